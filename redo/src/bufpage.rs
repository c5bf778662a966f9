//! Page-level operations of PostgreSQL 15's `bufpage.c` that redo uses,
//! reproducing its exact byte layout (where tuples are placed, how line
//! pointers are reused and compacted), because pages are compared byte for
//! byte with PostgreSQL's.
//!
//! Offsets are 1-based `OffsetNumber`s as in PostgreSQL. Every function
//! checks the page header and its arguments and returns an error instead of
//! corrupting the page.

use strata_formats::page::{
    item_id, pd_flags, pd_lower, pd_special, pd_upper, set_item_id, set_pd_flags, set_pd_lower,
    set_pd_pagesize_version, set_pd_special, set_pd_upper, ItemId, PageError, ITEM_ID_SIZE, LP_NORMAL, LP_UNUSED,
    MAXIMUM_ALIGNOF, PAGE_HEADER_SIZE, PD_HAS_FREE_LINES, PG_PAGE_LAYOUT_VERSION,
};
use strata_formats::version::BLCKSZ;

use crate::RedoError;

/// A page being redone.
pub type Page = [u8; BLCKSZ];

/// Most line pointers a heap page can have (`MaxHeapTuplesPerPage`): a page
/// full of header-only tuples, each with its line pointer.
pub const MAX_HEAP_TUPLES_PER_PAGE: u16 = ((BLCKSZ - PAGE_HEADER_SIZE) / (maxalign(23) + ITEM_ID_SIZE)) as u16;

/// Largest valid offset number (`MaxOffsetNumber`): a page of nothing but line pointers.
pub const MAX_OFFSET_NUMBER: u16 = (BLCKSZ / ITEM_ID_SIZE) as u16;

/// Largest item a line pointer can describe (`lp_len` has 15 bits).
const MAX_ITEM_LEN: usize = 0x7FFF;

/// Rounds `len` up to the platform's maximum alignment (`MAXALIGN`).
pub const fn maxalign(len: usize) -> usize {
    (len + MAXIMUM_ALIGNOF - 1) & !(MAXIMUM_ALIGNOF - 1)
}

fn page_err(e: PageError) -> RedoError {
    RedoError::BadPage(e.to_string())
}

/// The header's free-space bounds, validated the way `bufpage.c` does before
/// it moves any data.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    lower: usize,
    upper: usize,
    special: usize,
}

impl Bounds {
    /// `aligned_special`: also insist on a MAXALIGNed special space (the
    /// routines that compact tuple data do).
    fn read(page: &Page, aligned_special: bool) -> Result<Bounds, RedoError> {
        let lower = pd_lower(page).map_err(page_err)? as usize;
        let upper = pd_upper(page).map_err(page_err)? as usize;
        let special = pd_special(page).map_err(page_err)? as usize;
        if lower < PAGE_HEADER_SIZE
            || lower > upper
            || upper > special
            || special > BLCKSZ
            || (aligned_special && special != maxalign(special))
        {
            return Err(RedoError::BadPage(format!(
                "corrupted page pointers: lower = {lower}, upper = {upper}, special = {special}"
            )));
        }
        Ok(Bounds { lower, upper, special })
    }

    fn max_offset(&self) -> u16 {
        ((self.lower - PAGE_HEADER_SIZE) / ITEM_ID_SIZE) as u16
    }
}

fn lp(page: &Page, offnum: u16) -> Result<ItemId, RedoError> {
    item_id(page, offnum).map_err(page_err)
}

fn set_lp(page: &mut Page, offnum: u16, id: ItemId) -> Result<(), RedoError> {
    set_item_id(page, offnum, id).map_err(page_err)
}

fn lp_pos(offnum: u16) -> usize {
    PAGE_HEADER_SIZE + (offnum as usize - 1) * ITEM_ID_SIZE
}

fn set_has_free_lines(page: &mut Page, on: bool) -> Result<(), RedoError> {
    let flags = pd_flags(page).map_err(page_err)?;
    let flags = if on { flags | PD_HAS_FREE_LINES } else { flags & !PD_HAS_FREE_LINES };
    set_pd_flags(page, flags).map_err(page_err)
}

