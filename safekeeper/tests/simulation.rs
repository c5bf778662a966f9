//! Deterministic simulation of the safekeeper protocol: three acceptors,
//! competing proposers, lost connections, crashes that lose unflushed WAL,
//! failing disks, peer recovery and membership changes (an acceptor whose
//! disk is gone replaced by a new, empty one,
//! `docs/safekeeper-membership.md`), driven by a seeded generator. After
//! every step it checks the safety properties:
//!
//! - committed WAL never changes (a single oracle of committed bytes);
//! - every byte an acceptor holds as written in term T is the byte T's
//!   proposer wrote at that LSN (so no two acceptors hold different WAL for
//!   one LSN range and term);
//! - at most one proposer is elected per term;
//! - every quorum that could still elect a proposer, under any generation,
//!   would elect a donor whose WAL begins with all committed WAL;
//! - after a final election with every acceptor up (under the newest
//!   configuration, without the replaced acceptor), the elected WAL begins
//!   with all committed WAL.
//!
//! With sites, the acceptors sit in two sites (0 and 1 in `dc1`, 2 in
//! `dc2`, a replacement in its predecessor's) and changes also move the
//! placement (`docs/sites.md`) between `majority`, `local-quorum` at home
//! in either site and `stretched`, through the same joint configuration.

use std::collections::{BTreeMap, HashMap};

use strata_formats::Lsn;
use strata_protocol::safekeeper::election::Epoch;
use strata_protocol::safekeeper::election::{advance_commit, elect, next_term, start_streaming_at};
use strata_protocol::safekeeper::{
    AcceptorMessage, AppendRequest, Member, Membership, Placement, ProposerElected, ProposerGreeting, ProposerMessage,
    Term, TermHistory, TimelineIdentity, VoteRequest, VoteResponse, PROTOCOL_VERSION,
};
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_safekeeper::acceptor::{Acceptor, AcceptorError, PersistentState, WalStore};
use strata_safekeeper::memory::{MemoryControl, MemoryWal};
use strata_test_support::rng::{Rng, RngExt};

const N: usize = 3;
const PROPOSERS: usize = 2;
const START: Lsn = Lsn(0x100_0000);
/// Steps of a run (more while a membership change is under way, up to `MAX_STEPS`).
const STEPS: u32 = 400;
const MAX_STEPS: u32 = 1500;
/// How far behind the members' commit LSN NEW may be when the joint phase
/// starts (the simulation's "one segment").
const CATCH_UP_SLACK: u64 = 64;

type Node = Acceptor<MemoryWal, MemoryControl>;

fn member(i: usize) -> Member {
    Member::new(NodeId(i as u64), format!("sk{i}:5454"))
}

/// The placements a change with sites moves between.
fn placements() -> [Placement; 4] {
    let local = |home: &str| Placement::LocalQuorum {
        home: home.into(),
        max_async_lag: 1 << 20,
        on_async_lag: strata_protocol::safekeeper::OnAsyncLag::FallBehind,
    };
    [Placement::Majority, local("dc1"), local("dc2"), Placement::Stretched]
}

fn node_index(m: &Member) -> usize {
    m.id.0 as usize
}

/// The configuration as sent in a greeting: generation 0 stands for the set
/// the proposer was configured with and carries no members.
fn on_the_wire(m: &Membership) -> Membership {
    if m.generation == 0 {
        Membership::default()
    } else {
        m.clone()
    }
}

struct Proposer {
    term: Term,
    epoch_start: Lsn,
    history: TermHistory,
    /// The configuration it was elected under; its messages reach only
    /// acceptors of the same generation.
    membership: Membership,
    /// WAL from START: the donor's WAL up to the epoch start, then our records.
    wal: Vec<u8>,
    /// Per acceptor in the current term: (next LSN to send, flushed LSN).
    /// Ordered: the order appends go out in is part of the run, and a seed
    /// must give the same run every time (a HashMap's order differs per process).
    active: BTreeMap<usize, (Lsn, Lsn)>,
    commit_lsn: Lsn,
    seq: u64,
}

impl Proposer {
    fn end(&self) -> Lsn {
        Lsn(START.0 + self.wal.len() as u64)
    }
}

/// How a membership change is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeMode {
    /// Steps 1–5 of `strata safekeeper replace`: catch up, joint
    /// configuration, wait until everything committed is on a majority of
    /// the new set (seen as the rule says), final configuration.
    Joint(Settled),
    /// Unsafe: the new set is installed directly as the next generation.
    Direct,
}

/// How step 4 sees that everything committed is on a majority of the new set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    /// A member's commit LSN has passed every flush LSN read at step 3
    /// (so a proposer of the joint generation committed past its epoch
    /// start), and NEW has flushed up to it.
    CommitPastStep3,
    /// A majority of the new set has flushed the epoch start of a term
    /// elected under the joint generation (each acceptor tells the
    /// generation its last term was elected under; its history lists the
    /// term once it holds the epoch start).
    ElectedUnderJoint,
    /// The same as each acceptor reports it (`elected_generation`, and the
    /// last term of its history as the elected term), as
    /// `strata safekeeper replace` reads it.
    ReportedElection,
}

/// Where a change stands (the steps of `strata safekeeper replace`).
#[derive(Debug)]
enum Phase {
    /// Step 1–2: NEW copies committed WAL from members.
    CatchUp,
    /// Step 3: the joint generation is being written; `installed` holds the
    /// old-set members that took it, with their flush LSN at that moment.
    Joint { installed: BTreeMap<usize, Lsn> },
    /// Step 4 (`Settled`): `mark` is the highest flush LSN read at step 3,
    /// which no commit of the old generation passes; `target` a commit LSN
    /// past it, read from a member.
    Settle { mark: Lsn, target: Option<Lsn> },
    /// Step 5: the final generation is being written to the new set.
    Final,
}

