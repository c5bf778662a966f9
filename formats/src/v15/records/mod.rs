//! Decoders for the PostgreSQL 15 records whose effects a page server must
//! know beyond block images: transaction status, SLRUs, whole-file
//! operations, relation mapping, checkpoints, visibility-map clearing and the
//! GiST follow-right fix-up.

pub mod gist;
pub mod heap;
pub mod slru;
pub mod storage;
pub mod xact;
pub mod xlog;

use crate::v15::rmgr::*;
use crate::wal::record::DecodedRecord;

/// The content of a record, for the records Strata interprets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedRecord {
    Xlog(xlog::XlogRecord),
    Xact(xact::XactRecord),
    Smgr(storage::SmgrRecord),
    Clog(slru::ClogRecord),
    Dbase(storage::DbaseRecord),
    Tblspc(storage::TblspcRecord),
    MultiXact(slru::MultiXactRecord),
    RelMap(storage::RelMapUpdate),
    /// A heap or heap2 record that clears visibility-map bits.
    VmClear(Vec<heap::VmClear>),
    /// A GiST record whose left child (this block id) needs the follow-right fix-up.
    GistFollowRight {
        block_id: u8,
    },
}

/// A record whose main data does not match its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {rmgr} record: {reason}")]
pub struct ParseError {
    pub rmgr: String,
    pub reason: String,
}

/// Interprets a record; `Ok(None)` for records with nothing beyond their
/// block references (or nothing Strata needs).
pub fn parse(record: &DecodedRecord) -> Result<Option<ParsedRecord>, ParseError> {
    let info = record.header.info;
    let data = record.main_data();
    let err = |e: &dyn std::fmt::Display| ParseError { rmgr: name(record.rmgr()).into_owned(), reason: e.to_string() };
    let parsed = match record.rmgr() {
        RM_XLOG_ID => Some(ParsedRecord::Xlog(xlog::parse(info, data).map_err(|e| err(&e))?)),
        RM_XACT_ID => Some(ParsedRecord::Xact(xact::parse(info, data).map_err(|e| err(&e))?)),
        RM_SMGR_ID => storage::parse_smgr(info, data).map_err(|e| err(&e))?.map(ParsedRecord::Smgr),
        RM_CLOG_ID => slru::parse_clog(info, data).map_err(|e| err(&e))?.map(ParsedRecord::Clog),
        RM_DBASE_ID => storage::parse_dbase(info, data).map_err(|e| err(&e))?.map(ParsedRecord::Dbase),
        RM_TBLSPC_ID => storage::parse_tblspc(info, data).map_err(|e| err(&e))?.map(ParsedRecord::Tblspc),
        RM_MULTIXACT_ID => slru::parse_multixact(info, data).map_err(|e| err(&e))?.map(ParsedRecord::MultiXact),
        RM_RELMAP_ID => storage::parse_relmap(info, data).map_err(|e| err(&e))?.map(ParsedRecord::RelMap),
        RM_HEAP_ID | RM_HEAP2_ID => {
            let clears = heap::vm_clears(record, record.rmgr() == RM_HEAP2_ID).map_err(|e| err(&e))?;
            (!clears.is_empty()).then_some(ParsedRecord::VmClear(clears))
        }
        RM_GIST_ID => gist::follow_right_child(record).map(|block_id| ParsedRecord::GistFollowRight { block_id }),
        _ => None,
    };
    Ok(parsed)
}
