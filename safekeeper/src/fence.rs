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

use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Newest pageserver generation of one timeline, for the running streams.
pub struct Fence {
    newest: watch::Sender<u32>,
}

impl Fence {
    /// A fence at `newest` (from the control file).
    pub fn new(newest: u32) -> Fence {
        Fence { newest: watch::channel(newest).0 }
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
#[error("attachment generation {generation} of timeline {tenant}/{timeline} is stale: a pageserver has streamed it under generation {newest}")]
pub struct Stale {
    pub tenant: strata_protocol::TenantId,
    pub timeline: strata_protocol::TimelineId,
    pub generation: u32,
    pub newest: u32,
}

impl StreamFence {
    /// The fence of a stream of `generation` (0: not a pageserver, never
    /// fenced), admitted while `fence` was at most `generation`.
    pub fn new(fence: &Fence, generation: u32) -> StreamFence {
        let rx = (generation != 0).then(|| fence.newest.subscribe());
        StreamFence { generation, rx, stale_since: None }
    }
}

/// One stream's view of its timeline's fence.
pub struct StreamFence {
    generation: u32,
    /// `None` for consumers that are not pageservers.
    rx: Option<watch::Receiver<u32>>,
    stale_since: Option<Instant>,
}

impl StreamFence {
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
                self.stale_since = Some(Instant::now());
            }
            _ => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_learns_of_a_newer_generation_once() {
        let fence = Fence::new(3);
        let mut s = StreamFence { generation: 3, rx: Some(fence.newest.subscribe()), stale_since: None };
        fence.raise(2);
        fence.raise(3);
        let waited = tokio::time::timeout(Duration::from_millis(50), s.superseded()).await;
        assert!(waited.is_err(), "an older or equal generation does not fence");
        assert!(!s.is_fenced());
        fence.raise(4);
        s.superseded().await;
        assert!(s.is_fenced());
        assert_eq!(fence.newest(), 4);
        let grace = Duration::from_secs(5);
        assert!(s.deadline(grace).unwrap() > Instant::now());
        // Once fenced it waits for nothing more (the deadline governs).
        assert!(tokio::time::timeout(Duration::from_millis(20), s.superseded()).await.is_err());
    }

    #[tokio::test]
    async fn consumers_that_are_not_pageservers_are_never_fenced() {
        let mut s = StreamFence { generation: 0, rx: None, stale_since: None };
        assert!(tokio::time::timeout(Duration::from_millis(20), s.superseded()).await.is_err());
        assert!(!s.is_fenced());
        assert_eq!(s.deadline(Duration::ZERO), None);
    }
}
