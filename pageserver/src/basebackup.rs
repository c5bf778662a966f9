//! Basebackup@LSN: a tar stream of a data directory that a stock
//! PostgreSQL 15 starts from without recovery (D5): every non-relation file,
//! a generated `pg_control` and a WAL segment holding a shutdown checkpoint
//! at the LSN, unlogged relations' init forks also as their main forks, and
//! every relation's data ([`RelationData::All`]), none of it, or a manifest
//! of the relation forks a lazy compute reads from the pageserver
//! ([`RelationData::Manifest`], `docs/lazy-compute.md`). For a hot standby
//! the data is at a checkpoint record's redo point, with a `backup_label`
//! naming the record instead of a generated checkpoint (`docs/replicas.md`).
//!
//! The free space map is left out: it is a hint that is not WAL-logged, and
//! PostgreSQL treats a missing one as empty and rebuilds it.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::v15::startup::{shutdown_checkpoint_at, standby_start};
use strata_formats::version::BLCKSZ;
use strata_formats::wal::encode::headers_before;
use strata_formats::Lsn;
use strata_protocol::lazy_manifest::{Manifest, ManifestEntry, ManifestFork, MANIFEST_NAME};
use strata_protocol::pageserver::SlruKind;

use crate::checkpoint_record::CheckpointRecord;
use crate::import::{GLOBALTABLESPACE_OID, RELSEG_BLOCKS};
use crate::ingest::SLRU_PAGES_PER_SEGMENT;
use crate::key::{Key, RelTag};
use crate::timeline::{ReadError, Timeline};

/// Directories PostgreSQL 15 expects in a data directory.
const EMPTY_DIRS: &[&str] = &[
    "pg_commit_ts",
    "pg_dynshmem",
    "pg_logical",
    "pg_logical/mappings",
    "pg_logical/snapshots",
    "pg_notify",
    "pg_replslot",
    "pg_serial",
    "pg_snapshots",
    "pg_stat",
    "pg_stat_tmp",
    "pg_subtrans",
    "pg_tblspc",
    "pg_wal/archive_status",
];
use crate::limits::BASEBACKUP_READ_BATCH as READ_BATCH;

/// Why a basebackup could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum BasebackupError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{0}")]
    Lsn(String),
    #[error("writing the tar stream: {0}")]
    Io(#[from] std::io::Error),
}

/// What a basebackup carries of the relations that are WAL-logged
/// (unlogged relations' init forks are always in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelationData {
    /// Every page: an eager compute.
    All,
    /// None.
    Nothing,
    /// None, and the manifest of their forks and sizes: a lazy compute.
    Manifest,
}

