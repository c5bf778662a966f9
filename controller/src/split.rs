//! Splits as changes of the state (`docs/sharding.md`, "Split, step by
//! step"): each function takes the state and returns the next one, so
//! the steps are the same whether the leader that takes them is the one
//! that began the split or one that took over after a crash.
//!
//! `Prepared` → (every parent's pageserver wrote its children's indexes)
//! → `Copied` → (every child attached and caught up) → `Done`; a split
//! that cannot reach `Copied` goes to `RolledBack` instead.

use strata_protocol::api::controller::{ControllerState, SplitPhase, TenantPlacement, TenantSplit};
use strata_protocol::shard::{ShardIndex, ShardLayout};
use strata_protocol::{TenantId, TenantShardId};

/// What the leader knows of one parent's call to write its children's
/// indexes (forgotten with a restart: the calls are then made again, which
/// is harmless).
#[derive(Clone, Debug, Default)]
pub struct SplitCall {
    pub done: bool,
    pub failures: u32,
    /// Asking again cannot help (the pageserver refused the request).
    pub permanent: bool,
    pub last_error: Option<String>,
}

/// Why a split is not begun.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SplitRefused {
    #[error("tenant {0} is not known to the controllers")]
    Unknown(TenantId),
    #[error("tenant {tenant}: a split to {to} shards is under way")]
    UnderWay { tenant: TenantId, to: u8 },
    #[error("tenant {tenant}: {why}")]
    Invalid { tenant: TenantId, why: String },
    #[error("tenant {tenant}: shard {shard} is {why}; try again once it is attached and settled")]
    NotSettled { tenant: TenantId, shard: TenantShardId, why: &'static str },
}

/// The shards the tenant has now (a layout of one: unsharded), in order.
pub fn current_shards(state: &ControllerState, tenant: TenantId) -> Vec<(TenantShardId, &TenantPlacement)> {
    let count = state.current_count(tenant);
    let from = TenantShardId { tenant, shard: ShardIndex::UNSHARDED };
    state
        .tenants
        .range(from..)
        .take_while(|(t, _)| t.tenant == tenant)
        .filter(|(t, _)| count.is_none_or(|c| t.shard.shards() == c))
        .map(|(t, p)| (*t, p))
        .collect()
}

/// Records a split of `tenant` into `to` shards of `stripe_blocks` blocks,
/// the children's first generations given (in shard order).
pub fn prepare(
    state: &ControllerState,
    tenant: TenantId,
    to: u8,
    stripe_blocks: u32,
    generations: Vec<u32>,
) -> Result<ControllerState, SplitRefused> {
    if let Some(s) = state.splits.get(&tenant).filter(|s| s.is_open()) {
        return Err(SplitRefused::UnderWay { tenant, to: s.to.count });
    }
    let shards = current_shards(state, tenant);
    let count = shards.first().map(|(t, _)| t.shard.shards()).ok_or(SplitRefused::Unknown(tenant))?;
    let invalid = |why: String| SplitRefused::Invalid { tenant, why };
    if shards.len() != usize::from(count) {
        return Err(invalid(format!("{} of its {count} shards are registered", shards.len())));
    }
    let from = ShardLayout::new(u32::from(count), stripe_blocks).map_err(|e| invalid(e.to_string()))?;
    let to = from.split(u32::from(to)).map_err(|e| invalid(e.to_string()))?;
    if generations.len() != usize::from(to.count) || generations.contains(&0) {
        return Err(invalid(format!("{} generations for {} children", generations.len(), to.count)));
    }
    let mut parents = Vec::with_capacity(shards.len());
    for (shard, p) in &shards {
        let not = |why| SplitRefused::NotSettled { tenant, shard: *shard, why };
        let attached = p.attached.clone().ok_or(not("not attached"))?;
        if p.migration.is_some() {
            return Err(not("moving to another pageserver"));
        }
        parents.push(attached);
    }
    let mut next = state.clone();
    let split = TenantSplit {
        from,
        to,
        phase: SplitPhase::Prepared,
        generations,
        parents,
        version: state.version + 1,
        error: None,
        swept: false,
    };
    next.splits.insert(tenant, split);
    Ok(next)
}

/// Every child's index is written: the children are placed where their
/// parents are now, under their first generations.
pub fn copied(state: &ControllerState, tenant: TenantId) -> Option<ControllerState> {
    let split = state.splits.get(&tenant).filter(|s| s.phase == SplitPhase::Prepared)?;
    let mut next = state.clone();
    let parents = split.parent_ids(tenant);
    for (child, generation) in split.child_ids(tenant).into_iter().zip(&split.generations) {
        let parent = usize::from(child.shard.number % split.from.count);
        let attached = state.tenants.get(&parents[parent]).and_then(|p| p.attached.clone());
        let at = attached.unwrap_or_else(|| split.parents[parent].clone());
        let placement = TenantPlacement { generation: *generation, attached: Some(at), ..Default::default() };
        next.tenants.entry(child).or_insert(placement);
    }
    next.splits.get_mut(&tenant).expect("present").phase = SplitPhase::Copied;
    Some(next)
}

/// The children serve the tenant: the parents leave the placements (the
/// leader detaches them where they are held).
pub fn done(state: &ControllerState, tenant: TenantId) -> Option<ControllerState> {
    let split = state.splits.get(&tenant).filter(|s| s.phase == SplitPhase::Copied)?;
    let mut next = state.clone();
    for parent in split.parent_ids(tenant) {
        next.tenants.remove(&parent);
    }
    next.splits.get_mut(&tenant).expect("present").phase = SplitPhase::Done;
    Some(next)
}

