//! Starting and stopping the safekeepers, the pageservers and the storage
//! controllers (each under its supervisor), and making sure the tenant and
//! its timelines exist on the attached pageserver and the safekeepers.

use std::ffi::OsStr;
use std::time::Instant;

use super::error::{failed, Error, Result};
use super::{hosts, http};
use strata_protocol::api::pageserver::{CreateTenantRequest, TimelineState, TimelineStatus};
use strata_protocol::api::safekeeper::CreateTimelineRequest;
use strata_protocol::TenantShardId;

use super::layout::{Kind, Service, Tenant, TenantState, Workdir, MAIN_BRANCH};
use super::process::{self, Identity, Poll};
use super::report::{Event, Held, Progress, ServiceEvent, StopReport};
use super::supervisor::{Liveness, Supervised};
use crate::limits::{
    BOOTSTRAP_TIMEOUT, NODE_CALL, QUICK, SERVICE_START_PROBE, SERVICE_START_WAIT, SERVICE_STOP_GRACE,
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
pub fn start_anywhere(wd: &Workdir, s: &Service, progress: &mut dyn Progress) -> Result<()> {
    if is_local(wd, s) {
        start_one(wd, s, progress)
    } else {
        on_node(wd, s, "start", false, progress)
    }
}

/// Stops one service on its host: here, or through its host's node.
pub fn stop_anywhere(wd: &Workdir, s: &Service, immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    if is_local(wd, s) {
        progress.tell(stop_local(wd, s, immediate)?);
        Ok(())
    } else {
        on_node(wd, s, "stop", immediate, progress)
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
fn on_node(wd: &Workdir, s: &Service, action: &str, immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    let host = hosts::host(wd, &s.host)?;
    if action == "start" {
        // It starts with the config of this machine's copy of the state.
        hosts::send(wd, host)?;
    }
    let req = hosts::ServicesRequest { names: vec![s.name.clone()], immediate };
    let out: hosts::Lines = hosts::call(host, "POST", &format!("/v1/services/{action}"), Some(&req), NODE_CALL)?;
    if action == "start" {
        progress.tell(ServiceEvent::RunningOnHost { service: s.name.clone(), host: host.name.clone() });
    }
    for line in out.lines {
        progress.report(Event::Relayed { line, host: Some(host.name.clone()) });
    }
    Ok(())
}

/// The order services start in, kind by kind: the link proxy (the others
/// reach another site through it), the safekeepers, the pageservers (they
/// stream WAL from the safekeepers), then the storage controllers (they
/// ask the pageservers for their status first thing), then the proxy (it
/// wakes computes, which need all of them). Stops go backwards.
pub const START_ORDER: [Kind; 5] = [Kind::LinkProxy, Kind::Safekeeper, Kind::Pageserver, Kind::Controller, Kind::Proxy];

/// The services named by `--only` (all if empty), kind by kind in
/// [`START_ORDER`], each kind in the order of `cluster.toml`.
fn select<'a>(wd: &'a Workdir, only: &[String]) -> Result<Vec<Vec<&'a Service>>> {
    for name in only {
        if wd.service(name).is_none() {
            let known: Vec<&str> = wd.cluster.services.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::Usage(format!("no service named {name:?} (services: {})", known.join(", "))));
        }
    }
    let wanted = |s: &&Service| only.is_empty() || only.contains(&s.name);
    Ok(by_kind(wd.cluster.services.iter().filter(wanted).collect()))
}

/// `services` in groups of one kind, in [`START_ORDER`] (empty groups left out).
pub fn by_kind(services: Vec<&Service>) -> Vec<Vec<&Service>> {
    START_ORDER
        .iter()
        .map(|kind| services.iter().copied().filter(|s| s.kind == *kind).collect::<Vec<_>>())
        .filter(|group| !group.is_empty())
        .collect()
}