struct Change {
    /// The acceptor that replaces one (none: the placement changes alone).
    new: Option<usize>,
    joint: Membership,
    target: Membership,
    phase: Phase,
}

#[derive(Clone, Copy, Debug, Default)]
struct Options {
    /// Commit by counting flushes alone (unsafe; to show the simulation catches it).
    naive_commit: bool,
    /// Membership changes in three seeds of four.
    change: Option<ChangeMode>,
    /// Only the checks of what the protocol did (committed WAL, terms, the
    /// final election), not those of elections that could happen.
    protocol_checks_only: bool,
    /// Acceptors no proposer streams to recover committed WAL from peers.
    peer_recovery: bool,
    /// Acceptors in two sites; half the changes move the placement.
    sites: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    elections: u64,
    commits: u64,
    /// Elections won under a joint configuration.
    joint_elections: u64,
    /// Elections won under the configuration of a completed change.
    new_set_elections: u64,
    /// Proposers that found an acceptor of a newer generation.
    fenced: u64,
    changes_started: u64,
    changes_completed: u64,
    /// Joint phases begun with NEW behind the members' commit LSN (the
    /// proposers of the joint generation bring it up).
    lagging_joins: u64,
    /// WAL recovered from a peer.
    recoveries: u64,
    /// Changes of the placement alone.
    placement_changes: u64,
    /// Commit advances under a placement other than majority.
    placed_commits: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.elections += o.elections;
        self.commits += o.commits;
        self.joint_elections += o.joint_elections;
        self.new_set_elections += o.new_set_elections;
        self.fenced += o.fenced;
        self.changes_started += o.changes_started;
        self.changes_completed += o.changes_completed;
        self.lagging_joins += o.lagging_joins;
        self.recoveries += o.recoveries;
        self.placement_changes += o.placement_changes;
        self.placed_commits += o.placed_commits;
    }
}

struct Sim {
    rng: Rng,
    identity: TimelineIdentity,
    /// Acceptor i has node id i; `None`: its disk is gone for good.
    nodes: Vec<Option<Node>>,
    proposers: Vec<Option<Proposer>>,
    /// Per proposer: the newest configuration it knows (it runs its next
    /// election under it).
    known: Vec<Membership>,
    /// Bytes written by the proposer of each term (from START).
    term_wal: HashMap<Term, Vec<u8>>,
    /// The generation each term was elected under.
    term_generation: HashMap<Term, u32>,
    committed: Vec<u8>,
    /// The configuration in force as the operator sees it (generation 0:
    /// the initial set).
    config: Membership,
    /// Every configuration some acceptor may hold.
    configs: Vec<Membership>,
    /// Step at which the next membership change starts.
    plan: Option<u32>,
    changes_left: u32,
    change: Option<Change>,
    /// Each acceptor's site (with `Options::sites`).
    sites: Vec<Option<String>>,
    steps: u32,
    stats: Stats,
    options: Options,
}

impl Sim {
    fn new(seed: u64, options: Options) -> Sim {
        let identity = TimelineIdentity {
            tenant_id: TenantId([1; 16]),
            timeline_id: TimelineId([2; 16]),
            system_id: 42,
            pg_version: 15,
            wal_segment_size: 16 << 20,
        };
        let nodes = (0..N).map(|i| Some(Self::empty_node(&identity, i))).collect();
        let sites: Vec<Option<String>> =
            (0..N).map(|i| options.sites.then(|| if i == 2 { "dc2" } else { "dc1" }.to_string())).collect();
        let config = Membership {
            generation: 0,
            members: (0..N).map(|i| Member { site: sites[i].clone(), ..member(i) }).collect(),
            new_members: None,
            ..Default::default()
        };
        Sim {
            rng: Rng::with_seed(seed),
            identity,
            nodes,
            proposers: (0..PROPOSERS).map(|_| None).collect(),
            known: vec![config.clone(); PROPOSERS],
            term_wal: HashMap::new(),
            term_generation: HashMap::new(),
            committed: Vec::new(),
            configs: vec![config.clone()],
            config,
            plan: None,
            changes_left: 0,
            change: None,
            sites,
            steps: 0,
            stats: Stats::default(),
            options,
        }
    }

    /// A newly created timeline on acceptor `i`.
    fn empty_node(identity: &TimelineIdentity, i: usize) -> Node {
        let state = PersistentState::new(identity, START);
        let control = MemoryControl { persisted: Some(state.clone()) };
        Acceptor::new(NodeId(i as u64), state, MemoryWal::new(START), control)
    }

    fn crash(&mut self, i: usize) {
        let Some(node) = self.nodes[i].take() else { return };
        let (_, mut wal, control) = node.into_parts();
        wal.crash();
        wal.fail_writes = false;
        let state = control.persisted.clone().expect("created with a persisted state");
        self.nodes[i] = Some(Acceptor::new(NodeId(i as u64), state, wal, control));
        for p in self.proposers.iter_mut().flatten() {
            p.active.remove(&i);
        }
    }

    /// Proposer `p` has seen configuration `m` at an acceptor.
    fn learn(&mut self, p: usize, m: &Membership) {
        if m.generation > self.known[p].generation {
            self.known[p] = m.clone();
            self.stats.fenced += 1;
        }
    }

