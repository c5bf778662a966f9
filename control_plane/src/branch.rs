//! `strata branch create|list`: branches of the local cluster's tenant
//! (`docs/branches.md`). A branch is a timeline that begins at a point of
//! another: metadata on the pageserver, a new WAL timeline on the
//! safekeepers, a line in `cluster.toml`.

use strata_formats::Lsn;
use strata_protocol::api::cluster::BranchInfo;
use strata_protocol::api::pageserver::{self, CreateBranchRequest};
use strata_protocol::api::safekeeper;
use strata_protocol::TimelineId;

use super::error::{failed, Error, Result};
use super::layout::{update_cluster, Branch, Kind, Tenant, Workdir, MAIN_BRANCH};
use super::report::{EndpointEvent, Progress};
use super::{endpoint, http, services};
use crate::limits::{BRANCH_CREATE_TIMEOUT, QUICK};

/// Branch names go into `cluster.toml` and command lines: keep them plain.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!("invalid branch name {name:?}: use letters, digits, '-' and '_' (at most 63)")))
    }
}

/// The branch's newest commit, if anything running knows it: the highest
/// commit LSN of the WAL proposers of its running endpoints and of the
/// running safekeepers. The proposer's comes first: a commit is
/// acknowledged to its client once the proposer's commit LSN passes it,
/// and the safekeepers learn that LSN a moment later (with the next append,
/// or after the proposer's commit update delay), so a branch made right
/// after a commit would otherwise begin before it.
pub(crate) fn newest_commit(wd: &Workdir, t: &Tenant, branch: &Branch) -> Result<Option<Lsn>> {
    let (tenant, timeline) = (t.tenant_id, branch.timeline_id);
    let from_safekeepers = wd.cluster.of_kind(Kind::Safekeeper).filter(|s| services::is_up(wd, s)).filter_map(|s| {
        let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", s.http_url());
        let r = http::get(&url, QUICK).ok().filter(|r| r.status == 200)?;
        r.json::<safekeeper::TimelineStatus>().ok().map(|t| t.commit_lsn)
    });
    let from_proposers = endpoint::inventory(wd)?
        .into_iter()
        .filter(|r| r.file.tenant == t.name && r.file.branch == branch.name && r.state != "stopped")
        .filter_map(|r| endpoint::compute_status_of(wd, r.file))
        .map(|s| s.proposer.commit_lsn)
        .filter(|lsn| *lsn != Lsn::INVALID);
    Ok(from_safekeepers.chain(from_proposers).max())
}

/// A branch `strata branch create` made: `branch dev: timeline T, from main at L`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchCreated {
    pub name: String,
    pub timeline: TimelineId,
    pub parent: String,
    /// Where it begins in its parent.
    pub start: Lsn,
}

impl std::fmt::Display for BranchCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BranchCreated { name, timeline, parent, start } = self;
        write!(f, "branch {name}: timeline {timeline}, from {parent} at {start}")
    }
}

/// Where a new branch begins: `--at LSN`, `--at-time TS` or neither (the
/// parent's newest commit).
#[derive(Clone, Copy, Debug, Default)]
pub struct BranchPoint<'a> {
    pub at: Option<&'a str>,
    pub at_time: Option<&'a str>,
}

/// `strata branch create NAME [--from PARENT] [--at LSN | --at-time TS]`;
/// reports the new timeline's creation on the safekeepers.
pub fn create(
    wd: &Workdir,
    tenant: &str,
    name: &str,
    from: Option<&str>,
    point: BranchPoint<'_>,
    progress: &mut dyn Progress,
) -> Result<BranchCreated> {
    check_name(name)?;
    let t = wd.cluster.tenant_named(tenant)?;
    if t.branch(name).is_some() {
        return failed(format!("a branch named {name:?} exists"));
    }
    super::split::refuse_while_open(wd, t, "create the branch")?;
    let parent_name = from.unwrap_or(MAIN_BRANCH);
    let Some(parent) = t.branch(parent_name).cloned() else {
        return failed(format!("no branch named {parent_name:?} (branches: {})", t.branch_names()));
    };
    let made = new_timeline(wd, t, &parent, point).map_err(|e| match e {
        Error::Failed(m) => Error::Failed(format!("branch {name}: {m}")),
        usage => usage,
    })?;
    let NewTimeline { timeline_id, start, ref point_time } = made;
    update_cluster(&wd.root, |cluster| {
        let t = cluster.tenant_mut(tenant).ok_or_else(|| Error::Failed(format!("tenant {tenant} was deleted")))?;
        t.branches.push(Branch {
            name: name.to_string(),
            timeline_id,
            parent: Some(parent_name.to_string()),
            ancestor_lsn: Some(start),
            // A branch's WAL is placed as its parent's.
            placement: parent.placement.clone(),
            divergent: None,
            // And its major (an upgraded branch's children are of its major).
            pg_version: parent.pg_version,
            created_at: Some(crate::supervisor_state::unix_now()),
            point_time: point_time.clone(),
        });
        Ok(())
    })?;
    // Its WAL timeline on every running safekeeper (the others get it at `strata start`).
    let wd = Workdir::open(&wd.root)?;
    services::ensure_branch(&wd, wd.cluster.tenant_named(tenant)?, name, progress)?;
    Ok(BranchCreated { name: name.into(), timeline: timeline_id, parent: parent_name.into(), start })
}

