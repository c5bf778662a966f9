//! The agent's state as others see it: `GET /v1/status` (JSON) and
//! `GET /metrics` (Prometheus text), including the durations of the phases
//! of the last start and the restarts of PostgreSQL.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::clock::SharedClock;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use strata_service::auth::http::{guard, HttpAuth, Need, RefusalMetrics};
use strata_service::auth::Verifier;
use strata_service::ListenerMetrics;
use tokio::sync::watch;

pub use strata_protocol::api::compute::{
    AgentState, AgentStatus, ComputeStatus, LazyStatus, RestartStatus, StartTimings,
};

use crate::limits::CHECKPOINT_TIMEOUT;
use crate::proposer::ProposerStatus;

/// Shared handle on the agent's status; cheap to clone.
#[derive(Clone)]
pub struct StatusHandle {
    agent: Arc<Mutex<AgentStatus>>,
    proposer: watch::Receiver<ProposerStatus>,
    /// Connections of the status server itself.
    listeners: ListenerMetrics,
    /// Calls to the status server refused for their token.
    refusals: RefusalMetrics,
    /// A lazy compute's file system counters.
    lazy: Option<Arc<crate::lazy::fs::LazyStats>>,
    /// The tenant's shards as the compute follows them (their count and
    /// layout switches in the metrics).
    shards: Option<crate::pageserver_target::TenantShards>,
    /// Until when the recent restarts are a crash loop; `crash_loop` is
    /// derived from it when the status is read.
    crash_loop_until: Arc<Mutex<Option<Instant>>>,
    /// A writer's session through its socket, for `POST /v1/checkpoint`.
    sql: Option<crate::pg_replication::ReplicationConfig>,
    /// What `crash_loop_until` is compared with.
    clock: SharedClock,
}

impl StatusHandle {
    /// A handle starting from `initial`, reading the proposer's part from `proposer`.
    pub fn new(initial: AgentStatus, proposer: watch::Receiver<ProposerStatus>) -> StatusHandle {
        StatusHandle {
            agent: Arc::new(Mutex::new(initial)),
            proposer,
            listeners: ListenerMetrics::default(),
            refusals: RefusalMetrics::default(),
            lazy: None,
            shards: None,
            crash_loop_until: Arc::default(),
            sql: None,
            clock: SharedClock::default(),
        }
    }

    /// The same handle, reading the time from `clock`.
    pub fn with_clock(mut self, clock: SharedClock) -> StatusHandle {
        self.clock = clock;
        self
    }

    /// The same handle, able to ask a writer's PostgreSQL for a checkpoint
    /// (where a new replica starts) over this session.
    pub fn with_sql(mut self, sql: crate::pg_replication::ReplicationConfig) -> StatusHandle {
        self.sql = Some(sql);
        self
    }

    /// The same handle, reporting a lazy compute's file system counters.
    pub fn with_lazy(mut self, stats: Arc<crate::lazy::fs::LazyStats>) -> StatusHandle {
        self.lazy = Some(stats);
        self
    }

    /// The same handle, reporting the tenant's shard count and layout switches.
    pub fn with_shards(mut self, shards: crate::pageserver_target::TenantShards) -> StatusHandle {
        self.shards = Some(shards);
        self
    }

    /// Registers the metrics of the tenant's shards, if followed.
    fn register_shard_metrics(&self, registry: &mut Registry) {
        let Some(shards) = &self.shards else { return };
        let now = shards.now();
        registry.register(
            "shards",
            "Shards of the tenant the compute reads from",
            ConstGauge::new(i64::from(now.layout.count)),
        );
        registry.register(
            "shard_layout_switches",
            "Times the compute switched to a new shard layout of its tenant (splits)",
            ConstCounter::new(now.switches),
        );
    }

