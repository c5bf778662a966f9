//! One start of the compute, phases 1 to 6: the timeline, sync-safekeepers,
//! waiting for the pageserver, the basebackup, the configuration and
//! PostgreSQL accepting connections. The first start and every restart run
//! the same sequence; a restart keeps the state `restarting` throughout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use strata_service::clock::timeout;

use strata_formats::Lsn;
use strata_protocol::safekeeper::TimelineIdentity;
use tokio::sync::watch;
use tracing::info;

use super::pageserver_api::{self, BasebackupKind, PageserverClient};
use super::postgres::{self, OsUser, Postgres};
use super::running::Started;
use super::status::{AgentState, StartTimings};
use super::{
    basebackup, check_timeline, fail, leftover, pgconf, roles, stop_requested, unless_stopped, Agent, AgentError,
    Attempt, RunEnd,
};
use crate::pg_replication::ReplicationConfig;
use crate::proposer::{self, ProposerConfig, ProposerStatus};
use strata_protocol::api::compute::ReplicaStatus;
use strata_protocol::api::pageserver::{CheckpointRecordResponse, TimelineState};

/// How a start ended before PostgreSQL ran with its proposer.
enum StartEnd {
    Started(Box<Started>),
    /// A stop was requested; the result of stopping what had been started.
    Stopped(Result<(), AgentError>),
    Failed(AgentError),
}

/// `?` for the phases: an error ends the start as [`StartEnd::Failed`].
macro_rules! step {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return StartEnd::Failed(e),
        }
    };
}

/// A stop requested before PostgreSQL was started: nothing to undo.
fn stopped_early() -> StartEnd {
    info!("stop requested before PostgreSQL was started");
    StartEnd::Stopped(Ok(()))
}

impl Agent {
    fn record(&self, f: impl FnOnce(&mut StartTimings)) {
        self.status.update(|s| f(&mut s.timings));
    }

    /// Shows `state` unless this is a restart (which stays `restarting`).
    fn enter(&self, attempt: Attempt, state: AgentState) {
        if !attempt.is_restart() {
            self.status.set_state(state);
        }
    }

    /// The application role's login with the endpoint's password, over TCP
    /// as every client's (SCRAM-SHA-256).
    fn app_login_config(&self, password: &str) -> ReplicationConfig {
        ReplicationConfig {
            password: Some(password.to_string()),
            application_name: "strata_agent".into(),
            replication: false,
            ..ReplicationConfig::new("127.0.0.1", self.cfg.pg_port, self.cfg.app_role.clone())
        }
    }

    /// A connection through the Unix socket (trusted: its directory is
    /// private to PostgreSQL's user) as the superuser, which has no
    /// password and cannot log in over TCP: the agent's own sessions.
    pub(super) fn socket_config(&self, replication: bool) -> ReplicationConfig {
        ReplicationConfig { replication, ..super::socket_session(&self.pgdata, &self.cfg) }
    }

    /// The WAL proposer's replication connection: through the socket, under
    /// the application name `synchronous_standby_names` lists.
    fn proposer_connection(&self) -> ReplicationConfig {
        ReplicationConfig { application_name: self.cfg.application_name.clone(), ..self.socket_config(true) }
    }

    /// Starts the compute and runs it until a stop or a failure.
    pub(super) async fn start_and_run(
        &self,
        stop: &mut watch::Receiver<bool>,
        proposer_tx: &watch::Sender<ProposerStatus>,
        attempt: Attempt,
    ) -> RunEnd {
        match self.start(stop, attempt).await {
            StartEnd::Started(started) => self.run_started(stop, *started, proposer_tx.clone(), attempt).await,
            StartEnd::Stopped(result) => RunEnd::Stopped(result),
            StartEnd::Failed(error) if error.is_fenced() => RunEnd::Fenced(error),
            StartEnd::Failed(error) => {
                let cause = format!("the start failed: {error}");
                RunEnd::Failed { error, cause, running_since: None }
            }
        }
    }

