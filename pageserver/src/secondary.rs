//! Warm secondaries (`docs/storage-controller.md`, "Warm secondaries").
//!
//! The attached location publishes a **heatmap** of each tenant: the
//! uploaded layers it holds locally, most recently read first
//! (`tenants/<tenant>/heatmap-v1.json`, format in
//! `docs/pageserver-storage.md`). A secondary location reads it every
//! `heatmap_period` and downloads those layers, in that order, into
//! `<tenant>/secondary/<timeline>/<layer>-<generation>`, until its share of
//! `secondary_cache_bytes` (the pageserver's budget, split equally among its
//! secondary tenants); files the heatmap no longer lists, or the share no
//! longer holds, go. When the secondary is attached, the warm files that
//! the index lists under the same generation are moved into the timelines
//! instead of being downloaded by the first reads.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strata_protocol::api::pageserver::{LocationMode, LocationStatus};
use strata_protocol::{TenantShardId, TimelineId};
use strata_remote_storage::RemoteStorage;
use strata_service::clock::Clock;
use tracing::{info, warn};

use crate::remote::index::{IndexLayer, RemoteIndex};
use crate::remote::Remote;

/// The heatmap format this build reads and writes.
pub const HEATMAP_FORMAT_VERSION: u32 = 1;
use crate::limits::MAX_HEATMAP_BYTES;
/// The warm cache's directory inside a tenant's directory.
const WARM_DIR: &str = "secondary";

/// A tenant's heatmap object.
pub fn heatmap_key(tenant: TenantShardId) -> String {
    format!("tenants/{tenant}/heatmap-v1.json")
}

/// What the attached location reads, per timeline, hottest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heatmap {
    pub format_version: u32,
    /// Of the attachment that published it.
    pub generation: u32,
    pub timelines: Vec<HeatmapTimeline>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatmapTimeline {
    pub timeline_id: TimelineId,
    /// Uploaded layers held locally, most recently read first.
    pub layers: Vec<IndexLayer>,
}

impl Heatmap {
    /// Parses and checks a heatmap object.
    pub fn decode(bytes: &[u8]) -> Result<Heatmap, String> {
        if bytes.len() > MAX_HEATMAP_BYTES {
            return Err(format!("larger than {MAX_HEATMAP_BYTES} bytes"));
        }
        let h: Heatmap = serde_json::from_slice(bytes).map_err(|e| format!("not a heatmap: {e}"))?;
        if h.format_version != HEATMAP_FORMAT_VERSION {
            return Err(format!("format version {}, this build reads {HEATMAP_FORMAT_VERSION}", h.format_version));
        }
        for t in &h.timelines {
            if let Some(l) = t.layers.iter().find(|l| l.name.parse::<crate::layer::layer_file::LayerName>().is_err()) {
                return Err(format!("timeline {}: {:?} is not a layer name", t.timeline_id, l.name));
            }
        }
        Ok(h)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a heatmap always encodes")
    }
}

/// The warm file of a layer uploaded by `generation`.
fn warm_path(tenant_dir: &Path, timeline: TimelineId, name: &str, generation: u32) -> PathBuf {
    tenant_dir.join(WARM_DIR).join(timeline.to_string()).join(format!("{name}-{generation:08x}"))
}

/// Moves the uploaded layer files of a stopped timeline into the warm
/// cache; returns how many. Best effort: what cannot be moved is removed
/// with the timeline.
pub fn keep_as_warm(tenant_dir: &Path, timeline: TimelineId, timeline_dir: &Path, uploaded: &[(String, u32)]) -> usize {
    let mut kept = 0;
    for (name, generation) in uploaded {
        let from = timeline_dir.join(name);
        if !from.exists() {
            continue;
        }
        let to = warm_path(tenant_dir, timeline, name, *generation);
        let moved = std::fs::create_dir_all(to.parent().expect("under the warm dir"))
            .and_then(|()| std::fs::rename(&from, &to));
        match moved {
            Ok(()) => kept += 1,
            Err(e) => warn!(file = %from.display(), "keeping a layer warm: {e}"),
        }
    }
    kept
}

