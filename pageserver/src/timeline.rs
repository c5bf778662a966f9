//! A timeline: one branch of a tenant's history. Holds the layer map,
//! serves reads at any ingested LSN, and turns in-memory layers into layer
//! files, advancing `disk_consistent_lsn` only once they are durable.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_service::clock::Clock;

use bytes::Bytes;

use crate::rebuilt_pages::RebuiltPages;
use parking_lot::{Condvar, Mutex, RwLock};
use strata_formats::types::{BlockNumber, ForkNumber, Oid};
use strata_formats::v15::control::ControlFile;
use strata_formats::v15::records::xlog::CheckPoint;
use strata_formats::version::{PgVersion, BLCKSZ};
use strata_formats::Lsn;
use strata_protocol::pageserver::SlruKind;
use strata_protocol::{ShardIdentity, TenantShardId, TimelineId};
use tracing::{info, warn};

mod compaction;
mod flush;
mod gc;
pub mod leases;

pub use crate::metadata::{TimelineMetadata, METADATA_VERSION};
pub use compaction::{CompactionError, Throttle};
pub use gc::GcPolicy;
pub use strata_protocol::api::pageserver::{Broken, BrokenKind, CompactionOutcome, GcOutcome, RedoCheck};

use strata_service::durable::{replace_file, sync_dir};

use crate::checkpoint_record::CheckpointRecord;
use crate::dirs;
use crate::idle::Activity;
use crate::key::{Key, RelTag};
use crate::layer::files::FileCache;
use crate::layer::inmemory::InMemoryLayer;
use crate::layer::layer_file::{LayerFile, LayerName, WriteError};
use crate::layer::map::{HistoricLayers, LayerCounts, LayerMap, RecordLsns};
use crate::layer::{LayerError, Versions};
use crate::metrics::Metrics;
use crate::remote::{RemoteTimeline, UploadSource};
use crate::value::Value;

/// What every timeline of a pageserver shares.
#[derive(Clone)]
pub struct TimelineResources {
    /// fsync layer files and metadata (off only for tests).
    pub fsync: bool,
    /// WAL bytes ingested into the in-memory layer before it is frozen.
    pub checkpoint_distance: u64,
    pub metrics: Arc<Metrics>,
    /// The bounded cache of open layer files.
    pub files: Arc<FileCache>,
    /// Check native redo against PostgreSQL's images at ingest (computes
    /// then log images for every resource manager).
    pub verify_redo: bool,
    /// When to compact and create images.
    pub policy: LayerPolicy,
    /// Where every timeline, and what works on it, reads the time.
    pub clock: Arc<dyn Clock>,
}

/// When a timeline's layers are compacted and imaged (`docs/bottomless-pageserver.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerPolicy {
    /// L0 deltas that start a compaction.
    pub compaction_threshold: usize,
    /// A new L1 file starts at the first key after this many bytes.
    pub compaction_target_size: u64,
    /// L1 delta runs above the newest image that start an image creation.
    pub image_creation_threshold: usize,
    /// L0 deltas at which ingest is slowed (the applied LSN reported stops at the oldest L0).
    pub l0_backpressure_threshold: usize,
    /// Fresh pages of one relation fork in one flush, in bytes, from which
    /// the flush writes them as their own deltas (0: never).
    pub fresh_page_min_bytes: u64,
}

impl Default for LayerPolicy {
    fn default() -> LayerPolicy {
        LayerPolicy {
            compaction_threshold: crate::limits::DEFAULT_COMPACTION_THRESHOLD,
            compaction_target_size: crate::limits::DEFAULT_COMPACTION_TARGET_SIZE,
            image_creation_threshold: crate::limits::DEFAULT_IMAGE_CREATION_THRESHOLD,
            l0_backpressure_threshold: crate::limits::DEFAULT_L0_BACKPRESSURE_THRESHOLD,
            fresh_page_min_bytes: crate::limits::DEFAULT_FRESH_PAGE_MIN_BYTES,
        }
    }
}

/// A failed operation on a timeline's files, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    Layer(#[from] LayerError),
}

impl From<WriteError> for StorageError {
    fn from(e: WriteError) -> StorageError {
        StorageError::Io { op: e.op, path: e.path, source: e.source }
    }
}

impl From<strata_service::durable::FileError> for StorageError {
    fn from(e: strata_service::durable::FileError) -> StorageError {
        StorageError::Io { op: e.op, path: e.path, source: e.source }
    }
}

impl StorageError {
    pub fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
        move |source| StorageError::Io { op, path: path.to_path_buf(), source }
    }
}

/// A flush or checkpoint that failed: the timeline is broken after it and
/// `disk_consistent_lsn` stayed where it was.
#[derive(Debug, thiserror::Error)]
#[error("timeline {tenant_id}/{timeline_id}: flushing up to {lsn}: {source}")]
pub struct FlushError {
    pub tenant_id: TenantShardId,
    pub timeline_id: TimelineId,
    pub lsn: Lsn,
    #[source]
    pub source: StorageError,
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error("timeline {timeline}: {reason}")]
    Corrupt { timeline: TimelineId, reason: String },
    #[error("timeline {timeline} has ingested WAL up to {last}; {lsn} was not reached within {waited:?}")]
    LsnTimeout { timeline: TimelineId, lsn: Lsn, last: Lsn, waited: Duration },
    #[error("timeline {timeline} is broken: {reason}")]
    Broken { timeline: TimelineId, reason: String },
    #[error("timeline {timeline}: {lsn} is below the GC cutoff {cutoff} (versions older than the cutoff may be gone; see pitr_interval and gc_horizon)")]
    BelowGcCutoff { timeline: TimelineId, lsn: Lsn, cutoff: Lsn },
    /// The tenant moved to another pageserver (`docs/storage-controller.md`).
    #[error("timeline {timeline}: its tenant is no longer attached to this pageserver")]
    NotAttached { timeline: TimelineId },
}

