//! Idle timelines: a timeline that receives no WAL for a while gives up its
//! WAL stream and its threads, and gets them back when a safekeeper has
//! WAL it lacks or a read waits for an LSN it has not reached
//! (`docs/pageserver.md`, "Idle timelines").
//!
//! The WAL receiver decides when to leave ([`next_step`]); the pageserver's
//! watcher (`watcher.rs`) reaps the ended threads and wakes the timeline.
//! [`Activity`] is the state they share with the read path:
//!
//! ```text
//!   Active ──receiver: quiet, caught up, durable, reported──► Leaving
//!   Leaving ──a read waits──► Active          (the receiver streams on)
//!   Leaving ──no read waits──► Left            (its threads end)
//!   Left ──watcher joins the threads──► Idle
//!   Idle ──watcher: a read waits, or a safekeeper has more WAL──► Active
//! ```
//!
//! A read that starts waiting counts itself in `waiters` before it looks at
//! the state; the receiver moves to `Leaving` before it looks at `waiters`.
//! Both are sequentially consistent, so at least one of the two sees the
//! other: either the receiver stays, or the read finds the timeline leaving
//! and calls the watcher, which wakes it once its threads are gone.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use strata_formats::Lsn;
use tokio::sync::Notify;

/// Where a timeline is between streaming and idling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Its WAL receiver and flusher run.
    Active,
    /// Its receiver has decided to go idle and looks whether a read waits.
    Leaving,
    /// Its threads are ending or ended; the watcher has not joined them yet.
    Left,
    /// No thread, no WAL stream: everything it ingested is on disk.
    Idle,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            0 => State::Active,
            1 => State::Leaving,
            2 => State::Left,
            _ => State::Idle,
        }
    }

    /// Whether the timeline counts as idle (in the status and the metrics).
    pub fn is_idle(self) -> bool {
        matches!(self, State::Left | State::Idle)
    }
}

/// What the receiver, the read path and the watcher share of one timeline.
#[derive(Debug)]
pub struct Activity {
    state: AtomicU8,
    /// Reads waiting for an LSN the timeline has not reached.
    waiters: AtomicUsize,
    /// End of the WAL received when the timeline went idle: a safekeeper
    /// that has committed beyond it has WAL for it.
    received: AtomicU64,
    /// Wakes the pageserver's watcher; unset where there is none (the
    /// timeline then never goes idle).
    watcher: OnceLock<Arc<Notify>>,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            state: AtomicU8::new(State::Active as u8),
            waiters: AtomicUsize::new(0),
            received: AtomicU64::new(0),
            watcher: OnceLock::new(),
        }
    }
}

/// Counts a read as waiting for WAL while it lives.
pub struct Waiting<'a>(&'a Activity);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, SeqCst);
    }
}

impl Activity {
    /// Lets the timeline go idle, with `watcher` to call when it must wake
    /// (the first watcher set stays).
    pub fn watch(&self, watcher: Arc<Notify>) {
        let _ = self.watcher.set(watcher);
    }

    /// Whether a watcher would wake the timeline again (else it never leaves).
    pub fn has_watcher(&self) -> bool {
        self.watcher.get().is_some()
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(SeqCst))
    }

    /// Reads waiting for WAL now.
    pub fn waiters(&self) -> usize {
        self.waiters.load(SeqCst)
    }

    /// End of the WAL received when the timeline last went idle.
    pub fn received(&self) -> Lsn {
        Lsn(self.received.load(SeqCst))
    }

    /// A read starts waiting for WAL: counted first, then the watcher is
    /// called unless the timeline streams (see the module's comment).
    pub fn wait_for_wal(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, SeqCst);
        if self.state() != State::Active {
            self.notify();
        }
        Waiting(self)
    }

    /// The receiver asks to leave, having received WAL up to `received`:
    /// true if it may (its threads must then end and call [`Self::left`]),
    /// false if a read waits and it streams on.
    pub fn try_leave(&self, received: Lsn) -> bool {
        if self.state.compare_exchange(State::Active as u8, State::Leaving as u8, SeqCst, SeqCst).is_err() {
            return false;
        }
        if self.waiters() > 0 {
            self.state.store(State::Active as u8, SeqCst);
            return false;
        }
        self.received.store(received.0, SeqCst);
        true
    }

    /// The receiver's threads are ending: the watcher joins them.
    pub fn left(&self) {
        self.state.store(State::Left as u8, SeqCst);
        self.notify();
    }

    /// The watcher joined the threads of a timeline that [`Self::left`].
    pub fn reaped(&self) {
        let _ = self.state.compare_exchange(State::Left as u8, State::Idle as u8, SeqCst, SeqCst);
    }

    /// The watcher starts the threads of an idle timeline again: true if it
    /// was idle (the caller starts them), false if another did.
    pub fn wake(&self) -> bool {
        self.state.compare_exchange(State::Idle as u8, State::Active as u8, SeqCst, SeqCst).is_ok()
    }

    /// The threads could not be started again: the timeline stays idle.
    pub fn wake_failed(&self) {
        self.state.store(State::Idle as u8, SeqCst);
    }

    fn notify(&self) {
        if let Some(w) = self.watcher.get() {
            w.notify_one();
        }
    }
}

