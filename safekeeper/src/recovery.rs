//! Peer recovery: a safekeeper that is far behind what its peers have
//! committed (it was down while WAL was written) fetches that committed WAL
//! from a peer instead of waiting for the proposer to resend it. Only
//! committed WAL is copied, so it is final whatever elections follow, and
//! only when the peer's term history continues ours.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{info, warn};

use strata_formats::Lsn;
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::{ConsumerMessage, StartStreaming, StreamMessage, PROTOCOL_VERSION};

use crate::server::Shared;
use crate::timeline::Timeline;

/// How far behind a peer's commit LSN a timeline must be before recovery
/// starts; below it the proposer's own stream catches the safekeeper up.
pub const RECOVERY_THRESHOLD_BYTES: u64 = 8 << 20;
/// How often timelines are checked.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes written per flush during recovery.
const FLUSH_EVERY: usize = 16 << 20;

/// Checks every timeline against every peer, forever.
pub async fn run(shared: Arc<Shared>) {
    if shared.config.peers.is_empty() {
        return;
    }
    loop {
        tokio::time::sleep(CHECK_INTERVAL).await;
        for timeline in shared.timelines.all() {
            for peer in &shared.config.peers {
                if peer.id == shared.config.id {
                    continue;
                }
                match recover_from(&shared, &timeline, &peer.address).await {
                    Ok(Some(end)) => {
                        info!(timeline = %timeline.identity.timeline_id, peer = %peer.address, %end, "recovered WAL from peer");
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        warn!(timeline = %timeline.identity.timeline_id, peer = %peer.address, "peer recovery: {e}")
                    }
                }
            }
        }
    }
}

/// Copies the peer's committed WAL beyond ours, if we are far enough behind.
async fn recover_from(shared: &Shared, timeline: &Arc<Timeline>, address: &str) -> Result<Option<Lsn>, String> {
    let timeout = shared.config.idle_timeout;
    let mine = timeline.positions();
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(address))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    codec::encode_consumer(
        &ConsumerMessage::Start(StartStreaming {
            protocol_version: PROTOCOL_VERSION,
            tenant_id: timeline.identity.tenant_id,
            timeline_id: timeline.identity.timeline_id,
            start_lsn: mine.flush_lsn,
            stop_lsn: Lsn::INVALID,
            include_uncommitted: false,
            consumer_id: format!("peer-recovery-{}", shared.config.id),
        }),
        &mut out,
    );
    s.write_all(&out).await.map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let mut target: Option<(Lsn, strata_protocol::safekeeper::TermHistory)> = None;
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_start = mine.flush_lsn;
    let mut applied = mine.flush_lsn;
    loop {
        while let Some((n, frame)) = codec::split_frame(&buf).map_err(|e| e.to_string())? {
            let msg = codec::decode_stream(frame).map_err(|e| e.to_string())?;
            buf.drain(..n);
            match msg {
                StreamMessage::Start(start) => {
                    if start.timeline != timeline.identity {
                        return Err("peer's timeline identity differs".into());
                    }
                    if start.commit_lsn.0 < mine.flush_lsn.0 + RECOVERY_THRESHOLD_BYTES {
                        return Ok(None);
                    }
                    info!(peer = %address, from = %mine.flush_lsn, to = %start.commit_lsn, "recovering WAL from peer");
                    target = Some((start.commit_lsn, start.term_history));
                }
                StreamMessage::Wal(w) => {
                    let Some((until, _)) = &target else { return Err("WAL before stream start".into()) };
                    if w.begin_lsn.0 != pending_start.0 + pending.len() as u64 {
                        return Err(format!("peer sent WAL at {} out of order", w.begin_lsn));
                    }
                    let take = w.wal.len().min(until.0.saturating_sub(w.begin_lsn.0) as usize);
                    pending.extend_from_slice(&w.wal[..take]);
                }
                StreamMessage::Keepalive { .. } => {}
                StreamMessage::Error(e) => return Err(format!("{:?}: {}", e.code, e.message)),
            }
        }
        let Some((until, history)) = &target else {
            let n = tokio::time::timeout(timeout, s.read(&mut chunk)).await.map_err(|_| "no answer".to_string())?;
            let n = n.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("peer closed the stream".into());
            }
            buf.extend_from_slice(&chunk[..n]);
            continue;
        };
        let done = pending_start.0 + pending.len() as u64 >= until.0;
        if pending.len() >= FLUSH_EVERY || (done && !pending.is_empty()) {
            let (history, commit) = (history.clone(), *until);
            let bytes = std::mem::take(&mut pending);
            let at = pending_start;
            tokio::task::block_in_place(|| timeline.with_acceptor(|a| a.recovery_append(&history, at, &bytes, commit)))
                .map_err(|e| e.to_string())?;
            pending_start = Lsn(at.0 + bytes.len() as u64);
            applied = pending_start;
        }
        if done {
            return Ok(Some(applied));
        }
        let n = tokio::time::timeout(timeout, s.read(&mut chunk)).await.map_err(|_| "peer stalled".to_string())?;
        let n = n.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("peer closed the stream".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
