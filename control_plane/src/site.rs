//! `strata site promote SITE` and `strata site rejoin SITE`
//! (`docs/sites.md`, "Site failover"): the operator's word that the other
//! site is gone, and its return.
//!
//! Promote, for every branch: its timeline is sealed on the promoted
//! site's safekeepers (they refuse every writer from then on, and their
//! WAL is final and committed: it ends at the fork LSN F) and on every
//! other safekeeper that still answers; the other sites' pageservers are
//! marked lost, so the storage controller attaches the tenant in the
//! promoted site; the branch goes on in a new timeline branched at F, at
//! home in the promoted site; the sealed timeline becomes the branch
//! `<branch>-divergent-<F>`, where endpoints that ran on the branch are
//! recorded. Nothing is rewound: the lost site's tail past F stays in the
//! sealed timeline. Then the writer starts in the promoted site.
//!
//! Rejoin: the returning site's safekeepers are sealed too (peers that
//! heard of the seal already did it), get the new timelines, and the loss
//! report is completed from their WAL: the transactions they had
//! committed past F.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Instant;

use strata_formats::version::PgVersion;
use strata_formats::wal::reader::{StartPosition, WalDecoder};
use strata_formats::Lsn;
use strata_protocol::api::pageserver::{self, CreateBranchRequest};
use strata_protocol::api::safekeeper::TimelineStatus;
use strata_protocol::framed::FrameReader;
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::membership::Membership;
use strata_protocol::safekeeper::{
    ConsumerMessage, OnAsyncLag, Placement, StartStreaming, StreamMessage, PROTOCOL_VERSION,
};
use strata_protocol::shard::TenantShardId;
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_service::auth::{Claims, Scope};

use super::error::{failed, Error, Result};
use strata_safekeeper::config::SafekeeperConfig;

use super::layout::{
    read_toml, update_cluster, Branch, ClusterFile, Divergence, Kind, Service, Tenant, TenantState, Workdir,
    DEFAULT_TENANT,
};
use super::report::{Loss, Progress, SiteEvent};
use super::{controller, endpoint, http, services};
use crate::limits::{
    LOSS_BRANCH_TIMEOUT, QUICK, READ_TAIL_READ_TIMEOUT, READ_TAIL_TIMEOUT, SITE_ATTACH_POLL, SITE_ATTACH_WAIT,
};

/// What the lost site's safekeepers that answer held of a sealed
/// timeline: (acknowledged at most, held, the safekeeper holding the
/// most). `others`: the other safekeepers' statuses of it, those that
/// answer.
///
/// A safekeeper learns the commit LSN with its proposer's next message,
/// so its `commit_before_seal` may lag by one round what the writer had
/// acknowledged: a commit is acknowledged once a commit quorum has flushed
/// it, whatever the safekeepers were told. The bound is the higher of the
/// two: the highest commit LSN a safekeeper was told, and the highest LSN
/// a commit quorum of the timeline's configuration may have flushed
/// (`quorum_bound`), never past what the lost side holds.
fn lost_side<'a>(
    wd: &Workdir,
    sealed: &[(&'a Service, TimelineStatus)],
    others: &[(&Service, TimelineStatus)],
) -> (Option<Lsn>, Option<Lsn>, Option<&'a Service>) {
    let told = sealed.iter().map(|(_, s)| s.commit_before_seal.unwrap_or(s.commit_lsn)).max();
    let best = sealed.iter().max_by_key(|(_, s)| s.flush_lsn);
    let held = best.map(|(_, s)| s.flush_lsn);
    let flushes: Vec<(NodeId, Lsn)> =
        sealed.iter().chain(others).filter_map(|(sk, s)| node_id(wd, sk).map(|id| (id, s.flush_lsn))).collect();
    let membership = sealed.iter().chain(others).map(|(_, s)| &s.membership).max_by_key(|m| m.generation);
    let quorum = membership.filter(|m| m.generation > 0).map(|m| quorum_bound(m, &flushes));
    let acknowledged = match (told, quorum, held) {
        (Some(t), Some(q), Some(h)) => Some(t.max(q.min(h))),
        (t, _, _) => t,
    };
    (acknowledged, held, best.map(|(sk, _)| *sk))
}

/// The highest LSN a commit quorum of `m` may have flushed, from the flush
/// LSNs of the members that answer; a member that does not answer may
/// hold anything (`Lsn::MAX`, which the caller bounds by what it can read).
fn quorum_bound(m: &Membership, known: &[(NodeId, Lsn)]) -> Lsn {
    let flushes: Vec<(NodeId, Lsn)> = m
        .all()
        .iter()
        .map(|x| (x.id, known.iter().find(|(id, _)| *id == x.id).map_or(Lsn(u64::MAX), |(_, l)| *l)))
        .collect();
    m.quorum_lsn(&flushes)
}

/// A safekeeper's node id, from its configuration in the workdir.
fn node_id(wd: &Workdir, sk: &Service) -> Option<NodeId> {
    read_toml::<SafekeeperConfig>(&wd.config_path(sk)).ok().map(|c| c.id)
}

/// What the lost side held of a branch's sealed timeline past the fork:
/// up to where its safekeepers acknowledged and held WAL, and the one
/// holding the most.
struct Tail<'a> {
    timeline: TimelineId,
    fork: Lsn,
    acknowledged: Option<Lsn>,
    held: Option<Lsn>,
    source: Option<&'a Service>,
}