pub struct Timeline {
    pub tenant_id: TenantShardId,
    /// Which keys it stores (all of them unless its tenant is sharded).
    pub shard: ShardIdentity,
    pub timeline_id: TimelineId,
    pub dir: PathBuf,
    fsync: bool,
    checkpoint_distance: u64,
    files: Arc<FileCache>,
    meta: Mutex<TimelineMetadata>,
    /// The PostgreSQL major of its WAL and pages (`meta.pg_version`; 15 for
    /// a timeline that could not be loaded).
    pub pg_version: PgVersion,
    layers: RwLock<LayerMap>,
    lsns: tokio::sync::watch::Sender<RecordLsns>,
    broken: Mutex<Option<Broken>>,
    /// Set when the tenant leaves this pageserver: reads (and waits for
    /// LSNs that will never be ingested here) end at once.
    detached: std::sync::atomic::AtomicBool,
    /// Signalled when a frozen layer has been flushed.
    flushed: Condvar,
    flush_wait: Mutex<()>,
    /// Serializes flushes.
    flush_lock: Mutex<()>,
    /// Serializes changes of the set of layer files (a flush adding one,
    /// compaction, image creation, GC): each writes the metadata and swaps
    /// the map under it.
    layer_files_lock: Mutex<()>,
    /// Serializes compaction, image creation and GC.
    compaction_lock: Mutex<()>,
    /// `gc_cutoff_lsn` of the metadata, for the read path.
    gc_cutoff: std::sync::atomic::AtomicU64,
    policy: LayerPolicy,
    clock: Arc<dyn Clock>,
    opened_at: Mutex<Instant>,
    /// Size of each relation fork (`None`: it does not exist) and the LSN
    /// from which that holds until a newer change: ingest records every
    /// change before making it visible, so a read at or after that LSN may
    /// use it instead of walking the layers twice (directory, then size).
    rel_size_cache: RwLock<std::collections::HashMap<RelTag, (Lsn, Option<BlockNumber>)>>,
    /// Whether pages carry checksums (read from pg_control once).
    checksums: std::sync::OnceLock<bool>,
    /// Pages rebuilt from redo records, the base of their next read.
    rebuilt: RebuiltPages,
    /// See [`TimelineResources::verify_redo`].
    pub verify_redo: bool,
    /// What the redo oracle found (with `verify_redo`).
    pub redo_check: Mutex<RedoCheck>,
    pub metrics: Arc<Metrics>,
    /// Object storage, when the pageserver has it.
    remote: std::sync::OnceLock<Arc<RemoteTimeline>>,
    /// The branch point (`ancestor_lsn`; never changes) and the timeline
    /// it branched from, once both are attached: versions a read does not
    /// find here are read there, at the branch point at most.
    ancestor_lsn: Option<Lsn>,
    ancestor: RwLock<Option<Arc<Timeline>>>,
    /// LSNs read-only computes and replicas read at, with when each
    /// lease ends (`timeline::leases`). GC
    /// computes and announces its cutoff under this lock, so a lease is
    /// either seen by GC or refused as below the cutoff.
    leases: Mutex<leases::Leases>,
    /// Whether its WAL receiver runs or it idles, and the reads waiting
    /// for WAL (`idle.rs`).
    pub activity: Activity,
}

pub use leases::LEASE_TTL;

/// Name of a timeline's metadata file.
pub const METADATA_FILE: &str = "metadata.json";

