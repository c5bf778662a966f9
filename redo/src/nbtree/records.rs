//! Decoding of the btree record structures (`xl_btree_*` of PostgreSQL 15
//! `nbtxlog.h`), with every read bounds-checked.

use strata_formats::types::{Cursor, Truncated};

use super::page::Metadata;
use crate::RedoError;

// `xl_info` values of the btree resource manager (the high four bits).
/// A tuple added to a leaf page.
pub const XLOG_BTREE_INSERT_LEAF: u8 = 0x00;
/// A downlink added to an internal page, completing a child's split.
pub const XLOG_BTREE_INSERT_UPPER: u8 = 0x10;
/// Like `INSERT_UPPER`, and the metapage rewritten.
pub const XLOG_BTREE_INSERT_META: u8 = 0x20;
/// A page split with the new item on the left half.
pub const XLOG_BTREE_SPLIT_L: u8 = 0x30;
/// A page split with the new item on the right half.
pub const XLOG_BTREE_SPLIT_R: u8 = 0x40;
/// A leaf insert that splits an existing posting list.
pub const XLOG_BTREE_INSERT_POST: u8 = 0x50;
/// Runs of equal leaf tuples merged into posting lists.
pub const XLOG_BTREE_DEDUP: u8 = 0x60;
/// Leaf tuples removed outside VACUUM (simple or bottom-up deletion).
pub const XLOG_BTREE_DELETE: u8 = 0x70;
/// A half-dead page (or its parent) unlinked and marked deleted.
pub const XLOG_BTREE_UNLINK_PAGE: u8 = 0x80;
/// Like `UNLINK_PAGE`, and the metapage rewritten.
pub const XLOG_BTREE_UNLINK_PAGE_META: u8 = 0x90;
/// A new root page (a new index or a split root).
pub const XLOG_BTREE_NEWROOT: u8 = 0xA0;
/// An empty leaf marked half-dead and its downlink removed.
pub const XLOG_BTREE_MARK_PAGE_HALFDEAD: u8 = 0xB0;
/// Leaf tuples removed by VACUUM.
pub const XLOG_BTREE_VACUUM: u8 = 0xC0;
/// A deleted page about to be reused (a hot standby conflict point only).
pub const XLOG_BTREE_REUSE_PAGE: u8 = 0xD0;
/// The metapage's cleanup fields rewritten.
pub const XLOG_BTREE_META_CLEANUP: u8 = 0xE0;

fn truncated(what: &'static str) -> impl Fn(Truncated) -> RedoError {
    move |e| RedoError::BadRecord(format!("{what}: {e}"))
}

/// `xl_btree_metadata`: block data of the metapage block.
pub fn metadata(data: &[u8]) -> Result<Metadata, RedoError> {
    let t = truncated("xl_btree_metadata");
    let mut c = Cursor::new(data);
    Ok(Metadata {
        version: c.u32().map_err(&t)?,
        root: c.u32().map_err(&t)?,
        level: c.u32().map_err(&t)?,
        fastroot: c.u32().map_err(&t)?,
        fastlevel: c.u32().map_err(&t)?,
        last_cleanup_num_delpages: c.u32().map_err(&t)?,
        allequalimage: c.u8().map_err(&t)?,
    })
}

/// `xl_btree_insert`: the offset the new tuple goes to.
pub fn insert_offnum(main: &[u8]) -> Result<u16, RedoError> {
    Cursor::new(main).u16().map_err(truncated("xl_btree_insert"))
}

/// `xl_btree_split`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Tree level of the page split (0 = leaf).
    pub level: u32,
    /// First item of the original page that moved to the right page.
    pub firstrightoff: u16,
    /// Offset of the new item in the original page's numbering.
    pub newitemoff: u16,
    /// Nonzero: the new item split the posting list before it at this TID.
    pub postingoff: u16,
}

impl Split {
    /// Decodes the record's main data.
    pub fn decode(main: &[u8]) -> Result<Split, RedoError> {
        let t = truncated("xl_btree_split");
        let mut c = Cursor::new(main);
        Ok(Split {
            level: c.u32().map_err(&t)?,
            firstrightoff: c.u16().map_err(&t)?,
            newitemoff: c.u16().map_err(&t)?,
            postingoff: c.u16().map_err(&t)?,
        })
    }
}