/// Gives up a split that has not reached `Copied`; the children's objects
/// are removed next (`swept` once they are).
pub fn roll_back(state: &ControllerState, tenant: TenantId, why: String) -> Option<ControllerState> {
    let split = state.splits.get(&tenant).filter(|s| s.phase == SplitPhase::Prepared)?;
    let mut next = state.clone();
    for child in split.child_ids(tenant) {
        debug_assert!(!next.tenants.contains_key(&child), "a child placed before Copied");
        next.tenants.remove(&child);
    }
    let s = next.splits.get_mut(&tenant).expect("present");
    s.phase = SplitPhase::RolledBack;
    s.error = Some(why);
    Some(next)
}

/// Notes that what an ended split left behind is removed.
pub fn swept(state: &ControllerState, tenant: TenantId) -> Option<ControllerState> {
    state.splits.get(&tenant).filter(|s| !s.is_open() && !s.swept)?;
    let mut next = state.clone();
    next.splits.get_mut(&tenant).expect("present").swept = true;
    Some(next)
}

/// Whether `shard` is a parent that an ended split took out of service.
pub fn is_retired_parent(state: &ControllerState, shard: TenantShardId) -> bool {
    state.splits.get(&shard.tenant).is_some_and(|s| s.phase == SplitPhase::Done && s.is_parent(shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(tenant: TenantId, count: u8, at: &[&str]) -> ControllerState {
        let mut s = ControllerState {
            format_version: strata_protocol::api::controller::STATE_FORMAT_VERSION,
            ..Default::default()
        };
        for (n, name) in at.iter().enumerate() {
            let shard = ShardIndex::new(n as u8, count).unwrap();
            let p = TenantPlacement { generation: 3, attached: Some(name.to_string()), ..Default::default() };
            s.tenants.insert(TenantShardId { tenant, shard }, p);
        }
        s
    }

    #[test]
    fn a_split_goes_prepared_copied_done_and_children_sit_where_their_parents_are() {
        let t = TenantShardId::generate().tenant;
        let s = state_with(t, 2, &["a", "b"]);
        let p = prepare(&s, t, 4, 8, vec![1, 1, 2, 1]).unwrap();
        assert_eq!(p.splits[&t].parents, vec!["a", "b"]);
        assert_eq!(p.current_count(t), Some(2));
        assert!(!p.may_delete(TenantShardId { tenant: t, shard: ShardIndex::new(1, 2).unwrap() }));
        assert_eq!(prepare(&p, t, 8, 8, vec![1; 8]).unwrap_err(), SplitRefused::UnderWay { tenant: t, to: 4 });
        let c = copied(&p, t).unwrap();
        let at: Vec<_> = current_shards(&c, t).iter().map(|(s, p)| (s.shard.number, p.attached.clone())).collect();
        assert_eq!(at.len(), 2, "the parents still answer for the tenant");
        let children: Vec<_> = TenantSplit::child_ids(&c.splits[&t], t)
            .iter()
            .map(|id| (c.tenants[id].attached.clone().unwrap(), c.tenants[id].generation))
            .collect();
        assert_eq!(children, vec![("a".into(), 1), ("b".into(), 1), ("a".into(), 2), ("b".into(), 1)]);
        assert!(roll_back(&c, t, "late".into()).is_none(), "after Copied a split completes");
        let d = done(&c, t).unwrap();
        assert_eq!(current_shards(&d, t).len(), 4);
        assert!(is_retired_parent(&d, TenantShardId { tenant: t, shard: ShardIndex::new(0, 2).unwrap() }));
        assert!(!d.may_delete(TenantShardId { tenant: t, shard: ShardIndex::new(0, 2).unwrap() }));
        assert!(d.may_delete(TenantShardId { tenant: t, shard: ShardIndex::new(0, 4).unwrap() }));
        // The state object keeps it, checked.
        assert_eq!(ControllerState::decode(&d.encode()).unwrap(), d);
    }

    #[test]
    fn an_unsharded_tenant_splits_and_bad_splits_are_refused() {
        let t = TenantShardId::generate().tenant;
        let s = state_with(t, 1, &["a"]);
        let p = prepare(&s, t, 2, 2048, vec![4, 4]).unwrap();
        let r = roll_back(&p, t, "storage failed".into()).unwrap();
        assert_eq!(r.splits[&t].phase, SplitPhase::RolledBack);
        assert!(r.may_delete(TenantShardId::unsharded(t)), "a rolled back parent deletes again");
        assert_eq!(current_shards(&r, t).len(), 1);
        assert!(prepare(&s, t, 3, 8, vec![1; 3]).is_ok(), "1 to 3 is a multiple");
        assert!(matches!(prepare(&s, t, 1, 8, vec![1]), Err(SplitRefused::Invalid { .. })));
        assert!(matches!(prepare(&s, t, 2, 7, vec![1, 1]), Err(SplitRefused::Invalid { .. })));
        assert!(matches!(prepare(&s, t, 2, 8, vec![1]), Err(SplitRefused::Invalid { .. })));
        let other = TenantShardId::generate().tenant;
        assert_eq!(prepare(&s, other, 2, 8, vec![1, 1]).unwrap_err(), SplitRefused::Unknown(other));
        let mut moving = s.clone();
        moving
            .tenants
            .values_mut()
            .for_each(|p| p.migration = Some(strata_protocol::api::controller::Migration { to: "b".into() }));
        assert!(matches!(prepare(&moving, t, 2, 8, vec![1, 1]), Err(SplitRefused::NotSettled { .. })));
        let s2 = state_with(t, 2, &["a", "b"]);
        let mut half = s2.clone();
        half.tenants.pop_last();
        assert!(matches!(prepare(&half, t, 4, 8, vec![1; 4]), Err(SplitRefused::Invalid { .. })));
        let swept_once = swept(&r, t).unwrap();
        assert!(swept(&swept_once, t).is_none());
    }
}
