//! `strata compute start`: the compute agent in eager mode. It brings up a
//! stock PostgreSQL on a timeline and keeps it running:
//!
//! 1. asks the pageserver about the timeline (system id, segment size);
//! 2. syncs the safekeepers: the end of the timeline's WAL, `L`;
//! 3. waits until the pageserver has ingested the WAL up to `L`;
//! 4. unpacks the pageserver's basebackup at `L` into the data directory;
//! 5. writes PostgreSQL's configuration;
//! 6. starts PostgreSQL and, once it accepts connections, runs the WAL
//!    proposer (its synchronous standby) in this process;
//! 7. on SIGTERM or SIGINT stops PostgreSQL (fast shutdown) while the
//!    proposer makes its last WAL durable.
//!
//! Once the compute has been running, a failure of PostgreSQL or of the
//! proposer leads to a fresh start (steps 1 to 6 again, on the same port)
//! after a backoff ([`restart`]); before that, a failure ends the agent.
//! Status and metrics are served over HTTP ([`status`]). With an idle
//! period, a compute without clients for that long suspends itself
//! ([`suspend`]).

mod activity;
pub mod basebackup;
mod config;
pub mod config_file;
mod error;
pub mod exit;
pub mod fsm_sync;
pub mod lazy;
pub mod leftover;
pub mod materialize;
pub mod pageserver_api;
pub mod pgconf;
pub mod postgres;
mod renewal;
mod replica;
pub mod restart;
mod roles;
mod running;
mod start;
pub mod status;
pub mod suspend;
pub mod trash;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, info, warn};

pub use config::{check_role_name, AgentConfig, ReplicaConfig, DEFAULT_APP_ROLE, SUPERUSER};
use error::fail;
pub use error::AgentError;

use crate::proposer::ProposerStatus;
use pageserver_api::TimelineStatus;
use restart::RestartTracker;
use status::{AgentState, AgentStatus, RestartStatus, StartTimings, StatusHandle};
use strata_protocol::api::pageserver::TimelineState;

/// The major of the PostgreSQL whose programs are in `bin_dir`, from
/// `postgres --version` (`postgres (PostgreSQL) 18.6 (Debian 18.6-3)`).
fn postgres_major(bin_dir: &Path) -> Result<u32, String> {
    let postgres = bin_dir.join("postgres");
    let out = std::process::Command::new(&postgres)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {} --version: {e}", postgres.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_postgres_major(&text).ok_or_else(|| format!("{} --version says {:?}", postgres.display(), text.trim()))
}

/// The major in `postgres --version`'s output.
fn parse_postgres_major(text: &str) -> Option<u32> {
    let version = text.trim().strip_prefix("postgres (PostgreSQL) ")?;
    version.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A receiver that turns true at the first SIGTERM or SIGINT (a graceful stop).
pub fn stop_on_signals() -> std::io::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if *tx.borrow() {
                warn!("{name}: already stopping");
            } else {
                info!("{name}: stopping");
                let _ = tx.send(true);
            }
        }
    });
    Ok(rx)
}

/// Resolves once a stop was requested (never if the sender is gone silently).
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Runs `fut` unless a stop is requested first (then `None`).
async fn unless_stopped<T>(stop: &mut watch::Receiver<bool>, fut: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::select! {
        r = fut => Some(r),
        _ = stop_requested(stop) => None,
    }
}

/// How the agent ended without an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// A stop was requested (SIGTERM, SIGINT): the compute stopped.
    Stopped,
    /// No client was connected for the idle period: the compute stopped
    /// the same way and the marker says so (`suspend`).
    Suspended(suspend::Marker),
}

