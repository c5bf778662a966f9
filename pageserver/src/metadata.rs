//! What a timeline persists besides its layer files: `metadata.json`
//! (format in `docs/pageserver-storage.md`), which the remote index carries
//! too. A format of its own, so that the timeline and its remote side both
//! use it without either depending on the other.

use strata_formats::Lsn;
use strata_protocol::{ShardIdentity, TenantShardId, TimelineId};

/// Version of `metadata.json`.
pub const METADATA_VERSION: u32 = 1;

/// What a timeline persists besides its layer files (`metadata.json`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineMetadata {
    pub format_version: u32,
    pub tenant_id: TenantShardId,
    pub timeline_id: TimelineId,
    pub ancestor_timeline_id: Option<TimelineId>,
    pub ancestor_lsn: Option<Lsn>,
    pub pg_version: u32,
    pub system_id: u64,
    pub wal_segment_size: u32,
    /// Where the timeline's WAL begins (the bootstrap or branch point).
    pub start_lsn: Lsn,
    /// Every version up to this LSN is in the listed layer files, fsynced.
    pub disk_consistent_lsn: Lsn,
    /// Start of the record that ends at `disk_consistent_lsn`.
    pub prev_record_lsn: Lsn,
    pub layers: Vec<String>,
    /// Layer files no longer part of the timeline (replaced by compaction,
    /// removed by GC) whose local files may still exist: they are deleted
    /// when no read uses them any more, and at load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_layers: Vec<String>,
    /// Reads below this LSN are refused: GC may have removed their versions.
    #[serde(default, skip_serializing_if = "lsn_is_zero")]
    pub gc_cutoff_lsn: Lsn,
    /// LSNs whose pages GC keeps readable whatever the cutoff (branch points).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retain_lsns: Vec<Lsn>,
    /// Blocks per stripe of a sharded tenant (`docs/sharding.md`; the
    /// shard itself is part of `tenant_id`). Absent when unsharded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_blocks: Option<u32>,
}

impl TimelineMetadata {
    /// What the timeline's shard stores, or why the metadata names none.
    pub fn shard(&self) -> Result<ShardIdentity, String> {
        let index = self.tenant_id.shard;
        match (index.is_unsharded(), self.stripe_blocks) {
            (true, None) => Ok(ShardIdentity::UNSHARDED),
            (true, Some(_)) => Err("an unsharded tenant's timeline names a stripe size".into()),
            (false, None) => Err(format!("shard {} names no stripe size", self.tenant_id)),
            (false, Some(stripe)) => {
                strata_protocol::ShardLayout::new(u32::from(index.count), stripe).map_err(|e| e.to_string())?;
                Ok(ShardIdentity { index, stripe_blocks: stripe })
            }
        }
    }
}

fn lsn_is_zero(lsn: &Lsn) -> bool {
    *lsn == Lsn::INVALID
}
