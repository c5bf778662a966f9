//! PostgreSQL 15 data pages: the 24-byte page header, line pointers, data
//! checksums ([`checksum`]) and masking for page-image comparison ([`mask`]).
//!
//! Every relation page (heap, index, sequence) is an 8 KiB "slotted page":
//!
//! ```text
//! +--------+----------------+--------- hole ---------+--------+---------+
//! | header | line pointers  |      (unused)          | tuples | special |
//! +--------+----------------+------------------------+--------+---------+
//! 0        24               pd_lower                 pd_upper pd_special 8192
//! ```
//!
//! All multi-byte fields are little-endian (the byte order of the platforms
//! Strata supports). The helpers here only check that the buffer is long
//! enough; they do not judge whether the header values make sense, because
//! callers (masking, checksums, dumps) must cope with corrupt pages too.

pub mod checksum;
pub mod mask;

pub use checksum::{page_checksum, set_checksum, verify_checksum};
pub use mask::{mask_page, mask_page_at, PageKind};

/// Size of a page (PostgreSQL's `BLCKSZ` as built by every supported distribution).
pub const PAGE_SIZE: usize = 8192;
/// Size of the fixed page header; the line pointer array starts here.
pub const PAGE_HEADER_SIZE: usize = 24;
/// Size of one line pointer (`ItemIdData`).
pub const ITEM_ID_SIZE: usize = 4;
/// Alignment of tuples and special spaces (`MAXALIGN` on 64-bit platforms).
pub const MAXIMUM_ALIGNOF: usize = 8;
/// Page layout version stored in the low byte of `pd_pagesize_version` since 8.3.
pub const PG_PAGE_LAYOUT_VERSION: u8 = 4;

/// `pd_flags`: there are (probably) unused line pointers before `pd_lower`.
pub const PD_HAS_FREE_LINES: u16 = 0x1;
/// `pd_flags`: a recent update found no room for a new tuple (hint for pruning).
pub const PD_PAGE_FULL: u16 = 0x2;
/// `pd_flags`: every tuple on the page is visible to all transactions.
pub const PD_ALL_VISIBLE: u16 = 0x4;

/// Line pointer state: free slot (length should be 0).
pub const LP_UNUSED: u8 = 0;
/// Line pointer state: points at a tuple.
pub const LP_NORMAL: u8 = 1;
/// Line pointer state: HOT redirect; `lp_off` holds the target offset number.
pub const LP_REDIRECT: u8 = 2;
/// Line pointer state: dead; may or may not still have storage.
pub const LP_DEAD: u8 = 3;

// Byte offsets of the header fields.
const OFF_LSN: usize = 0;
const OFF_CHECKSUM: usize = 8;
const OFF_FLAGS: usize = 10;
const OFF_LOWER: usize = 12;
const OFF_UPPER: usize = 14;
const OFF_SPECIAL: usize = 16;
const OFF_PAGESIZE_VERSION: usize = 18;
const OFF_PRUNE_XID: usize = 20;

/// Error for a buffer too short for the requested field, or a bad offset number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// The buffer ends before the field being accessed.
    #[error("page buffer is {len} bytes, need at least {need}")]
    TooShort { len: usize, need: usize },
    /// Offset numbers are 1-based; 0 is `InvalidOffsetNumber`.
    #[error("offset number 0 is invalid (offset numbers start at 1)")]
    InvalidOffsetNumber,
}

fn check_len(page: &[u8], need: usize) -> Result<(), PageError> {
    if page.len() < need {
        Err(PageError::TooShort { len: page.len(), need })
    } else {
        Ok(())
    }
}

fn get_u16(page: &[u8], off: usize) -> Result<u16, PageError> {
    check_len(page, off + 2)?;
    Ok(u16::from_le_bytes([page[off], page[off + 1]]))
}

fn get_u32(page: &[u8], off: usize) -> Result<u32, PageError> {
    check_len(page, off + 4)?;
    Ok(u32::from_le_bytes(page[off..off + 4].try_into().unwrap()))
}