/// The warm files of `timeline` that `index` lists (same name, generation
/// and size), as (file, layer name): moved into the timeline on attach.
pub fn take_warm(tenant_dir: &Path, timeline: TimelineId, index: &RemoteIndex) -> Vec<(PathBuf, String)> {
    index
        .layers
        .iter()
        .filter_map(|l| {
            let p = warm_path(tenant_dir, timeline, &l.name, l.generation);
            let size = std::fs::metadata(&p).ok()?.len();
            (size == l.size).then(|| (p, l.name.clone()))
        })
        .collect()
}

/// Removes the warm cache of a tenant (after an attach took what it could).
pub fn clear_warm(tenant_dir: &Path) {
    let dir = tenant_dir.join(WARM_DIR);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!(dir = %dir.display(), "removing the warm cache: {e}"),
    }
}

/// What a secondary's downloader reports.
#[derive(Default)]
struct WarmStatus {
    last_heatmap: Option<Instant>,
    error: Option<String>,
    layers: u64,
    bytes: u64,
}

/// One secondary location's downloader.
struct Warmer {
    stop: AtomicBool,
    /// Held for each round, so that stopping can wait for the one under way.
    round: tokio::sync::Mutex<()>,
    status: Mutex<WarmStatus>,
}

/// The secondary locations of a pageserver.
#[derive(Default)]
pub struct Secondaries {
    warmers: Mutex<HashMap<TenantShardId, Arc<Warmer>>>,
    /// How many warmers share the budget.
    sharing: Arc<AtomicUsize>,
}

/// What a warmer needs of the pageserver.
struct WarmContext {
    storage: RemoteStorage,
    clock: Arc<dyn Clock>,
    tenant: TenantShardId,
    tenant_dir: PathBuf,
    /// The pageserver's budget, shared by `sharing` warmers.
    budget: u64,
    sharing: Arc<AtomicUsize>,
    period: Duration,
}

impl WarmContext {
    /// This tenant's share of the budget now: the shares of all secondary
    /// tenants add up to at most the budget.
    fn share(&self) -> u64 {
        self.budget / self.sharing.load(Ordering::SeqCst).max(1) as u64
    }
}

impl Secondaries {
    /// Starts keeping `tenant` (whose directory is `tenant_dir`) warm,
    /// within its share of `budget` bytes, reading its heatmap every
    /// `period`; nothing if it already is.
    pub fn start(
        &self,
        remote: &Arc<Remote>,
        tenant: TenantShardId,
        tenant_dir: PathBuf,
        budget: u64,
        period: Duration,
    ) {
        let Some((w, cx)) = self.add(remote.storage.clone(), remote.clock.clone(), tenant, tenant_dir, budget, period)
        else {
            return;
        };
        remote.spawn(async move { warm_loop(w, cx).await });
    }

    fn add(
        &self,
        storage: RemoteStorage,
        clock: Arc<dyn Clock>,
        tenant: TenantShardId,
        tenant_dir: PathBuf,
        budget: u64,
        period: Duration,
    ) -> Option<(Arc<Warmer>, WarmContext)> {
        let mut warmers = self.warmers.lock();
        if warmers.contains_key(&tenant) {
            return None;
        }
        let w = Arc::new(Warmer {
            stop: AtomicBool::new(false),
            round: tokio::sync::Mutex::new(()),
            status: Mutex::new(WarmStatus::default()),
        });
        warmers.insert(tenant, w.clone());
        self.sharing.store(warmers.len(), Ordering::SeqCst);
        let sharing = self.sharing.clone();
        Some((w, WarmContext { storage, clock, tenant, tenant_dir, budget, sharing, period }))
    }