/// Creates `dir` (and missing parents) durably: each new directory's entry
/// in its parent is fsynced before this returns.
pub fn create_dir_durable(dir: &Path, fsync: bool) -> Result<(), StorageError> {
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.exists() {
        missing.push(d.to_path_buf());
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    std::fs::create_dir_all(dir).map_err(StorageError::io("creating", dir))?;
    if fsync {
        for created in missing.iter().rev() {
            sync_dir(created)?;
            if let Some(parent) = created.parent() {
                sync_dir(parent)?;
            }
        }
    }
    Ok(())
}

impl Timeline {
    /// Creates a new, empty timeline directory whose WAL starts at
    /// `meta.start_lsn`; it counts as created once a checkpoint made its
    /// initial versions durable (`disk_consistent_lsn` set).
    pub fn create(
        dir: PathBuf,
        meta: TimelineMetadata,
        res: &TimelineResources,
    ) -> Result<Arc<Timeline>, StorageError> {
        meta.shard().map_err(|reason| StorageError::Invalid { path: dir.clone(), reason })?;
        create_dir_durable(&dir, res.fsync)?;
        let tl = Timeline::new(dir, meta, HistoricLayers::default(), res);
        tl.write_metadata(&tl.metadata())?;
        Ok(tl)
    }

    /// A timeline that could not be loaded, kept (with its files) to be
    /// reported: every request on it answers that it is broken, of `kind`.
    pub fn unloadable(
        dir: PathBuf,
        tenant_id: TenantShardId,
        timeline_id: TimelineId,
        kind: BrokenKind,
        reason: String,
        res: &TimelineResources,
    ) -> Arc<Timeline> {
        let meta = TimelineMetadata {
            format_version: METADATA_VERSION,
            tenant_id,
            timeline_id,
            ancestor_timeline_id: None,
            ancestor_lsn: None,
            pg_version: 0,
            system_id: 0,
            wal_segment_size: 0,
            start_lsn: Lsn::INVALID,
            disk_consistent_lsn: Lsn::INVALID,
            prev_record_lsn: Lsn::INVALID,
            layers: Vec::new(),
            removed_layers: Vec::new(),
            gc_cutoff_lsn: Lsn::INVALID,
            retain_lsns: Vec::new(),
            stripe_blocks: None,
        };
        let tl = Timeline::new(dir, meta, HistoricLayers::default(), res);
        tl.set_broken(kind, reason);
        tl
    }

    fn new(dir: PathBuf, meta: TimelineMetadata, historic: HistoricLayers, res: &TimelineResources) -> Arc<Timeline> {
        let lsns = RecordLsns { last: meta.disk_consistent_lsn, prev: meta.prev_record_lsn };
        // A new timeline (nothing durable yet) takes its initial versions at its start LSN.
        let first =
            if meta.disk_consistent_lsn == Lsn::INVALID { meta.start_lsn } else { Lsn(meta.disk_consistent_lsn.0 + 1) };
        let open = Arc::new(InMemoryLayer::new(first));
        let gc_cutoff = meta.gc_cutoff_lsn;
        let ancestor_lsn = meta.ancestor_timeline_id.and(meta.ancestor_lsn);
        let pg_version = PgVersion::from_major(meta.pg_version).unwrap_or(PgVersion::V15);
        // Checked at load and creation; an unloadable timeline has none.
        let shard = meta.shard().unwrap_or(ShardIdentity::UNSHARDED);
        Arc::new(Timeline {
            pg_version,
            shard,
            tenant_id: meta.tenant_id,
            timeline_id: meta.timeline_id,
            dir,
            fsync: res.fsync,
            checkpoint_distance: res.checkpoint_distance,
            files: res.files.clone(),
            layers: RwLock::new(LayerMap { open, frozen: Vec::new(), historic: Arc::new(historic) }),
            lsns: tokio::sync::watch::Sender::new(lsns),
            meta: Mutex::new(meta),
            broken: Mutex::new(None),
            detached: std::sync::atomic::AtomicBool::new(false),
            flushed: Condvar::new(),
            flush_wait: Mutex::new(()),
            flush_lock: Mutex::new(()),
            layer_files_lock: Mutex::new(()),
            compaction_lock: Mutex::new(()),
            gc_cutoff: std::sync::atomic::AtomicU64::new(gc_cutoff.0),
            policy: res.policy,
            clock: res.clock.clone(),
            opened_at: Mutex::new(res.clock.now()),
            rel_size_cache: RwLock::new(std::collections::HashMap::new()),
            checksums: std::sync::OnceLock::new(),
            rebuilt: RebuiltPages::new(crate::limits::REBUILT_PAGES),
            verify_redo: res.verify_redo,
            redo_check: Mutex::new(RedoCheck::default()),
            metrics: res.metrics.clone(),
            remote: std::sync::OnceLock::new(),
            ancestor_lsn,
            ancestor: RwLock::new(None),
            leases: Mutex::new(leases::Leases::default()),
            activity: Activity::default(),
        })
    }

    /// Loads a timeline from its directory. A layer file that cannot be
    /// opened makes the timeline broken (the error names the file), not the
    /// process. Nothing is ever deleted here except what is garbage by
    /// construction: temporary files, and layer files of a flush that did
    /// not reach the metadata (they start after `disk_consistent_lsn` and
    /// their WAL is ingested again). Any other file not listed in the
    /// metadata is unexpected: an error, and every file stays, the garbage
    /// too — with something unexplained in the directory, the metadata may
    /// not be the one these files were written with.
    pub fn load(dir: PathBuf, res: &TimelineResources) -> Result<Arc<Timeline>, StorageError> {
        Timeline::load_with_remote(dir, res, None)
    }

    /// [`Timeline::load`] for a pageserver with object storage: a listed
    /// layer that is not on local disk but in `remote`'s index is a layer
    /// evicted earlier (or one never downloaded, for a timeline attached
    /// from object storage), downloaded by the first read that needs it.
    pub fn load_with_remote(
        dir: PathBuf,
        res: &TimelineResources,
        remote: Option<Arc<RemoteTimeline>>,
    ) -> Result<Arc<Timeline>, StorageError> {
        let meta_path = dir.join(METADATA_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(StorageError::io("reading", &meta_path))?;
        let invalid = |reason: String| StorageError::Invalid { path: meta_path.clone(), reason };
        let meta: TimelineMetadata = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if meta.format_version != METADATA_VERSION {
            return Err(invalid(format!("format version {} is not {METADATA_VERSION}", meta.format_version)));
        }
        if PgVersion::from_major(meta.pg_version).is_none() {
            return Err(invalid(format!("PostgreSQL {} is not a version this pageserver supports", meta.pg_version)));
        }
        meta.shard().map_err(invalid)?;
        if meta.disk_consistent_lsn == Lsn::INVALID {
            return Err(invalid("nothing was ever made durable (an unfinished creation without its marker)".into()));
        }
        // A compaction or image creation lists its new files in the metadata
        // while they still have their temporary names, and renames them
        // after: a crash in between leaves listed files under `<name>.tmp`,
        // complete and fsynced.
        let mut renamed = false;
        for name in &meta.layers {
            let path = dir.join(name);
            let tmp = dir.join(format!("{name}.tmp"));
            if !path.exists() && tmp.exists() {
                info!(file = %path.display(), "completing the rename of a layer file the metadata lists");
                std::fs::rename(&tmp, &path).map_err(StorageError::io("renaming", &tmp))?;
                renamed = true;
            }
        }
        if renamed && res.fsync {
            sync_dir(&dir)?;
        }
        let listed: BTreeSet<&str> = meta.layers.iter().map(String::as_str).collect();
        let removed: BTreeSet<&str> = meta.removed_layers.iter().map(String::as_str).collect();
        let mut unexpected = Vec::new();
        let mut garbage = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(StorageError::io("listing", &dir))? {
            let entry = entry.map_err(StorageError::io("listing", &dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == METADATA_FILE || listed.contains(name.as_str()) {
                continue;
            }
            let unfinished_flush = name.parse::<LayerName>().is_ok_and(|l| l.lsn_start > meta.disk_consistent_lsn);
            // `.download`: a download cut short (the file is renamed only when whole).
            if name.ends_with(".tmp")
                || name.ends_with(".download")
                || unfinished_flush
                || removed.contains(name.as_str())
            {
                garbage.push(entry.path());
            } else {
                unexpected.push(name);
            }
        }
        if unexpected.is_empty() {
            for path in garbage {
                warn!(file = %path.display(), "removing a file left by an unfinished flush");
                std::fs::remove_file(&path).map_err(StorageError::io("removing", &path))?;
            }
        } else {
            unexpected.sort();
            return Err(StorageError::Invalid {
                path: dir.clone(),
                reason: format!(
                    "files that the metadata does not list and no unfinished flush explains (left as they are): {}",
                    unexpected.join(", ")
                ),
            });
        }
        let mut historic = HistoricLayers::default();
        let mut broken = None;
        for name in &meta.layers {
            let path = dir.join(name);
            let opened = match &remote {
                Some(r) if !path.exists() => match (r.uploaded_size(name), name.parse::<LayerName>()) {
                    (Some(size), Ok(n)) => Ok(LayerFile::remote(&path, n, size, &res.files, r.clone())),
                    // Neither local nor remote: the open names the missing file.
                    (None, _) => LayerFile::open(&path, &res.files).map_err(|e| e.to_string()),
                    (_, Err(e)) => Err(e.to_string()),
                },
                _ => LayerFile::open(&path, &res.files).map_err(|e| e.to_string()),
            };
            let inserted =
                opened.and_then(|l| historic.insert(Arc::new(l)).map_err(|e| format!("{}: {e}", dir.display())));
            if let Err(e) = inserted {
                broken = Some(e);
                break;
            }
        }
        let tl = Timeline::new(dir, meta, historic, res);
        if let Some(reason) = broken {
            tl.set_broken(BrokenKind::Files, reason);
        }
        if let Some(r) = remote {
            tl.set_remote(r);
        }
        Ok(tl)
    }

    /// Connects the timeline to object storage: its layers can be evicted
    /// and downloaded again, and its upload loop starts.
    pub fn set_remote(self: &Arc<Self>, remote: Arc<RemoteTimeline>) {
        if self.remote.set(remote.clone()).is_err() {
            return;
        }
        for l in self.historic().iter() {
            l.set_remote(remote.clone());
        }
        let timeline = Arc::downgrade(self);
        remote.start(move || match timeline.upgrade() {
            None => UploadSource::Gone,
            // A broken timeline's metadata may not match its files.
            Some(t) if t.is_broken() => UploadSource::Broken,
            Some(t) => UploadSource::Metadata(t.metadata()),
        });
    }

    /// Links the timeline this one branched from (at attach, and again
    /// whenever the parent is attached anew).
    pub fn set_ancestor(&self, parent: Arc<Timeline>) {
        debug_assert_eq!(Some(parent.timeline_id), self.metadata().ancestor_timeline_id, "another parent");
        *self.ancestor.write() = Some(parent);
    }

    /// The branch point and the parent timeline, if this is a branch
    /// (`Err`: a branch whose parent is not attached).
    fn ancestor_for_read(&self) -> Result<Option<(Arc<Timeline>, Lsn)>, ReadError> {
        let Some(at) = self.ancestor_lsn else { return Ok(None) };
        match self.ancestor.read().clone() {
            Some(parent) => Ok(Some((parent, at))),
            None => Err(ReadError::NotFound(format!(
                "timeline {} is a branch of {} at {at}, which is not attached here",
                self.timeline_id,
                self.metadata().ancestor_timeline_id.map_or_else(|| "?".into(), |t| t.to_string())
            ))),
        }
    }

    /// Reads below a branch's start are the parent's, not the branch's.
    fn check_branch_start(&self, lsn: Lsn) -> Result<(), ReadError> {
        match self.ancestor_lsn {
            Some(start) if lsn < start => Err(ReadError::NotFound(format!(
                "timeline {} begins at {start} (a branch); {lsn} is before it",
                self.timeline_id
            ))),
            _ => Ok(()),
        }
    }

    /// Completes `out` with the versions the parent holds at the branch
    /// point (recursively, through every ancestor).
    fn collect_from_ancestor(&self, key: &Key, lsn: Lsn, out: &mut Versions) -> Result<(), ReadError> {
        if out.complete() {
            return Ok(());
        }
        let Some((parent, at)) = self.ancestor_for_read()? else { return Ok(()) };
        let older = parent.versions(key, lsn.min(at))?;
        out.append_older(older);
        Ok(())
    }

    /// Leases `lsn` for [`LEASE_TTL`] (or renews it), for `holder` if
    /// named (its earlier lease is replaced): GC keeps it readable until
    /// then. Refused below the GC cutoff, before a branch's start, beyond
    /// the ingested WAL; a named lease also more than `max_lag` bytes
    /// behind the ingested WAL (a replica that lags that far is restarted
    /// at the newest WAL rather than hold GC back).
    pub fn lease(&self, lsn: Lsn, holder: Option<&str>, max_lag: Option<u64>) -> Result<Duration, ReadError> {
        self.check_broken()?;
        self.check_readable_point(lsn)?;
        if let (Some(name), Some(max)) = (holder, max_lag) {
            let last = self.record_lsns().last;
            if last.0.saturating_sub(lsn.0) > max {
                return Err(ReadError::NotFound(format!(
                    "lease of {name} at {lsn}: {} bytes behind the WAL ingested ({last}), more than max_replica_lag_bytes {max}",
                    last.0 - lsn.0
                )));
            }
        }
        let mut leases = self.leases.lock();
        self.check_gc_cutoff(lsn)?;
        let now = self.clock.now();
        leases
            .grant(lsn, holder, now, now + LEASE_TTL)
            .map_err(|e| ReadError::NotFound(format!("timeline {}: {e}", self.timeline_id)))?;
        Ok(LEASE_TTL)
    }

    /// Whether `lsn` is a point a compute can start at: aligned, within the
    /// timeline's ingested WAL (`NotFound` otherwise), not below the GC
    /// cutoff (`BelowGcCutoff`).
    pub fn check_readable_point(&self, lsn: Lsn) -> Result<(), ReadError> {
        let start = self.meta.lock().start_lsn;
        let last = self.record_lsns().last;
        if !lsn.0.is_multiple_of(8) {
            return Err(ReadError::NotFound(format!(
                "{lsn} is not a WAL position: records begin at 8-byte aligned LSNs"
            )));
        }
        if lsn < start || lsn > last {
            return Err(ReadError::NotFound(format!(
                "{lsn} is outside timeline {} ({start} to the WAL ingested, {last})",
                self.timeline_id
            )));
        }
        self.check_gc_cutoff(lsn)
    }

    /// The live leases, lowest LSN first, with the seconds each has left
    /// and its holder if named.
    pub fn leases(&self) -> Vec<(Lsn, u64, Option<String>)> {
        self.leases.lock().live(self.clock.now())
    }

    /// Keeps `lsn` readable whatever GC does (a branch point): in the
    /// metadata, durably, and in the next index. `Some(cutoff)`: refused,
    /// the point is below the GC cutoff.
    pub fn retain_lsn(&self, lsn: Lsn) -> Result<Option<Lsn>, StorageError> {
        // GC holds the leases lock from reading the retained LSNs to
        // announcing its cutoff: either it sees this point, or this check
        // sees its cutoff.
        let _gc = self.leases.lock();
        let cutoff = self.gc_cutoff_lsn();
        if lsn < cutoff {
            return Ok(Some(cutoff));
        }
        self.install_layers_with(Vec::new(), &[], |m| {
            if !m.retain_lsns.contains(&lsn) {
                m.retain_lsns.push(lsn);
                m.retain_lsns.sort_unstable();
            }
        })
        .map(|_| None)
    }

    /// Lets GC have `lsn` again (a branch deleted), if no other branch
    /// point is at that LSN (`others`: how many remain there).
    pub fn release_lsn(&self, lsn: Lsn, others: usize) -> Result<(), StorageError> {
        if others > 0 {
            return Ok(());
        }
        self.install_layers_with(Vec::new(), &[], |m| m.retain_lsns.retain(|l| *l != lsn)).map(|_| ())
    }

    /// Where this timeline reads the time.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The timeline's object storage client, if the pageserver has object storage.
    pub fn remote(&self) -> Option<&Arc<RemoteTimeline>> {
        self.remote.get()
    }

    /// A new layer file of this timeline: evictable once uploaded.
    fn adopt(&self, layer: &LayerFile) {
        if let Some(r) = self.remote.get() {
            layer.set_remote(r.clone());
        }
    }

    /// Tells the upload loop that the metadata changed.
    fn metadata_changed(&self) {
        if let Some(r) = self.remote.get() {
            r.wake();
        }
    }

    /// Every layer file: name and bytes.
    pub fn layer_sizes(&self) -> Vec<(String, u64)> {
        self.historic().iter().map(|l| (l.name.to_string(), l.file_size)).collect()
    }

    /// Layer files on local disk, and their bytes.
    pub fn resident_layers(&self) -> (usize, u64) {
        let h = self.historic();
        h.iter().filter(|l| l.is_resident()).fold((0, 0), |(n, b), l| (n + 1, b + l.file_size))
    }

    /// Evicts every uploaded layer file that no read holds (operators and
    /// benchmarks: the next reads download what they need); returns the
    /// layers and bytes evicted.
    pub fn evict_all(&self) -> Result<(usize, u64), LayerError> {
        let Some(r) = self.remote.get().filter(|r| !r.is_reader()) else { return Ok((0, 0)) };
        let mut done = (0, 0);
        for l in self.historic().iter() {
            if l.is_resident() && r.is_in_index(&l.name.to_string()) && l.evict()? {
                done.0 += 1;
                done.1 += l.file_size;
            }
        }
        self.metrics.layers_evicted.inc_by(done.0 as u64);
        Ok(done)
    }

    /// Waits until the remote index covers `disk_consistent_lsn` (at once without object storage).
    pub fn wait_uploaded(&self, timeout: Duration) -> Result<Lsn, String> {
        let lsn = self.disk_consistent_lsn();
        if let Some(r) = self.remote.get() {
            r.wait_uploaded(lsn, timeout)?;
        }
        Ok(lsn)
    }

    pub fn metadata(&self) -> TimelineMetadata {
        self.meta.lock().clone()
    }

    /// Writes the metadata again, durably. A timeline re-read after a
    /// storage failure does this before it is used: reading works on a disk
    /// that still fails fsync, and a timeline that flushed into it again
    /// would only break again, after having looked healthy meanwhile. It
    /// also makes the removals of `load` durable.
    pub fn persist_metadata(&self) -> Result<(), StorageError> {
        self.write_metadata(&self.metadata())
    }

    /// Writes `meta` durably; only then may it be installed in memory.
    fn write_metadata(&self, meta: &TimelineMetadata) -> Result<(), StorageError> {
        let text = serde_json::to_vec_pretty(meta).expect("metadata serializes");
        Ok(replace_file(&self.dir.join(METADATA_FILE), &text, self.fsync)?)
    }

    /// Stops the timeline: ingest, flushes and reads refuse from now on.
    /// The first reason is kept.
    pub fn set_broken(&self, kind: BrokenKind, reason: String) {
        let mut broken = self.broken.lock();
        if broken.is_some() {
            return;
        }
        warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, ?kind, %reason, "timeline is broken");
        let since = self.clock.system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        *broken = Some(Broken { kind, reason, since, reload_attempts: 0, last_reload_error: None });
    }

    /// Records a failed attempt to re-read this broken timeline from disk.
    pub fn note_reload_failure(&self, error: String) {
        if let Some(b) = self.broken.lock().as_mut() {
            b.reload_attempts += 1;
            b.last_reload_error = Some(error);
        }
    }

    pub fn broken(&self) -> Option<Broken> {
        self.broken.lock().clone()
    }

    pub fn is_broken(&self) -> bool {
        self.broken.lock().is_some()
    }

    pub fn broken_reason(&self) -> Option<String> {
        self.broken.lock().as_ref().map(|b| b.reason.clone())
    }

    /// Takes the timeline out of service (its tenant moved elsewhere):
    /// every read, and every wait for an LSN, ends with `NotAttached`.
    pub fn detach(&self) {
        self.detached.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the waits for LSNs, which look at the flag.
        self.lsns.send_modify(|_| {});
    }

    /// Whether [`Self::detach`] was called.
    pub fn is_detached(&self) -> bool {
        self.detached.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn check_broken(&self) -> Result<(), ReadError> {
        if self.is_detached() {
            return Err(ReadError::NotAttached { timeline: self.timeline_id });
        }
        match self.broken_reason() {
            Some(reason) => Err(ReadError::Broken { timeline: self.timeline_id, reason }),
            None => Ok(()),
        }
    }

    pub fn record_lsns(&self) -> RecordLsns {
        *self.lsns.borrow()
    }

    pub fn subscribe_lsns(&self) -> tokio::sync::watch::Receiver<RecordLsns> {
        self.lsns.subscribe()
    }

    pub fn disk_consistent_lsn(&self) -> Lsn {
        self.meta.lock().disk_consistent_lsn
    }

    /// Whether so many L0 deltas wait for compaction that ingest must slow down.
    pub fn backpressure(&self) -> bool {
        self.layers.read().historic.l0_count() >= self.policy.l0_backpressure_threshold
    }

    /// The LSN reported to the safekeepers as applied: `disk_consistent_lsn`,
    /// or, while L0s pile up past `l0_backpressure_threshold`, the start of
    /// the oldest of them. The proposer holds commits back while consumers
    /// lag more than its limit, so ingest slows until compaction catches up
    /// (`docs/bottomless-pageserver.md`, "Backpressure").
    pub fn feedback_lsn(&self) -> Lsn {
        let dcl = self.disk_consistent_lsn();
        let mut lsn = dcl;
        if self.backpressure() {
            lsn = self.layers.read().historic.l0().first().map_or(dcl, |l| l.name.lsn_start.min(dcl));
        }
        // While uploads lag too far (object storage down or slow), the
        // applied LSN stops at what object storage has.
        if self.upload_backpressure() {
            let uploaded = self.remote.get().map_or(Lsn::INVALID, |r| r.remote_consistent_lsn());
            let floor = if uploaded == Lsn::INVALID { self.meta.lock().start_lsn } else { uploaded };
            lsn = lsn.min(floor);
        }
        lsn
    }

    /// Whether local layers not yet in object storage pass `max_upload_lag_bytes`.
    pub fn upload_backpressure(&self) -> bool {
        self.upload_status().is_some_and(|u| u.backpressure)
    }

    /// The remote side's status (`None` without object storage).
    pub fn upload_status(&self) -> Option<crate::remote::UploadStatus> {
        self.remote.get().map(|r| r.status(&self.layer_sizes()))
    }

    /// `disk_consistent_lsn` of the newest index in object storage.
    pub fn remote_consistent_lsn(&self) -> Option<Lsn> {
        self.remote.get().map(|r| r.remote_consistent_lsn())
    }

    /// Resolves LSN 0 ("latest") and waits until `lsn` is ingested.
    pub async fn wait_lsn(&self, lsn: Lsn, timeout: Duration) -> Result<Lsn, ReadError> {
        self.check_broken()?;
        if lsn == Lsn::INVALID {
            return Ok(self.record_lsns().last);
        }
        let start = self.meta.lock().start_lsn;
        if lsn < start {
            return Err(ReadError::NotFound(format!(
                "{lsn} is before the start of timeline {} ({start})",
                self.timeline_id
            )));
        }
        let mut rx = self.lsns.subscribe();
        // An idle timeline is woken at once: no WAL streams until then.
        let _waiting = (rx.borrow().last < lsn).then(|| self.activity.wait_for_wal());
        let waiting = rx.wait_for(|l| l.last >= lsn || self.is_detached());
        let reached = strata_service::clock::timeout(&*self.clock, timeout, waiting).await.is_ok_and(|r| r.is_ok());
        self.check_broken()?;
        match reached {
            true => Ok(lsn),
            false => Err(ReadError::LsnTimeout {
                timeline: self.timeline_id,
                lsn,
                last: self.record_lsns().last,
                waited: timeout,
            }),
        }
    }

    // ---- writes (the single ingest thread) ----

    /// Adds the versions one record produced and advances the record LSNs.
    pub fn commit_record(&self, mut batch: Vec<(Key, Lsn, Value)>, lsns: RecordLsns) {
        debug_assert!(lsns.last >= self.record_lsns().last, "record LSNs go backwards");
        // A shard stores only its own keys, whoever made the versions
        // (ingest skips other shards' blocks early; an import does not).
        if !self.shard.index.is_unsharded() {
            batch.retain(|(key, _, _)| key.is_stored_on(&self.shard));
        }
        // Holding the map (shared) across both steps keeps a concurrent
        // freeze from cutting between the versions and their record LSNs.
        let map = self.layers.read();
        if !batch.is_empty() {
            map.open.put_batch(batch);
        }
        self.lsns.send_replace(lsns);
    }

    /// Whether nothing ingested is only in memory: no in-memory layer holds
    /// a version, and every record ingested is below `disk_consistent_lsn`.
    pub fn is_all_durable(&self) -> bool {
        let map = self.layers.read();
        map.open.is_empty() && map.frozen.is_empty() && self.record_lsns().last == self.disk_consistent_lsn()
    }

    /// Whether the open layer should be frozen (large enough, or old enough and not empty).
    pub fn should_freeze(&self, max_age: Duration) -> bool {
        let open = self.layers.read().open.clone();
        let bytes = open.bytes() as u64;
        let opened_at = *self.opened_at.lock();
        bytes >= self.checkpoint_distance || (bytes > 0 && self.clock.since(opened_at) >= max_age)
    }

    /// Freezes the open layer at the current record LSNs; waits while too
    /// many frozen layers are unflushed, so memory stays bounded.
    pub fn freeze(&self) {
        {
            let mut map = self.layers.write();
            let lsns = self.record_lsns();
            if map.open.is_empty() && map.frozen.is_empty() && lsns.last == self.disk_consistent_lsn() {
                return;
            }
            let next = Arc::new(InMemoryLayer::new(Lsn(lsns.last.0 + 1)));
            let old = std::mem::replace(&mut map.open, next);
            old.freeze(Lsn(lsns.last.0 + 1));
            map.frozen.push((old, lsns));
        }
        *self.opened_at.lock() = self.clock.now();
        let mut guard = self.flush_wait.lock();
        while self.layers.read().frozen.len() > crate::limits::MAX_FROZEN && self.broken_reason().is_none() {
            // Woken by each flush; the timeout only notices a timeline that broke.
            self.flushed.wait_for(&mut guard, crate::limits::FROZEN_WAIT_POLL);
        }
    }

    /// Writes every frozen layer to a delta layer file and advances
    /// `disk_consistent_lsn` — in memory only after the metadata naming the
    /// file is durable. Called by the flusher thread (and checkpoints). A
    /// failure breaks the timeline: after a failed fsync nothing since the
    /// last good one can be trusted.
    pub fn flush_frozen(&self) -> Result<(), FlushError> {
        let _guard = self.flush_lock.lock();
        loop {
            if let Some(b) = self.broken() {
                let source = StorageError::Invalid { path: self.dir.clone(), reason: format!("broken: {}", b.reason) };
                return Err(self.flush_error(self.disk_consistent_lsn(), source));
            }
            let Some((layer, lsns)) = self.layers.read().frozen.first().cloned() else { return Ok(()) };
            if let Err(source) = self.flush_one(&layer, lsns) {
                self.set_broken(BrokenKind::Storage, format!("flushing up to {}: {source}", lsns.last));
                return Err(self.flush_error(lsns.last, source));
            }
            let _g = self.flush_wait.lock();
            self.flushed.notify_all();
        }
    }

    fn flush_error(&self, lsn: Lsn, source: StorageError) -> FlushError {
        FlushError { tenant_id: self.tenant_id, timeline_id: self.timeline_id, lsn, source }
    }

    /// Freezes and flushes everything ingested so far.
    pub fn checkpoint(&self) -> Result<(), FlushError> {
        self.freeze();
        self.flush_frozen()
    }

    /// In-memory layers, and layer files by kind.
    pub fn layer_count(&self) -> (usize, LayerCounts) {
        let map = self.layers.read();
        (map.frozen.len() + 1, map.historic.counts())
    }

    /// The layer files now.
    pub fn historic(&self) -> Arc<HistoricLayers> {
        self.layers.read().historic.clone()
    }

    /// Drops from `removed_layers` the files that are gone.
    fn prune_removed(&self, meta: &mut TimelineMetadata) {
        meta.removed_layers.retain(|n| self.dir.join(n).exists());
    }

    // ---- reads ----

    /// Gathers the versions of `key` visible at `lsn`.
    /// Refuses reads below the GC cutoff.
    fn check_gc_cutoff(&self, lsn: Lsn) -> Result<(), ReadError> {
        let cutoff = Lsn(self.gc_cutoff.load(std::sync::atomic::Ordering::Acquire));
        if lsn < cutoff {
            return Err(ReadError::BelowGcCutoff { timeline: self.timeline_id, lsn, cutoff });
        }
        Ok(())
    }

    /// Refuses reads below the GC cutoff, except at a retained LSN: a
    /// child reads its parent at exactly its branch point, and GC keeps
    /// what those reads need.
    fn check_read_point(&self, lsn: Lsn) -> Result<(), ReadError> {
        match self.check_gc_cutoff(lsn) {
            Err(_) if self.meta.lock().retain_lsns.contains(&lsn) => Ok(()),
            r => r,
        }
    }

    /// Reads below this LSN are refused (but at retained LSNs).
    pub fn gc_cutoff_lsn(&self) -> Lsn {
        Lsn(self.gc_cutoff.load(std::sync::atomic::Ordering::Acquire))
    }

    fn versions(&self, key: &Key, lsn: Lsn) -> Result<Versions, ReadError> {
        self.check_broken()?;
        self.check_read_point(lsn)?;
        self.check_branch_start(lsn)?;
        let (memory, historic) = self.layers.read().snapshot();
        let mut out = Versions::default();
        let mut visited = 0u32;
        for layer in memory {
            if layer.start_lsn > lsn {
                continue;
            }
            visited += 1;
            if layer.collect(key, lsn, &mut out) {
                break;
            }
        }
        if !out.complete() {
            visited += historic.collect(key, lsn, &mut out)?;
        }
        self.metrics.read_layers_visited.observe(f64::from(visited));
        self.collect_from_ancestor(key, lsn, &mut out)?;
        Ok(out)
    }

    /// The value of `key` at `lsn`, or `None` if it never had one.
    pub fn get(&self, key: &Key, lsn: Lsn) -> Result<Option<Bytes>, ReadError> {
        let versions = self.versions(key, lsn)?;
        self.reconstruct(key, lsn, versions)
    }

    /// Values of several keys at one LSN, visiting the layer map once (batched GetPage).
    pub fn get_many(&self, keys: &[Key], lsn: Lsn) -> Vec<Result<Option<Bytes>, ReadError>> {
        if let Err(e) = self.check_broken() {
            return keys
                .iter()
                .map(|_| Err(ReadError::Broken { timeline: self.timeline_id, reason: e.to_string() }))
                .collect();
        }
        if self.check_read_point(lsn).is_err() {
            let cutoff = self.gc_cutoff_lsn();
            return keys
                .iter()
                .map(|_| Err(ReadError::BelowGcCutoff { timeline: self.timeline_id, lsn, cutoff }))
                .collect();
        }
        if let Err(e) = self.check_branch_start(lsn) {
            let message = e.to_string();
            return keys.iter().map(|_| Err(ReadError::NotFound(message.clone()))).collect();
        }
        let (memory, historic) = self.layers.read().snapshot();
        let mut found: Vec<Result<Versions, LayerError>> = keys.iter().map(|_| Ok(Versions::default())).collect();
        let mut visited = vec![0u32; keys.len()];
        for layer in memory {
            if layer.start_lsn > lsn {
                continue;
            }
            for ((key, slot), n) in keys.iter().zip(found.iter_mut()).zip(visited.iter_mut()) {
                let Ok(v) = slot else { continue };
                if v.complete() {
                    continue;
                }
                *n += 1;
                layer.collect(key, lsn, v);
            }
        }
        historic.collect_many(keys, lsn, &mut found, &mut visited);
        for n in visited {
            self.metrics.read_layers_visited.observe(f64::from(n));
        }
        keys.iter()
            .zip(found)
            .map(|(key, v)| {
                let mut v = v?;
                self.collect_from_ancestor(key, lsn, &mut v)?;
                self.reconstruct(key, lsn, v)
            })
            .collect()
    }

    fn reconstruct(&self, key: &Key, lsn: Lsn, versions: Versions) -> Result<Option<Bytes>, ReadError> {
        let mut list = versions.list;
        let Some(&(newest, _)) = list.first() else { return Ok(None) };
        let corrupt = |reason: String| ReadError::Corrupt { timeline: self.timeline_id, reason };
        // A page rebuilt before, at a version this read includes, replaces
        // that version and everything older.
        if list.len() > 1 {
            if let Some((at, page)) = self.rebuilt.get(key) {
                if let Some(i) = list.iter().position(|(l, _)| *l == at) {
                    self.metrics.rebuilt_page_hits.inc();
                    if i == 0 {
                        return Ok(Some(page));
                    }
                    list.truncate(i);
                    list.push((at, Value::Image(page)));
                }
            }
        }
        // A relation directory's changes apply to its last whole version.
        if list.iter().any(|(_, v)| matches!(v, Value::RelDirChange(_))) {
            let dir = self.reconstruct_rel_dir(key, lsn, &list)?;
            if list.len() > 1 {
                self.rebuilt.insert(*key, newest, dir.clone());
            }
            return Ok(Some(dir));
        }
        let Some((_, oldest)) = list.last() else { return Ok(None) };
        // The page to apply the newer versions to; changes without an older
        // image start from zeros, as PostgreSQL reads a page that was never written.
        let mut page: Vec<u8> = match oldest {
            Value::Image(b) if list.len() == 1 => return Ok(Some(b.clone())),
            Value::Image(b) => {
                let page = b.to_vec();
                list.pop();
                page
            }
            Value::ZeroPage => {
                list.pop();
                vec![0u8; BLCKSZ]
            }
            Value::Native(_) | Value::Wal(_) if key.is_page() => vec![0u8; BLCKSZ],
            Value::Native(_) | Value::Wal(_) | Value::RelDirChange(_) => {
                return Err(corrupt(format!("key {key} has only changes, no base, at {lsn}")))
            }
        };
        let applied = !list.is_empty();
        if applied {
            let page: &mut [u8; BLCKSZ] = page
                .as_mut_slice()
                .try_into()
                .map_err(|_| corrupt(format!("key {key}: changes on top of a value of {} bytes", list.len())))?;
            self.metrics.redo_records_applied.inc_by(list.len() as u64);
            for (i, (l, v)) in list.iter().enumerate().rev() {
                match v {
                    Value::Native(r) => r.apply(page).map_err(|e| corrupt(format!("key {key} at {l}: {e}")))?,
                    // Only the oldest version gathered can be a record that initializes the page.
                    Value::Wal(w) if !w.will_init || i == list.len() - 1 => {
                        w.apply(self.pg_version, page).map_err(|e| corrupt(format!("key {key}: {e}")))?
                    }
                    _ => return Err(corrupt(format!("key {key}: base version above the oldest at {l}"))),
                }
            }
            if let Some((tag, block)) = key.as_rel_block() {
                let new = strata_formats::page::is_new(&page[..]).unwrap_or(true);
                if tag.fork != ForkNumber::Fsm && !new && self.data_checksums()? {
                    // The changes moved pd_lsn and the content: the checksum follows.
                    strata_formats::page::checksum::set_checksum(page, block);
                }
            }
        }
        let page = Bytes::from(page);
        if applied {
            self.rebuilt.insert(*key, newest, page.clone());
        }
        Ok(Some(page))
    }

    /// A relation directory from its versions (newest first): the oldest a
    /// whole directory, every newer one a change to apply to it.
    fn reconstruct_rel_dir(&self, key: &Key, lsn: Lsn, list: &[(Lsn, Value)]) -> Result<Bytes, ReadError> {
        let corrupt = |reason: String| ReadError::Corrupt { timeline: self.timeline_id, reason };
        let Some(((base_lsn, Value::Image(base)), changes)) = list.split_last() else {
            return Err(corrupt(format!("key {key}: relation directory changes without a whole directory at {lsn}")));
        };
        let mut dir = dirs::decode_rels(base).map_err(|e| self.decode_err("relation directory", *base_lsn, e))?;
        for (l, v) in changes.iter().rev() {
            match v {
                Value::RelDirChange(c) => c.apply(&mut dir),
                _ => {
                    return Err(corrupt(format!("key {key}: a version at {l} that is not a relation directory change")))
                }
            }
        }
        self.metrics.redo_records_applied.inc_by(changes.len() as u64);
        Ok(Bytes::from(dirs::encode_rels(&dir)))
    }

    /// Whether the cluster has data checksums (pages served must carry them).
    fn data_checksums(&self) -> Result<bool, ReadError> {
        if let Some(on) = self.checksums.get() {
            return Ok(*on);
        }
        let lsn = self.record_lsns().last;
        // Before the import there is no pg_control, and no page either.
        let Some(b) = self.get(&Key::control(), lsn)? else { return Ok(false) };
        let control = ControlFile::decode(&b).map_err(|e| self.decode_err("pg_control", lsn, e))?;
        Ok(*self.checksums.get_or_init(|| control.data_checksum_version != 0))
    }

    fn decode_err(&self, what: &str, lsn: Lsn, e: impl std::fmt::Display) -> ReadError {
        ReadError::Corrupt { timeline: self.timeline_id, reason: format!("{what} at {lsn}: {e}") }
    }

    /// Records a relation fork's new size (or its removal) at `lsn`, before
    /// the record that makes it is visible (called by ingest only).
    pub fn note_rel_size(&self, tag: RelTag, lsn: Lsn, size: Option<BlockNumber>) {
        self.rel_size_cache.write().insert(tag, (lsn, size));
    }

    /// Size of a relation fork in blocks, `None` if it does not exist.
    pub fn rel_size(&self, tag: RelTag, lsn: Lsn) -> Result<Option<BlockNumber>, ReadError> {
        self.rel_size_checked(tag, lsn, true)
    }

    /// Size of a relation fork that the caller found in its relation
    /// directory at `lsn`. Walking a directory this way reads the directory
    /// once rather than once per relation (80 000 relations made that
    /// minutes of a cold basebackup).
    pub fn listed_rel_size(&self, tag: RelTag, lsn: Lsn) -> Result<BlockNumber, ReadError> {
        Ok(self.rel_size_checked(tag, lsn, false)?.unwrap_or(0))
    }

    fn rel_size_checked(&self, tag: RelTag, lsn: Lsn, check_dir: bool) -> Result<Option<BlockNumber>, ReadError> {
        if let Some((since, size)) = self.rel_size_cache.read().get(&tag) {
            if *since <= lsn {
                return Ok(*size);
            }
        }
        let size = self.rel_size_uncached(tag, lsn, check_dir)?;
        let mut cache = self.rel_size_cache.write();
        // Only a newer answer replaces an entry: ingest may have noted a
        // change after this read began.
        if cache.get(&tag).is_none_or(|(since, _)| *since < lsn) {
            cache.insert(tag, (lsn, size));
        }
        Ok(size)
    }

    fn rel_size_uncached(&self, tag: RelTag, lsn: Lsn, check_dir: bool) -> Result<Option<BlockNumber>, ReadError> {
        if check_dir && !self.rel_dir(tag.rel.spc, tag.rel.db, lsn)?.contains(&(tag.rel.rel, tag.fork as u8)) {
            return Ok(None);
        }
        match self.get(&Key::rel_size(tag), lsn)? {
            Some(b) if b.len() == 4 => Ok(Some(u32::from_le_bytes(b[..].try_into().expect("4 bytes")))),
            Some(b) => Err(self.decode_err("relation size", lsn, format_args!("{} bytes", b.len()))),
            None => Ok(Some(0)),
        }
    }

    /// A page of a relation; blocks never written read as zeros.
    pub fn rel_page(&self, tag: RelTag, block: BlockNumber, lsn: Lsn) -> Result<Bytes, ReadError> {
        let size = self
            .rel_size(tag, lsn)?
            .ok_or_else(|| ReadError::NotFound(format!("relation {tag} does not exist at {lsn}")))?;
        if block >= size {
            return Err(ReadError::NotFound(format!("block {block} of {tag} is beyond its {size} blocks at {lsn}")));
        }
        Ok(self.get(&Key::rel_block(tag, block), lsn)?.unwrap_or_else(|| Bytes::from(vec![0u8; BLCKSZ])))
    }

    pub fn db_dir(&self, lsn: Lsn) -> Result<BTreeSet<(Oid, Oid)>, ReadError> {
        match self.get(&Key::db_dir(), lsn)? {
            Some(b) => dirs::decode_pairs(&b).map_err(|e| self.decode_err("database directory", lsn, e)),
            None => Ok(BTreeSet::new()),
        }
    }

    pub fn rel_dir(&self, spc: Oid, db: Oid, lsn: Lsn) -> Result<BTreeSet<(Oid, u8)>, ReadError> {
        match self.get(&Key::rel_dir(spc, db), lsn)? {
            Some(b) => dirs::decode_rels(&b).map_err(|e| self.decode_err("relation directory", lsn, e)),
            None => Ok(BTreeSet::new()),
        }
    }

    /// Size of a database's relations in bytes.
    pub fn db_size(&self, spc: Oid, db: Oid, lsn: Lsn) -> Result<u64, ReadError> {
        let mut total = 0u64;
        for (rel, fork) in self.rel_dir(spc, db, lsn)? {
            let Some(fork) = strata_formats::types::ForkNumber::from_u8(fork) else { continue };
            let tag = RelTag { rel: strata_formats::types::RelFileNode { spc, db, rel }, fork };
            total += u64::from(self.listed_rel_size(tag, lsn)?) * BLCKSZ as u64;
        }
        Ok(total)
    }

    pub fn slru_segments(&self, kind: SlruKind, lsn: Lsn) -> Result<BTreeSet<u32>, ReadError> {
        match self.get(&Key::slru_dir(kind), lsn)? {
            Some(b) => dirs::decode_u32s(&b).map_err(|e| self.decode_err("SLRU directory", lsn, e)),
            None => Ok(BTreeSet::new()),
        }
    }

    pub fn twophase_xids(&self, lsn: Lsn) -> Result<BTreeSet<u32>, ReadError> {
        match self.get(&Key::twophase_dir(), lsn)? {
            Some(b) => dirs::decode_u32s(&b).map_err(|e| self.decode_err("two-phase directory", lsn, e)),
            None => Ok(BTreeSet::new()),
        }
    }

    pub fn checkpoint_at(&self, lsn: Lsn) -> Result<CheckPoint, ReadError> {
        let b = self.get(&Key::checkpoint(), lsn)?.ok_or_else(|| self.decode_err("checkpoint", lsn, "missing"))?;
        CheckPoint::decode(&b).map_err(|e| self.decode_err("checkpoint", lsn, e))
    }

    /// The last checkpoint record that ends at or before `lsn`, if ingest saw one.
    pub fn checkpoint_record_at(&self, lsn: Lsn) -> Result<Option<CheckpointRecord>, ReadError> {
        match self.get(&Key::checkpoint_record(), lsn)? {
            Some(b) => CheckpointRecord::decode(&b).map(Some).map_err(|e| self.decode_err("checkpoint record", lsn, e)),
            None => Ok(None),
        }
    }

    /// The commit time recorded at or before `lsn` (µs since 2000-01-01), if any.
    pub fn commit_time_at(&self, lsn: Lsn) -> Result<Option<i64>, ReadError> {
        match self.get(&Key::commit_time(), lsn)? {
            Some(b) if b.len() == 8 => Ok(Some(i64::from_le_bytes(b[..].try_into().expect("8 bytes")))),
            Some(b) => Err(self.decode_err("commit time", lsn, format_args!("{} bytes", b.len()))),
            None => Ok(None),
        }
    }

    pub fn control_template(&self) -> Result<ControlFile, ReadError> {
        let lsn = self.record_lsns().last;
        let b = self.get(&Key::control(), lsn)?.ok_or_else(|| self.decode_err("pg_control", lsn, "missing"))?;
        ControlFile::decode(&b).map_err(|e| self.decode_err("pg_control", lsn, e))
    }
}
