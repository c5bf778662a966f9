//! The storage controller (`docs/storage-controller.md`): places each
//! tenant's attached location and a warm secondary on the pageservers,
//! heartbeats them, attaches the secondary under a new generation when the
//! attached one stops answering, moves tenants live for drains and
//! rebalancing, and tells the computes where their pages are. Its state is
//! one object in object storage, written by compare-and-swap; several
//! controllers run, and the holder of a lease object leads.
//!
//! Time, storage, pageserver calls and randomness come in through
//! [`env::Env`]: the process gives it the real ones, the simulation
//! (`tests/simulation.rs`) fakes driven by one seed.

pub mod client;
pub mod config;
pub mod env;
pub mod http;
pub mod metrics;
pub mod retry;
pub mod schedule;
pub mod service;
pub mod store;
pub mod tasks;

use std::sync::Arc;

use strata_service::auth::http::HttpAuth;
use strata_service::listener::{bind, Limits, Listener};

/// Why the controller could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Bind(#[from] strata_service::listener::BindError),
    #[error("config: {0}")]
    Config(#[from] strata_service::config::ConfigError),
    #[error("auth: {0}")]
    Auth(#[from] strata_service::auth::KeyError),
    #[error("tls: {0}")]
    Tls(#[from] strata_service::tls::TlsError),
    #[error("signals: {0}")]
    Signals(std::io::Error),
    #[error("object storage: {0}")]
    Storage(String),
}

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(config: config::ControllerConfig) -> Result<(), StartError> {
    config.validate()?;
    let http = bind("listen_http", config.listen_http).await?;
    let shutdown = strata_service::shutdown_signal().map_err(StartError::Signals)?;
    let metrics = Arc::new(metrics::Metrics::new());
    let tls = config.tls.as_ref().map(|t| t.server()).transpose()?;
    let client_tls = config.tls.as_ref().map(|t| t.client()).transpose()?;
    let verifier = match &config.auth {
        Some(a) => Some(Arc::new(a.verifier()?)),
        None => {
            tracing::warn!("authentication is OFF: every caller is accepted");
            None
        }
    };
    let auth = verifier.map(|v| HttpAuth::new(v, metrics.refusal_metrics()));
    let token = config.auth.as_ref().map(|a| a.token()).transpose()?.flatten();
    let store = store::Store::open(&config.remote_storage).map_err(StartError::Storage)?;
    let client = client::Client::new(
        client_tls.as_ref(),
        token,
        config.heartbeat_interval.max(std::time::Duration::from_secs(1)),
    );
    let listener = Listener::new(
        "http",
        http,
        Limits { max_connections: config.max_http_connections, handshake_timeout: std::time::Duration::from_secs(10) },
        strata_service::http::refusal,
        &metrics.listener_metrics(),
    )
    .with_tls(tls);
    tracing::info!(id = config.id, http = %config.listen_http, storage = %store.describe(), "storage controller started");
    let controller = service::Controller::new(config, env::Env::production(store, client), metrics);
    let router = http::router(controller.clone(), auth.as_ref());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(strata_service::http::serve(listener, router, Default::default()));
    tasks.spawn(controller.run());
    shutdown.await;
    tasks.abort_all();
    tracing::info!("storage controller stopped");
    Ok(())
}
