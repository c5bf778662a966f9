//! Redo of heap and heap2 records (PostgreSQL 15 `heapam.c`).
//!
//! Each function applies one record to one of its blocks, exactly as
//! PostgreSQL's redo changes that buffer when it needs redo. Changes to the
//! visibility map that heap records make without a block reference are not
//! made here (they are derived separately); the heap page's own
//! PD_ALL_VISIBLE flag is.

use strata_formats::page::{
    is_new, item_id, max_offset_number, pd_flags, pd_lsn, pd_prune_xid, set_item_id, set_pd_flags, set_pd_lsn,
    set_pd_prune_xid, ItemId, PageError, LP_DEAD, LP_REDIRECT, LP_UNUSED, PAGE_HEADER_SIZE, PD_ALL_VISIBLE,
};
use strata_formats::types::{Cursor, ForkNumber, TransactionId};
use strata_formats::v15::records::heap::{
    vm_clears, VISIBILITYMAP_VALID_BITS, XLOG_HEAP2_FREEZE_PAGE, XLOG_HEAP2_LOCK_UPDATED, XLOG_HEAP2_MULTI_INSERT,
    XLOG_HEAP2_NEW_CID, XLOG_HEAP2_PRUNE, XLOG_HEAP2_VACUUM, XLOG_HEAP2_VISIBLE, XLOG_HEAP_CONFIRM, XLOG_HEAP_DELETE,
    XLOG_HEAP_HOT_UPDATE, XLOG_HEAP_INIT_PAGE, XLOG_HEAP_INPLACE, XLOG_HEAP_INSERT, XLOG_HEAP_LOCK, XLOG_HEAP_OPMASK,
    XLOG_HEAP_UPDATE,
};
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::{BlockRef, DecodedRecord};

use crate::bufpage::{
    page_add_item, page_get_item, page_get_item_mut, page_init, page_repair_fragmentation,
    page_truncate_line_pointer_array, Page,
};
use crate::htup::{xid_precedes, xmax_is_locked_only, TupleMut, HEAP_HOT_UPDATED, HEAP_TUPLE_HEADER_SIZE};
use crate::htup::{FROZEN_TRANSACTION_ID, MOVED_PARTITIONS_BLOCK, MOVED_PARTITIONS_OFFSET};
use crate::{RedoError, HEAPBLOCKS_PER_VM_PAGE};

pub mod prune_freeze;
pub mod records;

use prune_freeze::{PruneFreeze, PruneFreezeData};
use records::*;

/// Largest heap tuple (`MaxHeapTupleSize`): a page holding just that tuple and its line pointer.
pub const MAX_HEAP_TUPLE_SIZE: usize = BLCKSZ - crate::bufpage::maxalign(PAGE_HEADER_SIZE + 4);

/// Where the visibility map's bits start on its pages (after the MAXALIGNed page header).
const VM_MAP_START: usize = 24;

/// Heap records (`xl_info`) that are redone natively.
///
/// TRUNCATE has no block reference (its redo only serves logical decoding).
pub fn supports_heap(info: u8) -> bool {
    matches!(
        info & XLOG_HEAP_OPMASK,
        XLOG_HEAP_INSERT
            | XLOG_HEAP_DELETE
            | XLOG_HEAP_UPDATE
            | XLOG_HEAP_HOT_UPDATE
            | XLOG_HEAP_CONFIRM
            | XLOG_HEAP_LOCK
            | XLOG_HEAP_INPLACE
    )
}

/// Heap2 records (`xl_info`) that are redone natively.
///
/// NEW_CID changes no page (it only serves logical decoding); REWRITE
/// writes logical-decoding mapping files, not pages.
pub fn supports_heap2(info: u8) -> bool {
    matches!(
        info & XLOG_HEAP_OPMASK,
        XLOG_HEAP2_PRUNE
            | XLOG_HEAP2_VACUUM
            | XLOG_HEAP2_FREEZE_PAGE
            | XLOG_HEAP2_VISIBLE
            | XLOG_HEAP2_MULTI_INSERT
            | XLOG_HEAP2_LOCK_UPDATED
            | XLOG_HEAP2_NEW_CID
    )
}

