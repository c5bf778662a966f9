//! The views' data: the cluster's state as `strata status --json` reads it
//! (every service and endpoint, every branch on the pageservers and the
//! safekeepers), read again every [`SNAPSHOT_INTERVAL`] by a thread of its
//! own and at once after an action, and shaped for the pages. A request
//! never waits on the services: it is answered from the last snapshot.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use strata_control_plane::endpoint::{self, EndpointRecord};
use strata_control_plane::layout::Workdir;
use strata_control_plane::status;
use strata_formats::Lsn;
use strata_protocol::api::cluster::{BranchStatus, ClusterStatus, EndpointStatus, ServiceStatus, TenantStatus};
use tracing::warn;

use crate::limits::SNAPSHOT_INTERVAL;

/// One tenant in the list.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TenantRow {
    pub name: String,
    pub tenant_id: String,
    pub state: String,
    pub pg_version: u32,
    pub attached: Option<String>,
    pub logical_bytes: Option<u64>,
    pub wal_held_bytes: Option<u64>,
    pub local_layer_bytes: Option<u64>,
    pub remote_layer_bytes: Option<u64>,
    pub branches: usize,
    pub endpoints_running: usize,
    pub endpoints_suspended: usize,
}

/// What GC keeps a branch's history for, below its cutoff's move.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GcWait {
    pub what: String,
    pub lsn: Lsn,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Layers {
    pub local_bytes: Option<u64>,
    pub remote_bytes: Option<u64>,
    pub l0: Option<usize>,
    pub l1: Option<usize>,
    pub image: Option<usize>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SafekeeperLsns {
    pub name: String,
    pub flush_lsn: Option<Lsn>,
    pub commit_lsn: Option<Lsn>,
}

/// One branch of a tenant's tree.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BranchRow {
    pub name: String,
    pub timeline_id: String,
    pub parent: Option<String>,
    pub ancestor_lsn: Option<Lsn>,
    pub created_at: Option<u64>,
    pub point_time: Option<String>,
    pub last_record_lsn: Option<Lsn>,
    pub logical_bytes: Option<u64>,
    pub pitr_window_secs: Option<u64>,
    pub gc_cutoff_lsn: Option<Lsn>,
    pub gc_waits_for: Vec<GcWait>,
    pub layers: Layers,
    pub attached: Option<String>,
    pub generation: Option<u32>,
    pub safekeepers: Vec<SafekeeperLsns>,
    /// Where a site failover left it (`docs/sites.md`), if it did.
    pub divergent: Option<String>,
    /// Bytes of WAL the safekeepers committed that the pageserver has not ingested.
    pub ingest_lag_bytes: Option<u64>,
}

/// One endpoint.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EndpointRow {
    pub name: String,
    pub tenant: String,
    pub branch: String,
    pub role: String,
    pub state: String,
    pub host: String,
    pub site: String,
    pub connstr: String,
    pub replica_of: Option<String>,
    pub replica_lag_bytes: Option<u64>,
    pub replica_lag_seconds: Option<f64>,
    pub suspend_after_secs: Option<u64>,
    pub restarts: u64,
    pub last_cause: Option<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Detail {
    pub label: String,
    pub value: String,
}

/// One service.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServiceRow {
    pub name: String,
    pub kind: String,
    pub host: String,
    pub site: String,
    pub state: String,
    /// `ok`, `down`, `restarting` or `unknown` (its host did not answer).
    pub health: String,
    pub pid: Option<i32>,
    pub restarts: u64,
    pub last_exit: Option<String>,
    pub ports: BTreeMap<String, u16>,
    pub detail: Vec<Detail>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct HostRow {
    pub host: String,
    pub services: Vec<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SiteRow {
    pub site: String,
    pub hosts: Vec<HostRow>,
}

/// Everything the pages show, at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Unix seconds; 0 before the first reading.
    pub sampled_at: u64,
    pub tenants: Vec<TenantRow>,
    pub branches: BTreeMap<String, Vec<BranchRow>>,
    pub endpoints: Vec<EndpointRow>,
    pub services: Vec<ServiceRow>,
    pub sites: Vec<SiteRow>,
    /// Why the last reading failed, if it did (the previous one is kept).
    pub error: Option<String>,
    /// How long the reading took.
    pub read_seconds: f64,
}

