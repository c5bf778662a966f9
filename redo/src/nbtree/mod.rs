//! Redo of btree records (PostgreSQL 15 `nbtxlog.c`), one block at a time.
//!
//! Each record names the pages it changes as block references; redo of one
//! block only ever looks at that page and at the record (sibling block
//! numbers come from the other block references). Pages that redo rebuilds
//! from scratch (the right half of a split, a new root, half-dead and
//! deleted pages, the metapage) ignore their previous contents.

use strata_formats::page::set_pd_lsn;
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::DecodedRecord;

use crate::bufpage::{self, Page};
use crate::RedoError;

mod dedup;
mod page;
mod records;
#[cfg(test)]
mod tests;
mod tuple;

use page::{Opaque, BTP_HALF_DEAD, BTP_HAS_GARBAGE, BTP_INCOMPLETE_SPLIT, BTP_LEAF, BTP_ROOT, P_HIKEY, P_NONE};
use records::*;

/// Btree records (`xl_info`) that are redone natively: all of them.
pub fn supports(info: u8) -> bool {
    info & 0xF0 <= XLOG_BTREE_META_CLEANUP
}

/// Redoes a btree record on block `block_id`.
pub fn redo(rec: &DecodedRecord, block_id: u8, page: &mut [u8; BLCKSZ]) -> Result<(), RedoError> {
    let info = rec.header.info & 0xF0;
    let changed = match info {
        XLOG_BTREE_INSERT_LEAF | XLOG_BTREE_INSERT_UPPER | XLOG_BTREE_INSERT_META | XLOG_BTREE_INSERT_POST => {
            redo_insert(rec, info, block_id, page)?
        }
        XLOG_BTREE_SPLIT_L | XLOG_BTREE_SPLIT_R => redo_split(rec, info == XLOG_BTREE_SPLIT_L, block_id, page)?,
        XLOG_BTREE_DEDUP if block_id == 0 => {
            let intervals = dedup_intervals(rec.main_data(), block_data(rec, 0)?)?;
            dedup::redo_dedup(page, &intervals)?;
            true
        }
        XLOG_BTREE_VACUUM if block_id == 0 => {
            let deletion = vacuum(rec.main_data(), block_data(rec, 0)?)?;
            apply_deletion(page, &deletion)?;
            // VACUUM has finished with the page, so its cycle id goes too.
            page::update_opaque(page, |o| {
                o.cycle_id = 0;
                o.flags &= !BTP_HAS_GARBAGE;
            })?;
            true
        }
        XLOG_BTREE_DELETE if block_id == 0 => {
            let (ndeleted, nupdated) = delete(rec.main_data())?;
            let deletion = deletion(ndeleted, nupdated, block_data(rec, 0)?)?;
            apply_deletion(page, &deletion)?;
            page::update_opaque(page, |o| o.flags &= !BTP_HAS_GARBAGE)?;
            true
        }
        XLOG_BTREE_MARK_PAGE_HALFDEAD => redo_mark_halfdead(rec, block_id, page)?,
        XLOG_BTREE_UNLINK_PAGE | XLOG_BTREE_UNLINK_PAGE_META => redo_unlink(rec, info, block_id, page)?,
        XLOG_BTREE_NEWROOT => redo_newroot(rec, block_id, page)?,
        // Only a recovery conflict point for hot standby: no page changes.
        XLOG_BTREE_REUSE_PAGE => false,
        XLOG_BTREE_META_CLEANUP if block_id == 0 => {
            page::restore_meta(page, &metadata(block_data(rec, 0)?)?)?;
            true
        }
        XLOG_BTREE_DEDUP | XLOG_BTREE_VACUUM | XLOG_BTREE_DELETE | XLOG_BTREE_META_CLEANUP => {
            return Err(unused_block(block_id))
        }
        _ => return Err(RedoError::Unsupported { rmgr: rec.rmgr(), info: rec.header.info }),
    };
    if changed {
        set_pd_lsn(page, rec.end_lsn.0).map_err(|e| RedoError::BadPage(e.to_string()))?;
    }
    Ok(())
}

fn unused_block(block_id: u8) -> RedoError {
    RedoError::BadRecord(format!("block reference {block_id} is not one this record changes"))
}

