//! The safekeeper: accepts WAL from one elected proposer at a time, makes it
//! durable, and serves it to consumers.
//!
//! `acceptor` is the protocol state machine over abstract storage, so the
//! same code runs in the server and in deterministic simulations.

pub mod acceptor;
pub mod config;
pub mod connection;
pub mod control_file;
pub mod http;
pub mod memory;
pub mod metrics;
pub mod pg_server;
pub mod recovery;
pub mod server;
pub mod timeline;
pub mod timelines;
pub mod wal_reader;
pub mod wal_store;

use std::sync::Arc;

/// Runs a safekeeper until SIGTERM or SIGINT, then writes every control file.
pub async fn run(config: config::SafekeeperConfig) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|e| format!("{}: {e}", config.listen))?;
    let http =
        tokio::net::TcpListener::bind(config.listen_http).await.map_err(|e| format!("{}: {e}", config.listen_http))?;
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
    };
    serve(config, listener, http, shutdown).await
}

/// Serves on bound listeners until `shutdown` completes.
pub async fn serve(
    config: config::SafekeeperConfig,
    listener: tokio::net::TcpListener,
    http: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    if !config.fsync {
        tracing::warn!("fsync is OFF: acknowledged WAL can be lost on a power failure");
    }
    let timelines =
        tokio::task::block_in_place(|| timelines::Timelines::load(config.id, config.data_dir.clone(), !config.fsync))
            .map_err(|e| e.to_string())?;
    tracing::info!(id = %config.id, listen = %config.listen, http = %config.listen_http, "safekeeper started");
    let shared = Arc::new(server::Shared { config, timelines, metrics: metrics::Metrics::new() });
    let mut protocol = tokio::spawn(server::serve(listener, shared.clone()));
    let recovery = tokio::spawn(recovery::run(shared.clone()));
    let pg = match shared.config.listen_pg {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("{addr}: {e}"))?;
            Some(tokio::spawn(pg_server::serve(listener, shared.clone())))
        }
        None => None,
    };
    let router = http::router(shared.clone());
    let mut api = tokio::spawn(async move { axum::serve(http, router).await });
    tokio::select! {
        _ = shutdown => {}
        r = &mut protocol => return Err(format!("protocol listener failed: {r:?}")),
        r = &mut api => return Err(format!("HTTP listener failed: {r:?}")),
    }
    protocol.abort();
    api.abort();
    recovery.abort();
    if let Some(pg) = pg {
        pg.abort();
    }
    for tl in shared.timelines.all() {
        if let Err(e) = tokio::task::block_in_place(|| tl.with_acceptor(|a| a.persist())) {
            tracing::warn!(timeline = %tl.identity.timeline_id, "writing control file at shutdown: {e}");
        }
    }
    Ok(())
}