/// The transactions of [fork, acknowledged) and [acknowledged, held), read
/// from the tail's source (`None` when not read: an event says why).
fn tail_transactions(
    wd: &Workdir,
    tenant: TenantId,
    branch: &str,
    tail: &Tail<'_>,
    progress: &mut dyn Progress,
) -> Option<(u64, u64)> {
    let (Some(sk), Some(c), Some(h)) = (tail.source, tail.acknowledged, tail.held) else { return None };
    let fork = tail.fork;
    if h <= fork {
        return Some((0, 0));
    }
    match count_commits(wd, sk, (tenant, tail.timeline), fork, c.max(fork), h) {
        Ok(n) => Some(n),
        Err(error) => {
            let (branch, safekeeper) = (branch.to_string(), sk.name.clone());
            progress.tell(SiteEvent::TailUnread { branch, from: fork, to: h, safekeeper, error });
            None
        }
    }
}

fn tl_url(sk: &Service, tenant: TenantId, timeline: TimelineId) -> String {
    format!("{}/v1/tenant/{tenant}/timeline/{timeline}", sk.http_url())
}

/// A safekeeper's status of a timeline, if it answers.
fn sk_status(sk: &Service, tenant: TenantId, timeline: TimelineId) -> Option<TimelineStatus> {
    let r = http::get(&tl_url(sk, tenant, timeline), QUICK).ok().filter(|r| r.status == 200)?;
    r.json().ok()
}

/// Seals a timeline on a safekeeper; its status after.
fn seal(sk: &Service, tenant: TenantId, timeline: TimelineId) -> std::result::Result<TimelineStatus, String> {
    let r = http::post(&format!("{}/seal", tl_url(sk, tenant, timeline)), &serde_json::json!({}), QUICK)?;
    if r.status != 200 {
        return Err(format!("HTTP {}: {}", r.status, r.error_text()));
    }
    r.json().map_err(|e| format!("its status: {e}"))
}

/// The divergent branch's name: the branch and the fork LSN in hex.
fn divergent_name(branch: &str, fork: Lsn) -> String {
    format!("{branch}-divergent-{:X}", fork.0)
}

/// The sites of a promotion: the promoted one's safekeepers, the others'.
struct Sides<'a> {
    site: &'a str,
    here: Vec<&'a Service>,
    elsewhere: Vec<&'a Service>,
    /// The lost sites' names, for the report.
    lost: String,
}

impl<'a> Sides<'a> {
    /// Refuses a site that cannot take over: it needs a safekeeper and a pageserver.
    fn of(c: &'a ClusterFile, site: &'a str) -> Result<Sides<'a>> {
        let here: Vec<&Service> = c.of_kind(Kind::Safekeeper).filter(|s| c.site_of(s) == site).collect();
        let elsewhere: Vec<&Service> = c.of_kind(Kind::Safekeeper).filter(|s| c.site_of(s) != site).collect();
        if here.is_empty() {
            return Err(Error::Usage(format!("site {site} has no safekeeper: it cannot take over")));
        }
        if !c.of_kind(Kind::Pageserver).any(|p| c.site_of(p) == site) {
            return Err(Error::Usage(format!("site {site} has no pageserver: it cannot take over")));
        }
        let mut lost: Vec<String> = elsewhere.iter().map(|s| c.site_of(s).to_string()).collect();
        lost.sort();
        lost.dedup();
        Ok(Sides { site, here, elsewhere, lost: lost.join(", ") })
    }
}

/// The tenants a site failover carries over (all but those being deleted).
fn live_tenants(c: &ClusterFile) -> Vec<&Tenant> {
    c.tenants.iter().filter(|t| t.state != TenantState::Deleting).collect()
}

/// Says which tenant the events that follow are of (but the default one).
fn tell_tenant(t: &Tenant, progress: &mut dyn Progress) {
    if t.name != DEFAULT_TENANT {
        progress.tell(SiteEvent::Tenant { tenant: t.name.clone() });
    }
}

/// `strata site promote SITE`: every tenant's branches.
pub fn promote(wd: &Workdir, site: &str, progress: &mut dyn Progress) -> Result<()> {
    // Every shard of a tenant is forked: the layout the controllers last
    // finished, and none while a split is under way (it completes or rolls
    // back by itself, and the promotion is asked again).
    let mut adopted = None;
    for t in live_tenants(&wd.cluster) {
        super::split::refuse_while_open(wd, t, "promote a site")?;
        if let Some(now) = super::split::adopt_layout(adopted.as_ref().unwrap_or(wd), t)? {
            adopted = Some(now);
        }
    }
    let wd = adopted.as_ref().unwrap_or(wd);
    let sides = Sides::of(&wd.cluster, site)?;
    // 1. Seal: the promoted site's safekeepers first (their WAL ends at F),
    //    then every other one that answers (its writer is fenced at once).
    //    The branches that go on here: every one not already left behind.
    let mut sealed: Vec<(String, Vec<Loss>)> = Vec::new();
    for t in live_tenants(&wd.cluster) {
        tell_tenant(t, progress);
        let branches: Vec<&Branch> = t.branches.iter().filter(|b| b.divergent.is_none()).collect();
        let losses = branches.iter().map(|b| seal_branch(wd, t, &sides, b, progress)).collect::<Result<Vec<Loss>>>()?;
        sealed.push((t.name.clone(), losses));
    }
    // 2. The lost sites' pageservers: the controller attaches the tenants here.
    mark_lost(wd, site, progress)?;
    let mut writers = Vec::new();
    for (name, losses) in sealed {
        let wd = Workdir::open(&wd.root)?;
        let t = wd.cluster.tenant_named(&name)?;
        tell_tenant(t, progress);
        let shards = attached_in(&wd, t, site, progress)?;
        // 3. Fork each branch at F; the sealed timeline becomes the divergent branch.
        fork_branches(&wd, t, &shards, &sides, &losses, progress)?;
        let wd = Workdir::open(&wd.root)?;
        let t = wd.cluster.tenant_named(&name)?;
        // 4. Endpoints of the old timelines are recorded on the divergent branches.
        let records = rebranch_endpoints(&wd, t, &losses, progress)?;
        // 5. The new timelines on the safekeepers that run, under their first
        //    configuration (at home here): the others get both when they return.
        services::ensure_tenant(&wd, t, progress)?;
        for loss in &losses {
            first_configuration(&wd, t, &loss.branch, progress)?;
        }
        // 6. The report, then the writers: their connection strings come last.
        for loss in &losses {
            progress.tell(SiteEvent::Loss { loss: loss.clone(), lost_site: sides.lost.clone() });
        }
        writers.push((name, losses, records));
    }
    let wd = Workdir::open(&wd.root)?;
    for (name, losses, records) in writers {
        start_writers(&wd, wd.cluster.tenant_named(&name)?, site, &losses, &records, progress)?;
    }
    Ok(())
}

