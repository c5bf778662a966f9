//! The safekeeper protocol server: proposer connections (votes, elections,
//! WAL appends with group commit) and consumer connections (WAL streaming).

use std::sync::Arc;
use std::time::Instant;

use std::sync::atomic::Ordering;

use strata_protocol::framed;
use strata_protocol::Token;
use strata_service::auth::Access;
use strata_service::clock::Clock;
use strata_service::Listener;
use tracing::{info, warn};

use strata_formats::Lsn;
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::{
    AcceptorMessage, ConsumerMessage, ErrorCode, ErrorMessage, ProposerMessage, StartStreaming, StreamMessage,
    StreamStart, WalData, PROTOCOL_VERSION,
};

use strata_protocol::decoded_wal::StreamFormat;
use strata_protocol::shard::ShardLayout;

use crate::acceptor::AcceptorError;
use crate::connection::{Connection, ConnectionError, Frames, Writer};
use crate::decoded_stream::{DecodedStream, DecodedStreamError};
use crate::fence::StreamFence;
use crate::limits::{
    CONSUMER_GATHER_BYTES, CONSUMER_GATHER_DELAY, CONSUMER_KEEPALIVE, IDLE_STREAM_BUFFER, RECENT_WAL_BYTES,
    SEND_TIMEOUT,
};
use crate::shared::Shared;
use crate::timeline::{AcceptorCallError, ConsumerStatus, Timeline};
use crate::wal_reader::WalReader;

/// The answer to a connection refused because the listener is full: an
/// error of the kind its first frame expects (consumer or proposer).
pub fn refusal(first_bytes: &[u8]) -> Vec<u8> {
    let msg = ErrorMessage {
        code: ErrorCode::Overloaded,
        message: "too many connections to this safekeeper; retry later".into(),
    };
    let mut out = Vec::new();
    match first_bytes.get(codec::LENGTH_SIZE) {
        Some(0x10..=0x1F) => codec::encode_stream(&StreamMessage::Error(msg), &mut out),
        _ => codec::encode_acceptor(&AcceptorMessage::Error(msg), &mut out),
    }
    out
}

/// Serves proposers, consumers and peers on `listener` forever.
pub async fn serve(listener: Listener, shared: Arc<Shared>) {
    listener
        .serve(move |conn| {
            let shared = shared.clone();
            async move {
                let peer = conn.peer;
                if let Err(e) = handle(conn, shared).await {
                    if e.is_closed() {
                        info!(%peer, "connection closed");
                    } else {
                        warn!(%peer, "connection ended: {e}");
                    }
                }
            }
        })
        .await
}

/// What a connection's first frame asks for.
enum First {
    Proposer(Result<ProposerMessage, codec::CodecError>),
    Consumer(Result<ConsumerMessage, codec::CodecError>),
    Unknown,
}

async fn handle(accepted: strata_service::Connection, shared: Arc<Shared>) -> Result<(), ConnectionError> {
    let (stream, slot) = accepted.secure().await.map_err(ConnectionError::Tls)?;
    let mut conn = Connection::new(stream);
    let limit = shared.config.handshake_timeout;
    let frame = match tokio::time::timeout_at(slot.handshake_deadline(), conn.read_frame(limit)).await {
        Err(_) => return Err(ConnectionError::Handshake(limit)),
        Ok(frame) => frame?,
    };
    let first = match frame.first() {
        Some(0x01..=0x0F) => First::Proposer(codec::decode_proposer(frame)),
        Some(0x10..=0x1F) => First::Consumer(codec::decode_consumer(frame)),
        _ => First::Unknown,
    };
    // A token is checked before anything else is looked at, and before the
    // connection holds an established place.
    match first {
        First::Proposer(msg) => {
            if let Ok(ProposerMessage::Greeting(g)) = &msg {
                let need = Access::Propose(g.timeline.tenant_id, g.timeline.timeline_id);
                if let Err(refusal) = check_token(&shared, "proposer", &g.token, need) {
                    codec::encode_acceptor(&AcceptorMessage::Error(refusal), conn.out());
                    return conn.flush(SEND_TIMEOUT).await;
                }
                slot.established();
            }
            proposer(conn, msg, shared).await
        }
        First::Consumer(msg) => {
            if let Ok(ConsumerMessage::Start(s)) = &msg {
                if let Err(refusal) =
                    check_token(&shared, "stream", &s.token, Access::Timeline(s.tenant_id, s.timeline_id))
                {
                    codec::encode_stream(&StreamMessage::Error(refusal), conn.out());
                    return conn.flush(SEND_TIMEOUT).await;
                }
                slot.established();
            }
            let id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
            consumer(conn, msg, shared, id).await
        }
        First::Unknown => {
            shared.metrics.protocol_errors.inc();
            let msg =
                ErrorMessage { code: ErrorCode::Protocol, message: "expected a greeting or a stream request".into() };
            codec::encode_acceptor(&AcceptorMessage::Error(msg), conn.out());
            conn.flush(SEND_TIMEOUT).await
        }
    }
}

