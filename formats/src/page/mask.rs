//! Masking page images before comparing them, with the same rules as
//! PostgreSQL's `wal_consistency_checking`.
//!
//! When a WAL record is replayed, the resulting page can legitimately differ
//! from the page the primary had after the same change: hint bits and other
//! hints are set without WAL, the LSN and checksum depend on timing, and redo
//! reinitializes some fields (command ids, split cycle ids, ...). PostgreSQL
//! therefore runs a per-resource-manager "mask" function over both images
//! and compares the results byte for byte. [`mask_page`] reproduces those
//! functions; the masked value is always zero.
//!
//! PostgreSQL trusts the page header and line pointers here (an invalid hole
//! is an error, other garbage is undefined behaviour). This implementation
//! never panics and never touches the page header beyond the fields it masks:
//! an inconsistent hole is left alone, the special space is used only if it
//! starts after the header and fits in the page, and a tuple field is masked
//! only if it lies entirely between the header and the end of the page.
//! For sane pages the result is identical to PostgreSQL's.
//!
//! What gets masked depends on page *contents*, not just on the kind:
//! btree/GiST line pointer flags only on leaf pages, hash pages by page type,
//! GIN deleted pages entirely, heap infomask bits depending on whether xmin
//! is frozen, speculative-insertion ctids using the block number.

use super::{ItemId, ITEM_ID_SIZE, MAXIMUM_ALIGNOF, PAGE_HEADER_SIZE, PAGE_SIZE};
use super::{PD_ALL_VISIBLE, PD_HAS_FREE_LINES, PD_PAGE_FULL};

/// Which masking rules apply to a page: one variant per resource manager
/// that defines a mask function, plus `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageKind {
    /// Heap (table) pages. PostgreSQL applies this mask to the visibility-map
    /// page of a heap "visible" record too, which zeroes that page's whole bitmap
    /// (map pages keep their data in what the header calls the hole).
    Heap,
    /// B-tree index pages.
    Btree,
    /// Hash index pages.
    Hash,
    /// GIN index pages.
    Gin,
    /// GiST index pages.
    Gist,
    /// Sequence pages.
    Sequence,
    /// SP-GiST index pages.
    SpGist,
    /// BRIN index pages.
    Brin,
    /// Pages changed through generic WAL records (e.g. the bloom extension).
    Generic,
    /// Anything else: only the universally safe header fields are masked.
    Unknown,
}

// Resource manager ids (PostgreSQL 15) that define a mask function.
const RM_HEAP2_ID: u8 = 9;
const RM_HEAP_ID: u8 = 10;
const RM_BTREE_ID: u8 = 11;
const RM_HASH_ID: u8 = 12;
const RM_GIN_ID: u8 = 13;
const RM_GIST_ID: u8 = 14;
const RM_SEQ_ID: u8 = 15;
const RM_SPGIST_ID: u8 = 16;
const RM_BRIN_ID: u8 = 17;
const RM_GENERIC_ID: u8 = 20;

// Heap tuple header (HeapTupleHeaderData) field offsets and infomask bits.
const HTUP_CID: usize = 8;
const HTUP_CTID: usize = 12;
const HTUP_INFOMASK: usize = 20;
const HEAP_XMIN_COMMITTED: u16 = 0x0100;
const HEAP_XMIN_INVALID: u16 = 0x0200;
const HEAP_XMIN_FROZEN: u16 = HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID;
const HEAP_XMAX_COMMITTED: u16 = 0x0400;
const HEAP_XMAX_INVALID: u16 = 0x0800;
/// All visibility-related infomask bits (everything but the four attribute-shape bits).
const HEAP_XACT_MASK: u16 = 0xFFF0;
/// ctid offset number marking a speculative insertion (the block field holds a token).
const SPEC_TOKEN_OFFSET_NUMBER: u16 = 0xFFFE;

// B-tree special space: prev u32, next u32, level u32, flags u16, cycle id u16.
const BT_OPAQUE_SIZE: usize = 16;
const BT_FLAGS: usize = 12;
const BT_CYCLEID: usize = 14;
const BTP_LEAF: u16 = 1 << 0;
const BTP_SPLIT_END: u16 = 1 << 5;
const BTP_HAS_GARBAGE: u16 = 1 << 6;
const BTP_KNOWN_FLAGS: u16 = 0x1FF;
const MAX_BT_CYCLE_ID: u16 = 0xFF7F;

// Hash special space: prevblkno u32, nextblkno u32, bucket u32, flag u16, page id u16.
const HASH_OPAQUE_SIZE: usize = 16;
const HASH_FLAG: usize = 12;
const HASHO_PAGE_ID: u16 = 0xFF80;
const LH_UNUSED_PAGE: u16 = 0;
const LH_OVERFLOW_PAGE: u16 = 1 << 0;
const LH_BUCKET_PAGE: u16 = 1 << 1;
const LH_PAGE_TYPE: u16 = 0xF;
const LH_PAGE_HAS_DEAD_TUPLES: u16 = 1 << 7;

// GIN special space: rightlink u32, maxoff u16, flags u16.
const GIN_OPAQUE_SIZE: usize = 8;
const GIN_FLAGS: usize = 6;
const GIN_DELETED: u16 = 1 << 2;
const GIN_KNOWN_FLAGS: u16 = 0xFF;