/// Seals a branch's timeline, here first; what the lost side held of it.
fn seal_branch(wd: &Workdir, t: &Tenant, sides: &Sides<'_>, b: &Branch, progress: &mut dyn Progress) -> Result<Loss> {
    let (c, site, tenant, t1) = (&wd.cluster, sides.site, t.tenant_id, b.timeline_id);
    let before_here: Vec<TimelineStatus> = sides.here.iter().filter_map(|s| sk_status(s, tenant, t1)).collect();
    if before_here.is_empty() {
        return failed(format!("branch {}: no safekeeper of {site} answers for timeline {t1}", b.name));
    }
    if before_here.iter().any(|s| s.sealed) {
        progress.tell(SiteEvent::AlreadySealed { branch: b.name.clone(), timeline: t1 });
    }
    let told = before_here.iter().map(|s| s.commit_lsn).max().unwrap_or(Lsn::INVALID);
    // `stretched` over two sites puts this site's safekeepers in every
    // commit quorum: nothing acknowledged can be missing here.
    let stretched = before_here.iter().all(|s| {
        let m = &s.membership;
        let mut sites: Vec<Option<String>> = m.all().into_iter().map(|x| x.site).collect();
        sites.sort();
        sites.dedup();
        m.generation > 0 && sites.len() == 2 && m.rules().all(|(_, p)| matches!(p, Placement::Stretched))
    });
    let mut fork = Lsn::INVALID;
    let mut sealed_here = Vec::new();
    for sk in &sides.here {
        match seal(sk, tenant, t1) {
            // A sealed timeline's WAL is final and committed: F is where it ends.
            Ok(s) if !s.sealed || s.commit_lsn != s.flush_lsn => {
                return failed(format!(
                    "branch {}: {} answered the seal with an unsealed timeline (commit {}, flush {})",
                    b.name, sk.name, s.commit_lsn, s.flush_lsn
                ))
            }
            Ok(s) => {
                fork = fork.max(s.commit_lsn);
                sealed_here.push((*sk, s));
            }
            Err(error) => {
                progress.tell(SiteEvent::NotSealed { branch: b.name.clone(), safekeeper: sk.name.clone(), error })
            }
        }
    }
    if fork == Lsn::INVALID {
        return failed(format!("branch {}: no safekeeper of {site} could be sealed", b.name));
    }
    let mut sealed_elsewhere = Vec::new();
    for sk in &sides.elsewhere {
        if let Ok(s) = seal(sk, tenant, t1) {
            let (branch, safekeeper, site) = (b.name.clone(), sk.name.clone(), c.site_of(sk).to_string());
            progress.tell(SiteEvent::SealedElsewhere { branch, safekeeper, site, at: s.flush_lsn });
            sealed_elsewhere.push((*sk, s));
        }
    }
    let (acknowledged, held, source) = lost_side(wd, &sealed_elsewhere, &sealed_here);
    let tail = Tail { timeline: t1, fork, acknowledged, held, source };
    let transactions = tail_transactions(wd, tenant, &b.name, &tail, progress);
    Ok(Loss {
        branch: b.name.clone(),
        divergent: divergent_name(&b.name, fork),
        fork_lsn: fork,
        acknowledged,
        held,
        told,
        transactions,
        stretched,
    })
}

/// Marks every other site's pageserver lost: the storage controller
/// attaches their tenants in `site`.
fn mark_lost(wd: &Workdir, site: &str, progress: &mut dyn Progress) -> Result<()> {
    let c = &wd.cluster;
    for ps in c.of_kind(Kind::Pageserver).filter(|p| c.site_of(p) != site) {
        progress.tell(controller::set_policy(wd, &ps.name, "lost")?);
    }
    Ok(())
}

/// The pageserver each shard of a tenant is attached to (one, the
/// tenant's own, when it is unsharded), shard 0 first.
type Shards<'a> = Vec<(TenantShardId, &'a Service)>;