/// `strata start`: starts the selected services that are not running, all
/// of a kind at once, then, if the pageserver runs, makes sure the tenant
/// and timelines exist. Reports each service's lines in the order of
/// `cluster.toml`; the first kind with a failure is the last started.
pub fn start(wd: &Workdir, only: &[String], progress: &mut dyn Progress) -> Result<()> {
    for group in select(wd, only)? {
        let results = at_once(wd, &group, false, |s, events| start_anywhere(wd, s, events));
        joined(report_all(results, progress), "\n")?;
    }
    let pageservers = wd.cluster.of_kind(Kind::Pageserver).any(|s| is_up(wd, s));
    let controllers = wd.cluster.of_kind(Kind::Controller).any(|s| is_up(wd, s));
    if pageservers && controllers {
        ensure_timelines(wd, progress)
    } else {
        progress.tell(ServiceEvent::TenantNotChecked);
        Ok(())
    }
}

/// What one service's start or stop reported, and how it ended.
pub type Outcome = (Vec<Event>, Result<()>);

/// Runs `f` for every service at once: each service of this machine on a
/// thread of its own, those of another host one after the other on a
/// thread per host (its node does one command at a time), the rest of
/// them skipped after a failure unless `past_failures`. The outcomes of
/// those run, in the order of `services`.
pub fn at_once<F>(wd: &Workdir, services: &[&Service], past_failures: bool, f: F) -> Vec<Outcome>
where
    F: Fn(&Service, &mut Vec<Event>) -> Result<()> + Sync,
{
    // Each group: indexes into `services`, run in their order.
    let mut groups: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
    for (i, s) in services.iter().enumerate() {
        let remote = (!is_local(wd, s)).then_some(s.host.as_str());
        match groups.iter_mut().find(|(host, _)| remote.is_some() && *host == remote) {
            Some((_, members)) => members.push(i),
            None => groups.push((remote, vec![i])),
        }
    }
    let run_group = |members: &[usize]| -> Vec<(usize, Outcome)> {
        let mut done = Vec::new();
        for &i in members {
            let mut events = Vec::new();
            let result = f(services[i], &mut events);
            let failed = result.is_err();
            done.push((i, (events, result)));
            if failed && !past_failures {
                break;
            }
        }
        done
    };
    let mut outcomes: Vec<(usize, Outcome)> = if groups.len() == 1 {
        run_group(&groups[0].1)
    } else {
        std::thread::scope(|scope| {
            let threads: Vec<_> = groups.iter().map(|(_, members)| scope.spawn(|| run_group(members))).collect();
            threads.into_iter().flat_map(|t| t.join().expect("a service's start or stop does not panic")).collect()
        })
    };
    outcomes.sort_by_key(|(i, _)| *i);
    outcomes.into_iter().map(|(_, o)| o).collect()
}

/// Reports every outcome's events in order; the failures.
pub fn report_all(outcomes: Vec<Outcome>, progress: &mut dyn Progress) -> Vec<Error> {
    let mut errors = Vec::new();
    for (events, result) in outcomes {
        events.into_iter().for_each(|e| progress.report(e));
        if let Err(e) = result {
            errors.push(e);
        }
    }
    errors
}

/// No error, one error as it is, or several as one failure (joined by `separator`).
pub fn joined(mut errors: Vec<Error>, separator: &str) -> Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => failed(errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(separator)),
    }
}

