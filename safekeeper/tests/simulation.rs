//! Deterministic simulation of the safekeeper protocol: three acceptors,
//! competing proposers, lost connections, crashes that lose unflushed WAL,
//! and failing disks, driven by a seeded generator. After every step it
//! checks the safety properties:
//!
//! - committed WAL never changes (a single oracle of committed bytes);
//! - every byte an acceptor holds as written in term T is the byte T's
//!   proposer wrote at that LSN (so no two acceptors hold different WAL for
//!   one LSN range and term);
//! - at most one proposer is elected per term;
//! - after a final election with every acceptor up, the elected WAL begins
//!   with all committed WAL.

use std::collections::{BTreeMap, HashMap};

use strata_formats::Lsn;
use strata_protocol::safekeeper::election::Epoch;
use strata_protocol::safekeeper::election::{advance_commit, elect, next_term, quorum, quorum_lsn, start_streaming_at};
use strata_protocol::safekeeper::{
    AcceptorMessage, AppendRequest, ProposerElected, ProposerMessage, Term, TermHistory, TimelineIdentity, VoteRequest,
    VoteResponse,
};
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_safekeeper::acceptor::{Acceptor, PersistentState};
use strata_safekeeper::memory::{MemoryControl, MemoryWal};

const N: usize = 3;
const START: Lsn = Lsn(0x100_0000);

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

type Node = Acceptor<MemoryWal, MemoryControl>;

struct Proposer {
    term: Term,
    epoch_start: Lsn,
    history: TermHistory,
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

struct Sim {
    rng: Rng,
    nodes: Vec<Option<Node>>,
    /// What survives a crash of node i: its control state and durable WAL.
    proposers: Vec<Option<Proposer>>,
    /// Bytes written by the proposer of each term (from START).
    term_wal: HashMap<Term, Vec<u8>>,
    committed: Vec<u8>,
    elections: u64,
    commits: u64,
    /// Commit by counting flushes alone (unsafe; to show the simulation catches it).
    naive_commit: bool,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let identity = TimelineIdentity {
            tenant_id: TenantId([1; 16]),
            timeline_id: TimelineId([2; 16]),
            system_id: 42,
            pg_version: 15,
            wal_segment_size: 16 << 20,
        };
        let nodes = (0..N)
            .map(|i| {
                let state = PersistentState::new(&identity, START);
                let control = MemoryControl { persisted: Some(state.clone()) };
                Some(Acceptor::new(NodeId(i as u64), state, MemoryWal::new(START), control))
            })
            .collect();
        Sim {
            rng: Rng(seed | 1),
            nodes,
            proposers: vec![None, None],
            term_wal: HashMap::new(),
            committed: Vec::new(),
            elections: 0,
            commits: 0,
            naive_commit: false,
        }
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

    /// Proposer `p` runs an election among the acceptors it can reach.
    /// With `healthy`, every acceptor is reachable and the term is fresh.
    fn election(&mut self, p: usize, healthy: bool) {
        let reachable: Vec<usize> =
            (0..N).filter(|&i| self.nodes[i].is_some() && (healthy || self.rng.chance(80))).collect();
        let seen: Vec<Term> = reachable.iter().map(|&i| self.nodes[i].as_ref().unwrap().state().term).collect();
        // Usually the next term above what it saw; sometimes a stale or
        // colliding guess, as a proposer with old information would make.
        let term = match if healthy { 1 } else { self.rng.below(4) } {
            0 => next_term(seen.iter().copied()).saturating_sub(self.rng.below(3)).max(1),
            _ => next_term(seen.iter().copied()),
        };
        let mut votes: Vec<(usize, VoteResponse)> = Vec::new();
        for &i in &reachable {
            let node = self.nodes[i].as_mut().unwrap();
            match node.handle(&ProposerMessage::VoteRequest(VoteRequest { term })) {
                Ok(Some(AcceptorMessage::VoteResponse(v))) if v.vote_given => votes.push((i, v)),
                Ok(_) => {}
                Err(e) => panic!("vote request failed: {e}"),
            }
        }
        self.proposers[p] = None;
        if votes.len() < quorum(N) {
            return;
        }
        let responses: Vec<VoteResponse> = votes.iter().map(|(_, v)| v.clone()).collect();
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
            wal: donor_wal.to_vec(),
            active: BTreeMap::new(),
            commit_lsn: Lsn::INVALID,
            seq: 0,
        };
        self.elections += 1;
        self.term_wal.insert(term, proposer.wal.clone());
        for (i, v) in &votes {
            let start = start_streaming_at(&epoch, &v.term_history, v.flush_lsn, START);
            self.send_elected(&mut proposer, *i, &epoch.history, start);
        }
        self.proposers[p] = Some(proposer);
    }