// GiST special space: nsn (8 bytes, LSN layout), rightlink u32, flags u16, page id u16.
const GIST_OPAQUE_SIZE: usize = 16;
const GIST_NSN: usize = 0;
const GIST_FLAGS: usize = 12;
const GIST_PAGE_ID: u16 = 0xFF81;
const F_LEAF: u16 = 1 << 0;
const F_FOLLOW_RIGHT: u16 = 1 << 3;
const F_HAS_GARBAGE: u16 = 1 << 4;

// SP-GiST special space: flags, nRedirection, nPlaceholder, page id (all u16).
const SPGIST_PAGE_ID: u16 = 0xFF82;
// The bloom extension (generic WAL) ends its 8-byte special space with this id.
const BLOOM_PAGE_ID: u16 = 0xFF83;

// BRIN special space: four u16, flags in the third, page type in the fourth.
const BRIN_OPAQUE_SIZE: usize = 8;
const BRIN_FLAGS: usize = 4;
const BRIN_TYPE: usize = 6;
const BRIN_PAGETYPE_META: u16 = 0xF091;
const BRIN_PAGETYPE_REVMAP: u16 = 0xF092;
const BRIN_PAGETYPE_REGULAR: u16 = 0xF093;
const BRIN_EVACUATE_PAGE: u16 = 1 << 0;

// Sequence special space: a u32 magic number, padded to 8 bytes.
const SEQ_MAGIC: u32 = 0x1717;

impl PageKind {
    /// Every kind, for iteration in tests and tools.
    pub const ALL: [PageKind; 10] = [
        PageKind::Heap,
        PageKind::Btree,
        PageKind::Hash,
        PageKind::Gin,
        PageKind::Gist,
        PageKind::Sequence,
        PageKind::SpGist,
        PageKind::Brin,
        PageKind::Generic,
        PageKind::Unknown,
    ];

    /// The kind whose mask PostgreSQL applies to pages referenced by a record of
    /// resource manager `rmgr`; `None` for resource managers without a mask function
    /// (PostgreSQL then compares those images unmasked).
    pub fn from_rmgr(rmgr: u8) -> Option<PageKind> {
        Some(match rmgr {
            RM_HEAP2_ID | RM_HEAP_ID => PageKind::Heap,
            RM_BTREE_ID => PageKind::Btree,
            RM_HASH_ID => PageKind::Hash,
            RM_GIN_ID => PageKind::Gin,
            RM_GIST_ID => PageKind::Gist,
            RM_SEQ_ID => PageKind::Sequence,
            RM_SPGIST_ID => PageKind::SpGist,
            RM_BRIN_ID => PageKind::Brin,
            RM_GENERIC_ID => PageKind::Generic,
            _ => return None,
        })
    }

    /// Guesses the kind from the page itself (size and magic of the special space).
    ///
    /// Needs a full, initialized page with a sane header; anything doubtful is
    /// `Unknown`. Heap means "no special space": a free-space-map or
    /// visibility-map page looks the same, so an empty-looking page (no line
    /// pointers) whose hole is not zeroed is reported as `Unknown`. GIN has no
    /// page id, so an 8-byte special space with no other match and plausible
    /// GIN flags is taken as GIN. Pages of the bloom extension are `Generic`.
    pub fn detect(page: &[u8]) -> PageKind {
        let Ok(page) = <&[u8; PAGE_SIZE]>::try_from(page) else {
            return PageKind::Unknown;
        };
        let Ok(h) = super::PageHeader::decode(page) else {
            return PageKind::Unknown;
        };
        if h.is_new() || h.page_size() != PAGE_SIZE || h.layout_version() != super::PG_PAGE_LAYOUT_VERSION {
            return PageKind::Unknown;
        }
        if !h.has_valid_bounds() {
            return PageKind::Unknown;
        }
        let special = h.special as usize;
        let last_u16 = get_u16(page, PAGE_SIZE - 2).unwrap_or(0);
        match PAGE_SIZE - special {
            0 => {
                let hole = &page[h.lower as usize..h.upper as usize];
                if h.max_offset_number() == 0 && hole.iter().any(|&b| b != 0) {
                    PageKind::Unknown
                } else {
                    PageKind::Heap
                }
            }
            8 => match last_u16 {
                SPGIST_PAGE_ID => PageKind::SpGist,
                BLOOM_PAGE_ID => PageKind::Generic,
                BRIN_PAGETYPE_META | BRIN_PAGETYPE_REVMAP | BRIN_PAGETYPE_REGULAR => PageKind::Brin,
                // A sequence page holds exactly one tuple.
                _ if get_u32(page, special) == Some(SEQ_MAGIC) && h.max_offset_number() == 1 => PageKind::Sequence,
                flags if flags & !GIN_KNOWN_FLAGS == 0 => PageKind::Gin,
                _ => PageKind::Unknown,
            },
            16 => match last_u16 {
                HASHO_PAGE_ID => PageKind::Hash,
                GIST_PAGE_ID => PageKind::Gist,
                cycle_id
                    if cycle_id <= MAX_BT_CYCLE_ID
                        && get_u16(page, special + BT_FLAGS).is_some_and(|f| f & !BTP_KNOWN_FLAGS == 0) =>
                {
                    PageKind::Btree
                }
                _ => PageKind::Unknown,
            },
            _ => PageKind::Unknown,
        }
    }
}

