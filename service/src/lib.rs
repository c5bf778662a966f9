//! What every Strata service shares: listeners that bound and survive their
//! clients, the HTTP server of the management APIs, the open-file budget,
//! free ports for services configured before they bind, config helpers,
//! files replaced atomically and durably, the tokens that authorize
//! every call, and TLS on the links between hosts.

pub mod allocator;
pub mod api_client;
pub mod audit;
pub mod auth;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod durable;
pub mod failpoint;
pub mod http;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod ports;
pub mod start;
pub mod tls;

pub use listener::{bind, BindError, Connection, Limits, Listener, Slot};
pub use metrics::ListenerMetrics;

/// A future that completes at the first SIGTERM or SIGINT (logged): when a
/// service shuts down cleanly. Fails only if the handlers cannot be installed.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

/// The message of a caught panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
