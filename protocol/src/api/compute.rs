//! The compute agent's HTTP API: `GET /v1/status` (the agent's and its
//! WAL proposer's state), read by `strata status` and `strata endpoint`.

use std::path::PathBuf;

use strata_formats::Lsn;

use crate::safekeeper::Term;

/// The `/v1/status` document.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ComputeStatus {
    #[serde(flatten)]
    pub agent: AgentStatus,
    pub proposer: ProposerStatus,
}

/// Where the agent is in a compute's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Looking up the timeline and bringing the safekeepers to the end of its WAL.
    Syncing,
    /// Waiting for the pageserver to ingest the WAL up to that end.
    WaitingForPageserver,
    /// Downloading and unpacking the basebackup, writing the configuration.
    Restoring,
    /// PostgreSQL is starting; the proposer is connecting.
    Starting,
    /// PostgreSQL accepts connections and its WAL streams to the safekeepers.
    Running,
    /// PostgreSQL or the proposer failed after `running`: waiting to start
    /// afresh, or starting afresh (all phases again).
    Restarting,
    /// Shutting down: PostgreSQL's last WAL is being made durable.
    Stopping,
    /// The first start failed (`error` says why); the agent exits.
    Failed,
}

impl AgentState {
    /// All states, in order.
    pub const ALL: [AgentState; 8] = [
        AgentState::Syncing,
        AgentState::WaitingForPageserver,
        AgentState::Restoring,
        AgentState::Starting,
        AgentState::Running,
        AgentState::Restarting,
        AgentState::Stopping,
        AgentState::Failed,
    ];

    /// The name used in JSON and metrics.
    pub fn name(self) -> &'static str {
        match self {
            AgentState::Syncing => "syncing",
            AgentState::WaitingForPageserver => "waiting_for_pageserver",
            AgentState::Restoring => "restoring",
            AgentState::Starting => "starting",
            AgentState::Running => "running",
            AgentState::Restarting => "restarting",
            AgentState::Stopping => "stopping",
            AgentState::Failed => "failed",
        }
    }
}

/// Durations (seconds) and sizes of the phases of the last start; zero
/// until a phase has completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StartTimings {
    /// Asking the pageserver for the timeline (including retries).
    pub timeline_lookup_seconds: f64,
    /// sync-safekeepers: election and catch-up of a quorum.
    pub sync_seconds: f64,
    /// Until the pageserver had ingested the WAL up to the start LSN.
    pub wait_seconds: f64,
    /// Downloading and unpacking the basebackup (streamed, so together).
    pub basebackup_seconds: f64,
    pub basebackup_bytes: u64,
    pub basebackup_files: u64,
    /// Writing the configuration and setting ownership.
    pub config_seconds: f64,
    /// A lazy compute: reading the manifest, creating the backing files
    /// and mounting `base/` and `global/` (0 when eager).
    pub mount_seconds: f64,
    /// From starting `postgres` until it accepted connections.
    pub postgres_start_seconds: f64,
    /// Until the proposer streamed PostgreSQL's WAL (state `running`).
    pub proposer_start_seconds: f64,
    /// From the agent's start to `running`.
    pub total_seconds: f64,
}

/// PostgreSQL's restarts by this agent process.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RestartStatus {
    /// Fresh starts after a failure (each attempt counts).
    pub restarts: u64,
    /// What led to the last one: PostgreSQL's exit, the proposer's error,
    /// or a failed restart attempt.
    pub last_restart_cause: Option<String>,
    /// When the last one was decided (Unix seconds).
    pub last_restart_at: Option<u64>,
    /// From detecting the failure to `running` again, for the last restart
    /// that got there.
    pub last_restart_downtime_seconds: Option<f64>,
    /// The recent restarts are a crash loop (see `AgentConfig::restart`).
    pub crash_loop: bool,
}

/// Everything `/v1/status` reports except the proposer's part.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AgentStatus {
    pub state: AgentState,
    pub pg_port: u16,
    pub pgdata: PathBuf,
    /// PostgreSQL's log file.
    pub pg_log: PathBuf,
    pub tenant_id: String,
    pub timeline_id: String,
    /// The LSN the compute started at (the end of the timeline's WAL), once known.
    pub start_lsn: Option<Lsn>,
    /// Why the first start failed (`failed`), or what the agent is
    /// recovering from (`restarting`); null otherwise.
    pub error: Option<String>,
    pub timings: StartTimings,
    #[serde(flatten)]
    pub restart: RestartStatus,
    /// A lazy compute's file system (`docs/lazy-compute.md`); null when eager.
    pub lazy: Option<LazyStatus>,
    /// A replica's replay and lag (`docs/replicas.md`); null otherwise.
    #[serde(default)]
    pub replica: Option<ReplicaStatus>,
    /// The pageserver it reads from now (`docs/storage-controller.md`).
    #[serde(default)]
    pub pageserver: Option<PageserverInUse>,
    /// The agent's own token: which key signed it, when it expires, its
    /// renewals (`docs/security.md`, "Renewal"); null without one.
    #[serde(default)]
    pub token: Option<TokenStatus>,
    /// PostgreSQL's activity as last polled while it runs: its transactions
    /// (commits and rollbacks of every database since the server started)
    /// and its client connections; null until a poll succeeded.
    #[serde(default)]
    pub activity: Option<Activity>,
}