/// Redoes a heap or heap2 record on a visibility-map block it references:
/// clears that record's bits of the heap blocks this VM page covers, and
/// stamps the page only if a bit changed. Minor releases from 18.6 on
/// register the VM page in the records that clear its bits (older WAL has
/// no such reference; the clears are then derived by the pageserver).
pub fn redo_vm_block(rec: &DecodedRecord, block_id: u8, page: &mut [u8; BLCKSZ]) -> Result<(), RedoError> {
    let vm = rec.block(block_id).ok_or(RedoError::NoBlock(block_id))?;
    debug_assert_eq!(vm.fork, ForkNumber::VisibilityMap);
    let clears = vm_clears(rec, rec.rmgr() == strata_formats::v15::rmgr::RM_HEAP2_ID)
        .map_err(|e| RedoError::BadRecord(e.to_string()))?;
    let mine: Vec<_> =
        clears.iter().filter(|c| c.rel == vm.rel && c.heap_block / HEAPBLOCKS_PER_VM_PAGE == vm.block).collect();
    if mine.is_empty() {
        return Err(RedoError::BadRecord(format!(
            "block {block_id} is visibility-map page {} but the record clears no bit on it",
            vm.block
        )));
    }
    // Replay that already went past this record leaves the page alone. On a
    // page that does not exist yet (zeros) no bit is set: nothing changes
    // and the page is not stamped.
    if rec.end_lsn.0 <= pd_lsn(page).map_err(page_err)? {
        return Ok(());
    }
    let mut changed = false;
    for c in mine {
        let in_page = (c.heap_block % HEAPBLOCKS_PER_VM_PAGE) as usize;
        let byte = VM_MAP_START + in_page / 4;
        let mask = (c.bits & VISIBILITYMAP_VALID_BITS) << (2 * (in_page % 4));
        changed |= page[byte] & mask != 0;
        page[byte] &= !mask;
    }
    if changed {
        set_lsn(rec, page)?;
    }
    Ok(())
}

/// Whether a heap or heap2 record's block in `fork` is a visibility-map page
/// whose bits the record clears (heap2 `VISIBLE` sets them: its own redo).
pub fn clears_vm_block(rec: &DecodedRecord, fork: ForkNumber) -> bool {
    fork == ForkNumber::VisibilityMap
        && !(rec.rmgr() == strata_formats::v15::rmgr::RM_HEAP2_ID
            && rec.header.info & XLOG_HEAP_OPMASK == XLOG_HEAP2_VISIBLE)
}

/// Redoes a heap record on block `block_id`.
pub fn redo_heap(rec: &DecodedRecord, block_id: u8, page: &mut [u8; BLCKSZ]) -> Result<(), RedoError> {
    match rec.header.info & XLOG_HEAP_OPMASK {
        XLOG_HEAP_INSERT => insert(rec, block_id, page),
        XLOG_HEAP_DELETE => delete(rec, block_id, page),
        XLOG_HEAP_UPDATE => update(rec, block_id, page, false),
        XLOG_HEAP_HOT_UPDATE => update(rec, block_id, page, true),
        XLOG_HEAP_CONFIRM => confirm(rec, block_id, page),
        XLOG_HEAP_LOCK => lock(rec, block_id, page),
        XLOG_HEAP_INPLACE => inplace(rec, block_id, page),
        _ => Err(RedoError::Unsupported { rmgr: rec.rmgr(), info: rec.header.info }),
    }
}

/// Redoes a heap2 record on block `block_id`.
pub fn redo_heap2(rec: &DecodedRecord, block_id: u8, page: &mut [u8; BLCKSZ]) -> Result<(), RedoError> {
    let op = rec.header.info & XLOG_HEAP_OPMASK;
    if rec.version.merged_prune_records() && matches!(op, XLOG_HEAP2_PRUNE | XLOG_HEAP2_VACUUM | XLOG_HEAP2_FREEZE_PAGE)
    {
        // 17's PRUNE_ON_ACCESS, PRUNE_VACUUM_SCAN and PRUNE_VACUUM_CLEANUP.
        return prune_and_freeze(rec, block_id, page);
    }
    match op {
        XLOG_HEAP2_PRUNE => prune(rec, block_id, page),
        XLOG_HEAP2_VACUUM => vacuum(rec, block_id, page),
        XLOG_HEAP2_FREEZE_PAGE => freeze_page(rec, block_id, page),
        XLOG_HEAP2_VISIBLE => visible(rec, block_id, page),
        XLOG_HEAP2_MULTI_INSERT => multi_insert(rec, block_id, page),
        XLOG_HEAP2_LOCK_UPDATED => lock_updated(rec, block_id, page),
        XLOG_HEAP2_NEW_CID => Ok(()),
        _ => Err(RedoError::Unsupported { rmgr: rec.rmgr(), info: rec.header.info }),
    }
}

