//! The link proxy's HTTP API: its routes' status, delay changes, cut, heal
//! and reset (the faults of a test), and metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use strata_service::auth::http::{guard, HttpAuth, Need};

use crate::config::Delay;
use crate::metrics::Metrics;
use crate::relay::Cut;
use crate::route::{RouteState, RouteStatus};

/// What the handlers share.
pub struct Proxy {
    pub routes: BTreeMap<String, Arc<RouteState>>,
    pub metrics: Arc<Metrics>,
    /// The HTTP API's address (bound).
    pub http: std::net::SocketAddr,
}

/// `GET /v1/status`.
#[derive(serde::Serialize)]
struct Status {
    routes: Vec<RouteStatus>,
}

#[derive(serde::Serialize)]
struct ErrorBody {
    error: String,
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(ErrorBody { error: message })).into_response()
}

/// The routes; with `auth`, changes need a management token and reads a service one.
pub fn router(proxy: Arc<Proxy>, auth: Option<&HttpAuth>) -> Router {
    let management = Router::new()
        .route("/v1/route/{name}", put(set_delay))
        .route("/v1/route/{name}/cut", post(cut))
        .route("/v1/route/{name}/heal", post(heal))
        .route("/v1/route/{name}/reset", post(reset));
    let service = Router::new().route("/v1/status", get(status)).route("/metrics", get(metrics));
    Router::new()
        .merge(guard(management, auth, Need::Management))
        .merge(guard(service, auth, Need::Service))
        .with_state(proxy)
}

async fn status(State(p): State<Arc<Proxy>>) -> Response {
    Json(Status { routes: p.routes.values().map(|r| r.status()).collect() }).into_response()
}

async fn metrics(State(p): State<Arc<Proxy>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], p.metrics.render()).into_response()
}

/// Applies `f` to the route `name` (`*`: every route) and answers with
/// their status, or 404 if there is no such route.
fn act(p: &Proxy, name: &str, f: impl Fn(&RouteState)) -> Response {
    let routes: Vec<Arc<RouteState>> = if name == "*" {
        p.routes.values().cloned().collect()
    } else {
        match p.routes.get(name) {
            Some(r) => vec![r.clone()],
            None => return error(StatusCode::NOT_FOUND, format!("no route {name:?}")),
        }
    };
    routes.iter().for_each(|r| f(r));
    Json(Status { routes: routes.iter().map(|r| r.status()).collect() }).into_response()
}

async fn set_delay(
    State(p): State<Arc<Proxy>>,
    Path(name): Path<String>,
    body: Result<Json<Delay>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let delay = match body {
        Ok(Json(d)) => d,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if let Err(e) = delay.validate() {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    act(&p, &name, |r| r.set_delay(delay))
}

/// `?direction=` of a cut: which way nothing moves.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CutQuery {
    #[serde(default)]
    direction: CutDirection,
}

#[derive(Clone, Copy, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum CutDirection {
    #[default]
    Both,
    Forward,
    Back,
}

async fn cut(
    State(p): State<Arc<Proxy>>,
    Path(name): Path<String>,
    query: Result<Query<CutQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let cut = match query {
        Ok(Query(q)) => match q.direction {
            CutDirection::Both => Cut::BOTH,
            CutDirection::Forward => Cut { forward: true, back: false },
            CutDirection::Back => Cut { forward: false, back: true },
        },
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    act(&p, &name, |r| r.set_cut(cut))
}

async fn heal(State(p): State<Arc<Proxy>>, Path(name): Path<String>) -> Response {
    act(&p, &name, |r| r.set_cut(Cut::default()))
}

async fn reset(State(p): State<Arc<Proxy>>, Path(name): Path<String>) -> Response {
    act(&p, &name, |r| r.reset())
}