    fn send_elected(&mut self, proposer: &mut Proposer, i: usize, history: &TermHistory, start: Lsn) {
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
            // start and the epoch start for a while.
            let from = (next.0 - START.0) as usize;
            let len = (1 + self.rng.below(64) as usize).min(proposer.wal.len() - from);
            let chunk = proposer.wal[from..from + len].to_vec();
            let end = Lsn(next.0 + len as u64);
            let req = AppendRequest {
                term: proposer.term,
                begin_lsn: next,
                commit_lsn: proposer.commit_lsn,
                truncate_lsn: truncate,
                wal: chunk,
            };
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
        let Some(node_term) = self.nodes[i].as_ref().map(|n| n.state().term) else { return };
        for slot in 0..self.proposers.len() {
            let Some(proposer) = self.proposers[slot].as_mut() else { continue };
            if proposer.term != node_term || !proposer.active.contains_key(&i) {
                continue;
            }
            let entry = proposer.active.get_mut(&i).unwrap();
            entry.1 = entry.1.max(ack.flush_lsn);
            let flushes: Vec<Lsn> = proposer.active.values().map(|(_, f)| *f).collect();
            let commit = if self.naive_commit {
                quorum_lsn(&flushes, N).max(proposer.commit_lsn)
            } else {
                advance_commit(proposer.commit_lsn, quorum_lsn(&flushes, N), proposer.epoch_start)
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
                    self.commits += 1;
                }
            }
        }
    }

    /// A proposer whose connection to `i` broke reconnects: greeting and
    /// vote (not granted: same term) tell it where `i` stands.
    fn reconnect(&mut self, p: usize, i: usize) {
        let Some(mut proposer) = self.proposers[p].take() else { return };
        if proposer.active.contains_key(&i) || self.nodes[i].is_none() {
            self.proposers[p] = Some(proposer);
            return;
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
        self.send_elected(&mut proposer, i, &history, start);
        self.proposers[p] = Some(proposer);
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
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=2 => {
                let i = self.rng.below(N as u64) as usize;
                self.crash(i);
            }
            3..=6 => {
                let p = self.rng.below(2) as usize;
                self.election(p, false);
            }
            7..=9 => {
                let (p, i) = (self.rng.below(2) as usize, self.rng.below(N as u64) as usize);
                self.reconnect(p, i);
            }
            10 => {
                let i = self.rng.below(N as u64) as usize;
                if let Some(node) = self.nodes[i].as_mut() {
                    node.wal_mut().fail_writes = !node.wal().clone().fail_writes;
                }
            }
            11..=55 => {
                let p = self.rng.below(2) as usize;
                self.append(p);
            }
            _ => {
                let i = self.rng.below(N as u64) as usize;
                self.flush(i);
            }
        }
        self.check();
    }

    /// Heals everything and elects a final proposer that brings every
    /// acceptor to its WAL.
    fn finish(&mut self) {
        for i in 0..N {
            self.crash(i);
        }
        self.election(0, true);
        let proposer = self.proposers[0].as_ref().expect("an election with every acceptor up succeeds");
        assert_eq!(proposer.active.len(), N, "every acceptor follows the final proposer");
        assert!(proposer.wal.starts_with(&self.committed), "the elected WAL lost committed WAL");
        for _ in 0..3 {
            self.append(0);
            for i in 0..N {
                self.flush(i);
            }
        }
        self.check();
    }
}

fn run(seeds: std::ops::RangeInclusive<u64>, naive_commit: bool) -> (u64, u64) {
    let mut elections = 0;
    let mut commits = 0;
    for seed in seeds {
        let mut sim = Sim::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        sim.naive_commit = naive_commit;
        for _ in 0..400 {
            sim.step();
        }
        sim.finish();
        elections += sim.elections;
        commits += sim.commits;
    }
    (elections, commits)
}

#[test]
fn counting_flushes_below_the_epoch_start_loses_commits() {
    let caught = std::panic::catch_unwind(|| run(1..=3000, true)).is_err();
    assert!(caught, "the simulation must find the unsafe commit rule");
}

#[test]
fn safety_under_crashes_partitions_and_competing_proposers() {
    let (elections, commits) = run(1..=1000, false);
    // The simulation must actually exercise the protocol.
    assert!(elections > 3000, "only {elections} elections");
    assert!(commits > 10_000, "only {commits} commit advances");
}
