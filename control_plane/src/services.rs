//! Starting and stopping the safekeepers, the pageservers and the storage
//! controllers (each under its supervisor), and making sure the tenant and
//! its timelines exist on the attached pageserver and the safekeepers.

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use super::error::{failed, Error, Result};
use super::{hosts, http};
use strata_protocol::api::pageserver::{CreateTenantRequest, TimelineState, TimelineStatus};
use strata_protocol::api::safekeeper::CreateTimelineRequest;

use super::layout::{Kind, Service, Workdir, MAIN_BRANCH};
use super::process::{self, Identity, Stopped};
use super::supervisor::{Liveness, StopOutcome, Supervised};
use crate::limits::{
    BOOTSTRAP_TIMEOUT, NODE_CALL, POLL, QUICK, SERVICE_START_PROBE, SERVICE_START_WAIT, SERVICE_STOP_GRACE,
    SERVICE_TAIL_LINES,
};

/// How a service's process is recognised (see `process`).
pub fn identity(wd: &Workdir, s: &Service) -> Identity {
    Identity { subcommand: s.kind.as_str(), marker: wd.config_path(s), pidfile: wd.pid_path(&s.name) }
}

/// The service with its supervisor.
pub fn supervised(wd: &Workdir, s: &Service) -> Supervised {
    Supervised::new(s.name.clone(), identity(wd, s), wd.log_path(&s.name), SERVICE_STOP_GRACE)
}

/// The pid of a running service of this machine, if it runs.
pub fn running(wd: &Workdir, s: &Service) -> Option<i32> {
    identity(wd, s).running()
}

/// Starts one service on its host: here, or through its host's node.
pub fn start_anywhere(wd: &Workdir, s: &Service) -> Result<()> {
    if is_local(wd, s) {
        start_one(wd, s)
    } else {
        on_node(wd, s, "start", false)
    }
}

/// Stops one service on its host: here, or through its host's node.
pub fn stop_anywhere(wd: &Workdir, s: &Service, immediate: bool) -> Result<()> {
    if is_local(wd, s) {
        stop_one(wd, s, immediate)
    } else {
        on_node(wd, s, "stop", immediate)
    }
}

/// Whether the service's host is this machine.
pub fn is_local(wd: &Workdir, s: &Service) -> bool {
    wd.cluster.host(&s.host).is_some_and(hosts::is_local)
}

/// Whether a service runs: by its pidfile on this machine, else by its
/// status API answering.
pub fn is_up(wd: &Workdir, s: &Service) -> bool {
    if let Some(up) = http::transport_says_running(&s.http_url()) {
        return up;
    }
    if is_local(wd, s) {
        return running(wd, s).is_some();
    }
    matches!(http::get(&format!("{}/v1/status", s.http_url()), QUICK), Ok(r) if r.status == 200)
}

/// Starts or stops one service on its host (another machine) through that host's node.
fn on_node(wd: &Workdir, s: &Service, action: &str, immediate: bool) -> Result<()> {
    let host = hosts::host(wd, &s.host)?;
    if action == "start" {
        // It starts with the config of this machine's copy of the state.
        hosts::send(wd, host)?;
    }
    let req = hosts::ServicesRequest { names: vec![s.name.clone()], immediate };
    let out: hosts::Lines = hosts::call(host, "POST", &format!("/v1/services/{action}"), Some(&req), NODE_CALL)?;
    if action == "start" {
        println!("{}: running on host {}", s.name, host.name);
    }
    out.lines.iter().for_each(|l| println!("{l} (host {})", host.name));
    Ok(())
}

/// The services named by `--only` (all if empty): the link proxy, the
/// safekeepers, then the pageservers (they stream WAL from the
/// safekeepers), then the storage controllers.
fn select<'a>(wd: &'a Workdir, only: &[String]) -> Result<Vec<&'a Service>> {
    for name in only {
        if wd.service(name).is_none() {
            let known: Vec<&str> = wd.cluster.services.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::Usage(format!("no service named {name:?} (services: {})", known.join(", "))));
        }
    }
    let wanted = |s: &&Service| only.is_empty() || only.contains(&s.name);
    // The link proxy first: the others reach another site through it.
    let mut selected: Vec<&Service> = wd.cluster.of_kind(Kind::LinkProxy).filter(wanted).collect();
    selected.extend(wd.cluster.of_kind(Kind::Safekeeper).filter(wanted));
    selected.extend(wd.cluster.of_kind(Kind::Pageserver).filter(wanted));
    selected.extend(wd.cluster.of_kind(Kind::Controller).filter(wanted));
    Ok(selected)
}

