//! Writing a frozen in-memory layer to layer files (`docs/pageserver.md`,
//! "Fresh pages skip compaction").
//!
//! A flush writes one L0 delta (every key) and, beside it over the same LSN
//! range, fresh-page deltas: key-ranged files of the pages that started
//! from a base in this flush. Compaction merges the L0s into L1s and
//! leaves fresh-page deltas as they are unless another flush of its window
//! touched the same keys, so the bytes of a bulk load are written once
//! instead of twice.

use std::path::PathBuf;
use std::sync::Arc;

use strata_service::durable::sync_dir;
use tracing::info;

use super::{StorageError, Timeline};
use crate::key::Key;
use crate::layer::inmemory::InMemoryLayer;
use crate::layer::layer_file::{LayerFile, LayerFileWriter, LayerName};
use crate::layer::map::RecordLsns;
use crate::value::Value;

/// Fresh-page delta files being written for one flush: a new file at each
/// relation fork and once the current one reaches the target size, each
/// named by the keys it holds (`[first, last.next())`).
struct FreshFiles<'a> {
    tl: &'a Timeline,
    name: LayerName,
    current: Option<LayerFileWriter>,
    last_key: Option<Key>,
    done: Vec<PathBuf>,
}

impl FreshFiles<'_> {
    fn put(&mut self, key: &Key, lsn: strata_formats::Lsn, value: &Value) -> Result<(), StorageError> {
        if self.last_key != Some(*key) {
            let other_fork =
                self.last_key.is_some_and(|l| l.as_rel_block().map(|r| r.0) != key.as_rel_block().map(|r| r.0));
            let full = self.current.as_ref().is_some_and(|w| w.written() >= self.tl.policy.compaction_target_size);
            if other_fork || full {
                self.finish_current()?;
            }
            if self.current.is_none() {
                let name = LayerName::delta(*key, Key::MAX, self.name.lsn_start, self.name.lsn_end);
                self.current = Some(LayerFileWriter::new(&self.tl.dir, name)?);
            }
            self.last_key = Some(*key);
        }
        self.current.as_mut().expect("opened above").put(key, lsn, value)?;
        Ok(())
    }

    fn finish_current(&mut self) -> Result<(), StorageError> {
        if let (Some(mut w), Some(last)) = (self.current.take(), self.last_key) {
            w.set_key_end(last.next());
            self.done.push(w.finish(self.tl.fsync)?);
        }
        Ok(())
    }
}

impl Drop for FreshFiles<'_> {
    fn drop(&mut self) {
        // Files of a flush that failed: nothing lists them.
        if let Some(w) = self.current.take() {
            let _ = std::fs::remove_file(w.path());
        }
    }
}

impl Timeline {
    /// Writes `layer` (frozen) to layer files, lists them in the metadata
    /// with `disk_consistent_lsn` at `lsns`, and puts them in the map.
    pub(super) fn flush_one(&self, layer: &Arc<InMemoryLayer>, lsns: RecordLsns) -> Result<(), StorageError> {
        let started = self.clock.now();
        let mut files: Vec<Arc<LayerFile>> = Vec::new();
        let mut fresh_bytes = 0u64;
        if layer.key_range().is_some() {
            let end = layer.end_lsn().expect("frozen");
            // The L0: every key the fresh-page deltas do not hold.
            let name = LayerName::delta(Key::MIN, Key::MAX, layer.start_lsn, end);
            let fresh = layer.fresh_keys(self.policy.fresh_page_min_bytes);
            // Each step's error names the layer file (its temporary name).
            let mut writer = LayerFileWriter::new(&self.dir, name)?;
            let mut fresh_files = FreshFiles { tl: self, name, current: None, last_key: None, done: Vec::new() };
            let mut next_fresh = 0;
            layer.for_each(|k, l, v| {
                while fresh.get(next_fresh).is_some_and(|f| f < k) {
                    next_fresh += 1;
                }
                if fresh.get(next_fresh) == Some(k) {
                    fresh_files.put(k, l, v)
                } else {
                    writer.put(k, l, v).map_err(StorageError::from)
                }
            })?;
            fresh_files.finish_current()?;
            let mut paths = std::mem::take(&mut fresh_files.done);
            paths.push(writer.finish(self.fsync)?);
            if self.fsync {
                sync_dir(&self.dir)?;
            }
            for path in paths {
                let file = LayerFile::open(&path, &self.files)?;
                self.adopt(&file);
                if file.name.key_start != Key::MIN {
                    fresh_bytes += file.file_size;
                }
                files.push(Arc::new(file));
            }
        }
        let _files = self.layer_files_lock.lock();
        let mut next = self.metadata();
        next.layers.extend(files.iter().map(|f| f.name.to_string()));
        debug_assert!(lsns.last >= next.disk_consistent_lsn, "disk_consistent_lsn goes backwards");
        next.disk_consistent_lsn = lsns.last;
        next.prev_record_lsn = lsns.prev;
        self.prune_removed(&mut next);
        self.write_metadata(&next)?;
        *self.meta.lock() = next;
        self.metadata_changed();
        {
            let mut map = self.layers.write();
            if !files.is_empty() {
                let mut historic = (*map.historic).clone();
                for f in &files {
                    self.metrics.layer_bytes_written.inc_by(f.file_size);
                    historic
                        .insert(f.clone())
                        .map_err(|e| StorageError::Invalid { path: self.dir.clone(), reason: e.to_string() })?;
                }
                map.historic = Arc::new(historic);
            }
            let (first, _) = map.frozen.remove(0);
            debug_assert!(Arc::ptr_eq(&first, layer));
        }
        self.metrics.layers_flushed.inc();
        self.metrics.fresh_bytes_written.inc_by(fresh_bytes);
        info!(
            tenant = %self.tenant_id, timeline = %self.timeline_id, disk_consistent_lsn = %lsns.last,
            versions = files.iter().map(|f| f.len()).sum::<u64>(), files = files.len(), fresh_bytes,
            elapsed_ms = self.clock.since(started).as_millis() as u64, "flushed a layer"
        );
        Ok(())
    }
}