/// Writes the basebackup of `tl` at `lsn` to `out`: the end of the last
/// ingested record for a compute that writes, any ingested LSN for a
/// read-only one (whose shutdown checkpoint names no previous record), or
/// the redo point of `standby`'s checkpoint record for a hot standby.
pub fn write_basebackup<W: Write>(
    tl: &Timeline,
    lsn: Lsn,
    relations: RelationData,
    standby: Option<&CheckpointRecord>,
    out: W,
) -> Result<(), BasebackupError> {
    let lsns = tl.record_lsns();
    if lsn > lsns.last {
        return Err(BasebackupError::Lsn(format!("the WAL is ingested up to {}; {lsn} is beyond it", lsns.last)));
    }
    if let Some(r) = standby {
        if lsn != r.checkpoint.redo || r.end_lsn > lsns.last {
            return Err(BasebackupError::Lsn(format!(
                "a standby starts at the redo point {} of the checkpoint record at {} (ingested to {}), not at {lsn}",
                r.checkpoint.redo, r.lsn, lsns.last
            )));
        }
    }
    let prev = if lsn == lsns.last { lsns.prev } else { Lsn::INVALID };
    let mtime = tl.clock().system_now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut tar = TarOut { tar: tar::Builder::new(out), mtime };
    let pg_version = format!("{}\n", tl.pg_version.major());
    tar.small("PG_VERSION", pg_version.as_bytes())?;
    tar.small("postgresql.conf", b"# written by the compute agent\n")?;
    tar.small("postgresql.auto.conf", b"")?;
    tar.small("pg_ident.conf", b"")?;
    tar.small("pg_hba.conf", b"local all all trust\nhost all all 127.0.0.1/32 trust\n")?;
    tar.dir("global")?;
    tar.dir("base")?;
    tar.dir("pg_wal")?;
    for d in EMPTY_DIRS {
        tar.dir(d)?;
    }

    // Databases and their relations.
    let mut manifest = Vec::new();
    let databases = tl.db_dir(lsn)?;
    for &(spc, db) in &databases {
        let prefix = if spc == GLOBALTABLESPACE_OID { "global".to_string() } else { format!("base/{db}") };
        if spc != GLOBALTABLESPACE_OID {
            tar.dir(&prefix)?;
            tar.small(&format!("{prefix}/PG_VERSION"), pg_version.as_bytes())?;
        }
        if let Some(map) = tl.get(&Key::relmap(spc, db), lsn)? {
            tar.small(&format!("{prefix}/pg_filenode.map"), &map)?;
        }
        let rels = tl.rel_dir(spc, db, lsn)?;
        let has_init: BTreeSet<u32> =
            rels.iter().filter(|(_, f)| *f == ForkNumber::Init as u8).map(|(r, _)| *r).collect();
        for &(rel, fork) in &rels {
            let Some(fork) = ForkNumber::from_u8(fork) else { continue };
            let tag = RelTag { rel: RelFileNode { spc, db, rel }, fork };
            let unlogged = has_init.contains(&rel);
            if unlogged && fork == ForkNumber::Fsm {
                // An unlogged relation's map starts afresh with its data.
                continue;
            }
            if unlogged && fork == ForkNumber::Main {
                // Written from the init fork below: an unlogged relation starts empty.
                continue;
            }
            let size = tl.listed_rel_size(tag, lsn)?;
            if relations != RelationData::All && !unlogged {
                let fork = match fork {
                    ForkNumber::Main => ManifestFork::Main,
                    ForkNumber::VisibilityMap => ManifestFork::VisibilityMap,
                    ForkNumber::Fsm => ManifestFork::FreeSpaceMap,
                    // A logged relation has no init fork.
                    ForkNumber::Init => continue,
                };
                let db = (spc != GLOBALTABLESPACE_OID).then_some(db);
                manifest.push(ManifestEntry { db, relfilenode: rel, fork, blocks: size });
                continue;
            }
            write_fork(&mut tar, tl, tag, size, lsn, &format!("{prefix}/{rel}{}", fork.file_suffix()))?;
            if fork == ForkNumber::Init {
                write_fork(&mut tar, tl, tag, size, lsn, &format!("{prefix}/{rel}"))?;
            }
        }
    }

    if relations == RelationData::Manifest {
        tar.small(MANIFEST_NAME, Manifest { lsn, entries: manifest }.encode().as_bytes())?;
    }

    // SLRUs: each segment up to its last existing page.
    for (kind, path) in [
        (SlruKind::Clog, "pg_xact"),
        (SlruKind::MultiXactOffsets, "pg_multixact/offsets"),
        (SlruKind::MultiXactMembers, "pg_multixact/members"),
    ] {
        if kind == SlruKind::MultiXactOffsets {
            tar.dir("pg_multixact")?;
        }
        tar.dir(path)?;
        for seg in tl.slru_segments(kind, lsn)? {
            let data = slru_segment(tl, kind, seg, lsn)?;
            tar.small(&format!("{path}/{seg:04X}"), &data)?;
        }
    }

    tar.dir("pg_twophase")?;
    for xid in tl.twophase_xids(lsn)? {
        if let Some(data) = tl.get(&Key::twophase_file(xid), lsn)? {
            tar.small(&format!("pg_twophase/{xid:08X}"), &data)?;
        }
    }

    let template = tl.control_template()?;
    if let Some(r) = standby {
        // No WAL: the standby streams it from the redo point on.
        let time = chrono::DateTime::from_timestamp(r.checkpoint.time, 0).unwrap_or_default();
        let start = standby_start(
            &template,
            r.lsn,
            r.end_lsn,
            &r.checkpoint,
            &time.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        );
        tar.small("global/pg_control", &start.control_file)?;
        tar.small("backup_label", start.backup_label.as_bytes())?;
        // A timeline that begins inside a segment has no bytes before its
        // start: PostgreSQL reads the segment's first page header whenever
        // it opens it, and the header of the page it starts on. The
        // walreceiver then writes what it streams into this file.
        let (begin, segment_size) = (tl.metadata().start_lsn, u64::from(template.wal_segment_size));
        if begin.0 / segment_size == r.checkpoint.redo.0 / segment_size && !begin.0.is_multiple_of(segment_size) {
            let version = tl.pg_version;
            let tli = r.checkpoint.this_timeline;
            let (name, bytes) = headers_before(version, template.system_identifier, tli, segment_size, begin);
            tar.small(&format!("pg_wal/{name}"), &bytes)?;
        }
        tar.tar.into_inner()?.flush()?;
        tl.metrics.basebackups.inc();
        return Ok(());
    }
    // pg_control and the WAL segment with a shutdown checkpoint at `lsn`.
    let checkpoint = tl.checkpoint_at(lsn)?;
    let now = mtime as i64;
    let generated = shutdown_checkpoint_at(&template, &checkpoint, lsn, prev, now);
    tar.small("global/pg_control", &generated.control_file)?;
    for (name, data) in &generated.segments {
        tar.small(&format!("pg_wal/{name}"), data)?;
    }
    tar.tar.into_inner()?.flush()?;
    tl.metrics.basebackups.inc();
    Ok(())
}

