//! The WAL proposer: gets elected by a quorum of safekeepers, brings lagging
//! ones up to the epoch start with the donor's WAL, then streams the WAL that
//! PostgreSQL sends it (as a physical standby) and reports back, as its
//! flush position, what a quorum has made durable — so `synchronous_commit`
//! waits for the quorum.
//!
//! One task owns all decisions (`Core`); a task per safekeeper only moves
//! bytes (`safekeeper_link`). Appends are cut at record boundaries, so every
//! flush LSN a safekeeper reports is a place where WAL can continue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_service::clock::{timeout, Clock, Sleep};

use tokio::sync::mpsc;
use tracing::{info, warn};

/// Progress reported to the caller (status, metrics).
pub use strata_protocol::api::compute::ProposerStatus;

use strata_formats::wal::{StartPosition, WalDecoder};
use strata_formats::{Lsn, PgVersion};
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::election::{
    advance_commit, elect, next_term, quorum, quorum_lsn, start_streaming_at, Epoch,
};
use strata_protocol::safekeeper::{
    AcceptorMessage, ErrorCode, Membership, OnAsyncLag, ProposerElected, ProposerGreeting, ProposerMessage,
    StandbyFeedback, Term, TimelineIdentity, VoteRequest, VoteResponse, PROTOCOL_VERSION,
};
use strata_protocol::{NodeId, Token};

use crate::clock::SharedClock;
use crate::limits::{
    ACK_WAITS, LAGGING_CHECK_INTERVAL, LAST_COMMIT_DELIVERY, LINK_COMMANDS_CAPACITY, LINK_EVENTS_CAPACITY,
    POSITION_RETRY, QUORUM_WAIT, STATUS_REPORT_INTERVAL,
};
use crate::pg_replication::{ReplicationConfig, ReplicationConnection, ReplicationEvent, ReplicationStream};
use crate::safekeeper_link::{run_link, LinkCommand, LinkEvent, Target};
use strata_service::tls::ClientTls;

/// What the proposer needs.
#[derive(Clone, Debug)]
pub struct ProposerConfig {
    pub safekeepers: Vec<String>,
    pub timeline: TimelineIdentity,
    /// Bound on every network wait.
    pub timeout: Duration,
    /// WAL held in memory for acceptors that have not acknowledged it.
    pub max_buffer_bytes: usize,
    /// Largest append sent at once.
    pub max_append_bytes: usize,
    /// Unacknowledged bytes in flight per safekeeper.
    pub max_in_flight_bytes: u64,
    /// Backpressure: PostgreSQL's commits are acknowledged only up to this
    /// many bytes past what the WAL consumers (pageservers) have applied.
    pub max_consumer_lag_bytes: Option<u64>,
    /// The token sent in every greeting and WAL request (a tenant or
    /// service token; never logged).
    pub token: Option<Token>,
    /// TLS to the safekeepers, with the cluster's CA; none: plaintext.
    pub tls: Option<ClientTls>,
    /// Addresses in the membership configuration and where this compute
    /// reaches them instead (a route to another site, `docs/sites.md`).
    pub address_map: Vec<(String, String)>,
    /// Where every decision by time reads it: election and catch-up
    /// deadlines, reconnection backoff, position retries, status reports.
    pub clock: SharedClock,
}

impl ProposerConfig {
    pub fn new(safekeepers: Vec<String>, timeline: TimelineIdentity) -> ProposerConfig {
        ProposerConfig {
            safekeepers,
            timeline,
            timeout: crate::limits::PROPOSER_TIMEOUT,
            max_buffer_bytes: crate::limits::PROPOSER_MAX_BUFFER_BYTES,
            max_append_bytes: crate::limits::PROPOSER_MAX_APPEND_BYTES,
            max_in_flight_bytes: crate::limits::PROPOSER_MAX_IN_FLIGHT_BYTES,
            max_consumer_lag_bytes: None,
            token: None,
            tls: None,
            address_map: Vec::new(),
            clock: SharedClock::default(),
        }
    }
}

/// Why the proposer stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProposerError {
    #[error("lost the election: safekeepers are at term {seen}, ours is {ours}")]
    Superseded { ours: Term, seen: Term },
    #[error("safekeeper {0} refused: {1}")]
    Refused(String, String),
    /// A site failover sealed the timeline (`docs/sites.md`): this writer
    /// is fenced for good, and a restart would only be refused again.
    #[error("safekeeper {0} has sealed the timeline (a site failover forked the branch): {1}")]
    Sealed(String, String),
    #[error("safekeepers hold WAL up to {epoch_start}, beyond this PostgreSQL's end {pg_end}: start it from a basebackup at {epoch_start}")]
    PostgresBehind { epoch_start: Lsn, pg_end: Lsn },
    #[error("PostgreSQL: {0}")]
    Postgres(String),
    #[error("invalid WAL from PostgreSQL: {0}")]
    Wal(String),
    /// A membership change re-elected this proposer, but the new quorum
    /// does not continue the WAL it streamed: it must start afresh.
    #[error("re-elected under membership generation {generation}: {why}")]
    Reconfigured { generation: u32, why: String },
    #[error("{0}")]
    Other(String),
}

