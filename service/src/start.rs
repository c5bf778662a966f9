//! One way to start a service: what the pageserver, the safekeeper, the
//! storage controller, the link proxy and `strata node` all do before they
//! serve — the signals that stop them, the security of their config (TLS
//! on their listeners and to their peers, the verifier of callers' tokens,
//! the token they show), their HTTP listener with its bound and its
//! refusals — and the error that says why a start failed; and the umask
//! that keeps what they write to their own user.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use crate::auth::http::{HttpAuth, RefusalMetrics};
use crate::auth::{AuthConfig, KeyError, Token, Verifier};
use crate::listener::BindError;
use crate::tls::{ClientTls, ServerTls, TlsConfig, TlsError};
use crate::{Limits, Listener, ListenerMetrics};

/// Makes every file and directory this process creates from now on
/// private to its user (umask 0o077: files 0600, directories 0700): WAL
/// segments, layers, control and metadata files, a local object store's
/// objects hold the tenants' data, which no other local user may read.
///
/// Called first by each service role, before any thread starts (the mask
/// is the whole process's). Not by the CLI, `strata node` or the compute
/// agent: they create what PostgreSQL, running as another user, must
/// reach (an endpoint's directory); the services they start set their own.
pub fn private_umask() {
    // SAFETY: umask only replaces the process's file mode creation mask.
    unsafe { libc::umask(0o077) };
}

/// Why a service could not start (or stopped with an error).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("config: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("auth: {0}")]
    Auth(#[from] KeyError),
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    #[error("signals: {0}")]
    Signals(std::io::Error),
    /// What the service itself could not do (load its data, reach its
    /// storage), named by `what`.
    #[error("{what}: {message}")]
    Service { what: &'static str, message: String },
}

impl StartError {
    /// A failure of the service's own start-up step `what`.
    pub fn service(what: &'static str, message: impl std::fmt::Display) -> StartError {
        StartError::Service { what, message: message.to_string() }
    }
}

/// The security a service's config asks for: TLS on its listeners and to
/// its peers with the cluster's CA, the verifier of its callers' tokens,
/// and the token it shows its peers. Without auth every caller is
/// accepted, which is said once in the log.
#[derive(Clone, Default)]
pub struct Security {
    pub server_tls: Option<ServerTls>,
    pub client_tls: Option<ClientTls>,
    pub verifier: Option<Arc<Verifier>>,
    pub token: Option<Token>,
}

impl Security {
    /// Loads the certificates and keys the config names, and opens the
    /// audit log it names, as `service`'s.
    pub fn load(service: &str, tls: Option<&TlsConfig>, auth: Option<&AuthConfig>) -> Result<Security, StartError> {
        let (server_tls, client_tls) = match tls {
            Some(t) => (Some(t.server()?), Some(t.client()?)),
            None => (None, None),
        };
        if let Some(path) = auth.and_then(|a| a.audit_log.as_deref()) {
            crate::audit::open(path, service)
                .map_err(|e| StartError::service("audit log", format!("{}: {e}", path.display())))?;
        }
        let (verifier, token) = match auth {
            Some(a) => (Some(Arc::new(a.verifier()?)), a.token()?),
            None => {
                tracing::warn!("authentication is OFF: every caller is accepted");
                (None, None)
            }
        };
        Ok(Security { server_tls, client_tls, verifier, token })
    }

    /// The token check of the HTTP API, counting refusals in `refusals`.
    pub fn http_auth(&self, refusals: RefusalMetrics) -> Option<HttpAuth> {
        self.verifier.clone().map(|v| HttpAuth::new(v, refusals))
    }
}

/// A future that completes at the first SIGTERM or SIGINT; installed
/// before the service serves, so that a signal during start-up is not lost.
pub fn stop_signal() -> Result<impl std::future::Future<Output = ()>, StartError> {
    crate::shutdown_signal().map_err(StartError::Signals)
}

/// Binds `addr`, the config's `key`, for a service's listener.
pub async fn bind(key: &'static str, addr: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    Ok(crate::bind(key, addr).await?)
}

/// The HTTP listener of a management API: at most `max_connections` at
/// once, each with `handshake_timeout` to finish TLS, refused ones answered
/// as HTTP, over the service's TLS.
pub fn http_listener(
    listener: tokio::net::TcpListener,
    max_connections: usize,
    handshake_timeout: Duration,
    metrics: &ListenerMetrics,
    security: &Security,
) -> Listener {
    Listener::new("http", listener, Limits { max_connections, handshake_timeout }, crate::http::refusal, metrics)
        .with_tls(security.server_tls.clone())
}

/// Serves a management API's router on its listener until the task is
/// aborted (the listener never stops by itself).
pub async fn serve_http(listener: Listener, router: Router) {
    crate::http::serve(listener, router, Default::default()).await
}
