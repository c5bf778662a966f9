//! A greeted proposer's connection, served by a thread of its own with
//! blocking reads, writes and fsyncs.
//!
//! Every commit of the compute waits for this loop: read the append, write
//! it, fsync, answer. On the async runtime each fsync had to hand the
//! worker thread's other tasks to a fresh thread (`block_in_place`) and
//! each message woke a worker; here the loop is one thread that sleeps in
//! `read` and `fdatasync`, like PostgreSQL's own WAL receiver. A timeline
//! has at most one proposer at a time, so this is a thread per active
//! compute, and the connection limit bounds the rest.

use std::io::Write;
use std::time::Duration;

use tracing::{info, warn};

use strata_protocol::framed::{FrameError, FrameReader};
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::{AcceptorMessage, ErrorCode, ErrorMessage, ProposerMessage};
use strata_service::tls::BlockingStream;

use crate::acceptor::AcceptorError;
use crate::connection::ConnectionError;
use crate::limits::MAX_APPENDS_PER_FLUSH;
use crate::shared::Shared;
use crate::timeline::{AcceptorCallError, Timeline};

/// The blocking connection: frames in, encoded replies out (through the
/// same stream: a TLS connection cannot be split).
struct Session {
    frames: FrameReader<BlockingStream>,
    out: Vec<u8>,
    idle_timeout: Duration,
    send_timeout: Duration,
}

impl Session {
    fn read_frame(&mut self) -> Result<&[u8], ConnectionError> {
        let idle = self.idle_timeout;
        self.frames.read_frame_blocking().map_err(|e| match e {
            // The socket's read timeout is the idle timeout.
            FrameError::Timeout(_) => ConnectionError::Frame(FrameError::Timeout(idle)),
            e => ConnectionError::Frame(e),
        })
    }

    fn send(&mut self) -> Result<(), ConnectionError> {
        let result = self.frames.get_mut().write_all(&self.out).and_then(|()| self.frames.get_mut().flush());
        self.out.clear();
        result.map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                ConnectionError::Frame(FrameError::WriteTimeout(self.send_timeout))
            }
            _ => ConnectionError::Frame(FrameError::Io(e)),
        })
    }

    /// Sends the error for `err` and ends the connection.
    fn refuse(&mut self, shared: &Shared, err: &AcceptorCallError) -> Result<(), ConnectionError> {
        codec::encode_acceptor(&refusal_message(shared, err), &mut self.out);
        self.send()
    }
}

