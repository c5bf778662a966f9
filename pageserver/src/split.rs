//! A split's work on a parent shard's pageserver (`docs/sharding.md`,
//! "Split, step by step"): each timeline is flushed and uploaded, then
//! each child gets an index of its own that names the parent's layers.
//! No layer is copied: a child reads them from the parent's objects and
//! drops what is not its own as compaction rewrites them.
//!
//! The storage controller calls this once it has recorded the split: from
//! then on the parent deletes no object (its deletions are refused), so the
//! layers a child index names stay. Writing the same children's indexes
//! again is harmless, so a call repeated after any crash is too.

use bytes::Bytes;
use strata_protocol::api::pageserver::{SplitShardDone, SplitShardRequest, SplitTimeline};
use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantShardId, TimelineId};
use strata_service::failpoint;

use crate::remote::index::{index_key, RemoteIndex};
use crate::tenants::Tenants;

/// How long each timeline's upload may take before the split step fails
/// (the controller calls again).
pub use crate::limits::SPLIT_UPLOAD_TIMEOUT;

/// Why a parent's children could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error("split of {parent}: {why}")]
    Invalid { parent: TenantShardId, why: String },
    #[error("split of {parent}: no timeline of it is attached here")]
    NotAttached { parent: TenantShardId },
    #[error("split of {parent}: the pageserver has no object storage")]
    NoRemote { parent: TenantShardId },
    #[error("split of {parent}: {why}")]
    Storage { parent: TenantShardId, why: String },
    #[error("split of {parent}, timeline {timeline}: {why}")]
    Timeline { parent: TenantShardId, timeline: TimelineId, why: String },
}

/// Checks that `req` names children of `parent`: one layout, a multiple of
/// the parent's count, each child a part of the parent (`h mod kn ≡ h mod n`).
fn check(parent: TenantShardId, req: &SplitShardRequest) -> Result<ShardLayout, String> {
    let first = req.children.first().ok_or("no children")?;
    let count = first.shard.shard.shards();
    let to = ShardLayout::new(u32::from(count), req.stripe_blocks).map_err(|e| e.to_string())?;
    let from = ShardLayout { count: parent.shard.shards(), stripe_blocks: req.stripe_blocks };
    from.split(u32::from(count)).map_err(|e| e.to_string())?;
    if req.children.len() != usize::from(count / from.count) {
        return Err(format!(
            "{} children; a parent of {} shards has {}",
            req.children.len(),
            from.count,
            count / from.count
        ));
    }
    for c in &req.children {
        if c.shard.tenant != parent.tenant || c.shard.shard.shards() != count {
            return Err(format!("{} is not a shard of {} of the same tenant", c.shard, count));
        }
        if c.shard.shard.number % from.count != parent.shard.number {
            return Err(format!("{} is not a child of {parent}", c.shard));
        }
        if c.generation == 0 {
            return Err(format!("{}: generation 0", c.shard));
        }
    }
    Ok(to)
}

/// A child's index from its parent's: the child's generation and stripe,
/// every layer named in the objects that hold it (the parent's, or the
/// shard the parent had it from).
pub fn child_index(parent_index: &RemoteIndex, parent: TenantShardId, generation: u32, stripe: u32) -> RemoteIndex {
    let mut index = parent_index.clone();
    index.generation = generation;
    index.stripe_blocks = Some(stripe);
    for l in &mut index.layers {
        l.owner = Some(l.owner.unwrap_or(parent));
    }
    index
}

