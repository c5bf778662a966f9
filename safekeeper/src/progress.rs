//! How far a timeline's WAL has got beyond this safekeeper's own flush and
//! commit: what the pageserver holds in object storage, what is offloaded,
//! and where the WAL kept on this disk begins. The timeline's background
//! work (`manager`) and its consumers' feedback write it; the status, the
//! peers (`GET /v1/positions`) and new consumers read it.
//!
//! It sits in the timeline, below the tasks that write it, so that the
//! timeline holds no task's working memory.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::api::safekeeper::{OffloadStatus, RemovalStatus};

/// One timeline's progress beyond its own positions.
#[derive(Default)]
pub struct Progress {
    /// The offload, as its task last published it.
    offload: Mutex<OffloadStatus>,
    /// The WAL removal, as its task last published it.
    removal: Mutex<RemovalStatus>,
    /// The highest `remote_consistent_lsn` a consumer or a live peer reported.
    remote_consistent: AtomicU64,
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
