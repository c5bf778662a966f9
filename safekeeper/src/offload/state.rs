//! What this safekeeper knows of one timeline's offload: kept in the
//! timeline, changed by the offload task, shown in the status.

use strata_formats::Lsn;
use strata_protocol::api::safekeeper::OffloadStatus;
use strata_protocol::NodeId;

/// A timeline's offload, as this safekeeper knows it (for the status).
#[derive(Clone, Debug, Default)]
pub struct OffloadState {
    /// End of the unbroken run of offloaded segments from the timeline's
    /// first one (0 until object storage was listed).
    pub offloaded_lsn: Lsn,
    /// Who offloads the timeline, as seen from here (none until this
    /// safekeeper has looked at it with its peers' views settled).
    pub offloader: Option<NodeId>,
    /// End of the partial segment this safekeeper last offloaded (0: none).
    pub partial_lsn: Lsn,
    pub last_error: Option<String>,
    /// Since when committed WAL beyond what object storage holds has waited.
    pub(super) uncovered_since: Option<std::time::Instant>,
    /// When archived segments were last checked against their retention.
    pub(super) expired_at: Option<std::time::Instant>,
    /// Whether object storage was listed since the timeline was loaded.
    pub(super) listed: bool,
    /// When this safekeeper first looked at the timeline: peers that hold it
    /// too may not have reported it yet (it is created on each in turn).
    pub(super) first_seen: Option<std::time::Instant>,
}

impl OffloadState {
    /// What the status shows of it.
    pub fn status(&self) -> OffloadStatus {
        OffloadStatus {
            offloaded_lsn: self.offloaded_lsn,
            offloader: self.offloader,
            partial_lsn: self.partial_lsn,
            last_error: self.last_error.clone(),
        }
    }
}
