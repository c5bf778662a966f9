//! Starting an unmodified PostgreSQL at any LSN without recovery: a generated
//! WAL segment holding a real shutdown checkpoint record at that LSN, and a
//! `pg_control` pointing at it.

use crate::lsn::Lsn;
use crate::v15::control::ControlFile;
use crate::v15::records::xlog::CheckPoint;
use crate::v15::rmgr::{RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN};
use crate::version::PgVersion;
use crate::wal::encode::{encode_record, WalBuilder};

/// The files that make a data directory start at a given LSN.
pub struct ShutdownCheckpoint {
    /// LSN of the generated checkpoint record (also its redo pointer).
    pub checkpoint_lsn: Lsn,
    /// Where the server will write its next record.
    pub end_lsn: Lsn,
    pub checkpoint: CheckPoint,
    /// The new `global/pg_control` (8 KiB).
    pub control_file: Vec<u8>,
    /// Full-size segment files for `pg_wal/`, by name.
    pub segments: Vec<(String, Vec<u8>)>,
}

/// Generates a shutdown checkpoint at `at` (the end of the WAL: the record
/// goes there, or just after the page header if `at` is a page boundary).
/// `prev` is the LSN of the last record before it; `state` holds the
/// counters as of `at`; `template` supplies the cluster's fixed settings.
pub fn shutdown_checkpoint_at(
    template: &ControlFile,
    state: &CheckPoint,
    at: Lsn,
    prev: Lsn,
    time: i64,
) -> ShutdownCheckpoint {
    let segment_size = template.wal_segment_size as u64;
    let mut builder =
        WalBuilder::new(PgVersion::V15, template.system_identifier, state.this_timeline, segment_size, at, prev);
    let mut checkpoint = *state;
    checkpoint.time = time;
    // No transaction is running at a shutdown checkpoint.
    checkpoint.oldest_active_xid = 0;
    let checkpoint_lsn = builder.append_with(|lsn, prev| {
        checkpoint.redo = lsn;
        encode_record(RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN, 0, prev, &checkpoint.encode())
    });
    let mut control = template.clone();
    control.set_shutdown_checkpoint(checkpoint_lsn, checkpoint);
    ShutdownCheckpoint {
        checkpoint_lsn,
        end_lsn: builder.end_lsn(),
        checkpoint,
        control_file: control.encode(),
        segments: builder.into_segments(),
    }
}
