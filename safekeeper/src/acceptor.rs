//! The acceptor side of the safekeeper protocol for one timeline.
//!
//! Safety rests on four rules (argued in `docs/safekeeper-protocol.md`):
//! a vote is given only for a term higher than any seen, and the term is
//! durable before the answer; appends are accepted only in the current term
//! after its ProposerElected; only fsynced WAL is acknowledged; the term
//! history is reported only up to the flushed WAL. Each is asserted where
//! it holds (`debug_assert!`, on in every test build), and so are the
//! invariants they rest on: the durable state's term, commit and truncate
//! LSNs and membership generation never go back (`persist_state`), and the
//! commit LSN never passes the flushed WAL (`check_positions`).

use strata_formats::Lsn;
use strata_protocol::safekeeper::{
    AcceptorGreeting, AcceptorMessage, AppendRequest, AppendResponse, ErrorCode, ErrorMessage, Membership,
    ProposerElected, ProposerGreeting, ProposerMessage, Term, TermHistory, TimelineIdentity, VoteRequest, VoteResponse,
    OLDEST_GREETING_VERSION, PROTOCOL_VERSION,
};
use strata_protocol::shard::ShardIndex;
use strata_protocol::NodeId;

/// What the acceptor keeps durably (the control file).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PersistentState {
    pub identity: TimelineIdentityState,
    pub timeline_start_lsn: Lsn,
    /// The highest term voted in or followed.
    pub term: Term,
    /// Terms of the WAL held (entries past the flushed WAL describe WAL not yet received).
    pub term_history: TermHistory,
    pub commit_lsn: Lsn,
    /// WAL below this is held by every acceptor.
    pub truncate_lsn: Lsn,
    /// Flushed WAL end when the state was last written; the real end is found
    /// by reading the WAL from here at start-up.
    pub flush_lsn_hint: Lsn,
    /// The timeline's membership configuration (absent in control files
    /// written before membership existed: generation 0).
    #[serde(default)]
    pub membership: Membership,
    /// The membership generation under which the last term in
    /// `term_history` was elected (a membership change waits for an
    /// election under its joint configuration).
    #[serde(default)]
    pub elected_generation: u32,
    /// The newest attachment generation a pageserver has streamed this
    /// timeline under; consumers of older generations are refused (kept
    /// here so that a restart does not let a fenced pageserver back in).
    #[serde(default)]
    pub pageserver_generation: u32,
    /// The same for each shard of a sharded tenant (`<n>of<count>`): each
    /// shard is attached, and fails over, on its own. At most one entry
    /// per shard of each layout the tenant has had.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub shard_generations: std::collections::BTreeMap<String, u32>,
    /// Sealed by a site failover (`docs/sites.md`): no proposer is ever
    /// accepted again, and the WAL held is final (consumers still read it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sealed: bool,
    /// The commit LSN when it was sealed: what its writer had had
    /// acknowledged (the seal commits the rest of the flushed WAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_before_seal: Option<Lsn>,
}

/// `TimelineIdentity` in a serializable form.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TimelineIdentityState {
    pub tenant_id: strata_protocol::TenantId,
    pub timeline_id: strata_protocol::TimelineId,
    pub system_id: u64,
    pub pg_version: u32,
    pub wal_segment_size: u32,
}

impl From<&TimelineIdentity> for TimelineIdentityState {
    fn from(t: &TimelineIdentity) -> Self {
        TimelineIdentityState {
            tenant_id: t.tenant_id,
            timeline_id: t.timeline_id,
            system_id: t.system_id,
            pg_version: t.pg_version,
            wal_segment_size: t.wal_segment_size,
        }
    }
}

impl TimelineIdentityState {
    /// The identity as sent on the wire.
    pub fn to_identity(&self) -> TimelineIdentity {
        TimelineIdentity {
            tenant_id: self.tenant_id,
            timeline_id: self.timeline_id,
            system_id: self.system_id,
            pg_version: self.pg_version,
            wal_segment_size: self.wal_segment_size,
        }
    }
}

/// How [`PersistentState::shard_generations`] names a shard.
fn shard_key(shard: ShardIndex) -> String {
    format!("{}of{}", shard.number, shard.count)
}

