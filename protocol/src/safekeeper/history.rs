//! Term history: which term wrote which range of the WAL, and where two
//! histories stop agreeing.

use strata_formats::Lsn;

use super::term::Term;

/// Term `term` wrote WAL from `lsn` until the next entry's `lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TermLsn {
    pub term: Term,
    pub lsn: Lsn,
}

/// Entries in increasing term order with non-decreasing LSNs.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TermHistory(pub Vec<TermLsn>);

/// A history whose entries are out of order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid term history: {0}")]
pub struct HistoryError(pub String);

impl TermHistory {
    /// Checks the ordering invariant (terms strictly increase, LSNs never decrease).
    pub fn validate(&self) -> Result<(), HistoryError> {
        for w in self.0.windows(2) {
            if w[1].term <= w[0].term || w[1].lsn < w[0].lsn {
                return Err(HistoryError(format!("entry {:?} follows {:?}", w[1], w[0])));
            }
        }
        Ok(())
    }

    /// Term of the last entry (0 if empty).
    pub fn last_term(&self) -> Term {
        self.0.last().map_or(0, |e| e.term)
    }

    /// The history of WAL that ends at `end`: entries starting after `end` are
    /// dropped (they describe WAL not held).
    pub fn up_to(&self, end: Lsn) -> TermHistory {
        TermHistory(self.0.iter().copied().filter(|e| e.lsn <= end).collect())
    }

    /// Where WAL described by `self` (ending at `self_end`) and by `other`
    /// (ending at `other_end`) stops being identical. The same term at the
    /// same LSN was written by one proposer, so a shared entry means shared
    /// WAL up to the end of that term in both. `None`: no common entry.
    pub fn divergence(&self, self_end: Lsn, other: &TermHistory, other_end: Lsn) -> Option<Lsn> {
        let mut common = None;
        for (i, (a, b)) in self.0.iter().zip(other.0.iter()).enumerate() {
            if a != b {
                break;
            }
            let a_end = self.0.get(i + 1).map_or(self_end, |n| n.lsn);
            let b_end = other.0.get(i + 1).map_or(other_end, |n| n.lsn);
            common = Some(a_end.min(b_end));
        }
        common
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(entries: &[(u64, u64)]) -> TermHistory {
        TermHistory(entries.iter().map(|&(term, lsn)| TermLsn { term, lsn: Lsn(lsn) }).collect())
    }

    #[test]
    fn divergence_points() {
        let proposer = h(&[(1, 100), (3, 500), (5, 900)]);
        // Same history, behind: streams from its end.
        assert_eq!(h(&[(1, 100), (3, 500)]).divergence(Lsn(700), &proposer, Lsn(900)), Some(Lsn(700)));
        // Wrote more in term 3 than the proposer took over: truncated at the term switch.
        assert_eq!(h(&[(1, 100), (3, 500)]).divergence(Lsn(1000), &proposer, Lsn(900)), Some(Lsn(900)));
        // Term 2 never made it into the proposer's history: back to the end of term 1.
        assert_eq!(h(&[(1, 100), (2, 300)]).divergence(Lsn(800), &proposer, Lsn(900)), Some(Lsn(300).min(Lsn(500))));
        assert_eq!(h(&[(2, 100)]).divergence(Lsn(800), &proposer, Lsn(900)), None);
        assert!(h(&[(1, 100), (1, 200)]).validate().is_err());
        assert!(h(&[(1, 100), (2, 50)]).validate().is_err());
        assert_eq!(proposer.up_to(Lsn(899)), h(&[(1, 100), (3, 500)]));
    }
}