/// Flushes and uploads every timeline of `parent`, then writes each
/// child's index of it; where each timeline's children start. Blocking.
pub fn write_children(
    tenants: &Tenants,
    parent: TenantShardId,
    req: &SplitShardRequest,
) -> Result<SplitShardDone, SplitError> {
    let invalid = |why: String| SplitError::Invalid { parent, why };
    check(parent, req).map_err(invalid)?;
    let remote = tenants.remote.clone().ok_or(SplitError::NoRemote { parent })?;
    let entries: Vec<_> = tenants.all().into_iter().filter(|e| e.tl.tenant_id == parent).collect();
    if entries.is_empty() {
        return Err(SplitError::NotAttached { parent });
    }
    let mut indexes = Vec::with_capacity(entries.len());
    for e in &entries {
        let tl = &e.tl;
        let fail = |why: String| SplitError::Timeline { parent, timeline: tl.timeline_id, why };
        if tl.remote().is_none_or(|r| r.is_reader()) {
            return Err(SplitError::NotAttached { parent });
        }
        if !tl.shard.index.is_unsharded() && tl.shard.stripe_blocks != req.stripe_blocks {
            return Err(invalid(format!("its stripe is {} blocks, not {}", tl.shard.stripe_blocks, req.stripe_blocks)));
        }
        tl.checkpoint().map_err(|e| fail(format!("flushing: {e}")))?;
        tl.wait_uploaded(SPLIT_UPLOAD_TIMEOUT).map_err(fail)?;
        let index = tl.remote().and_then(|r| r.index()).ok_or_else(|| fail("no index was uploaded".into()))?;
        indexes.push((tl.timeline_id, index));
    }
    failpoint::hit("split-before-child-indexes").map_err(|why| SplitError::Storage { parent, why })?;
    // The split must still be the one the controllers record as prepared.
    let children: Vec<(TenantShardId, u32)> = req.children.iter().map(|c| (c.shard, c.generation)).collect();
    let (authority, storage) = (remote.authority.clone(), remote.storage.clone());
    remote
        .block_on(async move { authority.split_prepared(&storage, &children).await })
        .map_err(|e| SplitError::Storage { parent, why: e.to_string() })?
        .map_err(|why| invalid(format!("refused: {why}")))?;
    for (i, child) in req.children.iter().enumerate() {
        for (timeline, index) in &indexes {
            let fail = |why: String| SplitError::Timeline { parent, timeline: *timeline, why };
            let bytes = Bytes::from(child_index(index, parent, child.generation, req.stripe_blocks).encode());
            let (storage, key) = (remote.storage.clone(), index_key(child.shard, *timeline, child.generation));
            remote
                .block_on(async move { storage.put(&key, bytes).await })
                .map_err(|e| fail(e.to_string()))?
                .map_err(|e| fail(format!("writing {}'s index: {e}", child.shard)))?;
        }
        if i == 0 {
            failpoint::hit("split-between-child-indexes").map_err(|why| SplitError::Storage { parent, why })?;
        }
    }
    failpoint::hit("split-after-child-indexes").map_err(|why| SplitError::Storage { parent, why })?;
    let timelines =
        indexes.iter().map(|(t, i)| SplitTimeline { timeline_id: *t, lsn: i.disk_consistent_lsn }).collect();
    tracing::info!(%parent, children = req.children.len(), "split: children's indexes written");
    Ok(SplitShardDone { timelines })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::api::pageserver::SplitChild;
    use strata_protocol::shard::ShardIndex;

    fn shard(tenant: TenantShardId, number: u8, count: u8) -> TenantShardId {
        TenantShardId { tenant: tenant.tenant, shard: ShardIndex::new(number, count).unwrap() }
    }

    #[test]
    fn children_must_be_the_parents_own() {
        let t = TenantShardId::generate();
        let req = |children: Vec<(TenantShardId, u32)>| SplitShardRequest {
            stripe_blocks: 8,
            children: children.into_iter().map(|(shard, generation)| SplitChild { shard, generation }).collect(),
        };
        // An unsharded parent's children are all of the new shards.
        let all4: Vec<_> = (0..4).map(|n| (shard(t, n, 4), 1)).collect();
        assert_eq!(check(t, &req(all4.clone())).unwrap().count, 4);
        assert!(check(t, &req(all4[..3].to_vec())).unwrap_err().contains("3 children"));
        // Shard 1 of 2 has children 1 and 3 of 4.
        let p = shard(t, 1, 2);
        assert!(check(p, &req(vec![(shard(t, 1, 4), 1), (shard(t, 3, 4), 2)])).is_ok());
        assert!(check(p, &req(vec![(shard(t, 0, 4), 1), (shard(t, 2, 4), 1)])).unwrap_err().contains("not a child"));
        assert!(check(p, &req(vec![(shard(t, 1, 3), 1)])).unwrap_err().contains("cannot become 3"));
        assert!(check(p, &req(vec![(shard(t, 1, 4), 0), (shard(t, 3, 4), 1)])).unwrap_err().contains("generation 0"));
        let other = TenantShardId::generate();
        assert!(check(p, &req(vec![(shard(other, 1, 4), 1), (shard(t, 3, 4), 1)]))
            .unwrap_err()
            .contains("same tenant"));
        assert!(check(p, &req(vec![])).is_err());
    }

    #[test]
    fn a_childs_index_names_where_each_layer_is() {
        use crate::remote::index::IndexLayer;
        use strata_formats::Lsn;
        let (t, grandparent) = (TenantShardId::generate(), TenantShardId::generate());
        let layer =
            |name: &str, generation, owner| IndexLayer { name: name.into(), size: 1, crc32c: 2, generation, owner };
        let parent_index = RemoteIndex {
            generation: 9,
            pg_version: 15,
            system_id: 1,
            wal_segment_size: 16 << 20,
            start_lsn: Lsn(8),
            disk_consistent_lsn: Lsn(64),
            prev_record_lsn: Lsn(32),
            ancestor_timeline_id: None,
            ancestor_lsn: None,
            gc_cutoff_lsn: Lsn(0),
            retain_lsns: vec![],
            layers: vec![layer("a", 9, None), layer("b", 3, Some(grandparent))],
            stripe_blocks: None,
        };
        let child = child_index(&parent_index, t, 2, 16);
        assert_eq!((child.generation, child.stripe_blocks, child.disk_consistent_lsn), (2, Some(16), Lsn(64)));
        assert_eq!(child.layers[0], layer("a", 9, Some(t)), "the parent's own layer, under its generation");
        assert_eq!(child.layers[1], layer("b", 3, Some(grandparent)), "a layer the parent had from its own parent");
        let key = child.layers[0].object_key(shard(t, 1, 2), TimelineId::generate());
        assert!(key.starts_with(&format!("tenants/{t}/timelines/")), "{key}");
    }
}
