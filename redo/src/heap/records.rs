//! Decoders for the main data of PostgreSQL 15 heap and heap2 records
//! (`heapam_xlog.h`). Each reads the C struct at its natural alignment from
//! the start of the main data; bytes after the struct (logged old tuples,
//! which redo does not need) are ignored.

use strata_formats::types::{Cursor, TransactionId, Truncated};

use crate::RedoError;

/// A record's data ended early.
pub(crate) fn truncated(what: &'static str) -> impl Fn(Truncated) -> RedoError {
    move |t| RedoError::BadRecord(format!("{what}: {t}"))
}

/// `xl_heap_insert.flags` / `xl_heap_multi_insert.flags`: PD_ALL_VISIBLE was cleared.
pub const XLH_INSERT_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
/// `xl_heap_multi_insert.flags`: the page was filled frozen (COPY FREEZE) and is all-visible.
pub const XLH_INSERT_ALL_FROZEN_SET: u8 = 1 << 5;

/// `xl_heap_update.flags`: PD_ALL_VISIBLE was cleared on the old tuple's page.
pub const XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
/// `xl_heap_update.flags`: PD_ALL_VISIBLE was cleared on the new tuple's page.
pub const XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED: u8 = 1 << 1;
/// `xl_heap_update.flags`: the new tuple's block data starts with a prefix length.
pub const XLH_UPDATE_PREFIX_FROM_OLD: u8 = 1 << 5;
/// `xl_heap_update.flags`: the new tuple's block data has a suffix length.
pub const XLH_UPDATE_SUFFIX_FROM_OLD: u8 = 1 << 6;

/// `xl_heap_delete.flags`: PD_ALL_VISIBLE was cleared.
pub const XLH_DELETE_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
/// `xl_heap_delete.flags`: a speculative insertion is being killed (xmin is invalidated).
pub const XLH_DELETE_IS_SUPER: u8 = 1 << 3;
/// `xl_heap_delete.flags`: the row moved to another partition.
pub const XLH_DELETE_IS_PARTITION_MOVE: u8 = 1 << 4;

/// `xl_heap_freeze_tuple.frzflags`: set xvac to the frozen xid.
pub const XLH_FREEZE_XVAC: u8 = 0x02;
/// `xl_heap_freeze_tuple.frzflags`: set xvac to the invalid xid.
pub const XLH_INVALID_XVAC: u8 = 0x04;

/// `xl_heap_insert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapInsert {
    pub offnum: u16,
    pub flags: u8,
}

impl HeapInsert {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapInsert, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_insert");
        Ok(HeapInsert { offnum: c.u16().map_err(&f)?, flags: c.u8().map_err(&f)? })
    }
}

/// `xl_heap_delete`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapDelete {
    pub xmax: TransactionId,
    pub offnum: u16,
    pub infobits_set: u8,
    pub flags: u8,
}

impl HeapDelete {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapDelete, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_delete");
        Ok(HeapDelete {
            xmax: c.u32().map_err(&f)?,
            offnum: c.u16().map_err(&f)?,
            infobits_set: c.u8().map_err(&f)?,
            flags: c.u8().map_err(&f)?,
        })
    }
}

/// `xl_heap_update` (also HOT updates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapUpdate {
    pub old_xmax: TransactionId,
    pub old_offnum: u16,
    pub old_infobits_set: u8,
    pub flags: u8,
    pub new_xmax: TransactionId,
    pub new_offnum: u16,
}

impl HeapUpdate {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapUpdate, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_update");
        Ok(HeapUpdate {
            old_xmax: c.u32().map_err(&f)?,
            old_offnum: c.u16().map_err(&f)?,
            old_infobits_set: c.u8().map_err(&f)?,
            flags: c.u8().map_err(&f)?,
            new_xmax: c.u32().map_err(&f)?,
            new_offnum: c.u16().map_err(&f)?,
        })
    }
}

/// `xl_heap_header`: the tuple header fields a logged tuple keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapHeader {
    pub t_infomask2: u16,
    pub t_infomask: u16,
    pub t_hoff: u8,
}

impl HeapHeader {
    /// Size as logged (`SizeOfHeapHeader`, no padding).
    pub const SIZE: usize = 5;

    /// Reads the header at the cursor (no alignment).
    pub fn read(c: &mut Cursor<'_>) -> Result<HeapHeader, RedoError> {
        let f = truncated("xl_heap_header");
        Ok(HeapHeader {
            t_infomask2: c.u16().map_err(&f)?,
            t_infomask: c.u16().map_err(&f)?,
            t_hoff: c.u8().map_err(&f)?,
        })
    }
}

/// `xl_heap_lock` and `xl_heap_lock_updated` (same layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapLock {
    /// The locker: a transaction or a multixact.
    pub xmax: TransactionId,
    pub offnum: u16,
    pub infobits_set: u8,
    pub flags: u8,
}

impl HeapLock {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapLock, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_lock");
        Ok(HeapLock {
            xmax: c.u32().map_err(&f)?,
            offnum: c.u16().map_err(&f)?,
            infobits_set: c.u8().map_err(&f)?,
            flags: c.u8().map_err(&f)?,
        })
    }
}