/// Whether `token` allows a greeting (proposing on its timeline) or a
/// stream request (reading its timeline): `need` (always, without a
/// verifier); a refusal is counted under `interface`.
fn check_token(
    shared: &Shared,
    interface: &'static str,
    token: &Option<Token>,
    need: Access,
) -> Result<(), ErrorMessage> {
    let Some(verifier) = &shared.verifier else { return Ok(()) };
    let action = format!("{interface} {need}");
    verifier.check_for(interface, &action, &strata_protocol::token::wire(token), need).map(drop).map_err(|refusal| {
        shared.metrics.refusal_metrics().count(interface, &refusal);
        warn!(?need, reason = refusal.reason(), "refused a {interface} connection");
        let code = if refusal.unauthenticated() { ErrorCode::Unauthorized } else { ErrorCode::Forbidden };
        ErrorMessage { code, message: refusal.to_string() }
    })
}

/// Sends an error to a proposer and ends the connection.
async fn refuse(conn: &mut Connection, shared: &Shared, err: &AcceptorCallError) -> Result<(), ConnectionError> {
    codec::encode_acceptor(&crate::proposer_session::refusal_message(shared, err), conn.out());
    conn.flush(SEND_TIMEOUT).await
}

/// A refusal for a message that did not decode or came out of order.
fn protocol_error(message: String) -> AcceptorCallError {
    AcceptorCallError::Refused(AcceptorError::Protocol(message))
}

async fn proposer(
    mut conn: Connection,
    first: Result<ProposerMessage, codec::CodecError>,
    shared: Arc<Shared>,
) -> Result<(), ConnectionError> {
    let greeting = match first {
        Ok(ProposerMessage::Greeting(g)) => g,
        Ok(_) => {
            return refuse(&mut conn, &shared, &protocol_error("the first message must be a greeting".into())).await
        }
        Err(codec::CodecError::UnsupportedVersion { version, .. }) => {
            return refuse(&mut conn, &shared, &AcceptorCallError::Refused(AcceptorError::Version(version))).await
        }
        Err(e) => return refuse(&mut conn, &shared, &protocol_error(e.to_string())).await,
    };
    let Some(timeline) = shared.timelines.get(greeting.timeline.tenant_id, greeting.timeline.timeline_id) else {
        shared.metrics.protocol_errors.inc();
        let msg = ErrorMessage {
            code: ErrorCode::NotFound,
            message: format!("timeline {}/{} not found", greeting.timeline.tenant_id, greeting.timeline.timeline_id),
        };
        codec::encode_acceptor(&AcceptorMessage::Error(msg), conn.out());
        return conn.flush(SEND_TIMEOUT).await;
    };
    let span = tracing::info_span!("proposer", tenant = %greeting.timeline.tenant_id, timeline = %greeting.timeline.timeline_id);
    let _enter = span.enter();
    shared.metrics.proposer_connections.inc();
    let result = proposer_loop(conn, &shared, &timeline, ProposerMessage::Greeting(greeting)).await;
    shared.metrics.proposer_connections.dec();
    result
}

/// Hands the greeted connection to a thread of its own
/// ([`crate::proposer_session`]) and waits for it to end.
async fn proposer_loop(
    conn: Connection,
    shared: &Arc<Shared>,
    timeline: &Arc<Timeline>,
    greeting: ProposerMessage,
) -> Result<(), ConnectionError> {
    let io = |e: std::io::Error| ConnectionError::Frame(framed::FrameError::Io(e));
    let (frames, writer) = conn.into_split();
    let (reader, buffered) = frames.into_parts();
    // The session runs on a thread of its own with blocking I/O, in TLS
    // too: the connection's TLS state goes with it.
    let stream = strata_service::tls::BlockingStream::from_async(reader.unsplit(writer)).map_err(io)?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (shared, timeline) = (shared.clone(), timeline.clone());
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("proposer".into())
        .spawn(move || {
            let _enter = span.enter();
            let result = crate::proposer_session::serve(stream, buffered, &shared, &timeline, greeting, SEND_TIMEOUT);
            let _ = done_tx.send(result);
        })
        .map_err(io)?;
    // The thread always answers, unless it panicked.
    done_rx.await.unwrap_or_else(|_| Err(io(std::io::Error::other("the proposer's thread panicked"))))
}

