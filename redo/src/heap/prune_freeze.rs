//! Heap2's merged prune and freeze record of PostgreSQL 17 on
//! (`XLOG_HEAP2_PRUNE_ON_ACCESS`, `_VACUUM_SCAN`, `_VACUUM_CLEANUP`: one
//! layout, `xl_heap_prune` in `access/heapam_xlog.h`), which replaced 15's
//! separate prune, vacuum and freeze records.
//!
//! Main data: `reason` and `flags` bytes, then the conflict horizon xid
//! (unaligned) when `XLHP_HAS_CONFLICT_HORIZON`. Block 0's data holds the
//! optional parts in the order of their flags: freeze plans (a 2-byte count
//! padded to 4, then 12-byte plans), redirected pairs, dead offsets and
//! unused offsets (each a 2-byte count then the offsets), and last the
//! offsets of the frozen tuples, as many as the plans add up to.

use strata_formats::types::{Cursor, TransactionId};

use super::records::truncated;
use crate::RedoError;

/// The record needs a cleanup lock: it may move tuple data (pruning), so
/// redo repairs fragmentation; without it only line pointers change.
pub const XLHP_CLEANUP_LOCK: u8 = 1 << 2;
/// The conflict horizon xid follows the two bytes of main data.
pub const XLHP_HAS_CONFLICT_HORIZON: u8 = 1 << 3;
/// Freeze plans and frozen offsets are in block 0's data.
pub const XLHP_HAS_FREEZE_PLANS: u8 = 1 << 4;
/// Redirected (from, to) pairs are in block 0's data.
pub const XLHP_HAS_REDIRECTIONS: u8 = 1 << 5;
/// Offsets that become dead are in block 0's data.
pub const XLHP_HAS_DEAD_ITEMS: u8 = 1 << 6;
/// Offsets that become unused are in block 0's data.
pub const XLHP_HAS_NOW_UNUSED_ITEMS: u8 = 1 << 7;

/// The record's main data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PruneFreeze {
    pub reason: u8,
    pub flags: u8,
    pub conflict_horizon: Option<TransactionId>,
}

impl PruneFreeze {
    /// Decodes the record's main data.
    pub fn decode(data: &[u8]) -> Result<PruneFreeze, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_prune");
        let reason = c.u8().map_err(&f)?;
        let flags = c.u8().map_err(&f)?;
        let conflict_horizon = if flags & XLHP_HAS_CONFLICT_HORIZON != 0 { Some(c.u32().map_err(&f)?) } else { None };
        Ok(PruneFreeze { reason, flags, conflict_horizon })
    }

    /// Whether redo repairs fragmentation (pruning) rather than only
    /// truncating the line pointer array.
    pub fn cleanup_lock(&self) -> bool {
        self.flags & XLHP_CLEANUP_LOCK != 0
    }
}

/// `xlhp_freeze_plan`: new header values for a group of tuples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreezePlan {
    pub xmax: TransactionId,
    pub t_infomask2: u16,
    pub t_infomask: u16,
    pub frzflags: u8,
    pub ntuples: u16,
}

impl FreezePlan {
    /// Array stride: xid, two masks, flags, a pad byte, the count.
    const SIZE: usize = 12;
}

/// Block 0's data: what changes on the heap page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneFreezeData {
    /// Each plan with the offsets of the tuples it freezes.
    pub frozen: Vec<(FreezePlan, Vec<u16>)>,
    /// (from, to) pairs: `from` becomes a redirect to `to`.
    pub redirected: Vec<(u16, u16)>,
    pub dead: Vec<u16>,
    pub unused: Vec<u16>,
}

