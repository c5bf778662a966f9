//! One proposer connection to one safekeeper, as a task: it (re)connects
//! with backoff, greets, and then forwards commands from the proposer core
//! and the safekeeper's answers. The core owns all protocol decisions.

use std::sync::Arc;
use std::time::Duration;

use strata_service::clock::timeout;
use strata_service::tls::{ClientTls, Stream};

use crate::clock::SharedClock;
use crate::limits::{LINK_FIRST_BACKOFF, LINK_MAX_WRITE_BATCH, LINK_RECONNECT_MIN_BACKOFF};
use tokio::sync::mpsc;
use tracing::{info, warn};

use strata_protocol::framed::{self, FrameError, FrameReader};
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::{AcceptorMessage, Membership, ProposerGreeting, ProposerMessage};
use strata_protocol::NodeId;

/// What a link reports to the core.
#[derive(Debug)]
pub enum LinkEvent {
    /// Connected and greeted; a new session (the core must vote/elect again).
    Connected {
        link: usize,
        session: u64,
        term: u64,
        /// The safekeeper's node id and its configuration of the timeline.
        node_id: NodeId,
        membership: Membership,
    },
    Message {
        link: usize,
        session: u64,
        msg: AcceptorMessage,
    },
    Disconnected {
        link: usize,
        session: u64,
        reason: String,
    },
}

/// Commands from the core for the current session of a link.
#[derive(Debug)]
pub enum LinkCommand {
    /// A message to encode and send.
    Message(ProposerMessage),
    /// A frame already encoded, shared by every link it goes to (an append
    /// the core encoded once for all the safekeepers at its position).
    Frame(Arc<[u8]>),
}

/// Commands taken for one write: messages encoded into a scratch buffer,
/// shared frames referred to as they are, so that an append's WAL reaches
/// the socket without another copy (a vectored write).
#[derive(Default)]
struct Batch {
    scratch: Vec<u8>,
    /// Each command's bytes: a range of `scratch` or a shared frame.
    parts: Vec<Part>,
    len: usize,
}

enum Part {
    Scratch(std::ops::Range<usize>),
    Frame(Arc<[u8]>),
}

impl Batch {
    fn clear(&mut self) {
        self.scratch.clear();
        self.parts.clear();
        self.len = 0;
    }

    fn push(&mut self, cmd: LinkCommand) {
        let part = match cmd {
            LinkCommand::Message(msg) => {
                let start = self.scratch.len();
                codec::encode_proposer(&msg, &mut self.scratch);
                Part::Scratch(start..self.scratch.len())
            }
            LinkCommand::Frame(frame) => Part::Frame(frame),
        };
        self.len += match &part {
            Part::Scratch(r) => r.len(),
            Part::Frame(f) => f.len(),
        };
        self.parts.push(part);
    }

    fn slices(&self) -> Vec<&[u8]> {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Scratch(r) => &self.scratch[r.clone()],
                Part::Frame(f) => &f[..],
            })
            .collect()
    }
}

/// Where a link connects: a safekeeper's protocol address, over TLS with
/// the cluster's CA when given.
#[derive(Clone, Debug)]
pub struct Target {
    pub address: String,
    pub tls: Option<ClientTls>,
}

/// Runs a link forever (until the core drops its channels). Its waits
/// between reconnections, and for a connection, are measured on `clock`.
pub async fn run_link(
    link: usize,
    target: Target,
    greeting: ProposerGreeting,
    events: mpsc::Sender<LinkEvent>,
    mut commands: mpsc::Receiver<(u64, LinkCommand)>,
    limit: Duration,
    clock: SharedClock,
) {
    let mut session = 0u64;
    let mut backoff = LINK_FIRST_BACKOFF;
    loop {
        session += 1;
        let result = session_loop((link, session), &target, &greeting, &events, &mut commands, limit, &clock).await;
        let reason = match result {
            Ok(()) => return, // the core is gone
            Err(e) => e,
        };
        if events.send(LinkEvent::Disconnected { link, session, reason: reason.clone() }).await.is_err() {
            return;
        }
        warn!(safekeeper = %target.address, "connection lost: {reason}; retrying in {backoff:?}");
        // Drop commands meant for the dead session.
        while commands.try_recv().is_ok() {}
        clock.sleep(backoff).await;
        backoff = (backoff * 2).min(crate::limits::LINK_MAX_BACKOFF);
        if session > 1 {
            backoff = backoff.max(LINK_RECONNECT_MIN_BACKOFF);
        }
    }
}

