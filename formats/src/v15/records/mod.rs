//! Decoders for the PostgreSQL 15 records whose effects a page server must
//! know beyond block images: transaction status, SLRUs, whole-file
//! operations, relation mapping, checkpoints, visibility-map clearing and the
//! GiST follow-right fix-up.

pub mod gist;
pub mod heap;
pub mod logicalmsg;
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
    /// A logical decoding message (`pg_logical_emit_message`).
    LogicalMessage(logicalmsg::LogicalMessage),
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
        RM_XACT_ID => Some(ParsedRecord::Xact(xact::parse(record.version, info, data).map_err(|e| err(&e))?)),
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
        RM_LOGICALMSG_ID => logicalmsg::parse(info, data).map_err(|e| err(&e))?.map(ParsedRecord::LogicalMessage),
        _ => None,
    };
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;
    use crate::types::RelFileNode;
    use crate::wal::record::RecordHeader;

    /// A record with the given block references (no images, no block data)
    /// and main data; the CRC is not needed for fragment decoding.
    fn record(rmgr: u8, info: u8, xid: u32, blocks: &[(RelFileNode, u32)], main: &[u8]) -> DecodedRecord {
        let mut body = Vec::new();
        for (i, (rel, blk)) in blocks.iter().enumerate() {
            body.extend_from_slice(&[i as u8, 0, 0, 0]);
            body.extend_from_slice(&rel.encode());
            body.extend_from_slice(&blk.to_le_bytes());
        }
        body.extend_from_slice(&[255, main.len() as u8]);
        body.extend_from_slice(main);
        let header = RecordHeader { total_length: 24 + body.len() as u32, xid, prev: Lsn(8), info, rmgr, crc: 0 };
        let mut raw = header.encode().to_vec();
        raw.extend(body);
        DecodedRecord::decode(crate::PgVersion::V15, Lsn(0x100), Lsn(0x200), raw).unwrap()
    }

    const REL: RelFileNode = RelFileNode { spc: 1663, db: 5, rel: 16384 };

    #[test]
    fn heap_update_clears_old_and_new_vm_bits() {
        // xl_heap_update: old_xmax, old_offnum, old_infobits, flags=0b11, new_xmax, new_offnum
        let mut main = vec![0u8; 14];
        main[7] = 0b11;
        let r = record(RM_HEAP_ID, heap::XLOG_HEAP_UPDATE, 900, &[(REL, 70_000), (REL, 5)], &main);
        let Some(ParsedRecord::VmClear(clears)) = parse(&r).unwrap() else { panic!("no VM clears") };
        assert_eq!(clears.len(), 2);
        assert_eq!((clears[0].heap_block, clears[0].bits), (5, heap::VISIBILITYMAP_VALID_BITS));
        assert_eq!((clears[1].heap_block, clears[1].bits), (70_000, heap::VISIBILITYMAP_VALID_BITS));
        // 32672 heap blocks per VM page, 4 per byte, 2 bits each.
        assert_eq!(clears[1].vm_block(), 2);
        assert_eq!(clears[1].vm_byte_and_shift(), ((70_000 - 2 * 32672) as usize / 4, 0));
        assert_eq!(clears[0].vm_byte_and_shift(), (1, 2));
    }

    #[test]
    fn heap_lock_clears_only_all_frozen_and_insert_without_flag_clears_nothing() {
        let mut main = vec![0u8; 8];
        main[7] = 1;
        let r = record(RM_HEAP_ID, heap::XLOG_HEAP_LOCK, 900, &[(REL, 3)], &main);
        let Some(ParsedRecord::VmClear(clears)) = parse(&r).unwrap() else { panic!("no VM clears") };
        assert_eq!(clears[0].bits, heap::VISIBILITYMAP_ALL_FROZEN);
        let r = record(RM_HEAP_ID, heap::XLOG_HEAP_INSERT | heap::XLOG_HEAP_INIT_PAGE, 900, &[(REL, 3)], &[1, 0, 0]);
        assert_eq!(parse(&r).unwrap(), None);
        // A heap record without its block reference is malformed, not a panic.
        let r = record(RM_HEAP_ID, heap::XLOG_HEAP_DELETE, 900, &[], &[0, 0, 0, 0, 1, 0, 0, 1]);
        assert!(parse(&r).is_err());
    }

    #[test]
    fn commit_with_subtransactions_and_dropped_relations() {
        let mut main = Vec::new();
        main.extend_from_slice(&1234i64.to_le_bytes()); // xact_time
        let xinfo = xact::XACT_XINFO_HAS_DBINFO | xact::XACT_XINFO_HAS_SUBXACTS | xact::XACT_XINFO_HAS_RELFILENODES;
        main.extend_from_slice(&xinfo.to_le_bytes());
        main.extend_from_slice(&5u32.to_le_bytes()); // db
        main.extend_from_slice(&1663u32.to_le_bytes()); // tablespace
        main.extend_from_slice(&2i32.to_le_bytes());
        main.extend_from_slice(&901u32.to_le_bytes());
        main.extend_from_slice(&902u32.to_le_bytes());
        main.extend_from_slice(&1i32.to_le_bytes());
        main.extend_from_slice(&REL.encode());
        let r = record(RM_XACT_ID, xact::XLOG_XACT_COMMIT | xact::XLOG_XACT_HAS_INFO, 900, &[], &main);
        let Some(ParsedRecord::Xact(xact::XactRecord::Finish(f))) = parse(&r).unwrap() else { panic!() };
        assert_eq!(f.outcome, xact::Outcome::Commit);
        assert_eq!(f.subxacts, vec![901, 902]);
        assert_eq!(f.dropped_rels, vec![REL]);
        assert_eq!((f.db_id, f.ts_id), (5, 1663));
        assert_eq!(f.xid(900), 900);
        // A subtransaction count larger than the data is an error, not an allocation.
        let mut bad = main.clone();
        bad[20..24].copy_from_slice(&i32::MAX.to_le_bytes());
        let r = record(RM_XACT_ID, xact::XLOG_XACT_COMMIT | xact::XLOG_XACT_HAS_INFO, 900, &[], &bad);
        assert!(parse(&r).is_err());
    }

    #[test]
    fn gist_follow_right_child() {
        let r = record(RM_GIST_ID, gist::XLOG_GIST_PAGE_UPDATE, 0, &[(REL, 1), (REL, 2)], &[0; 8]);
        assert_eq!(parse(&r).unwrap(), Some(ParsedRecord::GistFollowRight { block_id: 1 }));
        let r = record(RM_GIST_ID, gist::XLOG_GIST_PAGE_UPDATE, 0, &[(REL, 1)], &[0; 8]);
        assert_eq!(parse(&r).unwrap(), None);
        let mut page = [0u8; 8192];
        page[8192 - 4..8192 - 2].copy_from_slice(&(gist::F_FOLLOW_RIGHT | 1).to_le_bytes());
        gist::clear_follow_right(&mut page, Lsn(0x1_0000_0020));
        assert_eq!(u16::from_le_bytes([page[8188], page[8189]]), 1, "only F_FOLLOW_RIGHT cleared");
        assert_eq!(&page[8176..8184], &[1, 0, 0, 0, 0x20, 0, 0, 0], "NSN = LSN (xlogid, xrecoff)");
        assert_eq!(&page[0..8], &[1, 0, 0, 0, 0x20, 0, 0, 0], "pd_lsn");
    }
}
