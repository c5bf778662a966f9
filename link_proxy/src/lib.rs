//! The link proxy (`docs/sites.md`): a TCP relay that holds every chunk for
//! a route's one-way delay before passing it on, so that tests and
//! benchmarks can put a known latency (and partitions) between the sites of
//! a cluster where `tc netem` is not available. It relays bytes and never
//! looks at them: TLS between the services passes through.

pub mod config;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod relay;
pub mod route;

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_service::listener::{bind, BindError};
use strata_service::start::{http_listener, serve_http, stop_signal, Security};

/// Why the link proxy could not start (every service's start-up error).
pub use strata_service::start::StartError;

/// Runs the link proxy until SIGTERM/SIGINT.
pub async fn run(config: config::LinkProxyConfig) -> Result<(), StartError> {
    let shutdown = stop_signal()?;
    let (proxy, tasks) = start(config).await?;
    shutdown.await;
    drop(proxy);
    drop(tasks);
    tracing::info!("link proxy stopped");
    Ok(())
}

/// Binds every listener and starts serving; the tasks stop when the set is dropped.
pub async fn start(
    config: config::LinkProxyConfig,
) -> Result<(Arc<http::Proxy>, tokio::task::JoinSet<()>), StartError> {
    config.validate()?;
    let metrics = Arc::new(metrics::Metrics::new());
    let bounds = route::Bounds {
        max_connections: config.max_connections,
        max_in_flight_bytes: config.max_in_flight_bytes,
        connect_timeout: config.connect_timeout,
    };
    let mut tasks = tokio::task::JoinSet::new();
    let mut routes = BTreeMap::new();
    for r in &config.routes {
        let listener = bind("routes.listen", r.listen).await?;
        let listen =
            listener.local_addr().map_err(|source| BindError { key: "routes.listen", addr: r.listen, source })?;
        let state = route::RouteState::new(r, listen, metrics.clone());
        tracing::info!(route = %r.name, listen = %r.listen, target = %r.target, delay_ms = r.delay_ms,
            jitter_ms = r.jitter_ms, "relaying");
        tasks.spawn(route::serve(listener, state.clone(), bounds));
        routes.insert(r.name.clone(), state);
    }
    let http = bind("listen_http", config.listen_http).await?;
    let http_addr =
        http.local_addr().map_err(|source| BindError { key: "listen_http", addr: config.listen_http, source })?;
    let security = Security::load("link-proxy", config.tls.as_ref(), config.auth.as_ref())?;
    let auth = security.http_auth(metrics.refusal_metrics());
    let listener = http_listener(
        http,
        limits::HTTP_MAX_CONNECTIONS,
        limits::HTTP_HANDSHAKE_TIMEOUT,
        &metrics.listener_metrics(),
        &security,
    );
    let proxy = Arc::new(http::Proxy { routes, metrics, http: http_addr });
    tasks.spawn(serve_http(listener, http::router(proxy.clone(), auth.as_ref())));
    Ok((proxy, tasks))
}
