//! The leader's side of splits (`crate::split` has the state changes): the
//! API call that begins one, and the decision rounds' steps that take it
//! to `Done` or `RolledBack`.

use std::collections::BTreeMap;

use strata_formats::Lsn;
use strata_protocol::api::controller::{SplitPhase, TenantSplit};
use strata_protocol::api::pageserver::{LocationMode, SplitChild, SplitShardRequest};
use strata_protocol::{TenantId, TenantShardId};
use strata_remote_storage::cas::ObjectVersion;
use strata_service::failpoint;
use tracing::{info, warn};

use super::{CallError, Controller, Inner};
use crate::limits::{SPLIT_ATTEMPTS, SPLIT_SWEEP_SETTLE, WRITE_ATTEMPTS};
use crate::split::{self, SplitCall};
use strata_protocol::api::controller::ControllerState;

impl Controller {
    /// Begins a split of `tenant` into `to` shards (`POST /v1/tenant/{tenant}/split`):
    /// records it as prepared; the decision rounds take it on.
    pub async fn split_tenant(&self, tenant: TenantId, to: u8, stripe_blocks: u32) -> Result<TenantSplit, CallError> {
        let mut generations: Option<Vec<u32>> = None;
        for _ in 0..WRITE_ATTEMPTS {
            let (state, version, term) = self.leader_state().await?;
            if let Some(s) = state.splits.get(&tenant).filter(|s| s.is_open() && s.to.count == to) {
                return Ok(s.clone());
            }
            let gens = match &generations {
                Some(g) => g.clone(),
                None => {
                    // Above any object a child's prefix holds, and above the
                    // generations of an earlier attempt (rolled back, its
                    // objects swept): no generation is issued twice.
                    let earlier = state.splits.get(&tenant).map(|s| s.generations.iter().copied().max().unwrap_or(0));
                    let mut g = Vec::with_capacity(usize::from(to));
                    for shard in (0..to).map(|n| strata_protocol::shard::ShardIndex::new(n, to)) {
                        let shard = shard.map_err(|e| CallError::Split(e.to_string()))?;
                        let child = TenantShardId { tenant, shard };
                        let max = self.store.max_generation(child).await.map_err(|e| {
                            self.metrics.storage_errors.inc();
                            CallError::Store(format!("tenant {child}: listing its objects: {e}"))
                        })?;
                        g.push(max.max(earlier.unwrap_or(0)) + 1);
                    }
                    generations.insert(g).clone()
                }
            };
            let next = split::prepare(&state, tenant, to, stripe_blocks, gens).map_err(|e| match e {
                split::SplitRefused::NotSettled { .. } => CallError::Later(e.to_string()),
                _ => CallError::Split(e.to_string()),
            })?;
            let recorded = next.splits[&tenant].clone();
            match self.write(next, version.as_ref(), term).await {
                Ok(()) => {
                    info!(tenant = %tenant, from = recorded.from.count, to, "split prepared");
                    failpoint::hit("controller-split-prepared").map_err(CallError::Store)?;
                    self.wake.notify_one();
                    return Ok(recorded);
                }
                Err(e) => warn!(tenant = %tenant, "preparing a split: {e}"),
            }
        }
        Err(CallError::Store(format!("tenant {tenant}: the state kept changing; the split was not recorded")))
    }

    /// The newest split of `tenant`, as the state has it.
    pub fn split_of(&self, tenant: TenantId) -> Option<TenantSplit> {
        self.inner.lock().state.as_ref().and_then(|(s, _)| s.splits.get(&tenant).cloned())
    }