fn page_err(e: PageError) -> RedoError {
    RedoError::BadPage(e.to_string())
}

/// The block reference being redone, which must be the record's block
/// `expected` (the only one this kind of record changes).
fn only_block(rec: &DecodedRecord, block_id: u8, expected: u8) -> Result<&BlockRef, RedoError> {
    if block_id != expected {
        return Err(RedoError::BadRecord(format!("this record changes only block {expected}, not block {block_id}")));
    }
    rec.block(block_id).ok_or(RedoError::NoBlock(block_id))
}

fn set_lsn(rec: &DecodedRecord, page: &mut Page) -> Result<(), RedoError> {
    set_pd_lsn(page, rec.end_lsn.0).map_err(page_err)
}

fn set_all_visible(page: &mut Page, on: bool) -> Result<(), RedoError> {
    let flags = pd_flags(page).map_err(page_err)?;
    let flags = if on { flags | PD_ALL_VISIBLE } else { flags & !PD_ALL_VISIBLE };
    set_pd_flags(page, flags).map_err(page_err)
}

/// `PageSetPrunable`: remember the oldest transaction that may leave prunable tuples.
fn set_prunable(page: &mut Page, xid: TransactionId) -> Result<(), RedoError> {
    let current = pd_prune_xid(page).map_err(page_err)?;
    if current == 0 || xid_precedes(xid, current) {
        set_pd_prune_xid(page, xid).map_err(page_err)?;
    }
    Ok(())
}

fn max_offset(page: &Page) -> Result<u16, RedoError> {
    max_offset_number(page).map_err(page_err)
}

/// The tuple at `offnum`, which must be an existing normal line pointer
/// (PostgreSQL panics with "invalid lp" otherwise).
fn normal_tuple(page: &mut Page, offnum: u16) -> Result<TupleMut<'_>, RedoError> {
    let max = max_offset(page)?;
    if offnum == 0 || offnum > max || !item_id(page, offnum).map_err(page_err)?.is_normal() {
        return Err(RedoError::BadPage(format!("invalid lp: offset {offnum} is not a normal item (max {max})")));
    }
    TupleMut::new(page_get_item_mut(page, offnum)?)
}

/// A new tuple goes at most one past the last line pointer.
fn check_new_offset(page: &Page, offnum: u16) -> Result<(), RedoError> {
    let max = max_offset(page)?;
    if max as u32 + 1 < offnum as u32 {
        return Err(RedoError::BadPage(format!("invalid max offset number: new item {offnum}, page has {max}")));
    }
    Ok(())
}

/// A tuple as heap redo rebuilds it from a logged header and data: the
/// inserting transaction as xmin, command id 0 and `ctid` pointing at itself.
fn build_tuple(
    header: &HeapHeader,
    parts: &[&[u8]],
    xid: TransactionId,
    block: u32,
    offnum: u16,
) -> Result<Vec<u8>, RedoError> {
    let len = HEAP_TUPLE_HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
    if len > MAX_HEAP_TUPLE_SIZE {
        return Err(RedoError::BadRecord(format!("a heap tuple of {len} bytes is larger than a page allows")));
    }
    let mut bytes = Vec::with_capacity(len);
    bytes.resize(HEAP_TUPLE_HEADER_SIZE, 0);
    for p in parts {
        bytes.extend_from_slice(p);
    }
    let mut t = TupleMut::new(&mut bytes)?;
    t.set_infomask2(header.t_infomask2);
    t.set_infomask(header.t_infomask);
    t.set_hoff(header.t_hoff);
    t.set_xmin(xid);
    t.set_plain_cid(0);
    t.set_ctid(block, offnum);
    Ok(bytes)
}

