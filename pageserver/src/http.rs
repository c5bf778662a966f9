//! The pageserver's HTTP API: status, tenant bootstrap, timeline status,
//! basebackups, checkpoints, a single-page read for debugging and tests,
//! and Prometheus metrics.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::{Lsn, PgVersion};
use strata_protocol::{ShardLayout, TenantShardId, TimelineId};
use strata_service::auth::http::{guard, HttpAuth, Need};

use strata_protocol::api::pageserver::{
    BasebackupQuery, CheckpointQuery, CheckpointRecordQuery, CheckpointRecordResponse, CheckpointResponse,
    CreateBranchRequest, CreateTenantRequest, DeleteTimelineResponse, EvictResponse, LeaseRequest, LeaseResponse,
    LocationRequest, LsnResponse, PageQuery, PageserverStatus, StatusQuery, TenantObjectsDeleted, TimeQuery,
};
use strata_protocol::api::ErrorBody;

use crate::checkpoint_record::CheckpointRecord;
use crate::key::RelTag;
use crate::tenants::{BranchError, CreateError, DeleteError, LocationError, Tenants, TimelineEntry};
use crate::timeline::ReadError;

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(ErrorBody { error: message })).into_response()
}

fn read_error(e: ReadError) -> Response {
    let status = match e {
        ReadError::NotFound(_) => StatusCode::NOT_FOUND,
        ReadError::LsnTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        ReadError::BelowGcCutoff { .. } => StatusCode::GONE,
        ReadError::Layer(_) | ReadError::Corrupt { .. } | ReadError::Broken { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        ReadError::NotAttached { .. } => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

/// The status of a failed creation, from its kind.
fn create_status(e: &CreateError) -> StatusCode {
    match e {
        CreateError::Exists(..) => StatusCode::CONFLICT,
        // The control plane must attach the tenant here first.
        CreateError::NotAttached { .. } => StatusCode::PRECONDITION_FAILED,
        // What was sent cannot become a tenant (an import's data directory).
        CreateError::Import { source, .. } if matches!(**source, crate::import::ImportError::Invalid { .. }) => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        CreateError::Import { .. } | CreateError::Storage { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        // Out of threads: retrying later may work.
        CreateError::Receiver { .. } => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The API; with `auth`, each route needs the scope of its group
/// (`docs/security.md`).
pub fn router(tenants: Arc<Tenants>, auth: Option<&HttpAuth>) -> Router {
    let management = Router::new()
        .route("/v1/tenant", post(create_tenant))
        .route("/v1/tenant/{tenant}", delete(delete_tenant))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/import", put(import_tenant))
        .route("/v1/tenant/{tenant}/timeline", post(create_branch))
        .route("/v1/tenant/{tenant}/timeline/{timeline}", delete(delete_timeline))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/checkpoint", post(checkpoint))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/evict", post(evict));
    // What a compute of the tenant reads.
    let tenant = Router::new()
        .route("/v1/tenant/{tenant}/timeline/{timeline}", get(timeline_status))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/basebackup", get(basebackup))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/checkpoint_record", get(checkpoint_record))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/lease", post(lease))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/lsn_by_time", get(lsn_by_time))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/page", get(page));
    // The storage controller places tenants with its own token; the
    // services' token, on every host, may not.
    let placement = Router::new()
        .route("/v1/tenant/{tenant}/location", put(set_location))
        .route("/v1/tenant/{tenant}/split", post(split_shard));
    let service = Router::new().route("/v1/status", get(status)).route("/metrics", get(metrics));
    Router::new()
        .merge(guard(management, auth, Need::Management))
        .merge(guard(placement, auth, Need::Placement))
        .merge(guard(tenant, auth, Need::Tenant))
        .merge(guard(service, auth, Need::Service))
        .with_state(tenants)
}

async fn status(State(tenants): State<Arc<Tenants>>) -> Response {
    let timelines: Vec<_> = tenants.all().iter().map(|e| e.status()).collect();
    Json(PageserverStatus {
        id: tenants.conf.id,
        listen_pg: tenants.conf.listen_pg,
        listen_http: tenants.conf.listen_http,
        safekeepers: tenants.conf.safekeepers.clone(),
        data_dir: tenants.conf.data_dir.clone(),
        remote_storage: tenants.remote.as_ref().map(|r| r.describe().to_string()),
        timelines,
        locations: tenants.locations(),
    })
    .into_response()
}

/// The object name prefixes of everything a tenant has in object storage.
pub fn tenant_prefixes(tenant: TenantShardId) -> Vec<String> {
    // Offloaded WAL and data keys belong to the tenant, not to one shard:
    // they go with shard 0 (the last one a tenant's deletion removes).
    if tenant.shard.number == 0 {
        let t = tenant.tenant;
        vec![format!("tenants/{tenant}/"), format!("wal/{t}/"), format!("keys/{t}/")]
    } else {
        vec![format!("tenants/{tenant}/")]
    }
}

/// `DELETE /v1/tenant/{tenant}`: deletes every object of a tenant from
/// object storage (layers, indexes, heatmaps, offloaded WAL, data keys).
/// Refused while the tenant has a location here: the storage controller
/// detaches it from every pageserver first, so nothing uploads it again.
async fn delete_tenant(State(tenants): State<Arc<Tenants>>, Path(tenant): Path<String>) -> Response {
    let tenant: TenantShardId = match tenant.parse() {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    if let Some(l) = tenants.locations().into_iter().find(|l| l.tenant_id == tenant) {
        let why = format!("tenant {tenant} is still located here ({:?}): detach it first", l.mode);
        return error(StatusCode::CONFLICT, why);
    }
    let mut deleted = 0u64;
    if let Some(remote) = &tenants.remote {
        for prefix in tenant_prefixes(tenant) {
            let listed = match remote.storage.list(&prefix).await {
                Ok(l) => l,
                Err(e) => {
                    return error(StatusCode::SERVICE_UNAVAILABLE, format!("tenant {tenant}: listing {prefix}: {e}"))
                }
            };
            for o in listed {
                if let Err(e) = remote.storage.delete(&o.key).await {
                    return error(StatusCode::SERVICE_UNAVAILABLE, format!("tenant {tenant}: deleting {}: {e}", o.key));
                }
                deleted += 1;
            }
        }
    }
    Json(TenantObjectsDeleted { tenant_id: tenant, objects_deleted: deleted }).into_response()
}

/// `PUT /v1/tenant/{tenant}/location`: the storage controller places the
/// tenant here (attached under a generation, secondary, or detached).
async fn set_location(
    State(tenants): State<Arc<Tenants>>,
    Path(tenant): Path<String>,
    body: Result<Json<LocationRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let tenant: TenantShardId = match tenant.parse() {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    let req = match body {
        Ok(Json(b)) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let t2 = tenants.clone();
    match tokio::task::spawn_blocking(move || t2.set_location(tenant, req.mode, req.generation)).await {
        Ok(Ok(status)) => Json(status).into_response(),
        Ok(Err(e)) => {
            let code = match &e {
                LocationError::NoGeneration(_) => StatusCode::BAD_REQUEST,
                LocationError::Older { .. } => StatusCode::CONFLICT,
                LocationError::NoRemote => StatusCode::PRECONDITION_FAILED,
                LocationError::Failed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(code, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("location task failed: {e}")),
    }
}

/// A split's step on a parent shard (`crate::split`): its children's indexes.
async fn split_shard(
    State(tenants): State<Arc<Tenants>>,
    Path(tenant): Path<String>,
    body: Result<Json<strata_protocol::api::pageserver::SplitShardRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let parent: TenantShardId = match tenant.parse() {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    let req = match body {
        Ok(Json(b)) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    match tokio::task::spawn_blocking(move || crate::split::write_children(&tenants, parent, &req)).await {
        Ok(Ok(done)) => Json(done).into_response(),
        Ok(Err(e)) => {
            let code = match &e {
                crate::split::SplitError::Invalid { .. } => StatusCode::BAD_REQUEST,
                crate::split::SplitError::NotAttached { .. } => StatusCode::NOT_FOUND,
                crate::split::SplitError::NoRemote { .. } => StatusCode::PRECONDITION_FAILED,
                crate::split::SplitError::Storage { .. } => StatusCode::SERVICE_UNAVAILABLE,
                crate::split::SplitError::Timeline { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(code, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("split task failed: {e}")),
    }
}

async fn create_tenant(
    State(tenants): State<Arc<Tenants>>,
    body: Result<Json<CreateTenantRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let major = req.pg_version.unwrap_or(15);
    let version = match PgVersion::from_major(major) {
        Some(v) if v != PgVersion::V16 => v,
        _ => {
            let message = format!(
                "PostgreSQL {major} is not a major a tenant can have (15, 17 and 18; docs/postgres-versions.md)"
            );
            return error(StatusCode::BAD_REQUEST, message);
        }
    };
    let tenant = req.tenant_id.unwrap_or_else(TenantShardId::generate);
    let timeline = req.timeline_id.unwrap_or_else(TimelineId::generate);
    let shard = match shard_request(tenant, req.stripe_blocks, req.system_id) {
        Ok(s) => s,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let t2 = tenants.clone();
    let create = move || match shard {
        None => t2.bootstrap(tenant, timeline, version),
        Some((stripe, system_id)) => t2.bootstrap_shard(tenant, timeline, version, stripe, system_id),
    };
    match tokio::task::spawn_blocking(create).await {
        Ok(Ok(entry)) => (StatusCode::CREATED, Json(entry.status())).into_response(),
        Ok(Err(e)) => error(create_status(&e), e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("bootstrap task failed: {e}")),
    }
}

/// The stripe size and shared system identifier of a shard's creation,
/// none for an unsharded tenant, or why the request is refused.
fn shard_request(
    tenant: TenantShardId,
    stripe_blocks: Option<u32>,
    system_id: Option<u64>,
) -> Result<Option<(u32, Option<u64>)>, String> {
    let shard = tenant.shard;
    if shard.is_unsharded() {
        return match (stripe_blocks, system_id) {
            (None, None) => Ok(None),
            _ => Err(format!("tenant {tenant} is not a shard: it takes no stripe_blocks or system_id")),
        };
    }
    let Some(stripe) = stripe_blocks else {
        return Err(format!("shard {tenant} needs stripe_blocks"));
    };
    ShardLayout::new(u32::from(shard.count), stripe).map_err(|e| format!("shard {tenant}: {e}"))?;
    match (shard.number, system_id) {
        (0, Some(_)) => Err(format!("shard {tenant} is the first: it is given a system identifier of its own")),
        (0, None) => Ok(Some((stripe, None))),
        (_, None) => Err(format!("shard {tenant} needs the system_id of shard 0")),
        (_, Some(id)) => Ok(Some((stripe, Some(id)))),
    }
}

/// `PUT /v1/tenant/{tenant}/timeline/{timeline}/import`: a new tenant
/// whose first timeline is the cleanly shut-down data directory sent as a
/// tar stream (`docs/import.md`). The stream is unpacked as it arrives
/// into a directory of its own under `<data_dir>/imports/`, imported, and
/// removed.
async fn import_tenant(
    State(tenants): State<Arc<Tenants>>,
    Path((tenant, timeline)): Path<(String, String)>,
    body: Body,
) -> Response {
    use crate::import_upload::{unpack, ChunkReader};
    use crate::limits::IMPORT_IDLE_TIMEOUT;
    let (tenant, timeline): (TenantShardId, TimelineId) = match (tenant.parse(), timeline.parse()) {
        (Ok(t), Ok(l)) => (t, l),
        (Err(e), _) | (_, Err(e)) => return error(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    if tenants.exists(tenant, timeline) {
        return error(StatusCode::CONFLICT, CreateError::Exists(tenant, timeline).to_string());
    }
    let Ok(_permit) = tenants.importing.clone().try_acquire_owned() else {
        let message = format!("{} imports are receiving already; try again later", crate::limits::IMPORTS_AT_ONCE);
        return error(StatusCode::SERVICE_UNAVAILABLE, message);
    };
    let imports = tenants.conf.data_dir.join("imports");
    let dest = imports.join(format!("{tenant}-{timeline}"));
    // Left by an import this process did not finish (it crashed).
    if dest.exists() {
        if let Err(e) = std::fs::remove_dir_all(&dest) {
            return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{}: {e}", dest.display()));
        }
    }
    if let Err(e) = std::fs::create_dir_all(&imports) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{}: {e}", imports.display()));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let max = tenants.conf.import_max_bytes;
    let to = dest.clone();
    let unpacking = tokio::task::spawn_blocking(move || unpack(ChunkReader::new(rx), &to, max));
    let mut stream = body.into_data_stream();
    loop {
        let next = std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut stream), cx));
        let item = match strata_service::clock::timeout(&*tenants.resources.clock, IMPORT_IDLE_TIMEOUT, next).await {
            Err(_) => Err(format!("no data for {IMPORT_IDLE_TIMEOUT:?}")),
            Ok(None) => break,
            Ok(Some(Ok(chunk))) => Ok(chunk),
            Ok(Some(Err(e))) => Err(format!("receiving the data directory: {e}")),
        };
        let failed = item.is_err();
        // The unpacker stopped (it failed, and says why below).
        if tx.send(item).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    let result = match unpacking.await {
        Ok(Ok(unpacked)) => {
            tracing::info!(%tenant, %timeline, files = unpacked.files, bytes = unpacked.bytes, "received a data directory to import");
            let (t2, d2) = (tenants.clone(), dest.clone());
            match tokio::task::spawn_blocking(move || t2.import(tenant, timeline, &d2)).await {
                Ok(Ok(entry)) => (StatusCode::CREATED, Json(entry.status())).into_response(),
                Ok(Err(e)) => error(create_status(&e), e.to_string()),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("import task failed: {e}")),
            }
        }
        Ok(Err(e)) => error(StatusCode::UNPROCESSABLE_ENTITY, format!("import of {tenant}/{timeline}: {e}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("unpacking task failed: {e}")),
    };
    let gone = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dest).map_err(|e| (dest, e))).await;
    if let Ok(Err((dest, e))) = gone {
        tracing::warn!("removing {}: {e}", dest.display());
    }
    result
}

use crate::limits::BRANCH_LSN_WAIT;

/// The status of a failed branch creation, from its kind.
fn branch_status(e: &BranchError) -> StatusCode {
    match e {
        BranchError::Exists(..) => StatusCode::CONFLICT,
        BranchError::ParentNotFound(..) => StatusCode::NOT_FOUND,
        BranchError::NotAligned { .. }
        | BranchError::BeforeStart { .. }
        | BranchError::InFuture { .. }
        | BranchError::NoCommitThatOld { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        BranchError::BelowGcCutoff { .. } => StatusCode::GONE,
        BranchError::ParentBroken { .. } | BranchError::Receiver { .. } => StatusCode::SERVICE_UNAVAILABLE,
        BranchError::Read(_) | BranchError::Storage { .. } | BranchError::Other(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// PostgreSQL's time (µs since 2000-01-01) of an RFC 3339 timestamp.
fn pg_time(text: &str) -> Result<i64, String> {
    let t = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| format!("ancestor_time {text:?}: {e}"))?;
    Ok(strata_formats::time::from_unix_micros(t.timestamp_micros()))
}

/// `POST /v1/tenant/{tenant}/timeline`: a branch of a timeline at an LSN,
/// at a time, or at its newest record (`docs/branches.md`).
async fn create_branch(
    State(tenants): State<Arc<Tenants>>,
    Path(tenant): Path<String>,
    body: Result<Json<CreateBranchRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let tenant: TenantShardId = match tenant.parse() {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    let req = match body {
        Ok(Json(b)) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let parent_id = req.ancestor_timeline_id;
    let Some(parent) = tenants.get(tenant, parent_id) else {
        return error(StatusCode::NOT_FOUND, BranchError::ParentNotFound(tenant, parent_id).to_string());
    };
    let timeline = req.timeline_id.unwrap_or_else(TimelineId::generate);
    if let Some(reason) = parent.tl.broken_reason() {
        let e = BranchError::ParentBroken { parent: parent_id, reason };
        return error(branch_status(&e), e.to_string());
    }
    let lsn = match (req.ancestor_lsn, req.ancestor_time) {
        (Some(_), Some(_)) => {
            return error(StatusCode::BAD_REQUEST, "give ancestor_lsn or ancestor_time, not both".into())
        }
        (Some(lsn), None) if !lsn.0.is_multiple_of(8) || lsn < parent.tl.metadata().start_lsn => {
            // Refused at once, not after a wait for the LSN.
            let e = if !lsn.0.is_multiple_of(8) {
                BranchError::NotAligned { lsn }
            } else {
                BranchError::BeforeStart { lsn, start: parent.tl.metadata().start_lsn, parent: parent_id }
            };
            return error(branch_status(&e), e.to_string());
        }
        (Some(lsn), None) => match parent.tl.wait_lsn(lsn, BRANCH_LSN_WAIT).await {
            Ok(_) => lsn,
            Err(ReadError::LsnTimeout { last, .. }) => {
                let e = BranchError::InFuture { lsn, last, parent: parent_id };
                return error(branch_status(&e), e.to_string());
            }
            Err(e) => return read_error(e),
        },
        (None, Some(text)) => {
            let time = match pg_time(&text) {
                Ok(t) => t,
                Err(e) => return error(StatusCode::BAD_REQUEST, e),
            };
            if time > crate::clock::pg_now(&**parent.tl.clock()) {
                return error(StatusCode::UNPROCESSABLE_ENTITY, format!("{text} is in the future"));
            }
            let tl = parent.tl.clone();
            match tokio::task::spawn_blocking(move || tl.lsn_for_time(time)).await {
                Ok(Ok(Some(lsn))) => lsn,
                Ok(Ok(None)) => {
                    let e = BranchError::NoCommitThatOld { parent: parent_id };
                    return error(branch_status(&e), e.to_string());
                }
                Ok(Err(e)) => return read_error(e),
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("time lookup failed: {e}")),
            }
        }
        (None, None) => parent.tl.record_lsns().last,
    };
    let t2 = tenants.clone();
    match tokio::task::spawn_blocking(move || t2.create_branch(tenant, timeline, parent_id, lsn)).await {
        Ok(Ok(entry)) => (StatusCode::CREATED, Json(entry.status())).into_response(),
        Ok(Err(e)) => error(branch_status(&e), e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("branch creation failed: {e}")),
    }
}

/// `DELETE /v1/tenant/{tenant}/timeline/{timeline}`: refused (409) while a
/// branch depends on it.
/// A timeline no longer served whose deletion a failure interrupted is
/// found by its marker: the request finishes it.
async fn delete_timeline(
    State(tenants): State<Arc<Tenants>>,
    Path((tenant, timeline)): Path<(String, String)>,
) -> Response {
    let (tenant, timeline) = match timeline_ids(&tenant, &timeline) {
        Ok(ids) => ids,
        Err(e) => return bad_id(e),
    };
    let t2 = tenants.clone();
    match tokio::task::spawn_blocking(move || t2.delete_timeline(tenant, timeline)).await {
        Ok(Ok(())) => (StatusCode::OK, Json(DeleteTimelineResponse { deleted: timeline })).into_response(),
        Ok(Err(e)) => {
            let status = match e {
                DeleteError::NotFound(..) => return missing_timeline(&tenants, tenant, timeline),
                DeleteError::HasBranches { .. } => StatusCode::CONFLICT,
                DeleteError::Remote { .. } | DeleteError::Storage { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(status, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("deletion failed: {e}")),
    }
}

/// `POST .../lease {"lsn", "holder"?}`: keeps `lsn` readable (GC stays
/// below it) for [`crate::timeline::LEASE_TTL`]; a read-only compute
/// renews it, a replica moves its named lease along with its replay.
async fn lease(
    State(tenants): State<Arc<Tenants>>,
    TimelinePath(entry): TimelinePath,
    body: Result<Json<LeaseRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let max_lag = Some(tenants.conf.max_replica_lag_bytes).filter(|m| *m > 0);
    match entry.tl.lease(req.lsn, req.holder.as_deref(), max_lag) {
        Ok(ttl) => Json(LeaseResponse { lsn: req.lsn, valid_for_seconds: ttl.as_secs() }).into_response(),
        Err(ReadError::NotFound(m)) => error(StatusCode::UNPROCESSABLE_ENTITY, m),
        Err(e) => read_error(e),
    }
}

/// `GET .../lsn_by_time?time=…`: the LSN a branch or a read-only compute
/// at that time uses (after every commit stamped at or before it, before
/// the first stamped after it).
async fn lsn_by_time(
    TimelinePath(entry): TimelinePath,
    query: Result<Query<TimeQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error(StatusCode::BAD_REQUEST, "expected ?time=<RFC 3339 timestamp>".into());
    };
    let time = match pg_time(&q.time) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if time > crate::clock::pg_now(&**entry.tl.clock()) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, format!("{} is in the future", q.time));
    }
    let tl = entry.tl.clone();
    match tokio::task::spawn_blocking(move || tl.lsn_for_time(time)).await {
        Ok(Ok(Some(lsn))) => Json(LsnResponse { lsn }).into_response(),
        Ok(Ok(None)) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("timeline {} has no commit at or before {} that is still readable", entry.tl.timeline_id, q.time),
        ),
        Ok(Err(e)) => read_error(e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("time lookup failed: {e}")),
    }
}

/// `GET .../checkpoint_record?lsn=…`: the last checkpoint record that ends
/// at or before `lsn` (default: the last record ingested); 404 when ingest
/// has seen none by then.
async fn checkpoint_record(
    State(tenants): State<Arc<Tenants>>,
    TimelinePath(entry): TimelinePath,
    query: Result<Query<CheckpointRecordQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error(StatusCode::BAD_REQUEST, "the only query parameter is lsn=X/Y".into());
    };
    let lsn = match entry.tl.wait_lsn(q.lsn.unwrap_or(Lsn::INVALID), tenants.conf.wait_lsn_timeout).await {
        Ok(l) => l,
        Err(e) => return read_error(e),
    };
    match last_checkpoint_record(&entry, lsn).await {
        Ok(r) => Json(CheckpointRecordResponse {
            lsn: r.lsn,
            end_lsn: r.end_lsn,
            redo: r.checkpoint.redo,
            shutdown: r.shutdown,
            pg_timeline: r.checkpoint.this_timeline,
        })
        .into_response(),
        Err(response) => response,
    }
}

/// The last checkpoint record ending at or before `lsn`, or the error to
/// answer with (404 when ingest has seen none by then).
async fn last_checkpoint_record(entry: &TimelineEntry, lsn: Lsn) -> Result<CheckpointRecord, Response> {
    let tl = entry.tl.clone();
    match tokio::task::spawn_blocking(move || tl.checkpoint_record_at(lsn)).await {
        Ok(Ok(Some(r))) => Ok(r),
        Ok(Ok(None)) => Err(error(
            StatusCode::NOT_FOUND,
            format!("timeline {} has no checkpoint record ingested at or before {lsn}", entry.tl.timeline_id),
        )),
        Ok(Err(e)) => Err(read_error(e)),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, format!("checkpoint record lookup failed: {e}"))),
    }
}

/// The timeline a request's path names (`/v1/tenant/{tenant}/timeline/{timeline}/…`),
/// found before the handler runs: a malformed id is a 400, an unknown
/// timeline a 404.
struct TimelinePath(Arc<TimelineEntry>);

impl FromRequestParts<Arc<Tenants>> for TimelinePath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, tenants: &Arc<Tenants>) -> Result<Self, Response> {
        let Path((tenant, timeline)) =
            Path::<(String, String)>::from_request_parts(parts, tenants).await.map_err(IntoResponse::into_response)?;
        let (t, l) = timeline_ids(&tenant, &timeline).map_err(bad_id)?;
        let entry = tenants.get(t, l).ok_or_else(|| missing_timeline(tenants, t, l))?;
        Ok(TimelinePath(entry))
    }
}

/// The tenant and timeline of a route's path.
fn timeline_ids(
    tenant: &str,
    timeline: &str,
) -> Result<(TenantShardId, TimelineId), strata_protocol::ids::IdParseError> {
    Ok((tenant.parse()?, timeline.parse()?))
}

/// The answer for an id in a path that does not parse.
fn bad_id(e: strata_protocol::ids::IdParseError) -> Response {
    error(StatusCode::BAD_REQUEST, e.to_string())
}

/// The answer for a timeline this pageserver does not have: 404, unless
/// it may yet have it. A reader follows the tenant's indexes in object
/// storage, so a timeline made since its last refresh (a new tenant's
/// first one, a new branch) appears a few seconds later, and a tenant
/// still attaching has not loaded all of its timelines: 503 then, which a
/// compute asks again after.
fn missing_timeline(tenants: &Tenants, t: TenantShardId, l: TimelineId) -> Response {
    if tenants.is_reader(t) || tenants.is_attaching(t) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "timeline {t}/{l} is not loaded here yet (this pageserver is still loading the tenant's timelines)"
            ),
        );
    }
    error(StatusCode::NOT_FOUND, format!("timeline {t}/{l} not found"))
}

async fn timeline_status(
    State(tenants): State<Arc<Tenants>>,
    TimelinePath(entry): TimelinePath,
    query: Result<Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return error(StatusCode::BAD_REQUEST, "the only query parameter is logical_size=true|false".into());
    };
    let mut status = entry.status();
    status.pitr_interval_secs = Some(tenants.conf.gc_policy().pitr_interval.as_secs());
    if query.logical_size {
        let tl = entry.tl.clone();
        let size = tokio::task::spawn_blocking(move || {
            let lsn = tl.record_lsns().last;
            let mut total = 0u64;
            for (spc, db) in tl.db_dir(lsn)? {
                total += tl.db_size(spc, db, lsn)?;
            }
            Ok::<u64, ReadError>(total)
        })
        .await;
        match size {
            Ok(Ok(n)) => status.logical_size = Some(n),
            Ok(Err(e)) => return read_error(e),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("logical size: {e}")),
        }
    }
    Json(status).into_response()
}

/// A body fed from a blocking producer through a bounded channel.
struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl futures_core::Stream for ChannelBody {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// Buffers the tar stream into chunks for the channel (blocking send: the producer is a blocking task).
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

use crate::limits::BASEBACKUP_CHUNK as CHUNK;

impl std::io::Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
            self.tx.blocking_send(Ok(chunk)).map_err(|_| std::io::Error::other("the client went away"))?;
        }
        Ok(())
    }
}

async fn basebackup(
    State(tenants): State<Arc<Tenants>>,
    TimelinePath(entry): TimelinePath,
    query: Result<Query<BasebackupQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if let Some(why) = basebackup_refusal(&entry.tl.shard, q.full) {
        return error(StatusCode::BAD_REQUEST, format!("{}: {why}", entry.tl.tenant_id));
    }
    let lsn = match entry.tl.wait_lsn(q.lsn.unwrap_or(Lsn::INVALID), tenants.conf.wait_lsn_timeout).await {
        Ok(l) => l,
        Err(e) => return read_error(e),
    };
    // A standby starts from a checkpoint record at or before `lsn`, with the
    // data at its redo point.
    let (lsn, standby) = if q.standby {
        match last_checkpoint_record(&entry, lsn).await {
            Ok(r) => (r.checkpoint.redo, Some(r)),
            Err(response) => return response,
        }
    } else {
        (lsn, None)
    };
    let last = entry.tl.record_lsns().last;
    if lsn != last && !q.read_only && !q.standby {
        return error(
            StatusCode::BAD_REQUEST,
            format!("a basebackup is made at the end of the ingested WAL ({last}); {lsn} is not it (read_only=true for another LSN)"),
        );
    }
    // Refused before the answer starts: a tar cut short is a worse error.
    match entry.tl.check_readable_point(lsn) {
        Ok(()) => {}
        Err(ReadError::NotFound(m)) => return error(StatusCode::UNPROCESSABLE_ENTITY, m),
        Err(e) => return read_error(e),
    }
    let relations = match (q.full, q.lazy) {
        (true, true) => return error(StatusCode::BAD_REQUEST, "full=true and lazy=true exclude each other".into()),
        (true, false) => crate::basebackup::RelationData::All,
        (false, true) => crate::basebackup::RelationData::Manifest,
        (false, false) => crate::basebackup::RelationData::Nothing,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let tl = entry.tl.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) };
        if let Err(e) =
            crate::basebackup::write_basebackup(&tl, lsn, relations, standby.as_ref(), &mut w).and_then(|()| {
                use std::io::Write;
                w.flush().map_err(Into::into)
            })
        {
            tracing::error!(timeline = %tl.timeline_id, %lsn, "basebackup failed: {e}");
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    ([("content-type", "application/x-tar")], Body::from_stream(ChannelBody(rx))).into_response()
}

/// Why a shard cannot make the basebackup asked for, if it cannot: only
/// shard 0 holds the SLRUs, the catalog and the init forks, and no shard
/// holds every page (`docs/sharding.md`). Answered before the tar starts:
/// a basebackup missing pages would be a silent zero page, not an error.
fn basebackup_refusal(shard: &strata_protocol::ShardIdentity, full: bool) -> Option<&'static str> {
    if shard.index.is_unsharded() {
        None
    } else if !shard.is_home() {
        Some("a sharded tenant's basebackups come from its shard 0")
    } else if full {
        Some("no shard holds every page of a sharded tenant: full=true is for unsharded ones")
    } else {
        None
    }
}

/// Flushes what was ingested (and, with `compact=true`, compacts and
/// writes images); answers with the timeline's status.
async fn checkpoint(
    State(tenants): State<Arc<Tenants>>,
    TimelinePath(entry): TimelinePath,
    query: Result<Query<CheckpointQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let tl = entry.tl.clone();
    let gc_policy = tenants.conf.gc_policy();
    let work = move || -> Result<CheckpointResponse, String> {
        // A failed flush breaks the timeline (its status says why).
        tl.checkpoint().map_err(|e| e.to_string())?;
        let compaction = match q.compact {
            true => {
                let never = std::sync::atomic::AtomicBool::new(false);
                let mut throttle = crate::timeline::Throttle::unlimited();
                Some(tl.compact(true, &mut throttle, &never).map_err(|e| e.to_string())?)
            }
            false => None,
        };
        let gc = match q.gc {
            true => Some(tl.gc(&gc_policy, crate::clock::pg_now(&**tl.clock())).map_err(|e| e.to_string())?),
            false => None,
        };
        let uploaded_lsn = match q.upload_timeout {
            0 => None,
            secs => Some(tl.wait_uploaded(std::time::Duration::from_secs(secs))?),
        };
        Ok(CheckpointResponse { timeline: entry.status(), compaction, gc, uploaded_lsn })
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(done)) => Json(done).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Evicts every uploaded layer of the timeline that no read holds.
async fn evict(TimelinePath(entry): TimelinePath) -> Response {
    if entry.tl.remote().is_none() {
        return error(StatusCode::BAD_REQUEST, "the pageserver has no object storage: nothing can be evicted".into());
    }
    let tl = entry.tl.clone();
    match tokio::task::spawn_blocking(move || tl.evict_all()).await {
        Ok(Ok((layers, bytes))) => Json(EvictResponse { evicted_layers: layers, evicted_bytes: bytes }).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// One page (8192 bytes) of a relation at an LSN.
async fn page(
    State(tenants): State<Arc<Tenants>>,
    TimelinePath(entry): TimelinePath,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let parts: Vec<Result<u32, _>> = q.rel.split('/').map(str::parse).collect();
    let (Some(fork), [Ok(spc), Ok(db), Ok(rel)]) = (ForkNumber::from_u8(q.fork), parts.as_slice()) else {
        return error(StatusCode::BAD_REQUEST, format!("bad relation {:?} or fork {}", q.rel, q.fork));
    };
    let tag = RelTag { rel: RelFileNode { spc: *spc, db: *db, rel: *rel }, fork };
    let lsn = match entry.tl.wait_lsn(q.lsn.unwrap_or(Lsn::INVALID), tenants.conf.wait_lsn_timeout).await {
        Ok(l) => l,
        Err(e) => return read_error(e),
    };
    let tl = entry.tl.clone();
    match tokio::task::spawn_blocking(move || tl.rel_page(tag, q.block, lsn)).await {
        Ok(Ok(page)) => ([("content-type", "application/octet-stream")], page).into_response(),
        Ok(Err(e)) => read_error(e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn metrics(State(tenants): State<Arc<Tenants>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], tenants.render_metrics()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::{ShardIdentity, ShardIndex, TenantId};

    fn shard(number: u8, count: u8) -> TenantShardId {
        TenantShardId { tenant: TenantId([7; 16]), shard: ShardIndex::new(number, count).unwrap() }
    }

    #[test]
    fn shards_are_created_with_their_stripe_and_shard_0s_identity() {
        let plain = TenantShardId::unsharded(TenantId([7; 16]));
        assert_eq!(shard_request(plain, None, None), Ok(None));
        assert!(shard_request(plain, Some(8), None).is_err(), "an unsharded tenant has no stripe");
        assert!(shard_request(plain, None, Some(5)).is_err());
        assert_eq!(shard_request(shard(0, 4), Some(8), None), Ok(Some((8, None))));
        assert!(shard_request(shard(0, 4), Some(8), Some(5)).is_err(), "shard 0 gets an identity of its own");
        assert!(shard_request(shard(0, 4), None, None).is_err(), "a shard needs its stripe");
        assert!(shard_request(shard(0, 4), Some(12), None).is_err(), "not a power of two");
        assert_eq!(shard_request(shard(3, 4), Some(2048), Some(5)), Ok(Some((2048, Some(5)))));
        assert!(shard_request(shard(3, 4), Some(2048), None).is_err(), "shard 0's system identifier is needed");
    }

    #[test]
    fn only_shard_0_makes_basebackups_and_never_full_ones() {
        let of = |number, count| ShardIdentity { index: ShardIndex::new(number, count).unwrap(), stripe_blocks: 8 };
        assert_eq!(basebackup_refusal(&ShardIdentity::UNSHARDED, true), None);
        assert_eq!(basebackup_refusal(&of(0, 2), false), None);
        assert!(basebackup_refusal(&of(0, 2), true).is_some());
        assert!(basebackup_refusal(&of(1, 2), false).is_some());
    }
}