/// Waits until the storage controller has attached every shard of `t` in
/// `site`; those pageservers.
fn attached_in<'a>(wd: &'a Workdir, t: &Tenant, site: &str, progress: &mut dyn Progress) -> Result<Shards<'a>> {
    let c = &wd.cluster;
    let deadline = Instant::now() + SITE_ATTACH_WAIT;
    let mut shards: Shards<'a> = Vec::new();
    for shard in t.shard_ids() {
        let ps = loop {
            let ps = controller::attached(wd, shard)?;
            if c.site_of(ps) == site {
                break ps;
            }
            if Instant::now() >= deadline {
                let secs = SITE_ATTACH_WAIT.as_secs();
                return failed(format!("tenant {shard} is still attached to {} after {secs}s", ps.name));
            }
            std::thread::sleep(SITE_ATTACH_POLL);
        };
        if !shards.iter().any(|(_, p)| p.name == ps.name) {
            progress.tell(SiteEvent::AttachedIn { pageserver: ps.name.clone(), site: site.to_string() });
        }
        shards.push((shard, ps));
    }
    Ok(shards)
}

/// Forks each lost branch at its F on pageserver `ps` and records the
/// change in `cluster.toml`: the branch goes on in the new timeline, at
/// home in the promoted site; the sealed one is its divergent branch.
fn fork_branches(
    wd: &Workdir,
    t: &Tenant,
    shards: &Shards<'_>,
    sides: &Sides<'_>,
    losses: &[Loss],
    progress: &mut dyn Progress,
) -> Result<()> {
    update_cluster(&wd.root, |c| {
        let cluster = c.tenant_mut(&t.name).ok_or_else(|| Error::Failed(format!("tenant {} was deleted", t.name)))?;
        fork_in(cluster, shards, sides, losses, progress)
    })
}

/// [`fork_branches`] of one tenant's `cluster.toml` entry.
fn fork_in(
    cluster: &mut Tenant,
    shards: &Shards<'_>,
    sides: &Sides<'_>,
    losses: &[Loss],
    progress: &mut dyn Progress,
) -> Result<()> {
    for loss in losses {
        let old = cluster.branch(&loss.branch).cloned().expect("every loss is of a branch");
        let t2 = TimelineId::generate();
        // Shard 0 first; every other shard branches where it began, so
        // that all of them are one branch.
        let (home, rest) = shards.split_first().expect("a tenant has a shard");
        let start = fork_timeline(*home, old.timeline_id, t2, &loss.branch, loss.fork_lsn)?;
        for shard in rest {
            fork_timeline(*shard, old.timeline_id, t2, &loss.branch, start)?;
        }
        let home = home_placement(old.placement.as_ref(), sides.site);
        for b in cluster.branches.iter_mut() {
            if b.parent.as_deref() == Some(loss.branch.as_str()) {
                // Branched from the old history: their parent is the divergent branch.
                b.parent = Some(loss.divergent.clone());
            }
        }
        let entry = cluster.branches.iter_mut().find(|b| b.name == loss.branch).expect("every loss is of a branch");
        *entry = Branch {
            name: loss.divergent.clone(),
            divergent: Some(Divergence {
                site: sides.lost.clone(),
                continued_as: loss.branch.clone(),
                fork_lsn: loss.fork_lsn,
                acknowledged_lsn: loss.acknowledged,
            }),
            ..old.clone()
        };
        cluster.branches.push(Branch {
            name: loss.branch.clone(),
            timeline_id: t2,
            parent: Some(loss.divergent.clone()),
            ancestor_lsn: Some(start),
            placement: Some(home),
            divergent: None,
            pg_version: old.pg_version,
            created_at: Some(crate::supervisor_state::unix_now()),
            point_time: None,
        });
        progress.tell(SiteEvent::GoesOn {
            branch: loss.branch.clone(),
            timeline: t2,
            start,
            site: sides.site.to_string(),
            old: old.timeline_id,
            divergent: loss.divergent.clone(),
        });
    }
    // Each lost branch now goes on under its name and is kept as its
    // divergent branch; nothing else changed names.
    debug_assert!(losses.iter().all(|l| {
        let new = cluster.branch(&l.branch).is_some_and(|b| b.parent.as_deref() == Some(l.divergent.as_str()));
        new && cluster.branch(&l.divergent).is_some_and(|b| b.divergent.is_some())
    }));
    Ok(())
}

/// Creates timeline `t2` of one shard, branched from `t1` at `at` (the
/// loss's fork LSN); its start LSN.
fn fork_timeline(
    (shard, ps): (TenantShardId, &Service),
    t1: TimelineId,
    t2: TimelineId,
    branch: &str,
    at: Lsn,
) -> Result<Lsn> {
    let body = CreateBranchRequest {
        timeline_id: Some(t2),
        ancestor_timeline_id: t1,
        ancestor_lsn: Some(at),
        ancestor_time: None,
    };
    let url = format!("{}/v1/tenant/{shard}/timeline", ps.http_url());
    let r = http::post(&url, &body, LOSS_BRANCH_TIMEOUT).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
    if r.status != 201 {
        let status = r.status;
        return failed(format!(
            "branch {branch}, {shard} on {}: forking at {at}: HTTP {status}: {}",
            ps.name,
            r.error_text()
        ));
    }
    let status = r
        .json::<pageserver::TimelineStatus>()
        .map_err(|e| Error::Failed(format!("{}: the new timeline: {e}", ps.name)))?;
    Ok(status.start_lsn)
}

/// The placement of a branch going on in `site`: local-quorum at home
/// there, keeping the old bound on asynchronous members if it had one.
fn home_placement(old: Option<&Placement>, site: &str) -> Placement {
    match old {
        Some(Placement::LocalQuorum { max_async_lag, on_async_lag, .. }) => {
            Placement::LocalQuorum { home: site.into(), max_async_lag: *max_async_lag, on_async_lag: *on_async_lag }
        }
        // One site cannot satisfy `stretched`; `strata branch placement` restores it once the other is back.
        _ => Placement::LocalQuorum {
            home: site.into(),
            max_async_lag: strata_protocol::safekeeper::membership::DEFAULT_MAX_ASYNC_LAG,
            on_async_lag: OnAsyncLag::default(),
        },
    }
}

