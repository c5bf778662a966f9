//! PostgreSQL major versions whose formats this crate understands.
//!
//! The WAL framing (page headers, record headers, block references) is the same
//! from 15 to 18; what differs is the page magic, resource manager record
//! layouts and `pg_control`. Those live in one module per version (`v15`).

/// A supported PostgreSQL major version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PgVersion {
    /// PostgreSQL 15.
    V15,
}

impl PgVersion {
    /// `XLOG_PAGE_MAGIC` written in every WAL page header by this version.
    pub fn wal_page_magic(self) -> u16 {
        match self {
            PgVersion::V15 => crate::v15::XLOG_PAGE_MAGIC,
        }
    }

    /// The version whose WAL pages carry `magic`, if supported.
    pub fn from_wal_page_magic(magic: u16) -> Option<PgVersion> {
        match magic {
            crate::v15::XLOG_PAGE_MAGIC => Some(PgVersion::V15),
            _ => None,
        }
    }

    /// Highest built-in resource manager id.
    pub fn max_builtin_rmgr_id(self) -> u8 {
        match self {
            PgVersion::V15 => crate::v15::rmgr::RM_MAX_BUILTIN_ID,
        }
    }

    /// Major version number.
    pub fn major(self) -> u32 {
        match self {
            PgVersion::V15 => 15,
        }
    }
}

/// Size of a relation data page (`BLCKSZ`); Debian builds use the default.
pub const BLCKSZ: usize = 8192;
/// Size of a WAL page (`XLOG_BLCKSZ`).
pub const XLOG_BLCKSZ: usize = 8192;
/// Default WAL segment size (`initdb --wal-segsize` can change it).
pub const DEFAULT_WAL_SEGMENT_SIZE: u64 = 16 * 1024 * 1024;
/// `MAXIMUM_ALIGNOF` on every 64-bit platform PostgreSQL supports.
pub const MAXALIGN: u64 = 8;

/// Rounds `n` up to `MAXALIGN`.
pub const fn maxalign(n: usize) -> usize {
    (n + 7) & !7
}
