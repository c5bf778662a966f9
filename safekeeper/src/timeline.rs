//! One timeline on this safekeeper: its acceptor (behind a lock, since
//! proposer connections and status requests share it), its directory, and
//! the positions consumers wait on.
//!
//! **Fail-stop.** A storage error (a failed write, fsync or control file
//! update) or a panic in the acceptor's code marks the timeline *failed*:
//! it refuses proposers from then on, because what it holds in memory may
//! no longer match the disk (after a failed fsync the kernel may have
//! dropped the unwritten pages). It comes back only by re-reading its state
//! from disk ([`Timeline::reload`], retried by the background task in
//! `healing`), cut back to the last flush that succeeded, or by a restart.
//! Consumers keep reading the WAL below the published flush LSN, which was
//! durable before the failure. Other timelines are not affected.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::safekeeper::{Term, TermHistory, TimelineIdentity};
use strata_protocol::shard::ShardIndex;
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_service::clock::Clock;
use strata_service::panic_message;

use crate::acceptor::{Acceptor, AcceptorError, PersistentState, StorageError, WalStore as _};
use crate::control_file::ControlFile;
use crate::wal_store::SegmentStore;
pub use strata_protocol::api::safekeeper::{ConsumerStatus, Failure};
use strata_protocol::api::safekeeper::{TimelineState, TimelineStatus};
use strata_service::durable::sync_dir;

/// Positions published to consumers after every change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Positions {
    pub term: Term,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
}

pub type TimelineAcceptor = Acceptor<SegmentStore, ControlFile>;

/// An acceptor call on a timeline that has failed (or failed during the call).
#[derive(Debug, Clone, thiserror::Error)]
#[error("timeline {tenant_id}/{timeline_id} stopped accepting after a failure ({reason}); it resumes once its state has been re-read from disk")]
pub struct TimelineFailed {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub reason: String,
}

/// A timeline held by this safekeeper.
pub struct Timeline {
    pub identity: TimelineIdentity,
    pub dir: PathBuf,
    pub start_lsn: Lsn,
    node_id: NodeId,
    no_sync: bool,
    acceptor: Mutex<TimelineAcceptor>,
    /// Set while the timeline refuses work (see the module docs).
    failure: Mutex<Option<Failure>>,
    /// The most recent failure, kept after a reload (for the status).
    last_failure: Mutex<Option<Failure>>,
    /// Failures so far (each one a new episode for the healing task).
    failures: std::sync::atomic::AtomicU64,
    positions: tokio::sync::watch::Sender<Positions>,
    pub consumers: Mutex<HashMap<u64, ConsumerStatus>>,
    last_persist: Mutex<Instant>,
    /// What is offloaded, where the WAL held begins, and what the
    /// pageserver holds in object storage (see `progress`).
    pub progress: crate::progress::Progress,
    /// Open proposer connections, closed when the membership changes so
    /// their proposers learn the new configuration at once.
    proposers: Mutex<Vec<(u64, std::net::TcpStream)>>,
    next_proposer: std::sync::atomic::AtomicU64,
    /// When a proposer last wrote WAL here (peer recovery waits for none).
    last_append: Mutex<Option<Instant>>,
    /// The replicas' `hot_standby_feedback`, for the proposer.
    pub standby_feedback: crate::standby_feedback::FeedbackRegistry,
    /// The newest pageserver generation of each shard (see `fence`),
    /// made when a consumer of the shard first asks.
    fences: Mutex<BTreeMap<ShardIndex, Arc<crate::fence::Fence>>>,
    /// The decoded streams' shared chunks, one cache per shard layout
    /// streamed now (held by the streams; gone with the last of them).
    decoded: Mutex<Vec<std::sync::Weak<crate::decoded_stream::DecodedCache>>>,
    /// Times the control file's rewrites, failures and appends.
    clock: Arc<dyn Clock>,
    /// Held (shared) by the offloader through each round of writes to
    /// object storage; true once the timeline is deleted. A deletion takes
    /// it exclusively before it lists and deletes the offloaded objects,
    /// so no upload in flight lands after them.
    uploads: tokio::sync::RwLock<bool>,
}

