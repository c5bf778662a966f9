//! A started PostgreSQL with its WAL proposer: reaching `running`, watching
//! both until a stop is requested (then stopping them in order) or either
//! fails (then stopping what is left, for the agent to start afresh).

use std::time::Instant;

use strata_service::clock::timeout;

use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn};

use super::fsm_sync::{self, FsmScanner};
use super::postgres::Postgres;
use super::status::AgentState;
use super::{fail, stop_requested, Agent, AgentError, Attempt, RunEnd};
use crate::pg_replication::ReplicationConfig;
use crate::proposer::{self, ProposerConfig, ProposerStatus};

/// What a start hands over to the run.
pub(super) struct Started {
    pub pg: Postgres,
    pub proposer_cfg: ProposerConfig,
    pub repl: ReplicationConfig,
}

/// What ended the watch over a running compute.
enum Watch {
    StopRequested,
    PostgresExited(Result<std::process::ExitStatus, super::postgres::PostgresError>),
    ProposerEnded(Result<strata_formats::Lsn, proposer::ProposerError>),
    NotStreaming,
    /// A lazy compute's mount stopped being served.
    MountDied(std::path::PathBuf),
}

/// The error and the one-line cause of PostgreSQL's unexpected exit.
fn unexpected_exit(
    pg: &Postgres,
    exit: Result<std::process::ExitStatus, super::postgres::PostgresError>,
) -> (AgentError, String) {
    match exit {
        Ok(status) => (
            fail("running", format!("PostgreSQL stopped unexpectedly: {}", pg.unexpected_exit(status))),
            pg.exit_cause(status),
        ),
        Err(e) => {
            let message = format!("PostgreSQL stopped unexpectedly: {e}");
            (fail("running", &message), message)
        }
    }
}

