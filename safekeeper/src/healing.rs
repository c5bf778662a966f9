//! Brings failed timelines back: each is re-read from disk (see
//! `timeline`), retried with a growing, jittered delay while the cause
//! persists (a disk that still fails its fsyncs fails the reload too).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_protocol::{TenantId, TimelineId};
use strata_service::backoff::Backoff;

use crate::server::Shared;

const CHECK_INTERVAL: Duration = Duration::from_millis(500);
const MIN_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(60);

/// Reloads failed timelines, forever.
pub async fn run(shared: Arc<Shared>) {
    // When each failed timeline is tried next, and its backoff.
    let mut schedule: HashMap<(TenantId, TimelineId), (Instant, Backoff)> = HashMap::new();
    loop {
        tokio::time::sleep(CHECK_INTERVAL).await;
        let mut failed = 0;
        for tl in shared.timelines.all() {
            let key = (tl.identity.tenant_id, tl.identity.timeline_id);
            if tl.failure().is_none() {
                schedule.remove(&key);
                continue;
            }
            failed += 1;
            let (next, backoff) = schedule.entry(key).or_insert_with(|| {
                shared.metrics.timeline_failures.inc();
                (Instant::now() + MIN_DELAY, Backoff::new(MIN_DELAY, MAX_DELAY))
            });
            if Instant::now() < *next {
                continue;
            }
            match tokio::task::block_in_place(|| tl.reload()) {
                Ok(()) => {
                    shared.metrics.timeline_reloads.inc();
                    failed -= 1;
                    schedule.remove(&key);
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(timeline = %tl.identity.timeline_id, "re-reading the timeline from disk failed: {e}; next try in {delay:?}");
                    *next = Instant::now() + delay;
                }
            }
        }
        shared.metrics.timelines_failed.set(failed);
    }
}
