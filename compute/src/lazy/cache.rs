//! The local file cache's budget (`docs/lazy-compute.md`, "Cache"): a CLOCK
//! ring of the blocks that the block rules allow to drop (fetched blocks,
//! and written main-fork blocks once the pageserver has their version).
//! When the ring holds more blocks than the budget, its hand drops the
//! oldest ones not read since it last passed them.
//!
//! Requests admit blocks and run the hand themselves, passing over files
//! another request holds (it may be waiting on the pageserver); a thread of
//! the cache then finishes the pass, waiting for those files. So the ring
//! is over budget only by what concurrent requests hold, and not for long.
//!
//! The ring only names blocks; whether one may go is asked of its file
//! each time ([`Evictable::evict`]), so an entry left behind by a
//! truncation, an unlink or a rewrite is simply dropped when the hand
//! reaches it. The ring may therefore hold more entries than there are
//! evictable local blocks, never fewer: the budget bounds the disk.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex};
use strata_formats::Lsn;

use super::rules::Eviction;

/// A file whose blocks the cache may drop.
pub trait Evictable: Send + Sync {
    /// Drops `block` if the rules allow it (`ingested`: how far the
    /// pageserver has the WAL). Unless `wait`, must not wait for a lock
    /// another request may hold for long (a fetch from the pageserver), and
    /// says `Waiting` instead.
    fn evict(&self, block: u32, ingested: Lsn, wait: bool) -> Eviction;
}

/// The cache's counters.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Blocks dropped from the backing files.
    pub evictions: AtomicU64,
    /// Blocks the ring holds (an upper bound of the evictable local blocks).
    pub blocks: AtomicU64,
    /// The budget, in blocks.
    pub budget_blocks: AtomicU64,
}

struct Slot {
    file: Weak<dyn Evictable>,
    block: u32,
}

/// The budget of one compute's backing files (both mounts share it).
pub struct Cache {
    budget: usize,
    ring: Mutex<VecDeque<Slot>>,
    /// Wakes the cache's thread when a request left the ring over budget.
    over: Condvar,
    /// The pageserver's ingested LSN, as last learnt.
    ingested: AtomicU64,
    /// The read floor of a read-write compute (`docs/lazy-compute.md`,
    /// rule 1): an LSN the pageserver had ingested, moved up as it goes.
    floor: AtomicU64,
    stats: Arc<CacheStats>,
}

impl Cache {
    /// A cache of at most `budget` evictable blocks (at least one).
    pub fn new(budget: usize, stats: Arc<CacheStats>) -> Cache {
        stats.budget_blocks.store(budget.max(1) as u64, Ordering::Relaxed);
        Cache {
            budget: budget.max(1),
            ring: Mutex::new(VecDeque::new()),
            over: Condvar::new(),
            ingested: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            stats,
        }
    }