    /// Proposer `p` connects to acceptor `i` under configuration `m`. The
    /// acceptor adopts a higher generation; a higher one of the acceptor's
    /// is learnt by the proposer, which must start over. The acceptor's term
    /// if both now work under the same generation.
    fn greet(&mut self, p: usize, m: &Membership, i: usize) -> Option<Term> {
        let msg = ProposerMessage::Greeting(ProposerGreeting {
            protocol_version: PROTOCOL_VERSION,
            proposer_id: [p as u8 + 1; 16],
            timeline: self.identity.clone(),
            membership: on_the_wire(m),
            token: None,
        });
        let node = self.nodes[i].as_mut()?;
        let reply = match node.handle(&msg) {
            Ok(Some(AcceptorMessage::Greeting(g))) => g,
            other => panic!("unexpected answer to a greeting: {other:?}"),
        };
        if reply.membership.generation == m.generation {
            Some(reply.term)
        } else {
            assert!(reply.membership.generation > m.generation, "acceptor {i} kept an older generation");
            self.learn(p, &reply.membership);
            None
        }
    }

    /// The connection check: a message of proposer `p`, working under
    /// `generation`, reaches acceptor `i` only if the acceptor's configuration
    /// is of the same generation; otherwise the connection closes and the
    /// proposer learns the acceptor's configuration.
    fn same_generation(&mut self, p: usize, generation: u32, i: usize) -> bool {
        let Some(node) = self.nodes[i].as_ref() else { return false };
        if node.membership().generation == generation {
            return true;
        }
        let theirs = node.membership().clone();
        self.learn(p, &theirs);
        false
    }

    /// Proposer `p` runs an election among the members it can reach, under
    /// the newest configuration it knows. With `healthy`, every member is
    /// reachable and the term is fresh.
    fn election(&mut self, p: usize, healthy: bool) {
        self.proposers[p] = None;
        let config = self.known[p].clone();
        let reachable: Vec<usize> = config
            .all()
            .iter()
            .map(node_index)
            .filter(|&i| self.nodes[i].is_some() && (healthy || self.rng.chance(80)))
            .collect();
        let mut greeted = Vec::new();
        let mut seen = Vec::new();
        for &i in &reachable {
            if let Some(term) = self.greet(p, &config, i) {
                greeted.push(i);
                seen.push(term);
            }
        }
        if self.known[p].generation > config.generation {
            return; // a newer configuration: reconnect and run a new election
        }
        // Usually the next term above what it saw; sometimes a stale or
        // colliding guess, as a proposer with old information would make.
        let term = match if healthy { 1 } else { self.rng.below(4) } {
            0 => next_term(seen.iter().copied()).saturating_sub(self.rng.below(3)).max(1),
            _ => next_term(seen.iter().copied()),
        };
        let mut votes: Vec<(usize, VoteResponse)> = Vec::new();
        for &i in &greeted {
            let node = self.nodes[i].as_mut().unwrap();
            match node.handle(&ProposerMessage::VoteRequest(VoteRequest { term })) {
                Ok(Some(AcceptorMessage::VoteResponse(v))) if v.vote_given => votes.push((i, v)),
                Ok(_) => {}
                Err(e) => panic!("vote request failed: {e}"),
            }
        }
        let voters: Vec<NodeId> = votes.iter().map(|(i, _)| NodeId(*i as u64)).collect();
        if !config.has_quorum(&voters) {
            return;
        }
        // As the compute's proposer does: the voters of the placement
        // choose the epoch; asynchronous members' votes come last.
        let is_voter = |i: usize| config.generation == 0 || config.is_voter(NodeId(i as u64));
        votes.sort_by_key(|(i, _)| !is_voter(*i));
        let responses: Vec<VoteResponse> = votes.iter().filter(|(i, _)| is_voter(*i)).map(|(_, v)| v.clone()).collect();
        let epoch = elect(term, &responses).expect("a quorum of votes");
        assert!(!self.term_wal.contains_key(&term), "two proposers elected in term {term}");
        // Fetch the donor's WAL (as a recovery stream would).
        let donor = votes[epoch.donor].0;
        let Some(donor_node) = self.nodes[donor].as_ref() else { return };
        let Some(donor_wal) = donor_node.wal().read(START, epoch.start_lsn) else { return };
        let mut proposer = Proposer {
            term,
            epoch_start: epoch.start_lsn,
            history: epoch.history.clone(),
            membership: config,
            wal: donor_wal.to_vec(),
            active: BTreeMap::new(),
            commit_lsn: Lsn::INVALID,
            seq: 0,
        };
        self.stats.elections += 1;
        if proposer.membership.new_members.is_some() {
            self.stats.joint_elections += 1;
        } else if proposer.membership.generation > 0 {
            self.stats.new_set_elections += 1;
        }
        self.term_wal.insert(term, proposer.wal.clone());
        self.term_generation.insert(term, proposer.membership.generation);
        for (i, v) in &votes {
            let start = start_streaming_at(&epoch, &v.term_history, v.flush_lsn, START);
            self.send_elected(p, &mut proposer, *i, &epoch.history, start);
        }
        self.proposers[p] = Some(proposer);
    }

    fn send_elected(&mut self, p: usize, proposer: &mut Proposer, i: usize, history: &TermHistory, start: Lsn) {
        if !self.same_generation(p, proposer.membership.generation, i) {
            return;
        }
        let Some(node) = self.nodes[i].as_mut() else { return };
        let msg = ProposerMessage::Elected(ProposerElected {
            term: proposer.term,
            start_streaming_at: start,
            term_history: history.clone(),
            timeline_start_lsn: START,
        });
        match node.handle(&msg) {
            Ok(Some(AcceptorMessage::AppendResponse(r))) => {
                proposer.active.insert(i, (start, r.flush_lsn.min(start)));
            }
            Ok(other) => panic!("unexpected answer to Elected: {other:?}"),
            Err(_) => {} // superseded or storage: the acceptor stays out
        }
    }