    /// Changes the agent's part.
    pub fn update(&self, f: impl FnOnce(&mut AgentStatus)) {
        let mut guard = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard);
    }

    /// Until when the recent restarts are a crash loop (`None`: they are not).
    pub fn set_crash_loop_until(&self, until: Option<Instant>) {
        *self.crash_loop_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    /// Sets the state.
    pub fn set_state(&self, state: AgentState) {
        self.update(|s| s.state = state);
    }

    /// A copy of the agent's part, as of now.
    pub fn agent(&self) -> AgentStatus {
        let mut copy = self.agent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let until = *self.crash_loop_until.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock.now();
        copy.restart.crash_loop = until.is_some_and(|until| now < until);
        copy.lazy = self.lazy.as_ref().map(|l| LazyStatus {
            blocks_fetched: l.blocks_fetched.load(std::sync::atomic::Ordering::Relaxed),
            blocks_streamed: l.blocks_streamed.load(std::sync::atomic::Ordering::Relaxed),
            fetch_errors: l.fetch_errors.load(std::sync::atomic::Ordering::Relaxed),
            cache_evictions: l.cache.evictions.load(std::sync::atomic::Ordering::Relaxed),
            cache_blocks: l.cache.blocks.load(std::sync::atomic::Ordering::Relaxed),
            cache_budget_blocks: l.cache.budget_blocks.load(std::sync::atomic::Ordering::Relaxed),
        });
        copy
    }

    /// The proposer's latest status.
    pub fn proposer(&self) -> ProposerStatus {
        self.proposer.borrow().clone()
    }

    /// The `/v1/status` document.
    pub fn to_json(&self) -> serde_json::Value {
        let agent = self.agent();
        serde_json::to_value(ComputeStatus { agent, proposer: self.proposer() }).expect("the status serializes")
    }
}

/// Registers the proposer's metrics (`strata_proposer_*` when `registry` has
/// no prefix of its own).
pub fn register_proposer_metrics(registry: &mut Registry, s: &ProposerStatus) {
    let r = registry.sub_registry_with_prefix("strata_proposer");
    r.register("term", "Election term of this proposer", ConstGauge::new(s.term as i64));
    r.register("commit_lsn", "Quorum-flushed LSN in this term", ConstGauge::new(s.commit_lsn.0 as i64));
    r.register(
        "acknowledged_lsn",
        "LSN reported to PostgreSQL as flushed",
        ConstGauge::new(s.acknowledged_lsn.0 as i64),
    );
    r.register(
        "connected_safekeepers",
        "Safekeepers with an open connection",
        ConstGauge::new(s.connected_safekeepers as i64),
    );
    r.register(
        "throttled_seconds",
        "Time acknowledgements were held back by backpressure",
        ConstCounter::new(s.throttled_seconds),
    );
    r.register(
        "async_lag_bytes",
        "Largest lag of an asynchronous safekeeper behind the WAL received (local-quorum)",
        ConstGauge::new(s.async_safekeepers.iter().filter_map(|a| a.lag_bytes).max().unwrap_or(0) as i64),
    );
    r.register(
        "async_dropped",
        "Times an asynchronous safekeeper was dropped for lagging past max_async_lag",
        ConstCounter::new(s.async_dropped),
    );
    r.register(
        "acks",
        "Batches of PostgreSQL's WAL acknowledged as flushed once a quorum held them",
        ConstCounter::new(s.acks),
    );
    r.register(
        "ack_wait_seconds",
        "Summed wait of those batches from arrival to acknowledgement (what commits wait on the safekeepers)",
        ConstCounter::new(s.ack_wait_seconds),
    );
}

/// The proposer's metrics in Prometheus text format.
pub fn render_proposer_metrics(s: &ProposerStatus) -> String {
    let mut registry = Registry::default();
    register_proposer_metrics(&mut registry, s);
    strata_service::metrics::render(&registry)
}