/// The data of block reference `id`. A block logged with a full-page image
/// to restore carries no redo data: such a block can only be restored.
fn block_data(rec: &DecodedRecord, id: u8) -> Result<&[u8], RedoError> {
    let block = rec.block(id).ok_or(RedoError::NoBlock(id))?;
    let data = rec.block_data(block);
    if data.is_empty() && block.image.as_ref().is_some_and(|i| i.apply()) {
        return Err(RedoError::BadRecord(format!(
            "block reference {id} carries a full-page image to restore instead of redo data"
        )));
    }
    Ok(data)
}

/// The block number of block reference `id`, if the record has it.
fn block_number(rec: &DecodedRecord, id: u8) -> Option<u32> {
    rec.block(id).map(|b| b.block)
}

/// `_bt_clear_incomplete_split`: the child whose split a new downlink completes.
fn clear_incomplete_split(page: &mut Page) -> Result<bool, RedoError> {
    page::update_opaque(page, |o| o.flags &= !BTP_INCOMPLETE_SPLIT)?;
    Ok(true)
}

/// INSERT_LEAF / INSERT_UPPER / INSERT_META / INSERT_POST: block 0 gets the
/// new tuple, block 1 is the child whose split an upper insert completes,
/// block 2 the metapage.
fn redo_insert(rec: &DecodedRecord, info: u8, block_id: u8, page: &mut Page) -> Result<bool, RedoError> {
    let is_leaf = matches!(info, XLOG_BTREE_INSERT_LEAF | XLOG_BTREE_INSERT_POST);
    match block_id {
        0 => {
            let offnum = insert_offnum(rec.main_data())?;
            let data = block_data(rec, 0)?;
            if info == XLOG_BTREE_INSERT_POST {
                insert_with_posting_split(page, offnum, data)?;
            } else {
                bufpage::page_add_item(page, data, Some(offnum), false, false)?;
            }
            Ok(true)
        }
        1 if !is_leaf => clear_incomplete_split(page),
        2 if info == XLOG_BTREE_INSERT_META => {
            page::restore_meta(page, &metadata(block_data(rec, 2)?)?)?;
            Ok(true)
        }
        _ => Err(unused_block(block_id)),
    }
}

/// An insert that lands inside the posting list just before `offnum`: the
/// posting list takes the new item's TID in place (keeping its size) and
/// the item is inserted with the TID that fell off the posting list's end.
fn insert_with_posting_split(page: &mut Page, offnum: u16, data: &[u8]) -> Result<(), RedoError> {
    if data.len() < 2 {
        return Err(RedoError::BadRecord("posting split insert without its posting offset".into()));
    }
    let postingoff = u16::from_le_bytes([data[0], data[1]]) as usize;
    let orignewitem = &data[2..];
    if tuple::tuple_size(orignewitem).map_err(|e| RedoError::BadRecord(e.to_string()))? != orignewitem.len() {
        return Err(RedoError::BadRecord("posting split insert: new item size disagrees with its data".into()));
    }
    let mut newitem = orignewitem.to_vec();
    let postingoffnum = offnum
        .checked_sub(1)
        .filter(|&o| o > 0)
        .ok_or_else(|| RedoError::BadRecord(format!("posting split insert at offset {offnum}")))?;
    let oposting = bufpage::page_get_item_mut(page, postingoffnum)?;
    let nposting = tuple::swap_posting(&mut newitem, oposting, postingoff)?;
    let len = tuple::maxalign(nposting.len());
    if len != nposting.len() || len > oposting.len() {
        return Err(RedoError::BadPage(format!("posting list at offset {postingoffnum} has an unaligned size")));
    }
    oposting[..len].copy_from_slice(&nposting);
    bufpage::page_add_item(page, &newitem, Some(offnum), false, false)?;
    Ok(())
}

