//! WAL offload: completed, committed segments of every timeline go to
//! object storage, byte for byte as the safekeepers hold them (the
//! consistency bit left as is), each followed by a small metadata object
//! with its checksum. Layout and format: `docs/safekeeper.md`, "WAL in
//! object storage".
//!
//! One safekeeper offloads a timeline: of the live members that hold it
//! (this one and the peers that answered lately, see `peers`), the one with
//! the lowest node id. It uploads each segment once it holds it whole and
//! knows it committed. When it dies, the others stop seeing it within
//! `limits::LIVE_FOR` and the next one takes over. (Choosing by positions
//! as well would make the choice flap: peers' positions are up to a second
//! old while the WAL moves on.) Committed WAL is the same on every safekeeper, and a
//! segment's object name is fixed, so two members that briefly both think
//! they offload (a stale view) write the same bytes to the same names:
//! nothing is duplicated, nothing is lost.
//!
//! A segment counts as offloaded only once its metadata object exists and
//! matches it, so a crash between the two uploads leaves a segment that
//! the next offloader simply uploads again.
//!
//! The segment being written is offloaded as a partial segment (its
//! committed prefix) once committed WAL beyond what object storage holds
//! has waited `partial_offload_after`: a compute that stops leaves its last
//! segment incomplete for good, and its last commits would otherwise be on
//! the safekeepers' disks only. The offloader replaces the partial segment
//! as the WAL grows and deletes it once the whole segment is uploaded.
//!
//! Offloaded WAL is an archive with a bound: the offloader deletes segments
//! older than `wal_archive_retention` once the pageserver's
//! `remote_consistent_lsn` is past them (a pageserver rebuilt from its
//! newest index never needs them; a restore from an older base backup or
//! an older index needs them only within the retention).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_formats::wal::segment::SegmentName;
use strata_formats::Lsn;
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_remote_storage::wal::{
    meta_key, partial_key, partial_meta_key, segment_key, timeline_prefix, SegmentMeta, FORMAT_VERSION, PG_TIMELINE,
};
use strata_remote_storage::RemoteStorage;
use strata_service::clock::Clock;
use tracing::{info, warn};

use crate::config::{Peer, SafekeeperConfig};
use crate::limits::{
    EXPIRE_EVERY, LIVE_FOR, OFFLOAD_SEGMENTS_PER_TICK, OFFLOAD_TICK, UPLOAD_ATTEMPTS, UPLOAD_RETRY_DELAYS,
    UPLOAD_TIMEOUT,
};
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::timeline::Timeline;
use crate::wal_store::segment_path;

mod state;
use state::OffloadState;

/// What the offload of every timeline shares: the object storage, this
/// safekeeper's place among its peers, and the configured limits. Each
/// timeline's manager runs [`Offloader::run`] for its timeline.
pub struct Offloader {
    storage: RemoteStorage,
    me: NodeId,
    /// The configured peers, whose views must settle before anything is offloaded.
    peers: Vec<Peer>,
    views: Arc<PeerViews>,
    partial_offload_after: Duration,
    wal_archive_retention: Duration,
    metrics: Arc<Metrics>,
    /// Times the rounds, the waits before offloading and the archive's age.
    clock: Arc<dyn Clock>,
}

