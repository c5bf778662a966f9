//! The tenants and timelines this pageserver holds: loading them at start,
//! bootstrapping new ones, and their WAL receivers.
//!
//! On-disk layout: `<data_dir>/tenants/<tenant>/timelines/<timeline>/`
//! holds `metadata.json` and the timeline's layer files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use strata_protocol::{TenantId, TimelineId};
use tracing::{error, info, warn};

use crate::config::PageserverConfig;
use crate::import;
use crate::metrics::Metrics;
use crate::timeline::Timeline;
use crate::walreceiver::{ReceiverStatus, WalReceiver};

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
    #[error("{0}")]
    Failed(String),
}

pub struct Tenants {
    pub conf: Arc<PageserverConfig>,
    pub metrics: Arc<Metrics>,
    timelines: RwLock<BTreeMap<(TenantId, TimelineId), Arc<TimelineEntry>>>,
    creating: Mutex<()>,
}

impl Tenants {
    fn timeline_dir(&self, tenant: TenantId, timeline: TimelineId) -> PathBuf {
        self.conf.data_dir.join("tenants").join(tenant.to_string()).join("timelines").join(timeline.to_string())
    }

    /// Loads every timeline under the data directory and starts its WAL receiver.
    pub fn load(conf: Arc<PageserverConfig>, metrics: Arc<Metrics>) -> Result<Arc<Tenants>, String> {
        let tenants =
            Arc::new(Tenants { conf, metrics, timelines: RwLock::new(BTreeMap::new()), creating: Mutex::new(()) });
        let root = tenants.conf.data_dir.join("tenants");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        for t in std::fs::read_dir(&root).map_err(|e| format!("{}: {e}", root.display()))? {
            let t = t.map_err(|e| format!("{}: {e}", root.display()))?;
            let Ok(tenant_id) = t.file_name().to_string_lossy().parse::<TenantId>() else { continue };
            let tl_root = t.path().join("timelines");
            let Ok(entries) = std::fs::read_dir(&tl_root) else { continue };
            for l in entries.flatten() {
                let Ok(timeline_id) = l.file_name().to_string_lossy().parse::<TimelineId>() else { continue };
                if !l.path().join("metadata.json").exists() {
                    warn!(dir = %l.path().display(), "removing a timeline whose creation did not finish");
                    let _ = std::fs::remove_dir_all(l.path());
                    continue;
                }
                match Timeline::load(
                    l.path(),
                    tenants.conf.fsync,
                    tenants.conf.checkpoint_distance,
                    tenants.metrics.clone(),
                ) {
                    Ok(tl) => {
                        info!(%tenant_id, %timeline_id, disk_consistent_lsn = %tl.disk_consistent_lsn(), "loaded timeline");
                        tenants.attach(tl);
                    }
                    Err(e) if e.contains("did not finish") => {
                        warn!("{e}; removing it");
                        let _ = std::fs::remove_dir_all(l.path());
                    }
                    Err(e) => error!(%tenant_id, %timeline_id, "cannot load timeline: {e}"),
                }
            }
        }
        Ok(tenants)
    }

    fn attach(&self, tl: Arc<Timeline>) -> Arc<TimelineEntry> {
        let receiver = WalReceiver::spawn(tl.clone(), self.conf.safekeepers.clone());
        let entry = Arc::new(TimelineEntry {
            tl: tl.clone(),
            receiver: receiver.status.clone(),
            handle: Mutex::new(Some(receiver)),
        });
        self.timelines.write().insert((tl.tenant_id, tl.timeline_id), entry.clone());
        entry
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
        if self.get(tenant, timeline).is_some() || dir.exists() {
            return Err(CreateError::Exists(tenant, timeline));
        }
        let pgdata = self.conf.data_dir.join("tmp").join(format!("initdb-{timeline}"));
        let result = import::run_initdb(&self.conf, &pgdata).and_then(|()| {
            import::import_datadir(&pgdata, dir.clone(), tenant, timeline, &self.conf, self.metrics.clone())
        });
        let _ = std::fs::remove_dir_all(&pgdata);
        match result {
            Ok((tl, imported)) => {
                info!(%tenant, %timeline, start_lsn = %imported.end_lsn, system_id = imported.system_id, "bootstrapped tenant");
                Ok(self.attach(tl))
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(CreateError::Failed(format!("bootstrap of {tenant}/{timeline}: {e}")))
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
        let broken = self.tl.broken_reason();
        let (memory_layers, delta_layers) = self.tl.layer_count();
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
            "wal_source": receiver.safekeeper,
            "safekeeper_commit_lsn": receiver.safekeeper_commit_lsn,
            "wal_source_error": receiver.last_error,
            "memory_layers": memory_layers,
            "delta_layers": delta_layers,
            "state": if broken.is_some() { "broken" } else { "active" },
            "error": broken,
        })
    }
}
