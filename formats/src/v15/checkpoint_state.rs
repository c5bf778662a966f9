//! Tracking, from the WAL alone, the counters a checkpoint record must carry
//! (next XID, next OID, next multixact and its offset, oldest XID/multi) so
//! that a checkpoint can be written at any LSN (see `startup`).
//!
//! The rules follow what PostgreSQL's own redo does with the same records, so
//! the result is what a server recovering to that LSN would use.

use crate::types::TransactionId;
use crate::v15::records::slru::MultiXactRecord;
use crate::v15::records::xact::XactRecord;
use crate::v15::records::xlog::{CheckPoint, XlogRecord};
use crate::v15::records::ParsedRecord;
use crate::wal::record::DecodedRecord;

/// First XID that is not special (invalid, bootstrap, frozen).
pub const FIRST_NORMAL_XID: TransactionId = 3;
/// First valid multixact id (0 is invalid).
const FIRST_MULTI_ID: u32 = 1;

/// `a` is logically after `b` in the 32-bit XID circle.
fn xid_follows(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The checkpoint state as of the last record applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointState {
    pub checkpoint: CheckPoint,
}

impl CheckpointState {
    /// Starts from a checkpoint (from a checkpoint record or `pg_control`).
    pub fn new(checkpoint: CheckPoint) -> CheckpointState {
        CheckpointState { checkpoint }
    }

    /// Moves the next XID past `xid` if `xid` is at or after it.
    pub fn observe_xid(&mut self, xid: TransactionId) {
        if xid < FIRST_NORMAL_XID {
            return;
        }
        let next = self.checkpoint.next_full_xid;
        let next32 = next as u32;
        if xid != next32 && !xid_follows(xid, next32) {
            return;
        }
        // Same epoch unless the 32-bit counter wrapped between next and xid.
        let epoch = (next >> 32) + u64::from(xid < next32);
        let mut new_next = (epoch << 32 | u64::from(xid)) + 1;
        if (new_next as u32) < FIRST_NORMAL_XID {
            new_next = (new_next & !0xffff_ffff) | u64::from(FIRST_NORMAL_XID);
        }
        self.checkpoint.next_full_xid = new_next;
    }

    /// Applies one record (with its parsed form, if any).
    pub fn apply(&mut self, record: &DecodedRecord, parsed: Option<&ParsedRecord>) {
        self.observe_xids(record.header.xid, record.toplevel_xid);
        let Some(parsed) = parsed else { return };
        match parsed {
            ParsedRecord::Xact(XactRecord::Finish(finish)) => {
                for sub in &finish.subxacts {
                    self.observe_xid(*sub);
                }
                if let Some(xid) = finish.twophase_xid {
                    self.observe_xid(xid);
                }
            }
            ParsedRecord::Xact(XactRecord::Assignment { top_xid, subxacts }) => {
                self.observe_xid(*top_xid);
                for sub in subxacts {
                    self.observe_xid(*sub);
                }
            }
            ParsedRecord::Xact(XactRecord::Prepare(prepare)) => self.observe_xid(prepare.xid),
            ParsedRecord::Xlog(XlogRecord::NextOid(oid)) => self.checkpoint.next_oid = *oid,
            ParsedRecord::Xlog(XlogRecord::Checkpoint { shutdown, checkpoint }) => {
                self.apply_checkpoint(*shutdown, checkpoint)
            }
            ParsedRecord::MultiXact(MultiXactRecord::Create { multi, offset, members }) => {
                let mut next = multi.wrapping_add(1);
                if next < FIRST_MULTI_ID {
                    next = FIRST_MULTI_ID;
                }
                if xid_follows(next, self.checkpoint.next_multi) {
                    self.checkpoint.next_multi = next;
                }
                let next_offset = offset.wrapping_add(members.len() as u32);
                if xid_follows(next_offset, self.checkpoint.next_multi_offset) {
                    self.checkpoint.next_multi_offset = next_offset;
                }
                for m in members {
                    self.observe_xid(m.xid);
                }
            }
            ParsedRecord::MultiXact(MultiXactRecord::Truncate { oldest_multi_db, end_offsets, .. }) => {
                self.checkpoint.oldest_multi = *end_offsets;
                self.checkpoint.oldest_multi_db = *oldest_multi_db;
            }
            _ => {}
        }
    }

    /// What a record's header says of the transaction counters: its
    /// transaction id and, for a subtransaction's first record, its top's.
    pub fn observe_xids(&mut self, xid: TransactionId, toplevel: Option<TransactionId>) {
        self.observe_xid(xid);
        if let Some(top) = toplevel {
            self.observe_xid(top);
        }
    }

    fn apply_checkpoint(&mut self, shutdown: bool, record: &CheckPoint) {
        let cp = &mut self.checkpoint;
        if shutdown {
            // A shutdown checkpoint states the exact counters.
            cp.next_full_xid = record.next_full_xid;
            cp.next_oid = record.next_oid;
            cp.next_multi = record.next_multi;
            cp.next_multi_offset = record.next_multi_offset;
        } else {
            // An online checkpoint's counters were read before WAL that
            // precedes it in the stream: only move forward.
            if record.next_full_xid > cp.next_full_xid {
                cp.next_full_xid = record.next_full_xid;
            }
            if xid_follows(record.next_multi, cp.next_multi) {
                cp.next_multi = record.next_multi;
            }
            if xid_follows(record.next_multi_offset, cp.next_multi_offset) {
                cp.next_multi_offset = record.next_multi_offset;
            }
        }
        if xid_follows(record.oldest_xid, cp.oldest_xid) || shutdown {
            cp.oldest_xid = record.oldest_xid;
            cp.oldest_xid_db = record.oldest_xid_db;
        }
        if xid_follows(record.oldest_multi, cp.oldest_multi) || shutdown {
            cp.oldest_multi = record.oldest_multi;
            cp.oldest_multi_db = record.oldest_multi_db;
        }
        cp.this_timeline = record.this_timeline;
        cp.prev_timeline = record.prev_timeline;
        cp.full_page_writes = record.full_page_writes;
        cp.oldest_commit_ts_xid = record.oldest_commit_ts_xid;
        cp.newest_commit_ts_xid = record.newest_commit_ts_xid;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;

    fn checkpoint(next_full_xid: u64) -> CheckPoint {
        CheckPoint {
            redo: Lsn(0),
            this_timeline: 1,
            prev_timeline: 1,
            full_page_writes: true,
            wal_level: 0,
            next_full_xid,
            next_oid: 16384,
            next_multi: 1,
            next_multi_offset: 0,
            oldest_xid: 716,
            oldest_xid_db: 1,
            oldest_multi: 1,
            oldest_multi_db: 1,
            time: 0,
            oldest_commit_ts_xid: 0,
            newest_commit_ts_xid: 0,
            oldest_active_xid: 0,
        }
    }

    #[test]
    fn next_xid_advances_and_wraps_epoch() {
        let mut s = CheckpointState::new(checkpoint(1000));
        s.observe_xid(999);
        assert_eq!(s.checkpoint.next_full_xid, 1000, "older xids do not move it back");
        s.observe_xid(1000);
        assert_eq!(s.checkpoint.next_full_xid, 1001);
        s.observe_xid(2);
        assert_eq!(s.checkpoint.next_full_xid, 1001, "special xids are ignored");

        let mut s = CheckpointState::new(checkpoint(0xffff_fff0));
        s.observe_xid(0xffff_ffff);
        assert_eq!(s.checkpoint.next_full_xid, (1 << 32) | 3, "wraps to the next epoch, skipping special xids");
        s.observe_xid(5);
        assert_eq!(s.checkpoint.next_full_xid, (1 << 32) | 6);
    }
}