/// The agent's and the proposer's metrics in Prometheus text format.
pub fn render_metrics(agent: &AgentStatus, proposer: &ProposerStatus) -> String {
    let mut registry = Registry::default();
    {
        let r = registry.sub_registry_with_prefix("strata_compute");
        let states = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
        for state in AgentState::ALL {
            states.get_or_create(&vec![("state", state.name())]).set(i64::from(agent.state == state));
        }
        r.register("state", "1 for the agent's current state, 0 for the others", states);
        r.register("pg_port", "PostgreSQL's TCP port", ConstGauge::new(i64::from(agent.pg_port)));
        r.register(
            "start_lsn",
            "LSN the compute started at",
            ConstGauge::new(agent.start_lsn.unwrap_or_default().0 as i64),
        );
        let t = &agent.timings;
        let seconds = [
            (
                "start_timeline_lookup_seconds",
                "Last start: asking the pageserver for the timeline",
                t.timeline_lookup_seconds,
            ),
            ("start_sync_seconds", "Last start: sync-safekeepers", t.sync_seconds),
            ("start_wait_seconds", "Last start: waiting for the pageserver to reach the start LSN", t.wait_seconds),
            ("start_basebackup_seconds", "Last start: downloading and unpacking the basebackup", t.basebackup_seconds),
            ("start_config_seconds", "Last start: writing the configuration", t.config_seconds),
            ("start_mount_seconds", "Last start: mounting a lazy compute's relation files", t.mount_seconds),
            ("start_postgres_seconds", "Last start: until PostgreSQL accepted connections", t.postgres_start_seconds),
            (
                "start_proposer_seconds",
                "Last start: until PostgreSQL's WAL streamed to the safekeepers",
                t.proposer_start_seconds,
            ),
            ("start_total_seconds", "Last start: from the agent's start to running", t.total_seconds),
        ];
        for (name, help, value) in seconds {
            r.register(name, help, ConstGauge::new(value));
        }
        r.register(
            "basebackup_bytes",
            "Last start: bytes of the basebackup stream",
            ConstGauge::new(t.basebackup_bytes),
        );
        r.register("basebackup_files", "Last start: files in the basebackup", ConstGauge::new(t.basebackup_files));
        let restart = &agent.restart;
        r.register(
            "restarts",
            "Fresh starts of PostgreSQL after a failure, by this agent process",
            ConstCounter::new(restart.restarts),
        );
        r.register(
            "crash_loop",
            "1 while the recent restarts are a crash loop",
            ConstGauge::new(i64::from(restart.crash_loop)),
        );
        r.register(
            "last_restart_downtime_seconds",
            "Last restart: from detecting the failure to running again",
            ConstGauge::new(restart.last_restart_downtime_seconds.unwrap_or(0.0)),
        );
        if let Some(a) = &agent.activity {
            r.register(
                "transactions",
                "PostgreSQL's commits and rollbacks since its server started (pg_stat_database, polled)",
                ConstCounter::new(a.transactions),
            );
            r.register(
                "client_connections",
                "PostgreSQL's client connections, the agent's own excluded (polled)",
                ConstGauge::new(a.client_connections as i64),
            );
        }
        if let Some(lazy) = &agent.lazy {
            r.register(
                "lazy_blocks_fetched",
                "Blocks the lazy file system fetched from the pageserver",
                ConstCounter::new(lazy.blocks_fetched),
            );
            r.register(
                "lazy_blocks_streamed",
                "Blocks fetched for a large sequential read and not kept in the cache",
                ConstCounter::new(lazy.blocks_streamed),
            );
            r.register(
                "lazy_fetch_errors",
                "Fetches from the pageserver that failed (I/O errors to PostgreSQL)",
                ConstCounter::new(lazy.fetch_errors),
            );
            r.register(
                "lazy_cache_evictions",
                "Blocks the lazy file system's cache dropped from local disk",
                ConstCounter::new(lazy.cache_evictions),
            );
            r.register(
                "lazy_cache_blocks",
                "Blocks the lazy file system's cache holds and may drop",
                ConstGauge::new(lazy.cache_blocks as i64),
            );
            r.register(
                "lazy_cache_budget_blocks",
                "The most blocks the lazy file system's cache holds",
                ConstGauge::new(lazy.cache_budget_blocks as i64),
            );
        }
        if let Some(ps) = &agent.pageserver {
            r.register(
                "pageserver_switches",
                "Times the compute switched to another pageserver (failovers and moves)",
                ConstCounter::new(ps.switches),
            );
        }
        if let Some(replica) = &agent.replica {
            r.register(
                "replica_lag_bytes",
                "A replica: bytes of the branch's WAL it has not replayed yet",
                ConstGauge::new(replica.lag_bytes as i64),
            );
            r.register(
                "replica_lag_seconds",
                "A replica: how long the oldest WAL it has not replayed has been known to it",
                ConstGauge::new(replica.lag_seconds),
            );
            r.register(
                "replica_replay_lsn",
                "A replica: PostgreSQL's replay position (bytes)",
                ConstGauge::new(replica.replay_lsn.map_or(0, |l| l.0 as i64)),
            );
            r.register(
                "replica_lag_restarts",
                "A replica: restarts because it lagged beyond the bound",
                ConstCounter::new(replica.lag_restarts),
            );
        }
    }
    register_proposer_metrics(&mut registry, proposer);
    strata_service::metrics::render(&registry)
}

