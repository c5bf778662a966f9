//! The layer map of a timeline: the open in-memory layer, frozen in-memory
//! layers waiting to be written, and the layer files.
//!
//! Layer files are kept in *runs*: layers of one kind that share an LSN
//! range and have disjoint key ranges. Every L0 delta (a flush, all keys) is
//! a run of its own; the fresh-page deltas written beside it by the same
//! flush form another (`docs/pageserver.md`, "Fresh pages skip
//! compaction"); the L1 deltas one compaction writes form a run; so do
//! the image layers of one image creation. Runs are ordered by the end of
//! their LSN range, newest first, images before deltas that end at the same
//! LSN — the order a read must visit them. Within a run, the layer that may
//! hold a key is found by its key range in `O(log n)`, so a read never scans
//! the layers, and it stops at the first image that covers its key.
//!
//! The files are held in an immutable snapshot (`Arc<HistoricLayers>`): a
//! read clones the pointer and searches without any lock, while a flush,
//! compaction or GC builds the next snapshot and swaps it in.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

use strata_formats::Lsn;

use super::inmemory::InMemoryLayer;
use super::layer_file::{LayerFile, LayerKind, LayerName};
use super::{LayerError, Versions};
use crate::key::Key;

/// Last and previous record LSNs at some point of ingest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordLsns {
    /// End of the last record ingested.
    pub last: Lsn,
    /// Start of that record.
    pub prev: Lsn,
}

/// Whether a delta layer is an L0: written by one flush, its key range is
/// every key.
pub fn is_l0(name: &LayerName) -> bool {
    name.kind == LayerKind::Delta && name.key_start == Key::MIN && name.key_end == Key::MAX
}

/// Order of runs: newest end LSN first; at the same end, images first (an
/// image at `L` holds every version at or below `L`, including those of a
/// delta ending at `L + 1`); then the newest start; then an L0 before the
/// fresh-page deltas of the same flush (they hold other keys, so a read
/// may visit them in either order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RunKey {
    lsn_end: Reverse<Lsn>,
    delta: bool,
    lsn_start: Reverse<Lsn>,
    not_l0: bool,
}

impl RunKey {
    fn of(name: &LayerName) -> RunKey {
        RunKey {
            lsn_end: Reverse(name.lsn_end),
            delta: name.kind == LayerKind::Delta,
            lsn_start: Reverse(name.lsn_start),
            not_l0: !is_l0(name),
        }
    }
}

/// Layers of one kind and LSN range, by the start of their key range.
#[derive(Clone, Default)]
struct Run {
    layers: BTreeMap<Key, Arc<LayerFile>>,
}

impl Run {
    /// The layer whose key range holds `key`, if any.
    fn find(&self, key: &Key) -> Option<&Arc<LayerFile>> {
        let (_, layer) = self.layers.range(..=*key).next_back()?;
        (*key < layer.name.key_end).then_some(layer)
    }
}

/// Two layers of one run whose key ranges overlap: the map would not know
/// which one a read must visit.
#[derive(Debug, thiserror::Error)]
#[error("layer {new} overlaps {existing}, of the same kind and LSN range")]
pub struct OverlapError {
    pub new: Box<LayerName>,
    pub existing: Box<LayerName>,
}

/// The layer files of a timeline, as runs (see the module comment).
#[derive(Clone, Default)]
pub struct HistoricLayers {
    runs: BTreeMap<RunKey, Run>,
    count: usize,
}

/// How many layers of each kind a timeline has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LayerCounts {
    pub l0: usize,
    pub l1: usize,
    pub image: usize,
    /// Bytes of all the files.
    pub bytes: u64,
}

