//! PostgreSQL major versions whose formats this crate understands.
//!
//! The WAL framing (page headers, record headers, block references) is the same
//! from 15 to 18; what differs is the page magic, some resource managers'
//! record layouts and `pg_control`. The numbers are one table with a row per
//! version (`docs/postgres-versions.md`); the code is one path that asks it.

/// A supported PostgreSQL major version.
///
/// Everything that differs between majors and is a plain number lives in
/// [`VersionTable`], one row per version; code that needs a version's own
/// record layout matches on the version where it decodes that record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum PgVersion {
    /// PostgreSQL 15.
    V15,
    /// PostgreSQL 16.
    V16,
    /// PostgreSQL 17.
    V17,
    /// PostgreSQL 18.
    V18,
}

/// The numbers that identify a major's formats, from its headers
/// (`access/xlog_internal.h`, `catalog/pg_control.h`, `catalog/catversion.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionTable {
    /// The major version number.
    pub major: u32,
    /// `XLOG_PAGE_MAGIC`, in every WAL page header.
    pub wal_page_magic: u16,
    /// `PG_CONTROL_VERSION`, in `pg_control`.
    pub control_version: u32,
    /// `CATALOG_VERSION_NO` of the release line, in `pg_control`.
    pub catalog_version: u32,
    /// Size of `global/pg_filenode.map` and of each database's map.
    pub relmap_file_size: usize,
}

const TABLES: [VersionTable; 4] = [
    VersionTable {
        major: 15,
        wal_page_magic: 0xD110,
        control_version: 1300,
        catalog_version: 202209061,
        relmap_file_size: 512,
    },
    VersionTable {
        major: 16,
        wal_page_magic: 0xD113,
        control_version: 1300,
        catalog_version: 202307071,
        relmap_file_size: 524,
    },
    VersionTable {
        major: 17,
        wal_page_magic: 0xD116,
        control_version: 1700,
        catalog_version: 202406281,
        relmap_file_size: 524,
    },
    VersionTable {
        major: 18,
        wal_page_magic: 0xD118,
        control_version: 1800,
        catalog_version: 202506291,
        relmap_file_size: 524,
    },
];

impl PgVersion {
    /// Every supported version, oldest first.
    pub const ALL: [PgVersion; 4] = [PgVersion::V15, PgVersion::V16, PgVersion::V17, PgVersion::V18];

    /// This version's row of numbers.
    pub fn table(self) -> &'static VersionTable {
        &TABLES[self as usize]
    }

    /// `XLOG_PAGE_MAGIC` written in every WAL page header by this version.
    pub fn wal_page_magic(self) -> u16 {
        self.table().wal_page_magic
    }

    /// The version whose WAL pages carry `magic`, if supported.
    pub fn from_wal_page_magic(magic: u16) -> Option<PgVersion> {
        PgVersion::ALL.into_iter().find(|v| v.wal_page_magic() == magic)
    }

    /// The version of a major number (`15`, `18`), if supported.
    pub fn from_major(major: u32) -> Option<PgVersion> {
        PgVersion::ALL.into_iter().find(|v| v.major() == major)
    }

    /// Highest built-in resource manager id (the same list from 15 to 18).
    pub fn max_builtin_rmgr_id(self) -> u8 {
        crate::v15::rmgr::RM_MAX_BUILTIN_ID
    }

    /// Major version number.
    pub fn major(self) -> u32 {
        self.table().major
    }

    /// Whether this version's heap2 records 0x10-0x30 are 17's merged
    /// prune/freeze records (`PRUNE_ON_ACCESS`, `PRUNE_VACUUM_SCAN`,
    /// `PRUNE_VACUUM_CLEANUP`) rather than 15's `PRUNE`, `VACUUM` and
    /// `FREEZE_PAGE`.
    pub fn merged_prune_records(self) -> bool {
        self >= PgVersion::V17
    }
}

impl std::fmt::Display for PgVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.major())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_is_found_by_its_magic_and_major() {
        for v in PgVersion::ALL {
            assert_eq!(PgVersion::from_wal_page_magic(v.wal_page_magic()), Some(v));
            assert_eq!(PgVersion::from_major(v.major()), Some(v));
            assert_eq!(v.to_string(), v.major().to_string());
        }
        assert_eq!(PgVersion::from_wal_page_magic(0xD10D), None);
        assert_eq!(PgVersion::from_major(14), None);
        assert!(!PgVersion::V16.merged_prune_records());
        assert!(PgVersion::V17.merged_prune_records());
    }
}