impl PersistentState {
    /// The newest attachment generation `shard` has streamed under (0: none yet).
    pub fn pageserver_generation_of(&self, shard: ShardIndex) -> u32 {
        match shard.is_unsharded() {
            true => self.pageserver_generation,
            false => self.shard_generations.get(&shard_key(shard)).copied().unwrap_or(0),
        }
    }

    /// State of a new, empty timeline whose WAL starts at `timeline_start_lsn`.
    pub fn new(identity: &TimelineIdentity, timeline_start_lsn: Lsn) -> PersistentState {
        PersistentState {
            identity: identity.into(),
            timeline_start_lsn,
            term: 0,
            term_history: TermHistory::default(),
            commit_lsn: timeline_start_lsn,
            truncate_lsn: timeline_start_lsn,
            flush_lsn_hint: timeline_start_lsn,
            membership: Membership::default(),
            elected_generation: 0,
            pageserver_generation: 0,
            shard_generations: Default::default(),
            sealed: false,
            commit_before_seal: None,
        }
    }
}

/// Durable storage of a timeline's WAL.
pub trait WalStore {
    /// Writes `bytes` at `at`, which must equal `write_lsn()`; not yet durable.
    fn write(&mut self, at: Lsn, bytes: &[u8]) -> Result<(), StorageError>;
    /// Makes everything written durable.
    fn flush(&mut self) -> Result<(), StorageError>;
    /// Durably removes all WAL from `at` on.
    fn truncate(&mut self, at: Lsn) -> Result<(), StorageError>;
    /// End of the WAL written.
    fn write_lsn(&self) -> Lsn;
    /// End of the WAL made durable.
    fn flush_lsn(&self) -> Lsn;
}

/// Durable storage of `PersistentState`, replaced atomically.
pub trait ControlStore {
    fn persist(&mut self, state: &PersistentState) -> Result<(), StorageError>;
}

/// A storage failure, naming the operation and the file. The timeline
/// stops accepting until it has re-read its state from disk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} {}: {message}", path.display())]
pub struct StorageError {
    /// What was being done ("syncing", "writing", …).
    pub op: &'static str,
    pub path: std::path::PathBuf,
    /// The operating system's error number, if the error came from it.
    pub errno: Option<i32>,
    pub message: String,
}

impl From<strata_service::durable::FileError> for StorageError {
    fn from(e: strata_service::durable::FileError) -> StorageError {
        StorageError::io(e.op, &e.path, &e.source)
    }
}

impl StorageError {
    /// An I/O error of `op` on `path`.
    pub fn io(op: &'static str, path: &std::path::Path, e: &std::io::Error) -> StorageError {
        StorageError { op, path: path.to_path_buf(), errno: e.raw_os_error(), message: e.to_string() }
    }

    /// Any other failure of `op` on `path`.
    pub fn other(op: &'static str, path: &std::path::Path, message: impl Into<String>) -> StorageError {
        StorageError { op, path: path.to_path_buf(), errno: None, message: message.into() }
    }
}

/// Why the acceptor refused a message; the connection is closed after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcceptorError {
    #[error("protocol version {0} is not supported (this safekeeper speaks {PROTOCOL_VERSION})")]
    Version(u32),
    #[error("timeline identity differs: {0}")]
    Mismatch(String),
    #[error("term {offered} is older than the current term {current}")]
    TermSuperseded { offered: Term, current: Term },
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("the membership configuration is now of generation {current}, not {session}")]
    MembershipChanged { session: u32, current: u32 },
    #[error("this safekeeper is no member of the timeline's configuration (generation {generation})")]
    NotMember { generation: u32 },
    #[error("the timeline is sealed (a site failover forked it): it accepts no writer")]
    Sealed,
}

impl AcceptorError {
    /// The message sent to the peer before closing.
    pub fn to_message(&self) -> AcceptorMessage {
        let code = match self {
            AcceptorError::Version(_) => ErrorCode::Version,
            AcceptorError::Mismatch(_) => ErrorCode::Mismatch,
            AcceptorError::TermSuperseded { .. } => ErrorCode::TermSuperseded,
            AcceptorError::Protocol(_) => ErrorCode::Protocol,
            AcceptorError::Storage(_) => ErrorCode::Storage,
            AcceptorError::MembershipChanged { .. } | AcceptorError::NotMember { .. } => ErrorCode::MembershipChanged,
            AcceptorError::Sealed => ErrorCode::Sealed,
        };
        AcceptorMessage::Error(ErrorMessage { code, message: self.to_string() })
    }
}

