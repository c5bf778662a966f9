//! The safekeeper's HTTP API (`docs/openapi/safekeeper.yaml`).

use std::net::SocketAddr;

use strata_formats::Lsn;

use crate::safekeeper::{Membership, Term, TermHistory};
use crate::{NodeId, TenantId, TimelineId};

/// `GET /v1/status`: the safekeeper and every timeline it holds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SafekeeperStatus {
    pub id: NodeId,
    pub listen: SocketAddr,
    pub fsync: bool,
    pub peers: Vec<Peer>,
    pub timelines: Vec<TimelineStatus>,
    /// Timelines whose files could not be loaded at start-up.
    pub unloadable: Vec<Unloadable>,
}

/// A peer safekeeper (for peer recovery and the choice of the offloader),
/// as its configuration names it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Peer {
    pub id: NodeId,
    /// Its protocol address (`host:port`).
    pub address: String,
    /// Its HTTP address (`host:port`), polled for its positions; a peer
    /// without one never counts as live for the choice of the offloader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
}

/// A timeline that could not be loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unloadable {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub error: String,
}

/// One timeline as `GET /v1/tenant/{tenant}/timeline/{timeline}` describes it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TimelineStatus {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub system_id: u64,
    pub pg_version: u32,
    pub wal_segment_size: u32,
    pub timeline_start_lsn: Lsn,
    pub state: TimelineState,
    /// The highest term voted in or followed.
    pub term: Term,
    /// Terms of the WAL held, up to the flushed WAL.
    pub term_history: TermHistory,
    pub membership: Membership,
    /// The last term of the history.
    pub elected_term: Term,
    /// The membership generation under which that term was elected.
    pub elected_generation: u32,
    pub write_lsn: Lsn,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
    /// WAL below this is held by every member.
    pub truncate_lsn: Lsn,
    pub consumers: Vec<ConsumerStatus>,
    pub offload: OffloadStatus,
    pub removal: RemovalStatus,
    /// The highest `remote_consistent_lsn` a pageserver reported.
    pub remote_consistent_lsn: Lsn,
    /// The newest attachment generation a pageserver streamed under;
    /// older generations are fenced.
    #[serde(default)]
    pub pageserver_generation: u32,
    /// Sealed by a site failover: it accepts no writer (`docs/sites.md`).
    #[serde(default)]
    pub sealed: bool,
    /// A sealed timeline's commit LSN before the seal: what its writer
    /// had had acknowledged (the seal commits the rest of the WAL held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_before_seal: Option<Lsn>,
    /// The latest failure, current or recovered from.
    pub last_error: Option<String>,
    /// Why the timeline stopped accepting, while it does.
    pub failure: Option<Failure>,
    /// This safekeeper's peers (the single-timeline answer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<Peer>>,
}

/// Whether a timeline accepts WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineState {
    Active,
    /// Stopped after a storage error or a panic, until re-read from disk.
    Failed,
}

impl std::fmt::Display for TimelineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimelineState::Active => "active",
            TimelineState::Failed => "failed",
        })
    }
}

/// A connected WAL consumer (a pageserver).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConsumerStatus {
    pub name: String,
    pub sent_lsn: Lsn,
    pub applied_lsn: Lsn,
    /// What the consumer has in object storage (0: nothing, or no object storage).
    pub remote_consistent_lsn: Lsn,
    /// The consumer's attachment generation (0: not a pageserver).
    #[serde(default)]
    pub generation: u32,
    /// The consumer's generation has been superseded: its feedback is
    /// ignored and its stream ends after the grace period.
    #[serde(default)]
    pub fenced: bool,
}

/// Why a timeline stopped accepting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    pub reason: String,
    /// Unix seconds.
    pub since: u64,
    /// The WAL up to here was durable before the failure; a reload keeps
    /// exactly this much.
    pub durable_flush_lsn: Lsn,
    /// Reloads tried so far.
    pub reload_attempts: u64,
    pub last_reload_error: Option<String>,
}

/// A timeline's WAL offload, as this safekeeper knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OffloadStatus {
    /// End of the unbroken run of offloaded segments from the timeline's
    /// first one (0 until object storage was listed).
    pub offloaded_lsn: Lsn,
    /// Who offloads the timeline, as seen from here (none until this
    /// safekeeper has looked at it with its peers' views settled).
    pub offloader: Option<NodeId>,
    /// End of the partial segment this safekeeper last offloaded (0: none).
    pub partial_lsn: Lsn,
    pub last_error: Option<String>,
}

/// A timeline's WAL removal.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemovalStatus {
    /// The WAL held begins here.
    pub removed_before: Lsn,
    /// Segments wholly below this may go.
    pub horizon: Lsn,
    /// Which input sets the horizon.
    pub held_back_by: String,
    /// Bytes of the segment files held.
    pub local_wal_bytes: u64,
    /// Segments removed since the safekeeper started.
    pub segments_removed: u64,
    /// Removed segments kept to be recycled as the next new ones.
    #[serde(default)]
    pub spare_segments: u64,
}

/// `GET /v1/positions`: one timeline's positions as a safekeeper reports
/// them to its peers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TimelinePositions {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
    /// End of the WAL this safekeeper knows to be in object storage.
    pub offloaded_lsn: Lsn,
    /// The highest `remote_consistent_lsn` the pageserver reported to it
    /// (the pageserver streams from one safekeeper; the others learn it here).
    #[serde(default)]
    pub remote_consistent_lsn: Lsn,
    /// Where its local WAL begins (it removed what lies before).
    #[serde(default)]
    pub removed_before: Lsn,
    /// Sealed: a peer that holds the timeline seals it too.
    #[serde(default)]
    pub sealed: bool,
}

/// `POST /v1/tenant/{tenant}/timeline/{timeline}`: create a timeline.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTimelineRequest {
    pub system_id: u64,
    pub pg_version: u32,
    pub wal_segment_size: u32,
    pub start_lsn: Lsn,
}

/// `DELETE /v1/tenant/{tenant}/timeline/{timeline}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeleteTimelineResponse {
    /// Whether this safekeeper held it.
    pub deleted: bool,
    /// Objects of its offloaded WAL deleted from object storage.
    pub offloaded_objects_deleted: usize,
}
