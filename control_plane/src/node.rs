//! `strata node`: one host's part of a cluster (`docs/deployment.md`).
//!
//! The node starts the host's services, each under its supervisor as
//! `strata start` would, starts any of them again whose supervisor is gone,
//! and serves an API (TLS, management tokens) through which a CLI on any
//! other machine starts and stops the host's services and endpoints and
//! reads their state. SIGTERM or SIGINT stops the host's endpoints, then
//! its services, then the node.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use strata_protocol::api::ErrorBody;
use strata_service::auth::http::{guard, HttpAuth, Need, RefusalMetrics};
use strata_service::auth::Verifier;
use strata_service::start::{http_listener, serve_http, stop_signal, Security};
use tracing::{error, info, warn};

use super::endpoint::{self, EndpointRecord, LaunchRequest};
use super::error::{Error, Result};
use super::hosts::{EndpointRequest, Lines, ServicesRequest};
use super::layout::{Service, Workdir};
use super::report::{self, Event};
use super::supervisor::Liveness;
use super::{hosts, services, status};
use crate::limits::{NODE_HANDSHAKE_TIMEOUT, NODE_MAX_CONNECTIONS, WATCH_INTERVAL};

/// `strata node`: what it runs.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The cluster's directory on this host (a copy of the one `strata
    /// init` wrote, at the same path on every host).
    pub workdir: PathBuf,
    /// The host this is (default: the host whose address is this machine's).
    pub host: Option<String>,
}

/// The node's state shared by its handlers.
#[derive(Clone)]
struct Node {
    root: PathBuf,
    host: String,
    /// Services to keep running: all of the host's, less those stopped through the API.
    wanted: Arc<Mutex<BTreeSet<String>>>,
}

type Answer<T> = std::result::Result<Json<T>, (StatusCode, Json<ErrorBody>)>;

/// What an operation of the node reported: to its log, since nobody waits
/// on its output (warnings as warnings).
fn log_events(events: Vec<Event>) {
    for e in events {
        if e.is_notice() {
            warn!("{e}");
        } else {
            info!("{e}");
        }
    }
}

/// The lines of the node's answer; warnings go to its log.
fn answer_lines(events: Vec<Event>) -> Lines {
    Lines { lines: report::lines(events, |e| warn!("{e}")) }
}

fn refused(e: Error) -> (StatusCode, Json<ErrorBody>) {
    let status = match e {
        Error::Usage(_) => StatusCode::BAD_REQUEST,
        Error::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(ErrorBody { error: e.to_string() }))
}

impl Node {
    /// The workdir as it is now (a command may have changed it).
    fn workdir(&self) -> Result<Workdir> {
        Workdir::open(&self.root)
    }

    /// The named services, each of which must run on this host.
    fn own<'a>(&self, wd: &'a Workdir, names: &[String]) -> Result<Vec<&'a Service>> {
        names
            .iter()
            .map(|n| match wd.service(n) {
                Some(s) if s.host == self.host => Ok(s),
                Some(s) => Err(Error::Usage(format!("{n} runs on host {}, not {}", s.host, self.host))),
                None => Err(Error::Usage(format!("no service named {n:?}"))),
            })
            .collect()
    }

    /// Runs `f` on a blocking thread with the workdir, and its lock unless
    /// `f` only reads.
    async fn blocking<T: Send + 'static>(
        &self,
        lock: bool,
        f: impl FnOnce(&Node, &Workdir) -> Result<T> + Send + 'static,
    ) -> Answer<T> {
        let node = self.clone();
        let out = tokio::task::spawn_blocking(move || {
            let wd = node.workdir()?;
            let _lock = if lock { Some(wd.lock(|| info!("waiting for another command's lock"))?) } else { None };
            f(&node, &wd)
        })
        .await
        .map_err(|e| refused(Error::Failed(format!("the node's worker failed: {e}"))))?;
        out.map(Json).map_err(refused)
    }

    /// Starts every wanted service whose supervisor is gone (at the node's
    /// start: all of them), kind by kind as `strata start` does, all of a
    /// kind at once.
    fn keep_running(&self) -> Result<()> {
        let wd = self.workdir()?;
        let _lock = wd.lock(|| info!("waiting for another command's lock"))?;
        let wanted = self.wanted.lock().expect("not poisoned").clone();
        let gone: Vec<&Service> = wd
            .cluster
            .services
            .iter()
            .filter(|s| wanted.contains(&s.name))
            .filter(|s| {
                let liveness = services::supervised(&wd, s).liveness();
                !matches!(liveness, Liveness::Running { supervisor: Some(_), .. } | Liveness::Restarting { .. })
            })
            .collect();
        for group in services::by_kind(gone) {
            let outcomes = services::at_once(&wd, &group, true, |s, events| services::start_one(&wd, s, events));
            for (s, (events, result)) in group.iter().zip(outcomes) {
                log_events(events);
                if let Err(e) = result {
                    error!(service = %s.name, "starting it: {e}");
                }
            }
        }
        Ok(())
    }

    /// Stops the host's endpoints, then its services (pageserver first).
    fn stop_all(&self) -> Result<()> {
        let wd = self.workdir()?;
        let _lock = wd.lock(|| info!("waiting for another command's lock"))?;
        let mut events = Vec::new();
        let endpoints = endpoint::stop_all(&wd, false, &mut events);
        let names: Vec<String> =
            wd.cluster.services.iter().filter(|s| s.host == self.host).map(|s| s.name.clone()).collect();
        let services = services::stop(&wd, &names, false, &mut events);
        log_events(events);
        endpoints.and(services)
    }
}

