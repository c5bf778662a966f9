//! Btree pages: the special space every btree page ends with, the
//! metapage, and the whole-page rebuilds redo performs (fresh pages, pages
//! refilled from a record's tuples, temporary copies that keep only the
//! special space).

use strata_formats::page::{self, PageHeader};
use strata_formats::version::BLCKSZ;

use super::tuple;
use crate::bufpage::{self, Page};
use crate::RedoError;

/// `btpo_flags`: leaf page.
pub const BTP_LEAF: u16 = 1 << 0;
/// `btpo_flags`: root page.
pub const BTP_ROOT: u16 = 1 << 1;
/// `btpo_flags`: deleted page (waiting to be recycled).
pub const BTP_DELETED: u16 = 1 << 2;
/// `btpo_flags`: the metapage.
pub const BTP_META: u16 = 1 << 3;
/// `btpo_flags`: empty leaf page whose deletion has begun.
pub const BTP_HALF_DEAD: u16 = 1 << 4;
/// `btpo_flags`: the page may hold LP_DEAD items (a hint).
pub const BTP_HAS_GARBAGE: u16 = 1 << 6;
/// `btpo_flags`: the right sibling has no downlink in the parent yet.
pub const BTP_INCOMPLETE_SPLIT: u16 = 1 << 7;
/// `btpo_flags`: a deleted page stores a 64-bit safe XID.
pub const BTP_HAS_FULLXID: u16 = 1 << 8;

/// Block number meaning "no page" in sibling links.
pub const P_NONE: u32 = 0;
/// Offset of the high key on a page that has one.
pub const P_HIKEY: u16 = 1;
/// First data item offset of a page with a high key.
const P_FIRSTKEY: u16 = 2;

/// Size of the special space (`BTPageOpaqueData`, already MAXALIGNed).
const OPAQUE_SIZE: usize = 16;
/// Start of the page contents after the header (`MAXALIGN(SizeOfPageHeaderData)`).
const CONTENTS: usize = 24;
/// Identifies a btree metapage.
const BTREE_MAGIC: u32 = 0x053162;
/// Size of `BTMetaPageData`, including its trailing padding.
const META_SIZE: usize = 48;

/// The special space of a btree page (`BTPageOpaqueData`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Opaque {
    pub prev: u32,
    pub next: u32,
    pub level: u32,
    pub flags: u16,
    pub cycle_id: u16,
}

impl Opaque {
    /// No right sibling (`P_RIGHTMOST`): then the page has no high key.
    pub fn is_rightmost(&self) -> bool {
        self.next == P_NONE
    }

    /// Offset of the first data item (`P_FIRSTDATAKEY`).
    pub fn first_data_key(&self) -> u16 {
        if self.is_rightmost() {
            P_HIKEY
        } else {
            P_FIRSTKEY
        }
    }
}

fn page_err(e: page::PageError) -> RedoError {
    RedoError::BadPage(e.to_string())
}

/// The header of an initialized btree page, with its layout checked.
pub fn header(page: &Page) -> Result<PageHeader, RedoError> {
    let h = PageHeader::decode(page).map_err(page_err)?;
    if h.is_new() {
        return Err(RedoError::BadPage("btree page is not initialized".into()));
    }
    if !h.has_valid_bounds() || h.page_size() != BLCKSZ || BLCKSZ - h.special as usize != OPAQUE_SIZE {
        return Err(RedoError::BadPage(format!(
            "not a btree page layout: lower {} upper {} special {} size/version {:#06x}",
            h.lower, h.upper, h.special, h.pagesize_version
        )));
    }
    Ok(h)
}

/// Number of items on an initialized btree page (`PageGetMaxOffsetNumber`).
pub fn max_offset(page: &Page) -> Result<u16, RedoError> {
    Ok(header(page)?.max_offset_number())
}

fn u32_at(page: &Page, at: usize) -> u32 {
    u32::from_le_bytes(page[at..at + 4].try_into().unwrap())
}

