//! What the offload of one timeline remembers between its rounds: owned by
//! that timeline's offload loop (see `manager`), which publishes the part
//! the status shows in the timeline's progress.

use strata_formats::Lsn;
use strata_protocol::api::safekeeper::OffloadStatus;
use strata_protocol::NodeId;

/// A timeline's offload, as this safekeeper knows it.
#[derive(Clone, Debug, Default)]
pub struct OffloadState {
    /// End of the unbroken run of offloaded segments from the timeline's
    /// first one (0 until object storage was listed).
    pub(super) offloaded_lsn: Lsn,
    /// Who offloads the timeline, as seen from here (none until this
    /// safekeeper has looked at it with its peers' views settled).
    pub(super) offloader: Option<NodeId>,
    /// End of the partial segment this safekeeper last offloaded (0: none).
    pub(super) partial_lsn: Lsn,
    /// The last round's error, if it failed.
    pub(super) last_error: Option<String>,
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
