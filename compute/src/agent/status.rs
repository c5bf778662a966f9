//! The agent's state as others see it: `GET /v1/status` (JSON) and
//! `GET /metrics` (Prometheus text), including the durations of the phases
//! of the last start and the restarts of PostgreSQL.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use strata_formats::Lsn;
use strata_service::ListenerMetrics;
use tokio::sync::watch;

use crate::proposer::ProposerStatus;

/// Where the agent is in a compute's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Looking up the timeline and bringing the safekeepers to the end of its WAL.
    Syncing,
    /// Waiting for the pageserver to ingest the WAL up to that end.
    WaitingForPageserver,
    /// Downloading and unpacking the basebackup, writing the configuration.
    Restoring,
    /// PostgreSQL is starting; the proposer is connecting.
    Starting,
    /// PostgreSQL accepts connections and its WAL streams to the safekeepers.
    Running,
    /// PostgreSQL or the proposer failed after `running`: waiting to start
    /// afresh, or starting afresh (all phases again).
    Restarting,
    /// Shutting down: PostgreSQL's last WAL is being made durable.
    Stopping,
    /// The first start failed (`error` says why); the agent exits.
    Failed,
}

impl AgentState {
    /// All states, in order.
    pub const ALL: [AgentState; 8] = [
        AgentState::Syncing,
        AgentState::WaitingForPageserver,
        AgentState::Restoring,
        AgentState::Starting,
        AgentState::Running,
        AgentState::Restarting,
        AgentState::Stopping,
        AgentState::Failed,
    ];

    /// The name used in JSON and metrics.
    pub fn name(self) -> &'static str {
        match self {
            AgentState::Syncing => "syncing",
            AgentState::WaitingForPageserver => "waiting_for_pageserver",
            AgentState::Restoring => "restoring",
            AgentState::Starting => "starting",
            AgentState::Running => "running",
            AgentState::Restarting => "restarting",
            AgentState::Stopping => "stopping",
            AgentState::Failed => "failed",
        }
    }
}

/// Durations (seconds) and sizes of the phases of the last start; zero
/// until a phase has completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StartTimings {
    /// Asking the pageserver for the timeline (including retries).
    pub timeline_lookup_seconds: f64,
    /// sync-safekeepers: election and catch-up of a quorum.
    pub sync_seconds: f64,
    /// Until the pageserver had ingested the WAL up to the start LSN.
    pub wait_seconds: f64,
    /// Downloading and unpacking the basebackup (streamed, so together).
    pub basebackup_seconds: f64,
    pub basebackup_bytes: u64,
    pub basebackup_files: u64,
    /// Writing the configuration and setting ownership.
    pub config_seconds: f64,
    /// A lazy compute: reading the manifest, creating the backing files
    /// and mounting `base/` and `global/` (0 when eager).
    pub mount_seconds: f64,
    /// From starting `postgres` until it accepted connections.
    pub postgres_start_seconds: f64,
    /// Until the proposer streamed PostgreSQL's WAL (state `running`).
    pub proposer_start_seconds: f64,
    /// From the agent's start to `running`.
    pub total_seconds: f64,
}

/// PostgreSQL's restarts by this agent process.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RestartStatus {
    /// Fresh starts after a failure (each attempt counts).
    pub restarts: u64,
    /// What led to the last one: PostgreSQL's exit, the proposer's error,
    /// or a failed restart attempt.
    pub last_restart_cause: Option<String>,
    /// When the last one was decided (Unix seconds).
    pub last_restart_at: Option<u64>,
    /// From detecting the failure to `running` again, for the last restart
    /// that got there.
    pub last_restart_downtime_seconds: Option<f64>,
    /// The recent restarts are a crash loop (see `AgentConfig::restart`).
    pub crash_loop: bool,
    /// Until when they are; `crash_loop` is derived from it when read.
    #[serde(skip)]
    pub crash_loop_until: Option<Instant>,
}

impl RestartStatus {
    /// `crash_loop` as of `now`.
    fn refresh(&mut self, now: Instant) {
        self.crash_loop = self.crash_loop_until.is_some_and(|until| now < until);
    }
}

/// Everything `/v1/status` reports except the proposer's part.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AgentStatus {
    pub state: AgentState,
    pub pg_port: u16,
    pub pgdata: PathBuf,
    /// PostgreSQL's log file.
    pub pg_log: PathBuf,
    pub tenant_id: String,
    pub timeline_id: String,
    /// The LSN the compute started at (the end of the timeline's WAL), once known.
    pub start_lsn: Option<Lsn>,
    /// Why the first start failed (`failed`), or what the agent is
    /// recovering from (`restarting`); null otherwise.
    pub error: Option<String>,
    pub timings: StartTimings,
    #[serde(flatten)]
    pub restart: RestartStatus,
    /// A lazy compute's file system (`docs/lazy-compute.md`); null when eager.
    pub lazy: Option<LazyStatus>,
}

