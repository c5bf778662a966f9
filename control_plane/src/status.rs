//! `strata status`: every service, endpoint and timeline, as a table or
//! JSON. Works whatever runs: a stopped service is reported, not an error.

use strata_protocol::api::cluster::{
    BranchStatus, ClusterStatus, EndpointStatus, SafekeeperPosition, ServiceStatus, ShardPosition, TenantStatus,
};
use strata_protocol::api::compute::{AgentState, RestartStatus};
use strata_protocol::api::controller::TenantPlacement;
use strata_protocol::api::pageserver::{PageserverStatus, TimelineStatus};
use strata_protocol::api::safekeeper::SafekeeperStatus;
use strata_protocol::shard::{ShardIndex, TenantShardId};
use strata_protocol::TimelineId;

use super::endpoint::{self, Endpoint};
use super::error::Result;
use super::layout::{Branch, Kind, Tenant, Workdir, DEFAULT_TENANT};
use super::supervisor::{Liveness, Restarts, Supervised};
use super::{hosts, http, services};
use crate::limits::{QUICK, SHORT_CHARS};

/// An endpoint's restarts: the supervisor's of the agent plus the agent's
/// of PostgreSQL, and the most recent cause of either.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointRestarts {
    pub total: u64,
    /// The supervisor's restarts of the agent process.
    pub agent: u64,
    /// The agent's restarts of PostgreSQL.
    pub postgres: u64,
    pub last_cause: Option<String>,
    pub crash_loop: bool,
}

/// Combines the supervisor's and the agent's view of an endpoint's restarts.
fn combine(supervisor: &Restarts, agent: Option<&RestartStatus>) -> EndpointRestarts {
    let postgres = agent.map_or(0, |a| a.restarts);
    let agent_cause = agent.and_then(|a| Some((a.last_restart_at.unwrap_or(0), a.last_restart_cause.clone()?)));
    let supervisor_cause = supervisor
        .last_exit
        .as_ref()
        .map(|e| (supervisor.last_exit_at.unwrap_or(0), format!("the compute agent exited ({e})")));
    // The later of the two; the agent's restart on a tie (it is the finer one).
    let last_cause = match (agent_cause, supervisor_cause) {
        (Some(a), Some(s)) => Some(if s.0 > a.0 { s.1 } else { a.1 }),
        (a, s) => a.or(s).map(|c| c.1),
    };
    EndpointRestarts {
        total: supervisor.restarts + postgres,
        agent: supervisor.restarts,
        postgres,
        last_cause,
        crash_loop: supervisor.crash_loop || agent.is_some_and(|a| a.crash_loop),
    }
}

/// An endpoint's restarts, asking its supervisor and its agent.
pub fn endpoint_restarts(ep: &Endpoint) -> EndpointRestarts {
    let sv = ep.supervised();
    let agent = sv.service.running().and_then(|_| ep.agent_view());
    combine(&supervisor_view(ep, &sv, sv.liveness()), agent.as_ref().map(|a| &a.restart))
}

/// What the endpoint's supervisor reports; for a suspended endpoint, whose
/// supervisor has exited, how it ended (`suspended after N s idle`) from the
/// state file it left.
fn supervisor_view(ep: &Endpoint, sv: &Supervised, liveness: Liveness) -> Restarts {
    if endpoint_state_name(ep, liveness) != SUSPENDED {
        return sv.restarts();
    }
    let last = sv.last_state();
    Restarts {
        last_exit: last.as_ref().and_then(|s| s.last_exit.clone()),
        last_exit_at: last.as_ref().and_then(|s| s.last_exit_at),
        ..Default::default()
    }
}

/// `strata endpoint list`: a table, or how to make the first endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointList {
    Table(String),
    None { root: std::path::PathBuf },
}

impl std::fmt::Display for EndpointList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointList::Table(table) => f.write_str(table),
            EndpointList::None { root } => {
                writeln!(f, "no endpoints (create one with `strata endpoint start NAME --workdir {}`)", root.display())
            }
        }
    }
}

