//! Timelines for the pageserver's integration tests.
#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use strata_formats::types::RelFileNode;
use strata_formats::v15::control::ControlFile;
use strata_formats::wal::record::{record_crc, DecodedRecord};
use strata_formats::{Lsn, PgVersion};
use strata_pageserver::key::Key;
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::map::RecordLsns;
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{Timeline, TimelineMetadata, TimelineResources};
use strata_pageserver::value::Value;
use strata_protocol::{TenantId, TenantShardId, TimelineId};

/// The pg_control of the format test vectors.
pub const CONTROL: &[u8] = include_bytes!("../../../formats/tests/data/pg_control_v15");

/// Metadata of a new timeline starting at `start`, with nothing on disk yet.
pub fn metadata(start: Lsn, system_id: u64) -> TimelineMetadata {
    TimelineMetadata {
        format_version: 1,
        tenant_id: TenantId::generate().into(),
        timeline_id: TimelineId::generate(),
        ancestor_timeline_id: None,
        ancestor_lsn: None,
        pg_version: 15,
        system_id,
        wal_segment_size: 16 << 20,
        start_lsn: start,
        disk_consistent_lsn: Lsn::INVALID,
        prev_record_lsn: Lsn::INVALID,
        layers: Vec::new(),
        removed_layers: Vec::new(),
        gc_cutoff_lsn: Lsn::INVALID,
        retain_lsns: Vec::new(),
        stripe_blocks: None,
    }
}

/// Resources without fsync and with 1 MiB in-memory layers.
pub fn resources(metrics: Arc<Metrics>, files: Arc<FileCache>) -> TimelineResources {
    TimelineResources {
        fsync: false,
        checkpoint_distance: 1 << 20,
        metrics,
        files,
        verify_redo: false,
        policy: Default::default(),
        clock: strata_pageserver::clock::system(),
    }
}

/// The value of the unlabelled sample `name` (its full name) in `metrics`.
pub fn metric(metrics: &Metrics, name: &str) -> f64 {
    let text = metrics.render();
    let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("{name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Sum and count of the layers reads visited so far.
pub fn layers_visited(metrics: &Metrics) -> (f64, f64) {
    (
        metric(metrics, "strata_pageserver_read_layers_visited_sum"),
        metric(metrics, "strata_pageserver_read_layers_visited_count"),
    )
}

/// A fresh directory for a test's timeline.
pub fn test_dir(name: &str) -> PathBuf {
    let dir = test_dir_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Where [`test_dir`] put the directory of `name`.
pub fn test_dir_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-{name}-{}", std::process::id()))
}

/// A timeline holding what an import leaves, pg_control and the checkpoint
/// at `start`, so that ingest can begin after it.
pub fn imported_timeline(name: &str, start: Lsn) -> (Arc<Timeline>, Arc<Metrics>, ControlFile) {
    imported_shard(name, start, TenantId::generate().into(), None)
}

/// [`imported_timeline`] for one shard of a tenant (`stripe_blocks` of a
/// sharded one).
pub fn imported_shard(
    name: &str,
    start: Lsn,
    tenant_id: TenantShardId,
    stripe_blocks: Option<u32>,
) -> (Arc<Timeline>, Arc<Metrics>, ControlFile) {
    let control = ControlFile::decode(CONTROL).unwrap();
    let metrics = Arc::new(Metrics::new());
    let res = resources(metrics.clone(), FileCache::new(16, Default::default(), strata_pageserver::clock::system()));
    let meta = TimelineMetadata { tenant_id, stripe_blocks, ..metadata(start, control.system_identifier) };
    let tl = Timeline::create(test_dir(name), meta, &res).unwrap();
    tl.commit_record(
        vec![
            (Key::control(), start, Value::Image(Bytes::copy_from_slice(CONTROL))),
            (Key::checkpoint(), start, Value::Image(Bytes::copy_from_slice(&control.checkpoint_copy.encode()))),
        ],
        RecordLsns { last: start, prev: Lsn::INVALID },
    );
    (tl, metrics, control)
}

/// A WAL record with one block reference to `block` of `rel` (`fork_flags`
/// as given, data attached) and main data, its length and CRC filled in.
#[allow(clippy::too_many_arguments)] // the fields of a record header
pub fn record(
    rel: RelFileNode,
    rmgr: u8,
    info: u8,
    block: u32,
    fork_flags: u8,
    data: &[u8],
    main: &[u8],
    lsn: Lsn,
) -> DecodedRecord {
    let mut raw = vec![0u8; 24];
    raw.push(0); // block id
    raw.push(fork_flags);
    raw.extend_from_slice(&(data.len() as u16).to_le_bytes());
    for v in [rel.spc, rel.db, rel.rel, block] {
        raw.extend_from_slice(&v.to_le_bytes());
    }
    raw.push(255);
    raw.push(main.len() as u8);
    raw.extend_from_slice(data);
    raw.extend_from_slice(main);
    raw[4..8].copy_from_slice(&1000u32.to_le_bytes());
    seal(raw, rmgr, info, lsn)
}

/// Fills in the header of a record whose body follows its 24 header bytes
/// (length, resource manager, info, CRC) and decodes it at `lsn`.
pub fn seal(mut raw: Vec<u8>, rmgr: u8, info: u8, lsn: Lsn) -> DecodedRecord {
    let len = raw.len() as u32;
    raw[0..4].copy_from_slice(&len.to_le_bytes());
    raw[16] = info;
    raw[17] = rmgr;
    let crc = record_crc(&raw);
    raw[20..24].copy_from_slice(&crc.to_le_bytes());
    let end = Lsn((lsn.0 + u64::from(len)).next_multiple_of(8));
    DecodedRecord::decode(PgVersion::V15, lsn, end, raw).unwrap()
}

/// An 8 KiB page that does not compress, different for each `seed`.
pub fn noise_page(seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut page = vec![0u8; 8192];
    for chunk in page.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    Bytes::from(page)
}