/// `strata start`: starts the selected services that are not running, then,
/// if the pageserver runs, makes sure the tenant and timelines exist.
pub fn start(wd: &Workdir, only: &[String]) -> Result<()> {
    for s in select(wd, only)? {
        start_anywhere(wd, s)?;
    }
    let pageservers = wd.cluster.of_kind(Kind::Pageserver).any(|s| is_up(wd, s));
    let controllers = wd.cluster.of_kind(Kind::Controller).any(|s| is_up(wd, s));
    if pageservers && controllers {
        ensure_timelines(wd)
    } else {
        println!("no pageserver or no storage controller runs, so the tenant was not checked");
        Ok(())
    }
}

/// Spawns one service under a new supervisor unless it runs (or its
/// supervisor is restarting it), and waits until its HTTP API answers. A
/// service that runs without its supervisor (the supervisor was killed) is
/// stopped and started again under a new one: never two copies.
pub fn start_one(wd: &Workdir, s: &Service) -> Result<()> {
    let sv = supervised(wd, s);
    match sv.liveness() {
        Liveness::Running { pid, supervisor: Some(_) } => {
            println!("{}: already running (pid {pid})", s.name);
            return Ok(());
        }
        Liveness::Restarting { supervisor } => {
            let r = sv.restarts();
            println!(
                "{}: restarting (its supervisor, pid {supervisor}, starts it again; restarts {}, last exit: {})",
                s.name,
                r.restarts,
                r.last_exit.as_deref().unwrap_or("-")
            );
            return Ok(());
        }
        Liveness::Running { pid, supervisor: None } => {
            println!("{}: runs without its supervisor (pid {pid}); restarting it under a new one", s.name);
            sv.stop_unsupervised()?;
        }
        Liveness::Stopped => {}
    }
    let config = wd.config_path(s);
    if !config.is_file() {
        return failed(format!("{}: config {} is missing", s.name, config.display()));
    }
    let exe = std::env::current_exe().map_err(|e| Error::Failed(format!("finding the strata binary: {e}")))?;
    let log = wd.log_path(&s.name);
    let from = process::log_len(&log);
    let args = [OsStr::new(s.kind.as_str()), OsStr::new("--config"), config.as_os_str()];
    let mut child = sv.spawn(&exe, &args, &wd.root)?;

    let url = format!("{}/v1/status", s.http_url());
    let deadline = Instant::now() + SERVICE_START_WAIT;
    let abort = |child: &mut std::process::Child, why: String| {
        let _ = sv.stop(true);
        let _ = child.try_wait();
        failed(format!("{}: {why}\n{}", s.name, process::log_tail(&log, from, SERVICE_TAIL_LINES)))
    };
    let pid = loop {
        if let Some(why) = sv.start_failure(&mut child) {
            return abort(&mut child, why);
        }
        // Ours must still run after the answer, and never have exited: another
        // process could hold the port if ours failed to bind it.
        if matches!(http::get(&url, SERVICE_START_PROBE), Ok(r) if r.status == 200) {
            if let (Some(pid), None) = (sv.service.running(), sv.start_failure(&mut child)) {
                break pid;
            }
        }
        if Instant::now() > deadline {
            return abort(
                &mut child,
                format!("{url} did not answer within {}s; killed it", SERVICE_START_WAIT.as_secs()),
            );
        }
        std::thread::sleep(POLL);
    };
    println!("{}: started (pid {pid}, supervisor pid {}, log {})", s.name, child.id(), log.display());
    Ok(())
}

