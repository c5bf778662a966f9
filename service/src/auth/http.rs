//! Tokens on the HTTP APIs: a layer over each group of routes that reads
//! `Authorization: Bearer <token>`, checks it and the scope the group
//! needs, and answers 401 or 403 (with the reason, never the token) before
//! the handler runs, so a refused call changes nothing.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use strata_protocol::{TenantShardId, TimelineId};

use super::{bearer_token, Access, Refusal, Verifier};

/// The path parameter that names the tenant of a tenant route.
pub const TENANT_PARAM: &str = "tenant";
/// The path parameter that names the timeline of a tenant route, if any:
/// a token bound to another timeline is refused.
pub const TIMELINE_PARAM: &str = "timeline";

/// What a group of routes needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Management,
    /// Placing tenants: a controller's token (or management).
    Placement,
    Service,
    /// The tenant named by the route's `{tenant}` parameter.
    Tenant,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabel {
    interface: &'static str,
    reason: &'static str,
}

const REFUSALS_HELP: &str =
    "Calls refused for their token (none, malformed, bad signature, expired, scope, other tenant)";

/// Refused calls, by interface and reason (shared by a service's interfaces).
#[derive(Clone, Default)]
pub struct RefusalMetrics(Family<RefusalLabel, Counter>);

impl RefusalMetrics {
    /// Creates the counter and registers it in `registry`.
    pub fn register(registry: &mut Registry) -> RefusalMetrics {
        let m = RefusalMetrics::default();
        m.register_into(registry);
        m
    }

    /// Registers these counters (their values are shared) in `registry`.
    pub fn register_into(&self, registry: &mut Registry) {
        registry.register("auth_refusals", REFUSALS_HELP, self.0.clone());
    }

    /// Counts one refusal on `interface`.
    pub fn count(&self, interface: &'static str, refusal: &Refusal) {
        self.0.get_or_create(&RefusalLabel { interface, reason: refusal.reason() }).inc();
    }
}

/// The token checks of one service's HTTP API.
#[derive(Clone)]
pub struct HttpAuth {
    verifier: Arc<Verifier>,
    refusals: RefusalMetrics,
}

impl HttpAuth {
    pub fn new(verifier: Arc<Verifier>, refusals: RefusalMetrics) -> HttpAuth {
        HttpAuth { verifier, refusals }
    }
}

/// `routes`, each of which now needs `need`; unchanged without `auth`.
pub fn guard<S: Clone + Send + Sync + 'static>(routes: Router<S>, auth: Option<&HttpAuth>, need: Need) -> Router<S> {
    match auth {
        Some(auth) => routes.route_layer(axum::middleware::from_fn_with_state((auth.clone(), need), check)),
        None => routes,
    }
}

async fn check(State((auth, need)): State<(HttpAuth, Need)>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let access = match need {
        Need::Management => Access::Management,
        Need::Placement => Access::Placement,
        Need::Service => Access::Service,
        Need::Tenant => match RawPathParams::from_request_parts(&mut parts, &()).await {
            Ok(params) => {
                let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
                // A shard's route (`<tenant>-<n>of<count>`) is its tenant's.
                let tenant = param(TENANT_PARAM).map(|v| v.parse::<TenantShardId>().map(|t| t.tenant));
                match (tenant, param(TIMELINE_PARAM)) {
                    (Some(Ok(t)), None) => Access::Tenant(t),
                    (Some(Ok(t)), Some(l)) => match l.parse::<TimelineId>() {
                        Ok(l) => Access::Timeline(t, l),
                        // Not a timeline id: the tenant's to hear the handler's 400.
                        Err(_) => Access::Tenant(t),
                    },
                    // Not a tenant id: only a scope that may see every tenant
                    // gets as far as the handler's own 400.
                    _ => Access::Service,
                }
            }
            Err(_) => Access::Service,
        },
    };
    let token = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
    let action = format!("{} {}", parts.method, parts.uri.path());
    let verdict = auth.verifier.check_for("http", &action, token.unwrap_or(""), access);
    match verdict {
        Ok(claims) => {
            // What changes something is audited (reads are not).
            if !matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD) {
                crate::audit::allowed("http", &action, super::identity(Some(&claims)));
            }
            next.run(Request::from_parts(parts, body)).await
        }
        Err(refusal) => {
            auth.refusals.count("http", &refusal);
            refuse(&refusal)
        }
    }
}

/// The answer to a refused call: 401 with a challenge, or 403.
pub fn refuse(refusal: &Refusal) -> Response {
    let body = axum::Json(serde_json::json!({ "error": refusal.to_string() }));
    if refusal.unauthenticated() {
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
    } else {
        (StatusCode::FORBIDDEN, body).into_response()
    }
}
