//! The compactor: one thread per pageserver that visits every timeline in
//! turn, compacting L0 deltas and creating images when they are due, and
//! keeps the layer gauges current; then evicts layers from local disk
//! when it holds more than `local_cache_bytes`. One thread (not one per timeline) bounds
//! the disk bandwidth and memory that background work takes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tracing::{error, warn};

use crate::tenants::Tenants;
use std::collections::HashMap;

use strata_protocol::{TenantShardId, TimelineId};

use crate::timeline::{CompactionError, Throttle, Timeline};

/// The compactor thread; stopped (and joined) by [`Compactor::stop`].
pub struct Compactor {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Compactor {
    pub fn spawn(tenants: Arc<Tenants>) -> std::io::Result<Compactor> {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = std::thread::Builder::new().name("compactor".into()).spawn({
            let stop = stop.clone();
            move || run(&tenants, &stop)
        })?;
        Ok(Compactor { stop, handle: Some(handle) })
    }

    /// Stops a compaction in progress (its temporary files are removed) and waits for the thread.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(tenants: &Tenants, stop: &AtomicBool) {
    let period = tenants.conf.compaction_period;
    let rate = tenants.conf.compaction_max_bytes_per_second;
    let gc_policy = tenants.conf.gc_policy();
    let clock = &*tenants.resources.clock;
    let mut last_gc: HashMap<(TenantShardId, TimelineId), Instant> = HashMap::new();
    let launched = clock.now();
    while !stop.load(Ordering::SeqCst) {
        let started = clock.now();
        let (mut l0, mut l1, mut image, mut pressed) = (0, 0, 0, 0);
        let (mut lag_layers, mut lag_bytes, mut upload_pressed) = (0, 0, 0);
        let all = tenants.all();
        // Timelines deleted or detached since the last round are forgotten:
        // under branch churn the map would otherwise grow with every branch.
        let present: std::collections::HashSet<_> = all.iter().map(|e| (e.tl.tenant_id, e.tl.timeline_id)).collect();
        last_gc.retain(|key, _| present.contains(key));
        for entry in all {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let tl = &entry.tl;
            if tl.is_broken() {
                continue;
            }
            let compacted = guarded(tenants, tl, "compaction", || {
                tl.compact(false, &mut Throttle::new(rate, tenants.resources.clock.clone()), stop).map(drop)
            });
            let key = (tl.tenant_id, tl.timeline_id);
            // Leases granted before a restart are not known here: they are
            // renewed within a minute, and until one TTL has passed GC waits.
            let leases_known = clock.since(launched) >= crate::limits::LEASE_TTL;
            let gc_due = last_gc.get(&key).is_none_or(|t| clock.since(*t) >= tenants.conf.gc_period);
            if compacted && leases_known && gc_due {
                last_gc.insert(key, clock.now());
                let _ = guarded(tenants, tl, "GC", || tl.gc(&gc_policy, crate::clock::pg_now(clock)).map(drop));
            }
            let (_, counts) = tl.layer_count();
            l0 += counts.l0;
            l1 += counts.l1;
            image += counts.image;
            pressed += usize::from(tl.backpressure());
            if let Some(u) = tl.upload_status() {
                lag_layers += u.upload_queue_layers;
                lag_bytes += u.upload_lag_bytes;
                upload_pressed += usize::from(u.backpressure);
            }
        }
        crate::eviction::evict_to_limit(tenants, tenants.conf.local_cache_bytes);
        crate::eviction::unload_to_limit(tenants, tenants.conf.layer_index_cache_bytes);
        tenants.metrics.upload_queue_layers.set(lag_layers as i64);
        tenants.metrics.upload_lag_bytes.set(lag_bytes as i64);
        tenants.metrics.upload_backpressure_timelines.set(upload_pressed as i64);
        tenants.metrics.l0_layers.set(l0 as i64);
        tenants.metrics.l1_layers.set(l1 as i64);
        tenants.metrics.image_layers.set(image as i64);
        tenants.metrics.backpressure_timelines.set(pressed as i64);
        let mut rest = period.saturating_sub(clock.since(started));
        while !rest.is_zero() && !stop.load(Ordering::SeqCst) {
            let step = rest.min(crate::limits::COMPACTOR_STOP_POLL);
            clock.sleep_blocking(step);
            rest -= step;
        }
    }
}

/// Runs one piece of background work on `tl`: a failure is logged, counted
/// and tried again next round; a panic is a bug in that work and breaks
/// this timeline (re-read from disk), not the pageserver. True if it succeeded.
#[must_use]
fn guarded(tenants: &Tenants, tl: &Timeline, what: &str, f: impl FnOnce() -> Result<(), CompactionError>) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => true,
        Ok(Err(CompactionError::Cancelled)) => false,
        Ok(Err(e)) => {
            tenants.metrics.compaction_errors.inc();
            warn!(tenant = %tl.tenant_id, timeline = %tl.timeline_id, "{what} failed (retried later): {e}");
            false
        }
        Err(panic) => {
            tenants.metrics.compaction_errors.inc();
            let message = strata_service::panic_message(&*panic);
            error!(tenant = %tl.tenant_id, timeline = %tl.timeline_id, "{what} panicked: {message}");
            tl.set_broken(crate::timeline::BrokenKind::Panic, format!("{what} panicked: {message}"));
            false
        }
    }
}