/// `strata endpoint list`: name, branch, port, state, restarts, the last
/// cause of a restart, and the connection string; with the host too when
/// the cluster has several.
pub fn list_endpoints(wd: &Workdir) -> Result<EndpointList> {
    let many = wd.cluster.hosts.len() > 1;
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let row = |host: &str, mut cells: Vec<String>| {
        if many {
            cells.insert(1, host.to_string());
        }
        cells
    };
    for ep in endpoint::load_all(wd)? {
        if !wd.cluster.host(&ep.file.host).is_some_and(hosts::is_local) {
            continue;
        }
        let r = endpoint_restarts(&ep);
        let cells = vec![
            ep.file.name.clone(),
            ep.file.branch.clone(),
            ep.file.pg_port.to_string(),
            endpoint_state_text(&ep),
            r.total.to_string(),
            short(r.last_cause.as_deref().unwrap_or("-")),
            ep.connstr(),
        ];
        rows.push((ep.file.name.clone(), row(&ep.file.host, cells)));
    }
    for host in wd.cluster.hosts.iter().filter(|h| h.computes && !hosts::is_local(h)) {
        let part: HostStatus = hosts::call(host, "GET", "/v1/status", None::<&()>, QUICK * 2)?;
        for e in part.endpoints {
            let cells = vec![
                e.name.clone(),
                e.branch.clone(),
                e.ports.get("pg").map_or("-".into(), |p| p.to_string()),
                endpoint_state(&e),
                e.restarts.to_string(),
                short(&or_dash(e.last_cause.as_ref())),
                e.connstr.clone(),
            ];
            rows.push((e.name.clone(), row(&host.name, cells)));
        }
    }
    if rows.is_empty() {
        return Ok(EndpointList::None { root: wd.root.clone() });
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = vec!["NAME", "BRANCH", "PORT", "STATE", "RESTARTS", "LAST CAUSE", "CONNECTION"];
    if many {
        header.insert(1, "HOST");
    }
    // The connection string last: scripts take the last field.
    Ok(EndpointList::Table(table(&header, rows.into_iter().map(|(_, r)| r).collect())))
}

/// A service's local data directory and its object storage (a path for
/// the local backend, a URL otherwise), from its config.
fn storage_of(wd: &Workdir, s: &super::layout::Service) -> (Option<std::path::PathBuf>, Option<String>) {
    let path = wd.config_path(s);
    match s.kind {
        Kind::Pageserver => match strata_pageserver::config::PageserverConfig::load(&path) {
            Ok(c) => (Some(c.data_dir), c.remote_storage.map(|r| r.describe())),
            Err(_) => (None, None),
        },
        Kind::Safekeeper => match strata_safekeeper::config::SafekeeperConfig::load(&path) {
            Ok(c) => (Some(c.data_dir), c.remote_storage.map(|r| r.describe())),
            Err(_) => (None, None),
        },
        Kind::Controller => match strata_controller::config::ControllerConfig::load(&path) {
            Ok(c) => (None, Some(c.remote_storage.describe())),
            Err(_) => (None, None),
        },
        Kind::LinkProxy | Kind::Proxy => (None, None),
    }
}

/// What one host's node reports: its services and endpoints.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct HostStatus {
    pub host: String,
    pub services: Vec<ServiceStatus>,
    pub endpoints: Vec<EndpointStatus>,
}

/// The services and endpoints of `host`, as this machine sees them (its
/// pidfiles, supervisors and agents).
pub fn host_part(wd: &Workdir, host: &str) -> Result<HostStatus> {
    let c = &wd.cluster;
    let mut services = Vec::new();
    for s in c.services.iter().filter(|s| s.host == host) {
        let sv = services::supervised(wd, s);
        let liveness = sv.liveness();
        let r = sv.restarts();
        let (data_dir, remote_storage) = storage_of(wd, s);
        services.push(ServiceStatus {
            name: s.name.clone(),
            host: s.host.clone(),
            site: site_of(wd, &s.host),
            kind: s.kind.as_str().to_string(),
            pid: liveness.pid(),
            supervisor_pid: liveness.supervisor(),
            supervised: liveness.supervisor().is_some(),
            ports: s.ports.clone(),
            state: liveness.name().to_string(),
            restarts: r.restarts,
            last_exit: r.last_exit,
            last_exit_at: r.last_exit_at,
            crash_loop: r.crash_loop,
            config: wd.config_path(s),
            log: wd.log_path(&s.name),
            data_dir,
            remote_storage,
        });
    }

    let mut endpoints = Vec::new();
    for ep in endpoint::load_all(wd)?.into_iter().filter(|ep| ep.file.host == host) {
        let sv = ep.supervised();
        let liveness = sv.liveness();
        let supervisor = supervisor_view(&ep, &sv, liveness);
        let agent = liveness.pid().and_then(|_| ep.agent_view());
        let restarts = combine(&supervisor, agent.as_ref().map(|a| &a.restart));
        endpoints.push(EndpointStatus {
            name: ep.file.name.clone(),
            host: ep.file.host.clone(),
            site: site_of(wd, &ep.file.host),
            kind: "compute".into(),
            pid: liveness.pid(),
            supervisor_pid: liveness.supervisor(),
            supervised: liveness.supervisor().is_some(),
            ports: [("pg".to_string(), ep.file.pg_port), ("http".to_string(), ep.file.http_port)].into(),
            tenant: ep.file.tenant.clone(),
            branch: ep.file.branch.clone(),
            timeline_id: c.tenant(&ep.file.tenant).and_then(|t| t.branch(&ep.file.branch)).map(|b| b.timeline_id),
            state: endpoint_state_name(&ep, liveness).to_string(),
            compute_state: agent.as_ref().map(|a| a.state),
            compute_error: agent.as_ref().and_then(|a| a.error.clone()),
            restarts: restarts.total,
            agent_restarts: restarts.agent,
            postgres_restarts: restarts.postgres,
            last_exit: supervisor.last_exit,
            last_exit_at: supervisor.last_exit_at,
            last_restart_cause: agent.as_ref().and_then(|a| a.restart.last_restart_cause.clone()),
            last_restart_at: agent.as_ref().and_then(|a| a.restart.last_restart_at),
            last_restart_downtime_seconds: agent.as_ref().and_then(|a| a.restart.last_restart_downtime_seconds),
            last_cause: restarts.last_cause,
            crash_loop: restarts.crash_loop,
            orphan_postgres_pid: endpoint::orphan_postgres(&ep),
            connstr: ep.connstr(),
            log: ep.log(),
            role: role(&ep.file).into(),
            replica: agent.as_ref().and_then(|a| a.replica.clone()),
        });
    }
    Ok(HostStatus { host: host.to_string(), services, endpoints })
}

