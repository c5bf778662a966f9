//! Majorities: how many acceptors make a quorum, and the LSN a quorum
//! holds. Elections and membership configurations both count with these.

use strata_formats::Lsn;

/// Smallest number of acceptors that forms a majority of `n`.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The highest LSN at least a majority of `flush_lsns` (one per acceptor,
/// counting only acceptors that accepted the current term) have reached.
pub fn quorum_lsn(flush_lsns: &[Lsn], acceptors: usize) -> Lsn {
    let q = quorum(acceptors);
    if flush_lsns.len() < q {
        return Lsn::INVALID;
    }
    let mut sorted = flush_lsns.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let lsn = sorted[q - 1];
    debug_assert!(flush_lsns.iter().filter(|&&f| f >= lsn).count() >= q, "a majority holds the quorum LSN");
    lsn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_commit() {
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum_lsn(&[Lsn(5), Lsn(9), Lsn(7)], 3), Lsn(7));
        assert_eq!(quorum_lsn(&[Lsn(5)], 3), Lsn(0), "one of three is no quorum");
    }
}