fn insert(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapInsert::decode(rec.main_data())?;
    if rec.header.info & XLOG_HEAP_INIT_PAGE != 0 {
        page_init(page, 0);
    }
    check_new_offset(page, xl.offnum)?;
    let data = rec.block_data(blk);
    if data.len() <= HeapHeader::SIZE {
        return Err(RedoError::BadRecord(format!("insert carries {} bytes of tuple", data.len())));
    }
    let mut c = Cursor::new(data);
    let header = HeapHeader::read(&mut c)?;
    let tuple = build_tuple(&header, &[&data[HeapHeader::SIZE..]], rec.header.xid, blk.block, xl.offnum)?;
    page_add_item(page, &tuple, Some(xl.offnum), true, true)?;
    if xl.flags & XLH_INSERT_ALL_VISIBLE_CLEARED != 0 {
        set_all_visible(page, false)?;
    }
    set_lsn(rec, page)
}

fn multi_insert(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let init = rec.header.info & XLOG_HEAP_INIT_PAGE != 0;
    let xl = HeapMultiInsert::decode(rec.main_data(), init)?;
    if init {
        page_init(page, 0);
    }
    let data = rec.block_data(blk);
    let mut c = Cursor::new(data);
    for i in 0..xl.ntuples as usize {
        let offnum = if init { (i + 1) as u16 } else { xl.offsets[i] };
        check_new_offset(page, offnum)?;
        let t = MultiInsertTuple::read(&mut c)?;
        let body = c.take(t.datalen as usize).map_err(truncated("multi-insert tuple data"))?;
        let tuple = build_tuple(&t.header, &[body], rec.header.xid, blk.block, offnum)?;
        page_add_item(page, &tuple, Some(offnum), true, true)?;
    }
    if c.remaining() != 0 {
        return Err(RedoError::BadRecord(format!(
            "multi-insert of {} tuples leaves {} bytes of tuple data",
            xl.ntuples,
            c.remaining()
        )));
    }
    if xl.flags & XLH_INSERT_ALL_VISIBLE_CLEARED != 0 {
        set_all_visible(page, false)?;
    }
    if xl.flags & XLH_INSERT_ALL_FROZEN_SET != 0 {
        set_all_visible(page, true)?;
    }
    set_lsn(rec, page)
}

fn delete(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapDelete::decode(rec.main_data())?;
    let mut t = normal_tuple(page, xl.offnum)?;
    t.clear_xmax_bits(true);
    t.apply_infobits(xl.infobits_set);
    if xl.flags & XLH_DELETE_IS_SUPER == 0 {
        t.set_xmax(xl.xmax);
    } else {
        t.set_xmin(0);
    }
    t.set_plain_cid(0);
    if xl.flags & XLH_DELETE_IS_PARTITION_MOVE != 0 {
        t.set_ctid(MOVED_PARTITIONS_BLOCK, MOVED_PARTITIONS_OFFSET);
    } else {
        t.set_ctid(blk.block, xl.offnum);
    }
    set_prunable(page, rec.header.xid)?;
    if xl.flags & XLH_DELETE_ALL_VISIBLE_CLEARED != 0 {
        set_all_visible(page, false)?;
    }
    set_lsn(rec, page)
}

/// UPDATE and HOT_UPDATE. Block 0 gets the new tuple; the old one is on
/// block 1 if that exists, else on block 0 too (then the new tuple may
/// borrow a prefix and a suffix of the old one's data).
fn update(rec: &DecodedRecord, block_id: u8, page: &mut Page, hot: bool) -> Result<(), RedoError> {
    let xl = HeapUpdate::decode(rec.main_data())?;
    let new_blk = rec.block(0).ok_or(RedoError::NoBlock(0))?;
    let old_blk = rec.block(1);
    match block_id {
        1 => {
            if old_blk.is_none() {
                return Err(RedoError::NoBlock(1));
            }
            update_old_tuple(rec, &xl, page, hot, new_blk.block)?;
            set_lsn(rec, page)
        }
        0 => {
            let old_tuple = if old_blk.is_none() {
                Some(update_old_tuple(rec, &xl, page, hot, new_blk.block)?)
            } else {
                if rec.header.info & XLOG_HEAP_INIT_PAGE != 0 {
                    page_init(page, 0);
                }
                None
            };
            update_new_tuple(rec, &xl, new_blk, page, old_tuple.as_deref())?;
            set_lsn(rec, page)
        }
        other => Err(RedoError::BadRecord(format!("an update changes blocks 0 and 1, not block {other}"))),
    }
}

