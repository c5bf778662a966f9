//! The proposer's side of an election, as pure functions: choosing the
//! donor, building the new history, computing each acceptor's divergence
//! point and the quorum commit LSN. Shared by the compute's proposer and by
//! the deterministic simulation tests.

use strata_formats::Lsn;

use super::history::{TermHistory, TermLsn};
use super::messages::VoteResponse;
pub use super::quorum::{quorum, quorum_lsn};
use super::term::Term;

/// The next term to propose, above every term the acceptors reported.
pub fn next_term(seen: impl IntoIterator<Item = Term>) -> Term {
    let highest = seen.into_iter().max().unwrap_or(0);
    // Terms never go back, nor wrap: a proposer's term is above every term seen.
    highest.checked_add(1).expect("the term space is exhausted")
}

/// The outcome of winning an election with a majority of votes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    pub term: Term,
    /// Index (into the votes) of the acceptor whose WAL is the base.
    pub donor: usize,
    /// Where the new term's WAL begins: the donor's flush LSN.
    pub start_lsn: Lsn,
    /// Donor's history plus (term, start_lsn).
    pub history: TermHistory,
    pub timeline_start_lsn: Lsn,
}

/// Picks the donor among the granted votes: the highest (last term of its
/// history, flush LSN). Every committed LSN is held by some member of any
/// majority, and the donor's WAL contains all of them (see the protocol
/// document). `votes` must all be granted votes in `term`.
pub fn elect(term: Term, votes: &[VoteResponse]) -> Option<Epoch> {
    debug_assert!(votes.iter().all(|v| v.vote_given && v.term == term), "only votes granted in {term} elect");
    let (donor, best) = votes.iter().enumerate().max_by_key(|(_, v)| (v.term_history.last_term(), v.flush_lsn))?;
    let mut history = best.term_history.up_to(best.flush_lsn);
    debug_assert!(history.last_term() < term, "a vote in `term` reports only older terms");
    history.0.push(TermLsn { term, lsn: best.flush_lsn });
    let timeline_start_lsn = votes.iter().map(|v| v.timeline_start_lsn).max().unwrap_or(Lsn::INVALID);
    // The donor's WAL is the most advanced of the voters': no voter holds
    // a later last term, nor more WAL in the donor's last term.
    debug_assert!(votes
        .iter()
        .all(|v| (v.term_history.last_term(), v.flush_lsn) <= (best.term_history.last_term(), best.flush_lsn)));
    debug_assert!(history.validate().is_ok(), "the new history is ordered: {history:?}");
    Some(Epoch { term, donor, start_lsn: best.flush_lsn, history, timeline_start_lsn })
}

/// Where an acceptor with `history` ending at `flush_lsn` must start
/// receiving WAL from a proposer of `epoch`: the end of the WAL they share,
/// or the timeline start if they share nothing.
pub fn start_streaming_at(epoch: &Epoch, history: &TermHistory, flush_lsn: Lsn, timeline_start_lsn: Lsn) -> Lsn {
    let own = history.up_to(flush_lsn);
    // The proposer's WAL ends (for now) at the epoch start.
    own.divergence(flush_lsn, &epoch.history, epoch.start_lsn).unwrap_or(timeline_start_lsn)
}

/// The commit LSN after acknowledgements put the quorum at `quorum`: it
/// moves only once the quorum has reached the epoch start. Below it, the
/// acceptors that make up the quorum may still report an older last term,
/// so a later election could pick a donor without this WAL (the Raft rule
/// of committing only entries of the current term by counting).
pub fn advance_commit(current: Lsn, quorum: Lsn, epoch_start: Lsn) -> Lsn {
    let commit = if quorum >= epoch_start { current.max(quorum) } else { current };
    // The commit LSN never goes back, and moves only to a quorum-held LSN
    // of the current term's WAL.
    debug_assert!(commit >= current && (commit == current || (commit == quorum && quorum >= epoch_start)));
    commit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(history: &[(u64, u64)], flush: u64) -> VoteResponse {
        VoteResponse {
            term: 9,
            vote_given: true,
            flush_lsn: Lsn(flush),
            truncate_lsn: Lsn(0),
            term_history: TermHistory(history.iter().map(|&(term, lsn)| TermLsn { term, lsn: Lsn(lsn) }).collect()),
            timeline_start_lsn: Lsn(100),
        }
    }

    #[test]
    fn donor_has_latest_term_then_longest_wal() {
        let votes = [vote(&[(1, 100), (2, 500)], 600), vote(&[(1, 100)], 900), vote(&[(1, 100), (2, 500)], 700)];
        let e = elect(9, &votes).unwrap();
        assert_eq!(e.donor, 2, "term 2 beats a longer term-1 log");
        assert_eq!(e.start_lsn, Lsn(700));
        assert_eq!(e.history.0.last(), Some(&TermLsn { term: 9, lsn: Lsn(700) }));
        // The term-1 acceptor wrote past the term switch: truncated at 500.
        assert_eq!(start_streaming_at(&e, &votes[1].term_history, Lsn(900), Lsn(100)), Lsn(500));
        assert_eq!(start_streaming_at(&e, &votes[0].term_history, Lsn(600), Lsn(100)), Lsn(600));
        assert_eq!(start_streaming_at(&e, &TermHistory::default(), Lsn(100), Lsn(100)), Lsn(100));
    }

    #[test]
    fn next_term_is_above_every_term_seen() {
        assert_eq!(next_term([3, 7, 1]), 8);
        assert_eq!(next_term([]), 1);
    }
}
