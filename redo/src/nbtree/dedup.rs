//! Redo of a deduplication pass over a leaf page (`_bt_dedup_*` of
//! `nbtdedup.c`).
//!
//! The record does not carry the new page: it lists which runs of items
//! were merged (the first item's offset and the number of items). Redo
//! walks the page's items again and merges exactly those runs, so the
//! rebuilt page comes out byte for byte as the primary built it.

use super::page::{self, BTP_HAS_GARBAGE, P_HIKEY};
use super::records::DedupInterval;
use super::tuple::{self, Tid, TID_SIZE};
use crate::bufpage::{self, Page};
use crate::RedoError;

/// Largest posting list tuple redo accepts: `BTMaxItemSize` of an 8 KiB
/// page, above the primary's own limit so that whatever it formed fits.
const MAX_POSTING_SIZE: usize = 2704;

/// The pending posting list: the run of items being merged into one tuple.
struct Pending {
    base: Vec<u8>,
    baseoff: u16,
    /// Key part of the base tuple (without any posting list it has).
    basetupsize: usize,
    tids: Vec<Tid>,
    nitems: u16,
}

impl Pending {
    fn start(item: &[u8], off: u16) -> Result<Pending, RedoError> {
        let base = tuple::sized(item)?.to_vec();
        let (tids, basetupsize) = tuple::heap_tids(&base)?;
        Ok(Pending { base, baseoff: off, basetupsize, tids, nitems: 1 })
    }

    /// Adds `item`'s TIDs unless the merged tuple would be too large.
    fn save(&mut self, item: &[u8]) -> Result<bool, RedoError> {
        let (tids, _) = tuple::heap_tids(tuple::sized(item)?)?;
        let merged = tuple::maxalign(self.basetupsize + (self.tids.len() + tids.len()) * TID_SIZE);
        if merged > MAX_POSTING_SIZE {
            return Ok(false);
        }
        self.tids.extend_from_slice(&tids);
        self.nitems += 1;
        Ok(true)
    }

    /// Appends the run to `newpage`: the base tuple unchanged if it is alone,
    /// else a posting list tuple of all the run's TIDs. True if merged.
    fn finish(self, newpage: &mut Page) -> Result<bool, RedoError> {
        let next = page::max_offset(newpage)? + 1;
        if self.nitems == 1 {
            bufpage::page_add_item(newpage, &self.base, Some(next), false, false)?;
            Ok(false)
        } else {
            let posting = tuple::form_posting(&self.base, &self.tids)?;
            bufpage::page_add_item(newpage, &posting, Some(next), false, false)?;
            Ok(true)
        }
    }
}

/// Rebuilds the leaf `page` with the runs of `intervals` merged into posting lists.
pub fn redo_dedup(page: &mut Page, intervals: &[DedupInterval]) -> Result<(), RedoError> {
    let opaque = page::opaque(page)?;
    let minoff = opaque.first_data_key();
    let maxoff = page::max_offset(page)?;
    if minoff > maxoff {
        return Err(RedoError::BadPage("deduplication of a page without data items".into()));
    }
    let mut newpage = page::empty_copy_special(page)?;
    if !opaque.is_rightmost() {
        let high_key = bufpage::page_get_item(page, P_HIKEY)?;
        bufpage::page_add_item(&mut newpage, high_key, Some(P_HIKEY), false, false)?;
    }

    let mut merged = 0usize;
    let mut pending = Pending::start(bufpage::page_get_item(page, minoff)?, minoff)?;
    for off in minoff + 1..=maxoff {
        let item = bufpage::page_get_item(page, off)?;
        let extends =
            intervals.get(merged).is_some_and(|iv| pending.baseoff == iv.baseoff && pending.nitems < iv.nitems);
        if extends {
            if !pending.save(item)? {
                return Err(RedoError::BadPage(format!(
                    "posting list at offset {} would be too large",
                    pending.baseoff
                )));
            }
        } else {
            merged += pending.finish(&mut newpage)? as usize;
            pending = Pending::start(item, off)?;
        }
    }
    merged += pending.finish(&mut newpage)? as usize;
    if merged != intervals.len() {
        return Err(RedoError::BadPage(format!(
            "the page's items gave {merged} posting lists, the record lists {}",
            intervals.len()
        )));
    }

    if opaque.flags & BTP_HAS_GARBAGE != 0 {
        page::update_opaque(&mut newpage, |o| o.flags &= !BTP_HAS_GARBAGE)?;
    }
    *page = *newpage;
    Ok(())
}