/// Masks `page` in place for comparison, as PostgreSQL does for `kind`
/// (see [`mask_page_at`]; this variant assumes block number 0).
///
/// The block number only matters for heap tuples caught mid speculative
/// insertion (`INSERT ... ON CONFLICT`); use [`mask_page_at`] when comparing
/// heap pages of other blocks, or such tuples will compare unequal.
pub fn mask_page(page: &mut [u8; PAGE_SIZE], kind: PageKind) {
    mask_page_at(page, kind, 0)
}

/// Masks `page` (block `block_number` of its fork) in place for comparison,
/// following the mask function of PostgreSQL's resource manager for `kind`.
pub fn mask_page_at(page: &mut [u8; PAGE_SIZE], kind: PageKind, block_number: u32) {
    match kind {
        PageKind::Heap => heap_mask(page, block_number),
        PageKind::Btree => btree_mask(page),
        PageKind::Hash => hash_mask(page),
        PageKind::Gin => gin_mask(page),
        PageKind::Gist => gist_mask(page),
        PageKind::Sequence => seq_mask(page),
        PageKind::SpGist => spg_mask(page),
        PageKind::Brin => brin_mask(page),
        PageKind::Generic => generic_mask(page),
        PageKind::Unknown => unknown_mask(page),
    }
}

// ---------------------------------------------------------------------------
// Bounds-checked field access. Reads outside the page yield None, writes
// outside the page are skipped.

fn get_u16(page: &[u8; PAGE_SIZE], off: usize) -> Option<u16> {
    let b = page.get(off..off.checked_add(2)?)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}

