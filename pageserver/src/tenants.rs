//! The tenants and timelines this pageserver holds: loading them at start,
//! bootstrapping new ones, their WAL receivers, and re-reading broken ones.
//!
//! On-disk layout: `<data_dir>/tenants/<tenant>/timelines/<timeline>/`
//! holds `metadata.json` and the timeline's layer files. A creation in
//! progress is marked by `<timeline>.creating` next to that directory,
//! written durably before the directory's first byte and removed once the
//! timeline is complete: only a marked directory is ever removed at start.
//! Anything else unexpected (no metadata, unlisted files, damage) makes the
//! timeline `broken` with the reason, and its files stay as they are.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use strata_protocol::{TenantShardId, TimelineId, Token};
use strata_service::backoff::Backoff;
use tracing::{error, info, warn};

mod activity;
mod heatmaps;
mod locations;
mod readers;
pub use activity::Commits;
pub use locations::LocationError;

use crate::config::PageserverConfig;
use crate::import::{self, ImportError};
use crate::metrics::Metrics;
use crate::remote::{Attachments, Remote, RemoteTimeline};
use strata_protocol::api::pageserver::{Lease, TimelineState, TimelineStatus};
use strata_service::durable::{replace_file, sync_dir};

use crate::timeline::{BrokenKind, StorageError, Timeline, TimelineMetadata, TimelineResources};
use crate::walreceiver::{ReceiverStatus, SpawnError, WalReceiver, WalSources};
use strata_formats::{Lsn, PgVersion};

/// Suffix of a creation marker (`<timeline>.creating`).
const CREATING_SUFFIX: &str = ".creating";
/// Suffix of a deletion marker (`<timeline>.deleting`): the timeline was
/// asked to go and is no longer served; its objects and directory go
/// before the marker does (a retry of the deletion or the next start
/// finishes what a failure interrupted).
const DELETING_SUFFIX: &str = ".deleting";
use crate::limits::{RELOAD_MAX_DELAY, RELOAD_MIN_DELAY, SHUTDOWN_UPLOAD_WAIT};

/// `disk_consistent_lsn` of a timeline directory's metadata, if readable.
fn local_disk_consistent_lsn(dir: &Path) -> Option<Lsn> {
    let text = std::fs::read_to_string(dir.join(crate::timeline::METADATA_FILE)).ok()?;
    let meta: crate::timeline::TimelineMetadata = serde_json::from_str(&text).ok()?;
    (meta.disk_consistent_lsn != Lsn::INVALID).then_some(meta.disk_consistent_lsn)
}

/// A timeline with its WAL receiver (none while it idles).
pub struct TimelineEntry {
    pub tl: Arc<Timeline>,
    pub receiver: Arc<Mutex<ReceiverStatus>>,
    handle: Mutex<Option<WalReceiver>>,
    /// Set (under `handle`) once the entry is out of service (deleted,
    /// detached, replaced, shut down): the watcher never wakes it again.
    retired: std::sync::atomic::AtomicBool,
}

/// Why a branch could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("timeline {0}/{1} already exists")]
    Exists(TenantShardId, TimelineId),
    #[error("parent timeline {0}/{1} not found")]
    ParentNotFound(TenantShardId, TimelineId),
    #[error("parent timeline {parent} is broken: {reason}")]
    ParentBroken { parent: TimelineId, reason: String },
    #[error("{lsn} is not a WAL position: records begin at 8-byte aligned LSNs")]
    NotAligned { lsn: Lsn },
    #[error("{lsn} is before the start of timeline {parent} ({start})")]
    BeforeStart { lsn: Lsn, start: Lsn, parent: TimelineId },
    #[error("{lsn} is in the future: timeline {parent} has WAL up to {last}")]
    InFuture { lsn: Lsn, last: Lsn, parent: TimelineId },
    #[error("{lsn} is below the GC cutoff {cutoff} of timeline {parent}: its history before the cutoff is gone (see pitr_interval)")]
    BelowGcCutoff { lsn: Lsn, cutoff: Lsn, parent: TimelineId },
    #[error("timeline {parent} has no commit at or before that time that is still readable")]
    NoCommitThatOld { parent: TimelineId },
    #[error("branch {tenant}/{timeline}: {source}")]
    Storage {
        tenant: TenantShardId,
        timeline: TimelineId,
        #[source]
        source: StorageError,
    },
    #[error("branch {tenant}/{timeline}: {source}")]
    Receiver {
        tenant: TenantShardId,
        timeline: TimelineId,
        #[source]
        source: SpawnError,
    },
    #[error("reading the parent: {0}")]
    Read(#[from] crate::timeline::ReadError),
    #[error("{0}")]
    Other(String),
}

/// Why a timeline could not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("timeline {0}/{1} not found")]
    NotFound(TenantShardId, TimelineId),
    #[error("timeline {timeline} has branches ({}); delete them first", children.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "))]
    HasBranches { timeline: TimelineId, children: Vec<TimelineId> },
    #[error("timeline {timeline}: deleting its objects: {reason}")]
    Remote { timeline: TimelineId, reason: String },
    #[error("timeline {timeline}: {source}")]
    Storage {
        timeline: TimelineId,
        #[source]
        source: StorageError,
    },
}

/// Where a new tenant's first timeline comes from.
enum Origin<'a> {
    /// The kept `initdb` output of this major: a new identity per tenant,
    /// or for a shard other than 0 the system identifier of its shard 0.
    Initdb(PgVersion, Option<u64>),
    /// An existing database's data directory, cleanly shut down.
    Directory(&'a Path),
}

/// Why a tenant could not be bootstrapped (or imported).
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("timeline {0}/{1} already exists")]
    Exists(TenantShardId, TimelineId),
    #[error("bootstrap of {tenant}/{timeline}: {source}")]
    Import {
        tenant: TenantShardId,
        timeline: TimelineId,
        #[source]
        source: Box<ImportError>,
    },
    #[error("bootstrap of {tenant}/{timeline}: {source}")]
    Storage {
        tenant: TenantShardId,
        timeline: TimelineId,
        #[source]
        source: StorageError,
    },
    #[error("tenant {tenant} is not attached to this pageserver: {reason}")]
    NotAttached { tenant: TenantShardId, reason: String },
    #[error("timeline {tenant}/{timeline}: {source}")]
    Receiver {
        tenant: TenantShardId,
        timeline: TimelineId,
        #[source]
        source: SpawnError,
    },
}

