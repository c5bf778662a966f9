//! A timeline's versions across in-memory layers, flushes to layer files and
//! a reload from disk: reads at every LSN see exactly the versions at or
//! below it, native records apply on top of the newest image; a layer file
//! of an unfinished flush is removed at load, while any other file the
//! metadata does not list stops the load and stays.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::layer_file::LayerName;
use strata_pageserver::layer::map::RecordLsns;
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{Timeline, TimelineMetadata, TimelineResources};
use strata_pageserver::value::Value;
use strata_redo::NativeRecord;

fn meta(start: Lsn) -> TimelineMetadata {
    common::metadata(start, 42)
}

fn page(fill: u8) -> Value {
    Value::Image(Bytes::from(vec![fill; 8192]))
}

fn resources() -> TimelineResources {
    common::resources(
        Arc::new(Metrics::new()),
        FileCache::new(16, Default::default(), strata_pageserver::clock::system()),
    )
}

const TAG: RelTag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, fork: ForkNumber::VisibilityMap };

#[test]
fn versions_survive_flushes_and_reload() {
    let dir = std::env::temp_dir().join(format!("strata-timeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let start = Lsn(0x100_0000);
    let tl = Timeline::create(dir.clone(), meta(start), &resources()).unwrap();
    let k = Key::rel_block(TAG, 0);
    // Record i ends at start + 0x100 * i; every 10th record writes an image, the others a VM clear.
    let lsn = |i: u64| Lsn(start.0 + 0x100 * i);
    for i in 0..100u64 {
        let v = if i % 10 == 0 { page(0xff) } else { Value::Native(NativeRecord::ClearVmBits(vec![(i as u32, 1)])) };
        tl.commit_record(
            vec![(k, lsn(i), v), (Key::rel_block(TAG, 1 + i as u32), lsn(i), page(i as u8))],
            RecordLsns { last: lsn(i), prev: lsn(i.saturating_sub(1)) },
        );
        if i % 25 == 24 {
            tl.checkpoint().unwrap();
        }
    }
    let expect = |tl: &Timeline, i: u64| {
        let got = tl.get(&k, lsn(i)).unwrap().unwrap();
        // Heap blocks j in (10 * (i / 10), i] had their all-visible bit cleared.
        let mut want = vec![0xffu8; 8192];
        for j in (i / 10 * 10 + 1)..=i {
            want[24 + j as usize / 4] &= !(1 << (2 * (j % 4)));
        }
        assert_eq!(&got[..], &want[..], "page at record {i}");
    };
    for i in [0, 1, 9, 10, 24, 25, 37, 99] {
        expect(&tl, i);
    }
    assert_eq!(tl.get(&Key::rel_block(TAG, 50), lsn(48)).unwrap(), None, "not written yet at that LSN");
    let many = tl.get_many(&[Key::rel_block(TAG, 50), k, Key::rel_block(TAG, 3)], lsn(60));
    assert_eq!(many[0].as_ref().unwrap().as_deref(), Some(&[49u8; 8192][..]));
    assert_eq!(many[2].as_ref().unwrap().as_deref(), Some(&[2u8; 8192][..]));
    tl.checkpoint().unwrap();
    assert_eq!(tl.disk_consistent_lsn(), lsn(99));
    let layers = tl.metadata().layers.len();
    assert!(layers >= 4, "{layers} layer files");

    // Leftovers of an unfinished flush (a layer starting after
    // disk_consistent_lsn, a temporary file) are removed at load; reads are unchanged.
    let name = |from: Lsn, to: Lsn| LayerName::delta(Key::MIN, k.next(), from, to).to_string();
    let unfinished = name(Lsn(lsn(99).0 + 1), lsn(120));
    std::fs::write(dir.join(&unfinished), b"partial").unwrap();
    std::fs::write(dir.join("half-written.tmp"), b"partial").unwrap();
    drop(tl);
    let tl = Timeline::load(dir.clone(), &resources()).unwrap();
    assert!(tl.broken_reason().is_none());
    assert!(!dir.join(&unfinished).exists() && !dir.join("half-written.tmp").exists());
    assert_eq!(tl.record_lsns(), RecordLsns { last: lsn(99), prev: lsn(98) });
    for i in [0, 9, 25, 99] {
        expect(&tl, i);
    }
    drop(tl);

    // A file nothing explains (an old LSN range not in the metadata) stops
    // the load with the file named, and nothing is removed: not even what
    // would otherwise be the leftovers of an unfinished flush (with the
    // metadata in doubt, so is what "unfinished" means).
    let stray = name(lsn(3), lsn(4));
    std::fs::write(dir.join(&stray), b"whose?").unwrap();
    std::fs::write(dir.join(&unfinished), b"partial").unwrap();
    std::fs::write(dir.join("half-written.tmp"), b"partial").unwrap();
    let err = Timeline::load(dir.clone(), &resources()).err().expect("refused").to_string();
    assert!(err.contains(&stray) && err.contains("left as they are"), "{err}");
    assert!(!err.contains(&unfinished) && !err.contains("half-written.tmp"), "{err}");
    assert!(dir.join(&stray).exists() && dir.join(&unfinished).exists() && dir.join("half-written.tmp").exists());
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, layers + 4, "every layer, the metadata, the stray file and the leftovers stay");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unfinished_creation_is_refused_at_load() {
    let dir = std::env::temp_dir().join(format!("strata-timeline-new-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tl = Timeline::create(dir.clone(), meta(Lsn(0x100_0000)), &resources()).unwrap();
    drop(tl);
    let err = Timeline::load(dir.clone(), &resources()).err().unwrap().to_string();
    assert!(err.contains("nothing was ever made durable"), "{err}");
    assert!(dir.join("metadata.json").exists(), "kept");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_panic_in_a_timeline_thread_breaks_only_that_timeline() {
    use strata_pageserver::timeline::BrokenKind;
    use strata_pageserver::walreceiver::spawn_guarded;
    let dir = std::env::temp_dir().join(format!("strata-timeline-panic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let res = resources();
    let a = Timeline::create(dir.join("a"), meta(Lsn(0x100_0000)), &res).unwrap();
    let b = Timeline::create(dir.join("b"), meta(Lsn(0x100_0000)), &res).unwrap();
    spawn_guarded("test-a".into(), a.clone(), || panic!("injected")).unwrap().join().unwrap();
    spawn_guarded("test-b".into(), b.clone(), || {}).unwrap().join().unwrap();
    let broken = a.broken().expect("a is broken");
    assert_eq!(broken.kind, BrokenKind::Panic);
    assert!(broken.kind.reloads(), "re-read from disk");
    assert!(broken.reason.contains("test-a") && broken.reason.contains("injected"), "{}", broken.reason);
    assert!(b.broken().is_none(), "the other timeline goes on");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_flush_breaks_the_timeline_and_names_the_file() {
    use strata_pageserver::timeline::BrokenKind;
    let dir = std::env::temp_dir().join(format!("strata-timeline-flush-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let start = Lsn(0x100_0000);
    let tl = Timeline::create(dir.clone(), meta(start), &resources()).unwrap();
    let k = Key::rel_block(TAG, 0);
    tl.commit_record(vec![(k, Lsn(start.0 + 0x100), page(1))], RecordLsns { last: Lsn(start.0 + 0x100), prev: start });
    tl.checkpoint().unwrap();
    let durable = tl.disk_consistent_lsn();
    tl.commit_record(
        vec![(k, Lsn(start.0 + 0x200), page(2))],
        RecordLsns { last: Lsn(start.0 + 0x200), prev: durable },
    );
    // The directory is gone (a disk that failed under it): the layer file cannot be created.
    std::fs::remove_dir_all(&dir).unwrap();
    let err = tl.checkpoint().expect_err("the flush fails").to_string();
    let broken = tl.broken().expect("broken");
    assert_eq!(broken.kind, BrokenKind::Storage);
    let file =
        dir.join(format!("{}.tmp", LayerName::delta(Key::MIN, Key::MAX, Lsn(durable.0 + 1), Lsn(start.0 + 0x201))));
    let expected = format!("creating {}: ", file.display());
    assert!(broken.reason.contains(&expected) && err.contains(&expected), "{} / {err}", broken.reason);
    assert_eq!(tl.disk_consistent_lsn(), durable, "disk_consistent_lsn stays");
}

#[test]
fn reads_count_the_layers_they_visit() {
    let dir = std::env::temp_dir().join(format!("strata-timeline-visits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let metrics = Arc::new(Metrics::new());
    let start = Lsn(0x100_0000);
    let res =
        common::resources(metrics.clone(), FileCache::new(16, Default::default(), strata_pageserver::clock::system()));
    let tl = Timeline::create(dir.clone(), meta(start), &res).unwrap();
    let k = Key::rel_block(TAG, 0);
    let lsn = |i: u64| Lsn(start.0 + 0x100 * i);
    // An image, flushed; a change, flushed; a change in memory.
    let values = [
        page(1),
        Value::Native(NativeRecord::ClearVmBits(vec![(0, 1)])),
        Value::Native(NativeRecord::ClearVmBits(vec![(1, 1)])),
    ];
    for (i, v) in values.into_iter().enumerate() {
        let i = i as u64 + 1;
        tl.commit_record(vec![(k, lsn(i), v)], RecordLsns { last: lsn(i), prev: lsn(i - 1) });
        if i < 3 {
            tl.checkpoint().unwrap();
        }
    }
    let observed = || common::layers_visited(&metrics);
    let (sum0, count0) = observed();
    let absent = Key::rel_block(TAG, 9);
    // A key no layer holds: the open layer and both files are searched.
    assert_eq!(tl.get(&absent, lsn(3)).unwrap(), None);
    assert_eq!(observed(), (sum0 + 3.0, count0 + 1.0));
    // At the image's LSN only the first file starts early enough to be searched.
    tl.get(&k, lsn(1)).unwrap().unwrap();
    assert_eq!(observed(), (sum0 + 4.0, count0 + 2.0));
    // Batched reads count per key.
    tl.get_many(&[absent, k], lsn(1));
    assert_eq!(observed(), (sum0 + 6.0, count0 + 4.0));
    std::fs::remove_dir_all(&dir).unwrap();
}