/// A timeline made on the pageservers as a branch of `parent` (not yet in
/// `cluster.toml` nor on the safekeepers).
struct NewTimeline {
    timeline_id: TimelineId,
    /// Where it begins in its parent.
    start: Lsn,
    /// The time it was asked for, normalized, when it was made at a time.
    point_time: Option<String>,
}

/// Makes a new timeline of `parent` on the pageservers of every shard, at
/// `point` (its newest commit when the point names nothing).
fn new_timeline(wd: &Workdir, t: &Tenant, parent: &Branch, point: BranchPoint<'_>) -> Result<NewTimeline> {
    let BranchPoint { at, at_time } = point;
    let ps = super::controller::attached(wd, t.home())?;
    if !services::is_up(wd, ps) {
        return failed(format!("{} is not running (start it with `strata start`)", ps.name));
    }
    let timeline_id = TimelineId::generate();
    let mut body = CreateBranchRequest {
        timeline_id: Some(timeline_id),
        ancestor_timeline_id: parent.timeline_id,
        ancestor_lsn: None,
        ancestor_time: None,
    };
    let mut point_time = None;
    match (at, at_time) {
        (Some(_), Some(_)) => return Err(Error::Usage("give --at or --at-time, not both".into())),
        (Some(lsn), None) => {
            let lsn: Lsn = lsn.parse().map_err(|e| Error::Usage(format!("--at {lsn:?}: {e}")))?;
            // Said at once rather than after the pageserver's wait for it.
            if let Some(newest) = newest_commit(wd, t, parent)?.filter(|n| lsn > *n) {
                return failed(format!("{lsn} is in the future: the newest commit of {} is {newest}", parent.name));
            }
            body.ancestor_lsn = Some(lsn);
        }
        (None, Some(time)) => {
            let time = super::options::parse_time(time, "--at-time")?;
            body.ancestor_time = Some(time.clone());
            point_time = Some(time);
        }
        // The parent's newest commit: what its safekeepers hold committed
        // (the pageserver waits until it has ingested it).
        (None, None) => {
            body.ancestor_lsn = newest_commit(wd, t, parent)?;
        }
    }
    let url = format!("{}/v1/tenant/{}/timeline", ps.http_url(), t.home());
    let r = http::post(&url, &body, BRANCH_CREATE_TIMEOUT).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
    if r.status != 201 {
        return failed(format!("{}: {} (HTTP {})", ps.name, r.error_text(), r.status));
    }
    let start = r
        .json::<pageserver::TimelineStatus>()
        .map_err(|e| Error::Failed(format!("{}: the new timeline: {e}", ps.name)))?
        .start_lsn;
    // Every other shard branches at the LSN shard 0 resolved (a time is
    // resolved once), so that all of them are one branch.
    for shard in &t.shard_ids()[1..] {
        let ps = super::controller::attached(wd, *shard)?;
        let body = CreateBranchRequest { ancestor_lsn: Some(start), ancestor_time: None, ..body.clone() };
        let url = format!("{}/v1/tenant/{shard}/timeline", ps.http_url());
        let r =
            http::post(&url, &body, BRANCH_CREATE_TIMEOUT).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
        if r.status != 201 {
            return failed(format!("shard {shard} on {}: {} (HTTP {})", ps.name, r.error_text(), r.status));
        }
    }

    Ok(NewTimeline { timeline_id, start, point_time })
}