    /// The proposer writes a record and sends what each active acceptor lacks.
    fn append(&mut self, p: usize) {
        let Some(mut proposer) = self.proposers[p].take() else { return };
        if self.rng.chance(70) {
            proposer.seq += 1;
            let len = 1 + self.rng.below(40) as usize;
            let tag = format!("[p{p} t{} #{}]", proposer.term, proposer.seq);
            let record: Vec<u8> = tag.bytes().cycle().take(len.max(tag.len())).collect();
            proposer.wal.extend_from_slice(&record);
            self.term_wal.insert(proposer.term, proposer.wal.clone());
        }
        let truncate = proposer.active.values().map(|(_, f)| *f).min().unwrap_or(START);
        let targets: Vec<usize> = proposer.active.keys().copied().collect();
        for i in targets {
            if !self.rng.chance(85) {
                continue; // delayed: sent later
            }
            let (next, flushed) = proposer.active[&i];
            if next >= proposer.end() {
                continue;
            }
            // Random-size chunks: acceptors catching up sit between their
            // start and the epoch start for a while. One far behind gets
            // larger ones (a catch-up stream is faster than new WAL comes).
            let from = (next.0 - START.0) as usize;
            let speed = if proposer.wal.len() - from > 256 { 4 } else { 1 };
            let len = ((1 + self.rng.below(64) as usize) * speed).min(proposer.wal.len() - from);
            let chunk = proposer.wal[from..from + len].to_vec();
            let end = Lsn(next.0 + len as u64);
            let req = AppendRequest {
                term: proposer.term,
                begin_lsn: next,
                commit_lsn: proposer.commit_lsn,
                truncate_lsn: truncate,
                wal: chunk,
            };
            if !self.same_generation(p, proposer.membership.generation, i) {
                proposer.active.remove(&i);
                continue;
            }
            let Some(node) = self.nodes[i].as_mut() else {
                proposer.active.remove(&i);
                continue;
            };
            match node.handle(&ProposerMessage::Append(req)) {
                Ok(None) => {
                    proposer.active.insert(i, (end, flushed));
                }
                Ok(other) => panic!("unexpected answer to append: {other:?}"),
                Err(_) => {
                    // Connection closed (superseded, storage error): reconnect later.
                    proposer.active.remove(&i);
                }
            }
        }
        if proposer.membership.generation < self.known[p].generation {
            return; // a newer configuration: this proposer steps down
        }
        self.proposers[p] = Some(proposer);
    }

    /// Acceptor `i` flushes and acknowledges to the proposer of its term.
    fn flush(&mut self, i: usize) {
        let Some(node) = self.nodes[i].as_mut() else { return };
        let ack = match node.flush() {
            Ok(AcceptorMessage::AppendResponse(r)) => r,
            Ok(other) => panic!("unexpected flush answer {other:?}"),
            Err(_) => return,
        };
        let Some(node) = self.nodes[i].as_ref() else { return };
        let node_term = node.state().term;
        let node_config = node.membership().clone();
        for slot in 0..self.proposers.len() {
            let Some(proposer) = self.proposers[slot].as_mut() else { continue };
            if proposer.term != node_term || !proposer.active.contains_key(&i) {
                continue;
            }
            if proposer.membership.generation != node_config.generation {
                // The acceptor's configuration changed under the connection:
                // it closes, and an outdated proposer learns the new one.
                proposer.active.remove(&i);
                if proposer.membership.generation < node_config.generation {
                    self.learn(slot, &node_config);
                    self.proposers[slot] = None;
                }
                continue;
            }
            let entry = proposer.active.get_mut(&i).unwrap();
            entry.1 = entry.1.max(ack.flush_lsn);
            let flushes: Vec<(NodeId, Lsn)> =
                proposer.active.iter().map(|(&k, &(_, f))| (NodeId(k as u64), f)).collect();
            let quorum = proposer.membership.quorum_lsn(&flushes);
            let commit = if self.options.naive_commit {
                quorum.max(proposer.commit_lsn)
            } else {
                advance_commit(proposer.commit_lsn, quorum, proposer.epoch_start)
            };
            if commit > proposer.commit_lsn {
                proposer.commit_lsn = commit;
                let bytes = proposer.wal[..(commit.0 - START.0) as usize].to_vec();
                let overlap = bytes.len().min(self.committed.len());
                assert_eq!(
                    bytes[..overlap],
                    self.committed[..overlap],
                    "committed WAL changed in term {}",
                    proposer.term
                );
                if bytes.len() > self.committed.len() {
                    self.committed = bytes;
                    self.stats.commits += 1;
                    if proposer.membership.rules().any(|(_, p)| !p.is_majority()) {
                        self.stats.placed_commits += 1;
                    }
                }
            }
        }
    }

    /// A proposer whose connection to `i` broke reconnects: greeting and
    /// vote (not granted: same term) tell it where `i` stands.
    fn reconnect(&mut self, p: usize, i: usize) {
        let Some(mut proposer) = self.proposers[p].take() else { return };
        if proposer.active.contains_key(&i)
            || self.nodes[i].is_none()
            || !proposer.membership.is_member(NodeId(i as u64))
        {
            self.proposers[p] = Some(proposer);
            return;
        }
        if self.greet(p, &proposer.membership, i).is_none() {
            return; // a newer configuration: this proposer steps down
        }
        let node = self.nodes[i].as_mut().unwrap();
        let vote = match node.handle(&ProposerMessage::VoteRequest(VoteRequest { term: proposer.term })) {
            Ok(Some(AcceptorMessage::VoteResponse(v))) => v,
            other => panic!("unexpected vote answer {other:?}"),
        };
        if vote.term > proposer.term {
            return; // superseded: this proposer steps down
        }
        let history = proposer.history.clone();
        // The proposer's WAL now ends past its epoch start.
        let epoch_like = Epoch {
            term: proposer.term,
            donor: 0,
            start_lsn: proposer.end(),
            history: history.clone(),
            timeline_start_lsn: START,
        };
        let start = start_streaming_at(&epoch_like, &vote.term_history, vote.flush_lsn, START);
        self.send_elected(p, &mut proposer, i, &history, start);
        self.proposers[p] = Some(proposer);
    }

