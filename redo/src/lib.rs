//! Native redo: changes that PostgreSQL applies to pages without carrying an
//! image of the result, written from PostgreSQL's page formats.
//!
//! Two kinds: PostgreSQL's own heap, heap2 and btree records, redone block
//! by block exactly as PostgreSQL 15's redo does ([`redo_block`], checked
//! against PostgreSQL's images by [`verify`]); and [`NativeRecord`]s, the
//! changes PostgreSQL makes without a block reference (visibility-map bit
//! clearing, the SLRU updates of transaction status and multixacts), which
//! the pageserver derives from records. Every other resource manager's
//! changes arrive as full images (`wal_consistency_checking`). The byte
//! layout of the encoded records is part of the layer file format
//! (`docs/pageserver-storage.md`).

use strata_formats::types::TransactionId;
use strata_formats::version::BLCKSZ;

mod apply;
pub mod bufpage;
pub mod fuzz;
pub mod heap;
pub mod htup;
pub mod nbtree;
pub mod verify;

pub use apply::{redo_block, supports};

/// Resource managers (as `wal_consistency_checking` names them) whose every
/// record is redone natively, so computes need not log images for them.
/// A name is added only once the oracle finds no difference over the test
/// workloads.
pub const NATIVE_RMGRS: &[&str] = &["heap", "heap2", "btree"];

/// A page change that needs no image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeRecord {
    /// Clear visibility-map bits: (heap block, bits) pairs of one VM page.
    ClearVmBits(Vec<(u32, u8)>),
    /// Set the status of these transactions on one CLOG page.
    ClogSetStatus { xids: Vec<TransactionId>, status: u8 },
    /// Set the members' starting offset of a multixact on its offsets page.
    MultiXactOffset { multi: u32, offset: u32 },
    /// Set members (member offset, xid, status) on one members page.
    MultiXactMembers(Vec<(u32, TransactionId, u8)>),
    /// Set the page's `pd_lsn`: an `XLOG_FPI_FOR_HINT` record without an
    /// image (hint bits set with `full_page_writes` off). The hint bits stay
    /// on the compute; the LSN stamp is what the record changed that a read
    /// can see (`docs/decisions.md`, "Full-page writes off").
    SetPageLsn(u64),
}

/// Transaction status values in the CLOG (2 bits per transaction).
pub const CLOG_COMMITTED: u8 = 0x01;
pub const CLOG_ABORTED: u8 = 0x02;
pub const CLOG_SUB_COMMITTED: u8 = 0x03;

/// Transactions per CLOG page (4 per byte).
pub const CLOG_XACTS_PER_PAGE: u32 = (BLCKSZ * 4) as u32;
/// Multixact offsets per page (one u32 each).
pub const MULTIXACT_OFFSETS_PER_PAGE: u32 = (BLCKSZ / 4) as u32;
/// Members are stored in groups of four: four flag bytes, then four xids.
const MEMBER_GROUP_SIZE: usize = 4 + 4 * 4;
const MEMBER_GROUPS_PER_PAGE: u32 = (BLCKSZ / MEMBER_GROUP_SIZE) as u32;
/// Multixact members per page.
pub const MULTIXACT_MEMBERS_PER_PAGE: u32 = MEMBER_GROUPS_PER_PAGE * 4;
/// Heap blocks covered by one visibility-map page (2 bits each after the 24-byte header).
pub const HEAPBLOCKS_PER_VM_PAGE: u32 = ((BLCKSZ - VM_HEADER) * 4) as u32;
const VM_HEADER: usize = 24;

/// The CLOG page holding a transaction's status.
pub fn clog_page(xid: TransactionId) -> u32 {
    xid / CLOG_XACTS_PER_PAGE
}
/// The multixact offsets page of a multixact.
pub fn multixact_offsets_page(multi: u32) -> u32 {
    multi / MULTIXACT_OFFSETS_PER_PAGE
}
/// The multixact members page of a member offset.
pub fn multixact_members_page(offset: u32) -> u32 {
    offset / MULTIXACT_MEMBERS_PER_PAGE
}