fn get_u32(page: &[u8; PAGE_SIZE], off: usize) -> Option<u32> {
    let b = page.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn put_u16(page: &mut [u8; PAGE_SIZE], off: usize, v: u16) {
    if let Some(b) = off.checked_add(2).and_then(|end| page.get_mut(off..end)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

fn put_u32(page: &mut [u8; PAGE_SIZE], off: usize, v: u32) {
    if let Some(b) = off.checked_add(4).and_then(|end| page.get_mut(off..end)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// Zeroes `len` bytes at `off`, clipped to the page.
fn zero_clipped(page: &mut [u8; PAGE_SIZE], off: usize, len: usize) {
    let start = off.min(PAGE_SIZE);
    let end = off.saturating_add(len).min(PAGE_SIZE);
    page[start..end].fill(0);
}

/// Header fields, read fresh each time because masking may rewrite them.
fn lower(page: &[u8; PAGE_SIZE]) -> usize {
    get_u16(page, 12).unwrap_or(0) as usize
}

fn upper(page: &[u8; PAGE_SIZE]) -> usize {
    get_u16(page, 14).unwrap_or(0) as usize
}

fn special(page: &[u8; PAGE_SIZE]) -> usize {
    get_u16(page, 16).unwrap_or(0) as usize
}

fn max_offset(page: &[u8; PAGE_SIZE]) -> usize {
    lower(page).saturating_sub(PAGE_HEADER_SIZE) / ITEM_ID_SIZE
}

/// Position of line pointer `off` (1-based), if the whole pointer lies in the page.
fn item_id_pos(off: usize) -> Option<usize> {
    let pos = PAGE_HEADER_SIZE + (off - 1) * ITEM_ID_SIZE;
    (pos + ITEM_ID_SIZE <= PAGE_SIZE).then_some(pos)
}

/// Start of an access method's special space, if a struct of `size` bytes fits
/// between the header and the end of the page.
fn opaque(page: &[u8; PAGE_SIZE], size: usize) -> Option<usize> {
    let sp = special(page);
    (sp >= PAGE_HEADER_SIZE && sp + size <= PAGE_SIZE).then_some(sp)
}

// ---------------------------------------------------------------------------
// The shared building blocks (PostgreSQL's bufmask.c).

/// `mask_page_lsn_and_checksum`: LSN and checksum always differ between the two images.
fn mask_lsn_and_checksum(page: &mut [u8; PAGE_SIZE]) {
    page[0..10].fill(0);
}

/// `mask_page_hint_bits`: `pd_prune_xid` and the `PD_PAGE_FULL`, `PD_HAS_FREE_LINES`
/// and `PD_ALL_VISIBLE` flags are set without WAL (or not set during replay).
fn mask_hint_bits(page: &mut [u8; PAGE_SIZE]) {
    put_u32(page, 20, 0);
    let flags = get_u16(page, 10).unwrap_or(0);
    put_u16(page, 10, flags & !(PD_PAGE_FULL | PD_HAS_FREE_LINES | PD_ALL_VISIBLE));
}

/// `mask_unused_space`: zero the hole between `pd_lower` and `pd_upper`.
/// PostgreSQL raises an error on inconsistent bounds; we mask nothing then.
fn mask_unused_space(page: &mut [u8; PAGE_SIZE]) {
    let (lo, up, sp) = (lower(page), upper(page), special(page));
    if lo > up || sp < up || lo < PAGE_HEADER_SIZE || sp > PAGE_SIZE {
        return;
    }
    page[lo..up].fill(0);
}

/// `mask_lp_flags`: reset every used line pointer's state to `LP_UNUSED`
/// (index AMs mark items dead without WAL). Offset and length are kept.
fn mask_lp_flags(page: &mut [u8; PAGE_SIZE]) {
    let maxoff = max_offset(page);
    for off in 1..=maxoff {
        let Some(pos) = item_id_pos(off) else { break };
        let mut id = ItemId::from_raw(get_u32(page, pos).unwrap_or(0));
        if id.is_used() {
            id.flags = super::LP_UNUSED;
            put_u32(page, pos, id.to_raw());
        }
    }
}

/// `mask_page_content`: zero everything after the header, plus `pd_lower` and `pd_upper`
/// (used where redo reinitializes a page whose old contents do not matter).
fn mask_page_content(page: &mut [u8; PAGE_SIZE]) {
    page[PAGE_HEADER_SIZE..].fill(0);
    page[12..16].fill(0);
}

// ---------------------------------------------------------------------------
// Per access method.

/// `heap_mask`: header hints and hole; per normal tuple the visibility hint bits
/// (all of them unless xmin is frozen, else only the xmax hints), the command id,
/// and a speculative-insertion ctid (replaced by the tuple's own TID, as redo
/// writes it); per item with storage, the padding up to MAXALIGN after it.
fn heap_mask(page: &mut [u8; PAGE_SIZE], block_number: u32) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);
    mask_unused_space(page);

    // Items are not allowed to reach into the header, so pd_lower (and hence
    // the loop bound) cannot change. Each line pointer is read just before
    // use: on a corrupt page, masking one tuple may rewrite a later pointer.
    for off in 1..=max_offset(page) {
        let Some(pos) = item_id_pos(off) else { break };
        let id = ItemId::from_raw(get_u32(page, pos).unwrap_or(0));
        let item = id.off as usize;
        if item < PAGE_HEADER_SIZE {
            continue;
        }

        if id.is_normal() {
            if let Some(infomask) = get_u16(page, item + HTUP_INFOMASK) {
                let masked = if infomask & HEAP_XMIN_FROZEN != HEAP_XMIN_FROZEN {
                    infomask & !HEAP_XACT_MASK
                } else {
                    infomask & !(HEAP_XMAX_INVALID | HEAP_XMAX_COMMITTED)
                };
                put_u16(page, item + HTUP_INFOMASK, masked);
            }
            // Redo sets the command id to FirstCommandId.
            put_u32(page, item + HTUP_CID, 0);
            // ctid = block id (high u16, low u16) + offset number u16.
            if get_u16(page, item + HTUP_CTID + 4) == Some(SPEC_TOKEN_OFFSET_NUMBER) {
                put_u16(page, item + HTUP_CTID, (block_number >> 16) as u16);
                put_u16(page, item + HTUP_CTID + 2, block_number as u16);
                put_u16(page, item + HTUP_CTID + 4, off as u16);
            }
        }

        if id.has_storage() {
            let len = id.len as usize;
            let padlen = len.next_multiple_of(MAXIMUM_ALIGNOF) - len;
            zero_clipped(page, item + len, padlen);
        }
    }
}

/// `btree_mask`: header hints and hole; on leaf pages the line pointer flags
/// (LP_DEAD is set without WAL); always the `BTP_HAS_GARBAGE` and
/// `BTP_SPLIT_END` flags and the vacuum cycle id (redo of a split leaves them clear).
fn btree_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);
    mask_unused_space(page);

    let Some(sp) = opaque(page, BT_OPAQUE_SIZE) else {
        return;
    };
    if get_u16(page, sp + BT_FLAGS).unwrap_or(0) & BTP_LEAF != 0 {
        mask_lp_flags(page);
    }
    let flags = get_u16(page, sp + BT_FLAGS).unwrap_or(0);
    put_u16(page, sp + BT_FLAGS, flags & !(BTP_HAS_GARBAGE | BTP_SPLIT_END));
    put_u16(page, sp + BT_CYCLEID, 0);
}

/// `hash_mask`: header hints and hole; an unused page (type 0) entirely; on
/// bucket and overflow pages the line pointer flags; always the
/// `LH_PAGE_HAS_DEAD_TUPLES` hint.
fn hash_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);
    mask_unused_space(page);

    let Some(sp) = opaque(page, HASH_OPAQUE_SIZE) else {
        return;
    };
    let page_type = get_u16(page, sp + HASH_FLAG).unwrap_or(0) & LH_PAGE_TYPE;
    if page_type == LH_UNUSED_PAGE {
        mask_page_content(page);
    } else if page_type == LH_BUCKET_PAGE || page_type == LH_OVERFLOW_PAGE {
        mask_lp_flags(page);
    }
    // Re-read: masking the content above may have zeroed the special space.
    let Some(sp) = opaque(page, HASH_OPAQUE_SIZE) else {
        return;
    };
    let flag = get_u16(page, sp + HASH_FLAG).unwrap_or(0);
    put_u16(page, sp + HASH_FLAG, flag & !LH_PAGE_HAS_DEAD_TUPLES);
}

/// `gin_mask`: header hints; a `GIN_DELETED` page entirely (redo reinitializes
/// it); otherwise the hole, but only if `pd_lower` is past the header (some GIN
/// pages, e.g. old metapages, do not maintain `pd_lower`).
fn gin_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    let deleted = opaque(page, GIN_OPAQUE_SIZE)
        .and_then(|sp| get_u16(page, sp + GIN_FLAGS))
        .is_some_and(|f| f & GIN_DELETED != 0);
    mask_hint_bits(page);
    if deleted {
        mask_page_content(page);
    } else if lower(page) > PAGE_HEADER_SIZE {
        mask_unused_space(page);
    }
}