    /// Takes each split one step, if it can: at most one write per call
    /// (the round repeats at once after a write).
    pub(super) async fn advance_splits(
        &self,
        state: &ControllerState,
        version: Option<&ObjectVersion>,
        term: u64,
    ) -> Result<bool, String> {
        {
            // Calls of splits past `Prepared` are of no more use.
            let mut inner = self.inner.lock();
            let open = |p: &TenantShardId| state.splits.get(&p.tenant).is_some_and(|s| s.phase == SplitPhase::Prepared);
            inner.split_calls.retain(|p, _| open(p));
            let copied = |c: &TenantShardId| state.splits.get(&c.tenant).is_some_and(|s| s.phase == SplitPhase::Copied);
            inner.split_goals.retain(|c, _| copied(c));
            let sweeping = |t: &TenantId| state.splits.get(t).is_some_and(|s| s.phase == SplitPhase::Done && !s.swept);
            inner.split_clean_since.retain(|t, _| sweeping(t));
        }
        for (tenant, s) in &state.splits {
            let next = match s.phase {
                SplitPhase::Prepared => self.prepared_step(state, *tenant, s),
                SplitPhase::Copied if self.children_ready(state, *tenant, s) => split::done(state, *tenant),
                SplitPhase::RolledBack if !s.swept => self.sweep_children(state, *tenant, s).await,
                SplitPhase::Done if !s.swept => self.sweep_parents(state, *tenant, s).await,
                _ => None,
            };
            let Some(next) = next else { continue };
            let now = next.splits[tenant].clone();
            self.write(next, version, term).await?;
            match (now.phase, now.swept) {
                (SplitPhase::Copied, _) => {
                    info!(tenant = %tenant, "split copied: the children are placed");
                    failpoint::hit("controller-split-copied")?
                }
                (SplitPhase::Done, false) => {
                    info!(tenant = %tenant, to = now.to.count, "split done: the children serve the tenant");
                    failpoint::hit("controller-split-done")?
                }
                (SplitPhase::RolledBack, false) => {
                    warn!(tenant = %tenant, error = ?now.error, "split rolled back")
                }
                (SplitPhase::RolledBack, true) => info!(tenant = %tenant, "a rolled back split's children are gone"),
                (SplitPhase::Done, true) => info!(tenant = %tenant, "the parents' objects are gone"),
                (SplitPhase::Prepared, _) => {}
            }
            self.wake.notify_one();
            return Ok(true);
        }
        Ok(false)
    }

    /// `Prepared`: calls each parent's pageserver until all have written
    /// their children's indexes (then `Copied`), or rolls back once one
    /// refuses or keeps failing.
    fn prepared_step(&self, state: &ControllerState, tenant: TenantId, s: &TenantSplit) -> Option<ControllerState> {
        let parents = s.parent_ids(tenant);
        let calls: BTreeMap<TenantShardId, SplitCall> = {
            let inner = self.inner.lock();
            parents.iter().filter_map(|p| Some((*p, inner.split_calls.get(p)?.clone()))).collect()
        };
        let failed = calls.iter().find(|(_, c)| c.permanent || c.failures >= SPLIT_ATTEMPTS);
        if let Some((p, c)) = failed {
            let why = format!("{p}: {}", c.last_error.clone().unwrap_or_default());
            return split::roll_back(state, tenant, why);
        }
        if parents.iter().all(|p| calls.get(p).is_some_and(|c| c.done)) {
            return split::copied(state, tenant);
        }
        for parent in parents.iter().filter(|p| !calls.get(p).is_some_and(|c| c.done)) {
            let Some(ps) = state.tenants.get(parent).and_then(|p| p.attached.as_ref()) else { continue };
            let Some(ps) = self.conf.pageserver(ps).cloned() else { continue };
            let children = s
                .child_ids(tenant)
                .into_iter()
                .zip(&s.generations)
                .filter(|(c, _)| c.shard.number % s.from.count == parent.shard.number)
                .map(|(shard, generation)| SplitChild { shard, generation: *generation })
                .collect();
            self.send_split(&ps, *parent, SplitShardRequest { stripe_blocks: s.to.stripe_blocks, children });
        }
        None
    }

    /// Sends a parent's pageserver its split call in a task of its own,
    /// unless one is under way or waits to be retried.
    fn send_split(&self, ps: &crate::config::PageserverRef, parent: TenantShardId, req: SplitShardRequest) {
        let key = (format!("split {}", ps.name), parent);
        if self.retries.lock().waiting(&key, self.clock.now()) || !self.split_in_flight.lock().insert(parent) {
            return;
        }
        info!(pageserver = %ps.name, %parent, children = req.children.len(), "split: writing the children's indexes");
        let (pageservers, http, me) = (self.pageservers.clone(), ps.http.clone(), self.me.clone());
        self.spawn.spawn(Box::pin(async move {
            let r = pageservers.split_shard(&http, parent, req).await;
            let Some(me) = me.upgrade() else { return };
            me.split_in_flight.lock().remove(&parent);
            let mut retries = me.retries.lock();
            let mut inner = me.inner.lock();
            let call = inner.split_calls.entry(parent).or_default();
            match r {
                Ok(_) => {
                    retries.succeeded(&key);
                    call.done = true;
                }
                Err((permanent, e)) => {
                    retries.failed(key, me.clock.now());
                    call.failures += 1;
                    call.permanent |= permanent;
                    warn!(%parent, failures = call.failures, "split call: {e}");
                    call.last_error = Some(e);
                }
            }
            drop((inner, retries));
            me.wake.notify_one();
        }));
    }