    /// Starts replacing a member: OLD's disk is gone for good, NEW is an
    /// empty acceptor with the timeline created. With sites, half the
    /// changes instead move the placement of the same members.
    fn start_change(&mut self, mode: ChangeMode) {
        let members: Vec<usize> = self.config.members.iter().map(node_index).collect();
        let g = self.config.generation;
        let current = self.config.target().1;
        // A member whose loss leaves the others no quorum under the rule in
        // force (the only one of a local-quorum's home site) cannot be
        // replaced this way: that takes a site failover.
        let replaceable: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&old| {
                let rest: Vec<NodeId> = members.iter().filter(|&&i| i != old).map(|&i| NodeId(i as u64)).collect();
                Membership::of(1, self.config.members.clone(), current.clone()).has_quorum(&rest)
            })
            .collect();
        // (A direct change with sites always moves the placement: the test
        // of it must fail for the placement, not for a replacement.)
        let direct = mode == ChangeMode::Direct;
        if self.options.sites && (direct || replaceable.is_empty() || self.rng.chance(50)) {
            let others: Vec<Placement> = placements().into_iter().filter(|p| *p != current).collect();
            let placement = others[self.rng.below(others.len() as u64) as usize].clone();
            let joint = Membership {
                generation: g + 1,
                members: self.config.members.clone(),
                new_members: None,
                placement: current,
                new_placement: Some(placement.clone()),
            };
            let target = Membership::of(
                if mode == ChangeMode::Direct { g + 1 } else { g + 2 },
                self.config.members.clone(),
                placement,
            );
            self.changes_left -= 1;
            self.stats.changes_started += 1;
            self.stats.placement_changes += 1;
            self.change = Some(Change { new: None, joint, target, phase: Phase::CatchUp });
            return;
        }
        let flush = |i: usize| self.nodes[i].as_ref().map_or(START, |n| n.flush_lsn());
        // Often the member holding the most WAL: the one whose loss hurts.
        let old = if self.rng.chance(50) {
            replaceable.iter().copied().max_by_key(|&i| flush(i)).unwrap()
        } else {
            replaceable[self.rng.below(replaceable.len() as u64) as usize]
        };
        self.nodes[old] = None;
        for p in self.proposers.iter_mut().flatten() {
            p.active.remove(&old);
        }
        let new = self.nodes.len();
        self.nodes.push(Some(Self::empty_node(&self.identity, new)));
        self.sites.push(self.sites[old].clone());
        let new_set: Vec<Member> = members
            .iter()
            .copied()
            .filter(|&i| i != old)
            .chain(std::iter::once(new))
            .map(|i| Member { site: self.sites[i].clone(), ..member(i) })
            .collect();
        let joint = Membership {
            generation: g + 1,
            members: self.config.members.clone(),
            new_members: Some(new_set.clone()),
            placement: current.clone(),
            new_placement: None,
        };
        let target = Membership::of(if mode == ChangeMode::Direct { g + 1 } else { g + 2 }, new_set, current);
        self.changes_left -= 1;
        self.stats.changes_started += 1;
        self.change = Some(Change { new: Some(new), joint, target, phase: Phase::CatchUp });
    }

    /// Acceptor `i` appends committed WAL from `peer` (peer recovery): up
    /// to the peer's commit LSN, with the peer's term history cut there.
    /// Whether it recovered anything.
    fn recover(&mut self, i: usize, peer: usize) -> Result<bool, AcceptorError> {
        let (Some(node), Some(peer_node)) = (self.nodes[i].as_ref(), self.nodes[peer].as_ref()) else {
            return Ok(false);
        };
        let at = node.flush_lsn();
        let end = peer_node.state().commit_lsn.min(peer_node.flush_lsn());
        if end <= at || node.wal().write_lsn() != at {
            return Ok(false);
        }
        let bytes = peer_node.wal().read(at, end).expect("a node holds WAL up to its commit LSN").to_vec();
        let history = peer_node.held_history();
        self.nodes[i].as_mut().unwrap().recovery_append(&history, at, &bytes, end)?;
        self.stats.recoveries += 1;
        Ok(true)
    }

    /// Step 1: NEW recovers committed WAL from a reachable member.
    fn catch_up(&mut self, new: usize) {
        let peers: Vec<usize> =
            self.config.members.iter().map(node_index).filter(|&i| self.nodes[i].is_some()).collect();
        let peer = peers[self.rng.below(peers.len() as u64) as usize];
        if !self.rng.chance(80) {
            return;
        }
        match self.recover(new, peer) {
            Ok(_) | Err(AcceptorError::Storage(_)) => {}
            Err(e) => panic!("recovery of {new} from {peer} refused: {e}"),
        }
    }

    /// An acceptor no proposer streams to recovers from a peer what the
    /// peer has committed past its WAL (as safekeepers do in the
    /// background, at any time, members or not).
    fn background_recovery(&mut self) {
        let n = self.nodes.len() as u64;
        let (i, peer) = (self.rng.below(n) as usize, self.rng.below(n) as usize);
        if i == peer || self.proposers.iter().flatten().any(|p| p.active.contains_key(&i)) {
            return;
        }
        // Refused when the histories differ (an uncommitted tail): retried
        // later, in vain until a proposer truncates it.
        let _ = self.recover(i, peer);
    }

    /// Writes `m` to the reachable acceptors among `members` (the
    /// membership HTTP API, which accepts only a higher generation). The
    /// acceptors that hold it afterwards, with their flush LSN.
    fn install(&mut self, m: &Membership, members: &[Member]) -> Vec<(usize, Lsn)> {
        if !self.configs.contains(m) {
            self.configs.push(m.clone());
        }
        let mut holding = Vec::new();
        for i in members.iter().map(node_index) {
            if self.nodes[i].is_none() || !self.rng.chance(80) {
                continue;
            }
            let node = self.nodes[i].as_mut().unwrap();
            match node.set_membership(m.clone()) {
                Ok(()) => holding.push((i, node.flush_lsn())),
                Err(e) => panic!("acceptor {i} refused generation {}: {e}", m.generation),
            }
        }
        holding
    }

    /// One action of the operator's `strata safekeeper replace OLD NEW`
    /// (failed steps are retried by a later action).
    fn advance_change(&mut self, mode: ChangeMode) {
        let Some(mut change) = self.change.take() else { return };
        match &mut change.phase {
            Phase::CatchUp => {
                if let Some(new) = change.new.filter(|_| mode != ChangeMode::Direct || self.rng.chance(50)) {
                    self.catch_up(new);
                }
                // Step 2: NEW close to the members' commit LSN, so the joint
                // phase is short. Sometimes the operator goes on earlier:
                // the proposers then bring NEW up (slower, as safe).
                let commit = self
                    .config
                    .members
                    .iter()
                    .filter_map(|m| self.nodes[node_index(m)].as_ref())
                    .map(|n| n.state().commit_lsn)
                    .max()
                    .unwrap_or(START);
                let new_flush = change.new.map_or(commit, |new| self.nodes[new].as_ref().unwrap().flush_lsn());
                let close = new_flush.0 + CATCH_UP_SLACK >= commit.0;
                if mode == ChangeMode::Direct {
                    change.phase = Phase::Final;
                } else if close || self.rng.chance(20) {
                    if !close {
                        self.stats.lagging_joins += 1;
                    }
                    change.phase = Phase::Joint { installed: BTreeMap::new() };
                }
            }
            Phase::Joint { installed } => {
                // Step 3: to every reachable member of either set; done once a
                // majority of the old set holds it (no proposer of the old
                // generation can then be elected or commit).
                let joint = change.joint.clone();
                for (i, flush) in self.install(&joint, &joint.all()) {
                    if joint.members.iter().any(|m| node_index(m) == i) {
                        installed.entry(i).or_insert(flush);
                    }
                }
                let old_set = Membership::of(joint.generation, joint.members.clone(), joint.placement.clone());
                let holders: Vec<NodeId> = installed.keys().map(|&i| NodeId(i as u64)).collect();
                if old_set.has_quorum(&holders) {
                    // Every commit of the old generation is on one of these
                    // members, below the flush LSN it had on taking the new
                    // generation. The highest of them, not each member's own:
                    // a member's commit LSN can pass its own flush LSN by a
                    // commit LSN the old proposer announced before (applied
                    // as the joint proposer fills its WAL), with no commit of
                    // the joint generation and WAL committed past it.
                    let mark = installed.values().copied().max().unwrap();
                    change.phase = Phase::Settle { mark, target: None };
                }
            }
            Phase::Settle { mark, target } => {
                let settled = match mode {
                    ChangeMode::Joint(Settled::CommitPastStep3) => {
                        // A member's commit LSN past every flush LSN read at
                        // step 3 was committed by a proposer of the joint
                        // generation (one of the old generation commits
                        // nothing past them), so everything committed is on
                        // a majority of the new set...
                        if target.is_none() {
                            let members = change.joint.all();
                            let i = node_index(&members[self.rng.below(members.len() as u64) as usize]);
                            if let Some(node) = self.nodes[i].as_ref() {
                                if node.state().commit_lsn > *mark {
                                    *target = Some(node.state().commit_lsn);
                                }
                            }
                        }
                        // ... and NEW has flushed it.
                        let new_flush = change.new.map(|new| self.nodes[new].as_ref().unwrap().flush_lsn());
                        target.is_some_and(|t| new_flush.is_none_or(|f| f >= t))
                    }
                    ChangeMode::Joint(Settled::ElectedUnderJoint) => {
                        // That proposer's voters included a majority of the
                        // old set, so its epoch start holds everything
                        // committed before; what it and its successors commit
                        // is on majorities of both sets.
                        let mut holders = Vec::new();
                        for m in &change.target.members {
                            let Some(node) = self.nodes[node_index(m)].as_ref() else { continue };
                            let joint_term = node
                                .held_history()
                                .0
                                .iter()
                                .any(|e| self.term_generation.get(&e.term) == Some(&change.joint.generation));
                            if self.rng.chance(80) && joint_term {
                                holders.push(m.id);
                            }
                        }
                        change.target.has_quorum(&holders)
                    }
                    ChangeMode::Joint(Settled::ReportedElection) => {
                        let mut holders = Vec::new();
                        for m in &change.target.members {
                            let Some(node) = self.nodes[node_index(m)].as_ref() else { continue };
                            let state = node.state();
                            let elected = state.elected_generation >= change.joint.generation
                                && node.held_history().last_term() == state.term_history.last_term();
                            if self.rng.chance(80) && elected {
                                holders.push(m.id);
                            }
                        }
                        change.target.has_quorum(&holders)
                    }
                    ChangeMode::Direct => unreachable!("no joint phase"),
                };
                if settled {
                    change.phase = Phase::Final;
                }
            }
            Phase::Final => {
                // Step 5: the new set alone, written to a majority of it.
                let target = change.target.clone();
                self.install(&target, &target.members);
                let holders: Vec<NodeId> = target
                    .members
                    .iter()
                    .filter(|m| {
                        self.nodes[node_index(m)]
                            .as_ref()
                            .is_some_and(|n| n.membership().generation >= target.generation)
                    })
                    .map(|m| m.id)
                    .collect();
                if target.has_quorum(&holders) {
                    self.config = target;
                    self.stats.changes_completed += 1;
                    if self.changes_left > 0 {
                        self.plan = Some(self.steps + 20 + self.rng.below(100) as u32);
                    }
                    return;
                }
            }
        }
        self.change = Some(change);
    }

    fn check(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            let flush = node.flush_lsn();
            let history = node.held_history();
            for (k, entry) in history.0.iter().enumerate() {
                let end = history.0.get(k + 1).map_or(flush, |n| n.lsn).min(flush);
                if end <= entry.lsn {
                    continue;
                }
                let held = node.wal().read(entry.lsn, end).expect("held WAL is readable");
                let written = self.term_wal.get(&entry.term).expect("a term in a history was elected");
                let from = (entry.lsn.0 - START.0) as usize;
                let to = (end.0 - START.0) as usize;
                assert!(to <= written.len(), "node {i} holds WAL of term {} past what was written", entry.term);
                assert_eq!(held, &written[from..to], "node {i}: WAL of term {} at {} differs", entry.term, entry.lsn);
            }
            // Durable WAL up to the node's commit LSN is committed WAL.
            let commit = node.state().commit_lsn.min(flush);
            let upto = (commit.0 - START.0) as usize;
            if upto > 0 {
                let held = node.wal().read(START, commit).expect("committed WAL is held");
                assert_eq!(held, &self.committed[..upto.min(self.committed.len())], "node {i} commit prefix");
            }
        }
        if !self.options.protocol_checks_only {
            self.check_possible_elections();
        }
    }

    /// Every set of acceptors that could elect a proposer now would start
    /// its epoch with all committed WAL. Under configuration C, an acceptor
    /// of a generation up to C's can vote (a greeting raises it to C's); the
    /// donor is a voter of the highest (last term, flush LSN) (`elect`), and
    /// the voters that rank no higher than a given acceptor are the largest
    /// set that can pick it.
    fn check_possible_elections(&self) {
        let committed_end = Lsn(START.0 + self.committed.len() as u64);
        // (index, generation, donor rank, holds all committed WAL)
        let nodes: Vec<(usize, u32, (Term, Lsn), bool)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
            .map(|(i, n)| {
                let flush = n.flush_lsn();
                let complete = n.wal().read(START, committed_end).is_some_and(|w| w == self.committed);
                (i, n.membership().generation, (n.held_history().last_term(), flush), complete)
            })
            .collect();
        for config in &self.configs {
            let eligible: Vec<_> = nodes
                .iter()
                .filter(|(i, g, _, _)| *g <= config.generation && config.is_member(NodeId(*i as u64)))
                .collect();
            for (i, _, rank, complete) in &eligible {
                // An asynchronous member is never a donor.
                if *complete || (config.generation > 0 && !config.is_voter(NodeId(*i as u64))) {
                    continue;
                }
                let voters: Vec<NodeId> =
                    eligible.iter().filter(|(_, _, r, _)| r <= rank).map(|(j, ..)| NodeId(*j as u64)).collect();
                assert!(
                    !config.has_quorum(&voters),
                    "acceptors {voters:?} could elect under generation {} a donor ({i}, last term and flush {rank:?}) \
                     without all committed WAL (up to {committed_end})",
                    config.generation
                );
            }
        }
    }

    fn step(&mut self) {
        let n = self.nodes.len() as u64;
        if self.plan == Some(self.steps) {
            self.plan = None;
            self.start_change(self.options.change.expect("a change is planned only in its mode"));
        } else if self.options.peer_recovery && self.rng.chance(3) {
            self.background_recovery();
        } else if self.change.is_some() && self.rng.chance(10) {
            self.advance_change(self.options.change.expect("a change is under way only in its mode"));
        } else {
            match self.rng.below(100) {
                0..=2 => {
                    let i = self.rng.below(n) as usize;
                    self.crash(i);
                }
                3..=6 => {
                    let p = self.rng.below(PROPOSERS as u64) as usize;
                    self.election(p, false);
                }
                7..=9 => {
                    let (p, i) = (self.rng.below(PROPOSERS as u64) as usize, self.rng.below(n) as usize);
                    self.reconnect(p, i);
                }
                10 => {
                    let i = self.rng.below(n) as usize;
                    if let Some(node) = self.nodes[i].as_mut() {
                        node.wal_mut().fail_writes = !node.wal().clone().fail_writes;
                    }
                }
                11..=55 => {
                    let p = self.rng.below(PROPOSERS as u64) as usize;
                    self.append(p);
                }
                _ => {
                    let i = self.rng.below(n) as usize;
                    self.flush(i);
                }
            }
        }
        self.steps += 1;
        self.check();
    }

    /// Heals everything and elects a final proposer (under the newest
    /// configuration, which it learns from the acceptors) that brings every
    /// member to its WAL.
    fn finish(&mut self) {
        for i in 0..self.nodes.len() {
            self.crash(i);
        }
        // A proposer of an older configuration learns the newest one from
        // the acceptors' greetings and runs the election again.
        for _ in 0..3 {
            self.election(0, true);
            if self.proposers[0].is_some() {
                break;
            }
        }
        let proposer = self.proposers[0].as_ref().expect("an election with every acceptor up succeeds");
        let live_members = proposer.membership.all().iter().filter(|m| self.nodes[node_index(m)].is_some()).count();
        assert_eq!(proposer.active.len(), live_members, "every member follows the final proposer");
        if self.change.is_none() {
            assert_eq!(proposer.membership, self.config, "the final election is under the newest configuration");
        }
        assert!(proposer.wal.starts_with(&self.committed), "the elected WAL lost committed WAL");
        for _ in 0..3 {
            self.append(0);
            for i in 0..self.nodes.len() {
                self.flush(i);
            }
        }
        self.check();
    }
}