async fn stream_error(w: &mut Writer, code: ErrorCode, message: String) -> Result<(), ConnectionError> {
    let mut out = Vec::new();
    codec::encode_stream(&StreamMessage::Error(ErrorMessage { code, message }), &mut out);
    Ok(framed::write_all(w, &out, SEND_TIMEOUT).await?)
}

async fn consumer(
    conn: Connection,
    first: Result<ConsumerMessage, codec::CodecError>,
    shared: Arc<Shared>,
    id: u64,
) -> Result<(), ConnectionError> {
    let (mut reader, mut w) = conn.into_split();
    let start: StartStreaming = match first {
        Ok(ConsumerMessage::Start(s)) => s,
        Ok(_) => {
            return stream_error(&mut w, ErrorCode::Protocol, "the first message must be a stream request".into()).await
        }
        Err(e @ codec::CodecError::UnsupportedVersion { .. }) => {
            return stream_error(&mut w, ErrorCode::Version, e.to_string()).await
        }
        Err(e) => return stream_error(&mut w, ErrorCode::Protocol, e.to_string()).await,
    };
    // Stream requests of versions 1 and 2 differ from 3 only in carrying no
    // token (only the proposer greetings changed otherwise), so consumers of
    // each are served; a safekeeper that checks tokens has refused them above.
    if !(codec::OLDEST_CONSUMER_VERSION..=PROTOCOL_VERSION).contains(&start.protocol_version) {
        let msg = format!("protocol version {} is not supported", start.protocol_version);
        return stream_error(&mut w, ErrorCode::Version, msg).await;
    }
    let Some(timeline) = shared.timelines.get(start.tenant_id, start.timeline_id) else {
        let msg = format!("timeline {}/{} not found", start.tenant_id, start.timeline_id);
        return stream_error(&mut w, ErrorCode::NotFound, msg).await;
    };
    let positions = timeline.positions();
    if start.start_lsn < timeline.start_lsn || start.start_lsn > positions.flush_lsn {
        let msg = format!(
            "start {} is outside the WAL held ({} to {})",
            start.start_lsn, timeline.start_lsn, positions.flush_lsn
        );
        return stream_error(&mut w, ErrorCode::NotFound, msg).await;
    }
    let held_from = timeline.progress.removed_before();
    if start.start_lsn < held_from {
        let msg =
            format!("start {} lies in WAL this safekeeper removed; it holds the WAL from {held_from}", start.start_lsn);
        return stream_error(&mut w, ErrorCode::WalRemoved, msg).await;
    }
    let decoded = match decoded_stream(&timeline, &start) {
        Ok(d) => d,
        Err(msg) => return stream_error(&mut w, ErrorCode::Protocol, msg).await,
    };
    let fence = match timeline.admit_consumer(start.shard, start.generation) {
        Ok(Ok(fence)) => fence,
        Ok(Err(stale)) => {
            shared.metrics.stale_consumers_refused.inc();
            warn!(consumer = %start.consumer_id, "{stale}; refused");
            return stream_error(&mut w, ErrorCode::StaleGeneration, stale.to_string()).await;
        }
        Err(e) => return stream_error(&mut w, ErrorCode::Storage, e.to_string()).await,
    };
    shared.metrics.consumer_connections.inc();
    timeline.consumers.lock().insert(
        id,
        ConsumerStatus {
            name: start.consumer_id.clone(),
            sent_lsn: start.start_lsn,
            applied_lsn: Lsn::INVALID,
            remote_consistent_lsn: Lsn::INVALID,
            generation: start.generation,
            fenced: false,
        },
    );
    let admitted = Admitted { fence, decoded };
    let result = consumer_loop(&mut reader, &mut w, &shared, &timeline, &start, id, admitted).await;
    timeline.consumers.lock().remove(&id);
    shared.metrics.consumer_connections.dec();
    result
}

/// What a consumer was admitted with: its generation's fence and, if it
/// asked for one, its decoded stream.
struct Admitted {
    fence: StreamFence,
    decoded: Option<DecodedStream>,
}

