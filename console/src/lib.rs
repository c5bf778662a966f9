//! `strata console`: the cluster as a web page (`docs/console.md`).
//!
//! It runs where the CLI runs, with the workdir and its keys: its views
//! come from the same status the CLI prints, its actions are the CLI's
//! operations, and it signs its calls to the services as the CLI does. It
//! serves HTTPS only, with a certificate of the cluster's CA, to sessions
//! of a management token or of a user `strata console user add` made.

pub mod actions;
mod assets;
pub mod history;
pub mod limits;
pub mod sessions;
pub mod snapshot;
mod sql;
pub mod users;
mod web;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_control_plane::{certs, keys};
use strata_service::start::{http_listener, serve_http, stop_signal, Security};
use tracing::{info, warn};

/// Where it remembers its address.
const CONFIG_FILE: &str = "console.toml";

/// What `strata console` was asked.
#[derive(Clone, Debug)]
pub struct ConsoleOptions {
    pub workdir: PathBuf,
    /// Where to listen (default: the address it listened on last, else a
    /// free port on 127.0.0.1).
    pub listen: Option<SocketAddr>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsoleFile {
    listen: SocketAddr,
}

/// The console's directory in the workdir at `root`.
pub fn console_dir(root: &Path) -> PathBuf {
    root.join(users::CONSOLE_DIR)
}

/// The address to listen on, remembered for the next start.
fn listen_address(dir: &Path, given: Option<SocketAddr>) -> Result<SocketAddr, String> {
    let path = dir.join(CONFIG_FILE);
    let addr = match (given, std::fs::read_to_string(&path)) {
        (Some(a), _) => a,
        (None, Ok(text)) => {
            toml::from_str::<ConsoleFile>(&text).map_err(|e| format!("{}: {e}", path.display()))?.listen
        }
        (None, Err(_)) => {
            let port = strata_service::ports::allocate(1, &[]).map_err(|e| format!("a free port: {e}"))?[0];
            SocketAddr::from(([127, 0, 0, 1], port))
        }
    };
    let text = toml::to_string(&ConsoleFile { listen: addr }).expect("the config serializes");
    strata_service::durable::replace_file_with_mode(&path, text.as_bytes(), true, 0o600).map_err(|e| e.to_string())?;
    Ok(addr)
}

/// The console's certificate for `addr` (and loopback's names), issued by
/// the cluster's CA when missing or made for another address.
fn server_tls(root: &Path, dir: &Path, addr: SocketAddr) -> Result<strata_service::tls::ServerTls, String> {
    let (cert, key) = (dir.join("tls.pem"), dir.join("tls.key"));
    let names_file = dir.join("tls.names");
    let mut names = vec![addr.ip().to_string()];
    if addr.ip().is_loopback() || addr.ip().is_unspecified() {
        names.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
    }
    names.dedup();
    let wanted = names.join(",");
    let current = std::fs::read_to_string(&names_file).unwrap_or_default();
    if !cert.exists() || !key.exists() || current.trim() != wanted {
        let (c, k) = certs::issue_names_of(root, &names).map_err(|e| e.to_string())?;
        strata_service::auth::write_secret(&key, &k).map_err(|e| e.to_string())?;
        strata_service::durable::replace_file_with_mode(&cert, c.as_bytes(), true, 0o644).map_err(|e| e.to_string())?;
        strata_service::durable::replace_file_with_mode(&names_file, wanted.as_bytes(), true, 0o600)
            .map_err(|e| e.to_string())?;
    }
    strata_service::tls::ServerTls::load(&cert, &key).map_err(|e| e.to_string())
}

/// Serves the console until SIGTERM or SIGINT.
pub fn serve(options: ConsoleOptions) -> Result<(), String> {
    let mut events = Vec::new();
    let wd = strata_control_plane::open(&options.workdir, &mut events).map_err(|e| e.to_string())?;
    let root = wd.root.clone();
    // HTTPS and tokens or nothing: a cluster made without them has no
    // CA to certify the console and no key to check its logins.
    if certs::client(&root).map_err(|e| e.to_string())?.is_none() || keys::signer(&root).ok().flatten().is_none() {
        return Err(format!(
            "{}: the console serves HTTPS with the cluster's CA and checks its keys; this workdir has no CA or no \
             signing key (a cluster made with --insecure-loopback, or a host without the keys)",
            root.display()
        ));
    }
    let verifier = Arc::new(
        strata_service::auth::Verifier::load(&keys::public_key(&root))
            .map_err(|e| format!("the cluster's keys: {e}"))?,
    );
    let dir = console_dir(&root);
    users::create_private_dir(&dir)?;
    let addr = listen_address(&dir, options.listen)?;
    let tls = server_tls(&root, &dir, addr)?;
    strata_service::audit::open(&dir.join(web::AUDIT_FILE), "console").map_err(|e| format!("the audit log: {e}"))?;
    if users::load(&root)?.is_empty() {
        info!("no console users yet: log in with a management token, or add one with `strata console user add`");
    }

    let snapshots = snapshot::Snapshots::new(root.clone());
    snapshots.read_now();
    let history = history::History::open(dir.join("history.json"));
    // The snapshot thread opens the workdir every few seconds, which mints
    // the management token of the calls to the services again before its
    // hour ends (`keys::use_management_token`).
    spawn("console-snapshots", {
        let s = snapshots.clone();
        move || s.run()
    })?;
    spawn("console-sampler", {
        let (r, h, s) = (root.clone(), history.clone(), snapshots.clone());
        move || history::run_sampler(r, h, s)
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("console")
        .enable_all()
        .build()
        .map_err(|e| format!("the runtime: {e}"))?;
    let kept = history.clone();
    runtime.block_on(async move {
        let stop = stop_signal().map_err(|e| e.to_string())?;
        let mut registry = prometheus_client::registry::Registry::default();
        let listeners = strata_service::ListenerMetrics::register(&mut registry);
        let registry = Arc::new(registry);
        let security = Security { server_tls: Some(tls), ..Default::default() };
        let console = Arc::new(web::Console {
            root: root.clone(),
            sessions: sessions::Sessions::default(),
            snapshots,
            history: history.clone(),
            verifier,
            metrics: registry,
        });
        let listener = strata_service::listener::listen(addr).map_err(|e| format!("binding {addr}: {e}"))?;
        let listener =
            http_listener(listener, limits::MAX_CONNECTIONS, limits::HANDSHAKE_TIMEOUT, &listeners, &security);
        let server = tokio::spawn(serve_http(listener, web::router(console)));
        info!(%addr, "console listening");
        println!("console: https://{addr}/");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        stop.await;
        server.abort();
        Ok::<(), String>(())
    })?;
    if let Err(e) = kept.save() {
        warn!("saving the graphs' history: {e}");
    }
    Ok(())
}

/// The fuzz target's entry (`fuzz/`): the console's readers of text it did
/// not write — metrics of the services, `Cookie` headers — and the
/// redaction of passwords in what it logs, on arbitrary bytes.
pub fn fuzz_one(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let metrics = history::parse_metrics(&text);
    assert!(metrics.len() <= text.lines().count());
    let _ = web::cookie_of(text.lines());
    let redacted = web::redact_passwords(&text);
    // Redaction only ever replaces a password: what is left is the same
    // text around it, and doing it again changes nothing.
    assert_eq!(web::redact_passwords(&redacted), redacted);
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
    std::thread::Builder::new().name(name.into()).spawn(f).map(|_| ()).map_err(|e| format!("a thread: {e}"))
}
