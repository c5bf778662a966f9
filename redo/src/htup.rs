//! The fixed heap tuple header (`HeapTupleHeaderData`, PostgreSQL 15) as
//! redo reads and writes it: field offsets, infomask bits and small
//! accessors over a tuple's bytes.
//!
//! ```text
//! 0 xmin · 4 xmax · 8 cid/xvac · 12 ctid (block hi, block lo, offset)
//! 18 infomask2 · 20 infomask · 22 hoff · 23 null bitmap / data
//! ```

use strata_formats::types::TransactionId;

use crate::RedoError;

/// Size of the fixed header (`SizeofHeapTupleHeader`); data starts at `t_hoff`.
pub const HEAP_TUPLE_HEADER_SIZE: usize = 23;

const T_XMIN: usize = 0;
const T_XMAX: usize = 4;
const T_FIELD3: usize = 8;
const T_CTID: usize = 12;
const T_INFOMASK2: usize = 18;
const T_INFOMASK: usize = 20;
const T_HOFF: usize = 22;

/// `t_infomask`: the xmax is a key-share locker.
pub const HEAP_XMAX_KEYSHR_LOCK: u16 = 0x0010;
/// `t_infomask`: `t_cid` is a combo command id.
pub const HEAP_COMBOCID: u16 = 0x0020;
/// `t_infomask`: the xmax is an exclusive locker.
pub const HEAP_XMAX_EXCL_LOCK: u16 = 0x0040;
/// `t_infomask`: the xmax, if valid, only locks the tuple.
pub const HEAP_XMAX_LOCK_ONLY: u16 = 0x0080;
/// `t_infomask`: the share-lock combination of the two lock bits.
pub const HEAP_XMAX_SHR_LOCK: u16 = HEAP_XMAX_EXCL_LOCK | HEAP_XMAX_KEYSHR_LOCK;
/// `t_infomask`: every lock-strength bit.
pub const HEAP_LOCK_MASK: u16 = HEAP_XMAX_SHR_LOCK | HEAP_XMAX_EXCL_LOCK | HEAP_XMAX_KEYSHR_LOCK;
/// `t_infomask`: hint that the xmax committed.
pub const HEAP_XMAX_COMMITTED: u16 = 0x0400;
/// `t_infomask`: hint that the xmax is invalid or aborted.
pub const HEAP_XMAX_INVALID: u16 = 0x0800;
/// `t_infomask`: the xmax is a multixact.
pub const HEAP_XMAX_IS_MULTI: u16 = 0x1000;
/// `t_infomask`: moved by a pre-9.0 VACUUM FULL (the third field holds xvac).
pub const HEAP_MOVED: u16 = 0x4000 | 0x8000;
/// `t_infomask`: every bit describing the xmax.
pub const HEAP_XMAX_BITS: u16 =
    HEAP_XMAX_COMMITTED | HEAP_XMAX_INVALID | HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK | HEAP_XMAX_LOCK_ONLY;

/// `t_infomask2`: the update changed key columns (or it was a delete).
pub const HEAP_KEYS_UPDATED: u16 = 0x2000;
/// `t_infomask2`: the tuple was HOT-updated.
pub const HEAP_HOT_UPDATED: u16 = 0x4000;

/// `infobits_set` of heap WAL records: the xmax is a multixact.
pub const XLHL_XMAX_IS_MULTI: u8 = 0x01;
/// `infobits_set`: the xmax only locks.
pub const XLHL_XMAX_LOCK_ONLY: u8 = 0x02;
/// `infobits_set`: exclusive lock bit.
pub const XLHL_XMAX_EXCL_LOCK: u8 = 0x04;
/// `infobits_set`: key-share lock bit.
pub const XLHL_XMAX_KEYSHR_LOCK: u8 = 0x08;
/// `infobits_set`: the update changed key columns.
pub const XLHL_KEYS_UPDATED: u8 = 0x10;

