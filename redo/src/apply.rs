//! Redo of PostgreSQL's own WAL records, block by block: which records are
//! applied natively and the dispatch to each resource manager's redo.
//!
//! A block's redo gets the whole decoded record (some redo routines read
//! other block references, e.g. a btree split's sibling numbers) and the
//! page as it was before the record. Like PostgreSQL's redo it stamps the
//! page with the record's end LSN.

use strata_formats::v15::rmgr::{RM_BTREE_ID, RM_HEAP2_ID, RM_HEAP_ID};
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::DecodedRecord;

use crate::{heap, nbtree, RedoError};

/// Whether a block reference of a record with this resource manager and
/// `xl_info` is redone natively (otherwise it needs a full-page image).
pub fn supports(rmgr: u8, info: u8) -> bool {
    match rmgr {
        RM_HEAP_ID => heap::supports_heap(info),
        RM_HEAP2_ID => heap::supports_heap2(info),
        RM_BTREE_ID => nbtree::supports(info),
        _ => false,
    }
}

/// Applies `rec`'s change to its block `block_id`, whose content before the
/// record is `page` (all zeros for a page that does not exist yet; ignored
/// when the block is initialized by the record). Errors,
/// never a guess, when the record or the page is not what redo expects.
pub fn redo_block(rec: &DecodedRecord, block_id: u8, page: &mut [u8; BLCKSZ]) -> Result<(), RedoError> {
    let block = rec.block(block_id).ok_or(RedoError::NoBlock(block_id))?;
    if block.will_init() {
        // PostgreSQL hands redo a zeroed buffer: the old content must not leak in.
        page.fill(0);
    }
    match rec.rmgr() {
        RM_HEAP_ID | RM_HEAP2_ID if heap::clears_vm_block(rec, block.fork) => heap::redo_vm_block(rec, block_id, page),
        RM_HEAP_ID if heap::supports_heap(rec.header.info) => heap::redo_heap(rec, block_id, page),
        RM_HEAP2_ID if heap::supports_heap2(rec.header.info) => heap::redo_heap2(rec, block_id, page),
        RM_BTREE_ID if nbtree::supports(rec.header.info) => nbtree::redo(rec, block_id, page),
        rmgr => Err(RedoError::Unsupported { rmgr, info: rec.header.info }),
    }
}