    /// Phases 1 to 6: PostgreSQL runs and accepts connections.
    async fn start(&self, stop: &mut watch::Receiver<bool>, attempt: Attempt) -> StartEnd {
        let client = Arc::new(self.cfg.pageserver_client());
        info!(
            tenant = %self.cfg.tenant_id, timeline = %self.cfg.timeline_id, pgdata = %self.pgdata.display(),
            port = self.cfg.pg_port, restart = attempt.is_restart(), "starting a compute"
        );
        self.status.update(|s| s.timings = StartTimings::default());
        self.enter(attempt, AgentState::Syncing);

        // 1. The timeline, as the pageserver knows it.
        let t = self.cfg.clock.now();
        let patience =
            if attempt.is_restart() { self.cfg.restart_pageserver_patience } else { self.cfg.pageserver_patience };
        let Some(info) = unless_stopped(
            stop,
            pageserver_api::timeline_with_retry(
                &client,
                self.cfg.tenant_id,
                self.cfg.timeline_id,
                patience,
                &*self.cfg.clock,
            ),
        )
        .await
        else {
            return stopped_early();
        };
        let info = step!(info.map_err(|e| fail("pageserver", format!("{}: {e}", self.timeline_name()))));
        step!(check_timeline(&info).map_err(|e| fail("pageserver", format!("{}: {e}", self.timeline_name()))));
        step!(self.check_postgres_major(info.pg_version));
        let seconds = self.cfg.clock.since(t).as_secs_f64();
        self.record(|t| t.timeline_lookup_seconds = seconds);
        info!(seconds, system_id = info.system_id, last_record_lsn = %info.last_record_lsn, "timeline found");

        // 2. The end of the timeline's WAL, committed on a quorum (a new term).
        let t = self.cfg.clock.now();
        let identity = TimelineIdentity {
            tenant_id: self.cfg.tenant_id,
            timeline_id: self.cfg.timeline_id,
            system_id: info.system_id,
            pg_version: info.pg_version,
            wal_segment_size: info.wal_segment_size,
        };
        let mut proposer_cfg = ProposerConfig::new(self.cfg.safekeepers.clone(), identity);
        proposer_cfg.max_consumer_lag_bytes = self.cfg.max_consumer_lag_bytes;
        proposer_cfg.token = self.cfg.token.clone();
        proposer_cfg.tls = self.cfg.tls_client.clone();
        proposer_cfg.address_map = self.cfg.address_map.clone();
        proposer_cfg.clock = self.cfg.clock.clone();
        // A replica's basebackup is asked for at its checkpoint record's end
        // and holds the data at the record's redo point, `lsn`; the second
        // LSN is where it starts answering queries.
        let mut basebackup_at = None;
        let lsn = match (self.cfg.read_only_at, &self.cfg.replica) {
            // A read-only compute writes no WAL: no election, its point is given.
            (Some(lsn), _) => {
                self.status.update(|s| s.start_lsn = Some(lsn));
                info!(%lsn, "read-only at a fixed LSN: the safekeepers are not involved");
                lsn
            }
            // A replica writes no WAL either: it starts from a checkpoint record.
            (None, Some(replica)) => {
                let Some(record) = unless_stopped(stop, self.replica_start_point(&client, replica.after)).await else {
                    return stopped_early();
                };
                let (record, newest) = step!(record);
                // Queries wait until replay has passed every position this
                // replica (an earlier run of it) or the branch may have shown.
                let shown = self.status.agent().replica.and_then(|r| r.replay_lsn).unwrap_or(Lsn::INVALID);
                let consistent_at = newest.max(shown).max(record.end_lsn);
                let seconds = self.cfg.clock.since(t).as_secs_f64();
                self.status.update(|s| {
                    s.start_lsn = Some(record.redo);
                    s.timings.sync_seconds = seconds;
                    // Lag restarts count over every run.
                    let lag_restarts = s.replica.as_ref().map_or(0, |r| r.lag_restarts);
                    s.replica = Some(ReplicaStatus {
                        checkpoint_lsn: record.lsn,
                        redo_lsn: record.redo,
                        lag_restarts,
                        ..ReplicaStatus::default()
                    });
                });
                info!(
                    seconds, checkpoint = %record.lsn, redo = %record.redo, shutdown = record.shutdown,
                    %consistent_at, "a replica starts from this checkpoint record, and answers queries once replayed to consistent_at"
                );
                basebackup_at = Some((record.end_lsn, consistent_at));
                record.redo
            }
            (None, None) => {
                let sync =
                    timeout(&*self.cfg.clock, self.cfg.sync_timeout, proposer::sync_safekeepers(proposer_cfg.clone()));
                let Some(lsn) = unless_stopped(stop, sync).await else {
                    return stopped_early();
                };
                let lsn = step!(match lsn {
                    Ok(Ok(lsn)) => Ok(lsn),
                    // Sealed by a site failover: never to start again (`docs/sites.md`).
                    Ok(Err(e @ proposer::ProposerError::Sealed(..))) => {
                        Err(fail(super::error::FENCED, format!("{}: {e}", self.timeline_name())))
                    }
                    Ok(Err(e)) => Err(fail("sync-safekeepers", format!("{}: {e}", self.timeline_name()))),
                    Err(_) => Err(fail(
                        "sync-safekeepers",
                        format!(
                            "{}: no quorum of safekeepers was synced within {:?}",
                            self.timeline_name(),
                            self.cfg.sync_timeout
                        ),
                    )),
                });
                let seconds = self.cfg.clock.since(t).as_secs_f64();
                self.status.update(|s| {
                    s.start_lsn = Some(lsn);
                    s.timings.sync_seconds = seconds;
                });
                info!(seconds, %lsn, "safekeepers synced: the timeline's WAL ends here");
                lsn
            }
        };

        // 3. The pageserver must have all of it.
        self.enter(attempt, AgentState::WaitingForPageserver);
        let t = self.cfg.clock.now();
        let Some(waited) = unless_stopped(stop, self.wait_for_pageserver(&client, lsn)).await else {
            return stopped_early();
        };
        step!(waited);
        let seconds = self.cfg.clock.since(t).as_secs_f64();
        self.record(|t| t.wait_seconds = seconds);
        info!(seconds, %lsn, "the pageserver has the WAL up to the start LSN");
        if self.cfg.read_only_at.is_some() || self.cfg.replica.is_some() {
            // Held before the basebackup reads at it, renewed (a replica's
            // moved) while running.
            let clients = self.cfg.shard_clients();
            let (tenant, timeline) = (self.cfg.tenant_id, self.cfg.timeline_id);
            let holder = self.cfg.replica.as_ref().map(|r| r.name.clone());
            let leased = tokio::task::spawn_blocking(move || {
                PageserverClient::lease_all(&clients, tenant, timeline, lsn, holder.as_deref())
            })
            .await;
            step!(leased
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map_err(|e| fail("lease", format!("{} at {lsn}: {e}", self.timeline_name()))));
        }

        // 4. The data directory from the basebackup.
        self.enter(attempt, AgentState::Restoring);
        let t = self.cfg.clock.now();
        let Some(stats) = step!(self.restore(stop, &client, lsn, basebackup_at).await) else {
            return stopped_early();
        };
        let seconds = self.cfg.clock.since(t).as_secs_f64();
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
        let t = self.cfg.clock.now();
        let password = step!(read_password(&self.cfg.password_file).map_err(|e| fail("configuration", e)));
        let verifier = match &self.cfg.password_verifier_file {
            Some(path) => Some(step!(read_verifier(path).map_err(|e| fail("configuration", e)))),
            None => None,
        };
        let user = step!(postgres::server_user(&self.cfg.pg_user).map_err(|e| fail("configuration", e)));
        step!(self.configure(user.as_ref()).await);
        let seconds = self.cfg.clock.since(t).as_secs_f64();
        self.record(|t| t.config_seconds = seconds);
        info!(seconds, "configuration written");
        if let Some(addr) = &self.cfg.lazy_page_service {
            let t = self.cfg.clock.now();
            let owner = user.as_ref().map(|u| (u.uid, u.gid));
            let files = step!(self.lazy.mount(&self.pgdata, addr, &self.cfg, lsn, owner).await);
            let seconds = self.cfg.clock.since(t).as_secs_f64();
            self.record(|t| t.mount_seconds = seconds);
            info!(seconds, files, "relation files mounted (lazy)");
        }

        // 6. PostgreSQL.
        self.enter(attempt, AgentState::Starting);
        let t = self.cfg.clock.now();
        let log = postgres::log_path(&self.pgdata);
        let mut pg =
            step!(Postgres::spawn(&self.cfg.pg_bin_dir, &self.pgdata, &log, user.as_ref(), self.cfg.clock.clone())
                .map_err(|e| fail("starting PostgreSQL", e)));
        info!(pid = pg.pid(), log = %log.display(), "PostgreSQL started");
        match unless_stopped(stop, pg.wait_ready(&self.socket_config(true), self.cfg.start_timeout)).await {
            None => {
                info!("stop requested while PostgreSQL was starting");
                return StartEnd::Stopped(
                    pg.stop(self.cfg.stop_timeout).await.map(|_| ()).map_err(|e| fail("stopping", e)),
                );
            }
            Some(Err(e)) => {
                let _ = pg.stop_everything().await;
                return StartEnd::Failed(fail("starting PostgreSQL", e));
            }
            Some(Ok(())) => {}
        }
        let names = roles::Names { app: &self.cfg.app_role, superuser: &self.cfg.pg_role };
        let standby = self.cfg.read_only_at.is_some() || self.cfg.replica.is_some();
        let ensured = roles::ensure(
            &self.app_login_config(&password),
            &self.socket_config(false),
            names,
            standby,
            verifier.as_deref(),
        )
        .await;
        if let Err(e) = ensured {
            let _ = pg.stop_everything().await;
            return StartEnd::Failed(e);
        }
        let repl = self.proposer_connection();
        let seconds = self.cfg.clock.since(t).as_secs_f64();
        self.record(|t| t.postgres_start_seconds = seconds);
        info!(seconds, "PostgreSQL accepts connections");
        StartEnd::Started(Box::new(Started { pg, proposer_cfg, repl }))
    }