fn put_u32(page: &mut Page, at: usize, v: u32) {
    page[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Reads the special space of an initialized btree page.
pub fn opaque(page: &Page) -> Result<Opaque, RedoError> {
    let s = header(page)?.special as usize;
    Ok(Opaque {
        prev: u32_at(page, s),
        next: u32_at(page, s + 4),
        level: u32_at(page, s + 8),
        flags: u16::from_le_bytes([page[s + 12], page[s + 13]]),
        cycle_id: u16::from_le_bytes([page[s + 14], page[s + 15]]),
    })
}

/// Writes the special space of an initialized btree page.
pub fn set_opaque(page: &mut Page, o: &Opaque) -> Result<(), RedoError> {
    let s = header(page)?.special as usize;
    put_u32(page, s, o.prev);
    put_u32(page, s + 4, o.next);
    put_u32(page, s + 8, o.level);
    page[s + 12..s + 14].copy_from_slice(&o.flags.to_le_bytes());
    page[s + 14..s + 16].copy_from_slice(&o.cycle_id.to_le_bytes());
    Ok(())
}

/// Changes the special space of an initialized btree page in place.
pub fn update_opaque(page: &mut Page, f: impl FnOnce(&mut Opaque)) -> Result<(), RedoError> {
    let mut o = opaque(page)?;
    f(&mut o);
    set_opaque(page, &o)
}

/// `_bt_pageinit` followed by setting the special space: an empty btree page.
pub fn init(page: &mut Page, o: &Opaque) -> Result<(), RedoError> {
    bufpage::page_init(page, OPAQUE_SIZE);
    set_opaque(page, o)
}

/// `PageGetTempPageCopySpecial`: an empty page with `page`'s special space.
pub fn empty_copy_special(page: &Page) -> Result<Box<Page>, RedoError> {
    let special = header(page)?.special as usize;
    let mut temp = Box::new([0u8; BLCKSZ]);
    bufpage::page_init(&mut temp, BLCKSZ - special);
    temp[special..].copy_from_slice(&page[special..]);
    Ok(temp)
}

/// `_bt_restore_page`: refills a freshly initialized page from a record's
/// copy of its tuple area. The tuples were laid out from the end of the page
/// downwards in item order, so the data holds the last item first; adding
/// them back in item order reproduces the same layout.
pub fn restore_items(page: &mut Page, data: &[u8]) -> Result<(), RedoError> {
    let mut items = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let rest = &data[pos..];
        let size = tuple::maxalign(tuple::tuple_size(rest).map_err(|e| RedoError::BadRecord(e.to_string()))?);
        if size < tuple::INDEX_TUPLE_HEADER || size > rest.len() {
            return Err(RedoError::BadRecord(format!(
                "tuple of {size} bytes at byte {pos} of {} bytes of page contents",
                data.len()
            )));
        }
        items.push(&rest[..size]);
        pos += size;
    }
    let n = items.len();
    for (i, item) in items.iter().enumerate().rev() {
        bufpage::page_add_item(page, item, Some((n - i) as u16), false, false)?;
    }
    Ok(())
}

/// Metadata a record carries to rebuild the metapage (`xl_btree_metadata`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    pub version: u32,
    pub root: u32,
    pub level: u32,
    pub fastroot: u32,
    pub fastlevel: u32,
    pub last_cleanup_num_delpages: u32,
    /// Stored byte for byte, as PostgreSQL copies the `bool`.
    pub allequalimage: u8,
}

/// `_bt_restore_meta`: the metapage rebuilt from scratch.
pub fn restore_meta(page: &mut Page, md: &Metadata) -> Result<(), RedoError> {
    init(page, &Opaque { flags: BTP_META, ..Opaque::default() })?;
    let m = CONTENTS;
    put_u32(page, m, BTREE_MAGIC);
    put_u32(page, m + 4, md.version);
    put_u32(page, m + 8, md.root);
    put_u32(page, m + 12, md.level);
    put_u32(page, m + 16, md.fastroot);
    put_u32(page, m + 20, md.fastlevel);
    put_u32(page, m + 24, md.last_cleanup_num_delpages);
    // The heap tuple count is no longer maintained; -1 marks it unknown.
    page[m + 32..m + 40].copy_from_slice(&(-1.0f64).to_le_bytes());
    page[m + 40] = md.allequalimage;
    // The metadata lives in what would otherwise be the hole, so pd_lower
    // must cover it or page compression would drop it.
    page::set_pd_lower(page, (m + META_SIZE) as u16).map_err(page_err)
}

/// `BTPageSetDeleted`: marks an empty page deleted and records its safe XID
/// where the line pointers would start.
pub fn set_deleted(page: &mut Page, safexid: u64) -> Result<(), RedoError> {
    update_opaque(page, |o| o.flags |= BTP_DELETED | BTP_HAS_FULLXID)?;
    let special = header(page)?.special;
    page::set_pd_lower(page, (CONTENTS + 8) as u16).map_err(page_err)?;
    page::set_pd_upper(page, special).map_err(page_err)?;
    page[CONTENTS..CONTENTS + 8].copy_from_slice(&safexid.to_le_bytes());
    Ok(())
}
