//! Endpoints: a compute (stock PostgreSQL plus the `strata compute start`
//! agent, under its supervisor) on a branch, each in `endpoints/<name>/`
//! with its remembered ports.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use strata_compute::agent::postgres;
use strata_protocol::api::compute::{AgentState, AgentStatus, ComputeStatus};
use strata_protocol::api::pageserver::LsnResponse;
use strata_service::auth::{Claims, Scope};

use super::args::AgentArgs;
use super::error::{failed, Error, Result};
use super::layout::{self, Kind, Workdir, HOST, MAIN_BRANCH};
use super::process::{self, Identity};
use super::supervisor::{Liveness, Supervised};
use super::{http, services};
use strata_service::ports;

/// Longest an agent may take from spawn to a running PostgreSQL (it may
/// sync the safekeepers, wait for the pageserver and restore a basebackup).
const START_WAIT: Duration = Duration::from_secs(120);
/// Longest an agent may take to stop: PostgreSQL shuts down and its last
/// WAL reaches the safekeepers.
const STOP_GRACE: Duration = Duration::from_secs(60);
/// Longest a PostgreSQL left behind by a dead agent gets to shut down.
const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// Log lines shown when an endpoint fails to start.
const TAIL_LINES: usize = 30;
/// File name of an endpoint's settings inside its directory.
const ENDPOINT_FILE: &str = "endpoint.toml";
/// The agent's tenant token (mode 0600), beside `endpoint.toml`.
const AGENT_TOKEN_FILE: &str = "agent.token";
/// The password clients log in with (mode 0600), beside `endpoint.toml`.
const PASSWORD_FILE: &str = "password";

/// `endpoints/<name>/endpoint.toml`: what a restart reuses.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointFile {
    pub name: String,
    /// The branch (name in `cluster.toml`) it runs on.
    pub branch: String,
    /// PostgreSQL's port on 127.0.0.1.
    pub pg_port: u16,
    /// The agent's HTTP API port on 127.0.0.1.
    pub http_port: u16,
    /// A read-only compute pinned to this LSN of its branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_at: Option<strata_formats::Lsn>,
    /// A lazy compute (`docs/lazy-compute.md`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    /// A lazy compute's cache size in MiB, when not the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_mb: Option<u64>,
    /// A lazy compute's fetch retry window in seconds, when not the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_retry_secs: Option<u64>,
}

/// An endpoint with its directory.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub dir: PathBuf,
    pub file: EndpointFile,
}

impl Endpoint {
    /// Its PostgreSQL data directory (written by the agent).
    pub fn pgdata(&self) -> PathBuf {
        self.dir.join("pgdata")
    }

    /// The agent's log (its own output and PostgreSQL's).
    pub fn log(&self) -> PathBuf {
        self.dir.join("compute.log")
    }

    /// How the agent process is recognised: `strata compute … <pgdata> …`.
    pub fn identity(&self) -> Identity {
        Identity { subcommand: "compute", marker: self.pgdata(), pidfile: self.dir.join("compute.pid") }
    }

    /// The agent with its supervisor.
    pub fn supervised(&self) -> Supervised {
        Supervised::new(format!("endpoint {}", self.file.name), self.identity(), self.log(), STOP_GRACE)
    }

    /// libpq connection string of its PostgreSQL, without the password.
    pub fn connstr(&self) -> String {
        format!("postgresql://postgres@{HOST}:{}/postgres", self.file.pg_port)
    }

    /// The connection string a client on this host uses: with the
    /// password, without TLS. Loopback traffic never leaves the kernel, and
    /// TLS on it costs PostgreSQL about an eighth of its pgbench throughput
    /// (`docs/security.md`, "Computes").
    pub fn local_connstr(&self, password: &str) -> String {
        // Generated passwords are letters and digits: nothing to escape.
        format!("postgresql://postgres:{password}@{HOST}:{}/postgres?sslmode=disable", self.file.pg_port)
    }

    /// The connection string over TLS, verified against `ca` (the
    /// cluster's CA): what a client on another host uses.
    pub fn tls_connstr(&self, password: &str, ca: &std::path::Path) -> String {
        format!(
            "postgresql://postgres:{password}@{HOST}:{}/postgres?sslmode=verify-full&sslrootcert={}",
            self.file.pg_port,
            uri_escape(&ca.to_string_lossy())
        )
    }

