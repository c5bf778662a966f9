//! Tenant bootstrap: `initdb` with the installed PostgreSQL, then import of
//! that data directory into a new timeline at its end-of-WAL LSN.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, Oid, RelFileNode};
use strata_formats::v15::control::ControlFile;
use strata_formats::version::{PgVersion, BLCKSZ};
use strata_formats::wal::segment::{list_segments, SegmentReader};
use strata_formats::Lsn;
use strata_protocol::pageserver::SlruKind;
use strata_protocol::{TenantShardId, TimelineId};
use tracing::info;

use crate::dirs;
use crate::ingest::SLRU_PAGES_PER_SEGMENT;
use crate::key::{Key, RelTag};
use crate::layer::map::RecordLsns;
use crate::timeline::{FlushError, StorageError, Timeline, TimelineMetadata, TimelineResources};
use crate::value::Value;

/// Tablespace OIDs of `global/` and `base/`.
pub const GLOBALTABLESPACE_OID: Oid = 1664;
pub const DEFAULTTABLESPACE_OID: Oid = 1663;
use crate::limits::IMPORT_BATCH as BATCH;

/// Why a tenant could not be bootstrapped.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{program} failed ({status}): {stderr}")]
    Initdb { program: PathBuf, status: std::process::ExitStatus, stderr: String },
    #[error("running {program}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    User(#[from] crate::user::UserError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    Flush(#[from] FlushError),
}

fn io(path: &Path, e: std::io::Error) -> ImportError {
    ImportError::Storage(StorageError::Io { op: "reading", path: path.to_path_buf(), source: e })
}

fn invalid(path: &Path, reason: String) -> ImportError {
    ImportError::Invalid { path: path.to_path_buf(), reason }
}

/// What an import found.
pub struct Imported {
    pub system_id: u64,
    pub wal_segment_size: u32,
    /// End of the last checkpoint record: where the timeline's WAL continues.
    pub end_lsn: Lsn,
    pub checkpoint_lsn: Lsn,
}

/// Whose identity (`pg_control`'s system identifier and mock
/// authentication nonce) an imported timeline has.
#[derive(Clone, Copy, Debug)]
pub enum Identity {
    /// The source's: an existing database brought in.
    Source,
    /// One of its own (a data directory shared by many tenants,
    /// `initdb_template`), with the given system identifier if any (the
    /// shards of one tenant share theirs).
    Fresh(Option<u64>),
}

/// How a data directory is imported.
#[derive(Clone, Copy, Debug)]
pub struct ImportAs {
    pub identity: Identity,
    /// The stripe size of a sharded tenant's shard (`docs/sharding.md`).
    pub stripe_blocks: Option<u32>,
}

