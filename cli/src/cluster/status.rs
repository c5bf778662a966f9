//! `strata status`: every service, endpoint and timeline, as a table or
//! JSON. Works whatever runs: a stopped service is reported, not an error.

use serde_json::{json, Value};

use super::endpoint::{self, Endpoint};
use super::layout::{Kind, Workdir};
use super::{http, services, Result};

/// The whole status as JSON (the `--json` output).
pub fn collect(wd: &Workdir) -> Result<Value> {
    let c = &wd.cluster;
    let mut service_rows = Vec::new();
    for s in &c.services {
        let pid = services::running(wd, s);
        service_rows.push(json!({
            "name": s.name,
            "kind": s.kind.as_str(),
            "pid": pid,
            "ports": s.ports,
            "state": if pid.is_some() { "running" } else { "stopped" },
            "config": wd.config_path(s),
            "log": wd.log_path(&s.name),
        }));
    }

    let mut endpoint_rows = Vec::new();
    for ep in endpoint::load_all(wd)? {
        let pid = ep.identity().running();
        let agent = pid.and_then(|_| ep.agent_state());
        endpoint_rows.push(json!({
            "name": ep.file.name,
            "kind": "compute",
            "pid": pid,
            "ports": { "pg": ep.file.pg_port, "http": ep.file.http_port },
            "branch": ep.file.branch,
            "timeline_id": c.branch(&ep.file.branch).map(|b| b.timeline_id.to_string()),
            "state": if pid.is_some() { "running" } else { "stopped" },
            "compute_state": agent.as_ref().map(|a| a.0.clone()),
            "compute_error": agent.and_then(|a| a.1),
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

/// `running`, `stopped`, or `running (<agent state>)` while it is not yet ready.
pub fn endpoint_state_text(ep: &Endpoint) -> String {
    match ep.identity().running() {
        None => match endpoint::orphan_postgres(ep) {
            Some(pid) => format!("stopped (PostgreSQL pid {pid} left running)"),
            None => "stopped".into(),
        },
        Some(_) => match ep.agent_state() {
            Some((s, _)) if s == "running" => "running".into(),
            Some((s, _)) => format!("running ({s})"),
            None => "running (no answer)".into(),
        },
    }
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

    let rows = arr("services")
        .iter()
        .map(|s| vec![text(&s["name"]), text(&s["kind"]), text(&s["state"]), text(&s["pid"]), ports(&s["ports"])])
        .collect();
    out.push_str(&table(&["NAME", "KIND", "STATE", "PID", "PORTS"], rows));

    out.push('\n');
    let endpoints = arr("endpoints");
    if endpoints.is_empty() {
        out.push_str("no endpoints\n");
    } else {
        let rows = endpoints
            .iter()
            .map(|e| {
                let state = match (&e["state"], &e["compute_state"], &e["orphan_postgres_pid"]) {
                    (s, Value::String(c), _) if c != "running" => format!("{} ({c})", text(s)),
                    (s, _, Value::Number(pid)) => format!("{} (PostgreSQL pid {pid} left running)", text(s)),
                    (s, _, _) => text(s),
                };
                vec![
                    text(&e["name"]),
                    text(&e["branch"]),
                    state,
                    text(&e["pid"]),
                    ports(&e["ports"]),
                    text(&e["connstr"]),
                ]
            })
            .collect();
        out.push_str(&table(&["ENDPOINT", "BRANCH", "STATE", "PID", "PORTS", "CONNECTION"], rows));
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
                row.push(format!(
                    "last_record={} disk_consistent={}",
                    text(&ps["last_record_lsn"]),
                    text(&ps["disk_consistent_lsn"])
                ));
            }
        }
        rows.push(row);
        for sk in t["safekeepers"].as_array().cloned().unwrap_or_default() {
            let mut row = head(&text(&sk["name"]));
            if sk["flush_lsn"].is_null() {
                row.extend(["-".into(), "(no such timeline)".into()]);
            } else {
                row.push("-".into());
                row.push(format!("flush={} commit={}", text(&sk["flush_lsn"]), text(&sk["commit_lsn"])));
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
    fn renders_stopped_cluster() {
        let st = json!({
            "workdir": "/w", "tenant_id": "t",
            "services": [{"name": "sk1", "kind": "safekeeper", "state": "stopped", "pid": null, "ports": {"http": 1}}],
            "endpoints": [],
            "timelines": [{"branch": "main", "timeline_id": "l", "pageserver": null,
                           "safekeepers": [{"name": "sk1", "flush_lsn": "0/10", "commit_lsn": "0/8"}]}],
        });
        let out = render(&st);
        assert!(out.contains("sk1   safekeeper  stopped  -    http=1"), "{out}");
        assert!(out.contains("flush=0/10 commit=0/8"), "{out}");
        assert!(out.contains("no endpoints"), "{out}");
        assert!(out.contains("pageserver  -      (not running)"), "{out}");
    }
}
