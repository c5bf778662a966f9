//! How far a timeline's WAL has got beyond this safekeeper's own flush and
//! commit: what the pageserver holds in object storage, what is offloaded,
//! and where the WAL kept on this disk begins. The timeline's background
//! work (`manager`) and its consumers' feedback write it; the status, the
//! peers (`GET /v1/positions`) and new consumers read it.
//!
//! It sits in the timeline, below the tasks that write it, so that the
//! timeline holds no task's working memory.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::api::safekeeper::{OffloadStatus, RemovalStatus};
use strata_protocol::shard::ShardIndex;

/// One timeline's progress beyond its own positions.
#[derive(Default)]
pub struct Progress {
    /// The offload, as its task last published it.
    offload: Mutex<OffloadStatus>,
    /// The WAL removal, as its task last published it.
    removal: Mutex<RemovalStatus>,
    /// The highest `remote_consistent_lsn` a consumer or a live peer reported.
    remote_consistent: AtomicU64,
    /// The highest each shard of a sharded tenant reported: only what every
    /// shard of a layout holds counts as the tenant's (at most one entry
    /// per shard of each layout).
    shard_remote: Mutex<BTreeMap<ShardIndex, Lsn>>,
}

impl Progress {
    /// The progress of a timeline whose WAL on disk begins at `removed_before`.
    pub fn new(removed_before: Lsn) -> Progress {
        let removal = RemovalStatus { removed_before, ..Default::default() };
        Progress { removal: Mutex::new(removal), ..Default::default() }
    }

    /// Notes a `remote_consistent_lsn` reported for the timeline; it never goes back.
    pub fn note_remote_consistent(&self, lsn: Lsn) {
        self.remote_consistent.fetch_max(lsn.0, Ordering::SeqCst);
    }

    /// Notes `shard`'s `remote_consistent_lsn`: for a shard of a sharded
    /// tenant, the timeline's moves to the lowest of its layout's shards
    /// once every one of them has reported (WAL one shard still needs
    /// must not go because another has uploaded past it).
    pub fn note_shard_remote_consistent(&self, shard: ShardIndex, lsn: Lsn) {
        if shard.is_unsharded() {
            return self.note_remote_consistent(lsn);
        }
        let mut reported = self.shard_remote.lock();
        let e = reported.entry(shard).or_insert(Lsn::INVALID);
        *e = (*e).max(lsn);
        let of_layout: Vec<Lsn> = reported.iter().filter(|(s, _)| s.count == shard.count).map(|(_, l)| *l).collect();
        if of_layout.len() == usize::from(shard.count) {
            let lowest = of_layout.into_iter().min().unwrap_or(Lsn::INVALID);
            self.note_remote_consistent(lowest);
        }
    }

    /// The highest `remote_consistent_lsn` reported (0 until one is, after a start).
    pub fn remote_consistent_lsn(&self) -> Lsn {
        Lsn(self.remote_consistent.load(Ordering::SeqCst))
    }

    /// The offload's status.
    pub fn offload(&self) -> OffloadStatus {
        self.offload.lock().clone()
    }

    /// End of the WAL this safekeeper knows to be offloaded.
    pub fn offloaded_lsn(&self) -> Lsn {
        self.offload.lock().offloaded_lsn
    }

    /// Publishes the offload's status (by the offload task only).
    pub fn set_offload(&self, status: OffloadStatus) {
        *self.offload.lock() = status;
    }

    /// The removal's status.
    pub fn removal(&self) -> RemovalStatus {
        self.removal.lock().clone()
    }

    /// Where the WAL held on this disk begins.
    pub fn removed_before(&self) -> Lsn {
        self.removal.lock().removed_before
    }

    /// Publishes the removal's status (by the removal task only).
    pub fn set_removal(&self, status: RemovalStatus) {
        *self.removal.lock() = status;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sharded_tenants_remote_consistent_lsn_is_its_slowest_shards() {
        let p = Progress::new(Lsn(0));
        let shard = |n| ShardIndex::new(n, 3).unwrap();
        p.note_shard_remote_consistent(shard(0), Lsn(500));
        p.note_shard_remote_consistent(shard(2), Lsn(300));
        assert_eq!(p.remote_consistent_lsn(), Lsn(0), "shard 1 has not reported: nothing is known");
        p.note_shard_remote_consistent(shard(1), Lsn(400));
        assert_eq!(p.remote_consistent_lsn(), Lsn(300));
        p.note_shard_remote_consistent(shard(2), Lsn(900));
        assert_eq!(p.remote_consistent_lsn(), Lsn(400));
        // A report never takes it back.
        p.note_shard_remote_consistent(shard(1), Lsn(100));
        assert_eq!(p.remote_consistent_lsn(), Lsn(400));
        // Unsharded reports count as they come.
        p.note_shard_remote_consistent(ShardIndex::UNSHARDED, Lsn(1000));
        assert_eq!(p.remote_consistent_lsn(), Lsn(1000));
    }
}