/// The snapshot in force and the thread that renews it.
pub struct Snapshots {
    root: PathBuf,
    current: Mutex<Arc<Snapshot>>,
    wake: (Mutex<bool>, Condvar),
}

impl Snapshots {
    pub fn new(root: PathBuf) -> Arc<Snapshots> {
        Arc::new(Snapshots { root, current: Mutex::new(Arc::new(Snapshot::default())), wake: Default::default() })
    }

    pub fn current(&self) -> Arc<Snapshot> {
        self.current.lock().clone()
    }

    /// Reads the cluster again now (after an action).
    pub fn refresh(&self) {
        *self.wake.0.lock() = true;
        self.wake.1.notify_all();
    }

    /// Reads the cluster every interval, or when asked to, until the process ends.
    pub fn run(self: Arc<Self>) {
        loop {
            self.read_now();
            let mut woken = self.wake.0.lock();
            if !*woken {
                self.wake.1.wait_for(&mut woken, SNAPSHOT_INTERVAL);
            }
            *woken = false;
        }
    }

    /// Reads the cluster once, now (the first reading, before the console
    /// serves: its first page has the cluster on it).
    pub fn read_now(&self) {
        {
            let next = match read(&self.root) {
                Ok(s) => s,
                Err(e) => {
                    warn!("reading the cluster's state: {e}");
                    let mut old = (*self.current()).clone();
                    old.error = Some(e);
                    old
                }
            };
            *self.current.lock() = Arc::new(next);
        }
    }