/// Holds a proposer connection's place in its timeline's list.
pub struct ProposerRegistration<'a> {
    timeline: &'a Timeline,
    id: u64,
}

impl Drop for ProposerRegistration<'_> {
    fn drop(&mut self) {
        self.timeline.proposers.lock().retain(|(id, _)| *id != self.id);
    }
}

/// Directory of a timeline under the data directory.
pub fn timeline_dir(data_dir: &Path, tenant: TenantId, timeline: TimelineId) -> PathBuf {
    data_dir.join(tenant.to_string()).join(timeline.to_string())
}

impl Timeline {
    /// Creates a new timeline whose WAL starts at `start_lsn`. The directory
    /// and its entry in the parents are durable before the control file is
    /// written, and the control file before this returns.
    pub fn create(
        data_dir: &Path,
        node_id: NodeId,
        identity: &TimelineIdentity,
        start_lsn: Lsn,
        no_sync: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Timeline>, StorageError> {
        let dir = timeline_dir(data_dir, identity.tenant_id, identity.timeline_id);
        std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("creating", &dir, &e))?;
        if !no_sync {
            // The timeline's directory, and the tenant's in the data directory.
            let tenant_dir = dir.parent().expect("under the tenant's directory");
            sync_dir(tenant_dir)?;
            sync_dir(data_dir)?;
        }
        let mut control = ControlFile::new(&dir, no_sync);
        if control.load()?.is_some() {
            return Err(StorageError::other("creating", &dir, "already holds a timeline"));
        }
        let state = PersistentState::new(identity, start_lsn);
        crate::acceptor::ControlStore::persist(&mut control, &state)?;
        Self::open(dir, node_id, state, control, no_sync, clock)
    }

    /// Loads a timeline from its directory.
    pub fn load(
        dir: &Path,
        node_id: NodeId,
        no_sync: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Timeline>, StorageError> {
        let control = ControlFile::new(dir, no_sync);
        let state = control.load()?.ok_or_else(|| StorageError::other("loading", dir, "no control file"))?;
        Self::open(dir.to_path_buf(), node_id, state, control, no_sync, clock)
    }

    fn open_acceptor(
        dir: &Path,
        node_id: NodeId,
        state: PersistentState,
        control: ControlFile,
        no_sync: bool,
        durable: Option<Lsn>,
    ) -> Result<TimelineAcceptor, StorageError> {
        let segment_size = u64::from(state.identity.wal_segment_size);
        if !segment_size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&segment_size) {
            return Err(StorageError::other("loading", dir, format!("invalid segment size {segment_size}")));
        }
        let start = state.timeline_start_lsn;
        let store = match durable {
            None => SegmentStore::open(dir, segment_size, start, state.flush_lsn_hint, no_sync)?,
            Some(durable) => SegmentStore::reopen(dir, segment_size, start, durable, no_sync)?,
        };
        Ok(Acceptor::new(node_id, state, store, control))
    }