impl Offloader {
    /// An offloader to `storage` for the safekeeper `config` describes.
    pub fn new(
        storage: &RemoteStorage,
        config: &SafekeeperConfig,
        views: Arc<PeerViews>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Offloader {
        let (min_delay, max_delay) = UPLOAD_RETRY_DELAYS;
        let storage = storage.clone().with_retries(UPLOAD_TIMEOUT, UPLOAD_ATTEMPTS, min_delay, max_delay);
        info!(storage = %storage.describe(), "offloading completed WAL segments");
        Offloader {
            storage,
            me: config.id,
            peers: config.peers.clone(),
            views,
            partial_offload_after: config.partial_offload_after,
            wal_archive_retention: config.wal_archive_retention,
            metrics,
            clock,
        }
    }

    /// Offloads one timeline's WAL, forever. What it remembers between
    /// rounds is its own; its status is published in the timeline's progress.
    pub async fn run(&self, tl: &Arc<Timeline>) {
        let mut state = OffloadState::default();
        loop {
            self.clock.sleep(OFFLOAD_TICK).await;
            // Until every peer answered or stayed silent long enough, a live one
            // with a lower id looks dead, and this one would offload what that one does.
            if !self.views.settled(&self.peers) || tl.failure().is_some() {
                continue;
            }
            // A deleted timeline writes nothing more (its deletion waits
            // for this round to end before it deletes the objects).
            let Some(_leave) = tl.upload_leave().await else { return };
            match self.offload_timeline(tl, &mut state).await {
                Ok(()) => state.last_error = None,
                Err(e) => {
                    self.metrics.offload_errors.inc();
                    if state.last_error.as_ref() != Some(&e) {
                        warn!(tenant = %tl.identity.tenant_id, timeline = %tl.identity.timeline_id, "offloading WAL: {e}");
                    }
                    state.last_error = Some(e);
                }
            }
            tl.progress.set_offload(state.status());
        }
    }

    /// Offloads what this safekeeper is to offload of one timeline now.
    async fn offload_timeline(&self, tl: &Arc<Timeline>, state: &mut OffloadState) -> Result<(), String> {
        let (tenant, timeline) = (tl.identity.tenant_id, tl.identity.timeline_id);
        let segment_size = u64::from(tl.identity.wal_segment_size);
        let first = tl.start_lsn.0 / segment_size;
        let seen = *state.first_seen.get_or_insert_with(|| self.clock.now());
        if self.clock.since(seen) < LIVE_FOR {
            return Ok(());
        }
        if !state.listed {
            let done = offloaded_in_storage(&self.storage, tenant, timeline, first, segment_size).await?;
            state.offloaded_lsn = state.offloaded_lsn.max(done);
            state.listed = true;
        }
        // The peers' view changes once a second: taken once per tick.
        let peers = self.views.live(tenant, timeline);
        let mut offloaded = state.offloaded_lsn;
        // What a live peer offloaded is in object storage (it uploaded it or saw it there).
        for (_, p) in &peers {
            if p.offloaded_lsn > offloaded && p.offloaded_lsn.0.is_multiple_of(segment_size) {
                offloaded = p.offloaded_lsn;
            }
        }
        let offloader =
            peers.iter().map(|(id, _)| *id).chain([self.me]).min_by_key(|id| id.0).expect("this one at least");
        state.offloaded_lsn = offloaded;
        state.offloader = Some(offloader);
        // Removal and the peers go by the offloaded LSN: shown as soon as it moves.
        tl.progress.set_offload(state.status());
        if offloader != self.me {
            return Ok(());
        }
        for _ in 0..OFFLOAD_SEGMENTS_PER_TICK {
            let segno = (offloaded.0 / segment_size).max(first);
            let end = Lsn((segno + 1) * segment_size);
            let mine = tl.positions();
            if mine.flush_lsn < end || mine.commit_lsn < end {
                break;
            }
            self.upload_segment(tl, segno, segment_size).await?;
            offloaded = end;
            state.offloaded_lsn = end;
            tl.progress.set_offload(state.status());
        }
        self.offload_partial(tl, state, offloaded).await?;
        let every = EXPIRE_EVERY.min(self.wal_archive_retention);
        if state.expired_at.is_none_or(|t| self.clock.since(t) >= every) {
            self.expire_archive(tl).await?;
            state.expired_at = Some(self.clock.now());
        }
        Ok(())
    }

    /// Deletes archived segments older than the retention that the pageserver
    /// no longer needs (metadata first: a segment without metadata is not
    /// offloaded to any reader).
    async fn expire_archive(&self, tl: &Arc<Timeline>) -> Result<(), String> {
        let (tenant, timeline) = (tl.identity.tenant_id, tl.identity.timeline_id);
        let segment_size = u64::from(tl.identity.wal_segment_size);
        let needed_from = tl.progress.remote_consistent_lsn();
        if needed_from == Lsn(0) {
            return Ok(()); // unknown since the start: keep everything
        }
        let now = self.clock.system_now();
        let objects = self.storage.list(&timeline_prefix(tenant, timeline)).await.map_err(|e| e.to_string())?;
        let mut expired = 0;
        for o in &objects {
            let Some(name) = o.key.rsplit('/').next().and_then(|n| n.strip_suffix(".json")) else { continue };
            let Some(segment) = SegmentName::parse(name, segment_size).filter(|s| s.timeline == PG_TIMELINE) else {
                continue;
            };
            let end = (segment.segment_number + 1) * segment_size;
            let old = now.duration_since(o.last_modified).unwrap_or_default() >= self.wal_archive_retention;
            if end > needed_from.0 || !old {
                continue;
            }
            for key in [
                meta_key(tenant, timeline, segment.segment_number, segment_size),
                segment_key(tenant, timeline, segment.segment_number, segment_size),
            ] {
                self.storage.delete(&key).await.map_err(|e| e.to_string())?;
            }
            expired += 1;
        }
        if expired > 0 {
            self.metrics.archived_segments_expired.inc_by(expired);
            info!(%tenant, %timeline, segments = expired, remote_consistent = %needed_from,
                  retention_s = self.wal_archive_retention.as_secs(), "deleted archived WAL past its retention");
        }
        Ok(())
    }

    /// Offloads the committed part of the segment being written once it has
    /// waited `partial_offload_after` beyond what object storage holds.
    async fn offload_partial(
        &self,
        tl: &Arc<Timeline>,
        state: &mut OffloadState,
        offloaded: Lsn,
    ) -> Result<(), String> {
        let segment_size = u64::from(tl.identity.wal_segment_size);
        let segno = (offloaded.0 / segment_size).max(tl.start_lsn.0 / segment_size);
        let seg_start = Lsn(segno * segment_size);
        let mine = tl.positions();
        let committed = mine.commit_lsn.min(mine.flush_lsn);
        let covered = state.partial_lsn.max(seg_start).max(tl.start_lsn);
        // Whole segments are the loop above's business (or wait for commit).
        if committed <= covered || committed.0 >= seg_start.0 + segment_size {
            state.uncovered_since = None;
            return Ok(());
        }
        let since = *state.uncovered_since.get_or_insert_with(|| self.clock.now());
        if self.clock.since(since) < self.partial_offload_after {
            return Ok(());
        }
        self.put_segment(tl, segno, committed).await?;
        state.partial_lsn = committed;
        state.uncovered_since = None;
        tl.progress.set_offload(state.status());
        self.metrics.partial_segments_offloaded.inc();
        let (tenant, timeline) = (tl.identity.tenant_id, tl.identity.timeline_id);
        info!(%tenant, %timeline, segment = segno, end = %committed, "offloaded a partial WAL segment");
        Ok(())
    }

    /// Uploads segment `segno` up to `end` (all of it, or the committed prefix
    /// of a segment being written: a partial segment), then its metadata.
    async fn put_segment(&self, tl: &Arc<Timeline>, segno: u64, end: Lsn) -> Result<(), String> {
        let (tenant, timeline) = (tl.identity.tenant_id, tl.identity.timeline_id);
        let segment_size = u64::from(tl.identity.wal_segment_size);
        let start = Lsn(segno * segment_size);
        debug_assert!(start < end && end.0 <= start.0 + segment_size, "{end} is not in segment {segno}");
        let partial = end.0 < start.0 + segment_size;
        let bytes = read_segment(tl, segno, segment_size, end.0 - start.0).await?;
        let meta = SegmentMeta {
            format_version: FORMAT_VERSION,
            segment_size,
            start_lsn: start,
            end_lsn: end,
            crc32c: crc32c::crc32c(&bytes),
            wal_start_lsn: (tl.start_lsn > start && tl.start_lsn < end).then_some(tl.start_lsn),
            uploaded_by: self.me,
            partial,
        };
        let (key, mkey) = if partial {
            (
                partial_key(tenant, timeline, segno, segment_size),
                partial_meta_key(tenant, timeline, segno, segment_size),
            )
        } else {
            (segment_key(tenant, timeline, segno, segment_size), meta_key(tenant, timeline, segno, segment_size))
        };
        self.storage.put(&key, Bytes::from(bytes)).await.map_err(|e| e.to_string())?;
        self.storage.put(&mkey, Bytes::from(meta.encode())).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Uploads segment `segno`, then its metadata.
    async fn upload_segment(&self, tl: &Arc<Timeline>, segno: u64, segment_size: u64) -> Result<(), String> {
        let (tenant, timeline) = (tl.identity.tenant_id, tl.identity.timeline_id);
        let end = Lsn((segno + 1) * segment_size);
        self.put_segment(tl, segno, end).await?;
        // The whole segment replaces a partial one (this or another offloader's):
        // metadata first, so no reader finds metadata without its object.
        for key in [
            partial_meta_key(tenant, timeline, segno, segment_size),
            partial_key(tenant, timeline, segno, segment_size),
        ] {
            self.storage.delete(&key).await.map_err(|e| e.to_string())?;
        }
        self.metrics.segments_offloaded.inc();
        self.metrics.offload_bytes.inc_by(segment_size);
        info!(%tenant, %timeline, segment = segno, %end, "offloaded a WAL segment");
        Ok(())
    }
}

/// The first `len` bytes of segment `segno` as offloaded (with page
/// headers before the timeline's start).
async fn read_segment(tl: &Arc<Timeline>, segno: u64, segment_size: u64, len: u64) -> Result<Vec<u8>, String> {
    let path = segment_path(&tl.dir, segno, segment_size);
    let mut bytes = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || std::fs::read(path)).await.map_err(|e| e.to_string())?
    }
    .map_err(|e| format!("reading {}: {e}", path.display()))?;
    if (bytes.len() as u64) < len || bytes.len() as u64 > segment_size {
        return Err(format!(
            "{} has {} bytes: {len} of a segment of {segment_size} are to be offloaded",
            path.display(),
            bytes.len()
        ));
    }
    bytes.resize(segment_size as usize, 0);
    fill_headers_before_start(&mut bytes, tl, segno, segment_size)?;
    bytes.truncate(len as usize);
    Ok(bytes)
}