impl Agent {
    /// Runs the proposer next to the started server until a stop is
    /// requested (then stops both in order) or either fails.
    pub(super) async fn run_started(
        &self,
        stop: &mut watch::Receiver<bool>,
        started: Started,
        proposer_tx: watch::Sender<ProposerStatus>,
        attempt: Attempt,
    ) -> RunEnd {
        if let Some(lsn) = self.cfg.read_only_at {
            return self.run_read_only(stop, started.pg, lsn, attempt).await;
        }
        if self.cfg.replica.is_some() {
            return self.run_replica(stop, started.pg, attempt).await;
        }
        let Started { mut pg, proposer_cfg, repl } = started;
        let (proposer_stop_tx, proposer_stop_rx) = watch::channel(false);
        let mut proposer_status = proposer_tx.subscribe();
        let (slot, stop_timeout) = (Some(self.cfg.slot.clone()), self.cfg.stop_timeout);
        let mut proposer = Box::pin(proposer::on_own_thread(move || {
            proposer::run_until_shutdown(proposer_cfg, repl, slot, proposer_tx, proposer_stop_rx, stop_timeout)
        }));
        let clock = &self.cfg.clock;
        let t = clock.now();
        let mut streaming_deadline = clock.sleep(self.cfg.start_timeout);
        let mut running_since = None;
        let fsm = self.fsm_scanner().await;
        *self.fsm.lock() = Some(fsm.clone());
        let mut fsm_tick = clock.sleep(crate::limits::FSM_SYNC_EVERY);
        let mut fsm_task: Option<tokio::task::JoinHandle<()>> = None;
        let ended = loop {
            tokio::select! {
                _ = &mut fsm_tick => {
                    fsm_tick = clock.sleep(crate::limits::FSM_SYNC_EVERY);
                    if fsm_task.as_ref().is_none_or(|t| t.is_finished()) {
                        fsm_task = Some(tokio::spawn(self.fsm_pass(fsm.clone(), false)));
                    }
                }
                exit = pg.wait() => break Watch::PostgresExited(exit),
                r = &mut proposer => break Watch::ProposerEnded(r),
                dead = self.lazy.died() => break Watch::MountDied(dead),
                _ = stop_requested(stop) => break Watch::StopRequested,
                changed = proposer_status.changed(), if running_since.is_none() => {
                    if changed.is_ok() && proposer_status.borrow_and_update().streaming {
                        running_since = Some(clock.now());
                        self.now_running(t, attempt);
                    }
                }
                _ = &mut streaming_deadline, if running_since.is_none() => {
                    break Watch::NotStreaming;
                }
            }
        };

        if let Some(task) = fsm_task.take() {
            task.abort();
        }
        // Still in the slot unless a suspension took it to send the last
        // maps before it was decided (`suspend`): from the decision on,
        // PostgreSQL must refuse clients, so the stop sends none.
        let last_pass = self.fsm.lock().take();
        let (error, cause) = match ended {
            Watch::StopRequested => {
                // The maps PostgreSQL holds in its buffers reach their files
                // at a checkpoint: sent before the shutdown's own.
                if let Some(fsm) = last_pass {
                    self.fsm_pass(fsm, true).await;
                }
                return RunEnd::Stopped(self.stop_gracefully(&mut pg, &mut proposer, &proposer_stop_tx).await);
            }
            Watch::PostgresExited(exit) => unexpected_exit(&pg, exit),
            Watch::ProposerEnded(Err(e)) if e.is_fenced() => {
                // Another writer was elected, or a site failover sealed the
                // timeline: this one's WAL can no longer commit, and starting
                // again would take the branch back or be refused for ever.
                drop(proposer);
                let why = match e {
                    proposer::ProposerError::Superseded { ours, seen } => format!(
                        "another writer took the branch over (safekeeper term {seen}, ours {ours}); stopping for good"
                    ),
                    other => format!("{other}; stopping for good"),
                };
                warn!("{why}");
                if let Err(e) = pg.stop_everything().await {
                    warn!("stopping PostgreSQL: {e}");
                }
                return RunEnd::Fenced(fail(super::error::FENCED, why));
            }
            Watch::ProposerEnded(r) => {
                let why = match r {
                    Err(e) => format!("the WAL proposer failed: {e}"),
                    Ok(_) => "the WAL proposer stopped unexpectedly".to_string(),
                };
                // The root cause is PostgreSQL's exit if it follows at once.
                match timeout(&**clock, crate::limits::EXIT_ATTRIBUTION_WAIT, pg.wait()).await {
                    Ok(Ok(status)) => (fail("running", format!("{why}; {}", pg.unexpected_exit(status))), {
                        format!("{}; {why}", pg.exit_cause(status))
                    }),
                    _ => (fail("running", &why), why),
                }
            }
            Watch::NotStreaming => {
                let why =
                    format!("PostgreSQL's WAL did not stream to the safekeepers within {:?}", self.cfg.start_timeout);
                (fail("starting the WAL proposer", &why), why)
            }
            Watch::MountDied(path) => {
                // Acknowledged commits are on the safekeepers; the next
                // start mounts afresh.
                let why = format!("the lazy file system's mount of {} is no longer served", path.display());
                (fail("running", &why), why)
            }
        };
        // The old proposer and its safekeeper connections go first, then
        // whatever is left of PostgreSQL.
        drop(proposer);
        warn!("{cause}; stopping what is left of PostgreSQL");
        if let Err(e) = pg.stop_everything().await {
            warn!("stopping PostgreSQL: {e}");
        }
        RunEnd::Failed { error, cause, running_since }
    }