/// One session of link `link`: connects, greets and forwards until it fails.
async fn session_loop(
    (link, session): (usize, u64),
    target: &Target,
    greeting: &ProposerGreeting,
    events: &mpsc::Sender<LinkEvent>,
    commands: &mut mpsc::Receiver<(u64, LinkCommand)>,
    limit: Duration,
    clock: &SharedClock,
) -> Result<(), String> {
    let address = target.address.as_str();
    let stream = timeout(&**clock, limit, Stream::connect(address, target.tls.as_ref()))
        .await
        .map_err(|_| format!("connecting timed out after {limit:?}"))?
        .map_err(|e| format!("connecting: {e}"))?;
    let (r, mut w) = tokio::io::split(stream);
    let mut frames = FrameReader::new(r, codec::MAX_FRAME_SIZE);
    let mut out = Vec::new();
    codec::encode_proposer(&ProposerMessage::Greeting(greeting.clone()), &mut out);
    framed::write_all(&mut w, &out, limit).await.map_err(|e| format!("sending greeting: {e}"))?;
    // The greeting answer.
    let first = match frames.read_frame(limit).await {
        Ok(frame) => codec::decode_acceptor(frame).map_err(|e| e.to_string())?,
        Err(FrameError::Timeout(_)) => return Err("no greeting answer".into()),
        Err(e) => return Err(format!("during greeting: {e}")),
    };
    let (term, node_id, membership) = match first {
        AcceptorMessage::Greeting(g) => (g.term, g.node_id, g.membership),
        AcceptorMessage::Error(e) => {
            let reason = format!("refused: {:?}: {}", e.code, e.message);
            let _ = events.send(LinkEvent::Message { link, session, msg: AcceptorMessage::Error(e) }).await;
            return Err(reason);
        }
        other => return Err(format!("unexpected answer to greeting: {other:?}")),
    };
    info!(safekeeper = %address, term, generation = membership.generation, "connected");
    if events.send(LinkEvent::Connected { link, session, term, node_id, membership }).await.is_err() {
        return Ok(());
    }
    let mut batch = Batch::default();
    loop {
        tokio::select! {
            cmd = commands.recv() => {
                let Some((cmd_session, cmd)) = cmd else { return Ok(()) };
                if cmd_session != session {
                    continue;
                }
                batch.clear();
                batch.push(cmd);
                // Drain whatever else is queued into the same write.
                while let Ok((s, more)) = commands.try_recv() {
                    if s == session {
                        batch.push(more);
                    }
                    if batch.len > LINK_MAX_WRITE_BATCH {
                        break;
                    }
                }
                framed::write_all_vectored(&mut w, &batch.slices(), limit).await.map_err(|e| format!("sending: {e}"))?;
            }
            // A quiet PostgreSQL sends nothing for long stretches, and a
            // safekeeper answers only appends: silence alone is not a
            // failure until it outlasts the safekeeper's own idle timeout
            // (which closes the connection). Writes have `limit`.
            frame = frames.read_frame(crate::limits::IDLE_READ_TIMEOUT) => {
                let msg = match frame {
                    Ok(frame) => codec::decode_acceptor(frame).map_err(|e| e.to_string())?,
                    Err(FrameError::Closed) => return Err("closed by safekeeper".into()),
                    Err(e) => return Err(format!("reading: {e}")),
                };
                let is_error = matches!(msg, AcceptorMessage::Error(_));
                if events.send(LinkEvent::Message { link, session, msg }).await.is_err() {
                    return Ok(());
                }
                if is_error {
                    return Err("safekeeper reported an error".into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::safekeeper::{Membership, TimelineIdentity, PROTOCOL_VERSION};
    use strata_protocol::{TenantId, TimelineId};
    use strata_service::clock::{Clock, ManualClock};
    use tokio::io::AsyncReadExt;

    fn greeting() -> ProposerGreeting {
        ProposerGreeting {
            protocol_version: PROTOCOL_VERSION,
            proposer_id: [7; 16],
            timeline: TimelineIdentity {
                tenant_id: TenantId([1; 16]),
                timeline_id: TimelineId([2; 16]),
                system_id: 1,
                pg_version: 15,
                wal_segment_size: 16 << 20,
            },
            membership: Membership::default(),
            token: None,
        }
    }

    /// Accepts one connection, reads the greeting and hangs up.
    async fn accept_and_drop(listener: &tokio::net::TcpListener) {
        let (mut socket, _) = listener.accept().await.expect("a connection");
        let mut buf = [0u8; 1];
        socket.read_exact(&mut buf).await.expect("the greeting");
    }

    /// Whether the link connects again within a moment of real time (its
    /// connection attempts are real I/O; only its waits are on the clock).
    async fn reconnects(listener: &tokio::net::TcpListener) -> bool {
        let waited = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        waited.is_ok()
    }

    #[tokio::test]
    async fn a_lost_link_reconnects_only_after_its_backoff_on_the_clock() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = Target { address: listener.local_addr().unwrap().to_string(), tls: None };
        let clock = ManualClock::new();
        let (events_tx, mut events) = mpsc::channel(16);
        let (_commands_tx, commands) = mpsc::channel(16);
        let link = tokio::spawn(run_link(
            0,
            target,
            greeting(),
            events_tx,
            commands,
            Duration::from_secs(10),
            SharedClock::new(clock.clone()),
        ));

        accept_and_drop(&listener).await;
        let ev = events.recv().await.unwrap();
        assert!(matches!(ev, LinkEvent::Disconnected { session: 1, .. }), "{ev:?}");
        // Waiting out its first backoff on the manual clock, which has not moved.
        let lost_at = clock.now();
        while clock.next_deadline() != Some(lost_at + LINK_FIRST_BACKOFF) {
            tokio::task::yield_now().await;
        }
        assert!(!reconnects(&listener).await, "no attempt before the backoff");
        clock.advance(LINK_FIRST_BACKOFF - Duration::from_millis(1));
        assert!(!reconnects(&listener).await, "no attempt a millisecond before the backoff ends");
        clock.advance(Duration::from_millis(1));
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1];
        socket.read_exact(&mut buf).await.unwrap();
        drop(socket);

        // The second loss waits twice as long.
        let ev = events.recv().await.unwrap();
        assert!(matches!(ev, LinkEvent::Disconnected { session: 2, .. }), "{ev:?}");
        let lost_at = clock.now();
        while clock.next_deadline() != Some(lost_at + LINK_FIRST_BACKOFF * 2) {
            tokio::task::yield_now().await;
        }
        clock.advance(LINK_FIRST_BACKOFF);
        assert!(!reconnects(&listener).await, "the backoff doubled");
        clock.advance(LINK_FIRST_BACKOFF);
        accept_and_drop(&listener).await;
        link.abort();
    }
}