fn run(seeds: std::ops::RangeInclusive<u64>, options: Options) -> Stats {
    let mut stats = Stats::default();
    for seed in seeds {
        let mut sim = Sim::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), options);
        if let Some(mode) = options.change {
            if seed % 4 != 0 {
                sim.changes_left = if mode == ChangeMode::Direct { 1 } else { 2 };
                sim.plan = Some(sim.rng.below(150) as u32);
            }
        }
        while sim.steps < STEPS || (sim.change.is_some() && sim.steps < MAX_STEPS) {
            sim.step();
        }
        sim.finish();
        stats += sim.stats;
    }
    stats
}

#[test]
fn counting_flushes_below_the_epoch_start_loses_commits() {
    let options = Options { naive_commit: true, ..Options::default() };
    let caught = std::panic::catch_unwind(|| run(1..=3000, options)).is_err();
    assert!(caught, "the simulation must find the unsafe commit rule");
}

#[test]
fn safety_under_crashes_partitions_and_competing_proposers() {
    let stats = run(1..=1000, Options::default());
    println!("{stats:?}");
    // The simulation must actually exercise the protocol.
    assert!(stats.elections > 3000, "only {} elections", stats.elections);
    assert!(stats.commits > 10_000, "only {} commit advances", stats.commits);
}

