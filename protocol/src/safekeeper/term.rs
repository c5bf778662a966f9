//! Election terms: the numbers that order proposers.

/// An election term. Terms only grow; each has at most one proposer.
pub type Term = u64;