    /// Stops keeping `tenant` warm and waits for a download under way
    /// (called from a blocking thread).
    pub fn stop(&self, tenant: TenantShardId) {
        let w = {
            let mut warmers = self.warmers.lock();
            let w = warmers.remove(&tenant);
            self.sharing.store(warmers.len(), Ordering::SeqCst);
            w
        };
        if let Some(w) = w {
            w.stop.store(true, Ordering::SeqCst);
            drop(w.round.blocking_lock());
        }
    }

    /// Every secondary location (the heatmaps' ages on `clock`).
    pub fn statuses(&self, clock: &dyn Clock) -> Vec<LocationStatus> {
        self.warmers
            .lock()
            .iter()
            .map(|(t, w)| {
                let s = w.status.lock();
                LocationStatus {
                    tenant_id: *t,
                    mode: LocationMode::Secondary,
                    generation: None,
                    local_layers: s.layers,
                    local_layer_bytes: s.bytes,
                    heatmap_age_seconds: s.last_heatmap.map(|i| clock.since(i).as_secs()),
                    error: s.error.clone(),
                }
            })
            .collect()
    }
}

async fn warm_loop(w: Arc<Warmer>, cx: WarmContext) {
    while !w.stop.load(Ordering::SeqCst) {
        let result = {
            let _round = w.round.lock().await;
            if w.stop.load(Ordering::SeqCst) {
                return;
            }
            warm_round(&w, &cx).await
        };
        if let Err(e) = result {
            warn!(tenant = %cx.tenant, "keeping the secondary warm: {e}");
            w.status.lock().error = Some(e);
        }
        cx.clock.sleep(cx.period).await;
    }
}

