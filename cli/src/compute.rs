//! `strata compute …`: the compute agent's roles.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use strata_compute::agent;
use strata_compute::pg_replication::ReplicationConfig;
use strata_compute::proposer::{self, ProposerConfig, ProposerError};
use strata_protocol::safekeeper::TimelineIdentity;
use strata_protocol::{TenantId, TimelineId, Token};
use strata_service::auth::http::{guard, HttpAuth, Need, RefusalMetrics};
use strata_service::auth::{read_token, Verifier};
use strata_service::tls::{ClientTls, ServerTls};

/// Default bound on how far WAL consumers may lag before commits wait.
const DEFAULT_MAX_CONSUMER_LAG_MB: u64 = 1024;

#[derive(Subcommand)]
pub enum ComputeCommand {
    /// Start a compute in eager mode and keep it running: sync the
    /// safekeepers, restore the data directory from the pageserver's
    /// basebackup, configure and start PostgreSQL, and be its WAL proposer.
    /// Once running, a failure leads to a fresh start after a backoff.
    /// SIGTERM or SIGINT stops it gracefully.
    Start(Box<StartArgs>),
    /// Elect a proposer among the safekeepers, bring a quorum to the end of the
    /// timeline's WAL and commit it; print that LSN.
    SyncSafekeepers {
        #[command(flatten)]
        timeline: TimelineArgs,
        /// PostgreSQL's system identifier of the timeline.
        #[arg(long)]
        system_id: u64,
        #[arg(long, default_value_t = 16 << 20)]
        wal_segment_size: u32,
    },
    /// Be the WAL proposer of a running PostgreSQL: receive its WAL as its
    /// synchronous standby and report as flushed what a quorum of
    /// safekeepers holds.
    Proposer {
        #[command(flatten)]
        timeline: TimelineArgs,
        /// PostgreSQL's socket directory (or host name).
        #[arg(long)]
        pg_host: String,
        #[arg(long, default_value_t = 5432)]
        pg_port: u16,
        #[arg(long, default_value = "postgres")]
        pg_user: String,
        /// The name PostgreSQL's synchronous_standby_names lists.
        #[arg(long, default_value = "strata_proposer")]
        application_name: String,
        /// Physical replication slot that keeps WAL until the safekeepers have it.
        #[arg(long, default_value = "strata_proposer")]
        slot: String,
        /// WAL kept in memory for safekeepers that have not acknowledged it;
        /// one further behind recovers from its peers.
        #[arg(long, default_value_t = 256)]
        max_buffer_mb: usize,
        /// Hold commits back while WAL consumers lag more than this many MiB
        /// (0: never). The pageserver reports a lag while L0 layers wait for
        /// compaction, so this bounds them too.
        #[arg(long, default_value_t = DEFAULT_MAX_CONSUMER_LAG_MB)]
        max_consumer_lag_mb: u64,
        /// Serve status (/v1/status) and Prometheus metrics (/metrics) here.
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
        /// The cluster's public key: callers of the status server must
        /// present a service or management token signed by it.
        #[arg(long, value_name = "PEM")]
        auth_public_key: Option<std::path::PathBuf>,
    },
}