/// Runs the compute until `stop` turns true (then stops it gracefully and
/// returns `Ended::Stopped`), until it suspends after its idle period
/// (`Ended::Suspended`), or until its first start fails. Failures after it
/// ran are followed by fresh starts.
pub async fn run(cfg: AgentConfig, stop: watch::Receiver<bool>) -> Result<Ended, AgentError> {
    let pgdata = absolute(&cfg.pgdata).map_err(|e| fail("configuration", e))?;
    cfg.restart.validate().map_err(|e| fail("configuration", e))?;
    let (proposer_tx, proposer_rx) = watch::channel(ProposerStatus::default());
    let status = StatusHandle::new(initial_status(&cfg, &pgdata), proposer_rx).with_clock(cfg.clock.clone());
    let lazy = std::sync::Arc::new(lazy::LazyMounts::default());
    let status = if cfg.lazy_page_service.is_some() { status.with_lazy(lazy.stats().clone()) } else { status };
    let status = status.with_shards(cfg.shards.clone());
    let status = if cfg.read_only_at.is_none() && cfg.replica.is_none() {
        status.with_sql(socket_session(&pgdata, &cfg))
    } else {
        status
    };
    let verifier = match &cfg.auth_public_key {
        Some(path) => Some(std::sync::Arc::new(
            strata_service::auth::Verifier::load(path).map_err(|e| fail("auth", e.to_string()))?,
        )),
        None => None,
    };
    let server = match cfg.http {
        Some(addr) => Some(
            status::serve(addr, cfg.http_max_connections, status.clone(), verifier.clone(), cfg.tls_server.clone())
                .await
                .map_err(|e| fail("status server", format!("{addr}: {e}")))?,
        ),
        None => None,
    };
    // Shard 0's page service: a lazy compute's (a sharded tenant's shards
    // name theirs, shard 0's too, from the configuration).
    if let Some(pg) = cfg.lazy_page_service.clone() {
        cfg.shards.home().set_pg(Some(pg));
    }
    let watcher = tokio::spawn(watch_attachment(&cfg, &status, &lazy));
    let renewal = cfg.token.clone().map(|token| {
        let renewal = renewal::Renewal {
            token,
            token_file: cfg.token_file.clone(),
            controllers: cfg.controllers.clone(),
            tenant: cfg.tenant_id,
            tls: cfg.tls_client.clone(),
            verifier: verifier.clone(),
            replica_pgdata: cfg.replica.as_ref().map(|_| pgdata.clone()),
            clock: cfg.clock.clone(),
        };
        let status = status.clone();
        tokio::spawn(renewal.run(move |t| status.update(|s| s.token = Some(t))))
    });
    let marker = suspend::marker_path(&pgdata);
    let fsm = fsm_sync::FsmSlot::default();
    let mut stops = Stops::new(stop, &cfg, (&pgdata, &marker), &status, &fsm);
    let agent = Agent { cfg, pgdata, status: status.clone(), lazy, marker, pg_major: std::sync::OnceLock::new(), fsm };
    let result = agent.run(&mut stops.rx, proposer_tx).await;
    let decided = stops.end();
    watcher.abort();
    if let Some(renewal) = renewal {
        renewal.abort();
    }
    // PostgreSQL is stopped by now: its files can go.
    agent.lazy.unmount(&agent.pgdata);
    let result = match (result, decided) {
        (Ok(()), Some(m)) => Ok(Ended::Suspended(suspend::complete(&agent.marker, m, &agent.cfg.clock))),
        (Ok(()), None) => Ok(Ended::Stopped),
        (Err(e), _) => Err(e),
    };
    if let Err(e) = &result {
        status.update(|s| {
            s.state = AgentState::Failed;
            s.error = Some(e.to_string());
        });
        if server.is_some() {
            agent.cfg.clock.sleep(agent.cfg.failed_linger).await;
        }
    }
    if let Some(server) = server {
        server.abort();
    }
    result
}