/// The site of host `host` (empty for a host the cluster does not name).
fn site_of(wd: &Workdir, host: &str) -> String {
    wd.cluster.host(host).map(|h| h.site.clone()).unwrap_or_default()
}

/// What an endpoint is to its branch.
fn role(file: &endpoint::EndpointFile) -> &'static str {
    match (file.read_only_at, &file.replica_of) {
        (Some(_), _) => "read-only",
        (None, Some(_)) => "replica",
        (None, None) => "writer",
    }
}

/// The role column: a replica's with its lag.
fn role_text(e: &EndpointStatus) -> String {
    match &e.replica {
        Some(r) => format!("replica, lag {} B {:.2} s", r.lag_bytes, r.lag_seconds),
        None if e.role.is_empty() => "-".into(),
        None => e.role.clone(),
    }
}

/// A service whose host's node does not answer: its state is unknown.
fn unreachable(wd: &Workdir, s: &super::layout::Service) -> ServiceStatus {
    ServiceStatus {
        name: s.name.clone(),
        host: s.host.clone(),
        site: site_of(wd, &s.host),
        kind: s.kind.as_str().to_string(),
        pid: None,
        supervisor_pid: None,
        supervised: false,
        ports: s.ports.clone(),
        state: "unknown (its host's node does not answer)".into(),
        restarts: 0,
        last_exit: None,
        last_exit_at: None,
        crash_loop: false,
        config: wd.config_path(s),
        log: wd.log_path(&s.name),
        data_dir: None,
        remote_storage: None,
    }
}

/// The whole status (the `--json` output): each host's part from this
/// machine or from the host's node, then the timelines from the services.
pub fn collect(wd: &Workdir) -> Result<ClusterStatus> {
    let c = &wd.cluster;
    let mut services = Vec::new();
    let mut endpoints = Vec::new();
    for host in &c.hosts {
        let part = if hosts::is_local(host) {
            Some(host_part(wd, &host.name)?)
        } else {
            hosts::call::<HostStatus>(host, "GET", "/v1/status", None::<&()>, QUICK * 2).ok()
        };
        match part {
            Some(p) => {
                services.extend(p.services);
                endpoints.extend(p.endpoints);
            }
            None => services.extend(c.services.iter().filter(|s| s.host == host.name).map(|s| unreachable(wd, s))),
        }
    }
    // cluster.toml's order, whatever the hosts' order.
    services.sort_by_key(|st| c.services.iter().position(|s| s.name == st.name));
    endpoints.sort_by(|a, b| a.name.cmp(&b.name));
    let up = |name: &str| services.iter().any(|s| s.name == name && s.state == "running");

    // One status query per running safekeeper covers every timeline.
    let mut sk_status: Vec<(String, Option<SafekeeperStatus>)> = Vec::new();
    for s in c.of_kind(Kind::Safekeeper) {
        if up(&s.name) {
            let body = http::get(&format!("{}/v1/status", s.http_url()), QUICK)
                .ok()
                .filter(|r| r.status == 200)
                .and_then(|r| r.json().ok());
            sk_status.push((s.name.clone(), body));
        }
    }
    let state = super::controller::status(wd).and_then(|s| s.state);
    let ps_status: Vec<(String, PageserverStatus)> = c
        .of_kind(Kind::Pageserver)
        .filter(|ps| up(&ps.name))
        .filter_map(|ps| {
            let r = http::get(&format!("{}/v1/status", ps.http_url()), QUICK).ok().filter(|r| r.status == 200)?;
            Some((ps.name.clone(), r.json().ok()?))
        })
        .collect();
    let mut timelines = Vec::new();
    let mut tenants = Vec::new();
    for t in &c.tenants {
        // Where each shard is: the controller's state (every branch is
        // where its shard is); shard 0 (the tenant itself when unsharded) first.
        let placements: Vec<(TenantShardId, Option<TenantPlacement>)> = t
            .shard_ids()
            .into_iter()
            .map(|id| (id, state.as_ref().and_then(|s| s.tenants.get(&id).cloned())))
            .collect();
        let running = |p: &Option<TenantPlacement>| {
            let attached = p.as_ref().and_then(|p| p.attached.as_deref());
            ps_status.iter().any(|(n, _)| Some(n.as_str()) == attached)
        };
        let here: Vec<BranchStatus> =
            t.branches.iter().map(|b| branch_status(wd, t, b, &placements, &running, &sk_status)).collect();
        tenants.push(tenant_status(t, &placements, &ps_status, &here, &sk_status));
        timelines.extend(here);
    }
    Ok(ClusterStatus { workdir: wd.root.clone(), tenants, services, endpoints, timelines })
}