/// Records the endpoints of each lost branch on its divergent branch; the
/// endpoints as they were before.
fn rebranch_endpoints(
    wd: &Workdir,
    t: &Tenant,
    losses: &[Loss],
    progress: &mut dyn Progress,
) -> Result<Vec<endpoint::EndpointRecord>> {
    let records: Vec<_> = endpoint::inventory(wd)?.into_iter().filter(|r| r.file.tenant == t.name).collect();
    for loss in losses {
        for r in records.iter().filter(|r| r.file.branch == loss.branch) {
            let endpoint = r.file.name.clone();
            progress.tell(match endpoint::rebranch(wd, &r.file.name, &loss.divergent) {
                Ok(()) => SiteEvent::Rebranched { endpoint, branch: loss.divergent.clone(), state: r.state.clone() },
                Err(e) => SiteEvent::NotRebranched { endpoint, branch: loss.branch.clone(), error: e.to_string() },
            });
        }
    }
    Ok(records)
}

/// Starts `<branch>-<site>` (`<tenant>-<branch>-<site>` but in the
/// default tenant) in `site` for each branch that had a writer; each
/// prints its connection string last, the last one's ends the output.
fn start_writers(
    wd: &Workdir,
    t: &Tenant,
    site: &str,
    losses: &[Loss],
    records: &[endpoint::EndpointRecord],
    progress: &mut dyn Progress,
) -> Result<()> {
    let had_writer: Vec<&Loss> =
        losses.iter().filter(|l| records.iter().any(|r| r.file.branch == l.branch && r.file.is_writer())).collect();
    let Some(host) = wd.cluster.hosts.iter().find(|h| h.site == site && h.computes) else {
        if !had_writer.is_empty() {
            progress.tell(SiteEvent::NoComputeHost { site: site.to_string() });
        }
        return Ok(());
    };
    for l in had_writer {
        let name = match t.name == DEFAULT_TENANT {
            true => format!("{}-{site}", l.branch),
            false => format!("{}-{}-{site}", t.name, l.branch),
        };
        let how = endpoint::StartOptions {
            tenant: Some(t.name.as_str()),
            branch: Some(l.branch.as_str()),
            host: Some(host.name.as_str()),
            ..Default::default()
        };
        let (branch, site) = (l.branch.clone(), site.to_string());
        progress.tell(SiteEvent::Writer { endpoint: name.clone(), branch, site });
        endpoint::start(wd, &name, &how, &Default::default(), progress)?;
    }
    Ok(())
}

/// Installs the first membership configuration of a branch's new timeline
/// (its placement over every safekeeper) on the safekeepers that answer.
fn first_configuration(wd: &Workdir, t: &Tenant, branch: &str, progress: &mut dyn Progress) -> Result<()> {
    let b = t.branch(branch).ok_or_else(|| Error::Failed(format!("no branch named {branch:?}")))?;
    let nodes = super::reconfigure::nodes(wd)?;
    let change = super::reconfigure::Change {
        tenant: t.tenant_id,
        timeline: b.timeline_id,
        old: &nodes,
        new: &nodes,
        placement: b.placement.clone(),
    };
    change.first_on_reachable(progress)
}

/// `strata site rejoin SITE`.
pub fn rejoin(wd: &Workdir, site: &str, progress: &mut dyn Progress) -> Result<()> {
    let c = &wd.cluster;
    let returning: Vec<&Service> = c.of_kind(Kind::Safekeeper).filter(|s| c.site_of(s) == site).collect();
    if returning.is_empty() && !c.of_kind(Kind::Pageserver).any(|p| c.site_of(p) == site) {
        return Err(Error::Usage(format!("site {site} has no safekeeper or pageserver")));
    }
    let down: Vec<&str> = returning.iter().filter(|s| !services::is_up(wd, s)).map(|s| s.name.as_str()).collect();
    if !down.is_empty() {
        return failed(format!("{} of {site} not running: start them first (`strata start`)", down.join(", ")));
    }
    let mut divergent: Vec<(String, Branch)> = Vec::new();
    for t in live_tenants(c) {
        tell_tenant(t, progress);
        let ds = update_cluster(&wd.root, |cluster| {
            let entry =
                cluster.tenant_mut(&t.name).ok_or_else(|| Error::Failed(format!("tenant {} was deleted", t.name)))?;
            rejoin_tenant(wd, entry, &returning, site, progress)
        })?;
        divergent.extend(ds.into_iter().map(|d| (t.name.clone(), d)));
    }
    let wd = Workdir::open(&wd.root)?;
    // The branches that went on: their timelines on the returning
    // safekeepers, under the configuration the others hold (the returning
    // ones are asynchronous members and catch up from their peers).
    services::ensure_timelines(&wd, progress)?;
    for (t, b) in wd.cluster.all_branches().filter(|(t, b)| t.state != TenantState::Deleting && b.divergent.is_none()) {
        first_configuration(&wd, t, &b.name, progress)?;
    }
    for ps in wd.cluster.of_kind(Kind::Pageserver).filter(|p| wd.cluster.site_of(p) == site) {
        progress.tell(controller::set_policy(&wd, &ps.name, "fill")?);
    }
    for (t, d) in &divergent {
        let div = d.divergent.as_ref().expect("filtered");
        let at = div.acknowledged_lsn.unwrap_or(div.fork_lsn);
        let branch = wd.cluster.tenant(t).map_or_else(|| d.name.clone(), |t| t.label(&d.name));
        progress.tell(SiteEvent::History { branch, site: site.to_string(), at });
    }
    Ok(())
}