/// A native record that does not fit the page it is applied to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedoError {
    #[error("{what} {value} does not belong on this page")]
    WrongPage { what: &'static str, value: u32 },
    #[error("malformed native record: {0}")]
    Malformed(&'static str),
    /// No native redo for this kind of record: it needs a full-page image.
    #[error("no native redo for resource manager {rmgr} record with info {info:#04x}")]
    Unsupported { rmgr: u8, info: u8 },
    #[error("the record has no block reference {0}")]
    NoBlock(u8),
    /// The record's data does not decode (truncated, impossible values).
    #[error("malformed record: {0}")]
    BadRecord(String),
    /// The page is not in a state the record can apply to (a missing item,
    /// no room, a bad header): the page or the WAL is not what it should be.
    #[error("page does not fit the record: {0}")]
    BadPage(String),
}

impl NativeRecord {
    /// Applies the change to `page` (which must be the page the record is for).
    pub fn apply(&self, page: &mut [u8; BLCKSZ]) -> Result<(), RedoError> {
        match self {
            NativeRecord::ClearVmBits(clears) => {
                for &(heap_block, bits) in clears {
                    let in_page = (heap_block % HEAPBLOCKS_PER_VM_PAGE) as usize;
                    let byte = VM_HEADER + in_page / 4;
                    let shift = 2 * (in_page % 4);
                    page[byte] &= !((bits & 0x03) << shift);
                }
            }
            NativeRecord::ClogSetStatus { xids, status } => {
                let first = xids.first().map_or(0, |x| clog_page(*x));
                for &xid in xids {
                    if clog_page(xid) != first {
                        return Err(RedoError::WrongPage { what: "transaction", value: xid });
                    }
                    let in_page = (xid % CLOG_XACTS_PER_PAGE) as usize;
                    let shift = 2 * (in_page % 4);
                    let b = &mut page[in_page / 4];
                    *b = (*b & !(0x03 << shift)) | ((status & 0x03) << shift);
                }
            }
            NativeRecord::MultiXactOffset { multi, offset } => {
                let at = (multi % MULTIXACT_OFFSETS_PER_PAGE) as usize * 4;
                page[at..at + 4].copy_from_slice(&offset.to_le_bytes());
            }
            NativeRecord::MultiXactMembers(members) => {
                let first = members.first().map_or(0, |m| multixact_members_page(m.0));
                for &(offset, xid, status) in members {
                    if multixact_members_page(offset) != first {
                        return Err(RedoError::WrongPage { what: "member offset", value: offset });
                    }
                    let in_page = offset % MULTIXACT_MEMBERS_PER_PAGE;
                    let group = (in_page / 4) as usize * MEMBER_GROUP_SIZE;
                    let slot = (in_page % 4) as usize;
                    page[group + slot] = status;
                    let x = group + 4 + slot * 4;
                    page[x..x + 4].copy_from_slice(&xid.to_le_bytes());
                }
            }
            NativeRecord::SetPageLsn(lsn) => {
                // A page never initialized stays all zeros: PostgreSQL
                // verifies a page with no upper bound as all zeros, and a
                // hint is never set on one.
                if !strata_formats::page::is_new(&page[..]).unwrap_or(true) {
                    strata_formats::page::set_pd_lsn(&mut page[..], *lsn)
                        .map_err(|_| RedoError::Malformed("a page too short for pd_lsn"))?;
                }
            }
        }
        Ok(())
    }

    /// Appends the record's bytes (tag, then fields, little-endian).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            NativeRecord::ClearVmBits(clears) => {
                out.push(1);
                out.extend_from_slice(&(clears.len() as u32).to_le_bytes());
                for &(block, bits) in clears {
                    out.extend_from_slice(&block.to_le_bytes());
                    out.push(bits);
                }
            }
            NativeRecord::ClogSetStatus { xids, status } => {
                out.push(2);
                out.push(*status);
                out.extend_from_slice(&(xids.len() as u32).to_le_bytes());
                for xid in xids {
                    out.extend_from_slice(&xid.to_le_bytes());
                }
            }
            NativeRecord::MultiXactOffset { multi, offset } => {
                out.push(3);
                out.extend_from_slice(&multi.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
            }
            NativeRecord::MultiXactMembers(members) => {
                out.push(4);
                out.extend_from_slice(&(members.len() as u32).to_le_bytes());
                for &(offset, xid, status) in members {
                    out.extend_from_slice(&offset.to_le_bytes());
                    out.extend_from_slice(&xid.to_le_bytes());
                    out.push(status);
                }
            }
            NativeRecord::SetPageLsn(lsn) => {
                out.push(5);
                out.extend_from_slice(&lsn.to_le_bytes());
            }
        }
    }

    /// Decodes what `encode` wrote; errors on any malformed input.
    pub fn decode(bytes: &[u8]) -> Result<NativeRecord, RedoError> {
        let mut c = strata_formats::types::Cursor::new(bytes);
        let bad = |_| RedoError::Malformed("truncated");
        let tag = c.u8().map_err(bad)?;
        let rec = match tag {
            1 => {
                let n = c.u32().map_err(bad)? as usize;
                if n > c.remaining() / 5 {
                    return Err(RedoError::Malformed("count larger than the record"));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push((c.u32().map_err(bad)?, c.u8().map_err(bad)?));
                }
                NativeRecord::ClearVmBits(v)
            }
            2 => {
                let status = c.u8().map_err(bad)?;
                let n = c.u32().map_err(bad)? as usize;
                if n > c.remaining() / 4 {
                    return Err(RedoError::Malformed("count larger than the record"));
                }
                let xids = (0..n).map(|_| c.u32()).collect::<Result<_, _>>().map_err(bad)?;
                NativeRecord::ClogSetStatus { xids, status }
            }
            3 => NativeRecord::MultiXactOffset { multi: c.u32().map_err(bad)?, offset: c.u32().map_err(bad)? },
            4 => {
                let n = c.u32().map_err(bad)? as usize;
                if n > c.remaining() / 9 {
                    return Err(RedoError::Malformed("count larger than the record"));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push((c.u32().map_err(bad)?, c.u32().map_err(bad)?, c.u8().map_err(bad)?));
                }
                NativeRecord::MultiXactMembers(v)
            }
            5 => NativeRecord::SetPageLsn(c.u64().map_err(bad)?),
            _ => return Err(RedoError::Malformed("unknown tag")),
        };
        if c.remaining() != 0 {
            return Err(RedoError::Malformed("trailing bytes"));
        }
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(r: &NativeRecord) {
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(&NativeRecord::decode(&out).unwrap(), r);
        for cut in 0..out.len() {
            assert!(NativeRecord::decode(&out[..cut]).is_err(), "truncated at {cut} must fail");
        }
    }

    #[test]
    fn clog_status_bits() {
        let mut page = [0u8; BLCKSZ];
        let r = NativeRecord::ClogSetStatus {
            xids: vec![CLOG_XACTS_PER_PAGE + 5, CLOG_XACTS_PER_PAGE + 6],
            status: CLOG_COMMITTED,
        };
        r.apply(&mut page).unwrap();
        // xid 5 in page: byte 1, shift 2; xid 6: byte 1, shift 4.
        assert_eq!(page[1], 0b0001_0100);
        NativeRecord::ClogSetStatus { xids: vec![CLOG_XACTS_PER_PAGE + 5], status: CLOG_ABORTED }
            .apply(&mut page)
            .unwrap();
        assert_eq!(page[1], 0b0001_1000, "status replaced, neighbour kept");
        let mixed = NativeRecord::ClogSetStatus { xids: vec![1, CLOG_XACTS_PER_PAGE], status: CLOG_COMMITTED };
        assert!(mixed.apply(&mut page).is_err());
        roundtrip(&r);
    }

    #[test]
    fn vm_clear_and_multixact_layout() {
        let mut page = [0xffu8; BLCKSZ];
        let r = NativeRecord::ClearVmBits(vec![(HEAPBLOCKS_PER_VM_PAGE + 1, 0x01), (2, 0x03)]);
        r.apply(&mut page).unwrap();
        assert_eq!(page[24], 0b1100_1011);
        roundtrip(&r);

        let mut page = [0u8; BLCKSZ];
        let r = NativeRecord::MultiXactOffset { multi: MULTIXACT_OFFSETS_PER_PAGE + 3, offset: 0x0102_0304 };
        r.apply(&mut page).unwrap();
        assert_eq!(&page[12..16], &[4, 3, 2, 1]);
        roundtrip(&r);

        assert_eq!(MULTIXACT_MEMBERS_PER_PAGE, 1636);
        let r = NativeRecord::MultiXactMembers(vec![(5, 777, 2)]);
        r.apply(&mut page).unwrap();
        // offset 5: group 1 (bytes 20..40), slot 1: flag byte 21, xid at 20+4+4.
        assert_eq!(page[21], 2);
        assert_eq!(&page[28..32], &777u32.to_le_bytes());
        roundtrip(&r);
        assert!(NativeRecord::decode(&[9]).is_err());
        assert!(NativeRecord::decode(&[1, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn a_page_lsn_stamp_sets_pd_lsn_of_an_initialized_page_only() {
        let r = NativeRecord::SetPageLsn(0x0000_0001_2345_6789);
        let mut page = [0u8; BLCKSZ];
        r.apply(&mut page).unwrap();
        assert_eq!(page, [0u8; BLCKSZ], "a page never initialized stays zeros");
        page[12..14].copy_from_slice(&24u16.to_le_bytes()); // pd_lower
        page[14..16].copy_from_slice(&8192u16.to_le_bytes()); // pd_upper
        page[100] = 7;
        let before = page;
        r.apply(&mut page).unwrap();
        // pd_lsn: xlogid (high half) then xrecoff, each little-endian.
        assert_eq!(&page[0..8], &[1, 0, 0, 0, 0x89, 0x67, 0x45, 0x23]);
        assert_eq!(&page[8..], &before[8..], "nothing but pd_lsn changes");
        roundtrip(&r);
    }
}