/// Spawns one service under a new supervisor unless it runs (or its
/// supervisor is restarting it), and waits until its HTTP API answers. A
/// service that runs without its supervisor (the supervisor was killed) is
/// stopped and started again under a new one: never two copies.
pub fn start_one(wd: &Workdir, s: &Service, progress: &mut dyn Progress) -> Result<()> {
    let sv = supervised(wd, s);
    let service = s.name.clone();
    match sv.liveness() {
        Liveness::Running { pid, supervisor: Some(_) } => {
            progress.tell(ServiceEvent::AlreadyRunning { service, pid });
            return Ok(());
        }
        Liveness::Restarting { supervisor } => {
            let r = sv.restarts();
            progress.tell(ServiceEvent::Restarting {
                service,
                supervisor,
                restarts: r.restarts,
                last_exit: r.last_exit,
            });
            return Ok(());
        }
        Liveness::Running { pid, supervisor: None } => {
            progress.tell(ServiceEvent::Unsupervised { service, pid });
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
    let mut poll = Poll::new();
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
        poll.pause();
    };
    progress.tell(ServiceEvent::Started { service: s.name.clone(), pid, supervisor: child.id(), log });
    Ok(())
}

/// [`ensure_tenant`] for every tenant that is not being deleted; goes on
/// past a tenant that fails and reports them all. A tenant whose creation
/// was interrupted (`creating`) is active once this is done for it.
pub fn ensure_timelines(wd: &Workdir, progress: &mut dyn Progress) -> Result<()> {
    let mut errors = Vec::new();
    let mut created = Vec::new();
    for t in wd.cluster.tenants.iter().filter(|t| t.state != TenantState::Deleting) {
        match ensure_tenant(wd, t, progress) {
            Ok(()) if t.state == TenantState::Creating => created.push(t.name.clone()),
            Ok(()) => {}
            Err(e) => errors.push(t.context(e)),
        }
    }
    if !created.is_empty() {
        super::layout::update_cluster(&wd.root, |c| {
            for t in c.tenants.iter_mut().filter(|t| created.contains(&t.name) && t.state == TenantState::Creating) {
                t.state = TenantState::Active;
            }
            Ok(())
        })?;
    }
    joined(errors, "; ")
}

/// Makes sure a tenant is placed by the storage controllers and every
/// branch's timeline exists on the pageserver (creating the tenant with
/// its `main` timeline if needed) and on every running safekeeper, with
/// the identity the pageserver reports. Idempotent.
pub fn ensure_tenant(wd: &Workdir, t: &Tenant, progress: &mut dyn Progress) -> Result<()> {
    ensure_branches(wd, t, None, progress)
}

/// [`ensure_tenant`] for one branch only (`branch create`, `branch reset`):
/// its cost does not grow with the tenant's other branches.
pub fn ensure_branch(wd: &Workdir, t: &Tenant, branch: &str, progress: &mut dyn Progress) -> Result<()> {
    ensure_branches(wd, t, Some(branch), progress)
}

fn ensure_branches(wd: &Workdir, t: &Tenant, only: Option<&str>, progress: &mut dyn Progress) -> Result<()> {
    let c = &wd.cluster;
    let tenant = t.tenant_id;
    // Every shard is placed before any is created: the controllers spread
    // them over the pageservers as they come.
    let shards = t.shard_ids();
    for shard in &shards {
        super::controller::register(wd, *shard)?;
    }
    let ps = super::controller::attached(wd, shards[0])?;
    for branch in t.branches.iter().filter(|b| only.is_none_or(|name| b.name == name)) {
        let timeline = branch.timeline_id;
        let status = ensure_shard_timeline(wd, t, shards[0], branch, None, progress)?;
        // The other shards take shard 0's system identifier: one WAL feeds them all.
        for shard in &shards[1..] {
            ensure_shard_timeline(wd, t, *shard, branch, Some(status.system_id), progress)?;
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
                on.push((sk.name.clone(), Held::NotRunning));
                continue;
            }
            let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", sk.http_url());
            let r = http::post(&url, &create, QUICK).map_err(|e| Error::Failed(format!("{}: {e}", sk.name)))?;
            match r.status {
                201 => on.push((sk.name.clone(), Held::Created)),
                200 => on.push((sk.name.clone(), Held::Existing)),
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
        progress.tell(ServiceEvent::TimelineOn {
            branch: t.label(&branch.name),
            timeline,
            pageserver: ps.name.clone(),
            safekeepers: on,
        });
        if branch.placement.is_some() {
            if c.of_kind(Kind::Safekeeper).all(|sk| is_up(wd, sk)) {
                super::placement::apply_placement(wd, &t.name, &branch.name, progress)?;
            } else {
                progress.tell(ServiceEvent::PlacementLater { branch: t.label(&branch.name) });
            }
        }
    }
    Ok(())
}

/// Makes sure `shard`'s pageserver has `branch`'s timeline, creating the
/// shard (with the `main` timeline) if it has none; its status. Shards
/// other than 0 are created with shard 0's system identifier.
fn ensure_shard_timeline(
    wd: &Workdir,
    t: &Tenant,
    shard: TenantShardId,
    branch: &super::layout::Branch,
    system_id: Option<u64>,
    progress: &mut dyn Progress,
) -> Result<TimelineStatus> {
    let ps = super::controller::attached(wd, shard)?;
    let timeline = branch.timeline_id;
    let url = format!("{}/v1/tenant/{shard}/timeline/{timeline}", ps.http_url());
    let get = || http::get(&url, QUICK).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)));
    let mut reply = get()?;
    if reply.status == 404 && branch.name == MAIN_BRANCH {
        progress.tell(ServiceEvent::CreatingTenant { pageserver: ps.name.clone(), tenant: shard });
        let create_url = format!("{}/v1/tenant", ps.http_url());
        let body = CreateTenantRequest {
            tenant_id: Some(shard),
            timeline_id: Some(timeline),
            pg_version: Some(t.pg_version),
            stripe_blocks: t.shards.map(|l| l.stripe_blocks),
            system_id,
        };
        let created = http::post(&create_url, &body, BOOTSTRAP_TIMEOUT)
            .map_err(|e| Error::Failed(format!("{}: creating the tenant: {e}", ps.name)))?;
        reply = match created.status {
            201 => created,
            // Created meanwhile (or earlier, but then the GET would have found it).
            409 => get()?,
            s => return failed(format!("{}: creating tenant {shard}: HTTP {s}: {}", ps.name, created.error_text())),
        };
    }
    if reply.status != 200 && reply.status != 201 {
        return failed(format!(
            "{}: branch {} (timeline {timeline}{}): HTTP {}: {}",
            ps.name,
            branch.name,
            if shard.shard.is_unsharded() { String::new() } else { format!(", shard {shard}") },
            reply.status,
            reply.error_text()
        ));
    }
    let status: TimelineStatus =
        reply.json().map_err(|e| Error::Failed(format!("{}: timeline {timeline}: {e}", ps.name)))?;
    if status.state == TimelineState::Broken {
        let why = status.error.clone().unwrap_or_else(|| "no reason given".into());
        let of = if shard.shard.is_unsharded() { String::new() } else { format!(" (shard {shard})") };
        return failed(format!("{}: timeline {timeline} is broken{of}: {why}", ps.name));
    }
    if system_id.is_some_and(|id| id != status.system_id) {
        return failed(format!(
            "{}: shard {shard} has system identifier {}, shard 0 has {}",
            ps.name,
            status.system_id,
            system_id.unwrap_or_default()
        ));
    }
    Ok(status)
}