/// A branch `strata branch delete` deleted: `branch dev: deleted (timeline T)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchDeleted {
    pub name: String,
    pub timeline: TimelineId,
}

impl std::fmt::Display for BranchDeleted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "branch {}: deleted (timeline {})", self.name, self.timeline)
    }
}

/// `strata branch delete NAME [--force]`: refused while a branch depends
/// on it, and while an endpoint runs on it unless `--force` (which stops
/// it). The branch's timeline goes from the pageserver and every
/// safekeeper (all must run), its endpoints' directories with it; reports
/// the endpoints stopped and removed.
pub fn delete(
    wd: &Workdir,
    tenant: &str,
    name: &str,
    force: bool,
    progress: &mut dyn Progress,
) -> Result<BranchDeleted> {
    let t = wd.cluster.tenant_named(tenant)?;
    let Some(b) = t.branch(name).cloned() else {
        return failed(format!("no branch named {name:?}"));
    };
    if b.parent.is_none() {
        return failed(format!("{name} is the tenant's first branch; every other branch descends from it"));
    }
    super::split::refuse_while_open(wd, t, "delete the branch")?;
    let children: Vec<&str> =
        t.branches.iter().filter(|c| c.parent.as_deref() == Some(name)).map(|c| c.name.as_str()).collect();
    if !children.is_empty() {
        return failed(format!("branch {name} has branches ({}); delete them first", children.join(", ")));
    }
    let on: Vec<endpoint::EndpointRecord> =
        endpoint::inventory(wd)?.into_iter().filter(|e| e.file.tenant == tenant && e.file.branch == name).collect();
    for ep in &on {
        if ep.state != "stopped" && !force {
            return failed(format!(
                "endpoint {} (pid {}) runs on branch {name}; stop it first or use --force",
                ep.file.name,
                ep.pid.unwrap_or(0)
            ));
        }
    }
    let services: Vec<_> = wd.cluster.services.iter().collect();
    if let Some(s) = services.iter().find(|s| !services::is_up(wd, s)) {
        return failed(format!("{} is not running: every service deletes the branch's data (start it first)", s.name));
    }
    for ep in &on {
        endpoint::stop(wd, &ep.file.name, false, progress)?;
        endpoint::remove(wd, &ep.file, progress)?;
        progress.tell(EndpointEvent::Removed { endpoint: ep.file.name.clone() });
    }
    delete_timeline(wd, t, b.timeline_id)?;
    update_cluster(&wd.root, |cluster| {
        if let Some(t) = cluster.tenant_mut(tenant) {
            t.branches.retain(|x| x.name != name);
        }
        Ok(())
    })?;
    Ok(BranchDeleted { name: name.into(), timeline: b.timeline_id })
}

/// Deletes a timeline's data from the pageservers of every shard and from
/// every safekeeper (one that does not have it is fine).
fn delete_timeline(wd: &Workdir, t: &Tenant, timeline: TimelineId) -> Result<()> {
    let tenant_id = t.tenant_id;
    for shard in t.shard_ids() {
        let ps = super::controller::attached(wd, shard)?;
        let url = format!("{}/v1/tenant/{shard}/timeline/{}", ps.http_url(), timeline);
        let r = http::delete(&url, BRANCH_CREATE_TIMEOUT).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
        if r.status != 200 && r.status != 404 {
            return failed(format!(
                "{}: deleting timeline {} of {shard}: {} (HTTP {})",
                ps.name,
                timeline,
                r.error_text(),
                r.status
            ));
        }
    }
    for sk in wd.cluster.of_kind(Kind::Safekeeper) {
        let url = format!("{}/v1/tenant/{tenant_id}/timeline/{}", sk.http_url(), timeline);
        let r = http::delete(&url, BRANCH_CREATE_TIMEOUT).map_err(|e| Error::Failed(format!("{}: {e}", sk.name)))?;
        if r.status != 200 && r.status != 404 {
            return failed(format!(
                "{}: deleting timeline {}: {} (HTTP {})",
                sk.name,
                timeline,
                r.error_text(),
                r.status
            ));
        }
    }
    Ok(())
}