/// A deduplicated run of items: the first item's offset and how many items
/// were merged into one posting list (`BTDedupInterval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupInterval {
    pub baseoff: u16,
    pub nitems: u16,
}

/// `xl_btree_dedup` and its intervals (block 0 data).
pub fn dedup_intervals(main: &[u8], data: &[u8]) -> Result<Vec<DedupInterval>, RedoError> {
    let n = Cursor::new(main).u16().map_err(truncated("xl_btree_dedup"))? as usize;
    let t = truncated("deduplication intervals");
    let mut c = Cursor::new(data);
    if n * 4 > c.remaining() {
        return Err(RedoError::BadRecord(format!("{n} deduplication intervals in {} bytes", data.len())));
    }
    (0..n).map(|_| Ok(DedupInterval { baseoff: c.u16().map_err(&t)?, nitems: c.u16().map_err(&t)? })).collect()
}

/// Items removed from a leaf page by `xl_btree_vacuum` / `xl_btree_delete`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deletion {
    /// Offsets of items removed outright.
    pub deleted: Vec<u16>,
    /// Posting list tuples that lose some TIDs: the item's offset and the
    /// 0-based positions of the TIDs to drop.
    pub updated: Vec<(u16, Vec<u16>)>,
}

/// `xl_btree_vacuum`: counts in the main data, offsets and updates in block 0.
pub fn vacuum(main: &[u8], data: &[u8]) -> Result<Deletion, RedoError> {
    let t = truncated("xl_btree_vacuum");
    let mut c = Cursor::new(main);
    let ndeleted = c.u16().map_err(&t)?;
    let nupdated = c.u16().map_err(&t)?;
    deletion(ndeleted, nupdated, data)
}

/// `xl_btree_delete`: like VACUUM's, after a conflict horizon XID.
pub fn delete(main: &[u8]) -> Result<(u16, u16), RedoError> {
    let t = truncated("xl_btree_delete");
    let mut c = Cursor::new(main);
    c.u32().map_err(&t)?;
    Ok((c.u16().map_err(&t)?, c.u16().map_err(&t)?))
}

/// The block 0 payload shared by VACUUM and DELETE records.
pub fn deletion(ndeleted: u16, nupdated: u16, data: &[u8]) -> Result<Deletion, RedoError> {
    let t = truncated("deleted and updated items");
    let mut c = Cursor::new(data);
    let offsets = |c: &mut Cursor, n: u16| -> Result<Vec<u16>, RedoError> {
        if n as usize * 2 > c.remaining() {
            return Err(RedoError::BadRecord(format!("{n} offsets in {} bytes", c.remaining())));
        }
        (0..n).map(|_| c.u16().map_err(&t)).collect()
    };
    let deleted = offsets(&mut c, ndeleted)?;
    let updated_offsets = offsets(&mut c, nupdated)?;
    let mut updated = Vec::with_capacity(updated_offsets.len());
    for off in updated_offsets {
        let n = c.u16().map_err(&t)?;
        updated.push((off, offsets(&mut c, n)?));
    }
    Ok(Deletion { deleted, updated })
}

/// `xl_btree_mark_page_halfdead`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkHalfDead {
    /// Offset in the parent of the downlink that goes away with its successor's key.
    pub poffset: u16,
    pub leafblk: u32,
    pub leftblk: u32,
    pub rightblk: u32,
    pub topparent: u32,
}

impl MarkHalfDead {
    /// Decodes the record's main data.
    pub fn decode(main: &[u8]) -> Result<MarkHalfDead, RedoError> {
        let t = truncated("xl_btree_mark_page_halfdead");
        let mut c = Cursor::new(main);
        let poffset = c.u16().map_err(&t)?;
        c.align(4).map_err(&t)?;
        Ok(MarkHalfDead {
            poffset,
            leafblk: c.u32().map_err(&t)?,
            leftblk: c.u32().map_err(&t)?,
            rightblk: c.u32().map_err(&t)?,
            topparent: c.u32().map_err(&t)?,
        })
    }
}

