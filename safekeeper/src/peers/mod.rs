//! What this safekeeper knows of its peers: each peer with an HTTP address
//! is polled every second for the positions of its timelines
//! (`GET /v1/positions`). A peer that answered within
//! [`LIVE_FOR`](crate::limits::LIVE_FOR) is live;
//! the choice of the offloader (`offload`) is made among live members only,
//! so when the offloader dies another takes over after at most that long.
//!
//! The poller is given what it needs ([`Polling`]) rather than the
//! safekeeper's shared state, which holds the views it fills.

use std::sync::Arc;

use strata_service::api_client::ApiClient;
use strata_service::auth::Token;
use strata_service::clock::Clock;
use strata_service::tls::ClientTls;
use tracing::debug;

use crate::config::Peer;
use crate::limits::{PEER_MAX_ANSWER, PEER_POLL, PEER_TIMEOUT};
use crate::timelines::Timelines;

mod views;
pub use views::{PeerViews, TimelinePositions};

/// What polling the peers needs.
pub struct Polling {
    /// The other safekeepers; those with an HTTP address are polled.
    pub peers: Vec<Peer>,
    /// Where their answers are kept.
    pub views: Arc<PeerViews>,
    /// This safekeeper's timelines: one a peer reports sealed is sealed here.
    pub timelines: Arc<Timelines>,
    /// Trust for peers over TLS; none: they are plaintext.
    pub tls: Option<ClientTls>,
    /// This safekeeper's own token, sent to its peers (never logged).
    pub token: Option<Token>,
    /// Times the polls.
    pub clock: Arc<dyn Clock>,
}

/// Seals here every timeline a peer reports sealed (`docs/sites.md`): a
/// site that comes back after a failover stops taking its old writer's WAL
/// as soon as it hears from the other site, before any operator acts.
fn adopt_seals(timelines: &Timelines, peer: strata_protocol::NodeId, positions: &[TimelinePositions]) {
    for p in positions.iter().filter(|p| p.sealed) {
        let Some(tl) = timelines.get(p.tenant_id, p.timeline_id) else { continue };
        if tl.is_sealed() {
            continue;
        }
        match tokio::task::block_in_place(|| tl.seal()) {
            Ok(_) => {
                tracing::info!(%peer, tenant = %p.tenant_id, timeline = %p.timeline_id, "sealed as peer {peer} reports")
            }
            Err(e) => {
                tracing::warn!(%peer, tenant = %p.tenant_id, timeline = %p.timeline_id, "sealing as a peer reports: {e}")
            }
        }
    }
}

/// Polls every peer that has an HTTP address, forever.
pub async fn run(polling: Polling) {
    let polling = Arc::new(polling);
    let mut tasks = tokio::task::JoinSet::new();
    for peer in polling.peers.iter().filter(|p| p.http.is_some()).cloned() {
        tasks.spawn(poll(polling.clone(), peer));
    }
    while tasks.join_next().await.is_some() {}
}

async fn poll(polling: Arc<Polling>, peer: Peer) {
    // Peers are configured alike: TLS here means TLS there.
    let client =
        ApiClient::new(polling.tls.as_ref(), polling.token.clone(), PEER_TIMEOUT).with_max_answer(PEER_MAX_ANSWER);
    let url = client.url(peer.http.as_deref().expect("filtered on"), "/v1/positions");
    loop {
        polling.clock.sleep(PEER_POLL).await;
        let (client, url2) = (client.clone(), url.clone());
        let answer = tokio::task::spawn_blocking(move || -> Result<Vec<TimelinePositions>, String> {
            client.get(&url2).map_err(|e| e.to_string())
        })
        .await;
        if let Ok(Ok(positions)) = &answer {
            adopt_seals(&polling.timelines, peer.id, positions);
            polling.views.record(peer.id, positions.clone());
        }
        polling.views.note_asked(peer.id);
        match answer {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => debug!(peer = %peer.id, %url, "asking a peer for its positions: {e}"),
            Err(e) => debug!(peer = %peer.id, "asking a peer for its positions: {e}"),
        }
    }
}
