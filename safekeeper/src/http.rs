//! HTTP API: status (JSON), timeline creation, Prometheus metrics.
//!
//! - `GET  /v1/status` — this safekeeper and a summary of every timeline
//! - `GET  /v1/tenant/{tenant}/timeline/{timeline}` — one timeline's state
//! - `POST /v1/tenant/{tenant}/timeline/{timeline}` — create a timeline:
//!   `{"system_id": u64, "pg_version": 15, "wal_segment_size": u32, "start_lsn": "X/X"}`
//! - `DELETE /v1/tenant/{tenant}/timeline/{timeline}` — delete a timeline
//!   (a deleted branch) and its offloaded WAL
//! - `GET  /v1/tenant/{tenant}/timeline/{timeline}/membership` — its membership configuration
//! - `PUT  /v1/tenant/{tenant}/timeline/{timeline}/membership` — install a
//!   configuration of a higher generation (`docs/safekeeper-membership.md`);
//!   200 with the configuration now held, 409 for an older or a different
//!   one of the same generation, 400 for a malformed one
//! - `GET  /v1/positions` — flush, commit and offloaded LSN of every timeline (polled by peers)
//! - `GET  /metrics` — Prometheus text format

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};

use strata_protocol::api::safekeeper::{
    CreateTimelineRequest, DeleteTimelineResponse, SafekeeperStatus, TimelinePositions,
};
use strata_protocol::api::ErrorBody;
use strata_protocol::safekeeper::{Membership, TimelineIdentity};
use strata_protocol::{TenantId, TimelineId};

use crate::shared::Shared;
use strata_service::auth::http::{guard, HttpAuth, Need};

/// Body of a timeline creation request.
fn error(status: StatusCode, message: String) -> Response {
    (status, Json(ErrorBody { error: message })).into_response()
}

/// The API; with `auth`, each route needs the scope of its group
/// (`docs/security.md`).
pub fn router(shared: Arc<Shared>, auth: Option<&HttpAuth>) -> Router {
    let management = Router::new()
        .route("/v1/tenant/{tenant}/timeline/{timeline}", post(create_timeline).delete(delete_timeline))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/membership", put(set_membership))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/seal", post(seal_timeline));
    let tenant = Router::new()
        .route("/v1/tenant/{tenant}/timeline/{timeline}", get(timeline_status))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/membership", get(get_membership));
    let service = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/positions", get(positions))
        .route("/metrics", get(metrics));
    Router::new()
        .merge(guard(management, auth, Need::Management))
        .merge(guard(tenant, auth, Need::Tenant))
        .merge(guard(service, auth, Need::Service))
        .with_state(shared)
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    let timelines: Vec<_> = shared.timelines.all().iter().map(|t| t.status()).collect();
    Json(SafekeeperStatus {
        id: shared.config.id,
        listen: shared.config.listen,
        fsync: shared.config.fsync,
        peers: shared.config.peers.clone(),
        timelines,
        unloadable: shared.timelines.unloadable(),
    })
    .into_response()
}

async fn positions(State(shared): State<Arc<Shared>>) -> Response {
    let all: Vec<TimelinePositions> = shared
        .timelines
        .all()
        .iter()
        // A failed timeline is not held for the choice of the offloader.
        .filter(|t| t.failure().is_none())
        .map(|t| {
            let p = t.positions();
            TimelinePositions {
                tenant_id: t.identity.tenant_id,
                timeline_id: t.identity.timeline_id,
                flush_lsn: p.flush_lsn,
                commit_lsn: p.commit_lsn,
                offloaded_lsn: t.progress.offloaded_lsn(),
                remote_consistent_lsn: t.progress.remote_consistent_lsn(),
                removed_before: t.progress.removed_before(),
                sealed: t.is_sealed(),
            }
        })
        .collect();
    Json(all).into_response()
}

/// The timeline ids a request's path names (`/v1/tenant/{tenant}/timeline/{timeline}/…`);
/// a malformed id is a 400 before the handler runs.
struct TimelineIds(TenantId, TimelineId);

impl<S: Send + Sync> FromRequestParts<S> for TimelineIds {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path((tenant, timeline)) =
            Path::<(String, String)>::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        let bad = |e: strata_protocol::ids::IdParseError| error(StatusCode::BAD_REQUEST, e.to_string());
        Ok(TimelineIds(tenant.parse().map_err(bad)?, timeline.parse().map_err(bad)?))
    }
}

async fn timeline_status(State(shared): State<Arc<Shared>>, TimelineIds(t, l): TimelineIds) -> Response {
    match shared.timelines.get(t, l) {
        Some(tl) => {
            let mut status = tl.status();
            status.peers = Some(shared.config.peers.clone());
            Json(status).into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("timeline {t}/{l} not found")),
    }
}