    fn open(
        dir: PathBuf,
        node_id: NodeId,
        state: PersistentState,
        control: ControlFile,
        no_sync: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Timeline>, StorageError> {
        let identity = state.identity.to_identity();
        let start_lsn = state.timeline_start_lsn;
        let acceptor = Self::open_acceptor(&dir, node_id, state, control, no_sync, None)?;
        let progress = crate::progress::Progress::new(acceptor.wal().removed_before());
        let positions = Self::positions_of(&acceptor);
        Ok(Arc::new(Timeline {
            identity,
            dir,
            start_lsn,
            node_id,
            no_sync,
            acceptor: Mutex::new(acceptor),
            failure: Mutex::new(None),
            last_failure: Mutex::new(None),
            failures: std::sync::atomic::AtomicU64::new(0),
            positions: tokio::sync::watch::channel(positions).0,
            consumers: Mutex::new(HashMap::new()),
            last_persist: Mutex::new(clock.now()),
            progress,
            proposers: Mutex::new(Vec::new()),
            next_proposer: std::sync::atomic::AtomicU64::new(0),
            last_append: Mutex::new(None),
            standby_feedback: crate::standby_feedback::FeedbackRegistry::new(clock.clone()),
            fences: Mutex::new(BTreeMap::new()),
            decoded: Mutex::new(Vec::new()),
            clock,
            uploads: tokio::sync::RwLock::new(false),
        }))
    }

    /// The cache of decoded chunks the streams of `layout` share.
    pub fn decoded_cache(
        &self,
        layout: strata_protocol::shard::ShardLayout,
    ) -> Result<Arc<crate::decoded_stream::DecodedCache>, String> {
        let version = strata_formats::version::PgVersion::from_major(self.identity.pg_version)
            .ok_or_else(|| format!("PostgreSQL {} has no decoder here", self.identity.pg_version))?;
        let mut caches = self.decoded.lock();
        caches.retain(|w| w.strong_count() > 0);
        if let Some(c) = caches.iter().filter_map(|w| w.upgrade()).find(|c| c.layout() == layout) {
            return Ok(c);
        }
        let segment_size = u64::from(self.identity.wal_segment_size);
        let cache =
            Arc::new(crate::decoded_stream::DecodedCache::new(layout, version, self.identity.system_id, segment_size));
        caches.push(Arc::downgrade(&cache));
        Ok(cache)
    }

    fn positions_of(acceptor: &TimelineAcceptor) -> Positions {
        Positions {
            term: acceptor.state().term,
            flush_lsn: acceptor.flush_lsn(),
            commit_lsn: acceptor.state().commit_lsn,
        }
    }

    fn failed_error(&self, reason: String) -> TimelineFailed {
        TimelineFailed { tenant_id: self.identity.tenant_id, timeline_id: self.identity.timeline_id, reason }
    }

    /// Why the timeline refuses work, if it does.
    pub fn failure(&self) -> Option<Failure> {
        self.failure.lock().clone()
    }

    /// How many times the timeline has failed since it was loaded.
    pub fn failure_count(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the timeline (see the module docs). `store_flush_lsn` is the
    /// WAL store's own flush LSN (it only advances after a successful sync
    /// and drops at once when a truncation begins); with the published one
    /// (everything acknowledged) it bounds what is known durable.
    fn fail(&self, reason: String, store_flush_lsn: Lsn) {
        let mut failure = self.failure.lock();
        if failure.is_some() {
            return;
        }
        let durable_flush_lsn = self.positions().flush_lsn.min(store_flush_lsn);
        tracing::error!(
            tenant = %self.identity.tenant_id, timeline = %self.identity.timeline_id, %durable_flush_lsn,
            "timeline stops accepting: {reason}"
        );
        let since = self.clock.system_now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let f = Failure { reason, since, durable_flush_lsn, reload_attempts: 0, last_reload_error: None };
        *self.last_failure.lock() = Some(f.clone());
        *failure = Some(f);
        self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Lists a proposer connection (a clone of its socket) until the
    /// registration is dropped.
    pub fn register_proposer(&self, socket: std::net::TcpStream) -> ProposerRegistration<'_> {
        let id = self.next_proposer.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.proposers.lock().push((id, socket));
        ProposerRegistration { timeline: self, id }
    }

    /// Closes every proposer connection (after a membership change): each
    /// proposer reconnects and is told the new configuration in the greeting.
    /// Leave to write this timeline's objects: `None` once it is deleted.
    /// Held while writing, it keeps a deletion waiting.
    pub async fn upload_leave(&self) -> Option<tokio::sync::RwLockReadGuard<'_, bool>> {
        let guard = self.uploads.read().await;
        (!*guard).then_some(guard)
    }

    /// Waits for the writes to object storage in flight, and allows no more.
    pub async fn stop_uploads(&self) {
        *self.uploads.write().await = true;
    }

    pub fn disconnect_proposers(&self) -> usize {
        let proposers = self.proposers.lock();
        for (_, socket) in proposers.iter() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        proposers.len()
    }

    /// Records that a proposer wrote WAL now.
    pub fn note_append(&self) {
        *self.last_append.lock() = Some(self.clock.now());
    }

    /// How long since a proposer last wrote WAL here (`None`: never since start).
    pub fn since_last_append(&self) -> Option<std::time::Duration> {
        self.last_append.lock().map(|t| self.clock.since(t))
    }

    /// Runs `f` on the acceptor, then publishes the new positions and, at
    /// most once per [`crate::limits::PERSIST_EVERY`], rewrites the control file (so restarts scan
    /// little WAL). A storage error returned by `f`, or a panic in it,
    /// fails the timeline (and the panic becomes an error here).
    pub fn with_acceptor<R>(
        &self,
        f: impl FnOnce(&mut TimelineAcceptor) -> Result<R, AcceptorError>,
    ) -> Result<R, AcceptorCallError> {
        // Checked under the acceptor's lock: a call that waited for it while
        // another call failed the timeline must not run on the failed
        // acceptor (a vote it persisted could be missed by the reload).
        // Locks are always taken in this order: acceptor, then failure.
        let mut acceptor = self.acceptor.lock();
        if let Some(failure) = self.failure() {
            return Err(AcceptorCallError::Failed(self.failed_error(failure.reason)));
        }
        // The acceptor's state may be half-updated after a panic: it is
        // never used again (the timeline fails and reloads from disk).
        let result = match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut acceptor))) {
            Ok(result) => result,
            Err(payload) => {
                let reason = format!("panicked: {}", panic_message(payload.as_ref()));
                self.fail(reason.clone(), acceptor.flush_lsn());
                return Err(AcceptorCallError::Failed(self.failed_error(reason)));
            }
        };
        if let Err(AcceptorError::Storage(e)) = &result {
            let reason = format!("storage: {e}");
            self.fail(reason.clone(), acceptor.flush_lsn());
            return Err(AcceptorCallError::Failed(self.failed_error(reason)));
        }
        // Published only after a successful call: every published flush LSN is durable.
        let now = Self::positions_of(&acceptor);
        self.publish(now);
        let mut last = self.last_persist.lock();
        if self.clock.since(*last) >= crate::limits::PERSIST_EVERY {
            *last = self.clock.now();
            if let Err(e) = acceptor.persist() {
                // What the call did is durable (and may be acknowledged);
                // later calls are refused.
                self.fail(format!("persisting the control file: {e}"), acceptor.flush_lsn());
            }
        }
        result.map_err(AcceptorCallError::Refused)
    }

    fn publish(&self, now: Positions) {
        self.positions.send_if_modified(|p| {
            let changed = *p != now;
            debug_assert!(now.term >= p.term || !changed, "terms never go back");
            *p = now;
            changed
        });
    }

    /// Re-reads the timeline's state from disk after a failure: the control
    /// file, and the WAL cut back to the durable flush LSN. Then writes the
    /// control file again (its flush-LSN hint now the durable flush LSN),
    /// which proves the disk takes a durable write: cutting the WAL back
    /// syncs nothing when there is nothing to cut (e.g. no segment yet), and
    /// a timeline must not accept again on a disk whose fsync still fails.
    /// On success the timeline accepts again.
    pub fn reload(&self) -> Result<(), StorageError> {
        let Some(failure) = self.failure() else { return Ok(()) };
        let result = (|| -> Result<TimelineAcceptor, StorageError> {
            let control = ControlFile::new(&self.dir, self.no_sync);
            let state =
                control.load()?.ok_or_else(|| StorageError::other("reloading", &self.dir, "no control file"))?;
            let mut acceptor = Self::open_acceptor(
                &self.dir,
                self.node_id,
                state,
                control,
                self.no_sync,
                Some(failure.durable_flush_lsn),
            )?;
            acceptor.persist().map_err(|e| match e {
                AcceptorError::Storage(e) => e,
                other => StorageError::other("reloading", &self.dir, other.to_string()),
            })?;
            Ok(acceptor)
        })();
        // No call runs while the timeline is failed, so none wrote the disk
        // since it was read. Same lock order as `with_acceptor`.
        let mut current = self.acceptor.lock();
        let mut slot = self.failure.lock();
        match result {
            Ok(acceptor) => {
                let now = Self::positions_of(&acceptor);
                *current = acceptor;
                *slot = None;
                drop(slot);
                self.publish(now);
                drop(current);
                tracing::info!(
                    tenant = %self.identity.tenant_id, timeline = %self.identity.timeline_id,
                    flush_lsn = %now.flush_lsn, "timeline re-read from disk; accepting again"
                );
                Ok(())
            }
            Err(e) => {
                if let Some(f) = slot.as_mut() {
                    f.reload_attempts += 1;
                    f.last_reload_error = Some(e.to_string());
                }
                Err(e)
            }
        }
    }

    /// The lowest applied LSN its consumers reported (`Lsn::INVALID` if none reported yet).
    pub fn consumer_applied_lsn(&self) -> Lsn {
        let consumers = self.consumers.lock();
        consumers.values().map(|c| c.applied_lsn).filter(|l| *l != Lsn::INVALID).min().unwrap_or(Lsn::INVALID)
    }

    /// Positions as of now, and a receiver to wait for changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Positions> {
        self.positions.subscribe()
    }

    pub fn positions(&self) -> Positions {
        *self.positions.borrow()
    }

    /// Term history of the WAL held.
    pub fn held_history(&self) -> TermHistory {
        self.acceptor.lock().held_history()
    }

    /// Admits a WAL consumer of attachment generation `generation` (0: not
    /// a pageserver, always admitted). A newer generation is durable before
    /// it is admitted, so that a restart still refuses the older ones.
    pub fn admit_consumer(
        &self,
        shard: ShardIndex,
        generation: u32,
    ) -> Result<Result<crate::fence::StreamFence, crate::fence::Stale>, AcceptorCallError> {
        let fence = self.fence(shard)?;
        if generation != 0 {
            // Only a newer generation needs the acceptor (to be made
            // durable): a reconnect of the current one streams even from a
            // timeline that has stopped accepting WAL.
            if generation > fence.newest() {
                let newest = self.with_acceptor(|a| a.note_pageserver_generation(shard, generation))?;
                fence.raise(newest);
            }
            let newest = fence.newest();
            if generation < newest {
                let (tenant, timeline) = (self.identity.tenant_id, self.identity.timeline_id);
                return Ok(Err(crate::fence::Stale { tenant, timeline, shard, generation, newest }));
            }
        }
        Ok(Ok(crate::fence::StreamFence::new(&fence, generation)))
    }

    /// The fence of `shard`'s pageservers, from the control file the first time.
    pub fn fence(&self, shard: ShardIndex) -> Result<Arc<crate::fence::Fence>, AcceptorCallError> {
        if let Some(f) = self.fences.lock().get(&shard) {
            return Ok(f.clone());
        }
        let newest = self.with_acceptor(|a| Ok(a.state().pageserver_generation_of(shard)))?;
        let mut fences = self.fences.lock();
        let f = fences.entry(shard).or_insert_with(|| Arc::new(crate::fence::Fence::new(newest, self.clock.clone())));
        Ok(f.clone())
    }

    /// Writes the control file (at shutdown); not for a failed timeline.
    pub fn persist(&self) -> Result<(), AcceptorCallError> {
        self.with_acceptor(|a| a.persist())
    }

    /// Seals the timeline (`docs/sites.md`, "Site failover"): durably, then
    /// every proposer connection is closed (each would be refused at its
    /// next message anyway). Returns whether it was sealed now.
    pub fn seal(&self) -> Result<bool, AcceptorCallError> {
        let sealed_now = self.with_acceptor(|a| {
            let was = a.state().sealed;
            a.seal()?;
            Ok(!was)
        })?;
        if sealed_now {
            let closed = self.disconnect_proposers();
            tracing::info!(tenant = %self.identity.tenant_id, timeline = %self.identity.timeline_id, closed,
                "timeline sealed: it accepts no writer any more");
        }
        Ok(sealed_now)
    }

    /// Whether the timeline is sealed.
    pub fn is_sealed(&self) -> bool {
        self.acceptor.lock().state().sealed
    }

    /// JSON status for the HTTP API.
    pub fn status(&self) -> TimelineStatus {
        let (state, write_lsn) = {
            let a = self.acceptor.lock();
            (a.state().clone(), a.wal().write_lsn())
        };
        let p = self.positions();
        let failure = self.failure();
        TimelineStatus {
            tenant_id: self.identity.tenant_id,
            timeline_id: self.identity.timeline_id,
            system_id: self.identity.system_id,
            pg_version: self.identity.pg_version,
            wal_segment_size: self.identity.wal_segment_size,
            timeline_start_lsn: self.start_lsn,
            state: if failure.is_some() { TimelineState::Failed } else { TimelineState::Active },
            term: state.term,
            term_history: state.term_history.up_to(p.flush_lsn),
            membership: state.membership,
            elected_term: state.term_history.last_term(),
            elected_generation: state.elected_generation,
            write_lsn,
            flush_lsn: p.flush_lsn,
            commit_lsn: p.commit_lsn,
            truncate_lsn: state.truncate_lsn,
            consumers: self.consumers.lock().values().cloned().collect(),
            offload: self.progress.offload(),
            removal: self.progress.removal(),
            remote_consistent_lsn: self.progress.remote_consistent_lsn(),
            pageserver_generation: state.pageserver_generation,
            sealed: state.sealed,
            commit_before_seal: state.commit_before_seal,
            last_error: self.last_failure.lock().as_ref().map(|f| f.reason.clone()),
            failure,
            peers: None,
        }
    }
}

