//! `strata tenant split NAME --shards N` (`docs/sharding.md`, "Split, step
//! by step"): the storage controllers record and carry out the split; the
//! CLI asks for it, follows it to its end, and records the new layout in
//! the cluster file (new computes are started with it; running ones
//! switch by themselves once the controllers answer the children).

use std::time::Instant;

use strata_protocol::api::controller::{SplitPhase, SplitRequest, TenantSplit};
use strata_protocol::shard::ShardLayout;
use strata_protocol::TenantId;

use super::error::{failed, Error, Result};
use super::http;
use super::layout::{update_cluster, Kind, Tenant, TenantState, Workdir};
use super::report::{Progress, TenantEvent};
use crate::limits::{CONTROLLER_ACTION_POLL, QUICK, SPLIT_WAIT};

/// A split that ended in the children: `tenant acme: 1 shard -> 4 shards`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSplitDone {
    pub name: String,
    pub tenant: TenantId,
    pub from: u8,
    pub to: ShardLayout,
}

impl std::fmt::Display for TenantSplitDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: u8| if n == 1 { "" } else { "s" };
        write!(
            f,
            "tenant {}: {} shard{} -> {} shards of {} blocks per stripe",
            self.name,
            self.from,
            plural(self.from),
            self.to.count,
            self.to.stripe_blocks
        )
    }
}