    /// Where a replica starts: the last checkpoint record the pageserver has
    /// ingested, after waiting for it to ingest `after` (the writer's fresh
    /// checkpoint) if given (`docs/replicas.md`, "Where a replica starts").
    async fn replica_start_point(
        &self,
        client: &Arc<PageserverClient>,
        after: Option<Lsn>,
    ) -> Result<(CheckpointRecordResponse, Lsn), AgentError> {
        if let Some(after) = after {
            self.wait_for_pageserver(client, after).await?;
        }
        let (c, tenant, timeline) = (client.clone(), self.cfg.tenant_id, self.cfg.timeline_id);
        let record = tokio::task::spawn_blocking(move || {
            let info = c.timeline(tenant, timeline)?;
            let record = c.checkpoint_record(tenant, timeline, info.last_record_lsn)?;
            // Not the safekeepers' commit LSN the pageserver was told: WAL
            // up to it may not be on the safekeepers this replica streams
            // from (another site's, through a cut), and PostgreSQL would
            // refuse queries until it were.
            Ok::<_, crate::agent::pageserver_api::ApiError>((record, info.last_record_lsn))
        })
        .await
        .map_err(|e| fail("replica start", format!("request task: {e}")))?;
        record.map_err(|e| fail("replica start", format!("{}: its last checkpoint record: {e}", self.timeline_name())))
    }