/// The decoded stream a request asks for, if it does: its shard and
/// layout checked, its cache shared with the other shards' streams.
fn decoded_stream(timeline: &Timeline, start: &StartStreaming) -> Result<Option<DecodedStream>, String> {
    if start.format != StreamFormat::Decoded {
        return Ok(None);
    }
    if start.include_uncommitted {
        // Only committed WAL is never truncated: chunks of it can be shared.
        return Err("a decoded stream carries committed WAL only".into());
    }
    let layout = ShardLayout::new(u32::from(start.shard.shards()), start.stripe_blocks)
        .map_err(|e| format!("decoded stream: {e}"))?;
    let cache = timeline.decoded_cache(layout)?;
    DecodedStream::new(cache, start.shard.number, start.start_lsn).map(Some).map_err(|e| e.to_string())
}

/// Sends the next decoded batch up to `limit`; false if the stream must
/// end (the consumer was told why).
async fn send_decoded(
    w: &mut Writer,
    out: &mut Vec<u8>,
    shared: &Shared,
    stream: &mut DecodedStream,
    wal: &mut WalReader,
    limit: Lsn,
    now: &crate::timeline::Positions,
) -> Result<bool, ConnectionError> {
    match stream.next_batch(wal, limit, now.commit_lsn, now.flush_lsn).await {
        Ok((batch, covered)) => {
            shared.metrics.decoded_wal_bytes.inc_by(covered);
            shared.metrics.decoded_sent_bytes.inc_by(batch.payload.len() as u64);
            shared.metrics.decoded_batches.inc();
            codec::encode_stream(&StreamMessage::Decoded(batch), out);
            Ok(true)
        }
        Err(DecodedStreamError::Io(e)) => Err(e.into()),
        Err(e @ DecodedStreamError::Undecodable { .. }) => {
            stream_error(w, ErrorCode::RecordTooLarge, e.to_string()).await?;
            Ok(false)
        }
    }
}

/// Sleeps on `clock` until `deadline`, or forever without one.
async fn sleep_until_deadline(clock: &dyn Clock, deadline: Option<Instant>) {
    match deadline {
        Some(d) => clock.sleep(d.saturating_duration_since(clock.now())).await,
        None => std::future::pending().await,
    }
}

