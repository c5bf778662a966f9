//! `strata status --json`: a local or multi-host cluster's services,
//! endpoints and timelines, as the CLI reports them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use strata_formats::Lsn;

use super::compute::AgentState;
use super::pageserver::TimelineStatus;
use crate::{TenantId, TimelineId};

/// The whole document.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ClusterStatus {
    /// The cluster's directory.
    pub workdir: PathBuf,
    /// Every tenant, with its sizes.
    pub tenants: Vec<TenantStatus>,
    pub services: Vec<ServiceStatus>,
    pub endpoints: Vec<EndpointStatus>,
    /// One entry per branch.
    pub timelines: Vec<BranchStatus>,
}

/// A tenant and what it takes: sizes are absent when the service that
/// knows them did not answer.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TenantStatus {
    pub name: String,
    pub tenant_id: TenantId,
    /// `active`, `creating` or `deleting` (a command that did not finish).
    pub state: String,
    /// The pageserver it is attached to, as the storage controller says.
    pub attached: Option<String>,
    /// The sum of its branches' logical sizes (what PostgreSQL's relations
    /// take; branches share what they have in common, counted once each).
    pub logical_bytes: Option<u64>,
    /// The WAL its timelines hold on the safekeeper that holds the most.
    pub wal_held_bytes: Option<u64>,
    /// Its layer files on the attached pageserver's disk.
    pub local_layer_bytes: Option<u64>,
    /// Its layer files in object storage.
    pub remote_layer_bytes: Option<u64>,
}

/// A safekeeper or pageserver process and its supervisor.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ServiceStatus {
    pub name: String,
    /// The host it runs on.
    #[serde(default)]
    pub host: String,
    /// The site (data centre) of that host (`docs/sites.md`).
    #[serde(default)]
    pub site: String,
    /// `safekeeper` or `pageserver`.
    pub kind: String,
    pub pid: Option<i32>,
    pub supervisor_pid: Option<i32>,
    pub supervised: bool,
    /// Port of each of its listeners, by name.
    pub ports: BTreeMap<String, u16>,
    /// `running`, `restarting` or `stopped`.
    pub state: String,
    /// Restarts by its supervisor.
    pub restarts: u64,
    pub last_exit: Option<String>,
    /// Unix seconds.
    pub last_exit_at: Option<u64>,
    pub crash_loop: bool,
    pub config: PathBuf,
    pub log: PathBuf,
    pub data_dir: Option<PathBuf>,
    /// Where it keeps objects (a path or URL), if anywhere.
    pub remote_storage: Option<String>,
}

/// A compute: PostgreSQL with its agent, under a supervisor.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct EndpointStatus {
    pub name: String,
    /// The host it runs on.
    #[serde(default)]
    pub host: String,
    /// The site (data centre) of that host.
    #[serde(default)]
    pub site: String,
    /// Always `compute`.
    pub kind: String,
    pub pid: Option<i32>,
    pub supervisor_pid: Option<i32>,
    pub supervised: bool,
    /// `pg` and `http`.
    pub ports: BTreeMap<String, u16>,
    /// The tenant of its branch.
    #[serde(default)]
    pub tenant: String,
    pub branch: String,
    pub timeline_id: Option<TimelineId>,
    /// The agent process: `running`, `restarting` or `stopped`; or
    /// `suspended`: no agent runs and the endpoint sleeps after its idle
    /// period (`docs/compute.md`, "Suspend"), or was on its way to when it
    /// crashed; the next `strata endpoint start` wakes it.
    pub state: String,
    /// What the agent reports, while it answers.
    pub compute_state: Option<AgentState>,
    pub compute_error: Option<String>,
    /// The agent's restarts by its supervisor plus PostgreSQL's by the agent.
    pub restarts: u64,
    pub agent_restarts: u64,
    pub postgres_restarts: u64,
    pub last_exit: Option<String>,
    pub last_exit_at: Option<u64>,
    pub last_restart_cause: Option<String>,
    pub last_restart_at: Option<u64>,
    pub last_restart_downtime_seconds: Option<f64>,
    /// The latest cause of either kind of restart.
    pub last_cause: Option<String>,
    pub crash_loop: bool,
    /// A PostgreSQL left running by an agent that is gone.
    pub orphan_postgres_pid: Option<i32>,
    pub connstr: String,
    pub log: PathBuf,
    /// `writer`, `read-only` or `replica`.
    #[serde(default)]
    pub role: String,
    /// A replica's replay and lag, while its agent answers.
    #[serde(default)]
    pub replica: Option<crate::api::compute::ReplicaStatus>,
}

/// A branch's timeline as the pageserver and each running safekeeper see it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BranchStatus {
    pub branch: String,
    /// Its tenant's name.
    #[serde(default)]
    pub tenant: String,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The attached pageserver's answer (none when it is not running or did not answer).
    pub pageserver: Option<TimelineStatus>,
    /// The pageserver the branch is attached to, as the storage controller
    /// says (every branch of the tenant is on the same one).
    #[serde(default)]
    pub attached: Option<String>,
    /// The generation of that attachment.
    #[serde(default)]
    pub generation: Option<u32>,
    /// The pageservers that keep it warm.
    #[serde(default)]
    pub secondaries: Vec<String>,
    /// Its WAL placement as the safekeepers hold it (the configuration of
    /// the highest generation; while a change is joint, where it goes).
    #[serde(default)]
    pub placement: crate::safekeeper::Placement,
    /// The placement `cluster.toml` asks for, when it differs (a change
    /// not yet applied: a safekeeper was down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_wanted: Option<crate::safekeeper::Placement>,
    pub safekeepers: Vec<SafekeeperPosition>,
    /// The other shards of a sharded tenant, in order (shard 0's are the
    /// fields above); empty when unsharded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardPosition>,
}

/// One shard of a sharded tenant's branch, as the storage controller
/// places it and its attached pageserver sees it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ShardPosition {
    pub shard: crate::TenantShardId,
    pub attached: Option<String>,
    pub generation: Option<u32>,
    /// The attached pageserver's answer (none when it did not answer).
    pub pageserver: Option<TimelineStatus>,
}

/// One running safekeeper's positions of a timeline (none: it does not hold it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SafekeeperPosition {
    pub name: String,
    pub flush_lsn: Option<Lsn>,
    pub commit_lsn: Option<Lsn>,
    pub membership_generation: Option<u32>,
}

/// One branch as `strata branch list --json` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BranchInfo {
    pub name: String,
    pub timeline_id: TimelineId,
    /// The branch it was made from (none for `main`).
    pub parent: Option<String>,
    /// Where on the parent it begins.
    pub ancestor_lsn: Option<Lsn>,
    /// The pageserver's newest LSN of it, while it answers.
    pub last_record_lsn: Option<Lsn>,
    /// Bytes of its relations at that LSN, while the pageserver answers.
    pub logical_size: Option<u64>,
    /// Endpoints on it.
    pub endpoints: Vec<String>,
}
