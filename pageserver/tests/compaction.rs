//! Compaction and image creation change where versions live, never what a
//! read returns: reads at every LSN are the same before and after, and
//! after a reload; replaced files are deleted; a read at the newest LSN
//! visits a bounded number of layers; a crash between the metadata and
//! the renames is completed at load.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::map::RecordLsns;
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{GcPolicy, LayerPolicy, Throttle, Timeline, TimelineResources};
use strata_pageserver::value::Value;
use strata_redo::NativeRecord;

const TAG: RelTag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, fork: ForkNumber::VisibilityMap };
const KEYS: u32 = 40;
const PER_ROUND: u64 = 60;

fn resources() -> TimelineResources {
    let mut res = common::resources(
        Arc::new(Metrics::new()),
        FileCache::new(16, Default::default(), strata_pageserver::clock::system()),
    );
    res.policy = LayerPolicy {
        compaction_threshold: 4,
        // Small files, so that a run has several and reads cross them.
        compaction_target_size: 64 << 10,
        image_creation_threshold: 2,
        l0_backpressure_threshold: 8,
        fresh_page_min_bytes: 0,
    };
    res
}

fn lsn(i: u64) -> Lsn {
    Lsn(0x100_0000 + 0x100 * i)
}

/// Record `i` writes one key: every 9th version of a key is an image, the
/// others clear a bit of it (native redo on top).
fn write_rounds(tl: &Timeline, rounds: std::ops::Range<u64>) {
    for r in rounds {
        for i in r * PER_ROUND..(r + 1) * PER_ROUND {
            let i = i + 1;
            let block = (i * 7 % u64::from(KEYS)) as u32;
            let v = if (i / u64::from(KEYS)) % 9 == 0 {
                Value::Image(common::noise_page(i))
            } else {
                Value::Native(NativeRecord::ClearVmBits(vec![((i % 4000) as u32, 1)]))
            };
            tl.commit_record(
                vec![(Key::rel_block(TAG, block), lsn(i), v)],
                RecordLsns { last: lsn(i), prev: lsn(i - 1) },
            );
        }
        tl.checkpoint().unwrap();
    }
}

/// Every key at every 5th LSN up to record `upto`.
fn reads(tl: &Timeline, upto: u64) -> BTreeMap<(u64, u32), Option<Bytes>> {
    let mut out = BTreeMap::new();
    for i in (1..=upto).step_by(5).chain([upto]) {
        for b in 0..KEYS {
            out.insert((i, b), tl.get(&Key::rel_block(TAG, b), lsn(i)).unwrap());
        }
    }
    out
}

fn layer_files_on_disk(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "metadata.json")
        .collect();
    names.sort();
    names
}