async fn host_status(State(node): State<Node>) -> Answer<status::HostStatus> {
    node.blocking(false, |node, wd| status::host_part(wd, &node.host)).await
}

async fn start_services(State(node): State<Node>, Json(req): Json<ServicesRequest>) -> Answer<Lines> {
    node.blocking(true, move |node, wd| {
        // What the start did goes to the node's log: the caller says where it runs.
        for s in node.own(wd, &req.names)? {
            let mut events = Vec::new();
            let started = services::start_one(wd, s, &mut events);
            log_events(events);
            started?;
            node.wanted.lock().expect("not poisoned").insert(s.name.clone());
        }
        Ok(Lines::default())
    })
    .await
}

async fn stop_services(State(node): State<Node>, Json(req): Json<ServicesRequest>) -> Answer<Lines> {
    node.blocking(true, move |node, wd| {
        let own = node.own(wd, &req.names)?;
        for s in &own {
            node.wanted.lock().expect("not poisoned").remove(&s.name);
        }
        let mut lines = Vec::new();
        for s in own {
            lines.push(services::stop_local(wd, s, req.immediate)?.to_string());
        }
        Ok(Lines { lines })
    })
    .await
}

async fn list_endpoints(State(node): State<Node>) -> Answer<Vec<EndpointRecord>> {
    node.blocking(false, |_, wd| endpoint::records(wd)).await
}

async fn start_endpoint(State(node): State<Node>, Json(req): Json<LaunchRequest>) -> Answer<Lines> {
    node.blocking(true, move |node, wd| {
        if req.host != node.host {
            return Err(Error::Usage(format!("endpoint {} is for host {}, this is {}", req.name, req.host, node.host)));
        }
        let mut events = Vec::new();
        endpoint::launch(wd, &req, &mut events)?;
        Ok(answer_lines(events))
    })
    .await
}

async fn stop_endpoint(State(node): State<Node>, Json(req): Json<EndpointRequest>) -> Answer<Lines> {
    node.blocking(true, move |_, wd| {
        let mut events = Vec::new();
        let stopped = endpoint::stop_local(wd, &req.name, req.immediate, &mut events)?;
        events.push(stopped.into());
        Ok(answer_lines(events))
    })
    .await
}

async fn forget_endpoint(State(node): State<Node>, Json(req): Json<EndpointRequest>) -> Answer<endpoint::Forgotten> {
    node.blocking(true, move |_, wd| {
        let mut events = Vec::new();
        let forgotten = endpoint::forget(wd, &req.name, &mut events);
        log_events(events);
        forgotten
    })
    .await
}

async fn endpoint_password(State(node): State<Node>, Json(req): Json<EndpointRequest>) -> Answer<endpoint::Password> {
    node.blocking(false, move |_, wd| endpoint::password_of(wd, &req.name)).await
}

/// An endpoint's verifier without its password: what the proxy holds.
async fn endpoint_verifier(State(node): State<Node>, Json(req): Json<EndpointRequest>) -> Answer<endpoint::Password> {
    node.blocking(false, move |_, wd| {
        endpoint::password_of(wd, &req.name).map(|p| endpoint::Password { password: None, verifier: p.verifier })
    })
    .await
}

async fn get_spec(State(node): State<Node>) -> Answer<hosts::Spec> {
    node.blocking(false, |_, wd| hosts::spec(wd)).await
}

/// What `POST /v1/spec` did.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct SpecTaken {
    /// The host's revision now.
    pub revision: u64,
    pub taken: bool,
}

async fn put_spec(State(node): State<Node>, Json(spec): Json<hosts::Spec>) -> Answer<SpecTaken> {
    node.blocking(true, move |_, wd| {
        let taken = hosts::adopt(wd, &spec)?;
        if taken {
            info!(revision = spec.revision, "took a new revision of the cluster's state");
        }
        Ok(SpecTaken { revision: wd.cluster.revision.max(if taken { spec.revision } else { 0 }), taken })
    })
    .await
}