/// `POST /v1/checkpoint`: a writer runs `CHECKPOINT`, and answers where the
/// checkpoint record is: a new replica starts from it (`docs/replicas.md`).
async fn checkpoint(handle: StatusHandle) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let refuse = |code: StatusCode, message: String| {
        (code, axum::Json(strata_protocol::api::ErrorBody { error: message })).into_response()
    };
    let Some(sql) = handle.sql.clone() else {
        return refuse(StatusCode::CONFLICT, "only a writer makes checkpoints".into());
    };
    if handle.agent().state != AgentState::Running {
        return refuse(StatusCode::CONFLICT, format!("the compute is {}", handle.agent().state.name()));
    }
    let run = async {
        let mut conn = crate::pg_replication::ReplicationConnection::connect(&sql).await.map_err(|e| e.to_string())?;
        conn.simple_query("CHECKPOINT").await.map_err(|e| e.to_string())?;
        let rows = conn
            .simple_query("SELECT checkpoint_lsn::text, redo_lsn::text FROM pg_control_checkpoint()")
            .await
            .map_err(|e| e.to_string())?;
        let lsn = |i: usize| -> Result<strata_formats::Lsn, String> {
            let text = rows.first().and_then(|r| r.get(i).cloned().flatten()).ok_or("no checkpoint reported")?;
            text.parse().map_err(|_| format!("not an LSN: {text:?}"))
        };
        Ok::<_, String>(strata_protocol::api::compute::CheckpointResponse {
            checkpoint_lsn: lsn(0)?,
            redo_lsn: lsn(1)?,
        })
    };
    match strata_service::clock::timeout(&*handle.clock, CHECKPOINT_TIMEOUT, run).await {
        Ok(Ok(answer)) => axum::Json(answer).into_response(),
        Ok(Err(e)) => refuse(StatusCode::SERVICE_UNAVAILABLE, format!("CHECKPOINT: {e}")),
        Err(_) => {
            refuse(StatusCode::SERVICE_UNAVAILABLE, format!("CHECKPOINT: not done within {CHECKPOINT_TIMEOUT:?}"))
        }
    }
}

/// `/v1/status`, `/metrics` and `POST /v1/checkpoint`; with `auth`, for
/// services and management.
pub fn router(handle: StatusHandle, auth: Option<&HttpAuth>) -> axum::Router {
    use axum::routing::{get, post};
    let json = handle.clone();
    let for_checkpoint = handle.clone();
    let routes = axum::Router::new()
        .route("/v1/checkpoint", post(move || checkpoint(for_checkpoint.clone())))
        .route(
            "/v1/status",
            get(move || {
                let doc = json.to_json();
                async move { axum::Json(doc) }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let mut text = render_metrics(&handle.agent(), &handle.proposer());
                let mut registry = Registry::with_prefix("strata_compute");
                handle.listeners.register_into(&mut registry);
                handle.refusals.register_into(&mut registry);
                handle.register_shard_metrics(&mut registry);
                text.push_str(&strata_service::metrics::render(&registry));
                async move { text }
            }),
        );
    guard(routes, auth, Need::Service)
}