#[derive(Args)]
pub struct StartArgs {
    /// PostgreSQL's data directory; emptied and restored at every start.
    #[arg(long)]
    pgdata: std::path::PathBuf,
    /// PostgreSQL's TCP port (on 127.0.0.1, and on --pg-host-address).
    #[arg(long)]
    pg_port: u16,
    /// The host's address: PostgreSQL listens there too, for clients of
    /// other hosts, over TLS only (needs --tls-cert).
    #[arg(long, value_name = "IP", requires = "tls_cert")]
    pg_host_address: Option<std::net::IpAddr>,
    #[command(flatten)]
    timeline: TimelineArgs,
    /// The pageserver's HTTP API (host:port) at start.
    #[arg(long)]
    pageserver_http: String,
    /// The storage controllers' HTTP APIs (host:port, comma-separated):
    /// the compute follows the tenant when they move it to another
    /// pageserver (docs/storage-controller.md).
    #[arg(long = "controller", value_delimiter = ',')]
    controllers: Vec<String>,
    /// A replica's site: it reads the site's own pageserver (its reader)
    /// when the controllers have one there (docs/sites.md).
    #[arg(long)]
    pageserver_site: Option<String>,
    /// Addresses the safekeepers' membership configuration or a storage
    /// controller gives, and where this compute reaches them instead
    /// (`FROM=TO`, comma-separated; routes to another site, docs/sites.md).
    #[arg(long = "address-map", value_delimiter = ',', value_parser = parse_address_pair)]
    address_map: Vec<(String, String)>,
    /// Serve status (/v1/status) and Prometheus metrics (/metrics) here.
    #[arg(long)]
    http: Option<std::net::SocketAddr>,
    /// Most connections to the status server at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    http_max_connections: u16,
    /// Directory of the PostgreSQL 15 binaries.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pg_bin_dir: std::path::PathBuf,
    /// Operating-system user PostgreSQL runs as when this runs as root.
    #[arg(long, default_value = "postgres")]
    pg_user: String,
    /// PostgreSQL's shared_buffers.
    #[arg(long, default_value = "128MB")]
    shared_buffers: String,
    /// Log an image of every changed page, also for resource managers the
    /// pageserver redoes natively, so it can check its redo against them.
    #[arg(long)]
    verify_redo: bool,
    /// Hold commits back while WAL consumers lag more than this many MiB
    /// (0: never). The pageserver reports a lag while L0 layers wait for
    /// compaction, so this bounds them too.
    #[arg(long, default_value_t = DEFAULT_MAX_CONSUMER_LAG_MB)]
    max_consumer_lag_mb: u64,
    /// How long the pageserver may take to ingest the WAL up to the start LSN.
    #[arg(long, default_value_t = 60)]
    wait_timeout_secs: u64,
    /// After PostgreSQL ran, this many restarts within --crash-loop-window-secs
    /// are reported as a crash loop (restarts go on, backed off).
    #[arg(long, default_value_t = 5)]
    crash_loop_restarts: u32,
    #[arg(long, default_value_t = 300)]
    crash_loop_window_secs: u64,
    /// Longest pause between two restarts of PostgreSQL.
    #[arg(long, default_value_t = 30)]
    restart_max_delay_secs: u64,
    /// A read-only compute at this LSN: a hot standby of the basebackup
    /// there, no safekeepers, writes refused by PostgreSQL; the agent holds
    /// a lease on the LSN.
    #[arg(long, value_name = "LSN")]
    read_only_at: Option<strata_formats::Lsn>,
    /// A replica named NAME: a hot standby of the branch streaming its WAL
    /// from the safekeepers' replication services (`docs/replicas.md`).
    #[arg(long, value_name = "NAME", conflicts_with = "read_only_at", requires = "safekeeper_replication")]
    replica: Option<String>,
    /// The safekeepers' replication services (host:port, comma-separated).
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',')]
    safekeeper_replication: Vec<String>,
    /// A replica starts from a checkpoint record at or after this LSN (the
    /// writer's, just made): the pageserver is waited for until it has it.
    #[arg(long, value_name = "LSN", requires = "replica")]
    replica_after: Option<strata_formats::Lsn>,
    /// A replica's oldest snapshot holds back the writer's cleanup.
    #[arg(long, requires = "replica")]
    hot_standby_feedback: bool,
    /// A replica lagging more than this many MiB of WAL is restarted at the
    /// newest WAL (0: no bound).
    #[arg(long, default_value_t = 1024)]
    max_replica_lag_mb: u64,
    /// ... or more than this many seconds (0: no bound).
    #[arg(long, default_value_t = 900)]
    max_replica_lag_secs: u64,
    /// A lazy compute: PostgreSQL's relation files served through FUSE,
    /// their blocks fetched from the pageserver's page service at this
    /// address as they are read (`docs/lazy-compute.md`).
    #[arg(long, value_name = "HOST:PORT")]
    lazy_page_service: Option<String>,
    /// A lazy compute's local file cache: the most MiB of relation blocks
    /// it keeps that it may fetch again (blocks only it holds are kept too).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    lazy_cache_mb: u64,
    /// How long a lazy compute's read keeps trying while the pageserver
    /// cannot be reached before that query fails with an I/O error
    /// (0: fail at once).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=3600))]
    lazy_fetch_retry_secs: u64,
    /// The cluster's public key: callers of the status server must present
    /// a token signed by it (`docs/security.md`).
    #[arg(long, value_name = "PEM")]
    auth_public_key: Option<std::path::PathBuf>,
    /// The file (mode 0600) with the password TCP clients and the agent
    /// log in with as the role `postgres` (SCRAM-SHA-256); a primary sets
    /// it on the role at every start if it is not already the role's.
    #[arg(long, value_name = "FILE")]
    password_file: std::path::PathBuf,
    /// This host's certificate and key: the status server and PostgreSQL
    /// speak TLS with them.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

