//! `strata status`: every service, endpoint and timeline, as a table or
//! JSON. Works whatever runs: a stopped service is reported, not an error.

use serde_json::{json, Value};

use super::endpoint::{self, AgentView, Endpoint};
use super::error::Result;
use super::layout::{Kind, Workdir};
use super::supervisor::Liveness;
use super::{http, services};

/// Longest cause shown in a table cell.
const SHORT_CHARS: usize = 80;

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
fn combine(supervisor: &super::supervisor::Restarts, agent: Option<&AgentView>) -> EndpointRestarts {
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
    combine(&sv.restarts(), agent.as_ref())
}

/// `strata endpoint list`: name, branch, port, state, restarts, the last
/// cause of a restart, and the connection string.
pub fn list_endpoints(wd: &Workdir) -> Result<()> {
    let endpoints = endpoint::load_all(wd)?;
    if endpoints.is_empty() {
        println!("no endpoints (create one with `strata endpoint start NAME --workdir {}`)", wd.root.display());
        return Ok(());
    }
    let rows = endpoints
        .iter()
        .map(|ep| {
            let r = endpoint_restarts(ep);
            vec![
                ep.file.name.clone(),
                ep.file.branch.clone(),
                ep.file.pg_port.to_string(),
                endpoint_state_text(ep),
                r.total.to_string(),
                short(r.last_cause.as_deref().unwrap_or("-")),
                ep.connstr(),
            ]
        })
        .collect();
    // The connection string last: scripts take the last field.
    print!("{}", table(&["NAME", "BRANCH", "PORT", "STATE", "RESTARTS", "LAST CAUSE", "CONNECTION"], rows));
    Ok(())
}

/// The whole status as JSON (the `--json` output).
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
    }
}

pub fn collect(wd: &Workdir) -> Result<Value> {
    let c = &wd.cluster;
    let mut service_rows = Vec::new();
    for s in &c.services {
        let sv = services::supervised(wd, s);
        let liveness = sv.liveness();
        let r = sv.restarts();
        let (data_dir, remote_storage) = storage_of(wd, s);
        service_rows.push(json!({
            "name": s.name,
            "kind": s.kind.as_str(),
            "pid": liveness.pid(),
            "supervisor_pid": liveness.supervisor(),
            "supervised": liveness.supervisor().is_some(),
            "ports": s.ports,
            "state": liveness.name(),
            "restarts": r.restarts,
            "last_exit": r.last_exit,
            "last_exit_at": r.last_exit_at,
            "crash_loop": r.crash_loop,
            "config": wd.config_path(s),
            "log": wd.log_path(&s.name),
            "data_dir": data_dir,
            "remote_storage": remote_storage,
        }));
    }

    let mut endpoint_rows = Vec::new();
    for ep in endpoint::load_all(wd)? {
        let sv = ep.supervised();
        let liveness = sv.liveness();
        let supervisor = sv.restarts();
        let agent = liveness.pid().and_then(|_| ep.agent_view());
        let restarts = combine(&supervisor, agent.as_ref());
        endpoint_rows.push(json!({
            "name": ep.file.name,
            "kind": "compute",
            "pid": liveness.pid(),
            "supervisor_pid": liveness.supervisor(),
            "supervised": liveness.supervisor().is_some(),
            "ports": { "pg": ep.file.pg_port, "http": ep.file.http_port },
            "branch": ep.file.branch,
            "timeline_id": c.branch(&ep.file.branch).map(|b| b.timeline_id.to_string()),
            "state": liveness.name(),
            "compute_state": agent.as_ref().map(|a| a.state.clone()),
            "compute_error": agent.as_ref().and_then(|a| a.error.clone()),
            "restarts": restarts.total,
            "agent_restarts": restarts.agent,
            "postgres_restarts": restarts.postgres,
            "last_exit": supervisor.last_exit,
            "last_exit_at": supervisor.last_exit_at,
            "last_restart_cause": agent.as_ref().and_then(|a| a.last_restart_cause.clone()),
            "last_restart_at": agent.as_ref().and_then(|a| a.last_restart_at),
            "last_restart_downtime_seconds": agent.as_ref().and_then(|a| a.last_restart_downtime_seconds),
            "last_cause": restarts.last_cause,
            "crash_loop": restarts.crash_loop,
            "orphan_postgres_pid": endpoint::orphan_postgres(&ep),
            "connstr": ep.connstr(),
            "log": ep.log(),
        }));
    }

    // One status query per running safekeeper covers every timeline.
    let mut sk_status = Vec::new();
    for s in c.of_kind(Kind::Safekeeper) {
        if services::running(wd, s).is_some() {
            let body = http::get(&format!("{}/v1/status", s.http_url()), http::QUICK)
                .ok()
                .filter(|r| r.status == 200)
                .map(|r| r.body);
            sk_status.push((s.name.clone(), body));
        }
    }
    let ps = c.pageserver();
    let ps_running = services::running(wd, ps).is_some();
    let mut timelines = Vec::new();
    for b in &c.branches {
        let (tenant, timeline) = (c.tenant_id.to_string(), b.timeline_id.to_string());
        let pageserver = if ps_running {
            let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", ps.http_url());
            http::get(&url, http::QUICK).ok().filter(|r| r.status == 200).map(|r| r.body)
        } else {
            None
        };
        let safekeepers: Vec<Value> = sk_status
            .iter()
            .map(|(name, body)| {
                let tl = body.as_ref().and_then(|b| b.get("timelines")).and_then(|t| t.as_array()).and_then(|all| {
                    all.iter().find(|t| t["tenant_id"] == tenant.as_str() && t["timeline_id"] == timeline.as_str())
                });
                json!({
                    "name": name,
                    "flush_lsn": tl.map(|t| t["flush_lsn"].clone()),
                    "commit_lsn": tl.map(|t| t["commit_lsn"].clone()),
                    "membership_generation": tl.map(|t| t["membership"]["generation"].clone()),
                })
            })
            .collect();
        timelines.push(json!({
            "branch": b.name,
            "tenant_id": tenant,
            "timeline_id": timeline,
            "pageserver": pageserver,
            "safekeepers": safekeepers,
        }));
    }

    Ok(json!({
        "workdir": wd.root,
        "tenant_id": c.tenant_id.to_string(),
        "services": service_rows,
        "endpoints": endpoint_rows,
        "timelines": timelines,
    }))
}

