//! The pageserver: ingests WAL from the safekeepers into a key/value store of
//! page versions (in-memory layer, then immutable layer files), and serves
//! GetPage@LSN, relation sizes and basebackups at any ingested LSN.

pub mod basebackup;
pub mod config;
pub mod dirs;
pub mod fuzz;
pub mod http;
pub mod import;
pub mod ingest;
pub mod key;
pub mod layer;
pub mod metrics;
pub mod page_service;
pub mod tenants;
pub mod timeline;
pub mod user;
pub mod value;
pub mod walreceiver;

use std::sync::Arc;

/// Runs the pageserver until SIGTERM/SIGINT.
pub async fn run(config: config::PageserverConfig) -> Result<(), String> {
    let page =
        tokio::net::TcpListener::bind(config.listen_pg).await.map_err(|e| format!("{}: {e}", config.listen_pg))?;
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
    serve(config, page, http, shutdown).await
}

/// Serves on bound listeners until `shutdown` completes, then stops ingest
/// and writes what was ingested to layer files.
pub async fn serve(
    config: config::PageserverConfig,
    page: tokio::net::TcpListener,
    http: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    if !config.fsync {
        tracing::warn!("fsync is OFF: layer files may be lost on a power failure");
    }
    let metrics = Arc::new(metrics::Metrics::new());
    let conf = Arc::new(config);
    let tenants = tokio::task::spawn_blocking({
        let conf = conf.clone();
        move || tenants::Tenants::load(conf, metrics)
    })
    .await
    .map_err(|e| e.to_string())??;
    tracing::info!(id = %conf.id, page_service = %conf.listen_pg, http = %conf.listen_http, "pageserver started");
    let mut pages = tokio::spawn(page_service::serve(page, tenants.clone()));
    let router = http::router(tenants.clone());
    let mut api = tokio::spawn(async move { axum::serve(http, router).await });
    tokio::select! {
        _ = shutdown => {}
        r = &mut pages => return Err(format!("page service listener failed: {r:?}")),
        r = &mut api => return Err(format!("HTTP listener failed: {r:?}")),
    }
    pages.abort();
    api.abort();
    tokio::task::spawn_blocking(move || tenants.shutdown()).await.map_err(|e| e.to_string())?;
    tracing::info!("pageserver stopped");
    Ok(())
}
