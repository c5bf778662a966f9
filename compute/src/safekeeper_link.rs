//! One proposer connection to one safekeeper, as a task: it (re)connects
//! with backoff, greets, and then forwards commands from the proposer core
//! and the safekeeper's answers. The core owns all protocol decisions.

use std::time::Duration;

use strata_service::tls::{ClientTls, Stream};
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
pub type LinkCommand = ProposerMessage;

/// Longest silence from a connected safekeeper before the link gives up
/// on it (beyond the safekeepers' default idle timeout of 60 s).
const IDLE_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where a link connects: a safekeeper's protocol address, over TLS with
/// the cluster's CA when given.
#[derive(Clone, Debug)]
pub struct Target {
    pub address: String,
    pub tls: Option<ClientTls>,
}

/// Runs a link forever (until the core drops its channels).
pub async fn run_link(
    link: usize,
    target: Target,
    greeting: ProposerGreeting,
    events: mpsc::Sender<LinkEvent>,
    mut commands: mpsc::Receiver<(u64, LinkCommand)>,
    timeout: Duration,
) {
    let mut session = 0u64;
    let mut backoff = Duration::from_millis(50);
    loop {
        session += 1;
        let result = session_loop(link, session, &target, &greeting, &events, &mut commands, timeout).await;
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
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        if session > 1 {
            backoff = backoff.max(Duration::from_millis(100));
        }
    }
}

async fn session_loop(
    link: usize,
    session: u64,
    target: &Target,
    greeting: &ProposerGreeting,
    events: &mpsc::Sender<LinkEvent>,
    commands: &mut mpsc::Receiver<(u64, LinkCommand)>,
    timeout: Duration,
) -> Result<(), String> {
    let address = target.address.as_str();
    let stream = tokio::time::timeout(timeout, Stream::connect(address, target.tls.as_ref()))
        .await
        .map_err(|_| format!("connecting timed out after {timeout:?}"))?
        .map_err(|e| format!("connecting: {e}"))?;
    let (r, mut w) = tokio::io::split(stream);
    let mut frames = FrameReader::new(r, codec::MAX_FRAME_SIZE);
    let mut out = Vec::new();
    codec::encode_proposer(&ProposerMessage::Greeting(greeting.clone()), &mut out);
    framed::write_all(&mut w, &out, timeout).await.map_err(|e| format!("sending greeting: {e}"))?;
    // The greeting answer.
    let first = match frames.read_frame(timeout).await {
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
    loop {
        tokio::select! {
            cmd = commands.recv() => {
                let Some((cmd_session, cmd)) = cmd else { return Ok(()) };
                if cmd_session != session {
                    continue;
                }
                out.clear();
                codec::encode_proposer(&cmd, &mut out);
                // Drain whatever else is queued into the same write.
                while let Ok((s, more)) = commands.try_recv() {
                    if s == session {
                        codec::encode_proposer(&more, &mut out);
                    }
                    if out.len() > 4 << 20 {
                        break;
                    }
                }
                framed::write_all(&mut w, &out, timeout).await.map_err(|e| format!("sending: {e}"))?;
            }
            // A quiet PostgreSQL sends nothing for long stretches, and a
            // safekeeper answers only appends: silence alone is not a
            // failure until it outlasts the safekeeper's own idle timeout
            // (which closes the connection). Writes have `timeout`.
            frame = frames.read_frame(IDLE_READ_TIMEOUT) => {
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
