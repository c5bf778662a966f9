//! Compaction and image creation (`docs/bottomless-pageserver.md`).
//!
//! Compaction merges the oldest L0 deltas (one per flush, every key) into a
//! run of L1 deltas cut by key range, so that a read visits one L1 per run
//! instead of every L0. Image creation writes, at the end LSN of the newest
//! L1 run, the value of every key: a read at or after it stops there, which
//! bounds both the layers a read visits and the redo chain it applies.
//!
//! Both read immutable files and write new ones under temporary names; the
//! swap (metadata first, then renames, then the map) takes only the locks of
//! a flush, so ingest and reads never wait for the work itself.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_service::clock::Clock;

use strata_formats::Lsn;
use tracing::{debug, info};

use super::{BrokenKind, ReadError, StorageError, Timeline};
use crate::key::Key;
use crate::layer::layer_file::{LayerFile, LayerFileWriter, LayerKind, LayerName, RawVersion};
use crate::layer::map::is_l0;
use crate::layer::LayerError;
use crate::value::Value;
use strata_protocol::api::pageserver::CompactionOutcome;

use crate::limits::{IMAGE_BATCH, MAX_L0_PER_COMPACTION, THROTTLE_CHECK_BYTES, THROTTLE_SLACK};

/// Why a compaction or image creation did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("stopped: the pageserver is shutting down")]
    Cancelled,
}

/// Limits the bytes compaction and image creation read per second, so
/// that they leave the disk to ingest and reads.
pub struct Throttle {
    /// The rate, and the clock it is measured and waited on (`None`: no limit).
    limit: Option<(u64, Arc<dyn Clock>)>,
    started: Option<Instant>,
    consumed: u64,
}

impl Throttle {
    /// At most `bytes_per_second` (`0` means no limit) of `clock`'s time.
    pub fn new(bytes_per_second: u64, clock: Arc<dyn Clock>) -> Throttle {
        let limit = (bytes_per_second > 0).then_some((bytes_per_second, clock));
        Throttle { limit, started: None, consumed: 0 }
    }

    /// No limit (operators' requests, tests).
    pub fn unlimited() -> Throttle {
        Throttle { limit: None, started: None, consumed: 0 }
    }

    /// Accounts for `bytes` and sleeps while ahead of the rate. The clock
    /// is read once per [`THROTTLE_CHECK_BYTES`], not per value (a clock
    /// read costs more than a small value's copy).
    fn consume(&mut self, bytes: u64) {
        let Some((bytes_per_second, clock)) = &self.limit else { return };
        let started = *self.started.get_or_insert_with(|| clock.now());
        let before = self.consumed;
        self.consumed += bytes;
        if before / THROTTLE_CHECK_BYTES == self.consumed / THROTTLE_CHECK_BYTES {
            return;
        }
        let due = Duration::from_secs_f64(self.consumed as f64 / *bytes_per_second as f64);
        let elapsed = clock.since(started);
        if due > elapsed + THROTTLE_SLACK {
            clock.sleep_blocking(due - elapsed);
        }
    }
}

/// Calls `f` on every version of `layers` in (key, LSN) order; layers whose
/// LSN ranges overlap (an L0 and its fresh-page deltas) hold other keys, so
/// no two versions compare equal.
fn merge(
    layers: &[Arc<LayerFile>],
    keys_only: bool,
    mut f: impl FnMut(RawVersion) -> Result<(), CompactionError>,
) -> Result<(), CompactionError> {
    let mut scans: Vec<_> = layers.iter().map(|l| if keys_only { l.scan_keys() } else { l.scan() }).collect();
    let mut heads: Vec<Option<RawVersion>> = vec![None; layers.len()];
    let mut heap = BinaryHeap::with_capacity(layers.len());
    for (i, scan) in scans.iter_mut().enumerate() {
        if let Some(v) = scan.next().transpose()? {
            heap.push(Reverse((v.key, v.lsn, i)));
            heads[i] = Some(v);
        }
    }
    while let Some(Reverse((_, _, i))) = heap.pop() {
        let v = heads[i].take().expect("a queued layer has its head");
        if let Some(n) = scans[i].next().transpose()? {
            debug_assert!((n.key, n.lsn) >= (v.key, v.lsn), "layer versions are sorted");
            heap.push(Reverse((n.key, n.lsn, i)));
            heads[i] = Some(n);
        }
        f(v)?;
    }
    Ok(())
}

/// What a compaction merges, and the count and bytes of the fresh-page
/// deltas of its window that it keeps as they are.
type CompactionInputs = (Vec<Arc<LayerFile>>, (usize, u64));