/// [`rejoin`] of one tenant: seals its divergent branches on the returning
/// safekeepers, reports their loss and records what they acknowledged in
/// `cluster`; those branches.
fn rejoin_tenant(
    wd: &Workdir,
    cluster: &mut Tenant,
    returning: &[&Service],
    site: &str,
    progress: &mut dyn Progress,
) -> Result<Vec<Branch>> {
    let tenant = cluster.tenant_id;
    let divergent: Vec<Branch> = cluster
        .branches
        .iter()
        .filter(|b| b.divergent.as_ref().is_some_and(|d| d.site.split(", ").any(|s| s == site)))
        .cloned()
        .collect();
    for d in &divergent {
        let div = d.divergent.clone().expect("filtered");
        let t1 = d.timeline_id;
        let mut sealed = Vec::new();
        for sk in returning {
            let after = seal(sk, tenant, t1).map_err(|e| Error::Failed(format!("{}: sealing {t1}: {e}", sk.name)))?;
            sealed.push((*sk, after));
        }
        let others: Vec<(&Service, TimelineStatus)> = wd
            .cluster
            .of_kind(Kind::Safekeeper)
            .filter(|sk| !returning.iter().any(|r| r.name == sk.name))
            .filter_map(|sk| sk_status(sk, tenant, t1).map(|s| (sk, s)))
            .collect();
        let (ack_here, held, source) = lost_side(wd, &sealed, &others);
        let acknowledged = ack_here.max(div.acknowledged_lsn);
        let tail = Tail { timeline: t1, fork: div.fork_lsn, acknowledged, held, source };
        let transactions = tail_transactions(wd, tenant, &d.name, &tail, progress);
        if let Some(b) = cluster.branches.iter_mut().find(|b| b.name == d.name) {
            if let Some(x) = b.divergent.as_mut() {
                x.acknowledged_lsn = acknowledged;
            }
        }
        let loss = Loss {
            branch: div.continued_as.clone(),
            divergent: d.name.clone(),
            fork_lsn: div.fork_lsn,
            acknowledged,
            held,
            told: div.fork_lsn,
            transactions,
            stretched: false,
        };
        progress.tell(SiteEvent::Loss { loss, lost_site: site.to_string() });
    }
    Ok(divergent)
}