/// SPLIT_L / SPLIT_R: block 0 is the original page that keeps the left
/// half, block 1 the new right page, block 2 the old right sibling, block 3
/// the child whose split an upper-level split completes.
fn redo_split(rec: &DecodedRecord, new_item_on_left: bool, block_id: u8, page: &mut Page) -> Result<bool, RedoError> {
    let split = Split::decode(rec.main_data())?;
    let is_leaf = split.level == 0;
    let left = block_number(rec, 0).ok_or(RedoError::NoBlock(0))?;
    let right = block_number(rec, 1).ok_or(RedoError::NoBlock(1))?;
    match block_id {
        0 => {
            rebuild_left_half(page, &split, new_item_on_left, block_data(rec, 0)?)?;
            page::update_opaque(page, |o| {
                o.flags = BTP_INCOMPLETE_SPLIT | if is_leaf { BTP_LEAF } else { 0 };
                o.next = right;
                o.cycle_id = 0;
            })?;
            Ok(true)
        }
        1 => {
            let next = block_number(rec, 2).unwrap_or(P_NONE);
            let flags = if is_leaf { BTP_LEAF } else { 0 };
            page::init(page, &Opaque { prev: left, next, level: split.level, flags, cycle_id: 0 })?;
            page::restore_items(page, block_data(rec, 1)?)?;
            Ok(true)
        }
        2 => {
            page::update_opaque(page, |o| o.prev = right)?;
            Ok(true)
        }
        3 if !is_leaf => clear_incomplete_split(page),
        _ => Err(unused_block(block_id)),
    }
}

/// Takes the next MAXALIGNed tuple off the front of `data`.
fn take_tuple<'a>(data: &mut &'a [u8], what: &str) -> Result<&'a [u8], RedoError> {
    let size = tuple::maxalign(tuple::tuple_size(data).map_err(|e| RedoError::BadRecord(format!("{what}: {e}")))?);
    if size < tuple::INDEX_TUPLE_HEADER || size > data.len() {
        return Err(RedoError::BadRecord(format!("{what} of {size} bytes in {} bytes of data", data.len())));
    }
    let (t, rest) = data.split_at(size);
    *data = rest;
    Ok(t)
}

/// Rebuilds the left half of a split in item order on an empty copy, as
/// the split itself did, so the tuples land at the same places: the new
/// high key, the original items before the split point, and the new item
/// (or the posting list it split) where it belongs.
fn rebuild_left_half(page: &mut Page, split: &Split, new_item_on_left: bool, data: &[u8]) -> Result<(), RedoError> {
    let mut data = data;
    let mut newitem = None;
    let mut replace = None;
    if new_item_on_left || split.postingoff != 0 {
        let mut item = take_tuple(&mut data, "split new item")?.to_vec();
        if split.postingoff != 0 {
            let off = split.newitemoff.checked_sub(1).filter(|&o| o > 0).ok_or_else(|| {
                RedoError::BadRecord(format!("posting split at new item offset {}", split.newitemoff))
            })?;
            let oposting = bufpage::page_get_item(page, off)?;
            let nposting = tuple::swap_posting(&mut item, oposting, split.postingoff as usize)?;
            replace = Some((off, nposting));
        }
        newitem = Some(item);
    }
    let high_key = take_tuple(&mut data, "split left high key")?;
    if !data.is_empty() {
        return Err(RedoError::BadRecord(format!("{} bytes after the split's left high key", data.len())));
    }

    let first = page::opaque(page)?.first_data_key();
    let mut left = page::empty_copy_special(page)?;
    bufpage::page_add_item(&mut left, high_key, Some(P_HIKEY), false, false)?;
    let mut leftoff = P_HIKEY + 1;
    let mut add = |left: &mut Page, item: &[u8]| -> Result<(), RedoError> {
        bufpage::page_add_item(left, item, Some(leftoff), false, false)?;
        leftoff += 1;
        Ok(())
    };
    let new_item_here = |off: u16| new_item_on_left && off == split.newitemoff;
    let mut off = first;
    while off < split.firstrightoff {
        match &replace {
            Some((roff, nposting)) if *roff == off => {
                let len = tuple::maxalign(nposting.len());
                let mut padded = nposting.clone();
                padded.resize(len, 0);
                add(&mut left, &padded)?;
            }
            _ => {
                if new_item_here(off) {
                    add(&mut left, newitem.as_deref().unwrap_or_default())?;
                }
                add(&mut left, bufpage::page_get_item(page, off)?)?;
            }
        }
        off += 1;
    }
    if new_item_here(off) {
        add(&mut left, newitem.as_deref().unwrap_or_default())?;
    }
    *page = *left;
    Ok(())
}

