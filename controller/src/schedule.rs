//! Placement decisions: from the state and what the heartbeats say, the
//! next state (`docs/storage-controller.md`, "Decisions"). Pure functions,
//! so every case is a unit test; the controller writes what they return
//! by compare-and-swap and then makes the pageservers match it.

use std::collections::{BTreeMap, BTreeSet};

use strata_protocol::api::controller::{ControllerState, DeletedTenant, Migration, PageserverPolicy, TenantPlacement};
use strata_protocol::limits::MAX_DELETED_TENANTS;
use strata_protocol::TenantShardId;

use crate::limits::MAX_SECONDARIES;

/// What the controller knows of the pageservers.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every pageserver, in the configured order of preference.
    pub order: Vec<String>,
    /// Those that answer heartbeats.
    pub online: BTreeSet<String>,
    /// The site of each pageserver that has one (`docs/sites.md`).
    pub sites: BTreeMap<String, String>,
}

impl View {
    fn policy(&self, state: &ControllerState, name: &str) -> PageserverPolicy {
        state.pageservers.get(name).copied().unwrap_or(PageserverPolicy::Active)
    }

    /// Online and taking new placements.
    fn usable(&self, state: &ControllerState, name: &str) -> bool {
        self.online.contains(name) && self.policy(state, name) == PageserverPolicy::Active
    }
}

