//! The console's HTTP side: its routes, each group under the guard of what
//! it needs (nothing, a session, an operator's or an admin's session, or a
//! service token for its own metrics and status), the session cookie and
//! the CSRF check, and the headers every answer carries (a strict content
//! security policy among them).

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use strata_service::audit::{self, Identity};
use strata_service::auth::{Access, Scope, Token, Verifier};

use crate::actions::{self, Action};
use crate::history::History;
use crate::sessions::{same_secret, Session, Sessions, COOKIE};
use crate::snapshot::Snapshots;
use crate::users::{self, Role};
use crate::{assets, sql};

/// The console's audit log, in its directory.
pub const AUDIT_FILE: &str = "audit.jsonl";

/// What every handler shares.
pub struct Console {
    pub root: PathBuf,
    pub sessions: Sessions,
    pub snapshots: Arc<Snapshots>,
    pub history: Arc<History>,
    pub verifier: Arc<Verifier>,
    /// The console's own metrics (its listener's), besides those of its sessions and history.
    pub metrics: Arc<prometheus_client::registry::Registry>,
}

pub type Shared = Arc<Console>;

/// An error answer: `{"error": …}` with its status.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

fn err(status: StatusCode, text: impl Into<String>) -> ApiError {
    ApiError(status, text.into())
}

type Answer<T> = Result<Json<T>, ApiError>;

/// What a group of routes needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Anyone: the application's files and the login.
    Public,
    /// A live session.
    Session,
    /// An operator's or an admin's session.
    Operator,
    /// An admin's session (a management token's).
    Admin,
    /// A service token (or management), as every service's metrics and status.
    Service,
}

/// The session a guarded request was made in.
#[derive(Clone)]
struct Authed {
    id: String,
    session: Session,
}

impl Authed {
    fn who(&self) -> Identity {
        who(&self.session)
    }
}

fn who(s: &Session) -> Identity {
    Identity {
        scope: Some(if s.token.is_some() { "management".into() } else { "user".into() }),
        jti: s.jti.clone(),
        user: Some(s.user.clone()),
        ..Default::default()
    }
}

/// The router, every group under its guard.
pub fn router(console: Shared) -> Router {
    let public = Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/api/login", post(login));
    let session = Router::new()
        .route("/api/logout", post(logout))
        .route("/api/session", get(session_info))
        .route("/api/overview", get(overview))
        .route("/api/tenants/{tenant}", get(tenant_view))
        .route("/api/graphs", get(graphs));
    let operator = Router::new()
        .route("/api/tenants/{tenant}/branches", post(create_branch))
        .route("/api/tenants/{tenant}/branches/{branch}/reset", post(reset_branch))
        .route("/api/tenants/{tenant}/endpoints", post(new_endpoint))
        .route("/api/endpoints/{endpoint}/{action}", post(endpoint_action))
        .route("/api/sql", post(run_sql));
    let admin = Router::new().route("/api/audit", get(audit_view));
    let service = Router::new().route("/metrics", get(metrics)).route("/v1/status", get(status));
    Router::new()
        .merge(guard(public, &console, Need::Public))
        .merge(guard(session, &console, Need::Session))
        .merge(guard(operator, &console, Need::Operator))
        .merge(guard(admin, &console, Need::Admin))
        .merge(guard(service, &console, Need::Service))
        .fallback(|| async { err(StatusCode::NOT_FOUND, "no such page") })
        .layer(middleware::from_fn(headers))
        .with_state(console)
}

/// Puts `routes` under the check of `need`.
fn guard(routes: Router<Shared>, console: &Shared, need: Need) -> Router<Shared> {
    routes.route_layer(middleware::from_fn_with_state((console.clone(), need), check))
}