/// Marks the old version updated; returns its bytes afterwards.
fn update_old_tuple(
    rec: &DecodedRecord,
    xl: &HeapUpdate,
    page: &mut Page,
    hot: bool,
    new_block: u32,
) -> Result<Vec<u8>, RedoError> {
    let mut t = normal_tuple(page, xl.old_offnum)?;
    t.clear_xmax_bits(false);
    let m2 = if hot { t.infomask2() | HEAP_HOT_UPDATED } else { t.infomask2() & !HEAP_HOT_UPDATED };
    t.set_infomask2(m2);
    t.apply_infobits(xl.old_infobits_set);
    t.set_xmax(xl.old_xmax);
    t.set_plain_cid(0);
    t.set_ctid(new_block, xl.new_offnum);
    set_prunable(page, rec.header.xid)?;
    if xl.flags & XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED != 0 {
        set_all_visible(page, false)?;
    }
    Ok(page_get_item(page, xl.old_offnum)?.to_vec())
}

fn update_new_tuple(
    rec: &DecodedRecord,
    xl: &HeapUpdate,
    new_blk: &BlockRef,
    page: &mut Page,
    old_tuple: Option<&[u8]>,
) -> Result<(), RedoError> {
    check_new_offset(page, xl.new_offnum)?;
    let data = rec.block_data(new_blk);
    let mut c = Cursor::new(data);
    let lengths = truncated("update prefix and suffix lengths");
    let prefixlen = if xl.flags & XLH_UPDATE_PREFIX_FROM_OLD != 0 { c.u16().map_err(&lengths)? as usize } else { 0 };
    let suffixlen = if xl.flags & XLH_UPDATE_SUFFIX_FROM_OLD != 0 { c.u16().map_err(&lengths)? as usize } else { 0 };
    let header = HeapHeader::read(&mut c)?;
    let rest = c.take(c.remaining()).map_err(truncated("update tuple data"))?;

    let old = match old_tuple {
        Some(old) => old,
        None if prefixlen > 0 || suffixlen > 0 => {
            return Err(RedoError::BadRecord("an update across pages borrows from the old tuple".to_string()));
        }
        None => &[],
    };
    let mut parts: Vec<&[u8]> = Vec::with_capacity(4);
    if prefixlen > 0 {
        let bitmap_len = (header.t_hoff as usize).checked_sub(HEAP_TUPLE_HEADER_SIZE).filter(|&l| l <= rest.len());
        let Some(bitmap_len) = bitmap_len else {
            return Err(RedoError::BadRecord(format!(
                "new tuple header of {} bytes does not fit its {} logged bytes",
                header.t_hoff,
                rest.len()
            )));
        };
        let old_hoff = old.get(22).copied().unwrap_or(0) as usize;
        let prefix = old.get(old_hoff..old_hoff + prefixlen).ok_or_else(|| {
            RedoError::BadPage(format!("old tuple of {} bytes has no {prefixlen}-byte prefix", old.len()))
        })?;
        parts.extend([&rest[..bitmap_len], prefix, &rest[bitmap_len..]]);
    } else {
        parts.push(rest);
    }
    if suffixlen > 0 {
        let start = old.len().checked_sub(suffixlen).ok_or_else(|| {
            RedoError::BadPage(format!("old tuple of {} bytes has no {suffixlen}-byte suffix", old.len()))
        })?;
        parts.push(&old[start..]);
    }

    let mut tuple = build_tuple(&header, &parts, rec.header.xid, new_blk.block, xl.new_offnum)?;
    TupleMut::new(&mut tuple)?.set_xmax(xl.new_xmax);
    page_add_item(page, &tuple, Some(xl.new_offnum), true, true)?;
    if xl.flags & XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED != 0 {
        set_all_visible(page, false)?;
    }
    Ok(())
}