/// Follows the tenant's attachment (`pageserver_target`): shard 0's
/// pageserver shows in the status, and a new layout (a split) switches the
/// lazy file system's page source.
fn watch_attachment(
    cfg: &AgentConfig,
    status: &StatusHandle,
    lazy: &std::sync::Arc<lazy::LazyMounts>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let in_use = |t: &crate::pageserver_target::Target| strata_protocol::api::compute::PageserverInUse {
        name: t.name.clone(),
        http: t.http.clone(),
        pg: t.pg.clone(),
        generation: t.generation,
        switches: t.switches,
        reader: t.reader,
    };
    status.update(|s| s.pageserver = Some(in_use(&cfg.shards.home().get())));
    let watch = crate::pageserver_target::AttachmentWatch {
        shards: cfg.shards.clone(),
        controllers: cfg.controllers.clone(),
        site: cfg.pageserver_site.clone(),
        tenant: cfg.tenant_id,
        tls: cfg.tls_client.clone(),
        token: cfg.token.clone(),
    };
    let status = status.clone();
    let lazy = lazy.clone();
    watch.run(
        move |t| status.update(|s| s.pageserver = Some(in_use(t))),
        std::sync::Arc::new(move |shards| lazy.follow_layout(shards)),
    )
}

/// The status before anything started.
fn initial_status(cfg: &AgentConfig, pgdata: &Path) -> AgentStatus {
    AgentStatus {
        state: AgentState::Syncing,
        pg_port: cfg.pg_port,
        pgdata: pgdata.to_path_buf(),
        pg_log: postgres::log_path(pgdata),
        tenant_id: cfg.tenant_id.to_string(),
        timeline_id: cfg.timeline_id.to_string(),
        start_lsn: None,
        error: None,
        timings: StartTimings::default(),
        restart: RestartStatus::default(),
        lazy: None,
        replica: None,
        pageserver: None,
        token: None,
        activity: None,
    }
}

/// What ends a run besides a failure: a stop requested from outside, or
/// the idle watch's decision to suspend (`suspend`), which stops the
/// compute the same way.
struct Stops {
    /// What the agent obeys: true once either asks.
    rx: watch::Receiver<bool>,
    /// Forwarding the outside stop, and the idle watch if any.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    decided: suspend::Decided,
}

impl Stops {
    fn new(
        outside: watch::Receiver<bool>,
        cfg: &AgentConfig,
        (pgdata, marker): (&Path, &Path),
        status: &StatusHandle,
        fsm: &fsm_sync::FsmSlot,
    ) -> Stops {
        let (tx, rx) = watch::channel(false);
        let forward = tokio::spawn({
            let (tx, mut outside) = (tx.clone(), outside);
            async move {
                stop_requested(&mut outside).await;
                let _ = tx.send(true);
            }
        });
        let decided = suspend::Decided::default();
        let idle = cfg.suspend_after.map(|after| {
            let watch = suspend::IdleWatch {
                after,
                status: status.clone(),
                conn: socket_session(pgdata, cfg),
                proposer: cfg.application_name.clone(),
                marker: marker.to_path_buf(),
                clock: cfg.clock.clone(),
                fsm: fsm.clone(),
            };
            tokio::spawn(watch.run(tx, decided.clone()))
        });
        let activity = tokio::spawn(
            activity::ActivityWatch {
                status: status.clone(),
                conn: socket_session(pgdata, cfg),
                clock: cfg.clock.clone(),
            }
            .run(),
        );
        Stops { rx, tasks: [forward, activity].into_iter().chain(idle).collect(), decided }
    }

    /// Ends the tasks; the suspension that stopped the run, if one did.
    fn end(self) -> Option<suspend::Marker> {
        self.tasks.iter().for_each(|t| t.abort());
        self.decided.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The agent's own session through PostgreSQL's Unix socket, as the
/// superuser (`Agent::socket_config`, before there is an agent).
fn socket_session(pgdata: &Path, cfg: &AgentConfig) -> crate::pg_replication::ReplicationConfig {
    let dir = pgconf::socket_dir(pgdata, cfg.pg_port);
    crate::pg_replication::ReplicationConfig {
        application_name: "strata_agent".into(),
        replication: false,
        ..crate::pg_replication::ReplicationConfig::new(dir.to_string_lossy(), cfg.pg_port, cfg.pg_role.clone())
    }
}

/// `path` made absolute against the current directory; not `/` itself.
fn absolute(path: &Path) -> Result<PathBuf, String> {
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| format!("current directory: {e}"))?.join(path)
    };
    if path.parent().is_none() {
        return Err(format!("{} cannot be a data directory", path.display()));
    }
    Ok(path)
}