/// A tenant's sizes from what its services reported.
fn tenant_status(
    t: &Tenant,
    placements: &[(TenantShardId, Option<TenantPlacement>)],
    ps_status: &[(String, PageserverStatus)],
    branches: &[BranchStatus],
    sk_status: &[(String, Option<SafekeeperStatus>)],
) -> TenantStatus {
    // Every shard's answer counts (each holds its own keys).
    let sum = |f: &dyn Fn(&TimelineStatus) -> Option<u64>| -> Option<u64> {
        branches
            .iter()
            .flat_map(|b| std::iter::once(&b.pageserver).chain(b.shards.iter().map(|s| &s.pageserver)))
            .map(|answer| answer.as_ref().and_then(f))
            .sum()
    };
    let mut attached: Vec<&str> = Vec::new();
    for on in placements.iter().filter_map(|(_, p)| p.as_ref().and_then(|p| p.attached.as_deref())) {
        if !attached.contains(&on) {
            attached.push(on);
        }
    }
    let local_layer_bytes = placements
        .iter()
        .map(|(id, p)| {
            let on = p.as_ref().and_then(|p| p.attached.as_deref())?;
            let (_, st) = ps_status.iter().find(|(n, _)| n == on)?;
            st.locations.iter().find(|l| l.tenant_id == *id).map(|l| l.local_layer_bytes)
        })
        .sum();
    let wal_held = sk_status
        .iter()
        .filter_map(|(_, body)| body.as_ref())
        .map(|b| b.timelines.iter().filter(|x| x.tenant_id == t.tenant_id).map(|x| x.removal.local_wal_bytes).sum())
        .max();
    TenantStatus {
        name: t.name.clone(),
        tenant_id: t.tenant_id,
        state: t.state.as_str().into(),
        // Each shard's, in shard order, each pageserver once.
        attached: (!attached.is_empty()).then(|| attached.join(",")),
        // Shard 0 holds every relation's size.
        logical_bytes: branches.iter().map(|b| b.pageserver.as_ref().and_then(|s| s.logical_size)).sum(),
        wal_held_bytes: wal_held,
        local_layer_bytes,
        remote_layer_bytes: sum(&|s| s.remote.as_ref().map(|r| r.remote_bytes)),
    }
}

/// One branch as the attached pageserver and each running safekeeper see it.
/// A shard's timeline as its attached pageserver answers, if it runs and answers.
fn shard_timeline(
    wd: &Workdir,
    shard: TenantShardId,
    timeline: TimelineId,
    placement: Option<&TenantPlacement>,
    running: bool,
) -> Option<TimelineStatus> {
    let ps = placement.and_then(|p| p.attached.as_deref()).and_then(|n| wd.service(n)).filter(|_| running)?;
    let url = format!("{}/v1/tenant/{shard}/timeline/{timeline}", ps.http_url());
    let get = |url: &str| http::get(url, QUICK).ok().filter(|r| r.status == 200).and_then(|r| r.json().ok());
    // A timeline whose size cannot be read (broken, say) still has a
    // status; only shard 0 holds every relation's size.
    let sized = if shard.shard.number == 0 { get(&format!("{url}?logical_size=true")) } else { None };
    sized.or_else(|| get(&url))
}