/// Makes sure every branch's timeline exists on the pageserver (creating
/// the tenant with its `main` timeline if needed) and on every running
/// safekeeper, with the identity the pageserver reports. Idempotent.
pub fn ensure_timelines(wd: &Workdir) -> Result<()> {
    let c = &wd.cluster;
    let ps = super::controller::attached(wd)?;
    let tenant = c.tenant_id;
    for branch in &c.branches {
        let timeline = branch.timeline_id;
        let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", ps.http_url());
        let get = || http::get(&url, QUICK).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)));
        let mut reply = get()?;
        if reply.status == 404 && branch.name == MAIN_BRANCH {
            println!("{}: creating tenant {tenant} (initdb and import; this takes a while)", ps.name);
            let create_url = format!("{}/v1/tenant", ps.http_url());
            let body = CreateTenantRequest { tenant_id: Some(tenant), timeline_id: Some(timeline) };
            let created = http::post(&create_url, &body, BOOTSTRAP_TIMEOUT)
                .map_err(|e| Error::Failed(format!("{}: creating the tenant: {e}", ps.name)))?;
            reply = match created.status {
                201 => created,
                // Created meanwhile (or earlier, but then the GET would have found it).
                409 => get()?,
                s => {
                    return failed(format!("{}: creating tenant {tenant}: HTTP {s}: {}", ps.name, created.error_text()))
                }
            };
        }
        if reply.status != 200 && reply.status != 201 {
            return failed(format!(
                "{}: branch {} (timeline {timeline}): HTTP {}: {}",
                ps.name,
                branch.name,
                reply.status,
                reply.error_text()
            ));
        }
        let status: TimelineStatus =
            reply.json().map_err(|e| Error::Failed(format!("{}: timeline {timeline}: {e}", ps.name)))?;
        if status.state == TimelineState::Broken {
            let why = status.error.unwrap_or_else(|| "no reason given".into());
            return failed(format!("{}: timeline {timeline} is broken: {why}", ps.name));
        }
        let create = CreateTimelineRequest {
            system_id: status.system_id,
            pg_version: status.pg_version,
            wal_segment_size: status.wal_segment_size,
            start_lsn: status.start_lsn,
        };
        let mut on = Vec::new();
        for sk in c.of_kind(Kind::Safekeeper) {
            if !is_up(wd, sk) {
                // Created when `strata start` starts it again.
                on.push(format!("{} (not running)", sk.name));
                continue;
            }
            let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", sk.http_url());
            let r = http::post(&url, &create, QUICK).map_err(|e| Error::Failed(format!("{}: {e}", sk.name)))?;
            match r.status {
                201 => on.push(format!("{} (created)", sk.name)),
                200 => on.push(sk.name.clone()),
                409 => {
                    return failed(format!(
                        "{}: holds timeline {timeline} with another identity than the pageserver's: {}",
                        sk.name,
                        r.error_text()
                    ))
                }
                s => return failed(format!("{}: creating timeline {timeline}: HTTP {s}: {}", sk.name, r.error_text())),
            }
        }
        println!("branch {}: timeline {timeline} on {}, {}", branch.name, ps.name, on.join(", "));
        if branch.placement.is_some() {
            if c.of_kind(Kind::Safekeeper).all(|sk| is_up(wd, sk)) {
                super::placement::apply_placement(wd, &branch.name)?;
            } else {
                println!("branch {}: its placement is applied once every safekeeper runs", branch.name);
            }
        }
    }
    Ok(())
}

/// `strata stop` of the services (the endpoints are stopped before):
/// the pageserver, then the safekeepers; keeps going past a failure and
/// reports them all.
pub fn stop(wd: &Workdir, only: &[String], immediate: bool) -> Result<()> {
    let mut errors = Vec::new();
    let mut selected = select(wd, only)?;
    // The pageserver first: it would otherwise log lost safekeeper connections.
    selected.reverse();
    for s in selected {
        let result = stop_anywhere(wd, s, immediate);
        if let Err(e) = result {
            errors.push(e.to_string());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        failed(errors.join("; "))
    }
}

pub fn stop_one(wd: &Workdir, s: &Service, immediate: bool) -> Result<()> {
    println!("{}: {}", s.name, stop_quietly(wd, s, immediate)?);
    Ok(())
}

/// Stops a service of this machine; returns how it went (`stopped (pid N)`, …).
pub fn stop_quietly(wd: &Workdir, s: &Service, immediate: bool) -> Result<String> {
    let outcome = supervised(wd, s).stop(immediate)?;
    Ok(stop_message(outcome, immediate, SERVICE_STOP_GRACE))
}

/// `stopped (pid N)`, `killed (pid N)`, `not running`, ….
pub fn stop_message(outcome: StopOutcome, immediate: bool, grace: Duration) -> String {
    let StopOutcome::Stopped { pid, how } = outcome else { return "not running".into() };
    let pid = match pid {
        Some(pid) => format!("pid {pid}"),
        None => "it was waiting to be restarted".into(),
    };
    match how {
        Stopped::Clean => format!("stopped ({pid})"),
        Stopped::Killed if immediate => format!("killed ({pid})"),
        Stopped::Killed => format!("killed ({pid}) after not stopping within {}s", grace.as_secs()),
    }
}