/// One round: read the heatmap, download what is missing within the
/// tenant's share of the budget, remove what is no longer wanted.
async fn warm_round(w: &Warmer, cx: &WarmContext) -> Result<(), String> {
    let share = cx.share();
    let key = heatmap_key(cx.tenant);
    let heatmap = match cx.storage.get(&key).await {
        Ok(b) => Heatmap::decode(&b).map_err(|e| format!("{key}: {e}"))?,
        // Nothing published yet (no attached location has read anything).
        Err(strata_remote_storage::RemoteError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let mut wanted: Vec<(TimelineId, IndexLayer)> = Vec::new();
    let mut total = 0u64;
    // Round-robin over timelines, so each one's hottest layers come first.
    let longest = heatmap.timelines.iter().map(|t| t.layers.len()).max().unwrap_or(0);
    'fill: for i in 0..longest {
        for t in &heatmap.timelines {
            if let Some(l) = t.layers.get(i) {
                if total + l.size > share {
                    break 'fill;
                }
                total += l.size;
                wanted.push((t.timeline_id, l.clone()));
            }
        }
    }
    let (mut layers, mut bytes, mut downloaded) = (0u64, 0u64, 0usize);
    for (timeline, l) in &wanted {
        if w.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let path = warm_path(&cx.tenant_dir, *timeline, &l.name, l.generation);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == l.size) {
            layers += 1;
            bytes += l.size;
            continue;
        }
        std::fs::create_dir_all(path.parent().expect("under the warm dir"))
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        let object = l.object_key(cx.tenant, *timeline);
        let got = match cx.storage.download_file(&object, &path).await {
            Ok(got) => got,
            // Deleted since the heatmap was written (compaction, GC): the next one will not list it.
            Err(strata_remote_storage::RemoteError::NotFound { .. }) => continue,
            Err(e) => return Err(e.to_string()),
        };
        if got.size != l.size || got.crc32c != l.crc32c {
            let _ = std::fs::remove_file(&path);
            return Err(format!(
                "{object}: downloaded {} bytes with CRC {:08x}, the heatmap says {} bytes, CRC {:08x}",
                got.size, got.crc32c, l.size, l.crc32c
            ));
        }
        layers += 1;
        bytes += got.size;
        downloaded += 1;
    }
    debug_assert!(bytes <= share, "{bytes} warm bytes over the share {share}");
    // What the heatmap no longer lists (or the share no longer holds).
    let keep: BTreeSet<PathBuf> =
        wanted.iter().map(|(t, l)| warm_path(&cx.tenant_dir, *t, &l.name, l.generation)).collect();
    let mut removed = 0;
    for t in std::fs::read_dir(cx.tenant_dir.join(WARM_DIR)).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(t.path()).into_iter().flatten().flatten() {
            if !keep.contains(&f.path()) && std::fs::remove_file(f.path()).is_ok() {
                removed += 1;
            }
        }
    }
    if downloaded > 0 || removed > 0 {
        info!(tenant = %cx.tenant, downloaded, removed, layers, bytes, "secondary warmed");
    }
    let mut s = w.status.lock();
    *s = WarmStatus { last_heatmap: Some(cx.clock.now()), error: None, layers, bytes };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::index::layer_key;
    use strata_formats::Lsn;

    fn layer(name: &str, generation: u32, size: u64) -> IndexLayer {
        IndexLayer { name: name.into(), size, crc32c: 0, generation, owner: None }
    }

    fn name(from: u64, to: u64) -> String {
        use crate::key::Key;
        crate::layer::layer_file::LayerName::delta(Key::MIN, Key::MAX, Lsn(from), Lsn(to)).to_string()
    }

    #[test]
    fn heatmaps_round_trip_and_bad_ones_are_refused() {
        let (l1, t) = (name(1, 2), TimelineId::generate());
        let h = Heatmap {
            format_version: 1,
            generation: 4,
            timelines: vec![HeatmapTimeline { timeline_id: t, layers: vec![layer(&l1, 3, 10)] }],
        };
        assert_eq!(Heatmap::decode(&h.encode()).unwrap(), h);
        let text = String::from_utf8(h.encode()).unwrap();
        assert!(Heatmap::decode(text.replace("\"format_version\":1", "\"format_version\":9").as_bytes())
            .unwrap_err()
            .contains("version 9"));
        let err = Heatmap::decode(text.replace(&l1, "../../etc/passwd").as_bytes()).unwrap_err();
        assert!(err.contains("not a layer name"), "{err}");
        assert!(Heatmap::decode(b"{").is_err());
    }

    #[test]
    fn warm_files_are_kept_and_taken_by_name_generation_and_size() {
        let root = strata_test_support::scratch_dir("secondary-warm");
        let tenant_dir = root.join("tenant");
        let (l1, l2, t) = (name(1, 2), name(2, 3), TimelineId::generate());
        let tl_dir = tenant_dir.join("timelines").join(t.to_string());
        std::fs::create_dir_all(&tl_dir).unwrap();
        std::fs::write(tl_dir.join(&l1), vec![1u8; 10]).unwrap();
        std::fs::write(tl_dir.join(&l2), vec![2u8; 20]).unwrap();
        // L2 was never uploaded: it is not kept.
        assert_eq!(keep_as_warm(&tenant_dir, t, &tl_dir, &[(l1.clone(), 3)]), 1);
        assert!(warm_path(&tenant_dir, t, &l1, 3).exists());
        let index = |layers: Vec<IndexLayer>| RemoteIndex {
            generation: 5,
            pg_version: 15,
            system_id: 1,
            wal_segment_size: 16 << 20,
            start_lsn: Lsn(1),
            disk_consistent_lsn: Lsn(2),
            prev_record_lsn: Lsn(1),
            ancestor_timeline_id: None,
            ancestor_lsn: None,
            gc_cutoff_lsn: Lsn(0),
            retain_lsns: vec![],
            layers,
            stripe_blocks: None,
        };
        // Another generation's object of the same name, or another size: not the same file.
        assert!(take_warm(&tenant_dir, t, &index(vec![layer(&l1, 4, 10)])).is_empty());
        assert!(take_warm(&tenant_dir, t, &index(vec![layer(&l1, 3, 11)])).is_empty());
        let taken = take_warm(&tenant_dir, t, &index(vec![layer(&l1, 3, 10), layer(&l2, 3, 20)]));
        assert_eq!(taken, vec![(warm_path(&tenant_dir, t, &l1, 3), l1.clone())]);
        clear_warm(&tenant_dir);
        assert!(!tenant_dir.join(WARM_DIR).exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Warm bytes on disk under a tenant's directory.
    fn warm_bytes(tenant_dir: &Path) -> (usize, u64) {
        let mut out = (0, 0);
        for t in std::fs::read_dir(tenant_dir.join(WARM_DIR)).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(t.path()).into_iter().flatten().flatten() {
                out.0 += 1;
                out.1 += f.metadata().unwrap().len();
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn secondaries_share_the_budget_hottest_layers_first_and_bad_downloads_are_refused() {
        use bytes::Bytes;
        use strata_remote_storage::RemoteStorageConfig;
        let root = strata_test_support::scratch_dir("secondary-budget");
        let storage = RemoteStorage::new(&RemoteStorageConfig::Local { path: root.join("store") }).unwrap();
        let secondaries = Secondaries::default();
        let (t1, t2, tl) = (TenantShardId::generate(), TenantShardId::generate(), TimelineId::generate());
        // Five layers of 100 kB per tenant, the hottest first.
        for tenant in [t1, t2] {
            let mut layers = Vec::new();
            for i in 0..5u64 {
                let bytes = vec![i as u8 + 1; 100_000];
                let l = IndexLayer {
                    name: name(i + 1, i + 2),
                    size: 100_000,
                    crc32c: crc32c::crc32c(&bytes),
                    generation: 3,
                    owner: None,
                };
                storage.put(&layer_key(tenant, tl, &l.name, 3), Bytes::from(bytes)).await.unwrap();
                layers.push(l);
            }
            let heatmap = Heatmap {
                format_version: HEATMAP_FORMAT_VERSION,
                generation: 3,
                timelines: vec![HeatmapTimeline { timeline_id: tl, layers }],
            };
            storage.put(&heatmap_key(tenant), Bytes::from(heatmap.encode())).await.unwrap();
        }
        let budget = 450_000;
        let add = |tenant: TenantShardId| {
            let dir = root.join(tenant.to_string());
            secondaries
                .add(storage.clone(), crate::clock::system(), tenant, dir, budget, Duration::from_secs(1))
                .unwrap()
        };
        // Alone, the tenant takes the whole budget: its four hottest layers.
        let (w1, cx1) = add(t1);
        warm_round(&w1, &cx1).await.unwrap();
        assert_eq!(warm_bytes(&cx1.tenant_dir), (4, 400_000));
        for i in 0..4u64 {
            assert!(warm_path(&cx1.tenant_dir, tl, &name(i + 1, i + 2), 3).exists(), "layer {i} is among the hottest");
        }
        // A second secondary tenant: each keeps half, the first gives back
        // its coldest layers at its next round.
        let (w2, cx2) = add(t2);
        assert_eq!((cx1.share(), cx2.share()), (225_000, 225_000));
        warm_round(&w2, &cx2).await.unwrap();
        warm_round(&w1, &cx1).await.unwrap();
        let (a, b) = (warm_bytes(&cx1.tenant_dir), warm_bytes(&cx2.tenant_dir));
        assert_eq!((a, b), ((2, 200_000), (2, 200_000)));
        assert!(a.1 + b.1 <= budget);
        assert_eq!(w1.status.lock().bytes, 200_000);
        // Once the second one stops, the first grows back.
        tokio::task::block_in_place(|| secondaries.stop(t2));
        warm_round(&w1, &cx1).await.unwrap();
        assert_eq!(warm_bytes(&cx1.tenant_dir), (4, 400_000));

        // An object that is not what the heatmap says is refused and not kept.
        let hot = name(1, 2);
        clear_warm(&cx1.tenant_dir);
        storage.put(&layer_key(t1, tl, &hot, 3), Bytes::from(vec![9u8; 100_000])).await.unwrap();
        let err = warm_round(&w1, &cx1).await.unwrap_err();
        assert!(err.contains("CRC"), "{err}");
        assert!(!warm_path(&cx1.tenant_dir, tl, &hot, 3).exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