fn put_u16(page: &mut [u8], off: usize, v: u16) -> Result<(), PageError> {
    check_len(page, off + 2)?;
    page[off..off + 2].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

fn put_u32(page: &mut [u8], off: usize, v: u32) -> Result<(), PageError> {
    check_len(page, off + 4)?;
    page[off..off + 4].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Reads `pd_lsn`; stored as two u32 halves (high, low), not as one u64.
pub fn pd_lsn(page: &[u8]) -> Result<u64, PageError> {
    let hi = get_u32(page, OFF_LSN)?;
    let lo = get_u32(page, OFF_LSN + 4)?;
    Ok(((hi as u64) << 32) | lo as u64)
}

/// Writes `pd_lsn` as its two u32 halves.
pub fn set_pd_lsn(page: &mut [u8], lsn: u64) -> Result<(), PageError> {
    check_len(page, OFF_LSN + 8)?;
    put_u32(page, OFF_LSN, (lsn >> 32) as u32)?;
    put_u32(page, OFF_LSN + 4, lsn as u32)
}

/// Reads the stored data checksum (meaningful only if the cluster has checksums on).
pub fn pd_checksum(page: &[u8]) -> Result<u16, PageError> {
    get_u16(page, OFF_CHECKSUM)
}

/// Writes the stored checksum field verbatim (see [`set_checksum`] to compute it).
pub fn set_pd_checksum(page: &mut [u8], v: u16) -> Result<(), PageError> {
    put_u16(page, OFF_CHECKSUM, v)
}

/// Reads `pd_flags` (`PD_*` bits).
pub fn pd_flags(page: &[u8]) -> Result<u16, PageError> {
    get_u16(page, OFF_FLAGS)
}

/// Writes `pd_flags`.
pub fn set_pd_flags(page: &mut [u8], v: u16) -> Result<(), PageError> {
    put_u16(page, OFF_FLAGS, v)
}

/// Reads `pd_lower`: end of the line pointer array, start of the hole.
pub fn pd_lower(page: &[u8]) -> Result<u16, PageError> {
    get_u16(page, OFF_LOWER)
}

/// Writes `pd_lower`.
pub fn set_pd_lower(page: &mut [u8], v: u16) -> Result<(), PageError> {
    put_u16(page, OFF_LOWER, v)
}

/// Reads `pd_upper`: end of the hole, start of tuple storage (0 on a never-initialized page).
pub fn pd_upper(page: &[u8]) -> Result<u16, PageError> {
    get_u16(page, OFF_UPPER)
}

/// Writes `pd_upper`.
pub fn set_pd_upper(page: &mut [u8], v: u16) -> Result<(), PageError> {
    put_u16(page, OFF_UPPER, v)
}

/// Reads `pd_special`: start of the access-method-specific trailer (8192 = none).
pub fn pd_special(page: &[u8]) -> Result<u16, PageError> {
    get_u16(page, OFF_SPECIAL)
}

/// Writes `pd_special`.
pub fn set_pd_special(page: &mut [u8], v: u16) -> Result<(), PageError> {
    put_u16(page, OFF_SPECIAL, v)
}

/// Reads `pd_pagesize_version`: page size in the high byte(s) OR layout version in the low byte.
pub fn pd_pagesize_version(page: &[u8]) -> Result<u16, PageError> {
    get_u16(page, OFF_PAGESIZE_VERSION)
}

/// Writes `pd_pagesize_version`.
pub fn set_pd_pagesize_version(page: &mut [u8], v: u16) -> Result<(), PageError> {
    put_u16(page, OFF_PAGESIZE_VERSION, v)
}

/// Reads `pd_prune_xid`: oldest XID that might make pruning worthwhile (a hint; 0 = none).
pub fn pd_prune_xid(page: &[u8]) -> Result<u32, PageError> {
    get_u32(page, OFF_PRUNE_XID)
}

/// Writes `pd_prune_xid`.
pub fn set_pd_prune_xid(page: &mut [u8], v: u32) -> Result<(), PageError> {
    put_u32(page, OFF_PRUNE_XID, v)
}

/// True if the page was never initialized (`pd_upper == 0`, PostgreSQL's `PageIsNew`).
///
/// Such pages (normally all zeros, e.g. after a relation extension that was
/// not followed by a write) carry no checksum and must be accepted as valid.
pub fn is_new(page: &[u8]) -> Result<bool, PageError> {
    Ok(pd_upper(page)? == 0)
}

/// True if every byte is zero (the only "new" page a checksum verifier accepts).
pub fn is_all_zeros(page: &[u8]) -> bool {
    page.iter().all(|&b| b == 0)
}

/// Number of line pointers, derived from `pd_lower` (`PageGetMaxOffsetNumber`).
pub fn max_offset_number(page: &[u8]) -> Result<u16, PageError> {
    let lower = pd_lower(page)? as usize;
    Ok(if lower <= PAGE_HEADER_SIZE { 0 } else { ((lower - PAGE_HEADER_SIZE) / ITEM_ID_SIZE) as u16 })
}

/// The decoded 24-byte page header (`PageHeaderData` without the line pointers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PageHeader {
    /// LSN of the last WAL record that changed the page.
    pub lsn: u64,
    pub checksum: u16,
    pub flags: u16,
    pub lower: u16,
    pub upper: u16,
    pub special: u16,
    pub pagesize_version: u16,
    pub prune_xid: u32,
}

impl PageHeader {
    /// Decodes the header from the first 24 bytes of `page`.
    pub fn decode(page: &[u8]) -> Result<PageHeader, PageError> {
        check_len(page, PAGE_HEADER_SIZE)?;
        Ok(PageHeader {
            lsn: pd_lsn(page)?,
            checksum: pd_checksum(page)?,
            flags: pd_flags(page)?,
            lower: pd_lower(page)?,
            upper: pd_upper(page)?,
            special: pd_special(page)?,
            pagesize_version: pd_pagesize_version(page)?,
            prune_xid: pd_prune_xid(page)?,
        })
    }

    /// Encodes the header into its 24-byte on-disk form.
    pub fn encode(&self) -> [u8; PAGE_HEADER_SIZE] {
        let mut out = [0u8; PAGE_HEADER_SIZE];
        // The buffer is exactly header-sized, so none of these can fail.
        let _ = set_pd_lsn(&mut out, self.lsn);
        let _ = set_pd_checksum(&mut out, self.checksum);
        let _ = set_pd_flags(&mut out, self.flags);
        let _ = set_pd_lower(&mut out, self.lower);
        let _ = set_pd_upper(&mut out, self.upper);
        let _ = set_pd_special(&mut out, self.special);
        let _ = set_pd_pagesize_version(&mut out, self.pagesize_version);
        let _ = set_pd_prune_xid(&mut out, self.prune_xid);
        out
    }

    /// Page size recorded in the header (the layout version byte masked off).
    pub fn page_size(&self) -> usize {
        (self.pagesize_version & 0xFF00) as usize
    }

    /// Page layout version (4 for every PostgreSQL since 8.3).
    pub fn layout_version(&self) -> u8 {
        self.pagesize_version as u8
    }

    /// `PageIsNew`: the page was never initialized.
    pub fn is_new(&self) -> bool {
        self.upper == 0
    }

    /// Number of line pointers (`PageGetMaxOffsetNumber`).
    pub fn max_offset_number(&self) -> u16 {
        let lower = self.lower as usize;
        if lower <= PAGE_HEADER_SIZE {
            0
        } else {
            ((lower - PAGE_HEADER_SIZE) / ITEM_ID_SIZE) as u16
        }
    }

    /// True if `header <= pd_lower <= pd_upper <= pd_special <= PAGE_SIZE`
    /// (the bounds PostgreSQL insists on before touching the hole).
    pub fn has_valid_bounds(&self) -> bool {
        let (lower, upper, special) = (self.lower as usize, self.upper as usize, self.special as usize);
        PAGE_HEADER_SIZE <= lower && lower <= upper && upper <= special && special <= PAGE_SIZE
    }
}

/// A decoded line pointer (`ItemIdData`): a 32-bit word holding
/// `lp_off` (bits 0-14), `lp_flags` (bits 15-16) and `lp_len` (bits 17-31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ItemId {
    /// Byte offset of the item from the start of the page (target offset number for redirects).
    pub off: u16,
    /// One of `LP_UNUSED`, `LP_NORMAL`, `LP_REDIRECT`, `LP_DEAD`.
    pub flags: u8,
    /// Length of the item in bytes (0 = no storage).
    pub len: u16,
}

