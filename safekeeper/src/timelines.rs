//! All timelines of this safekeeper, loaded from the data directory at
//! start-up and created through the HTTP API.

use std::collections::{BTreeMap, HashMap};
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::safekeeper::TimelineIdentity;
use strata_protocol::{NodeId, TenantId, TimelineId};

use strata_protocol::api::safekeeper::Unloadable;
use strata_service::clock::Clock;

use crate::acceptor::StorageError;
use crate::timeline::Timeline;

/// Suffix of a timeline directory being deleted.
const DELETED_SUFFIX: &str = ".deleted";

/// Why a timeline could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("timeline {0}/{1} exists with a different identity or start LSN")]
    Conflict(TenantId, TimelineId),
    #[error("timeline {0}/{1} exists on disk but could not be loaded ({2}); it is kept as it is")]
    Unloadable(TenantId, TimelineId, String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The registry of timelines.
pub struct Timelines {
    pub node_id: NodeId,
    pub data_dir: PathBuf,
    pub no_sync: bool,
    /// The time every timeline reads (given to each when it is loaded or created).
    pub clock: Arc<dyn Clock>,
    map: Mutex<HashMap<(TenantId, TimelineId), Arc<Timeline>>>,
    /// Timelines found on disk that could not be loaded, with the reason:
    /// never served, never overwritten, shown in the status.
    unloadable: Mutex<BTreeMap<(TenantId, TimelineId), String>>,
}

impl Timelines {
    /// Loads every timeline found under `data_dir/<tenant>/<timeline>/`. A
    /// timeline that does not load is reported (and left on disk as it is);
    /// the others are served.
    pub fn load(
        node_id: NodeId,
        data_dir: PathBuf,
        no_sync: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<Timelines, StorageError> {
        std::fs::create_dir_all(&data_dir).map_err(|e| StorageError::io("creating", &data_dir, &e))?;
        let mut map = HashMap::new();
        let mut unloadable = BTreeMap::new();
        let read = |p: &PathBuf| std::fs::read_dir(p).map_err(|e| StorageError::io("listing", p, &e));
        for tenant in read(&data_dir)? {
            let tenant = tenant.map_err(|e| StorageError::io("listing", &data_dir, &e))?.path();
            let Some(tenant_id) = tenant.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()) else {
                continue;
            };
            for timeline in read(&tenant)? {
                let dir = timeline.map_err(|e| StorageError::io("listing", &tenant, &e))?.path();
                if dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(DELETED_SUFFIX)) {
                    // A deletion cut short: finish it.
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), "removing a deleted timeline's directory: {e}");
                    }
                    continue;
                }
                let Some(timeline_id) = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()) else {
                    continue;
                };
                match Timeline::load(&dir, node_id, no_sync, clock.clone()) {
                    Ok(tl) => {
                        tracing::info!(%tenant_id, %timeline_id, flush_lsn = %tl.positions().flush_lsn, "loaded timeline");
                        map.insert((tenant_id, timeline_id), tl);
                    }
                    Err(e) => {
                        tracing::error!(%tenant_id, %timeline_id, "timeline not loaded, left on disk as it is: {e}");
                        unloadable.insert((tenant_id, timeline_id), e.to_string());
                    }
                }
            }
        }
        Ok(Timelines { node_id, data_dir, no_sync, clock, map: Mutex::new(map), unloadable: Mutex::new(unloadable) })
    }

    pub fn get(&self, tenant: TenantId, timeline: TimelineId) -> Option<Arc<Timeline>> {
        self.map.lock().get(&(tenant, timeline)).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Timeline>> {
        self.map.lock().values().cloned().collect()
    }

    /// The local WAL bytes of each tenant's timelines, as each timeline's
    /// removal last counted them (what its status shows as
    /// `removal.local_wal_bytes`): no directory is read.
    pub fn wal_bytes_by_tenant(&self) -> BTreeMap<TenantId, u64> {
        let mut out = BTreeMap::new();
        for tl in self.all() {
            *out.entry(tl.identity.tenant_id).or_insert(0) += tl.progress.removal().local_wal_bytes;
        }
        out
    }

    /// Timelines on disk that could not be loaded, with why.
    pub fn unloadable(&self) -> Vec<Unloadable> {
        self.unloadable
            .lock()
            .iter()
            .map(|((t, l), why)| Unloadable { tenant_id: *t, timeline_id: *l, error: why.clone() })
            .collect()
    }

    /// Deletes a timeline (a deleted branch): it leaves the map, its
    /// proposers are disconnected, and its directory is renamed away
    /// (durably) and removed; a crash in between is finished at the next
    /// load. Returns whether it existed.
    pub fn delete(&self, tenant: TenantId, timeline: TimelineId) -> Result<bool, StorageError> {
        let Some(tl) = self.map.lock().remove(&(tenant, timeline)) else { return Ok(false) };
        tl.disconnect_proposers();
        let dir = tl.dir.clone();
        let mut gone = dir.clone().into_os_string();
        gone.push(DELETED_SUFFIX);
        let gone = PathBuf::from(gone);
        if let Err(e) = std::fs::rename(&dir, &gone) {
            // Nothing was deleted: it is served again.
            self.map.lock().insert((tenant, timeline), tl);
            return Err(StorageError::io("renaming", &dir, &e));
        }
        if !self.no_sync {
            strata_service::durable::sync_dir(dir.parent().expect("under the tenant's directory"))?;
        }
        std::fs::remove_dir_all(&gone).map_err(|e| StorageError::io("removing", &gone, &e))?;
        // The tenant's directory goes with its last timeline. Under the map's
        // lock: a creation of another timeline of the tenant makes the
        // directory under it too, so it never finds the directory gone.
        let tenant_dir = dir.parent().expect("under the tenant's directory");
        let _creations_wait = self.map.lock();
        match std::fs::remove_dir(tenant_dir) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DirectoryNotEmpty) => {}
            Err(e) => return Err(StorageError::io("removing", tenant_dir, &e)),
        }
        tracing::info!(%tenant, %timeline, "deleted timeline");
        Ok(true)
    }

    /// Creates a timeline; creating one that exists with the same identity
    /// and start is a no-op, with a different one an error.
    pub fn create(&self, identity: &TimelineIdentity, start_lsn: Lsn) -> Result<(Arc<Timeline>, bool), CreateError> {
        let mut map = self.map.lock();
        let key = (identity.tenant_id, identity.timeline_id);
        if let Some(existing) = map.get(&key) {
            if existing.identity == *identity && existing.start_lsn == start_lsn {
                return Ok((existing.clone(), false));
            }
            return Err(CreateError::Conflict(identity.tenant_id, identity.timeline_id));
        }
        if let Some(why) = self.unloadable.lock().get(&key) {
            return Err(CreateError::Unloadable(identity.tenant_id, identity.timeline_id, why.clone()));
        }
        let tl = Timeline::create(&self.data_dir, self.node_id, identity, start_lsn, self.no_sync, self.clock.clone())?;
        map.insert(key, tl.clone());
        Ok((tl, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(tenant: u8, timeline: u8) -> TimelineIdentity {
        TimelineIdentity {
            tenant_id: TenantId([tenant; 16]),
            timeline_id: TimelineId([timeline; 16]),
            system_id: 7,
            pg_version: 15,
            wal_segment_size: 1 << 20,
        }
    }

    /// A tenant's directory stays while it has a timeline and goes with its
    /// last one; another tenant's is untouched.
    #[test]
    fn a_tenant_directory_goes_with_its_last_timeline() {
        let dir = strata_test_support::scratch_dir("sk-timelines-delete");
        let clock: Arc<dyn Clock> = Arc::new(strata_service::clock::SystemClock);
        let timelines = Timelines::load(NodeId(1), dir.clone(), true, clock).unwrap();
        for (t, l) in [(1, 1), (1, 2), (3, 1)] {
            timelines.create(&identity(t, l), Lsn(1 << 20)).unwrap();
        }
        let tenant_dir = dir.join(TenantId([1; 16]).to_string());
        assert!(timelines.delete(TenantId([1; 16]), TimelineId([1; 16])).unwrap());
        assert!(tenant_dir.is_dir(), "its other timeline is still there");
        assert!(timelines.delete(TenantId([1; 16]), TimelineId([2; 16])).unwrap());
        assert!(!tenant_dir.exists());
        assert!(dir.join(TenantId([3; 16]).to_string()).join(TimelineId([1; 16]).to_string()).is_dir());
        // Gone already: nothing to delete, no error.
        assert!(!timelines.delete(TenantId([1; 16]), TimelineId([2; 16])).unwrap());
        // The tenant comes back with a new timeline.
        timelines.create(&identity(1, 4), Lsn(1 << 20)).unwrap();
        assert!(tenant_dir.is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A deletion waits for the upload round in flight, and no round
    /// begins after it: no offloaded object lands after the deletion
    /// listed them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deletion_waits_for_the_upload_in_flight_and_stops_the_next() {
        let dir = strata_test_support::scratch_dir("sk-timelines-uploads");
        let clock: Arc<dyn Clock> = Arc::new(strata_service::clock::SystemClock);
        let timelines = Timelines::load(NodeId(1), dir.clone(), true, clock).unwrap();
        let (tl, _) = timelines.create(&identity(1, 1), Lsn(1 << 20)).unwrap();
        let leave = tl.upload_leave().await.expect("a live timeline may upload");
        let stopping = {
            let tl = tl.clone();
            tokio::spawn(async move { tl.stop_uploads().await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!stopping.is_finished(), "the deletion waits while a round writes");
        drop(leave);
        tokio::time::timeout(std::time::Duration::from_secs(10), stopping).await.unwrap().unwrap();
        assert!(tl.upload_leave().await.is_none(), "no round after the deletion");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