    /// Polls the pageserver until it has ingested the WAL up to `lsn`.
    async fn wait_for_pageserver(&self, client: &Arc<PageserverClient>, lsn: Lsn) -> Result<(), AgentError> {
        let clock = &self.cfg.clock;
        let deadline = clock.now() + self.cfg.wait_timeout;
        let mut pause = crate::limits::INGEST_WAIT_FIRST_PAUSE;
        loop {
            let c = client.clone();
            let (tenant, timeline) = (self.cfg.tenant_id, self.cfg.timeline_id);
            let answer = tokio::task::spawn_blocking(move || c.timeline(tenant, timeline))
                .await
                .map_err(|e| fail("waiting for the pageserver", format!("request task: {e}")))?;
            let last = match answer {
                Ok(info) => {
                    check_timeline(&info).map_err(|e| fail("waiting for the pageserver", e))?;
                    if info.state == TimelineState::Active && info.last_record_lsn >= lsn {
                        return Ok(());
                    }
                    format!("{} at {}", info.state, info.last_record_lsn)
                }
                Err(e) if e.is_transient() => e.to_string(),
                Err(e) => return Err(fail("waiting for the pageserver", format!("{}: {e}", self.timeline_name()))),
            };
            if clock.now() + pause > deadline {
                return Err(fail(
                    "waiting for the pageserver",
                    format!(
                        "{}: the pageserver did not reach {lsn} within {:?} (last: {last})",
                        self.timeline_name(),
                        self.cfg.wait_timeout
                    ),
                ));
            }
            clock.sleep(pause).await;
            pause = (pause * 2).min(crate::limits::INGEST_WAIT_MAX_PAUSE);
        }
    }