/// What a receiver streaming WAL knows when it considers going idle.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet {
    /// How long no WAL has arrived.
    pub quiet_for: Duration,
    /// The WAL received reaches the safekeeper's commit LSN.
    pub caught_up: bool,
    /// A read waits for an LSN not yet ingested.
    pub readers_waiting: bool,
    /// Nothing ingested is only in memory: no open or frozen layer holds a
    /// version, and `disk_consistent_lsn` is the last record ingested.
    pub durable: bool,
    /// Object storage has every layer file (true without object storage).
    pub uploaded: bool,
    /// The safekeeper was last told the applied and uploaded LSNs of now.
    pub reported: bool,
}

/// What the receiver does next about idling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep streaming.
    Stream,
    /// Freeze the in-memory layer so that the flusher writes it.
    Freeze,
    /// End the stream and the threads.
    Leave,
}

/// The receiver's next step after `q`, for a timeline that goes idle after
/// `idle_after` without WAL. Uploads get one more `idle_after` to finish:
/// WAL removal on the safekeepers waits for the uploaded LSN, which only
/// a stream reports; a timeline whose object storage is down goes idle
/// after that all the same (its layers are on local disk, uploaded later).
pub fn next_step(q: &Quiet, idle_after: Duration) -> Step {
    if q.quiet_for < idle_after || !q.caught_up || q.readers_waiting {
        return Step::Stream;
    }
    if !q.durable {
        return Step::Freeze;
    }
    if !q.uploaded && q.quiet_for < idle_after.saturating_mul(2) {
        return Step::Stream;
    }
    if !q.reported {
        return Step::Stream;
    }
    Step::Leave
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(30);

    fn settled() -> Quiet {
        Quiet {
            quiet_for: AFTER,
            caught_up: true,
            readers_waiting: false,
            durable: true,
            uploaded: true,
            reported: true,
        }
    }

    /// Whether `notify` holds a call (taken if so), without waiting.
    fn called(notify: &Notify) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            tokio::select! {
                biased;
                () = notify.notified() => true,
                () = std::future::ready(()) => false,
            }
        })
    }

    #[test]
    fn a_quiet_caught_up_durable_reported_timeline_leaves() {
        assert_eq!(next_step(&settled(), AFTER), Step::Leave);
    }

    #[test]
    fn wal_within_the_idle_period_a_lag_or_a_waiting_read_keep_it_streaming() {
        let recent = Quiet { quiet_for: AFTER - Duration::from_millis(1), ..settled() };
        assert_eq!(next_step(&recent, AFTER), Step::Stream);
        assert_eq!(next_step(&Quiet { caught_up: false, ..settled() }, AFTER), Step::Stream);
        assert_eq!(next_step(&Quiet { readers_waiting: true, ..settled() }, AFTER), Step::Stream);
        // Nothing is frozen early: WAL may still come within the period.
        assert_eq!(next_step(&Quiet { durable: false, ..recent }, AFTER), Step::Stream);
    }

    #[test]
    fn what_is_in_memory_is_frozen_first_and_the_report_waits_for_it() {
        assert_eq!(next_step(&Quiet { durable: false, ..settled() }, AFTER), Step::Freeze);
        assert_eq!(next_step(&Quiet { reported: false, ..settled() }, AFTER), Step::Stream);
    }

    #[test]
    fn uploads_get_one_more_period_and_then_the_timeline_leaves_anyway() {
        let pending = Quiet { uploaded: false, ..settled() };
        assert_eq!(next_step(&pending, AFTER), Step::Stream);
        let later = Quiet { quiet_for: AFTER * 2, ..pending };
        assert_eq!(next_step(&later, AFTER), Step::Leave);
        assert_eq!(next_step(&Quiet { reported: false, ..later }, AFTER), Step::Stream);
    }

    #[test]
    fn a_timeline_leaves_and_is_woken_through_every_state() {
        let a = Activity::default();
        let notify = Arc::new(Notify::new());
        a.watch(notify.clone());
        assert!(a.try_leave(Lsn(0x100)));
        assert_eq!(a.state(), State::Leaving);
        assert_eq!(a.received(), Lsn(0x100));
        a.left();
        assert!(a.state().is_idle());
        assert!(!a.wake(), "not before its threads are joined");
        a.reaped();
        assert_eq!(a.state(), State::Idle);
        assert!(a.wake());
        assert_eq!(a.state(), State::Active);
        assert!(!a.wake(), "woken once");
    }

    #[test]
    fn a_waiting_read_keeps_the_receiver_or_calls_the_watcher() {
        let a = Activity::default();
        let notify = Arc::new(Notify::new());
        a.watch(notify.clone());
        {
            let _w = a.wait_for_wal();
            assert!(!a.try_leave(Lsn(8)), "a read waits: the receiver streams on");
            assert_eq!(a.state(), State::Active);
        }
        assert_eq!(a.waiters(), 0);
        assert!(a.try_leave(Lsn(8)));
        a.left();
        a.reaped();
        // left() called the watcher; a read on the idle timeline calls it again.
        assert!(called(&notify), "leaving calls the watcher");
        assert!(!called(&notify));
        let w = a.wait_for_wal();
        assert_eq!(a.waiters(), 1);
        assert!(called(&notify), "a read on an idle timeline calls the watcher");
        drop(w);
    }

    #[test]
    fn only_an_active_timeline_may_leave() {
        let a = Activity::default();
        assert!(a.try_leave(Lsn(8)));
        assert!(!a.try_leave(Lsn(16)), "already leaving");
        a.left();
        a.reaped();
        assert!(!a.try_leave(Lsn(16)), "idle");
        assert_eq!(a.received(), Lsn(8));
        a.wake();
        a.wake_failed();
        assert_eq!(a.state(), State::Idle);
    }
}