    /// The size policy (`SplitPolicy`): begins the split of the first
    /// tenant one of whose shards holds more of its own layers than the
    /// policy allows, once all its shards are attached where they should
    /// be and no split of it is under way. At most one per round.
    pub(super) async fn policy_split(&self, state: &ControllerState) -> Result<(), CallError> {
        let policy = &self.conf.split_policy;
        if policy.shard_bytes == 0 {
            return Ok(());
        }
        let tenants: std::collections::BTreeSet<TenantId> = state.tenants.keys().map(|t| t.tenant).collect();
        for tenant in tenants {
            if state.splits.get(&tenant).is_some_and(|s| s.is_open()) {
                continue;
            }
            let shards = split::current_shards(state, tenant);
            let Some(count) = shards.first().map(|(t, _)| t.shard.shards()) else { continue };
            if shards.len() != usize::from(count) || shards.iter().any(|(_, p)| p.migration.is_some()) {
                continue;
            }
            let mut sizes = Vec::with_capacity(shards.len());
            for (shard, p) in &shards {
                let Some(size) = p.attached.as_deref().and_then(|ps| self.own_bytes(ps, *shard)) else { break };
                sizes.push(size);
            }
            if sizes.len() != shards.len() {
                continue;
            }
            let largest = sizes.iter().map(|(bytes, _)| *bytes).max().unwrap_or(0);
            let Some(to) = policy.next_count(count, largest) else { continue };
            let stripe = match sizes.iter().find_map(|(_, stripe)| *stripe) {
                Some(stripe) => stripe,
                None if count == 1 => policy.stripe_blocks,
                // A sharded tenant whose stripe no shard reported yet.
                None => continue,
            };
            info!(tenant = %tenant, from = count, to, largest, limit = policy.shard_bytes, "size policy: splitting");
            self.split_tenant(tenant, to, stripe).await?;
            return Ok(());
        }
        Ok(())
    }

    /// What `shard` holds of its own layers on `ps` (every timeline), and
    /// its stripe, as the heartbeat said.
    fn own_bytes(&self, ps: &str, shard: TenantShardId) -> Option<(u64, Option<u32>)> {
        let inner = self.inner.lock();
        let status = inner.health.get(ps)?.status.as_ref()?;
        let timelines: Vec<_> = status.timelines.iter().filter(|t| t.tenant_id == shard).collect();
        if timelines.is_empty() {
            return None;
        }
        let bytes = timelines.iter().map(|t| t.layer_bytes.saturating_sub(t.foreign_layer_bytes)).sum();
        Some((bytes, timelines.iter().find_map(|t| t.stripe_blocks)))
    }

    /// `Copied`: whether every child is attached under its generation and
    /// has ingested every timeline as far as its parent had when the child
    /// was first seen attached.
    fn children_ready(&self, state: &ControllerState, tenant: TenantId, s: &TenantSplit) -> bool {
        let parents = s.parent_ids(tenant);
        let mut inner = self.inner.lock();
        for child in s.child_ids(tenant) {
            let Some(p) = state.tenants.get(&child) else { return false };
            let Some(at) = p.attached.as_deref() else { return false };
            let attached = inner.health.get(at).and_then(|h| h.status.as_ref()).is_some_and(|st| {
                st.locations.iter().any(|l| {
                    l.tenant_id == child && l.mode == LocationMode::Attached && l.generation == Some(p.generation)
                })
            });
            let Some(have) = attached.then(|| timeline_lsns(&inner, at, child)).flatten() else { return false };
            if !inner.split_goals.contains_key(&child) {
                let parent = parents[usize::from(child.shard.number % s.from.count)];
                let parent_at = state.tenants.get(&parent).and_then(|p| p.attached.clone());
                let Some(goal) = parent_at.and_then(|ps| timeline_lsns(&inner, &ps, parent)) else { return false };
                inner.split_goals.insert(child, goal);
            }
            let goal = &inner.split_goals[&child];
            if !goal.iter().all(|(tl, lsn)| have.get(tl).is_some_and(|h| h >= lsn)) {
                return false;
            }
        }
        true
    }

    /// `Done`: once no shard of the tenant names a layer in another
    /// shard's objects (every one attached, each timeline's uploaded index
    /// free of foreign layers, as the heartbeats say) and no pageserver
    /// holds a parent any more, removes the objects of every earlier
    /// layout's shards (a split goes from `n` to a multiple of `n`: their
    /// counts divide today's); `swept` once they are gone.
    async fn sweep_parents(
        &self,
        state: &ControllerState,
        tenant: TenantId,
        s: &TenantSplit,
    ) -> Option<ControllerState> {
        let shards = split::current_shards(state, tenant);
        let clean = shards.len() == usize::from(s.to.count) && self.free_of_foreign_layers(&shards);
        // Clean through a settling time of heartbeats, not one answer: a
        // shard reporting a moment's state (a move, a restart) must not
        // cost the objects another shard still names.
        let now = self.clock.now();
        let since = {
            let mut inner = self.inner.lock();
            if !clean {
                inner.split_clean_since.remove(&tenant);
                return None;
            }
            *inner.split_clean_since.entry(tenant).or_insert(now)
        };
        if self.clock.since(since) < SPLIT_SWEEP_SETTLE {
            return None;
        }
        let earlier: Vec<TenantShardId> =
            s.to.earlier()
                .flat_map(|layout| layout.shards().map(|shard| TenantShardId { tenant, shard }).collect::<Vec<_>>())
                .collect();
        let held = {
            let inner = self.inner.lock();
            inner.health.values().filter_map(|h| h.status.as_ref()).any(|st| {
                st.locations.iter().any(|l| l.mode != LocationMode::Detached && earlier.contains(&l.tenant_id))
            })
        };
        if held {
            return None;
        }
        info!(tenant = %tenant, "no shard named another shard's layers for {SPLIT_SWEEP_SETTLE:?}: sweeping");
        if !self.delete_shards_objects(&earlier, "a split's parent").await {
            return None;
        }
        split::swept(state, tenant)
    }