/// Why the tenants could not be loaded at all (a single timeline that
/// does not load is reported broken instead).
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct LoadError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

pub struct Tenants {
    pub conf: Arc<PageserverConfig>,
    pub metrics: Arc<Metrics>,
    pub resources: TimelineResources,
    /// Object storage, if configured.
    pub remote: Option<Arc<Remote>>,
    /// Where every timeline's WAL receiver streams from.
    wal_sources: WalSources,
    /// Calls the watcher that wakes idle timelines (`watcher.rs`).
    pub wakeups: Arc<tokio::sync::Notify>,
    /// The generation of each tenant attached here, read at start (and at
    /// bootstrap): the one this pageserver's objects carry.
    generations: Mutex<HashMap<TenantShardId, u32>>,
    /// The tenants kept warm here for another pageserver.
    pub secondaries: crate::secondary::Secondaries,
    /// Tenants whose attachment is under way: their timelines are not all
    /// loaded yet, so they count as not attached (a compute asking now
    /// retries, rather than hear that a timeline does not exist).
    attaching: Mutex<std::collections::HashSet<TenantShardId>>,
    /// Tenants held here as a site's reader, every timeline loaded
    /// (`docs/sites.md`, "A pageserver per site").
    readers: Mutex<std::collections::HashSet<TenantShardId>>,
    timelines: RwLock<BTreeMap<(TenantShardId, TimelineId), Arc<TimelineEntry>>>,
    creating: Mutex<()>,
    /// Imports receiving their data now (`crate::limits::IMPORTS_AT_ONCE`).
    pub importing: Arc<tokio::sync::Semaphore>,
    /// The kept `initdb` output new tenants are imported from.
    initdb: crate::initdb_template::InitdbTemplates,
    /// When each broken timeline is re-read next, and its backoff.
    reloads: Mutex<HashMap<(TenantShardId, TimelineId), (Instant, Backoff)>>,
    /// Held through a metrics scrape (`render_metrics`).
    scrape: Mutex<()>,
    /// Set when a timeline was deleted: its memory went back to the
    /// allocator, and the watcher returns it to the system (`heap_trim.rs`).
    trim_wanted: std::sync::atomic::AtomicBool,
}

/// Where the timelines' WAL receivers stream from, and when they idle.
fn wal_sources(
    conf: &PageserverConfig,
    token: Option<Token>,
    tls: Option<strata_service::tls::ClientTls>,
) -> WalSources {
    WalSources {
        safekeepers: conf.safekeepers.clone(),
        site: conf.site_safekeepers,
        token,
        tls,
        idle_after: conf.idle_after(),
        wal_stream: conf.wal_stream,
    }
}

fn marker_path(timeline_dir: &Path) -> PathBuf {
    suffixed(timeline_dir, CREATING_SUFFIX)
}

fn deleting_marker(timeline_dir: &Path) -> PathBuf {
    suffixed(timeline_dir, DELETING_SUFFIX)
}