/// PostgreSQL's activity at one poll (`pg_stat_database`, `pg_stat_activity`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Activity {
    /// Commits and rollbacks since the server started (a new server starts again from 0).
    pub transactions: u64,
    /// Client backends, the agent's own sessions excluded.
    pub client_connections: u64,
}

/// What the agent's token is now (never the token itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenStatus {
    /// The id of the key that signed it.
    pub kid: Option<String>,
    /// When it expires (seconds since 1970); null: never.
    pub exp: Option<u64>,
    /// Times it was renewed at a controller.
    pub renewals: u64,
    /// Why the last renewal failed, until one succeeds.
    pub last_error: Option<String>,
}

/// The pageserver a compute reads from, and how often it moved.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PageserverInUse {
    /// Its name, once a storage controller named it.
    pub name: Option<String>,
    pub http: String,
    pub pg: Option<String>,
    pub generation: Option<u32>,
    /// Times the compute switched to another pageserver.
    pub switches: u64,
    /// It is its site's reader, not the attached pageserver (`docs/sites.md`).
    #[serde(default)]
    pub reader: bool,
}

/// `POST /v1/checkpoint` on a writer's agent: where the checkpoint it just
/// made is in the WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointResponse {
    pub checkpoint_lsn: Lsn,
    pub redo_lsn: Lsn,
}

/// Where a replica started and how far behind the branch it is.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaStatus {
    /// The checkpoint record it started from, and that record's redo point.
    pub checkpoint_lsn: Lsn,
    pub redo_lsn: Lsn,
    /// Where PostgreSQL's replay is (`pg_last_wal_replay_lsn()`), once it answers.
    pub replay_lsn: Option<Lsn>,
    /// The end of the branch's WAL as far as the replica knows: what its
    /// walreceiver received or was told of, or the pageserver ingested.
    pub wal_end_lsn: Option<Lsn>,
    /// Blocks it has not read since its start are read at this LSN.
    pub read_floor: Option<Lsn>,
    /// The LSN its pageserver lease keeps readable.
    pub leased_lsn: Option<Lsn>,
    /// `wal_end_lsn - replay_lsn`.
    pub lag_bytes: u64,
    /// How long the oldest WAL not replayed yet has been known to it (0
    /// when replay is at the end).
    pub lag_seconds: f64,
    /// Restarts because it lagged beyond the bound (`max_replica_lag`).
    pub lag_restarts: u64,
}

/// What a lazy compute's file system did, over every run of PostgreSQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LazyStatus {
    /// Blocks fetched from the pageserver.
    pub blocks_fetched: u64,
    /// Of those, blocks a large sequential read fetched for the first time
    /// and did not keep in the cache.
    pub blocks_streamed: u64,
    /// Fetches that failed (each an I/O error to PostgreSQL).
    pub fetch_errors: u64,
    /// Blocks the cache dropped from local disk.
    pub cache_evictions: u64,
    /// Blocks the cache holds that it may drop (an upper bound).
    pub cache_blocks: u64,
    /// The most blocks it holds before dropping some.
    pub cache_budget_blocks: u64,
}

/// Progress reported to the caller (status, metrics).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ProposerStatus {
    pub term: Term,
    pub epoch_start: Lsn,
    pub commit_lsn: Lsn,
    /// What PostgreSQL was told is flushed (the commit LSN, unless throttled).
    pub acknowledged_lsn: Lsn,
    pub consumer_applied_lsn: Lsn,
    pub received_lsn: Lsn,
    pub connected_safekeepers: usize,
    /// Total time acknowledgements were held back by backpressure.
    pub throttled_seconds: f64,
    /// PostgreSQL's WAL is being streamed to the safekeepers (its commits can complete).
    pub streaming: bool,
    /// The safekeepers' membership generation the proposer works under (0: its configured set).
    pub membership_generation: u32,
    /// Elections won since the start (more than one: re-elected after membership changes).
    pub elections: u32,
    /// The WAL placement in force (`majority`, `local-quorum`, `stretched`).
    #[serde(default)]
    pub placement: String,
    /// Asynchronous safekeepers (`local-quorum`) and how far each is behind
    /// the WAL received, in bytes (none: not heard from in this term).
    #[serde(default)]
    pub async_safekeepers: Vec<AsyncSafekeeper>,
    /// Times an asynchronous safekeeper was dropped for lagging past
    /// `max_async_lag` (`on_async_lag = "fall-behind"`).
    #[serde(default)]
    pub async_dropped: u64,
    /// Acknowledgements of PostgreSQL's WAL: each the end of a batch of
    /// records received, reported flushed once a quorum held it.
    #[serde(default)]
    pub acks: u64,
    /// Their summed wait, from a batch's arrival to its acknowledgement
    /// (what a commit waits on the safekeepers), in seconds.
    #[serde(default)]
    pub ack_wait_seconds: f64,
}

/// An asynchronous safekeeper as the proposer sees it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AsyncSafekeeper {
    pub address: String,
    pub lag_bytes: Option<u64>,
    /// Being streamed to (false: dropped until it catches up from its peers).
    pub streaming: bool,
}