#[derive(Args)]
pub struct TimelineArgs {
    /// Safekeeper addresses, comma-separated (host:port).
    #[arg(long, value_delimiter = ',', required = true)]
    safekeepers: Vec<String>,
    #[arg(long)]
    tenant_id: TenantId,
    #[arg(long)]
    timeline_id: TimelineId,
    /// A file holding this compute's token (the tenant's), sent to the
    /// safekeepers and the pageserver (`docs/security.md`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// The cluster CA's certificate: the safekeepers (and the pageserver)
    /// are reached over TLS and must present certificates it issued.
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<std::path::PathBuf>,
}

impl TimelineArgs {
    /// The token of `--token-file`, if given.
    fn token(&self) -> Result<Option<Token>, String> {
        self.token_file.as_deref().map(read_token).transpose().map_err(|e| e.to_string())
    }

    /// The trust of `--tls-ca`, if given.
    fn tls(&self) -> Result<Option<ClientTls>, String> {
        self.tls_ca.as_deref().map(ClientTls::load).transpose().map_err(|e| e.to_string())
    }
}

pub fn run(cmd: ComputeCommand) -> i32 {
    crate::logging::init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime starts");
    let mut fenced = false;
    let result = runtime.block_on(async {
        match cmd {
            ComputeCommand::Start(args) => start(*args).await.map_err(|e| {
                fenced = e.is_fenced();
                e.to_string()
            }),
            other => run_proposer_role(other).await.map_err(|e| e.to_string()),
        }
    });
    // Blocking tasks still reading a stalled stream must not hold up the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("strata compute: {e}");
            if fenced {
                agent::exit::FENCED
            } else {
                1
            }
        }
    }
}