    /// Waits (bounded) until a snapshot newer than `after` exists.
    pub fn wait_newer(&self, after: u64, limit: Duration) {
        let start = std::time::Instant::now();
        while self.current().sampled_at <= after && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn read(root: &std::path::Path) -> Result<Snapshot, String> {
    let started = std::time::Instant::now();
    let mut events = Vec::new();
    let wd = strata_control_plane::open(root, &mut events).map_err(|e| e.to_string())?;
    let st = status::collect(&wd).map_err(|e| e.to_string())?;
    let records = endpoint::inventory(&wd).unwrap_or_default();
    let mut snapshot = shape(&wd, &st, &records);
    snapshot.read_seconds = started.elapsed().as_secs_f64();
    Ok(snapshot)
}

/// The pages' rows from the cluster's status.
pub fn shape(wd: &Workdir, st: &ClusterStatus, records: &[EndpointRecord]) -> Snapshot {
    let endpoints: Vec<EndpointRow> = st.endpoints.iter().map(|e| endpoint_row(e, records)).collect();
    let mut branches = BTreeMap::new();
    let mut tenants = Vec::new();
    for t in &wd.cluster.tenants {
        let rows: Vec<BranchRow> =
            st.timelines.iter().filter(|b| b.tenant == t.name).map(|b| branch_row(wd, &t.name, b, st)).collect();
        let status = st.tenants.iter().find(|s| s.name == t.name);
        tenants.push(tenant_row(t, status, rows.len(), &endpoints));
        branches.insert(t.name.clone(), rows);
    }
    let services: Vec<ServiceRow> = st.services.iter().map(|s| service_row(s, st)).collect();
    let mut sites: Vec<SiteRow> = Vec::new();
    for s in &services {
        let site = match sites.iter_mut().find(|x| x.site == s.site) {
            Some(x) => x,
            None => {
                sites.push(SiteRow { site: s.site.clone(), hosts: Vec::new() });
                sites.last_mut().expect("pushed")
            }
        };
        match site.hosts.iter_mut().find(|h| h.host == s.host) {
            Some(h) => h.services.push(s.name.clone()),
            None => site.hosts.push(HostRow { host: s.host.clone(), services: vec![s.name.clone()] }),
        }
    }
    Snapshot {
        sampled_at: strata_service::auth::now(),
        tenants,
        branches,
        endpoints,
        services,
        sites,
        error: None,
        read_seconds: 0.0,
    }
}

fn tenant_row(
    t: &strata_control_plane::layout::Tenant,
    st: Option<&TenantStatus>,
    branches: usize,
    endpoints: &[EndpointRow],
) -> TenantRow {
    let of_tenant = || endpoints.iter().filter(|e| e.tenant == t.name);
    TenantRow {
        name: t.name.clone(),
        tenant_id: t.tenant_id.to_string(),
        state: st.map_or_else(|| t.state.as_str().to_string(), |s| s.state.clone()),
        pg_version: t.pg_version,
        attached: st.and_then(|s| s.attached.clone()),
        logical_bytes: st.and_then(|s| s.logical_bytes),
        wal_held_bytes: st.and_then(|s| s.wal_held_bytes),
        local_layer_bytes: st.and_then(|s| s.local_layer_bytes),
        remote_layer_bytes: st.and_then(|s| s.remote_layer_bytes),
        branches,
        endpoints_running: of_tenant().filter(|e| e.state == "running").count(),
        endpoints_suspended: of_tenant().filter(|e| e.state == "suspended").count(),
    }
}

fn branch_row(wd: &Workdir, tenant: &str, b: &BranchStatus, st: &ClusterStatus) -> BranchRow {
    let layout = wd.cluster.tenant(tenant).and_then(|t| t.branch(&b.branch));
    let ps = b.pageserver.as_ref();
    let mut gc_waits_for = Vec::new();
    if let Some(ps) = ps {
        // A child's branch point: name the child.
        for lsn in &ps.retain_lsns {
            let children: Vec<&str> = st
                .timelines
                .iter()
                .filter(|c| c.tenant == tenant)
                .filter(|c| c.pageserver.as_ref().is_some_and(|p| p.ancestor_timeline_id == Some(b.timeline_id)))
                .filter(|c| c.pageserver.as_ref().and_then(|p| p.ancestor_lsn) == Some(*lsn))
                .map(|c| c.branch.as_str())
                .collect();
            let what = match children.is_empty() {
                true => "a branch point".to_string(),
                false => format!("branch point of {}", children.join(", ")),
            };
            gc_waits_for.push(GcWait { what, lsn: *lsn });
        }
        for lease in &ps.leases {
            let who = lease.holder.as_deref().map_or_else(|| "a lease".to_string(), |h| format!("lease of {h}"));
            gc_waits_for.push(GcWait { what: format!("{who} ({} s left)", lease.seconds_left), lsn: lease.lsn });
        }
    }
    let commit = b.safekeepers.iter().filter_map(|s| s.commit_lsn).max();
    BranchRow {
        name: b.branch.clone(),
        timeline_id: b.timeline_id.to_string(),
        parent: layout.and_then(|l| l.parent.clone()),
        ancestor_lsn: layout.and_then(|l| l.ancestor_lsn),
        created_at: layout.and_then(|l| l.created_at),
        point_time: layout.and_then(|l| l.point_time.clone()),
        last_record_lsn: ps.map(|p| p.last_record_lsn),
        logical_bytes: ps.and_then(|p| p.logical_size),
        pitr_window_secs: ps.and_then(|p| p.pitr_interval_secs),
        gc_cutoff_lsn: ps.map(|p| p.gc_cutoff_lsn),
        gc_waits_for,
        layers: Layers {
            local_bytes: ps.map(|p| p.local_layer_bytes),
            remote_bytes: ps.and_then(|p| p.remote.as_ref().map(|r| r.remote_bytes)),
            l0: ps.map(|p| p.l0_layers),
            l1: ps.map(|p| p.l1_layers),
            image: ps.map(|p| p.image_layers),
        },
        attached: b.attached.clone(),
        generation: b.generation,
        safekeepers: b
            .safekeepers
            .iter()
            .map(|s| SafekeeperLsns { name: s.name.clone(), flush_lsn: s.flush_lsn, commit_lsn: s.commit_lsn })
            .collect(),
        divergent: layout.and_then(|l| l.divergent.as_ref()).map(|d| format!("left by the loss of site {}", d.site)),
        ingest_lag_bytes: match (commit, ps) {
            (Some(c), Some(p)) => Some(c.0.saturating_sub(p.last_record_lsn.0)),
            _ => None,
        },
    }
}

fn endpoint_row(e: &EndpointStatus, records: &[EndpointRecord]) -> EndpointRow {
    let file = records.iter().find(|r| r.file.name == e.name).map(|r| &r.file);
    // The agent's own word while it starts or stops.
    let state = match (e.state.as_str(), e.compute_state) {
        ("running", Some(s)) if s.name() != "running" => match s.name() {
            "stopping" => "stopping".to_string(),
            "restarting" => "restarting".to_string(),
            _ => "starting".to_string(),
        },
        ("running", None) => "starting".to_string(),
        (other, _) => other.to_string(),
    };
    EndpointRow {
        name: e.name.clone(),
        tenant: e.tenant.clone(),
        branch: e.branch.clone(),
        role: e.role.clone(),
        state,
        host: e.host.clone(),
        site: e.site.clone(),
        connstr: e.connstr.clone(),
        replica_of: file.and_then(|f| f.replica_of.clone()),
        replica_lag_bytes: e.replica.as_ref().map(|r| r.lag_bytes),
        replica_lag_seconds: e.replica.as_ref().map(|r| r.lag_seconds),
        suspend_after_secs: file.and_then(|f| f.suspend_after_secs),
        restarts: e.restarts,
        last_cause: e.last_cause.clone(),
    }
}

fn service_row(s: &ServiceStatus, st: &ClusterStatus) -> ServiceRow {
    let health = match s.state.as_str() {
        "running" => "ok",
        "restarting" => "restarting",
        "unknown" => "unknown",
        _ => "down",
    };
    let mut detail = Vec::new();
    match s.kind.as_str() {
        "pageserver" => {
            let mut attached: Vec<String> = Vec::new();
            let mut secondary = 0;
            for b in &st.timelines {
                if b.attached.as_deref() == Some(s.name.as_str()) {
                    let entry = format!("{} (generation {})", b.tenant, b.generation.unwrap_or(0));
                    if !attached.contains(&entry) {
                        attached.push(entry);
                    }
                }
                if b.secondaries.iter().any(|x| x == &s.name) {
                    secondary += 1;
                }
            }
            detail.push(Detail { label: "attached tenants".into(), value: attached.len().to_string() });
            for a in attached.iter().take(20) {
                detail.push(Detail { label: "attached".into(), value: a.clone() });
            }
            if secondary > 0 {
                detail.push(Detail { label: "secondary of branches".into(), value: secondary.to_string() });
            }
        }
        "safekeeper" => {
            let positions: Vec<(&BranchStatus, Option<Lsn>, Option<Lsn>)> = st
                .timelines
                .iter()
                .filter_map(|b| {
                    let p = b.safekeepers.iter().find(|p| p.name == s.name)?;
                    p.flush_lsn.map(|_| (b, p.flush_lsn, p.commit_lsn))
                })
                .collect();
            detail.push(Detail { label: "timelines".into(), value: positions.len().to_string() });
            for (b, flush, commit) in positions.iter().take(20) {
                detail.push(Detail {
                    label: format!("{}/{}", b.tenant, b.branch),
                    value: format!(
                        "flush {} commit {}",
                        flush.map_or("-".into(), |l| l.to_string()),
                        commit.map_or("-".into(), |l| l.to_string())
                    ),
                });
            }
        }
        _ => {}
    }
    if let Some(exit) = &s.last_exit {
        detail.push(Detail { label: "last exit".into(), value: exit.clone() });
    }
    ServiceRow {
        name: s.name.clone(),
        kind: s.kind.clone(),
        host: s.host.clone(),
        site: s.site.clone(),
        state: s.state.clone(),
        health: health.into(),
        pid: s.pid,
        restarts: s.restarts,
        last_exit: s.last_exit.clone(),
        ports: s.ports.clone(),
        detail,
    }
}