#[test]
fn compaction_and_images_keep_every_read_the_same() {
    let dir = common::test_dir("compaction");
    let res = resources();
    let tl = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    let never = AtomicBool::new(false);
    write_rounds(&tl, 0..6);
    let before = reads(&tl, 6 * PER_ROUND);
    assert_eq!(tl.layer_count().1.l0, 6);

    // Six L0s (threshold 4) become one run of L1s; no image yet (one run, threshold 2).
    let outcome = tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
    assert_eq!(outcome.l0_compacted, 6, "{outcome:?}");
    assert!(outcome.l1_written >= 2, "files are cut at the target size: {outcome:?}");
    assert_eq!(outcome.images_written, 0);
    let counts = tl.layer_count().1;
    assert_eq!((counts.l0, counts.l1, counts.image), (0, outcome.l1_written, 0));
    assert_eq!(reads(&tl, 6 * PER_ROUND), before, "compaction changed a read");
    // The L0 files are gone (no read holds them); the directory holds what the metadata lists.
    let mut listed = tl.metadata().layers.clone();
    listed.sort();
    assert_eq!(layer_files_on_disk(&dir), listed);

    // Below the threshold nothing happens.
    write_rounds(&tl, 6..9);
    assert_eq!(tl.compact(false, &mut Throttle::unlimited(), &never).unwrap(), Default::default());
    // The fourth L0 starts a second compaction, and the second run above no image, an image.
    write_rounds(&tl, 9..10);
    let before = reads(&tl, 10 * PER_ROUND);
    let outcome = tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
    assert_eq!(outcome.l0_compacted, 4, "{outcome:?}");
    assert!(outcome.images_written >= 1, "{outcome:?}");
    assert_eq!(outcome.image_lsn, Some(lsn(10 * PER_ROUND)), "images at the end of the newest L1 run");
    assert_eq!(reads(&tl, 10 * PER_ROUND), before, "compaction or images changed a read");

    // A read at the newest LSN stops at the image.
    write_rounds(&tl, 10..11);
    let (s0, c0) = common::layers_visited(&res.metrics);
    let untouched = Key::rel_block(TAG, KEYS + 5);
    assert_eq!(tl.get(&untouched, lsn(11 * PER_ROUND)).unwrap(), None);
    let (s1, c1) = common::layers_visited(&res.metrics);
    assert_eq!(c1 - c0, 1.0);
    // The newest L0, then the image run ends the search (the open layer
    // starts after the read's LSN; the L1s below the image are not visited).
    assert_eq!(s1 - s0, 2.0, "layers visited for a key without a value");

    // A reload from disk reads the same.
    let all = reads(&tl, 11 * PER_ROUND);
    let meta = tl.metadata();
    drop(tl);
    let tl = Timeline::load(dir.clone(), &res).unwrap();
    assert!(tl.broken().is_none(), "{:?}", tl.broken());
    assert_eq!(reads(&tl, 11 * PER_ROUND), all);

    // A crash after the metadata listed new files but before their rename:
    // load completes the rename. A file the metadata lists as removed is deleted.
    let l1 = meta.layers.iter().find(|n| n.ends_with(".delta") && !n.starts_with(&Key::MIN.to_string())).unwrap();
    drop(tl);
    std::fs::rename(dir.join(l1), dir.join(format!("{l1}.tmp"))).unwrap();
    let removed = meta.removed_layers.first().cloned().unwrap_or_else(|| "000000000000000000000000000000000000-FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF__0000000001000001-0000000001000002.delta".into());
    let mut with_removed = meta.clone();
    with_removed.removed_layers = vec![removed.clone()];
    std::fs::write(dir.join("metadata.json"), serde_json::to_vec(&with_removed).unwrap()).unwrap();
    std::fs::write(dir.join(&removed), b"an old L0 whose deletion a crash cut short").unwrap();
    let tl = Timeline::load(dir.clone(), &res).unwrap();
    assert!(tl.broken().is_none(), "{:?}", tl.broken());
    assert!(dir.join(l1).exists() && !dir.join(format!("{l1}.tmp")).exists());
    assert!(!dir.join(&removed).exists());
    assert_eq!(reads(&tl, 11 * PER_ROUND), all);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn l0s_past_the_threshold_hold_back_the_reported_lsn() {
    let dir = common::test_dir("backpressure");
    let res = resources();
    let tl = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    write_rounds(&tl, 0..7);
    assert!(!tl.backpressure());
    assert_eq!(tl.feedback_lsn(), tl.disk_consistent_lsn());
    write_rounds(&tl, 7..8);
    assert!(tl.backpressure(), "8 L0s reach the threshold");
    let oldest = tl.historic().l0()[0].name.lsn_start;
    assert_eq!(tl.feedback_lsn(), oldest, "the applied LSN reported stops at the oldest L0");
    let never = AtomicBool::new(false);
    tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
    assert!(!tl.backpressure());
    assert_eq!(tl.feedback_lsn(), tl.disk_consistent_lsn());
    // A compaction stopped by shutdown leaves no file behind and changes nothing.
    write_rounds(&tl, 8..12);
    let files = layer_files_on_disk(&dir);
    let stop = AtomicBool::new(true);
    assert!(tl.compact(false, &mut Throttle::unlimited(), &stop).is_err());
    assert_eq!(layer_files_on_disk(&dir), files);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gc_removes_what_the_newest_image_below_the_cutoff_covers() {
    let dir = common::test_dir("gc");
    let res = resources();
    let tl = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    let never = AtomicBool::new(false);
    // Commit times: record i committed at second 1000 + i / 10 (PostgreSQL's µs).
    let commit = |i: u64| (1000 + i as i64 / 10) * 1_000_000;
    for r in 0..12 {
        write_rounds(&tl, r..r + 1);
        // A commit record after the round's last record (which was flushed).
        let i = (r + 1) * PER_ROUND;
        let at = Lsn(lsn(i).0 + 0x10);
        tl.commit_record(
            vec![(Key::commit_time(), at, Value::Image(Bytes::copy_from_slice(&commit(i).to_le_bytes())))],
            RecordLsns { last: at, prev: lsn(i) },
        );
        tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
    }
    tl.checkpoint().unwrap();
    let end = 12 * PER_ROUND;
    let all = reads(&tl, end);
    let files_before = layer_files_on_disk(&dir).len();

    // Times map to the LSN of the newest commit at or before them.
    let commit_lsn = |i: u64| Lsn(lsn(i).0 + 0x10);
    assert_eq!(
        tl.lsn_for_commit_time(commit(4 * PER_ROUND), lsn(end)).unwrap(),
        Some(Lsn(commit_lsn(5 * PER_ROUND).0 - 1)),
        "the last LSN before the next recorded commit"
    );
    assert_eq!(tl.lsn_for_commit_time(commit(0), lsn(end)).unwrap(), None, "before the first commit recorded");
    assert_eq!(tl.lsn_for_commit_time(i64::MAX, lsn(end)).unwrap(), Some(lsn(end)));

    // A PITR window of 30 s, 30 s after record 600's commit: the cutoff is
    // the LSN of the newest commit at or before that time.
    let now = commit(10 * PER_ROUND) + 30_000_000;
    let policy = GcPolicy { pitr_interval: Duration::from_secs(30), gc_horizon: 0 };
    let outcome = tl.gc(&policy, now).unwrap();
    assert_eq!(outcome.cutoff, Lsn(commit_lsn(11 * PER_ROUND).0 - 1));
    assert_eq!(tl.gc_cutoff_lsn(), outcome.cutoff);
    assert!(outcome.layers_removed > 0, "{outcome:?}");
    let image = outcome.image_lsn.unwrap();
    assert!(image <= outcome.cutoff);
    // Pages at LSNs inside the window are unchanged; below it, refused with the cutoff named.
    for ((i, b), page) in &all {
        let got = tl.get(&Key::rel_block(TAG, *b), lsn(*i));
        if lsn(*i) >= outcome.cutoff {
            assert_eq!(&got.unwrap(), page, "record {i} block {b}");
        } else {
            let err = got.unwrap_err().to_string();
            assert!(err.contains("below the GC cutoff") && err.contains(&outcome.cutoff.to_string()), "{err}");
        }
    }
    assert!(layer_files_on_disk(&dir).len() < files_before);
    // Every layer that remains ends after the image, or is the image.
    for l in tl.historic().iter() {
        assert!(l.name.lsn_end.0 > image.0 + 1 || l.name.lsn_start == image, "{} should be gone", l.name);
    }
    // The cutoff never goes back, and survives a reload.
    let again = tl.gc(&GcPolicy { pitr_interval: Duration::from_secs(3600), gc_horizon: 0 }, now).unwrap();
    assert_eq!(again.cutoff, outcome.cutoff);
    assert_eq!(again.layers_removed, 0);
    drop(tl);
    let tl = Timeline::load(dir.clone(), &res).unwrap();
    assert!(tl.broken().is_none(), "{:?}", tl.broken());
    assert_eq!(tl.gc_cutoff_lsn(), outcome.cutoff);
    for b in 0..KEYS {
        assert_eq!(Some(&tl.get(&Key::rel_block(TAG, b), lsn(end)).unwrap()), all.get(&(end, b)));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A day of flushes compressed: 500 flushes of 1 MiB-class layers with
/// compaction and GC after each. Layer count, bytes, open files and the
/// layers a read at the newest LSN visits stay bounded: the second half of
/// the history adds nothing to any of them.
#[test]
fn long_history_keeps_layers_files_and_read_cost_bounded() {
    let dir = common::test_dir("long-history");
    let metrics = Arc::new(Metrics::new());
    let files = FileCache::new(32, metrics.layer_files(), strata_pageserver::clock::system());
    let mut res = common::resources(metrics.clone(), files.clone());
    res.policy = resources().policy;
    let tl = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    let never = AtomicBool::new(false);
    // Keep 20 flushes of history.
    let policy = GcPolicy { pitr_interval: Duration::ZERO, gc_horizon: 20 * PER_ROUND * 0x100 };
    let visits = |key: Key, at: Lsn| -> f64 {
        let (before, _) = common::layers_visited(&metrics);
        tl.get(&key, at).unwrap();
        common::layers_visited(&metrics).0 - before
    };
    let mut worst = Vec::new();
    for half in 0..2 {
        let (mut layers, mut bytes, mut visited, mut open) = (0usize, 0u64, 0f64, 0usize);
        for r in half * 250..(half + 1) * 250 {
            write_rounds(&tl, r..r + 1);
            tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
            tl.gc(&policy, 0).unwrap();
            let counts = tl.layer_count().1;
            layers = layers.max(counts.l0 + counts.l1 + counts.image);
            bytes = bytes.max(counts.bytes);
            let end = lsn((r + 1) * PER_ROUND);
            visited = visited.max(visits(Key::rel_block(TAG, (r % u64::from(KEYS)) as u32), end));
            open = open.max(files.len());
        }
        worst.push((layers, bytes, visited, open));
    }
    println!("per half (layers, bytes, layers visited, open files): {worst:?}");
    let (first, second) = (worst[0], worst[1]);
    assert!(second.0 <= first.0, "layer count grew: {worst:?}");
    assert!(second.1 <= first.1 * 11 / 10, "layer bytes grew: {worst:?}");
    assert!(second.2 <= first.2, "read cost grew: {worst:?}");
    // L0s below the threshold, L1 runs below the image threshold, one image, the open layer.
    assert!(second.2 <= (4 + 2 + 2) as f64, "{worst:?}");
    assert!(second.3 <= 32, "{worst:?}");
    assert!(tl.gc_cutoff_lsn() > lsn(400 * PER_ROUND), "GC followed the horizon");
    // The files on disk are the ones the metadata lists.
    let mut listed = tl.metadata().layers.clone();
    listed.sort();
    assert_eq!(layer_files_on_disk(&dir), listed);
    std::fs::remove_dir_all(&dir).unwrap();
}

const BULK: RelTag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16390 }, fork: ForkNumber::VisibilityMap };

/// Writes one record of `key` at the next LSN of `i`.
fn record(tl: &Timeline, i: &mut u64, key: Key, v: impl FnOnce(u64) -> Value) {
    *i += 1;
    let v = v(*i);
    tl.commit_record(vec![(key, lsn(*i), v)], RecordLsns { last: lsn(*i), prev: lsn(*i - 1) });
}

fn change(i: u64) -> Value {
    Value::Native(NativeRecord::ClearVmBits(vec![((i % 4000) as u32, 1)]))
}

/// Every key of `rels` (blocks `0..blocks`) at every LSN up to record `upto`.
fn reads_of(tl: &Timeline, rels: &[RelTag], blocks: u32, upto: u64) -> BTreeMap<(u64, RelTag, u32), Option<Bytes>> {
    let mut out = BTreeMap::new();
    for i in 1..=upto {
        for rel in rels {
            for b in 0..blocks {
                out.insert((i, *rel, b), tl.get(&Key::rel_block(*rel, b), lsn(i)).unwrap());
            }
        }
    }
    out
}

/// The non-L0 delta files, by name.
fn fresh_names(tl: &Timeline) -> Vec<String> {
    let l0 = format!("{}-{}__", Key::MIN, Key::MAX);
    let mut names: Vec<String> =
        tl.metadata().layers.iter().filter(|n| n.ends_with(".delta") && !n.starts_with(&l0)).cloned().collect();
    names.sort();
    names
}

#[test]
fn fresh_pages_skip_compaction_unless_their_window_changes_them_again() {
    let dir = common::test_dir("fresh-pages");
    let mut res = resources();
    res.policy.fresh_page_min_bytes = 16 << 10;
    let tl = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    let never = AtomicBool::new(false);
    let mut i = 0;
    let mut flushes = Vec::new();
    for round in 0..4u32 {
        // A load: eight new blocks of BULK, each an image and two changes.
        for b in round * 8..round * 8 + 8 {
            record(&tl, &mut i, Key::rel_block(BULK, b), |i| Value::Image(common::noise_page(i)));
            for _ in 0..2 {
                record(&tl, &mut i, Key::rel_block(BULK, b), change);
            }
        }
        // Four hot blocks of TAG: images in the first flush, changes after.
        for b in 0..4 {
            let v = |i| if round == 0 { Value::Image(common::noise_page(i)) } else { change(i) };
            record(&tl, &mut i, Key::rel_block(TAG, b), v);
        }
        // The third flush changes a page the second loaded.
        if round == 2 {
            record(&tl, &mut i, Key::rel_block(BULK, 9), change);
        }
        tl.checkpoint().unwrap();
        flushes.push(fresh_names(&tl));
    }
    // Each flush wrote its L0 and a fresh-page delta for its load (less
    // its highest block); the first also one for the hot blocks' images
    // (less the highest: three images, 24 KiB).
    let counts = tl.layer_count().1;
    assert_eq!((counts.l0, counts.l1, counts.image), (4, 5, 0), "{:?}", flushes.last());
    assert!(common::metric(&res.metrics, "strata_pageserver_fresh_bytes_written_total") > 0.0);
    let fresh = flushes.last().unwrap().clone();
    let of_round = |r: usize| -> Vec<String> {
        let before: Vec<String> = if r == 0 { Vec::new() } else { flushes[r - 1].clone() };
        flushes[r].iter().filter(|n| !before.contains(n)).cloned().collect()
    };
    assert_eq!(of_round(0).len(), 2);
    let bulk =
        |r: usize| of_round(r).into_iter().find(|n| n.starts_with(&Key::rel_block(BULK, 0).to_string()[..26])).unwrap();
    assert!(bulk(1).starts_with(&Key::rel_block(BULK, 8).to_string()), "{}", bulk(1));
    assert!(
        bulk(1).contains(&format!("-{}__", Key::rel_block(BULK, 15))),
        "the highest block stays in the L0: {}",
        bulk(1)
    );
    let before = reads_of(&tl, &[BULK, TAG], 33, i);
    let sizes: BTreeMap<String, u64> = tl.layer_sizes().into_iter().collect();

    // Compaction merges the L0s with the two fresh-page deltas whose keys
    // other flushes changed (the hot blocks, block 9) and keeps the others.
    let outcome = tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
    assert_eq!(outcome.l0_compacted, 4, "{outcome:?}");
    assert_eq!(outcome.images_written, 0, "runs kept inside the L1 run do not count for images: {outcome:?}");
    let after = fresh_names(&tl);
    for kept in [bulk(0), bulk(2), bulk(3)] {
        assert!(after.contains(&kept), "{kept} kept: {after:?}");
    }
    let hot = of_round(0).into_iter().find(|n| n.starts_with(&Key::rel_block(TAG, 0).to_string())).unwrap();
    for merged in [bulk(1), hot] {
        assert!(!after.contains(&merged) && !dir.join(&merged).exists(), "{merged} merged: {after:?}");
    }
    // It read everything but the files it kept.
    let kept_bytes: u64 = [bulk(0), bulk(2), bulk(3)].iter().map(|n| sizes[n]).sum();
    assert_eq!(outcome.bytes_read, sizes.values().sum::<u64>() - kept_bytes);
    assert_eq!(fresh.len(), 5);
    assert_eq!(reads_of(&tl, &[BULK, TAG], 33, i), before, "compaction changed a read");

    // Further flushes and compactions: images come after two L1 runs, and
    // every read stays the same, after a reload too.
    for round in 4..9u32 {
        for b in [round, 9, 20] {
            record(&tl, &mut i, Key::rel_block(BULK, b), change);
        }
        record(&tl, &mut i, Key::rel_block(TAG, 1), change);
        tl.checkpoint().unwrap();
    }
    let before = reads_of(&tl, &[BULK, TAG], 33, i);
    let outcome = tl.compact(false, &mut Throttle::unlimited(), &never).unwrap();
    assert_eq!(outcome.l0_compacted, 5, "{outcome:?}");
    assert!(outcome.images_written >= 1, "{outcome:?}");
    assert_eq!(reads_of(&tl, &[BULK, TAG], 33, i), before, "compaction or images changed a read");
    drop(tl);
    let tl = Timeline::load(dir.clone(), &res).unwrap();
    assert!(tl.broken().is_none(), "{:?}", tl.broken());
    assert_eq!(reads_of(&tl, &[BULK, TAG], 33, i), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_compaction_of_one_l0_takes_its_fresh_pages_along() {
    let dir = common::test_dir("fresh-one");
    let mut res = resources();
    res.policy.fresh_page_min_bytes = 16 << 10;
    let tl = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    let never = AtomicBool::new(false);
    let mut i = 0;
    for b in 0..6 {
        record(&tl, &mut i, Key::rel_block(BULK, b), |i| Value::Image(common::noise_page(i)));
    }
    tl.checkpoint().unwrap();
    let counts = tl.layer_count().1;
    assert_eq!((counts.l0, counts.l1), (1, 1), "the highest block goes to the L0, the rest to a fresh-page delta");
    let fresh = fresh_names(&tl);
    let before = reads_of(&tl, &[BULK], 7, i);
    // A forced compaction of a single L0 merges its fresh-page deltas too:
    // the L1 run has their LSN range, and one run cannot hold both.
    let outcome = tl.compact(true, &mut Throttle::unlimited(), &never).unwrap();
    assert_eq!(outcome.l0_compacted, 1, "{outcome:?}");
    assert!(fresh_names(&tl).iter().all(|n| !fresh.contains(n)), "{:?}", fresh_names(&tl));
    assert_eq!(reads_of(&tl, &[BULK], 7, i), before);
    std::fs::remove_dir_all(&dir).unwrap();
}