/// `PageInit`: an empty page with `special_size` (MAXALIGNed) bytes of special space.
///
/// A special space that would not leave room for the header is clamped to
/// the largest one that does (PostgreSQL treats it as a programming error).
pub fn page_init(page: &mut Page, special_size: usize) {
    let largest = (BLCKSZ - PAGE_HEADER_SIZE - 1) & !(MAXIMUM_ALIGNOF - 1);
    debug_assert!(special_size <= largest, "special space of {special_size} bytes does not fit a page");
    let special = maxalign(special_size.min(largest));
    page.fill(0);
    // The buffer is a whole page, so none of these writes can fail.
    let _ = set_pd_lower(page, PAGE_HEADER_SIZE as u16);
    let _ = set_pd_upper(page, (BLCKSZ - special) as u16);
    let _ = set_pd_special(page, (BLCKSZ - special) as u16);
    let _ = set_pd_pagesize_version(page, BLCKSZ as u16 | PG_PAGE_LAYOUT_VERSION as u16);
}

/// `PageAddItemExtended`: places `item` at `offnum` (or the first free line
/// pointer / the end when `offnum` is `None`), shifting later line pointers
/// unless `overwrite`; `is_heap` applies the heap's limit on line pointers.
/// Returns the offset number used.
///
/// `Some(0)` means no offset, as `InvalidOffsetNumber` does in PostgreSQL.
/// Where PostgreSQL would refuse the item (and redo would PANIC), this
/// returns an error and leaves the page as PostgreSQL would (at most the
/// free-line-pointer hint reset).
pub fn page_add_item(
    page: &mut Page,
    item: &[u8],
    offnum: Option<u16>,
    overwrite: bool,
    is_heap: bool,
) -> Result<u16, RedoError> {
    let b = Bounds::read(page, false)?;
    let limit = b.max_offset() + 1;
    let mut needshuffle = false;

    let offnum = match offnum.filter(|&o| o != 0) {
        Some(o) if o > MAX_OFFSET_NUMBER => {
            return Err(RedoError::BadPage(format!("item offset {o} is beyond any page")));
        }
        Some(o) => {
            if overwrite {
                if o < limit {
                    let id = lp(page, o)?;
                    if id.is_used() || id.has_storage() {
                        return Err(RedoError::BadPage(format!("will not overwrite the used line pointer {o}")));
                    }
                }
            } else if o < limit {
                needshuffle = true;
            }
            o
        }
        None => {
            let flags = pd_flags(page).map_err(page_err)?;
            if flags & PD_HAS_FREE_LINES != 0 {
                let mut found = limit;
                for o in 1..limit {
                    let id = lp(page, o)?;
                    if !id.is_used() && !id.has_storage() {
                        found = o;
                        break;
                    }
                }
                if found == limit {
                    // The hint was stale: PostgreSQL resets it even if the insert then fails.
                    set_has_free_lines(page, false)?;
                }
                found
            } else {
                limit
            }
        }
    };

    if offnum > limit {
        return Err(RedoError::BadPage(format!("item offset {offnum} is past the first free line pointer {limit}")));
    }
    if is_heap && offnum > MAX_HEAP_TUPLES_PER_PAGE {
        return Err(RedoError::BadPage(format!("heap item offset {offnum} exceeds {MAX_HEAP_TUPLES_PER_PAGE}")));
    }
    if item.len() > MAX_ITEM_LEN {
        return Err(RedoError::BadPage(format!("item of {} bytes is too long for a line pointer", item.len())));
    }

    let lower = if offnum == limit || needshuffle { b.lower + ITEM_ID_SIZE } else { b.lower };
    let aligned = maxalign(item.len());
    if aligned > b.upper || lower > b.upper - aligned {
        return Err(RedoError::BadPage(format!(
            "no room for an item of {} bytes (lower {}, upper {})",
            item.len(),
            b.lower,
            b.upper
        )));
    }
    let upper = b.upper - aligned;

    if needshuffle {
        let from = lp_pos(offnum);
        let to = lp_pos(limit);
        page.copy_within(from..to, from + ITEM_ID_SIZE);
    }
    set_lp(page, offnum, ItemId { off: upper as u16, flags: LP_NORMAL, len: item.len() as u16 })?;
    page[upper..upper + item.len()].copy_from_slice(item);
    set_pd_lower(page, lower as u16).map_err(page_err)?;
    set_pd_upper(page, upper as u16).map_err(page_err)?;
    Ok(offnum)
}