/// The transaction id every frozen xvac is set to.
pub const FROZEN_TRANSACTION_ID: TransactionId = 2;
/// `MovedPartitionsBlockNumber`: ctid block of a tuple whose update moved
/// it to another partition.
pub const MOVED_PARTITIONS_BLOCK: u32 = 0xFFFF_FFFF;
/// `MovedPartitionsOffsetNumber`: the matching ctid offset.
pub const MOVED_PARTITIONS_OFFSET: u16 = 0xFFFD;

/// `HEAP_XMAX_IS_LOCKED_ONLY`: the xmax only locks (also the pre-9.3 form
/// of a lone exclusive lock bit without a multixact).
pub fn xmax_is_locked_only(infomask: u16) -> bool {
    infomask & HEAP_XMAX_LOCK_ONLY != 0 || infomask & (HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK) == HEAP_XMAX_EXCL_LOCK
}

/// `TransactionIdPrecedes`: circular comparison for normal transaction
/// ids, plain comparison when either is a special one (below 3).
pub fn xid_precedes(a: TransactionId, b: TransactionId) -> bool {
    if a < 3 || b < 3 {
        return a < b;
    }
    (a.wrapping_sub(b) as i32) < 0
}

/// A heap tuple's bytes (header and data), mutable in place.
pub struct TupleMut<'a>(&'a mut [u8]);

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl<'a> TupleMut<'a> {
    /// Wraps `bytes`, which must hold at least the fixed header.
    pub fn new(bytes: &'a mut [u8]) -> Result<TupleMut<'a>, RedoError> {
        if bytes.len() < HEAP_TUPLE_HEADER_SIZE {
            return Err(RedoError::BadPage(format!(
                "a heap tuple of {} bytes has no room for its header",
                bytes.len()
            )));
        }
        Ok(TupleMut(bytes))
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// `t_infomask`.
    pub fn infomask(&self) -> u16 {
        get16(self.0, T_INFOMASK)
    }

    /// Sets `t_infomask`.
    pub fn set_infomask(&mut self, v: u16) {
        self.put16(T_INFOMASK, v);
    }

    /// `t_infomask2` (attribute count and update flags).
    pub fn infomask2(&self) -> u16 {
        get16(self.0, T_INFOMASK2)
    }

    /// Sets `t_infomask2`.
    pub fn set_infomask2(&mut self, v: u16) {
        self.put16(T_INFOMASK2, v);
    }

    /// `t_hoff`: where the data starts.
    pub fn hoff(&self) -> u8 {
        self.0[T_HOFF]
    }

    /// Sets `t_hoff`.
    pub fn set_hoff(&mut self, v: u8) {
        self.0[T_HOFF] = v;
    }

    /// Sets the inserting transaction.
    pub fn set_xmin(&mut self, xid: TransactionId) {
        self.put32(T_XMIN, xid);
    }

    /// Sets the deleting or locking transaction (or multixact).
    pub fn set_xmax(&mut self, xid: TransactionId) {
        self.put32(T_XMAX, xid);
    }

    /// `HeapTupleHeaderSetCmin`/`SetCmax` without a combo id: the command
    /// id goes in the third field and the combo flag is cleared.
    pub fn set_plain_cid(&mut self, cid: u32) {
        self.put32(T_FIELD3, cid);
        let m = self.infomask() & !HEAP_COMBOCID;
        self.set_infomask(m);
    }

    /// `HeapTupleHeaderSetXvac`: the third field read as the mover's xid.
    pub fn set_xvac(&mut self, xid: TransactionId) {
        self.put32(T_FIELD3, xid);
    }

    /// Sets `t_ctid` (block number stored as two 16-bit halves, high first).
    pub fn set_ctid(&mut self, block: u32, offnum: u16) {
        self.put16(T_CTID, (block >> 16) as u16);
        self.put16(T_CTID + 2, block as u16);
        self.put16(T_CTID + 4, offnum);
    }

    /// Resets the xmax description before a record sets it anew: xmax
    /// bits and the moved flags, "keys updated" and (when `clear_hot`)
    /// "HOT updated".
    pub fn clear_xmax_bits(&mut self, clear_hot: bool) {
        let m = self.infomask() & !(HEAP_XMAX_BITS | HEAP_MOVED);
        self.set_infomask(m);
        let mut m2 = self.infomask2() & !HEAP_KEYS_UPDATED;
        if clear_hot {
            m2 &= !HEAP_HOT_UPDATED;
        }
        self.set_infomask2(m2);
    }

    /// `fix_infomask_from_infobits`: turns a record's compact infobits into
    /// the tuple's xmax lock bits and "keys updated".
    pub fn apply_infobits(&mut self, infobits: u8) {
        let mut m =
            self.infomask() & !(HEAP_XMAX_IS_MULTI | HEAP_XMAX_LOCK_ONLY | HEAP_XMAX_KEYSHR_LOCK | HEAP_XMAX_EXCL_LOCK);
        let mut m2 = self.infomask2() & !HEAP_KEYS_UPDATED;
        if infobits & XLHL_XMAX_IS_MULTI != 0 {
            m |= HEAP_XMAX_IS_MULTI;
        }
        if infobits & XLHL_XMAX_LOCK_ONLY != 0 {
            m |= HEAP_XMAX_LOCK_ONLY;
        }
        if infobits & XLHL_XMAX_EXCL_LOCK != 0 {
            m |= HEAP_XMAX_EXCL_LOCK;
        }
        if infobits & XLHL_XMAX_KEYSHR_LOCK != 0 {
            m |= HEAP_XMAX_KEYSHR_LOCK;
        }
        if infobits & XLHL_KEYS_UPDATED != 0 {
            m2 |= HEAP_KEYS_UPDATED;
        }
        self.set_infomask(m);
        self.set_infomask2(m2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_land_at_their_offsets() {
        let mut bytes = [0u8; 24];
        let mut t = TupleMut::new(&mut bytes).unwrap();
        t.set_xmin(0x0102_0304);
        t.set_xmax(0x1112_1314);
        t.set_infomask(HEAP_COMBOCID | 0x0002);
        t.set_plain_cid(7);
        t.set_ctid(0x0005_0006, 9);
        t.set_infomask2(3);
        t.set_hoff(24);
        assert_eq!(t.infomask(), 0x0002, "a plain command id clears the combo flag");
        assert_eq!(bytes, [4, 3, 2, 1, 0x14, 0x13, 0x12, 0x11, 7, 0, 0, 0, 5, 0, 6, 0, 9, 0, 3, 0, 2, 0, 24, 0]);
        assert!(TupleMut::new(&mut [0u8; 22]).is_err());
    }

    #[test]
    fn infobits_and_lock_only() {
        let mut bytes = [0u8; 24];
        let mut t = TupleMut::new(&mut bytes).unwrap();
        t.set_infomask(HEAP_XMAX_INVALID | HEAP_XMAX_IS_MULTI | 0x0001);
        t.set_infomask2(HEAP_HOT_UPDATED | HEAP_KEYS_UPDATED | 2);
        t.clear_xmax_bits(true);
        assert_eq!((t.infomask(), t.infomask2()), (0x0001, 2));
        t.apply_infobits(XLHL_XMAX_LOCK_ONLY | XLHL_XMAX_KEYSHR_LOCK | XLHL_KEYS_UPDATED);
        assert_eq!(t.infomask(), 0x0001 | HEAP_XMAX_LOCK_ONLY | HEAP_XMAX_KEYSHR_LOCK);
        assert_eq!(t.infomask2(), 2 | HEAP_KEYS_UPDATED);
        assert!(xmax_is_locked_only(t.infomask()));
        assert!(xmax_is_locked_only(HEAP_XMAX_EXCL_LOCK));
        assert!(!xmax_is_locked_only(HEAP_XMAX_EXCL_LOCK | HEAP_XMAX_IS_MULTI));
        assert!(!xmax_is_locked_only(0));
    }

    #[test]
    fn xid_comparison_wraps() {
        assert!(xid_precedes(100, 200));
        assert!(!xid_precedes(200, 100));
        assert!(xid_precedes(0xFFFF_FFF0, 5), "across the wraparound");
        assert!(xid_precedes(2, 100), "special ids compare plainly");
        assert!(!xid_precedes(100, 2));
    }
}
