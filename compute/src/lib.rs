//! The compute agent: runs next to an unmodified PostgreSQL, receives its
//! WAL over physical replication as its synchronous standby, and is the
//! proposer that makes that WAL durable on a quorum of safekeepers. In eager
//! mode ([`agent`]) it also restores PostgreSQL's data directory from the
//! pageserver, configures and starts the server, and stops it in order.

pub mod agent;
pub mod clock;
pub mod dedicated;
pub mod lazy;
pub mod limits;
pub mod page_client;
pub mod pageserver_target;
pub mod pg_replication;
pub mod proposer;
pub mod safekeeper_link;
pub mod wal_fetch;