fn confirm(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapOffnum::decode(rec.main_data())?;
    normal_tuple(page, xl.offnum)?.set_ctid(blk.block, xl.offnum);
    set_lsn(rec, page)
}

fn lock(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapLock::decode(rec.main_data())?;
    let mut t = normal_tuple(page, xl.offnum)?;
    t.clear_xmax_bits(false);
    t.apply_infobits(xl.infobits_set);
    // A pure lock leaves no update chain: a stale HOT flag or forward link
    // from an aborted update goes away.
    if xmax_is_locked_only(t.infomask()) {
        let m2 = t.infomask2() & !HEAP_HOT_UPDATED;
        t.set_infomask2(m2);
        t.set_ctid(blk.block, xl.offnum);
    }
    t.set_xmax(xl.xmax);
    t.set_plain_cid(0);
    set_lsn(rec, page)
}

fn lock_updated(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    only_block(rec, block_id, 0)?;
    let xl = HeapLock::decode(rec.main_data())?;
    let mut t = normal_tuple(page, xl.offnum)?;
    t.clear_xmax_bits(false);
    t.apply_infobits(xl.infobits_set);
    t.set_xmax(xl.xmax);
    set_lsn(rec, page)
}

fn inplace(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapOffnum::decode(rec.main_data())?;
    let new_data = rec.block_data(blk);
    let hoff = normal_tuple(page, xl.offnum)?.hoff() as usize;
    let tuple = page_get_item_mut(page, xl.offnum)?;
    let old_len = tuple.len().checked_sub(hoff);
    if old_len != Some(new_data.len()) {
        return Err(RedoError::BadPage(format!(
            "wrong tuple length: the item holds {} bytes after a {hoff}-byte header, the record {}",
            tuple.len(),
            new_data.len()
        )));
    }
    tuple[hoff..].copy_from_slice(new_data);
    set_lsn(rec, page)
}

/// Line pointer `offnum` must exist before a prune or vacuum rewrites it.
fn existing_offset(page: &Page, offnum: u16) -> Result<u16, RedoError> {
    let max = max_offset(page)?;
    if offnum == 0 || offnum > max {
        return Err(RedoError::BadPage(format!("line pointer {offnum} does not exist (the page has {max})")));
    }
    Ok(offnum)
}

fn set_lp(page: &mut Page, offnum: u16, id: ItemId) -> Result<(), RedoError> {
    let offnum = existing_offset(page, offnum)?;
    set_item_id(page, offnum, id).map_err(page_err)
}

fn prune(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapPrune::decode(rec.main_data())?;
    let offs = PruneOffsets::decode(&xl, rec.block_data(blk))?;
    for &(from, to) in &offs.redirected {
        set_lp(page, from, ItemId { off: to, flags: LP_REDIRECT, len: 0 })?;
    }
    for &off in &offs.dead {
        set_lp(page, off, ItemId { off: 0, flags: LP_DEAD, len: 0 })?;
    }
    for &off in &offs.unused {
        set_lp(page, off, ItemId { off: 0, flags: LP_UNUSED, len: 0 })?;
    }
    page_repair_fragmentation(page)?;
    set_lsn(rec, page)
}

fn vacuum(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapVacuum::decode(rec.main_data())?;
    for off in xl.offsets(rec.block_data(blk))? {
        set_lp(page, off, ItemId { off: 0, flags: LP_UNUSED, len: 0 })?;
    }
    page_truncate_line_pointer_array(page)?;
    set_lsn(rec, page)
}

fn freeze_page(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = HeapFreezePage::decode(rec.main_data())?;
    for plan in xl.tuples(rec.block_data(blk))? {
        freeze_tuple(page, plan.offset, plan.xmax, plan.t_infomask2, plan.t_infomask, plan.frzflags)?;
    }
    set_lsn(rec, page)
}

