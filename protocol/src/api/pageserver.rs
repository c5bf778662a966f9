//! The pageserver's HTTP API (`docs/openapi/pageserver.yaml`).

use std::net::SocketAddr;
use std::path::PathBuf;

use strata_formats::Lsn;

use crate::{NodeId, TenantShardId, TimelineId};

/// `GET /v1/status`: the pageserver and every timeline it holds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PageserverStatus {
    pub id: NodeId,
    pub listen_pg: SocketAddr,
    pub listen_http: SocketAddr,
    pub safekeepers: Vec<String>,
    pub data_dir: PathBuf,
    /// Where layers are uploaded (a path or URL), if anywhere.
    pub remote_storage: Option<String>,
    pub timelines: Vec<TimelineStatus>,
    /// What this pageserver holds of each tenant (`docs/storage-controller.md`).
    #[serde(default)]
    pub locations: Vec<LocationStatus>,
}

/// What a pageserver holds of a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocationMode {
    /// Serves its pages, ingests its WAL and uploads under a generation.
    Attached,
    /// Keeps the layers the attached location reads warm, from object
    /// storage, ready to be attached.
    Secondary,
    /// Serves reads to the computes of its own site: it loads the tenant
    /// from object storage and ingests the WAL from its own site's
    /// safekeepers, but never uploads, deletes or fences
    /// (`docs/sites.md`, "A pageserver per site"). It is a secondary too:
    /// attached after a failover, it takes what it downloaded.
    Reader,
    /// Nothing (its local files are removed).
    Detached,
}

/// `PUT /v1/tenant/{tenant}/location`: what the storage controller wants
/// this pageserver to hold of the tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationRequest {
    pub mode: LocationMode,
    /// The generation of an attachment (required for `attached`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
}

/// One tenant's location on a pageserver (in its status and in the answer
/// to a location request).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LocationStatus {
    pub tenant_id: TenantShardId,
    pub mode: LocationMode,
    /// Of an attached location.
    pub generation: Option<u32>,
    /// Layer files held locally for the tenant (attached or warm).
    #[serde(default)]
    pub local_layers: u64,
    #[serde(default)]
    pub local_layer_bytes: u64,
    /// A secondary: when it last read the attached location's heatmap
    /// (seconds ago), and what failed last.
    #[serde(default)]
    pub heatmap_age_seconds: Option<u64>,
    #[serde(default)]
    pub error: Option<String>,
}

