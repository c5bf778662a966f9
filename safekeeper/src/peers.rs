//! What this safekeeper knows of its peers: each peer with an HTTP address
//! is polled every second for the positions of its timelines
//! (`GET /v1/positions`). A peer that answered within [`LIVE_FOR`] is live;
//! the choice of the offloader (`offload`) is made among live members only,
//! so when the offloader dies another takes over after at most that long.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::{NodeId, TenantId, TimelineId};
use tracing::debug;

use crate::config::Peer;
use crate::server::Shared;

/// How often each peer is asked.
const POLL: Duration = Duration::from_secs(1);
/// Longest wait for one answer.
const TIMEOUT: Duration = Duration::from_secs(3);
/// A peer that has not answered for this long is taken for dead.
pub const LIVE_FOR: Duration = Duration::from_secs(10);
/// Largest answer read (about 200 bytes per timeline).
const MAX_ANSWER: u64 = 64 << 20;

/// One timeline's positions as a safekeeper reports them to its peers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TimelinePositions {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
    /// End of the WAL this safekeeper knows to be in object storage.
    pub offloaded_lsn: Lsn,
    /// The highest `remote_consistent_lsn` the pageserver reported to it
    /// (the pageserver streams from one safekeeper; the others learn it here).
    #[serde(default)]
    pub remote_consistent_lsn: Lsn,
    /// Where its local WAL begins (it removed what lies before).
    #[serde(default)]
    pub removed_before: Lsn,
}

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

    fn record(&self, peer: NodeId, answer: Vec<TimelinePositions>) {
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
}

/// Polls every peer that has an HTTP address, forever.
pub async fn run(shared: Arc<Shared>) {
    let mut tasks = tokio::task::JoinSet::new();
    for peer in shared.config.peers.iter().filter(|p| p.http.is_some()).cloned() {
        tasks.spawn(poll(shared.clone(), peer));
    }
    while tasks.join_next().await.is_some() {}
}

async fn poll(shared: Arc<Shared>, peer: Peer) {
    let url = format!("http://{}/v1/positions", peer.http.as_deref().expect("filtered on"));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(true)
        // Peers are addressed directly: a proxy from the environment must not be used.
        .proxy(None)
        .build()
        .into();
    loop {
        tokio::time::sleep(POLL).await;
        let (agent, url2) = (agent.clone(), url.clone());
        let answer = tokio::task::spawn_blocking(move || -> Result<Vec<TimelinePositions>, String> {
            let mut r = agent.get(&url2).call().map_err(|e| e.to_string())?;
            let text = r.body_mut().with_config().limit(MAX_ANSWER).read_to_string().map_err(|e| e.to_string())?;
            serde_json::from_str(&text).map_err(|e| format!("malformed answer: {e}"))
        })
        .await;
        if let Ok(Ok(positions)) = &answer {
            shared.peers.record(peer.id, positions.clone());
        }
        shared.peers.first_asked.lock().entry(peer.id).or_insert_with(Instant::now);
        match answer {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => debug!(peer = %peer.id, %url, "asking a peer for its positions: {e}"),
            Err(e) => debug!(peer = %peer.id, "asking a peer for its positions: {e}"),
        }
    }
}
