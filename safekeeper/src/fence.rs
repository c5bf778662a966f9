//! Fencing of stale pageservers: each pageserver streams a timeline under the
//! attachment generation the storage controller gave it. The newest generation
//! seen is kept in the control file; a consumer of an older one is refused,
//! and one already streaming is cut off after a grace period. Its feedback
//! stops counting at once: a fenced pageserver's `remote_consistent_lsn`
//! could let WAL go that the new generation still needs.
//!
//! The grace lets a live move finish: the origin keeps serving its computes
//! until the target (the newer generation) has caught up and the computes
//! have switched, which takes about a second. After a failover the stale
//! pageserver is cut off a grace period after the new one connects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_service::clock::Clock;
use tokio::sync::watch;

/// Newest pageserver generation of one timeline, for the running streams.
pub struct Fence {
    newest: watch::Sender<u32>,
    /// When a stream learns it is fenced, its grace starts on this clock.
    clock: Arc<dyn Clock>,
}

impl Fence {
    /// A fence at `newest` (from the control file), timing graces on `clock`.
    pub fn new(newest: u32, clock: Arc<dyn Clock>) -> Fence {
        Fence { newest: watch::channel(newest).0, clock }
    }

    /// The newest generation seen.
    pub fn newest(&self) -> u32 {
        *self.newest.borrow()
    }

    /// Makes `g` the newest, if it is newer.
    pub fn raise(&self, g: u32) {
        self.newest.send_if_modified(|n| {
            let raised = g > *n;
            if raised {
                *n = g;
            }
            raised
        });
    }
}

/// Why a consumer's stream request was refused.
#[derive(Debug, thiserror::Error)]
#[error("attachment generation {generation} of timeline {tenant}/{timeline}{} is stale: a pageserver has streamed it under generation {newest}", shard_suffix(*.shard))]
pub struct Stale {
    pub tenant: strata_protocol::TenantId,
    pub timeline: strata_protocol::TimelineId,
    pub shard: strata_protocol::shard::ShardIndex,
    pub generation: u32,
    pub newest: u32,
}

/// ` (shard N of M)` for a shard of a sharded tenant, else nothing.
pub fn shard_suffix(shard: strata_protocol::shard::ShardIndex) -> String {
    match shard.is_unsharded() {
        true => String::new(),
        false => format!(" (shard {} of {})", shard.number, shard.count),
    }
}

impl StreamFence {
    /// The fence of a stream of `generation` (0: not a pageserver, never
    /// fenced), admitted while `fence` was at most `generation`.
    pub fn new(fence: &Fence, generation: u32) -> StreamFence {
        let rx = (generation != 0).then(|| fence.newest.subscribe());
        StreamFence { generation, rx, stale_since: None, clock: fence.clock.clone() }
    }
}

/// One stream's view of its timeline's fence.
pub struct StreamFence {
    generation: u32,
    /// `None` for consumers that are not pageservers.
    rx: Option<watch::Receiver<u32>>,
    stale_since: Option<Instant>,
    clock: Arc<dyn Clock>,
}

impl StreamFence {
    /// The newest generation of its shard seen so far.
    pub fn newest(&self) -> u32 {
        self.rx.as_ref().map_or(self.generation, |rx| *rx.borrow())
    }

    /// The consumer's generation (0: not a pageserver).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether a newer generation has streamed since this one started.
    pub fn is_fenced(&self) -> bool {
        self.stale_since.is_some()
    }

    /// When the stream must end (a grace after it was fenced), if it is.
    pub fn deadline(&self, grace: Duration) -> Option<Instant> {
        self.stale_since.map(|t| t + grace)
    }

    /// Whether the stream was fenced at least `grace` ago (and must end now).
    pub fn expired(&self, grace: Duration) -> bool {
        self.deadline(grace).is_some_and(|d| d <= self.clock.now())
    }

    /// Waits until a newer generation appears (forever for consumers that
    /// are not pageservers, or once fenced), then notes it.
    pub async fn superseded(&mut self) {
        let generation = self.generation;
        match (&mut self.rx, self.stale_since) {
            (Some(rx), None) => {
                if rx.wait_for(|newest| *newest > generation).await.is_err() {
                    // The timeline is gone: its stream ends otherwise.
                    return std::future::pending().await;
                }
                self.stale_since = Some(self.clock.now());
            }
            _ => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use strata_service::clock::ManualClock;

    /// Polls `f` once: whether it completed (none of these futures needs a runtime).
    fn ready(f: impl Future<Output = ()>) -> bool {
        let mut f = std::pin::pin!(f);
        f.as_mut().poll(&mut Context::from_waker(Waker::noop())) == Poll::Ready(())
    }

    #[test]
    fn a_stream_learns_of_a_newer_generation_once() {
        let fence = Fence::new(3, Arc::new(ManualClock::new()));
        let mut s = StreamFence::new(&fence, 3);
        fence.raise(2);
        fence.raise(3);
        assert!(!ready(s.superseded()), "an older or equal generation does not fence");
        assert!(!s.is_fenced());
        fence.raise(4);
        assert!(ready(s.superseded()));
        assert!(s.is_fenced());
        assert_eq!(fence.newest(), 4);
        // Once fenced it waits for nothing more (the deadline governs).
        assert!(!ready(s.superseded()));
    }

    #[test]
    fn a_fenced_stream_expires_a_grace_after_it_learned_of_the_newer_generation() {
        let clock = ManualClock::new();
        let fence = Fence::new(3, Arc::new(clock.clone()));
        let mut s = StreamFence::new(&fence, 3);
        let grace = Duration::from_secs(5);
        // Time before it is fenced does not count towards the grace.
        clock.advance(Duration::from_secs(100));
        assert!(!s.expired(grace));
        fence.raise(4);
        assert!(ready(s.superseded()));
        assert_eq!(s.deadline(grace), Some(clock.now() + grace));
        clock.advance(grace - Duration::from_millis(1));
        assert!(!s.expired(grace), "still within the grace");
        clock.advance(Duration::from_millis(1));
        assert!(s.expired(grace), "the grace is over");
    }

    #[test]
    fn consumers_that_are_not_pageservers_are_never_fenced() {
        let clock = ManualClock::new();
        let fence = Fence::new(3, Arc::new(clock.clone()));
        let mut s = StreamFence::new(&fence, 0);
        fence.raise(9);
        assert!(!ready(s.superseded()));
        clock.advance(Duration::from_secs(3600));
        assert!(!s.is_fenced());
        assert_eq!(s.deadline(Duration::ZERO), None);
        assert!(!s.expired(Duration::ZERO));
    }
}
