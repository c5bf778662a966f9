//! The in-memory layer: versions ingested since the last flush, kept sorted
//! by key and LSN so that freezing writes a delta layer in one pass.

use std::collections::BTreeMap;

use parking_lot::RwLock;
use strata_formats::Lsn;

use super::Versions;
use crate::key::Key;
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

    /// Smallest and largest key held.
    pub fn key_range(&self) -> Option<(Key, Key)> {
        let inner = self.inner.read();
        Some((*inner.map.keys().next()?, *inner.map.keys().next_back()?))
    }
}
