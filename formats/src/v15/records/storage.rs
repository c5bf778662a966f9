//! Whole-file operations: smgr create/truncate, CREATE/DROP DATABASE,
//! tablespaces and relation-mapper updates.

use crate::types::{BlockNumber, Cursor, ForkNumber, Oid, RelFileNode, Truncated};

pub const XLOG_SMGR_CREATE: u8 = 0x10;
pub const XLOG_SMGR_TRUNCATE: u8 = 0x20;
pub const SMGR_TRUNCATE_HEAP: u32 = 0x1;
pub const SMGR_TRUNCATE_VM: u32 = 0x2;
pub const SMGR_TRUNCATE_FSM: u32 = 0x4;

pub const XLOG_DBASE_CREATE_FILE_COPY: u8 = 0x00;
pub const XLOG_DBASE_CREATE_WAL_LOG: u8 = 0x10;
pub const XLOG_DBASE_DROP: u8 = 0x20;

pub const XLOG_TBLSPC_CREATE: u8 = 0x00;
pub const XLOG_TBLSPC_DROP: u8 = 0x10;

pub const XLOG_RELMAP_UPDATE: u8 = 0x00;

/// An smgr (Storage) record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum SmgrRecord {
    Create {
        rel: RelFileNode,
        fork: ForkNumber,
    },
    /// Truncates the forks selected by `flags` to `blocks` blocks (main fork)
    /// and to what those blocks need (VM, FSM).
    Truncate {
        rel: RelFileNode,
        blocks: BlockNumber,
        flags: u32,
    },
}

/// Error decoding a record of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageParseError {
    #[error(transparent)]
    Truncated(#[from] Truncated),
    #[error("invalid fork number {0}")]
    InvalidFork(i32),
}

/// Decodes a Storage record's main data.
pub fn parse_smgr(info: u8, data: &[u8]) -> Result<Option<SmgrRecord>, StorageParseError> {
    let mut c = Cursor::new(data);
    Ok(match info & 0xF0 {
        XLOG_SMGR_CREATE => {
            let rel = c.rel_file_node()?;
            let fork_number = c.i32()?;
            let fork = u8::try_from(fork_number)
                .ok()
                .and_then(ForkNumber::from_u8)
                .ok_or(StorageParseError::InvalidFork(fork_number))?;
            Some(SmgrRecord::Create { rel, fork })
        }
        XLOG_SMGR_TRUNCATE => {
            let blocks = c.u32()?;
            let rel = c.rel_file_node()?;
            let flags = c.u32()?;
            Some(SmgrRecord::Truncate { rel, blocks, flags })
        }
        _ => None,
    })
}

/// A Database record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum DbaseRecord {
    /// CREATE DATABASE … STRATEGY FILE_COPY: the directory is copied file by file.
    CreateFileCopy {
        db: Oid,
        tablespace: Oid,
        src_db: Oid,
        src_tablespace: Oid,
    },
    /// CREATE DATABASE … STRATEGY WAL_LOG: blocks follow as their own records.
    CreateWalLog {
        db: Oid,
        tablespace: Oid,
    },
    Drop {
        db: Oid,
        tablespaces: Vec<Oid>,
    },
}

/// Decodes a Database record's main data.
pub fn parse_dbase(info: u8, data: &[u8]) -> Result<Option<DbaseRecord>, Truncated> {
    let mut c = Cursor::new(data);
    Ok(match info & 0xF0 {
        XLOG_DBASE_CREATE_FILE_COPY => Some(DbaseRecord::CreateFileCopy {
            db: c.u32()?,
            tablespace: c.u32()?,
            src_db: c.u32()?,
            src_tablespace: c.u32()?,
        }),
        XLOG_DBASE_CREATE_WAL_LOG => Some(DbaseRecord::CreateWalLog { db: c.u32()?, tablespace: c.u32()? }),
        XLOG_DBASE_DROP => {
            let db = c.u32()?;
            let n = c.count(4)?;
            let tablespaces = (0..n).map(|_| c.u32()).collect::<Result<_, _>>()?;
            Some(DbaseRecord::Drop { db, tablespaces })
        }
        _ => None,
    })
}

/// A Tablespace record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TblspcRecord {
    Create { tablespace: Oid, path: String },
    Drop { tablespace: Oid },
}

/// Decodes a Tablespace record's main data.
pub fn parse_tblspc(info: u8, data: &[u8]) -> Result<Option<TblspcRecord>, Truncated> {
    let mut c = Cursor::new(data);
    Ok(match info & 0xF0 {
        XLOG_TBLSPC_CREATE => {
            let tablespace = c.u32()?;
            let rest = c.take(c.remaining())?;
            let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
            Some(TblspcRecord::Create { tablespace, path: String::from_utf8_lossy(&rest[..end]).into_owned() })
        }
        XLOG_TBLSPC_DROP => Some(TblspcRecord::Drop { tablespace: c.u32()? }),
        _ => None,
    })
}

/// A relation-mapper update: the whole new `pg_filenode.map` contents.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RelMapUpdate {
    /// 0 for the shared map in `global/`.
    pub db: Oid,
    pub tablespace: Oid,
    #[serde(skip)]
    pub data: Vec<u8>,
}

/// Decodes a RelMap record's main data.
pub fn parse_relmap(info: u8, data: &[u8]) -> Result<Option<RelMapUpdate>, Truncated> {
    if info & 0xF0 != XLOG_RELMAP_UPDATE {
        return Ok(None);
    }
    let mut c = Cursor::new(data);
    let db = c.u32()?;
    let tablespace = c.u32()?;
    let n = c.count(1)?;
    Ok(Some(RelMapUpdate { db, tablespace, data: c.take(n)?.to_vec() }))
}
