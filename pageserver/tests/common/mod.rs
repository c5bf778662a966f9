//! Timelines for the pageserver's integration tests.
#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use strata_formats::v15::control::ControlFile;
use strata_formats::Lsn;
use strata_pageserver::key::Key;
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::map::RecordLsns;
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{Timeline, TimelineMetadata, TimelineResources};
use strata_pageserver::value::Value;
use strata_protocol::{TenantId, TimelineId};

/// The pg_control of the format test vectors.
pub const CONTROL: &[u8] = include_bytes!("../../../formats/tests/data/pg_control_v15");

/// Metadata of a new timeline starting at `start`, with nothing on disk yet.
pub fn metadata(start: Lsn, system_id: u64) -> TimelineMetadata {
    TimelineMetadata {
        format_version: 1,
        tenant_id: TenantId::generate(),
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
    let control = ControlFile::decode(CONTROL).unwrap();
    let metrics = Arc::new(Metrics::new());
    let res = resources(metrics.clone(), FileCache::new(16, Default::default(), strata_pageserver::clock::system()));
    let tl = Timeline::create(test_dir(name), metadata(start, control.system_identifier), &res).unwrap();
    tl.commit_record(
        vec![
            (Key::control(), start, Value::Image(Bytes::copy_from_slice(CONTROL))),
            (Key::checkpoint(), start, Value::Image(Bytes::copy_from_slice(&control.checkpoint_copy.encode()))),
        ],
        RecordLsns { last: start, prev: Lsn::INVALID },
    );
    (tl, metrics, control)
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
