//! Branches (`docs/branches.md`): a child timeline reads its parent's
//! versions up to the branch point and its own after it; writes on either
//! never show on the other; a branch of a branch reads through both;
//! images, compaction and a reload of the child keep every read the same;
//! GC past a branch point keeps only the layers a read there visits.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_pageserver::clock::pg_now;
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::layer_file::LayerKind;
use strata_pageserver::layer::map::RecordLsns;
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{GcPolicy, LayerPolicy, Throttle, Timeline, TimelineMetadata, TimelineResources};
use strata_pageserver::value::Value;
use strata_redo::NativeRecord;

const TAG: RelTag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, fork: ForkNumber::VisibilityMap };
const KEYS: u32 = 24;
const PER_ROUND: u64 = 40;

fn resources() -> TimelineResources {
    let mut res = common::resources(
        Arc::new(Metrics::new()),
        FileCache::new(16, Default::default(), strata_pageserver::clock::system()),
    );
    res.policy = LayerPolicy {
        compaction_threshold: 3,
        compaction_target_size: 64 << 10,
        image_creation_threshold: 1,
        l0_backpressure_threshold: 8,
        fresh_page_min_bytes: 0,
    };
    res
}

fn lsn(i: u64) -> Lsn {
    Lsn(0x100_0000 + 0x100 * i)
}

/// Records `rounds` (each `PER_ROUND` records, then a checkpoint). Record
/// `i` writes block `i * 7 % KEYS` if `keys` takes it: an image every 5th
/// time, else a change on top. `salt` makes the timelines' pages differ.
fn write(tl: &Timeline, rounds: std::ops::Range<u64>, salt: u64, keys: impl Fn(u32) -> bool) {
    for r in rounds {
        for i in r * PER_ROUND + 1..=(r + 1) * PER_ROUND {
            let block = (i * 7 % u64::from(KEYS)) as u32;
            let batch = if keys(block) {
                let v = if (i / u64::from(KEYS)) % 5 == 0 {
                    Value::Image(common::noise_page(i ^ salt))
                } else {
                    Value::Native(NativeRecord::ClearVmBits(vec![(((i ^ salt) % 4000) as u32, 1)]))
                };
                vec![(Key::rel_block(TAG, block), lsn(i), v)]
            } else {
                Vec::new()
            };
            tl.commit_record(batch, RecordLsns { last: lsn(i), prev: lsn(i - 1) });
        }
        tl.checkpoint().unwrap();
    }
}

fn read_all(tl: &Timeline, at: u64) -> BTreeMap<u32, Option<Bytes>> {
    (0..KEYS).map(|b| (b, tl.get(&Key::rel_block(TAG, b), lsn(at)).unwrap())).collect()
}

fn read_many(tl: &Timeline, at: u64) -> BTreeMap<u32, Option<Bytes>> {
    let keys: Vec<Key> = (0..KEYS).map(|b| Key::rel_block(TAG, b)).collect();
    (0..KEYS).zip(tl.get_many(&keys, lsn(at))).map(|(b, v)| (b, v.unwrap())).collect()
}

fn child_metadata(parent: &Timeline, at: Lsn) -> TimelineMetadata {
    let mut meta = common::metadata(at, 42);
    meta.tenant_id = parent.tenant_id;
    meta.ancestor_timeline_id = Some(parent.timeline_id);
    meta.ancestor_lsn = Some(at);
    meta.disk_consistent_lsn = at;
    meta
}