/// The node API: every route needs a management token.
fn router(node: Node, auth: Option<&HttpAuth>) -> Router {
    let routes = Router::new()
        .route("/v1/status", get(host_status))
        .route("/v1/services/start", post(start_services))
        .route("/v1/services/stop", post(stop_services))
        .route("/v1/endpoints", get(list_endpoints))
        .route("/v1/endpoints/start", post(start_endpoint))
        .route("/v1/endpoints/stop", post(stop_endpoint))
        .route("/v1/endpoints/forget", post(forget_endpoint))
        .route("/v1/endpoints/password", post(endpoint_password))
        .route("/v1/endpoints/verifier", post(endpoint_verifier))
        .route("/v1/spec", get(get_spec).post(put_spec))
        .with_state(node);
    guard(routes, auth, Need::Management)
}

/// What the node serves with: its state, where it listens, its TLS and
/// the verifier of callers' tokens.
struct Prepared {
    node: Node,
    addr: SocketAddr,
    tls: Option<strata_service::tls::ServerTls>,
    verifier: Option<Arc<Verifier>>,
}

/// Finds this host in the workdir and loads its TLS and keys; refuses to
/// serve beyond loopback without them.
fn prepare(args: &NodeOptions) -> Result<Prepared> {
    // The node runs for months: it calls its services with the services'
    // token, which does not expire, not the CLI's management token of an
    // hour (set first: the first token set is the process's). It follows
    // the file: a key's rotation signs it again.
    let service_token = super::keys::service_token(&args.workdir);
    if service_token.exists() {
        let token = strata_service::auth::load_token(&service_token).map_err(|e| Error::Failed(e.to_string()))?;
        super::http::use_token(token);
    }
    let wd = Workdir::open(&args.workdir)?;
    let host = match &args.host {
        Some(name) => hosts::host(&wd, name)?.clone(),
        None => hosts::this_host(&wd)?
            .cloned()
            .ok_or_else(|| Error::Usage("no host of the cluster has this machine's address: give --host".into()))?,
    };
    let addr = SocketAddr::new(host.address, host.node_port);
    let tls = match super::certs::client(&wd.root)? {
        Some(_) => {
            let files = super::certs::service_tls(&wd.root, &host.address.to_string());
            Some(
                strata_service::tls::ServerTls::load(&files.cert, &files.key)
                    .map_err(|e| Error::Failed(format!("host {}: {e}", host.name)))?,
            )
        }
        None => None,
    };
    let public_key = super::keys::public_key(&wd.root);
    let verifier = match public_key.exists() {
        true => Some(Arc::new(Verifier::load(&public_key).map_err(|e| Error::Failed(e.to_string()))?)),
        false => None,
    };
    if !host.is_loopback() && (tls.is_none() || verifier.is_none()) {
        return Err(Error::Failed(format!(
            "host {} is at {}: beyond loopback the node API needs the cluster's TLS and keys",
            host.name, host.address
        )));
    }
    let node = Node {
        root: wd.root.clone(),
        host: host.name.clone(),
        wanted: Arc::new(Mutex::new(
            wd.cluster.services.iter().filter(|s| s.host == host.name).map(|s| s.name.clone()).collect(),
        )),
    };
    Ok(Prepared { node, addr, tls, verifier })
}

/// `strata node`: serves until SIGTERM or SIGINT.
pub fn serve(args: NodeOptions) -> Result<()> {
    let Prepared { node, addr, tls, verifier } = prepare(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Failed(format!("a runtime: {e}")))?;
    runtime.block_on(async move {
        let mut registry = Registry::with_prefix("strata_node");
        let listeners = strata_service::ListenerMetrics::register(&mut registry);
        let refusals = RefusalMetrics::register(&mut registry);
        let security = Security { server_tls: tls, verifier, ..Default::default() };
        let auth = security.http_auth(refusals);
        let stop = stop_signal().map_err(|e| Error::Failed(e.to_string()))?;
        let listener =
            strata_service::listener::listen(addr).map_err(|e| Error::Failed(format!("binding {addr}: {e}")))?;
        let listener = http_listener(listener, NODE_MAX_CONNECTIONS, NODE_HANDSHAKE_TIMEOUT, &listeners, &security);
        let server = tokio::spawn(serve_http(listener, router(node.clone(), auth.as_ref())));
        info!(host = %node.host, %addr, "node API listening");

        let watcher = node.clone();
        let watch = tokio::task::spawn_blocking(move || {
            // The host's services, then a look every few seconds.
            loop {
                if let Err(e) = watcher.keep_running() {
                    warn!("keeping the host's services running: {e}");
                }
                std::thread::sleep(WATCH_INTERVAL);
                if STOPPING.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
            }
        });
        stop.await;
        info!(host = %node.host, "stopping the host's endpoints and services");
        STOPPING.store(true, std::sync::atomic::Ordering::Release);
        let _ = watch.await;
        server.abort();
        let stopper = node.clone();
        tokio::task::spawn_blocking(move || stopper.stop_all())
            .await
            .map_err(|e| Error::Failed(format!("stopping: {e}")))?
    })
}

/// Set once the node stops, so its watcher starts nothing more.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