impl ItemId {
    /// Unpacks the raw little-endian word.
    pub fn from_raw(raw: u32) -> ItemId {
        ItemId { off: (raw & 0x7FFF) as u16, flags: ((raw >> 15) & 0x3) as u8, len: ((raw >> 17) & 0x7FFF) as u16 }
    }

    /// Packs into the raw word; out-of-range fields are truncated to their bit widths.
    pub fn to_raw(self) -> u32 {
        (self.off as u32 & 0x7FFF) | ((self.flags as u32 & 0x3) << 15) | ((self.len as u32 & 0x7FFF) << 17)
    }

    /// `ItemIdIsUsed`: anything but `LP_UNUSED`.
    pub fn is_used(self) -> bool {
        self.flags != LP_UNUSED
    }

    /// `ItemIdIsNormal`: points at a tuple.
    pub fn is_normal(self) -> bool {
        self.flags == LP_NORMAL
    }

    /// `ItemIdHasStorage`: nonzero length, whatever the state.
    pub fn has_storage(self) -> bool {
        self.len != 0
    }
}

/// Byte position of line pointer `offnum` (1-based) within the page.
fn item_id_pos(offnum: u16) -> Result<usize, PageError> {
    if offnum == 0 {
        return Err(PageError::InvalidOffsetNumber);
    }
    Ok(PAGE_HEADER_SIZE + (offnum as usize - 1) * ITEM_ID_SIZE)
}

