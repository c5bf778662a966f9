//! Scale to zero (`docs/compute.md`, "Suspend"): an agent given
//! `suspend_after_secs` counts its PostgreSQL's clients about once a second
//! and, once none has been connected for that long, stops the compute the
//! way a SIGTERM does and exits with [`super::exit::SUSPENDED`]; its
//! supervisor then does not start it again. The next `strata endpoint
//! start` wakes it: a normal start, from storage.
//!
//! What happened is kept in a marker file beside the data directory
//! ([`MARKER_FILE`]), written durably before anything stops (`suspending`)
//! and again once nothing of the compute is left (`suspended`): whoever
//! finds the agent gone and the marker there knows the endpoint sleeps and
//! is to be woken, whether or not the suspension was interrupted by a
//! crash. The next start of the compute removes it once running.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_service::clock::timeout;
use tokio::sync::watch;
use tracing::{info, warn};

use super::status::{AgentState, StatusHandle};
use crate::clock::SharedClock;
use crate::limits::{IDLE_POLL, IDLE_QUERY_TIMEOUT};
use crate::pg_replication::{ReplicationConfig, ReplicationConnection};

/// The marker's file name, in the directory of the data directory (the
/// endpoint's directory, beside `postgres.log`).
pub const MARKER_FILE: &str = "suspended";

/// How far a suspension got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Decided and under way: PostgreSQL may still be shutting down. A
    /// marker left in this phase by a crash means the same as `suspended`
    /// to whoever wakes the endpoint: its next start comes from storage.
    Suspending,
    /// PostgreSQL stopped cleanly with its last WAL on the safekeepers,
    /// the lazy file system unmounted; the agent exits a moment later.
    Suspended,
}

/// The marker file's content (JSON).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    pub phase: Phase,
    /// How long no client had been connected when the agent decided, in
    /// whole seconds.
    pub idle_secs: u64,
    /// When it decided (Unix seconds).
    pub decided_at: u64,
    /// When the compute was all stopped (Unix seconds), once `suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_at: Option<u64>,
}

/// The marker of the compute whose data directory is `pgdata`.
pub fn marker_path(pgdata: &Path) -> PathBuf {
    pgdata.parent().unwrap_or(Path::new("/")).join(MARKER_FILE)
}

/// The marker at `path`, if there is one. A file that does not parse (it
/// is only ever replaced whole, so only someone else can have written it)
/// is read as an interrupted suspension: the endpoint is still to be woken.
pub fn read_marker(path: &Path) -> Option<Marker> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).unwrap_or(Marker {
        phase: Phase::Suspending,
        idle_secs: 0,
        decided_at: 0,
        suspended_at: None,
    }))
}

/// Writes the marker durably (the file and its directory are synced
/// before this returns): a crash right after must still find it.
pub fn write_marker(path: &Path, marker: &Marker) -> Result<(), String> {
    let text = serde_json::to_string(marker).expect("a marker serializes") + "\n";
    strata_service::durable::replace_file(path, text.as_bytes(), true).map_err(|e| e.to_string())
}

/// Removes the marker, durably; whether there was one.
pub fn clear_marker(path: &Path) -> Result<bool, String> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    strata_service::durable::sync_dir(strata_service::durable::parent_of(path)).map_err(|e| e.to_string())?;
    Ok(true)
}

/// What one count of the clients says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A client is connected, or nothing could be counted.
    Busy,
    /// No client, for this long so far.
    Idle(Duration),
    /// No client for at least the idle period: suspend.
    Suspend(Duration),
}

/// The idle period's state: when the clients were last seen gone. A pure
/// function of the counts and the times they were taken at.
#[derive(Clone, Debug)]
pub struct IdleTracker {
    after: Duration,
    idle_since: Option<Instant>,
}

impl IdleTracker {
    /// Suspends after `after` without a client.
    pub fn new(after: Duration) -> IdleTracker {
        IdleTracker { after, idle_since: None }
    }

    /// A count taken at `now`: `Some(n)` clients, or `None` when there was
    /// nothing to count (PostgreSQL not running, or no answer). Only an
    /// unbroken run of zeros counts as idle: a client, or a count that
    /// could not be made, starts the period over, so that a compute is
    /// never suspended on a guess.
    pub fn observe(&mut self, now: Instant, clients: Option<u64>) -> Verdict {
        if clients != Some(0) {
            self.idle_since = None;
            return Verdict::Busy;
        }
        let since = *self.idle_since.get_or_insert(now);
        let idle = now.saturating_duration_since(since);
        if idle >= self.after {
            Verdict::Suspend(idle)
        } else {
            Verdict::Idle(idle)
        }
    }
}

