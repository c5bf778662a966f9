//! A timeline's decisions by time, on a `ManualClock`: leases hold GC back
//! exactly until the clock passes their end, a wait for an LSN ends when the
//! clock says so, and a small in-memory layer is frozen once it is old —
//! none of it waiting in real time.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_pageserver::clock::{Clock, ManualClock};
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::layer::map::RecordLsns;
use strata_pageserver::limits::{LEASE_TTL, MAX_LAYER_AGE};
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::{GcPolicy, ReadError, Timeline, TimelineResources};
use strata_pageserver::value::Value;

const TAG: RelTag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, fork: ForkNumber::Main };
const START: Lsn = Lsn(0x100_0000);

/// Resources whose clock is `clock`, for the timeline and its layer files alike.
fn resources(clock: &ManualClock) -> TimelineResources {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let mut res = common::resources(Arc::new(Metrics::new()), FileCache::new(16, Default::default(), clock.clone()));
    res.clock = clock;
    res
}

/// Record `i` ends at this LSN (aligned: a point a compute can lease).
fn lsn(i: u64) -> Lsn {
    Lsn(START.0 + 0x100 * i)
}

/// A timeline with `records` records of one page each, all durable.
fn timeline(name: &str, clock: &ManualClock, records: u64) -> Arc<Timeline> {
    let tl = Timeline::create(common::test_dir(name), common::metadata(START, 42), &resources(clock)).unwrap();
    for i in 0..records {
        let page = Value::Image(Bytes::from(vec![i as u8; 8192]));
        tl.commit_record(vec![(Key::rel_block(TAG, 0), lsn(i), page)], RecordLsns { last: lsn(i), prev: Lsn::INVALID });
    }
    tl.checkpoint().unwrap();
    tl
}

fn poll_once<F: Future + ?Sized>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_lease_holds_the_gc_cutoff_until_the_clock_passes_its_end() {
    let clock = ManualClock::new();
    let tl = timeline("clock-lease", &clock, 10);
    let durable = tl.disk_consistent_lsn();
    // No history kept: only the lease holds the cutoff back.
    let none = GcPolicy { pitr_interval: Duration::ZERO, gc_horizon: 0 };
    assert_eq!(tl.lease(lsn(3), None, None).unwrap(), LEASE_TTL);
    clock.advance(LEASE_TTL - Duration::from_secs(1));
    let pg_now = || strata_pageserver::clock::pg_now(&clock);
    assert_eq!(tl.gc(&none, pg_now()).unwrap().cutoff, lsn(3), "a second before the lease ends");
    assert_eq!(tl.leases(), vec![(lsn(3), 1, None)]);
    assert!(tl.get(&Key::rel_block(TAG, 0), lsn(3)).unwrap().is_some());
    clock.advance(Duration::from_secs(1));
    assert!(tl.leases().is_empty());
    assert_eq!(tl.gc(&none, pg_now()).unwrap().cutoff, durable, "once the lease ended");
    assert!(matches!(tl.get(&Key::rel_block(TAG, 0), lsn(3)), Err(ReadError::BelowGcCutoff { .. })));
    std::fs::remove_dir_all(&tl.dir).unwrap();
}

#[test]
fn a_wait_for_an_lsn_ends_when_the_clock_passes_its_timeout() {
    let clock = ManualClock::new();
    let tl = timeline("clock-wait-lsn", &clock, 2);
    let timeout = Duration::from_secs(30);
    let mut waiting = Box::pin(tl.wait_lsn(lsn(5), timeout));
    assert!(poll_once(waiting.as_mut()).is_pending());
    clock.advance(timeout - Duration::from_millis(1));
    assert!(poll_once(waiting.as_mut()).is_pending(), "not yet");
    clock.advance(Duration::from_millis(1));
    match poll_once(waiting.as_mut()) {
        Poll::Ready(Err(ReadError::LsnTimeout { lsn: l, waited, .. })) => assert_eq!((l, waited), (lsn(5), timeout)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Ingested in time, the wait ends at once.
    let mut reached = Box::pin(tl.wait_lsn(lsn(1), timeout));
    assert!(matches!(poll_once(reached.as_mut()), Poll::Ready(Ok(l)) if l == lsn(1)));
    std::fs::remove_dir_all(&tl.dir).unwrap();
}

#[test]
fn a_small_layer_is_frozen_once_the_clock_says_it_is_old() {
    let clock = ManualClock::new();
    let tl = timeline("clock-freeze", &clock, 1);
    assert!(!tl.should_freeze(MAX_LAYER_AGE), "nothing to freeze");
    tl.commit_record(
        vec![(Key::rel_block(TAG, 1), lsn(1), Value::Image(Bytes::from(vec![7u8; 8192])))],
        RecordLsns { last: lsn(1), prev: lsn(0) },
    );
    clock.advance(MAX_LAYER_AGE - Duration::from_millis(1));
    assert!(!tl.should_freeze(MAX_LAYER_AGE), "small and young");
    clock.advance(Duration::from_millis(1));
    assert!(tl.should_freeze(MAX_LAYER_AGE), "small but old");
    tl.freeze();
    assert!(!tl.should_freeze(MAX_LAYER_AGE), "a new layer is young again");
    std::fs::remove_dir_all(&tl.dir).unwrap();
}