/// A tar stream with fixed modes and modification time.
struct TarOut<W: Write> {
    tar: tar::Builder<W>,
    mtime: u64,
}

impl<W: Write> TarOut<W> {
    fn file(&mut self, path: &str, data: &mut dyn Read, size: u64) -> std::io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o600);
        h.set_mtime(self.mtime);
        h.set_entry_type(tar::EntryType::Regular);
        self.tar.append_data(&mut h, path, data)
    }

    fn small(&mut self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.file(path, &mut &data[..], data.len() as u64)
    }

    fn dir(&mut self, path: &str) -> std::io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o700);
        h.set_mtime(self.mtime);
        h.set_entry_type(tar::EntryType::Directory);
        self.tar.append_data(&mut h, path, std::io::empty())
    }
}

/// Writes one fork as 1 GiB segment files, streaming its pages.
fn write_fork<W: Write>(
    tar: &mut TarOut<W>,
    tl: &Timeline,
    tag: RelTag,
    size: u32,
    lsn: Lsn,
    path: &str,
) -> Result<(), BasebackupError> {
    let segments = u64::from(size).div_ceil(RELSEG_BLOCKS).max(1);
    for seg in 0..segments {
        let first = seg * RELSEG_BLOCKS;
        let blocks = (u64::from(size) - first.min(u64::from(size))).min(RELSEG_BLOCKS);
        let name = if seg == 0 { path.to_string() } else { format!("{path}.{seg}") };
        let mut reader = ForkReader {
            tl,
            tag,
            lsn,
            next: first as u32,
            end: (first + blocks) as u32,
            buf: Vec::new(),
            pos: 0,
            error: None,
        };
        tar.file(&name, &mut reader, blocks * BLCKSZ as u64)?;
        if let Some(e) = reader.error {
            return Err(e.into());
        }
    }
    Ok(())
}

/// Reads a range of a fork's pages, a batch at a time.
struct ForkReader<'a> {
    tl: &'a Timeline,
    tag: RelTag,
    lsn: Lsn,
    next: u32,
    end: u32,
    buf: Vec<u8>,
    pos: usize,
    error: Option<ReadError>,
}

impl Read for ForkReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.next >= self.end {
                return Ok(0);
            }
            let n = ((self.end - self.next) as usize).min(READ_BATCH);
            let keys: Vec<Key> = (0..n as u32).map(|i| Key::rel_block(self.tag, self.next + i)).collect();
            self.buf.clear();
            self.pos = 0;
            for r in self.tl.get_many(&keys, self.lsn) {
                match r {
                    Ok(Some(page)) if page.len() == BLCKSZ => self.buf.extend_from_slice(&page),
                    Ok(Some(page)) => {
                        let e = std::io::Error::other(format!("a page of {} bytes in {}", page.len(), self.tag));
                        return Err(e);
                    }
                    Ok(None) => self.buf.extend_from_slice(&[0u8; BLCKSZ]),
                    Err(e) => {
                        let msg = e.to_string();
                        self.error = Some(e);
                        return Err(std::io::Error::other(msg));
                    }
                }
            }
            self.next += n as u32;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// One SLRU segment file: its pages up to the last one that exists.
pub fn slru_segment(tl: &Timeline, kind: SlruKind, seg: u32, lsn: Lsn) -> Result<Vec<u8>, ReadError> {
    let keys: Vec<Key> =
        (0..SLRU_PAGES_PER_SEGMENT).map(|i| Key::slru_page(kind, seg * SLRU_PAGES_PER_SEGMENT + i)).collect();
    let pages: Vec<Option<Bytes>> = tl.get_many(&keys, lsn).into_iter().collect::<Result<_, _>>()?;
    let Some(last) = pages.iter().rposition(Option::is_some) else { return Ok(Vec::new()) };
    let mut data = Vec::with_capacity((last + 1) * BLCKSZ);
    for p in &pages[..=last] {
        match p {
            Some(page) if page.len() == BLCKSZ => data.extend_from_slice(page),
            _ => data.extend_from_slice(&[0u8; BLCKSZ]),
        }
    }
    Ok(data)
}
