//! Brings failed timelines back: each is re-read from disk (see
//! `timeline`), retried with a growing, jittered delay while the cause
//! persists (a disk that still fails its fsyncs fails the reload too).
//!
//! A timeline that fails again soon after coming back (a disk that fills
//! up again as soon as the WAL is cut back) keeps its grown delay instead
//! of starting over, so it flaps ever more slowly instead of every second.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use strata_protocol::{TenantId, TimelineId};
use strata_service::backoff::Backoff;

use crate::limits::{HEALING_CHECK_INTERVAL, HEALING_MAX_DELAY, HEALING_MIN_DELAY, STABLE_AFTER};
use crate::shared::Shared;

/// What is known of one timeline that failed recently.
struct Episode {
    /// The timeline's failure count this entry has seen.
    failures: u64,
    next_try: Instant,
    backoff: Backoff,
    recovered_at: Option<Instant>,
}

/// Reloads failed timelines, forever.
pub async fn run(shared: Arc<Shared>) {
    let mut episodes: HashMap<(TenantId, TimelineId), Episode> = HashMap::new();
    let clock = &*shared.clock;
    loop {
        clock.sleep(HEALING_CHECK_INTERVAL).await;
        let now = clock.now();
        let mut failed = 0;
        for tl in shared.timelines.all() {
            let key = (tl.identity.tenant_id, tl.identity.timeline_id);
            if tl.failure().is_none() {
                if episodes.get(&key).is_some_and(|e| e.recovered_at.is_some_and(|t| clock.since(t) >= STABLE_AFTER)) {
                    episodes.remove(&key);
                }
                continue;
            }
            failed += 1;
            let count = tl.failure_count();
            let episode = episodes.entry(key).or_insert_with(|| Episode {
                failures: 0,
                next_try: now,
                backoff: Backoff::new(HEALING_MIN_DELAY, HEALING_MAX_DELAY),
                recovered_at: None,
            });
            if episode.failures != count {
                // A new failure: wait before the first re-read, longer each
                // time if it keeps failing soon after coming back.
                shared.metrics.timeline_failures.inc();
                episode.failures = count;
                episode.recovered_at = None;
                episode.next_try = now + episode.backoff.next_delay();
            }
            if now < episode.next_try {
                continue;
            }
            match tokio::task::block_in_place(|| tl.reload()) {
                Ok(()) => {
                    shared.metrics.timeline_reloads.inc();
                    failed -= 1;
                    episode.recovered_at = Some(clock.now());
                }
                Err(e) => {
                    let delay = episode.backoff.next_delay();
                    tracing::warn!(timeline = %tl.identity.timeline_id, "re-reading the timeline from disk failed: {e}; next try in {delay:?}");
                    episode.next_try = clock.now() + delay;
                }
            }
        }
        shared.metrics.timelines_failed.set(failed);
    }
}
