//! Endpoints: a compute (stock PostgreSQL plus the `strata compute start`
//! agent) on a branch, each in `endpoints/<name>/` with its remembered ports.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::layout::{self, Kind, Workdir, HOST, MAIN_BRANCH};
use super::process::{self, Identity, Stopped};
use super::{failed, http, ports, services, status, Error, Result};

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

    /// libpq connection string of its PostgreSQL.
    pub fn connstr(&self) -> String {
        format!("postgresql://postgres@{HOST}:{}/postgres", self.file.pg_port)
    }

    /// The agent's `/v1/status` URL.
    fn status_url(&self) -> String {
        format!("http://{HOST}:{}/v1/status", self.file.http_port)
    }

    /// The agent's reported `state` and `error`, if it answers.
    pub fn agent_state(&self) -> Option<(String, Option<String>)> {
        let r = http::get(&self.status_url(), http::QUICK).ok().filter(|r| r.status == 200)?;
        let state = r.body.get("state")?.as_str()?.to_string();
        let error = r.body.get("error").and_then(|e| e.as_str()).map(str::to_string);
        Some((state, error))
    }
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

/// `strata endpoint start`: spawns the agent and waits until PostgreSQL runs;
/// the last line printed is the connection string.
pub fn start(wd: &Workdir, name: &str, branch: Option<&str>, port: Option<u16>) -> Result<()> {
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
        if let Some(pid) = o.identity().running() {
            return failed(format!("endpoint {name} is already running (pid {pid}): {}", o.connstr()));
        }
    }
    // One writer per timeline: a second PostgreSQL would fork its WAL.
    for other in load_all(wd)? {
        if other.file.name != name && other.file.branch == branch_name {
            if let Some(pid) = other.identity().running() {
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

    let (pg_port, http_port) = choose_ports(wd, name, port, old.as_ref().map(|o| &o.file))?;
    let dir = wd.endpoint_dir(name);
    fs::create_dir_all(&dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let ep =
        Endpoint { dir, file: EndpointFile { name: name.into(), branch: branch_name.clone(), pg_port, http_port } };
    layout::write_toml(
        &ep.dir.join(ENDPOINT_FILE),
        "# Written by `strata endpoint start`; reused by restarts.\n",
        &ep.file,
    )?;

    let c = &wd.cluster;
    let ps = c.pageserver();
    let args: Vec<OsString> = vec![
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
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let exe = std::env::current_exe().map_err(|e| Error::Failed(format!("finding the strata binary: {e}")))?;
    let log = ep.log();
    let from = process::log_len(&log);
    let id = ep.identity();
    let mut child = process::spawn(&exe, &args, &log, &wd.root)?;
    let pid = child.id();
    id.write_pid(pid)?;

    let deadline = Instant::now() + START_WAIT;
    let mut last_state = String::from("(no answer)");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            id.remove_pidfile();
            return failed(format!(
                "endpoint {name}: the compute agent exited ({status}) in state {last_state}\n{}",
                process::log_tail(&log, from, TAIL_LINES)
            ));
        }
        if let Some((state, error)) = ep.agent_state() {
            match state.as_str() {
                "running" => break,
                "failed" => {
                    let _ = process::terminate(&id, pid as i32, Duration::from_secs(10), false);
                    let _ = child.wait();
                    id.remove_pidfile();
                    return failed(format!(
                        "endpoint {name}: failed: {}\n{}",
                        error.unwrap_or_else(|| "(no error given)".into()),
                        process::log_tail(&log, from, TAIL_LINES)
                    ));
                }
                _ => last_state = state,
            }
        }
        if Instant::now() > deadline {
            let _ = process::terminate(&id, pid as i32, Duration::from_secs(10), false);
            let _ = child.wait();
            id.remove_pidfile();
            return failed(format!(
                "endpoint {name}: not running after {}s (last state: {last_state}); stopped it\n{}",
                START_WAIT.as_secs(),
                process::log_tail(&log, from, TAIL_LINES)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "endpoint {name}: running on branch {branch_name} (timeline {}), agent pid {pid}, log {}",
        branch.timeline_id,
        log.display()
    );
    // Last line: scripts take the connection string from here.
    println!("{}", ep.connstr());
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

/// The pid of a PostgreSQL running in the endpoint's pgdata while its agent
/// does not (the agent was killed).
pub fn orphan_postgres(ep: &Endpoint) -> Option<i32> {
    if ep.identity().running().is_some() {
        return None;
    }
    let pid = process::read_pid(&ep.pgdata().join("postmaster.pid"))?;
    (process::alive(pid) && process::comm(pid).as_deref() == Some("postgres")).then_some(pid)
}

/// Stops a PostgreSQL that outlived its agent, so nothing of a stopped
/// endpoint runs and a restart finds its port and pgdata free.
fn stop_orphan_postgres(ep: &Endpoint, immediate: bool) -> Result<()> {
    let Some(pid) = orphan_postgres(ep) else { return Ok(()) };
    let is_postgres = || process::alive(pid) && process::comm(pid).as_deref() == Some("postgres");
    // SIGINT: fast shutdown; SIGQUIT: immediate shutdown (crash recovery at next start).
    process::send(pid, if immediate { libc::SIGQUIT } else { libc::SIGINT });
    if !process::wait_gone(is_postgres, ORPHAN_GRACE) {
        process::kill_group(pid);
        if !process::wait_gone(is_postgres, Duration::from_secs(10)) {
            return failed(format!("endpoint {}: PostgreSQL (pid {pid}) does not die", ep.file.name));
        }
    }
    println!("endpoint {}: stopped PostgreSQL (pid {pid}) left running by its agent", ep.file.name);
    Ok(())
}

/// `strata endpoint stop`: SIGTERM to the agent (it stops PostgreSQL and
/// flushes the WAL), SIGKILL after the grace period. Idempotent.
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
    let name = &ep.file.name;
    let id = ep.identity();
    match id.running() {
        None => println!("endpoint {name}: not running"),
        Some(pid) => {
            let how = process::terminate(&id, pid, STOP_GRACE, immediate)
                .map_err(|e| Error::Failed(format!("endpoint {name}: {e}")))?;
            match how {
                Stopped::Clean => println!("endpoint {name}: stopped (pid {pid})"),
                Stopped::Killed if immediate => println!("endpoint {name}: killed (pid {pid})"),
                Stopped::Killed => {
                    println!("endpoint {name}: killed (pid {pid}) after not stopping within {}s", STOP_GRACE.as_secs())
                }
            }
        }
    }
    id.remove_pidfile();
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

/// `strata endpoint list`: name, branch, port, state, connection string.
pub fn list(wd: &Workdir) -> Result<()> {
    let endpoints = load_all(wd)?;
    if endpoints.is_empty() {
        println!("no endpoints (create one with `strata endpoint start NAME --workdir {}`)", wd.root.display());
        return Ok(());
    }
    let rows = endpoints
        .iter()
        .map(|ep| {
            vec![
                ep.file.name.clone(),
                ep.file.branch.clone(),
                ep.file.pg_port.to_string(),
                status::endpoint_state_text(ep),
                ep.connstr(),
            ]
        })
        .collect();
    print!("{}", status::table(&["NAME", "BRANCH", "PORT", "STATE", "CONNECTION"], rows));
    Ok(())
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
        let f = EndpointFile { name: "e".into(), branch: "main".into(), pg_port: 5432, http_port: 8080 };
        let text = toml::to_string(&f).unwrap();
        assert_eq!(toml::from_str::<EndpointFile>(&text).unwrap(), f);
        let ep = Endpoint { dir: "/w/endpoints/e".into(), file: f };
        assert_eq!(ep.connstr(), "postgresql://postgres@127.0.0.1:5432/postgres");
        assert_eq!(ep.identity().marker, PathBuf::from("/w/endpoints/e/pgdata"));
    }
}
