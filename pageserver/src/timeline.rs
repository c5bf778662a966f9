//! A timeline: one branch of a tenant's history. Holds the layer map,
//! serves reads at any ingested LSN, and turns in-memory layers into layer
//! files, advancing `disk_consistent_lsn` only once they are durable.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use strata_formats::types::{BlockNumber, Oid};
use strata_formats::v15::control::ControlFile;
use strata_formats::v15::records::xlog::CheckPoint;
use strata_formats::version::BLCKSZ;
use strata_formats::Lsn;
use strata_protocol::pageserver::SlruKind;
use strata_protocol::{TenantId, TimelineId};
use tracing::{info, warn};

use crate::dirs;
use crate::key::{Key, RelTag};
use crate::layer::delta::{DeltaLayer, DeltaLayerWriter, LayerName};
use crate::layer::inmemory::InMemoryLayer;
use crate::layer::map::{LayerMap, RecordLsns};
use crate::layer::{LayerError, Versions};
use crate::metrics::Metrics;
use crate::value::Value;

/// Version of `metadata.json`.
const METADATA_VERSION: u32 = 1;
/// Frozen layers allowed to wait for their flush before ingest waits too.
const MAX_FROZEN: usize = 2;

/// What a timeline persists besides its layer files (`metadata.json`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineMetadata {
    pub format_version: u32,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub ancestor_timeline_id: Option<TimelineId>,
    pub ancestor_lsn: Option<Lsn>,
    pub pg_version: u32,
    pub system_id: u64,
    pub wal_segment_size: u32,
    /// Where the timeline's WAL begins (the bootstrap or branch point).
    pub start_lsn: Lsn,
    /// Every version up to this LSN is in the listed layer files, fsynced.
    pub disk_consistent_lsn: Lsn,
    /// Start of the record that ends at `disk_consistent_lsn`.
    pub prev_record_lsn: Lsn,
    pub layers: Vec<String>,
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
}

pub struct Timeline {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub dir: PathBuf,
    fsync: bool,
    checkpoint_distance: u64,
    meta: Mutex<TimelineMetadata>,
    layers: RwLock<LayerMap>,
    lsns: tokio::sync::watch::Sender<RecordLsns>,
    broken: Mutex<Option<String>>,
    /// Signalled when a frozen layer has been flushed.
    flushed: Condvar,
    flush_wait: Mutex<()>,
    /// Serializes flushes.
    flush_lock: Mutex<()>,
    opened_at: Mutex<Instant>,
    /// Size of each relation fork (`None`: it does not exist) and the LSN
    /// from which that holds until a newer change: ingest records every
    /// change before making it visible, so a read at or after that LSN may
    /// use it instead of walking the layers twice (directory, then size).
    rel_size_cache: RwLock<std::collections::HashMap<RelTag, (Lsn, Option<BlockNumber>)>>,
    pub metrics: Arc<Metrics>,
}

