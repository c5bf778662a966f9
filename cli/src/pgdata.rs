//! `strata wal reset-to-end`: make a cleanly stopped data directory start at
//! the end of its WAL from a checkpoint that Strata generated (the same
//! mechanism a basebackup at an arbitrary LSN uses).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use strata_formats::v15::checkpoint_state::CheckpointState;
use strata_formats::v15::control::{ControlFile, DbState};
use strata_formats::v15::records::xlog::XlogRecord;
use strata_formats::v15::records::{self, ParsedRecord};
use strata_formats::v15::startup::shutdown_checkpoint_at;
use strata_formats::wal::segment::{list_segments, SegmentReader};
use strata_formats::Lsn;
use strata_service::durable::replace_file;

/// Copies the owner of `reference` to `path` (the server must own its files).
fn same_owner(path: &Path, reference: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(reference)?;
    std::os::unix::fs::chown(path, Some(meta.uid()), Some(meta.gid()))
        .with_context(|| format!("chown {}", path.display()))
}

/// With `fresh_wal`, every old segment is removed and the generated segment
/// holds nothing before the checkpoint (as in a basebackup); otherwise WAL
/// before the end is kept byte for byte and only what follows it is replaced.
pub fn reset_to_end(pgdata: &Path, fresh_wal: bool) -> anyhow::Result<serde_json::Value> {
    if pgdata.join("postmaster.pid").exists() {
        bail!("{}: postmaster.pid exists; stop the server first", pgdata.display());
    }
    let control_path = pgdata.join("global/pg_control");
    let control_bytes = fs::read(&control_path).with_context(|| format!("reading {}", control_path.display()))?;
    let control = ControlFile::decode(&control_bytes).with_context(|| control_path.display().to_string())?;
    if !matches!(control.state, DbState::Shutdowned | DbState::ShutdownedInRecovery) {
        bail!(
            "{}: the server was not shut down cleanly (state {:?}); its data files may be behind its WAL",
            pgdata.display(),
            control.state
        );
    }

    // Follow the WAL from the last checkpoint, as recovery would; the
    // counters start from that checkpoint.
    let waldir = pgdata.join("pg_wal");
    let files = list_segments(&waldir).with_context(|| format!("listing {}", waldir.display()))?;
    if files.is_empty() {
        bail!("{}: no WAL segments", waldir.display());
    }
    let mut reader = SegmentReader::open(&files, Some(control.checkpoint))?;
    let mut state: Option<CheckpointState> = None;
    let mut last: Option<(Lsn, Lsn)> = None;
    let mut records = 0u64;
    while let Some(record) = reader.next_record()? {
        records += 1;
        let parsed = records::parse(&record).with_context(|| format!("record at {}", record.lsn))?;
        match (&mut state, &parsed) {
            (Some(s), _) => s.apply(&record, parsed.as_ref()),
            (None, Some(ParsedRecord::Xlog(XlogRecord::Checkpoint { checkpoint, .. }))) => {
                state = Some(CheckpointState::new(*checkpoint));
            }
            (None, _) => bail!("the record at {} named by pg_control is not a checkpoint", record.lsn),
        }
        last = Some((record.lsn, record.end_lsn));
    }
    let state = state.context("no checkpoint record in the WAL")?;
    let (last_lsn, end_of_wal) = last.context("no records in the WAL")?;
    if last_lsn != control.checkpoint {
        bail!(
            "the last WAL record ({last_lsn}) is not the checkpoint in pg_control ({}); WAL was written after the clean shutdown",
            control.checkpoint
        );
    }

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let generated = shutdown_checkpoint_at(&control, &state.checkpoint, end_of_wal, last_lsn, now);

    let segment_size = u64::from(control.wal_segment_size);
    let end_segment = end_of_wal.segment_number(segment_size);
    let mut old_prefix: Option<(String, Vec<u8>)> = None;
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let segno = strata_formats::wal::segment::SegmentName::parse(&name, segment_size).map(|n| n.segment_number);
        if !fresh_wal && segno == Some(end_segment) {
            let mut bytes = fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            bytes.truncate(end_of_wal.segment_offset(segment_size) as usize);
            old_prefix = Some((name, bytes));
        }
        if fresh_wal || segno.is_none_or(|n| n >= end_segment) {
            fs::remove_file(f).with_context(|| format!("removing {}", f.display()))?;
        }
    }
    let mut written: Vec<PathBuf> = Vec::new();
    for (name, bytes) in &generated.segments {
        let path = waldir.join(name);
        let mut bytes = bytes.clone();
        if let Some((old_name, prefix)) = &old_prefix {
            if old_name.trim_end_matches(".partial") == name {
                bytes[..prefix.len()].copy_from_slice(prefix);
            }
        }
        replace_file(&path, &bytes, true)?;
        same_owner(&path, &control_path)?;
        written.push(path);
    }
    replace_file(&control_path, &generated.control_file, true)?;
    same_owner(&control_path, &pgdata.join("PG_VERSION"))?;

    Ok(serde_json::json!({
        "records_read": records,
        "previous_checkpoint": control.checkpoint,
        "end_of_wal": end_of_wal,
        "checkpoint_lsn": generated.checkpoint_lsn,
        "next_record_lsn": generated.end_lsn,
        "checkpoint": generated.checkpoint,
        "previous_checkpoint_values": control.checkpoint_copy,
        "segments": written,
        "kept_old_wal": !fresh_wal,
    }))
}