    /// Deletes every object of each of `shards` (`what` names them in the
    /// log); false after the first failure, which is noted: the caller
    /// tries again on a later pass.
    async fn delete_shards_objects(&self, shards: &[TenantShardId], what: &str) -> bool {
        for shard in shards {
            match self.store.delete_shard_objects(*shard).await {
                Ok(n) if n > 0 => info!(%shard, objects = n, "{what} removed"),
                Ok(_) => {}
                Err(e) => {
                    self.metrics.storage_errors.inc();
                    self.note_error(format!("removing {shard}'s objects: {e}"));
                    return false;
                }
            }
        }
        true
    }

    /// Whether every one of `shards` is attached under its generation with
    /// its timelines known, the same timelines as the others, and none of
    /// them naming another shard's layers.
    fn free_of_foreign_layers(
        &self,
        shards: &[(TenantShardId, &strata_protocol::api::controller::TenantPlacement)],
    ) -> bool {
        let inner = self.inner.lock();
        let mut timelines: Option<std::collections::BTreeSet<String>> = None;
        let mut seen = Vec::new();
        for (shard, p) in shards {
            let Some(st) = p.attached.as_deref().and_then(|ps| inner.health.get(ps)?.status.as_ref()) else {
                return false;
            };
            let attached = st.locations.iter().any(|l| {
                l.tenant_id == *shard && l.mode == LocationMode::Attached && l.generation == Some(p.generation)
            });
            let mine: Vec<_> = st.timelines.iter().filter(|t| t.tenant_id == *shard).collect();
            let ids: std::collections::BTreeSet<String> = mine.iter().map(|t| t.timeline_id.to_string()).collect();
            let clean = mine.iter().all(|t| t.foreign_layer_bytes == 0 && t.remote.is_some());
            if tracing::enabled!(tracing::Level::DEBUG) {
                let detail: Vec<String> = mine
                    .iter()
                    .map(|t| {
                        let layers = t.remote.as_ref().map(|r| r.remote_layers);
                        format!("{}:{}:{}:{layers:?}", t.timeline_id, t.layer_bytes, t.foreign_layer_bytes)
                    })
                    .collect();
                seen.push(format!("{shard}@{:?}#{} [{}]", p.attached, p.generation, detail.join(" ")));
            }
            if !attached || ids.is_empty() || !clean || timelines.as_ref().is_some_and(|t| *t != ids) {
                return false;
            }
            timelines = Some(ids);
        }
        // What the sweep goes by (timeline:layer bytes:foreign bytes:remote layers).
        tracing::debug!(shards = %seen.join(" "), "no shard names another shard's layers");
        true
    }

    /// `RolledBack`: removes the children's objects; `swept` once they are gone.
    async fn sweep_children(
        &self,
        state: &ControllerState,
        tenant: TenantId,
        s: &TenantSplit,
    ) -> Option<ControllerState> {
        // A call still under way may write a child's index yet (the
        // pageservers also check that the split is prepared before each).
        if s.parent_ids(tenant).iter().any(|p| self.split_in_flight.lock().contains(p)) {
            return None;
        }
        if !self.delete_shards_objects(&s.child_ids(tenant), "a rolled back split's child").await {
            return None;
        }
        split::swept(state, tenant)
    }
}

/// Each timeline's `last_record_lsn` of `shard` on `ps`, as its heartbeat said.
fn timeline_lsns(inner: &Inner, ps: &str, shard: TenantShardId) -> Option<BTreeMap<String, Lsn>> {
    let s = inner.health.get(ps)?.status.as_ref()?;
    let lsns: BTreeMap<String, Lsn> = s
        .timelines
        .iter()
        .filter(|t| t.tenant_id == shard)
        .map(|t| (t.timeline_id.to_string(), t.last_record_lsn))
        .collect();
    (!lsns.is_empty()).then_some(lsns)
}