impl HistoricLayers {
    /// Adds a layer; refuses one that overlaps a layer of its run.
    pub fn insert(&mut self, layer: Arc<LayerFile>) -> Result<(), OverlapError> {
        let run = self.runs.entry(RunKey::of(&layer.name)).or_default();
        let name = layer.name;
        let below = run.layers.range(..name.key_end).next_back().map(|(_, l)| l.name);
        if let Some(existing) = below.filter(|e| e.key_end > name.key_start) {
            return Err(OverlapError { new: Box::new(name), existing: Box::new(existing) });
        }
        run.layers.insert(name.key_start, layer);
        self.count += 1;
        Ok(())
    }

    /// Removes a layer; returns it if it was there.
    pub fn remove(&mut self, name: &LayerName) -> Option<Arc<LayerFile>> {
        let key = RunKey::of(name);
        let run = self.runs.get_mut(&key)?;
        let layer = run.layers.get(&name.key_start).filter(|l| l.name == *name)?.clone();
        run.layers.remove(&name.key_start);
        if run.layers.is_empty() {
            self.runs.remove(&key);
        }
        self.count -= 1;
        Some(layer)
    }

    pub fn get(&self, name: &LayerName) -> Option<&Arc<LayerFile>> {
        self.runs.get(&RunKey::of(name))?.layers.get(&name.key_start).filter(|l| l.name == *name)
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Every layer, in the order a read visits them.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<LayerFile>> {
        self.runs.values().flat_map(|r| r.layers.values())
    }

    /// The L0 deltas, oldest first.
    pub fn l0(&self) -> Vec<Arc<LayerFile>> {
        let mut out: Vec<_> = self.iter().filter(|l| is_l0(&l.name)).cloned().collect();
        out.reverse();
        out
    }

    /// Number of L0 deltas: they are the newest delta runs (each maybe
    /// followed by its flush's fresh-page deltas), so counting stops at the
    /// first other run.
    pub fn l0_count(&self) -> usize {
        let mut count = 0;
        let mut last_l0: Option<RunKey> = None;
        for key in self.runs.keys() {
            if !key.not_l0 {
                count += 1;
                last_l0 = Some(*key);
            } else if last_l0.is_none_or(|l| RunKey { not_l0: true, ..l } != *key) {
                break;
            }
        }
        count
    }

    /// The fresh-page deltas written by the flush of the L0 `l0`: the
    /// non-L0 deltas of exactly its LSN range.
    pub fn fresh_of(&self, l0: &LayerName) -> Vec<Arc<LayerFile>> {
        debug_assert!(is_l0(l0));
        let key = RunKey { not_l0: true, ..RunKey::of(l0) };
        self.runs.get(&key).map(|r| r.layers.values().cloned().collect()).unwrap_or_default()
    }

    pub fn counts(&self) -> LayerCounts {
        let mut c = LayerCounts::default();
        for l in self.iter() {
            match l.name.kind {
                LayerKind::Image => c.image += 1,
                LayerKind::Delta if is_l0(&l.name) => c.l0 += 1,
                LayerKind::Delta => c.l1 += 1,
            }
            c.bytes += l.file_size;
        }
        c
    }

    /// Gathers versions of `key` at or below `lsn` from the layer files,
    /// newest first, until a base or an image of the key's range; returns
    /// the number of layers visited.
    pub fn collect(&self, key: &Key, lsn: Lsn, out: &mut Versions) -> Result<u32, LayerError> {
        let mut visited = 0;
        for (run_key, run) in &self.runs {
            if out.complete() {
                break;
            }
            if run_key.lsn_start.0 > lsn {
                continue;
            }
            if let Some(layer) = run.find(key) {
                visited += 1;
                layer.collect(key, lsn, out)?;
            }
        }
        Ok(visited)
    }

    /// [`HistoricLayers::collect`] for several keys at one LSN, visiting each run once.
    pub fn collect_many(
        &self,
        keys: &[Key],
        lsn: Lsn,
        found: &mut [Result<Versions, LayerError>],
        visited: &mut [u32],
    ) {
        for (run_key, run) in &self.runs {
            if run_key.lsn_start.0 > lsn {
                continue;
            }
            let mut pending = false;
            for ((key, slot), n) in keys.iter().zip(found.iter_mut()).zip(visited.iter_mut()) {
                let Ok(v) = slot else { continue };
                if v.complete() {
                    continue;
                }
                pending = true;
                if let Some(layer) = run.find(key) {
                    *n += 1;
                    if let Err(e) = layer.collect(key, lsn, v) {
                        *slot = Err(e);
                    }
                }
            }
            if !pending {
                break;
            }
        }
    }
}

pub struct LayerMap {
    pub open: Arc<InMemoryLayer>,
    /// Oldest first, with the record LSNs at the moment each was frozen.
    pub frozen: Vec<(Arc<InMemoryLayer>, RecordLsns)>,
    /// The layer files; replaced as a whole when they change.
    pub historic: Arc<HistoricLayers>,
}

impl LayerMap {
    /// The in-memory layers, newest first, and the layer files: what a read visits, in order.
    pub fn snapshot(&self) -> (Vec<Arc<InMemoryLayer>>, Arc<HistoricLayers>) {
        let mut memory = Vec::with_capacity(1 + self.frozen.len());
        memory.push(self.open.clone());
        memory.extend(self.frozen.iter().rev().map(|(l, _)| l.clone()));
        (memory, self.historic.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: LayerName) -> Arc<LayerFile> {
        let dir = std::env::temp_dir().join(format!("strata-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = super::super::layer_file::LayerFileWriter::new(&dir, name).unwrap();
        if name.kind == LayerKind::Image {
            w.put(&name.key_start, name.lsn_start, &crate::value::Value::ZeroPage).unwrap();
        }
        let path = w.finish(false).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        Arc::new(LayerFile::from_bytes(&path, bytes).unwrap())
    }

    fn k(n: u32) -> Key {
        Key { kind: 0, field1: 1663, field2: 5, field3: 16384, field4: 0, field5: n }
    }

    #[test]
    fn runs_order_reads_and_refuse_overlaps() {
        let mut h = HistoricLayers::default();
        let l0 = LayerName::delta(Key::MIN, Key::MAX, Lsn(300), Lsn(401));
        let l1a = LayerName::delta(k(0), k(50), Lsn(100), Lsn(300));
        let l1b = LayerName::delta(k(50), k(100), Lsn(100), Lsn(300));
        let img = LayerName::image(k(0), k(100), Lsn(299));
        for n in [l1a, l0, img, l1b] {
            h.insert(layer(n)).unwrap();
        }
        let order: Vec<LayerName> = h.iter().map(|l| l.name).collect();
        assert_eq!(order, vec![l0, img, l1a, l1b], "newest end first, the image before deltas ending with it");
        assert_eq!(h.counts(), LayerCounts { l0: 1, l1: 2, image: 1, bytes: h.counts().bytes });
        let overlap = LayerName::delta(k(40), k(60), Lsn(100), Lsn(300));
        let err = h.insert(layer(overlap)).unwrap_err();
        assert_eq!(*err.existing, l1b, "the layer starting last before the new one ends");
        assert_eq!(h.len(), 4);
        // A read of key 70 at 350: the L0, then the image (which ends the
        // search: key 70 had no value there); the L1 run is not visited.
        let mut out = Versions::default();
        assert_eq!(h.collect(&k(70), Lsn(350), &mut out).unwrap(), 2);
        assert!(out.complete());
        // At 200 the image and the L0 are above the read: only the L1 holding key 70.
        let mut out = Versions::default();
        assert_eq!(h.collect(&k(70), Lsn(200), &mut out).unwrap(), 1);
        assert_eq!(h.remove(&l1a).unwrap().name, l1a);
        assert!(h.remove(&l1a).is_none());
        assert_eq!(h.l0().len(), 1);
        assert_eq!(h.len(), 3);
    }
}
