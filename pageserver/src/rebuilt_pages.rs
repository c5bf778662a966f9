//! Pages rebuilt from redo records, kept so that the next read of a hot
//! page applies only the records written since.
//!
//! A page that many records change is read back by applying up to
//! `MAX_REDO_CHAIN - 1` records (at most `MAX_CHAIN_BYTES` of them) to its
//! last image. Reading it again at the
//! same or a later LSN would repeat that work; instead the rebuilt page is
//! kept with the LSN of the newest version it includes. Versions at an LSN
//! never change, so the entry stays valid for every read whose versions
//! include that LSN, at any later LSN. Bounded by a count of pages; the
//! oldest insertion goes first.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use parking_lot::Mutex;

use strata_formats::Lsn;

use crate::key::Key;

/// Rebuilt pages kept per timeline.
pub use crate::limits::REBUILT_PAGES as DEFAULT_CAPACITY;

/// A bounded map from a key to its page as of the newest version applied.
pub struct RebuiltPages {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    pages: HashMap<Key, (Lsn, Bytes)>,
    /// Keys in insertion order (each at most once), for eviction.
    order: VecDeque<Key>,
}

impl RebuiltPages {
    pub fn new(capacity: usize) -> RebuiltPages {
        RebuiltPages { capacity, inner: Mutex::new(Inner::default()) }
    }

    /// The page of `key` with every version up to its LSN applied, if kept.
    pub fn get(&self, key: &Key) -> Option<(Lsn, Bytes)> {
        self.inner.lock().pages.get(key).cloned()
    }

    /// Keeps `page`, the value of `key` with every version up to `lsn`
    /// applied, unless a page of a later LSN is kept already.
    pub fn insert(&self, key: Key, lsn: Lsn, page: Bytes) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        match inner.pages.get_mut(&key) {
            Some(kept) if kept.0 >= lsn => {}
            Some(kept) => *kept = (lsn, page),
            None => {
                while inner.pages.len() >= self.capacity {
                    let Some(old) = inner.order.pop_front() else { break };
                    inner.pages.remove(&old);
                }
                inner.pages.insert(key, (lsn, page));
                inner.order.push_back(key);
            }
        }
        debug_assert_eq!(inner.pages.len(), inner.order.len());
    }

    /// Pages kept now.
    pub fn len(&self) -> usize {
        self.inner.lock().pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::RelTag;
    use strata_formats::types::{ForkNumber, RelFileNode};

    fn key(block: u32) -> Key {
        let rel = RelFileNode { spc: 1663, db: 5, rel: 16384 };
        Key::rel_block(RelTag { rel, fork: ForkNumber::Main }, block)
    }

    #[test]
    fn keeps_the_latest_lsn_and_stays_within_its_capacity() {
        let pages = RebuiltPages::new(3);
        pages.insert(key(0), Lsn(100), Bytes::from_static(b"a"));
        // An older rebuild does not replace a newer one; a newer one does.
        pages.insert(key(0), Lsn(50), Bytes::from_static(b"old"));
        assert_eq!(pages.get(&key(0)), Some((Lsn(100), Bytes::from_static(b"a"))));
        pages.insert(key(0), Lsn(200), Bytes::from_static(b"b"));
        assert_eq!(pages.get(&key(0)), Some((Lsn(200), Bytes::from_static(b"b"))));
        for b in 1..100 {
            pages.insert(key(b), Lsn(300 + u64::from(b)), Bytes::from_static(b"x"));
            assert!(pages.len() <= 3);
        }
        assert_eq!(pages.len(), 3);
        // The oldest insertions went first.
        assert!(pages.get(&key(0)).is_none() && pages.get(&key(96)).is_none());
        assert!(pages.get(&key(99)).is_some() && pages.get(&key(97)).is_some());
        let none = RebuiltPages::new(0);
        none.insert(key(1), Lsn(1), Bytes::from_static(b"x"));
        assert!(none.is_empty());
    }
}
