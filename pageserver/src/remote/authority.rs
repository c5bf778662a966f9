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
        self.read(storage, false).await
    }

    /// The generations of the tenants that may delete objects now: every
    /// tenant's, but a split's parents' (`ControllerState::may_delete`):
    /// their layers are named by their children's indexes.
    pub async fn deleting_generations(&self, storage: &RemoteStorage) -> Result<BTreeMap<TenantShardId, u32>, String> {
        self.read(storage, true).await
    }

    async fn read(&self, storage: &RemoteStorage, deleting: bool) -> Result<BTreeMap<TenantShardId, u32>, String> {
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
                let may = |t: &TenantShardId| !deleting || state.may_delete(*t);
                Ok(state
                    .tenants
                    .keys()
                    .filter(|t| may(t))
                    .filter_map(|t| state.generation(*t).map(|g| (*t, g)))
                    .collect())
            }
        }
    }

    /// Whether the split of `children`'s tenant with these children's
    /// generations is still prepared: only then may a parent write their
    /// indexes (a call that outlived its split's rollback must not). With
    /// the attachment file there is no controller, and no split.
    pub async fn split_prepared(
        &self,
        storage: &RemoteStorage,
        children: &[(TenantShardId, u32)],
    ) -> Result<(), String> {
        use strata_protocol::api::controller::{ControllerState, SplitPhase, STATE_KEY};
        let Authority::Controller = self else { return Err("splits need a storage controller".into()) };
        let Some(first) = children.first() else { return Ok(()) };
        let Some((bytes, _)) = storage.get_versioned(STATE_KEY).await.map_err(|e| e.to_string())? else {
            return Err("the storage controller's state does not exist".into());
        };
        let state = ControllerState::decode(&bytes).map_err(|e| format!("{STATE_KEY}: {e}"))?;
        let split = state.splits.get(&first.0.tenant).ok_or("the state records no split of the tenant")?;
        if split.phase != SplitPhase::Prepared {
            return Err(format!("the split is {:?}, not prepared", split.phase));
        }
        for (child, generation) in children {
            let recorded = split.generations.get(usize::from(child.shard.number)).copied();
            if child.shard.shards() != split.to.count || recorded != Some(*generation) {
                return Err(format!("{child} of generation {generation} is not a child of the split recorded"));
            }
        }
        Ok(())
    }

    /// What the errors and logs call it.
    pub fn describe(&self) -> String {
        match self {
            Authority::AttachmentFile(p) => format!("the attachment file {}", p.display()),
            Authority::Controller => "the storage controller's state".into(),
        }
    }
}