/// One timeline's acceptor.
pub struct Acceptor<W: WalStore, C: ControlStore> {
    node_id: NodeId,
    state: PersistentState,
    wal: W,
    control: C,
    /// The term whose ProposerElected was accepted; appends need it.
    elected_term: Option<Term>,
    /// Commit LSN announced by the proposer, applied once flushed WAL reaches it.
    announced_commit_lsn: Lsn,
    announced_truncate_lsn: Lsn,
    /// The term the control store holds: what a restart would find.
    durable_term: Term,
}

impl<W: WalStore, C: ControlStore> Acceptor<W, C> {
    /// An acceptor over recovered state and WAL (whose end has been found).
    pub fn new(node_id: NodeId, state: PersistentState, wal: W, control: C) -> Acceptor<W, C> {
        let announced_commit_lsn = state.commit_lsn;
        let announced_truncate_lsn = state.truncate_lsn;
        let durable_term = state.term;
        Acceptor {
            node_id,
            state,
            wal,
            control,
            elected_term: None,
            announced_commit_lsn,
            announced_truncate_lsn,
            durable_term,
        }
    }

    /// Makes `next` durable, then current. Every change of the term, the
    /// history, the membership or the positions it records goes through
    /// here, so that what the acceptor answers with is what a restart finds.
    fn persist_state(&mut self, next: PersistentState) -> Result<(), AcceptorError> {
        let now = &self.state;
        debug_assert!(next.term >= now.term, "the term goes back from {} to {}", now.term, next.term);
        debug_assert!(next.commit_lsn >= now.commit_lsn, "the commit LSN goes back");
        debug_assert!(next.truncate_lsn >= now.truncate_lsn, "the truncate LSN goes back");
        debug_assert!(next.membership.generation >= now.membership.generation, "the generation goes back");
        debug_assert!(next.pageserver_generation >= now.pageserver_generation, "the pageserver generation goes back");
        debug_assert!(next.sealed || !now.sealed, "a seal is never undone");
        debug_assert!(next.term_history.last_term() <= next.term, "a history past the term");
        debug_assert_eq!(next.identity, now.identity, "a timeline's identity never changes");
        self.control.persist(&next)?;
        self.durable_term = next.term;
        self.state = next;
        Ok(())
    }

    /// The positions every answer reports: the commit LSN is never past
    /// the flushed WAL, nor the flushed past the written.
    fn check_positions(&self) {
        let (commit, flush, write) = (self.state.commit_lsn, self.wal.flush_lsn(), self.wal.write_lsn());
        debug_assert!(commit <= flush, "commit LSN {commit} past the flushed WAL {flush}");
        debug_assert!(flush <= write, "flushed WAL {flush} past the written {write}");
    }

    pub fn state(&self) -> &PersistentState {
        &self.state
    }

    pub fn wal(&self) -> &W {
        &self.wal
    }

    pub fn wal_mut(&mut self) -> &mut W {
        &mut self.wal
    }

    /// End of the durable WAL.
    pub fn flush_lsn(&self) -> Lsn {
        self.wal.flush_lsn()
    }

    /// The term history of the WAL actually held.
    pub fn held_history(&self) -> TermHistory {
        self.state.term_history.up_to(self.wal.flush_lsn())
    }

    /// Handles one message. Appends are written but not flushed: the caller
    /// batches them and calls `flush` (group commit), which produces the
    /// acknowledgement.
    pub fn handle(&mut self, msg: &ProposerMessage) -> Result<Option<AcceptorMessage>, AcceptorError> {
        // Also for a session that began before the seal: nothing more is accepted.
        if self.state.sealed {
            return Err(AcceptorError::Sealed);
        }
        if !matches!(msg, ProposerMessage::Greeting(_)) {
            self.check_member()?;
        }
        match msg {
            ProposerMessage::Greeting(g) => self.greeting(g).map(Some),
            ProposerMessage::VoteRequest(v) => self.vote(v).map(Some),
            ProposerMessage::Elected(e) => self.elected(e).map(Some),
            ProposerMessage::Append(a) => self.append(a).map(|()| None),
        }
    }

