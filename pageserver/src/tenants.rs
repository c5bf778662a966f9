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
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use strata_protocol::{TenantId, TimelineId};
use strata_service::backoff::Backoff;
use tracing::{error, info, warn};

use crate::config::PageserverConfig;
use crate::import::{self, ImportError};
use crate::metrics::Metrics;
use crate::timeline::{sync_dir, StorageError, Timeline, TimelineResources};
use crate::walreceiver::{ReceiverStatus, SpawnError, WalReceiver};

/// Suffix of a creation marker (`<timeline>.creating`).
const CREATING_SUFFIX: &str = ".creating";
/// Broken timelines whose cause may pass are re-read from disk this often at first.
const RELOAD_MIN_DELAY: Duration = Duration::from_secs(1);
const RELOAD_MAX_DELAY: Duration = Duration::from_secs(60);

/// A timeline with its WAL receiver.
pub struct TimelineEntry {
    pub tl: Arc<Timeline>,
    pub receiver: Arc<Mutex<ReceiverStatus>>,
    handle: Mutex<Option<WalReceiver>>,
}

/// Why a timeline could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("timeline {0}/{1} already exists")]
    Exists(TenantId, TimelineId),
    #[error("bootstrap of {tenant}/{timeline}: {source}")]
    Import {
        tenant: TenantId,
        timeline: TimelineId,
        #[source]
        source: Box<ImportError>,
    },
    #[error("bootstrap of {tenant}/{timeline}: {source}")]
    Storage {
        tenant: TenantId,
        timeline: TimelineId,
        #[source]
        source: StorageError,
    },
    #[error("timeline {tenant}/{timeline}: {source}")]
    Receiver {
        tenant: TenantId,
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
    timelines: RwLock<BTreeMap<(TenantId, TimelineId), Arc<TimelineEntry>>>,
    creating: Mutex<()>,
    /// When each broken timeline is re-read next, and its backoff.
    reloads: Mutex<HashMap<(TenantId, TimelineId), (Instant, Backoff)>>,
}

fn marker_path(timeline_dir: &Path) -> PathBuf {
    let mut name = timeline_dir.file_name().expect("a timeline directory has a name").to_os_string();
    name.push(CREATING_SUFFIX);
    timeline_dir.with_file_name(name)
}

impl Tenants {
    fn timeline_dir(&self, tenant: TenantId, timeline: TimelineId) -> PathBuf {
        self.conf.data_dir.join("tenants").join(tenant.to_string()).join("timelines").join(timeline.to_string())
    }