fn replacing_members(settled: Settled) {
    let options = Options { change: Some(ChangeMode::Joint(settled)), peer_recovery: true, ..Options::default() };
    let stats = run(1..=1500, options);
    println!("{settled:?}: {stats:?}");
    // 1125 seeds replace a member, most of them twice; a few runs end with
    // the change still waiting in step 4.
    let (done, started) = (stats.changes_completed, stats.changes_started);
    assert!(done > 1200 && done * 100 > started * 90, "only {done} of {started} changes completed");
    assert!(stats.joint_elections > 3000, "only {} elections under a joint configuration", stats.joint_elections);
    assert!(stats.new_set_elections > 1000, "only {} elections under the new set", stats.new_set_elections);
    assert!(stats.fenced > 3000, "only {} proposers fenced by a newer generation", stats.fenced);
    assert!(stats.lagging_joins > 50, "only {} joint phases with NEW lagging", stats.lagging_joins);
    assert!(stats.recoveries > 700, "only {} peer recoveries", stats.recoveries);
    assert!(stats.commits > 10_000, "only {} commit advances", stats.commits);
}

#[test]
fn replacing_a_member_through_a_joint_configuration_is_safe() {
    replacing_members(Settled::CommitPastStep3);
}

#[test]
fn replacing_a_member_when_the_joint_generation_has_elected_is_safe() {
    replacing_members(Settled::ElectedUnderJoint);
}

