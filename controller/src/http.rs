//! The controller's HTTP API (`docs/openapi/controller.yaml`): its status,
//! where a tenant is attached (long-polled by the compute agents), the
//! renewal of the computes' tokens, registering and deleting tenants,
//! drain and fill of a pageserver, and metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use strata_protocol::api::controller::{PageserverPolicy, PolicyChanged, SplitRequest};
use strata_protocol::api::ErrorBody;
use strata_protocol::TenantShardId;
use strata_service::auth::http::{guard, HttpAuth, Need};

use crate::limits::MAX_WAIT;
use crate::service::{CallError, Controller};

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(ErrorBody { error: message })).into_response()
}

/// The routes; with `auth`, each needs the scope of its group.
pub fn router(
    controller: Arc<Controller>,
    auth: Option<&HttpAuth>,
    renewer: Option<Arc<crate::renew::Renewer>>,
) -> Router {
    let management = Router::new()
        .route("/v1/pageserver/{name}/drain", post(drain))
        .route("/v1/pageserver/{name}/fill", post(fill))
        .route("/v1/pageserver/{name}/lost", post(lost))
        .route("/v1/tenant/{tenant}", put(register_tenant).delete(delete_tenant))
        .route("/v1/tenant/{tenant}/split", post(split_tenant).get(split_status));
    let tenant = Router::new().route("/v1/tenant/{tenant}/attachment", get(attachment));
    let service = Router::new().route("/v1/status", get(status)).route("/metrics", get(metrics));
    let renewal = Router::new().route("/v1/tenant/{tenant}/token", post(renew_token)).with_state(renewer);
    Router::new()
        .merge(guard(management, auth, Need::Management))
        .merge(guard(tenant, auth, Need::Tenant))
        .merge(guard(service, auth, Need::Service))
        .with_state(controller)
        .merge(guard(renewal, auth, Need::Tenant))
}

/// `POST /v1/tenant/{tenant}/token`: see [`crate::renew`].
async fn renew_token(
    renewer: State<Option<Arc<crate::renew::Renewer>>>,
    tenant: Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    crate::renew::renew(renewer, tenant, headers).await
}

async fn status(State(c): State<Arc<Controller>>) -> Response {
    Json(c.status()).into_response()
}

async fn metrics(State(c): State<Arc<Controller>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], c.metrics.render()).into_response()
}

/// `?after=VERSION&wait_seconds=S`: answer once the state is newer than
/// `after` (at most `S`, up to 30 s, later).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachmentQuery {
    after: Option<u64>,
    wait_seconds: Option<f64>,
    /// The asking compute's site: its reader is answered if it has one.
    site: Option<String>,
}

async fn attachment(
    State(c): State<Arc<Controller>>,
    Path(tenant): Path<String>,
    query: Result<Query<AttachmentQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let tenant = match parse_tenant(&tenant) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let wait = match q.wait_seconds {
        Some(s) if !(0.0..=MAX_WAIT.as_secs_f64()).contains(&s) => {
            return error(StatusCode::BAD_REQUEST, format!("wait_seconds must be between 0 and {}", MAX_WAIT.as_secs()))
        }
        Some(s) => Duration::from_secs_f64(s),
        None => Duration::ZERO,
    };
    match c.attachment(tenant, q.after, wait, q.site.as_deref()).await {
        Ok(a) => Json(a).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e.to_string()),
    }
}

/// The tenant id of a path, or why it is none (a 400).
fn parse_tenant(tenant: &str) -> Result<TenantShardId, String> {
    tenant.parse().map_err(|e| format!("{e}"))
}

/// The answer to a management call that failed: a follower's and a
/// storage failure's are 503 (the caller asks the leader, or again).
fn call_error(e: CallError) -> Response {
    let status = match e {
        CallError::NotLeader(_) | CallError::Store(_) | CallError::Later(_) => StatusCode::SERVICE_UNAVAILABLE,
        CallError::Unknown(_) => StatusCode::NOT_FOUND,
        CallError::Split(_) => StatusCode::CONFLICT,
    };
    error(status, e.to_string())
}

async fn set_policy(c: Arc<Controller>, name: String, policy: PageserverPolicy) -> Response {
    match c.set_policy(&name, policy).await {
        Ok(()) => Json(PolicyChanged { pageserver: name, policy }).into_response(),
        Err(e) => call_error(e),
    }
}

/// `PUT /v1/tenant/{tenant}`: 201 when the tenant was new, 200 when known.
async fn register_tenant(State(c): State<Arc<Controller>>, Path(tenant): Path<String>) -> Response {
    let tenant = match parse_tenant(&tenant) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match c.register_tenant(tenant).await {
        Ok((true, r)) => (StatusCode::CREATED, Json(r)).into_response(),
        Ok((false, r)) => Json(r).into_response(),
        Err(e) => call_error(e),
    }
}

/// `DELETE /v1/tenant/{tenant}`: repeated until no pageserver holds it.
async fn delete_tenant(State(c): State<Arc<Controller>>, Path(tenant): Path<String>) -> Response {
    let tenant = match parse_tenant(&tenant) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match c.delete_tenant(tenant).await {
        Ok(d) => Json(d).into_response(),
        Err(e) => call_error(e),
    }
}

/// The bare tenant id of a split's path.
fn parse_bare_tenant(tenant: &str) -> Result<strata_protocol::TenantId, String> {
    match parse_tenant(tenant)? {
        t if t.shard.is_unsharded() => Ok(t.tenant),
        t => Err(format!("{t}: a split is asked of the tenant, not of a shard")),
    }
}

/// `POST /v1/tenant/{tenant}/split`: 202 with the split recorded.
async fn split_tenant(
    State(c): State<Arc<Controller>>,
    Path(tenant): Path<String>,
    body: Result<Json<SplitRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let tenant = match parse_bare_tenant(&tenant) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let req = match body {
        Ok(Json(b)) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    match c.split_tenant(tenant, req.shards, req.stripe_blocks).await {
        Ok(s) => (StatusCode::ACCEPTED, Json(s)).into_response(),
        Err(e) => call_error(e),
    }
}

/// `GET /v1/tenant/{tenant}/split`: the newest split, 404 if none.
async fn split_status(State(c): State<Arc<Controller>>, Path(tenant): Path<String>) -> Response {
    let tenant = match parse_bare_tenant(&tenant) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match c.split_of(tenant) {
        Some(s) => Json(s).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("tenant {tenant} was never split")),
    }
}

async fn drain(State(c): State<Arc<Controller>>, Path(name): Path<String>) -> Response {
    set_policy(c, name, PageserverPolicy::Draining).await
}

async fn lost(State(c): State<Arc<Controller>>, Path(name): Path<String>) -> Response {
    set_policy(c, name, PageserverPolicy::Lost).await
}

async fn fill(State(c): State<Arc<Controller>>, Path(name): Path<String>) -> Response {
    set_policy(c, name, PageserverPolicy::Active).await
}