    /// Loads every timeline under the data directory and starts its WAL receiver.
    pub fn load(conf: Arc<PageserverConfig>, resources: TimelineResources) -> Result<Arc<Tenants>, LoadError> {
        let tenants = Arc::new(Tenants {
            conf,
            metrics: resources.metrics.clone(),
            resources,
            timelines: RwLock::new(BTreeMap::new()),
            creating: Mutex::new(()),
            reloads: Mutex::new(HashMap::new()),
        });
        let root = tenants.conf.data_dir.join("tenants");
        fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LoadError + 'a {
            move |source| LoadError { op, path: path.to_path_buf(), source }
        }
        std::fs::create_dir_all(&root).map_err(err("creating", &root))?;
        for t in std::fs::read_dir(&root).map_err(err("listing", &root))? {
            let t = t.map_err(err("listing", &root))?;
            let Ok(tenant_id) = t.file_name().to_string_lossy().parse::<TenantId>() else { continue };
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
                if marker_path(&dir).exists() {
                    // Explicitly marked: a creation that did not finish.
                    warn!(dir = %dir.display(), "removing a timeline whose creation did not finish");
                    if let Err(e) = tenants.remove_unfinished(&dir) {
                        error!(%tenant_id, %timeline_id, "{e}");
                        tenants.attach_unloadable(dir, tenant_id, timeline_id, e.to_string());
                    }
                    continue;
                }
                match Timeline::load(dir.clone(), &tenants.resources) {
                    Ok(tl) => {
                        info!(%tenant_id, %timeline_id, disk_consistent_lsn = %tl.disk_consistent_lsn(), "loaded timeline");
                        if let Err(e) = tenants.attach(tl) {
                            error!(%tenant_id, %timeline_id, "{e}");
                        }
                    }
                    Err(e) => {
                        error!(%tenant_id, %timeline_id, "cannot load timeline; it is broken and its files stay: {e}");
                        tenants.attach_unloadable(dir, tenant_id, timeline_id, e.to_string());
                    }
                }
            }
        }
        // Markers whose directory is gone (a failed creation cleaned up halfway).
        for t in std::fs::read_dir(&root).map_err(err("listing", &root))?.flatten() {
            let Ok(entries) = std::fs::read_dir(t.path().join("timelines")) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(stem) = name.strip_suffix(CREATING_SUFFIX) {
                    if !e.path().with_file_name(stem).exists() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        Ok(tenants)
    }

    /// Removes a marked, unfinished timeline: the directory, then the marker.
    fn remove_unfinished(&self, dir: &Path) -> Result<(), StorageError> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::Io { op: "removing", path: dir.to_path_buf(), source: e }),
        }
        let marker = marker_path(dir);
        std::fs::remove_file(&marker).map_err(StorageError::io("removing", &marker))?;
        if self.conf.fsync {
            sync_dir(dir.parent().expect("under timelines/"))?;
        }
        Ok(())
    }

    fn attach_unloadable(&self, dir: PathBuf, tenant: TenantId, timeline: TimelineId, reason: String) {
        let tl = Timeline::unloadable(dir, tenant, timeline, reason, &self.resources);
        let entry = Arc::new(TimelineEntry {
            tl,
            receiver: Arc::new(Mutex::new(ReceiverStatus::default())),
            handle: Mutex::new(None),
        });
        self.timelines.write().insert((tenant, timeline), entry);
    }

    fn attach(&self, tl: Arc<Timeline>) -> Result<Arc<TimelineEntry>, CreateError> {
        let (tenant, timeline) = (tl.tenant_id, tl.timeline_id);
        let receiver = match WalReceiver::spawn(tl.clone(), self.conf.safekeepers.clone()) {
            Ok(r) => r,
            Err(source) => {
                // No threads: the timeline is kept, broken, and retried like a storage failure.
                tl.set_broken(crate::timeline::BrokenKind::Storage, format!("starting its WAL receiver: {source}"));
                let entry = Arc::new(TimelineEntry {
                    tl,
                    receiver: Arc::new(Mutex::new(ReceiverStatus::default())),
                    handle: Mutex::new(None),
                });
                self.timelines.write().insert((tenant, timeline), entry);
                return Err(CreateError::Receiver { tenant, timeline, source });
            }
        };
        let entry =
            Arc::new(TimelineEntry { tl, receiver: receiver.status.clone(), handle: Mutex::new(Some(receiver)) });
        self.timelines.write().insert((tenant, timeline), entry.clone());
        Ok(entry)
    }

    pub fn get(&self, tenant: TenantId, timeline: TimelineId) -> Option<Arc<TimelineEntry>> {
        self.timelines.read().get(&(tenant, timeline)).cloned()
    }

    pub fn all(&self) -> Vec<Arc<TimelineEntry>> {
        self.timelines.read().values().cloned().collect()
    }

    /// Creates a tenant with its first timeline from a fresh `initdb` (blocking; seconds).
    pub fn bootstrap(&self, tenant: TenantId, timeline: TimelineId) -> Result<Arc<TimelineEntry>, CreateError> {
        let _one_at_a_time = self.creating.lock();
        let dir = self.timeline_dir(tenant, timeline);
        let marker = marker_path(&dir);
        if self.get(tenant, timeline).is_some() || dir.exists() || marker.exists() {
            return Err(CreateError::Exists(tenant, timeline));
        }
        let storage = |source| CreateError::Storage { tenant, timeline, source };
        // The marker is durable before the timeline's first byte.
        let parent = dir.parent().expect("under timelines/").to_path_buf();
        crate::timeline::create_dir_durable(&parent, self.conf.fsync).map_err(storage)?;
        crate::timeline::write_atomic(&marker, b"", self.conf.fsync).map_err(storage)?;
        let pgdata = self.conf.data_dir.join("tmp").join(format!("initdb-{timeline}"));
        let result = import::run_initdb(&self.conf, &pgdata)
            .and_then(|()| import::import_datadir(&pgdata, dir.clone(), tenant, timeline, &self.resources));
        let _ = std::fs::remove_dir_all(&pgdata);
        match result {
            Ok((tl, imported)) => {
                // Complete: the marker goes, durably, before the timeline is served.
                std::fs::remove_file(&marker).map_err(StorageError::io("removing", &marker)).map_err(storage)?;
                if self.conf.fsync {
                    sync_dir(&parent).map_err(storage)?;
                }
                info!(%tenant, %timeline, start_lsn = %imported.end_lsn, system_id = imported.system_id, "bootstrapped tenant");
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
        let now = Instant::now();
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
            info!(tenant = %key.0, timeline = %key.1, reason = %broken.reason, "re-reading a broken timeline from disk");
            // The old receiver stops (it flushes nothing: the timeline is broken).
            if let Some(r) = entry.handle.lock().take() {
                r.shutdown();
            }
            // Back in service only once the disk takes a durable write again.
            let reloaded = Timeline::load(entry.tl.dir.clone(), &self.resources).and_then(|tl| match tl.broken() {
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

    /// Stops every WAL receiver and flushes what was ingested.
    pub fn shutdown(&self) {
        for entry in self.all() {
            if let Some(r) = entry.handle.lock().take() {
                r.shutdown();
            }
            if entry.tl.broken_reason().is_none() {
                if let Err(e) = entry.tl.flush_frozen() {
                    error!(timeline = %entry.tl.timeline_id, "final flush failed: {e}");
                }
            }
        }
    }
}

impl TimelineEntry {
    /// The timeline's status, as the HTTP API shows it.
    pub fn status(&self) -> serde_json::Value {
        let meta = self.tl.metadata();
        let lsns = self.tl.record_lsns();
        let receiver = self.receiver.lock().clone();
        let broken = self.tl.broken();
        let (memory_layers, files) = self.tl.layer_count();
        serde_json::json!({
            "tenant_id": meta.tenant_id,
            "timeline_id": meta.timeline_id,
            "ancestor_timeline_id": meta.ancestor_timeline_id,
            "ancestor_lsn": meta.ancestor_lsn,
            "pg_version": meta.pg_version,
            "system_id": meta.system_id,
            "wal_segment_size": meta.wal_segment_size,
            "start_lsn": meta.start_lsn,
            "last_record_lsn": lsns.last,
            "prev_record_lsn": lsns.prev,
            "disk_consistent_lsn": meta.disk_consistent_lsn,
            "gc_cutoff_lsn": meta.gc_cutoff_lsn,
            "wal_source": receiver.safekeeper,
            "safekeeper_commit_lsn": receiver.safekeeper_commit_lsn,
            "wal_source_error": receiver.last_error,
            "memory_layers": memory_layers,
            "delta_layers": files.l0 + files.l1,
            "l0_layers": files.l0,
            "l1_layers": files.l1,
            "image_layers": files.image,
            "layer_bytes": files.bytes,
            "backpressure": self.tl.backpressure(),
            "state": if broken.is_some() { "broken" } else { "active" },
            "error": broken.as_ref().map(|b| b.reason.clone()),
            "broken": broken,
            "verify_redo": self.tl.verify_redo.then(|| self.tl.redo_check.lock().clone()),
        })
    }
}
