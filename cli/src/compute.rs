//! `strata compute …`: the compute agent's roles.

use crate::out::{errln, outln};
use std::sync::Arc;

use clap::{Args, Subcommand};
use strata_compute::agent;
use strata_compute::pg_replication::ReplicationConfig;
use strata_compute::proposer::{self, ProposerConfig, ProposerError};
use strata_protocol::safekeeper::TimelineIdentity;
use strata_protocol::{TenantId, TimelineId, Token};
use strata_service::auth::http::{guard, HttpAuth, Need, RefusalMetrics};
use strata_service::auth::{read_token, Verifier};
use strata_service::tls::ClientTls;

use crate::limits;

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
        #[arg(long, default_value_t = limits::DEFAULT_MAX_BUFFER_MB)]
        max_buffer_mb: usize,
        /// Hold commits back while WAL consumers lag more than this many MiB
        /// (0: never). The pageserver reports a lag while L0 layers wait for
        /// compaction, so this bounds them too.
        #[arg(long, default_value_t = limits::DEFAULT_MAX_CONSUMER_LAG_MB)]
        max_consumer_lag_mb: u64,
        /// Serve status (/v1/status) and Prometheus metrics (/metrics) here.
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
        /// The cluster's public key: callers of the status server must
        /// present a service or management token signed by it.
        #[arg(long, value_name = "PEM")]
        auth_public_key: Option<std::path::PathBuf>,
        /// Follow a relay of a database being imported: the end of its
        /// stream is the normal end. Once a quorum holds all it sent, write
        /// where the WAL ended to FILE (JSON) and exit with code 80
        /// (`docs/import.md`, "Streaming import").
        #[arg(long, value_name = "FILE")]
        follow_end: Option<std::path::PathBuf>,
    },
}

/// What a follower writes where `--follow-end` says when its relay stopped.
#[derive(serde::Serialize)]
struct FollowEnd {
    /// The commit LSN: the end of the WAL a quorum of safekeepers holds.
    end_lsn: String,
    /// The WAL ended with the source's shutdown checkpoint.
    shut_down: bool,
}

#[derive(Args)]
pub struct StartArgs {
    /// The agent's configuration file (`agent.toml`, written by the control
    /// plane at every endpoint start; `docs/compute.md`).
    #[arg(long, value_name = "FILE")]
    config: std::path::PathBuf,
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
            ComputeCommand::Start(args) => start(*args).await.map(RoleEnd::Agent).map_err(|e| {
                fenced = e.is_fenced();
                e.to_string()
            }),
            other => run_proposer_role(other).await.map_err(|e| e.to_string()),
        }
    });
    // Blocking calls still waiting for an answer (the storage controller's
    // long poll) must not hold up the exit: the agent's work is done.
    runtime.shutdown_timeout(limits::RUNTIME_SHUTDOWN_TIMEOUT);
    match result {
        Ok(RoleEnd::Agent(agent::Ended::Stopped)) | Ok(RoleEnd::Done) => 0,
        // Its supervisor must not start it again: the next start wakes it.
        Ok(RoleEnd::Agent(agent::Ended::Suspended(_))) => agent::exit::SUSPENDED,
        Ok(RoleEnd::SourceEnded) => agent::exit::SOURCE_ENDED,
        Err(e) => {
            tracing::error!("{e}");
            errln!("strata compute: {e}");
            if fenced {
                agent::exit::FENCED
            } else {
                1
            }
        }
    }
}

/// How a role ended without an error.
enum RoleEnd {
    Agent(agent::Ended),
    Done,
    /// A follower's relay stopped and its WAL is on a quorum.
    SourceEnded,
}

/// `sync-safekeepers` and `proposer`.
async fn run_proposer_role(cmd: ComputeCommand) -> Result<RoleEnd, proposer::ProposerError> {
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
            outln!("{end}");
            Ok(RoleEnd::Done)
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
            follow_end,
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
                let limits = strata_service::Limits {
                    max_connections: limits::STATUS_MAX_CONNECTIONS,
                    handshake_timeout: limits::STATUS_HANDSHAKE_TIMEOUT,
                };
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
            let Some(path) = follow_end else {
                return proposer::on_own_thread(move || proposer::run(cfg, pg, Some(slot), status))
                    .await
                    .map(|()| RoleEnd::Done);
            };
            let drain = limits::FOLLOW_DRAIN_TIMEOUT;
            let end = proposer::on_own_thread(move || proposer::follow(cfg, pg, Some(slot), status, drain)).await?;
            let text = serde_json::to_string(&FollowEnd { end_lsn: end.end.to_string(), shut_down: end.shut_down })
                .expect("plain fields serialize");
            strata_service::durable::replace_file(&path, text.as_bytes(), true)
                .map_err(|e| ProposerError::Other(format!("{}: {e}", path.display())))?;
            tracing::info!(end = %end.end, shut_down = end.shut_down, "the followed WAL ended");
            Ok(RoleEnd::SourceEnded)
        }
    }
}

/// `strata compute start`: runs in the foreground until stopped or suspended.
async fn start(args: StartArgs) -> Result<agent::Ended, agent::AgentError> {
    let config = |e: String| agent::AgentError { phase: "configuration", message: e };
    let cfg = agent::config_file::AgentFile::load(&args.config).and_then(|f| f.into_config()).map_err(config)?;
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
        pg_version: server_major(conn.parameter("server_version"))?,
        wal_segment_size: size,
    })
}

/// The major of a `server_version` as the server reports it (`18.6`,
/// `15.18 (Debian 15.18-1)`: 18, 15).
fn server_major(version: Option<&str>) -> Result<u32, proposer::ProposerError> {
    version
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|major| major.parse::<u32>().ok())
        .ok_or_else(|| proposer::ProposerError::Postgres(format!("unexpected server_version {version:?}")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_major_is_read_from_the_reported_server_version() {
        assert_eq!(server_major(Some("18.6")).unwrap(), 18);
        assert_eq!(server_major(Some("15.18 (Debian 15.18-1.pgdg120+1)")).unwrap(), 15);
        assert_eq!(server_major(Some("19devel")).unwrap(), 19);
        assert!(server_major(Some("devel")).is_err());
        assert!(server_major(None).is_err());
    }
}
