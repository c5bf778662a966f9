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

use prometheus_client::metrics::gauge::Gauge;
use strata_formats::Lsn;
use strata_protocol::api::safekeeper::RemovalStatus;
use strata_service::clock::Clock;
use tracing::{info, warn};

use crate::config::SafekeeperConfig;
use crate::limits::{REMOVAL_FULL_ROUND_EVERY, REMOVAL_TICK};
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::timeline::Timeline;

/// What the removal of every timeline shares: which inputs bound the
/// horizon, the peers' views and the metrics. Each timeline's manager runs
/// [`Remover::run`] for its timeline.
pub struct Remover {
    /// With object storage: the offloaded LSN bounds the horizon.
    offloads: bool,
    /// Without object storage, or with a peer that cannot learn where this
    /// one's WAL begins: the truncate LSN bounds the horizon.
    keeps_for_peers: bool,
    views: Arc<PeerViews>,
    metrics: Arc<Metrics>,
    /// Times the rounds.
    clock: Arc<dyn Clock>,
}

impl Remover {
    /// The removal of the safekeeper `config` describes; `offloads`: it has object storage.
    pub fn new(
        config: &SafekeeperConfig,
        offloads: bool,
        views: Arc<PeerViews>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Remover {
        // A peer learns where this one's WAL begins over HTTP, and only then recovers from object storage.
        let peers_recover = config.peers.iter().filter(|p| p.id != config.id).all(|p| p.http.is_some());
        Remover { offloads, keeps_for_peers: !offloads || !peers_recover, views, metrics, clock }
    }

    /// Removes what one timeline no longer needs, forever. Its segments'
    /// bytes are its share of the `local_wal_bytes` gauge (none while it
    /// is failed or its removal fails), taken back when the loop ends.
    pub async fn run(&self, tl: &Timeline) {
        let mut share = GaugeShare { gauge: self.metrics.local_wal_bytes.clone(), value: 0 };
        let mut segments_removed = 0;
        // What the last round that succeeded saw, and rounds since it.
        let mut done: Option<RoundInputs> = None;
        let mut skipped = 0u32;
        loop {
            self.clock.sleep(REMOVAL_TICK).await;
            if tl.failure().is_some() {
                share.set(0);
                done = None;
                continue;
            }
            // An idle timeline's round would find what the last one found:
            // skipped, since a round holds the acceptor's lock and so leaves
            // the runtime's worker thread (a thread per idle timeline
            // otherwise). Every REMOVAL_FULL_ROUND_EVERY rounds one runs anyway.
            let inputs = self.inputs(tl);
            if done.as_ref() == Some(&inputs) && skipped + 1 < REMOVAL_FULL_ROUND_EVERY {
                skipped += 1;
                continue;
            }
            skipped = 0;
            match tokio::task::block_in_place(|| self.remove(tl, &mut segments_removed)) {
                Ok(bytes) => {
                    share.set(bytes);
                    done = Some(inputs);
                }
                Err(e) => {
                    share.set(0);
                    done = None;
                    warn!(tenant = %tl.identity.tenant_id, timeline = %tl.identity.timeline_id, "removing WAL: {e}")
                }
            }
        }
    }

    /// What a round's outcome depends on that can be read without the
    /// acceptor's lock: the published positions, the pageserver's and the
    /// offload's progress, and the live peers' positions.
    fn inputs(&self, tl: &Timeline) -> RoundInputs {
        let p = tl.positions();
        RoundInputs {
            positions: (p.term, p.flush_lsn, p.commit_lsn),
            remote_consistent: tl.progress.remote_consistent_lsn(),
            offloaded: tl.progress.offloaded_lsn(),
            peers: self.views.live(tl.identity.tenant_id, tl.identity.timeline_id),
        }
    }

    /// One round: moves the timeline's horizon, removes the segments below
    /// it; returns the bytes of segments held.
    fn remove(&self, tl: &Timeline, segments_removed: &mut u64) -> Result<u64, String> {
        let segment_size = u64::from(tl.identity.wal_segment_size);
        let (truncate, hint, flush, removed_before) = tl
            .with_acceptor(|a| {
                let s = a.state();
                Ok((s.truncate_lsn, s.flush_lsn_hint, a.flush_lsn(), a.wal().removed_before()))
            })
            .map_err(|e| e.to_string())?;
        // The pageserver reports to the safekeeper it streams from; the others learn it from their peers.
        for (_, p) in self.views.live(tl.identity.tenant_id, tl.identity.timeline_id) {
            tl.progress.note_remote_consistent(p.remote_consistent_lsn);
        }
        let remote_consistent = tl.progress.remote_consistent_lsn();
        let offloaded = tl.progress.offloaded_lsn();
        let mut inputs = vec![
            ("the pageserver's remote_consistent_lsn", remote_consistent),
            ("the flush LSN in the control file", hint),
        ];
        if self.offloads {
            inputs.push(("the offload", offloaded));
        }
        if self.keeps_for_peers {
            inputs.push(("a peer's flush LSN (the truncate LSN)", truncate));
        }
        let (held_back_by, horizon) = inputs.iter().copied().min_by_key(|(_, lsn)| *lsn).expect("not empty");
        let horizon = Lsn(horizon.0.min(flush.0) / segment_size * segment_size);
        let mut removed = 0;
        let mut spares = tl.progress.removal().spare_segments;
        let mut now_before = removed_before;
        if horizon > removed_before {
            // A failed removal (returned inside `Ok`) does not fail the
            // timeline: it is retried a second later.
            let (result, kept) = tl
                .with_acceptor(|a| Ok((a.wal_mut().remove_before(horizon), a.wal_mut().spare_segments())))
                .map_err(|e| e.to_string())?;
            removed = result.map_err(|e| e.to_string())?;
            spares = kept as u64;
            now_before = horizon;
            if removed > 0 {
                self.metrics.segments_removed.inc_by(removed);
                info!(
                    tenant = %tl.identity.tenant_id, timeline = %tl.identity.timeline_id, segments = removed,
                    from = %removed_before, to = %horizon, %remote_consistent, truncate_lsn = %truncate,
                    offloaded_lsn = %offloaded, flush_lsn_hint = %hint, "removed WAL segments"
                );
            }
        }
        if removed == 0 {
            // New segments take spares between removals: the count is read anew.
            spares = tl.with_acceptor(|a| Ok(a.wal_mut().spare_segments() as u64)).unwrap_or(spares);
        }
        let first = now_before.0 / segment_size;
        let local = (flush.0.div_ceil(segment_size).max(first + 1) - first) * segment_size;
        *segments_removed += removed;
        tl.progress.set_removal(RemovalStatus {
            removed_before: now_before,
            horizon,
            held_back_by: held_back_by.to_string(),
            local_wal_bytes: local,
            segments_removed: *segments_removed,
            spare_segments: spares,
        });
        Ok(local)
    }
}

/// The inputs of a removal round (see [`Remover::inputs`]).
#[derive(Debug, PartialEq)]
struct RoundInputs {
    positions: (strata_protocol::safekeeper::Term, Lsn, Lsn),
    remote_consistent: Lsn,
    offloaded: Lsn,
    peers: Vec<(strata_protocol::NodeId, strata_protocol::api::safekeeper::TimelinePositions)>,
}

/// One timeline's part of a gauge that sums every timeline's: kept up to
/// date by adding differences, taken back when dropped (the timeline was
/// deleted, or the safekeeper stops).
struct GaugeShare {
    gauge: Gauge,
    value: i64,
}

impl GaugeShare {
    fn set(&mut self, value: u64) {
        let value = value as i64;
        self.gauge.inc_by(value - self.value);
        self.value = value;
    }
}

impl Drop for GaugeShare {
    fn drop(&mut self) {
        self.gauge.dec_by(self.value);
    }
}