/// What `strata branch reset` did: `branch dev: reset to main at L
/// (timeline T, was U); endpoints restarted: …`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchReset {
    pub name: String,
    pub parent: String,
    pub start: Lsn,
    pub timeline: TimelineId,
    pub old_timeline: TimelineId,
    pub restarted: Vec<String>,
}

impl std::fmt::Display for BranchReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BranchReset { name, parent, start, timeline, old_timeline, restarted } = self;
        write!(f, "branch {name}: reset to {parent} at {start} (timeline {timeline}, was {old_timeline})")?;
        if !restarted.is_empty() {
            write!(f, "; endpoints restarted: {}", restarted.join(", "))?;
        }
        Ok(())
    }
}

/// `strata branch reset NAME`: the branch becomes a fresh copy of its
/// parent's newest commit, under its name, with its settings and its
/// endpoints: a new timeline of the parent takes its place, its endpoints
/// (writer and replicas) start again on it, and its old timeline is deleted
/// everywhere. Refused for a first branch, a divergent one, a branch with
/// branches (they begin in its old history) and one with a read-only
/// endpoint (pinned to an LSN of that history); every service must run,
/// since every one deletes the old timeline.
pub fn reset(wd: &Workdir, tenant: &str, name: &str, progress: &mut dyn Progress) -> Result<BranchReset> {
    let t = wd.cluster.tenant_named(tenant)?;
    let Some(b) = t.branch(name).cloned() else {
        return failed(format!("no branch named {name:?} (branches: {})", t.branch_names()));
    };
    let Some(parent_name) = b.parent.clone() else {
        return failed(format!("{name} is the tenant's first branch: it has no parent to reset to"));
    };
    if b.divergent.is_some() {
        return failed(format!("{name} is a divergent history a site failover left: it is kept as it is"));
    }
    let parent = t
        .branch(&parent_name)
        .cloned()
        .ok_or_else(|| Error::Failed(format!("the parent {parent_name} of {name} is not in cluster.toml")))?;
    let children: Vec<&str> =
        t.branches.iter().filter(|c| c.parent.as_deref() == Some(name)).map(|c| c.name.as_str()).collect();
    if !children.is_empty() {
        return failed(format!(
            "branch {name} has branches ({}), which begin in the history a reset deletes; delete them first",
            children.join(", ")
        ));
    }
    super::split::refuse_while_open(wd, t, "reset the branch")?;
    let on: Vec<endpoint::EndpointRecord> =
        endpoint::inventory(wd)?.into_iter().filter(|e| e.file.tenant == tenant && e.file.branch == name).collect();
    if let Some(ro) = on.iter().find(|e| e.file.read_only_at.is_some()) {
        return failed(format!(
            "endpoint {} reads branch {name} at {}, in the history a reset deletes; remove it first",
            ro.file.name,
            ro.file.read_only_at.unwrap_or_default()
        ));
    }
    if let Some(s) = wd.cluster.services.iter().find(|s| !services::is_up(wd, s)) {
        return failed(format!(
            "{} is not running: every service deletes the branch's old data (start it first)",
            s.name
        ));
    }
    // The writer first, then its replicas: each starts again in that order.
    let mut running: Vec<&endpoint::EndpointRecord> = on.iter().filter(|e| e.state == "running").collect();
    running.sort_by_key(|e| !e.file.is_writer());
    for ep in &running {
        endpoint::stop(wd, &ep.file.name, false, progress)?;
    }
    let made = new_timeline(wd, t, &parent, BranchPoint::default())
        .map_err(|e| Error::Failed(format!("branch {name}: a new timeline of {parent_name}: {e}")))?;
    update_cluster(&wd.root, |cluster| {
        let t = cluster.tenant_mut(tenant).ok_or_else(|| Error::Failed(format!("tenant {tenant} was deleted")))?;
        let entry = t
            .branches
            .iter_mut()
            .find(|x| x.name == name)
            .ok_or_else(|| Error::Failed(format!("branch {name} was deleted")))?;
        entry.timeline_id = made.timeline_id;
        entry.ancestor_lsn = Some(made.start);
        entry.created_at = Some(crate::supervisor_state::unix_now());
        entry.point_time = None;
        Ok(())
    })?;
    let wd = Workdir::open(&wd.root)?;
    let t = wd.cluster.tenant_named(tenant)?;
    services::ensure_branch(&wd, t, name, progress)?;
    delete_timeline(&wd, t, b.timeline_id)?;
    let mut restarted = Vec::new();
    for ep in running {
        let how = endpoint::StartOptions { tenant: Some(tenant), ..Default::default() };
        endpoint::start(&wd, &ep.file.name, &how, &Default::default(), progress)?;
        restarted.push(ep.file.name.clone());
    }
    Ok(BranchReset {
        name: name.into(),
        parent: parent_name,
        start: made.start,
        timeline: made.timeline_id,
        old_timeline: b.timeline_id,
        restarted,
    })
}