/// Splits tenant `name` into `shards` shards (its stripe, or `stripe_blocks`
/// for an unsharded tenant) and waits for the split to end ([`record`]
/// then writes the layout down). Run again after an interruption, it
/// follows the split under way (or finds the one done).
pub fn split(
    wd: &Workdir,
    name: &str,
    shards: u32,
    stripe_blocks: Option<u32>,
    progress: &mut dyn Progress,
) -> Result<TenantSplitDone> {
    let t = wd.cluster.tenant_named(name)?;
    if t.state != TenantState::Active {
        return failed(format!("tenant {name} is {:?}: only an active tenant is split", t.state));
    }
    let from = t.layout();
    if from.is_sharded() && stripe_blocks.is_some_and(|s| s != from.stripe_blocks) {
        return Err(Error::Usage(format!(
            "tenant {name} has stripes of {} blocks; a split keeps them (leave out --stripe-blocks)",
            from.stripe_blocks
        )));
    }
    let stripe = if from.is_sharded() { from.stripe_blocks } else { stripe_blocks.unwrap_or(from.stripe_blocks) };
    let from = ShardLayout { count: from.count, stripe_blocks: stripe };
    let to = from.split(shards).map_err(|e| Error::Usage(format!("tenant {name}: {e}")))?;
    let tenant = t.tenant_id;
    let recorded = match newest(wd, tenant)? {
        Some(s) if s.to == to && s.phase != SplitPhase::RolledBack => s,
        _ => begin(wd, tenant, to)?,
    };
    let mut phase = None;
    let deadline = Instant::now() + SPLIT_WAIT;
    let mut split = recorded;
    loop {
        if phase != Some(split.phase) {
            let words = serde_json::to_value(split.phase).ok().and_then(|v| v.as_str().map(str::to_string));
            progress.tell(TenantEvent::Split { tenant: name.into(), phase: words.unwrap_or_default() });
            phase = Some(split.phase);
        }
        match split.phase {
            SplitPhase::Done => break,
            SplitPhase::RolledBack => {
                return failed(format!(
                    "tenant {name}: the split to {} shards rolled back: {}",
                    to.count,
                    split.error.unwrap_or_default()
                ))
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return failed(format!(
                "tenant {name}: the split is still {:?} after {SPLIT_WAIT:?}; the controllers carry on (run this again \
                 to follow it)",
                split.phase
            ));
        }
        std::thread::sleep(CONTROLLER_ACTION_POLL);
        // A controller that restarts meanwhile answers again within its
        // lease; a follower's copy may be older than the split begun.
        if let Ok(Some(s)) = newest(wd, tenant) {
            if s.version >= split.version {
                split = s;
            }
        }
    }
    Ok(TenantSplitDone { name: name.into(), tenant, from: from.count, to })
}

/// Records a done split's layout in the cluster file (under the workdir's
/// lock, which the split itself does not hold while it waits).
pub fn record(wd: &Workdir, done: &TenantSplitDone) -> Result<()> {
    update_cluster(&wd.root, |c| {
        if let Some(t) = c.tenants.iter_mut().find(|t| t.tenant_id == done.tenant) {
            t.shards = Some(done.to);
        }
        Ok(())
    })
}

/// The cluster file after a split the controllers finished but the file
/// does not know of yet (a `tenant split` interrupted before it recorded
/// it): `Some` with the workdir opened again once it is recorded.
pub fn adopt_layout(wd: &Workdir, t: &Tenant) -> Result<Option<Workdir>> {
    let Ok(Some(s)) = newest(wd, t.tenant_id) else { return Ok(None) };
    if s.phase != SplitPhase::Done || s.to.count <= t.layout().count {
        return Ok(None);
    }
    let done = TenantSplitDone { name: t.name.clone(), tenant: t.tenant_id, from: s.from.count, to: s.to };
    record(wd, &done)?;
    Ok(Some(Workdir::open(&wd.root)?))
}

/// Refuses what would miss the children of a split under way (a branch
/// created or deleted on the parents alone).
pub fn refuse_while_open(wd: &Workdir, t: &Tenant, what: &str) -> Result<()> {
    match newest(wd, t.tenant_id) {
        Ok(Some(s)) if s.is_open() => failed(format!(
            "tenant {}: a split to {} shards is under way; {what} once it is done (`strata tenant split {} --shards {}` \
             follows it)",
            t.name, s.to.count, t.name, s.to.count
        )),
        _ => Ok(()),
    }
}

/// Asks the controllers (the leader takes it) to begin the split.
fn begin(wd: &Workdir, tenant: TenantId, to: ShardLayout) -> Result<TenantSplit> {
    let body = SplitRequest { shards: to.count, stripe_blocks: to.stripe_blocks };
    // A shard that is moving (a drain, a rebalance) is waited for.
    let deadline = Instant::now() + SPLIT_WAIT / 2;
    loop {
        let mut answers = Vec::new();
        for c in wd.cluster.of_kind(Kind::Controller) {
            let url = format!("{}/v1/tenant/{tenant}/split", c.http_url());
            match http::post(&url, &body, QUICK) {
                Ok(r) if r.status == 202 => return r.json().map_err(|e| Error::Failed(format!("{}: {e}", c.name))),
                // Refused for a reason that asking again does not change.
                Ok(r) if r.status == 409 || r.status == 400 => {
                    return failed(format!("the split was refused: {}", r.error_text()))
                }
                Ok(r) => answers.push(format!("{}: HTTP {}: {}", c.name, r.status, r.error_text())),
                Err(e) => answers.push(format!("{}: {e}", c.name)),
            }
        }
        if Instant::now() >= deadline {
            let answers =
                if answers.is_empty() { "no storage controller is configured".into() } else { answers.join("; ") };
            return failed(format!("no controller took the split ({answers})"));
        }
        std::thread::sleep(CONTROLLER_ACTION_POLL);
    }
}

/// The tenant's newest split, as the newest state among the controllers has it.
fn newest(wd: &Workdir, tenant: TenantId) -> Result<Option<TenantSplit>> {
    let mut best: Option<TenantSplit> = None;
    let mut answered = false;
    for c in wd.cluster.of_kind(Kind::Controller) {
        let url = format!("{}/v1/tenant/{tenant}/split", c.http_url());
        let Ok(r) = http::get(&url, QUICK) else { continue };
        match r.status {
            200 => {
                answered = true;
                let s: TenantSplit = r.json().map_err(|e| Error::Failed(format!("{}: {e}", c.name)))?;
                if best.as_ref().is_none_or(|b| (b.version, phase_rank(b.phase)) < (s.version, phase_rank(s.phase))) {
                    best = Some(s);
                }
            }
            404 => answered = true,
            _ => {}
        }
    }
    if !answered {
        return failed("no storage controller answered".to_string());
    }
    Ok(best)
}

/// Phases in the order a split goes through them (a follower's copy may lag).
fn phase_rank(p: SplitPhase) -> u8 {
    match p {
        SplitPhase::Prepared => 0,
        SplitPhase::Copied => 1,
        SplitPhase::Done | SplitPhase::RolledBack => 2,
    }
}