/// Step 4 as the acceptors report it (`elected_generation`, what `strata
/// safekeeper replace` reads). An acceptor that recovers WAL from a peer
/// adopts the peer's history: it must forget the generation of its own
/// last election, or it reports a joint election whose epoch start it does
/// not hold (seed 81 lost committed WAL in the final election before it did).
#[test]
fn replacing_a_member_when_the_acceptors_report_a_joint_election_is_safe() {
    replacing_members(Settled::ReportedElection);
}

/// Sites: the placement moves between majority, local-quorum at home in
/// either site and stretched (and members are replaced) while proposers
/// compete and acceptors crash.
#[test]
fn changing_the_placement_through_a_joint_configuration_is_safe() {
    let options = Options {
        change: Some(ChangeMode::Joint(Settled::ReportedElection)),
        peer_recovery: true,
        sites: true,
        ..Options::default()
    };
    let stats = run(1..=1500, options);
    println!("{stats:?}");
    let (done, started) = (stats.changes_completed, stats.changes_started);
    assert!(done * 100 > started * 90, "only {done} of {started} changes completed");
    assert!(stats.placement_changes > 800, "only {} placement changes", stats.placement_changes);
    assert!(stats.placed_commits > 2500, "only {} commits under a placement", stats.placed_commits);
    assert!(stats.joint_elections > 2000, "only {} elections under a joint configuration", stats.joint_elections);
    assert!(stats.fenced > 2000, "only {} proposers fenced by a newer generation", stats.fenced);
}

#[test]
fn changing_the_placement_without_the_joint_phase_loses_commits() {
    let direct = Options { change: Some(ChangeMode::Direct), peer_recovery: true, sites: true, ..Options::default() };
    let protocol_only = Options { protocol_checks_only: true, ..direct };
    let caught = std::panic::catch_unwind(|| run(1..=3000, protocol_only)).is_err();
    assert!(caught, "the proposers must really break safety when a placement change skips the joint configuration");
}

#[test]
fn replacing_a_member_without_the_joint_phase_loses_commits() {
    let direct = Options { change: Some(ChangeMode::Direct), peer_recovery: true, ..Options::default() };
    let caught = std::panic::catch_unwind(|| run(1..=3000, direct)).is_err();
    assert!(caught, "the simulation must find the change that skips the joint configuration");
    // Not only a possible election: what the proposers actually do loses
    // committed WAL or elects two proposers in a term.
    let protocol_only = Options { protocol_checks_only: true, ..direct };
    let caught = std::panic::catch_unwind(|| run(1..=3000, protocol_only)).is_err();
    assert!(caught, "the proposers must really break safety when the joint configuration is skipped");
}