/// `xl_heap_confirm` and `xl_heap_inplace`: just the tuple's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapOffnum {
    pub offnum: u16,
}

impl HeapOffnum {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapOffnum, RedoError> {
        let mut c = Cursor::new(data);
        Ok(HeapOffnum { offnum: c.u16().map_err(truncated("heap record offset"))? })
    }
}

/// `xl_heap_prune`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapPrune {
    pub latest_removed_xid: TransactionId,
    pub nredirected: u16,
    pub ndead: u16,
}

impl HeapPrune {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapPrune, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_prune");
        Ok(HeapPrune {
            latest_removed_xid: c.u32().map_err(&f)?,
            nredirected: c.u16().map_err(&f)?,
            ndead: c.u16().map_err(&f)?,
        })
    }
}

/// The line pointer changes of a prune, from block 0's data.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PruneOffsets {
    /// (from, to) pairs: `from` becomes a redirect to `to`.
    pub redirected: Vec<(u16, u16)>,
    pub dead: Vec<u16>,
    /// Whatever follows the dead ones, to the end of the data.
    pub unused: Vec<u16>,
}

impl PruneOffsets {
    /// Splits block 0's offset array by the counts in `prune`.
    pub fn decode(prune: &HeapPrune, data: &[u8]) -> Result<PruneOffsets, RedoError> {
        if !data.len().is_multiple_of(2) {
            return Err(RedoError::BadRecord(format!("prune offsets of odd length {}", data.len())));
        }
        let fixed = 2 * prune.nredirected as usize + prune.ndead as usize;
        if data.len() / 2 < fixed {
            return Err(RedoError::BadRecord(format!(
                "prune lists {} redirects and {} dead items but carries {} offsets",
                prune.nredirected,
                prune.ndead,
                data.len() / 2
            )));
        }
        let all = offsets(data);
        let (redirects, rest) = all.split_at(2 * prune.nredirected as usize);
        let (dead, unused) = rest.split_at(prune.ndead as usize);
        Ok(PruneOffsets {
            redirected: redirects.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
            dead: dead.to_vec(),
            unused: unused.to_vec(),
        })
    }
}

fn offsets(data: &[u8]) -> Vec<u16> {
    data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
}

/// `xl_heap_vacuum`: how many offsets block 0's data lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapVacuum {
    pub nunused: u16,
}

impl HeapVacuum {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapVacuum, RedoError> {
        let mut c = Cursor::new(data);
        Ok(HeapVacuum { nunused: c.u16().map_err(truncated("xl_heap_vacuum"))? })
    }

    /// The now-unused offsets from block 0's data.
    pub fn offsets(&self, data: &[u8]) -> Result<Vec<u16>, RedoError> {
        let n = self.nunused as usize;
        if data.len() < 2 * n {
            return Err(RedoError::BadRecord(format!("vacuum lists {n} offsets but carries {} bytes", data.len())));
        }
        Ok(offsets(&data[..2 * n]))
    }
}

/// `xl_heap_freeze_page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapFreezePage {
    pub cutoff_xid: TransactionId,
    pub ntuples: u16,
}

impl HeapFreezePage {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapFreezePage, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_freeze_page");
        Ok(HeapFreezePage { cutoff_xid: c.u32().map_err(&f)?, ntuples: c.u16().map_err(&f)? })
    }

    /// The per-tuple freeze plans from block 0's data.
    pub fn tuples(&self, data: &[u8]) -> Result<Vec<FreezeTuple>, RedoError> {
        let n = self.ntuples as usize;
        if data.len() < n * FreezeTuple::SIZE {
            return Err(RedoError::BadRecord(format!("freeze lists {n} tuples but carries {} bytes", data.len())));
        }
        data.chunks_exact(FreezeTuple::SIZE).take(n).map(FreezeTuple::decode).collect()
    }
}

/// `xl_heap_freeze_tuple`: the new header values of one frozen tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreezeTuple {
    pub xmax: TransactionId,
    pub offset: u16,
    pub t_infomask2: u16,
    pub t_infomask: u16,
    pub frzflags: u8,
}

impl FreezeTuple {
    /// Array stride: the struct is padded to its 4-byte alignment.
    pub const SIZE: usize = 12;

    fn decode(b: &[u8]) -> Result<FreezeTuple, RedoError> {
        let mut c = Cursor::new(b);
        let f = truncated("xl_heap_freeze_tuple");
        Ok(FreezeTuple {
            xmax: c.u32().map_err(&f)?,
            offset: c.u16().map_err(&f)?,
            t_infomask2: c.u16().map_err(&f)?,
            t_infomask: c.u16().map_err(&f)?,
            frzflags: c.u8().map_err(&f)?,
        })
    }
}

/// `xl_heap_visible`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapVisible {
    pub cutoff_xid: TransactionId,
    /// Visibility-map bits to set.
    pub flags: u8,
}