/// The metadata of a timeline directory, if it is still readable (the
/// branch point a deletion releases).
fn read_metadata(dir: &Path) -> Option<TimelineMetadata> {
    let text = std::fs::read(dir.join(crate::timeline::METADATA_FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}

fn suffixed(timeline_dir: &Path, suffix: &str) -> PathBuf {
    let mut name = timeline_dir.file_name().expect("a timeline directory has a name").to_os_string();
    name.push(suffix);
    timeline_dir.with_file_name(name)
}

impl Tenants {
    fn timeline_dir(&self, tenant: TenantShardId, timeline: TimelineId) -> PathBuf {
        self.conf.data_dir.join("tenants").join(tenant.to_string()).join("timelines").join(timeline.to_string())
    }

    /// Loads every timeline under the data directory and starts its WAL receiver.
    pub fn load(
        conf: Arc<PageserverConfig>,
        resources: TimelineResources,
        remote: Option<Arc<Remote>>,
        token: Option<Token>,
        tls: Option<strata_service::tls::ClientTls>,
    ) -> Result<Arc<Tenants>, LoadError> {
        let mut generations = HashMap::new();
        let mut secondaries = Vec::new();
        let mut readers = Vec::new();
        if let Some(r) = &remote {
            let a = Attachments::load(r.attachments_path()).map_err(|e| LoadError {
                op: "reading",
                path: r.attachments_path().to_path_buf(),
                source: std::io::Error::other(e),
            })?;
            generations = a.tenants.keys().filter_map(|t| a.generation(*t).map(|g| (*t, g))).collect();
            secondaries = a
                .tenants
                .iter()
                .filter(|(_, at)| at.mode == crate::remote::attachments::LocationMode::Secondary)
                .map(|(t, _)| *t)
                .collect();
            readers = a
                .tenants
                .iter()
                .filter(|(_, at)| at.mode == crate::remote::attachments::LocationMode::Reader)
                .map(|(t, _)| *t)
                .collect();
        }
        let tenants = Arc::new(Tenants {
            conf: conf.clone(),
            wal_sources: wal_sources(&conf, token, tls),
            wakeups: Arc::new(tokio::sync::Notify::new()),
            metrics: resources.metrics.clone(),
            resources,
            remote,
            generations: Mutex::new(generations),
            secondaries: Default::default(),
            attaching: Mutex::new(std::collections::HashSet::new()),
            readers: Mutex::new(std::collections::HashSet::new()),
            timelines: RwLock::new(BTreeMap::new()),
            creating: Mutex::new(()),
            importing: Arc::new(tokio::sync::Semaphore::new(crate::limits::IMPORTS_AT_ONCE)),
            initdb: crate::initdb_template::InitdbTemplates::new(
                conf.initdb_template_dir.clone().unwrap_or_else(|| conf.data_dir.join("initdb-template")),
            ),
            reloads: Mutex::new(HashMap::new()),
            scrape: Mutex::new(()),
            trim_wanted: std::sync::atomic::AtomicBool::new(false),
        });
        let root = tenants.conf.data_dir.join("tenants");
        fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LoadError + 'a {
            move |source| LoadError { op, path: path.to_path_buf(), source }
        }
        std::fs::create_dir_all(&root).map_err(err("creating", &root))?;
        // Attached once all are loaded, parents before their branches.
        let mut loaded: Vec<Arc<Timeline>> = Vec::new();
        for t in std::fs::read_dir(&root).map_err(err("listing", &root))? {
            let t = t.map_err(err("listing", &root))?;
            let Ok(tenant_id) = t.file_name().to_string_lossy().parse::<TenantShardId>() else { continue };
            if tenants.conf.controller && !tenants.is_attached(tenant_id) {
                // Not attached here (a secondary, or moved away while this
                // pageserver was down): an attach replaces what is left.
                info!(%tenant_id, "not attached here: its local timelines are not loaded");
                continue;
            }
            let tl_root = t.path().join("timelines");
            let entries = match std::fs::read_dir(&tl_root) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(err("listing", &tl_root)(e)),
            };
            for l in entries {
                let l = l.map_err(err("listing", &tl_root))?;
                let Ok(timeline_id) = l.file_name().to_string_lossy().parse::<TimelineId>() else { continue };
                let dir = l.path();
                if deleting_marker(&dir).exists() {
                    // Being deleted: finished with the markers below.
                    continue;
                }
                if marker_path(&dir).exists() {
                    // Explicitly marked: a creation that did not finish.
                    warn!(dir = %dir.display(), "removing a timeline whose creation did not finish");
                    if let Err(e) = tenants.remove_unfinished(&dir) {
                        error!(%tenant_id, %timeline_id, "{e}");
                        tenants.attach_unloadable(dir, tenant_id, timeline_id, e.to_string());
                    }
                    continue;
                }
                match tenants.load_local(&dir, tenant_id, timeline_id) {
                    Ok(tl) => loaded.push(tl),
                    Err((kind, reason)) => tenants.attach_broken(dir, tenant_id, timeline_id, kind, reason),
                }
            }
        }
        // Timelines that only object storage has: attached from their index.
        if let Some(remote) = tenants.remote.clone() {
            let attached: Vec<(TenantShardId, u32)> =
                tenants.generations.lock().iter().map(|(t, g)| (*t, *g)).collect();
            for (tenant_id, _) in attached {
                let remote_timelines = match crate::remote::remote_timelines(&remote, tenant_id) {
                    Ok(t) => t,
                    Err(e) => {
                        error!(%tenant_id, "listing the tenant's timelines in remote storage: {e}");
                        continue;
                    }
                };
                for timeline_id in remote_timelines {
                    if tenants.get(tenant_id, timeline_id).is_some()
                        || loaded.iter().any(|t| (t.tenant_id, t.timeline_id) == (tenant_id, timeline_id))
                        || tenants.being_deleted(tenant_id, timeline_id)
                    {
                        continue;
                    }
                    let dir = tenants.timeline_dir(tenant_id, timeline_id);
                    let attached = tenants
                        .remote_timeline(tenant_id, timeline_id, &dir)
                        .map_err(|e| StorageError::Invalid { path: dir.clone(), reason: e })
                        .and_then(|r| match r {
                            Some((rt, _)) => tenants.attach_from_remote(&dir, rt, false).map(Some),
                            None => Ok(None),
                        });
                    match attached {
                        Ok(Some(tl)) => loaded.push(tl),
                        Ok(None) => {
                            info!(%tenant_id, %timeline_id, "objects in remote storage but no index: nothing to attach")
                        }
                        Err(e) => {
                            error!(%tenant_id, %timeline_id, "attaching from remote storage: {e}");
                            tenants.attach_unloadable(dir, tenant_id, timeline_id, e.to_string());
                        }
                    }
                }
            }
        }
        tenants.attach_in_order(loaded);
        for t in secondaries {
            tenants.start_secondary(t);
        }
        // A reader comes back from object storage: what it ingested itself
        // was never uploaded, and the WAL is still there to ingest again.
        if let Some(remote) = tenants.remote.clone() {
            for t in readers {
                if let Err(e) = tenants.attach_reader(&remote, t) {
                    error!(tenant = %t, "loading the reader location: {e}");
                }
            }
        }
        // Markers whose directory is gone (a failed creation cleaned up
        // halfway), and deletions a crash or a failure interrupted.
        for t in std::fs::read_dir(&root).map_err(err("listing", &root))?.flatten() {
            let Ok(entries) = std::fs::read_dir(t.path().join("timelines")) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(stem) = name.strip_suffix(CREATING_SUFFIX) {
                    if !e.path().with_file_name(stem).exists() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
                if let Some(stem) = name.strip_suffix(DELETING_SUFFIX) {
                    tenants.resume_deletion(&t.file_name().to_string_lossy(), stem);
                }
            }
        }
        Ok(tenants)
    }

    /// The remote client of a timeline, with the LSN its newest index
    /// covers (`None` without object storage or without an attachment of
    /// the tenant here).
    fn remote_timeline(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        dir: &Path,
    ) -> Result<Option<(Arc<RemoteTimeline>, Lsn)>, String> {
        let Some(remote) = &self.remote else { return Ok(None) };
        let Some(generation) = self.generations.lock().get(&tenant).copied() else {
            warn!(%tenant, %timeline, "the tenant has no generation in the attachment file; its layers stay local");
            return Ok(None);
        };
        let found = RemoteTimeline::find_index(remote, tenant, timeline, generation)?;
        let lsn = found.as_ref().map_or(Lsn::INVALID, |f| f.index.disk_consistent_lsn);
        Ok(Some((RemoteTimeline::new(remote.clone(), tenant, timeline, generation, dir.to_path_buf(), found), lsn)))
    }

    /// Attaches a timeline from its remote index alone: the metadata comes
    /// from the index, every layer is downloaded when first read. Replaces
    /// the local directory if `replace` (the creation marker makes a crash
    /// halfway remove it at the next start).
    fn attach_from_remote(
        &self,
        dir: &Path,
        rt: Arc<RemoteTimeline>,
        replace: bool,
    ) -> Result<Arc<Timeline>, StorageError> {
        self.attach_from_remote_with(dir, rt, replace, &[])
    }

    /// [`Self::attach_from_remote`], moving `warm` files (a secondary's
    /// downloads of layers the index lists: file, layer name) into the
    /// timeline before it is loaded.
    fn attach_from_remote_with(
        &self,
        dir: &Path,
        rt: Arc<RemoteTimeline>,
        replace: bool,
        warm: &[(PathBuf, String)],
    ) -> Result<Arc<Timeline>, StorageError> {
        let (tenant, timeline) = (rt.tenant_id, rt.timeline_id);
        let index = rt.index().ok_or_else(|| StorageError::Invalid {
            path: dir.to_path_buf(),
            reason: "no index in remote storage".into(),
        })?;
        let parent = dir.parent().expect("under timelines/").to_path_buf();
        crate::timeline::create_dir_durable(&parent, self.conf.fsync)?;
        let marker = marker_path(dir);
        replace_file(&marker, b"", self.conf.fsync)?;
        if replace {
            std::fs::remove_dir_all(dir).map_err(StorageError::io("removing", dir))?;
        }
        crate::timeline::create_dir_durable(dir, self.conf.fsync)?;
        let meta = crate::remote::metadata_from_index(tenant, timeline, &index);
        let text = serde_json::to_vec_pretty(&meta).expect("metadata serializes");
        replace_file(&dir.join(crate::timeline::METADATA_FILE), &text, self.conf.fsync)?;
        let mut moved = 0;
        for (from, name) in warm {
            match std::fs::rename(from, dir.join(name)) {
                Ok(()) => moved += 1,
                Err(e) => warn!(%tenant, %timeline, file = %from.display(), "taking a warm layer: {e}"),
            }
        }
        if moved > 0 && self.conf.fsync {
            sync_dir(dir)?;
        }
        std::fs::remove_file(&marker).map_err(StorageError::io("removing", &marker))?;
        if self.conf.fsync {
            sync_dir(&parent)?;
        }
        let tl = Timeline::load_with_remote(dir.to_path_buf(), &self.resources, Some(rt))?;
        info!(%tenant, %timeline, disk_consistent_lsn = %tl.disk_consistent_lsn(), layers = index.layers.len(), warm = moved, generation = index.generation, "attached timeline from remote storage");
        Ok(tl)
    }

    /// Attaches loaded timelines, each parent before its branches: a
    /// branch's ingest reads through its parent from its first record.
    fn attach_in_order(&self, mut pending: Vec<Arc<Timeline>>) {
        while !pending.is_empty() {
            let waits_for_parent = |tl: &Arc<Timeline>| {
                tl.metadata().ancestor_timeline_id.is_some_and(|p| {
                    pending.iter().any(|other| other.tenant_id == tl.tenant_id && other.timeline_id == p)
                })
            };
            let (ready, rest): (Vec<_>, Vec<_>) = pending.iter().cloned().partition(|tl| !waits_for_parent(tl));
            // Nothing ready would mean a cycle of ancestors: attach them all (their reads fail, naming it).
            let (ready, rest) = if ready.is_empty() { (rest, Vec::new()) } else { (ready, rest) };
            for tl in ready {
                let (tenant, timeline) = (tl.tenant_id, tl.timeline_id);
                if let Err(e) = self.attach(tl) {
                    error!(%tenant, %timeline, "{e}");
                }
            }
            pending = rest;
        }
    }

    /// Whether a deletion of the timeline began here and has not finished:
    /// its objects may still be listed, but it is never attached again.
    pub(crate) fn being_deleted(&self, tenant: TenantShardId, timeline: TimelineId) -> bool {
        deleting_marker(&self.timeline_dir(tenant, timeline)).exists()
    }

    /// Finishes at start a deletion that was interrupted (names from the
    /// data directory); one that fails again is left to a retry of the
    /// request, the timeline staying out of service.
    fn resume_deletion(&self, tenant: &str, timeline: &str) {
        let (Ok(tenant), Ok(timeline)) = (tenant.parse::<TenantShardId>(), timeline.parse::<TimelineId>()) else {
            return;
        };
        if self.conf.controller && !self.is_attached(tenant) {
            // Its objects are the attached pageserver's to delete.
            return;
        }
        if self.get(tenant, timeline).is_some() {
            // Never: a timeline being deleted is neither loaded nor attached.
            error!(%tenant, %timeline, "a timeline being deleted was loaded; its deletion waits for a request");
            return;
        }
        let dir = self.timeline_dir(tenant, timeline);
        let meta = read_metadata(&dir);
        match self.finish_deletion(tenant, timeline, &dir, meta.as_ref()) {
            Ok(()) => info!(%tenant, %timeline, "finished a deletion that was interrupted"),
            Err(e) => {
                error!(%tenant, %timeline, "finishing an interrupted deletion (a retry of the request goes on): {e}")
            }
        }
    }

    /// Removes a marked, unfinished timeline: the directory, then the marker.
    fn remove_unfinished(&self, dir: &Path) -> Result<(), StorageError> {
        self.remove_marked(dir, &marker_path(dir))
    }

    /// Removes a timeline directory (if still there), then its `marker`.
    fn remove_marked(&self, dir: &Path, marker: &Path) -> Result<(), StorageError> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::Io { op: "removing", path: dir.to_path_buf(), source: e }),
        }
        std::fs::remove_file(marker).map_err(StorageError::io("removing", marker))?;
        if self.conf.fsync {
            sync_dir(dir.parent().expect("under timelines/"))?;
        }
        Ok(())
    }

    fn attach_unloadable(&self, dir: PathBuf, tenant: TenantShardId, timeline: TimelineId, reason: String) {
        self.attach_broken(dir, tenant, timeline, BrokenKind::Files, reason);
    }

    /// Keeps a timeline that could not be loaded, broken of `kind`.
    fn attach_broken(
        &self,
        dir: PathBuf,
        tenant: TenantShardId,
        timeline: TimelineId,
        kind: BrokenKind,
        reason: String,
    ) {
        let tl = Timeline::unloadable(dir, tenant, timeline, kind, reason, &self.resources);
        let entry = Arc::new(TimelineEntry::new(tl, None));
        self.timelines.write().insert((tenant, timeline), entry);
    }

    /// Loads a timeline directory found on disk: from its local files,
    /// with its object-storage side, or from object storage when that is
    /// ahead of the files. An index that could not be read is
    /// [`BrokenKind::Remote`] (loaded again once the store answers,
    /// [`Tenants::reload_broken`]); anything else about the files is
    /// [`BrokenKind::Files`].
    fn load_local(
        &self,
        dir: &Path,
        tenant_id: TenantShardId,
        timeline_id: TimelineId,
    ) -> Result<Arc<Timeline>, (BrokenKind, String)> {
        let remote = self.remote_timeline(tenant_id, timeline_id, dir).map_err(|e| {
            error!(%tenant_id, %timeline_id, "cannot read its index in remote storage: {e}");
            (BrokenKind::Remote, format!("reading its remote index: {e}"))
        })?;
        if let Some((rt, remote_lsn)) = &remote {
            let local_lsn = local_disk_consistent_lsn(dir);
            // Object storage is the truth, and it is ahead (another
            // attachment went on): the local files are an old cache.
            // Local files without readable metadata are not replaced:
            // they stay for an operator, as without object storage.
            if local_lsn.is_some_and(|l| l < *remote_lsn) {
                warn!(%tenant_id, %timeline_id, local = ?local_lsn, remote = %remote_lsn, "remote storage is ahead of the local files; attaching from remote storage");
                return self.attach_from_remote(dir, rt.clone(), true).map_err(|e| {
                    error!(%tenant_id, %timeline_id, "{e}");
                    (BrokenKind::Files, e.to_string())
                });
            }
        }
        match Timeline::load_with_remote(dir.to_path_buf(), &self.resources, remote.map(|(r, _)| r)) {
            Ok(tl) => {
                info!(%tenant_id, %timeline_id, disk_consistent_lsn = %tl.disk_consistent_lsn(), "loaded timeline");
                Ok(tl)
            }
            Err(e) => {
                error!(%tenant_id, %timeline_id, "cannot load timeline; it is broken and its files stay: {e}");
                Err((BrokenKind::Files, e.to_string()))
            }
        }
    }

    fn attach(&self, tl: Arc<Timeline>) -> Result<Arc<TimelineEntry>, CreateError> {
        let (tenant, timeline) = (tl.tenant_id, tl.timeline_id);
        // Before its ingest starts: a branch's first reads go to its parent.
        self.link_ancestors(&tl);
        if self.wal_sources.idle_after.is_some() {
            tl.activity.watch(self.wakeups.clone());
        }
        let status = Arc::new(Mutex::new(ReceiverStatus::default()));
        match WalReceiver::spawn(tl.clone(), self.wal_sources.clone(), status) {
            Ok(receiver) => {
                let entry = Arc::new(TimelineEntry::new(tl, Some(receiver)));
                self.timelines.write().insert((tenant, timeline), entry.clone());
                Ok(entry)
            }
            Err(source) => {
                // No threads: the timeline is kept, broken, and retried like a storage failure.
                tl.set_broken(crate::timeline::BrokenKind::Storage, format!("starting its WAL receiver: {source}"));
                self.timelines.write().insert((tenant, timeline), Arc::new(TimelineEntry::new(tl, None)));
                Err(CreateError::Receiver { tenant, timeline, source })
            }
        }
    }

    /// Links `tl` to its parent and its children to it, whichever was
    /// attached first (a parent attached anew replaces the old link).
    fn link_ancestors(&self, tl: &Arc<Timeline>) {
        let tenant = tl.tenant_id;
        if let Some(parent) = tl.metadata().ancestor_timeline_id {
            if let Some(p) = self.get(tenant, parent) {
                tl.set_ancestor(p.tl.clone());
            }
        }
        for child in self.all() {
            if child.tl.tenant_id == tenant && child.tl.metadata().ancestor_timeline_id == Some(tl.timeline_id) {
                child.tl.set_ancestor(tl.clone());
            }
        }
    }

    /// Creates a branch of `parent` at `lsn` (`docs/branches.md`): metadata
    /// only. The parent keeps `lsn` readable first (durably), then the
    /// child's directory appears with its metadata, then it is attached and
    /// streams its own WAL from the safekeepers from `lsn` on. The caller
    /// has resolved the point and waited for the parent to ingest it.
    pub fn create_branch(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        parent: TimelineId,
        lsn: Lsn,
    ) -> Result<Arc<TimelineEntry>, BranchError> {
        let _one_at_a_time = self.creating.lock();
        let dir = self.timeline_dir(tenant, timeline);
        let marker = marker_path(&dir);
        if self.get(tenant, timeline).is_some() || dir.exists() || marker.exists() || deleting_marker(&dir).exists() {
            return Err(BranchError::Exists(tenant, timeline));
        }
        let p = self.get(tenant, parent).ok_or(BranchError::ParentNotFound(tenant, parent))?;
        let ptl = &p.tl;
        if let Some(reason) = ptl.broken_reason() {
            return Err(BranchError::ParentBroken { parent, reason });
        }
        let pmeta = ptl.metadata();
        let lsns = ptl.record_lsns();
        if !lsn.0.is_multiple_of(8) {
            return Err(BranchError::NotAligned { lsn });
        }
        if lsn < pmeta.start_lsn {
            return Err(BranchError::BeforeStart { lsn, start: pmeta.start_lsn, parent });
        }
        if lsn > lsns.last {
            return Err(BranchError::InFuture { lsn, last: lsns.last, parent });
        }
        let cutoff = ptl.gc_cutoff_lsn();
        if lsn < cutoff {
            return Err(BranchError::BelowGcCutoff { lsn, cutoff, parent });
        }
        let storage = |source| BranchError::Storage { tenant, timeline, source };
        // GC may have moved the cutoff since the check.
        if let Some(cutoff) = ptl.retain_lsn(lsn).map_err(storage)? {
            return Err(BranchError::BelowGcCutoff { lsn, cutoff, parent });
        }
        let meta = TimelineMetadata {
            format_version: crate::timeline::METADATA_VERSION,
            tenant_id: tenant,
            timeline_id: timeline,
            ancestor_timeline_id: Some(parent),
            ancestor_lsn: Some(lsn),
            pg_version: pmeta.pg_version,
            system_id: pmeta.system_id,
            wal_segment_size: pmeta.wal_segment_size,
            start_lsn: lsn,
            disk_consistent_lsn: lsn,
            // The record before the branch point is known only at the
            // parent's newest record; elsewhere none is named (PostgreSQL
            // only checks that its first record's link points back).
            prev_record_lsn: if lsn == lsns.last { lsns.prev } else { Lsn::INVALID },
            layers: Vec::new(),
            removed_layers: Vec::new(),
            gc_cutoff_lsn: Lsn::INVALID,
            retain_lsns: Vec::new(),
            // A branch is of the same shard as its parent.
            stripe_blocks: pmeta.stripe_blocks,
        };
        let parent_dir = dir.parent().expect("under timelines/").to_path_buf();
        let created = (|| {
            replace_file(&marker, b"", self.conf.fsync)?;
            let tl = Timeline::create(dir.clone(), meta, &self.resources)?;
            std::fs::remove_file(&marker).map_err(StorageError::io("removing", &marker))?;
            if self.conf.fsync {
                sync_dir(&parent_dir)?;
            }
            Ok::<_, StorageError>(tl)
        })();
        let tl = match created {
            Ok(tl) => tl,
            Err(e) => {
                if let Err(e) = self.remove_unfinished(&dir) {
                    error!(%tenant, %timeline, "cleaning up after a failed branch creation: {e}");
                }
                return Err(storage(e));
            }
        };
        if let (Some(remote), Some(g)) = (&self.remote, self.generations.lock().get(&tenant).copied()) {
            tl.set_remote(RemoteTimeline::new(remote.clone(), tenant, timeline, g, dir.clone(), None));
        }
        info!(%tenant, %timeline, %parent, %lsn, "created branch");
        self.attach(tl).map_err(|e| match e {
            CreateError::Receiver { tenant, timeline, source } => BranchError::Receiver { tenant, timeline, source },
            other => BranchError::Other(other.to_string()),
        })
    }

    /// Deletes a timeline that no branch depends on: its WAL receiver
    /// stops, it leaves the map (reads in flight finish on their open
    /// files), its objects and directory go, and its parent lets GC have
    /// the branch point again.
    pub fn delete_timeline(&self, tenant: TenantShardId, timeline: TimelineId) -> Result<(), DeleteError> {
        let _one_at_a_time = self.creating.lock();
        let Some(entry) = self.get(tenant, timeline) else {
            // A deletion that a failure interrupted (object storage out of
            // reach): this request finishes it.
            let dir = self.timeline_dir(tenant, timeline);
            if deleting_marker(&dir).exists() {
                let meta = read_metadata(&dir);
                return self.finish_deletion(tenant, timeline, &dir, meta.as_ref());
            }
            return Err(DeleteError::NotFound(tenant, timeline));
        };
        let children: Vec<TimelineId> = self
            .all()
            .iter()
            .map(|e| e.tl.metadata())
            .filter(|m| m.tenant_id == tenant && m.ancestor_timeline_id == Some(timeline))
            .map(|m| m.timeline_id)
            .collect();
        if !children.is_empty() {
            return Err(DeleteError::HasBranches { timeline, children });
        }
        entry.stop_receiver();
        self.timelines.write().remove(&(tenant, timeline));
        self.reloads.lock().remove(&(tenant, timeline));
        // Reads still holding it end now rather than at their timeouts.
        entry.tl.detach();
        let meta = entry.tl.metadata();
        if let Some(r) = entry.tl.remote() {
            // An index uploaded after the listing below would outlive the deletion.
            r.stop_and_wait();
        }
        // From here on the deletion is recorded: whatever fails below, a
        // retry or the next start finishes it, and the timeline never comes
        // back (not even from its objects, which go first).
        let dir = entry.tl.dir.clone();
        replace_file(&deleting_marker(&dir), b"", self.conf.fsync)
            .map_err(|e| DeleteError::Storage { timeline, source: e.into() })?;
        self.finish_deletion(tenant, timeline, &dir, Some(&meta))
    }

    /// The rest of a deletion once its marker is written: the timeline's
    /// objects, its directory, the marker, and the parent's branch point.
    fn finish_deletion(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        dir: &Path,
        meta: Option<&TimelineMetadata>,
    ) -> Result<(), DeleteError> {
        if let Some(remote) = &self.remote {
            let n = crate::remote::delete_timeline_objects(remote, tenant, timeline)
                .map_err(|reason| DeleteError::Remote { timeline, reason })?;
            info!(%tenant, %timeline, objects = n, "deleted the timeline's objects");
        }
        self.remove_marked(dir, &deleting_marker(dir)).map_err(|source| DeleteError::Storage { timeline, source })?;
        if let Some((parent, at)) = meta.and_then(|m| m.ancestor_timeline_id.zip(m.ancestor_lsn)) {
            if let Some(p) = self.get(tenant, parent) {
                let others = self.branch_points(tenant, parent).iter().filter(|l| **l == at).count();
                if let Err(e) = p.tl.release_lsn(at, others) {
                    warn!(%tenant, %parent, %at, "releasing the branch point: {e}");
                }
            }
        }
        info!(%tenant, %timeline, "deleted timeline");
        self.trim_wanted.store(true, std::sync::atomic::Ordering::SeqCst);
        self.wakeups.notify_one();
        Ok(())
    }

    /// Whether a timeline was deleted since the last call: the watcher
    /// then asks for a heap trim.
    pub fn take_trim_request(&self) -> bool {
        self.trim_wanted.swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// The branch points of `parent`'s children attached here.
    fn branch_points(&self, tenant: TenantShardId, parent: TimelineId) -> Vec<Lsn> {
        self.all()
            .iter()
            .map(|e| e.tl.metadata())
            .filter(|m| m.tenant_id == tenant && m.ancestor_timeline_id == Some(parent))
            .filter_map(|m| m.ancestor_lsn)
            .collect()
    }

    pub fn get(&self, tenant: TenantShardId, timeline: TimelineId) -> Option<Arc<TimelineEntry>> {
        self.timelines.read().get(&(tenant, timeline)).cloned()
    }

    pub fn all(&self) -> Vec<Arc<TimelineEntry>> {
        self.timelines.read().values().cloned().collect()
    }

    /// Creates a tenant of PostgreSQL `version` with its first timeline from
    /// the kept `initdb` output of that major (blocking; a fraction of a
    /// second, seconds when `initdb` runs first).
    pub fn bootstrap(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        version: PgVersion,
    ) -> Result<Arc<TimelineEntry>, CreateError> {
        self.create_from(tenant, timeline, Origin::Initdb(version, None), None)
    }

    /// Bootstraps one shard of a sharded tenant (`docs/sharding.md`): shard
    /// 0 as any new tenant, every other one with shard 0's system
    /// identifier (`system_id`), so that all of them take the same WAL.
    pub fn bootstrap_shard(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        version: PgVersion,
        stripe_blocks: u32,
        system_id: Option<u64>,
    ) -> Result<Arc<TimelineEntry>, CreateError> {
        self.create_from(tenant, timeline, Origin::Initdb(version, system_id), Some(stripe_blocks))
    }

    /// Creates a tenant whose first timeline is the cleanly shut-down data
    /// directory `pgdata` (`strata tenant import`, `docs/import.md`): its
    /// system identifier, WAL position and major are the source's.
    pub fn import(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        pgdata: &Path,
    ) -> Result<Arc<TimelineEntry>, CreateError> {
        // A shard's new timeline (a major upgrade of a sharded tenant) is
        // striped as its other timelines; its first comes with the tenant.
        let stripe = match tenant.shard.is_unsharded() {
            true => None,
            false => {
                let of_shard = self.all().into_iter().find(|e| e.tl.tenant_id == tenant);
                let stripe = of_shard.map(|e| e.tl.shard.stripe_blocks).ok_or_else(|| CreateError::NotAttached {
                    tenant,
                    reason: "a shard's first timeline is made with its tenant; an import adds to a shard that has one"
                        .into(),
                })?;
                Some(stripe)
            }
        };
        self.create_from(tenant, timeline, Origin::Directory(pgdata), stripe)
    }

    /// Whether timeline `timeline` of `tenant` exists here, or is being
    /// created (so that an import is refused before its data is sent).
    pub fn exists(&self, tenant: TenantShardId, timeline: TimelineId) -> bool {
        let dir = self.timeline_dir(tenant, timeline);
        self.get(tenant, timeline).is_some() || dir.exists() || marker_path(&dir).exists()
    }

    fn create_from(
        &self,
        tenant: TenantShardId,
        timeline: TimelineId,
        origin: Origin<'_>,
        stripe_blocks: Option<u32>,
    ) -> Result<Arc<TimelineEntry>, CreateError> {
        let _one_at_a_time = self.creating.lock();
        let dir = self.timeline_dir(tenant, timeline);
        let marker = marker_path(&dir);
        if self.get(tenant, timeline).is_some() || dir.exists() || marker.exists() {
            return Err(CreateError::Exists(tenant, timeline));
        }
        let storage = |source| CreateError::Storage { tenant, timeline, source };
        // With object storage, a tenant is created only where it is attached.
        let generation = match &self.remote {
            Some(remote) if self.conf.controller => {
                // The controller attached the tenant here first.
                let g = self.generations.lock().get(&tenant).copied().ok_or_else(|| CreateError::NotAttached {
                    tenant,
                    reason: "the storage controller has not attached it to this pageserver".into(),
                })?;
                Some((remote.clone(), g))
            }
            Some(remote) => {
                let g = remote.generation(tenant).map_err(|reason| CreateError::NotAttached { tenant, reason })?;
                let Some(g) = g else {
                    return Err(CreateError::NotAttached {
                        tenant,
                        reason: format!("{} names no generation for it", remote.attachments_path().display()),
                    });
                };
                self.generations.lock().insert(tenant, g);
                Some((remote.clone(), g))
            }
            None => None,
        };
        // The marker is durable before the timeline's first byte.
        let parent = dir.parent().expect("under timelines/").to_path_buf();
        crate::timeline::create_dir_durable(&parent, self.conf.fsync).map_err(storage)?;
        replace_file(&marker, b"", self.conf.fsync).map_err(|e| storage(e.into()))?;
        let result = match origin {
            Origin::Initdb(version, system_id) => {
                let how = import::ImportAs { identity: import::Identity::Fresh(system_id), stripe_blocks };
                self.initdb.pgdata(&self.conf, version, self.resources.clock.system_now()).and_then(|pgdata| {
                    import::import_datadir(&pgdata, dir.clone(), tenant, timeline, &self.resources, how)
                })
            }
            Origin::Directory(pgdata) => {
                let how = import::ImportAs { identity: import::Identity::Source, stripe_blocks };
                import::check_importable(pgdata)
                    .and_then(|_| import::import_datadir(pgdata, dir.clone(), tenant, timeline, &self.resources, how))
            }
        };
        match result {
            Ok((tl, imported)) => {
                // Complete: the marker goes, durably, before the timeline is served.
                std::fs::remove_file(&marker).map_err(StorageError::io("removing", &marker)).map_err(storage)?;
                if self.conf.fsync {
                    sync_dir(&parent).map_err(|e| storage(e.into()))?;
                }
                info!(%tenant, %timeline, start_lsn = %imported.end_lsn, system_id = imported.system_id, "bootstrapped tenant");
                if let Some((remote, g)) = generation {
                    tl.set_remote(RemoteTimeline::new(remote, tenant, timeline, g, dir.clone(), None));
                }
                self.attach(tl)
            }
            Err(source) => {
                if let Err(e) = self.remove_unfinished(&dir) {
                    error!(%tenant, %timeline, "cleaning up after a failed bootstrap: {e}");
                }
                Err(CreateError::Import { tenant, timeline, source: Box::new(source) })
            }
        }
    }

    /// Re-reads from disk the broken timelines whose cause may have passed
    /// (a failed fsync, a panic), each with its own growing delay between
    /// attempts. Called periodically.
    pub fn reload_broken(&self) {
        let now = self.resources.clock.now();
        for entry in self.all() {
            let key = (entry.tl.tenant_id, entry.tl.timeline_id);
            let Some(broken) = entry.tl.broken().filter(|b| b.kind.reloads()) else {
                self.reloads.lock().remove(&key);
                continue;
            };
            {
                let mut reloads = self.reloads.lock();
                let (next, backoff) = reloads
                    .entry(key)
                    .or_insert_with(|| (now + RELOAD_MIN_DELAY, Backoff::new(RELOAD_MIN_DELAY, RELOAD_MAX_DELAY)));
                if now < *next {
                    continue;
                }
                *next = now + backoff.next_delay();
            }
            // Not while a delete (or a create) runs: a timeline deleted
            // after the listing above must not come back.
            let _one_at_a_time = self.creating.lock();
            if !self.get(key.0, key.1).is_some_and(|e| Arc::ptr_eq(&e, &entry)) {
                self.reloads.lock().remove(&key);
                continue;
            }
            info!(tenant = %key.0, timeline = %key.1, reason = %broken.reason, "re-reading a broken timeline from disk");
            // The old receiver stops (it flushes nothing: the timeline is broken).
            entry.stop_receiver();
            // Back in service only once the disk takes a durable write again.
            let loaded = match broken.kind {
                // Never loaded: the whole load again, index first.
                BrokenKind::Remote => self
                    .load_local(&entry.tl.dir, key.0, key.1)
                    .map_err(|(_, reason)| StorageError::Invalid { path: entry.tl.dir.clone(), reason }),
                _ => Timeline::load_with_remote(entry.tl.dir.clone(), &self.resources, entry.tl.remote().cloned()),
            };
            let reloaded = loaded.and_then(|tl| match tl.broken() {
                Some(b) => {
                    Err(StorageError::Invalid { path: tl.dir.clone(), reason: format!("still broken: {}", b.reason) })
                }
                None => tl.persist_metadata().map(|()| tl),
            });
            match reloaded {
                Ok(tl) => {
                    self.metrics.timeline_reloads.inc();
                    self.reloads.lock().remove(&key);
                    info!(tenant = %key.0, timeline = %key.1, disk_consistent_lsn = %tl.disk_consistent_lsn(), "timeline re-read from disk; active again");
                    if let Err(e) = self.attach(tl) {
                        error!(tenant = %key.0, timeline = %key.1, "{e}");
                    }
                }
                Err(e) => {
                    warn!(tenant = %key.0, timeline = %key.1, "re-reading failed: {e}");
                    entry.tl.note_reload_failure(e.to_string());
                }
            }
        }
    }

    /// Stops every WAL receiver and flushes what was ingested; gives the
    /// uploads a bounded time to put the last layers in object storage (what
    /// is not uploaded then is uploaded after the next start).
    pub fn shutdown(&self) {
        for entry in self.all() {
            entry.stop_receiver();
            if entry.tl.broken_reason().is_none() {
                if let Err(e) = entry.tl.flush_frozen() {
                    error!(timeline = %entry.tl.timeline_id, "final flush failed: {e}");
                }
            }
        }
        let clock = &self.resources.clock;
        let deadline = clock.now() + SHUTDOWN_UPLOAD_WAIT;
        for entry in self.all() {
            let Some(r) = entry.tl.remote() else { continue };
            if entry.tl.broken_reason().is_none() && !r.is_reader() {
                let left = deadline.saturating_duration_since(clock.now());
                if let Err(e) = entry.tl.wait_uploaded(left) {
                    warn!(timeline = %entry.tl.timeline_id, "not everything is uploaded at shutdown: {e}");
                }
            }
            r.stop();
        }
    }
}