/// `sync-safekeepers` and `proposer`.
async fn run_proposer_role(cmd: ComputeCommand) -> Result<(), proposer::ProposerError> {
    match cmd {
        ComputeCommand::Start(_) => unreachable!("handled by start"),
        ComputeCommand::SyncSafekeepers { timeline, system_id, wal_segment_size } => {
            let identity = TimelineIdentity {
                tenant_id: timeline.tenant_id,
                timeline_id: timeline.timeline_id,
                system_id,
                pg_version: 15,
                wal_segment_size,
            };
            let token = timeline.token().map_err(proposer::ProposerError::Other)?;
            let tls = timeline.tls().map_err(proposer::ProposerError::Other)?;
            let mut cfg = ProposerConfig::new(timeline.safekeepers, identity);
            cfg.token = token;
            cfg.tls = tls;
            let end = proposer::sync_safekeepers(cfg).await?;
            println!("{end}");
            Ok::<(), proposer::ProposerError>(())
        }
        ComputeCommand::Proposer {
            timeline,
            pg_host,
            pg_port,
            pg_user,
            application_name,
            slot,
            max_buffer_mb,
            max_consumer_lag_mb,
            http,
            auth_public_key,
        } => {
            let token = timeline.token().map_err(proposer::ProposerError::Other)?;
            let tls = timeline.tls().map_err(proposer::ProposerError::Other)?;
            let auth = match auth_public_key {
                Some(path) => Some(Arc::new(Verifier::load(&path).map_err(|e| ProposerError::Other(e.to_string()))?)),
                None if http.is_some() => {
                    tracing::warn!("authentication is OFF: the status server accepts every caller");
                    None
                }
                None => None,
            };
            let pg = ReplicationConfig {
                host: pg_host,
                port: pg_port,
                user: pg_user,
                password: std::env::var("PGPASSWORD").ok(),
                application_name,
                ..ReplicationConfig::new("", 0, "")
            };
            let identity = identity_from_postgres(&pg, &timeline).await?;
            let (status, status_rx) = tokio::sync::watch::channel(proposer::ProposerStatus::default());
            if let Some(addr) = http {
                let listener = strata_service::listener::listen(addr)
                    .map_err(|e| proposer::ProposerError::Other(format!("{addr}: {e}")))?;
                let limits = strata_service::Limits { max_connections: 32, handshake_timeout: Duration::from_secs(10) };
                let metrics = strata_service::ListenerMetrics::default();
                let listener =
                    strata_service::Listener::new("http", listener, limits, strata_service::http::refusal, &metrics);
                let router = status_router(status_rx, metrics, auth);
                tokio::spawn(strata_service::http::serve(listener, router, Default::default()));
            }
            let mut cfg = ProposerConfig::new(timeline.safekeepers, identity);
            cfg.token = token;
            cfg.tls = tls;
            cfg.max_buffer_bytes = max_buffer_mb.max(1) << 20;
            cfg.max_consumer_lag_bytes = (max_consumer_lag_mb > 0).then_some(max_consumer_lag_mb << 20);
            proposer::on_own_thread(move || proposer::run(cfg, pg, Some(slot), status)).await
        }
    }
}

/// `strata compute start`: runs in the foreground until stopped.
/// `FROM=TO` of `--address-map`.
fn parse_address_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((from, to)) if !from.is_empty() && !to.is_empty() => Ok((from.to_string(), to.to_string())),
        _ => Err(format!("{text:?}: expected FROM=TO")),
    }
}

async fn start(args: StartArgs) -> Result<(), agent::AgentError> {
    let config = |e: String| agent::AgentError { phase: "configuration", message: e };
    let token = args.timeline.token().map_err(config)?;
    let tls_client = args.timeline.tls().map_err(config)?;
    let mut cfg = agent::AgentConfig::new(
        args.pgdata,
        args.pg_port,
        args.timeline.safekeepers,
        args.timeline.tenant_id,
        args.timeline.timeline_id,
        args.pageserver_http,
        args.password_file,
    );
    cfg.controllers = args.controllers;
    cfg.pageserver_site = args.pageserver_site;
    cfg.pageserver.set_address_map(args.address_map.clone());
    cfg.address_map = args.address_map;
    cfg.http = args.http;
    cfg.http_max_connections = usize::from(args.http_max_connections);
    cfg.pg_bin_dir = args.pg_bin_dir;
    cfg.pg_user = args.pg_user;
    cfg.shared_buffers = args.shared_buffers;
    cfg.verify_redo = args.verify_redo;
    cfg.max_consumer_lag_bytes = (args.max_consumer_lag_mb > 0).then_some(args.max_consumer_lag_mb << 20);
    cfg.wait_timeout = Duration::from_secs(args.wait_timeout_secs);
    cfg.restart.crash_loop_restarts = args.crash_loop_restarts;
    cfg.restart.crash_loop_window = Duration::from_secs(args.crash_loop_window_secs);
    cfg.restart.max_delay = Duration::from_secs(args.restart_max_delay_secs);
    cfg.read_only_at = args.read_only_at;
    cfg.replica = args.replica.map(|name| agent::ReplicaConfig {
        name,
        replication: args.safekeeper_replication,
        after: args.replica_after,
        ca_file: args.timeline.tls_ca.clone(),
        hot_standby_feedback: args.hot_standby_feedback,
        max_lag_bytes: args.max_replica_lag_mb << 20,
        max_lag: Duration::from_secs(args.max_replica_lag_secs),
    });
    cfg.lazy_page_service = args.lazy_page_service;
    cfg.lazy_cache_bytes = args.lazy_cache_mb << 20;
    cfg.lazy_fetch_retry = Duration::from_secs(args.lazy_fetch_retry_secs);
    cfg.token = token;
    cfg.auth_public_key = args.auth_public_key;
    cfg.tls_client = tls_client;
    cfg.tls_server = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::load(cert, key).map_err(|e| config(e.to_string()))?),
        _ => None,
    };
    cfg.pg_tls_files = args.tls_cert.zip(args.tls_key);
    cfg.pg_host_address = args.pg_host_address;
    let stop = agent::stop_on_signals().map_err(|e| config(format!("installing signal handlers: {e}")))?;
    agent::run(cfg, stop).await
}

