//! The in-memory layer: versions ingested since the last flush, kept sorted
//! by key and LSN so that freezing writes a delta layer in one pass.

use std::collections::BTreeMap;

use parking_lot::RwLock;
use strata_formats::Lsn;

use super::Versions;
use crate::key::{Key, RelTag};
use crate::value::Value;

/// Versions of keys for LSNs in `[start_lsn, end_lsn)`; `end_lsn` is set when frozen.
pub struct InMemoryLayer {
    pub start_lsn: Lsn,
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Versions per key in ascending LSN order; equal LSNs keep insertion order.
    map: BTreeMap<Key, Vec<(Lsn, Value)>>,
    bytes: usize,
    end_lsn: Option<Lsn>,
}

impl InMemoryLayer {
    pub fn new(start_lsn: Lsn) -> InMemoryLayer {
        InMemoryLayer { start_lsn, inner: RwLock::new(Inner::default()) }
    }

    /// Adds versions (all at LSNs at or after the layer start).
    pub fn put_batch(&self, batch: impl IntoIterator<Item = (Key, Lsn, Value)>) {
        let mut inner = self.inner.write();
        debug_assert!(inner.end_lsn.is_none(), "put into a frozen layer");
        for (key, lsn, value) in batch {
            debug_assert!(lsn >= self.start_lsn);
            inner.bytes += value.size() + 40;
            let versions = inner.map.entry(key).or_default();
            debug_assert!(versions.last().is_none_or(|(l, _)| *l <= lsn), "versions must arrive in LSN order");
            versions.push((lsn, value));
        }
    }

    /// Approximate memory held.
    pub fn bytes(&self) -> usize {
        self.inner.read().bytes
    }

    pub fn is_empty(&self) -> bool {
        self.inner.read().map.is_empty()
    }

    /// Stops accepting versions; the layer covers `[start_lsn, end_lsn)`.
    pub fn freeze(&self, end_lsn: Lsn) {
        self.inner.write().end_lsn = Some(end_lsn);
    }

    pub fn end_lsn(&self) -> Option<Lsn> {
        self.inner.read().end_lsn
    }

    /// Gathers versions of `key` at or below `lsn`, newest first; true once a base is found.
    pub fn collect(&self, key: &Key, lsn: Lsn, out: &mut Versions) -> bool {
        let inner = self.inner.read();
        let Some(versions) = inner.map.get(key) else { return false };
        for (l, v) in versions.iter().rev() {
            if *l > lsn {
                continue;
            }
            if out.push(*l, v.clone()) {
                return true;
            }
        }
        false
    }

    /// Calls `f` on every version in key, then LSN order (for writing a layer file).
    pub fn for_each<E>(&self, mut f: impl FnMut(&Key, Lsn, &Value) -> Result<(), E>) -> Result<(), E> {
        let inner = self.inner.read();
        for (key, versions) in &inner.map {
            for (lsn, value) in versions {
                f(key, *lsn, value)?;
            }
        }
        Ok(())
    }

    /// The fresh pages of this layer, in key order: relation blocks whose
    /// oldest version here is a base (a page initialized or imaged here:
    /// bulk loads, index builds, restores), in the relation forks where
    /// they add up to at least `min_bytes` (`0`: none), less each fork's
    /// highest block here (the page a load is still filling, which the
    /// next flush is likely to change again). Nothing older is needed to
    /// read them, so they can skip compaction
    /// (`crate::timeline::Timeline::compact`).
    pub fn fresh_keys(&self, min_bytes: u64) -> Vec<Key> {
        let mut out = Vec::new();
        if min_bytes == 0 {
            return out;
        }
        let inner = self.inner.read();
        // Candidates of the fork being scanned, their bytes, and its highest block.
        let mut fork: Option<RelTag> = None;
        let mut candidates: Vec<(Key, u64)> = Vec::new();
        let mut highest: Option<Key> = None;
        let close = |candidates: &mut Vec<(Key, u64)>, highest: Option<Key>, out: &mut Vec<Key>| {
            if candidates.last().map(|(k, _)| Some(*k)) == Some(highest) {
                candidates.pop();
            }
            if candidates.iter().map(|(_, b)| b).sum::<u64>() >= min_bytes {
                out.extend(candidates.iter().map(|(k, _)| *k));
            }
            candidates.clear();
        };
        for (key, versions) in &inner.map {
            let Some((tag, _)) = key.as_rel_block() else { continue };
            if fork != Some(tag) {
                close(&mut candidates, highest, &mut out);
                fork = Some(tag);
            }
            highest = Some(*key);
            if versions.first().is_some_and(|(_, v)| v.is_base()) {
                let bytes: usize = versions.iter().map(|(_, v)| v.size()).sum();
                candidates.push((*key, bytes as u64));
            }
        }
        close(&mut candidates, highest, &mut out);
        debug_assert!(out.windows(2).all(|w| w[0] < w[1]), "fresh keys are in key order");
        out
    }

    /// Smallest and largest key held.
    pub fn key_range(&self) -> Option<(Key, Key)> {
        let inner = self.inner.read();
        Some((*inner.map.keys().next()?, *inner.map.keys().next_back()?))
    }
}