/// Reads line pointer `offnum` (1-based); does not check it against `pd_lower`.
pub fn item_id(page: &[u8], offnum: u16) -> Result<ItemId, PageError> {
    Ok(ItemId::from_raw(get_u32(page, item_id_pos(offnum)?)?))
}

/// Writes line pointer `offnum` (1-based); does not adjust `pd_lower`.
pub fn set_item_id(page: &mut [u8], offnum: u16, id: ItemId) -> Result<(), PageError> {
    put_u32(page, item_id_pos(offnum)?, id.to_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAP_BLK0: &[u8; PAGE_SIZE] = include_bytes!("../../tests/data/page/heap_blk0.page");

    #[test]
    fn decodes_real_header() {
        let h = PageHeader::decode(HEAP_BLK0).unwrap();
        assert_eq!(h.page_size(), PAGE_SIZE);
        assert_eq!(h.layout_version(), PG_PAGE_LAYOUT_VERSION);
        assert_eq!(h.special as usize, PAGE_SIZE);
        assert!(h.has_valid_bounds());
        assert!(!h.is_new());
        assert!(h.max_offset_number() > 0);
        assert_eq!(h.max_offset_number(), max_offset_number(HEAP_BLK0).unwrap());
        assert_eq!(&h.encode()[..], &HEAP_BLK0[..PAGE_HEADER_SIZE]);
        // Every line pointer of a freshly written heap page points inside the tuple area.
        for off in 1..=h.max_offset_number() {
            let lp = item_id(HEAP_BLK0, off).unwrap();
            if lp.is_normal() {
                assert!(lp.off >= h.upper && (lp.off + lp.len) as usize <= PAGE_SIZE);
            }
        }
    }

    #[test]
    fn setters_round_trip() {
        let mut page = vec![0u8; PAGE_SIZE];
        assert!(is_new(&page).unwrap());
        assert!(is_all_zeros(&page));
        set_pd_lsn(&mut page, 0x0000_0016_B374_D848).unwrap();
        assert_eq!(&page[0..8], &[0x16, 0, 0, 0, 0x48, 0xD8, 0x74, 0xB3]);
        assert_eq!(pd_lsn(&page).unwrap(), 0x16_B374_D848);
        set_pd_checksum(&mut page, 0xBEEF).unwrap();
        set_pd_flags(&mut page, PD_ALL_VISIBLE | PD_PAGE_FULL).unwrap();
        set_pd_lower(&mut page, 32).unwrap();
        set_pd_upper(&mut page, 8000).unwrap();
        set_pd_special(&mut page, 8176).unwrap();
        set_pd_pagesize_version(&mut page, PAGE_SIZE as u16 | PG_PAGE_LAYOUT_VERSION as u16).unwrap();
        set_pd_prune_xid(&mut page, 1234).unwrap();
        let h = PageHeader::decode(&page).unwrap();
        assert_eq!(
            h,
            PageHeader {
                lsn: 0x16_B374_D848,
                checksum: 0xBEEF,
                flags: 0x6,
                lower: 32,
                upper: 8000,
                special: 8176,
                pagesize_version: 0x2004,
                prune_xid: 1234,
            }
        );
        assert_eq!(h.max_offset_number(), 2);
        assert!(!is_new(&page).unwrap());
    }

    #[test]
    fn item_id_packing() {
        let id = ItemId { off: 8152, flags: LP_DEAD, len: 40 };
        let raw = id.to_raw();
        assert_eq!(raw, 8152 | (3 << 15) | (40 << 17));
        assert_eq!(ItemId::from_raw(raw), id);
        let mut page = vec![0u8; PAGE_SIZE];
        set_item_id(&mut page, 2, id).unwrap();
        assert_eq!(&page[28..32], &raw.to_le_bytes());
        assert_eq!(item_id(&page, 2).unwrap(), id);
        assert!(id.is_used() && !id.is_normal() && id.has_storage());
        assert_eq!(item_id(&page, 0), Err(PageError::InvalidOffsetNumber));
    }

    #[test]
    fn short_buffers_are_errors() {
        let mut short = [0u8; 10];
        assert_eq!(pd_lsn(&short).unwrap(), 0);
        assert_eq!(pd_flags(&short), Err(PageError::TooShort { len: 10, need: 12 }));
        assert!(set_pd_prune_xid(&mut short, 1).is_err());
        assert!(PageHeader::decode(&short).is_err());
        assert!(item_id(&[0u8; PAGE_HEADER_SIZE], 1).is_err());
        assert!(max_offset_number(&[]).is_err());
    }
}