async fn consumer_loop(
    reader: &mut Frames,
    w: &mut Writer,
    shared: &Shared,
    timeline: &Arc<Timeline>,
    start: &StartStreaming,
    id: u64,
    admitted: Admitted,
) -> Result<(), ConnectionError> {
    let Admitted { mut fence, mut decoded } = admitted;
    let mut positions = timeline.subscribe();
    let mut out = Vec::new();
    let now = *positions.borrow_and_update();
    let hello = StreamStart {
        term: now.term,
        term_history: timeline.held_history(),
        flush_lsn: now.flush_lsn,
        commit_lsn: now.commit_lsn,
        timeline: timeline.identity.clone(),
    };
    codec::encode_stream(&StreamMessage::Start(hello), &mut out);
    let segment_size = u64::from(timeline.identity.wal_segment_size);
    let mut sent = start.start_lsn;
    // No buffer lives across chunks: each chunk is read into the message
    // that carries it, so an idle stream holds no memory for its WAL.
    let max_chunk = shared.config.max_send_bytes;
    let mut wal = WalReader::new(&timeline.dir, segment_size, !start.include_uncommitted);
    let clock = &*shared.clock;
    let mut last_feedback = clock.now();
    // When the stream last carried anything: a keepalive is due CONSUMER_KEEPALIVE
    // after it, however often the consumer's feedback wakes this loop (a
    // timer restarted on every wake-up never fired while a consumer sent
    // feedback every second, and the consumer, hearing nothing, reconnected).
    let mut last_sent = clock.now();
    let grace = shared.config.stale_stream_grace;
    loop {
        let deadline = fence.deadline(grace);
        if fence.expired(grace) {
            shared.metrics.stale_streams_ended.inc();
            let msg = format!(
                "attachment generation {} of timeline {}/{}{} is stale: a pageserver has streamed it under generation {}",
                fence.generation(),
                start.tenant_id,
                start.timeline_id,
                crate::fence::shard_suffix(start.shard),
                fence.newest()
            );
            warn!(consumer = %start.consumer_id, "{msg}; stream ended");
            return stream_error(w, ErrorCode::StaleGeneration, msg).await;
        }
        if !out.is_empty() {
            framed::write_all(w, &out, SEND_TIMEOUT).await?;
            out.clear();
            last_sent = clock.now();
        }
        if out.capacity() > IDLE_STREAM_BUFFER {
            // A chunk of catch-up: its capacity is not kept for keepalives.
            out = Vec::new();
        }
        let now = *positions.borrow_and_update();
        let mut limit = if start.include_uncommitted { now.flush_lsn } else { now.commit_lsn };
        if start.stop_lsn != Lsn::INVALID {
            limit = limit.min(start.stop_lsn);
            if sent >= start.stop_lsn {
                return Ok(());
            }
        }
        if let (Some(stream), true) = (decoded.as_mut(), sent < limit) {
            if !send_decoded(w, &mut out, shared, stream, &mut wal, limit, &now).await? {
                return Ok(());
            }
            sent = stream.read_lsn();
            if let Some(c) = timeline.consumers.lock().get_mut(&id) {
                c.sent_lsn = sent;
            }
            continue;
        }
        if sent < limit {
            let n = ((limit.0 - sent.0) as usize).min(max_chunk);
            let mut chunk = vec![0u8; n];
            if now.flush_lsn.0 - sent.0 <= RECENT_WAL_BYTES {
                // Just written: in the page cache, a copy of a few kilobytes.
                wal.read(sent, &mut chunk)?;
            } else {
                tokio::task::block_in_place(|| wal.read(sent, &mut chunk))?;
            }
            codec::encode_stream(
                &StreamMessage::Wal(WalData {
                    begin_lsn: sent,
                    commit_lsn: now.commit_lsn,
                    flush_lsn: now.flush_lsn,
                    wal: chunk,
                }),
                &mut out,
            );
            shared.metrics.sent_bytes.inc_by(n as u64);
            sent = Lsn(sent.0 + n as u64);
            if let Some(c) = timeline.consumers.lock().get_mut(&id) {
                c.sent_lsn = sent;
            }
            continue;
        }
        tokio::select! {
            changed = positions.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let now = *positions.borrow();
                let limit = if start.include_uncommitted { now.flush_lsn } else { now.commit_lsn };
                if limit.0.saturating_sub(sent.0) < CONSUMER_GATHER_BYTES {
                    // Gathered: one message and one wake-up of the consumer for
                    // the appends and commits of the next moments.
                    clock.sleep(CONSUMER_GATHER_DELAY).await;
                }
            }
            frame = reader.read_frame(shared.config.idle_timeout) => {
                match codec::decode_consumer(frame?) {
                    Ok(ConsumerMessage::Feedback(f)) => {
                        last_feedback = clock.now();
                        if let Some(c) = timeline.consumers.lock().get_mut(&id) {
                            c.applied_lsn = f.applied_lsn;
                            c.remote_consistent_lsn = f.remote_consistent_lsn;
                        }
                        // A fenced pageserver's uploads may never become
                        // visible: WAL removal must not trust them.
                        if !fence.is_fenced() {
                            timeline.progress.note_shard_remote_consistent(start.shard, f.remote_consistent_lsn);
                        }
                    }
                    Ok(ConsumerMessage::Start(_)) => {
                        return stream_error(w, ErrorCode::Protocol, "stream already started".into()).await;
                    }
                    Err(e) => return stream_error(w, ErrorCode::Protocol, e.to_string()).await,
                }
            }
            () = fence.superseded() => {
                if let Some(c) = timeline.consumers.lock().get_mut(&id) {
                    c.fenced = true;
                }
                info!(consumer = %start.consumer_id, generation = fence.generation(), newest = fence.newest(),
                    grace = ?grace, "a newer attachment generation streams this timeline; this stream ends after the grace");
            }
            () = sleep_until_deadline(clock, deadline) => {}
            () = sleep_until_deadline(clock, Some(last_sent + CONSUMER_KEEPALIVE)) => {
                if clock.since(last_feedback) > shared.config.idle_timeout {
                    return Err(framed::FrameError::Timeout(shared.config.idle_timeout).into());
                }
                // Nothing to send for a keepalive's time: idle, so its
                // segment file is closed until there is WAL again.
                wal.close();
                codec::encode_stream(&StreamMessage::Keepalive { commit_lsn: now.commit_lsn, flush_lsn: now.flush_lsn }, &mut out);
            }
        }
    }
}