/// `gist_mask`: header hints and hole; the NSN (an LSN); `F_FOLLOW_RIGHT` is
/// forced *on* (it is set on the primary after the WAL record is written);
/// on leaf pages the line pointer flags; `F_HAS_GARBAGE` (never set by redo).
fn gist_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);
    mask_unused_space(page);

    let Some(sp) = opaque(page, GIST_OPAQUE_SIZE) else {
        return;
    };
    page[sp + GIST_NSN..sp + GIST_NSN + 8].fill(0);
    let flags = get_u16(page, sp + GIST_FLAGS).unwrap_or(0) | F_FOLLOW_RIGHT;
    put_u16(page, sp + GIST_FLAGS, flags);
    if flags & F_LEAF != 0 {
        mask_lp_flags(page);
    }
    let flags = get_u16(page, sp + GIST_FLAGS).unwrap_or(0);
    put_u16(page, sp + GIST_FLAGS, flags & !F_HAS_GARBAGE);
}

/// `seq_mask`: LSN, checksum and hole only (no header hint bits).
fn seq_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_unused_space(page);
}

/// `spg_mask`: header hints; the hole, but only if `pd_lower` was set (at least the header size).
fn spg_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);
    if lower(page) >= PAGE_HEADER_SIZE {
        mask_unused_space(page);
    }
}

/// `brin_mask`: header hints; the hole of regular pages, and of the metapage
/// if `pd_lower` is past the header; the `BRIN_EVACUATE_PAGE` flag (not WAL-logged).
fn brin_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);

    let Some(sp) = opaque(page, BRIN_OPAQUE_SIZE) else {
        return;
    };
    let page_type = get_u16(page, sp + BRIN_TYPE).unwrap_or(0);
    if page_type == BRIN_PAGETYPE_REGULAR || (page_type == BRIN_PAGETYPE_META && lower(page) > PAGE_HEADER_SIZE) {
        mask_unused_space(page);
    }
    let flags = get_u16(page, sp + BRIN_FLAGS).unwrap_or(0);
    put_u16(page, sp + BRIN_FLAGS, flags & !BRIN_EVACUATE_PAGE);
}

/// `generic_mask`: LSN, checksum and hole only (no header hint bits).
fn generic_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_unused_space(page);
}

/// No PostgreSQL counterpart: LSN, checksum and the page-header hints
/// (`mask_page_lsn_and_checksum` + `mask_page_hint_bits`), which are safe for
/// any page with a standard header. Unlike PostgreSQL, which compares pages of
/// resource managers without a mask function unmasked.
fn unknown_mask(page: &mut [u8; PAGE_SIZE]) {
    mask_lsn_and_checksum(page);
    mask_hint_bits(page);
}

#[cfg(test)]
mod tests {
    use super::super::{item_id, set_item_id, PageHeader, LP_DEAD, LP_NORMAL};
    use super::*;

    const HEAP_BLK0: &[u8; PAGE_SIZE] = include_bytes!("../../tests/data/page/heap_blk0.page");
    const HEAP_BLK1: &[u8; PAGE_SIZE] = include_bytes!("../../tests/data/page/heap_blk1.page");
    const PG_CLASS_BLK0: &[u8; PAGE_SIZE] = include_bytes!("../../tests/data/page/pg_class_blk0.page");
    const BTREE_BLK1: &[u8; PAGE_SIZE] = include_bytes!("../../tests/data/page/btree_blk1.page");

    /// Offset of the first differing byte (keeps failure messages short).
    fn first_diff(a: &[u8; PAGE_SIZE], b: &[u8; PAGE_SIZE]) -> Option<usize> {
        a.iter().zip(b.iter()).position(|(x, y)| x != y)
    }

    macro_rules! assert_same {
        ($a:expr, $b:expr $(, $msg:expr)?) => {
            assert_eq!(first_diff(&$a, &$b), None $(, "{:?}", $msg)?)
        };
    }

    macro_rules! assert_differ {
        ($a:expr, $b:expr $(, $msg:expr)?) => {
            assert!(first_diff(&$a, &$b).is_some() $(, "{:?}", $msg)?)
        };
    }

    fn masked(page: &[u8; PAGE_SIZE], kind: PageKind) -> [u8; PAGE_SIZE] {
        let mut p = *page;
        mask_page(&mut p, kind);
        p
    }

    fn first_normal(page: &[u8; PAGE_SIZE]) -> (u16, ItemId) {
        let n = PageHeader::decode(page).unwrap().max_offset_number();
        (1..=n).map(|o| (o, item_id(page, o).unwrap())).find(|(_, id)| id.is_normal()).unwrap()
    }

    /// An empty, initialized page with `special_size` bytes of special space.
    fn init_page(special_size: usize) -> [u8; PAGE_SIZE] {
        let mut p = [0u8; PAGE_SIZE];
        let h = PageHeader {
            lower: PAGE_HEADER_SIZE as u16,
            upper: (PAGE_SIZE - special_size) as u16,
            special: (PAGE_SIZE - special_size) as u16,
            pagesize_version: 0x2004,
            ..Default::default()
        };
        p[..PAGE_HEADER_SIZE].copy_from_slice(&h.encode());
        p
    }

