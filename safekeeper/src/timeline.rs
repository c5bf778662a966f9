//! One timeline on this safekeeper: its acceptor (behind a lock, since
//! proposer connections and status requests share it), its directory, and
//! the positions consumers wait on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use strata_formats::Lsn;
use strata_protocol::safekeeper::{Term, TermHistory, TimelineIdentity};
use strata_protocol::{NodeId, TenantId, TimelineId};

use crate::acceptor::{Acceptor, ControlStore, PersistentState, StorageError, WalStore};
use crate::control_file::ControlFile;
use crate::wal_store::SegmentStore;

/// Positions published to consumers after every change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Positions {
    pub term: Term,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
}

/// A connected consumer, for status.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConsumerInfo {
    pub name: String,
    pub sent_lsn: Lsn,
    pub applied_lsn: Lsn,
}

pub type TimelineAcceptor = Acceptor<SegmentStore, ControlFile>;

/// A timeline held by this safekeeper.
pub struct Timeline {
    pub identity: TimelineIdentity,
    pub dir: PathBuf,
    pub start_lsn: Lsn,
    acceptor: Mutex<TimelineAcceptor>,
    positions: tokio::sync::watch::Sender<Positions>,
    pub consumers: Mutex<HashMap<u64, ConsumerInfo>>,
    pub last_error: Mutex<Option<String>>,
    last_persist: Mutex<Instant>,
}

/// Directory of a timeline under the data directory.
pub fn timeline_dir(data_dir: &Path, tenant: TenantId, timeline: TimelineId) -> PathBuf {
    data_dir.join(tenant.to_string()).join(timeline.to_string())
}

impl Timeline {
    /// Creates a new timeline whose WAL starts at `start_lsn`.
    pub fn create(
        data_dir: &Path,
        node_id: NodeId,
        identity: &TimelineIdentity,
        start_lsn: Lsn,
        no_sync: bool,
    ) -> Result<Arc<Timeline>, StorageError> {
        let dir = timeline_dir(data_dir, identity.tenant_id, identity.timeline_id);
        std::fs::create_dir_all(&dir).map_err(|e| StorageError(format!("creating {}: {e}", dir.display())))?;
        let mut control = ControlFile::new(&dir, no_sync);
        if control.load()?.is_some() {
            return Err(StorageError(format!("{} already holds a timeline", dir.display())));
        }
        let state = PersistentState::new(identity, start_lsn);
        control.persist(&state)?;
        Self::open(dir, node_id, state, control, no_sync)
    }

    /// Loads a timeline from its directory.
    pub fn load(dir: &Path, node_id: NodeId, no_sync: bool) -> Result<Arc<Timeline>, StorageError> {
        let control = ControlFile::new(dir, no_sync);
        let state = control.load()?.ok_or_else(|| StorageError(format!("{}: no control file", dir.display())))?;
        Self::open(dir.to_path_buf(), node_id, state, control, no_sync)
    }

    fn open(
        dir: PathBuf,
        node_id: NodeId,
        state: PersistentState,
        control: ControlFile,
        no_sync: bool,
    ) -> Result<Arc<Timeline>, StorageError> {
        let identity = state.identity.to_identity();
        let segment_size = u64::from(identity.wal_segment_size);
        if !segment_size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&segment_size) {
            return Err(StorageError(format!("{}: invalid segment size {segment_size}", dir.display())));
        }
        let store = SegmentStore::open(&dir, segment_size, state.timeline_start_lsn, state.flush_lsn_hint, no_sync)?;
        let start_lsn = state.timeline_start_lsn;
        let acceptor = Acceptor::new(node_id, state, store, control);
        let positions = Positions {
            term: acceptor.state().term,
            flush_lsn: acceptor.flush_lsn(),
            commit_lsn: acceptor.state().commit_lsn,
        };
        Ok(Arc::new(Timeline {
            identity,
            dir,
            start_lsn,
            acceptor: Mutex::new(acceptor),
            positions: tokio::sync::watch::channel(positions).0,
            consumers: Mutex::new(HashMap::new()),
            last_error: Mutex::new(None),
            last_persist: Mutex::new(Instant::now()),
        }))
    }

    /// Runs `f` on the acceptor, then publishes the new positions and, at
    /// most once a second, rewrites the control file (so restarts scan little WAL).
    pub fn with_acceptor<R>(&self, f: impl FnOnce(&mut TimelineAcceptor) -> R) -> R {
        let mut acceptor = self.acceptor.lock().expect("acceptor lock poisoned");
        let result = f(&mut acceptor);
        let now = Positions {
            term: acceptor.state().term,
            flush_lsn: acceptor.flush_lsn(),
            commit_lsn: acceptor.state().commit_lsn,
        };
        let mut last = self.last_persist.lock().expect("lock poisoned");
        if last.elapsed().as_secs() >= 1 {
            *last = Instant::now();
            if let Err(e) = acceptor.persist() {
                tracing::warn!(timeline = %self.identity.timeline_id, "persisting control file: {e}");
            }
        }
        self.positions.send_if_modified(|p| {
            let changed = *p != now;
            *p = now;
            changed
        });
        result
    }

    /// The lowest applied LSN its consumers reported (`Lsn::INVALID` if none reported yet).
    pub fn consumer_applied_lsn(&self) -> Lsn {
        let consumers = self.consumers.lock().expect("lock poisoned");
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
        self.acceptor.lock().expect("acceptor lock poisoned").held_history()
    }

    /// JSON status for the HTTP API.
    pub fn status(&self) -> serde_json::Value {
        let (state, write_lsn) = {
            let a = self.acceptor.lock().expect("acceptor lock poisoned");
            (a.state().clone(), a.wal().write_lsn())
        };
        let p = self.positions();
        serde_json::json!({
            "tenant_id": self.identity.tenant_id,
            "timeline_id": self.identity.timeline_id,
            "system_id": self.identity.system_id,
            "pg_version": self.identity.pg_version,
            "wal_segment_size": self.identity.wal_segment_size,
            "timeline_start_lsn": self.start_lsn,
            "term": state.term,
            "term_history": state.term_history.up_to(p.flush_lsn),
            "write_lsn": write_lsn,
            "flush_lsn": p.flush_lsn,
            "commit_lsn": p.commit_lsn,
            "truncate_lsn": state.truncate_lsn,
            "consumers": self.consumers.lock().expect("lock poisoned").values().cloned().collect::<Vec<_>>(),
            "last_error": self.last_error.lock().expect("lock poisoned").clone(),
        })
    }
}