/// A timeline as `GET /v1/tenant/{tenant}/timeline/{timeline}` describes it
/// (and as creating, branching and checkpointing answer).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TimelineStatus {
    pub tenant_id: TenantShardId,
    pub timeline_id: TimelineId,
    pub ancestor_timeline_id: Option<TimelineId>,
    pub ancestor_lsn: Option<Lsn>,
    pub pg_version: u32,
    pub system_id: u64,
    pub wal_segment_size: u32,
    /// Where the timeline's WAL begins (the bootstrap or branch point).
    pub start_lsn: Lsn,
    /// End of the WAL ingested.
    pub last_record_lsn: Lsn,
    pub prev_record_lsn: Lsn,
    /// Every version up to here is in layer files on local disk, fsynced.
    pub disk_consistent_lsn: Lsn,
    /// Reads below this are refused: GC may have removed their versions.
    pub gc_cutoff_lsn: Lsn,
    /// LSNs GC keeps readable whatever the cutoff (branch points).
    pub retain_lsns: Vec<Lsn>,
    pub leases: Vec<Lease>,
    /// The safekeeper the WAL streams from, while connected.
    pub wal_source: Option<String>,
    pub safekeeper_commit_lsn: Lsn,
    pub wal_source_error: Option<String>,
    pub memory_layers: usize,
    pub delta_layers: usize,
    pub l0_layers: usize,
    pub l1_layers: usize,
    pub image_layers: usize,
    /// Bytes of every layer file, local or not.
    pub layer_bytes: u64,
    /// Ingest is slowed: L0 deltas wait for compaction.
    pub backpressure: bool,
    /// Ingest is slowed: uploads lag more than `max_upload_lag_bytes`.
    pub upload_backpressure: bool,
    pub local_layers: usize,
    pub local_layer_bytes: u64,
    /// The object storage side (none without object storage).
    pub remote: Option<UploadStatus>,
    pub remote_consistent_lsn: Option<Lsn>,
    pub state: TimelineState,
    /// Idle: no WAL arrived for a while, so its WAL stream and threads
    /// ended; WAL for it, or a read that waits for an LSN, wakes it.
    #[serde(default)]
    pub idle: bool,
    /// Why it is broken (`broken.reason`).
    pub error: Option<String>,
    pub broken: Option<Broken>,
    /// Native redo checked against PostgreSQL's images (`verify_redo`).
    pub verify_redo: Option<RedoCheck>,
    /// Bytes of every relation at the newest LSN, when asked for
    /// (`?logical_size=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_size: Option<u64>,
    /// A sharded timeline's stripe (`docs/sharding.md`); absent when unsharded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_blocks: Option<u32>,
    /// Bytes of the layers its index names in another shard's objects (a
    /// split's parent's, until compaction and garbage collection replace
    /// them): `layer_bytes` less these is what the shard holds of its own.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub foreign_layer_bytes: u64,
    /// How far back its history stays readable (the pageserver's
    /// `pitr_interval`): GC keeps every version younger than this, besides
    /// `retain_lsns` and `leases`. Absent from older pageservers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pitr_interval_secs: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TimelineStatus {
    /// A timeline as it is created: active, nothing ingested past its
    /// start, no layer files, no object storage (what a stand-in server
    /// answers; fields are set from there).
    pub fn new(
        tenant_id: TenantShardId,
        timeline_id: TimelineId,
        system_id: u64,
        wal_segment_size: u32,
        start_lsn: Lsn,
    ) -> TimelineStatus {
        TimelineStatus {
            tenant_id,
            timeline_id,
            ancestor_timeline_id: None,
            ancestor_lsn: None,
            pg_version: 15,
            system_id,
            wal_segment_size,
            start_lsn,
            last_record_lsn: start_lsn,
            prev_record_lsn: Lsn::INVALID,
            disk_consistent_lsn: start_lsn,
            gc_cutoff_lsn: Lsn::INVALID,
            retain_lsns: Vec::new(),
            leases: Vec::new(),
            wal_source: None,
            safekeeper_commit_lsn: Lsn::INVALID,
            wal_source_error: None,
            memory_layers: 1,
            delta_layers: 0,
            l0_layers: 0,
            l1_layers: 0,
            image_layers: 0,
            layer_bytes: 0,
            backpressure: false,
            upload_backpressure: false,
            local_layers: 0,
            local_layer_bytes: 0,
            remote: None,
            remote_consistent_lsn: None,
            state: TimelineState::Active,
            idle: false,
            error: None,
            broken: None,
            verify_redo: None,
            logical_size: None,
            stripe_blocks: None,
            foreign_layer_bytes: 0,
            pitr_interval_secs: None,
        }
    }
}

/// Whether a timeline serves reads and ingests WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineState {
    Active,
    /// Stopped by an error (`broken` says which and why).
    Broken,
}

impl std::fmt::Display for TimelineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimelineState::Active => "active",
            TimelineState::Broken => "broken",
        })
    }
}

/// A lease: an LSN kept readable (`POST …/lease`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    pub lsn: Lsn,
    pub seconds_left: u64,
    /// Who holds it, for a named lease (a replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// Why a timeline is broken.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Broken {
    pub kind: BrokenKind,
    pub reason: String,
    /// Unix seconds.
    pub since: u64,
    /// Re-reads from disk tried since (for the kinds that are re-read), all failed.
    pub reload_attempts: u32,
    /// Why the last of them failed.
    pub last_reload_error: Option<String>,
}

/// Why a timeline stopped, and whether re-reading it from disk may help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokenKind {
    /// A write, fsync or rename of its files failed: what is in memory may
    /// not be on disk. Re-read from disk (automatically, with backoff).
    Storage,
    /// Its code panicked: its memory may be inconsistent. Re-read from disk.
    Panic,
    /// The WAL could not be ingested (a record without image or native
    /// redo, a decoding error): re-reading would stop at the same record.
    Ingest,
    /// Its files on disk are missing, damaged or unexpected: an operator decides.
    Files,
    /// Its index in object storage could not be read when it was loaded
    /// (the store down or unreachable): loaded again, automatically and
    /// with backoff, once the store answers.
    Remote,
}

