//! `strata tenant create|list|delete`: the cluster's tenants, each a
//! PostgreSQL cluster of its own with its branches and endpoints
//! (`docs/tenants.md`). Creation and deletion are recorded in
//! `cluster.toml` before anything else is done, and every step after is
//! idempotent: run again after a crash, the command finishes.

use std::time::Instant;

use strata_protocol::api::pageserver::TenantObjectsDeleted;
use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantId, TenantShardId, TimelineId};

use super::error::{failed, Error, Result};
pub use super::layout::{check_pg_version, TENANT_PG_VERSIONS};
use super::layout::{update_cluster, Branch, Kind, Tenant, TenantState, Workdir, MAIN_BRANCH};
use super::report::{EndpointEvent, Progress, TenantEvent};
use super::{endpoint, http, services};
use crate::limits::{BRANCH_CREATE_TIMEOUT, DETACH_POLL, DETACH_WAIT, TENANT_DELETE_TIMEOUT};

/// Tenant names go into `cluster.toml`, command lines and the proxy's
/// server names: a DNS label.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    match ok {
        true => Ok(()),
        false => Err(Error::Usage(format!(
            "invalid tenant name {name:?}: use lowercase letters, digits and '-' (at most 63, not first or last)"
        ))),
    }
}

/// A tenant `strata tenant create` made: `tenant acme: id T, branch main = timeline L`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantCreated {
    pub name: String,
    pub tenant_id: TenantId,
    pub timeline: TimelineId,
}

impl std::fmt::Display for TenantCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tenant {}: id {}, branch {MAIN_BRANCH} = timeline {}", self.name, self.tenant_id, self.timeline)
    }
}

/// `strata tenant create NAME`: records the tenant (state `creating`),
/// has the storage controllers place it, creates it on its pageserver
/// (initdb from the kept template) and its `main` timeline on every
/// running safekeeper, then marks it active. A tenant left `creating` by
/// an interrupted run is finished.
/// With `shards`, a sharded tenant (`docs/sharding.md`): each shard is
/// placed, and created from the same `initdb` with shard 0's system
/// identifier.
pub fn create(
    wd: &Workdir,
    name: &str,
    pg_version: u32,
    shards: Option<ShardLayout>,
    progress: &mut dyn Progress,
) -> Result<TenantCreated> {
    create_with(wd, name, pg_version, shards, progress, &mut |_, _, _| Ok(()))
}

/// What fills a new tenant's first timeline on its pageserver before the
/// creation goes on (an import's upload); nothing: `initdb`'s output.
pub type Fill<'a> = dyn FnMut(&Workdir, &Tenant, &mut dyn Progress) -> Result<()> + 'a;