impl HeapVisible {
    /// Decodes the struct from the start of the record's main data.
    pub fn decode(data: &[u8]) -> Result<HeapVisible, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_visible");
        Ok(HeapVisible { cutoff_xid: c.u32().map_err(&f)?, flags: c.u8().map_err(&f)? })
    }
}

/// `xl_heap_multi_insert`; `offsets` is empty when the record initializes
/// the page (its tuples then go to offsets 1, 2, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapMultiInsert {
    pub flags: u8,
    pub ntuples: u16,
    pub offsets: Vec<u16>,
}

impl HeapMultiInsert {
    /// Decodes the main data; a record that initializes the page has no offsets.
    pub fn decode(data: &[u8], init: bool) -> Result<HeapMultiInsert, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_multi_insert");
        let flags = c.u8().map_err(&f)?;
        c.skip(1).map_err(&f)?;
        let ntuples = c.u16().map_err(&f)?;
        let offsets = if init { Vec::new() } else { offsets(c.take(2 * ntuples as usize).map_err(&f)?) };
        Ok(HeapMultiInsert { flags, ntuples, offsets })
    }
}

/// `xl_multi_insert_tuple`: one tuple's header in a multi-insert's block data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiInsertTuple {
    pub datalen: u16,
    pub header: HeapHeader,
}

impl MultiInsertTuple {
    /// Reads the next tuple header, which starts at an even offset of the block data.
    pub fn read(c: &mut Cursor<'_>) -> Result<MultiInsertTuple, RedoError> {
        let f = truncated("xl_multi_insert_tuple");
        c.align(2).map_err(&f)?;
        let datalen = c.u16().map_err(&f)?;
        Ok(MultiInsertTuple { datalen, header: HeapHeader::read(c)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structs_decode_at_c_offsets() {
        let d = HeapUpdate::decode(&[1, 0, 0, 0, 5, 0, 0x10, 0x22, 2, 0, 0, 0, 7, 0]).unwrap();
        assert_eq!(
            d,
            HeapUpdate { old_xmax: 1, old_offnum: 5, old_infobits_set: 0x10, flags: 0x22, new_xmax: 2, new_offnum: 7 }
        );
        assert!(HeapUpdate::decode(&[0; 13]).is_err());
        assert_eq!(HeapInsert::decode(&[3, 0, 1]).unwrap(), HeapInsert { offnum: 3, flags: 1 });
        assert!(HeapInsert::decode(&[3, 0]).is_err());
        assert_eq!(
            HeapLock::decode(&[9, 0, 0, 0, 4, 0, 0x12, 1]).unwrap(),
            HeapLock { xmax: 9, offnum: 4, infobits_set: 0x12, flags: 1 }
        );
        let m = HeapMultiInsert::decode(&[1, 0xAA, 2, 0, 5, 0, 6, 0], false).unwrap();
        assert_eq!(m, HeapMultiInsert { flags: 1, ntuples: 2, offsets: vec![5, 6] });
        assert!(HeapMultiInsert::decode(&[1, 0, 3, 0, 5, 0, 6, 0], false).is_err());
        assert_eq!(HeapMultiInsert::decode(&[1, 0, 3, 0], true).unwrap().offsets, Vec::<u16>::new());
    }

    #[test]
    fn prune_offsets_split() {
        let p = HeapPrune { latest_removed_xid: 0, nredirected: 1, ndead: 2 };
        let data: Vec<u8> = [1u16, 3, 4, 5, 6, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let o = PruneOffsets::decode(&p, &data).unwrap();
        assert_eq!(o, PruneOffsets { redirected: vec![(1, 3)], dead: vec![4, 5], unused: vec![6, 7] });
        assert!(PruneOffsets::decode(&p, &data[..5]).is_err(), "odd length");
        assert!(PruneOffsets::decode(&p, &data[..4]).is_err(), "fewer than declared");
    }

    #[test]
    fn freeze_plans_use_padded_stride() {
        let mut data = vec![0u8; 24];
        data[0..4].copy_from_slice(&7u32.to_le_bytes());
        data[4..6].copy_from_slice(&3u16.to_le_bytes());
        data[10] = XLH_FREEZE_XVAC;
        data[16..18].copy_from_slice(&9u16.to_le_bytes());
        let f = HeapFreezePage { cutoff_xid: 0, ntuples: 2 };
        let t = f.tuples(&data).unwrap();
        assert_eq!(t[0], FreezeTuple { xmax: 7, offset: 3, t_infomask2: 0, t_infomask: 0, frzflags: XLH_FREEZE_XVAC });
        assert_eq!(t[1].offset, 9);
        assert!(f.tuples(&data[..23]).is_err());
    }

    #[test]
    fn multi_insert_tuple_headers_are_short_aligned() {
        let data = [0xAAu8, 0xBB, 4, 0, 1, 0, 2, 0, 24];
        let mut c = Cursor::new(&data);
        c.skip(1).unwrap();
        let t = MultiInsertTuple::read(&mut c).unwrap();
        assert_eq!(
            t,
            MultiInsertTuple { datalen: 4, header: HeapHeader { t_infomask2: 1, t_infomask: 2, t_hoff: 24 } }
        );
        assert_eq!(c.remaining(), 0);
    }
}
