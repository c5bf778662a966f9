//! PostgreSQL's on-disk and WAL formats, as Strata needs them.
//!
//! Everything here decodes untrusted bytes: every decoder returns an error on
//! malformed input and never panics (see the fuzz target in `fuzz/` and the
//! randomized tests).

pub mod fuzz;
pub mod limits;
pub mod lsn;
pub mod page;
pub mod time;
pub mod types;
pub mod v15;
pub mod version;
pub mod wal;

pub use lsn::Lsn;
pub use types::{BlockNumber, ForkNumber, Oid, RelFileNode, TransactionId};
pub use version::PgVersion;