/// One branch as `branch list` shows it.
fn describe(wd: &Workdir, t: &Tenant, b: &Branch, endpoints: &[endpoint::EndpointRecord]) -> BranchInfo {
    let status = super::controller::attached_now(wd, t.home())
        .map(|ps| format!("{}/v1/tenant/{}/timeline/{}?logical_size=true", ps.http_url(), t.home(), b.timeline_id))
        .and_then(|url| http::get(&url, QUICK).ok())
        .filter(|r| r.status == 200)
        .and_then(|r| r.json::<pageserver::TimelineStatus>().ok());
    BranchInfo {
        name: b.name.clone(),
        timeline_id: b.timeline_id,
        parent: b.parent.clone(),
        ancestor_lsn: b.ancestor_lsn,
        last_record_lsn: status.as_ref().map(|s| s.last_record_lsn),
        logical_size: status.as_ref().and_then(|s| s.logical_size),
        endpoints: endpoints
            .iter()
            .filter(|e| e.file.tenant == t.name && e.file.branch == b.name)
            .map(|e| e.file.name.clone())
            .collect(),
    }
}

/// `strata branch list`: the tree of branches, depth-first from `main`,
/// each with its depth; a table (`Display`) or JSON.
#[derive(Clone, Debug)]
pub struct BranchList {
    pub rows: Vec<(usize, BranchInfo)>,
}

impl BranchList {
    /// The branches as a JSON array, in the tree's order.
    pub fn to_json(&self) -> String {
        let all: Vec<&BranchInfo> = self.rows.iter().map(|(_, v)| v).collect();
        serde_json::to_string_pretty(&all).expect("the branches serialize")
    }
}

impl std::fmt::Display for BranchList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
        writeln!(f, "{:<28} {:<32} {:<12} {:<12} {:>12}  ENDPOINTS", "BRANCH", "TIMELINE", "PARENT", "AT", "SIZE")?;
        for (depth, v) in &self.rows {
            let name = if *depth == 0 { v.name.clone() } else { format!("{}└ {}", "  ".repeat(depth - 1), v.name) };
            let size = v.logical_size.map_or("-".to_string(), human_bytes);
            writeln!(
                f,
                "{:<28} {:<32} {:<12} {:<12} {:>12}  {}",
                name,
                v.timeline_id,
                or_dash(v.parent.clone()),
                or_dash(v.ancestor_lsn.map(|l| l.to_string())),
                size,
                if v.endpoints.is_empty() { "-".to_string() } else { v.endpoints.join(",") }
            )?;
        }
        Ok(())
    }
}

/// `strata branch list [--json]`: the tree of branches.
pub fn list(wd: &Workdir, tenant: &str) -> Result<BranchList> {
    let t = wd.cluster.tenant_named(tenant)?;
    let endpoints = endpoint::inventory(wd)?;
    let mut rows = Vec::new();
    // Depth-first from `main`, children in creation order.
    fn walk(
        wd: &Workdir,
        t: &Tenant,
        name: &str,
        depth: usize,
        endpoints: &[endpoint::EndpointRecord],
        rows: &mut Vec<(usize, BranchInfo)>,
    ) {
        let Some(b) = t.branch(name) else { return };
        rows.push((depth, describe(wd, t, b, endpoints)));
        for child in t.branches.iter().filter(|c| c.parent.as_deref() == Some(name)) {
            walk(wd, t, &child.name, depth + 1, endpoints, rows);
        }
    }
    walk(wd, t, MAIN_BRANCH, 0, &endpoints, &mut rows);
    Ok(BranchList { rows })
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{} KiB", n.div_ceil(1024)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sizes() {
        assert!(check_name("dev-1").is_ok() && check_name("-x").is_err() && check_name("a b").is_err());
        assert_eq!(human_bytes(38 << 20), "38.0 MiB");
    }
}
