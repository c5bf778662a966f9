//! WAL removal: a safekeeper deletes a local segment once nobody can need
//! it from this disk. The horizon of a timeline is the lowest of
//!
//! - the pageserver's `remote_consistent_lsn` (the highest it reported, to
//!   this safekeeper or to a live peer): object storage holds layers with
//!   every change below it;
//! - with object storage, the offloaded LSN: the WAL below it is in object
//!   storage, where a peer that lacks it recovers it from (`recovery`);
//! - without object storage, the truncate LSN the proposer sends: every
//!   safekeeper has flushed the WAL below it, so no peer recovers it from
//!   here. (With object storage it is left out: a safekeeper that is down
//!   would otherwise hold every peer's WAL until it returns; peers without
//!   an HTTP address cannot learn where this one's WAL begins, so then it
//!   stays.)
//! - the flush LSN the control file records: a restart finds the end of
//!   the WAL by reading from there, so that segment stays.
//!
//! Only whole segments below the horizon go. Every removal is logged with
//! the LSNs that allowed it, and the status names what holds the horizon
//! back.

use std::sync::Arc;
use std::time::Duration;

use strata_formats::Lsn;
use tracing::{info, warn};

use crate::shared::Shared;
use crate::timeline::Timeline;

mod state;
pub use state::{RemoteConsistent, RemovalState};

/// How often every timeline is looked at.
const TICK: Duration = Duration::from_secs(1);

/// Removes what every timeline no longer needs, forever.
pub async fn run(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(TICK).await;
        let mut local = 0;
        for tl in shared.timelines.all() {
            if tl.failure().is_some() {
                continue;
            }
            match tokio::task::block_in_place(|| remove(&shared, &tl)) {
                Ok(bytes) => local += bytes,
                Err(e) => {
                    warn!(tenant = %tl.identity.tenant_id, timeline = %tl.identity.timeline_id, "removing WAL: {e}")
                }
            }
        }
        shared.metrics.local_wal_bytes.set(local as i64);
    }
}

/// One timeline: moves its horizon, removes the segments below it;
/// returns the bytes of segments held.
fn remove(shared: &Shared, tl: &Timeline) -> Result<u64, String> {
    let segment_size = u64::from(tl.identity.wal_segment_size);
    let (truncate, hint, flush, removed_before) = tl
        .with_acceptor(|a| {
            let s = a.state();
            Ok((s.truncate_lsn, s.flush_lsn_hint, a.flush_lsn(), a.wal().removed_before()))
        })
        .map_err(|e| e.to_string())?;
    // The pageserver reports to the safekeeper it streams from; the others learn it from their peers.
    for (_, p) in shared.peers.live(tl.identity.tenant_id, tl.identity.timeline_id) {
        tl.remote_consistent.note(p.remote_consistent_lsn);
    }
    let remote_consistent = tl.remote_consistent.get();
    let offloaded = tl.offload.lock().offloaded_lsn;
    let mut inputs = vec![
        ("the pageserver's remote_consistent_lsn", remote_consistent),
        ("the flush LSN in the control file", hint),
    ];
    // A peer learns where this one's WAL begins over HTTP, and only then recovers from object storage.
    let peers_recover = shared.config.peers.iter().filter(|p| p.id != shared.config.id).all(|p| p.http.is_some());
    if shared.remote.is_some() {
        inputs.push(("the offload", offloaded));
    }
    if shared.remote.is_none() || !peers_recover {
        inputs.push(("a peer's flush LSN (the truncate LSN)", truncate));
    }
    let (held_back_by, horizon) = inputs.iter().copied().min_by_key(|(_, lsn)| *lsn).expect("not empty");
    let horizon = Lsn(horizon.0.min(flush.0) / segment_size * segment_size);
    let mut removed = 0;
    let mut now_before = removed_before;
    if horizon > removed_before {
        // A failed removal (returned inside `Ok`) does not fail the
        // timeline: it is retried a second later.
        removed = tl
            .with_acceptor(|a| Ok(a.wal_mut().remove_before(horizon)))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        now_before = horizon;
        if removed > 0 {
            shared.metrics.segments_removed.inc_by(removed);
            info!(
                tenant = %tl.identity.tenant_id, timeline = %tl.identity.timeline_id, segments = removed,
                from = %removed_before, to = %horizon, %remote_consistent, truncate_lsn = %truncate,
                offloaded_lsn = %offloaded, flush_lsn_hint = %hint, "removed WAL segments"
            );
        }
    }
    let first = now_before.0 / segment_size;
    let local = (flush.0.div_ceil(segment_size).max(first + 1) - first) * segment_size;
    let mut state = tl.removal.lock();
    state.removed_before = now_before;
    state.horizon = horizon;
    state.held_back_by = held_back_by;
    state.local_wal_bytes = local;
    state.segments_removed += removed;
    Ok(local)
}
