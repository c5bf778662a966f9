//! Garbage collection (`docs/bottomless-pageserver.md`, "Garbage collection").
//!
//! The cutoff is the lower of the LSN `gc_horizon` bytes behind
//! `disk_consistent_lsn` and the LSN of the newest commit older than
//! `pitr_interval` (commit times are versions of [`Key::commit_time`]), and
//! never above a leased LSN. Reads below the cutoff are refused from then
//! on, except at a retained LSN (a branch point), which a child reads
//! through. A layer is removed when no read it could serve remains: every
//! read at or above the cutoff, and every read at a retained point below
//! it, finds each key in an image at or below its LSN before reaching the
//! layer (image runs cover every key of the key space).

use std::time::Duration;

use strata_formats::Lsn;
use tracing::info;

use super::compaction::CompactionError;
use super::{ReadError, Timeline};
use crate::layer::layer_file::{LayerKind, LayerName};
use strata_protocol::api::pageserver::GcOutcome;

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
    /// above it needs. `now` is in PostgreSQL's time (`strata_formats::time`).
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
        // Branch points do not hold the cutoff back: reads at exactly them
        // stay possible below it (`check_read_point`), and GC keeps only
        // the layers those reads visit. Leases do hold it: a read-only
        // compute's lease is short-lived and renewed, and its reads are
        // checked like any other.
        let mut cutoff = horizon.min(pitr);
        // Leases and branch points are granted under this lock after
        // checking the announced cutoff: held from reading them until the
        // new cutoff is announced below.
        let leases = self.leases.lock();
        let retain_lsns = self.metadata().retain_lsns;
        if let Some(oldest) = leases.oldest(self.clock.now()) {
            cutoff = cutoff.min(oldest);
        }
        // Never lower than a cutoff already announced: reads below it were
        // refused. (No commit old enough and no horizon yet: 0/0, nothing to do.)
        let cutoff = cutoff.max(meta.gc_cutoff_lsn);
        let historic = self.historic();
        let mut images: Vec<Lsn> =
            historic.iter().filter(|l| l.name.kind == LayerKind::Image).map(|l| l.name.lsn_start).collect();
        images.sort_unstable();
        images.dedup();
        let points: Vec<Lsn> = retain_lsns.iter().copied().filter(|r| *r < cutoff).collect();
        let image = newest_image_at_or_below(&images, cutoff);
        let mut outcome = GcOutcome { cutoff, image_lsn: image, retained_points: points.clone(), ..Default::default() };
        let removed: Vec<LayerName> = historic
            .iter()
            .filter(|l| removable(&l.name, cutoff, &points, &images))
            .map(|l| {
                outcome.bytes_removed += l.file_size;
                l.name
            })
            .collect();
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

/// The newest image LSN at or below `lsn` (`images` sorted).
fn newest_image_at_or_below(images: &[Lsn], lsn: Lsn) -> Option<Lsn> {
    images.partition_point(|i| *i <= lsn).checked_sub(1).map(|n| images[n])
}

/// Whether a read at `point` can need `layer`: it is the newest image at
/// or below the point, or it holds versions after that image and at or
/// before the point (all of them, with no such image).
fn needed_at(layer: &LayerName, point: Lsn, images: &[Lsn]) -> bool {
    if layer.lsn_start > point {
        return false;
    }
    match newest_image_at_or_below(images, point) {
        None => true,
        Some(i) if layer.kind == LayerKind::Image && layer.lsn_start == i => true,
        // Versions in [lsn_start, lsn_end) meet (i, point].
        Some(i) => layer.lsn_end.0 > i.0 + 1 && i < point,
    }
}

/// Whether GC may remove `layer`: no read at or above `cutoff` and none at
/// a retained point below it (`points`) can need it.
fn removable(layer: &LayerName, cutoff: Lsn, points: &[Lsn], images: &[Lsn]) -> bool {
    // Reads at or above the cutoff: each finds every key at the newest image
    // at or below the cutoff, or newer; they need the layers with versions
    // after that image.
    let above = match newest_image_at_or_below(images, cutoff) {
        None => true,
        Some(i) => layer.lsn_end.0 > i.0 + 1 || (layer.kind == LayerKind::Image && layer.lsn_start == i),
    };
    !above && !points.iter().any(|p| needed_at(layer, *p, images))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn delta(start: u64, end: u64) -> LayerName {
        LayerName::delta(Key::MIN, Key::MAX, Lsn(start), Lsn(end))
    }

    fn image(at: u64) -> LayerName {
        LayerName::image(Key::MIN, Key::MAX, Lsn(at))
    }

    #[test]
    fn layers_removed_are_those_no_read_visits() {
        // Images at 100, 300 and 500; deltas between them.
        let images = [Lsn(100), Lsn(300), Lsn(500)];
        let gone = |l: LayerName, cutoff: u64, points: &[u64]| {
            let points: Vec<Lsn> = points.iter().map(|p| Lsn(*p)).collect();
            removable(&l, Lsn(cutoff), &points, &images)
        };
        // No branch point: everything older than the newest image at or
        // below the cutoff goes, that image and what is newer stay.
        assert!(gone(delta(0, 100), 550, &[]));
        assert!(gone(image(100), 550, &[]));
        assert!(gone(delta(300, 500), 550, &[]));
        assert!(gone(delta(300, 501), 550, &[]), "versions up to the image's LSN are in the image");
        assert!(!gone(delta(300, 502), 550, &[]));
        assert!(!gone(image(500), 550, &[]));
        assert!(!gone(delta(500, 600), 550, &[]));
        assert!(!gone(delta(600, 700), 550, &[]));
        // No image at or below the cutoff: nothing goes.
        assert!(!gone(delta(0, 50), 90, &[]));
        // A branch point at 200 reads image 100 and the deltas up to 200.
        assert!(gone(delta(0, 100), 550, &[200]));
        assert!(!gone(image(100), 550, &[200]));
        assert!(!gone(delta(100, 200), 550, &[200]));
        assert!(!gone(delta(150, 250), 550, &[200]), "straddles the point");
        assert!(gone(delta(201, 300), 550, &[200]), "wholly after the point");
        assert!(gone(image(300), 550, &[200]));
        // A point before any image keeps everything it can reach.
        assert!(!gone(delta(0, 100), 550, &[50]));
        assert!(gone(delta(60, 100), 550, &[50]));
        // A point exactly at an image reads only that image.
        assert!(!gone(image(300), 550, &[300]));
        assert!(gone(delta(200, 301), 550, &[300]));
        assert!(gone(delta(200, 302), 550, &[300]), "its versions after 300 are not read there");
        assert!(!gone(delta(200, 302), 301, &[300]), "but at the cutoff 301 they are");
        // An image exactly at the cutoff: reads above it need what follows.
        assert!(!gone(delta(250, 302), 300, &[]));
        assert!(gone(delta(250, 301), 300, &[]));
    }
}
