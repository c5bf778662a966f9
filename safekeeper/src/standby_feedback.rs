//! The replicas' `hot_standby_feedback` on one timeline: the oldest
//! snapshot each replica streaming from this safekeeper holds, passed on
//! to the writer's proposer so that the writer keeps the rows those
//! snapshots may still see (`docs/replicas.md`, "Lag").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use strata_protocol::safekeeper::StandbyFeedback;
use strata_service::clock::Clock;

use crate::limits::FEEDBACK_TTL;

/// The latest feedback of each replication connection.
pub struct FeedbackRegistry {
    entries: Mutex<HashMap<u64, (StandbyFeedback, Instant)>>,
    next: std::sync::atomic::AtomicU64,
    /// When feedback arrived and how old it is now ([`FEEDBACK_TTL`]).
    clock: Arc<dyn Clock>,
}

/// A replication connection's place in the registry; its feedback goes
/// with it.
pub struct FeedbackSlot<'a> {
    registry: &'a FeedbackRegistry,
    id: u64,
}

impl FeedbackSlot<'_> {
    /// The replica's feedback: full transaction ids, 0 for none (a replica
    /// that stopped asking sends zeros).
    pub fn set(&self, feedback: StandbyFeedback) {
        let mut entries = self.registry.entries.lock();
        if feedback == StandbyFeedback::default() {
            entries.remove(&self.id);
        } else {
            entries.insert(self.id, (feedback, self.registry.clock.now()));
        }
    }
}

impl Drop for FeedbackSlot<'_> {
    fn drop(&mut self) {
        self.registry.entries.lock().remove(&self.id);
    }
}

impl FeedbackRegistry {
    /// An empty registry, ageing feedback on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> FeedbackRegistry {
        FeedbackRegistry { entries: Mutex::default(), next: Default::default(), clock }
    }

    /// A slot for a new replication connection.
    pub fn slot(&self) -> FeedbackSlot<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        FeedbackSlot { registry: self, id }
    }

    /// The oldest of the live feedback, each id on its own (0: none).
    pub fn oldest(&self) -> StandbyFeedback {
        let now = self.clock.now();
        let mut entries = self.entries.lock();
        entries.retain(|_, (_, at)| now.saturating_duration_since(*at) < FEEDBACK_TTL);
        let min = |f: fn(&StandbyFeedback) -> u64| entries.values().map(|(e, _)| f(e)).filter(|x| *x != 0).min();
        StandbyFeedback { xmin: min(|e| e.xmin).unwrap_or(0), catalog_xmin: min(|e| e.catalog_xmin).unwrap_or(0) }
    }
}

/// A hot standby feedback message's payload (after the `h`): time (8),
/// xmin (4), its epoch (4), catalog_xmin (4), its epoch (4), big-endian.
/// `None` if it is not one.
pub fn parse_hot_standby_feedback(payload: &[u8]) -> Option<StandbyFeedback> {
    if payload.len() != 24 {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes(payload[i..i + 4].try_into().expect("4 bytes")) as u64;
    let full = |xid: u64, epoch: u64| if xid == 0 { 0 } else { (epoch << 32) | xid };
    Some(StandbyFeedback { xmin: full(u32_at(8), u32_at(12)), catalog_xmin: full(u32_at(16), u32_at(20)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;
    use strata_service::clock::ManualClock;

    #[test]
    fn the_oldest_live_feedback_of_open_connections() {
        let clock = ManualClock::new();
        let r = FeedbackRegistry::new(Arc::new(clock.clone()));
        assert_eq!(r.oldest(), StandbyFeedback::default());
        let a = r.slot();
        let b = r.slot();
        a.set(StandbyFeedback { xmin: 900, catalog_xmin: 0 });
        b.set(StandbyFeedback { xmin: 700, catalog_xmin: 650 });
        assert_eq!(r.oldest(), StandbyFeedback { xmin: 700, catalog_xmin: 650 });
        drop(b);
        assert_eq!(r.oldest(), StandbyFeedback { xmin: 900, catalog_xmin: 0 });
        // Zeros: the replica stopped asking.
        a.set(StandbyFeedback::default());
        assert_eq!(r.oldest(), StandbyFeedback::default());
    }

    #[test]
    fn feedback_not_renewed_within_its_ttl_stops_counting() {
        let clock = ManualClock::new();
        let r = FeedbackRegistry::new(Arc::new(clock.clone()));
        let (a, b) = (r.slot(), r.slot());
        a.set(StandbyFeedback { xmin: 5, catalog_xmin: 0 });
        clock.advance(FEEDBACK_TTL / 2);
        b.set(StandbyFeedback { xmin: 9, catalog_xmin: 0 });
        clock.advance(FEEDBACK_TTL / 2 - Duration::from_millis(1));
        assert_eq!(r.oldest().xmin, 5, "both are live");
        clock.advance(Duration::from_millis(1));
        assert_eq!(r.oldest().xmin, 9, "a's expired; b's is younger");
        // Renewed: it counts again.
        a.set(StandbyFeedback { xmin: 6, catalog_xmin: 0 });
        assert_eq!(r.oldest().xmin, 6);
        clock.advance(FEEDBACK_TTL);
        assert_eq!(r.oldest(), StandbyFeedback::default(), "nothing renewed");
    }

    #[test]
    fn parses_postgres_feedback() {
        let mut m = vec![0u8; 8];
        m.extend(731u32.to_be_bytes());
        m.extend(2u32.to_be_bytes());
        m.extend(0u32.to_be_bytes());
        m.extend(0u32.to_be_bytes());
        assert_eq!(parse_hot_standby_feedback(&m), Some(StandbyFeedback { xmin: (2 << 32) | 731, catalog_xmin: 0 }));
        assert_eq!(parse_hot_standby_feedback(&m[1..]), None);
    }
}