/// The first segment of a timeline that starts inside it holds nothing
/// before the start (no safekeeper ever received it). Stock readers check
/// the segment's long page header and the header of the page they start
/// in, so those pages get headers with no record data: PostgreSQL can then
/// begin replay at the timeline's start (as from its checkpoint), and
/// `pg_waldump` from any page boundary after it.
fn fill_headers_before_start(bytes: &mut [u8], tl: &Timeline, segno: u64, segment_size: u64) -> Result<(), String> {
    use strata_formats::version::XLOG_BLCKSZ;
    use strata_formats::wal::page::{LongHeaderFields, PageHeader, XLP_LONG_HEADER};
    let seg_start = segno * segment_size;
    let start = tl.start_lsn.0;
    if start <= seg_start || start >= seg_start + segment_size {
        return Ok(());
    }
    let magic = match strata_formats::PgVersion::from_major(tl.identity.pg_version) {
        Some(v) => v.wal_page_magic(),
        None => return Err(format!("PostgreSQL {} is not supported", tl.identity.pg_version)),
    };
    let page = XLOG_BLCKSZ as u64;
    let mut at = seg_start;
    // Every page that begins before the start (the start's own page too,
    // unless the start is its first byte: then the WAL holds its header).
    while at < start {
        let off = (at - seg_start) as usize;
        let long = at == seg_start;
        let header = PageHeader {
            magic,
            info: if long { XLP_LONG_HEADER } else { 0 },
            timeline: PG_TIMELINE,
            page_address: Lsn(at),
            remaining_length: 0,
            long: long.then_some(LongHeaderFields {
                system_id: tl.identity.system_id,
                segment_size: segment_size as u32,
                block_size: XLOG_BLCKSZ as u32,
            }),
        };
        let end = off + header.size();
        // Never over WAL the safekeepers hold: only zeros before the start.
        if (at + header.size() as u64) <= start && bytes[off..end].iter().all(|b| *b == 0) {
            header.encode(&mut bytes[off..end]);
        }
        at += page;
    }
    Ok(())
}

/// End of the unbroken run of segments from `first` on that object storage
/// holds with their metadata (`Lsn(0)` if none).
async fn offloaded_in_storage(
    storage: &RemoteStorage,
    tenant: TenantId,
    timeline: TimelineId,
    first: u64,
    segment_size: u64,
) -> Result<Lsn, String> {
    let objects = storage.list(&timeline_prefix(tenant, timeline)).await.map_err(|e| e.to_string())?;
    let mut with_meta: Vec<u64> = objects
        .iter()
        .filter_map(|o| o.key.rsplit('/').next()?.strip_suffix(".json").map(str::to_string))
        .filter_map(|name| SegmentName::parse(&name, segment_size))
        .filter(|s| s.timeline == PG_TIMELINE)
        .map(|s| s.segment_number)
        .collect();
    with_meta.sort_unstable();
    // The archive's oldest segments may have expired: the run starts at the oldest one held.
    let first = with_meta.iter().copied().find(|s| *s >= first).unwrap_or(first);
    let mut next = first;
    for segno in with_meta.into_iter().filter(|s| *s >= first) {
        if segno != next {
            break;
        }
        next += 1;
    }
    Ok(if next == first { Lsn(0) } else { Lsn(next * segment_size) })
}