/// Commit records of `timeline`'s WAL in [from, split) and in [split,
/// to), read from `sk`'s stream (the same protocol a pageserver uses).
fn count_commits(
    wd: &Workdir,
    sk: &Service,
    (tenant, timeline): (TenantId, TimelineId),
    from: Lsn,
    split: Lsn,
    to: Lsn,
) -> std::result::Result<(u64, u64), String> {
    use strata_formats::v15::records::xact::{XLOG_XACT_COMMIT, XLOG_XACT_COMMIT_PREPARED, XLOG_XACT_OPMASK};
    use strata_formats::v15::rmgr::RM_XACT_ID;
    let status = sk_status(sk, tenant, timeline).ok_or("no status")?;
    let addr = sk.addr("listen").ok_or("no protocol address")?;
    let sockaddr = addr.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("address does not resolve")?;
    let tcp = TcpStream::connect_timeout(&sockaddr, QUICK).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(READ_TAIL_READ_TIMEOUT)).map_err(|e| e.to_string())?;
    let mut stream = match super::certs::client(&wd.root).map_err(|e| e.to_string())? {
        Some(tls) => tls.connect_blocking(strata_service::tls::host_of(&addr), tcp).map_err(|e| e.to_string())?,
        None => strata_service::tls::BlockingStream::Plain(tcp),
    };
    let token = super::keys::signer(&wd.root).map_err(|e| e.to_string())?.map(|s| {
        strata_protocol::Token::new(s.sign(&Claims::new(
            Scope::Tenant,
            Some(tenant),
            Some(crate::limits::CLI_TOKEN_TTL),
        )))
    });
    let mut out = Vec::new();
    codec::encode_consumer(
        &ConsumerMessage::Start(StartStreaming {
            protocol_version: PROTOCOL_VERSION,
            tenant_id: tenant,
            timeline_id: timeline,
            start_lsn: from,
            stop_lsn: to,
            include_uncommitted: false,
            consumer_id: "strata site rejoin".into(),
            token,
            generation: 0,
            shard: strata_protocol::shard::ShardIndex::UNSHARDED,
            format: strata_protocol::decoded_wal::StreamFormat::Raw,
            stripe_blocks: strata_protocol::shard::DEFAULT_STRIPE_BLOCKS,
        }),
        &mut out,
    );
    stream.write_all(&out).and_then(|()| stream.flush()).map_err(|e| e.to_string())?;
    let mut frames = FrameReader::new(stream, codec::MAX_FRAME_SIZE);
    let version = PgVersion::from_major(status.pg_version)
        .ok_or_else(|| format!("the timeline is of PostgreSQL {}, which is not supported", status.pg_version))?;
    let mut decoder = WalDecoder::new(version, from, u64::from(status.wal_segment_size), StartPosition::RecordBoundary);
    decoder.set_system_id(status.system_id);
    let (mut before, mut after, mut at) = (0u64, 0u64, from);
    let deadline = Instant::now() + READ_TAIL_TIMEOUT;
    while at < to {
        if Instant::now() >= deadline {
            return Err(format!("the WAL reached {at}, not {to}, within {}s", READ_TAIL_TIMEOUT.as_secs()));
        }
        let frame = frames.read_frame_blocking().map_err(|e| e.to_string())?;
        match codec::decode_stream(frame).map_err(|e| e.to_string())? {
            StreamMessage::Wal(w) => {
                at = Lsn(w.begin_lsn.0 + w.wal.len() as u64);
                decoder.feed(&w.wal);
                while let Some(r) = decoder.next_record().map_err(|e| e.to_string())? {
                    let op = r.header.info & XLOG_XACT_OPMASK;
                    if r.header.rmgr == RM_XACT_ID && (op == XLOG_XACT_COMMIT || op == XLOG_XACT_COMMIT_PREPARED) {
                        // Acknowledged once the commit LSN passed the record's end.
                        if r.end_lsn <= split {
                            before += 1;
                        } else if r.lsn < to {
                            after += 1;
                        }
                    }
                }
            }
            StreamMessage::Error(e) => return Err(format!("{:?}: {}", e.code, e.message)),
            StreamMessage::Decoded(_) => return Err("decoded WAL in a raw stream".into()),
            StreamMessage::Start(_) | StreamMessage::Keepalive { .. } => {}
        }
    }
    Ok((before, after))
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::fakes::{self, FakeServices};
    use crate::http::with_transport;
    use crate::options::InitOptions;
    use crate::report::Event;

    #[test]
    fn what_a_quorum_may_have_flushed_bounds_the_acknowledged_wal() {
        use strata_protocol::safekeeper::membership::Member;
        let member =
            |id: u64, site: &str| Member { id: NodeId(id), address: format!("sk{id}:1"), site: Some(site.into()) };
        let members = vec![member(1, "dc1"), member(2, "dc1"), member(3, "dc2")];
        let local =
            Placement::LocalQuorum { home: "dc1".into(), max_async_lag: 1 << 30, on_async_lag: OnAsyncLag::default() };
        let m = Membership::of(1, members.clone(), local);
        let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
        // dc1's two voters must both flush a commit: the lower of the two;
        // dc2's asynchronous member counts for nothing.
        assert_eq!(quorum_bound(&m, &[(n1, Lsn(100)), (n2, Lsn(150)), (n3, Lsn(50))]), Lsn(100));
        assert_eq!(quorum_bound(&m, &[(n1, Lsn(100)), (n2, Lsn(150)), (n3, Lsn(500))]), Lsn(100));
        // A voter that does not answer may have flushed anything: the other's.
        assert_eq!(quorum_bound(&m, &[(n1, Lsn(100)), (n3, Lsn(50))]), Lsn(100));
        // Neither answers: nothing bounds it.
        assert_eq!(quorum_bound(&m, &[(n3, Lsn(50))]), Lsn(u64::MAX));
        // A majority of three: the second highest.
        let m = Membership::of(1, members, Placement::Majority);
        assert_eq!(quorum_bound(&m, &[(n1, Lsn(100)), (n2, Lsn(150)), (n3, Lsn(50))]), Lsn(100));
        assert_eq!(quorum_bound(&m, &[(n1, Lsn(100)), (n3, Lsn(50))]), Lsn(100));
        assert_eq!(quorum_bound(&m, &[(n3, Lsn(50))]), Lsn(u64::MAX));
    }

    /// Two sites on this machine (sk1, sk2 and a pageserver in dc1; sk3
    /// and a pageserver in dc2), `main` under local-quorum at home in dc1,
    /// every service a fake.
    fn two_sites(tag: &str) -> (Workdir, Rc<FakeServices>) {
        let dir = std::env::temp_dir().join(format!("strata-site-{tag}-{}", TimelineId::generate()));
        crate::init::init(&InitOptions { sites: Some(2), insecure_loopback: true, ..InitOptions::for_test(&dir, 3) })
            .unwrap();
        let wd = Workdir::open(&dir).unwrap();
        let fake = fakes::of_workdir(&wd, Lsn(0x0300_0000));
        (wd, fake)
    }

    fn base(wd: &Workdir, name: &str) -> String {
        wd.service(name).unwrap().http_url()
    }

    fn cluster_text(wd: &Workdir) -> String {
        std::fs::read_to_string(wd.root.join(crate::layout::CLUSTER_FILE)).unwrap()
    }

    fn promote_dc2(wd: &Workdir, fake: &Rc<FakeServices>) -> Result<()> {
        promote_dc2_telling(wd, fake, &mut Vec::new())
    }

    fn promote_dc2_telling(wd: &Workdir, fake: &Rc<FakeServices>, events: &mut Vec<Event>) -> Result<()> {
        with_transport(fake.clone(), || promote(wd, "dc2", events))
    }

    /// The events' lines, in order.
    fn lines(events: &[Event]) -> Vec<String> {
        events.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn promote_when_the_other_site_is_gone_forks_each_branch_where_this_site_ends() {
        let (wd, fake) = two_sites("gone");
        let main = wd.cluster.tenants[0].branch("main").unwrap().clone();
        for name in ["sk1", "sk2", "pageserver"] {
            fake.safekeeper(&base(&wd, name), |s| s.down = true);
            fake.pageserver(&base(&wd, name), |p| p.down = true);
        }
        let mut events = Vec::new();
        promote_dc2_telling(&wd, &fake, &mut events).unwrap();

        let after = Workdir::open(&wd.root).unwrap();
        let divergent = format!("main-divergent-{:X}", 0x0300_0000);
        // Told as it went: the lost pageserver, the attachment, the fork, then the report.
        let told = lines(&events);
        let at = |prefix: &str| told.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{told:?}"));
        let (lost, attached) = (at("pageserver: lost with its site"), at("pageserver2: the tenant is attached in dc2"));
        let (goes_on, report) =
            (at("branch main: goes on in timeline"), at("branch main: dc1's safekeepers did not answer"));
        assert!(lost < attached && attached < goes_on && goes_on < report, "{told:?}");
        assert!(told[report].ends_with(&format!("its history is branch {divergent}")), "{}", told[report]);
        assert!(events.iter().all(|e| !e.is_notice()), "{told:?}");
        let old = after.cluster.tenants[0].branch(&divergent).expect("the old timeline is kept as a branch");
        assert_eq!(old.timeline_id, main.timeline_id);
        let d = old.divergent.as_ref().unwrap();
        assert_eq!((d.site.as_str(), d.continued_as.as_str(), d.fork_lsn), ("dc1", "main", Lsn(0x0300_0000)));
        let new = after.cluster.tenants[0].branch("main").unwrap();
        assert_ne!(new.timeline_id, main.timeline_id);
        assert_eq!((new.parent.as_deref(), new.ancestor_lsn), (Some(divergent.as_str()), Some(Lsn(0x0300_0000))));
        assert!(matches!(&new.placement, Some(Placement::LocalQuorum { home, .. }) if home == "dc2"));
        // Sealed where it was reached; the new timeline configured on sk3 (its home's quorum).
        let sk3 = base(&wd, "sk3");
        let sealed = fake.safekeepers.borrow()[&sk3].timelines[&main.timeline_id].sealed;
        assert!(sealed, "dc2's safekeeper sealed the old timeline");
        let m = fake.membership(&sk3, new.timeline_id).expect("the new timeline is on sk3");
        assert_eq!((m.generation, m.members.len()), (1, 3));
        assert_eq!(fake.controllers.borrow().attached, "pageserver2", "the tenant is attached in dc2");
    }

    #[test]
    fn promote_changes_nothing_when_this_site_cannot_answer_or_be_sealed() {
        let (wd, fake) = two_sites("unsealed");
        let before = cluster_text(&wd);
        let sk3 = base(&wd, "sk3");
        fake.safekeeper(&sk3, |s| s.down = true);
        let e = promote_dc2(&wd, &fake).unwrap_err();
        assert!(e.to_string().contains("no safekeeper of dc2 answers"), "{e}");
        assert!(
            fake.calls.borrow().iter().all(|c| !c.ends_with("/seal") && !c.contains("/lost")),
            "nothing was sealed and no pageserver declared lost: {:?}",
            fake.calls.borrow()
        );

        fake.safekeeper(&sk3, |s| {
            s.down = false;
            s.refuse_seal = Some(500);
        });
        let e = promote_dc2(&wd, &fake).unwrap_err();
        assert!(e.to_string().contains("no safekeeper of dc2 could be sealed"), "{e}");
        assert!(fake.calls.borrow().iter().all(|c| !c.contains("/lost")), "no pageserver declared lost");
        assert_eq!(cluster_text(&wd), before, "cluster.toml is as it was");
        assert_eq!(fake.controllers.borrow().attached, "pageserver");
    }

    #[test]
    fn a_seal_answered_with_an_unsealed_timeline_is_an_error() {
        let (wd, fake) = two_sites("lying");
        let before = cluster_text(&wd);
        fake.safekeeper(&base(&wd, "sk3"), |s| {
            s.ignore_seal = true;
            s.timelines.values_mut().for_each(|t| t.commit_lsn = Lsn(0x0200_0000));
        });
        let e = promote_dc2(&wd, &fake).unwrap_err();
        assert!(e.to_string().contains("answered the seal with an unsealed timeline"), "{e}");
        assert_eq!(cluster_text(&wd), before);
    }

    #[test]
    fn a_fork_the_pageserver_refuses_leaves_the_cluster_file_and_promote_resumes() {
        let (wd, fake) = two_sites("fork");
        let before = cluster_text(&wd);
        for name in ["sk1", "sk2"] {
            fake.safekeeper(&base(&wd, name), |s| s.down = true);
        }
        let ps2 = base(&wd, "pageserver2");
        fake.pageserver(&ps2, |p| p.refuse_branch = Some(500));
        let mut events = Vec::new();
        let e = promote_dc2_telling(&wd, &fake, &mut events).unwrap_err();
        assert!(e.to_string().contains("forking at"), "{e}");
        assert_eq!(cluster_text(&wd), before, "no branch was recorded");
        // The steps done before the refusal were told, no fork and no report.
        let told = lines(&events);
        assert!(told.iter().any(|l| l == "pageserver2: the tenant is attached in dc2"), "{told:?}");
        assert!(told.iter().all(|l| !l.contains("goes on in timeline") && !l.contains("history is")), "{told:?}");
        // Run again once the pageserver takes it: the seal is found and kept.
        fake.pageserver(&ps2, |p| p.refuse_branch = None);
        promote_dc2(&wd, &fake).unwrap();
        let after = Workdir::open(&wd.root).unwrap();
        assert!(after.cluster.tenants[0].branch(&format!("main-divergent-{:X}", 0x0300_0000)).is_some());
        assert_eq!(after.cluster.tenants[0].branches.iter().filter(|b| b.divergent.is_none()).count(), 1);
    }

    #[test]
    fn a_site_without_safekeepers_or_pageservers_cannot_take_over() {
        let (wd, _fake) = two_sites("usage");
        let e = promote(&wd, "dc3", &mut Vec::new()).unwrap_err();
        assert!(matches!(e, Error::Usage(_)) && e.to_string().contains("no safekeeper"), "{e}");
    }
}