impl BrokenKind {
    /// Whether the timeline is re-read from disk automatically.
    pub fn reloads(self) -> bool {
        matches!(self, BrokenKind::Storage | BrokenKind::Panic | BrokenKind::Remote)
    }
}

/// Results of checking native redo against PostgreSQL's images.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RedoCheck {
    pub verified: u64,
    pub mismatches: u64,
    /// The last mismatch: record, LSN, block and first differing byte.
    pub last_mismatch: Option<String>,
}

/// What the remote side of a timeline looks like now.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct UploadStatus {
    pub generation: u32,
    /// `disk_consistent_lsn` of the newest index in remote storage.
    pub remote_consistent_lsn: Lsn,
    /// Layers the newest remote index lists, and their bytes.
    pub remote_layers: usize,
    pub remote_bytes: u64,
    /// Local layer files not yet uploaded, and their bytes.
    pub upload_queue_layers: usize,
    pub upload_lag_bytes: u64,
    /// Whether the lag passes `max_upload_lag_bytes`, so that ingest is slowed.
    pub backpressure: bool,
    /// Why the last round failed, while it is being retried.
    pub upload_error: Option<String>,
}

/// What one compaction round did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompactionOutcome {
    pub l0_compacted: usize,
    pub l1_written: usize,
    /// Stored bytes of the L0s read.
    pub bytes_read: u64,
    /// Bytes of the L1 files written.
    pub bytes_written: u64,
    pub images_written: usize,
    pub image_bytes_written: u64,
    /// The LSN of the images written, if any.
    pub image_lsn: Option<Lsn>,
}

/// What one GC did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GcOutcome {
    /// The cutoff now in force.
    pub cutoff: Lsn,
    /// The newest image at or below the cutoff: every read at or above the
    /// cutoff finds each key there or above.
    pub image_lsn: Option<Lsn>,
    /// Branch points below the cutoff, still readable: the layers their
    /// reads visit were kept.
    pub retained_points: Vec<Lsn>,
    pub layers_removed: usize,
    pub bytes_removed: u64,
}

/// `POST /v1/tenant`: bootstrap a tenant from `initdb` (ids generated if absent).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantRequest {
    /// The tenant's shard: a sharded tenant is created one shard at a
    /// time, each from the same `initdb` (`docs/sharding.md`).
    pub tenant_id: Option<TenantShardId>,
    pub timeline_id: Option<TimelineId>,
    /// Blocks per stripe of a sharded tenant (required with a shard;
    /// `strata_protocol::shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_blocks: Option<u32>,
    /// For a shard other than 0: the system identifier shard 0 was given,
    /// which every shard of the tenant shares (required there, refused
    /// elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_id: Option<u64>,
    /// The tenant's PostgreSQL major (15 when absent): its `initdb` makes
    /// the first timeline, and every branch inherits it.
    #[serde(default)]
    pub pg_version: Option<u32>,
}

/// `POST /v1/tenant/{tenant}/timeline`: a branch (`docs/branches.md`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBranchRequest {
    /// The new timeline's id (generated if absent).
    pub timeline_id: Option<TimelineId>,
    pub ancestor_timeline_id: TimelineId,
    /// The branch point; at most one of `ancestor_lsn` and `ancestor_time`
    /// (neither: the parent's newest record).
    pub ancestor_lsn: Option<Lsn>,
    /// RFC 3339, e.g. `2026-11-24T14:03:05.123456+00:00`.
    pub ancestor_time: Option<String>,
}

/// `GET …/{timeline}?logical_size=true`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// Also sum the sizes of every relation at the newest LSN (reads every
    /// database's relation directory: not for frequent polling).
    #[serde(default)]
    pub logical_size: bool,
}

/// `DELETE …/{timeline}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeleteTimelineResponse {
    pub deleted: TimelineId,
}