impl PruneFreezeData {
    /// Decodes block 0's data as `flags` announce it; every byte must be used.
    pub fn decode(flags: u8, data: &[u8]) -> Result<PruneFreezeData, RedoError> {
        let mut c = Cursor::new(data);
        let f = truncated("xl_heap_prune block data");
        let mut out = PruneFreezeData::default();
        let mut plans = Vec::new();
        if flags & XLHP_HAS_FREEZE_PLANS != 0 {
            let n = c.u16().map_err(&f)?;
            c.skip(2).map_err(&f)?; // the plans are 4-byte aligned
            if n == 0 || usize::from(n) * FreezePlan::SIZE > c.remaining() {
                return Err(RedoError::BadRecord(format!("{n} freeze plans in {} bytes", c.remaining())));
            }
            for _ in 0..n {
                let plan = FreezePlan {
                    xmax: c.u32().map_err(&f)?,
                    t_infomask2: c.u16().map_err(&f)?,
                    t_infomask: c.u16().map_err(&f)?,
                    frzflags: c.u8().map_err(&f)?,
                    ntuples: {
                        c.skip(1).map_err(&f)?;
                        c.u16().map_err(&f)?
                    },
                };
                plans.push(plan);
            }
        }
        if flags & XLHP_HAS_REDIRECTIONS != 0 {
            let pairs = counted(&mut c, 2)?;
            out.redirected = pairs.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        }
        if flags & XLHP_HAS_DEAD_ITEMS != 0 {
            out.dead = counted(&mut c, 1)?;
        }
        if flags & XLHP_HAS_NOW_UNUSED_ITEMS != 0 {
            out.unused = counted(&mut c, 1)?;
        }
        for plan in plans {
            let offsets = (0..plan.ntuples).map(|_| c.u16().map_err(&f)).collect::<Result<Vec<_>, _>>()?;
            out.frozen.push((plan, offsets));
        }
        if c.remaining() != 0 {
            return Err(RedoError::BadRecord(format!("{} bytes left after the prune and freeze data", c.remaining())));
        }
        Ok(out)
    }

    /// Whether any line pointer changes (otherwise the record only freezes).
    pub fn prunes(&self) -> bool {
        !self.redirected.is_empty() || !self.dead.is_empty() || !self.unused.is_empty()
    }
}

/// An `xlhp_prune_items` sub-record: a non-zero count, then `count * per`
/// offsets.
fn counted(c: &mut Cursor<'_>, per: usize) -> Result<Vec<u16>, RedoError> {
    let f = truncated("xlhp_prune_items");
    let n = usize::from(c.u16().map_err(&f)?);
    if n == 0 || n * per * 2 > c.remaining() {
        return Err(RedoError::BadRecord(format!("{n} prune items in {} bytes", c.remaining())));
    }
    (0..n * per).map(|_| c.u16().map_err(&f)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16s(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn every_part_in_flag_order() {
        let mut data = u16s(&[1, 0]); // one plan, padding
        data.extend_from_slice(&900u32.to_le_bytes());
        data.extend_from_slice(&u16s(&[0x0802, 0x0B00]));
        data.extend_from_slice(&[0x02, 0]);
        data.extend_from_slice(&u16s(&[2])); // two tuples
        data.extend_from_slice(&u16s(&[1, 2, 4])); // one redirect: 2 -> 4
        data.extend_from_slice(&u16s(&[1, 3])); // dead: 3
        data.extend_from_slice(&u16s(&[2, 5, 6])); // unused: 5, 6
        data.extend_from_slice(&u16s(&[7, 8])); // frozen
        let flags = XLHP_HAS_FREEZE_PLANS | XLHP_HAS_REDIRECTIONS | XLHP_HAS_DEAD_ITEMS | XLHP_HAS_NOW_UNUSED_ITEMS;
        let d = PruneFreezeData::decode(flags, &data).unwrap();
        let plan = FreezePlan { xmax: 900, t_infomask2: 0x0802, t_infomask: 0x0B00, frzflags: 2, ntuples: 2 };
        assert_eq!(d.frozen, vec![(plan, vec![7, 8])]);
        assert_eq!((d.redirected.clone(), d.dead.clone(), d.unused.clone()), (vec![(2, 4)], vec![3], vec![5, 6]));
        assert!(d.prunes());
        // One byte short, one byte over, a part its flag does not announce.
        assert!(PruneFreezeData::decode(flags, &data[..data.len() - 1]).is_err());
        assert!(PruneFreezeData::decode(flags, &[&data[..], &[0]].concat()).is_err());
        assert!(PruneFreezeData::decode(flags & !XLHP_HAS_DEAD_ITEMS, &data).is_err());
    }

    #[test]
    fn main_data_with_and_without_a_conflict_horizon() {
        let p = PruneFreeze::decode(&[1, XLHP_CLEANUP_LOCK | XLHP_HAS_CONFLICT_HORIZON, 7, 0, 0, 0]).unwrap();
        assert_eq!((p.reason, p.conflict_horizon, p.cleanup_lock()), (1, Some(7), true));
        let p = PruneFreeze::decode(&[2, 0]).unwrap();
        assert_eq!((p.conflict_horizon, p.cleanup_lock()), (None, false));
        assert!(PruneFreeze::decode(&[2, XLHP_HAS_CONFLICT_HORIZON, 7]).is_err());
        assert!(PruneFreeze::decode(&[2]).is_err());
        assert!(PruneFreezeData::decode(XLHP_HAS_DEAD_ITEMS, &u16s(&[0])).is_err(), "a count of zero");
    }
}