/// Creates timeline `timeline_id` of `tenant_id` in `dir` from the cleanly
/// shut-down data directory `pgdata`, with the identity `how` says; a
/// shard keeps only its own keys of it.
pub fn import_datadir(
    pgdata: &Path,
    dir: PathBuf,
    tenant_id: TenantShardId,
    timeline_id: TimelineId,
    res: &TimelineResources,
    how: ImportAs,
) -> Result<(Arc<Timeline>, Imported), ImportError> {
    let control_path = pgdata.join("global/pg_control");
    let mut control_bytes = std::fs::read(&control_path).map_err(|e| io(&control_path, e))?;
    let mut control = ControlFile::decode(&control_bytes).map_err(|e| invalid(&control_path, e.to_string()))?;
    if let Identity::Fresh(system_id) = how.identity {
        let now = res.clock.system_now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        fresh_identity(&mut control, now.as_secs());
        if let Some(id) = system_id {
            control.system_identifier = id;
        }
        control_bytes = control.encode();
    }
    let segment_size = u64::from(control.wal_segment_size);
    // The end of the checkpoint record is where new WAL goes.
    let segments = list_segments(&pgdata.join("pg_wal")).map_err(|e| io(&pgdata.join("pg_wal"), e))?;
    let wal_dir = pgdata.join("pg_wal");
    let mut reader =
        SegmentReader::open(&segments, Some(control.checkpoint)).map_err(|e| invalid(&wal_dir, e.to_string()))?;
    let record = reader
        .next_record()
        .map_err(|e| invalid(&wal_dir, e.to_string()))?
        .ok_or_else(|| invalid(&wal_dir, format!("no checkpoint record at {}", control.checkpoint)))?;
    let end_lsn = record.end_lsn;
    let _ = segment_size;
    if control.state == strata_formats::v15::control::DbState::ShutdownedInRecovery
        && control.min_recovery_point != end_lsn
    {
        // Shut down in recovery, a standby's files are consistent at its
        // minimum recovery point. Only where that is the end of the
        // checkpoint record did its shutdown restartpoint write every page
        // replayed, so that the files hold the database at `end_lsn`
        // (what the streaming import makes, `docs/import.md`).
        return Err(invalid(
            &control_path,
            format!(
                "a standby's data directory (shut down in recovery) whose minimum recovery point {} is not the end \
                 {end_lsn} of its checkpoint record {}: promote it, or start it once without standby.signal, and \
                 shut it down cleanly",
                control.min_recovery_point, control.checkpoint
            ),
        ));
    }

    let meta = TimelineMetadata {
        format_version: 1,
        tenant_id,
        timeline_id,
        ancestor_timeline_id: None,
        ancestor_lsn: None,
        pg_version: control.pg_version().major(),
        system_id: control.system_identifier,
        wal_segment_size: control.wal_segment_size,
        start_lsn: end_lsn,
        disk_consistent_lsn: Lsn::INVALID,
        prev_record_lsn: control.checkpoint,
        layers: Vec::new(),
        removed_layers: Vec::new(),
        gc_cutoff_lsn: Lsn::INVALID,
        retain_lsns: Vec::new(),
        stripe_blocks: how.stripe_blocks,
    };
    let tl = Timeline::create(dir, meta, res)?;
    let lsns = RecordLsns { last: end_lsn, prev: control.checkpoint };
    let mut batch = Vec::new();
    let put = |key: Key, value: Value, batch: &mut Vec<(Key, Lsn, Value)>| {
        batch.push((key, end_lsn, value));
        if batch.len() >= BATCH {
            tl.commit_record(std::mem::take(batch), lsns);
        }
    };

    put(Key::control(), Value::Image(Bytes::from(control_bytes.clone())), &mut batch);
    put(Key::checkpoint(), Value::Image(Bytes::copy_from_slice(&control.checkpoint_copy.encode())), &mut batch);

    // Relations of global/ and of each database in base/.
    let mut databases = BTreeSet::new();
    databases.insert((GLOBALTABLESPACE_OID, 0));
    let base = pgdata.join("base");
    for entry in std::fs::read_dir(&base).map_err(|e| io(&base, e))? {
        let entry = entry.map_err(|e| io(&base, e))?;
        if let Ok(db) = entry.file_name().to_string_lossy().parse::<Oid>() {
            databases.insert((DEFAULTTABLESPACE_OID, db));
        }
    }
    let mut pages = 0u64;
    for &(spc, db) in &databases {
        let dbdir = if spc == GLOBALTABLESPACE_OID { pgdata.join("global") } else { base.join(db.to_string()) };
        let mut forks: BTreeMap<RelTag, Vec<(u32, PathBuf)>> = BTreeMap::new();
        for entry in std::fs::read_dir(&dbdir).map_err(|e| io(&dbdir, e))? {
            let entry = entry.map_err(|e| io(&dbdir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "pg_filenode.map" {
                let data = std::fs::read(entry.path()).map_err(|e| io(&entry.path(), e))?;
                put(Key::relmap(spc, db), Value::Image(Bytes::from(data)), &mut batch);
                continue;
            }
            let Some((rel, fork, segno)) = parse_relfile_name(&name) else { continue };
            let tag = RelTag { rel: RelFileNode { spc, db, rel }, fork };
            forks.entry(tag).or_default().push((segno, entry.path()));
        }
        let mut rel_dir = BTreeSet::new();
        for (tag, mut files) in forks {
            if tag.fork == ForkNumber::Fsm {
                // The free space map is a hint and is not served; PostgreSQL rebuilds it.
                continue;
            }
            files.sort();
            let mut block = 0u32;
            for (segno, path) in files {
                if u64::from(segno) * RELSEG_BLOCKS != u64::from(block) {
                    return Err(invalid(&path, format!("segment {segno} follows a relation of {block} blocks")));
                }
                let data = std::fs::read(&path).map_err(|e| io(&path, e))?;
                if data.len() % BLCKSZ != 0 {
                    return Err(invalid(&path, format!("{} bytes is not a whole number of pages", data.len())));
                }
                for page in data.chunks_exact(BLCKSZ) {
                    put(Key::rel_block(tag, block), Value::Image(Bytes::copy_from_slice(page)), &mut batch);
                    block += 1;
                    pages += 1;
                }
            }
            rel_dir.insert((tag.rel.rel, tag.fork as u8));
            put(Key::rel_size(tag), Value::Image(Bytes::copy_from_slice(&block.to_le_bytes())), &mut batch);
        }
        put(Key::rel_dir(spc, db), Value::Image(Bytes::from(dirs::encode_rels(&rel_dir))), &mut batch);
    }
    put(Key::db_dir(), Value::Image(Bytes::from(dirs::encode_pairs(&databases))), &mut batch);

    for (kind, sub) in [
        (SlruKind::Clog, "pg_xact"),
        (SlruKind::MultiXactOffsets, "pg_multixact/offsets"),
        (SlruKind::MultiXactMembers, "pg_multixact/members"),
    ] {
        let dir = pgdata.join(sub);
        let mut segs = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
            let entry = entry.map_err(|e| io(&dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(segno) = u32::from_str_radix(&name, 16) else { continue };
            let data = std::fs::read(entry.path()).map_err(|e| io(&entry.path(), e))?;
            if data.len() % BLCKSZ != 0 || data.len() > BLCKSZ * SLRU_PAGES_PER_SEGMENT as usize {
                return Err(invalid(&entry.path(), format!("{} bytes is not an SLRU segment", data.len())));
            }
            for (i, page) in data.chunks_exact(BLCKSZ).enumerate() {
                let pageno = segno * SLRU_PAGES_PER_SEGMENT + i as u32;
                put(Key::slru_page(kind, pageno), Value::Image(Bytes::copy_from_slice(page)), &mut batch);
            }
            segs.insert(segno);
        }
        put(Key::slru_dir(kind), Value::Image(Bytes::from(dirs::encode_u32s(&segs))), &mut batch);
    }

    let twophase_dir = pgdata.join("pg_twophase");
    let mut xids = BTreeSet::new();
    for entry in std::fs::read_dir(&twophase_dir).map_err(|e| io(&twophase_dir, e))? {
        let entry = entry.map_err(|e| io(&twophase_dir, e))?;
        let Ok(xid) = u32::from_str_radix(&entry.file_name().to_string_lossy(), 16) else { continue };
        let data = std::fs::read(entry.path()).map_err(|e| io(&entry.path(), e))?;
        put(Key::twophase_file(xid), Value::Image(Bytes::from(data)), &mut batch);
        xids.insert(xid);
    }
    put(Key::twophase_dir(), Value::Image(Bytes::from(dirs::encode_u32s(&xids))), &mut batch);
    tl.commit_record(batch, lsns);
    tl.checkpoint()?;
    info!(%tenant_id, %timeline_id, %end_lsn, pages, "imported a data directory");
    Ok((
        tl,
        Imported {
            system_id: control.system_identifier,
            wal_segment_size: control.wal_segment_size,
            end_lsn,
            checkpoint_lsn: control.checkpoint,
        },
    ))
}

/// Checks that `pgdata` is a data directory a tenant can be made of: a
/// `pg_control` of a major a tenant can have, left by a clean shutdown of a
/// primary (so that no WAL is needed to make its files consistent), of
/// PostgreSQL's page and WAL block size, and without tablespaces. Returns
/// its major.
pub fn check_importable(pgdata: &Path) -> Result<PgVersion, ImportError> {
    use strata_formats::v15::control::DbState;
    let control_path = pgdata.join("global/pg_control");
    let bytes = std::fs::read(&control_path).map_err(|e| io(&control_path, e))?;
    let control = ControlFile::decode(&bytes).map_err(|e| invalid(&control_path, e.to_string()))?;
    let version = control.pg_version();
    if version == PgVersion::V16 {
        return Err(invalid(
            &control_path,
            "PostgreSQL 16 is not a major a tenant can have (docs/postgres-versions.md)".into(),
        ));
    }
    match control.state {
        DbState::Shutdowned => {}
        // A standby's directory is imported only where it stopped right
        // after a restartpoint at its last record; `import_datadir` checks
        // that against the WAL.
        DbState::ShutdownedInRecovery => {}
        other => {
            return Err(invalid(
                &control_path,
                format!("not shut down cleanly (state {other:?}): start PostgreSQL on it and stop it with pg_ctl stop"),
            ))
        }
    }
    if control.block_size as usize != BLCKSZ || control.wal_block_size as usize != BLCKSZ {
        return Err(invalid(
            &control_path,
            format!(
                "block size {} and WAL block size {}: only {BLCKSZ} is served",
                control.block_size, control.wal_block_size
            ),
        ));
    }
    let tablespaces = pgdata.join("pg_tblspc");
    if let Ok(mut entries) = std::fs::read_dir(&tablespaces) {
        if let Some(entry) = entries.next() {
            let name = entry.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default();
            return Err(invalid(&tablespaces, format!("tablespace {name}: tablespaces are not imported")));
        }
    }
    Ok(version)
}

/// A new tenant's `pg_control`: the template's with a system identifier and
/// mock authentication nonce of its own.
pub fn fresh_identity(control: &mut ControlFile, now_secs: u64) {
    // PostgreSQL's own choice is seconds in the high half and microseconds
    // and a pid below; random bits below serve uniqueness better.
    control.system_identifier = (now_secs << 32) | (random_u64() & 0xffff_ffff);
    let mut nonce = [0u8; 32];
    fill_random(&mut nonce);
    control.set_mock_authentication_nonce(nonce);
}

fn fill_random(out: &mut [u8]) {
    getrandom::fill(out).expect("the OS random source works");
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    u64::from_le_bytes(b)
}

/// Blocks per 1 GiB relation segment file.
pub const RELSEG_BLOCKS: u64 = (1 << 30) / BLCKSZ as u64;

/// Parses `<relfilenode>[_fsm|_vm|_init][.<segno>]`.
pub fn parse_relfile_name(name: &str) -> Option<(Oid, ForkNumber, u32)> {
    let (stem, segno) = match name.split_once('.') {
        Some((stem, seg)) => (stem, seg.parse().ok()?),
        None => (name, 0),
    };
    let (rel, fork) = match stem.split_once('_') {
        Some((rel, "fsm")) => (rel, ForkNumber::Fsm),
        Some((rel, "vm")) => (rel, ForkNumber::VisibilityMap),
        Some((rel, "init")) => (rel, ForkNumber::Init),
        Some(_) => return None,
        None => (stem, ForkNumber::Main),
    };
    if rel.is_empty() || !rel.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((rel.parse().ok()?, fork, segno))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relation_file_names() {
        assert_eq!(parse_relfile_name("16384"), Some((16384, ForkNumber::Main, 0)));
        assert_eq!(parse_relfile_name("16384_vm"), Some((16384, ForkNumber::VisibilityMap, 0)));
        assert_eq!(parse_relfile_name("16384_init.2"), Some((16384, ForkNumber::Init, 2)));
        assert_eq!(parse_relfile_name("pg_filenode.map"), None);
        assert_eq!(parse_relfile_name("PG_VERSION"), None);
        assert_eq!(parse_relfile_name("123_xx"), None);
        assert_eq!(parse_relfile_name("99999999999"), None);
    }
}
