//! A timeline's side of object storage: the upload loop that makes the
//! remote index follow the local metadata, on-demand downloads, and
//! attaching timelines from the index alone.
//!
//! The loop works from snapshots of the metadata: it uploads the listed
//! layers that are not in remote storage yet (at most
//! [`super::MAX_UPLOADS_IN_FLIGHT`] per pageserver at once), then the
//! index that lists them, then queues the deletion of the objects the new
//! index no longer lists. An object is part of the timeline only once an
//! index lists it, so a crash at any point leaves an index whose every
//! layer is whole in remote storage.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::{TenantShardId, TimelineId};
use strata_remote_storage::wal::{fetch_segment, SegmentMeta};
use strata_remote_storage::RemoteError;
use strata_service::backoff::Backoff;
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use super::index::{index_key, layer_key, newest_index, timeline_prefix, IndexLayer, RemoteIndex};
use super::{DeletionBatch, Remote};
use crate::layer::layer_file::{Fetch, LayerName};
pub use strata_protocol::api::pageserver::UploadStatus;

use crate::metadata::{TimelineMetadata, METADATA_VERSION};

use crate::limits::{UPLOAD_RETRY_MAX as RETRY_MAX, UPLOAD_RETRY_MIN as RETRY_MIN, UPLOAD_SYNC_PERIOD as SYNC_PERIOD};

#[derive(Default)]
struct SyncState {
    /// Every object in remote storage this timeline may use: what the
    /// newest index lists, plus layers uploaded for the next one.
    uploaded: BTreeMap<String, IndexLayer>,
    /// The newest index in remote storage (ours, or the one attached from).
    index: Option<RemoteIndex>,
    /// Index objects of older generations: deleted once ours is uploaded.
    older_indexes: Vec<String>,
    last_error: Option<String>,
    /// Why uploads stopped for good: the attachment file no longer names
    /// this generation, so a newer attachment owns the tenant.
    superseded: Option<String>,
}

/// An index found in remote storage, with the older ones beside it.
pub struct FoundIndex {
    pub index: RemoteIndex,
    /// Object names of indexes of generations below ours.
    pub older: Vec<String>,
}

/// Why a round of the upload loop stopped.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("{0}")]
    Remote(#[from] RemoteError),
    /// A listed file was replaced meanwhile (compaction): take a new snapshot.
    #[error("layer file {0} was replaced while being uploaded")]
    Replaced(String),
    #[error("{0}")]
    Other(String),
}

/// What a timeline's upload loop finds when it looks at the timeline.
pub enum UploadSource {
    /// The timeline was dropped: the loop ends.
    Gone,
    /// The timeline is broken: its metadata may not match its files, so
    /// nothing is uploaded until it is reloaded.
    Broken,
    /// What the timeline holds now.
    Metadata(TimelineMetadata),
}

/// A timeline's remote storage client.
pub struct RemoteTimeline {
    remote: Arc<Remote>,
    pub tenant_id: TenantShardId,
    pub timeline_id: TimelineId,
    /// Of this pageserver's attachment of the tenant.
    pub generation: u32,
    dir: PathBuf,
    state: Mutex<SyncState>,
    wake: Notify,
    consistent: watch::Sender<Lsn>,
    /// Only the newest upload loop runs (a timeline re-read from disk starts a new one).
    loop_id: AtomicU64,
    stopped: AtomicBool,
    /// Held by the upload loop for each round of uploads (not while it
    /// waits), so that `stop_and_wait` can wait for the round under way.
    round: tokio::sync::Mutex<()>,
    /// Set once a newer generation owns the tenant (see `SyncState::superseded`).
    superseded: Arc<AtomicBool>,
    /// A reader's client (`docs/sites.md`): it reads the index and
    /// downloads layers, and never uploads or deletes anything.
    reader: bool,
    /// A reader's read failed on a layer (gone from object storage, most
    /// likely): the tenant is loaded again at the next refresh.
    reload_wanted: AtomicBool,
}

