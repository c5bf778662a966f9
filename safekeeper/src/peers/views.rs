//! Every peer's last answer: the positions of the timelines it holds, and
//! whether it is live.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_service::clock::Clock;

use crate::config::Peer;
use crate::limits::LIVE_FOR;
pub use strata_protocol::api::safekeeper::TimelinePositions;

/// The last answer of one peer.
struct PeerView {
    at: Instant,
    timelines: HashMap<(TenantId, TimelineId), TimelinePositions>,
}

/// Every peer's last answer, and when each peer was first asked.
pub struct PeerViews {
    views: Mutex<HashMap<NodeId, PeerView>>,
    first_asked: Mutex<HashMap<NodeId, Instant>>,
    /// Dates the answers and judges their age.
    clock: Arc<dyn Clock>,
}

impl PeerViews {
    /// No answer yet; answers are dated and aged on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> PeerViews {
        PeerViews { views: Mutex::default(), first_asked: Mutex::default(), clock }
    }

    /// The positions of a timeline at every live peer that holds it.
    pub fn live(&self, tenant: TenantId, timeline: TimelineId) -> Vec<(NodeId, TimelinePositions)> {
        let views = self.views.lock();
        let mut out: Vec<_> = views
            .iter()
            .filter(|(_, v)| self.clock.since(v.at) < LIVE_FOR)
            .filter_map(|(id, v)| v.timelines.get(&(tenant, timeline)).map(|p| (*id, p.clone())))
            .collect();
        out.sort_by_key(|(id, _)| id.0);
        out
    }

    /// Keeps a peer's answer.
    pub(super) fn record(&self, peer: NodeId, answer: Vec<TimelinePositions>) {
        let timelines = answer.into_iter().map(|p| ((p.tenant_id, p.timeline_id), p)).collect();
        self.views.lock().insert(peer, PeerView { at: self.clock.now(), timelines });
    }

    /// Whether the view of every one of `peers` is settled: it answered
    /// once, or has been asked for [`LIVE_FOR`] without answering. Before
    /// that a live peer may look dead (it may be starting, like this one).
    pub fn settled(&self, peers: &[Peer]) -> bool {
        let views = self.views.lock();
        let first = self.first_asked.lock();
        peers
            .iter()
            .filter(|p| p.http.is_some())
            .all(|p| views.contains_key(&p.id) || first.get(&p.id).is_some_and(|t| self.clock.since(*t) >= LIVE_FOR))
    }

    /// Notes that `peer` was asked (its first time starts the settling wait).
    pub(super) fn note_asked(&self, peer: NodeId) {
        let now = self.clock.now();
        self.first_asked.lock().entry(peer).or_insert(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use strata_formats::Lsn;
    use strata_service::clock::ManualClock;

    fn positions(tenant: TenantId, timeline: TimelineId) -> TimelinePositions {
        TimelinePositions {
            tenant_id: tenant,
            timeline_id: timeline,
            flush_lsn: Lsn(8),
            commit_lsn: Lsn(8),
            offloaded_lsn: Lsn(0),
            remote_consistent_lsn: Lsn(0),
            removed_before: Lsn(0),
            sealed: false,
        }
    }

    #[test]
    fn a_peer_goes_stale_without_heartbeats_and_is_live_again_after_one() {
        let clock = ManualClock::new();
        let views = PeerViews::new(Arc::new(clock.clone()));
        let (tenant, timeline) = (TenantId([1; 16]), TimelineId([2; 16]));
        let peer = NodeId(2);
        views.record(peer, vec![positions(tenant, timeline)]);
        assert_eq!(views.live(tenant, timeline).len(), 1);
        clock.advance(LIVE_FOR - Duration::from_millis(1));
        assert_eq!(views.live(tenant, timeline).len(), 1, "answered within LIVE_FOR");
        clock.advance(Duration::from_millis(1));
        assert!(views.live(tenant, timeline).is_empty(), "silent for LIVE_FOR: taken for dead");
        views.record(peer, vec![positions(tenant, timeline)]);
        assert_eq!(views.live(tenant, timeline), vec![(peer, positions(tenant, timeline))], "live again");
    }

    #[test]
    fn a_silent_peer_settles_once_asked_for_live_for() {
        let clock = ManualClock::new();
        let views = PeerViews::new(Arc::new(clock.clone()));
        let peers = [Peer { id: NodeId(2), address: "b:1".into(), http: Some("b:2".into()) }];
        assert!(!views.settled(&peers), "never asked");
        views.note_asked(NodeId(2));
        clock.advance(LIVE_FOR / 2);
        views.note_asked(NodeId(2));
        assert!(!views.settled(&peers), "asked, not long enough");
        clock.advance(LIVE_FOR / 2);
        assert!(views.settled(&peers), "silent since it was first asked, LIVE_FOR ago");
    }
}