/// Where the item of line pointer `offnum` lies: any line pointer with
/// storage inside the page (PostgreSQL's `PageGetItem` does not look at
/// `lp_flags`; callers that need a normal item check that themselves).
fn item_range(page: &Page, offnum: u16) -> Result<std::ops::Range<usize>, RedoError> {
    let lower = pd_lower(page).map_err(page_err)? as usize;
    let max =
        if lower <= PAGE_HEADER_SIZE { 0 } else { ((lower.min(BLCKSZ) - PAGE_HEADER_SIZE) / ITEM_ID_SIZE) as u16 };
    if offnum == 0 || offnum > max {
        return Err(RedoError::BadPage(format!("no line pointer {offnum} (the page has {max})")));
    }
    let id = lp(page, offnum)?;
    let (off, len) = (id.off as usize, id.len as usize);
    if !id.has_storage() || off < PAGE_HEADER_SIZE || off + len > BLCKSZ {
        return Err(RedoError::BadPage(format!(
            "line pointer {offnum} has no item on the page (off {off}, len {len}, flags {})",
            id.flags
        )));
    }
    Ok(off..off + len)
}

/// The bytes of the item at `offnum` (a line pointer with storage).
pub fn page_get_item(page: &Page, offnum: u16) -> Result<&[u8], RedoError> {
    let r = item_range(page, offnum)?;
    Ok(&page[r])
}

/// The bytes of the item at `offnum`, writable in place.
pub fn page_get_item_mut(page: &mut Page, offnum: u16) -> Result<&mut [u8], RedoError> {
    let r = item_range(page, offnum)?;
    Ok(&mut page[r])
}

/// One item to keep while compacting: its line pointer, where its data is
/// and its MAXALIGNed length.
#[derive(Clone, Copy, Debug)]
struct Keep {
    offnum: u16,
    itemoff: usize,
    alignedlen: usize,
}

/// `compactify_tuples`: lays the kept items out back to back from the
/// special space down, in the order given (so the first line pointer's
/// tuple ends up last on the page), and points their line pointers there.
///
/// PostgreSQL moves the data in place or through a scratch copy depending
/// on the order it finds, with the same outcome for non-overlapping items:
/// every item's MAXALIGNed bytes (padding included) land at the offsets
/// computed here. Copying from a snapshot gives that outcome directly.
fn compactify(page: &mut Page, keep: &[Keep], special: usize) -> Result<usize, RedoError> {
    let old = *page;
    let mut upper = special;
    for k in keep {
        // Callers checked each item lies between pd_upper and pd_special and
        // that the total fits, so this cannot underflow.
        upper -= k.alignedlen;
        page[upper..upper + k.alignedlen].copy_from_slice(&old[k.itemoff..k.itemoff + k.alignedlen]);
        let mut id = lp(page, k.offnum)?;
        id.off = upper as u16;
        set_lp(page, k.offnum, id)?;
    }
    Ok(upper)
}

/// `PageRepairFragmentation` (heap pages): compacts the tuples of normal line pointers.
///
/// Also truncates unused line pointers at the end of the array and sets or
/// clears the free-line-pointer hint, as PostgreSQL 15 does.
pub fn page_repair_fragmentation(page: &mut Page) -> Result<(), RedoError> {
    let b = Bounds::read(page, true)?;
    let nline = b.max_offset();
    let mut keep = Vec::with_capacity(nline as usize);
    let mut nunused = 0usize;
    let mut totallen = 0usize;
    let mut finalused = 0u16;
    for offnum in 1..=nline {
        let id = lp(page, offnum)?;
        if id.is_used() {
            if id.has_storage() {
                let itemoff = id.off as usize;
                let alignedlen = maxalign(id.len as usize);
                if itemoff < b.upper || itemoff >= b.special || itemoff + alignedlen > b.special {
                    return Err(RedoError::BadPage(format!("corrupted line pointer {offnum}: offset {itemoff}")));
                }
                totallen += alignedlen;
                keep.push(Keep { offnum, itemoff, alignedlen });
            }
            finalused = offnum;
        } else {
            // Unused line pointers are reset whole, whatever they held.
            set_lp(page, offnum, ItemId { off: 0, flags: LP_UNUSED, len: 0 })?;
            nunused += 1;
        }
    }

    if keep.is_empty() {
        set_pd_upper(page, b.special as u16).map_err(page_err)?;
    } else {
        if totallen > b.special - b.lower {
            return Err(RedoError::BadPage(format!(
                "corrupted item lengths: total {totallen}, available space {}",
                b.special - b.lower
            )));
        }
        let upper = compactify(page, &keep, b.special)?;
        set_pd_upper(page, upper as u16).map_err(page_err)?;
    }

    if finalused != nline {
        let unused_at_end = (nline - finalused) as usize;
        nunused -= unused_at_end;
        set_pd_lower(page, (b.lower - unused_at_end * ITEM_ID_SIZE) as u16).map_err(page_err)?;
    }
    set_has_free_lines(page, nunused > 0)
}