    /// Starts the cache's thread, which finishes the passes requests leave
    /// over budget and retries blocks waiting for the pageserver; it ends
    /// when the cache is dropped.
    pub fn spawn_evictor(self: &Arc<Cache>) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new().name("lazy-cache".into()).spawn(move || evictor(weak))?;
        Ok(())
    }

    /// One pass of the hand that waits for busy files: takes the entries
    /// out of the ring (so requests are not held up), asks each file, and
    /// puts back what stays. Returns whether the ring is within budget.
    pub fn shrink_waiting(&self) -> bool {
        let ingested = self.ingested();
        let (taken, excess) = {
            let mut ring = self.ring.lock();
            let excess = ring.len().saturating_sub(self.budget);
            if excess == 0 {
                return true;
            }
            // Enough for two rounds of second chances over the excess.
            let n = ring.len().min(2 * excess + 64);
            (ring.drain(..n).collect::<Vec<Slot>>(), excess)
        };
        let mut kept = Vec::new();
        let mut unvisited = Vec::new();
        let mut dropped = 0usize;
        for slot in taken {
            if dropped >= excess {
                unvisited.push(slot);
                continue;
            }
            let Some(file) = slot.file.upgrade() else {
                dropped += 1;
                continue;
            };
            match file.evict(slot.block, ingested, true) {
                Eviction::Done => {
                    self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                }
                Eviction::Never => dropped += 1,
                Eviction::SecondChance | Eviction::Waiting => kept.push(slot),
            }
        }
        // Kept entries go to the back, as the hand passed them; those it
        // did not reach go back to the front.
        let mut ring = self.ring.lock();
        ring.extend(kept);
        for slot in unvisited.into_iter().rev() {
            ring.push_front(slot);
        }
        self.stats.blocks.store(ring.len() as u64, Ordering::Relaxed);
        ring.len() <= self.budget
    }

    /// The budget in blocks.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The pageserver has ingested WAL up to `lsn` (never moves back).
    pub fn set_ingested(&self, lsn: Lsn) {
        self.ingested.fetch_max(lsn.0, Ordering::Relaxed);
    }

    /// Moves the read floor up to `lsn` (never back).
    pub fn set_floor(&self, lsn: Lsn) {
        self.floor.fetch_max(lsn.0, Ordering::Relaxed);
    }

    /// The read floor (0 until set).
    pub fn floor(&self) -> Lsn {
        Lsn(self.floor.load(Ordering::Relaxed))
    }

    /// The pageserver's ingested LSN as last learnt.
    pub fn ingested(&self) -> Lsn {
        Lsn(self.ingested.load(Ordering::Relaxed))
    }

    /// `blocks` of `file` became local and evictable; drops blocks from
    /// the oldest end while the ring is over budget. Call without holding
    /// the file's lock.
    pub fn admit(&self, file: &Arc<dyn Evictable>, blocks: &[u32]) {
        if blocks.is_empty() {
            return;
        }
        let mut ring = self.ring.lock();
        for &block in blocks {
            ring.push_back(Slot { file: Arc::downgrade(file), block });
        }
        self.shrink(&mut ring);
        if ring.len() > self.budget {
            self.over.notify_one();
        }
    }

    /// Runs the hand until the ring is within budget, or it went round
    /// twice (once clears every second chance; what is left is waiting for
    /// the pageserver or busy: the next admission tries again).
    fn shrink(&self, ring: &mut VecDeque<Slot>) {
        let ingested = self.ingested();
        let mut visits = 2 * ring.len();
        while ring.len() > self.budget && visits > 0 {
            visits -= 1;
            let slot = ring.pop_front().expect("longer than the budget");
            let Some(file) = slot.file.upgrade() else { continue };
            match file.evict(slot.block, ingested, false) {
                Eviction::Done => {
                    self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                }
                Eviction::Never => {}
                Eviction::SecondChance | Eviction::Waiting => ring.push_back(slot),
            }
        }
        self.stats.blocks.store(ring.len() as u64, Ordering::Relaxed);
    }

    /// Entries in the ring.
    pub fn len(&self) -> usize {
        self.ring.lock().len()
    }

    /// Whether the ring is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The cache's thread: a pass whenever a request leaves the ring over