    /// Adds an item of `len` bytes (filled with `fill`) and its line pointer.
    fn add_item(p: &mut [u8; PAGE_SIZE], len: usize, flags: u8, fill: u8) -> u16 {
        let mut h = PageHeader::decode(p).unwrap();
        let start = (h.upper as usize - len) & !(MAXIMUM_ALIGNOF - 1);
        p[start..start + len].fill(fill);
        let off = h.max_offset_number() + 1;
        set_item_id(p, off, ItemId { off: start as u16, flags, len: len as u16 }).unwrap();
        h.lower += ITEM_ID_SIZE as u16;
        h.upper = start as u16;
        p[..PAGE_HEADER_SIZE].copy_from_slice(&h.encode());
        off
    }

    #[test]
    fn rmgr_ids() {
        assert_eq!(PageKind::from_rmgr(9), Some(PageKind::Heap));
        assert_eq!(PageKind::from_rmgr(10), Some(PageKind::Heap));
        assert_eq!(PageKind::from_rmgr(11), Some(PageKind::Btree));
        assert_eq!(PageKind::from_rmgr(17), Some(PageKind::Brin));
        assert_eq!(PageKind::from_rmgr(20), Some(PageKind::Generic));
        for no_mask in [0, 1, 8, 18, 19, 21, 128, 255] {
            assert_eq!(PageKind::from_rmgr(no_mask), None);
        }
    }

    #[test]
    fn detects_real_pages() {
        assert_eq!(PageKind::detect(HEAP_BLK0), PageKind::Heap);
        assert_eq!(PageKind::detect(HEAP_BLK1), PageKind::Heap);
        assert_eq!(PageKind::detect(PG_CLASS_BLK0), PageKind::Heap);
        assert_eq!(PageKind::detect(BTREE_BLK1), PageKind::Btree);
        assert_eq!(PageKind::detect(&[0u8; PAGE_SIZE]), PageKind::Unknown);
        assert_eq!(PageKind::detect(&HEAP_BLK0[..100]), PageKind::Unknown);
    }

    #[test]
    fn detects_special_space_magic() {
        let with_tail = |size: usize, tail: &[(usize, u16)]| {
            let mut p = init_page(size);
            for &(at, v) in tail {
                put_u16(&mut p, PAGE_SIZE - size + at, v);
            }
            p
        };
        assert_eq!(PageKind::detect(&with_tail(16, &[(14, HASHO_PAGE_ID)])), PageKind::Hash);
        assert_eq!(PageKind::detect(&with_tail(16, &[(14, GIST_PAGE_ID)])), PageKind::Gist);
        assert_eq!(PageKind::detect(&with_tail(16, &[(12, BTP_LEAF), (14, 7)])), PageKind::Btree);
        assert_eq!(PageKind::detect(&with_tail(16, &[(14, 0xFFF0)])), PageKind::Unknown);
        assert_eq!(PageKind::detect(&with_tail(8, &[(6, SPGIST_PAGE_ID)])), PageKind::SpGist);
        assert_eq!(PageKind::detect(&with_tail(8, &[(6, BRIN_PAGETYPE_REVMAP)])), PageKind::Brin);
        assert_eq!(PageKind::detect(&with_tail(8, &[(6, BLOOM_PAGE_ID)])), PageKind::Generic);
        assert_eq!(PageKind::detect(&with_tail(8, &[(6, 0x0003)])), PageKind::Gin);
        assert_eq!(PageKind::detect(&with_tail(8, &[(6, 0x1234)])), PageKind::Unknown);
        assert_eq!(PageKind::detect(&with_tail(24, &[])), PageKind::Unknown);

        let mut seq = with_tail(8, &[(0, SEQ_MAGIC as u16)]);
        add_item(&mut seq, 41, LP_NORMAL, 1);
        assert_eq!(PageKind::detect(&seq), PageKind::Sequence);

        // An FSM/VM-style page: no line pointers, data in the "hole".
        let mut map = init_page(0);
        map[100] = 0xFF;
        assert_eq!(PageKind::detect(&map), PageKind::Unknown);
        assert_eq!(PageKind::detect(&init_page(0)), PageKind::Heap);
    }

    #[test]
    fn real_pages_mask_idempotently() {
        for page in [HEAP_BLK0, HEAP_BLK1, PG_CLASS_BLK0, BTREE_BLK1] {
            for kind in PageKind::ALL {
                let once = masked(page, kind);
                assert_same!(masked(&once, kind), once, kind);
            }
        }
    }