/// `PageTruncateLinePointerArray` (heap pages): drops unused line pointers at the end.
///
/// The first line pointer always stays, so the page never looks empty; the
/// free-line-pointer hint is set if unused line pointers remain.
pub fn page_truncate_line_pointer_array(page: &mut Page) -> Result<(), RedoError> {
    let lower = pd_lower(page).map_err(page_err)? as usize;
    if !(PAGE_HEADER_SIZE..=BLCKSZ).contains(&lower) {
        return Err(RedoError::BadPage(format!("corrupted page pointers: lower = {lower}")));
    }
    let nline = ((lower - PAGE_HEADER_SIZE) / ITEM_ID_SIZE) as u16;
    let mut counting = true;
    let mut sethint = false;
    let mut unused_at_end = 0usize;
    for offnum in (1..=nline).rev() {
        let used = lp(page, offnum)?.is_used();
        if counting && offnum > 1 {
            if used {
                counting = false;
            } else {
                unused_at_end += 1;
            }
        } else if !used {
            sethint = true;
            break;
        }
    }
    if unused_at_end > 0 {
        set_pd_lower(page, (lower - unused_at_end * ITEM_ID_SIZE) as u16).map_err(page_err)?;
    }
    set_has_free_lines(page, sethint)
}

/// The MAXALIGNed size and offset of the item at `offnum` of an index page,
/// checked the way the index deletion routines do.
fn index_item(page: &Page, b: &Bounds, offnum: u16) -> Result<(usize, usize), RedoError> {
    let nline = b.max_offset();
    if offnum == 0 || offnum > nline {
        return Err(RedoError::BadPage(format!("invalid index offnum: {offnum} (the page has {nline})")));
    }
    let id = lp(page, offnum)?;
    let (offset, size) = (id.off as usize, id.len as usize);
    if offset < b.upper || offset + size > b.special || offset != maxalign(offset) {
        return Err(RedoError::BadPage(format!("corrupted line pointer: offset = {offset}, size = {size}")));
    }
    Ok((offset, maxalign(size)))
}

/// Moves the tuple data between `pd_upper` and `offset` up by `size` bytes
/// and shifts the line pointers that pointed into it (all those at or below
/// `offset` among the first `nline`, with storage if `storage_only`).
fn close_gap(
    page: &mut Page,
    upper: usize,
    offset: usize,
    size: usize,
    nline: u16,
    storage_only: bool,
) -> Result<(), RedoError> {
    if offset > upper {
        page.copy_within(upper..offset, upper + size);
    }
    set_pd_upper(page, (upper + size) as u16).map_err(page_err)?;
    let lower = pd_lower(page).map_err(page_err)? as usize;
    if lower > PAGE_HEADER_SIZE {
        for i in 1..=nline {
            let mut id = lp(page, i)?;
            if (!storage_only || id.has_storage()) && id.off as usize <= offset {
                // lp_off is a 15-bit field: the addition wraps as PostgreSQL's bit-field does.
                id.off = ((id.off as usize + size) & 0x7FFF) as u16;
                set_lp(page, i, id)?;
            }
        }
    }
    Ok(())
}

/// `PageIndexTupleDelete` (index pages): removes an item and its line pointer, closing the gap.
pub fn page_index_tuple_delete(page: &mut Page, offnum: u16) -> Result<(), RedoError> {
    let b = Bounds::read(page, true)?;
    let nline = b.max_offset();
    let (offset, size) = index_item(page, &b, offnum)?;
    let from = lp_pos(offnum) + ITEM_ID_SIZE;
    if b.lower > from {
        page.copy_within(from..b.lower, from - ITEM_ID_SIZE);
    }
    set_pd_lower(page, (b.lower - ITEM_ID_SIZE) as u16).map_err(page_err)?;
    close_gap(page, b.upper, offset, size, nline - 1, false)
}

