//! The pageserver: ingests WAL from the safekeepers into a key/value store of
//! page versions (in-memory layer, then immutable layer files), and serves
//! GetPage@LSN, relation sizes and basebackups at any ingested LSN.

pub mod background;
pub mod basebackup;
pub mod checkpoint_record;
pub mod clock;
pub mod config;
pub mod decoded_ingest;
pub mod dirs;
pub mod eviction;
pub mod fuzz;
pub mod heap_trim;
pub mod http;
pub mod idle;
pub mod import;
pub mod import_upload;
pub mod ingest;
pub mod initdb_template;
pub mod key;
pub mod layer;
pub mod limits;
mod metadata;
pub mod metrics;
pub mod page_service;
pub mod rebuilt_pages;
pub mod remote;
pub mod secondary;
pub mod split;
pub mod tenants;
pub mod timeline;
pub mod user;
pub mod value;
pub mod walreceiver;
pub mod watcher;

use std::sync::Arc;

use strata_service::start::{bind, http_listener, serve_http, stop_signal, Security, StartError as ServiceStartError};
use strata_service::{Limits, Listener};

/// Why the pageserver could not start (every service's start-up error;
/// its own steps are `Service` errors).
pub type StartError = ServiceStartError;

/// Object storage, when the config names it (with its attachment file).
fn start_remote(
    config: &config::PageserverConfig,
    metrics: &Arc<metrics::Metrics>,
    clock: &Arc<dyn clock::Clock>,
) -> Result<Option<Arc<remote::Remote>>, StartError> {
    let (Some(cfg), Some(attachments)) = (&config.remote_storage, &config.attachments) else {
        return Ok(None);
    };
    let storage = remote::open_storage(cfg, config.storage_key.as_deref())
        .map_err(|e| StartError::service("remote storage", e))?;
    remote::Remote::start(
        storage,
        attachments.clone(),
        config.controller,
        config.max_upload_lag_bytes,
        config.fsync,
        metrics.clone(),
        clock.clone(),
    )
    .map(Some)
    .map_err(|e| StartError::service("remote storage", e))
}

/// Runs the pageserver until SIGTERM/SIGINT.
pub async fn run(config: config::PageserverConfig) -> Result<(), StartError> {
    let open_files = strata_service::config::raise_open_file_limit();
    config.check_open_files(open_files)?;
    let page = bind("listen_pg", config.listen_pg).await?;
    let http = bind("listen_http", config.listen_http).await?;
    let shutdown = stop_signal()?;
    serve(config, page, http, shutdown).await
}

/// Serves on bound listeners until `shutdown` completes, then stops ingest
/// and writes what was ingested to layer files. The listeners never stop by
/// themselves (see `strata_service::listener`).
pub async fn serve(
    config: config::PageserverConfig,
    page: tokio::net::TcpListener,
    http: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    serve_with_clock(config, page, http, shutdown, clock::system()).await
}

/// [`serve`] on the time of `clock`: every lease, timeout, retry and
/// background period of the pageserver is timed by it.
pub async fn serve_with_clock(
    config: config::PageserverConfig,
    page: tokio::net::TcpListener,
    http: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    clock: Arc<dyn clock::Clock>,
) -> Result<(), StartError> {
    config.validate()?;
    if !config.fsync {
        tracing::warn!("fsync is OFF: layer files may be lost on a power failure");
    }
    let metrics = Arc::new(metrics::Metrics::new());
    let resources = timeline::TimelineResources {
        fsync: config.fsync,
        checkpoint_distance: config.checkpoint_distance,
        metrics: metrics.clone(),
        files: layer::files::FileCache::new(config.max_open_layer_files, metrics.layer_files(), clock.clone()),
        verify_redo: config.verify_redo,
        policy: config.layer_policy(),
        clock: clock.clone(),
    };
    let limits = |max_connections| Limits { max_connections, handshake_timeout: config.handshake_timeout };
    let listener_metrics = metrics.listener_metrics();
    let security = Security::load("pageserver", config.tls.as_ref(), config.auth.as_ref())?;
    // TLS to the safekeepers, with the same CA.
    let client_tls = security.client_tls.clone();
    let page = Listener::new("page", page, limits(config.max_connections), page_service::refusal, &listener_metrics)
        .with_tls(security.server_tls.clone());
    let http = http_listener(http, config.max_http_connections, config.handshake_timeout, &listener_metrics, &security);
    let remote = start_remote(&config, &metrics, &clock)?;
    let verifier = security.verifier.clone();
    let auth = security.http_auth(metrics.refusal_metrics());
    // The token this pageserver shows the safekeepers when it streams WAL.
    let token = security.token.clone();
    // Wakes idle timelines, asking the safekeepers with the same trust and token.
    let watcher = config.idle_after().map(|_| {
        watcher::Watcher::new(&config.safekeepers_http, client_tls.as_ref(), token.clone(), config.idle_poll_period)
    });
    let conf = Arc::new(config);
    let tenants = tokio::task::spawn_blocking({
        let conf = conf.clone();
        move || tenants::Tenants::load(conf, resources, remote, token, client_tls)
    })
    .await
    .map_err(|e| StartError::service("loading tenants", e))?
    .map_err(|e| StartError::service("loading tenants", e))?;
    let compactor =
        background::Compactor::spawn(tenants.clone()).map_err(|e| StartError::service("starting the compactor", e))?;
    tracing::info!(id = %conf.id, page_service = %conf.listen_pg, http = %conf.listen_http, "pageserver started");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(page_service::serve(page, tenants.clone(), verifier));
    tasks.spawn(serve_http(http, http::router(tenants.clone(), auth.as_ref())));
    if let Some(w) = watcher {
        tasks.spawn(w.run(tenants.clone()));
    }
    tasks.spawn({
        let (tenants, clock) = (tenants.clone(), clock.clone());
        async move {
            loop {
                clock.sleep(limits::RELOAD_CHECK_INTERVAL).await;
                let t = tenants.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    t.metrics.timelines_broken.set(t.all().iter().filter(|e| e.tl.broken().is_some()).count() as i64);
                    t.reload_broken();
                })
                .await;
            }
        }
    });
    if conf.controller {
        // Reader locations: new timelines, and layers downloaded ahead of reads.
        let (tenants, clock) = (tenants.clone(), clock.clone());
        tasks.spawn(async move {
            loop {
                clock.sleep(limits::READER_REFRESH_INTERVAL).await;
                let t = tenants.clone();
                let _ = tokio::task::spawn_blocking(move || t.refresh_readers()).await;
            }
        });
    }
    if conf.controller {
        // Heatmaps for the secondaries of the tenants attached here.
        let (tenants, clock) = (tenants.clone(), clock.clone());
        let period = conf.heatmap_period;
        tasks.spawn(async move {
            let published = Arc::new(parking_lot::Mutex::new(std::collections::HashMap::new()));
            loop {
                clock.sleep(period).await;
                let (t, p) = (tenants.clone(), published.clone());
                let _ = tokio::task::spawn_blocking(move || t.publish_heatmaps(&mut p.lock())).await;
            }
        });
    }
    shutdown.await;
    tasks.abort_all();
    tokio::task::spawn_blocking(move || compactor.stop())
        .await
        .map_err(|e| StartError::service("stopping the compactor", e))?;
    tokio::task::spawn_blocking(move || tenants.shutdown())
        .await
        .map_err(|e| StartError::service("shutting down", e))?;
    tracing::info!("pageserver stopped");
    Ok(())
}
