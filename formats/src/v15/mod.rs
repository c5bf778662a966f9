//! PostgreSQL 15 specifics: page magic, resource managers, record layouts, `pg_control`.

pub mod checkpoint_state;
pub mod control;
pub mod identify;
pub mod records;
pub mod rmgr;
pub mod startup;

/// `XLOG_PAGE_MAGIC` of PostgreSQL 15.
pub const XLOG_PAGE_MAGIC: u16 = 0xD110;