/// The count of clients: client backends other than the agent's own
/// sessions (through the Unix socket as the superuser under the
/// application name `strata_agent`: this one, a replica's position polls,
/// the status server's checkpoints), and walsenders other than the WAL
/// proposer's (a `pg_basebackup` or a logical replication client is
/// activity; replicas follow the safekeepers, never a compute).
fn count_query(proposer: &str) -> String {
    let proposer = proposer.replace('\'', "''");
    format!(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (\
         (backend_type = 'client backend' AND NOT (application_name = 'strata_agent' \
         AND client_addr IS NULL AND usename = current_user)) \
         OR (backend_type = 'walsender' AND application_name <> '{proposer}'))"
    )
}

/// A suspension decided by the watch: the stop it requested is one.
pub type Decided = Arc<Mutex<Option<Marker>>>;

/// Watches a compute's clients and requests the suspension.
pub(super) struct IdleWatch {
    pub after: Duration,
    pub status: StatusHandle,
    /// The agent's own session through the socket.
    pub conn: ReplicationConfig,
    /// The proposer's application name (its walsender is no client).
    pub proposer: String,
    pub marker: PathBuf,
    pub clock: SharedClock,
    /// The run's free space maps, sent before a suspension is decided.
    pub fsm: super::fsm_sync::FsmSlot,
}

impl IdleWatch {
    /// Counts the clients every [`IDLE_POLL`] while the compute is
    /// `running`; once none was seen for the idle period, writes the
    /// marker, records the decision in `decided` and requests the stop.
    pub async fn run(self, stop: watch::Sender<bool>, decided: Decided) {
        let mut tracker = IdleTracker::new(self.after);
        let mut conn: Option<ReplicationConnection> = None;
        let mut warned = false;
        let query = count_query(&self.proposer);
        loop {
            self.clock.sleep(IDLE_POLL).await;
            let clients = if self.status.agent().state == AgentState::Running {
                match self.count(&mut conn, &query).await {
                    Ok(n) => {
                        warned = false;
                        Some(n)
                    }
                    Err(e) => {
                        conn = None;
                        if !warned {
                            warn!("counting PostgreSQL's clients: {e}; not idle until a count succeeds");
                            warned = true;
                        }
                        None
                    }
                }
            } else {
                // A new server comes with new sessions.
                conn = None;
                None
            };
            let Verdict::Suspend(idle) = tracker.observe(self.clock.now(), clients) else { continue };
            if !self.maps_sent_and_still_idle(&mut conn, &query).await {
                tracker = IdleTracker::new(self.after);
                continue;
            }
            let marker = Marker {
                phase: Phase::Suspending,
                idle_secs: idle.as_secs(),
                decided_at: crate::clock::unix_now(&*self.clock),
                suspended_at: None,
            };
            if let Err(e) = write_marker(&self.marker, &marker) {
                // Without the marker a crash would look like a plain stop.
                warn!("writing {}: {e}; not suspending now", self.marker.display());
                tracker = IdleTracker::new(self.after);
                continue;
            }
            // The maps are sent: the stop that follows sends none.
            self.fsm.lock().take();
            info!(idle_secs = marker.idle_secs, "no client connected for {idle:?}: suspending");
            *decided.lock().unwrap_or_else(|e| e.into_inner()) = Some(marker);
            drop(conn);
            let _ = stop.send(true);
            return;
        }
    }

    /// Sends the free space maps (a checkpoint first), as a stop would,
    /// before the suspension is decided: from the decision on PostgreSQL
    /// must refuse clients, and a client that arrives meanwhile is served
    /// and keeps the compute up. Whether it is still idle after.
    async fn maps_sent_and_still_idle(&self, conn: &mut Option<ReplicationConnection>, query: &str) -> bool {
        let Some(scanner) = self.fsm.lock().clone() else { return true };
        super::fsm_sync::logged_pass(scanner, self.conn.clone(), self.clock.clone(), true).await;
        matches!(self.count(conn, query).await, Ok(0))
    }

    /// One count, over the agent's session (made again after an error).
    async fn count(&self, conn: &mut Option<ReplicationConnection>, query: &str) -> Result<u64, String> {
        let ask = async {
            if conn.is_none() {
                *conn = Some(ReplicationConnection::connect(&self.conn).await.map_err(|e| e.to_string())?);
            }
            let c = conn.as_mut().expect("connected above");
            let rows = c.simple_query(query).await.map_err(|e| e.to_string())?;
            let text = rows.first().and_then(|r| r.first()).cloned().flatten().ok_or("no count")?;
            text.parse::<u64>().map_err(|_| format!("not a count: {text:?}"))
        };
        timeout(&*self.clock, IDLE_QUERY_TIMEOUT, ask)
            .await
            .map_err(|_| format!("no answer within {IDLE_QUERY_TIMEOUT:?}"))?
    }
}