#[test]
fn a_branch_reads_its_parent_up_to_the_branch_point_and_its_own_writes_after() {
    let dir = common::test_dir("branch");
    let res = resources();
    let never = AtomicBool::new(false);
    let parent = Timeline::create(dir.join("parent"), common::metadata(lsn(0), 42), &res).unwrap();
    write(&parent, 0..4, 0, |_| true);
    parent.compact(true, &mut Throttle::unlimited(), &never).unwrap();
    let point = 3 * PER_ROUND + 7;
    let at_point = read_all(&parent, point);
    assert!(at_point.values().all(|v| v.is_some()), "every key has a value at the branch point");

    let child = Timeline::create(dir.join("child"), child_metadata(&parent, lsn(point)), &res).unwrap();
    // Not linked yet: reads that need the parent say so.
    let e = child.get(&Key::rel_block(TAG, 1), lsn(point)).unwrap_err();
    assert!(e.to_string().contains("not attached"), "{e}");
    child.set_ancestor(parent.clone());
    assert_eq!(read_all(&child, point), at_point);
    assert_eq!(read_many(&child, point), at_point);
    let e = child.get(&Key::rel_block(TAG, 1), lsn(point - 1)).unwrap_err();
    assert!(e.to_string().contains("before it"), "{e}");

    // The parent goes on; the child writes even blocks only.
    write(&parent, 4..6, 0, |_| true);
    let parent_after = read_all(&parent, 6 * PER_ROUND);
    write(&child, 10..13, 0xABCD, |b| b % 2 == 0);
    let child_now = read_all(&child, 13 * PER_ROUND);
    for (b, v) in &child_now {
        if b % 2 == 1 {
            assert_eq!(v, &at_point[b], "block {b}: the child sees the parent as of the branch point");
        } else {
            assert_ne!(v, &at_point[b], "block {b}: the child's own writes");
            assert_ne!(v, &parent_after[b], "block {b}: not the parent's later writes");
        }
    }
    assert_eq!(read_all(&parent, 6 * PER_ROUND), parent_after, "the child's writes never show on the parent");
    assert_eq!(read_many(&child, 13 * PER_ROUND), child_now);

    // A branch of the branch reads through both.
    let grand_point = 11 * PER_ROUND + 3;
    let grand_at = read_all(&child, grand_point);
    let grand = Timeline::create(dir.join("grand"), child_metadata(&child, lsn(grand_point)), &res).unwrap();
    grand.set_ancestor(child.clone());
    assert_eq!(read_all(&grand, grand_point), grand_at);
    write(&grand, 20..21, 0x5555, |b| b % 4 == 0);
    for (b, v) in read_all(&grand, 21 * PER_ROUND) {
        if b % 4 != 0 {
            assert_eq!(v, grand_at[&b], "block {b} of the grandchild");
        }
    }

    // Compaction and images on the child: its first images hold the
    // parent's keys too (a key only the parent wrote must not vanish).
    write(&child, 13..16, 0xABCD, |b| b % 2 == 0 && b < 8);
    let before = read_all(&child, 16 * PER_ROUND);
    let outcome = child.compact(true, &mut Throttle::unlimited(), &never).unwrap();
    assert!(outcome.images_written >= 1, "{outcome:?}");
    assert_eq!(read_all(&child, 16 * PER_ROUND), before, "images changed a read of the child");
    assert_eq!(read_all(&child, point), at_point);
    assert_eq!(read_all(&grand, grand_point), grand_at);

    // Reloaded from disk and linked again, the child reads the same.
    drop(grand);
    drop(child);
    let child = Timeline::load(dir.join("child"), &res).unwrap();
    assert!(child.broken().is_none(), "{:?}", child.broken());
    child.set_ancestor(parent.clone());
    assert_eq!(read_all(&child, 16 * PER_ROUND), before);
    assert_eq!(read_all(&child, point), at_point);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn retained_branch_points_are_durable() {
    let dir = common::test_dir("branch-retain");
    let res = resources();
    let parent = Timeline::create(dir.clone(), common::metadata(lsn(0), 42), &res).unwrap();
    write(&parent, 0..2, 0, |_| true);
    for l in [30, 10, 30] {
        assert_eq!(parent.retain_lsn(lsn(l)).unwrap(), None);
    }
    assert_eq!(parent.metadata().retain_lsns, vec![lsn(10), lsn(30)]);
    drop(parent);
    let parent = Timeline::load(dir.clone(), &res).unwrap();
    assert_eq!(parent.metadata().retain_lsns, vec![lsn(10), lsn(30)]);
    parent.release_lsn(lsn(10), 1).unwrap();
    assert_eq!(parent.metadata().retain_lsns, vec![lsn(10), lsn(30)], "another branch still needs it");
    parent.release_lsn(lsn(10), 0).unwrap();
    assert_eq!(parent.metadata().retain_lsns, vec![lsn(30)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gc_past_a_branch_point_keeps_only_what_a_read_there_visits() {
    let dir = common::test_dir("branch-gc");
    let res = resources();
    let never = AtomicBool::new(false);
    let parent = Timeline::create(dir.join("parent"), common::metadata(lsn(0), 42), &res).unwrap();
    // Images every two rounds: some below the branch point, several above.
    for r in 0..12 {
        write(&parent, r..r + 1, 0, |_| true);
        if r % 2 == 1 {
            parent.compact(true, &mut Throttle::unlimited(), &never).unwrap();
        }
    }
    let point = 5 * PER_ROUND + 7;
    let at_point = read_all(&parent, point);
    assert_eq!(parent.retain_lsn(lsn(point)).unwrap(), None);
    let child = Timeline::create(dir.join("child"), child_metadata(&parent, lsn(point)), &res).unwrap();
    child.set_ancestor(parent.clone());
    write(&child, 20..21, 0xABCD, |b| b % 2 == 0);
    let child_now = read_all(&child, 21 * PER_ROUND);
    let newest = read_all(&parent, 12 * PER_ROUND);
    let bytes_before = parent.historic().counts().bytes;

    // No history kept: the cutoff goes to the newest durable LSN, far past
    // the branch point, which stays readable.
    let none = GcPolicy { pitr_interval: std::time::Duration::ZERO, gc_horizon: 0 };
    let outcome = parent.gc(&none, pg_now(&**parent.clock())).unwrap();
    assert!(outcome.cutoff > lsn(point + 3 * PER_ROUND), "{outcome:?}");
    assert_eq!(outcome.retained_points, vec![lsn(point)]);
    assert!(outcome.layers_removed > 0, "{outcome:?}");
    assert!(parent.historic().counts().bytes < bytes_before);
    assert_eq!(read_all(&child, point), at_point, "the child at its branch point");
    assert_eq!(read_many(&child, point), at_point);
    assert_eq!(read_all(&child, 21 * PER_ROUND), child_now, "the child's own writes");
    assert_eq!(read_all(&parent, point), at_point, "the parent at the retained point");
    assert_eq!(read_all(&parent, 12 * PER_ROUND), newest);
    let e = parent.get(&Key::rel_block(TAG, 1), lsn(point + 1)).unwrap_err();
    assert!(e.to_string().contains("GC cutoff"), "{e}");

    // What is left below the cutoff's image: the image the point reads and
    // the deltas from it up to the point, nothing wholly after the point.
    let image = outcome.image_lsn.expect("an image at or below the cutoff");
    let point_image = parent
        .historic()
        .iter()
        .filter(|l| l.name.kind == LayerKind::Image && l.name.lsn_start <= lsn(point))
        .map(|l| l.name.lsn_start)
        .max()
        .expect("an image below the branch point");
    for l in parent.historic().iter() {
        let n = l.name;
        if n.lsn_end.0 <= image.0 + 1 && !(n.kind == LayerKind::Image && n.lsn_start == image) {
            assert!(n.lsn_start <= lsn(point) && n.lsn_end.0 > point_image.0, "{n} is not read at the point");
        }
    }
    // A branch cannot be made below the cutoff, even next to a retained point.
    assert_eq!(parent.retain_lsn(lsn(point + 1)).unwrap(), Some(outcome.cutoff));

    // The branch deleted: the point is let go, and the next GC takes its layers.
    drop(child);
    parent.release_lsn(lsn(point), 0).unwrap();
    let again = parent.gc(&none, pg_now(&**parent.clock())).unwrap();
    assert!(again.retained_points.is_empty() && again.layers_removed > 0, "{again:?}");
    let e = parent.get(&Key::rel_block(TAG, 1), lsn(point)).unwrap_err();
    assert!(e.to_string().contains("GC cutoff"), "{e}");
    assert_eq!(read_all(&parent, 12 * PER_ROUND), newest);
    std::fs::remove_dir_all(&dir).unwrap();
}