/// Checks the pageserver's description of the timeline.
fn check_timeline(info: &TimelineStatus) -> Result<(), String> {
    if info.state == TimelineState::Broken {
        return Err(format!(
            "the pageserver reports the timeline broken: {}",
            info.error.as_deref().unwrap_or("no reason given")
        ));
    }
    if strata_formats::PgVersion::from_major(info.pg_version).is_none() {
        return Err(format!("the timeline is of PostgreSQL {}, which this agent does not run", info.pg_version));
    }
    let size = info.wal_segment_size;
    if !size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&size) {
        return Err(format!("invalid WAL segment size {size}"));
    }
    Ok(())
}

/// How one start-and-run of the compute ended.
enum RunEnd {
    /// A stop was requested; the result of stopping.
    Stopped(Result<(), AgentError>),
    /// PostgreSQL or the proposer failed, or the start did; nothing of it
    /// runs any more. `cause` is one line for the status; `running_since`
    /// is when it reached `running`, if it did.
    Failed { error: AgentError, cause: String, running_since: Option<Instant> },
    /// Another writer took the branch over: nothing runs, nothing restarts.
    Fenced(AgentError),
}

/// One start of PostgreSQL: the first, or a restart after a failure.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    /// When this attempt began (its phases are timed from here).
    began: Instant,
    /// For a restart: since when the compute has been down.
    down_since: Option<Instant>,
}

impl Attempt {
    fn is_restart(&self) -> bool {
        self.down_since.is_some()
    }
}

struct Agent {
    cfg: AgentConfig,
    /// Absolute.
    pgdata: PathBuf,
    status: StatusHandle,
    /// A lazy compute's mounts of `base/` and `global/` (shared with the
    /// attachment watcher, which switches their source after a split).
    lazy: std::sync::Arc<lazy::LazyMounts>,
    /// The suspension marker beside the data directory (`suspend`).
    marker: PathBuf,
    /// The major of the PostgreSQL in `cfg.pg_bin_dir`, read once.
    pg_major: std::sync::OnceLock<u32>,
    /// The free space maps of the run under way (`fsm_sync`).
    fsm: fsm_sync::FsmSlot,
}

