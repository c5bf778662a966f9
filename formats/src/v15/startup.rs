//! Starting an unmodified PostgreSQL at any LSN without recovery: a generated
//! WAL segment holding a real shutdown checkpoint record at that LSN, and a
//! `pg_control` pointing at it. And starting one as a hot standby from a
//! checkpoint record already in the WAL ([`standby_start`]).

use crate::lsn::Lsn;
use crate::v15::control::{ControlFile, DbState};
use crate::v15::records::xlog::CheckPoint;
use crate::v15::rmgr::{RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN};
use crate::wal::encode::{encode_record, WalBuilder};
use crate::wal::segment::SegmentName;

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
        WalBuilder::new(template.pg_version(), template.system_identifier, state.this_timeline, segment_size, at, prev);
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

/// The files that make a data directory start as a hot standby from a
/// checkpoint record of the WAL (`docs/replicas.md`, "Where a replica
/// starts"): a `backup_label` naming the record and its redo point, as a
/// base backup taken from a standby has, and a `pg_control` in archive
/// recovery whose minimum recovery point is the record's end. PostgreSQL
/// replays from the redo point and takes read-only queries once replay has
/// passed the record (and the running-transactions record before it).
pub struct StandbyStart {
    /// The new `global/pg_control` (8 KiB).
    pub control_file: Vec<u8>,
    /// The `backup_label` file.
    pub backup_label: String,
}

/// Generates the start of a standby from the checkpoint record at
/// `checkpoint_lsn` (its contents `checkpoint`; the next record at
/// `end_lsn`). `start_time` is printed in the label as PostgreSQL prints
/// times (`YYYY-MM-DD HH:MM:SS UTC`).
pub fn standby_start(
    template: &ControlFile,
    checkpoint_lsn: Lsn,
    end_lsn: Lsn,
    checkpoint: &CheckPoint,
    start_time: &str,
) -> StandbyStart {
    debug_assert!(checkpoint.redo <= checkpoint_lsn && checkpoint_lsn < end_lsn);
    let segment_size = u64::from(template.wal_segment_size);
    let redo_segment =
        SegmentName { timeline: checkpoint.this_timeline, segment_number: checkpoint.redo.0 / segment_size };
    let mut control = template.clone();
    control.state = DbState::InArchiveRecovery;
    control.time = checkpoint.time;
    control.checkpoint = checkpoint_lsn;
    control.checkpoint_copy = *checkpoint;
    // With "BACKUP FROM: standby", the end of the backup is the minimum
    // recovery point: consistency comes once replay has passed the record.
    control.min_recovery_point = end_lsn;
    control.min_recovery_point_tli = checkpoint.this_timeline;
    control.backup_start_point = Lsn::INVALID;
    control.backup_end_point = Lsn::INVALID;
    control.backup_end_required = false;
    let backup_label = format!(
        "START WAL LOCATION: {} (file {})\nCHECKPOINT LOCATION: {}\nBACKUP METHOD: streamed\nBACKUP FROM: standby\n\
         START TIME: {start_time}\nLABEL: strata replica\nSTART TIMELINE: {}\n",
        checkpoint.redo,
        redo_segment.file_name(segment_size),
        checkpoint_lsn,
        checkpoint.this_timeline,
    );
    StandbyStart { control_file: control.encode(), backup_label }
}