impl RemoteTimeline {
    pub fn new(
        remote: Arc<Remote>,
        tenant_id: TenantShardId,
        timeline_id: TimelineId,
        generation: u32,
        dir: PathBuf,
        found: Option<FoundIndex>,
    ) -> Arc<RemoteTimeline> {
        Self::build(remote, tenant_id, timeline_id, generation, dir, found, false)
    }

    /// The client of a reader location: generation 0 (its WAL streams are
    /// never fenced and fence nothing), no upload loop.
    pub fn reader(
        remote: Arc<Remote>,
        tenant_id: TenantShardId,
        timeline_id: TimelineId,
        dir: PathBuf,
        found: Option<FoundIndex>,
    ) -> Arc<RemoteTimeline> {
        Self::build(remote, tenant_id, timeline_id, 0, dir, found, true)
    }

    fn build(
        remote: Arc<Remote>,
        tenant_id: TenantShardId,
        timeline_id: TimelineId,
        generation: u32,
        dir: PathBuf,
        found: Option<FoundIndex>,
        reader: bool,
    ) -> Arc<RemoteTimeline> {
        let mut state = SyncState::default();
        let mut consistent = Lsn::INVALID;
        if let Some(f) = found {
            state.uploaded = f.index.layers.iter().map(|l| (l.name.clone(), l.clone())).collect();
            consistent = f.index.disk_consistent_lsn;
            state.index = Some(f.index);
            state.older_indexes = f.older;
        }
        Arc::new(RemoteTimeline {
            remote,
            tenant_id,
            timeline_id,
            generation,
            dir,
            state: Mutex::new(state),
            wake: Notify::new(),
            consistent: watch::Sender::new(consistent),
            loop_id: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            round: tokio::sync::Mutex::new(()),
            superseded: Arc::new(AtomicBool::new(false)),
            reader,
            reload_wanted: AtomicBool::new(false),
        })
    }

    /// Whether this is a reader's client (nothing is ever uploaded).
    pub fn is_reader(&self) -> bool {
        self.reader
    }

    /// Asks for the reader to be loaded again (a layer read failed).
    pub fn want_reload(&self) {
        self.reload_wanted.store(true, Ordering::SeqCst);
    }

    /// Whether a reload was asked for.
    pub fn reload_wanted(&self) -> bool {
        self.reload_wanted.load(Ordering::SeqCst)
    }

    /// The newest index of the timeline at or below `generation`, if any.
    pub fn find_index(
        remote: &Arc<Remote>,
        tenant: TenantShardId,
        timeline: TimelineId,
        generation: u32,
    ) -> Result<Option<FoundIndex>, String> {
        let storage = remote.storage.clone();
        let prefix = timeline_prefix(tenant, timeline);
        let listed = remote
            .block_on(async move { storage.list(&prefix).await })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let keys: Vec<&str> = listed.iter().map(|o| o.key.as_str()).collect();
        let Some((g, key)) = newest_index(keys.iter().copied(), generation) else { return Ok(None) };
        let storage = remote.storage.clone();
        let k = key.to_string();
        let bytes = remote
            .block_on(async move { storage.get(&k).await })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let index = RemoteIndex::decode(&bytes).map_err(|e| format!("{key}: {e}"))?;
        if index.generation != g {
            return Err(format!("{key}: written by generation {}, named for {g}", index.generation));
        }
        let older = keys
            .iter()
            .filter_map(|k| newest_index([*k], generation.saturating_sub(1)).map(|(_, k)| k.to_string()))
            .collect();
        Ok(Some(FoundIndex { index, older }))
    }

    /// Wakes the upload loop: the metadata changed.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Stops the upload loop (shutdown).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Stops the upload loop and waits for a round under way to end: after
    /// it returns nothing of this timeline is uploaded (a deletion lists
    /// its objects after this). Called from a blocking thread.
    pub fn stop_and_wait(&self) {
        self.stop();
        drop(self.round.blocking_lock());
    }

    /// Starts the upload loop of a timeline (replacing any earlier loop);
    /// `source` tells the loop what the timeline holds now.
    pub fn start(self: &Arc<Self>, source: impl Fn() -> UploadSource + Send + Sync + 'static) {
        if self.reader {
            return;
        }
        let id = self.loop_id.fetch_add(1, Ordering::SeqCst) + 1;
        let me = self.clone();
        self.remote.spawn(async move { me.run(source, id).await });
        self.wake();
    }