/// `xl_btree_unlink_page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnlinkPage {
    pub leftsib: u32,
    pub rightsib: u32,
    pub level: u32,
    /// 64-bit XID after which the page may be recycled.
    pub safexid: u64,
    pub leafleftsib: u32,
    pub leafrightsib: u32,
    pub leaftopparent: u32,
}

impl UnlinkPage {
    /// Decodes the record's main data.
    pub fn decode(main: &[u8]) -> Result<UnlinkPage, RedoError> {
        let t = truncated("xl_btree_unlink_page");
        let mut c = Cursor::new(main);
        let leftsib = c.u32().map_err(&t)?;
        let rightsib = c.u32().map_err(&t)?;
        let level = c.u32().map_err(&t)?;
        c.align(8).map_err(&t)?;
        Ok(UnlinkPage {
            leftsib,
            rightsib,
            level,
            safexid: c.u64().map_err(&t)?,
            leafleftsib: c.u32().map_err(&t)?,
            leafrightsib: c.u32().map_err(&t)?,
            leaftopparent: c.u32().map_err(&t)?,
        })
    }
}

/// `xl_btree_newroot`: (root block, level).
pub fn newroot(main: &[u8]) -> Result<(u32, u32), RedoError> {
    let t = truncated("xl_btree_newroot");
    let mut c = Cursor::new(main);
    Ok((c.u32().map_err(&t)?, c.u32().map_err(&t)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let mut m = Vec::new();
        for v in [4u32, 3, 1, 3, 1, 0] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.extend_from_slice(&[1, 0, 0, 0]);
        let md = metadata(&m).unwrap();
        assert_eq!((md.version, md.root, md.fastlevel, md.allequalimage), (4, 3, 1, 1));
        assert!(metadata(&m[..24]).is_err());

        let s = Split::decode(&[1, 0, 0, 0, 5, 0, 7, 0, 2, 0]).unwrap();
        assert_eq!(s, Split { level: 1, firstrightoff: 5, newitemoff: 7, postingoff: 2 });
        assert!(Split::decode(&[1, 0, 0, 0, 5, 0, 7, 0, 2]).is_err());

        let mut h = vec![3, 0, 0xAA, 0xAA];
        for v in [10u32, 11, 12, 13] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        let hd = MarkHalfDead::decode(&h).unwrap();
        assert_eq!((hd.poffset, hd.leafblk, hd.topparent), (3, 10, 13));

        let mut u = Vec::new();
        for v in [1u32, 2, 3, 0] {
            u.extend_from_slice(&v.to_le_bytes());
        }
        u.extend_from_slice(&0x1_0000_0005u64.to_le_bytes());
        for v in [7u32, 8, 9] {
            u.extend_from_slice(&v.to_le_bytes());
        }
        let ul = UnlinkPage::decode(&u).unwrap();
        assert_eq!(ul.safexid, 0x1_0000_0005);
        assert_eq!((ul.level, ul.leaftopparent), (3, 9));
        assert!(UnlinkPage::decode(&u[..35]).is_err());
    }

    #[test]
    fn deletion_payload() {
        // Two deleted, one updated (offset 9, dropping TIDs 0 and 2).
        let data = [4u16, 6, 9, 2, 0, 2].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let d = vacuum(&[2, 0, 1, 0], &data).unwrap();
        assert_eq!(d.deleted, vec![4, 6]);
        assert_eq!(d.updated, vec![(9, vec![0, 2])]);
        assert!(vacuum(&[2, 0, 1, 0], &data[..data.len() - 1]).is_err());
        assert!(vacuum(&[0xff, 0xff, 0, 0], &data).is_err());
        assert_eq!(delete(&[0, 0, 0, 0, 2, 0, 1, 0]).unwrap(), (2, 1));

        let iv = dedup_intervals(&[2, 0], &[2, 0, 3, 0, 9, 0, 2, 0]).unwrap();
        assert_eq!(iv, vec![DedupInterval { baseoff: 2, nitems: 3 }, DedupInterval { baseoff: 9, nitems: 2 }]);
        assert!(dedup_intervals(&[3, 0], &[2, 0, 3, 0, 9, 0, 2, 0]).is_err());
    }
}