/// `/v1/status` (JSON) and `/metrics` (Prometheus text) of the proposer;
/// with `auth`, for services and management only.
fn status_router(
    status: tokio::sync::watch::Receiver<proposer::ProposerStatus>,
    listeners: strata_service::ListenerMetrics,
    auth: Option<Arc<Verifier>>,
) -> axum::Router {
    use axum::routing::get;
    let refusals = RefusalMetrics::default();
    let auth = auth.map(|v| HttpAuth::new(v, refusals.clone()));
    let json = status.clone();
    let routes = axum::Router::new()
        .route(
            "/v1/status",
            get(move || {
                let s = json.borrow().clone();
                async move { axum::Json(s) }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let mut text = render_metrics(&status.borrow());
                let mut registry = prometheus_client::registry::Registry::with_prefix("strata_compute");
                listeners.register_into(&mut registry);
                refusals.register_into(&mut registry);
                text.push_str(&strata_service::metrics::render(&registry));
                async move { text }
            }),
        );
    guard(routes, auth.as_ref(), Need::Service)
}

/// The proposer's status in Prometheus text format.
fn render_metrics(s: &proposer::ProposerStatus) -> String {
    agent::status::render_proposer_metrics(s)
}

/// The timeline identity as the running PostgreSQL states it.
async fn identity_from_postgres(
    pg: &ReplicationConfig,
    timeline: &TimelineArgs,
) -> Result<TimelineIdentity, proposer::ProposerError> {
    let err = |e: strata_compute::pg_replication::PgError| proposer::ProposerError::Postgres(e.to_string());
    let mut conn = strata_compute::pg_replication::ReplicationConnection::connect(pg).await.map_err(err)?;
    let system = conn.identify_system().await.map_err(err)?;
    let rows = conn.simple_query("SHOW wal_segment_size").await.map_err(err)?;
    let text = rows.first().and_then(|r| r.first()).cloned().flatten().unwrap_or_default();
    let size = parse_size(&text)
        .ok_or_else(|| proposer::ProposerError::Postgres(format!("unexpected wal_segment_size {text:?}")))?;
    Ok(TimelineIdentity {
        tenant_id: timeline.tenant_id,
        timeline_id: timeline.timeline_id,
        system_id: system.system_id,
        pg_version: 15,
        wal_segment_size: size,
    })
}

/// Parses PostgreSQL's "16MB" style sizes.
fn parse_size(text: &str) -> Option<u32> {
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u32 = digits.parse().ok()?;
    match &text[digits.len()..] {
        "MB" => n.checked_mul(1 << 20),
        "GB" => n.checked_mul(1 << 30),
        "kB" => n.checked_mul(1 << 10),
        "" => Some(n),
        _ => None,
    }
}
