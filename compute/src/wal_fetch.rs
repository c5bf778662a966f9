//! Fetching WAL from one safekeeper over the consumer protocol — used by the
//! proposer to get the donor's WAL that lagging acceptors lack.

use std::time::Duration;

use strata_formats::Lsn;

use crate::limits::MAX_WAL_FETCH_BYTES;
use strata_protocol::framed::{self, FrameError, FrameReader};
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::{ConsumerMessage, StartStreaming, StreamMessage, StreamStart, PROTOCOL_VERSION};
use strata_protocol::{TenantId, TimelineId, Token};
use strata_service::clock::{timeout, Clock};
use strata_service::tls::{ClientTls, Stream};

/// A safekeeper to read a timeline's WAL from, and how to reach it.
pub struct Donor<'a> {
    pub address: &'a str,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// Bound on every network wait.
    pub timeout: Duration,
    pub token: &'a Option<Token>,
    pub tls: Option<&'a ClientTls>,
    /// What the connection's timeout is measured on.
    pub clock: &'a dyn Clock,
}

/// Reads `[from, to)` of the donor's timeline's WAL (including uncommitted WAL).
pub async fn fetch_wal(donor: &Donor<'_>, from: Lsn, to: Lsn) -> Result<(StreamStart, Vec<u8>), String> {
    let (address, limit, tls) = (donor.address, donor.timeout, donor.tls);
    let len = to.0.checked_sub(from.0).ok_or("empty range")? as usize;
    if len > MAX_WAL_FETCH_BYTES {
        return Err(format!(
            "{len} bytes of WAL to fetch; more than the proposer buffers ({MAX_WAL_FETCH_BYTES} bytes)"
        ));
    }
    let mut s = timeout(donor.clock, limit, Stream::connect(address, tls))
        .await
        .map_err(|_| format!("{address}: connect timed out"))?
        .map_err(|e| format!("{address}: {e}"))?;
    let mut out = Vec::new();
    codec::encode_consumer(
        &ConsumerMessage::Start(StartStreaming {
            protocol_version: PROTOCOL_VERSION,
            tenant_id: donor.tenant_id,
            timeline_id: donor.timeline_id,
            start_lsn: from,
            stop_lsn: to,
            include_uncommitted: true,
            consumer_id: "proposer-recovery".into(),
            token: donor.token.clone(),
            // Not a pageserver: never fenced.
            generation: 0,
            shard: strata_protocol::shard::ShardIndex::UNSHARDED,
            format: strata_protocol::decoded_wal::StreamFormat::Raw,
            stripe_blocks: strata_protocol::shard::DEFAULT_STRIPE_BLOCKS,
        }),
        &mut out,
    );
    framed::write_all(&mut s, &out, limit).await.map_err(|e| format!("{address}: {e}"))?;
    let mut frames = FrameReader::new(s, codec::MAX_FRAME_SIZE);
    let mut wal = Vec::with_capacity(len);
    let mut start = None;
    while wal.len() < len {
        let frame = frames.read_frame(limit).await.map_err(|e| match e {
            FrameError::Timeout(_) => format!("{address}: no WAL for {limit:?}"),
            FrameError::Closed => format!("{address}: closed after {} of {len} bytes", wal.len()),
            e => format!("{address}: {e}"),
        })?;
        {
            let msg = codec::decode_stream(frame).map_err(|e| e.to_string())?;
            match msg {
                StreamMessage::Start(s) => start = Some(s),
                StreamMessage::Wal(w) => {
                    if w.begin_lsn.0 != from.0 + wal.len() as u64 {
                        return Err(format!("WAL at {} out of order", w.begin_lsn));
                    }
                    wal.extend_from_slice(&w.wal[..w.wal.len().min(len - wal.len())]);
                }
                StreamMessage::Keepalive { .. } => {}
                StreamMessage::Decoded(_) => return Err(format!("{address}: decoded WAL in a raw stream")),
                StreamMessage::Error(e) => return Err(format!("{address}: {:?}: {}", e.code, e.message)),
            }
        }
    }
    Ok((start.ok_or("no stream start")?, wal))
}