/// `create`, with `fill` run once the tenant is recorded and a storage
/// controller runs, before it is created on its pageserver and safekeepers.
pub fn create_with(
    wd: &Workdir,
    name: &str,
    pg_version: u32,
    shards: Option<ShardLayout>,
    progress: &mut dyn Progress,
    fill: &mut Fill<'_>,
) -> Result<TenantCreated> {
    check_name(name)?;
    check_pg_version(pg_version)?;
    // One shard is no sharding: recorded as unsharded.
    let shards = shards.filter(ShardLayout::is_sharded);
    if let Some(t) = wd.cluster.tenant(name).filter(|t| t.state == TenantState::Creating && t.shards != shards) {
        return failed(format!(
            "tenant {name} is being created with {} shards, not {}; finish that first",
            t.layout().count,
            shards.unwrap_or_default().count
        ));
    }
    if let Some(t) = wd.cluster.tenant(name).filter(|t| t.state == TenantState::Creating && t.pg_version != pg_version)
    {
        return failed(format!(
            "tenant {name} is being created with PostgreSQL {}, not {pg_version}; finish that first",
            t.pg_version
        ));
    }
    match wd.cluster.tenant(name).map(|t| t.state) {
        Some(TenantState::Active) => return failed(format!("a tenant named {name:?} exists")),
        Some(TenantState::Deleting) => {
            return failed(format!("tenant {name} is being deleted; finish that first (`strata tenant delete {name}`)"))
        }
        Some(TenantState::Creating) => progress.tell(TenantEvent::Resuming { tenant: name.into(), what: "creation" }),
        None => {
            // A new tenant's WAL is placed as the first tenant's `main` is.
            let placement =
                wd.cluster.tenants.first().and_then(|t| t.branch(MAIN_BRANCH)).and_then(|b| b.placement.clone());
            update_cluster(&wd.root, |c| {
                if c.tenant(name).is_some() {
                    return failed(format!("a tenant named {name:?} exists"));
                }
                c.tenants.push(Tenant {
                    name: name.into(),
                    tenant_id: TenantId::generate(),
                    state: TenantState::Creating,
                    pg_version,
                    follows: None,
                    shards,
                    branches: vec![Branch {
                        name: MAIN_BRANCH.into(),
                        timeline_id: TimelineId::generate(),
                        parent: None,
                        ancestor_lsn: None,
                        placement,
                        divergent: None,
                        pg_version: None,
                        created_at: Some(crate::supervisor_state::unix_now()),
                        point_time: None,
                    }],
                });
                Ok(())
            })?;
        }
    }
    let wd = Workdir::open(&wd.root)?;
    let t = wd.cluster.tenant_named(name)?;
    let how = format!("start the cluster (`strata start --workdir {}`), then run this again", wd.root.display());
    if !wd.cluster.of_kind(Kind::Controller).any(|s| services::is_up(&wd, s)) {
        return failed(format!("no storage controller is running: {how}"));
    }
    fill(&wd, t, progress).map_err(|e| Error::Failed(format!("tenant {name}: {e}")))?;
    services::ensure_tenant(&wd, t, progress).map_err(|e| Error::Failed(format!("tenant {name}: {e}; {how}")))?;
    update_cluster(&wd.root, |c| {
        if let Some(t) = c.tenant_mut(name) {
            t.state = TenantState::Active;
        }
        Ok(())
    })?;
    let timeline = t.branch(MAIN_BRANCH).map(|b| b.timeline_id).unwrap_or_default();
    Ok(TenantCreated { name: name.into(), tenant_id: t.tenant_id, timeline })
}

/// `strata tenant list`: every tenant with its state, branches and endpoints.
#[derive(Clone, Debug)]
pub struct TenantList {
    pub rows: Vec<TenantRow>,
}

/// One tenant as `tenant list` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TenantRow {
    pub name: String,
    pub tenant_id: TenantId,
    pub state: String,
    /// Its shard count (1: unsharded).
    pub shards: u8,
    pub branches: Vec<String>,
    pub endpoints: Vec<String>,
}

impl TenantList {
    /// The tenants as a JSON array.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.rows).expect("the tenants serialize")
    }
}

impl std::fmt::Display for TenantList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let list = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(",") };
                vec![r.name.clone(), r.tenant_id.to_string(), r.state.clone(), list(&r.branches), list(&r.endpoints)]
            })
            .collect();
        f.write_str(&super::status::table(&["TENANT", "ID", "STATE", "BRANCHES", "ENDPOINTS"], rows))
    }
}

/// `strata tenant list`.
pub fn list(wd: &Workdir) -> Result<TenantList> {
    let endpoints = endpoint::inventory(wd)?;
    let rows = wd
        .cluster
        .tenants
        .iter()
        .map(|t| TenantRow {
            name: t.name.clone(),
            tenant_id: t.tenant_id,
            state: t.state.as_str().into(),
            shards: t.layout().count,
            branches: t.branches.iter().map(|b| b.name.clone()).collect(),
            endpoints: endpoints.iter().filter(|e| e.file.tenant == t.name).map(|e| e.file.name.clone()).collect(),
        })
        .collect();
    Ok(TenantList { rows })
}

/// What `strata tenant delete` removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantDeleted {
    pub name: String,
    pub tenant_id: TenantId,
    pub objects: u64,
}

impl std::fmt::Display for TenantDeleted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tenant {}: deleted (id {}, {} objects)", self.name, self.tenant_id, self.objects)
    }
}

