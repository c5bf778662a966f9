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
//! Status and metrics are served over HTTP ([`status`]).

pub mod basebackup;
pub mod pageserver_api;
pub mod pgconf;
pub mod postgres;
pub mod status;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_formats::Lsn;
use strata_protocol::safekeeper::TimelineIdentity;
use strata_protocol::{TenantId, TimelineId};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::pg_replication::ReplicationConfig;
use crate::proposer::{self, ProposerConfig, ProposerStatus};
use pageserver_api::{PageserverClient, TimelineInfo};
use postgres::{OsUser, Postgres};
use status::{AgentState, AgentStatus, StartTimings, StatusHandle};

/// The only PostgreSQL major version supported.
const PG_VERSION: u32 = 15;

/// Everything `strata compute start` needs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The data directory; emptied and restored at every start.
    pub pgdata: PathBuf,
    /// PostgreSQL's TCP port on 127.0.0.1.
    pub pg_port: u16,
    /// Safekeeper addresses (host:port).
    pub safekeepers: Vec<String>,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The pageserver's HTTP API (host:port).
    pub pageserver_http: String,
    /// Where to serve `/v1/status` and `/metrics`.
    pub http: Option<SocketAddr>,
    /// Directory of the `postgres` binary.
    pub pg_bin_dir: PathBuf,
    /// Operating-system user PostgreSQL runs as when the agent runs as root.
    pub pg_user: String,
    /// Database role of the proposer's replication connection (and of the
    /// readiness check): the cluster's bootstrap superuser.
    pub pg_role: String,
    /// `shared_buffers` (`128MB`).
    pub shared_buffers: String,
    /// The proposer's application name, listed in `synchronous_standby_names`.
    pub application_name: String,
    /// The proposer's physical replication slot.
    pub slot: String,
    /// Backpressure: commits wait while the pageservers lag more than this.
    pub max_consumer_lag_bytes: Option<u64>,
    /// How long the pageserver may need to ingest the WAL up to the start LSN.
    pub wait_timeout: Duration,
    /// How long an unreachable pageserver is retried at first (it may be starting).
    pub pageserver_patience: Duration,
    /// Bound on PostgreSQL starting up, and on the proposer then streaming.
    pub start_timeout: Duration,
    /// Bound on a graceful stop (PostgreSQL's shutdown plus the last WAL
    /// reaching the safekeepers).
    pub stop_timeout: Duration,
    /// After a failure, how long `failed` stays visible on the status endpoint.
    pub failed_linger: Duration,
}

impl AgentConfig {
    /// A configuration with the defaults of the command line.
    pub fn new(
        pgdata: PathBuf,
        pg_port: u16,
        safekeepers: Vec<String>,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        pageserver_http: String,
    ) -> AgentConfig {
        AgentConfig {
            pgdata,
            pg_port,
            safekeepers,
            tenant_id,
            timeline_id,
            pageserver_http,
            http: None,
            pg_bin_dir: PathBuf::from("/usr/lib/postgresql/15/bin"),
            pg_user: "postgres".into(),
            pg_role: "postgres".into(),
            shared_buffers: "128MB".into(),
            application_name: "strata_proposer".into(),
            slot: "strata_proposer".into(),
            max_consumer_lag_bytes: None,
            wait_timeout: Duration::from_secs(60),
            pageserver_patience: Duration::from_secs(30),
            start_timeout: Duration::from_secs(60),
            stop_timeout: Duration::from_secs(60),
            failed_linger: Duration::from_secs(1),
        }
    }
}

/// Why the agent stopped with an error: the phase, and what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("{phase}: {message}")]
pub struct AgentError {
    pub phase: &'static str,
    pub message: String,
}