/// Serves the proposer on `stream` (which already delivered `buffered`, the
/// bytes read past its greeting) until it goes away or must be refused.
/// Blocks the calling thread: run it on a thread of its own.
pub fn serve(
    stream: BlockingStream,
    buffered: Vec<u8>,
    shared: &Shared,
    timeline: &Timeline,
    greeting: ProposerMessage,
    send_timeout: Duration,
) -> Result<(), ConnectionError> {
    let io = |e: std::io::Error| ConnectionError::Frame(FrameError::Io(e));
    let tcp = stream.tcp();
    tcp.set_nonblocking(false).map_err(io)?;
    tcp.set_read_timeout(Some(shared.config.idle_timeout)).map_err(io)?;
    tcp.set_write_timeout(Some(send_timeout)).map_err(io)?;
    let _registration = timeline.register_proposer(tcp.try_clone().map_err(io)?);
    let mut session = Session {
        frames: FrameReader::with_buffered(stream, buffered, codec::MAX_FRAME_SIZE),
        out: Vec::with_capacity(1 << 12),
        idle_timeout: shared.config.idle_timeout,
        send_timeout,
    };
    let mut pending: Option<ProposerMessage> = Some(greeting);
    // The membership generation this connection works under (set by the
    // greeting): once the timeline's changes, the proposer must reconnect
    // and learn the new configuration, so no vote or append of a stale
    // configuration is ever taken (docs/safekeeper-membership.md).
    let mut session_generation = 0u32;
    let mut feedback_sent = strata_protocol::safekeeper::StandbyFeedback::default();
    let same_generation = |acceptor: &crate::timeline::TimelineAcceptor, session: u32| {
        let current = acceptor.membership().generation;
        if current == session {
            Ok(())
        } else {
            Err(AcceptorError::MembershipChanged { session, current })
        }
    };
    loop {
        let msg = match pending.take() {
            Some(m) => m,
            None => match codec::decode_proposer(session.read_frame()?) {
                Ok(m) => m,
                Err(e) => return session.refuse(shared, &protocol_error(e.to_string())),
            },
        };
        if let ProposerMessage::Append(_) = msg {
            // Group commit: write this and every append already received, then flush once.
            let mut batch = vec![msg];
            while batch.len() < MAX_APPENDS_PER_FLUSH {
                let Some(frame) = session.frames.buffered_frame().map_err(ConnectionError::Frame)? else { break };
                match codec::decode_proposer(frame) {
                    Ok(m @ ProposerMessage::Append(_)) => batch.push(m),
                    Ok(other) => {
                        pending = Some(other);
                        break;
                    }
                    Err(e) => return session.refuse(shared, &protocol_error(e.to_string())),
                }
            }
            let started = shared.clock.now();
            let n = batch.len();
            let outcome = timeline.with_acceptor(|acceptor| {
                same_generation(acceptor, session_generation)?;
                for m in &batch {
                    if let ProposerMessage::Append(a) = m {
                        shared.metrics.append_requests.inc();
                        shared.metrics.append_bytes.inc_by(a.wal.len() as u64);
                    }
                    acceptor.handle(m)?;
                }
                acceptor.flush()
            });
            match outcome {
                Ok(mut ack) => {
                    timeline.note_append();
                    if let AcceptorMessage::AppendResponse(r) = &mut ack {
                        r.consumer_applied_lsn = timeline.consumer_applied_lsn();
                    }
                    shared.metrics.flushes.inc();
                    shared.metrics.flush_seconds.observe(shared.clock.since(started).as_secs_f64());
                    shared.metrics.appends_per_flush.observe(n as f64);
                    codec::encode_acceptor(&ack, &mut session.out);
                    // The replicas' feedback rides along when it changed.
                    let feedback = timeline.standby_feedback.oldest();
                    if feedback != feedback_sent {
                        codec::encode_acceptor(&AcceptorMessage::StandbyFeedback(feedback), &mut session.out);
                        feedback_sent = feedback;
                    }
                    session.send()?;
                }
                Err(e) => {
                    warn!("refusing appends: {e}");
                    return session.refuse(shared, &e);
                }
            }
            continue;
        }
        let handled = timeline.with_acceptor(|acceptor| {
            if !matches!(msg, ProposerMessage::Greeting(_)) {
                same_generation(acceptor, session_generation)?;
            }
            acceptor.handle(&msg)
        });
        match handled {
            Ok(Some(reply)) => {
                if let ProposerMessage::Elected(e) = &msg {
                    info!(term = e.term, start = %e.start_streaming_at, "proposer elected");
                }
                codec::encode_acceptor(&reply, &mut session.out);
                session.send()?;
                if let (ProposerMessage::Greeting(g), AcceptorMessage::Greeting(ours)) = (&msg, &reply) {
                    session_generation = ours.membership.generation;
                    if g.membership.generation < session_generation {
                        // The proposer learns the newer configuration from our greeting and reconnects.
                        info!(
                            theirs = g.membership.generation,
                            ours = session_generation,
                            "a proposer of an older membership generation; closing"
                        );
                        return Ok(());
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!("refusing proposer message: {e}");
                return session.refuse(shared, &e);
            }
        }
    }
}

/// A refusal for a message that did not decode or came out of order.
fn protocol_error(message: String) -> AcceptorCallError {
    AcceptorCallError::Refused(AcceptorError::Protocol(message))
}

/// The error a proposer is sent for `err` (counted in the metrics).
pub(crate) fn refusal_message(shared: &Shared, err: &AcceptorCallError) -> AcceptorMessage {
    match err {
        AcceptorCallError::Refused(e) => {
            shared.metrics.protocol_errors.inc();
            e.to_message()
        }
        AcceptorCallError::Failed(f) => {
            shared.metrics.storage_errors.inc();
            AcceptorMessage::Error(ErrorMessage { code: ErrorCode::Storage, message: f.to_string() })
        }
    }
}