/// Layer files being written, cut at key boundaries by size; removed
/// (temporary files) if dropped before being installed.
struct Outputs {
    dir: PathBuf,
    kind: LayerKind,
    lsn_start: Lsn,
    lsn_end: Lsn,
    target: u64,
    fsync: bool,
    current: Option<LayerFileWriter>,
    last_key: Option<Key>,
    done: Vec<(PathBuf, LayerName)>,
    /// Image runs cover every key: the first file starts at `Key::MIN`.
    cover_all: bool,
}

impl Outputs {
    fn new(tl: &Timeline, kind: LayerKind, lsn_start: Lsn, lsn_end: Lsn) -> Outputs {
        Outputs {
            dir: tl.dir.clone(),
            kind,
            lsn_start,
            lsn_end,
            target: tl.policy.compaction_target_size,
            fsync: tl.fsync,
            current: None,
            last_key: None,
            done: Vec::new(),
            cover_all: kind == LayerKind::Image,
        }
    }

    fn name(&self, key_start: Key) -> LayerName {
        match self.kind {
            LayerKind::Delta => LayerName::delta(key_start, Key::MAX, self.lsn_start, self.lsn_end),
            LayerKind::Image => LayerName::image(key_start, Key::MAX, self.lsn_start),
        }
    }

    /// The writer for a version of `key`: a new file once the current one
    /// is large enough and the key changes.
    fn writer(&mut self, key: Key) -> Result<&mut LayerFileWriter, StorageError> {
        let full = self.current.as_ref().is_some_and(|w| w.written() >= self.target);
        if full && self.last_key != Some(key) {
            self.finish_current(key)?;
        }
        if self.current.is_none() {
            let start = if self.cover_all && self.done.is_empty() { Key::MIN } else { key };
            self.current = Some(LayerFileWriter::new(&self.dir, self.name(start))?);
        }
        self.last_key = Some(key);
        Ok(self.current.as_mut().expect("set above"))
    }

    fn finish_current(&mut self, key_end: Key) -> Result<(), StorageError> {
        if let Some(mut w) = self.current.take() {
            w.set_key_end(key_end);
            let name = w.name();
            let path = match w.finish_unrenamed(self.fsync) {
                Ok(p) => p,
                Err(e) => {
                    let _ = std::fs::remove_file(self.dir.join(format!("{}.tmp", self.name(name.key_start))));
                    return Err(e.into());
                }
            };
            self.done.push((path, name));
        }
        Ok(())
    }