    fn greeting(&mut self, g: &ProposerGreeting) -> Result<AcceptorMessage, AcceptorError> {
        if !(OLDEST_GREETING_VERSION..=PROTOCOL_VERSION).contains(&g.protocol_version) {
            return Err(AcceptorError::Version(g.protocol_version));
        }
        let mine = &self.state.identity;
        let theirs = &g.timeline;
        if (mine.tenant_id, mine.timeline_id) != (theirs.tenant_id, theirs.timeline_id) {
            return Err(AcceptorError::Mismatch(format!(
                "greeting for {}/{}, this is {}/{}",
                theirs.tenant_id, theirs.timeline_id, mine.tenant_id, mine.timeline_id
            )));
        }
        if (mine.system_id, mine.pg_version, mine.wal_segment_size)
            != (theirs.system_id, theirs.pg_version, theirs.wal_segment_size)
        {
            return Err(AcceptorError::Mismatch(format!(
                "system id {} / PostgreSQL {} / segment size {} offered, timeline has {} / {} / {}",
                theirs.system_id,
                theirs.pg_version,
                theirs.wal_segment_size,
                mine.system_id,
                mine.pg_version,
                mine.wal_segment_size
            )));
        }
        // A proposer knows a newer configuration only from a member that holds it.
        if g.membership.generation > self.state.membership.generation {
            self.set_membership(g.membership.clone())?;
        }
        Ok(AcceptorMessage::Greeting(AcceptorGreeting {
            protocol_version: PROTOCOL_VERSION,
            node_id: self.node_id,
            term: self.state.term,
            membership: self.state.membership.clone(),
        }))
    }

    /// A safekeeper outside the timeline's configuration (one being added,
    /// or one replaced) neither votes nor accepts WAL from proposers: its
    /// vote would count for a set it is not part of.
    fn check_member(&self) -> Result<(), AcceptorError> {
        let m = &self.state.membership;
        if m.generation > 0 && !m.is_member(self.node_id) {
            return Err(AcceptorError::NotMember { generation: m.generation });
        }
        Ok(())
    }

    /// The timeline's membership configuration.
    pub fn membership(&self) -> &Membership {
        &self.state.membership
    }

    /// Adopts a configuration of a higher generation (durably); an equal
    /// one is a no-op if identical, any other is refused.
    pub fn set_membership(&mut self, m: Membership) -> Result<(), AcceptorError> {
        m.validate().map_err(|e| AcceptorError::Protocol(format!("membership configuration: {e}")))?;
        let current = &self.state.membership;
        if m.generation == current.generation {
            return if m == *current {
                Ok(())
            } else {
                Err(AcceptorError::Protocol(format!("another configuration of generation {}", m.generation)))
            };
        }
        if m.generation < current.generation {
            return Err(AcceptorError::MembershipChanged { session: m.generation, current: current.generation });
        }
        let mut next = self.state.clone();
        next.membership = m;
        self.persist_state(next)
    }

    fn vote(&mut self, v: &VoteRequest) -> Result<AcceptorMessage, AcceptorError> {
        let vote_given = v.term > self.state.term;
        if vote_given {
            // Durable before the answer: after a crash we must not vote again in this term.
            let mut next = self.state.clone();
            next.term = v.term;
            next.flush_lsn_hint = self.wal.flush_lsn();
            self.persist_state(next)?;
            self.elected_term = None;
        }
        // Rule 1: a vote only for a term above any seen before, durable now.
        debug_assert!(!vote_given || (self.state.term == v.term && self.durable_term == v.term));
        let flush_lsn = self.wal.flush_lsn();
        let term_history = self.held_history();
        // Rule 4: the history reported ends within the flushed WAL, and
        // names no term above the one voted in.
        debug_assert!(term_history.0.last().is_none_or(|t| t.lsn <= flush_lsn && t.term <= self.state.term));
        self.check_positions();
        Ok(AcceptorMessage::VoteResponse(VoteResponse {
            term: self.state.term,
            vote_given,
            flush_lsn,
            truncate_lsn: self.state.truncate_lsn,
            term_history,
            timeline_start_lsn: self.state.timeline_start_lsn,
        }))
    }