    /// The file with the password clients log in with.
    pub fn password_file(&self) -> PathBuf {
        self.dir.join(PASSWORD_FILE)
    }

    /// The agent's `/v1/status` URL.
    fn status_url(&self) -> String {
        format!("{}://{HOST}:{}/v1/status", super::http::scheme(), self.file.http_port)
    }

    /// What the agent and its WAL proposer report, if the agent answers.
    pub fn compute_status(&self) -> Option<ComputeStatus> {
        let r = http::get(&self.status_url(), http::QUICK).ok().filter(|r| r.status == 200)?;
        r.json::<ComputeStatus>().ok()
    }

    /// What the agent reports, if it answers.
    pub fn agent_view(&self) -> Option<AgentStatus> {
        self.compute_status().map(|s| s.agent)
    }
}

/// `text` with every byte outside RFC 3986's unreserved set and `/`
/// percent-encoded, for a path in a connection URI's query.
fn uri_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The endpoint's password, made at its first start: a new random one, or
/// for a read-only endpoint the one of its branch's primary endpoint, the
/// password its role most likely has at the LSN it reads (a primary sets
/// its password on the role; a read-only compute cannot).
fn ensure_password(wd: &Workdir, ep: &Endpoint) -> Result<String> {
    let read = |path: &std::path::Path| {
        fs::read_to_string(path).ok().and_then(|t| t.lines().next().map(str::to_string)).filter(|p| !p.is_empty())
    };
    let path = ep.password_file();
    if let Some(password) = read(&path) {
        return Ok(password);
    }
    let primary = || {
        let others = load_all(wd).ok()?;
        others
            .iter()
            .filter(|o| o.file.branch == ep.file.branch && o.file.read_only_at.is_none() && o.file.name != ep.file.name)
            .find_map(|o| read(&o.password_file()))
    };
    let password = match ep.file.read_only_at {
        Some(_) => primary().unwrap_or_else(strata_service::auth::generate_password),
        None => strata_service::auth::generate_password(),
    };
    strata_service::auth::write_secret(&path, &password).map_err(|e| Error::Failed(e.to_string()))?;
    Ok(password)
}

/// The LSN of `--at`: an LSN as given, or the branch's point at a time
/// (after every commit stamped by then), as the pageserver resolves it.
fn resolve_point(wd: &Workdir, branch: &layout::Branch, at: &str) -> Result<strata_formats::Lsn> {
    if let Ok(lsn) = at.parse::<strata_formats::Lsn>() {
        return Ok(lsn);
    }
    let time = super::args::parse_time(at, "--at")?;
    let ps = wd.cluster.pageserver();
    let url = format!(
        "{}/v1/tenant/{}/timeline/{}/lsn_by_time?time={}",
        ps.http_url(),
        wd.cluster.tenant_id,
        branch.timeline_id,
        time.replace('+', "%2B")
    );
    let r = http::get(&url, http::QUICK).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
    if r.status != 200 {
        return failed(format!("--at {at}: {} (HTTP {})", r.error_text(), r.status));
    }
    r.json::<LsnResponse>().map(|r| r.lsn).map_err(|e| Error::Failed(format!("{}: its LSN for {at}: {e}", ps.name)))
}

/// Endpoint names become directory names: keep them plain.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!("invalid endpoint name {name:?}: use letters, digits, '-' and '_' (at most 63)")))
    }
}

/// One endpoint, if it was ever started.
fn load(wd: &Workdir, name: &str) -> Result<Option<Endpoint>> {
    let dir = wd.endpoint_dir(name);
    let path = dir.join(ENDPOINT_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let file: EndpointFile = layout::read_toml(&path)?;
    Ok(Some(Endpoint { dir, file }))
}

/// Every endpoint, by name.
pub fn load_all(wd: &Workdir) -> Result<Vec<Endpoint>> {
    let dir = wd.endpoints_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return failed(format!("{}: {e}", dir.display())),
    };
    let mut all = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
        if let Some(name) = entry.file_name().to_str() {
            if let Some(ep) = load(wd, name)? {
                all.push(ep);
            }
        }
    }
    all.sort_by(|a, b| a.file.name.cmp(&b.file.name));
    Ok(all)
}

