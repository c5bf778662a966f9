//! Transaction resource manager: commit, abort, prepare, subtransaction assignment.

use crate::types::{Cursor, Oid, RelFileNode, TransactionId, Truncated};
use crate::version::PgVersion;

pub const XLOG_XACT_COMMIT: u8 = 0x00;
pub const XLOG_XACT_PREPARE: u8 = 0x10;
pub const XLOG_XACT_ABORT: u8 = 0x20;
pub const XLOG_XACT_COMMIT_PREPARED: u8 = 0x30;
pub const XLOG_XACT_ABORT_PREPARED: u8 = 0x40;
pub const XLOG_XACT_ASSIGNMENT: u8 = 0x50;
pub const XLOG_XACT_INVALIDATIONS: u8 = 0x60;
pub const XLOG_XACT_OPMASK: u8 = 0x70;
/// An `xl_xact_xinfo` word follows the fixed part.
pub const XLOG_XACT_HAS_INFO: u8 = 0x80;

pub const XACT_XINFO_HAS_DBINFO: u32 = 1 << 0;
pub const XACT_XINFO_HAS_SUBXACTS: u32 = 1 << 1;
pub const XACT_XINFO_HAS_RELFILENODES: u32 = 1 << 2;
pub const XACT_XINFO_HAS_INVALS: u32 = 1 << 3;
pub const XACT_XINFO_HAS_TWOPHASE: u32 = 1 << 4;
pub const XACT_XINFO_HAS_ORIGIN: u32 = 1 << 5;
pub const XACT_XINFO_HAS_AE_LOCKS: u32 = 1 << 6;
pub const XACT_XINFO_HAS_GID: u32 = 1 << 7;
pub const XACT_XINFO_HAS_DROPPED_STATS: u32 = 1 << 8;

/// Size of one `SharedInvalidationMessage`.
const INVALIDATION_MESSAGE_SIZE: usize = 16;
/// Size of one `xl_xact_stats_item`: kind, database and object id; 18
/// widened the object id to 64 bits (two 32-bit halves).
fn stats_item_size(version: PgVersion) -> usize {
    if version >= PgVersion::V18 {
        16
    } else {
        12
    }
}

/// Whether a finish record commits or aborts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Outcome {
    Commit,
    Abort,
}

/// A parsed commit or abort record (plain or of a prepared transaction).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct XactFinish {
    pub outcome: Outcome,
    /// True for COMMIT PREPARED / ABORT PREPARED.
    pub prepared: bool,
    pub xact_time: i64,
    pub xinfo: u32,
    pub db_id: Oid,
    pub ts_id: Oid,
    pub subxacts: Vec<TransactionId>,
    /// Relations whose files are removed by this commit or abort.
    pub dropped_rels: Vec<RelFileNode>,
    /// The prepared transaction being finished.
    pub twophase_xid: Option<TransactionId>,
    pub gid: Option<String>,
}

impl XactFinish {
    /// The top-level transaction whose status this record sets.
    pub fn xid(&self, record_xid: TransactionId) -> TransactionId {
        self.twophase_xid.unwrap_or(record_xid)
    }
}

/// The fixed header of a PREPARE record (`xl_xact_prepare`), which is also
/// the start of the two-phase state file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct XactPrepare {
    pub magic: u32,
    pub total_len: u32,
    pub xid: TransactionId,
    pub database: Oid,
    pub prepared_at: i64,
    pub owner: Oid,
    pub nsubxacts: i32,
    pub ncommitrels: i32,
    pub nabortrels: i32,
    pub ncommitstats: i32,
    pub nabortstats: i32,
    pub ninvalmsgs: i32,
    pub initfileinval: bool,
    pub gidlen: u16,
    pub gid: String,
}

/// The decoded transaction records.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum XactRecord {
    Finish(XactFinish),
    Prepare(XactPrepare),
    Assignment { top_xid: TransactionId, subxacts: Vec<TransactionId> },
    Invalidations,
}

fn xids(c: &mut Cursor<'_>) -> Result<Vec<TransactionId>, Truncated> {
    let n = c.count(4)?;
    (0..n).map(|_| c.u32()).collect()
}

fn c_string(c: &mut Cursor<'_>) -> Result<String, Truncated> {
    let offset = c.position();
    let rest = c.take(c.remaining())?;
    let end =
        rest.iter().position(|b| *b == 0).ok_or(Truncated { offset, needed: rest.len() + 1, available: rest.len() })?;
    let s = String::from_utf8_lossy(&rest[..end]).into_owned();
    // Put back what follows the terminator.
    *c = Cursor::new(&rest[end + 1..]);
    Ok(s)
}