/// `strata tenant delete NAME`: marks the tenant `deleting`, then removes,
/// each step idempotent: its endpoints; its placement (the controllers
/// detach it from every pageserver, which removes its local layers); its
/// timelines on every safekeeper (their WAL, local and offloaded); every
/// object under its prefixes in object storage; last its entry in
/// `cluster.toml`. Every service must run: one that does not would keep
/// (or upload again) what it holds.
pub fn delete(wd: &Workdir, name: &str, progress: &mut dyn Progress) -> Result<TenantDeleted> {
    let t = wd.cluster.tenant_named(name)?.clone();
    if let Some(s) = wd.cluster.services.iter().find(|s| !services::is_up(wd, s)) {
        return failed(format!("{} is not running: every service deletes the tenant's data (start it first)", s.name));
    }
    if t.state != TenantState::Deleting {
        update_cluster(&wd.root, |c| {
            if let Some(t) = c.tenant_mut(name) {
                t.state = TenantState::Deleting;
            }
            Ok(())
        })?;
    } else {
        progress.tell(TenantEvent::Resuming { tenant: name.into(), what: "deletion" });
    }
    remove_endpoints(wd, &t, progress)?;
    super::follow::abandon(wd, &t)?;
    detach_everywhere(wd, &t, progress)?;
    delete_timelines(wd, &t, progress)?;
    let objects = delete_objects(wd, &t)?;
    update_cluster(&wd.root, |c| {
        c.tenants.retain(|x| x.name != name);
        Ok(())
    })?;
    Ok(TenantDeleted { name: name.into(), tenant_id: t.tenant_id, objects })
}

/// Stops and removes every endpoint of the tenant, wherever it runs.
fn remove_endpoints(wd: &Workdir, t: &Tenant, progress: &mut dyn Progress) -> Result<()> {
    for ep in endpoint::inventory(wd)?.into_iter().filter(|e| e.file.tenant == t.name) {
        // Its data goes with the tenant: nothing of it needs a clean shutdown.
        endpoint::stop(wd, &ep.file.name, true, progress)?;
        endpoint::remove(wd, &ep.file, progress)?;
        progress.tell(EndpointEvent::Removed { endpoint: ep.file.name.clone() });
    }
    Ok(())
}

/// Has the storage controllers forget the tenant and waits until no
/// pageserver holds a location of it.
fn detach_everywhere(wd: &Workdir, t: &Tenant, progress: &mut dyn Progress) -> Result<()> {
    let deadline = Instant::now() + DETACH_WAIT;
    let mut told = false;
    loop {
        let (mut holding, mut offline) = (Vec::new(), Vec::new());
        for shard in t.shard_ids() {
            let answer = super::controller::forget(wd, shard)?;
            holding.extend(answer.still_located_on);
            offline.extend(answer.offline);
        }
        holding.sort();
        holding.dedup();
        offline.sort();
        offline.dedup();
        if holding.is_empty() && offline.is_empty() {
            return Ok(());
        }
        if holding.is_empty() {
            // Whether they hold it is unknown: its objects must wait for them.
            return failed(format!(
                "tenant {}: {} not online (they may hold it); start them and run this again",
                t.name,
                offline.join(", ")
            ));
        }
        if !told {
            progress.tell(TenantEvent::Detaching { tenant: t.name.clone(), pageservers: holding.clone() });
            told = true;
        }
        if Instant::now() >= deadline {
            return failed(format!(
                "tenant {}: {} still hold it after {}s; run this again",
                t.name,
                holding.join(", "),
                DETACH_WAIT.as_secs()
            ));
        }
        std::thread::sleep(DETACH_POLL);
    }
}