/// `strata stop` of the services (the endpoints are stopped before):
/// kind by kind against [`START_ORDER`], all of a kind at once; keeps
/// going past a failure and reports them all.
pub fn stop(wd: &Workdir, only: &[String], immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    let mut errors = Vec::new();
    // The pageserver before the safekeepers: it would otherwise log lost
    // safekeeper connections. Within a kind too, the lines go backwards.
    for mut group in select(wd, only)?.into_iter().rev() {
        group.reverse();
        let results = at_once(wd, &group, true, |s, events| stop_anywhere(wd, s, immediate, events));
        errors.extend(report_all(results, progress));
    }
    joined(errors, "; ")
}

/// Stops a service of this machine; how it went (`sk1: stopped (pid N)`, …).
pub fn stop_local(wd: &Workdir, s: &Service, immediate: bool) -> Result<StopReport> {
    let outcome = supervised(wd, s).stop(immediate)?;
    Ok(StopReport { label: s.name.clone(), outcome, immediate, grace: SERVICE_STOP_GRACE })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Host;

    fn started(name: &str) -> Event {
        ServiceEvent::AlreadyRunning { service: name.into(), pid: 1 }.into()
    }

    #[test]
    fn every_outcome_is_told_in_order_and_every_failure_kept() {
        let outcomes: Vec<Outcome> = vec![
            (vec![started("sk1")], Ok(())),
            (vec![started("sk2")], Err(Error::Failed("sk2: did not answer".into()))),
            (vec![started("sk3")], Err(Error::Failed("sk3: did not answer".into()))),
        ];
        let mut told = Vec::new();
        let errors = report_all(outcomes, &mut told);
        assert_eq!(told, [started("sk1"), started("sk2"), started("sk3")]);
        let e = joined(errors, "; ").unwrap_err();
        assert_eq!(e.to_string(), "sk2: did not answer; sk3: did not answer");
        // One error is kept as it is: a usage error stays one.
        assert!(matches!(joined(vec![Error::Usage("bad".into())], "; "), Err(Error::Usage(_))));
        assert!(joined(Vec::new(), "; ").is_ok());
    }

    /// sk1 on this machine, sk2 and sk3 on host `far` (an address no
    /// machine has), as the workdir is read, not as written.
    fn two_hosts() -> Workdir {
        let dir = std::env::temp_dir().join(format!("strata-at-once-{}", strata_protocol::TimelineId::generate()));
        crate::init::init(&crate::options::InitOptions {
            insecure_loopback: true,
            ..crate::options::InitOptions::for_test(&dir, 3)
        })
        .unwrap();
        let mut wd = Workdir::open(&dir).unwrap();
        let far = "192.0.2.1".parse().unwrap();
        wd.cluster.hosts.push(Host {
            name: "far".into(),
            address: far,
            site: "far".into(),
            node_port: 0,
            computes: false,
        });
        for s in wd.cluster.services.iter_mut().filter(|s| s.name == "sk2" || s.name == "sk3") {
            s.host = "far".into();
        }
        wd
    }

    #[test]
    fn each_local_service_runs_apart_and_another_hosts_one_after_the_other() {
        let wd = two_hosts();
        let sks: Vec<&Service> = wd.cluster.of_kind(Kind::Safekeeper).collect();
        assert_eq!(sks.iter().map(|s| s.host.as_str()).collect::<Vec<_>>(), ["local", "far", "far"]);
        let threads = std::sync::Mutex::new(Vec::new());
        let run = |past_failures: bool| {
            threads.lock().unwrap().clear();
            at_once(&wd, &sks, past_failures, |s, events| {
                threads.lock().unwrap().push((s.name.clone(), std::thread::current().id()));
                events.push(started(&s.name));
                if s.name == "sk2" {
                    return failed("sk2: its node does not answer");
                }
                Ok(())
            })
        };
        // The far host's sk3 waits for its sk2, which fails: it is not asked.
        let outcomes = run(false);
        let told: Vec<&Event> = outcomes.iter().flat_map(|(events, _)| events).collect();
        assert_eq!(told, [&started("sk1"), &started("sk2")]);
        assert!(outcomes[0].1.is_ok() && outcomes[1].1.is_err());
        // A stop goes past it, on the same thread; sk1 ran on another.
        let outcomes = run(true);
        assert_eq!(outcomes.iter().map(|(e, _)| e[0].clone()).collect::<Vec<_>>(), ["sk1", "sk2", "sk3"].map(started));
        let ran = threads.lock().unwrap().clone();
        let thread_of = |name: &str| ran.iter().find(|(n, _)| n == name).map(|(_, t)| *t).unwrap();
        assert_eq!(thread_of("sk2"), thread_of("sk3"));
        assert_ne!(thread_of("sk1"), thread_of("sk2"));
        let far: Vec<&str> = ran.iter().filter(|(n, _)| n != "sk1").map(|(n, _)| n.as_str()).collect();
        assert_eq!(far, ["sk2", "sk3"], "in their order");
        std::fs::remove_dir_all(&wd.root).unwrap();
    }
}
