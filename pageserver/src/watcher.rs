//! The watcher: one task per pageserver that keeps idle timelines
//! (`idle.rs`) from missing anything. It joins the threads of a timeline
//! that went idle, wakes one at once when a read waits for an LSN it has
//! not reached, and, while any timeline idles, reads every safekeeper's
//! positions of all timelines at once (`GET /v1/positions`) every
//! `idle_poll_period` to wake those a safekeeper has committed WAL for.
//!
//! One request per safekeeper and round, whatever the number of idle
//! timelines: an idle timeline costs no connection of its own. After a
//! round that joined threads, it returns the allocator's free memory to the
//! system (`heap_trim.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_protocol::api::safekeeper::TimelinePositions;
use strata_service::api_client::ApiClient;
use strata_service::auth::Token;
use strata_service::tls::ClientTls;
use tracing::debug;

use crate::heap_trim::HeapTrim;
use crate::limits::{POSITIONS_MAX_ANSWER, POSITIONS_TIMEOUT};
use crate::tenants::{Commits, Tenants};

/// What the watcher asks the safekeepers with.
pub struct Watcher {
    client: ApiClient,
    /// `GET /v1/positions` of each safekeeper.
    urls: Vec<String>,
    period: Duration,
}

impl Watcher {
    /// A watcher of the safekeepers at `addresses` (HTTP, `host:port`),
    /// asked every `period` with this pageserver's token.
    pub fn new(addresses: &[String], tls: Option<&ClientTls>, token: Option<Token>, period: Duration) -> Watcher {
        let client = ApiClient::new(tls, token, POSITIONS_TIMEOUT).with_max_answer(POSITIONS_MAX_ANSWER);
        let urls = addresses.iter().map(|a| client.url(a, "/v1/positions")).collect();
        Watcher { client, urls, period }
    }

    /// Watches forever (the pageserver aborts the task when it stops).
    pub async fn run(self, tenants: Arc<Tenants>) {
        let clock = tenants.resources.clock.clone();
        let me = Arc::new(self);
        let mut last_poll: Option<Instant> = None;
        let trim = Arc::new(parking_lot::Mutex::new(HeapTrim::new(clock.clone())));
        loop {
            tokio::select! {
                () = tenants.wakeups.notified() => {}
                () = clock.sleep(me.period) => {}
            }
            let poll_due = last_poll.is_none_or(|at| clock.since(at) >= me.period);
            let (t, w, trim) = (tenants.clone(), me.clone(), trim.clone());
            let polled = tokio::task::spawn_blocking(move || {
                // Reads first: they wait, and need no network.
                let mut reaped = t.tend_idle(None);
                let polled = poll_due && t.any_idle();
                if polled {
                    let commits = w.commits(&t);
                    reaped |= t.tend_idle(Some(&commits));
                }
                let mut trim = trim.lock();
                if reaped || t.take_trim_request() {
                    trim.request();
                }
                if trim.run_if_due() {
                    t.metrics.heap_trims.inc();
                }
                polled
            })
            .await;
            if matches!(polled, Ok(true)) {
                last_poll = Some(clock.now());
            }
        }
    }

    /// The highest commit LSN of each timeline among the safekeepers that
    /// answer (one that does not is counted and left out this round).
    fn commits(&self, tenants: &Tenants) -> Commits {
        let mut commits = Commits::new();
        for url in &self.urls {
            match self.client.get::<Vec<TimelinePositions>>(url) {
                Ok(positions) => merge(&mut commits, &positions),
                Err(e) => {
                    tenants.metrics.positions_errors.inc();
                    debug!(%url, "reading a safekeeper's positions: {e}");
                }
            }
        }
        commits
    }
}

/// Adds one safekeeper's positions to `commits`, keeping the highest.
fn merge(commits: &mut Commits, positions: &[TimelinePositions]) {
    for p in positions {
        let c = commits.entry((p.tenant_id, p.timeline_id)).or_insert(p.commit_lsn);
        *c = (*c).max(p.commit_lsn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::Lsn;
    use strata_protocol::{TenantId, TimelineId};

    fn at(tenant: TenantId, timeline: TimelineId, commit: u64) -> TimelinePositions {
        TimelinePositions {
            tenant_id: tenant,
            timeline_id: timeline,
            flush_lsn: Lsn(commit),
            commit_lsn: Lsn(commit),
            offloaded_lsn: Lsn(0),
            remote_consistent_lsn: Lsn(0),
            removed_before: Lsn(0),
            sealed: false,
        }
    }

    #[test]
    fn the_highest_commit_of_any_safekeeper_counts() {
        let (t, a, b) = (TenantId::generate(), TimelineId::generate(), TimelineId::generate());
        let mut commits = Commits::new();
        merge(&mut commits, &[at(t, a, 0x100), at(t, b, 0x300)]);
        merge(&mut commits, &[at(t, a, 0x200), at(t, b, 0x280)]);
        merge(&mut commits, &[]);
        assert_eq!(commits[&(t, a)], Lsn(0x200));
        assert_eq!(commits[&(t, b)], Lsn(0x300));
        assert_eq!(commits.len(), 2);
    }
}