impl Agent {
    /// Checks that the configured PostgreSQL is the timeline's major
    /// (its programs are asked once).
    fn check_postgres_major(&self, timeline_major: u32) -> Result<(), AgentError> {
        let major = match self.pg_major.get() {
            Some(m) => *m,
            None => {
                let m = postgres_major(&self.cfg.pg_bin_dir).map_err(|e| error::fail("postgres", e))?;
                *self.pg_major.get_or_init(|| m)
            }
        };
        if major != timeline_major {
            return Err(error::fail(
                "postgres",
                format!(
                    "{} is of PostgreSQL {timeline_major}, but {} holds PostgreSQL {major}",
                    self.timeline_name(),
                    self.cfg.pg_bin_dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// The PostgreSQL major checked by [`Agent::check_postgres_major`].
    fn checked_major(&self) -> u32 {
        *self.pg_major.get().expect("checked before the basebackup")
    }

    fn timeline_name(&self) -> String {
        format!("timeline {}/{}", self.cfg.tenant_id, self.cfg.timeline_id)
    }

    /// Starts the compute, and starts it again after each failure once it
    /// has been running, until a stop is requested.
    async fn run(
        &self,
        stop: &mut watch::Receiver<bool>,
        proposer_tx: watch::Sender<ProposerStatus>,
    ) -> Result<(), AgentError> {
        let mut tracker = RestartTracker::new(self.cfg.restart);
        let clock = &self.cfg.clock;
        let mut attempt = Attempt { began: clock.now(), down_since: None };
        loop {
            proposer_tx.send_replace(ProposerStatus::default());
            let (error, cause, running_since) = match self.start_and_run(stop, &proposer_tx, attempt).await {
                RunEnd::Stopped(result) => return result,
                RunEnd::Fenced(error) => return Err(error),
                // Before the first `running`, a failure is the agent's answer
                // (an unknown or broken timeline must be reported at once).
                RunEnd::Failed { error, running_since: None, .. } if !attempt.is_restart() => return Err(error),
                RunEnd::Failed { error, cause, running_since } => (error, cause, running_since),
            };
            let now = clock.now();
            let uptime = running_since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            // Down since this failure, or since the failure a failed restart tried to recover from.
            let down_since = match (running_since, attempt.down_since) {
                (None, Some(since)) => since,
                _ => now,
            };
            let delay = tracker.failed(uptime, restart::random_jitter());
            tracker.restarting(now);
            let crash_loop_until = tracker.crash_loop_until(now);
            let restarts = tracker.total();
            self.status.update(|s| {
                s.state = AgentState::Restarting;
                s.error = Some(error.to_string());
                s.restart.restarts = restarts;
                s.restart.last_restart_cause = Some(cause.clone());
                s.restart.last_restart_at = Some(crate::clock::unix_now(&**clock));
            });
            self.status.set_crash_loop_until(crash_loop_until);
            warn!(restarts, delay_ms = delay.as_millis() as u64, "{cause}; starting PostgreSQL afresh");
            if crash_loop_until.is_some() {
                let p = tracker.policy();
                error!(
                    restarts,
                    "crash loop: {} restarts within {:?}; still restarting, at most every {:?}",
                    p.crash_loop_restarts,
                    p.crash_loop_window,
                    p.max_delay
                );
            }
            if unless_stopped(stop, clock.sleep(delay)).await.is_none() {
                info!("stop requested while waiting to restart PostgreSQL");
                return Ok(());
            }
            attempt = Attempt { began: clock.now(), down_since: Some(down_since) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::Lsn;
    use strata_protocol::{TenantId, TimelineId};

    fn info() -> TimelineStatus {
        TimelineStatus::new(TenantId([1; 16]).into(), TimelineId([2; 16]), 1, 16 << 20, Lsn(0x100_0000))
    }

    #[test]
    fn checks_timelines() {
        check_timeline(&info()).unwrap();
        let broken = TimelineStatus { state: TimelineState::Broken, error: Some("missing layer".into()), ..info() };
        assert!(check_timeline(&broken).unwrap_err().contains("missing layer"));
        assert!(check_timeline(&TimelineStatus { pg_version: 14, ..info() }).is_err());
        assert_eq!(parse_postgres_major("postgres (PostgreSQL) 18.6 (Debian 18.6-3)\n"), Some(18));
        assert_eq!(parse_postgres_major("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"), Some(15));
        assert_eq!(parse_postgres_major("postgres (PostgreSQL) 19beta2"), Some(19));
        assert_eq!(parse_postgres_major("something else 15.1"), None);
        assert!(check_timeline(&TimelineStatus { wal_segment_size: 3 << 20, ..info() }).is_err());
        assert!(check_timeline(&TimelineStatus { wal_segment_size: 1 << 19, ..info() }).is_err());
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(absolute(Path::new("/a/b")).unwrap(), PathBuf::from("/a/b"));
        assert!(absolute(Path::new("rel")).unwrap().is_absolute());
        assert!(absolute(Path::new("/")).is_err());
    }

    #[test]
    fn error_names_the_phase() {
        let e = fail("basebackup", "timeline a/b at 0/1: refused");
        assert_eq!(e.to_string(), "basebackup: timeline a/b at 0/1: refused");
    }
}