fn fail(phase: &'static str, message: impl std::fmt::Display) -> AgentError {
    AgentError { phase, message: message.to_string() }
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

/// Runs the compute until `stop` turns true (then stops it gracefully and
/// returns `Ok`) or something fails.
pub async fn run(cfg: AgentConfig, mut stop: watch::Receiver<bool>) -> Result<(), AgentError> {
    let pgdata = absolute(&cfg.pgdata).map_err(|e| fail("configuration", e))?;
    let (proposer_tx, proposer_rx) = watch::channel(ProposerStatus::default());
    let status = StatusHandle::new(
        AgentStatus {
            state: AgentState::Syncing,
            pg_port: cfg.pg_port,
            pgdata: pgdata.clone(),
            pg_log: postgres::log_path(&pgdata),
            tenant_id: cfg.tenant_id.to_string(),
            timeline_id: cfg.timeline_id.to_string(),
            start_lsn: None,
            error: None,
            timings: StartTimings::default(),
        },
        proposer_rx,
    );
    let server = match cfg.http {
        Some(addr) => {
            Some(status::serve(addr, status.clone()).await.map_err(|e| fail("status server", format!("{addr}: {e}")))?)
        }
        None => None,
    };
    let agent = Agent { cfg, pgdata, status: status.clone(), started: Instant::now() };
    let result = agent.run(&mut stop, proposer_tx).await;
    if let Err(e) = &result {
        status.update(|s| {
            s.state = AgentState::Failed;
            s.error = Some(e.to_string());
        });
        if server.is_some() {
            tokio::time::sleep(agent.cfg.failed_linger).await;
        }
    }
    if let Some(server) = server {
        server.abort();
    }
    result
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
fn check_timeline(info: &TimelineInfo) -> Result<(), String> {
    if info.state == "broken" {
        return Err(format!(
            "the pageserver reports the timeline broken: {}",
            info.error.as_deref().unwrap_or("no reason given")
        ));
    }
    if info.pg_version != PG_VERSION {
        return Err(format!("the timeline is of PostgreSQL {}, this agent runs {PG_VERSION}", info.pg_version));
    }
    let size = info.wal_segment_size;
    if !size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&size) {
        return Err(format!("invalid WAL segment size {size}"));
    }
    Ok(())
}

struct Agent {
    cfg: AgentConfig,
    /// Absolute.
    pgdata: PathBuf,
    status: StatusHandle,
    started: Instant,
}

impl Agent {
    fn timeline_name(&self) -> String {
        format!("timeline {}/{}", self.cfg.tenant_id, self.cfg.timeline_id)
    }

    fn record(&self, f: impl FnOnce(&mut StartTimings)) {
        self.status.update(|s| f(&mut s.timings));
    }

    /// The replication connection to the local server.
    fn replication_config(&self) -> ReplicationConfig {
        ReplicationConfig {
            host: "127.0.0.1".into(),
            port: self.cfg.pg_port,
            user: self.cfg.pg_role.clone(),
            password: None,
            application_name: self.cfg.application_name.clone(),
            connect_timeout: Duration::from_secs(10),
        }
    }

    async fn run(
        &self,
        stop: &mut watch::Receiver<bool>,
        proposer_tx: watch::Sender<ProposerStatus>,
    ) -> Result<(), AgentError> {
        let client = Arc::new(PageserverClient::new(&self.cfg.pageserver_http));
        info!(
            tenant = %self.cfg.tenant_id, timeline = %self.cfg.timeline_id, pgdata = %self.pgdata.display(),
            port = self.cfg.pg_port, "starting a compute"
        );

        // 1. The timeline, as the pageserver knows it.
        let t = Instant::now();
        let Some(info) = unless_stopped(
            stop,
            pageserver_api::timeline_with_retry(
                &client,
                self.cfg.tenant_id,
                self.cfg.timeline_id,
                self.cfg.pageserver_patience,
            ),
        )
        .await
        else {
            return stopped_early();
        };
        let info = info.map_err(|e| fail("pageserver", format!("{}: {e}", self.timeline_name())))?;
        check_timeline(&info).map_err(|e| fail("pageserver", format!("{}: {e}", self.timeline_name())))?;
        let seconds = t.elapsed().as_secs_f64();
        self.record(|t| t.timeline_lookup_seconds = seconds);
        info!(seconds, system_id = info.system_id, last_record_lsn = %info.last_record_lsn, "timeline found");

        // 2. The end of the timeline's WAL, committed on a quorum.
        let t = Instant::now();
        let identity = TimelineIdentity {
            tenant_id: self.cfg.tenant_id,
            timeline_id: self.cfg.timeline_id,
            system_id: info.system_id,
            pg_version: PG_VERSION,
            wal_segment_size: info.wal_segment_size,
        };
        let mut proposer_cfg = ProposerConfig::new(self.cfg.safekeepers.clone(), identity);
        proposer_cfg.max_consumer_lag_bytes = self.cfg.max_consumer_lag_bytes;
        let Some(lsn) = unless_stopped(stop, proposer::sync_safekeepers(proposer_cfg.clone())).await else {
            return stopped_early();
        };
        let lsn = lsn.map_err(|e| fail("sync-safekeepers", format!("{}: {e}", self.timeline_name())))?;
        let seconds = t.elapsed().as_secs_f64();
        self.status.update(|s| {
            s.start_lsn = Some(lsn);
            s.timings.sync_seconds = seconds;
        });
        info!(seconds, %lsn, "safekeepers synced: the timeline's WAL ends here");

        // 3. The pageserver must have all of it.
        self.status.set_state(AgentState::WaitingForPageserver);
        let t = Instant::now();
        let Some(waited) = unless_stopped(stop, self.wait_for_pageserver(&client, lsn)).await else {
            return stopped_early();
        };
        waited?;
        let seconds = t.elapsed().as_secs_f64();
        self.record(|t| t.wait_seconds = seconds);
        info!(seconds, %lsn, "the pageserver has the WAL up to the start LSN");

        // 4. The data directory from the basebackup.
        self.status.set_state(AgentState::Restoring);
        let t = Instant::now();
        let Some(stats) = self.restore(stop, &client, lsn).await? else {
            return stopped_early();
        };
        let seconds = t.elapsed().as_secs_f64();
        self.record(|t| {
            t.basebackup_seconds = seconds;
            t.basebackup_bytes = stats.bytes;
            t.basebackup_files = stats.files;
        });
        info!(
            seconds,
            bytes = stats.bytes,
            files = stats.files,
            mb_per_second = stats.bytes as f64 / 1e6 / seconds.max(1e-6),
            "basebackup unpacked"
        );

        // 5. Configuration, and the directory handed to PostgreSQL's user.
        let t = Instant::now();
        let user = postgres::server_user(&self.cfg.pg_user).map_err(|e| fail("configuration", e))?;
        self.configure(user.as_ref()).await?;
        let seconds = t.elapsed().as_secs_f64();
        self.record(|t| t.config_seconds = seconds);
        info!(seconds, "configuration written");

        // 6. PostgreSQL.
        self.status.set_state(AgentState::Starting);
        let t = Instant::now();
        let log = postgres::log_path(&self.pgdata);
        let mut pg = Postgres::spawn(&self.cfg.pg_bin_dir, &self.pgdata, &log, user.as_ref())
            .map_err(|e| fail("starting PostgreSQL", e))?;
        info!(pid = pg.pid(), log = %log.display(), "PostgreSQL started");
        let repl = self.replication_config();
        match unless_stopped(stop, pg.wait_ready(&repl, self.cfg.start_timeout)).await {
            None => {
                info!("stop requested while PostgreSQL was starting");
                pg.stop(self.cfg.stop_timeout).await.map_err(|e| fail("stopping", e))?;
                return Ok(());
            }
            Some(Err(e)) => {
                let _ = pg.stop_immediately().await;
                return Err(fail("starting PostgreSQL", e));
            }
            Some(Ok(())) => {}
        }
        let seconds = t.elapsed().as_secs_f64();
        self.record(|t| t.postgres_start_seconds = seconds);
        info!(seconds, "PostgreSQL accepts connections");

        // 7. The proposer, then supervision until a stop or a failure.
        self.supervise(stop, pg, proposer_cfg, repl, proposer_tx).await
    }

    /// Polls the pageserver until it has ingested the WAL up to `lsn`.
    async fn wait_for_pageserver(&self, client: &Arc<PageserverClient>, lsn: Lsn) -> Result<(), AgentError> {
        let deadline = Instant::now() + self.cfg.wait_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let c = client.clone();
            let (tenant, timeline) = (self.cfg.tenant_id, self.cfg.timeline_id);
            let answer = tokio::task::spawn_blocking(move || c.timeline(tenant, timeline))
                .await
                .map_err(|e| fail("waiting for the pageserver", format!("request task: {e}")))?;
            let last = match answer {
                Ok(info) => {
                    check_timeline(&info).map_err(|e| fail("waiting for the pageserver", e))?;
                    if info.state == "active" && info.last_record_lsn >= lsn {
                        return Ok(());
                    }
                    format!("{} at {}", info.state, info.last_record_lsn)
                }
                Err(e) if e.is_transient() => e.to_string(),
                Err(e) => return Err(fail("waiting for the pageserver", format!("{}: {e}", self.timeline_name()))),
            };
            if Instant::now() + pause > deadline {
                return Err(fail(
                    "waiting for the pageserver",
                    format!(
                        "{}: the pageserver did not reach {lsn} within {:?} (last: {last})",
                        self.timeline_name(),
                        self.cfg.wait_timeout
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Empties the data directory and unpacks the basebackup at `lsn` into
    /// it, streaming. `None` if a stop was requested meanwhile.
    async fn restore(
        &self,
        stop: &mut watch::Receiver<bool>,
        client: &Arc<PageserverClient>,
        lsn: Lsn,
    ) -> Result<Option<basebackup::UnpackStats>, AgentError> {
        postgres::check_not_running(&self.pgdata).map_err(|e| fail("basebackup", e))?;
        let cancel = Arc::new(AtomicBool::new(false));
        let (c, pgdata, flag) = (client.clone(), self.pgdata.clone(), cancel.clone());
        let (tenant, timeline) = (self.cfg.tenant_id, self.cfg.timeline_id);
        let mut task = tokio::task::spawn_blocking(move || -> Result<basebackup::UnpackStats, String> {
            basebackup::prepare_dir(&pgdata).map_err(|e| e.to_string())?;
            let reader = c.basebackup(tenant, timeline, lsn).map_err(|e| e.to_string())?;
            let stats = basebackup::unpack(reader, &pgdata, &flag).map_err(|e| e.to_string())?;
            basebackup::finish(&pgdata, PG_VERSION).map_err(|e| e.to_string())?;
            Ok(stats)
        });
        let context = || format!("{} at {lsn} into {}", self.timeline_name(), self.pgdata.display());
        tokio::select! {
            r = &mut task => {
                let r = r.map_err(|e| fail("basebackup", format!("{}: unpacking task: {e}", context())))?;
                r.map(Some).map_err(|e| fail("basebackup", format!("{}: {e}", context())))
            }
            _ = stop_requested(stop) => {
                cancel.store(true, Ordering::Relaxed);
                let _ = task.await;
                Ok(None)
            }
        }
    }

    /// Writes the configuration and gives the data directory to `user`.
    async fn configure(&self, user: Option<&OsUser>) -> Result<(), AgentError> {
        let settings = pgconf::PgSettings {
            port: self.cfg.pg_port,
            socket_dir: self.pgdata.clone(),
            shared_buffers: self.cfg.shared_buffers.clone(),
            application_name: self.cfg.application_name.clone(),
        };
        let pgdata = self.pgdata.clone();
        let owner = user.map(|u| (u.uid, u.gid));
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            pgconf::write_config(&pgdata, &settings).map_err(|e| e.to_string())?;
            basebackup::set_ownership(&pgdata, owner).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| fail("configuration", format!("task: {e}")))?
        .map_err(|e| fail("configuration", e))
    }

    /// Runs the proposer next to the running server until a stop is
    /// requested (then stops both in order) or either fails.
    async fn supervise(
        &self,
        stop: &mut watch::Receiver<bool>,
        mut pg: Postgres,
        proposer_cfg: ProposerConfig,
        repl: ReplicationConfig,
        proposer_tx: watch::Sender<ProposerStatus>,
    ) -> Result<(), AgentError> {
        let (proposer_stop_tx, proposer_stop_rx) = watch::channel(false);
        let mut proposer_status = proposer_tx.subscribe();
        let mut proposer = Box::pin(proposer::run_until_shutdown(
            proposer_cfg,
            repl,
            Some(self.cfg.slot.clone()),
            proposer_tx,
            proposer_stop_rx,
            self.cfg.stop_timeout,
        ));
        let t = Instant::now();
        let streaming_deadline = tokio::time::Instant::now() + self.cfg.start_timeout;
        let mut running = false;
        loop {
            tokio::select! {
                exit = pg.wait() => {
                    let message = match exit {
                        Ok(status) => pg.unexpected_exit(status).to_string(),
                        Err(e) => e.to_string(),
                    };
                    return Err(fail("running", format!("PostgreSQL stopped unexpectedly: {message}")));
                }
                r = &mut proposer => {
                    let why = match r {
                        Err(e) => format!("the WAL proposer failed: {e}"),
                        Ok(_) => "the WAL proposer stopped unexpectedly".to_string(),
                    };
                    warn!("{why}; stopping PostgreSQL");
                    let stopped = pg.stop(self.cfg.stop_timeout).await;
                    let stopped = match stopped {
                        Ok(s) => format!("PostgreSQL stopped ({s})"),
                        Err(e) => e.to_string(),
                    };
                    return Err(fail("running", format!("{why}; {stopped}")));
                }
                _ = stop_requested(stop) => break,
                changed = proposer_status.changed(), if !running => {
                    if changed.is_ok() && proposer_status.borrow_and_update().streaming {
                        running = true;
                        let seconds = t.elapsed().as_secs_f64();
                        let total = self.started.elapsed().as_secs_f64();
                        self.status.update(|s| {
                            s.state = AgentState::Running;
                            s.timings.proposer_start_seconds = seconds;
                            s.timings.total_seconds = total;
                        });
                        info!(
                            seconds, total_seconds = total,
                            "running: postgresql://{}@127.0.0.1:{}/postgres", self.cfg.pg_role, self.cfg.pg_port
                        );
                    }
                }
                _ = tokio::time::sleep_until(streaming_deadline), if !running => {
                    let _ = pg.stop(self.cfg.stop_timeout).await;
                    return Err(fail(
                        "starting the WAL proposer",
                        format!("PostgreSQL's WAL did not stream to the safekeepers within {:?}", self.cfg.start_timeout),
                    ));
                }
            }
        }

        // Graceful stop: PostgreSQL writes its shutdown checkpoint and its
        // walsender sends the last WAL; the proposer makes it durable.
        self.status.set_state(AgentState::Stopping);
        info!(pid = pg.pid(), "stopping: fast shutdown of PostgreSQL");
        let t = Instant::now();
        let _ = proposer_stop_tx.send(true);
        pg.signal(libc::SIGINT);
        let deadline = tokio::time::Instant::now() + self.cfg.stop_timeout;
        let mut pg_exit = None;
        let mut proposer_end = None;
        while pg_exit.is_none() || proposer_end.is_none() {
            tokio::select! {
                exit = pg.wait(), if pg_exit.is_none() => pg_exit = Some(exit),
                end = &mut proposer, if proposer_end.is_none() => proposer_end = Some(end),
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let pg_result = match pg_exit {
            Some(Ok(status)) if status.success() => Ok(()),
            Some(Ok(status)) => Err(pg.unexpected_exit(status).to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => {
                let _ = pg.stop_immediately().await;
                Err(format!("PostgreSQL did not shut down within {:?}; stopped it immediately", self.cfg.stop_timeout))
            }
        };
        let proposer_result = match proposer_end {
            Some(Ok(commit_lsn)) => {
                info!(%commit_lsn, "the safekeepers hold all WAL PostgreSQL sent");
                Ok(())
            }
            Some(Err(e)) => Err(format!("the WAL proposer failed: {e}")),
            None => {
                Err(format!("the safekeepers did not confirm PostgreSQL's last WAL within {:?}", self.cfg.stop_timeout))
            }
        };
        match (pg_result, proposer_result) {
            (Ok(()), Ok(())) => {
                info!(seconds = t.elapsed().as_secs_f64(), "stopped");
                Ok(())
            }
            (Err(a), Ok(())) | (Ok(()), Err(a)) => Err(fail("stopping", a)),
            (Err(a), Err(b)) => Err(fail("stopping", format!("{a}; {b}"))),
        }
    }
}

/// The end of a stop requested before PostgreSQL was started: nothing to undo.
fn stopped_early() -> Result<(), AgentError> {
    info!("stop requested before PostgreSQL was started");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> TimelineInfo {
        TimelineInfo {
            system_id: 1,
            wal_segment_size: 16 << 20,
            pg_version: 15,
            last_record_lsn: Lsn(0x100_0000),
            state: "active".into(),
            error: None,
        }
    }

    #[test]
    fn checks_timelines() {
        check_timeline(&info()).unwrap();
        let broken = TimelineInfo { state: "broken".into(), error: Some("missing layer".into()), ..info() };
        assert!(check_timeline(&broken).unwrap_err().contains("missing layer"));
        assert!(check_timeline(&TimelineInfo { pg_version: 16, ..info() }).is_err());
        assert!(check_timeline(&TimelineInfo { wal_segment_size: 3 << 20, ..info() }).is_err());
        assert!(check_timeline(&TimelineInfo { wal_segment_size: 1 << 19, ..info() }).is_err());
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