    #[test]
    fn heap_hint_bits_lsn_checksum_and_prune_xid_are_masked() {
        let (_, id) = first_normal(HEAP_BLK0);
        let infomask_at = id.off as usize + HTUP_INFOMASK;
        let infomask = get_u16(HEAP_BLK0, infomask_at).unwrap();
        assert_ne!(infomask & HEAP_XMIN_FROZEN, HEAP_XMIN_FROZEN, "test vector tuples are not frozen");

        let mut other = *HEAP_BLK0;
        put_u16(&mut other, infomask_at, infomask ^ HEAP_XMIN_COMMITTED);
        other[0..10].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        put_u32(&mut other, 20, 987_654);
        let flags = get_u16(&other, 10).unwrap();
        put_u16(&mut other, 10, flags ^ PD_ALL_VISIBLE ^ PD_PAGE_FULL);
        // Command id differs too (redo uses FirstCommandId).
        put_u32(&mut other, id.off as usize + HTUP_CID, 42);
        assert_ne!(&other, HEAP_BLK0);
        assert_same!(masked(&other, PageKind::Heap), masked(HEAP_BLK0, PageKind::Heap));

        // Tuple data differences survive masking.
        let mut changed = other;
        changed[id.off as usize + id.len as usize - 1] ^= 0x5A;
        assert_differ!(masked(&changed, PageKind::Heap), masked(HEAP_BLK0, PageKind::Heap));

        // The attribute-shape bits of the infomask are not hints.
        let mut shape = *HEAP_BLK0;
        put_u16(&mut shape, infomask_at, infomask ^ 0x0001);
        assert_differ!(masked(&shape, PageKind::Heap), masked(HEAP_BLK0, PageKind::Heap));
    }

    #[test]
    fn frozen_tuples_keep_xmin_bits_but_lose_xmax_hints() {
        let mut a = init_page(0);
        let off = add_item(&mut a, 30, LP_NORMAL, 0);
        let at = item_id(&a, off).unwrap().off as usize + HTUP_INFOMASK;
        put_u16(&mut a, at, HEAP_XMIN_FROZEN | HEAP_XMAX_INVALID);
        let mut b = a;
        put_u16(&mut b, at, HEAP_XMIN_FROZEN);
        assert_same!(masked(&a, PageKind::Heap), masked(&b, PageKind::Heap));
        assert_eq!(get_u16(&masked(&a, PageKind::Heap), at), Some(HEAP_XMIN_FROZEN));
        // Unfrozen vs frozen is a real difference.
        put_u16(&mut b, at, HEAP_XMIN_COMMITTED);
        assert_differ!(masked(&a, PageKind::Heap), masked(&b, PageKind::Heap));
    }

    #[test]
    fn heap_padding_and_speculative_ctid() {
        let mut primary = init_page(0);
        let off = add_item(&mut primary, 29, LP_NORMAL, 0x11);
        let item = item_id(&primary, off).unwrap().off as usize;
        // Speculative token in the ctid on the primary...
        put_u16(&mut primary, item + HTUP_CTID, 0);
        put_u16(&mut primary, item + HTUP_CTID + 2, 77);
        put_u16(&mut primary, item + HTUP_CTID + 4, SPEC_TOKEN_OFFSET_NUMBER);
        primary[item + 29..item + 32].fill(0xEE); // garbage padding
                                                  // ...and the TID of the tuple itself after redo, on block 0x1_0005.
        let mut replay = primary;
        put_u16(&mut replay, item + HTUP_CTID, 1);
        put_u16(&mut replay, item + HTUP_CTID + 2, 5);
        put_u16(&mut replay, item + HTUP_CTID + 4, off);
        replay[item + 29..item + 32].fill(0);
        let (mut p, mut r) = (primary, replay);
        mask_page_at(&mut p, PageKind::Heap, 0x1_0005);
        mask_page_at(&mut r, PageKind::Heap, 0x1_0005);
        assert_same!(p, r);
        // Without the block number, only block 0 lines up.
        assert_differ!(masked(&primary, PageKind::Heap), masked(&replay, PageKind::Heap));
    }

    #[test]
    fn unused_space_garbage_is_masked() {
        let h = PageHeader::decode(HEAP_BLK1).unwrap();
        let mut garbage = *HEAP_BLK1;
        for (i, b) in garbage[h.lower as usize..h.upper as usize].iter_mut().enumerate() {
            *b = i as u8 | 1;
        }
        for kind in [PageKind::Heap, PageKind::Generic, PageKind::Sequence] {
            assert_same!(masked(&garbage, kind), masked(HEAP_BLK1, kind), kind);
        }
        // Unknown pages keep their hole.
        assert_differ!(masked(&garbage, PageKind::Unknown), masked(HEAP_BLK1, PageKind::Unknown));
    }

    #[test]
    fn btree_lp_dead_and_garbage_flags_are_masked_on_leaves() {
        let sp = special(BTREE_BLK1);
        assert_ne!(get_u16(BTREE_BLK1, sp + BT_FLAGS).unwrap() & BTP_LEAF, 0);
        let (off, mut id) = first_normal(BTREE_BLK1);
        let mut killed = *BTREE_BLK1;
        id.flags = LP_DEAD;
        set_item_id(&mut killed, off, id).unwrap();
        let flags = get_u16(&killed, sp + BT_FLAGS).unwrap();
        put_u16(&mut killed, sp + BT_FLAGS, flags | BTP_HAS_GARBAGE | BTP_SPLIT_END);
        put_u16(&mut killed, sp + BT_CYCLEID, 12);
        assert_same!(masked(&killed, PageKind::Btree), masked(BTREE_BLK1, PageKind::Btree));
        assert_differ!(masked(&killed, PageKind::Heap), masked(BTREE_BLK1, PageKind::Heap));

        // On an internal page LP_DEAD is a real difference.
        let mut internal = *BTREE_BLK1;
        put_u16(&mut internal, sp + BT_FLAGS, flags & !BTP_LEAF);
        let mut internal_killed = internal;
        set_item_id(&mut internal_killed, off, id).unwrap();
        assert_differ!(masked(&internal_killed, PageKind::Btree), masked(&internal, PageKind::Btree));
    }

