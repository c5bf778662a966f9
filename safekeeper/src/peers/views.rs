//! Every peer's last answer: the positions of the timelines it holds, and
//! whether it is live.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_protocol::{NodeId, TenantId, TimelineId};

use crate::config::Peer;
pub use strata_protocol::api::safekeeper::TimelinePositions;

/// A peer that has not answered for this long is taken for dead.
pub const LIVE_FOR: Duration = Duration::from_secs(10);

/// The last answer of one peer.
struct PeerView {
    at: Instant,
    timelines: HashMap<(TenantId, TimelineId), TimelinePositions>,
}

/// Every peer's last answer, and when each peer was first asked.
#[derive(Default)]
pub struct PeerViews {
    views: Mutex<HashMap<NodeId, PeerView>>,
    first_asked: Mutex<HashMap<NodeId, Instant>>,
}

impl PeerViews {
    /// The positions of a timeline at every live peer that holds it.
    pub fn live(&self, tenant: TenantId, timeline: TimelineId) -> Vec<(NodeId, TimelinePositions)> {
        let views = self.views.lock();
        let mut out: Vec<_> = views
            .iter()
            .filter(|(_, v)| v.at.elapsed() < LIVE_FOR)
            .filter_map(|(id, v)| v.timelines.get(&(tenant, timeline)).map(|p| (*id, p.clone())))
            .collect();
        out.sort_by_key(|(id, _)| id.0);
        out
    }

    /// Keeps a peer's answer.
    pub(super) fn record(&self, peer: NodeId, answer: Vec<TimelinePositions>) {
        let timelines = answer.into_iter().map(|p| ((p.tenant_id, p.timeline_id), p)).collect();
        self.views.lock().insert(peer, PeerView { at: Instant::now(), timelines });
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
            .all(|p| views.contains_key(&p.id) || first.get(&p.id).is_some_and(|t| t.elapsed() >= LIVE_FOR))
    }

    /// Notes that `peer` was asked (its first time starts the settling wait).
    pub(super) fn note_asked(&self, peer: NodeId) {
        self.first_asked.lock().entry(peer).or_insert_with(Instant::now);
    }
}