/// What a lazy compute's file system did, over every run of PostgreSQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LazyStatus {
    /// Blocks fetched from the pageserver.
    pub blocks_fetched: u64,
    /// Of those, blocks a large sequential read fetched for the first time
    /// and did not keep in the cache.
    pub blocks_streamed: u64,
    /// Fetches that failed (each an I/O error to PostgreSQL).
    pub fetch_errors: u64,
    /// Blocks the cache dropped from local disk.
    pub cache_evictions: u64,
    /// Blocks the cache holds that it may drop (an upper bound).
    pub cache_blocks: u64,
    /// The most blocks it holds before dropping some.
    pub cache_budget_blocks: u64,
}

/// The JSON document of `/v1/status`.
#[derive(serde::Serialize)]
struct StatusDocument<'a> {
    #[serde(flatten)]
    agent: &'a AgentStatus,
    proposer: ProposerStatus,
}

/// Shared handle on the agent's status; cheap to clone.
#[derive(Clone)]
pub struct StatusHandle {
    agent: Arc<Mutex<AgentStatus>>,
    proposer: watch::Receiver<ProposerStatus>,
    /// Connections of the status server itself.
    listeners: ListenerMetrics,
    /// A lazy compute's file system counters.
    lazy: Option<Arc<crate::lazy::fs::LazyStats>>,
}

impl StatusHandle {
    /// A handle starting from `initial`, reading the proposer's part from `proposer`.
    pub fn new(initial: AgentStatus, proposer: watch::Receiver<ProposerStatus>) -> StatusHandle {
        StatusHandle {
            agent: Arc::new(Mutex::new(initial)),
            proposer,
            listeners: ListenerMetrics::default(),
            lazy: None,
        }
    }

    /// The same handle, reporting a lazy compute's file system counters.
    pub fn with_lazy(mut self, stats: Arc<crate::lazy::fs::LazyStats>) -> StatusHandle {
        self.lazy = Some(stats);
        self
    }

    /// Changes the agent's part.
    pub fn update(&self, f: impl FnOnce(&mut AgentStatus)) {
        let mut guard = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard);
    }

    /// Sets the state.
    pub fn set_state(&self, state: AgentState) {
        self.update(|s| s.state = state);
    }

    /// A copy of the agent's part, as of now.
    pub fn agent(&self) -> AgentStatus {
        let mut copy = self.agent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        copy.restart.refresh(Instant::now());
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
        *self.proposer.borrow()
    }

    /// The `/v1/status` document.
    pub fn to_json(&self) -> serde_json::Value {
        let agent = self.agent();
        serde_json::to_value(StatusDocument { agent: &agent, proposer: self.proposer() })
            .expect("the status serializes")
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
    }
    register_proposer_metrics(&mut registry, proposer);
    strata_service::metrics::render(&registry)
}

/// `/v1/status` and `/metrics`.
pub fn router(handle: StatusHandle) -> axum::Router {
    use axum::routing::get;
    let json = handle.clone();
    axum::Router::new()
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
                text.push_str(&strata_service::metrics::render(&registry));
                async move { text }
            }),
        )
}

/// Binds `addr` and serves [`router`] in a background task, on a listener
/// with a connection limit that never stops on accept errors.
pub async fn serve(
    addr: SocketAddr,
    max_connections: usize,
    handle: StatusHandle,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = strata_service::listener::listen(addr)?;
    let limits = strata_service::Limits {
        max_connections: max_connections.max(1),
        handshake_timeout: std::time::Duration::from_secs(10),
    };
    let listener =
        strata_service::Listener::new("http", listener, limits, strata_service::http::refusal, &handle.listeners);
    Ok(tokio::spawn(strata_service::http::serve(listener, router(handle), Default::default())))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let handle = StatusHandle::new(status(), rx);
        let now = Instant::now();
        handle.update(|s| {
            s.state = AgentState::Restarting;
            s.restart = RestartStatus {
                restarts: 5,
                last_restart_cause: Some("PostgreSQL exited (signal 9: SIGKILL)".into()),
                last_restart_at: Some(1_700_000_000),
                last_restart_downtime_seconds: Some(1.25),
                crash_loop: false,
                crash_loop_until: Some(now + std::time::Duration::from_secs(60)),
            };
        });
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
        handle.update(|s| s.restart.crash_loop_until = Some(now));
        assert_eq!(handle.to_json()["crash_loop"], false);
        let text = render_metrics(&handle.agent(), &ProposerStatus::default());
        assert!(text.contains("strata_compute_crash_loop 0"), "{text}");
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
