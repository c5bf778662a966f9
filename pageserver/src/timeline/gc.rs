//! Garbage collection (`docs/bottomless-pageserver.md`, "Garbage collection").
//!
//! The cutoff is the lower of the LSN `gc_horizon` bytes behind
//! `disk_consistent_lsn` and the LSN of the newest commit older than
//! `pitr_interval` (commit times are versions of [`Key::commit_time`]), and
//! never above a retained LSN (a branch point). Reads below the cutoff are
//! refused from then on. A layer is removed when every version in it is
//! older than an image layer at or below the cutoff: image runs cover every
//! key, so the newest such image answers every read at or above the cutoff.

use std::time::Duration;

use strata_formats::Lsn;
use tracing::info;

use super::compaction::CompactionError;
use super::{ReadError, Timeline};
use crate::layer::layer_file::{LayerKind, LayerName};

/// How much history a timeline keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// Reads stay possible at any LSN committed within this long (0: none kept).
    pub pitr_interval: Duration,
    /// ... and within this many bytes of WAL behind the newest durable LSN.
    pub gc_horizon: u64,
}

impl Default for GcPolicy {
    fn default() -> GcPolicy {
        GcPolicy { pitr_interval: Duration::from_secs(7 * 24 * 3600), gc_horizon: 64 << 20 }
    }
}

/// What one GC did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcOutcome {
    /// The cutoff now in force.
    pub cutoff: Lsn,
    /// The image all removed layers lie below.
    pub image_lsn: Option<Lsn>,
    pub layers_removed: usize,
    pub bytes_removed: u64,
}

/// Microseconds between 1970-01-01 and 2000-01-01, PostgreSQL's epoch.
pub const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// Now, as PostgreSQL stamps commits (µs since 2000-01-01).
pub fn pg_now() -> i64 {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(unix.as_micros()).unwrap_or(i64::MAX) - PG_EPOCH_OFFSET_US
}

impl Timeline {
    /// The newest LSN at or below `upto` whose last recorded commit is at or
    /// before `time` (µs since 2000-01-01); `None` if no commit that old
    /// was recorded. Commit times are written in increasing order, so a
    /// binary search over LSNs finds it in a few dozen reads.
    pub fn lsn_for_commit_time(&self, time: i64, upto: Lsn) -> Result<Option<Lsn>, ReadError> {
        let floor = self.metadata().start_lsn.max(self.gc_cutoff_lsn());
        if upto < floor {
            return Ok(None);
        }
        // Invariant: every LSN in [floor, lo] satisfies "no commit recorded, or one at or before `time`".
        let older = |lsn: Lsn| -> Result<bool, ReadError> { Ok(self.commit_time_at(lsn)?.is_none_or(|t| t <= time)) };
        if !older(floor)? {
            return Ok(None);
        }
        let (mut lo, mut hi) = (floor.0, upto.0);
        if older(upto)? {
            lo = hi;
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if older(Lsn(mid))? {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        // An LSN before any commit was recorded gives no time to compare.
        Ok(self.commit_time_at(Lsn(lo))?.map(|_| Lsn(lo)))
    }

    /// The branch point for time `time` (µs since 2000-01-01): after every
    /// commit stamped at or before it and before the first stamped after
    /// it, as PostgreSQL's recovery_target_time stops (`docs/branches.md`).
    /// That first commit's record ends at a version of the commit-time key;
    /// 8 bytes before its end lies inside it, so the state there has every
    /// record before it and not the commit. With no commit after `time`
    /// yet, the newest record end. `None`: no commit that old is readable.
    pub fn lsn_for_time(&self, time: i64) -> Result<Option<Lsn>, ReadError> {
        let upto = self.record_lsns().last;
        let Some(lo) = self.lsn_for_commit_time(time, upto)? else { return Ok(None) };
        if lo == upto {
            return Ok(Some(upto));
        }
        let commit_end = lo.0 + 1;
        debug_assert!(commit_end.is_multiple_of(8), "records end at aligned LSNs");
        Ok(Some(Lsn(commit_end - 8)))
    }

    /// Raises the cutoff per `policy` and removes the layers no read at or
    /// above it needs. `now` is in PostgreSQL's time (see [`pg_now`]).
    pub fn gc(&self, policy: &GcPolicy, now: i64) -> Result<GcOutcome, CompactionError> {
        let _one = self.compaction_lock.lock();
        self.check_broken()?;
        let meta = self.metadata();
        let durable = meta.disk_consistent_lsn;
        let horizon = Lsn(durable.0.saturating_sub(policy.gc_horizon));
        let pitr = if policy.pitr_interval.is_zero() {
            durable
        } else {
            let before = now.saturating_sub(i64::try_from(policy.pitr_interval.as_micros()).unwrap_or(i64::MAX));
            self.lsn_for_commit_time(before, durable)?.unwrap_or(Lsn::INVALID)
        };
        let mut cutoff = horizon.min(pitr);
        for retained in &meta.retain_lsns {
            cutoff = cutoff.min(*retained);
        }
        // Leases are granted under this lock after checking the announced
        // cutoff: held until the new cutoff is announced below.
        let leases = self.leases.lock();
        let now_instant = std::time::Instant::now();
        for (lsn, until) in leases.iter() {
            if *until > now_instant {
                cutoff = cutoff.min(*lsn);
            }
        }
        // Never lower than a cutoff already announced: reads below it were
        // refused. (No commit old enough and no horizon yet: 0/0, nothing to do.)
        let cutoff = cutoff.max(meta.gc_cutoff_lsn);
        let historic = self.historic();
        let image = historic
            .iter()
            .filter(|l| l.name.kind == LayerKind::Image && l.name.lsn_start <= cutoff)
            .map(|l| l.name.lsn_start)
            .max();
        let mut outcome = GcOutcome { cutoff, image_lsn: image, ..Default::default() };
        let removed: Vec<LayerName> = match image {
            Some(i) => historic
                .iter()
                .filter(|l| l.name.lsn_end.0 <= i.0 + 1)
                .filter(|l| !(l.name.kind == LayerKind::Image && l.name.lsn_start == i))
                .map(|l| {
                    outcome.bytes_removed += l.file_size;
                    l.name
                })
                .collect(),
            None => Vec::new(),
        };
        outcome.layers_removed = removed.len();
        if cutoff == meta.gc_cutoff_lsn && removed.is_empty() {
            return Ok(outcome);
        }
        // Reads below the cutoff are refused before any layer goes (reads in
        // flight keep the files they hold until they finish).
        self.gc_cutoff.fetch_max(cutoff.0, std::sync::atomic::Ordering::AcqRel);
        drop(leases);
        self.install_layers_with(Vec::new(), &removed, |m| m.gc_cutoff_lsn = cutoff)?;
        self.metrics.gc_layers_removed.inc_by(removed.len() as u64);
        self.metrics.gc_bytes_removed.inc_by(outcome.bytes_removed);
        if !removed.is_empty() {
            info!(
                tenant = %self.tenant_id, timeline = %self.timeline_id, %cutoff, image = ?image,
                layers = removed.len(), bytes = outcome.bytes_removed, "garbage collected layers"
            );
        }
        Ok(outcome)
    }
}
