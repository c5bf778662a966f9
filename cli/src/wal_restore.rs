//! `strata wal restore`: PostgreSQL's `restore_command` for the WAL the
//! safekeepers offloaded (`docs/safekeeper.md`, "WAL in object storage").
//! It fetches one segment, checks it against its metadata (size, CRC-32C),
//! clears `XLR_CHECK_CONSISTENCY` in its records (a stock server would run
//! the consistency checks itself) and writes it where PostgreSQL asked.
//!
//! A segment that was only offloaded as a partial segment (the committed
//! prefix of the segment being written, e.g. the last one of a compute that
//! stopped) is given to PostgreSQL padded with zeros to a whole segment:
//! replay reads its records and ends at the zeros, as at the end of any WAL.
//!
//! Exit codes follow what PostgreSQL makes of them: 1 when the segment is
//! not in object storage (the end of the archive: recovery ends there);
//! 127 on any other failure (a damaged object, an unreachable store), which
//! PostgreSQL treats like a shell error and stops recovery at once, instead
//! of ending it early and losing the WAL it could not fetch.

use crate::out::errln;
use std::path::Path;

use anyhow::{anyhow, Context};
use strata_formats::wal::segment::SegmentName;
use strata_formats::wal::strip::ConsistencyStripper;
use strata_formats::PgVersion;
use strata_protocol::{TenantId, TimelineId};
use strata_remote_storage::wal::{fetch_partial_segment, fetch_segment, SegmentMeta};
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};

/// What a service config must hold for the restore: its object storage,
/// and the cluster's storage key when the WAL there is encrypted (so the
/// restore runs where a safekeeper's or pageserver's config and key are).
#[derive(serde::Deserialize)]
struct StorageOnly {
    remote_storage: Option<RemoteStorageConfig>,
    storage_key: Option<std::path::PathBuf>,
}

/// The arguments of `strata wal restore`.
pub struct Restore<'a> {
    pub config: &'a Path,
    pub tenant: TenantId,
    pub timeline: TimelineId,
    pub segment_size: u64,
    pub keep_consistency: bool,
    pub name: &'a str,
    pub destination: &'a Path,
}

/// Runs the restore; the exit code for PostgreSQL.
pub fn run(r: Restore<'_>) -> i32 {
    match restore(&r) {
        Ok(true) => 0,
        Ok(false) => {
            errln!("strata wal restore: {} is not in object storage", r.name);
            1
        }
        Err(e) => {
            errln!("strata wal restore: {}: {e:#}", r.name);
            127
        }
    }
}

/// Whether the segment was there (and is now at the destination).
fn restore(r: &Restore<'_>) -> anyhow::Result<bool> {
    // Timeline history files and anything else that is not a segment: none offloaded.
    let Some(segment) = SegmentName::parse(r.name, r.segment_size) else { return Ok(false) };
    if segment.timeline != 1 {
        return Ok(false);
    }
    let text = std::fs::read_to_string(r.config).with_context(|| format!("reading {}", r.config.display()))?;
    let cfg: StorageOnly = toml::from_str(&text).with_context(|| format!("parsing {}", r.config.display()))?;
    let key = cfg.storage_key;
    let cfg = cfg.remote_storage.ok_or_else(|| anyhow!("{} has no [remote_storage]", r.config.display()))?;
    let mut storage = RemoteStorage::new(&cfg)?;
    if let Some(key) = key {
        storage = storage.with_storage_key(&key)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().enable_io().build()?;
    let segno = segment.segment_number;
    let Some((meta, bytes)) = runtime.block_on(fetch(&storage, r, segno))? else { return Ok(false) };
    let out = if r.keep_consistency {
        bytes
    } else {
        // A record that runs into the next segment gets its new CRC only with its end.
        let next = if meta.partial { None } else { runtime.block_on(fetch(&storage, r, segno + 1))? };
        // (Of a partial next segment, only its WAL: the zeros after it do not decode.)
        let next = next.as_ref().map(|(m, b)| &b[..(m.end_lsn.0 - m.start_lsn.0) as usize]);
        strip(&meta, &bytes, next)?
    };
    // Through a temporary file and a rename: the server never sees half a segment.
    strata_service::durable::replace_file(r.destination, &out, true)?;
    Ok(true)
}

/// A segment and its metadata, checked against each other: the whole
/// segment, else a partial one padded with zeros (`None`: not offloaded).
async fn fetch(storage: &RemoteStorage, r: &Restore<'_>, segno: u64) -> anyhow::Result<Option<(SegmentMeta, Vec<u8>)>> {
    if let Some(whole) = fetch_segment(storage, r.tenant, r.timeline, segno, r.segment_size).await? {
        return Ok(Some(whole));
    }
    let partial = fetch_partial_segment(storage, r.tenant, r.timeline, segno, r.segment_size).await?;
    Ok(partial.map(|(meta, mut bytes)| {
        bytes.resize(r.segment_size as usize, 0);
        (meta, bytes)
    }))
}

/// The segment with the consistency flag cleared in every record that
/// begins in it (`next`: the following segment, for a record that ends there).
fn strip(meta: &SegmentMeta, bytes: &[u8], next: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
    let size = bytes.len();
    // Before the timeline's WAL begins there are only page headers.
    let from = meta.wal_start_lsn.unwrap_or(meta.start_lsn);
    let skip = (from.0 - meta.start_lsn.0) as usize;
    let mut out = bytes[..skip].to_vec();
    // The segment's first page says which major wrote it.
    let magic = u16::from_le_bytes([bytes[0], bytes[1]]);
    let version = PgVersion::from_wal_page_magic(magic)
        .with_context(|| format!("segment at {}: unknown WAL page magic {magic:04X}", meta.start_lsn))?;
    let mut stripper = ConsistencyStripper::new(version, from, meta.segment_size);
    if meta.partial {
        // The committed prefix; the zeros after it are no WAL.
        let end = (meta.end_lsn.0 - meta.start_lsn.0) as usize;
        out.extend(stripper.push(&bytes[skip..end]).context("decoding the partial segment")?);
        out.extend(stripper.finish());
        debug_assert_eq!(out.len(), end, "the stripper gives back every byte");
        out.resize(size, 0);
        return Ok(out);
    }
    out.extend(stripper.push(&bytes[skip..]).context("decoding the segment")?);
    if out.len() < size {
        if let Some(next) = next {
            // Decoding errors past this segment are the next restore's business.
            if let Ok(more) = stripper.push(next) {
                out.extend(more);
            }
        }
    }
    if out.len() < size {
        out.extend(stripper.finish());
    }
    debug_assert!(out.len() >= size, "the stripper gives back every byte");
    out.truncate(size);
    Ok(out)
}
