//! GiST: after a page update or split, redo marks the left child of the
//! inserted downlink as complete (clears F_FOLLOW_RIGHT and sets its NSN to
//! the record's LSN). The server makes that change after the record is
//! written, so the left child's image in the record lacks it.

use crate::wal::record::DecodedRecord;

pub const XLOG_GIST_PAGE_UPDATE: u8 = 0x00;
pub const XLOG_GIST_DELETE: u8 = 0x10;
pub const XLOG_GIST_PAGE_REUSE: u8 = 0x20;
pub const XLOG_GIST_PAGE_SPLIT: u8 = 0x30;
pub const XLOG_GIST_PAGE_DELETE: u8 = 0x60;
pub const XLOG_GIST_ASSIGN_LSN: u8 = 0x70;

/// GiST page flag: the right sibling has no downlink in the parent yet.
pub const F_FOLLOW_RIGHT: u16 = 1 << 3;

/// The block id of the left child whose follow-right flag this record clears.
pub fn follow_right_child(record: &DecodedRecord) -> Option<u8> {
    let id = match record.rmgr_info() {
        XLOG_GIST_PAGE_UPDATE => 1,
        XLOG_GIST_PAGE_SPLIT => 0,
        _ => return None,
    };
    record.block(id).map(|b| b.id)
}

/// Applies the fix-up to a GiST page: NSN := `lsn`, clear F_FOLLOW_RIGHT,
/// pd_lsn := `lsn`. The GiST opaque area is the last 16 bytes of the page:
/// nsn (8), rightlink (4), flags (2), page id (2).
pub fn clear_follow_right(page: &mut [u8; crate::version::BLCKSZ], lsn: crate::lsn::Lsn) {
    let special = crate::version::BLCKSZ - 16;
    let lsn_bytes = [((lsn.0 >> 32) as u32).to_le_bytes(), (lsn.0 as u32).to_le_bytes()].concat();
    page[special..special + 8].copy_from_slice(&lsn_bytes);
    let flags = u16::from_le_bytes([page[special + 12], page[special + 13]]) & !F_FOLLOW_RIGHT;
    page[special + 12..special + 14].copy_from_slice(&flags.to_le_bytes());
    page[0..8].copy_from_slice(&lsn_bytes);
}
