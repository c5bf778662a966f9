//! The proxy's HTTP API: its status and metrics (a service token reads them).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{extract::State, Json, Router};
use strata_service::auth::http::{guard, HttpAuth, Need};

use crate::state::Proxy;

/// `GET /v1/status`.
#[derive(serde::Serialize)]
struct Status {
    /// The PostgreSQL address of every endpoint.
    listen_pg: std::net::SocketAddr,
    domain: String,
    require_tls: bool,
    /// Sessions relayed now, in all and by tenant.
    sessions: i64,
    sessions_by_tenant: BTreeMap<String, usize>,
    /// Endpoints being woken now.
    waking: Vec<String>,
    /// Clients turned away since the start, by reason.
    refused: BTreeMap<&'static str, u64>,
}

/// The routes; with `auth`, a service token reads them.
pub fn router(proxy: Arc<Proxy>, auth: Option<&HttpAuth>) -> Router {
    let service = Router::new().route("/v1/status", get(status)).route("/metrics", get(metrics));
    Router::new().merge(guard(service, auth, Need::Service)).with_state(proxy)
}

async fn status(State(p): State<Arc<Proxy>>) -> Response {
    Json(Status {
        listen_pg: p.pg,
        domain: p.config.domain.clone(),
        require_tls: p.config.require_tls,
        sessions: p.metrics.sessions.get(),
        sessions_by_tenant: p.admission.open(),
        waking: p.wakes.in_flight(),
        refused: p.refusals.lock().clone(),
    })
    .into_response()
}

async fn metrics(State(p): State<Arc<Proxy>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], p.metrics.render()).into_response()
}
