//! What a timeline persists besides its layer files: `metadata.json`
//! (format in `docs/pageserver-storage.md`), which the remote index carries
//! too. A format of its own, so that the timeline and its remote side both
//! use it without either depending on the other.

use strata_formats::Lsn;
use strata_protocol::{TenantId, TimelineId};

/// Version of `metadata.json`.
pub const METADATA_VERSION: u32 = 1;

/// What a timeline persists besides its layer files (`metadata.json`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineMetadata {
    pub format_version: u32,
    pub tenant_id: TenantId,
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
}

fn lsn_is_zero(lsn: &Lsn) -> bool {
    *lsn == Lsn::INVALID
}