    fn elected(&mut self, e: &ProposerElected) -> Result<AcceptorMessage, AcceptorError> {
        if e.term < self.state.term {
            return Err(AcceptorError::TermSuperseded { offered: e.term, current: self.state.term });
        }
        e.term_history.validate().map_err(|err| AcceptorError::Protocol(err.to_string()))?;
        if e.term_history.last_term() != e.term {
            return Err(AcceptorError::Protocol(format!(
                "history of term {} ends with term {}",
                e.term,
                e.term_history.last_term()
            )));
        }
        let flush = self.wal.flush_lsn();
        let start = e.start_streaming_at;
        if start > flush {
            return Err(AcceptorError::Protocol(format!(
                "streaming would start at {start}, past this WAL's end {flush}"
            )));
        }
        if start < self.state.commit_lsn {
            // Impossible if every proposer follows the protocol: committed
            // WAL is in every elected history.
            return Err(AcceptorError::Protocol(format!(
                "truncation at {start} would remove committed WAL (commit LSN {})",
                self.state.commit_lsn
            )));
        }
        if start < self.state.timeline_start_lsn {
            return Err(AcceptorError::Protocol(format!(
                "streaming would start at {start}, before the timeline start {}",
                self.state.timeline_start_lsn
            )));
        }
        // The shared prefix must really be shared.
        let ours = self.held_history().up_to(start);
        let theirs = e.term_history.up_to(start);
        if ours.divergence(start, &theirs, start) != Some(start) && !ours.0.is_empty() {
            return Err(AcceptorError::Protocol(format!(
                "histories differ before {start}: ours {:?}, proposer's {:?}",
                ours.0, theirs.0
            )));
        }
        if self.wal.write_lsn() > start {
            self.wal.truncate(start)?;
        }
        let mut next = self.state.clone();
        next.term = e.term;
        next.term_history = e.term_history.clone();
        // Connections of another generation are refused before this point.
        next.elected_generation = self.state.membership.generation;
        next.flush_lsn_hint = self.wal.flush_lsn();
        self.persist_state(next)?;
        self.elected_term = Some(e.term);
        // Committed WAL survives the truncation: streaming starts at or after it.
        debug_assert!(self.wal.write_lsn() == start && self.state.commit_lsn <= start);
        Ok(self.append_response())
    }

    fn append(&mut self, a: &AppendRequest) -> Result<(), AcceptorError> {
        if a.term < self.state.term {
            return Err(AcceptorError::TermSuperseded { offered: a.term, current: self.state.term });
        }
        if self.elected_term != Some(a.term) {
            return Err(AcceptorError::Protocol(format!("append in term {} before ProposerElected", a.term)));
        }
        let write_lsn = self.wal.write_lsn();
        if a.begin_lsn != write_lsn {
            return Err(AcceptorError::Protocol(format!("append at {} but this WAL ends at {write_lsn}", a.begin_lsn)));
        }
        // Rule 2: WAL only from the proposer elected in the current term,
        // whose ProposerElected this acceptor accepted and made durable.
        debug_assert!(a.term == self.state.term && self.durable_term == a.term);
        if !a.wal.is_empty() {
            self.wal.write(a.begin_lsn, &a.wal)?;
        }
        self.announced_commit_lsn = self.announced_commit_lsn.max(a.commit_lsn);
        self.announced_truncate_lsn = self.announced_truncate_lsn.max(a.truncate_lsn);
        Ok(())
    }

    /// Makes the written WAL durable and returns the acknowledgement.
    pub fn flush(&mut self) -> Result<AcceptorMessage, AcceptorError> {
        let flushed_before = self.wal.flush_lsn();
        self.wal.flush()?;
        let flush = self.wal.flush_lsn();
        // Rule 3: only fsynced WAL is acknowledged, and a flush makes all
        // that was written durable.
        debug_assert!(flush >= flushed_before && flush == self.wal.write_lsn(), "a flush left WAL unflushed");
        // Commit is what the proposer says is quorum-flushed, limited to what we hold.
        let commit = self.announced_commit_lsn.min(flush);
        if commit > self.state.commit_lsn {
            self.state.commit_lsn = commit;
        }
        let truncate = self.announced_truncate_lsn.min(flush);
        if truncate > self.state.truncate_lsn {
            self.state.truncate_lsn = truncate;
        }
        Ok(self.append_response())
    }

