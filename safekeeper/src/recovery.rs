//! Peer recovery: a safekeeper that is far behind what its peers have
//! committed (it was down while WAL was written) fetches that committed WAL
//! from a peer instead of waiting for the proposer to resend it. Only
//! committed WAL is copied, so it is final whatever elections follow, and
//! only when the peer's term history continues ours.
//!
//! When the peer has removed part of what is missing (it was offloaded;
//! the peer reports where its WAL begins, see `peers`), that part comes
//! from object storage: the offloaded segments are committed WAL, checked
//! against their checksums, and the peer's term history (from its stream,
//! which then goes on from where its WAL begins) covers them as well.
//!
//! One worker per peer: it checks every timeline against that peer in turn,
//! so there is one attempt per peer at a time, different peers are used
//! concurrently, and a peer that hangs (every wait is bounded) holds up only
//! its own worker. A timeline is recovered by one worker at a time. After a
//! failure a worker waits a jittered, growing delay before trying its peer
//! again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_service::tls::Stream;
use tracing::{info, warn};

use strata_formats::Lsn;
use strata_protocol::framed::{self, FrameError, FrameReader};
use strata_protocol::safekeeper::codec::{self, CodecError};
use strata_protocol::safekeeper::{ConsumerMessage, StartStreaming, StreamMessage, TermHistory, PROTOCOL_VERSION};
use strata_protocol::{TenantId, TimelineId};
use strata_remote_storage::wal::fetch_segment;
use strata_remote_storage::RemoteStorage;
use strata_service::backoff::Backoff;
use strata_service::clock;

use crate::config::Peer;
use crate::limits::{
    NO_PROPOSER_AFTER, RECOVERY_CHECK_INTERVAL, RECOVERY_CONNECT_TIMEOUT, RECOVERY_FLUSH_BYTES, RECOVERY_MAX_BACKOFF,
    RECOVERY_MIN_BACKOFF, RECOVERY_THRESHOLD_BYTES,
};
use crate::shared::Shared;
use crate::timeline::{AcceptorCallError, Timeline};

/// Why a recovery attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("connecting: {0}")]
    Connect(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("malformed message: {0}")]
    Codec(#[from] CodecError),
    #[error("the peer refused: {0}")]
    Refused(String),
    #[error("the peer's stream is out of order: {0}")]
    Protocol(String),
    #[error("offloaded WAL: {0}")]
    Offloaded(String),
    #[error(transparent)]
    Local(#[from] AcceptorCallError),
}

/// Timelines being recovered right now (by any worker).
#[derive(Default)]
struct InRecovery(Mutex<HashSet<(TenantId, TimelineId)>>);

/// Holds a timeline's place in `InRecovery` while it is recovered.
struct Claim<'a> {
    set: &'a InRecovery,
    key: (TenantId, TimelineId),
}

impl InRecovery {
    fn claim(&self, tl: &Timeline) -> Option<Claim<'_>> {
        let key = (tl.identity.tenant_id, tl.identity.timeline_id);
        let claimed = self.0.lock().insert(key);
        // (Not `then_some`: a claim built and dropped for `false` would
        // release the other worker's claim.)
        if claimed {
            Some(Claim { set: self, key })
        } else {
            None
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.set.0.lock().remove(&self.key);
    }
}

/// Runs one worker per peer, forever.
pub async fn run(shared: Arc<Shared>) {
    let in_recovery = Arc::new(InRecovery::default());
    let mut workers = tokio::task::JoinSet::new();
    for peer in shared.config.peers.iter().filter(|p| p.id != shared.config.id).cloned() {
        workers.spawn(worker(shared.clone(), peer, in_recovery.clone()));
    }
    while workers.join_next().await.is_some() {}
}