/// `PageIndexMultiDelete` (index pages): removes the items at the sorted `offnums`.
pub fn page_index_multi_delete(page: &mut Page, offnums: &[u16]) -> Result<(), RedoError> {
    // For a couple of items PostgreSQL deletes one by one, last first; the
    // resulting layout differs from a bulk compaction, so this must too.
    if offnums.len() <= 2 {
        for &o in offnums.iter().rev() {
            page_index_tuple_delete(page, o)?;
        }
        return Ok(());
    }
    let b = Bounds::read(page, true)?;
    let nline = b.max_offset();
    let mut keep = Vec::with_capacity(nline as usize);
    let mut kept_ids = Vec::with_capacity(nline as usize);
    let mut next = 0usize;
    let mut totallen = 0usize;
    for offnum in 1..=nline {
        let id = lp(page, offnum)?;
        let (offset, size) = (id.off as usize, id.len as usize);
        if offset < b.upper || offset + size > b.special || offset != maxalign(offset) {
            return Err(RedoError::BadPage(format!("corrupted line pointer: offset = {offset}, size = {size}")));
        }
        if next < offnums.len() && offnum == offnums[next] {
            next += 1;
        } else {
            let alignedlen = maxalign(size);
            if offset + alignedlen > b.special {
                return Err(RedoError::BadPage(format!("line pointer {offnum} runs past the special space")));
            }
            totallen += alignedlen;
            kept_ids.push(id);
            keep.push(Keep { offnum: kept_ids.len() as u16, itemoff: offset, alignedlen });
        }
    }
    if next != offnums.len() {
        return Err(RedoError::BadPage("incorrect index offsets supplied".to_string()));
    }
    if totallen > b.special - b.lower {
        return Err(RedoError::BadPage(format!(
            "corrupted item lengths: total {totallen}, available space {}",
            b.special - b.lower
        )));
    }
    for (i, id) in kept_ids.iter().enumerate() {
        set_lp(page, i as u16 + 1, *id)?;
    }
    set_pd_lower(page, (PAGE_HEADER_SIZE + kept_ids.len() * ITEM_ID_SIZE) as u16).map_err(page_err)?;
    let upper = if keep.is_empty() { b.special } else { compactify(page, &keep, b.special)? };
    set_pd_upper(page, upper as u16).map_err(page_err)
}

/// `PageIndexTupleDeleteNoCompact` (index pages): removes an item, keeping
/// the line pointer array's other offsets (the last one may be dropped).
pub fn page_index_tuple_delete_no_compact(page: &mut Page, offnum: u16) -> Result<(), RedoError> {
    let b = Bounds::read(page, true)?;
    let mut nline = b.max_offset();
    let (offset, size) = index_item(page, &b, offnum)?;
    if offnum < nline {
        set_lp(page, offnum, ItemId { off: 0, flags: LP_UNUSED, len: 0 })?;
    } else {
        set_pd_lower(page, (b.lower - ITEM_ID_SIZE) as u16).map_err(page_err)?;
        nline -= 1;
    }
    close_gap(page, b.upper, offset, size, nline, true)
}