    /// Appends committed WAL fetched from a peer (peer recovery). `history`
    /// is the peer's term history; it must agree with ours up to our end,
    /// and `until` must be committed on the peer, so the WAL is final.
    /// Flushes, adopts the peer's history for the new WAL and persists it.
    pub fn recovery_append(
        &mut self,
        history: &TermHistory,
        at: Lsn,
        bytes: &[u8],
        peer_commit_lsn: Lsn,
    ) -> Result<(), AcceptorError> {
        // A sealed timeline's WAL is final: another site's is another history.
        if self.state.sealed {
            return Err(AcceptorError::Sealed);
        }
        let end = Lsn(at.0 + bytes.len() as u64);
        if at != self.wal.write_lsn() || at != self.wal.flush_lsn() {
            return Err(AcceptorError::Protocol(format!(
                "recovery at {at}, but this WAL ends at {}",
                self.wal.write_lsn()
            )));
        }
        if end > peer_commit_lsn {
            return Err(AcceptorError::Protocol(format!("recovery past the peer's commit LSN {peer_commit_lsn}")));
        }
        let ours = self.held_history();
        if !ours.0.is_empty() && ours.divergence(at, history, end) != Some(at) {
            return Err(AcceptorError::Protocol(format!(
                "peer history {:?} does not continue ours {:?} at {at}",
                history.0, ours.0
            )));
        }
        self.wal.write(at, bytes)?;
        self.wal.flush()?;
        let mut next = self.state.clone();
        next.term_history = history.up_to(end);
        if next.term_history.last_term() != self.state.term_history.last_term() {
            // The last term now is one this acceptor was not told of by its
            // proposer: under which generation it was won is unknown here.
            next.elected_generation = 0;
        }
        // Votes are never given for a term this WAL already holds: the
        // term it answers with must cover its history.
        next.term = next.term.max(next.term_history.last_term());
        next.commit_lsn = next.commit_lsn.max(end);
        next.flush_lsn_hint = end;
        self.persist_state(next)?;
        self.elected_term = None;
        self.check_positions();
        Ok(())
    }

    /// Seals the timeline, durably: from now on every proposer message and
    /// peer recovery is refused, and the flushed WAL is final and committed
    /// (what an election among the safekeepers that have it would commit;
    /// no new term is written, so the WAL stays one proposer's history).
    /// Idempotent.
    pub fn seal(&mut self) -> Result<(), AcceptorError> {
        if !self.state.sealed {
            let mut next = self.state.clone();
            next.sealed = true;
            next.commit_before_seal = Some(next.commit_lsn);
            next.commit_lsn = next.commit_lsn.max(self.wal.flush_lsn());
            self.persist_state(next)?;
            self.announced_commit_lsn = self.announced_commit_lsn.max(self.state.commit_lsn);
            self.elected_term = None;
        }
        self.check_positions();
        Ok(())
    }

    /// Records that a pageserver streams under attachment generation `g`
    /// (durably, if it is the newest yet); returns the newest.
    pub fn note_pageserver_generation(&mut self, shard: ShardIndex, g: u32) -> Result<u32, AcceptorError> {
        if g > self.state.pageserver_generation_of(shard) {
            let mut next = self.state.clone();
            match shard.is_unsharded() {
                true => next.pageserver_generation = g,
                false => {
                    next.shard_generations.insert(shard_key(shard), g);
                }
            }
            self.persist_state(next)?;
        }
        Ok(self.state.pageserver_generation_of(shard))
    }

    /// Writes the control file with the current positions (called
    /// periodically; not needed for safety).
    pub fn persist(&mut self) -> Result<(), AcceptorError> {
        let mut next = self.state.clone();
        next.flush_lsn_hint = self.wal.flush_lsn();
        self.persist_state(next)
    }

    fn append_response(&self) -> AcceptorMessage {
        self.check_positions();
        AcceptorMessage::AppendResponse(AppendResponse {
            term: self.state.term,
            flush_lsn: self.wal.flush_lsn(),
            commit_lsn: self.state.commit_lsn,
            // The server fills this in: consumers are its business.
            consumer_applied_lsn: Lsn::INVALID,
        })
    }

    /// Takes the WAL store and control store back (e.g. to simulate a crash).
    pub fn into_parts(self) -> (PersistentState, W, C) {
        (self.state, self.wal, self.control)
    }
}