/// After a stop that a suspension requested: the marker says it is done
/// (PostgreSQL stopped, the mounts gone). A failure to write it is logged:
/// the `suspending` marker left means the same to whoever wakes it.
pub(super) fn complete(path: &Path, mut marker: Marker, clock: &SharedClock) -> Marker {
    marker.phase = Phase::Suspended;
    marker.suspended_at = Some(crate::clock::unix_now(&**clock));
    if let Err(e) = write_marker(path, &marker) {
        warn!("writing {}: {e}", path.display());
    }
    info!(idle_secs = marker.idle_secs, "suspended: nothing of the compute runs");
    marker
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_service::clock::{Clock, ManualClock};

    #[test]
    fn suspends_after_an_unbroken_idle_period() {
        let t0 = ManualClock::new().now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut idle = IdleTracker::new(Duration::from_secs(3));
        assert_eq!(idle.observe(s(0), Some(2)), Verdict::Busy);
        assert_eq!(idle.observe(s(1), Some(0)), Verdict::Idle(Duration::ZERO));
        assert_eq!(idle.observe(s(2), Some(0)), Verdict::Idle(Duration::from_secs(1)));
        assert_eq!(idle.observe(s(3), Some(0)), Verdict::Idle(Duration::from_secs(2)));
        assert_eq!(idle.observe(s(4), Some(0)), Verdict::Suspend(Duration::from_secs(3)));
        // Asked again it still says so (the watch stops at the first).
        assert_eq!(idle.observe(s(5), Some(0)), Verdict::Suspend(Duration::from_secs(4)));
    }

    #[test]
    fn a_client_or_a_failed_count_starts_the_period_over() {
        let t0 = ManualClock::new().now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut idle = IdleTracker::new(Duration::from_secs(3));
        for (n, clients) in [(0, Some(0)), (1, Some(0)), (2, Some(0))] {
            assert!(matches!(idle.observe(s(n), clients), Verdict::Idle(_)));
        }
        // A client comes and goes just before the period ends.
        assert_eq!(idle.observe(s(3), Some(1)), Verdict::Busy);
        assert_eq!(idle.observe(s(4), Some(0)), Verdict::Idle(Duration::ZERO));
        assert_eq!(idle.observe(s(6), Some(0)), Verdict::Idle(Duration::from_secs(2)));
        // PostgreSQL restarting, or a count without an answer: not idle.
        assert_eq!(idle.observe(s(7), None), Verdict::Busy);
        assert_eq!(idle.observe(s(8), Some(0)), Verdict::Idle(Duration::ZERO));
        assert_eq!(idle.observe(s(11), Some(0)), Verdict::Suspend(Duration::from_secs(3)));
    }

    #[test]
    fn counts_are_taken_at_irregular_times() {
        // A slow count delays the next one: the period is measured in time,
        // not in counts.
        let t0 = ManualClock::new().now();
        let mut idle = IdleTracker::new(Duration::from_secs(2));
        assert_eq!(idle.observe(t0, Some(0)), Verdict::Idle(Duration::ZERO));
        let late = t0 + Duration::from_millis(2500);
        assert_eq!(idle.observe(late, Some(0)), Verdict::Suspend(Duration::from_millis(2500)));
        let mut zero = IdleTracker::new(Duration::ZERO);
        assert_eq!(zero.observe(t0, Some(0)), Verdict::Suspend(Duration::ZERO));
        assert_eq!(zero.observe(t0, Some(1)), Verdict::Busy);
    }

    #[test]
    fn the_marker_is_written_read_and_cleared() {
        let dir = std::env::temp_dir().join(format!("strata-suspend-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = marker_path(&dir.join("pgdata"));
        assert_eq!(path, dir.join(MARKER_FILE));
        assert_eq!(read_marker(&path), None);
        assert!(!clear_marker(&path).unwrap());
        let m = Marker { phase: Phase::Suspending, idle_secs: 2, decided_at: 100, suspended_at: None };
        write_marker(&path, &m).unwrap();
        assert_eq!(read_marker(&path), Some(m.clone()));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"phase\":\"suspending\""), "{text}");
        let done = complete(&path, m, &SharedClock::default());
        assert_eq!(done.phase, Phase::Suspended);
        assert!(done.suspended_at.is_some());
        assert_eq!(read_marker(&path), Some(done));
        // Someone else's file there still means: to be woken.
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(read_marker(&path).map(|m| m.phase), Some(Phase::Suspending));
        assert!(clear_marker(&path).unwrap());
        assert_eq!(read_marker(&path), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_count_leaves_out_the_agent_and_the_proposer() {
        let q = count_query("strata_proposer");
        assert!(q.contains("pid <> pg_backend_pid()"), "{q}");
        assert!(q.contains("backend_type = 'client backend'"), "{q}");
        assert!(q.contains("application_name <> 'strata_proposer'"), "{q}");
        // A name is quoted as a literal whatever it holds.
        assert!(count_query("a'b").contains("<> 'a''b'"));
    }
}