    #[test]
    fn gist_nsn_follow_right_and_leaf_flags() {
        let mut a = init_page(GIST_OPAQUE_SIZE);
        let sp = PAGE_SIZE - GIST_OPAQUE_SIZE;
        put_u16(&mut a, sp + 14, GIST_PAGE_ID);
        put_u16(&mut a, sp + GIST_FLAGS, F_LEAF);
        let off = add_item(&mut a, 16, LP_NORMAL, 3);
        let mut b = a;
        b[sp..sp + 8].fill(0x42);
        put_u16(&mut b, sp + GIST_FLAGS, F_LEAF | F_FOLLOW_RIGHT | F_HAS_GARBAGE);
        let mut id = item_id(&b, off).unwrap();
        id.flags = LP_DEAD;
        set_item_id(&mut b, off, id).unwrap();
        let ma = masked(&a, PageKind::Gist);
        assert_same!(ma, masked(&b, PageKind::Gist));
        assert_eq!(get_u16(&ma, sp + GIST_FLAGS), Some(F_LEAF | F_FOLLOW_RIGHT));
    }

    #[test]
    fn hash_unused_page_and_gin_deleted_page_are_masked_entirely() {
        let mut a = init_page(HASH_OPAQUE_SIZE);
        let sp = PAGE_SIZE - HASH_OPAQUE_SIZE;
        put_u16(&mut a, sp + 14, HASHO_PAGE_ID);
        let mut b = a;
        add_item(&mut b, 20, LP_NORMAL, 9);
        assert_same!(masked(&a, PageKind::Hash), masked(&b, PageKind::Hash));

        let mut g = init_page(GIN_OPAQUE_SIZE);
        put_u16(&mut g, PAGE_SIZE - 2, GIN_DELETED);
        let mut g2 = g;
        add_item(&mut g2, 20, LP_NORMAL, 9);
        assert_same!(masked(&g, PageKind::Gin), masked(&g2, PageKind::Gin));
        // Not deleted: the item is real content.
        put_u16(&mut g, PAGE_SIZE - 2, 0);
        put_u16(&mut g2, PAGE_SIZE - 2, 0);
        assert_differ!(masked(&g, PageKind::Gin), masked(&g2, PageKind::Gin));
    }

    #[test]
    fn unknown_masks_only_header_fields() {
        let m = masked(HEAP_BLK0, PageKind::Unknown);
        assert_eq!(&m[PAGE_HEADER_SIZE..], &HEAP_BLK0[PAGE_HEADER_SIZE..]);
        assert_eq!(&m[0..10], &[0; 10]);
        assert_eq!(&m[20..24], &[0; 4]);
        assert_eq!(&m[12..20], &HEAP_BLK0[12..20]);
    }

    #[test]
    fn zero_page_stays_zero() {
        for kind in PageKind::ALL {
            assert_same!(masked(&[0u8; PAGE_SIZE], kind), [0u8; PAGE_SIZE], kind);
        }
    }

    /// Pseudo-random pages, some fully random and some with plausible headers,
    /// line pointers and special spaces, must never make detect or mask panic.
    #[test]
    fn random_pages_never_panic() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let magics = [
            HASHO_PAGE_ID,
            GIST_PAGE_ID,
            SPGIST_PAGE_ID,
            BLOOM_PAGE_ID,
            BRIN_PAGETYPE_META,
            BRIN_PAGETYPE_REGULAR,
            0,
            1,
        ];
        for iter in 0..4000 {
            let mut page = [0u8; PAGE_SIZE];
            for chunk in page.chunks_mut(8) {
                chunk.copy_from_slice(&next().to_le_bytes());
            }
            if iter % 2 == 1 {
                // Mostly-plausible header so the deeper paths run.
                let r = next();
                let special = [PAGE_SIZE, PAGE_SIZE - 8, PAGE_SIZE - 16, (r >> 8) as usize % 9000][r as usize % 4];
                let lower = PAGE_HEADER_SIZE + (r >> 20) as usize % 600;
                let upper = lower + (r >> 32) as usize % 7000;
                put_u16(&mut page, 12, lower as u16);
                put_u16(&mut page, 14, upper as u16);
                put_u16(&mut page, 16, special as u16);
                put_u16(&mut page, 18, 0x2004);
                put_u16(&mut page, PAGE_SIZE - 2, magics[(r >> 48) as usize % magics.len()]);
                put_u16(&mut page, PAGE_SIZE - 4, (r >> 40) as u16 & 0x7);
                if iter % 4 == 1 {
                    // Line pointers near the end of the page, with long lengths.
                    for off in 1..=((lower - PAGE_HEADER_SIZE) / ITEM_ID_SIZE) as u16 {
                        let v = next();
                        let id =
                            ItemId { off: 8000 + (v % 400) as u16, flags: (v >> 16) as u8 & 3, len: (v >> 24) as u16 };
                        set_item_id(&mut page, off, id).unwrap();
                    }
                }
            }
            let detected = PageKind::detect(&page);
            for kind in PageKind::ALL {
                let mut copy = page;
                mask_page_at(&mut copy, kind, next() as u32);
            }
            let mut copy = page;
            mask_page(&mut copy, detected);
        }
    }
}