    /// The free space maps of this run's PostgreSQL, as it started
    /// (`fsm_sync`): the backing directory of a lazy compute, else the data
    /// directory.
    async fn fsm_scanner(&self) -> Arc<parking_lot::Mutex<FsmScanner>> {
        let root = match self.cfg.lazy_page_service {
            Some(_) => super::lazy::backing_dir(&self.pgdata),
            None => self.pgdata.clone(),
        };
        let scanner = Arc::new(parking_lot::Mutex::new(FsmScanner::new(root)));
        let (s, now) = (scanner.clone(), self.cfg.clock.system_now());
        let read = tokio::task::spawn_blocking(move || s.lock().baseline(now).map_err(|e| e.to_string()));
        if let Err(e) = read.await.map_err(|e| e.to_string()).and_then(|r| r) {
            warn!("reading the free space maps the compute started with: {e}");
        }
        scanner
    }

    /// A pass of `fsm_sync`, bounded and logged (`fsm_sync::logged_pass`).
    fn fsm_pass(
        &self,
        fsm: Arc<parking_lot::Mutex<FsmScanner>>,
        checkpoint: bool,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        fsm_sync::logged_pass(fsm, self.socket_config(false), self.cfg.clock.clone(), checkpoint)
    }

    /// A read-only compute: PostgreSQL alone (a hot standby that replays
    /// nothing), running as soon as it accepts connections; the lease on
    /// its LSN is renewed every minute until it stops.
    async fn run_read_only(
        &self,
        stop: &mut watch::Receiver<bool>,
        mut pg: Postgres,
        lsn: strata_formats::Lsn,
        attempt: Attempt,
    ) -> RunEnd {
        let clock = &self.cfg.clock;
        let running_since = clock.now();
        self.now_running(running_since, attempt);
        // The lease was just taken: the first renewal is one period away,
        // unless the tenant's shards change (a split) before.
        let mut renew = clock.sleep(crate::limits::READ_ONLY_LEASE_RENEWAL);
        let mut layout = self.cfg.shards.subscribe();
        loop {
            tokio::select! {
                exit = pg.wait() => return self.standby_exited(&mut pg, exit, running_since).await,
                dead = self.lazy.died() => return self.standby_mount_died(&mut pg, &dead, running_since).await,
                _ = stop_requested(stop) => return self.stop_standby(&mut pg).await,
                _ = &mut renew => {
                    renew = clock.sleep(crate::limits::READ_ONLY_LEASE_RENEWAL);
                    self.renew_lease(lsn).await;
                }
                Ok(()) = layout.changed() => {
                    info!(%lsn, "the tenant's shards changed: leasing the LSN on the new ones");
                    self.renew_lease(lsn).await;
                }
            }
        }
    }