/// Chooses the endpoint's ports: the requested or remembered PostgreSQL port
/// (which must be free: clients know it), the remembered agent port if free,
/// else new ones clear of every port the cluster has handed out.
fn choose_ports(wd: &Workdir, name: &str, port: Option<u16>, old: Option<&EndpointFile>) -> Result<(u16, u16)> {
    let mut reserved = wd.cluster.ports();
    for ep in load_all(wd)? {
        if ep.file.name != name {
            reserved.extend([ep.file.pg_port, ep.file.http_port]);
        }
    }
    let pg_port = match port.or(old.map(|o| o.pg_port)) {
        Some(p) => {
            if reserved.contains(&p) {
                return failed(format!("port {p} belongs to another service or endpoint of this cluster"));
            }
            if !ports::is_free(p) {
                return failed(format!("endpoint {name}: port {p} is in use (choose another with --port)"));
            }
            p
        }
        None => ports::allocate(1, &reserved).map_err(|e| Error::Failed(format!("finding a free port: {e}")))?[0],
    };
    reserved.push(pg_port);
    let http_port = match old.map(|o| o.http_port) {
        Some(p) if p != pg_port && !reserved.contains(&p) && ports::is_free(p) => p,
        _ => ports::allocate(1, &reserved).map_err(|e| Error::Failed(format!("finding a free port: {e}")))?[0],
    };
    Ok((pg_port, http_port))
}