/// Freezes the tuple at `offset` as a freeze plan says (PostgreSQL's
/// `heap_execute_freeze_tuple`): the same in 15's and 17's records.
fn freeze_tuple(
    page: &mut Page,
    offset: u16,
    xmax: u32,
    infomask2: u16,
    infomask: u16,
    frzflags: u8,
) -> Result<(), RedoError> {
    let mut t = TupleMut::new(page_get_item_mut(page, offset)?)?;
    t.set_xmax(xmax);
    if frzflags & XLH_FREEZE_XVAC != 0 {
        t.set_xvac(FROZEN_TRANSACTION_ID);
    }
    if frzflags & XLH_INVALID_XVAC != 0 {
        t.set_xvac(0);
    }
    t.set_infomask(infomask);
    t.set_infomask2(infomask2);
    Ok(())
}

/// 17's merged record: line pointers change as a prune (with a cleanup
/// lock: the page is defragmented) or a vacuum's second pass (without:
/// the line pointer array is only truncated), then the planned tuples are
/// frozen.
fn prune_and_freeze(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let blk = only_block(rec, block_id, 0)?;
    let xl = PruneFreeze::decode(rec.main_data())?;
    let data = PruneFreezeData::decode(xl.flags, rec.block_data(blk))?;
    if data.prunes() {
        let moves_items = !data.redirected.is_empty() || !data.dead.is_empty();
        if moves_items && !xl.cleanup_lock() {
            return Err(RedoError::BadRecord("redirects or dead items without a cleanup lock".into()));
        }
        for &(from, to) in &data.redirected {
            set_lp(page, from, ItemId { off: to, flags: LP_REDIRECT, len: 0 })?;
        }
        for &off in &data.dead {
            set_lp(page, off, ItemId { off: 0, flags: LP_DEAD, len: 0 })?;
        }
        for &off in &data.unused {
            set_lp(page, off, ItemId { off: 0, flags: LP_UNUSED, len: 0 })?;
        }
        if xl.cleanup_lock() {
            page_repair_fragmentation(page)?;
        } else {
            page_truncate_line_pointer_array(page)?;
        }
    }
    for (plan, offsets) in &data.frozen {
        for &off in offsets {
            freeze_tuple(page, off, plan.xmax, plan.t_infomask2, plan.t_infomask, plan.frzflags)?;
        }
    }
    set_lsn(rec, page)
}

/// VISIBLE: block 0 is the visibility-map page, block 1 the heap page.
///
/// The heap page gets PD_ALL_VISIBLE and the record's LSN. PostgreSQL sets
/// that LSN only when hint bits are WAL-logged (`wal_log_hints` or data
/// checksums); Strata's computes always run with `wal_log_hints = on`.
fn visible(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<(), RedoError> {
    let xl = HeapVisible::decode(rec.main_data())?;
    match block_id {
        1 => {
            rec.block(1).ok_or(RedoError::NoBlock(1))?;
            set_all_visible(page, true)?;
            set_lsn(rec, page)
        }
        0 => {
            let vm = rec.block(0).ok_or(RedoError::NoBlock(0))?;
            let heap_block = rec.block(1).ok_or(RedoError::NoBlock(1))?.block;
            if vm.fork != ForkNumber::VisibilityMap || vm.block != heap_block / HEAPBLOCKS_PER_VM_PAGE {
                return Err(RedoError::BadRecord(format!(
                    "block 0 ({} block {}) is not the visibility-map page of heap block {heap_block}",
                    vm.fork.name(),
                    vm.block
                )));
            }
            if is_new(page).map_err(page_err)? {
                page_init(page, 0);
            }
            // Replay that already went past this record must not set the bits again.
            if rec.end_lsn.0 <= pd_lsn(page).map_err(page_err)? {
                return Ok(());
            }
            let within = heap_block % HEAPBLOCKS_PER_VM_PAGE;
            let byte = VM_MAP_START + (within / 4) as usize;
            let shift = 2 * (within % 4);
            if xl.flags != (page[byte] >> shift) & VISIBILITYMAP_VALID_BITS {
                page[byte] |= ((xl.flags as u32) << shift) as u8;
                set_lsn(rec, page)?;
            }
            Ok(())
        }
        other => Err(RedoError::BadRecord(format!("a visible record changes blocks 0 and 1, not block {other}"))),
    }
}

#[cfg(test)]
mod tests;
