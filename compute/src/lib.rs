//! The compute agent: runs next to an unmodified PostgreSQL, receives its
//! WAL over physical replication as its synchronous standby, and is the
//! proposer that makes that WAL durable on a quorum of safekeepers.

pub mod pg_replication;
pub mod proposer;
pub mod safekeeper_link;
pub mod wal_fetch;