    /// Stops a PostgreSQL an earlier agent left running here, empties the
    /// data directory and unpacks the basebackup at `lsn` into it, streaming
    /// (a replica's standby basebackup is asked for at `standby_at`, the end
    /// of the checkpoint record whose redo point is `lsn`). `None` if a stop
    /// was requested meanwhile.
    async fn restore(
        &self,
        stop: &mut watch::Receiver<bool>,
        client: &Arc<PageserverClient>,
        lsn: Lsn,
        standby_at: Option<(Lsn, Lsn)>,
    ) -> Result<Option<basebackup::UnpackStats>, AgentError> {
        if let Some(pid) = leftover::find(&self.pgdata) {
            leftover::stop(&self.pgdata, pid, &*self.cfg.clock).await.map_err(|e| fail("basebackup", e))?;
        }
        postgres::check_not_running(&self.pgdata).map_err(|e| fail("basebackup", e))?;
        // A lazy compute's mounts of the previous run (or a dead agent's).
        self.lazy.unmount(&self.pgdata);
        let cancel = Arc::new(AtomicBool::new(false));
        let pg_major = self.checked_major();
        let (c, pgdata, flag) = (client.clone(), self.pgdata.clone(), cancel.clone());
        let (tenant, timeline) = (self.cfg.tenant_id, self.cfg.timeline_id);
        let (kind, at) = match (standby_at, self.cfg.read_only_at) {
            (Some((at, _)), _) => (BasebackupKind::Standby, at),
            (None, Some(_)) => (BasebackupKind::ReadOnly, lsn),
            (None, None) => (BasebackupKind::Writer, lsn),
        };
        let lazy = self.cfg.lazy_page_service.is_some();
        // An eager compute of a sharded tenant: shard 0's lazy basebackup,
        // then every relation file written from the shards.
        let from_shards = match lazy || !self.cfg.shards.now().layout.is_sharded() {
            true => None,
            false => Some(super::lazy::page_source(&self.cfg).map_err(|e| fail("basebackup", e))?),
        };
        let clock = self.cfg.clock.clone();
        let mut task = tokio::task::spawn_blocking(move || -> Result<basebackup::UnpackStats, String> {
            basebackup::prepare_dir(&pgdata).map_err(|e| e.to_string())?;
            let manifest = lazy || from_shards.is_some();
            let reader = c.basebackup(tenant, timeline, at, kind, manifest).map_err(|e| e.to_string())?;
            let mut stats = basebackup::unpack(reader, &pgdata, &flag).map_err(|e| e.to_string())?;
            if let Some(source) = from_shards {
                let t = clock.now();
                let done = super::materialize::materialize(&pgdata, &*source, &flag)?;
                let seconds = clock.since(t).as_secs_f64();
                info!(seconds, files = done.files, blocks = done.blocks, "relation files written from the shards");
                stats.bytes += done.blocks * strata_formats::version::BLCKSZ as u64;
                stats.files += done.files;
            }
            if let Some((_, consistent_at)) = standby_at {
                basebackup::hold_queries_until(&pgdata, consistent_at).map_err(|e| e.to_string())?;
            }
            basebackup::finish(&pgdata, pg_major).map_err(|e| e.to_string())?;
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
            host_address: self.cfg.pg_host_address,
            socket_dir: pgconf::socket_dir(&self.pgdata, self.cfg.pg_port),
            shared_buffers: self.cfg.shared_buffers.clone(),
            io_method: self.cfg.io_method,
            verify_redo: self.cfg.verify_redo,
            application_name: self.cfg.application_name.clone(),
            read_only: self.cfg.read_only_at.is_some(),
            standby: self.cfg.replica.as_ref().map(|r| pgconf::StandbySettings {
                replication: r.replication.clone(),
                user: self.cfg.pg_role.clone(),
                token: self.cfg.token.as_ref().map(|t| t.expose().to_string()),
                ca_file: r.ca_file.clone(),
                timeline: format!("{}/{}", self.cfg.tenant_id, self.cfg.timeline_id),
                feedback: r.hot_standby_feedback,
            }),
            tls_files: self.cfg.pg_tls_files.clone(),
            superuser: self.cfg.pg_role.clone(),
        };
        let pgdata = self.pgdata.clone();
        let owner = user.map(|u| (u.uid, u.gid));
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            pgconf::write_config(&pgdata, &settings).map_err(|e| e.to_string())?;
            pgconf::prepare_socket_dir(&settings.socket_dir, &pgdata, owner).map_err(|e| e.to_string())?;
            basebackup::set_ownership(&pgdata, owner).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| fail("configuration", format!("task: {e}")))?
        .map_err(|e| fail("configuration", e))
    }
}

