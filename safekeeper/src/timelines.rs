//! All timelines of this safekeeper, loaded from the data directory at
//! start-up and created through the HTTP API.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use strata_formats::Lsn;
use strata_protocol::safekeeper::TimelineIdentity;
use strata_protocol::{NodeId, TenantId, TimelineId};

use crate::acceptor::StorageError;
use crate::timeline::{timeline_dir, Timeline};

/// The registry of timelines.
pub struct Timelines {
    pub node_id: NodeId,
    pub data_dir: PathBuf,
    pub no_sync: bool,
    map: Mutex<HashMap<(TenantId, TimelineId), Arc<Timeline>>>,
}

impl Timelines {
    /// Loads every timeline found under `data_dir/<tenant>/<timeline>/`.
    pub fn load(node_id: NodeId, data_dir: PathBuf, no_sync: bool) -> Result<Timelines, StorageError> {
        std::fs::create_dir_all(&data_dir).map_err(|e| StorageError(format!("{}: {e}", data_dir.display())))?;
        let mut map = HashMap::new();
        let read = |p: &PathBuf| std::fs::read_dir(p).map_err(|e| StorageError(format!("{}: {e}", p.display())));
        for tenant in read(&data_dir)? {
            let tenant = tenant.map_err(|e| StorageError(e.to_string()))?.path();
            let Some(tenant_id) = tenant.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()) else {
                continue;
            };
            for timeline in read(&tenant)? {
                let dir = timeline.map_err(|e| StorageError(e.to_string()))?.path();
                let Some(timeline_id) = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()) else {
                    continue;
                };
                let tl = Timeline::load(&dir, node_id, no_sync)?;
                tracing::info!(%tenant_id, %timeline_id, flush_lsn = %tl.positions().flush_lsn, "loaded timeline");
                map.insert((tenant_id, timeline_id), tl);
            }
        }
        Ok(Timelines { node_id, data_dir, no_sync, map: Mutex::new(map) })
    }

    pub fn get(&self, tenant: TenantId, timeline: TimelineId) -> Option<Arc<Timeline>> {
        self.map.lock().expect("lock poisoned").get(&(tenant, timeline)).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Timeline>> {
        self.map.lock().expect("lock poisoned").values().cloned().collect()
    }

    /// Creates a timeline; creating one that exists with the same identity
    /// and start is a no-op, with a different one an error.
    pub fn create(&self, identity: &TimelineIdentity, start_lsn: Lsn) -> Result<(Arc<Timeline>, bool), StorageError> {
        let mut map = self.map.lock().expect("lock poisoned");
        let key = (identity.tenant_id, identity.timeline_id);
        if let Some(existing) = map.get(&key) {
            if existing.identity == *identity && existing.start_lsn == start_lsn {
                return Ok((existing.clone(), false));
            }
            return Err(StorageError(format!(
                "timeline {}/{} exists with a different identity or start LSN",
                identity.tenant_id, identity.timeline_id
            )));
        }
        let _ = timeline_dir(&self.data_dir, identity.tenant_id, identity.timeline_id);
        let tl = Timeline::create(&self.data_dir, self.node_id, identity, start_lsn, self.no_sync)?;
        map.insert(key, tl.clone());
        Ok((tl, true))
    }
}