/// `DELETE /v1/tenant/{tenant}`: what was deleted of a tenant no
/// pageserver holds any more.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantObjectsDeleted {
    pub tenant_id: TenantShardId,
    /// Objects deleted from object storage: layers, indexes, heatmaps,
    /// offloaded WAL and data keys.
    pub objects_deleted: u64,
}

/// `GET …/basebackup`: a tar of the data directory at an LSN.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasebackupQuery {
    /// The end of the ingested WAL if absent.
    pub lsn: Option<Lsn>,
    /// With every relation's pages.
    #[serde(default)]
    pub full: bool,
    /// For a read-only compute: any LSN of the timeline, not only the end
    /// of its WAL (`docs/branches.md`, "Computes").
    #[serde(default)]
    pub read_only: bool,
    /// No relation data, and the manifest of the relation forks a lazy
    /// compute reads (`docs/lazy-compute.md`).
    #[serde(default)]
    pub lazy: bool,
    /// For a hot standby: the data at the redo point of the last checkpoint
    /// record at or before `lsn`, a `backup_label` naming that record and a
    /// `pg_control` in archive recovery (`docs/replicas.md`).
    #[serde(default)]
    pub standby: bool,
}

/// `POST …/lease`: keep `lsn` readable for a while.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    pub lsn: Lsn,
    /// A replica's name: its lease replaces its last one, and is refused
    /// once it lags more than the pageserver's `max_replica_lag_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// The answer to a lease.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseResponse {
    pub lsn: Lsn,
    pub valid_for_seconds: u64,
}

/// `GET …/lsn_by_time?time=…`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeQuery {
    /// RFC 3339.
    pub time: String,
}

/// The LSN of a point in time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LsnResponse {
    pub lsn: Lsn,
}

/// `POST …/checkpoint`: flush now, and optionally compact, collect
/// garbage and wait for the upload.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointQuery {
    #[serde(default)]
    pub compact: bool,
    #[serde(default)]
    pub gc: bool,
    /// Seconds to wait for the remote index to cover the checkpoint (0: not at all).
    #[serde(default)]
    pub upload_timeout: u64,
}

/// The answer to a checkpoint: the timeline after it, and what was asked for.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CheckpointResponse {
    #[serde(flatten)]
    pub timeline: TimelineStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<GcOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded_lsn: Option<Lsn>,
}

/// `POST …/evict`: every layer file the remote index holds leaves local disk.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EvictResponse {
    pub evicted_layers: usize,
    pub evicted_bytes: u64,
}

/// `GET …/checkpoint_record?lsn=…`: the last checkpoint record at or before an LSN.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRecordQuery {
    /// Default: the last record ingested.
    pub lsn: Option<Lsn>,
}

/// Where a checkpoint record lies in the WAL, and its redo point: where a
/// hot standby starts (`docs/replicas.md`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointRecordResponse {
    /// The record's first byte.
    pub lsn: Lsn,
    /// Where the next record may start.
    pub end_lsn: Lsn,
    /// Its redo point, where replay from it begins.
    pub redo: Lsn,
    pub shutdown: bool,
    /// PostgreSQL's timeline (`ThisTimeLineID`) in the record.
    pub pg_timeline: u32,
}

/// `GET …/page`: one page, for debugging and tests.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// `spc/db/rel`.
    pub rel: String,
    #[serde(default)]
    pub fork: u8,
    pub block: u32,
    pub lsn: Option<Lsn>,
}

/// `POST /v1/tenant/{parent}/split` (the storage controller's): the parent
/// shard's pageserver writes an index for each child of each timeline,
/// naming the parent's layers (`docs/sharding.md`, "Split, step by step").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitShardRequest {
    /// The children's stripe (the parent's, or the default for an unsharded parent).
    pub stripe_blocks: u32,
    /// The parent's children, each with its first generation.
    pub children: Vec<SplitChild>,
}

/// One child of a split ([`SplitShardRequest::children`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitChild {
    pub shard: TenantShardId,
    pub generation: u32,
}

/// The answer: where each timeline's children start.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitShardDone {
    pub timelines: Vec<SplitTimeline>,
}

/// One timeline of a split: its children's indexes end at `lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitTimeline {
    pub timeline_id: TimelineId,
    pub lsn: Lsn,
}