/// Applies the updates (posting lists losing TIDs) and then the deletions
/// of a VACUUM or DELETE record; updates name offsets before the deletions.
fn apply_deletion(page: &mut Page, d: &Deletion) -> Result<(), RedoError> {
    for (off, positions) in &d.updated {
        let orig = bufpage::page_get_item(page, *off)?;
        let updated = tuple::update_posting(orig, positions)?;
        bufpage::page_index_tuple_overwrite(page, *off, &updated)?;
    }
    if !d.deleted.is_empty() {
        bufpage::page_index_multi_delete(page, &d.deleted)?;
    }
    Ok(())
}

/// An empty half-dead leaf page whose high key points to the top parent of
/// the subtree being deleted.
fn init_half_dead_leaf(page: &mut Page, prev: u32, next: u32, top_parent: u32) -> Result<(), RedoError> {
    page::init(page, &Opaque { prev, next, level: 0, flags: BTP_HALF_DEAD | BTP_LEAF, cycle_id: 0 })?;
    bufpage::page_add_item(page, &tuple::top_parent_high_key(top_parent), Some(P_HIKEY), false, false)?;
    Ok(())
}

/// MARK_PAGE_HALFDEAD: block 0 is the leaf, rebuilt half-dead; block 1 the
/// parent, whose downlink to the subtree is removed by pointing it at the
/// right sibling and dropping the next item.
fn redo_mark_halfdead(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<bool, RedoError> {
    let x = MarkHalfDead::decode(rec.main_data())?;
    match block_id {
        0 => init_half_dead_leaf(page, x.leftblk, x.rightblk, x.topparent)?,
        1 => {
            let next =
                x.poffset.checked_add(1).ok_or_else(|| RedoError::BadRecord(format!("parent offset {}", x.poffset)))?;
            let rightsib = tuple::downlink(bufpage::page_get_item(page, next)?)?;
            tuple::set_downlink(bufpage::page_get_item_mut(page, x.poffset)?, rightsib)?;
            bufpage::page_index_tuple_delete(page, next)?;
        }
        _ => return Err(unused_block(block_id)),
    }
    Ok(true)
}

/// UNLINK_PAGE(_META): block 0 is the page being deleted, blocks 1 and 2
/// its siblings whose links skip it, block 3 the half-dead leaf when the
/// page deleted is one of its parents, block 4 the metapage.
fn redo_unlink(rec: &DecodedRecord, info: u8, block_id: u8, page: &mut Page) -> Result<bool, RedoError> {
    let x = UnlinkPage::decode(rec.main_data())?;
    match block_id {
        0 => {
            let flags = if x.level == 0 { BTP_LEAF } else { 0 };
            page::init(page, &Opaque { prev: x.leftsib, next: x.rightsib, level: x.level, flags: 0, cycle_id: 0 })?;
            page::set_deleted(page, x.safexid)?;
            page::update_opaque(page, |o| o.flags |= flags)?;
        }
        // Without a left sibling PostgreSQL leaves such a block alone.
        1 if x.leftsib == P_NONE => return Ok(false),
        1 => page::update_opaque(page, |o| o.next = x.rightsib)?,
        2 => page::update_opaque(page, |o| o.prev = x.leftsib)?,
        3 => init_half_dead_leaf(page, x.leafleftsib, x.leafrightsib, x.leaftopparent)?,
        4 if info == XLOG_BTREE_UNLINK_PAGE_META => page::restore_meta(page, &metadata(block_data(rec, 4)?)?)?,
        _ => return Err(unused_block(block_id)),
    }
    Ok(true)
}

/// NEWROOT: block 0 is the new root (empty, or the two downlinks of a
/// split old root), block 1 the old root whose split this completes,
/// block 2 the metapage.
fn redo_newroot(rec: &DecodedRecord, block_id: u8, page: &mut Page) -> Result<bool, RedoError> {
    let (_, level) = newroot(rec.main_data())?;
    match block_id {
        0 => {
            let flags = BTP_ROOT | if level == 0 { BTP_LEAF } else { 0 };
            page::init(page, &Opaque { prev: P_NONE, next: P_NONE, level, flags, cycle_id: 0 })?;
            if level > 0 {
                page::restore_items(page, block_data(rec, 0)?)?;
            }
        }
        1 if level > 0 => {
            clear_incomplete_split(page)?;
        }
        2 => page::restore_meta(page, &metadata(block_data(rec, 2)?)?)?,
        _ => return Err(unused_block(block_id)),
    }
    Ok(true)
}