/// Binds `addr` and serves [`router`] in a background task, on a listener
/// with a connection limit that never stops on accept errors.
pub async fn serve(
    addr: SocketAddr,
    max_connections: usize,
    handle: StatusHandle,
    auth: Option<Arc<Verifier>>,
    tls: Option<strata_service::tls::ServerTls>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let auth = auth.map(|v| HttpAuth::new(v, handle.refusals.clone()));
    let listener = strata_service::listener::listen(addr)?;
    let limits = strata_service::Limits {
        max_connections: max_connections.max(1),
        handshake_timeout: crate::limits::STATUS_HANDSHAKE_TIMEOUT,
    };
    let listener =
        strata_service::Listener::new("http", listener, limits, strata_service::http::refusal, &handle.listeners)
            .with_tls(tls);
    Ok(tokio::spawn(strata_service::http::serve(listener, router(handle, auth.as_ref()), Default::default())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use strata_formats::Lsn;
    use strata_service::clock::Clock;

    fn status() -> AgentStatus {
        AgentStatus {
            state: AgentState::Running,
            pg_port: 55432,
            pgdata: PathBuf::from("/srv/ep/pgdata"),
            pg_log: PathBuf::from("/srv/ep/postgres.log"),
            tenant_id: "11".repeat(16),
            timeline_id: "22".repeat(16),
            start_lsn: Some(Lsn(0x0100_0028)),
            error: None,
            timings: StartTimings { sync_seconds: 0.25, basebackup_bytes: 4096, ..Default::default() },
            restart: RestartStatus::default(),
            lazy: None,
            replica: None,
            pageserver: None,
            token: None,
            activity: None,
        }
    }

    #[test]
    fn a_lazy_computes_counters() {
        let (_tx, rx) = watch::channel(ProposerStatus::default());
        let eager = StatusHandle::new(status(), rx.clone());
        assert!(eager.to_json()["lazy"].is_null());
        assert!(!render_metrics(&eager.agent(), &eager.proposer()).contains("strata_compute_lazy_"));
        let stats = Arc::new(crate::lazy::fs::LazyStats::default());
        stats.blocks_fetched.store(7, std::sync::atomic::Ordering::Relaxed);
        stats.blocks_streamed.store(5, std::sync::atomic::Ordering::Relaxed);
        let lazy = StatusHandle::new(status(), rx).with_lazy(stats);
        assert_eq!(
            lazy.to_json()["lazy"],
            serde_json::json!({"blocks_fetched": 7, "blocks_streamed": 5, "fetch_errors": 0, "cache_evictions": 0, "cache_blocks": 0,
                               "cache_budget_blocks": 0})
        );
        let text = render_metrics(&lazy.agent(), &lazy.proposer());
        assert!(text.contains("strata_compute_lazy_blocks_fetched_total 7"), "{text}");
        assert!(text.contains("strata_compute_lazy_blocks_streamed_total 5"), "{text}");
        assert!(text.contains("strata_compute_lazy_fetch_errors_total 0"), "{text}");
    }

    #[test]
    fn the_shard_count_and_layout_switches() {
        use crate::pageserver_target::{PageserverTarget, TenantShards};
        let (_tx, rx) = watch::channel(ProposerStatus::default());
        let metrics = |handle: &StatusHandle| {
            let mut registry = Registry::with_prefix("strata_compute");
            handle.register_shard_metrics(&mut registry);
            strata_service::metrics::render(&registry)
        };
        assert!(!metrics(&StatusHandle::new(status(), rx.clone())).contains("shard"));
        let shards = TenantShards::unsharded(PageserverTarget::new("ps:1".into(), None));
        let text = metrics(&StatusHandle::new(status(), rx).with_shards(shards));
        assert!(text.contains("strata_compute_shards 1"), "{text}");
        assert!(text.contains("strata_compute_shard_layout_switches_total 0"), "{text}");
    }

    #[test]
    fn status_json() {
        let (_tx, rx) = watch::channel(ProposerStatus { term: 3, streaming: true, ..Default::default() });
        let handle = StatusHandle::new(status(), rx);
        let v = handle.to_json();
        assert_eq!(v["state"], "running");
        assert_eq!(v["pg_port"], 55432);
        assert_eq!(v["pgdata"], "/srv/ep/pgdata");
        assert_eq!(v["start_lsn"], "0/1000028");
        assert_eq!(v["error"], serde_json::Value::Null);
        assert_eq!(v["timings"]["sync_seconds"], 0.25);
        assert_eq!(v["proposer"]["term"], 3);
        assert_eq!(v["proposer"]["streaming"], true);
        assert_eq!(v["restarts"], 0);
        assert_eq!(v["last_restart_cause"], serde_json::Value::Null);
        assert_eq!(v["last_restart_at"], serde_json::Value::Null);
        assert_eq!(v["last_restart_downtime_seconds"], serde_json::Value::Null);
        assert_eq!(v["crash_loop"], false);
        assert!(v.get("crash_loop_until").is_none());

        handle.update(|s| {
            s.state = AgentState::Failed;
            s.error = Some("basebackup: broken".into());
            s.start_lsn = None;
        });
        let v = handle.to_json();
        assert_eq!(v["state"], "failed");
        assert_eq!(v["error"], "basebackup: broken");
        assert_eq!(v["start_lsn"], serde_json::Value::Null);
    }

    #[test]
    fn restarts_and_crash_loops() {
        let (_tx, rx) = watch::channel(ProposerStatus::default());
        let clock = strata_service::clock::ManualClock::new();
        let handle = StatusHandle::new(status(), rx).with_clock(SharedClock::new(clock.clone()));
        let now = clock.now();
        handle.update(|s| {
            s.state = AgentState::Restarting;
            s.restart = RestartStatus {
                restarts: 5,
                last_restart_cause: Some("PostgreSQL exited (signal 9: SIGKILL)".into()),
                last_restart_at: Some(1_700_000_000),
                last_restart_downtime_seconds: Some(1.25),
                crash_loop: false,
            };
        });
        handle.set_crash_loop_until(Some(now + std::time::Duration::from_secs(60)));
        let v = handle.to_json();
        assert_eq!(v["state"], "restarting");
        assert_eq!(v["restarts"], 5);
        assert_eq!(v["last_restart_cause"], "PostgreSQL exited (signal 9: SIGKILL)");
        assert_eq!(v["last_restart_at"], 1_700_000_000u64);
        assert_eq!(v["last_restart_downtime_seconds"], 1.25);
        assert_eq!(v["crash_loop"], true, "derived from crash_loop_until");
        let text = render_metrics(&handle.agent(), &ProposerStatus::default());
        assert!(text.contains("strata_compute_restarts_total 5"), "{text}");
        assert!(text.contains("strata_compute_crash_loop 1"), "{text}");
        assert!(text.contains("strata_compute_last_restart_downtime_seconds 1.25"), "{text}");
        assert!(text.contains("strata_compute_state{state=\"restarting\"} 1"), "{text}");

        // A crash loop ends once its restarts leave the window.
        handle.set_crash_loop_until(Some(now));
        assert_eq!(handle.to_json()["crash_loop"], false);
        let text = render_metrics(&handle.agent(), &ProposerStatus::default());
        assert!(text.contains("strata_compute_crash_loop 0"), "{text}");
    }

    #[test]
    fn a_crash_loop_ends_when_the_clock_leaves_its_window() {
        let (_tx, rx) = watch::channel(ProposerStatus::default());
        let clock = strata_service::clock::ManualClock::new();
        let handle = StatusHandle::new(status(), rx).with_clock(SharedClock::new(clock.clone()));
        handle.set_crash_loop_until(Some(clock.now() + std::time::Duration::from_secs(60)));
        assert!(handle.agent().restart.crash_loop);
        clock.advance(std::time::Duration::from_millis(59_999));
        assert!(handle.agent().restart.crash_loop, "still within the window");
        clock.advance(std::time::Duration::from_millis(1));
        assert!(!handle.agent().restart.crash_loop, "the window has passed");
    }

    #[test]
    fn state_names_match_serde() {
        for state in AgentState::ALL {
            assert_eq!(serde_json::to_value(state).unwrap(), state.name());
        }
        assert_eq!(AgentState::WaitingForPageserver.name(), "waiting_for_pageserver");
    }

    #[test]
    fn metrics_text() {
        let text = render_metrics(&status(), &ProposerStatus { throttled_seconds: 1.5, ..Default::default() });
        assert!(text.contains("strata_compute_state{state=\"running\"} 1"), "{text}");
        assert!(text.contains("strata_compute_state{state=\"syncing\"} 0"), "{text}");
        assert!(text.contains("strata_compute_start_sync_seconds 0.25"), "{text}");
        assert!(text.contains("strata_compute_basebackup_bytes 4096"), "{text}");
        assert!(text.contains("strata_compute_start_lsn 16777256"), "{text}");
        assert!(text.contains("strata_proposer_throttled_seconds_total 1.5"), "{text}");
        assert!(text.contains("strata_proposer_term 0"), "{text}");
        assert!(text.contains("strata_compute_restarts_total 0"), "{text}");
        assert!(text.contains("strata_compute_crash_loop 0"), "{text}");
        let proposer_only = render_proposer_metrics(&ProposerStatus::default());
        assert!(proposer_only.contains("strata_proposer_commit_lsn 0") && !proposer_only.contains("strata_compute"));
    }
}