/// `running`, `restarting`, `stopped`, or `running (<agent state>)` while
/// the agent is not running PostgreSQL.
pub fn endpoint_state_text(ep: &Endpoint) -> String {
    match ep.supervised().liveness() {
        Liveness::Stopped => match endpoint::orphan_postgres(ep) {
            Some(pid) => format!("stopped (PostgreSQL pid {pid} left running)"),
            None => "stopped".into(),
        },
        Liveness::Restarting { .. } => "restarting".into(),
        Liveness::Running { .. } => match ep.agent_view() {
            Some(a) if a.state == "running" => "running".into(),
            Some(a) if a.crash_loop => format!("running ({}, crash loop)", a.state),
            Some(a) => format!("running ({})", a.state),
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

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Renders the collected status for people.
fn render(st: &Value) -> String {
    let mut out = format!("cluster {}  tenant {}\n\n", text(&st["workdir"]), text(&st["tenant_id"]));
    let arr = |k: &str| st[k].as_array().cloned().unwrap_or_default();
    let ports = |p: &Value| {
        p.as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };

    let state = |s: &Value| {
        if s["crash_loop"] == true {
            format!("{} (crash loop)", text(&s["state"]))
        } else {
            text(&s["state"])
        }
    };
    let rows = arr("services")
        .iter()
        .map(|s| {
            vec![
                text(&s["name"]),
                text(&s["kind"]),
                state(s),
                text(&s["pid"]),
                text(&s["restarts"]),
                ports(&s["ports"]),
                short(&text(&s["last_exit"])),
            ]
        })
        .collect();
    out.push_str(&table(&["NAME", "KIND", "STATE", "PID", "RESTARTS", "PORTS", "LAST EXIT"], rows));

    out.push('\n');
    let endpoints = arr("endpoints");
    if endpoints.is_empty() {
        out.push_str("no endpoints\n");
    } else {
        let rows = endpoints
            .iter()
            .map(|e| {
                let mut state = match (&e["state"], &e["compute_state"], &e["orphan_postgres_pid"]) {
                    (s, Value::String(c), _) if c != "running" => format!("{} ({c})", text(s)),
                    (s, _, Value::Number(pid)) => format!("{} (PostgreSQL pid {pid} left running)", text(s)),
                    (s, _, _) => text(s),
                };
                if e["crash_loop"] == true {
                    state.push_str(" (crash loop)");
                }
                vec![
                    text(&e["name"]),
                    text(&e["branch"]),
                    state,
                    text(&e["pid"]),
                    text(&e["restarts"]),
                    ports(&e["ports"]),
                    short(&text(&e["last_cause"])),
                    text(&e["connstr"]),
                ]
            })
            .collect();
        out.push_str(&table(
            &["ENDPOINT", "BRANCH", "STATE", "PID", "RESTARTS", "PORTS", "LAST CAUSE", "CONNECTION"],
            rows,
        ));
    }

    out.push('\n');
    let ps_running = arr("services").iter().any(|s| s["kind"] == "pageserver" && s["state"] == "running");
    let mut rows = Vec::new();
    for t in arr("timelines") {
        let head = |source: &str| vec![text(&t["branch"]), text(&t["timeline_id"]), source.to_string()];
        let mut row = head("pageserver");
        match &t["pageserver"] {
            Value::Null => row.extend(["-".into(), if ps_running { "(no answer)" } else { "(not running)" }.into()]),
            ps => {
                row.push(text(&ps["state"]));
                let mut lsns = format!(
                    "last_record={} disk_consistent={}",
                    text(&ps["last_record_lsn"]),
                    text(&ps["disk_consistent_lsn"])
                );
                if ps["layer_bytes"].is_u64() {
                    lsns.push_str(&format!(
                        " gc_cutoff={} layers(L0/L1/image)={}/{}/{} {:.1} MB",
                        text(&ps["gc_cutoff_lsn"]),
                        text(&ps["l0_layers"]),
                        text(&ps["l1_layers"]),
                        text(&ps["image_layers"]),
                        ps["layer_bytes"].as_u64().unwrap_or(0) as f64 / 1e6
                    ));
                }
                let remote = &ps["remote"];
                if remote.is_object() {
                    lsns.push_str(&format!(
                        " local={} {:.1} MB remote={} {:.1} MB remote_consistent={} upload_queue={} {:.1} MB",
                        text(&ps["local_layers"]),
                        ps["local_layer_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
                        text(&remote["remote_layers"]),
                        remote["remote_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
                        text(&remote["remote_consistent_lsn"]),
                        text(&remote["upload_queue_layers"]),
                        remote["upload_lag_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
                    ));
                    if let Some(e) = remote["upload_error"].as_str() {
                        lsns.push_str(&format!(" upload_error={}", short(e)));
                    }
                }
                row.push(lsns);
            }
        }
        rows.push(row);
        for sk in t["safekeepers"].as_array().cloned().unwrap_or_default() {
            let mut row = head(&text(&sk["name"]));
            if sk["flush_lsn"].is_null() {
                row.extend(["-".into(), "(no such timeline)".into()]);
            } else {
                row.push("-".into());
                let mut lsns = format!("flush={} commit={}", text(&sk["flush_lsn"]), text(&sk["commit_lsn"]));
                // Shown once the timeline's membership has changed (docs/safekeeper-membership.md).
                if let Some(g) = sk["membership_generation"].as_u64().filter(|g| *g > 0) {
                    lsns.push_str(&format!(" membership_generation={g}"));
                }
                row.push(lsns);
            }
            rows.push(row);
        }
    }
    out.push_str(&table(&["BRANCH", "TIMELINE", "SOURCE", "STATE", "LSNS"], rows));
    out
}

/// `strata status [--json]`.
pub fn print(wd: &Workdir, json: bool) -> Result<()> {
    let st = collect(wd)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st).expect("a JSON value serializes"));
    } else {
        print!("{}", render(&st));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        use super::super::supervisor::Restarts;
        let sup = Restarts {
            restarts: 1,
            last_exit: Some("signal 9: SIGKILL".into()),
            last_exit_at: Some(100),
            crash_loop: false,
        };
        let agent = AgentView {
            state: "running".into(),
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
        let st = json!({
            "workdir": "/w", "tenant_id": "t",
            "services": [{"name": "sk1", "kind": "safekeeper", "state": "stopped", "pid": null, "ports": {"http": 1},
                          "restarts": 0, "last_exit": null, "crash_loop": false},
                         {"name": "sk2", "kind": "safekeeper", "state": "restarting", "pid": null, "ports": {"http": 2},
                          "restarts": 6, "last_exit": "signal 9: SIGKILL", "crash_loop": true}],
            "endpoints": [],
            "timelines": [{"branch": "main", "timeline_id": "l", "pageserver": null,
                           "safekeepers": [{"name": "sk1", "flush_lsn": "0/10", "commit_lsn": "0/8"}]}],
        });
        let out = render(&st);
        assert!(out.contains("sk1   safekeeper  stopped                  -    0         http=1  -\n"), "{out}");
        assert!(
            out.contains("sk2   safekeeper  restarting (crash loop)  -    6         http=2  signal 9: SIGKILL"),
            "{out}"
        );
        assert!(out.contains("flush=0/10 commit=0/8"), "{out}");
        assert!(out.contains("no endpoints"), "{out}");
        assert!(out.contains("pageserver  -      (not running)"), "{out}");
    }
}