fn io_context(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

/// Writes `bytes` to `path` atomically: temporary file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8], fsync: bool) -> Result<(), String> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_context(&tmp, e))?;
    f.write_all(bytes).map_err(|e| io_context(&tmp, e))?;
    if fsync {
        f.sync_all().map_err(|e| io_context(&tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| io_context(path, e))?;
    if fsync {
        sync_dir(path.parent().expect("a file has a directory"))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_context(dir, e))
}

impl Timeline {
    /// Creates a new, empty timeline directory whose WAL starts at
    /// `meta.start_lsn`; it counts as created once a checkpoint made its
    /// initial versions durable (`disk_consistent_lsn` set).
    pub fn create(
        dir: PathBuf,
        meta: TimelineMetadata,
        fsync: bool,
        checkpoint_distance: u64,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Timeline>, String> {
        std::fs::create_dir_all(&dir).map_err(|e| io_context(&dir, e))?;
        let tl = Timeline::new(dir, meta, Vec::new(), fsync, checkpoint_distance, metrics);
        tl.write_metadata()?;
        Ok(tl)
    }

    fn new(
        dir: PathBuf,
        meta: TimelineMetadata,
        deltas: Vec<Arc<DeltaLayer>>,
        fsync: bool,
        checkpoint_distance: u64,
        metrics: Arc<Metrics>,
    ) -> Arc<Timeline> {
        let lsns = RecordLsns { last: meta.disk_consistent_lsn, prev: meta.prev_record_lsn };
        // A new timeline (nothing durable yet) takes its initial versions at its start LSN.
        let first =
            if meta.disk_consistent_lsn == Lsn::INVALID { meta.start_lsn } else { Lsn(meta.disk_consistent_lsn.0 + 1) };
        let open = Arc::new(InMemoryLayer::new(first));
        Arc::new(Timeline {
            tenant_id: meta.tenant_id,
            timeline_id: meta.timeline_id,
            dir,
            fsync,
            checkpoint_distance,
            layers: RwLock::new(LayerMap { open, frozen: Vec::new(), deltas }),
            lsns: tokio::sync::watch::Sender::new(lsns),
            meta: Mutex::new(meta),
            broken: Mutex::new(None),
            flushed: Condvar::new(),
            flush_wait: Mutex::new(()),
            flush_lock: Mutex::new(()),
            opened_at: Mutex::new(Instant::now()),
            rel_size_cache: RwLock::new(std::collections::HashMap::new()),
            metrics,
        })
    }

    /// Loads a timeline from its directory. A layer file that cannot be opened
    /// makes the timeline broken (the error names the file), not the process.
    pub fn load(
        dir: PathBuf,
        fsync: bool,
        checkpoint_distance: u64,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Timeline>, String> {
        let meta_path = dir.join("metadata.json");
        let text = std::fs::read_to_string(&meta_path).map_err(|e| io_context(&meta_path, e))?;
        let meta: TimelineMetadata =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", meta_path.display()))?;
        if meta.disk_consistent_lsn == Lsn::INVALID {
            return Err(format!("{}: the timeline's creation did not finish", dir.display()));
        }
        if meta.format_version != METADATA_VERSION {
            return Err(format!(
                "{}: format version {} is not {METADATA_VERSION}",
                meta_path.display(),
                meta.format_version
            ));
        }
        // Files of a flush that did not reach the metadata are not part of the timeline.
        let listed: BTreeSet<&str> = meta.layers.iter().map(String::as_str).collect();
        for entry in std::fs::read_dir(&dir).map_err(|e| io_context(&dir, e))? {
            let entry = entry.map_err(|e| io_context(&dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if (name.ends_with(".delta") || name.ends_with(".tmp")) && !listed.contains(name.as_str()) {
                warn!(file = %entry.path().display(), "removing a layer file left by an unfinished flush");
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let mut deltas = Vec::new();
        let mut broken = None;
        for name in &meta.layers {
            match DeltaLayer::open(&dir.join(name)) {
                Ok(l) => deltas.push(Arc::new(l)),
                Err(e) => {
                    broken = Some(e.to_string());
                    break;
                }
            }
        }
        deltas.sort_by_key(|l| l.name.lsn_start);
        let tl = Timeline::new(dir, meta, deltas, fsync, checkpoint_distance, metrics);
        if let Some(reason) = broken {
            tl.set_broken(reason);
        }
        Ok(tl)
    }

    pub fn metadata(&self) -> TimelineMetadata {
        self.meta.lock().clone()
    }

    fn write_metadata(&self) -> Result<(), String> {
        let meta = self.meta.lock().clone();
        let text = serde_json::to_vec_pretty(&meta).expect("metadata serializes");
        write_atomic(&self.dir.join("metadata.json"), &text, self.fsync)
    }

    pub fn set_broken(&self, reason: String) {
        warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, %reason, "timeline is broken");
        *self.broken.lock() = Some(reason);
    }

    pub fn broken_reason(&self) -> Option<String> {
        self.broken.lock().clone()
    }

    fn check_broken(&self) -> Result<(), ReadError> {
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
        let reached = tokio::time::timeout(timeout, rx.wait_for(|l| l.last >= lsn)).await.is_ok_and(|r| r.is_ok());
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
    pub fn commit_record(&self, batch: Vec<(Key, Lsn, Value)>, lsns: RecordLsns) {
        debug_assert!(lsns.last >= self.record_lsns().last, "record LSNs go backwards");
        // Holding the map (shared) across both steps keeps a concurrent
        // freeze from cutting between the versions and their record LSNs.
        let map = self.layers.read();
        if !batch.is_empty() {
            map.open.put_batch(batch);
        }
        self.lsns.send_replace(lsns);
    }

    /// Whether the open layer should be frozen (large enough, or old enough and not empty).
    pub fn should_freeze(&self, max_age: Duration) -> bool {
        let open = self.layers.read().open.clone();
        let bytes = open.bytes() as u64;
        bytes >= self.checkpoint_distance || (bytes > 0 && self.opened_at.lock().elapsed() >= max_age)
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
        *self.opened_at.lock() = Instant::now();
        let mut guard = self.flush_wait.lock();
        while self.layers.read().frozen.len() > MAX_FROZEN && self.broken_reason().is_none() {
            self.flushed.wait_for(&mut guard, Duration::from_millis(200));
        }
    }

    /// Writes every frozen layer to a delta layer file and advances
    /// `disk_consistent_lsn`. Called by the flusher thread (and checkpoints).
    pub fn flush_frozen(&self) -> Result<(), String> {
        let _guard = self.flush_lock.lock();
        loop {
            let Some((layer, lsns)) = self.layers.read().frozen.first().cloned() else { return Ok(()) };
            let started = Instant::now();
            let delta = match layer.key_range() {
                Some((first, last)) => {
                    let name = LayerName {
                        key_start: first,
                        key_end: last.next(),
                        lsn_start: layer.start_lsn,
                        lsn_end: layer.end_lsn().expect("frozen"),
                    };
                    let mut writer = DeltaLayerWriter::new(&self.dir, name).map_err(|e| io_context(&self.dir, e))?;
                    layer.for_each(|k, l, v| writer.put(k, l, v)).map_err(|e| io_context(&self.dir, e))?;
                    let path = writer.finish(self.fsync).map_err(|e| io_context(&self.dir, e))?;
                    if self.fsync {
                        sync_dir(&self.dir)?;
                    }
                    Some(Arc::new(DeltaLayer::open(&path).map_err(|e| e.to_string())?))
                }
                None => None,
            };
            {
                let mut meta = self.meta.lock();
                if let Some(d) = &delta {
                    meta.layers.push(d.name.to_string());
                }
                meta.disk_consistent_lsn = lsns.last;
                meta.prev_record_lsn = lsns.prev;
            }
            self.write_metadata()?;
            {
                let mut map = self.layers.write();
                let (first, _) = map.frozen.remove(0);
                debug_assert!(Arc::ptr_eq(&first, &layer));
                if let Some(d) = &delta {
                    self.metrics.layer_bytes_written.inc_by(d.file_size);
                    map.deltas.push(d.clone());
                }
            }
            self.metrics.layers_flushed.inc();
            info!(
                tenant = %self.tenant_id, timeline = %self.timeline_id, disk_consistent_lsn = %lsns.last,
                versions = delta.as_ref().map_or(0, |d| d.len()), elapsed_ms = started.elapsed().as_millis() as u64,
                "flushed a layer"
            );
            let _g = self.flush_wait.lock();
            self.flushed.notify_all();
        }
    }

    /// Freezes and flushes everything ingested so far.
    pub fn checkpoint(&self) -> Result<(), String> {
        self.freeze();
        self.flush_frozen()
    }

    pub fn layer_count(&self) -> (usize, usize) {
        let map = self.layers.read();
        (map.frozen.len() + 1, map.deltas.len())
    }

    // ---- reads ----

    /// Gathers the versions of `key` visible at `lsn`.
    fn versions(&self, key: &Key, lsn: Lsn) -> Result<Versions, ReadError> {
        self.check_broken()?;
        let layers = self.layers.read().newest_first();
        let mut out = Versions::default();
        for layer in layers {
            if layer.start_lsn() > lsn {
                continue;
            }
            if layer.collect(key, lsn, &mut out)? {
                break;
            }
        }
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
        let layers = self.layers.read().newest_first();
        let mut found: Vec<Result<Versions, ReadError>> = keys.iter().map(|_| Ok(Versions::default())).collect();
        for layer in layers {
            if layer.start_lsn() > lsn {
                continue;
            }
            for (key, slot) in keys.iter().zip(found.iter_mut()) {
                let Ok(v) = slot else { continue };
                if v.complete() {
                    continue;
                }
                if let Err(e) = layer.collect(key, lsn, v) {
                    *slot = Err(e.into());
                }
            }
        }
        keys.iter().zip(found).map(|(key, v)| self.reconstruct(key, lsn, v?)).collect()
    }

    fn reconstruct(&self, key: &Key, lsn: Lsn, versions: Versions) -> Result<Option<Bytes>, ReadError> {
        let mut list = versions.list;
        let Some((_, oldest)) = list.last() else { return Ok(None) };
        let corrupt = |reason: String| ReadError::Corrupt { timeline: self.timeline_id, reason };
        let mut page: Vec<u8> = match oldest {
            Value::Image(b) if list.len() == 1 => return Ok(Some(b.clone())),
            Value::Image(b) => b.to_vec(),
            Value::ZeroPage => vec![0u8; BLCKSZ],
            Value::Native(_) if key.is_page() => vec![0u8; BLCKSZ],
            Value::Native(_) => return Err(corrupt(format!("key {key} has only native records at {lsn}"))),
        };
        if list.len() > 1 {
            let page: &mut [u8; BLCKSZ] = page
                .as_mut_slice()
                .try_into()
                .map_err(|_| corrupt(format!("key {key}: native records on a value of {} bytes", list.len())))?;
            if list.last().is_some_and(|(_, v)| v.is_base()) {
                list.pop();
            }
            for (l, v) in list.iter().rev() {
                if let Value::Native(r) = v {
                    r.apply(page).map_err(|e| corrupt(format!("key {key} at {l}: {e}")))?;
                } else {
                    return Err(corrupt(format!("key {key}: base version above the oldest at {l}")));
                }
            }
        }
        Ok(Some(Bytes::from(page)))
    }

    fn decode_err(&self, what: &str, lsn: Lsn, e: String) -> ReadError {
        ReadError::Corrupt { timeline: self.timeline_id, reason: format!("{what} at {lsn}: {e}") }
    }

    /// Records a relation fork's new size (or its removal) at `lsn`, before
    /// the record that makes it is visible (called by ingest only).
    pub fn note_rel_size(&self, tag: RelTag, lsn: Lsn, size: Option<BlockNumber>) {
        self.rel_size_cache.write().insert(tag, (lsn, size));
    }

    /// Size of a relation fork in blocks, `None` if it does not exist.
    pub fn rel_size(&self, tag: RelTag, lsn: Lsn) -> Result<Option<BlockNumber>, ReadError> {
        if let Some((since, size)) = self.rel_size_cache.read().get(&tag) {
            if *since <= lsn {
                return Ok(*size);
            }
        }
        let size = self.rel_size_uncached(tag, lsn)?;
        let mut cache = self.rel_size_cache.write();
        // Only a newer answer replaces an entry: ingest may have noted a
        // change after this read began.
        if cache.get(&tag).is_none_or(|(since, _)| *since < lsn) {
            cache.insert(tag, (lsn, size));
        }
        Ok(size)
    }

    fn rel_size_uncached(&self, tag: RelTag, lsn: Lsn) -> Result<Option<BlockNumber>, ReadError> {
        if !self.rel_dir(tag.rel.spc, tag.rel.db, lsn)?.contains(&(tag.rel.rel, tag.fork as u8)) {
            return Ok(None);
        }
        match self.get(&Key::rel_size(tag), lsn)? {
            Some(b) if b.len() == 4 => Ok(Some(u32::from_le_bytes(b[..].try_into().expect("4 bytes")))),
            Some(b) => Err(self.decode_err("relation size", lsn, format!("{} bytes", b.len()))),
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
            total += u64::from(self.rel_size(tag, lsn)?.unwrap_or(0)) * BLCKSZ as u64;
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
        let b =
            self.get(&Key::checkpoint(), lsn)?.ok_or_else(|| self.decode_err("checkpoint", lsn, "missing".into()))?;
        CheckPoint::decode(&b).map_err(|e| self.decode_err("checkpoint", lsn, e.to_string()))
    }

    pub fn control_template(&self) -> Result<ControlFile, ReadError> {
        let lsn = self.record_lsns().last;
        let b = self.get(&Key::control(), lsn)?.ok_or_else(|| self.decode_err("pg_control", lsn, "missing".into()))?;
        ControlFile::decode(&b).map_err(|e| self.decode_err("pg_control", lsn, e.to_string()))
    }
}