/// `strata endpoint start`: spawns the agent under its supervisor and
/// waits until PostgreSQL runs; the last line printed is the connection string.
pub fn start(
    wd: &Workdir,
    name: &str,
    branch: Option<&str>,
    port: Option<u16>,
    agent: &AgentArgs,
    at: Option<&str>,
) -> Result<()> {
    let old = load(wd, name)?;
    let branch_name = match (branch, &old) {
        (Some(b), Some(o)) if b != o.file.branch => {
            return failed(format!(
                "endpoint {name} runs on branch {}, not {b} (use a new endpoint name for another branch)",
                o.file.branch
            ))
        }
        (Some(b), _) => b.to_string(),
        (None, Some(o)) => o.file.branch.clone(),
        (None, None) => MAIN_BRANCH.to_string(),
    };
    let Some(branch) = wd.cluster.branch(&branch_name).cloned() else {
        let known: Vec<&str> = wd.cluster.branches.iter().map(|b| b.name.as_str()).collect();
        return failed(format!("no branch named {branch_name:?} (branches: {})", known.join(", ")));
    };
    if let Some(o) = &old {
        match o.supervised().liveness() {
            Liveness::Running { pid, supervisor: Some(_) } => {
                return failed(format!("endpoint {name} is already running (pid {pid}): {}", o.connstr()))
            }
            Liveness::Restarting { supervisor } => {
                return failed(format!(
                    "endpoint {name} is already running: its supervisor (pid {supervisor}) is restarting its agent"
                ))
            }
            Liveness::Running { pid, supervisor: None } => {
                // Never two agents on one data directory: stop it, start anew.
                println!(
                    "endpoint {name}: its agent (pid {pid}) runs without its supervisor; restarting it under a new one"
                );
                o.supervised().stop_unsupervised()?;
            }
            Liveness::Stopped => {}
        }
    }
    // Read-only at a point given now, or as it was before.
    let read_only_at = match at {
        Some(at) => Some(resolve_point(wd, &branch, at)?),
        None => old.as_ref().and_then(|o| o.file.read_only_at),
    };
    // One writer per timeline: a second PostgreSQL would fork its WAL.
    for other in load_all(wd)? {
        if read_only_at.is_some() || other.file.read_only_at.is_some() {
            continue;
        }
        if other.file.name != name && other.file.branch == branch_name {
            let liveness = other.supervised().liveness();
            if let Some(pid) = liveness.pid().or(liveness.supervisor()) {
                return failed(format!(
                    "endpoint {} (pid {pid}) already runs on branch {branch_name}; one writer per branch",
                    other.file.name
                ));
            }
        }
    }
    check_storage_runs(wd)?;
    // A PostgreSQL whose agent was killed still holds the port and pgdata.
    if let Some(o) = &old {
        stop_orphan_postgres(o, false)?;
    }

    // Lazy unless asked otherwise, now or at an earlier start of the endpoint.
    let lazy = agent.lazy || (!agent.eager && old.as_ref().is_none_or(|o| o.file.lazy));
    let cache_mb = agent.cache_mb.or(old.as_ref().and_then(|o| o.file.cache_mb));
    let fetch_retry_secs = agent.fetch_retry_secs.or(old.as_ref().and_then(|o| o.file.fetch_retry_secs));
    let (pg_port, http_port) = choose_ports(wd, name, port, old.as_ref().map(|o| &o.file))?;
    let dir = wd.endpoint_dir(name);
    fs::create_dir_all(&dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let ep = Endpoint {
        dir,
        file: EndpointFile {
            name: name.into(),
            branch: branch_name.clone(),
            pg_port,
            http_port,
            read_only_at,
            lazy,
            cache_mb,
            fetch_retry_secs,
        },
    };
    layout::write_toml(
        &ep.dir.join(ENDPOINT_FILE),
        "# Written by `strata endpoint start`; reused by restarts.\n",
        &ep.file,
    )?;

    let password = ensure_password(wd, &ep)?;
    let c = &wd.cluster;
    let ps = c.pageserver();
    let mut args: Vec<OsString> = vec![
        "compute".into(),
        "start".into(),
        "--pgdata".into(),
        ep.pgdata().into(),
        "--pg-port".into(),
        pg_port.to_string().into(),
        "--safekeepers".into(),
        c.safekeeper_addrs().join(",").into(),
        "--tenant-id".into(),
        c.tenant_id.to_string().into(),
        "--timeline-id".into(),
        branch.timeline_id.to_string().into(),
        "--pageserver-http".into(),
        ps.addr("http").unwrap_or_default().into(),
        "--http".into(),
        format!("{HOST}:{http_port}").into(),
        "--pg-bin-dir".into(),
        c.pg_bin_dir.clone().into(),
        "--pg-user".into(),
        c.pg_user.clone().into(),
        "--password-file".into(),
        ep.password_file().into(),
    ];
    if c.verify_redo {
        args.push("--verify-redo".into());
    }
    if let Some(signer) = super::keys::signer(&wd.root)? {
        // The agent's own token: this tenant's data only. Rewritten at every
        // start, so a new key takes effect with the next one.
        let token = signer.sign(&Claims::new(Scope::Tenant, Some(c.tenant_id), None));
        let path = ep.dir.join(AGENT_TOKEN_FILE);
        strata_service::auth::write_secret(&path, &token).map_err(|e| Error::Failed(e.to_string()))?;
        args.extend([
            "--auth-public-key".into(),
            super::keys::public_key(&wd.root).into(),
            "--token-file".into(),
            path.into(),
        ]);
    }
    if super::certs::client(&wd.root)?.is_some() {
        let host = super::certs::service_tls(&wd.root, HOST);
        args.extend([
            "--tls-ca".into(),
            host.ca.into(),
            "--tls-cert".into(),
            host.cert.into(),
            "--tls-key".into(),
            host.key.into(),
        ]);
    }
    if let Some(lsn) = read_only_at {
        args.extend(["--read-only-at".into(), lsn.to_string().into()]);
    }
    if lazy {
        args.extend(["--lazy-page-service".into(), ps.addr("pg").unwrap_or_default().into()]);
        if let Some(mb) = cache_mb {
            args.extend(["--lazy-cache-mb".into(), mb.to_string().into()]);
        }
        if let Some(secs) = fetch_retry_secs {
            args.extend(["--lazy-fetch-retry-secs".into(), secs.to_string().into()]);
        }
    }
    if let Some(size) = &agent.shared_buffers {
        args.extend(["--shared-buffers".into(), size.into()]);
    }
    if let Some(n) = agent.crash_loop_restarts {
        args.extend(["--crash-loop-restarts".into(), n.to_string().into()]);
    }
    if let Some(secs) = agent.crash_loop_window_secs {
        args.extend(["--crash-loop-window-secs".into(), secs.to_string().into()]);
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let exe = std::env::current_exe().map_err(|e| Error::Failed(format!("finding the strata binary: {e}")))?;
    let log = ep.log();
    let from = process::log_len(&log);
    let sv = ep.supervised();
    let mut child = sv.spawn(&exe, &args, &wd.root)?;

    // A failed start leaves nothing running: the agent (which stops its
    // PostgreSQL), its supervisor, and a PostgreSQL it could not stop.
    let abort = |child: &mut std::process::Child, why: String| {
        let _ = sv.stop(false);
        let _ = stop_orphan_postgres(&ep, true);
        let _ = child.try_wait();
        failed(format!("endpoint {name}: {why}\n{}", process::log_tail(&log, from, TAIL_LINES)))
    };
    let deadline = Instant::now() + START_WAIT;
    let mut last_state = String::from("(no answer)");
    let pid = loop {
        if let Some(why) = sv.start_failure(&mut child) {
            return abort(&mut child, format!("the compute agent {why} in state {last_state}"));
        }
        if let Some(view) = ep.agent_view() {
            match view.state {
                AgentState::Running => {
                    if let Some(pid) = sv.service.running() {
                        break pid;
                    }
                }
                AgentState::Failed => {
                    let error = view.error.unwrap_or_else(|| "(no error given)".into());
                    return abort(&mut child, format!("failed: {error}"));
                }
                other => last_state = other.name().to_string(),
            }
        }
        if Instant::now() > deadline {
            return abort(
                &mut child,
                format!("not running after {}s (last state: {last_state}); stopped it", START_WAIT.as_secs()),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "endpoint {name}: running on branch {branch_name} (timeline {}), agent pid {pid}, supervisor pid {}, log {}",
        branch.timeline_id,
        child.id(),
        log.display()
    );
    if super::certs::client(&wd.root)?.is_some() {
        println!("over TLS: {}", ep.tls_connstr(&password, &super::certs::ca_cert(&wd.root)));
    }
    // Last line: scripts take the connection string from here.
    println!("{}", ep.local_connstr(&password));
    Ok(())
}

/// A compute needs the pageserver (its basebackup) and a majority of the
/// safekeepers (its commits); say so now rather than time out later.
fn check_storage_runs(wd: &Workdir) -> Result<()> {
    let how = format!("start it with `strata start --workdir {}`", wd.root.display());
    let ps = wd.cluster.pageserver();
    if services::running(wd, ps).is_none() {
        return failed(format!("{} is not running; {how}", ps.name));
    }
    let sks: Vec<_> = wd.cluster.of_kind(Kind::Safekeeper).collect();
    let up = sks.iter().filter(|s| services::running(wd, s).is_some()).count();
    if up * 2 <= sks.len() {
        return failed(format!("only {up} of {} safekeepers run, a majority is needed; {how}", sks.len()));
    }
    Ok(())
}

/// The pid of a PostgreSQL running in the endpoint's pgdata while neither
/// its agent nor the agent's supervisor does (both were killed).
pub fn orphan_postgres(ep: &Endpoint) -> Option<i32> {
    if ep.supervised().liveness() != Liveness::Stopped {
        return None;
    }
    let pid = process::read_pid(&ep.pgdata().join("postmaster.pid"))?;
    (process::alive(pid) && process::comm(pid).as_deref() == Some("postgres")).then_some(pid)
}

/// Stops a PostgreSQL that outlived its agent, so nothing of a stopped
/// endpoint runs and a restart finds its port and pgdata free; then kills
/// any postgres process still running in the data directory (the
/// postmaster's children each lead their own session, so they are found by
/// their working directory).
fn stop_orphan_postgres(ep: &Endpoint, immediate: bool) -> Result<()> {
    if let Some(pid) = orphan_postgres(ep) {
        let is_postgres = || process::alive(pid) && process::comm(pid).as_deref() == Some("postgres");
        // SIGINT: fast shutdown.
        process::send(pid, if immediate { libc::SIGKILL } else { libc::SIGINT });
        if !process::wait_gone(is_postgres, ORPHAN_GRACE) {
            process::kill_group(pid);
            if !process::wait_gone(is_postgres, Duration::from_secs(10)) {
                return failed(format!("endpoint {}: PostgreSQL (pid {pid}) does not die", ep.file.name));
            }
        }
        println!("endpoint {}: stopped PostgreSQL (pid {pid}) left running by its agent", ep.file.name);
    }
    if ep.supervised().liveness() != Liveness::Stopped {
        return Ok(());
    }
    let pgdata = ep.pgdata();
    let left = || !postgres::processes_in(&pgdata).is_empty();
    for pid in postgres::processes_in(&pgdata) {
        process::send(pid, libc::SIGKILL);
    }
    if !process::wait_gone(left, Duration::from_secs(10)) {
        return failed(format!("endpoint {}: postgres processes in {} do not die", ep.file.name, pgdata.display()));
    }
    // A lazy compute's mounts outlive an agent that was killed.
    strata_compute::agent::lazy::detach_left_behind(&pgdata);
    // A deep data directory has its socket in a directory of its own in
    // the temporary directory: it goes with the processes that used it
    // (the next start makes it again).
    let sockets = strata_compute::agent::pgconf::socket_dir(&pgdata, ep.file.pg_port);
    if sockets != pgdata {
        match std::fs::remove_dir_all(&sockets) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("endpoint {}: removing socket directory {}: {e}", ep.file.name, sockets.display()),
        }
    }
    Ok(())
}

/// `strata endpoint stop`: SIGTERM to the supervisor, which passes it to
/// the agent (it stops PostgreSQL and flushes the WAL) and kills it after
/// the grace period. Idempotent.
pub fn stop(wd: &Workdir, name: &str, immediate: bool) -> Result<()> {
    let Some(ep) = load(wd, name)? else {
        let known: Vec<String> = load_all(wd)?.into_iter().map(|e| e.file.name).collect();
        return failed(format!(
            "no endpoint named {name:?} (endpoints: {})",
            if known.is_empty() { "none".into() } else { known.join(", ") }
        ));
    };
    stop_endpoint(&ep, immediate)
}

fn stop_endpoint(ep: &Endpoint, immediate: bool) -> Result<()> {
    let outcome = ep.supervised().stop(immediate)?;
    println!("endpoint {}: {}", ep.file.name, services::stop_message(outcome, immediate, STOP_GRACE));
    stop_orphan_postgres(ep, immediate)
}

/// Stops every endpoint (the first step of `strata stop`).
pub fn stop_all(wd: &Workdir, immediate: bool) -> Result<()> {
    let mut errors = Vec::new();
    for ep in load_all(wd)? {
        if let Err(e) = stop_endpoint(&ep, immediate) {
            errors.push(e.to_string());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        failed(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["main", "ep-1", "a_b", "X9"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "a/b", "..", "a b", &"x".repeat(64)] {
            assert!(matches!(check_name(bad), Err(Error::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn endpoint_file_roundtrips() {
        let f = EndpointFile {
            name: "e".into(),
            branch: "main".into(),
            pg_port: 5432,
            http_port: 8080,
            read_only_at: None,
            lazy: false,
            cache_mb: None,
            fetch_retry_secs: Some(3),
        };
        let text = toml::to_string(&f).unwrap();
        assert_eq!(toml::from_str::<EndpointFile>(&text).unwrap(), f);
        let ep = Endpoint { dir: "/w/endpoints/e".into(), file: f };
        assert_eq!(ep.connstr(), "postgresql://postgres@127.0.0.1:5432/postgres");
        assert_eq!(ep.local_connstr("pw9"), "postgresql://postgres:pw9@127.0.0.1:5432/postgres?sslmode=disable");
        assert_eq!(
            ep.tls_connstr("pw9", std::path::Path::new("/w x/tls/ca.pem")),
            "postgresql://postgres:pw9@127.0.0.1:5432/postgres?sslmode=verify-full&sslrootcert=/w%20x/tls/ca.pem"
        );
        assert_eq!(ep.identity().marker, PathBuf::from("/w/endpoints/e/pgdata"));
    }
}