/// `PageIndexTupleOverwrite` (index pages): replaces the item at `offnum` with `item`.
///
/// The line pointer keeps its flags; data before the item moves to make
/// room or to close the gap. No room for the new item is an error.
pub fn page_index_tuple_overwrite(page: &mut Page, offnum: u16, item: &[u8]) -> Result<(), RedoError> {
    let b = Bounds::read(page, true)?;
    let itemcount = b.max_offset();
    if offnum == 0 || offnum > itemcount {
        return Err(RedoError::BadPage(format!("invalid index offnum: {offnum} (the page has {itemcount})")));
    }
    let mut id = lp(page, offnum)?;
    let (offset, oldsize) = (id.off as usize, id.len as usize);
    if offset < b.upper || offset + oldsize > b.special || offset != maxalign(offset) {
        return Err(RedoError::BadPage(format!("corrupted line pointer: offset = {offset}, size = {oldsize}")));
    }
    if item.len() > MAX_ITEM_LEN {
        return Err(RedoError::BadPage(format!("item of {} bytes is too long for a line pointer", item.len())));
    }
    let oldsize = maxalign(oldsize) as isize;
    let newsize = maxalign(item.len()) as isize;
    if newsize > oldsize + (b.upper - b.lower) as isize {
        return Err(RedoError::BadPage(format!("no room to replace item {offnum} with {} bytes", item.len())));
    }
    // Positive when the item shrinks: what pd_upper and the moved items gain.
    let diff = oldsize - newsize;
    let new_offset = (offset as isize + diff) as usize;
    if new_offset + item.len() > BLCKSZ {
        return Err(RedoError::BadPage(format!("replacement for item {offnum} runs past the page")));
    }
    if diff != 0 {
        let upper = b.upper;
        let dest = (upper as isize + diff) as usize;
        page.copy_within(upper..offset, dest);
        set_pd_upper(page, dest as u16).map_err(page_err)?;
        for i in 1..=itemcount {
            let mut other = lp(page, i)?;
            if other.has_storage() && other.off as usize <= offset {
                other.off = ((other.off as isize + diff) as usize & 0x7FFF) as u16;
                set_lp(page, i, other)?;
            }
        }
    }
    id.off = new_offset as u16;
    id.len = item.len() as u16;
    set_lp(page, offnum, id)?;
    page[new_offset..new_offset + item.len()].copy_from_slice(item);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::page::LP_DEAD;

    fn header(page: &Page) -> (usize, usize, usize) {
        (pd_lower(page).unwrap() as usize, pd_upper(page).unwrap() as usize, pd_special(page).unwrap() as usize)
    }

    fn new_page(special: usize) -> Box<Page> {
        let mut page = Box::new([0xAAu8; BLCKSZ]);
        page_init(&mut page, special);
        page
    }

    /// An item of `len` bytes, each its own tag so moved data can be recognized.
    fn item(tag: u8, len: usize) -> Vec<u8> {
        vec![tag; len]
    }

    #[test]
    fn init_layout() {
        let page = new_page(10);
        assert_eq!(header(&page), (24, 8176, 8176));
        assert_eq!(&page[18..20], &(0x2004u16).to_le_bytes());
        assert!(page[..12].iter().chain(&page[20..]).all(|&b| b == 0));
        assert_eq!(MAX_HEAP_TUPLES_PER_PAGE, 291);
    }

    #[test]
    fn add_items_at_end_and_in_between() {
        let mut page = new_page(0);
        assert_eq!(page_add_item(&mut page, &item(1, 30), None, false, true).unwrap(), 1);
        assert_eq!(header(&page), (28, 8192 - 32, 8192));
        assert_eq!(lp(&page, 1).unwrap(), ItemId { off: 8160, flags: LP_NORMAL, len: 30 });
        assert_eq!(&page[8160..8190], &item(1, 30)[..]);
        assert_eq!(page_add_item(&mut page, &item(2, 8), Some(2), true, true).unwrap(), 2);
        // Insert before 1, shifting both line pointers.
        assert_eq!(page_add_item(&mut page, &item(3, 9), Some(1), false, false).unwrap(), 1);
        assert_eq!(header(&page), (36, 8192 - 32 - 8 - 16, 8192));
        assert_eq!(lp(&page, 1).unwrap().off, 8136);
        assert_eq!(lp(&page, 2).unwrap().off, 8160);
        assert_eq!(lp(&page, 3).unwrap().off, 8152);
        // Past the first free slot, or overwriting a used one, is refused.
        assert!(page_add_item(&mut page, &item(4, 8), Some(5), true, true).is_err());
        assert!(page_add_item(&mut page, &item(4, 8), Some(2), true, true).is_err());
        assert!(page_add_item(&mut page, &item(4, 8100), None, false, true).is_err());
        assert!(page_add_item(&mut page, &item(4, 8), Some(MAX_OFFSET_NUMBER + 1), false, false).is_err());
        assert_eq!(header(&page), (36, 8136, 8192), "refusals leave the page alone");
    }

    #[test]
    fn free_line_pointers_are_reused_and_the_hint_reset() {
        let mut page = new_page(0);
        for t in 1..=3 {
            page_add_item(&mut page, &item(t, 8), None, false, true).unwrap();
        }
        set_lp(&mut page, 2, ItemId::default()).unwrap();
        // Without the hint the free slot is not looked for.
        assert_eq!(page_add_item(&mut page, &item(4, 8), None, false, true).unwrap(), 4);
        set_has_free_lines(&mut page, true).unwrap();
        assert_eq!(page_add_item(&mut page, &item(5, 8), None, false, true).unwrap(), 2);
        assert_eq!(pd_lower(&page[..]).unwrap(), 40, "a reused slot does not grow the array");
        // A stale hint is cleared when no free slot is found.
        assert_eq!(page_add_item(&mut page, &item(6, 8), None, false, true).unwrap(), 5);
        assert_eq!(pd_flags(&page[..]).unwrap() & PD_HAS_FREE_LINES, 0);
    }

    #[test]
    fn heap_line_pointer_limit() {
        let mut page = new_page(0);
        for _ in 0..MAX_HEAP_TUPLES_PER_PAGE {
            page_add_item(&mut page, &[], None, false, true).unwrap();
        }
        assert!(page_add_item(&mut page, &[], None, false, true).is_err());
        assert!(page_add_item(&mut page, &[], None, false, false).is_ok());
    }

    #[test]
    fn repair_fragmentation_compacts_in_line_pointer_order() {
        let mut page = new_page(0);
        for (t, len) in [(1u8, 10usize), (2, 20), (3, 30), (4, 5)] {
            page_add_item(&mut page, &item(t, len), None, false, true).unwrap();
        }
        // Padding bytes after each item travel with it.
        page[8176 + 10..8192].fill(0x11);
        set_lp(&mut page, 2, ItemId { off: 0, flags: LP_UNUSED, len: 0 }).unwrap();
        set_lp(&mut page, 4, ItemId { off: 0, flags: LP_UNUSED, len: 0 }).unwrap();
        page_repair_fragmentation(&mut page).unwrap();
        // Item 1 stays at the end, 3 follows right below; 4 is truncated away.
        assert_eq!(header(&page), (24 + 3 * 4, 8192 - 16 - 32, 8192));
        assert_eq!(lp(&page, 1).unwrap().off, 8176);
        assert_eq!(lp(&page, 3).unwrap().off, 8144);
        assert_eq!(&page[8144..8174], &item(3, 30)[..]);
        assert_eq!(&page[8186..8192], &[0x11; 6]);
        assert_ne!(pd_flags(&page[..]).unwrap() & PD_HAS_FREE_LINES, 0, "line pointer 2 is free");
    }

    #[test]
    fn repair_fragmentation_reorders_unsorted_items() {
        let mut page = new_page(0);
        for t in 1..=3u8 {
            page_add_item(&mut page, &item(t, 16), None, false, true).unwrap();
        }
        // Line pointer 1 reused later: its tuple sits lowest on the page.
        set_lp(&mut page, 1, ItemId::default()).unwrap();
        page_add_item(&mut page, &item(9, 16), Some(1), true, true).unwrap();
        assert_eq!(lp(&page, 1).unwrap().off, 8192 - 64);
        set_lp(&mut page, 2, ItemId { off: 0, flags: LP_DEAD, len: 0 }).unwrap();
        page_repair_fragmentation(&mut page).unwrap();
        assert_eq!(lp(&page, 1).unwrap().off, 8176);
        assert_eq!(lp(&page, 3).unwrap().off, 8160);
        assert_eq!(&page[8176..8192], &item(9, 16)[..]);
        assert_eq!(&page[8160..8176], &item(3, 16)[..]);
        assert_eq!(header(&page), (36, 8160, 8192));
        assert_eq!(pd_flags(&page[..]).unwrap() & PD_HAS_FREE_LINES, 0, "a dead line pointer is not free");
    }

    #[test]
    fn repair_fragmentation_rejects_corrupt_pages() {
        let mut page = new_page(0);
        page_add_item(&mut page, &item(1, 16), None, false, true).unwrap();
        set_lp(&mut page, 1, ItemId { off: 100, flags: LP_NORMAL, len: 16 }).unwrap();
        assert!(page_repair_fragmentation(&mut page).is_err());
        set_pd_lower(&mut page[..], 9000).unwrap();
        assert!(page_repair_fragmentation(&mut page).is_err());
        let mut zero = Box::new([0u8; BLCKSZ]);
        assert!(page_repair_fragmentation(&mut zero).is_err());
        assert!(page_add_item(&mut zero, &[1], None, false, true).is_err());
    }

    #[test]
    fn truncate_line_pointer_array_keeps_one() {
        let mut page = new_page(0);
        for t in 1..=4 {
            page_add_item(&mut page, &item(t, 8), None, false, true).unwrap();
        }
        set_lp(&mut page, 3, ItemId::default()).unwrap();
        set_lp(&mut page, 4, ItemId::default()).unwrap();
        page_truncate_line_pointer_array(&mut page).unwrap();
        assert_eq!(pd_lower(&page[..]).unwrap(), 32);
        assert_eq!(pd_flags(&page[..]).unwrap() & PD_HAS_FREE_LINES, 0);
        set_lp(&mut page, 1, ItemId::default()).unwrap();
        set_lp(&mut page, 2, ItemId::default()).unwrap();
        page_truncate_line_pointer_array(&mut page).unwrap();
        assert_eq!(pd_lower(&page[..]).unwrap(), 28, "the first line pointer stays");
        assert_ne!(pd_flags(&page[..]).unwrap() & PD_HAS_FREE_LINES, 0);
    }

    /// An index-like page: a special space and `n` items of 16 bytes.
    fn index_page(n: u8) -> Box<Page> {
        let mut page = new_page(16);
        for t in 1..=n {
            page_add_item(&mut page, &item(t, 12), None, false, false).unwrap();
        }
        page
    }

    #[test]
    fn index_tuple_delete_closes_the_gap() {
        let mut page = index_page(4);
        page_index_tuple_delete(&mut page, 2).unwrap();
        assert_eq!(header(&page), (36, 8176 - 48, 8176));
        let offs: Vec<_> = (1..=3).map(|o| lp(&page, o).unwrap().off).collect();
        assert_eq!(offs, vec![8160, 8144, 8128]);
        assert_eq!(page_get_item(&page, 2).unwrap(), &item(3, 12)[..]);
        assert_eq!(page_get_item(&page, 3).unwrap(), &item(4, 12)[..]);
        assert!(page_index_tuple_delete(&mut page, 4).is_err());
        assert!(page_index_tuple_delete(&mut page, 0).is_err());
    }

    #[test]
    fn index_multi_delete_bulk_and_retail() {
        let mut bulk = index_page(6);
        page_index_multi_delete(&mut bulk, &[1, 3, 4]).unwrap();
        assert_eq!(header(&bulk), (36, 8176 - 48, 8176));
        let items: Vec<_> = (1..=3).map(|o| page_get_item(&bulk, o).unwrap()[0]).collect();
        assert_eq!(items, vec![2, 5, 6]);
        assert_eq!(lp(&bulk, 1).unwrap().off, 8160);

        let mut retail = index_page(6);
        page_index_multi_delete(&mut retail, &[2, 5]).unwrap();
        let items: Vec<_> = (1..=4).map(|o| page_get_item(&retail, o).unwrap()[0]).collect();
        assert_eq!(items, vec![1, 3, 4, 6]);
        assert!(page_index_multi_delete(&mut retail, &[3, 2, 1]).is_err(), "unsorted offsets");
        page_index_multi_delete(&mut retail, &[1, 2, 3, 4]).unwrap();
        assert_eq!(header(&retail), (24, 8176, 8176));
    }

    #[test]
    fn index_delete_no_compact_keeps_offsets() {
        let mut page = index_page(3);
        page_index_tuple_delete_no_compact(&mut page, 2).unwrap();
        assert_eq!(header(&page), (36, 8176 - 32, 8176));
        assert_eq!(lp(&page, 2).unwrap(), ItemId::default());
        assert_eq!(page_get_item(&page, 3).unwrap(), &item(3, 12)[..]);
        page_index_tuple_delete_no_compact(&mut page, 3).unwrap();
        assert_eq!(header(&page), (32, 8176 - 16, 8176));
        assert_eq!(page_get_item(&page, 1).unwrap(), &item(1, 12)[..]);
    }

    #[test]
    fn index_tuple_overwrite_grows_and_shrinks() {
        let mut page = index_page(3);
        page_index_tuple_overwrite(&mut page, 2, &item(7, 20)).unwrap();
        assert_eq!(header(&page), (36, 8176 - 56, 8176));
        assert_eq!(page_get_item(&page, 2).unwrap(), &item(7, 20)[..]);
        assert_eq!(page_get_item(&page, 3).unwrap(), &item(3, 12)[..]);
        assert_eq!(page_get_item(&page, 1).unwrap(), &item(1, 12)[..]);
        page_index_tuple_overwrite(&mut page, 2, &item(8, 3)).unwrap();
        assert_eq!(header(&page), (36, 8176 - 40, 8176));
        assert_eq!(page_get_item(&page, 2).unwrap(), &item(8, 3)[..]);
        assert_eq!(page_get_item(&page, 3).unwrap(), &item(3, 12)[..]);
        assert!(page_index_tuple_overwrite(&mut page, 2, &item(9, 8120)).is_err());
    }

    #[test]
    fn get_item_checks_bounds() {
        let mut page = new_page(0);
        page_add_item(&mut page, &item(1, 4), None, false, true).unwrap();
        assert_eq!(page_get_item(&page, 1).unwrap(), &[1, 1, 1, 1]);
        assert!(page_get_item(&page, 2).is_err());
        set_lp(&mut page, 1, ItemId { off: 8190, flags: LP_NORMAL, len: 4 }).unwrap();
        assert!(page_get_item_mut(&mut page, 1).is_err());
    }
}
