//! What one timeline's WAL removal has done and what holds it back (kept in
//! the timeline, shown in the status), and the highest
//! `remote_consistent_lsn` its consumers reported.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_formats::Lsn;
use strata_protocol::api::safekeeper::RemovalStatus;

/// A timeline's removal, for the status.
#[derive(Clone, Debug, Default)]
pub struct RemovalState {
    /// The WAL held begins here.
    pub removed_before: Lsn,
    /// Segments wholly below this may go.
    pub horizon: Lsn,
    /// Which input sets the horizon.
    pub held_back_by: &'static str,
    /// Bytes of the segment files held.
    pub local_wal_bytes: u64,
    /// Segments removed since the safekeeper started.
    pub segments_removed: u64,
}

impl RemovalState {
    /// What the status shows of it.
    pub fn status(&self) -> RemovalStatus {
        RemovalStatus {
            removed_before: self.removed_before,
            horizon: self.horizon,
            held_back_by: self.held_back_by.to_string(),
            local_wal_bytes: self.local_wal_bytes,
            segments_removed: self.segments_removed,
        }
    }
}

/// The highest `remote_consistent_lsn` a consumer reported for a timeline.
#[derive(Default)]
pub struct RemoteConsistent(AtomicU64);

impl RemoteConsistent {
    pub fn note(&self, lsn: Lsn) {
        self.0.fetch_max(lsn.0, Ordering::SeqCst);
    }

    pub fn get(&self) -> Lsn {
        Lsn(self.0.load(Ordering::SeqCst))
    }
}