fn branch_status(
    wd: &Workdir,
    t: &Tenant,
    b: &Branch,
    placements: &[(TenantShardId, Option<TenantPlacement>)],
    running: &dyn Fn(&Option<TenantPlacement>) -> bool,
    sk_status: &[(String, Option<SafekeeperStatus>)],
) -> BranchStatus {
    let (tenant, timeline) = (t.tenant_id, b.timeline_id);
    let (home, home_placement) = &placements[0];
    let placement = home_placement.as_ref();
    let pageserver = shard_timeline(wd, *home, timeline, placement, running(home_placement));
    let shards = placements[1..]
        .iter()
        .map(|(id, p)| ShardPosition {
            shard: *id,
            attached: p.as_ref().and_then(|p| p.attached.clone()),
            generation: p.as_ref().map(|p| p.generation).filter(|g| *g > 0),
            pageserver: shard_timeline(wd, *id, timeline, p.as_ref(), running(p)),
        })
        .collect();
    let safekeepers = sk_status
        .iter()
        .map(|(name, body)| {
            let tl = body
                .as_ref()
                .and_then(|b| b.timelines.iter().find(|t| t.tenant_id == tenant && t.timeline_id == timeline));
            SafekeeperPosition {
                name: name.clone(),
                flush_lsn: tl.map(|t| t.flush_lsn),
                commit_lsn: tl.map(|t| t.commit_lsn),
                membership_generation: tl.map(|t| t.membership.generation),
            }
        })
        .collect();
    // The placement of the newest configuration any safekeeper holds.
    let wal_placement = sk_status
        .iter()
        .filter_map(|(_, body)| body.as_ref())
        .flat_map(|b| b.timelines.iter().filter(|t| t.tenant_id == tenant && t.timeline_id == timeline))
        .max_by_key(|t| t.membership.generation)
        .map(|t| t.membership.target().1)
        .unwrap_or_default();
    let wanted = b.placement.clone().unwrap_or_default();
    BranchStatus {
        branch: b.name.clone(),
        tenant: t.name.clone(),
        tenant_id: tenant,
        timeline_id: timeline,
        pageserver,
        attached: placement.and_then(|p| p.attached.clone()),
        generation: placement.map(|p| p.generation).filter(|g| *g > 0),
        secondaries: placement.map(|p| p.secondaries.clone()).unwrap_or_default(),
        placement_wanted: (wanted != wal_placement).then_some(wanted),
        placement: wal_placement,
        safekeepers,
        shards,
    }
}

/// An endpoint's state as its status tells it: `running`, `stopped`,
/// `running (<agent state>)` while the agent is not running PostgreSQL, …
fn endpoint_state(e: &EndpointStatus) -> String {
    let mut state = match (e.compute_state, e.orphan_postgres_pid) {
        (Some(c), _) if c != AgentState::Running => format!("{} ({})", e.state, c.name()),
        (_, Some(pid)) => format!("{} (PostgreSQL pid {pid} left running)", e.state),
        _ => e.state.clone(),
    };
    if e.crash_loop {
        state.push_str(" (crash loop)");
    }
    state
}

/// An endpoint's state in `strata status --json` (`EndpointStatus.state`):
/// its agent's liveness, except that an endpoint without a running agent
/// whose suspension marker is there is `suspended`.
pub fn endpoint_state_name(ep: &Endpoint, liveness: Liveness) -> &'static str {
    match liveness {
        Liveness::Stopped if ep.suspension().is_some() => SUSPENDED,
        other => other.name(),
    }
}

/// The state of a suspended endpoint.
pub const SUSPENDED: &str = "suspended";

/// `running`, `restarting`, `stopped`, `suspended`, `suspending` (its agent
/// stopping after its idle period), or `running (<agent state>)` while the
/// agent is not running PostgreSQL.
pub fn endpoint_state_text(ep: &Endpoint) -> String {
    let liveness = ep.supervised().liveness();
    match liveness {
        Liveness::Stopped => {
            let state = endpoint_state_name(ep, liveness);
            match endpoint::orphan_postgres(ep) {
                Some(pid) => format!("{state} (PostgreSQL pid {pid} left running)"),
                None => state.into(),
            }
        }
        Liveness::Restarting { .. } => "restarting".into(),
        Liveness::Running { .. } => match ep.agent_view() {
            Some(a) if a.state == AgentState::Stopping && ep.suspension().is_some() => "suspending".into(),
            Some(a) if a.state == AgentState::Running => "running".into(),
            Some(a) if a.restart.crash_loop => format!("running ({}, crash loop)", a.state.name()),
            Some(a) => format!("running ({})", a.state.name()),
            None => "running (no answer)".into(),
        },
    }
}

