//! Where a pageserver reads the current generation of each tenant.

use std::collections::BTreeMap;
use std::path::PathBuf;

use strata_protocol::TenantShardId;
use strata_remote_storage::RemoteStorage;

use super::attachments::Attachments;

/// Where the current generation of each tenant is read: the truth that a
/// pageserver checks its own generation against before it deletes objects
/// (and before each round of uploads).
#[derive(Clone, Debug)]
pub enum Authority {
    /// The attachment file, written by the control plane.
    AttachmentFile(PathBuf),
    /// The storage controller's state object, in the same object storage
    /// (`docs/storage-controller.md`): read with every check, so a
    /// pageserver cut off from the controller still learns it is stale.
    Controller,
}

impl Authority {
    /// Every tenant's current generation. An error means unknown: the
    /// callers then neither delete nor stop.
    pub async fn generations(&self, storage: &RemoteStorage) -> Result<BTreeMap<TenantShardId, u32>, String> {
        match self {
            Authority::AttachmentFile(path) => {
                let path = path.clone();
                let a = tokio::task::spawn_blocking(move || Attachments::load(&path))
                    .await
                    .map_err(|e| e.to_string())??;
                Ok(a.tenants.keys().filter_map(|t| a.generation(*t).map(|g| (*t, g))).collect())
            }
            Authority::Controller => {
                use strata_protocol::api::controller::{ControllerState, STATE_KEY};
                let Some((bytes, _)) = storage.get_versioned(STATE_KEY).await.map_err(|e| e.to_string())? else {
                    return Ok(BTreeMap::new());
                };
                let state = ControllerState::decode(&bytes).map_err(|e| format!("{STATE_KEY}: {e}"))?;
                Ok(state.tenants.keys().filter_map(|t| state.generation(*t).map(|g| (*t, g))).collect())
            }
        }
    }

    /// What the errors and logs call it.
    pub fn describe(&self) -> String {
        match self {
            Authority::AttachmentFile(p) => format!("the attachment file {}", p.display()),
            Authority::Controller => "the storage controller's state".into(),
        }
    }
}