    /// `disk_consistent_lsn` of the newest index in remote storage.
    pub fn remote_consistent_lsn(&self) -> Lsn {
        *self.consistent.borrow()
    }

    /// The newest index in remote storage, if any.
    pub fn index(&self) -> Option<RemoteIndex> {
        self.state.lock().index.clone()
    }

    /// Size of an uploaded layer (perhaps not yet listed by an index), as its index entry has it.
    pub fn uploaded_size(&self, name: &str) -> Option<u64> {
        self.state.lock().uploaded.get(name).map(|l| l.size)
    }

    /// Whether the newest remote index lists the layer `name`: only then may
    /// its local file go (after a crash the pageserver finds it through
    /// that index).
    pub fn is_in_index(&self, name: &str) -> bool {
        self.state
            .lock()
            .index
            .as_ref()
            .is_some_and(|i| i.layers.binary_search_by(|l| l.name.as_str().cmp(name)).is_ok())
    }

    /// Segment `segno` of this timeline's WAL as the safekeepers offloaded
    /// it to the same object storage, checked against its metadata (`None`:
    /// not offloaded).
    pub fn fetch_wal_segment(&self, segno: u64, segment_size: u64) -> Result<Option<(SegmentMeta, Vec<u8>)>, String> {
        let (storage, tenant, timeline) = (self.remote.storage.clone(), self.tenant_id, self.timeline_id);
        self.remote
            .block_on(async move { fetch_segment(&storage, tenant.tenant, timeline, segno, segment_size).await })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Waits until the remote index covers `lsn`.
    pub fn wait_uploaded(&self, lsn: Lsn, timeout: Duration) -> Result<(), String> {
        if self.reader {
            return Err(format!(
                "a reader location uploads nothing (the index it read covers {})",
                self.remote_consistent_lsn()
            ));
        }
        let mut rx = self.consistent.subscribe();
        self.wake();
        let superseded = self.superseded.clone();
        let clock = self.remote.clock.clone();
        let reached = self
            .remote
            .block_on(async move {
                let done = |l: &Lsn| *l >= lsn || superseded.load(Ordering::SeqCst);
                strata_service::clock::timeout(&*clock, timeout, rx.wait_for(done)).await.is_ok()
            })
            .map_err(|e| e.to_string())?;
        // Taken in a statement of its own: a guard in the `if let` would be
        // held through the `else` branches, which lock again (a deadlock
        // that stopped every upload after a wait that timed out).
        let superseded = self.state.lock().superseded.clone();
        if let Some(why) = superseded {
            Err(why)
        } else if reached {
            Ok(())
        } else {
            let err = self.state.lock().last_error.clone();
            Err(format!(
                "the remote index reached {} and not {lsn} within {timeout:?}{}",
                self.remote_consistent_lsn(),
                err.map(|e| format!(" (last upload error: {e})")).unwrap_or_default()
            ))
        }
    }

    /// Bytes of the layers the newest index lists, as the status shows
    /// them (`remote_bytes`): from the index held in memory, so cheap
    /// enough for every metrics scrape (no listing of object storage).
    pub fn remote_bytes(&self) -> u64 {
        index_totals(self.state.lock().index.as_ref()).1
    }

    /// Bytes of the layers the newest index names in another shard's
    /// objects (a split's parent's).
    pub fn foreign_bytes(&self) -> u64 {
        let state = self.state.lock();
        state.index.as_ref().map_or(0, |i| i.layers.iter().filter(|l| l.is_foreign()).map(|l| l.size).sum())
    }

    /// The remote side now; `local` are the timeline's layer files (name, bytes).
    pub fn status(&self, local: &[(String, u64)]) -> UploadStatus {
        let state = self.state.lock();
        let (remote_layers, remote_bytes) = index_totals(state.index.as_ref());
        let pending: Vec<u64> =
            local.iter().filter(|(n, _)| !state.uploaded.contains_key(n)).map(|(_, b)| *b).collect();
        UploadStatus {
            generation: self.generation,
            remote_consistent_lsn: self.remote_consistent_lsn(),
            remote_layers,
            remote_bytes,
            upload_queue_layers: pending.len(),
            upload_lag_bytes: pending.iter().sum(),
            backpressure: pending.iter().sum::<u64>() > self.remote.max_upload_lag_bytes,
            upload_error: state.last_error.clone(),
        }
    }

    async fn run(self: Arc<Self>, source: impl Fn() -> UploadSource, id: u64) {
        let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
        let clock = self.remote.clock.clone();
        loop {
            let _ = strata_service::clock::timeout(&*clock, SYNC_PERIOD, self.wake.notified()).await;
            // Checked under the round's lock: once `stop_and_wait` has taken
            // it, no round starts.
            let round = self.round.lock().await;
            if self.stopped.load(Ordering::SeqCst) || self.loop_id.load(Ordering::SeqCst) != id {
                return;
            }
            let meta = match source() {
                UploadSource::Gone => return,
                UploadSource::Broken => continue,
                UploadSource::Metadata(meta) => meta,
            };
            if let Some(why) = self.superseded_by().await {
                warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, "{why}");
                {
                    let mut state = self.state.lock();
                    state.last_error = Some(why.clone());
                    state.superseded = Some(why);
                }
                self.superseded.store(true, Ordering::SeqCst);
                // Waiters for an upload learn that none will come.
                self.consistent.send_modify(|_| {});
                return;
            }
            let result = self.sync(&meta).await;
            drop(round);
            match result {
                Ok(()) => {
                    backoff.reset();
                    self.state.lock().last_error = None;
                }
                Err(SyncError::Replaced(name)) => {
                    tracing::debug!(tenant = %self.tenant_id, timeline = %self.timeline_id, "{name} was replaced; taking the new layer list");
                    clock.sleep(RETRY_MIN).await;
                    self.wake();
                }
                Err(e) => {
                    self.remote.metrics.upload_errors.inc();
                    let delay = backoff.next_delay();
                    warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, ?delay, "uploading: {e}; retrying");
                    self.state.lock().last_error = Some(e.to_string());
                    clock.sleep(delay).await;
                    self.wake();
                }
            }
        }
    }

    /// Why this attachment may no longer upload, if so: the authority
    /// names another generation, or not the tenant at all. Uploads of a
    /// stale generation would be harmless (the new attachment never reads
    /// them) but endless. An unreadable authority says nothing: uploads go on.
    async fn superseded_by(&self) -> Option<String> {
        let current = self.remote.authority.generations(&self.remote.storage).await;
        let ours = self.generation;
        let source = self.remote.authority.describe();
        match current.map(|c| c.get(&self.tenant_id).copied()) {
            Ok(Some(g)) if g == ours => None,
            Ok(Some(g)) => {
                Some(format!("generation {ours} is no longer current ({source} names generation {g}): uploads stopped"))
            }
            Ok(None) => {
                Some(format!("{source} no longer lists the tenant (generation {ours} was ours): uploads stopped"))
            }
            Err(e) => {
                warn!(tenant = %self.tenant_id, "reading {source}: {e}; uploading anyway");
                None
            }
        }
    }

    /// One round: the layers `meta` lists that are not uploaded, then the
    /// index, then the deletions.
    async fn sync(&self, meta: &TimelineMetadata) -> Result<(), SyncError> {
        let missing: Vec<String> = {
            let state = self.state.lock();
            meta.layers.iter().filter(|n| !state.uploaded.contains_key(*n)).cloned().collect()
        };
        let mut uploads = tokio::task::JoinSet::new();
        for name in missing {
            let permit =
                self.remote.uploads.clone().acquire_owned().await.map_err(|e| SyncError::Other(e.to_string()))?;
            let path = self.dir.join(&name);
            let key = layer_key(self.tenant_id, self.timeline_id, &name, self.generation);
            let storage = self.remote.storage.clone();
            let generation = self.generation;
            uploads.spawn(async move {
                let _permit = permit;
                let uploaded = match storage.upload_file(&key, &path).await {
                    Ok(u) => u,
                    // Compaction replaced the layer since `meta` was taken.
                    Err(RemoteError::Local { op: "reading", source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Err(SyncError::Replaced(name))
                    }
                    Err(e) => return Err(e.into()),
                };
                let layer = IndexLayer { name, size: uploaded.size, crc32c: uploaded.crc32c, generation, owner: None };
                Ok(layer)
            });
        }
        let mut first_error = None;
        while let Some(done) = uploads.join_next().await {
            match done.map_err(|e| SyncError::Other(e.to_string())).and_then(|r| r) {
                Ok(layer) => {
                    self.remote.metrics.layers_uploaded.inc();
                    self.remote.metrics.upload_bytes.inc_by(layer.size);
                    self.state.lock().uploaded.insert(layer.name.clone(), layer);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let index = {
            let state = self.state.lock();
            let mut layers = Vec::with_capacity(meta.layers.len());
            for name in &meta.layers {
                let l = state.uploaded.get(name).ok_or_else(|| SyncError::Other(format!("{name} vanished")))?;
                layers.push(l.clone());
            }
            layers.sort_by(|a, b| a.name.cmp(&b.name));
            let index = RemoteIndex {
                generation: self.generation,
                pg_version: meta.pg_version,
                system_id: meta.system_id,
                wal_segment_size: meta.wal_segment_size,
                start_lsn: meta.start_lsn,
                disk_consistent_lsn: meta.disk_consistent_lsn,
                prev_record_lsn: meta.prev_record_lsn,
                ancestor_timeline_id: meta.ancestor_timeline_id,
                ancestor_lsn: meta.ancestor_lsn,
                gc_cutoff_lsn: meta.gc_cutoff_lsn,
                retain_lsns: meta.retain_lsns.clone(),
                layers,
                stripe_blocks: meta.stripe_blocks,
            };
            if state.index.as_ref() == Some(&index) {
                return Ok(());
            }
            index
        };
        let key = index_key(self.tenant_id, self.timeline_id, self.generation);
        self.remote.storage.put(&key, Bytes::from(index.encode())).await?;
        self.remote.metrics.indexes_uploaded.inc();
        let lsn = index.disk_consistent_lsn;
        // What no index lists any more goes, through the validated queue.
        let (gone, older) = {
            let mut state = self.state.lock();
            let listed: BTreeSet<&str> = index.layers.iter().map(|l| l.name.as_str()).collect();
            let gone: Vec<IndexLayer> =
                state.uploaded.values().filter(|l| !listed.contains(l.name.as_str())).cloned().collect();
            for l in &gone {
                state.uploaded.remove(&l.name);
            }
            state.index = Some(index);
            (gone, std::mem::take(&mut state.older_indexes))
        };
        self.consistent.send_replace(lsn);
        // Another shard's layers (a split's parent's) are only let go of:
        // their objects go with the parent's sweep.
        let mut keys: Vec<String> =
            gone.iter().filter(|l| !l.is_foreign()).map(|l| l.object_key(self.tenant_id, self.timeline_id)).collect();
        keys.extend(older);
        self.remote.delete_later(DeletionBatch { tenant: self.tenant_id, generation: self.generation, keys }).await;
        Ok(())
    }
}

impl Fetch for RemoteTimeline {
    fn fetch(&self, name: &LayerName, path: &Path, size: u64) -> Result<(), String> {
        let name_s = name.to_string();
        let entry = self
            .state
            .lock()
            .uploaded
            .get(&name_s)
            .cloned()
            .ok_or_else(|| format!("layer {name_s} is neither local nor in remote storage"))?;
        if entry.size != size {
            return Err(format!("layer {name_s}: the index says {} bytes, the timeline {size}", entry.size));
        }
        let key = entry.object_key(self.tenant_id, self.timeline_id);
        let storage = self.remote.storage.clone();
        let started = self.remote.clock.now();
        let k = key.clone();
        let got = self.remote.block_on(async move { storage.get(&k).await }).map_err(|e| e.to_string())?;
        let bytes = got.map_err(|e| {
            self.remote.metrics.download_errors.inc();
            e.to_string()
        })?;
        let crc = crc32c::crc32c(&bytes);
        if bytes.len() as u64 != entry.size || crc != entry.crc32c {
            self.remote.metrics.download_errors.inc();
            return Err(format!(
                "{key}: {} bytes with CRC {crc:08x}, the index says {} bytes with CRC {:08x}",
                bytes.len(),
                entry.size,
                entry.crc32c
            ));
        }
        let tmp = PathBuf::from(format!("{}.download", path.display()));
        let written = (|| {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            if self.remote.fsync {
                f.sync_all()?;
            }
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("writing {}: {e}", path.display()));
        }
        self.remote.metrics.layers_downloaded.inc();
        self.remote.metrics.download_bytes.inc_by(entry.size);
        info!(
            tenant = %self.tenant_id, timeline = %self.timeline_id, layer = %name_s, bytes = entry.size,
            elapsed_ms = self.remote.clock.since(started).as_millis() as u64, "downloaded a layer on demand"
        );
        Ok(())
    }
}

/// The timelines of `tenant` that remote storage holds objects of.
pub fn remote_timelines(remote: &Arc<Remote>, tenant: TenantShardId) -> Result<Vec<TimelineId>, String> {
    let storage = remote.storage.clone();
    let prefix = format!("tenants/{tenant}/timelines");
    let listed = remote
        .block_on(async move { storage.list(&prefix).await })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let mut out = BTreeSet::new();
    for o in listed {
        let mut parts = o.key.split('/');
        if let (Some("tenants"), Some(_), Some("timelines"), Some(tl)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            if let Ok(id) = tl.parse::<TimelineId>() {
                out.insert(id);
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// Deletes every object of a timeline (a deleted branch): its indexes
/// first, so an attach never finds an index whose layers are going, then
/// its layers. Returns how many objects went.
pub fn delete_timeline_objects(
    remote: &Arc<Remote>,
    tenant: TenantShardId,
    timeline: TimelineId,
) -> Result<usize, String> {
    let storage = remote.storage.clone();
    let prefix = format!("{}/", super::index::timeline_prefix(tenant, timeline));
    remote
        .block_on(async move {
            let mut keys: Vec<String> =
                storage.list(&prefix).await.map_err(|e| e.to_string())?.into_iter().map(|o| o.key).collect();
            // Indexes before layers.
            keys.sort_by_key(|k| !k.rsplit('/').next().is_some_and(|n| n.starts_with("index-")));
            for key in &keys {
                storage.delete(key).await.map_err(|e| format!("deleting {key}: {e}"))?;
            }
            Ok::<usize, String>(keys.len())
        })
        .map_err(|e| e.to_string())?
}

/// The metadata of a timeline attached from `index` alone.
pub fn metadata_from_index(tenant: TenantShardId, timeline: TimelineId, index: &RemoteIndex) -> TimelineMetadata {
    TimelineMetadata {
        format_version: METADATA_VERSION,
        tenant_id: tenant,
        timeline_id: timeline,
        ancestor_timeline_id: index.ancestor_timeline_id,
        ancestor_lsn: index.ancestor_lsn,
        pg_version: index.pg_version,
        system_id: index.system_id,
        wal_segment_size: index.wal_segment_size,
        start_lsn: index.start_lsn,
        disk_consistent_lsn: index.disk_consistent_lsn,
        prev_record_lsn: index.prev_record_lsn,
        layers: index.layers.iter().map(|l| l.name.clone()).collect(),
        removed_layers: Vec::new(),
        gc_cutoff_lsn: index.gc_cutoff_lsn,
        retain_lsns: index.retain_lsns.clone(),
        stripe_blocks: index.stripe_blocks,
    }
}

/// The layers an index lists and their bytes (none without an index yet).
fn index_totals(index: Option<&RemoteIndex>) -> (usize, u64) {
    index.map_or((0, 0), |i| (i.layers.len(), i.layers.iter().map(|l| l.size).sum()))
}