/// Checks every timeline against `peer`, recovering those far behind it.
async fn worker(shared: Arc<Shared>, peer: Peer, in_recovery: Arc<InRecovery>) {
    let mut backoff = Backoff::new(RECOVERY_MIN_BACKOFF, RECOVERY_MAX_BACKOFF);
    loop {
        shared.clock.sleep(RECOVERY_CHECK_INTERVAL).await;
        let mut failed = false;
        for timeline in shared.timelines.all() {
            if timeline.failure().is_some() {
                continue;
            }
            let Some(_claim) = in_recovery.claim(&timeline) else { continue };
            match recover_from(&shared, &timeline, &peer).await {
                Ok(Some(end)) => {
                    info!(timeline = %timeline.identity.timeline_id, peer = %peer.address, %end, "recovered WAL from peer")
                }
                Ok(None) => {}
                // The peer does not have this timeline (yet): not the peer's fault.
                Err(RecoveryError::Refused(e)) => {
                    tracing::debug!(timeline = %timeline.identity.timeline_id, peer = %peer.address, "peer recovery: {e}")
                }
                Err(e) => {
                    warn!(timeline = %timeline.identity.timeline_id, peer = %peer.address, "peer recovery: {e}");
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            shared.clock.sleep(backoff.next_delay()).await;
        } else {
            backoff.reset();
        }
    }
}

/// A stream of the peer's committed WAL of one timeline.
struct PeerStream {
    frames: FrameReader<Stream>,
    idle_timeout: Duration,
}

impl PeerStream {
    async fn open(
        address: &str,
        timeline: &Timeline,
        start: Lsn,
        me: String,
        shared: &Shared,
    ) -> Result<PeerStream, RecoveryError> {
        let connect = Stream::connect(address, shared.tls.as_ref());
        let mut s = clock::timeout(&*shared.clock, RECOVERY_CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| RecoveryError::Connect(format!("no connection within {RECOVERY_CONNECT_TIMEOUT:?}")))?
            .map_err(|e| RecoveryError::Connect(e.to_string()))?;
        let mut out = Vec::new();
        codec::encode_consumer(
            &ConsumerMessage::Start(StartStreaming {
                protocol_version: PROTOCOL_VERSION,
                tenant_id: timeline.identity.tenant_id,
                timeline_id: timeline.identity.timeline_id,
                start_lsn: start,
                stop_lsn: Lsn::INVALID,
                include_uncommitted: false,
                consumer_id: me,
                token: shared.token.clone(),
                // A peer, not a pageserver: never fenced.
                generation: 0,
                shard: strata_protocol::shard::ShardIndex::UNSHARDED,
                format: strata_protocol::decoded_wal::StreamFormat::Raw,
                stripe_blocks: strata_protocol::shard::DEFAULT_STRIPE_BLOCKS,
            }),
            &mut out,
        );
        framed::write_all(&mut s, &out, RECOVERY_CONNECT_TIMEOUT).await?;
        Ok(PeerStream { frames: FrameReader::new(s, codec::MAX_FRAME_SIZE), idle_timeout: shared.config.idle_timeout })
    }

    async fn next(&mut self, timeout: Duration) -> Result<StreamMessage, RecoveryError> {
        let msg = codec::decode_stream(self.frames.read_frame(timeout).await?)?;
        if let StreamMessage::Error(e) = msg {
            return Err(RecoveryError::Refused(format!("{:?}: {}", e.code, e.message)));
        }
        Ok(msg)
    }
}

/// Copies the peer's committed WAL beyond ours, if we are far enough behind.
async fn recover_from(shared: &Shared, timeline: &Arc<Timeline>, peer: &Peer) -> Result<Option<Lsn>, RecoveryError> {
    let address = peer.address.as_str();
    let mine = timeline.positions();
    let me = format!("peer-recovery-{}", shared.config.id);
    // Where the peer's WAL begins, as it last said: before it, object storage.
    let peer_from = shared
        .peers
        .live(timeline.identity.tenant_id, timeline.identity.timeline_id)
        .into_iter()
        .find(|(id, _)| *id == peer.id)
        .map_or(Lsn(0), |(_, p)| p.removed_before);
    let offloaded = shared.remote.as_ref().filter(|_| peer_from > mine.flush_lsn);
    let stream_from = if offloaded.is_some() { peer_from } else { mine.flush_lsn };
    let mut stream = PeerStream::open(address, timeline, stream_from, me, shared).await?;
    let (until, history): (Lsn, TermHistory) = match stream.next(RECOVERY_CONNECT_TIMEOUT).await? {
        StreamMessage::Start(start) => {
            if start.timeline != timeline.identity {
                return Err(RecoveryError::Protocol("the peer's timeline identity differs".into()));
            }
            // What the peer removed no proposer can send either: that is recovered however little.
            let unattended = timeline.since_last_append().is_none_or(|t| t > NO_PROPOSER_AFTER);
            let threshold = if unattended { 1 } else { RECOVERY_THRESHOLD_BYTES };
            if start.commit_lsn.0 < mine.flush_lsn.0 + threshold && offloaded.is_none() {
                return Ok(None);
            }
            info!(peer = %address, from = %mine.flush_lsn, to = %start.commit_lsn, "recovering WAL from peer");
            (start.commit_lsn, start.term_history)
        }
        other => return Err(RecoveryError::Protocol(format!("{other:?} before the stream start"))),
    };
    if let Some(storage) = offloaded {
        if stream_from > until {
            return Err(RecoveryError::Protocol(format!(
                "the peer's WAL begins at {stream_from}, past its commit {until}"
            )));
        }
        info!(peer = %address, from = %mine.flush_lsn, to = %stream_from, "recovering WAL the peer removed from object storage");
        recover_offloaded(shared, storage, timeline, mine.flush_lsn, stream_from, &history, until).await?;
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_start = stream_from;
    loop {
        let done = pending_start.0 + pending.len() as u64 >= until.0;
        if pending.len() >= RECOVERY_FLUSH_BYTES || (done && !pending.is_empty()) {
            let bytes = std::mem::take(&mut pending);
            let at = pending_start;
            tokio::task::block_in_place(|| timeline.with_acceptor(|a| a.recovery_append(&history, at, &bytes, until)))?;
            pending_start = Lsn(at.0 + bytes.len() as u64);
        }
        if done {
            return Ok(Some(pending_start));
        }
        match stream.next(stream.idle_timeout).await? {
            StreamMessage::Wal(w) => {
                if w.begin_lsn.0 != pending_start.0 + pending.len() as u64 {
                    return Err(RecoveryError::Protocol(format!("WAL at {} out of order", w.begin_lsn)));
                }
                let take = w.wal.len().min(until.0.saturating_sub(w.begin_lsn.0) as usize);
                pending.extend_from_slice(&w.wal[..take]);
            }
            StreamMessage::Keepalive { .. } => {}
            other => return Err(RecoveryError::Protocol(format!("unexpected {other:?}"))),
        }
    }
}

/// Appends the offloaded WAL `[from, to)`, segment by segment; `history`
/// and `until` are the peer's, which holds the WAL from `to` on.
async fn recover_offloaded(
    shared: &Shared,
    storage: &RemoteStorage,
    timeline: &Arc<Timeline>,
    from: Lsn,
    to: Lsn,
    history: &TermHistory,
    until: Lsn,
) -> Result<(), RecoveryError> {
    let (tenant, id) = (timeline.identity.tenant_id, timeline.identity.timeline_id);
    let segment_size = u64::from(timeline.identity.wal_segment_size);
    let mut at = from;
    while at < to {
        let segno = at.0 / segment_size;
        let fetched = fetch_segment(storage, tenant, id, segno, segment_size)
            .await
            .map_err(|e| RecoveryError::Offloaded(format!("segment {segno}: {e}")))?;
        let Some((_, bytes)) = fetched else {
            return Err(RecoveryError::Offloaded(format!(
                "segment {segno} is not in object storage, and the peer's WAL begins at {to}"
            )));
        };
        let begin = (at.0 - segno * segment_size) as usize;
        let end = (to.0 - segno * segment_size).min(segment_size) as usize;
        let chunk = &bytes[begin..end];
        tokio::task::block_in_place(|| timeline.with_acceptor(|a| a.recovery_append(history, at, chunk, until)))?;
        at = Lsn(at.0 + chunk.len() as u64);
        shared.metrics.segments_recovered_from_object_storage.inc();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_is_claimed_by_one_worker_at_a_time() {
        let dir = std::env::temp_dir().join(format!("strata-sk-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let identity = strata_protocol::safekeeper::TimelineIdentity {
            tenant_id: TenantId([1; 16]),
            timeline_id: TimelineId([2; 16]),
            system_id: 1,
            pg_version: 15,
            wal_segment_size: 1 << 20,
        };
        let clock = Arc::new(strata_service::clock::ManualClock::new());
        let tl = Timeline::create(&dir, strata_protocol::NodeId(1), &identity, Lsn(1 << 20), true, clock).unwrap();
        let set = InRecovery::default();
        let first = set.claim(&tl).expect("free");
        assert!(set.claim(&tl).is_none(), "claimed already");
        assert!(set.claim(&tl).is_none(), "a refused claim does not release the first");
        drop(first);
        assert!(set.claim(&tl).is_some(), "released");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
