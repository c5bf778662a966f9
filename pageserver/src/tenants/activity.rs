//! Idle timelines, on the side of the tenants: a timeline's receiver
//! stopped for good, and what the watcher (`watcher.rs`) does each round:
//! it joins the threads of the timelines that went idle, and wakes those
//! that a read waits on or that a safekeeper has WAL for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::{TenantId, TimelineId};
use tracing::{info, warn};

use super::{Tenants, TimelineEntry};
use crate::idle::State;
use crate::timeline::Timeline;
use crate::walreceiver::WalReceiver;

/// The highest commit LSN any safekeeper reported, per timeline.
/// Safekeepers' commit LSNs per timeline (every shard of a tenant reads
/// the same WAL).
pub type Commits = HashMap<(TenantId, TimelineId), Lsn>;

impl TimelineEntry {
    /// An entry of `tl`, with its receiver if one runs.
    pub(super) fn new(tl: Arc<Timeline>, receiver: Option<WalReceiver>) -> TimelineEntry {
        let status = receiver.as_ref().map_or_else(Default::default, |r| r.status.clone());
        TimelineEntry { tl, receiver: status, handle: Mutex::new(receiver), retired: AtomicBool::new(false) }
    }

    /// Stops its WAL receiver if one runs (the flusher writes what is
    /// frozen first) and takes the entry out of the watcher's hands: an
    /// idle timeline deleted, detached or replaced is never woken again.
    pub(super) fn stop_receiver(&self) {
        let receiver = {
            let mut handle = self.handle.lock();
            self.retired.store(true, Ordering::SeqCst);
            handle.take()
        };
        if let Some(r) = receiver {
            r.shutdown();
        }
    }
}

/// Why an idle timeline must wake, if it must: a read waits on it, or a
/// safekeeper has committed WAL beyond what it received.
fn wake_reason(waiters: usize, received: Lsn, commit: Option<Lsn>) -> Option<&'static str> {
    if waiters > 0 {
        Some("read")
    } else if commit.is_some_and(|c| c > received) {
        Some("wal")
    } else {
        None
    }
}

impl Tenants {
    /// Whether any timeline idles (the watcher reads positions only then).
    pub fn any_idle(&self) -> bool {
        self.timelines.read().values().any(|e| e.tl.activity.state().is_idle())
    }

    /// One round of the watcher: joins the threads of the timelines that
    /// went idle, and wakes the idle ones a read waits on or, with the
    /// `commits` read from the safekeepers this round, those they have WAL
    /// for. Blocking (joins and starts threads). Returns whether it joined
    /// any (their memory is then free for good: `heap_trim.rs`).
    pub fn tend_idle(&self, commits: Option<&Commits>) -> bool {
        let mut reaped = false;
        for entry in self.all() {
            let activity = &entry.tl.activity;
            match activity.state() {
                State::Left => {
                    self.reap(&entry);
                    reaped = true;
                }
                State::Idle => {}
                State::Active | State::Leaving => continue,
            }
            let key = (entry.tl.tenant_id.tenant, entry.tl.timeline_id);
            let commit = commits.and_then(|c| c.get(&key).copied());
            if let Some(reason) = wake_reason(activity.waiters(), activity.received(), commit) {
                self.wake(&entry, reason);
            }
        }
        reaped
    }

    /// Joins the ended threads of a timeline that went idle.
    fn reap(&self, entry: &TimelineEntry) {
        let receiver = entry.handle.lock().take();
        if let Some(r) = receiver {
            r.shutdown();
        }
        entry.tl.activity.reaped();
    }

    /// Starts the receiver and flusher of an idle timeline again; it
    /// streams from its last record ingested. A failure to start them
    /// leaves it idle, to be tried again next round.
    fn wake(&self, entry: &TimelineEntry, reason: &'static str) {
        let mut handle = entry.handle.lock();
        if entry.retired.load(Ordering::SeqCst) || handle.is_some() || !entry.tl.activity.wake() {
            return;
        }
        let tl = &entry.tl;
        match WalReceiver::spawn(tl.clone(), self.wal_sources.clone(), entry.receiver.clone()) {
            Ok(r) => {
                *handle = Some(r);
                self.metrics.count_wake(reason);
                info!(tenant = %tl.tenant_id, timeline = %tl.timeline_id, reason, last_record_lsn = %tl.record_lsns().last, "waking an idle timeline");
            }
            Err(e) => {
                tl.activity.wake_failed();
                warn!(tenant = %tl.tenant_id, timeline = %tl.timeline_id, reason, "waking an idle timeline: {e}; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_read_or_wal_beyond_what_was_received_wakes_a_timeline() {
        let received = Lsn(0x1000);
        assert_eq!(wake_reason(1, received, None), Some("read"));
        assert_eq!(wake_reason(0, received, Some(Lsn(0x1008))), Some("wal"));
        assert_eq!(wake_reason(2, received, Some(Lsn(0x1008))), Some("read"), "a read first");
        assert_eq!(wake_reason(0, received, Some(received)), None, "nothing new");
        assert_eq!(wake_reason(0, received, Some(Lsn(0x800))), None, "a lagging safekeeper");
        assert_eq!(wake_reason(0, received, None), None, "no safekeeper knows it");
    }
}
