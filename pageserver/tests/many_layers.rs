//! A timeline with tens of thousands of layer files loads and serves reads
//! under a 1,024-file limit: layer files are read through the bounded
//! descriptor cache, never held open one descriptor per layer.
//!
//! Its own test binary, because it lowers the open-file limit of the whole
//! process.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::layer_file::{LayerFileWriter, LayerName};
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{Timeline, TimelineMetadata};
use strata_pageserver::value::Value;

const LAYERS: u64 = 20_000;
const KEYS: u64 = 64;
const START: Lsn = Lsn(0x100_0000);
const TAG: RelTag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, fork: ForkNumber::Main };

/// Layer `i` holds one image of block `i % KEYS` at this LSN.
fn lsn(i: u64) -> Lsn {
    Lsn(START.0 + 0x10 * (i + 1))
}

fn fill(i: u64) -> u8 {
    (i % 251) as u8
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn twenty_thousand_layers_under_a_1024_file_limit() {
    // SAFETY: setrlimit only reads the struct passed.
    let limited = unsafe {
        let rl = libc::rlimit { rlim_cur: 1024, rlim_max: libc::RLIM_INFINITY };
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl) == 0
            || libc::setrlimit(libc::RLIMIT_NOFILE, &libc::rlimit { rlim_cur: 1024, rlim_max: 1024 }) == 0
    };
    assert!(limited, "could not lower the open-file limit to 1024");

    let dir = std::env::temp_dir().join(format!("strata-many-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut names = Vec::new();
    for i in 0..LAYERS {
        let key = Key::rel_block(TAG, (i % KEYS) as u32);
        let name = LayerName::delta(key, key.next(), lsn(i), Lsn(lsn(i).0 + 1));
        let mut w = LayerFileWriter::new(&dir, name).unwrap();
        w.put(&key, lsn(i), &Value::Image(Bytes::from(vec![fill(i); 8192]))).unwrap();
        names.push(w.finish(false).unwrap().file_name().unwrap().to_string_lossy().into_owned());
    }
    let meta = TimelineMetadata {
        disk_consistent_lsn: lsn(LAYERS - 1),
        prev_record_lsn: lsn(LAYERS - 2),
        layers: names,
        ..common::metadata(START, 42)
    };
    std::fs::write(dir.join("metadata.json"), serde_json::to_vec(&meta).unwrap()).unwrap();

    let metrics = Arc::new(Metrics::new());
    let files = FileCache::new(128, metrics.layer_files(), strata_pageserver::clock::system());
    let res = common::resources(metrics.clone(), files);
    let before = open_fds();
    let tl = Timeline::load(dir.clone(), &res).unwrap();
    assert!(tl.broken_reason().is_none());
    assert_eq!(tl.layer_count().1.l1, LAYERS as usize);
    // Every layer was opened once to check it, through the cache.
    assert!(metrics.layer_file_opens.get() >= LAYERS);
    assert!(res.files.len() <= 128);

    // Reads across the whole history: each version lives in its own file.
    let mut reads = 0;
    for i in (0..LAYERS).step_by(7).chain(LAYERS - KEYS..LAYERS) {
        let key = Key::rel_block(TAG, (i % KEYS) as u32);
        let page = tl.get(&key, lsn(i)).unwrap().expect("a version");
        assert!(page.iter().all(|b| *b == fill(i)), "block {} at {}", i % KEYS, lsn(i));
        reads += 1;
        assert!(open_fds() <= before + 128 + 8, "descriptors stay bounded while reading");
    }
    assert!(reads > 2_800);
    assert!(metrics.layer_file_evictions.get() > LAYERS, "the cache cycled through the files");
    drop(tl);
    std::fs::remove_dir_all(&dir).unwrap();
}
