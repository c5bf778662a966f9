//! XLOG resource manager: checkpoints, OID allocation, parameter changes.

use crate::lsn::Lsn;
use crate::types::{Cursor, Oid, TransactionId, Truncated};
use crate::wal::record::DecodedRecord;

/// An `XLOG_FPI_FOR_HINT` record: hint bits changed on its pages. Without
/// `full_page_writes` its blocks carry no image and replay skips them.
pub fn is_fpi_for_hint(rec: &DecodedRecord) -> bool {
    rec.rmgr() == crate::v15::rmgr::RM_XLOG_ID && rec.header.rmgr_info() == crate::v15::rmgr::XLOG_FPI_FOR_HINT
}

/// `CheckPoint`: the state a server needs to start at a checkpoint (88 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CheckPoint {
    pub redo: Lsn,
    pub this_timeline: u32,
    pub prev_timeline: u32,
    pub full_page_writes: bool,
    /// `wal_level` from 17 on. On 15 and 16 these four bytes are padding,
    /// kept as read so that a decoded struct re-encodes to the same bytes.
    pub wal_level: i32,
    /// 64-bit transaction id: epoch in the high 32 bits.
    pub next_full_xid: u64,
    pub next_oid: Oid,
    pub next_multi: u32,
    pub next_multi_offset: u32,
    pub oldest_xid: TransactionId,
    pub oldest_xid_db: Oid,
    pub oldest_multi: u32,
    pub oldest_multi_db: Oid,
    /// Seconds since the Unix epoch.
    pub time: i64,
    pub oldest_commit_ts_xid: TransactionId,
    pub newest_commit_ts_xid: TransactionId,
    pub oldest_active_xid: TransactionId,
}

impl CheckPoint {
    /// Size of the C struct, padding included.
    pub const SIZE: usize = 88;

    /// Decodes the struct from the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<CheckPoint, Truncated> {
        let mut c = Cursor::new(bytes);
        let redo = Lsn(c.u64()?);
        let this_timeline = c.u32()?;
        let prev_timeline = c.u32()?;
        let full_page_writes = c.u8()? != 0;
        c.skip(3)?;
        let wal_level = c.i32()?;
        let next_full_xid = c.u64()?;
        let next_oid = c.u32()?;
        let next_multi = c.u32()?;
        let next_multi_offset = c.u32()?;
        let oldest_xid = c.u32()?;
        let oldest_xid_db = c.u32()?;
        let oldest_multi = c.u32()?;
        let oldest_multi_db = c.u32()?;
        c.skip(4)?;
        let time = c.i64()?;
        let oldest_commit_ts_xid = c.u32()?;
        let newest_commit_ts_xid = c.u32()?;
        let oldest_active_xid = c.u32()?;
        c.skip(4)?;
        debug_assert_eq!(c.position(), Self::SIZE);
        Ok(CheckPoint {
            redo,
            this_timeline,
            prev_timeline,
            full_page_writes,
            wal_level,
            next_full_xid,
            next_oid,
            next_multi,
            next_multi_offset,
            oldest_xid,
            oldest_xid_db,
            oldest_multi,
            oldest_multi_db,
            time,
            oldest_commit_ts_xid,
            newest_commit_ts_xid,
            oldest_active_xid,
        })
    }

    /// Encodes the struct with zeroed padding.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..8].copy_from_slice(&self.redo.0.to_le_bytes());
        out[8..12].copy_from_slice(&self.this_timeline.to_le_bytes());
        out[12..16].copy_from_slice(&self.prev_timeline.to_le_bytes());
        out[16] = self.full_page_writes as u8;
        out[20..24].copy_from_slice(&self.wal_level.to_le_bytes());
        out[24..32].copy_from_slice(&self.next_full_xid.to_le_bytes());
        let words = [
            self.next_oid,
            self.next_multi,
            self.next_multi_offset,
            self.oldest_xid,
            self.oldest_xid_db,
            self.oldest_multi,
            self.oldest_multi_db,
        ];
        for (i, w) in words.iter().enumerate() {
            out[32 + 4 * i..36 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        out[64..72].copy_from_slice(&self.time.to_le_bytes());
        out[72..76].copy_from_slice(&self.oldest_commit_ts_xid.to_le_bytes());
        out[76..80].copy_from_slice(&self.newest_commit_ts_xid.to_le_bytes());
        out[80..84].copy_from_slice(&self.oldest_active_xid.to_le_bytes());
        out
    }

    /// The 32-bit next transaction id.
    pub fn next_xid(&self) -> TransactionId {
        self.next_full_xid as u32
    }

    /// The epoch of the next transaction id.
    pub fn next_xid_epoch(&self) -> u32 {
        (self.next_full_xid >> 32) as u32
    }
}

/// `xl_parameter_change`: settings a standby must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ParameterChange {
    pub max_connections: i32,
    pub max_worker_processes: i32,
    pub max_wal_senders: i32,
    pub max_prepared_xacts: i32,
    pub max_locks_per_xact: i32,
    pub wal_level: i32,
    pub wal_log_hints: bool,
    pub track_commit_timestamp: bool,
}

impl ParameterChange {
    pub fn decode(bytes: &[u8]) -> Result<ParameterChange, Truncated> {
        let mut c = Cursor::new(bytes);
        Ok(ParameterChange {
            max_connections: c.i32()?,
            max_worker_processes: c.i32()?,
            max_wal_senders: c.i32()?,
            max_prepared_xacts: c.i32()?,
            max_locks_per_xact: c.i32()?,
            wal_level: c.i32()?,
            wal_log_hints: c.u8()? != 0,
            track_commit_timestamp: c.u8()? != 0,
        })
    }
}

/// The decoded XLOG records Strata acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XlogRecord {
    Checkpoint {
        shutdown: bool,
        checkpoint: CheckPoint,
    },
    NextOid(Oid),
    Switch,
    ParameterChange(ParameterChange),
    /// A full-page image (the image is in the block reference); `for_hint` for FPI_FOR_HINT.
    FullPageImage {
        for_hint: bool,
    },
    /// A partial record at `lsn` was abandoned and overwritten.
    OverwriteContrecord {
        lsn: Lsn,
    },
    /// Records with no effect on stored state (noop, restore point, backup end, …).
    Other,
}

/// Decodes an XLOG record's main data.
pub fn parse(info: u8, data: &[u8]) -> Result<XlogRecord, Truncated> {
    use crate::v15::rmgr::*;
    Ok(match info & 0xF0 {
        XLOG_CHECKPOINT_SHUTDOWN | XLOG_CHECKPOINT_ONLINE => XlogRecord::Checkpoint {
            shutdown: info & 0xF0 == XLOG_CHECKPOINT_SHUTDOWN,
            checkpoint: CheckPoint::decode(data)?,
        },
        XLOG_NEXTOID => XlogRecord::NextOid(Cursor::new(data).u32()?),
        XLOG_SWITCH => XlogRecord::Switch,
        XLOG_PARAMETER_CHANGE => XlogRecord::ParameterChange(ParameterChange::decode(data)?),
        XLOG_FPI => XlogRecord::FullPageImage { for_hint: false },
        XLOG_FPI_FOR_HINT => XlogRecord::FullPageImage { for_hint: true },
        XLOG_OVERWRITE_CONTRECORD => XlogRecord::OverwriteContrecord { lsn: Lsn(Cursor::new(data).u64()?) },
        _ => XlogRecord::Other,
    })
}
