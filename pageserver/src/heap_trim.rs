//! Giving the allocator's free memory back to the system once timelines go
//! idle.
//!
//! The C allocator keeps what a thread freed in that thread's arena (up to
//! eight per core), ready for its next allocation, and returns it to the
//! system only from the top of the main heap. A tenant's import and a
//! timeline's WAL receiver and flusher allocate megabytes on threads that
//! end when the timeline idles; what they freed stayed resident in the
//! arenas, and was most of what an idle tenant cost (`docs/tenants.md`,
//! "What an idle tenant costs"). `malloc_trim` walks every arena and
//! releases its free pages; nothing live moves, so it changes no state
//! a read or ingest sees.
//!
//! One trim covers every timeline that went idle before it, so the watcher
//! asks for one whenever it reaps timelines ([`HeapTrim::request`]) and
//! runs it at most once per [`HEAP_TRIM_MIN_INTERVAL`]: a trim holds each
//! arena's lock in turn while it walks it, and many timelines going idle
//! together (after a restart) must not pay that once each.

use std::sync::Arc;
use std::time::Instant;

use crate::clock::Clock;
use crate::limits::HEAP_TRIM_MIN_INTERVAL;

/// Whether a trim is wanted, and when the last one ran.
pub struct HeapTrim {
    clock: Arc<dyn Clock>,
    pending: bool,
    last: Option<Instant>,
}

impl HeapTrim {
    /// Nothing wanted yet; the first request is served at once.
    pub fn new(clock: Arc<dyn Clock>) -> HeapTrim {
        HeapTrim { clock, pending: false, last: None }
    }

    /// Some memory was freed for good (timelines went idle or were deleted): trim soon.
    pub fn request(&mut self) {
        self.pending = true;
    }

    /// Whether a requested trim may run now (the last one is old enough).
    fn due(&self) -> bool {
        self.pending && self.last.is_none_or(|at| self.clock.since(at) >= HEAP_TRIM_MIN_INTERVAL)
    }

    /// Trims if one was requested and the last is old enough; returns
    /// whether it did. Blocks for the walk (call it off the runtime).
    pub fn run_if_due(&mut self) -> bool {
        if !self.due() {
            return false;
        }
        self.pending = false;
        let started = self.clock.now();
        self.last = Some(started);
        release_free_memory();
        tracing::debug!(took = ?self.clock.since(started), "returned the allocator's free memory to the system");
        true
    }
}

/// Returns the allocator's free pages of every arena to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: malloc_trim takes no pointer and only releases pages the
    // allocator holds free; it is thread-safe (it locks each arena).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators return free memory on their own, or offer no such call.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn trims_only_when_asked_and_at_most_once_per_interval() {
        let clock = Arc::new(ManualClock::new());
        let mut trim = HeapTrim::new(clock.clone());
        assert!(!trim.run_if_due(), "nothing asked");
        trim.request();
        assert!(trim.run_if_due(), "the first request is served at once");
        assert!(!trim.run_if_due(), "served once");
        trim.request();
        assert!(!trim.run_if_due(), "too soon after the last");
        clock.advance(HEAP_TRIM_MIN_INTERVAL);
        assert!(trim.run_if_due(), "the request waited, and is served");
        clock.advance(HEAP_TRIM_MIN_INTERVAL * 3);
        assert!(!trim.run_if_due(), "no new request");
    }

    #[test]
    fn a_trim_keeps_live_memory_intact() {
        // Free a lot on another thread (its own arena), keep some live, trim.
        let kept = std::thread::spawn(|| {
            let garbage: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 << 10]).collect();
            let kept: Vec<Vec<u8>> = (0..8).map(|i| vec![i as u8 + 1; 4 << 10]).collect();
            drop(garbage);
            kept
        })
        .join()
        .expect("the thread ran");
        release_free_memory();
        for (i, v) in kept.iter().enumerate() {
            assert!(v.iter().all(|b| *b == i as u8 + 1));
        }
    }
}