    /// Finishes the last file; returns the temporary files and their names.
    fn finish(mut self) -> Result<Vec<(PathBuf, LayerName)>, StorageError> {
        let end = match (self.cover_all, self.last_key) {
            (true, _) => Key::MAX,
            (false, Some(k)) => k.next(),
            (false, None) => return Ok(std::mem::take(&mut self.done)),
        };
        if self.cover_all && self.current.is_none() && self.done.is_empty() {
            // No key had a value: the image run is one empty file of every key.
            self.current = Some(LayerFileWriter::new(&self.dir, self.name(Key::MIN))?);
        }
        self.finish_current(end)?;
        Ok(std::mem::take(&mut self.done))
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        if let Some(w) = self.current.take() {
            let _ = std::fs::remove_file(w.path());
        }
        for (path, _) in self.done.drain(..) {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Timeline {
    /// One round of background work: compacts the L0s if there are at
    /// least `compaction_threshold` of them, then writes images if at least
    /// `image_creation_threshold` L1 runs lie above the newest image.
    /// `force` lowers both thresholds to one (a checkpoint).
    pub fn compact(
        &self,
        force: bool,
        throttle: &mut Throttle,
        stop: &AtomicBool,
    ) -> Result<CompactionOutcome, CompactionError> {
        let _one = self.compaction_lock.lock();
        let mut outcome = CompactionOutcome::default();
        self.check_broken()?;
        self.compact_l0(force, throttle, stop, &mut outcome)?;
        // A forced round leaves no L0 (one compaction takes at most
        // MAX_L0_PER_COMPACTION; the background takes the rest next round).
        while force && self.layers.read().historic.l0_count() > 0 {
            let done = outcome.l0_compacted;
            self.compact_l0(force, throttle, stop, &mut outcome)?;
            debug_assert!(outcome.l0_compacted > done, "a forced compaction makes progress");
        }
        self.create_images(force, throttle, stop, &mut outcome)?;
        Ok(outcome)
    }

    fn compact_l0(
        &self,
        force: bool,
        throttle: &mut Throttle,
        stop: &AtomicBool,
        outcome: &mut CompactionOutcome,
    ) -> Result<(), CompactionError> {
        let l0 = self.historic().l0();
        let threshold = if force { 1 } else { self.policy.compaction_threshold };
        if l0.len() < threshold || l0.is_empty() {
            return Ok(());
        }
        let started = self.clock.now();
        let l0: Vec<Arc<LayerFile>> = l0.into_iter().take(MAX_L0_PER_COMPACTION).collect();
        debug_assert!(l0.windows(2).all(|w| w[0].name.lsn_end <= w[1].name.lsn_start), "L0s are disjoint");
        let lsn_start = l0[0].name.lsn_start;
        let lsn_end = l0.last().expect("not empty").name.lsn_end;
        let (inputs, kept) = self.compaction_inputs(l0)?;
        let mut out = Outputs::new(self, LayerKind::Delta, lsn_start, lsn_end);
        // Stored bytes, as the files hold them (grouped values compressed).
        let bytes_read: u64 = inputs.iter().map(|l| l.file_size).sum();
        merge(&inputs, false, |v| {
            if stop.load(Ordering::Relaxed) {
                return Err(CompactionError::Cancelled);
            }
            // A split's child compacts its parent's L0 deltas too: their
            // siblings' keys stay behind.
            if !v.key.is_stored_on(&self.shard) {
                return Ok(());
            }
            throttle.consume(v.bytes.len() as u64 + 44);
            out.writer(v.key)?.put_raw(&v).map_err(StorageError::from)?;
            Ok(())
        })?;
        let written = out.finish()?;
        let removed: Vec<LayerName> = inputs.iter().map(|l| l.name).collect();
        let added = self.install_layers(written, &removed)?;
        let bytes_written: u64 = added.iter().map(|l| l.file_size).sum();
        self.metrics.compactions.inc();
        self.metrics.compaction_bytes_read.inc_by(bytes_read);
        self.metrics.compaction_bytes_written.inc_by(bytes_written);
        outcome.l0_compacted += inputs.iter().filter(|l| is_l0(&l.name)).count();
        outcome.l1_written += added.len();
        outcome.bytes_read += bytes_read;
        outcome.bytes_written += bytes_written;
        info!(
            tenant = %self.tenant_id, timeline = %self.timeline_id, inputs = inputs.len(), l1 = added.len(),
            fresh_kept = kept.0, fresh_bytes_kept = kept.1, %lsn_start, %lsn_end, bytes_read, bytes_written, elapsed_ms = self.clock.since(started).as_millis() as u64,
            "compacted L0 deltas"
        );
        Ok(())
    }

    /// The files a compaction of the L0s `l0` merges: the L0s, and the
    /// fresh-page deltas of their flushes that share a key with what is
    /// merged. A fresh-page delta stays as it is (the returned count and
    /// bytes) only when no other file of the window holds any of its keys:
    /// the L1 run spans the whole window, so a key in both would have its
    /// versions in two runs whose LSN ranges interleave, and a read collects
    /// each key's versions newest first, run after run. A single L0 takes
    /// its fresh-page deltas along: the L1 run would have their LSN range.
    fn compaction_inputs(&self, l0: Vec<Arc<LayerFile>>) -> Result<CompactionInputs, LayerError> {
        let historic = self.historic();
        let mut fresh: Vec<Arc<LayerFile>> = l0.iter().flat_map(|l| historic.fresh_of(&l.name)).collect();
        let mut inputs = l0;
        if inputs.len() == 1 || fresh.is_empty() {
            inputs.append(&mut fresh);
            return Ok((inputs, (0, 0)));
        }
        let keys_of = |l: &LayerFile| -> Result<Vec<Key>, LayerError> {
            let mut keys: Vec<Key> = Vec::new();
            for v in l.scan_keys() {
                let k = v?.key;
                if keys.last() != Some(&k) {
                    keys.push(k);
                }
            }
            Ok(keys)
        };
        let mut merged: HashSet<Key> = HashSet::new();
        for l in &inputs {
            merged.extend(keys_of(l)?);
        }
        let mut fresh_keys: Vec<Vec<Key>> = fresh.iter().map(|l| keys_of(l)).collect::<Result<_, _>>()?;
        // Until no fresh-page delta left shares a key with the merged files
        // (joining one adds its keys, which may tie in another).
        while let Some(i) = fresh_keys.iter().position(|keys| keys.iter().any(|k| merged.contains(k))) {
            merged.extend(fresh_keys.swap_remove(i));
            inputs.push(fresh.swap_remove(i));
        }
        // The fresh-page deltas kept share no key with the merged files, and
        // none with each other within one flush's run.
        debug_assert!(fresh_keys.iter().flatten().all(|k| !merged.contains(k)));
        let kept = (fresh.len(), fresh.iter().map(|l| l.file_size).sum());
        Ok((inputs, kept))
    }

    fn create_images(
        &self,
        force: bool,
        throttle: &mut Throttle,
        stop: &AtomicBool,
        outcome: &mut CompactionOutcome,
    ) -> Result<(), CompactionError> {
        let historic = self.historic();
        let newest_image = historic.iter().filter(|l| l.name.kind == LayerKind::Image).map(|l| l.name.lsn_start).max();
        // L1 runs above the newest image, by their LSN range. Not counted:
        // fresh-page deltas, both those of a flush whose L0 is not compacted
        // yet (same LSN range as an L0: an image above them would lie above
        // that L0, and its compaction would straddle the image) and those a
        // compaction kept (inside the range of its L1 run).
        let l0_ranges: BTreeSet<(Lsn, Lsn)> =
            historic.l0().iter().map(|l| (l.name.lsn_start, l.name.lsn_end)).collect();
        let ranges: BTreeSet<(Lsn, Lsn)> = historic
            .iter()
            .filter(|l| l.name.kind == LayerKind::Delta && !is_l0(&l.name))
            .filter(|l| newest_image.is_none_or(|i| l.name.lsn_start > i))
            .map(|l| (l.name.lsn_start, l.name.lsn_end))
            .filter(|r| !l0_ranges.contains(r))
            .collect();
        let runs: BTreeSet<(Lsn, Lsn)> = ranges
            .iter()
            .filter(|(s, e)| !ranges.iter().any(|(os, oe)| (os, oe) != (s, e) && os <= s && e <= oe))
            .copied()
            .collect();
        let threshold = if force { 1 } else { self.policy.image_creation_threshold };
        let Some(&(_, top)) = runs.iter().next_back() else { return Ok(()) };
        if runs.len() < threshold {
            return Ok(());
        }
        // At the end of the newest L1 run: every L0 lies above it, so no
        // delta will ever straddle the image (compaction merges only L0s).
        let lsn = Lsn(top.0 - 1);
        let started = self.clock.now();
        // The keys that may have a value at `lsn` (a branch's parent's too).
        let Some(sources) = self.key_sources(lsn)? else {
            debug!(tenant = %self.tenant_id, timeline = %self.timeline_id, "images wait for the parent's flush");
            return Ok(());
        };
        debug_assert!(
            sources.iter().filter(|l| l.path().starts_with(&self.dir)).all(|l| l.name.lsn_end.0 <= lsn.0 + 1),
            "a source of this timeline straddles the image LSN"
        );
        let mut out = Outputs::new(self, LayerKind::Image, lsn, Lsn(lsn.0 + 1));
        let mut batch: Vec<Key> = Vec::with_capacity(IMAGE_BATCH);
        let mut write_batch = |batch: &mut Vec<Key>, out: &mut Outputs| -> Result<(), CompactionError> {
            for (key, value) in batch.iter().zip(self.get_many(batch, lsn)) {
                let Some(page) = value? else { continue };
                throttle.consume(page.len() as u64);
                out.writer(*key)?.put(key, lsn, &Value::Image(page)).map_err(StorageError::from)?;
            }
            batch.clear();
            Ok(())
        };
        let mut last: Option<Key> = None;
        merge(&sources, true, |v| {
            if stop.load(Ordering::Relaxed) {
                return Err(CompactionError::Cancelled);
            }
            if last == Some(v.key) {
                return Ok(());
            }
            last = Some(v.key);
            // A split's child reads its parent's layers, which hold its
            // siblings' keys too: its images keep only its own.
            if !v.key.is_stored_on(&self.shard) {
                return Ok(());
            }
            batch.push(v.key);
            if batch.len() == IMAGE_BATCH {
                write_batch(&mut batch, &mut out)?;
            }
            Ok(())
        })?;
        write_batch(&mut batch, &mut out)?;
        let written = out.finish()?;
        let added = self.install_layers(written, &[])?;
        let bytes: u64 = added.iter().map(|l| l.file_size).sum();
        self.metrics.image_layers_created.inc_by(added.len() as u64);
        self.metrics.image_bytes_written.inc_by(bytes);
        outcome.images_written += added.len();
        outcome.image_bytes_written += bytes;
        outcome.image_lsn = Some(lsn);
        info!(
            tenant = %self.tenant_id, timeline = %self.timeline_id, %lsn, files = added.len(), bytes,
            l1_runs = runs.len(), elapsed_ms = self.clock.since(started).as_millis() as u64, "created image layers"
        );
        Ok(())
    }

    /// Makes `added` (temporary files, complete and fsynced) part of the
    /// timeline in place of `removed`: the metadata listing them is made
    /// durable first, then the files get their names, then the map swaps.
    /// A crash at any point leaves either the old set or the new one (load
    /// completes the renames and deletes the removed files). A failure
    /// after the metadata was written breaks the timeline; it is re-read.
    /// Layer files whose keys include every key that may have a value at
    /// `lsn`: the newest image at or below it (complete for every key) and
    /// the deltas above that image starting at or below `lsn`; for a branch
    /// without such an image, also its parent's at the branch point.
    /// `None` while some of the parent's versions are only in memory.
    fn key_sources(&self, lsn: Lsn) -> Result<Option<Vec<Arc<LayerFile>>>, ReadError> {
        let historic = self.historic();
        let newest_image = historic
            .iter()
            .filter(|l| l.name.kind == LayerKind::Image && l.name.lsn_start <= lsn)
            .map(|l| l.name.lsn_start)
            .max();
        let mut sources: Vec<Arc<LayerFile>> = historic
            .iter()
            .filter(|l| l.name.lsn_start <= lsn)
            .filter(|l| match (l.name.kind, newest_image) {
                (LayerKind::Image, Some(i)) => l.name.lsn_start == i,
                (LayerKind::Image, None) => false,
                (LayerKind::Delta, i) => i.is_none_or(|i| l.name.lsn_start > i),
            })
            .cloned()
            .collect();
        if newest_image.is_none() {
            if let Some((parent, at)) = self.ancestor_for_read()? {
                let at = lsn.min(at);
                if parent.disk_consistent_lsn() < at {
                    return Ok(None);
                }
                match parent.key_sources(at)? {
                    Some(more) => sources.extend(more),
                    None => return Ok(None),
                }
            }
        }
        Ok(Some(sources))
    }

    pub(super) fn install_layers(
        &self,
        added: Vec<(PathBuf, LayerName)>,
        removed: &[LayerName],
    ) -> Result<Vec<Arc<LayerFile>>, StorageError> {
        self.install_layers_with(added, removed, |_| {})
    }

    /// [`Timeline::install_layers`], changing the metadata with `edit` too.
    pub(super) fn install_layers_with(
        &self,
        added: Vec<(PathBuf, LayerName)>,
        removed: &[LayerName],
        edit: impl FnOnce(&mut super::TimelineMetadata),
    ) -> Result<Vec<Arc<LayerFile>>, StorageError> {
        let _files = self.layer_files_lock.lock();
        let mut next = self.metadata();
        edit(&mut next);
        let gone: BTreeSet<String> = removed.iter().map(|n| n.to_string()).collect();
        next.layers.retain(|n| !gone.contains(n));
        next.layers.extend(added.iter().map(|(_, n)| n.to_string()));
        self.prune_removed(&mut next);
        next.removed_layers.extend(gone);
        if let Err(e) = self.write_metadata(&next) {
            for (tmp, _) in &added {
                let _ = std::fs::remove_file(tmp);
            }
            self.set_broken(BrokenKind::Storage, format!("writing the metadata of new layer files: {e}"));
            return Err(e);
        }
        let result = (|| {
            let mut opened = Vec::with_capacity(added.len());
            for (tmp, name) in &added {
                let path = self.dir.join(name.to_string());
                std::fs::rename(tmp, &path).map_err(StorageError::io("renaming", tmp))?;
                opened.push(path);
            }
            if self.fsync {
                strata_service::durable::sync_dir(&self.dir)?;
            }
            let mut files = Vec::with_capacity(opened.len());
            for path in opened {
                let file = LayerFile::open(&path, &self.files)?;
                self.adopt(&file);
                files.push(Arc::new(file));
            }
            Ok::<_, StorageError>(files)
        })();
        let files = match result {
            Ok(f) => f,
            Err(e) => {
                self.set_broken(BrokenKind::Storage, format!("installing new layer files: {e}"));
                return Err(e);
            }
        };
        {
            let mut map = self.layers.write();
            let mut historic = (*map.historic).clone();
            for name in removed {
                if let Some(old) = historic.remove(name) {
                    old.mark_removed();
                }
            }
            for f in &files {
                if let Err(e) = historic.insert(f.clone()) {
                    let e = StorageError::Invalid { path: self.dir.clone(), reason: e.to_string() };
                    self.set_broken(BrokenKind::Files, format!("installing new layer files: {e}"));
                    return Err(e);
                }
            }
            map.historic = Arc::new(historic);
        }
        *self.meta.lock() = next;
        self.metadata_changed();
        Ok(files)
    }
}
