//! Every bound of the fusefs crate: what grows with load or time and where
//! it stops. The file system holds inode numbers, handles and backing
//! descriptors; these say where each stops, and the relations between them
//! are checked when it compiles.

/// The directory entry number given to a file the hooks serve but have not
/// created yet ([`crate::Hooks::pending_entries`]); our own numbers count up
/// from 1 and never get here.
pub const PENDING_INO: u64 = 1 << 62;

/// The fewest backing files held open when a bound is set: a handle in use
/// keeps its descriptor.
pub const MIN_OPEN_FILES: usize = 1;

/// How many times round the ring of open handles the hand goes at most for
/// one open: the first pass may only clear marks of handles used lately.
pub const HAND_ROUNDS: usize = 2;

// A pending entry's number is this one bit ORed with its index: unique for
// every index below it, and apart from our own numbers, which count up from
// the root's.
const _: () = assert!(PENDING_INO.is_power_of_two());
const _: () = assert!(crate::inodes::ROOT < PENDING_INO);
const _: () = assert!(MIN_OPEN_FILES >= 1);
// One pass clears the marks, the next can close a descriptor.
const _: () = assert!(HAND_ROUNDS >= 2);
