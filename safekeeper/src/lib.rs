//! The safekeeper: accepts WAL from one elected proposer at a time, makes it
//! durable, and serves it to consumers.
//!
//! `acceptor` is the protocol state machine over abstract storage, so the
//! same code runs in the server and in deterministic simulations.

pub mod acceptor;
pub mod config;
pub mod connection;
pub mod control_file;
pub mod decoded_stream;
pub mod fence;
pub mod healing;
pub mod http;
pub mod limits;
pub mod manager;
pub mod memory;
pub mod metrics;
pub mod offload;
pub mod peers;
pub mod pg_server;
pub mod progress;
pub mod proposer_session;
pub mod recovery;
pub mod removal;
pub mod server;
pub mod shared;
pub mod standby_feedback;
pub mod timeline;
pub mod timelines;
pub mod wal_reader;
pub mod wal_store;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use strata_service::clock::{Clock, SystemClock};
use strata_service::start::{bind, http_listener, serve_http, stop_signal, Security, StartError as ServiceStartError};
use strata_service::{Limits, Listener};

/// Why the safekeeper could not start or stopped with an error (every
/// service's start-up error; its own steps are `Service` errors).
pub type StartError = ServiceStartError;

/// Runs a safekeeper until SIGTERM or SIGINT, then writes every control file.
pub async fn run(config: config::SafekeeperConfig) -> Result<(), StartError> {
    let open_files = strata_service::config::raise_open_file_limit();
    config.check_open_files(open_files)?;
    let listener = bind("listen", config.listen).await?;
    let http = bind("listen_http", config.listen_http).await?;
    let pg = match config.listen_pg {
        Some(addr) => Some(bind("listen_pg", addr).await?),
        None => None,
    };
    let shutdown = stop_signal()?;
    serve(config, listener, http, pg, shutdown).await
}

/// Serves on bound listeners until `shutdown` completes. The listeners
/// never stop by themselves (see `strata_service::listener`).
pub async fn serve(
    config: config::SafekeeperConfig,
    listener: tokio::net::TcpListener,
    http: tokio::net::TcpListener,
    pg: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    config.validate()?;
    // The one place the real time enters: every decision by time reads it from here.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    if !config.fsync {
        tracing::warn!("fsync is OFF: acknowledged WAL can be lost on a power failure");
    }
    let timelines = Arc::new(
        tokio::task::block_in_place(|| {
            timelines::Timelines::load(config.id, config.data_dir.clone(), !config.fsync, clock.clone())
        })
        .map_err(|e| StartError::service("loading timelines", e))?,
    );
    tracing::info!(id = %config.id, listen = %config.listen, http = %config.listen_http, "safekeeper started");
    let metrics = Arc::new(metrics::Metrics::new());
    let listener_metrics = metrics.listener_metrics();
    let limits = |max_connections| Limits { max_connections, handshake_timeout: config.handshake_timeout };
    let security = Security::load("safekeeper", config.tls.as_ref(), config.auth.as_ref())?;
    let (server_tls, client_tls) = (security.server_tls.clone(), security.client_tls.clone());
    let protocol =
        Listener::new("protocol", listener, limits(config.max_connections), server::refusal, &listener_metrics)
            .with_tls(server_tls.clone());
    let http = http_listener(http, config.max_http_connections, config.handshake_timeout, &listener_metrics, &security);
    // TLS on the replication service is negotiated in its protocol
    // (SSLRequest), after the listener has handed the connection over.
    let pg =
        pg.map(|l| Listener::new("pg", l, limits(config.max_pg_connections), pg_server::refusal, &listener_metrics));
    let remote = config
        .remote_storage
        .as_ref()
        .map(|cfg| {
            let storage = strata_remote_storage::RemoteStorage::new(cfg)?;
            match &config.storage_key {
                Some(key) => storage.with_storage_key(key),
                None => Ok(storage),
            }
        })
        .transpose()
        .map_err(|e| StartError::service("remote storage", e))?;
    let (verifier, token) = (security.verifier.clone(), security.token.clone());
    let auth = security.http_auth(metrics.refusal_metrics());
    let views = Arc::new(peers::PeerViews::new(clock.clone()));
    // The background tasks whose results `Shared` holds get only what they need.
    let polling = peers::Polling {
        peers: config.peers.clone(),
        views: views.clone(),
        timelines: timelines.clone(),
        tls: client_tls.clone(),
        token: token.clone(),
        clock: clock.clone(),
    };
    let work = manager::Work {
        offloader: remote
            .as_ref()
            .map(|r| offload::Offloader::new(r, &config, views.clone(), metrics.clone(), clock.clone())),
        remover: removal::Remover::new(&config, remote.is_some(), views.clone(), metrics.clone(), clock.clone()),
        clock: clock.clone(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(peers::run(polling));
    tasks.spawn(manager::run(timelines.clone(), work));
    let shared = Arc::new(shared::Shared {
        remote,
        token,
        tls: client_tls,
        verifier,
        config,
        timelines,
        metrics,
        next_connection_id: AtomicU64::new(1),
        peers: views,
        clock,
        scrape: Default::default(),
    });
    tasks.spawn(server::serve(protocol, shared.clone()));
    tasks.spawn(recovery::run(shared.clone()));
    tasks.spawn(healing::run(shared.clone()));
    if let Some(pg) = pg {
        tasks.spawn(pg_server::serve(pg, shared.clone(), server_tls));
    }
    tasks.spawn(serve_http(http, http::router(shared.clone(), auth.as_ref())));
    shutdown.await;
    tasks.abort_all();
    for tl in shared.timelines.all() {
        if tl.failure().is_some() {
            continue;
        }
        if let Err(e) = tokio::task::block_in_place(|| tl.persist()) {
            tracing::warn!(timeline = %tl.identity.timeline_id, "writing control file at shutdown: {e}");
        }
    }
    Ok(())
}