impl TimelineEntry {
    /// The timeline's status, as the HTTP API shows it.
    pub fn status(&self) -> TimelineStatus {
        let meta = self.tl.metadata();
        let lsns = self.tl.record_lsns();
        let receiver = self.receiver.lock().clone();
        let broken = self.tl.broken();
        let (memory_layers, files) = self.tl.layer_count();
        let local = self.tl.resident_layers();
        let remote = self.tl.upload_status();
        TimelineStatus {
            tenant_id: meta.tenant_id,
            timeline_id: meta.timeline_id,
            ancestor_timeline_id: meta.ancestor_timeline_id,
            ancestor_lsn: meta.ancestor_lsn,
            pg_version: meta.pg_version,
            system_id: meta.system_id,
            wal_segment_size: meta.wal_segment_size,
            start_lsn: meta.start_lsn,
            last_record_lsn: lsns.last,
            prev_record_lsn: lsns.prev,
            disk_consistent_lsn: meta.disk_consistent_lsn,
            gc_cutoff_lsn: meta.gc_cutoff_lsn,
            retain_lsns: meta.retain_lsns,
            leases: self
                .tl
                .leases()
                .into_iter()
                .map(|(lsn, seconds_left, holder)| Lease { lsn, seconds_left, holder })
                .collect(),
            wal_source: receiver.safekeeper,
            safekeeper_commit_lsn: receiver.safekeeper_commit_lsn,
            wal_source_error: receiver.last_error,
            memory_layers,
            delta_layers: files.l0 + files.l1,
            l0_layers: files.l0,
            l1_layers: files.l1,
            image_layers: files.image,
            layer_bytes: files.bytes,
            backpressure: self.tl.backpressure(),
            upload_backpressure: remote.as_ref().is_some_and(|u| u.backpressure),
            local_layers: local.0,
            local_layer_bytes: local.1,
            remote,
            remote_consistent_lsn: self.tl.remote_consistent_lsn(),
            state: if broken.is_some() { TimelineState::Broken } else { TimelineState::Active },
            idle: self.tl.activity.state().is_idle(),
            error: broken.as_ref().map(|b| b.reason.clone()),
            broken,
            verify_redo: self.tl.verify_redo.then(|| self.tl.redo_check.lock().clone()),
            logical_size: None,
            stripe_blocks: meta.stripe_blocks,
            foreign_layer_bytes: self.tl.remote().map_or(0, |r| r.foreign_bytes()),
            pitr_interval_secs: None,
        }
    }
}