    /// Renews a read-only compute's lease on `lsn` on every shard of the
    /// layout now (a failure is retried at the next renewal).
    async fn renew_lease(&self, lsn: strata_formats::Lsn) {
        let (clients, tenant, timeline) = (self.cfg.shard_clients(), self.cfg.tenant_id, self.cfg.timeline_id);
        let renewed = move || super::pageserver_api::PageserverClient::lease_all(&clients, tenant, timeline, lsn, None);
        match tokio::task::spawn_blocking(renewed).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(%lsn, "renewing the lease: {e}"),
            Err(e) => warn!(%lsn, "renewing the lease: {e}"),
        }
    }

    /// A standby's PostgreSQL (read-only or replica) exited on its own.
    pub(super) async fn standby_exited(
        &self,
        pg: &mut Postgres,
        exit: Result<std::process::ExitStatus, super::postgres::PostgresError>,
        running_since: Instant,
    ) -> RunEnd {
        let (error, cause) = unexpected_exit(pg, exit);
        let _ = pg.stop_everything().await;
        RunEnd::Failed { error, cause, running_since: Some(running_since) }
    }

    /// A standby's mount stopped being served: PostgreSQL goes, to start afresh.
    pub(super) async fn standby_mount_died(
        &self,
        pg: &mut Postgres,
        dead: &std::path::Path,
        running_since: Instant,
    ) -> RunEnd {
        let why = format!("the lazy file system's mount of {} is no longer served", dead.display());
        warn!("{why}; stopping PostgreSQL");
        let _ = pg.stop_everything().await;
        RunEnd::Failed { error: fail("running", &why), cause: why, running_since: Some(running_since) }
    }

    /// A requested stop of a standby: PostgreSQL's fast shutdown (it writes no WAL).
    pub(super) async fn stop_standby(&self, pg: &mut Postgres) -> RunEnd {
        self.status.set_state(AgentState::Stopping);
        info!(pid = pg.pid(), "stopping the standby PostgreSQL");
        RunEnd::Stopped(pg.stop(self.cfg.stop_timeout).await.map(|_| ()).map_err(|e| fail("stopping", e)))
    }

    /// PostgreSQL streams its WAL to the proposer: commits can complete.
    pub(super) fn now_running(&self, proposer_started: Instant, attempt: Attempt) {
        let clock = &self.cfg.clock;
        let seconds = clock.since(proposer_started).as_secs_f64();
        let total = clock.since(attempt.began).as_secs_f64();
        let downtime = attempt.down_since.map(|t| clock.since(t).as_secs_f64());
        // Awake: a suspension's marker goes before `running` is told, so
        // that whoever waited for `running` finds it gone.
        match super::suspend::clear_marker(&self.marker) {
            Ok(true) => info!("woken from a suspension: removed {}", self.marker.display()),
            Ok(false) => {}
            Err(e) => warn!("removing the suspension marker: {e}"),
        }
        self.status.update(|s| {
            s.state = AgentState::Running;
            s.error = None;
            s.timings.proposer_start_seconds = seconds;
            s.timings.total_seconds = total;
            if downtime.is_some() {
                s.restart.last_restart_downtime_seconds = downtime;
            }
        });
        match downtime {
            Some(downtime) => info!(
                seconds,
                total_seconds = total,
                downtime_seconds = downtime,
                "running again: postgresql://{}@127.0.0.1:{}/postgres",
                self.cfg.app_role,
                self.cfg.pg_port
            ),
            None => info!(
                seconds,
                total_seconds = total,
                "running: postgresql://{}@127.0.0.1:{}/postgres",
                self.cfg.app_role,
                self.cfg.pg_port
            ),
        }
    }

    /// Graceful stop: PostgreSQL writes its shutdown checkpoint and its
    /// walsender sends the last WAL; the proposer makes it durable.
    async fn stop_gracefully(
        &self,
        pg: &mut Postgres,
        proposer: &mut std::pin::Pin<
            Box<impl std::future::Future<Output = Result<strata_formats::Lsn, proposer::ProposerError>>>,
        >,
        proposer_stop_tx: &watch::Sender<bool>,
    ) -> Result<(), AgentError> {
        self.status.set_state(AgentState::Stopping);
        info!(pid = pg.pid(), "stopping: fast shutdown of PostgreSQL");
        let clock = &self.cfg.clock;
        let t = clock.now();
        let _ = proposer_stop_tx.send(true);
        pg.signal(libc::SIGINT);
        let mut deadline = clock.sleep(self.cfg.stop_timeout);
        let mut pg_exit = None;
        let mut proposer_end = None;
        while pg_exit.is_none() || proposer_end.is_none() {
            tokio::select! {
                exit = pg.wait(), if pg_exit.is_none() => pg_exit = Some(exit),
                end = &mut *proposer, if proposer_end.is_none() => proposer_end = Some(end),
                _ = &mut deadline => break,
            }
        }
        let pg_result = match pg_exit {
            Some(Ok(status)) if status.success() => Ok(()),
            Some(Ok(status)) => Err(pg.unexpected_exit(status).to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => {
                let _ = pg.stop_everything().await;
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
                info!(seconds = clock.since(t).as_secs_f64(), "stopped");
                Ok(())
            }
            (Err(a), Ok(())) | (Ok(()), Err(a)) => Err(fail("stopping", a)),
            (Err(a), Err(b)) => Err(fail("stopping", format!("{a}; {b}"))),
        }
    }
}