/// Deletes each branch's timeline on every safekeeper (which deletes its
/// offloaded WAL too); one already gone is fine.
fn delete_timelines(wd: &Workdir, t: &Tenant, progress: &mut dyn Progress) -> Result<()> {
    for sk in wd.cluster.of_kind(Kind::Safekeeper) {
        for b in &t.branches {
            let url = format!("{}/v1/tenant/{}/timeline/{}", sk.http_url(), t.tenant_id, b.timeline_id);
            let r =
                http::delete(&url, BRANCH_CREATE_TIMEOUT).map_err(|e| Error::Failed(format!("{}: {e}", sk.name)))?;
            if r.status != 200 && r.status != 404 {
                return failed(format!(
                    "{}: deleting timeline {} of tenant {}: {} (HTTP {})",
                    sk.name,
                    b.timeline_id,
                    t.name,
                    r.error_text(),
                    r.status
                ));
            }
        }
        progress.tell(TenantEvent::TimelinesDeleted { tenant: t.name.clone(), safekeeper: sk.name.clone() });
    }
    Ok(())
}

/// Deletes every object of the tenant (a pageserver does it: it has the
/// object storage's credentials); how many there were.
fn delete_objects(wd: &Workdir, t: &Tenant) -> Result<u64> {
    // Shard 0 last: its prefixes hold the tenant's WAL and keys, which a
    // run that stops half-way must still find for the other shards.
    let mut total = 0;
    for shard in shards_ever(t) {
        total += delete_shard_objects(wd, t, shard)?;
    }
    Ok(total)
}

/// Every shard the tenant may have objects of, the current layout's shard
/// 0 last: a split's children name their parents' layers, so the parents'
/// prefixes may hold objects too, and splits go from `n` shards to a
/// multiple of `n`, so every earlier layout's count divides today's.
fn shards_ever(t: &Tenant) -> Vec<TenantShardId> {
    let now = t.layout();
    let mut shards: Vec<TenantShardId> = now
        .earlier()
        .chain([now])
        .flat_map(|layout| {
            layout.shards().map(|shard| TenantShardId { tenant: t.tenant_id, shard }).collect::<Vec<_>>()
        })
        .collect();
    let last = t.shard_ids()[0];
    shards.sort_by_key(|s| (*s == last, s.shard.number == 0));
    shards
}

fn delete_shard_objects(wd: &Workdir, t: &Tenant, shard: TenantShardId) -> Result<u64> {
    let mut last = String::from("no pageserver");
    for ps in wd.cluster.of_kind(Kind::Pageserver) {
        let url = format!("{}/v1/tenant/{shard}", ps.http_url());
        match http::delete(&url, TENANT_DELETE_TIMEOUT) {
            Ok(r) if r.status == 200 => {
                let done: TenantObjectsDeleted =
                    r.json().map_err(|e| Error::Failed(format!("{}: deleting tenant {}: {e}", ps.name, t.name)))?;
                return Ok(done.objects_deleted);
            }
            Ok(r) => last = format!("{}: HTTP {}: {}", ps.name, r.status, r.error_text()),
            Err(e) => last = format!("{}: {e}", ps.name),
        }
    }
    failed(format!("tenant {} ({shard}): its objects were not deleted ({last}); run this again", t.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_objects_are_looked_for_under_every_layout_it_may_have_had() {
        let mut t = Tenant {
            name: "t".into(),
            tenant_id: TenantId::generate(),
            state: TenantState::Active,
            pg_version: 15,
            follows: None,
            shards: Some(ShardLayout { count: 4, stripe_blocks: 8 }),
            branches: Vec::new(),
        };
        let names: Vec<String> = shards_ever(&t).iter().map(|s| s.to_string()).collect();
        let id = t.tenant_id;
        // 1, 2 and 4 shards; the zeros after the others, the current one last.
        assert_eq!(names.len(), 7, "{names:?}");
        assert_eq!(names.last().unwrap(), &format!("{id}-0of4"));
        assert!(names[..4].iter().all(|n| !n.contains("-0of") && n != &id.to_string()), "{names:?}");
        t.shards = None;
        assert_eq!(shards_ever(&t).iter().map(|s| s.to_string()).collect::<Vec<_>>(), vec![id.to_string()]);
    }

    #[test]
    fn tenant_names_are_dns_labels() {
        for good in ["acme", "pr-1234", "a", &"x".repeat(63)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a-", "Acme", "a_b", "a.b", "a b", &"x".repeat(64)] {
            assert!(matches!(check_name(bad), Err(Error::Usage(_))), "{bad}");
        }
    }
}