/// Why an acceptor call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AcceptorCallError {
    /// The acceptor refused the message (protocol, term, version…).
    #[error(transparent)]
    Refused(AcceptorError),
    /// The timeline has failed; see [`Failure`].
    #[error(transparent)]
    Failed(TimelineFailed),
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::safekeeper::{ProposerElected, ProposerMessage, VoteRequest};

    fn clock() -> Arc<dyn Clock> {
        Arc::new(strata_service::clock::ManualClock::new())
    }

    fn identity() -> TimelineIdentity {
        TimelineIdentity {
            tenant_id: TenantId([1; 16]),
            timeline_id: TimelineId([2; 16]),
            system_id: 7,
            pg_version: 15,
            wal_segment_size: 1 << 20,
        }
    }

    #[test]
    fn a_panic_fails_only_the_timeline_and_a_reload_recovers_it() {
        let dir = std::env::temp_dir().join(format!("strata-sk-timeline-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tl = Timeline::create(&dir, NodeId(1), &identity(), Lsn(2 << 20), false, clock()).unwrap();
        let vote = ProposerMessage::VoteRequest(VoteRequest { term: 3 });
        tl.with_acceptor(|a| a.handle(&vote)).unwrap();
        let err = tl.with_acceptor(|_| -> Result<(), AcceptorError> { panic!("injected") }).unwrap_err();
        assert!(matches!(&err, AcceptorCallError::Failed(f) if f.reason.contains("injected")), "{err}");
        assert_eq!(tl.status().state, TimelineState::Failed);
        // Refused while failed, without running the call.
        let ran = std::cell::Cell::new(false);
        assert!(tl
            .with_acceptor(|_| {
                ran.set(true);
                Ok(())
            })
            .is_err());
        assert!(!ran.get());
        // Another timeline in the same process is untouched.
        let mut other_id = identity();
        other_id.timeline_id = TimelineId([3; 16]);
        let other = Timeline::create(&dir, NodeId(1), &other_id, Lsn(2 << 20), false, clock()).unwrap();
        other.with_acceptor(|a| a.handle(&vote)).unwrap();
        // The reload re-reads the control file: the vote in term 3 survived.
        tl.reload().unwrap();
        assert_eq!(tl.status().state, TimelineState::Active);
        assert_eq!(tl.positions().term, 3);
        let elected = ProposerMessage::Elected(ProposerElected {
            term: 3,
            start_streaming_at: Lsn(2 << 20),
            timeline_start_lsn: Lsn(2 << 20),
            term_history: TermHistory(vec![strata_protocol::safekeeper::TermLsn { term: 3, lsn: Lsn(2 << 20) }]),
        });
        tl.with_acceptor(|a| a.handle(&elected)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A call that was waiting for the acceptor while another call failed
    /// the timeline is refused without running (it would run on the failed
    /// acceptor: a vote it persisted could be missed by the reload), and a
    /// reload meanwhile does not deadlock with it.
    #[test]
    fn a_call_waiting_while_the_timeline_fails_is_refused() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::mpsc;
        use std::time::Duration;
        let dir = std::env::temp_dir().join(format!("strata-sk-timeline-waiting-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tl = Timeline::create(&dir, NodeId(1), &identity(), Lsn(2 << 20), false, clock()).unwrap();
        let storage_error = || AcceptorError::Storage(StorageError::other("syncing", Path::new("x"), "injected"));

        // A holds the acceptor and fails the timeline once B waits for it.
        let (held_tx, held_rx) = mpsc::channel();
        let a = {
            let tl = tl.clone();
            std::thread::spawn(move || {
                tl.with_acceptor(|_| -> Result<(), AcceptorError> {
                    held_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(200));
                    Err(storage_error())
                })
            })
        };
        held_rx.recv().unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        // B reports when its call starts running, or when it returned.
        let (b_tx, b_rx) = mpsc::channel();
        let b = {
            let (tl, ran, b_tx) = (tl.clone(), ran.clone(), b_tx.clone());
            std::thread::spawn(move || {
                let result = tl.with_acceptor(|a| {
                    ran.store(true, Ordering::SeqCst);
                    b_tx.send("running").unwrap();
                    a.handle(&ProposerMessage::VoteRequest(VoteRequest { term: 5 }))?;
                    // A slow disk, then another storage error.
                    std::thread::sleep(Duration::from_millis(300));
                    Err::<(), _>(storage_error())
                });
                b_tx.send("returned").unwrap();
                result
            })
        };
        assert!(matches!(a.join().unwrap(), Err(AcceptorCallError::Failed(_))));
        b_rx.recv().unwrap();
        // The reload, in the background, while B runs if it does: it must finish.
        let (done_tx, done_rx) = mpsc::channel();
        {
            let tl = tl.clone();
            std::thread::spawn(move || done_tx.send(tl.reload()).unwrap());
        }
        let reloaded = done_rx.recv_timeout(Duration::from_secs(10)).expect("the reload deadlocked");
        let b = b.join().unwrap();
        assert!(matches!(&b, Err(AcceptorCallError::Failed(_))), "{b:?}");
        assert!(!ran.load(Ordering::SeqCst), "a call ran on the failed acceptor");
        reloaded.unwrap();
        assert_eq!(tl.positions().term, 0, "no vote was given while failed");
        tl.with_acceptor(|a| a.handle(&ProposerMessage::VoteRequest(VoteRequest { term: 5 }))).unwrap();
        assert_eq!(tl.positions().term, 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A timeline with no WAL yet has nothing to cut back or sync when it is
    /// re-read: the reload must still not succeed while the disk refuses a
    /// durable write (here: the control file's temporary name is taken by a
    /// directory, so writing it fails, even as root).
    #[test]
    fn a_reload_fails_while_the_control_file_cannot_be_written() {
        let dir = std::env::temp_dir().join(format!("strata-sk-timeline-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let start = Lsn(2 << 20);
        let tl = Timeline::create(&dir, NodeId(1), &identity(), start, false, clock()).unwrap();
        tl.with_acceptor(|_| -> Result<(), AcceptorError> { panic!("injected") }).unwrap_err();
        let blocker = strata_service::durable::temp_path(&tl.dir.join(crate::control_file::CONTROL_FILE_NAME));
        std::fs::create_dir(&blocker).unwrap();
        for attempt in 1..=2 {
            let err = tl.reload().unwrap_err();
            assert!(err.to_string().contains(&format!("safekeeper.control.{}.tmp", std::process::id())), "{err}");
            let failure = tl.failure().expect("still failed");
            assert_eq!(failure.reload_attempts, attempt);
            assert_eq!(failure.durable_flush_lsn, start);
            assert_eq!(tl.status().state, TimelineState::Failed);
        }
        // Writable again: the reload succeeds, and wrote the control file.
        std::fs::remove_dir(&blocker).unwrap();
        let inode = || {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(tl.dir.join(crate::control_file::CONTROL_FILE_NAME)).unwrap().ino()
        };
        let before = inode();
        tl.reload().unwrap();
        assert!(tl.failure().is_none());
        assert_ne!(inode(), before, "the reload replaced the control file");
        assert_eq!(tl.positions().flush_lsn, start);
        let vote = ProposerMessage::VoteRequest(VoteRequest { term: 1 });
        tl.with_acceptor(|a| a.handle(&vote)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