async fn create_timeline(
    State(shared): State<Arc<Shared>>,
    TimelineIds(t, l): TimelineIds,
    body: Result<Json<CreateTimelineRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let size = u64::from(req.wal_segment_size);
    if !size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&size) {
        return error(StatusCode::BAD_REQUEST, format!("invalid wal_segment_size {size}"));
    }
    if strata_formats::PgVersion::from_major(req.pg_version).is_none() {
        return error(StatusCode::BAD_REQUEST, format!("PostgreSQL {} is not supported", req.pg_version));
    }
    let identity = TimelineIdentity {
        tenant_id: t,
        timeline_id: l,
        system_id: req.system_id,
        pg_version: req.pg_version,
        wal_segment_size: req.wal_segment_size,
    };
    let result = tokio::task::block_in_place(|| shared.timelines.create(&identity, req.start_lsn));
    match result {
        Ok((tl, created)) => {
            let code = if created { StatusCode::CREATED } else { StatusCode::OK };
            (code, Json(tl.status())).into_response()
        }
        Err(e @ crate::timelines::CreateError::Storage(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::CONFLICT, e.to_string()),
    }
}

/// Deletes the timeline here and its offloaded WAL in object storage
/// (every safekeeper deletes the same objects: deleting is idempotent).
async fn delete_timeline(State(shared): State<Arc<Shared>>, TimelineIds(t, l): TimelineIds) -> Response {
    let held = shared.timelines.get(t, l);
    let existed = match tokio::task::block_in_place(|| shared.timelines.delete(t, l)) {
        Ok(existed) => existed,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    // An upload in flight would land after the listing below: waited for.
    if let Some(tl) = held.filter(|_| existed) {
        tl.stop_uploads().await;
    }
    let mut objects = 0usize;
    if let Some(storage) = &shared.remote {
        let prefix = format!("{}/", strata_remote_storage::wal::timeline_prefix(t, l));
        let listed = match storage.list(&prefix).await {
            Ok(l) => l,
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("listing the offloaded WAL: {e}")),
        };
        for o in listed {
            if let Err(e) = storage.delete(&o.key).await {
                return error(StatusCode::SERVICE_UNAVAILABLE, format!("deleting {}: {e}", o.key));
            }
            objects += 1;
        }
    }
    if !existed && objects == 0 {
        return error(StatusCode::NOT_FOUND, format!("timeline {t}/{l} not found"));
    }
    Json(DeleteTimelineResponse { deleted: existed, offloaded_objects_deleted: objects }).into_response()
}

async fn get_membership(State(shared): State<Arc<Shared>>, TimelineIds(t, l): TimelineIds) -> Response {
    let Some(tl) = shared.timelines.get(t, l) else {
        return error(StatusCode::NOT_FOUND, format!("timeline {t}/{l} not found"));
    };
    match tokio::task::block_in_place(|| tl.with_acceptor(|a| Ok(a.membership().clone()))) {
        Ok(m) => Json(m).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Seals a timeline (site failover, `docs/sites.md`); answers with its status.
async fn seal_timeline(State(shared): State<Arc<Shared>>, TimelineIds(t, l): TimelineIds) -> Response {
    let Some(tl) = shared.timelines.get(t, l) else {
        return error(StatusCode::NOT_FOUND, format!("timeline {t}/{l} not found"));
    };
    match tokio::task::block_in_place(|| tl.seal()) {
        Ok(_) => Json(tl.status()).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("sealing {t}/{l}: {e}")),
    }
}

async fn set_membership(
    State(shared): State<Arc<Shared>>,
    TimelineIds(t, l): TimelineIds,
    body: Result<Json<Membership>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(m) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if let Err(e) = m.validate() {
        return error(StatusCode::BAD_REQUEST, format!("membership configuration: {e}"));
    }
    let Some(tl) = shared.timelines.get(t, l) else {
        return error(StatusCode::NOT_FOUND, format!("timeline {t}/{l} not found"));
    };
    let generation = m.generation;
    match tokio::task::block_in_place(|| {
        tl.with_acceptor(|a| {
            let before = a.membership().generation;
            a.set_membership(m)?;
            Ok((a.membership().clone(), before))
        })
    }) {
        Ok((now, before)) => {
            if before != now.generation {
                // Proposers of the older generation reconnect and learn this one.
                let closed = tl.disconnect_proposers();
                tracing::info!(tenant = %t, timeline = %l, generation, closed, "membership configuration installed");
            }
            Json(now).into_response()
        }
        Err(crate::timeline::AcceptorCallError::Refused(e)) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], shared.render_metrics()).into_response()
}