/// Attached tenants per pageserver.
fn attached_counts(state: &ControllerState) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for p in state.tenants.values() {
        if let Some(a) = &p.attached {
            *counts.entry(a.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// How many other shards of `tenant`'s tenant are attached to (or moving
/// to) `name`: shards of one tenant go to different pageservers where
/// they can, so that one pageserver's failure or load is one shard's.
fn siblings_on(state: &ControllerState, tenant: TenantShardId, name: &str) -> usize {
    if tenant.shard.is_unsharded() {
        return 0;
    }
    state
        .tenants
        .iter()
        .filter(|(t, p)| {
            t.tenant == tenant.tenant
                && **t != tenant
                && (p.attached.as_deref() == Some(name) || p.migration.as_ref().is_some_and(|m| m.to == name))
        })
        .count()
}

/// The usable pageserver (not in `exclude`) with the fewest shards of
/// `tenant`'s tenant, then the fewest attached tenants, in the order of
/// preference on ties.
fn least_loaded(state: &ControllerState, view: &View, exclude: &[&str], tenant: TenantShardId) -> Option<String> {
    let counts = attached_counts(state);
    view.order
        .iter()
        .filter(|n| view.usable(state, n) && !exclude.contains(&n.as_str()))
        .min_by_key(|n| (siblings_on(state, tenant, n), counts.get(*n).copied().unwrap_or(0)))
        .cloned()
}

/// A decision rule: the next state from the state and the view, if
/// anything must change ([`plan`]).
pub type Planner = fn(&ControllerState, &View) -> Option<ControllerState>;

/// Places the tenants of `tenants` that the state does not know yet, each
/// with generations above `first_generation` (what object storage already
/// holds of it); they are attached by the next [`plan`].
pub fn add_tenants(state: &mut ControllerState, tenants: &[(TenantShardId, u32)]) -> bool {
    let mut changed = false;
    for (t, g) in tenants {
        if !state.tenants.contains_key(t) {
            state.tenants.insert(*t, TenantPlacement { generation: *g, ..Default::default() });
            changed = true;
        }
    }
    changed
}

/// The next state, if anything must change: failovers first, then
/// cancelled and new migrations (drains), secondaries, and one rebalancing
/// move at a time.
pub fn plan(state: &ControllerState, view: &View) -> Option<ControllerState> {
    let mut next = state.clone();
    let tenants: Vec<TenantShardId> = next.tenants.keys().copied().collect();
    for t in &tenants {
        let p = next.tenants[t].clone();
        let p = place(&next, view, *t, p);
        next.tenants.insert(*t, p);
    }
    rebalance(&mut next, view);
    debug_assert!(
        state.tenants.iter().all(|(t, before)| keeps_the_rules(before, &next.tenants[t])),
        "a decision broke a placement rule: {state:?} -> {next:?}"
    );
    (next != *state).then_some(next)
}

/// The pageserver a placement's generation belongs to: a move's target
/// (attached under it while the origin serves on), else the attached one.
fn generation_owner(p: &TenantPlacement) -> Option<&String> {
    p.migration.as_ref().map(|m| &m.to).or(p.attached.as_ref())
}

/// What every decision keeps of one tenant: its generation never goes
/// back, and stays with the pageserver it was issued to (another one gets
/// a new generation); an attachment is never dropped; the attached
/// pageserver is neither a secondary nor a move's target. (A move that
/// rebalancing starts may list its target as a secondary until the next
/// round; being the target takes precedence.)
fn keeps_the_rules(before: &TenantPlacement, after: &TenantPlacement) -> bool {
    let same_owner = after.generation != before.generation
        || generation_owner(before).is_none()
        || generation_owner(before) == generation_owner(after);
    let roles_apart = after.attached.as_ref().is_none_or(|a| !after.secondaries.contains(a))
        && after.migration.as_ref().is_none_or(|m| Some(&m.to) != after.attached.as_ref());
    after.generation >= before.generation
        && same_owner
        && (before.attached.is_none() || after.attached.is_some())
        && (after.attached.is_none() || after.generation > 0)
        && roles_apart
}

/// One tenant's placement, decided.
fn place(state: &ControllerState, view: &View, tenant: TenantShardId, mut p: TenantPlacement) -> TenantPlacement {
    let attached_ok = p.attached.as_ref().is_some_and(|a| view.online.contains(a));
    if !attached_ok {
        // Failover (or the first placement). A migration's target is
        // already attached under the current generation: it takes over as
        // it is. Otherwise a secondary (warm) is attached under a new one.
        if let Some(m) = p.migration.take_if(|m| view.online.contains(&m.to)) {
            let old = p.attached.replace(m.to.clone());
            p.secondaries.retain(|s| *s != m.to);
            if let Some(o) = old {
                p.secondaries.insert(0, o);
            }
        } else {
            // A secondary of the failed pageserver's own site first: its
            // computes stay near their pages.
            let old_site = p.attached.as_ref().and_then(|a| view.sites.get(a));
            let from_secondaries = p
                .secondaries
                .iter()
                .filter(|s| view.usable(state, s))
                .min_by_key(|s| (view.sites.get(*s) != old_site, siblings_on(state, tenant, s)))
                .cloned();
            let from_secondaries =
                from_secondaries.or_else(|| p.secondaries.iter().find(|s| view.online.contains(*s)).cloned());
            let target = from_secondaries
                .or_else(|| least_loaded(state, view, &[], tenant))
                .or_else(|| view.order.iter().find(|n| view.online.contains(*n)).cloned());
            // With nowhere to go, a move whose target is down too stays as
            // it is: its generation was issued to the target, so the origin
            // must never be told it (the move ends with the next failover,
            // under a new generation).
            if let Some(to) = target {
                p.migration = None;
                let old = p.attached.replace(to.clone());
                p.generation += 1;
                p.secondaries.retain(|s| *s != to);
                if let Some(o) = old {
                    p.secondaries.insert(0, o);
                }
            }
        }
    } else if let Some(m) = &p.migration {
        if !view.online.contains(&m.to) {
            // The target failed: the origin serves on, under a generation
            // newer than the one the target had.
            p.migration = None;
            p.generation += 1;
        }
    } else {
        let a = p.attached.clone().expect("attached_ok");
        if view.policy(state, &a) == PageserverPolicy::Draining {
            let to = p
                .secondaries
                .iter()
                .find(|s| view.usable(state, s))
                .cloned()
                .or_else(|| least_loaded(state, view, &[a.as_str()], tenant));
            if let Some(to) = to {
                p.migration = Some(Migration { to });
                p.generation += 1;
            }
        }
    }
    // Secondaries: never the attached one or the migration's target; a
    // draining one goes when another can take its place; one usable at least.
    let target = p.migration.as_ref().map(|m| m.to.clone());
    p.secondaries.retain(|s| Some(s) != p.attached.as_ref() && Some(s) != target.as_ref() && view.order.contains(s));
    let mut seen = BTreeSet::new();
    p.secondaries.retain(|s| seen.insert(s.clone()));
    if !p.secondaries.iter().any(|s| view.usable(state, s)) {
        let mut exclude: Vec<&str> = p.secondaries.iter().map(String::as_str).collect();
        exclude.extend(p.attached.as_deref());
        exclude.extend(target.as_deref());
        // Where no sibling shard is attached, if it can: a failover then
        // does not stack two shards on one pageserver.
        let pick = view
            .order
            .iter()
            .filter(|n| view.usable(state, n) && !exclude.contains(&n.as_str()))
            .min_by_key(|n| siblings_on(state, tenant, n));
        if let Some(c) = pick {
            p.secondaries.push(c.clone());
        }
    }
    // A secondary in every other site: it reads for that site's replicas.
    let home = p.attached.as_ref().and_then(|a| view.sites.get(a)).cloned();
    let other_sites: BTreeSet<&String> = view.sites.values().filter(|s| Some(*s) != home.as_ref()).collect();
    if home.is_some() {
        for site in &other_sites {
            let in_site = |n: &String| view.sites.get(n) == Some(*site);
            if p.secondaries.iter().any(|s| in_site(s) && view.usable(state, s)) {
                continue;
            }
            let pick = view.order.iter().find(|n| {
                in_site(n)
                    && view.usable(state, n)
                    && Some(*n) != p.attached.as_ref()
                    && Some(*n) != target.as_ref()
                    && !p.secondaries.contains(n)
            });
            if let Some(c) = pick {
                p.secondaries.push(c.clone());
            }
        }
    }
    if p.secondaries.iter().any(|s| view.usable(state, s)) {
        p.secondaries.retain(|s| view.policy(state, s) == PageserverPolicy::Active);
    }
    while p.secondaries.len() > MAX_SECONDARIES + other_sites.len() {
        // The offline ones go first, then the last added.
        match p.secondaries.iter().rposition(|s| !view.online.contains(s)) {
            Some(i) => p.secondaries.remove(i),
            None => p.secondaries.pop().expect("longer than the bound"),
        };
    }
    p
}

/// The reader of each other site (`docs/sites.md`, "A pageserver per
/// site"): the first secondary in each site that is not the attached
/// pageserver's. Without sites, none.
pub fn site_readers(p: &TenantPlacement, view: &View) -> BTreeMap<String, String> {
    let mut readers = BTreeMap::new();
    let Some(home) = p.attached.as_ref().and_then(|a| view.sites.get(a)) else { return readers };
    let target = p.migration.as_ref().map(|m| &m.to);
    let mut candidates: Vec<&String> = p.secondaries.iter().filter(|s| Some(*s) != target).collect();
    // Stable: in the order of the secondaries, those that answer first.
    candidates.sort_by_key(|s| !view.online.contains(*s));
    for s in candidates {
        if let Some(site) = view.sites.get(s).filter(|site| *site != home) {
            readers.entry(site.clone()).or_insert_with(|| s.clone());
        }
    }
    readers
}

/// When no move is under way and one usable pageserver has at least two
/// attached tenants more than another, starts moving one of them.
fn rebalance(state: &mut ControllerState, view: &View) {
    if state.tenants.values().any(|p| p.migration.is_some() || p.attached.is_none()) {
        return;
    }
    if let Some((t, to)) = rebalancing_move(state, view) {
        let p = state.tenants.get_mut(&t).expect("picked from the map");
        p.migration = Some(Migration { to });
        p.generation += 1;
    }
}

/// The one move rebalancing makes now, if any: (shard, to). Counts that
/// differ by two or more come first; then shards of one tenant that share
/// a pageserver while a less loaded one holds none of theirs (after a
/// failover, a site's return or a split, which places children with their
/// parents). Each move keeps the counts' spread and lowers the shards
/// sharing, so moves end.
fn rebalancing_move(state: &ControllerState, view: &View) -> Option<(TenantShardId, String)> {
    let counts = attached_counts(state);
    let usable: Vec<&String> = view.order.iter().filter(|n| view.usable(state, n)).collect();
    let count = |n: &str| counts.get(n).copied().unwrap_or(0);
    let most = usable.iter().max_by_key(|n| count(n))?;
    let least = usable.iter().min_by_key(|n| count(n))?;
    // A split under way waits for its parents and children where they are.
    let movable = state.tenants.iter().filter(|(t, _)| !state.splits.get(&t.tenant).is_some_and(|s| s.is_open()));
    if count(most) >= count(least) + 2 {
        // Prefer a shard with no sibling there, then one sharing its
        // pageserver with a sibling, then one whose secondary is there (warm).
        return movable
            .filter(|(_, p)| p.attached.as_deref() == Some(most.as_str()))
            .max_by_key(|(t, p)| {
                (siblings_on(state, **t, least) == 0, siblings_on(state, **t, most) > 0, p.secondaries.contains(least))
            })
            .map(|(t, _)| (*t, least.to_string()));
    }
    movable.into_iter().find_map(|(t, p)| {
        let from = p.attached.as_deref()?;
        if siblings_on(state, *t, from) == 0 {
            return None;
        }
        let to = usable
            .iter()
            .filter(|n| n.as_str() != from && siblings_on(state, *t, n) == 0 && count(n) < count(from))
            .min_by_key(|n| (count(n), !p.secondaries.contains(n)))?;
        Some((*t, to.to_string()))
    })
}

/// A migration whose target caught up: it becomes the attached location
/// and the origin its secondary.
pub fn complete_migration(state: &ControllerState, tenant: TenantShardId) -> Option<ControllerState> {
    let mut next = state.clone();
    let p = next.tenants.get_mut(&tenant)?;
    let m = p.migration.take()?;
    let origin = p.attached.replace(m.to.clone());
    p.secondaries.retain(|s| *s != m.to);
    if let Some(o) = origin {
        p.secondaries.insert(0, o);
    }
    p.secondaries.truncate(MAX_SECONDARIES);
    debug_assert!(keeps_the_rules(&state.tenants[&tenant], &next.tenants[&tenant]));
    Some(next)
}

/// Changes the policy of a pageserver; `None` if it is already so.
pub fn set_policy(state: &ControllerState, name: &str, policy: PageserverPolicy) -> Option<ControllerState> {
    let mut next = state.clone();
    match policy {
        PageserverPolicy::Active => next.pageservers.remove(name),
        p => next.pageservers.insert(name.to_string(), p),
    };
    (next != *state).then_some(next)
}

/// Registers `tenant` (`PUT /v1/tenant/{tenant}`): placed like a tenant of
/// the config, with generations above `first_generation` and above its
/// tombstone's, which goes (a tenant created again with the same id must
/// be served). `None` if it is placed already.
pub fn register_tenant(
    state: &ControllerState,
    tenant: TenantShardId,
    first_generation: u32,
) -> Option<ControllerState> {
    if state.tenants.contains_key(&tenant) {
        return None;
    }
    let mut next = state.clone();
    let deleted = next.deleted_tenants.remove(&tenant).map_or(0, |d| d.generation);
    add_tenants(&mut next, &[(tenant, first_generation.max(deleted))]);
    Some(next)
}

/// Deletes `tenant` (`DELETE /v1/tenant/{tenant}`): its placement becomes
/// a tombstone that keeps its generation. Beyond [`MAX_DELETED_TENANTS`]
/// the oldest tombstones go, but never those of `pinned` (the config's
/// tenants: without their tombstone the config would place them again).
/// `None` if it is deleted already.
pub fn delete_tenant(
    state: &ControllerState,
    tenant: TenantShardId,
    pinned: &[TenantShardId],
) -> Option<ControllerState> {
    if state.deleted_tenants.contains_key(&tenant) {
        return None;
    }
    let mut next = state.clone();
    let generation = next.tenants.remove(&tenant).map_or(0, |p| p.generation);
    // The version this state is written with.
    let version = state.version + 1;
    next.deleted_tenants.insert(tenant, DeletedTenant { generation, version });
    // A split's record goes with the tenant's last shard: the record bounds
    // nothing once no shard of it is placed.
    if !next.tenants.keys().any(|t| t.tenant == tenant.tenant) {
        next.splits.remove(&tenant.tenant);
    }
    loop {
        let droppable = next.deleted_tenants.iter().filter(|(t, _)| !pinned.contains(t));
        if droppable.clone().count() <= MAX_DELETED_TENANTS {
            break;
        }
        let oldest = droppable.min_by_key(|(t, d)| (d.version, **t)).map(|(t, _)| *t).expect("over the bound");
        next.deleted_tenants.remove(&oldest);
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(online: &[&str]) -> View {
        View {
            order: ["ps1", "ps2", "ps3"].iter().map(|s| s.to_string()).collect(),
            online: online.iter().map(|s| s.to_string()).collect(),
            sites: BTreeMap::new(),
        }
    }

    /// ps1 and ps2 in dc1, ps3 and ps4 in dc2.
    fn sites_view(online: &[&str]) -> View {
        let names = ["ps1", "ps2", "ps3", "ps4"];
        View {
            order: names.iter().map(|s| s.to_string()).collect(),
            online: online.iter().map(|s| s.to_string()).collect(),
            sites: names.iter().map(|n| (n.to_string(), if *n < "ps3" { "dc1" } else { "dc2" }.to_string())).collect(),
        }
    }

    #[test]
    fn every_other_site_gets_a_reader_and_failover_stays_in_the_site() {
        let t = tenant(1);
        let mut s = ControllerState::default();
        add_tenants(&mut s, &[(t, 0)]);
        let all = sites_view(&["ps1", "ps2", "ps3", "ps4"]);
        let s = settle(s, &all);
        // Attached in dc1, a secondary beside it and one in dc2, which reads for dc2.
        assert_eq!(placement(&s, t), (1, Some("ps1"), vec!["ps2", "ps3"], None));
        let readers = site_readers(&s.tenants[&t], &all);
        assert_eq!(readers, BTreeMap::from([("dc2".to_string(), "ps3".to_string())]));
        // ps1 fails: ps2, in the same site, takes over (not the reader in dc2).
        let no_ps1 = sites_view(&["ps2", "ps3", "ps4"]);
        let s = settle(s, &no_ps1);
        assert_eq!(placement(&s, t).1, Some("ps2"));
        assert_eq!(site_readers(&s.tenants[&t], &no_ps1)["dc2"], "ps3");
        // The reader fails: another pageserver of dc2 reads for it.
        let no_ps3 = sites_view(&["ps2", "ps4"]);
        let s = settle(s, &no_ps3);
        assert_eq!(site_readers(&s.tenants[&t], &no_ps3)["dc2"], "ps4");
        assert!(s.tenants[&t].secondaries.len() <= MAX_SECONDARIES + 1);
        // All of dc1 is gone: dc2 attaches, and dc1 has no usable pageserver to read for it.
        let dc2_only = sites_view(&["ps3", "ps4"]);
        let s = settle(s, &dc2_only);
        let attached = placement(&s, t).1.unwrap().to_string();
        assert_eq!(dc2_only.sites[&attached], "dc2");
        assert!(site_readers(&s.tenants[&t], &dc2_only).values().all(|r| !dc2_only.online.contains(r)));
        // Without sites there are no readers.
        assert!(site_readers(&s.tenants[&t], &view(&["ps3"])).is_empty());
    }

    #[test]
    fn shards_of_one_tenant_go_to_different_pageservers_and_fail_over_one_by_one() {
        let t = strata_protocol::TenantId([9; 16]);
        let shard = |n| TenantShardId { tenant: t, shard: strata_protocol::shard::ShardIndex::new(n, 3).unwrap() };
        let mut s = ControllerState::default();
        // Another tenant already on ps1: the shards still take one pageserver each.
        add_tenants(&mut s, &[(tenant(1), 0)]);
        let s = settle(s, &view(&["ps1", "ps2", "ps3"]));
        let mut s = s;
        add_tenants(&mut s, &[(shard(0), 0), (shard(1), 0), (shard(2), 0)]);
        let all = view(&["ps1", "ps2", "ps3"]);
        let s = settle(s, &all);
        let on = |s: &ControllerState, n| placement(s, shard(n)).1.unwrap().to_string();
        let mut places: Vec<String> = (0..3).map(|n| on(&s, n)).collect();
        places.sort();
        assert_eq!(places, ["ps1", "ps2", "ps3"], "{s:?}");
        // The pageserver of one shard fails: only that shard moves, under a new generation.
        let lost = on(&s, 1);
        let before: Vec<(u32, String)> = (0..3).map(|n| (placement(&s, shard(n)).0, on(&s, n))).collect();
        let rest: Vec<&str> = ["ps1", "ps2", "ps3"].into_iter().filter(|n| *n != lost).collect();
        let s = settle(s, &view(&rest));
        for n in [0, 2] {
            assert_eq!((placement(&s, shard(n)).0, on(&s, n)), before[n as usize], "shard {n} stays");
        }
        assert_ne!(on(&s, 1), lost);
        assert!(placement(&s, shard(1)).0 > before[1].0);
    }

    fn tenant(n: u8) -> TenantShardId {
        TenantShardId::unsharded(strata_protocol::TenantId([n; 16]))
    }

    /// [`settle`], with every migration completed as its target catches up.
    fn settle_moving(mut state: ControllerState, view: &View) -> ControllerState {
        for _ in 0..20 {
            state = settle(state, view);
            let moving: Vec<TenantShardId> =
                state.tenants.iter().filter(|(_, p)| p.migration.is_some()).map(|(t, _)| *t).collect();
            if moving.is_empty() {
                return state;
            }
            for t in moving {
                state = complete_migration(&state, t).expect("a migration");
            }
        }
        panic!("moves without end: {state:?}");
    }

    #[test]
    fn shards_sharing_a_pageserver_spread_when_another_returns() {
        let t = strata_protocol::TenantId([7; 16]);
        let shard = |n| TenantShardId { tenant: t, shard: strata_protocol::shard::ShardIndex::new(n, 2).unwrap() };
        let mut s = ControllerState::default();
        add_tenants(&mut s, &[(tenant(1), 0), (shard(0), 0), (shard(1), 0)]);
        // ps1 alone (the other site lost): all three there.
        let s = settle_moving(s, &view(&["ps1"]));
        assert!([tenant(1), shard(0), shard(1)].iter().all(|t| placement(&s, *t).1 == Some("ps1")), "{s:?}");
        // ps2 returns: the counts even out, and the shards part.
        let s = settle_moving(s, &view(&["ps1", "ps2"]));
        let (a, b) = (placement(&s, shard(0)).1.unwrap(), placement(&s, shard(1)).1.unwrap());
        assert_ne!(a, b, "{s:?}");
        // Counts even, one pageserver per shard: nothing moves again.
        assert!(plan(&s, &view(&["ps1", "ps2"])).is_none(), "{s:?}");

        // Counts within one (2 and 1) but both shards together: one moves
        // to the pageserver with fewer; with a single pageserver usable,
        // none does.
        let mut s = ControllerState::default();
        for (t, ps) in [(shard(0), "ps1"), (shard(1), "ps1"), (tenant(1), "ps2")] {
            s.tenants.insert(t, TenantPlacement { generation: 1, attached: Some(ps.into()), ..Default::default() });
        }
        assert!(settle_moving(s.clone(), &view(&["ps1"]))
            .tenants
            .values()
            .all(|p| p.attached.as_deref() == Some("ps1")));
        let s = settle_moving(s, &view(&["ps1", "ps2"]));
        assert_ne!(placement(&s, shard(0)).1, placement(&s, shard(1)).1, "{s:?}");
        assert_eq!(placement(&s, tenant(1)).1, Some("ps2"), "{s:?}");
    }

    fn placement(state: &ControllerState, t: TenantShardId) -> (u32, Option<&str>, Vec<&str>, Option<&str>) {
        let p = &state.tenants[&t];
        (
            p.generation,
            p.attached.as_deref(),
            p.secondaries.iter().map(String::as_str).collect(),
            p.migration.as_ref().map(|m| m.to.as_str()),
        )
    }

    /// Plans until nothing changes (as the controller does, round after round).
    fn settle(mut state: ControllerState, view: &View) -> ControllerState {
        for _ in 0..10 {
            match plan(&state, view) {
                Some(next) => state = next,
                None => return state,
            }
        }
        panic!("no fixed point: {state:?}");
    }

    #[test]
    fn a_new_tenant_is_attached_above_every_generation_in_storage_with_a_secondary() {
        let mut s = ControllerState::default();
        assert!(add_tenants(&mut s, &[(tenant(1), 7)]));
        assert!(!add_tenants(&mut s, &[(tenant(1), 9)]), "known tenants are kept");
        let s = settle(s, &view(&["ps1", "ps2"]));
        assert_eq!(placement(&s, tenant(1)), (8, Some("ps1"), vec!["ps2"], None));
        // With no pageserver online nothing is decided.
        let mut empty = ControllerState::default();
        add_tenants(&mut empty, &[(tenant(1), 0)]);
        assert!(plan(&empty, &view(&[])).is_none());
    }

    #[test]
    fn a_failed_attached_pageserver_fails_over_to_its_secondary_under_a_new_generation() {
        let mut s = ControllerState::default();
        add_tenants(&mut s, &[(tenant(1), 0)]);
        let s = settle(s, &view(&["ps1", "ps2"]));
        let s = settle(s, &view(&["ps2"]));
        // The failed one stays its secondary (it comes back warm).
        assert_eq!(placement(&s, tenant(1)), (2, Some("ps2"), vec!["ps1"], None));
        // It returns: nothing moves (one tenant is balanced either way).
        assert!(plan(&s, &view(&["ps1", "ps2"])).is_none());
        // With a third pageserver online, a usable secondary is added at once.
        let s3 = settle(s.clone(), &view(&["ps2", "ps3"]));
        assert_eq!(placement(&s3, tenant(1)), (2, Some("ps2"), vec!["ps1", "ps3"], None));
        // Both down: nothing to attach to; the state waits.
        assert!(plan(&s, &view(&[])).is_none());
    }

    #[test]
    fn a_drain_moves_the_tenant_live_and_a_failed_target_cancels_the_move() {
        let mut s = ControllerState::default();
        add_tenants(&mut s, &[(tenant(1), 0)]);
        let v = view(&["ps1", "ps2", "ps3"]);
        let s = settle(s, &v);
        assert_eq!(placement(&s, tenant(1)), (1, Some("ps1"), vec!["ps2"], None));
        let s = set_policy(&s, "ps1", PageserverPolicy::Draining).unwrap();
        assert!(set_policy(&s, "ps1", PageserverPolicy::Draining).is_none());
        let moving = settle(s, &v);
        // The target is attached under generation 2 while ps1 still serves.
        assert_eq!(placement(&moving, tenant(1)), (2, Some("ps1"), vec!["ps3"], Some("ps2")));
        let done = complete_migration(&moving, tenant(1)).unwrap();
        let done = settle(done, &v);
        // The drained pageserver keeps nothing once another can be the secondary.
        assert_eq!(placement(&done, tenant(1)), (2, Some("ps2"), vec!["ps3"], None));
        // The target fails during the move: the origin goes on under
        // generation 3, and the drain starts again towards ps3 (generation 4).
        let cancelled = plan(&moving, &view(&["ps1", "ps3"])).unwrap();
        assert_eq!(placement(&cancelled, tenant(1)), (3, Some("ps1"), vec!["ps3"], None));
        let again = settle(cancelled, &view(&["ps1", "ps3"]));
        assert_eq!(placement(&again, tenant(1)), (4, Some("ps1"), vec![], Some("ps3")));
        // The origin fails during the move: the target takes over as it is.
        let taken = settle(moving.clone(), &view(&["ps2", "ps3"]));
        assert_eq!(placement(&taken, tenant(1)), (2, Some("ps2"), vec!["ps3"], None));
        // Origin and target both fail with nowhere to go: the move stays, so
        // generation 2 (the target's) is never sent to the origin when it
        // returns first; the origin then serves on under generation 3.
        assert!(plan(&moving, &view(&[])).is_none());
        let origin_back = plan(&moving, &view(&["ps1"])).unwrap();
        assert_eq!(placement(&origin_back, tenant(1)).0, 3);
        assert_eq!(placement(&origin_back, tenant(1)).1, Some("ps1"));
        // A secondary online instead: it is attached under a new generation, the move ended.
        let failed_over = plan(&moving, &view(&["ps3"])).unwrap();
        assert_eq!(placement(&failed_over, tenant(1)), (3, Some("ps3"), vec!["ps1"], None));
    }

    #[test]
    fn a_registered_tenant_is_placed_once_and_a_deleted_one_comes_back_above_its_tombstone() {
        let v = view(&["ps1", "ps2"]);
        let s = register_tenant(&ControllerState::default(), tenant(1), 4).unwrap();
        let s = settle(s, &v);
        assert_eq!(placement(&s, tenant(1)), (5, Some("ps1"), vec!["ps2"], None));
        assert!(register_tenant(&s, tenant(1), 9).is_none(), "a placed tenant is kept as it is");
        // Deleted: out of the placements, its generation kept in the tombstone.
        let deleted = delete_tenant(&s, tenant(1), &[]).unwrap();
        assert!(!deleted.tenants.contains_key(&tenant(1)));
        assert_eq!(deleted.deleted_tenants[&tenant(1)], DeletedTenant { generation: 5, version: s.version + 1 });
        assert!(delete_tenant(&deleted, tenant(1), &[]).is_none(), "deleting again changes nothing");
        assert!(plan(&deleted, &v).is_none(), "a decision places no deleted tenant");
        // Registered again, with nothing in storage: above the tombstone.
        let again = register_tenant(&deleted, tenant(1), 0).unwrap();
        assert!(again.deleted_tenants.is_empty());
        assert_eq!(placement(&settle(again, &v), tenant(1)), (6, Some("ps1"), vec!["ps2"], None));
        // Or above storage's generations when they are higher.
        let again = register_tenant(&deleted, tenant(1), 11).unwrap();
        assert_eq!(placement(&settle(again, &v), tenant(1)).0, 12);
        // A tenant never placed can be deleted too.
        let unknown = delete_tenant(&s, tenant(2), &[]).unwrap();
        assert_eq!(unknown.deleted_tenants[&tenant(2)].generation, 0);
        assert_eq!(unknown.tenants, s.tenants);
    }

    #[test]
    fn tombstones_are_bounded_the_oldest_going_first_but_never_the_configs() {
        let id = |n: usize| {
            let mut bytes = [0xee; 16];
            bytes[..8].copy_from_slice(&(n as u64).to_be_bytes());
            TenantShardId::unsharded(strata_protocol::TenantId(bytes))
        };
        let config_tenant = tenant(1);
        let mut s = ControllerState::default();
        add_tenants(&mut s, &[(config_tenant, 3)]);
        // Each deletion as the controller writes it: the version goes up.
        let delete = |s: &ControllerState, t| {
            let mut next = delete_tenant(s, t, &[config_tenant]).unwrap();
            next.version += 1;
            next
        };
        s = delete(&s, config_tenant);
        for n in 0..MAX_DELETED_TENANTS + 10 {
            s = delete(&s, id(n));
            assert!(s.deleted_tenants.len() <= MAX_DELETED_TENANTS + 1);
        }
        assert_eq!(s.deleted_tenants.len(), MAX_DELETED_TENANTS + 1);
        // The ten oldest went; the config's tenant, older still, stayed.
        assert!((0..10).all(|n| !s.deleted_tenants.contains_key(&id(n))));
        assert!((10..MAX_DELETED_TENANTS + 10).all(|n| s.deleted_tenants.contains_key(&id(n))));
        assert_eq!(s.deleted_tenants[&config_tenant].generation, 3);
    }

    #[test]
    fn tenants_are_rebalanced_one_move_at_a_time() {
        let mut s = ControllerState::default();
        add_tenants(&mut s, &[(tenant(1), 0), (tenant(2), 0), (tenant(3), 0), (tenant(4), 0)]);
        // Only ps1 is up at first: all four go there.
        let s = settle(s, &view(&["ps1"]));
        assert!(s.tenants.values().all(|p| p.attached.as_deref() == Some("ps1")));
        // ps2 comes: one move starts; none other until it completes.
        let v = view(&["ps1", "ps2"]);
        let s = settle(s, &v);
        let moving: Vec<TenantShardId> =
            s.tenants.iter().filter(|(_, p)| p.migration.is_some()).map(|(t, _)| *t).collect();
        assert_eq!(moving.len(), 1);
        let s = settle(complete_migration(&s, moving[0]).unwrap(), &v);
        let s = settle(
            complete_migration(&s, *s.tenants.iter().find(|(_, p)| p.migration.is_some()).unwrap().0).unwrap(),
            &v,
        );
        let counts = attached_counts(&s);
        assert_eq!((counts["ps1"], counts["ps2"]), (2, 2), "{s:?}");
    }
}