async fn check(State((console, need)): State<(Shared, Need)>, mut req: Request, next: Next) -> Response {
    let changes = req.method() != Method::GET && req.method() != Method::HEAD;
    if changes && req.uri().path().starts_with("/api/") {
        // A form of another site cannot send JSON without asking first.
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json {
            return err(StatusCode::UNSUPPORTED_MEDIA_TYPE, "send JSON (content-type: application/json)")
                .into_response();
        }
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            if origin.to_str().ok() != Some(&format!("https://{host}")) {
                return err(StatusCode::FORBIDDEN, "a request from another origin").into_response();
            }
        }
    }
    match need {
        Need::Public => return next.run(req).await,
        Need::Service => {
            let token = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(strata_service::auth::bearer_token)
                .unwrap_or("");
            return match console.verifier.check_for("http", req.uri().path(), token, Access::Service) {
                Ok(_) => next.run(req).await,
                Err(r) if r.unauthenticated() => err(StatusCode::UNAUTHORIZED, r.to_string()).into_response(),
                Err(r) => err(StatusCode::FORBIDDEN, r.to_string()).into_response(),
            };
        }
        _ => {}
    }
    let Some(id) = cookie(req.headers()) else {
        return err(StatusCode::UNAUTHORIZED, "log in first").into_response();
    };
    let Some(session) = console.sessions.get(&id) else {
        return err(StatusCode::UNAUTHORIZED, "the session ended: log in again").into_response();
    };
    // A token's session lasts only as long as its token is good.
    if let Some(token) = &session.token {
        if let Err(r) = console.verifier.verify(&token.expose()) {
            console.sessions.remove(&id);
            audit::refused("http", "session", r.reason(), who(&session));
            return err(StatusCode::UNAUTHORIZED, format!("the session's token is no longer accepted ({r})"))
                .into_response();
        }
    }
    if changes {
        let sent = req.headers().get("x-csrf-token").and_then(|v| v.to_str().ok()).unwrap_or("");
        if !same_secret(sent, &session.csrf) {
            audit::refused("http", &format!("{} {}", req.method(), req.uri().path()), "csrf", who(&session));
            return err(StatusCode::FORBIDDEN, "missing or wrong x-csrf-token").into_response();
        }
    }
    let allowed = match need {
        Need::Operator => session.may_act(),
        Need::Admin => session.role == Role::Admin,
        _ => true,
    };
    if !allowed {
        audit::refused("http", &format!("{} {}", req.method(), req.uri().path()), "role", who(&session));
        return err(StatusCode::FORBIDDEN, format!("a {} may not do this", session.role.as_str())).into_response();
    }
    req.extensions_mut().insert(Authed { id, session });
    next.run(req).await
}

/// The session cookie's value.
fn cookie(headers: &HeaderMap) -> Option<String> {
    cookie_of(headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()))
}

/// The session cookie's value in `Cookie` header values: 64 hex digits, or nothing.
pub fn cookie_of<'a>(values: impl Iterator<Item = &'a str>) -> Option<String> {
    values
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The headers of every answer: nothing runs but the console's own
/// script, nothing frames it, nothing is cached, no referrer leaves.
async fn headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
               font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::STRICT_TRANSPORT_SECURITY, HeaderValue::from_static("max-age=31536000"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], assets::INDEX_HTML).into_response()
}

async fn app_js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], assets::APP_JS).into_response()
}

async fn app_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], assets::APP_CSS).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    user: Option<String>,
    password: Option<String>,
    token: Option<String>,
}

#[derive(serde::Serialize)]
struct SessionInfo {
    user: String,
    role: &'static str,
    tenants: Option<Vec<String>>,
    csrf: String,
    expires_at: u64,
}

fn info(s: &Session) -> SessionInfo {
    SessionInfo {
        user: s.user.clone(),
        role: s.role.as_str(),
        tenants: s.tenants.clone(),
        csrf: s.csrf.clone(),
        expires_at: s.expires_at,
    }
}