fn parse_finish(version: PgVersion, info: u8, data: &[u8]) -> Result<XactFinish, Truncated> {
    let op = info & XLOG_XACT_OPMASK;
    let mut c = Cursor::new(data);
    let xact_time = c.i64()?;
    let xinfo = if info & XLOG_XACT_HAS_INFO != 0 { c.u32()? } else { 0 };
    let mut finish = XactFinish {
        outcome: if matches!(op, XLOG_XACT_COMMIT | XLOG_XACT_COMMIT_PREPARED) {
            Outcome::Commit
        } else {
            Outcome::Abort
        },
        prepared: matches!(op, XLOG_XACT_COMMIT_PREPARED | XLOG_XACT_ABORT_PREPARED),
        xact_time,
        xinfo,
        db_id: 0,
        ts_id: 0,
        subxacts: Vec::new(),
        dropped_rels: Vec::new(),
        twophase_xid: None,
        gid: None,
    };
    if xinfo & XACT_XINFO_HAS_DBINFO != 0 {
        finish.db_id = c.u32()?;
        finish.ts_id = c.u32()?;
    }
    if xinfo & XACT_XINFO_HAS_SUBXACTS != 0 {
        finish.subxacts = xids(&mut c)?;
    }
    if xinfo & XACT_XINFO_HAS_RELFILENODES != 0 {
        let n = c.count(RelFileNode::SIZE)?;
        finish.dropped_rels = (0..n).map(|_| c.rel_file_node()).collect::<Result<_, _>>()?;
    }
    if xinfo & XACT_XINFO_HAS_DROPPED_STATS != 0 {
        let size = stats_item_size(version);
        let n = c.count(size)?;
        c.skip(n * size)?;
    }
    // Abort records never carry invalidations.
    if xinfo & XACT_XINFO_HAS_INVALS != 0 && finish.outcome == Outcome::Commit {
        let n = c.count(INVALIDATION_MESSAGE_SIZE)?;
        c.skip(n * INVALIDATION_MESSAGE_SIZE)?;
    }
    if xinfo & XACT_XINFO_HAS_TWOPHASE != 0 {
        finish.twophase_xid = Some(c.u32()?);
        if xinfo & XACT_XINFO_HAS_GID != 0 {
            finish.gid = Some(c_string(&mut c)?);
        }
    }
    if xinfo & XACT_XINFO_HAS_ORIGIN != 0 {
        c.skip(16)?;
    }
    Ok(finish)
}

fn parse_prepare(data: &[u8]) -> Result<XactPrepare, Truncated> {
    let mut c = Cursor::new(data);
    let magic = c.u32()?;
    let total_len = c.u32()?;
    let xid = c.u32()?;
    let database = c.u32()?;
    let prepared_at = c.i64()?;
    let owner = c.u32()?;
    let nsubxacts = c.i32()?;
    let ncommitrels = c.i32()?;
    let nabortrels = c.i32()?;
    let ncommitstats = c.i32()?;
    let nabortstats = c.i32()?;
    let ninvalmsgs = c.i32()?;
    let initfileinval = c.u8()? != 0;
    c.skip(1)?;
    let gidlen = c.u16()?;
    c.skip(16)?; // origin lsn and timestamp
                 // The GID follows the MAXALIGNed header (72 bytes).
    c.align(8)?;
    let gid_bytes = c.take(gidlen as usize)?;
    let end = gid_bytes.iter().position(|b| *b == 0).unwrap_or(gid_bytes.len());
    let gid = String::from_utf8_lossy(&gid_bytes[..end]).into_owned();
    Ok(XactPrepare {
        magic,
        total_len,
        xid,
        database,
        prepared_at,
        owner,
        nsubxacts,
        ncommitrels,
        nabortrels,
        ncommitstats,
        nabortstats,
        ninvalmsgs,
        initfileinval,
        gidlen,
        gid,
    })
}

/// Decodes a transaction record's main data, as written by `version`.
pub fn parse(version: PgVersion, info: u8, data: &[u8]) -> Result<XactRecord, Truncated> {
    Ok(match info & XLOG_XACT_OPMASK {
        XLOG_XACT_COMMIT | XLOG_XACT_ABORT | XLOG_XACT_COMMIT_PREPARED | XLOG_XACT_ABORT_PREPARED => {
            XactRecord::Finish(parse_finish(version, info, data)?)
        }
        XLOG_XACT_PREPARE => XactRecord::Prepare(parse_prepare(data)?),
        XLOG_XACT_ASSIGNMENT => {
            let mut c = Cursor::new(data);
            let top_xid = c.u32()?;
            XactRecord::Assignment { top_xid, subxacts: xids(&mut c)? }
        }
        _ => XactRecord::Invalidations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A COMMIT_PREPARED record that dropped the statistics of one object
    /// (`size` bytes per item) and carries no invalidations, then the
    /// prepared transaction's xid.
    fn commit_prepared(size: usize) -> Vec<u8> {
        let mut d = 7i64.to_le_bytes().to_vec(); // xact_time
        d.extend_from_slice(&(XACT_XINFO_HAS_DROPPED_STATS | XACT_XINFO_HAS_TWOPHASE).to_le_bytes());
        d.extend_from_slice(&1i32.to_le_bytes());
        d.extend(std::iter::repeat_n(0xAB, size));
        d.extend_from_slice(&4242u32.to_le_bytes());
        d
    }

    #[test]
    fn dropped_statistics_items_are_12_bytes_before_18_and_16_from_18() {
        let info = XLOG_XACT_COMMIT_PREPARED | XLOG_XACT_HAS_INFO;
        for (version, size) in [(PgVersion::V15, 12), (PgVersion::V17, 12), (PgVersion::V18, 16)] {
            let XactRecord::Finish(f) = parse(version, info, &commit_prepared(size)).unwrap() else { panic!() };
            assert_eq!((f.outcome, f.twophase_xid), (Outcome::Commit, Some(4242)), "{version}");
        }
        // 18's record read as 15's loses the prepared xid to the stats' tail.
        let XactRecord::Finish(f) = parse(PgVersion::V15, info, &commit_prepared(16)).unwrap() else { panic!() };
        assert_ne!(f.twophase_xid, Some(4242));
        assert!(parse(PgVersion::V18, info, &commit_prepared(12)).is_err(), "too short for 18's item");
    }
}
