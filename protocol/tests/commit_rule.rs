//! Why a proposer must not advance the commit LSN while the acknowledged
//! quorum position is below its epoch start LSN (see "Why it is safe" in
//! `docs/safekeeper-protocol.md`), replayed with the election functions.
//!
//! Three acceptors A, B, C and timeline start 0:
//! - term 1 (voters A, B) writes [0, 100) to A only;
//! - term 2 (voters B, C) sends ProposerElected to B only and writes [0, 50) to B;
//! - term 3 (voters A, C): donor A, epoch start 100; C is empty and must
//!   receive A's term-1 WAL from 0. C has flushed [0, 60) when A is at 100.

use strata_formats::Lsn;
use strata_protocol::safekeeper::election::{elect, quorum_lsn, start_streaming_at};
use strata_protocol::safekeeper::{TermHistory, TermLsn, VoteResponse};

fn history(entries: &[(u64, u64)]) -> TermHistory {
    TermHistory(entries.iter().map(|&(term, lsn)| TermLsn { term, lsn: Lsn(lsn) }).collect())
}

fn vote(term: u64, held: TermHistory, flush: u64) -> VoteResponse {
    VoteResponse {
        term,
        vote_given: true,
        flush_lsn: Lsn(flush),
        truncate_lsn: Lsn(0),
        term_history: held,
        timeline_start_lsn: Lsn(0),
    }
}

/// The commit rule of the protocol: the quorum position counts only once it
/// has reached the epoch start; before that the commit LSN stays put.
fn advance_commit(current: Lsn, quorum: Lsn, epoch_start: Lsn) -> Lsn {
    if quorum >= epoch_start {
        current.max(quorum)
    } else {
        current
    }
}

#[test]
fn commit_waits_for_the_epoch_start() {
    // Term 3 is elected by A and C.
    let a = vote(3, history(&[(1, 0)]), 100);
    let c = vote(3, history(&[]), 0);
    let epoch3 = elect(3, &[a, c]).unwrap();
    assert_eq!(epoch3.start_lsn, Lsn(100));
    assert_eq!(epoch3.history, history(&[(1, 0), (3, 100)]));
    assert_eq!(start_streaming_at(&epoch3, &history(&[]), Lsn(0), Lsn(0)), Lsn(0), "C starts from scratch");

    // A is at 100, C has flushed [0, 60). Counting flush positions alone
    // would call 60 committed.
    let quorum = quorum_lsn(&[Lsn(100), Lsn(60)], 3);
    assert_eq!(quorum, Lsn(60));

    // But C reports its history only up to what it holds: the term-3 entry
    // starts at 100, beyond C's WAL, so C's last term is 1. A new term
    // elected by B and C then takes B's term-2 WAL as the base and C is
    // truncated back to 0: [0, 60) would be lost had it been committed.
    let c_held = epoch3.history.up_to(Lsn(60));
    assert_eq!(c_held, history(&[(1, 0)]));
    let b = vote(4, history(&[(2, 0)]), 50);
    let epoch4 = elect(4, &[b, vote(4, c_held.clone(), 60)]).unwrap();
    assert_eq!(epoch4.donor, 0, "B's term 2 beats C's term 1");
    assert_eq!(start_streaming_at(&epoch4, &c_held, Lsn(60), Lsn(0)), Lsn(0));

    // Hence the rule: below the epoch start nothing new is committed...
    assert_eq!(advance_commit(Lsn(0), quorum, epoch3.start_lsn), Lsn(0));
    // ...and once a majority holds the epoch start, their histories carry
    // term 3, which wins every later election they take part in.
    let quorum = quorum_lsn(&[Lsn(130), Lsn(100)], 3);
    assert_eq!(advance_commit(Lsn(0), quorum, epoch3.start_lsn), Lsn(100));
    let c_held = epoch3.history.up_to(Lsn(100));
    assert_eq!(c_held.last_term(), 3);
    let epoch4 = elect(4, &[vote(4, history(&[(2, 0)]), 50), vote(4, c_held, 100)]).unwrap();
    assert_eq!(epoch4.donor, 1);
    assert_eq!(epoch4.start_lsn, Lsn(100));
}