/// The endpoint's password: the file's first line, which must not be empty
/// and may not be readable by others (it is a secret like a token).
fn read_password(path: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let what = || format!("password file {}", path.display());
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", what()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!("{}: mode {:o} lets others read it; it must be 0600", what(), meta.mode() & 0o777));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", what()))?;
    let password = text.lines().next().unwrap_or("").to_string();
    if password.is_empty() || password.contains('\0') {
        return Err(format!("{}: empty, or a NUL byte in the password", what()));
    }
    Ok(password)
}

/// The role's SCRAM verifier (`SCRAM-SHA-256$…`), private like the
/// password; only the characters of its format, since it goes into SQL.
fn read_verifier(path: &std::path::Path) -> Result<String, String> {
    let v = read_password(path).map_err(|e| e.replace("password file", "verifier file"))?;
    let plain = v.chars().all(|c| c.is_ascii_alphanumeric() || "+/=$:-".contains(c));
    if !v.starts_with("SCRAM-SHA-256$") || !plain {
        return Err(format!("verifier file {}: not a SCRAM-SHA-256 verifier", path.display()));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_verifier_file_holds_a_verifier_and_nothing_that_breaks_sql() {
        let dir = strata_test_support::scratch_dir("agent-verifier");
        let path = dir.join("password.scram");
        let write = |text: &str| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        write("SCRAM-SHA-256$4096:c2FsdA==$YWJj:ZGVm\n");
        assert_eq!(read_verifier(&path).unwrap(), "SCRAM-SHA-256$4096:c2FsdA==$YWJj:ZGVm");
        for bad in ["md5abc", "SCRAM-SHA-256$4096:x'; DROP TABLE t; --", ""] {
            write(bad);
            assert!(read_verifier(&path).is_err(), "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_password_file_must_be_private_and_hold_a_password() {
        let dir = std::env::temp_dir().join(format!("strata-password-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("password");
        let write = |text: &str, mode: u32| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("s3cret\nignored\n", 0o600);
        assert_eq!(read_password(&path).unwrap(), "s3cret");
        write("s3cret\n", 0o644);
        let err = read_password(&path).unwrap_err();
        assert!(err.contains("lets others read it") && !err.contains("s3cret"), "{err}");
        for bad in ["", "\n", "a\0b"] {
            write(bad, 0o600);
            let err = read_password(&path).unwrap_err();
            assert!(err.contains("empty, or a NUL byte"), "{bad:?}: {err}");
        }
        let err = read_password(&dir.join("missing")).unwrap_err();
        assert!(err.contains("missing"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