impl ProposerError {
    /// Whether this writer may never write the branch again: another writer
    /// was elected, or a site failover sealed the timeline.
    pub fn is_fenced(&self) -> bool {
        matches!(self, ProposerError::Superseded { .. } | ProposerError::Sealed(..))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkPhase {
    Down,
    Greeted,
    VoteSent,
    ElectedSent,
    /// Receiving WAL from `next`.
    Streaming {
        next: Lsn,
    },
}

struct Link {
    address: String,
    /// Its node id: from the configuration (generation > 0), else as it greeted.
    id: Option<NodeId>,
    session: u64,
    phase: LinkPhase,
    term_seen: Term,
    /// Durable end acknowledged in our term (survives reconnects).
    flush: Option<Lsn>,
    commands: mpsc::Sender<(u64, LinkCommand)>,
    /// When its position was last asked for (links left behind are asked again).
    last_request: Instant,
    /// What its consumers report as applied.
    consumer_applied: Lsn,
    /// The commit LSN last sent to it.
    commit_sent: Lsn,
    /// The oldest snapshots of the replicas streaming from it.
    feedback: StandbyFeedback,
}

/// WAL from `start`, record-complete up to `complete_end`.
/// `[from, to)` of WAL.
type LsnRange = (Lsn, Lsn);

struct WalBuffer {
    start: Lsn,
    bytes: VecDeque<u8>,
    complete_end: Lsn,
}

impl WalBuffer {
    fn end(&self) -> Lsn {
        Lsn(self.start.0 + self.bytes.len() as u64)
    }
    /// `[from, to)` as at most two runs of contiguous memory (the ring's
    /// two halves), in LSN order; either may be empty.
    fn parts(&self, from: Lsn, to: Lsn) -> [&[u8]; 2] {
        let a = (from.0 - self.start.0) as usize;
        let b = (to.0 - self.start.0) as usize;
        debug_assert!(a <= b && b <= self.bytes.len(), "a slice of WAL the buffer holds");
        let (front, back) = self.bytes.as_slices();
        let first = if a < front.len() { &front[a..b.min(front.len())] } else { &[][..] };
        let second = if b > front.len() { &back[a.saturating_sub(front.len())..b - front.len()] } else { &[][..] };
        [first, second]
    }

    /// A copy of `[from, to)`.
    #[cfg(test)]
    fn slice(&self, from: Lsn, to: Lsn) -> Vec<u8> {
        self.parts(from, to).concat()
    }
    fn trim_to(&mut self, lsn: Lsn) {
        if lsn > self.start {
            let n = ((lsn.0 - self.start.0) as usize).min(self.bytes.len());
            self.bytes.drain(..n);
            self.start = Lsn(self.start.0 + n as u64);
        }
    }
}

struct Core {
    cfg: ProposerConfig,
    /// Which safekeepers count (generation 0: the configured ones, by majority).
    membership: Membership,
    proposer_id: [u8; 16],
    links: Vec<Link>,
    events: mpsc::Receiver<LinkEvent>,
    term: Term,
    /// The term whose WAL this proposer streamed before a membership change
    /// made it run a new election (0: none); the new quorum must continue it.
    streamed_term: Term,
    elections: u32,
    votes: Vec<(usize, VoteResponse)>,
    epoch: Option<Epoch>,
    buffer: Option<WalBuffer>,
    commit_lsn: Lsn,
    /// The commit LSN every streaming link was sent.
    commit_sent: Lsn,
    /// How long a commit LSN that no WAL carries waits before it is sent on
    /// its own ([`crate::limits::COMMIT_UPDATE_DELAY`] while streaming, zero otherwise).
    commit_update_delay: Duration,
    /// Since when some link lacks the commit LSN and has no WAL to carry it.
    commit_waiting_since: Option<Instant>,
    status: tokio::sync::watch::Sender<ProposerStatus>,
    acknowledged_lsn: Lsn,
    throttled: Duration,
    throttled_since: Option<Instant>,
    /// Set once PostgreSQL streams its WAL to this proposer.
    streaming: bool,
    /// Asynchronous links dropped for lagging past `max_async_lag`.
    async_dropped: u64,
    /// Ends of batches of received WAL not yet acknowledged, with when they
    /// arrived (at most [`ACK_WAITS`]: past that a batch is timed with the next).
    ack_waits: VecDeque<(Lsn, Instant)>,
    acks: u64,
    ack_wait: Duration,
    /// The link tasks, aborted with the core: a dropped proposer keeps no
    /// safekeeper connection (or reconnection attempt) behind.
    link_tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Core {
    fn drop(&mut self) {
        for task in &self.link_tasks {
            task.abort();
        }
    }
}

impl Core {
    fn start(cfg: ProposerConfig, status: tokio::sync::watch::Sender<ProposerStatus>) -> Core {
        let (_, events) = mpsc::channel(1);
        let mut core = Core {
            cfg,
            membership: Membership::default(),
            proposer_id: *strata_protocol::TimelineId::generate().0.first_chunk().expect("16 bytes"),
            links: Vec::new(),
            events,
            term: 0,
            streamed_term: 0,
            elections: 0,
            votes: Vec::new(),
            epoch: None,
            buffer: None,
            commit_lsn: Lsn::INVALID,
            commit_sent: Lsn::INVALID,
            commit_update_delay: Duration::ZERO,
            commit_waiting_since: None,
            status,
            acknowledged_lsn: Lsn::INVALID,
            throttled: Duration::ZERO,
            throttled_since: None,
            streaming: false,
            async_dropped: 0,
            ack_waits: VecDeque::new(),
            acks: 0,
            ack_wait: Duration::ZERO,
            link_tasks: Vec::new(),
        };
        let configured = core.cfg.safekeepers.iter().map(|a| (None, a.clone())).collect();
        core.connect_links(configured);
        core
    }

    /// (Re)starts one link per safekeeper, greeting with the current
    /// configuration. Links of an earlier configuration are stopped and
    /// their events (on the old channel) are never read.
    fn connect_links(&mut self, safekeepers: Vec<(Option<NodeId>, String)>) {
        for task in self.link_tasks.drain(..) {
            task.abort();
        }
        let (ev_tx, ev_rx) = mpsc::channel(LINK_EVENTS_CAPACITY);
        self.events = ev_rx;
        let greeting = ProposerGreeting {
            protocol_version: PROTOCOL_VERSION,
            proposer_id: self.proposer_id,
            timeline: self.cfg.timeline.clone(),
            membership: self.membership.clone(),
            token: self.cfg.token.clone(),
        };
        self.links = Vec::with_capacity(safekeepers.len());
        for (i, (id, address)) in safekeepers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel(LINK_COMMANDS_CAPACITY);
            self.link_tasks.push(tokio::spawn(run_link(
                i,
                Target { address: address.clone(), tls: self.cfg.tls.clone() },
                greeting.clone(),
                ev_tx.clone(),
                rx,
                self.cfg.timeout,
                self.cfg.clock.clone(),
            )));
            self.links.push(Link {
                address,
                id,
                session: 0,
                phase: LinkPhase::Down,
                term_seen: 0,
                flush: None,
                commands: tx,
                last_request: self.cfg.clock.now(),
                consumer_applied: Lsn::INVALID,
                commit_sent: Lsn::INVALID,
                feedback: StandbyFeedback::default(),
            });
        }
    }

    /// Whether `links` make a quorum: a majority of the configured set
    /// (generation 0), or of each set of the configuration.
    fn is_quorum(&self, links: &[usize]) -> bool {
        if self.membership.generation == 0 {
            return links.len() >= quorum(self.links.len());
        }
        let ids: Vec<NodeId> = links.iter().filter_map(|&i| self.links[i].id).collect();
        self.membership.has_quorum(&ids)
    }

    /// Whether a link is an asynchronous member: a member that no rule of
    /// the configuration counts (`local-quorum`, outside the home site).
    fn is_async(&self, link: usize) -> bool {
        self.membership.generation > 0 && self.links[link].id.is_some_and(|id| !self.membership.is_voter(id))
    }

    /// The highest LSN a quorum has flushed in this term.
    fn quorum_flush(&self) -> Lsn {
        if self.membership.generation == 0 {
            let flushes: Vec<Lsn> = self.links.iter().filter_map(|l| l.flush).collect();
            return quorum_lsn(&flushes, self.links.len());
        }
        let flushes: Vec<(NodeId, Lsn)> = self.links.iter().filter_map(|l| Some((l.id?, l.flush?))).collect();
        self.membership.quorum_lsn(&flushes)
    }

    /// Moves to a configuration of a higher generation that a safekeeper
    /// reported: new links to its members and a new election. The WAL
    /// received from PostgreSQL and the commit LSN are kept; once elected
    /// again, streaming goes on from where each member's WAL ends.
    fn adopt(&mut self, m: Membership) -> Result<(), ProposerError> {
        m.validate().map_err(|e| ProposerError::Other(format!("a safekeeper's membership configuration: {e}")))?;
        let route = |address: String| {
            self.cfg.address_map.iter().find(|(from, _)| *from == address).map_or(address, |(_, to)| to.clone())
        };
        let members: Vec<(Option<NodeId>, String)> =
            m.all().into_iter().map(|x| (Some(x.id), route(x.address))).collect();
        info!(
            from = self.membership.generation,
            to = m.generation,
            joint = m.new_members.is_some(),
            members = ?members.iter().map(|(_, a)| a.as_str()).collect::<Vec<_>>(),
            "adopting the safekeepers' membership configuration; electing again"
        );
        if self.epoch.is_some() {
            self.streamed_term = self.term;
        }
        let min_term = self.term;
        self.membership = m;
        self.connect_links(members);
        for l in &mut self.links {
            l.term_seen = min_term;
        }
        self.term = 0;
        self.votes.clear();
        self.epoch = None;
        self.commit_sent = Lsn::INVALID;
        self.commit_waiting_since = None;
        Ok(())
    }

    fn send(&mut self, link: usize, msg: ProposerMessage) {
        self.send_command(link, LinkCommand::Message(msg));
    }

    fn send_command(&mut self, link: usize, msg: LinkCommand) {
        let l = &self.links[link];
        // A full queue means the link is far behind; it catches up from its acknowledged position later.
        if l.commands.try_send((l.session, msg)).is_err() {
            warn!(safekeeper = %l.address, "command queue full");
        }
    }

    fn publish(&self) {
        let received = self.buffer.as_ref().map_or(Lsn::INVALID, |b| b.complete_end);
        let connected = self.links.iter().filter(|l| l.phase != LinkPhase::Down).count();
        let throttled = self.throttled + self.throttled_since.map_or(Duration::ZERO, |t| self.cfg.clock.since(t));
        self.status.send_replace(ProposerStatus {
            term: self.term,
            epoch_start: self.epoch.as_ref().map_or(Lsn::INVALID, |e| e.start_lsn),
            commit_lsn: self.commit_lsn,
            acknowledged_lsn: self.acknowledged_lsn,
            consumer_applied_lsn: self.consumer_applied(),
            throttled_seconds: throttled.as_secs_f64(),
            received_lsn: self.buffer.as_ref().map_or(Lsn::INVALID, |b| b.complete_end),
            connected_safekeepers: connected,
            streaming: self.streaming,
            membership_generation: self.membership.generation,
            elections: self.elections,
            placement: self.membership.target().1.policy().to_string(),
            async_safekeepers: (0..self.links.len())
                .filter(|&i| self.is_async(i))
                .map(|i| {
                    let l = &self.links[i];
                    strata_protocol::api::compute::AsyncSafekeeper {
                        address: l.address.clone(),
                        lag_bytes: l.flush.map(|f| received.0.saturating_sub(f.0)),
                        streaming: matches!(l.phase, LinkPhase::Streaming { .. }),
                    }
                })
                .collect(),
            async_dropped: self.async_dropped,
            acks: self.acks,
            ack_wait_seconds: self.ack_wait.as_secs_f64(),
        });
    }

    /// Notes that PostgreSQL's WAL up to `end` arrived now.
    fn received(&mut self, end: Lsn) {
        if self.ack_waits.back().is_some_and(|(lsn, _)| *lsn >= end) || self.ack_waits.len() >= ACK_WAITS {
            return;
        }
        self.ack_waits.push_back((end, self.cfg.clock.now()));
    }

    /// Handles one link event; returns an error if this proposer must stop.
    fn on_event(&mut self, ev: LinkEvent) -> Result<(), ProposerError> {
        match ev {
            LinkEvent::Connected { link, session, term, node_id, membership } => {
                if membership.generation > self.membership.generation {
                    self.adopt(membership)?;
                    self.publish();
                    return Ok(());
                }
                let l = &mut self.links[link];
                if l.id.is_some_and(|id| id != node_id) {
                    warn!(safekeeper = %l.address, %node_id, expected = ?l.id, "another safekeeper answers at this address; not counted");
                    return Ok(());
                }
                l.id = Some(node_id);
                l.session = session;
                l.phase = LinkPhase::Greeted;
                l.commit_sent = Lsn::INVALID;
                l.term_seen = term;
                if self.epoch.is_some() && term > self.term {
                    return Err(ProposerError::Superseded { ours: self.term, seen: term });
                }
                if self.term > 0 {
                    // Ask for its position (a vote if the election is still open).
                    self.request_position(link);
                } else {
                    self.maybe_start_election();
                }
            }
            LinkEvent::Disconnected { link, session, .. } => {
                if self.links[link].session == session {
                    self.links[link].phase = LinkPhase::Down;
                    // Its replicas' snapshots count again once it reconnects and says so.
                    self.links[link].feedback = StandbyFeedback::default();
                }
            }
            LinkEvent::Message { link, session, msg } => {
                if self.links[link].session != session {
                    // A greeting refused because a site failover sealed the
                    // timeline (the session never began): fenced for good,
                    // where other refusals of a greeting are retried.
                    let sealed = matches!(&msg, AcceptorMessage::Error(e) if e.code == ErrorCode::Sealed);
                    if sealed && session > self.links[link].session {
                        return self.on_message(link, msg);
                    }
                    return Ok(());
                }
                self.on_message(link, msg)?;
            }
        }
        self.publish();
        Ok(())
    }

    fn request_position(&mut self, link: usize) {
        self.links[link].phase = LinkPhase::VoteSent;
        self.links[link].last_request = self.cfg.clock.now();
        self.send(link, ProposerMessage::VoteRequest(VoteRequest { term: self.term }));
    }

    /// Asks again for the position of links that were too far behind to be
    /// streamed to (they catch up from their peers meanwhile).
    /// The oldest snapshot of any replica, as the safekeepers report them
    /// (each id on its own; 0: none), for the writer's slot.
    fn standby_feedback(&self) -> StandbyFeedback {
        let min = |f: fn(&StandbyFeedback) -> u64| {
            self.links.iter().map(|l| f(&l.feedback)).filter(|x| *x != 0).min().unwrap_or(0)
        };
        StandbyFeedback { xmin: min(|f| f.xmin), catalog_xmin: min(|f| f.catalog_xmin) }
    }

    fn retry_lagging(&mut self) {
        if self.epoch.is_none() {
            return;
        }
        for i in 0..self.links.len() {
            let l = &self.links[i];
            if l.phase == LinkPhase::VoteSent && self.cfg.clock.since(l.last_request) > POSITION_RETRY {
                self.request_position(i);
            }
        }
    }

    fn maybe_start_election(&mut self) {
        let greeted: Vec<usize> =
            (0..self.links.len()).filter(|&i| self.links[i].phase == LinkPhase::Greeted).collect();
        if self.term > 0 || !self.is_quorum(&greeted) {
            return;
        }
        self.term = next_term(self.links.iter().map(|l| l.term_seen));
        debug_assert!(self.links.iter().all(|l| l.term_seen < self.term), "a term above every term seen");
        info!(term = self.term, "requesting votes");
        for i in greeted {
            self.links[i].phase = LinkPhase::VoteSent;
            self.send(i, ProposerMessage::VoteRequest(VoteRequest { term: self.term }));
        }
    }

    fn on_message(&mut self, link: usize, msg: AcceptorMessage) -> Result<(), ProposerError> {
        match msg {
            AcceptorMessage::VoteResponse(v) => {
                if v.term > self.term {
                    if self.epoch.is_some() {
                        return Err(ProposerError::Superseded { ours: self.term, seen: v.term });
                    }
                    // Someone else is electing: try again above them.
                    self.links[link].term_seen = v.term;
                    self.term = 0;
                    self.votes.clear();
                    for l in &mut self.links {
                        if l.phase == LinkPhase::VoteSent {
                            l.phase = LinkPhase::Greeted;
                        }
                    }
                    self.maybe_start_election();
                    return Ok(());
                }
                if v.term < self.term {
                    return Ok(()); // an answer to an older request
                }
                match &self.epoch {
                    None if v.vote_given => {
                        self.votes.push((link, v));
                        let voters: Vec<usize> = self.votes.iter().map(|(l, _)| *l).collect();
                        if self.is_quorum(&voters) {
                            self.win()?;
                            if self.buffer.is_some() {
                                // Elected again after a membership change: go on streaming.
                                self.continue_streaming()?;
                            }
                        }
                    }
                    None => {}
                    Some(_) => self.send_elected(link, &v),
                }
            }
            AcceptorMessage::AppendResponse(r) => {
                if r.term > self.term {
                    return Err(ProposerError::Superseded { ours: self.term, seen: r.term });
                }
                let l = &mut self.links[link];
                if l.phase == LinkPhase::ElectedSent {
                    // The answer to ProposerElected: its WAL now ends where we stream from.
                    l.phase = LinkPhase::Streaming { next: r.flush_lsn };
                }
                // Durable WAL in our term only grows.
                l.flush = Some(l.flush.map_or(r.flush_lsn, |f| f.max(r.flush_lsn)));
                l.consumer_applied = l.consumer_applied.max(r.consumer_applied_lsn);
                self.update_commit();
            }
            AcceptorMessage::Error(e) => {
                if e.code == ErrorCode::TermSuperseded {
                    return Err(ProposerError::Superseded { ours: self.term, seen: self.term + 1 });
                }
                if e.code == ErrorCode::Sealed {
                    return Err(ProposerError::Sealed(self.links[link].address.clone(), e.message));
                }
                if matches!(e.code, ErrorCode::Mismatch | ErrorCode::NotFound | ErrorCode::Version) {
                    return Err(ProposerError::Refused(self.links[link].address.clone(), e.message));
                }
                warn!(safekeeper = %self.links[link].address, "error: {:?}: {}", e.code, e.message);
            }
            AcceptorMessage::StandbyFeedback(f) => self.links[link].feedback = f,
            AcceptorMessage::Greeting(_) => {}
        }
        Ok(())
    }

    fn win(&mut self) -> Result<(), ProposerError> {
        // Elected only by a quorum of the configuration, each vote granted in this term.
        debug_assert!(self.epoch.is_none(), "one election per term");
        debug_assert!(self.is_quorum(&self.votes.iter().map(|(l, _)| *l).collect::<Vec<_>>()));
        // The voters decide the epoch; asynchronous members' votes come
        // last and only tell where their WAL continues.
        let mut votes = std::mem::take(&mut self.votes);
        votes.sort_by_key(|(l, _)| self.is_async(*l));
        self.votes = votes;
        let voting: Vec<VoteResponse> =
            self.votes.iter().filter(|(l, _)| !self.is_async(*l)).map(|(_, v)| v.clone()).collect();
        let epoch = elect(self.term, &voting).ok_or_else(|| ProposerError::Other("no votes".into()))?;
        debug_assert!(epoch.term == self.term && epoch.history.last_term() == self.term);
        info!(term = self.term, epoch_start = %epoch.start_lsn, donor = %self.links[self.votes[epoch.donor].0].address, generation = self.membership.generation, "elected");
        self.epoch = Some(epoch);
        self.elections += 1;
        Ok(())
    }

    /// After an election that a membership change caused: the new epoch must
    /// continue the WAL this proposer holds (its previous term's WAL, which
    /// a quorum of the old set — part of every joint quorum — holds), then
    /// each voter is told where its WAL continues.
    fn continue_streaming(&mut self) -> Result<(), ProposerError> {
        let epoch = self.epoch.as_ref().expect("just elected");
        let buffer = self.buffer.as_ref().expect("checked by the caller");
        let previous = epoch.history.0.iter().rev().nth(1).map_or(0, |t| t.term);
        let generation = self.membership.generation;
        if self.streamed_term != 0 && previous != self.streamed_term {
            return Err(ProposerError::Reconfigured {
                generation,
                why: format!("the new quorum's WAL ends in term {previous}, not in ours ({})", self.streamed_term),
            });
        }
        if epoch.start_lsn < buffer.start || epoch.start_lsn > buffer.complete_end {
            return Err(ProposerError::Reconfigured {
                generation,
                why: format!(
                    "the new epoch starts at {}, outside the WAL held ({}..{})",
                    epoch.start_lsn, buffer.start, buffer.complete_end
                ),
            });
        }
        let votes = self.votes.clone();
        for (link, v) in votes {
            self.send_elected(link, &v);
        }
        Ok(())
    }

    fn send_elected(&mut self, link: usize, v: &VoteResponse) {
        let epoch = self.epoch.as_ref().expect("elected");
        let end = self.buffer.as_ref().map_or(epoch.start_lsn, |b| b.complete_end);
        let mut current = epoch.clone();
        current.start_lsn = end.max(epoch.start_lsn);
        let start = start_streaming_at(&current, &v.term_history, v.flush_lsn, epoch.timeline_start_lsn);
        if let Some(b) = &self.buffer {
            if start < b.start {
                warn!(safekeeper = %self.links[link].address, %start, buffer_start = %b.start, "too far behind the buffered WAL; it must recover from its peers");
                return;
            }
        }
        let msg = ProposerElected {
            term: self.term,
            start_streaming_at: start,
            term_history: epoch.history.clone(),
            timeline_start_lsn: epoch.timeline_start_lsn,
        };
        self.links[link].phase = LinkPhase::ElectedSent;
        self.send(link, ProposerMessage::Elected(msg));
    }

    /// The most advanced consumer position any safekeeper reports (a
    /// pageserver streams from one of them).
    fn consumer_applied(&self) -> Lsn {
        self.links.iter().map(|l| l.consumer_applied).max().unwrap_or(Lsn::INVALID)
    }

    /// The LSN PostgreSQL may be told is flushed: the commit LSN, held back
    /// while consumers lag more than the configured limit (like
    /// max_replication_write_lag: writers wait instead of the lag growing).
    fn acknowledgeable(&mut self) -> Lsn {
        let applied = self.consumer_applied();
        let ack = match self.cfg.max_consumer_lag_bytes {
            Some(max) if applied != Lsn::INVALID => self.commit_lsn.min(Lsn(applied.0.saturating_add(max))),
            _ => self.commit_lsn,
        };
        let ack = match self.membership.async_rule() {
            // Commits wait while an asynchronous member is further behind
            // than the bound (one never heard from counts from the epoch start).
            Some((max_lag, OnAsyncLag::Throttle)) => {
                let base = self.epoch.as_ref().map_or(Lsn::INVALID, |e| e.start_lsn);
                (0..self.links.len())
                    .filter(|&i| self.is_async(i))
                    .map(|i| Lsn(self.links[i].flush.unwrap_or(base).0.saturating_add(max_lag)))
                    .fold(ack, Lsn::min)
            }
            _ => ack,
        };
        let ack = ack.max(self.acknowledged_lsn);
        // PostgreSQL is told flushed only what a quorum holds, and never less than before.
        debug_assert!(ack <= self.commit_lsn && ack >= self.acknowledged_lsn);
        match (ack < self.commit_lsn, self.throttled_since) {
            (true, None) => self.throttled_since = Some(self.cfg.clock.now()),
            (false, Some(since)) => {
                self.throttled += self.cfg.clock.since(since);
                self.throttled_since = None;
            }
            _ => {}
        }
        self.acknowledged_lsn = ack;
        while let Some(&(end, at)) = self.ack_waits.front().filter(|(end, _)| *end <= ack) {
            debug_assert!(end <= ack);
            self.ack_waits.pop_front();
            self.acks += 1;
            self.ack_wait += self.cfg.clock.since(at);
        }
        ack
    }

    fn update_commit(&mut self) {
        let Some(epoch) = &self.epoch else { return };
        let commit = advance_commit(self.commit_lsn, self.quorum_flush(), epoch.start_lsn);
        if commit > self.commit_lsn {
            self.commit_lsn = commit;
        }
    }

    /// When a commit LSN waiting to be sent on its own is due.
    fn commit_update_deadline(&self) -> Option<Instant> {
        self.commit_waiting_since.map(|since| since + self.commit_update_delay)
    }

    /// Under `local-quorum` with `on_async_lag = "fall-behind"`: an
    /// asynchronous member more than `max_async_lag` behind `complete` (and
    /// never more than half the buffer) stops being streamed to: the home
    /// site never waits for it, and it catches up from its peers; its
    /// position is asked again every few seconds.
    fn drop_lagging_async(&mut self, complete: Lsn) {
        let Some((max_lag, OnAsyncLag::FallBehind)) = self.membership.async_rule() else { return };
        let bound = max_lag.min(self.cfg.max_buffer_bytes as u64 / 2);
        let behind: Vec<usize> = (0..self.links.len())
            .filter(|&i| self.is_async(i))
            .filter(|&i| match self.links[i].phase {
                LinkPhase::Streaming { next } => {
                    complete.0.saturating_sub(self.links[i].flush.unwrap_or(next).0) > bound
                }
                _ => false,
            })
            .collect();
        for i in behind {
            warn!(safekeeper = %self.links[i].address, max_async_lag = bound, "an asynchronous safekeeper fell behind; it catches up from its peers");
            self.async_dropped += 1;
            self.request_position(i);
        }
    }

    /// Sends each streaming link what it lacks, within its in-flight bound;
    /// every append carries the commit LSN. A link with no WAL to send gets
    /// the commit LSN on its own once it has waited `commit_update_delay`:
    /// under load the next append carries it, and the safekeepers are spared
    /// a message (and the proposer an answer) per commit.
    fn pump(&mut self) {
        let Some(complete) = self.buffer.as_ref().map(|b| b.complete_end) else { return };
        self.drop_lagging_async(complete);
        let mut sends = Vec::new();
        let mut waiting = false;
        let now = self.cfg.clock.now();
        let commit_only_due = self.commit_update_deadline().is_some_and(|due| now >= due);
        for (i, l) in self.links.iter().enumerate() {
            let LinkPhase::Streaming { next } = l.phase else { continue };
            let flushed = l.flush.unwrap_or(next);
            let mut at = next;
            let mut msgs = Vec::new();
            while at < complete && at.0.saturating_sub(flushed.0) < self.cfg.max_in_flight_bytes {
                let to = Lsn((at.0 + self.cfg.max_append_bytes as u64).min(complete.0));
                msgs.push((at, to));
                at = to;
            }
            if msgs.is_empty() && self.commit_lsn > l.commit_sent {
                if self.commit_update_delay.is_zero() || commit_only_due {
                    msgs.push((at, at));
                } else {
                    waiting = true;
                }
            }
            if !msgs.is_empty() {
                sends.push((i, at, msgs));
            }
        }
        self.commit_waiting_since = match (waiting, self.commit_waiting_since) {
            (false, _) => None,
            (true, None) => Some(now),
            (true, since) => since,
        };
        // Held by every acceptor: unknown while one has not answered since
        // this proposer started (safekeepers remove WAL below it).
        let truncate = match self.links.iter().map(|l| l.flush).collect::<Option<Vec<Lsn>>>() {
            Some(flushes) => flushes.into_iter().min().unwrap_or(Lsn::INVALID),
            None => Lsn::INVALID,
        };
        // Links at the same position get the same appends: each is encoded
        // once, straight from the buffer, and its frame shared.
        let mut frames: Vec<(LsnRange, Arc<[u8]>)> = Vec::new();
        for (i, at, msgs) in sends {
            for (from, to) in msgs {
                let frame = match frames.iter().find(|(range, _)| *range == (from, to)) {
                    Some((_, frame)) => frame.clone(),
                    None => {
                        let mut out = Vec::new();
                        let wal = self.buffer.as_ref().expect("checked").parts(from, to);
                        codec::encode_append(self.term, from, self.commit_lsn, truncate, wal, &mut out);
                        let frame: Arc<[u8]> = out.into();
                        frames.push(((from, to), frame.clone()));
                        frame
                    }
                };
                self.send_command(i, LinkCommand::Frame(frame));
            }
            self.links[i].phase = LinkPhase::Streaming { next: at };
            self.links[i].commit_sent = self.commit_lsn;
        }
        self.commit_sent = self
            .links
            .iter()
            .filter(|l| matches!(l.phase, LinkPhase::Streaming { .. }))
            .map(|l| l.commit_sent)
            .min()
            .unwrap_or(self.commit_lsn);
        // Keep what some connected acceptor may still need.
        let keep = self
            .links
            .iter()
            .filter_map(|l| match l.phase {
                LinkPhase::Streaming { .. } => Some(l.flush.unwrap_or(Lsn::INVALID)),
                _ => None,
            })
            .min()
            .unwrap_or(self.commit_lsn)
            .min(self.commit_lsn);
        if let Some(b) = self.buffer.as_mut() {
            if b.bytes.len() > self.cfg.max_buffer_bytes / 2 {
                b.trim_to(keep);
            }
        }
    }
}

/// How long until `deadline` on `clock` (zero once it has passed).
fn until(clock: &dyn Clock, deadline: Instant) -> Duration {
    deadline.saturating_duration_since(clock.now())
}

/// Runs the election and brings a quorum to the epoch start: the first part
/// of both modes. Returns the core with a buffer ending at the epoch start.
async fn elect_and_sync(mut core: Core) -> Result<Core, ProposerError> {
    let clock = core.cfg.clock.clone();
    let deadline = clock.now() + QUORUM_WAIT;
    while core.epoch.is_none() {
        let ev = timeout(&*clock, until(&*clock, deadline), core.events.recv())
            .await
            .map_err(|_| ProposerError::Other("no quorum of safekeepers answered".into()))?
            .ok_or_else(|| ProposerError::Other("links stopped".into()))?;
        core.on_event(ev)?;
    }
    let epoch = core.epoch.clone().expect("elected");
    // Where each voter must start, and the WAL they lack from the donor.
    let mut min_start = epoch.start_lsn;
    // Asynchronous members far behind catch up from their peers rather
    // than through this buffer.
    for (_, v) in core.votes.iter().filter(|(l, _)| !core.is_async(*l)) {
        let s = start_streaming_at(&epoch, &v.term_history, v.flush_lsn, epoch.timeline_start_lsn);
        min_start = min_start.min(s);
    }
    let mut buffer = WalBuffer { start: min_start, bytes: VecDeque::new(), complete_end: min_start };
    if min_start < epoch.start_lsn {
        let donor = core.votes[epoch.donor].0;
        let address = core.links[donor].address.clone();
        let donor = crate::wal_fetch::Donor {
            address: &address,
            tenant_id: core.cfg.timeline.tenant_id,
            timeline_id: core.cfg.timeline.timeline_id,
            timeout: core.cfg.timeout,
            token: &core.cfg.token,
            tls: core.cfg.tls.as_ref(),
            clock: &*core.cfg.clock,
        };
        let (_, wal) =
            crate::wal_fetch::fetch_wal(&donor, min_start, epoch.start_lsn).await.map_err(ProposerError::Other)?;
        buffer.bytes.extend(wal);
        buffer.complete_end = epoch.start_lsn;
    }
    core.buffer = Some(buffer);
    let votes = core.votes.clone();
    for (link, v) in votes {
        core.send_elected(link, &v);
    }
    core.publish();
    Ok(core)
}

/// `strata compute sync-safekeepers`: elects a proposer, makes a quorum hold
/// the WAL up to the epoch start and commits it; returns that LSN (the end of
/// the timeline's WAL, where a new compute starts).
pub async fn sync_safekeepers(cfg: ProposerConfig) -> Result<Lsn, ProposerError> {
    let (status, _) = tokio::sync::watch::channel(ProposerStatus::default());
    let mut core = elect_and_sync(Core::start(cfg, status)).await?;
    let end = core.epoch.as_ref().expect("elected").start_lsn;
    let clock = core.cfg.clock.clone();
    let deadline = clock.now() + QUORUM_WAIT;
    // Done when a quorum has acknowledged a commit LSN of `end`.
    loop {
        core.pump();
        let acked: Vec<usize> =
            (0..core.links.len()).filter(|&i| core.links[i].flush.is_some_and(|f| f >= end)).collect();
        if core.epoch.is_some() && core.is_quorum(&acked) && core.commit_lsn >= end && core.commit_sent >= end {
            // One more round so acceptors persist the commit LSN.
            clock.sleep(LAST_COMMIT_DELIVERY).await;
            return Ok(end);
        }
        let ev = timeout(&*clock, until(&*clock, deadline), core.events.recv())
            .await
            .map_err(|_| ProposerError::Other("safekeepers did not catch up".into()))?
            .ok_or_else(|| ProposerError::Other("links stopped".into()))?;
        core.on_event(ev)?;
    }
}

/// Runs the proposer for a live PostgreSQL until it loses its term or fails.
/// The end of PostgreSQL's replication stream is an error here; see
/// [`run_until_shutdown`] for a proposer that is told PostgreSQL is stopping.
pub async fn run(
    cfg: ProposerConfig,
    pg: ReplicationConfig,
    slot: Option<String>,
    status: tokio::sync::watch::Sender<ProposerStatus>,
) -> Result<(), ProposerError> {
    run_inner(cfg, pg, slot, status, None, false).await.map(|_| ())
}

/// Like [`run`], for a PostgreSQL that may be asked to stop. Once `shutdown`
/// is true, the end of the replication stream (PostgreSQL's walsender ends it
/// after sending the WAL of its shutdown checkpoint) is the normal end: the
/// proposer waits, at most `drain_timeout`, until a quorum of safekeepers holds
/// every complete record received, and returns the commit LSN. If `shutdown`
/// turns true before streaming began, it returns [`Lsn::INVALID`] at once:
/// no commit can have been acknowledged yet.
pub async fn run_until_shutdown(
    cfg: ProposerConfig,
    pg: ReplicationConfig,
    slot: Option<String>,
    status: tokio::sync::watch::Sender<ProposerStatus>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    drain_timeout: Duration,
) -> Result<Lsn, ProposerError> {
    run_inner(cfg, pg, slot, status, Some((shutdown, drain_timeout)), false).await.map(|e| e.commit)
}

/// Where a followed server's WAL ended ([`follow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceEnd {
    /// The commit LSN: a quorum of safekeepers holds every record before it.
    pub end: Lsn,
    /// The last record before `end` is a shutdown checkpoint: the server
    /// the WAL comes from was shut down cleanly and wrote nothing after.
    pub shut_down: bool,
}

/// Like [`run_until_shutdown`] for a server whose stream ending is always
/// the normal end: a relay of a database being imported, stopped to cut
/// over (`docs/import.md`, "Streaming import"). Returns, once a quorum
/// holds every complete record received, where the WAL ended and whether
/// it ended with the source's shutdown checkpoint.
pub async fn follow(
    cfg: ProposerConfig,
    pg: ReplicationConfig,
    slot: Option<String>,
    status: tokio::sync::watch::Sender<ProposerStatus>,
    drain_timeout: Duration,
) -> Result<SourceEnd, ProposerError> {
    // Already true: every end of the stream drains.
    let (_stop, stopped) = tokio::sync::watch::channel(true);
    let ended = run_inner(cfg, pg, slot, status, Some((stopped, drain_timeout)), true).await?;
    Ok(SourceEnd { end: ended.commit, shut_down: ended.commit != Lsn::INVALID && ended.commit == ended.shutdown_end })
}

/// How [`run_inner`] ended.
struct Ended {
    commit: Lsn,
    /// The end of the last complete record received when that record is a
    /// shutdown checkpoint; [`Lsn::INVALID`] otherwise.
    shutdown_end: Lsn,
}

/// Runs the proposer that `make` returns ([`run`] or
/// [`run_until_shutdown`]) on a thread of its own ([`crate::dedicated`]):
/// the commit path of every transaction runs there, undisturbed by other
/// work and without waking other threads.
pub async fn on_own_thread<T, M, F>(make: M) -> Result<T, ProposerError>
where
    M: FnOnce() -> F + Send + 'static,
    F: std::future::Future<Output = Result<T, ProposerError>> + 'static,
    T: Send + 'static,
{
    crate::dedicated::run_on_own_thread("wal-proposer", make)
        .await
        .unwrap_or_else(|e| Err(ProposerError::Other(e.to_string())))
}

/// Resolves once `shutdown` holds true; never if there is no receiver or
/// its sender is gone without saying so.
async fn shutdown_requested(shutdown: &mut Option<(tokio::sync::watch::Receiver<bool>, Duration)>) {
    match shutdown {
        Some((rx, _)) => {
            if rx.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// The drain timeout once a shutdown was requested; `None` while running.
fn stopping(shutdown: &Option<(tokio::sync::watch::Receiver<bool>, Duration)>) -> Option<Duration> {
    match shutdown {
        Some((rx, drain_timeout)) if *rx.borrow() => Some(*drain_timeout),
        _ => None,
    }
}

/// Connects to PostgreSQL, wins an election, brings a quorum to the epoch
/// start and starts PostgreSQL's replication stream there.
async fn connect_and_elect(
    cfg: ProposerConfig,
    pg: &ReplicationConfig,
    slot: Option<&str>,
    status: tokio::sync::watch::Sender<ProposerStatus>,
) -> Result<(Core, WalDecoder, ReplicationStream), ProposerError> {
    let pg_err = |e: crate::pg_replication::PgError| ProposerError::Postgres(e.to_string());
    let mut conn = ReplicationConnection::connect(pg).await.map_err(pg_err)?;
    let system = conn.identify_system().await.map_err(pg_err)?;
    if system.system_id != cfg.timeline.system_id {
        return Err(ProposerError::Postgres(format!(
            "PostgreSQL's system id {} is not the timeline's {}",
            system.system_id, cfg.timeline.system_id
        )));
    }
    if let Some(slot) = slot {
        conn.create_physical_slot(slot).await.map_err(pg_err)?;
    }
    let segment_size = u64::from(cfg.timeline.wal_segment_size);
    let version = PgVersion::from_major(cfg.timeline.pg_version)
        .ok_or_else(|| ProposerError::Other(format!("PostgreSQL {} is not supported", cfg.timeline.pg_version)))?;
    let core = elect_and_sync(Core::start(cfg, status)).await?;
    let epoch = core.epoch.clone().expect("elected");
    if epoch.start_lsn > system.xlogpos {
        return Err(ProposerError::PostgresBehind { epoch_start: epoch.start_lsn, pg_end: system.xlogpos });
    }
    let start = epoch.start_lsn;
    let mode =
        if start == epoch.timeline_start_lsn { StartPosition::FindFirstRecord } else { StartPosition::RecordBoundary };
    let decoder = WalDecoder::new(version, start, segment_size, mode);
    let stream = conn.start_physical(slot, start, system.timeline).await.map_err(pg_err)?;
    info!(%start, "streaming WAL from PostgreSQL");
    Ok((core, decoder, stream))
}

async fn run_inner(
    cfg: ProposerConfig,
    pg: ReplicationConfig,
    slot: Option<String>,
    status: tokio::sync::watch::Sender<ProposerStatus>,
    mut shutdown: Option<(tokio::sync::watch::Receiver<bool>, Duration)>,
    following: bool,
) -> Result<Ended, ProposerError> {
    let pg_err = |e: crate::pg_replication::PgError| ProposerError::Postgres(e.to_string());
    let (mut core, mut decoder, mut stream) = tokio::select! {
        r = connect_and_elect(cfg, &pg, slot.as_deref(), status) => r?,
        _ = shutdown_requested(&mut shutdown), if !following => {
            info!("shutdown requested before PostgreSQL's WAL was streamed");
            return Ok(Ended { commit: Lsn::INVALID, shutdown_end: Lsn::INVALID });
        }
    };
    let mut shutdown_end = Lsn::INVALID;
    let drained = |commit: Lsn, shutdown_end: Lsn| Ended { commit, shutdown_end };
    core.streaming = true;
    core.commit_update_delay = crate::limits::COMMIT_UPDATE_DELAY;
    core.publish();
    let clock = core.cfg.clock.clone();
    let mut tick = clock.sleep(LAGGING_CHECK_INTERVAL);
    // The wait for a commit LSN to be due, kept while its deadline stays.
    let mut commit_wait: Option<(Instant, Sleep)> = None;
    let mut reported = Lsn::INVALID;
    let mut last_report = clock.now();
    let mut feedback_reported = StandbyFeedback::default();
    loop {
        let buffer_full = core.buffer.as_ref().is_some_and(|b| b.bytes.len() >= core.cfg.max_buffer_bytes);
        let commit_due = core.commit_update_deadline();
        if commit_wait.as_ref().map(|(at, _)| *at) != commit_due {
            commit_wait = commit_due.map(|at| (at, clock.sleep(until(&*clock, at))));
        }
        tokio::select! {
            ev = core.events.recv() => {
                let ev = ev.ok_or_else(|| ProposerError::Other("links stopped".into()))?;
                core.on_event(ev)?;
            }
            msg = stream.next(), if !buffer_full => {
                let msg = match msg {
                    Ok(msg) => msg,
                    // A stopping server may close the connection less tidily
                    // than with the end of the stream; what arrived is still
                    // made durable.
                    Err(e) => match stopping(&shutdown) {
                        Some(drain_timeout) => {
                            warn!("replication stream failed during shutdown: {e}");
                            return drain(core, drain_timeout).await.map(|c| drained(c, shutdown_end));
                        }
                        None => return Err(pg_err(e)),
                    },
                };
                match msg {
                    ReplicationEvent::XLogData { start: at, data, .. } => {
                        let b = core.buffer.as_mut().expect("set by sync");
                        if at != b.end() {
                            return Err(ProposerError::Wal(format!("WAL at {at}, expected {}", b.end())));
                        }
                        b.bytes.extend(data.iter());
                        decoder.feed(&data);
                        loop {
                            match decoder.next_record() {
                                Ok(Some(r)) => {
                                    b.complete_end = r.end_lsn.min(b.end());
                                    shutdown_end = if is_shutdown_checkpoint(&r) { b.complete_end } else { Lsn::INVALID };
                                }
                                Ok(None) => break,
                                Err(e) => return Err(ProposerError::Wal(e.to_string())),
                            }
                        }
                        let end = b.complete_end;
                        core.received(end);
                    }
                    ReplicationEvent::Keepalive { reply_requested, .. } => {
                        if reply_requested {
                            let ack = core.acknowledgeable();
                            if let Err(e) = stream.send_status(ack, ack, ack, false).await {
                                return match stopping(&shutdown) {
                                    Some(drain_timeout) => drain(core, drain_timeout).await.map(|c| drained(c, shutdown_end)),
                                    None => Err(pg_err(e)),
                                };
                            }
                        }
                    }
                    ReplicationEvent::End => {
                        return match stopping(&shutdown) {
                            Some(drain_timeout) => drain(core, drain_timeout).await.map(|c| drained(c, shutdown_end)),
                            None => Err(ProposerError::Postgres("replication stream ended".into())),
                        };
                    }
                }
            }
            _ = &mut tick => {
                tick = clock.sleep(LAGGING_CHECK_INTERVAL);
                core.retry_lagging();
            }
            _ = async { commit_wait.as_mut().expect("checked").1.as_mut().await }, if commit_wait.is_some() => {
                commit_wait = None;
            }
        }
        core.pump();
        let ack = core.acknowledgeable();
        if ack > reported || clock.since(last_report) > STATUS_REPORT_INTERVAL {
            // What a quorum holds is what PostgreSQL may consider flushed.
            if let Err(e) = stream.send_status(ack, ack, ack, false).await {
                return match stopping(&shutdown) {
                    Some(drain_timeout) => drain(core, drain_timeout).await.map(|c| drained(c, shutdown_end)),
                    None => Err(pg_err(e)),
                };
            }
            reported = ack;
            last_report = clock.now();
        }
        // The replicas' oldest snapshots hold the writer's slot back
        // (hot_standby_feedback through the safekeepers).
        let feedback = core.standby_feedback();
        if feedback != feedback_reported {
            if let Err(e) = stream.send_hot_standby_feedback(feedback.xmin, feedback.catalog_xmin).await {
                return match stopping(&shutdown) {
                    Some(drain_timeout) => drain(core, drain_timeout).await.map(|c| drained(c, shutdown_end)),
                    None => Err(pg_err(e)),
                };
            }
            feedback_reported = feedback;
        }
        core.publish();
    }
}

/// An XLOG_CHECKPOINT_SHUTDOWN record (the same on every major).
fn is_shutdown_checkpoint(r: &strata_formats::wal::DecodedRecord) -> bool {
    use strata_formats::v15::rmgr::{RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN};
    r.header.rmgr == RM_XLOG_ID && r.header.rmgr_info() & 0xF0 == XLOG_CHECKPOINT_SHUTDOWN
}

/// After PostgreSQL's stream ended at shutdown: keeps the safekeepers going
/// until a quorum holds every complete record received (and was sent that
/// commit LSN), at most `limit`. Returns the commit LSN.
async fn drain(mut core: Core, limit: Duration) -> Result<Lsn, ProposerError> {
    core.streaming = false;
    core.commit_update_delay = Duration::ZERO;
    let (target, received) = core.buffer.as_ref().map_or((Lsn::INVALID, Lsn::INVALID), |b| (b.complete_end, b.end()));
    if received > target {
        warn!(%target, %received, "the replication stream ended inside a record; its start is not sent");
    }
    info!(%target, "PostgreSQL's replication stream ended at shutdown; waiting for the safekeepers");
    let clock = core.cfg.clock.clone();
    let deadline = clock.now() + limit;
    loop {
        core.pump();
        core.publish();
        if core.commit_lsn >= target && core.commit_sent >= target {
            // Give the links a moment to deliver the last commit LSN.
            clock.sleep(LAST_COMMIT_DELIVERY).await;
            info!(commit_lsn = %core.commit_lsn, "all WAL received is on a quorum of safekeepers");
            return Ok(core.commit_lsn);
        }
        let ev = timeout(&*clock, until(&*clock, deadline), core.events.recv())
            .await
            .map_err(|_| {
                ProposerError::Other(format!(
                    "safekeepers did not confirm the WAL up to {target} within {limit:?} (commit LSN {})",
                    core.commit_lsn
                ))
            })?
            .ok_or_else(|| ProposerError::Other("links stopped".into()))?;
        core.on_event(ev)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::{TenantId, TimelineId};
    use strata_service::clock::ManualClock;

    #[test]
    fn a_slice_of_the_buffer_is_the_same_whichever_way_the_ring_wraps() {
        // Trimming the front and appending makes the ring wrap: every slice
        // must read as the bytes in LSN order.
        let mut b = WalBuffer { start: Lsn(1000), bytes: VecDeque::with_capacity(16), complete_end: Lsn(1000) };
        b.bytes.extend(0u8..12);
        b.trim_to(Lsn(1008));
        b.bytes.extend(12u8..20);
        let (front, back) = b.bytes.as_slices();
        assert!(!front.is_empty() && !back.is_empty(), "the ring wraps");
        let all: Vec<u8> = (8u8..20).collect();
        for from in 0..=all.len() {
            for to in from..=all.len() {
                let got = b.slice(Lsn(1008 + from as u64), Lsn(1008 + to as u64));
                assert_eq!(got, all[from..to], "slice {from}..{to}");
            }
        }
    }

    /// Waits (in real time: connection attempts are real I/O) until `ready`.
    async fn settle(ready: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if ready() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never settled");
    }

    /// The timeline of the clock tests (nothing checks its values).
    fn test_identity() -> TimelineIdentity {
        TimelineIdentity {
            tenant_id: TenantId([1; 16]),
            timeline_id: TimelineId([2; 16]),
            system_id: 1,
            pg_version: 15,
            wal_segment_size: 16 << 20,
        }
    }

    #[tokio::test]
    async fn the_election_gives_up_only_once_the_clock_passes_the_quorum_wait() {
        // Nobody listens there: every link fails and backs off on the clock.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let identity = test_identity();
        let clock = ManualClock::new();
        let mut cfg = ProposerConfig::new(vec![format!("127.0.0.1:{port}"); 3], identity);
        cfg.clock = SharedClock::new(clock.clone());
        let sync = tokio::spawn(sync_safekeepers(cfg));
        // Three links backing off and the election's wait for a quorum.
        settle(|| clock.sleeping() == 4).await;
        clock.advance(QUORUM_WAIT - Duration::from_millis(1));
        settle(|| clock.sleeping() == 4).await;
        assert!(!sync.is_finished(), "gave up before the quorum wait ended");
        clock.advance(Duration::from_millis(1));
        let err = tokio::time::timeout(Duration::from_secs(10), sync).await.expect("gave up").unwrap().unwrap_err();
        assert!(err.to_string().contains("no quorum of safekeepers answered"), "{err}");
    }

    /// A core on `clock` with no safekeepers configured (so no link task)
    /// and one link, "sk" in session 1 at `phase`, whose commands the test
    /// reads from the receiver.
    fn core_with_one_link(clock: &ManualClock, phase: LinkPhase) -> (Core, mpsc::Receiver<(u64, LinkCommand)>) {
        let mut cfg = ProposerConfig::new(Vec::new(), test_identity());
        cfg.clock = SharedClock::new(clock.clone());
        let (status, _) = tokio::sync::watch::channel(ProposerStatus::default());
        let mut core = Core::start(cfg, status);
        let (commands, sent) = mpsc::channel(16);
        core.links.push(Link {
            address: "sk".into(),
            id: None,
            session: 1,
            phase,
            term_seen: 0,
            flush: None,
            commands,
            last_request: clock.now(),
            consumer_applied: Lsn::INVALID,
            commit_sent: Lsn::INVALID,
            feedback: StandbyFeedback::default(),
        });
        (core, sent)
    }

    #[test]
    fn a_link_is_asked_for_its_position_again_only_after_the_retry_interval() {
        let clock = ManualClock::new();
        let (mut core, mut sent) = core_with_one_link(&clock, LinkPhase::Greeted);
        core.term = 3;
        core.epoch = Some(Epoch {
            term: 3,
            start_lsn: Lsn(0x100),
            timeline_start_lsn: Lsn(0x100),
            history: Default::default(),
            donor: 0,
        });
        core.request_position(0);
        assert!(matches!(sent.try_recv(), Ok((1, LinkCommand::Message(ProposerMessage::VoteRequest(_))))));
        clock.advance(POSITION_RETRY);
        core.retry_lagging();
        assert!(sent.try_recv().is_err(), "not before the interval has passed");
        clock.advance(Duration::from_millis(1));
        core.retry_lagging();
        assert!(matches!(
            sent.try_recv(),
            Ok((1, LinkCommand::Message(ProposerMessage::VoteRequest(VoteRequest { term: 3 }))))
        ));
        core.retry_lagging();
        assert!(sent.try_recv().is_err(), "asked once per interval");
    }

    #[test]
    fn a_greeting_refused_as_sealed_fences_the_proposer_and_other_refusals_are_retried() {
        let clock = ManualClock::new();
        let (mut core, _sent) = core_with_one_link(&clock, LinkPhase::Down);
        let refusal = |session, code| LinkEvent::Message {
            link: 0,
            session,
            msg: AcceptorMessage::Error(strata_protocol::safekeeper::ErrorMessage { code, message: "no".into() }),
        };
        // A timeline not (yet) on that safekeeper: the link tries again.
        assert!(core.on_event(refusal(2, ErrorCode::NotFound)).is_ok());
        let err = core.on_event(refusal(3, ErrorCode::Sealed)).unwrap_err();
        assert!(matches!(err, ProposerError::Sealed(..)) && err.is_fenced(), "{err}");
    }
}
