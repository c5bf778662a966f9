//! The Strata proxy (`docs/proxy.md`): one PostgreSQL address for every
//! endpoint of every tenant. It finds the endpoint a client asks for,
//! authenticates the client itself with SCRAM-SHA-256 from the endpoint's
//! verifier, wakes the endpoint's compute if it sleeps, and relays the
//! session to it.

pub mod admission;
pub mod cancel;
pub mod catalog;
pub mod compute;
pub mod config;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod refusal;
pub mod route;
pub mod scram;
pub mod session;
pub mod state;
pub mod wake;
pub mod wire;

use std::sync::Arc;

use strata_service::listener::{bind, BindError, Limits, Listener};
use strata_service::start::{http_listener, serve_http, stop_signal, Security};
use strata_service::tls::{ClientTls, ServerTls};

use catalog::Backend;
use state::Proxy;

/// Why the proxy could not start (every service's start-up error).
pub use strata_service::start::StartError;

/// Runs the proxy until SIGTERM/SIGINT.
pub async fn run(config: config::ProxyConfig, backend: Arc<dyn Backend>) -> Result<(), StartError> {
    let shutdown = stop_signal()?;
    let (proxy, tasks) = start(config, backend).await?;
    tracing::info!(pg = %proxy.pg, http = %proxy.http, "proxy running");
    shutdown.await;
    drop(tasks);
    tracing::info!("proxy stopped");
    Ok(())
}

/// Binds both listeners and starts serving; the tasks stop when the set is dropped.
pub async fn start(
    config: config::ProxyConfig,
    backend: Arc<dyn Backend>,
) -> Result<(Arc<Proxy>, tokio::task::JoinSet<()>), StartError> {
    config.validate()?;
    let server_tls = match &config.pg_tls {
        Some(t) => Some(ServerTls::load(&t.cert, &t.key).map_err(|e| StartError::service("pg_tls", e))?),
        None => None,
    };
    let compute_tls = match &config.tls {
        Some(t) => Some(ClientTls::load(&t.ca).map_err(|e| StartError::service("tls.ca", e))?),
        None => None,
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let pg = bind("listen_pg", config.listen_pg).await?;
    let pg_addr = pg.local_addr().map_err(|source| BindError { key: "listen_pg", addr: config.listen_pg, source })?;
    let limits = Limits { max_connections: config.max_connections, handshake_timeout: config.startup_timeout };
    let pg = Listener::new("pg", pg, limits, too_many, &metrics.listener_metrics());
    let http = bind("listen_http", config.listen_http).await?;
    let http_addr =
        http.local_addr().map_err(|source| BindError { key: "listen_http", addr: config.listen_http, source })?;
    let security = Security::load("proxy", config.tls.as_ref(), config.auth.as_ref())?;
    let auth = security.http_auth(metrics.refusal_metrics());
    let http = http_listener(
        http,
        limits::HTTP_MAX_CONNECTIONS,
        limits::HTTP_HANDSHAKE_TIMEOUT,
        &metrics.listener_metrics(),
        &security,
    );
    let mut decoy_secret = [0u8; 32];
    aws_lc_rs::rand::fill(&mut decoy_secret).map_err(|_| StartError::service("proxy", "no random source"))?;
    let proxy =
        Arc::new(Proxy::new(config, backend, metrics, (server_tls, compute_tls), decoy_secret, (pg_addr, http_addr)));
    let mut tasks = tokio::task::JoinSet::new();
    let serving = proxy.clone();
    tasks.spawn(pg.serve(move |conn| session::serve(conn, serving.clone())));
    tasks.spawn(serve_http(http, http::router(proxy.clone(), auth.as_ref())));
    Ok((proxy, tasks))
}

/// What a client gets when every place of the listener is taken.
fn too_many(_first_bytes: &[u8]) -> Vec<u8> {
    wire::error("53300", "too many connections to the proxy (max_connections)")
}
