//! Entry point for the fuzz target (`fuzz/`): native redo of arbitrary
//! heap, heap2 and btree records on arbitrary pages must return errors, never
//! panic or write outside the page.

use strata_formats::v15::rmgr::{RM_BTREE_ID, RM_HEAP2_ID, RM_HEAP_ID};
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::{record_crc, DecodedRecord, RECORD_HEADER_SIZE};
use strata_formats::{Lsn, PgVersion};

use crate::redo_block;

/// `data` = a selector byte (which resource manager and PostgreSQL major), the record, and
/// optionally a last full page to redo on (otherwise a zero page). The
/// record's length, resource manager and CRC are fixed up, so the fuzzer
/// spends its time in redo rather than on checksums.
pub fn fuzz_one(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    let rmgr = [RM_HEAP_ID, RM_HEAP2_ID, RM_BTREE_ID][usize::from(selector) % 3];
    let (record, page) =
        if rest.len() > BLCKSZ + RECORD_HEADER_SIZE { rest.split_at(rest.len() - BLCKSZ) } else { (rest, &[][..]) };
    if record.len() < RECORD_HEADER_SIZE {
        return;
    }
    let mut raw = record.to_vec();
    let len = raw.len() as u32;
    raw[0..4].copy_from_slice(&len.to_le_bytes());
    raw[17] = rmgr;
    let crc = record_crc(&raw);
    raw[20..24].copy_from_slice(&crc.to_le_bytes());
    let start = Lsn(0x0100_0028);
    let version = PgVersion::ALL[usize::from(selector / 3) % PgVersion::ALL.len()];
    let Ok(rec) = DecodedRecord::decode(version, start, Lsn(start.0 + u64::from(len)), raw) else { return };
    for block in &rec.blocks {
        let mut target = [0u8; BLCKSZ];
        if page.len() == BLCKSZ {
            target.copy_from_slice(page);
        }
        let _ = redo_block(&rec, block.id, &mut target);
    }
}