/// budget, and every second while it stays over (blocks waiting for the
/// pageserver to ingest).
fn evictor(cache: std::sync::Weak<Cache>) {
    loop {
        let Some(c) = cache.upgrade() else { return };
        let within = c.shrink_waiting();
        let mut ring = c.ring.lock();
        if within && ring.len() <= c.budget {
            c.over.wait_for(&mut ring, std::time::Duration::from_secs(1));
        } else if !within {
            // Still over after a whole pass: what is left waits for the
            // pageserver (or is busy); try again shortly.
            c.over.wait_for(&mut ring, std::time::Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lazy::rules::{ForkKind, SegmentRules};
    use strata_formats::version::BLCKSZ;

    const S: Lsn = Lsn(0x100_0000);

    /// A file of rules alone: what was dropped is visible in the rules.
    struct Rules(Mutex<SegmentRules>);

    impl Evictable for Rules {
        fn evict(&self, block: u32, ingested: Lsn, _wait: bool) -> Eviction {
            self.0.lock().evict(block, ingested)
        }
    }

    fn page(lsn: u64) -> Vec<u8> {
        let mut p = vec![1u8; BLCKSZ];
        p[0..4].copy_from_slice(&((lsn >> 32) as u32).to_le_bytes());
        p[4..8].copy_from_slice(&(lsn as u32).to_le_bytes());
        p
    }

    fn local(r: &Rules) -> u32 {
        r.0.lock().local_blocks().0
    }

    #[test]
    fn the_ring_keeps_the_budget_and_gives_read_blocks_a_second_chance() {
        let stats = Arc::new(CacheStats::default());
        let cache = Cache::new(4, stats.clone());
        cache.set_ingested(S);
        let rules = Arc::new(Rules(Mutex::new(SegmentRules::remote(ForkKind::Main, 100, S))));
        let file: Arc<dyn Evictable> = rules.clone();
        for b in 0..4 {
            rules.0.lock().fetched(b, S);
        }
        cache.admit(&file, &[0, 1, 2, 3]);
        assert_eq!((cache.len(), local(&rules)), (4, 4));
        // Block 0 was read again: the hand passes over it and drops 1.
        rules.0.lock().touch(0);
        rules.0.lock().fetched(4, S);
        cache.admit(&file, &[4]);
        assert_eq!((cache.len(), local(&rules)), (4, 4));
        let r = rules.0.lock();
        assert_eq!(r.source(0), crate::lazy::rules::Source::Local);
        assert_eq!(r.source(1), crate::lazy::rules::Source::Remote(S));
        drop(r);
        assert_eq!(stats.evictions.load(Ordering::Relaxed), 1);
        // Many more: never more than the budget local.
        for b in 5..60 {
            rules.0.lock().fetched(b, S);
            cache.admit(&file, &[b]);
            assert!(local(&rules) <= 4);
        }
        assert_eq!(stats.blocks.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn written_blocks_wait_for_the_pageserver_and_stale_entries_go() {
        let cache = Cache::new(2, Arc::new(CacheStats::default()));
        cache.set_ingested(S);
        let rules = Arc::new(Rules(Mutex::new(SegmentRules::remote(ForkKind::Main, 10, S))));
        let file: Arc<dyn Evictable> = rules.clone();
        for b in 0..3 {
            rules.0.lock().write(b, &page(S.0 + 0x100 * (u64::from(b) + 1)));
        }
        cache.admit(&file, &[0, 1, 2]);
        // Nothing the pageserver has: over budget, nothing dropped.
        assert_eq!((cache.len(), local(&rules)), (3, 3));
        cache.set_ingested(Lsn(S.0 + 0x100));
        cache.set_ingested(Lsn(1)); // never moves back
        assert_eq!(cache.ingested(), Lsn(S.0 + 0x100));
        rules.0.lock().fetched(5, S);
        cache.admit(&file, &[5]);
        // Block 0 (ingested) goes, 1 and 2 wait, then the fetched 5 goes.
        assert_eq!((cache.len(), local(&rules)), (2, 2));
        let r = rules.0.lock();
        assert_eq!(r.source(0), crate::lazy::rules::Source::Remote(Lsn(S.0 + 0x100)));
        assert_eq!(r.source(5), crate::lazy::rules::Source::Remote(S));
        drop(r);
        // Entries of a dropped file are dropped when the hand reaches them
        // (had 7 and 8 been asked, their file would have said Never).
        drop(file);
        drop(rules);
        let other: Arc<dyn Evictable> = Arc::new(Rules(Mutex::new(SegmentRules::remote(ForkKind::Main, 10, S))));
        cache.admit(&other, &[7, 8]);
        assert_eq!(cache.len(), 2, "the dropped file's entries went first");
    }
}