/// The first line of `text`, at most 80 characters (`…` when cut).
pub fn short(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= SHORT_CHARS && line.len() == text.trim_end().len() {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(SHORT_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Left-aligned columns separated by two spaces, one line per row.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// An optional value, or `-`.
fn or_dash(v: Option<impl std::fmt::Display>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// `name=port` for each listener.
fn ports(ports: &std::collections::BTreeMap<String, u16>) -> String {
    ports.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

fn megabytes(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Renders the collected status for people: services, endpoints, timelines.
fn render(st: &ClusterStatus) -> String {
    let mut out = format!("cluster {}\n\n", st.workdir.display());
    out.push_str(&render_tenants(st));
    out.push('\n');
    out.push_str(&render_services(st));
    out.push('\n');
    out.push_str(&render_endpoints(st));
    out.push('\n');
    out.push_str(&render_timelines(st));
    out
}

fn render_tenants(st: &ClusterStatus) -> String {
    let size = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |b| format!("{:.1} MB", megabytes(b)));
    let rows = st
        .tenants
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.tenant_id.to_string(),
                t.state.clone(),
                or_dash(t.attached.as_deref()),
                size(t.logical_bytes),
                size(t.wal_held_bytes),
                size(t.local_layer_bytes),
                size(t.remote_layer_bytes),
            ]
        })
        .collect();
    table(&["TENANT", "ID", "STATE", "ATTACHED", "LOGICAL", "WAL HELD", "LAYERS LOCAL", "LAYERS REMOTE"], rows)
}

fn render_services(st: &ClusterStatus) -> String {
    let rows = st
        .services
        .iter()
        .map(|s| {
            let state = if s.crash_loop { format!("{} (crash loop)", s.state) } else { s.state.clone() };
            vec![
                s.name.clone(),
                s.kind.clone(),
                state,
                or_dash(s.pid),
                s.restarts.to_string(),
                ports(&s.ports),
                short(&or_dash(s.last_exit.as_ref())),
            ]
        })
        .collect();
    table(&["NAME", "KIND", "STATE", "PID", "RESTARTS", "PORTS", "LAST EXIT"], rows)
}

fn render_endpoints(st: &ClusterStatus) -> String {
    if st.endpoints.is_empty() {
        return "no endpoints\n".into();
    }
    let rows = st
        .endpoints
        .iter()
        .map(|e| {
            vec![
                e.name.clone(),
                branch_label(&e.tenant, &e.branch),
                role_text(e),
                endpoint_state(e),
                or_dash(e.pid),
                e.restarts.to_string(),
                ports(&e.ports),
                short(&or_dash(e.last_cause.as_ref())),
                e.connstr.clone(),
            ]
        })
        .collect();
    table(&["ENDPOINT", "BRANCH", "ROLE", "STATE", "PID", "RESTARTS", "PORTS", "LAST CAUSE", "CONNECTION"], rows)
}

/// `tenant/branch`, or `branch` in the default tenant.
fn branch_label(tenant: &str, branch: &str) -> String {
    match tenant {
        "" | DEFAULT_TENANT => branch.to_string(),
        tenant => format!("{tenant}/{branch}"),
    }
}

/// Each timeline: its pageserver's view, its placement when not a
/// majority, and each safekeeper's positions.
fn render_timelines(st: &ClusterStatus) -> String {
    let ps_running = st.services.iter().any(|s| s.kind == Kind::Pageserver.as_str() && s.state == "running");
    let mut rows = Vec::new();
    for t in &st.timelines {
        let branch = branch_label(&t.tenant, &t.branch);
        let head = |source: &str| vec![branch.clone(), t.timeline_id.to_string(), source.to_string()];
        let first = t.attached.as_deref().unwrap_or("pageserver");
        let mut row = match t.shards.first() {
            // Shard 0's, named as the others are.
            Some(s) => head(&format!(
                "{first} ({})",
                shard_name(TenantShardId { shard: ShardIndex { number: 0, ..s.shard.shard }, ..s.shard })
            )),
            None => head(first),
        };
        match &t.pageserver {
            None if t.attached.is_none() => {
                row.extend(["-".into(), "(not attached: no storage controller answered)".into()])
            }
            None => row.extend(["-".into(), if ps_running { "(no answer)" } else { "(not running)" }.into()]),
            Some(ps) => row.extend([ps.state.to_string(), pageserver_lsns(t, ps)]),
        }
        rows.push(row);
        for s in &t.shards {
            let source = format!("{} ({})", s.attached.as_deref().unwrap_or("-"), shard_name(s.shard));
            let mut row = head(&source);
            match &s.pageserver {
                None => row.extend(["-".into(), "(no answer)".into()]),
                Some(ps) => {
                    let generation = s.generation.map(|g| format!("generation={g} ")).unwrap_or_default();
                    let lsns =
                        format!("{generation}last_record={} {:.1} MB", ps.last_record_lsn, megabytes(ps.layer_bytes));
                    row.extend([ps.state.to_string(), lsns]);
                }
            }
            rows.push(row);
        }
        if !t.placement.is_majority() || t.placement_wanted.is_some() {
            let mut text = super::report::describe_placement(&t.placement);
            if let Some(w) = &t.placement_wanted {
                text.push_str(&format!(
                    " (wanted: {}, applied once every safekeeper runs)",
                    super::report::describe_placement(w)
                ));
            }
            rows.push([head("placement"), vec!["-".into(), text]].concat());
        }
        for sk in &t.safekeepers {
            let mut row = head(&sk.name);
            match (sk.flush_lsn, sk.commit_lsn) {
                (Some(flush), Some(commit)) => {
                    let mut lsns = format!("flush={flush} commit={commit}");
                    // Shown once the timeline's membership has changed (docs/safekeeper-membership.md).
                    if let Some(g) = sk.membership_generation.filter(|g| *g > 0) {
                        lsns.push_str(&format!(" membership_generation={g}"));
                    }
                    row.extend(["-".into(), lsns]);
                }
                _ => row.extend(["-".into(), "(no such timeline)".into()]),
            }
            rows.push(row);
        }
    }
    table(&["BRANCH", "TIMELINE", "SOURCE", "STATE", "LSNS"], rows)
}

/// A shard as the status names it: `1of4`.
fn shard_name(id: TenantShardId) -> String {
    format!("{}of{}", id.shard.number, id.shard.count)
}

/// The pageserver's LSNs and layers of a timeline (with its placement
/// when a storage controller placed it), and object storage's.
fn pageserver_lsns(t: &BranchStatus, ps: &strata_protocol::api::pageserver::TimelineStatus) -> String {
    let placement = match (&t.attached, t.generation) {
        (Some(_), Some(g)) if t.secondaries.is_empty() => format!("generation={g} secondaries=- "),
        (Some(_), Some(g)) => format!("generation={g} secondaries={} ", t.secondaries.join(",")),
        _ => String::new(),
    };
    let mut lsns = placement
        + &format!(
            "last_record={} disk_consistent={} gc_cutoff={} layers(L0/L1/image)={}/{}/{} {:.1} MB",
            ps.last_record_lsn,
            ps.disk_consistent_lsn,
            ps.gc_cutoff_lsn,
            ps.l0_layers,
            ps.l1_layers,
            ps.image_layers,
            megabytes(ps.layer_bytes)
        );
    if let Some(remote) = &ps.remote {
        lsns.push_str(&format!(
            " local={} {:.1} MB remote={} {:.1} MB remote_consistent={} upload_queue={} {:.1} MB",
            ps.local_layers,
            megabytes(ps.local_layer_bytes),
            remote.remote_layers,
            megabytes(remote.remote_bytes),
            remote.remote_consistent_lsn,
            remote.upload_queue_layers,
            megabytes(remote.upload_lag_bytes),
        ));
        if let Some(e) = &remote.upload_error {
            lsns.push_str(&format!(" upload_error={}", short(e)));
        }
    }
    lsns
}

/// `strata status [--json]`: what it prints (JSON ends with a newline too).
pub fn report(wd: &Workdir, json: bool) -> Result<String> {
    let st = collect(wd)?;
    Ok(if json { serde_json::to_string_pretty(&st).expect("the status serializes") + "\n" } else { render(&st) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::Lsn;
    use strata_protocol::{TenantId, TimelineId};

    #[test]
    fn table_aligns() {
        let t = table(&["A", "LONGER"], vec![vec!["xyz".into(), "1".into()], vec!["q".into(), "22".into()]]);
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
    }

    #[test]
    fn short_cells() {
        assert_eq!(short("one line"), "one line");
        assert_eq!(short("first\nsecond"), "first…");
        let long = "x".repeat(200);
        assert_eq!(short(&long).chars().count(), SHORT_CHARS);
        assert!(short(&long).ends_with('…'));
    }

    #[test]
    fn endpoint_restarts_add_up_and_take_the_latest_cause() {
        let sup = Restarts {
            restarts: 1,
            last_exit: Some("signal 9: SIGKILL".into()),
            last_exit_at: Some(100),
            crash_loop: false,
        };
        let agent = RestartStatus {
            restarts: 2,
            last_restart_cause: Some("PostgreSQL exited (exit code 1)".into()),
            last_restart_at: Some(200),
            ..Default::default()
        };
        let r = combine(&sup, Some(&agent));
        assert_eq!((r.total, r.agent, r.postgres), (3, 1, 2));
        assert_eq!(r.last_cause.as_deref(), Some("PostgreSQL exited (exit code 1)"));
        assert!(!r.crash_loop);
        let later = Restarts { last_exit_at: Some(300), crash_loop: true, ..sup.clone() };
        let r = combine(&later, Some(&agent));
        assert_eq!(r.last_cause.as_deref(), Some("the compute agent exited (signal 9: SIGKILL)"));
        assert!(r.crash_loop);
        assert_eq!(combine(&Restarts::default(), None), EndpointRestarts::default());
        assert_eq!(combine(&sup, None).last_cause.as_deref(), Some("the compute agent exited (signal 9: SIGKILL)"));
    }

    #[test]
    fn renders_stopped_cluster() {
        let service = |name: &str, state: &str, port: u16, restarts: u64, last_exit: Option<&str>| ServiceStatus {
            host: "local".into(),
            site: "local".into(),
            name: name.into(),
            kind: "safekeeper".into(),
            pid: None,
            supervisor_pid: None,
            supervised: false,
            ports: [("http".to_string(), port)].into(),
            state: state.into(),
            restarts,
            last_exit: last_exit.map(str::to_string),
            last_exit_at: None,
            crash_loop: restarts > 5,
            config: "/w/sk/safekeeper.toml".into(),
            log: "/w/sk/log".into(),
            data_dir: None,
            remote_storage: None,
        };
        let st = ClusterStatus {
            workdir: "/w".into(),
            tenants: vec![
                TenantStatus {
                    name: "default".into(),
                    tenant_id: TenantId([1; 16]),
                    state: "active".into(),
                    attached: Some("ps1".into()),
                    logical_bytes: Some(30_000_000),
                    wal_held_bytes: Some(16_777_216),
                    local_layer_bytes: None,
                    remote_layer_bytes: Some(1_000_000),
                },
                TenantStatus {
                    name: "acme".into(),
                    tenant_id: TenantId([3; 16]),
                    state: "deleting".into(),
                    ..Default::default()
                },
            ],
            services: vec![
                service("sk1", "stopped", 1, 0, None),
                service("sk2", "restarting", 2, 6, Some("signal 9: SIGKILL")),
            ],
            endpoints: vec![],
            timelines: vec![BranchStatus {
                branch: "main".into(),
                tenant: "acme".into(),
                tenant_id: TenantId([1; 16]),
                timeline_id: TimelineId([2; 16]),
                pageserver: None,
                attached: None,
                generation: None,
                secondaries: vec![],
                placement: strata_protocol::safekeeper::Placement::Stretched,
                placement_wanted: Some(strata_protocol::safekeeper::Placement::Majority),
                safekeepers: vec![SafekeeperPosition {
                    name: "sk1".into(),
                    flush_lsn: Some(Lsn(0x10)),
                    commit_lsn: Some(Lsn(8)),
                    membership_generation: None,
                }],
                shards: vec![ShardPosition {
                    shard: TenantShardId { tenant: TenantId([1; 16]), shard: ShardIndex::new(1, 2).unwrap() },
                    attached: Some("ps2".into()),
                    generation: Some(3),
                    pageserver: None,
                }],
            }],
        };
        let out = render(&st);
        assert!(out.contains("sk1   safekeeper  stopped                  -    0         http=1  -\n"), "{out}");
        assert!(
            out.contains("sk2   safekeeper  restarting (crash loop)  -    6         http=2  signal 9: SIGKILL"),
            "{out}"
        );
        assert!(out.contains("flush=0/10 commit=0/8"), "{out}");
        // Each tenant with its sizes; a branch of a tenant but the default one is named with it.
        assert!(out.contains("default  01010101010101010101010101010101  active    ps1       30.0 MB  16.8 MB   -             1.0 MB\n"), "{out}");
        assert!(
            out.contains(
                "acme     03030303030303030303030303030303  deleting  -         -        -         -             -\n"
            ),
            "{out}"
        );
        assert!(out.contains("acme/main  02020202020202020202020202020202  sk1"), "{out}");
        assert!(out.contains("no endpoints"), "{out}");
        assert!(out.contains("stretched (wanted: majority, applied once every safekeeper runs)"), "{out}");
        assert!(out.contains("pageserver (0of2)  -      (not attached: no storage controller answered)"), "{out}");
        assert!(out.contains("ps2 (1of2)         -      (no answer)"), "{out}");
    }
}