/// `POST /api/login`: a name and password, or a management token.
async fn login(State(c): State<Shared>, Json(body): Json<Login>) -> Response {
    let (name, session) = match body {
        Login { token: Some(token), user: None, password: None } => {
            const NAME: &str = "(token)";
            if c.sessions.locked_out(NAME) {
                return err(StatusCode::TOO_MANY_REQUESTS, "too many failed logins: wait a few minutes")
                    .into_response();
            }
            match c.verifier.verify(token.trim()) {
                Ok(claims) if claims.scope == Scope::Management => {
                    let jti = claims.jti.clone();
                    let user = format!("management token {}", jti.as_deref().unwrap_or("(no id)"));
                    let mut s =
                        Session::new(user, Role::Admin, None, Some((Token::new(token.trim().to_string()), jti)));
                    if let Some(exp) = claims.exp {
                        s.expires_at = s.expires_at.min(exp);
                    }
                    (NAME.to_string(), s)
                }
                Ok(claims) => {
                    c.sessions.failed_login(NAME);
                    audit::refused("http", "login", "scope", strata_service::auth::identity(Some(&claims)));
                    return err(StatusCode::FORBIDDEN, "only a management token logs in to the console")
                        .into_response();
                }
                Err(r) => {
                    c.sessions.failed_login(NAME);
                    audit::refused("http", "login", r.reason(), Identity::default());
                    return err(StatusCode::UNAUTHORIZED, format!("the token is not accepted ({r})")).into_response();
                }
            }
        }
        Login { user: Some(user), password: Some(password), token: None } => {
            if users::check_name(&user).is_err() || c.sessions.locked_out(&user) {
                c.sessions.failed_login(&user);
                return err(StatusCode::TOO_MANY_REQUESTS, "too many failed logins: wait a few minutes")
                    .into_response();
            }
            let root = c.root.clone();
            let (u, p) = (user.clone(), password);
            let found = tokio::task::spawn_blocking(move || users::check_password(&root, &u, &p)).await;
            match found {
                Ok(Ok(Some(found))) => (user, Session::new(found.name, found.role, found.tenants, None)),
                Ok(Ok(None)) => {
                    c.sessions.failed_login(&user);
                    let who = Identity { user: Some(user.clone()), ..Default::default() };
                    audit::refused("http", "login", "bad_password", who);
                    return err(StatusCode::UNAUTHORIZED, "wrong user or password").into_response();
                }
                Ok(Err(e)) => return err(StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
                Err(e) => return err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
        _ => return err(StatusCode::BAD_REQUEST, "give user and password, or token").into_response(),
    };
    c.sessions.succeeded(&name);
    audit::allowed("http", "login", who(&session));
    let answer = info(&session);
    let max_age = session.expires_at.saturating_sub(strata_service::auth::now());
    let id = c.sessions.create(session);
    let cookie = format!("{COOKIE}={id}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}");
    ([(header::SET_COOKIE, cookie)], Json(answer)).into_response()
}

async fn logout(State(c): State<Shared>, Extension(a): Extension<Authed>) -> Response {
    c.sessions.remove(&a.id);
    audit::allowed("http", "logout", a.who());
    let gone = format!("{COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, gone)], Json(serde_json::json!({}))).into_response()
}

async fn session_info(Extension(a): Extension<Authed>) -> Json<SessionInfo> {
    Json(info(&a.session))
}

/// `GET /api/overview`: the tenants the session sees, the services by site and host.
async fn overview(State(c): State<Shared>, Extension(a): Extension<Authed>) -> Json<serde_json::Value> {
    let snap = c.snapshots.current();
    let s = &a.session;
    let tenants: Vec<_> = snap.tenants.iter().filter(|t| s.sees(&t.name)).collect();
    // Another tenant's branches are named in the services' details: only
    // a session that sees every tenant sees them.
    let services: Vec<_> = snap
        .services
        .iter()
        .map(|svc| {
            let mut svc = svc.clone();
            if s.tenants.is_some() {
                svc.detail.retain(|d| !d.label.contains('/') && d.label != "attached");
            }
            svc
        })
        .collect();
    Json(serde_json::json!({
        "sampled_at": snap.sampled_at,
        "error": snap.error,
        "tenants": tenants,
        "services": services,
        "sites": snap.sites,
    }))
}

/// `GET /api/tenants/{tenant}`.
async fn tenant_view(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Path(tenant): Path<String>,
) -> Answer<serde_json::Value> {
    let snap = c.snapshots.current();
    let row = snap
        .tenants
        .iter()
        .find(|t| t.name == tenant && a.session.sees(&t.name))
        .ok_or_else(|| err(StatusCode::NOT_FOUND, format!("no tenant named {tenant:?}")))?;
    let endpoints: Vec<_> = snap.endpoints.iter().filter(|e| e.tenant == tenant).collect();
    Ok(Json(serde_json::json!({
        "sampled_at": snap.sampled_at,
        "tenant": row,
        "branches": snap.branches.get(&tenant).cloned().unwrap_or_default(),
        "endpoints": endpoints,
    })))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphQuery {
    range: Option<String>,
    tenant: Option<String>,
}

/// `GET /api/graphs?range=hour|day[&tenant=T]`.
async fn graphs(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Query(q): Query<GraphQuery>,
) -> Answer<serde_json::Value> {
    let day = match q.range.as_deref() {
        None | Some("hour") => false,
        Some("day") => true,
        Some(other) => return Err(err(StatusCode::BAD_REQUEST, format!("range {other:?}: hour or day"))),
    };
    let tenant = q.tenant.filter(|t| !t.is_empty());
    match &tenant {
        Some(t) if !a.session.sees(t) => return Err(err(StatusCode::NOT_FOUND, format!("no tenant named {t:?}"))),
        None if a.session.tenants.is_some() => {
            return Err(err(StatusCode::FORBIDDEN, "choose one of your tenants (tenant=…)"));
        }
        _ => {}
    }
    let now = strata_service::auth::now();
    let step = if day { crate::limits::DAY_SLOT_SECS } else { crate::limits::SAMPLE_INTERVAL.as_secs() };
    Ok(Json(serde_json::json!({
        "range": if day { "day" } else { "hour" },
        "step_secs": step,
        "now": now,
        "tenant": tenant,
        "series": c.history.query(tenant.as_deref(), day, now),
    })))
}

/// Runs an action as `a`'s, records it, and answers once the views show it.
async fn act(c: &Shared, a: &Authed, tenant: &str, action: Action) -> Answer<serde_json::Value> {
    if !a.session.sees(tenant) {
        return Err(err(StatusCode::NOT_FOUND, format!("no tenant named {tenant:?}")));
    }
    let what = action.describe();
    let root = c.root.clone();
    let before = c.snapshots.current().sampled_at;
    let outcome = tokio::task::spawn_blocking(move || actions::run(&root, &action))
        .await
        .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    c.snapshots.refresh();
    match outcome {
        Ok(lines) => {
            // The answer carries a new endpoint's connection string with its
            // password, for the operator who started it; the log never does.
            audit::finished("http", &what, true, &redact_passwords(&lines.join("; ")), a.who());
            let snapshots = c.snapshots.clone();
            let _ = tokio::task::spawn_blocking(move || {
                snapshots.wait_newer(before.max(strata_service::auth::now()), std::time::Duration::from_secs(20))
            })
            .await;
            Ok(Json(serde_json::json!({ "lines": lines })))
        }
        Err(e) => {
            audit::finished("http", &what, false, &e.to_string(), a.who());
            let status = match e {
                strata_control_plane::Error::Usage(_) => StatusCode::BAD_REQUEST,
                strata_control_plane::Error::Failed(_) => StatusCode::CONFLICT,
            };
            Err(err(status, e.to_string()))
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewBranch {
    name: String,
    parent: Option<String>,
    at: Option<String>,
    at_time: Option<String>,
}

async fn create_branch(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Path(tenant): Path<String>,
    Json(b): Json<NewBranch>,
) -> Answer<serde_json::Value> {
    let blank = |s: Option<String>| s.filter(|x| !x.trim().is_empty());
    let action = Action::CreateBranch {
        tenant: tenant.clone(),
        name: b.name,
        parent: blank(b.parent).unwrap_or_else(|| "main".into()),
        at: blank(b.at),
        at_time: blank(b.at_time),
    };
    act(&c, &a, &tenant, action).await
}

async fn reset_branch(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Path((tenant, branch)): Path<(String, String)>,
) -> Answer<serde_json::Value> {
    act(&c, &a, &tenant.clone(), Action::ResetBranch { tenant, name: branch }).await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewEndpoint {
    name: String,
    branch: Option<String>,
    replica_of: Option<String>,
    suspend_after_secs: Option<u64>,
}

async fn new_endpoint(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Path(tenant): Path<String>,
    Json(e): Json<NewEndpoint>,
) -> Answer<serde_json::Value> {
    let replica_of = e.replica_of.filter(|r| !r.is_empty());
    // A replica follows an endpoint of the same tenant.
    if let Some(of) = &replica_of {
        let snap = c.snapshots.current();
        if !snap.endpoints.iter().any(|x| &x.name == of && x.tenant == tenant) {
            return Err(err(StatusCode::NOT_FOUND, format!("no endpoint {of:?} in tenant {tenant}")));
        }
    }
    let action = Action::StartNew {
        tenant: tenant.clone(),
        name: e.name,
        branch: e.branch.filter(|b| !b.is_empty()).unwrap_or_else(|| "main".into()),
        replica_of,
        suspend_after_secs: e.suspend_after_secs,
    };
    act(&c, &a, &tenant, action).await
}

/// The tenant of endpoint `name`, from the views (or the workdir, for one made a moment ago).
async fn tenant_of_endpoint(c: &Shared, name: &str) -> Result<String, ApiError> {
    if let Some(e) = c.snapshots.current().endpoints.iter().find(|e| e.name == name) {
        return Ok(e.tenant.clone());
    }
    let root = c.root.clone();
    let n = name.to_string();
    let found = tokio::task::spawn_blocking(move || {
        let wd = strata_control_plane::layout::Workdir::open(&root).ok()?;
        strata_control_plane::endpoint::inventory(&wd)
            .ok()?
            .into_iter()
            .find(|r| r.file.name == n)
            .map(|r| r.file.tenant)
    })
    .await
    .ok()
    .flatten();
    found.ok_or_else(|| err(StatusCode::NOT_FOUND, format!("no endpoint named {name:?}")))
}

async fn endpoint_action(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Path((endpoint, action)): Path<(String, String)>,
) -> Answer<serde_json::Value> {
    let tenant = tenant_of_endpoint(&c, &endpoint).await?;
    let name = endpoint;
    let action = match action.as_str() {
        "start" => Action::Start { name },
        "stop" => Action::Stop { name },
        "suspend" => Action::Suspend { name },
        "promote" => Action::Promote { name },
        other => return Err(err(StatusCode::NOT_FOUND, format!("no endpoint action {other:?}"))),
    };
    act(&c, &a, &tenant, action).await
}

/// `POST /api/sql`.
async fn run_sql(
    State(c): State<Shared>,
    Extension(a): Extension<Authed>,
    Json(req): Json<sql::SqlRequest>,
) -> Response {
    if req.sql.len() > crate::limits::SQL_MAX_TEXT {
        return err(StatusCode::PAYLOAD_TOO_LARGE, format!("at most {} bytes of SQL", crate::limits::SQL_MAX_TEXT))
            .into_response();
    }
    let tenant = match tenant_of_endpoint(&c, &req.endpoint).await {
        Ok(t) if a.session.sees(&t) => t,
        Ok(_) | Err(_) => {
            return err(StatusCode::NOT_FOUND, format!("no endpoint named {:?}", req.endpoint)).into_response()
        }
    };
    let what = format!("sql on {} ({tenant})", req.endpoint);
    let (root, name) = (c.root.clone(), req.endpoint.clone());
    let target = match tokio::task::spawn_blocking(move || sql::target(&root, &name)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return err(StatusCode::CONFLICT, e).into_response(),
        Err(e) => return err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let timeout = sql::timeout_of(req.timeout_secs);
    // The statements themselves are not recorded (they may hold data); who ran what where is.
    let outcome = sql::run(target, &req.endpoint, &req.sql, timeout).await;
    c.snapshots.refresh();
    match outcome {
        Ok(answer) => {
            audit::finished("http", &what, true, &format!("{} results", answer.results.len()), a.who());
            Json(answer).into_response()
        }
        Err(e) => {
            audit::finished("http", &what, false, &e.error, a.who());
            (StatusCode::BAD_REQUEST, Json(e)).into_response()
        }
    }
}

/// `text` with the password of every connection URL in it (`scheme://user:PASSWORD@`) replaced.
pub fn redact_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        // The authority ends at the first '/', '?', '#' or white space.
        let end = after.find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace()).unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@').and_then(|at| authority[..at].find(':').map(|colon| (colon, at))) {
            Some((colon, at)) => {
                out.push_str(&authority[..colon]);
                out.push_str(":(password)");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `GET /api/audit`: the newest entries of the console's audit log.
async fn audit_view(State(c): State<Shared>) -> Answer<serde_json::Value> {
    let path = c.root.join(users::CONSOLE_DIR).join(AUDIT_FILE);
    let entries = tokio::task::spawn_blocking(move || tail_lines(&path, crate::limits::AUDIT_VIEW_LINES))
        .await
        .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let entries: Vec<serde_json::Value> = entries.iter().filter_map(|l| serde_json::from_str(l).ok()).rev().collect();
    Ok(Json(serde_json::json!({ "entries": entries })))
}

/// The last `n` lines of a file, read from its last 512 KiB.
fn tail_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(512 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut text = String::new();
    if f.take(512 * 1024).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    lines.iter().rev().take(n).rev().map(|s| s.to_string()).collect()
}

async fn metrics(State(c): State<Shared>) -> Response {
    let mut text = strata_service::metrics::render(&c.metrics);
    if let Some(stripped) = text.strip_suffix("# EOF\n") {
        text = stripped.to_string();
    }
    let snap = c.snapshots.current();
    text.push_str(&format!(
        "# HELP strata_console_sessions Sessions alive\n# TYPE strata_console_sessions gauge\nstrata_console_sessions {}\n\
         # HELP strata_console_series Series of the graphs' history\n# TYPE strata_console_series gauge\nstrata_console_series {}\n\
         # HELP strata_console_snapshot_time Unix seconds of the views' last reading of the cluster\n# TYPE strata_console_snapshot_time gauge\nstrata_console_snapshot_time {}\n# EOF\n",
        c.sessions.count(),
        c.history.series_count(),
        snap.sampled_at
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn status(State(c): State<Shared>) -> Json<serde_json::Value> {
    let snap = c.snapshots.current();
    Json(serde_json::json!({
        "sessions": c.sessions.count(),
        "snapshot_at": snap.sampled_at,
        "snapshot_error": snap.error,
        "snapshot_seconds": snap.read_seconds,
        "tenants": snap.tenants.len(),
        "series": c.history.series_count(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_connection_urls_are_redacted() {
        let line = "endpoint e: running; postgresql://app:s3cret@127.0.0.1:5432/postgres?sslmode=verify-full and \
                    postgresql://app@10.0.0.1:5/x; https://host/path";
        let out = redact_passwords(line);
        assert!(!out.contains("s3cret"), "{out}");
        assert!(out.contains("postgresql://app:(password)@127.0.0.1:5432/postgres?sslmode=verify-full"));
        assert!(out.contains("postgresql://app@10.0.0.1:5/x") && out.contains("https://host/path"));
        assert_eq!(redact_passwords("no url here"), "no url here");
        assert_eq!(redact_passwords("x://a:b@"), "x://a:(password)@");
    }

    #[test]
    fn only_a_well_formed_session_cookie_is_read() {
        let id = "ab".repeat(32);
        assert_eq!(cookie_of([format!("a=1; strata_console={id}").as_str()].into_iter()), Some(id.clone()));
        assert_eq!(cookie_of(["strata_console=zz"].into_iter()), None);
        assert_eq!(cookie_of(["other=1", ""].into_iter()), None);
        assert_eq!(cookie_of([format!("strata_console={id}x").as_str()].into_iter()), None);
    }
}
