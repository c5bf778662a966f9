//! The controller's two objects in object storage, both written by
//! compare-and-swap (`strata_remote_storage::cas`): the state
//! (`controller/state.json`) and the leader's lease (`controller/leader.json`).

use std::time::Duration;

use bytes::Bytes;
use strata_protocol::api::controller::{ControllerState, LEADER_KEY, STATE_KEY};
use strata_protocol::TenantId;
use strata_remote_storage::cas::{CasError, ObjectVersion};
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};

/// Bound on one attempt of one operation: a controller whose storage
/// hangs must still notice that its lease ran out.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
const ATTEMPTS: u32 = 2;

/// `controller/leader.json`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaderLease {
    /// The controller's id.
    pub holder: u64,
    /// Its HTTP API (`host:port`), so that the others can point callers at it.
    pub http: String,
    /// Incremented by every takeover; the state names the term that wrote it.
    pub term: u64,
    /// Counts renewals: every renewal changes the object, which is how the
    /// others see that the holder is alive (no clocks are compared).
    pub renewals: u64,
}

/// Both objects.
#[derive(Clone)]
pub struct Store {
    storage: RemoteStorage,
}

/// Why the store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Failed(String),
}

impl From<CasError> for StoreError {
    fn from(e: CasError) -> StoreError {
        match e {
            CasError::Conflict { .. } => StoreError::Conflict(e.to_string()),
            CasError::Remote(r) => StoreError::Failed(r.to_string()),
        }
    }
}

impl Store {
    pub fn open(cfg: &RemoteStorageConfig) -> Result<Store, String> {
        let storage = RemoteStorage::new(cfg).map_err(|e| e.to_string())?.with_retries(
            ATTEMPT_TIMEOUT,
            ATTEMPTS,
            Duration::from_millis(50),
            Duration::from_millis(200),
        );
        Ok(Store { storage })
    }

    /// The object storage (for status pages).
    pub fn describe(&self) -> &str {
        self.storage.describe()
    }

    pub async fn read_state(&self) -> Result<Option<(ControllerState, ObjectVersion)>, StoreError> {
        let Some((bytes, v)) =
            self.storage.get_versioned(STATE_KEY).await.map_err(|e| StoreError::Failed(e.to_string()))?
        else {
            return Ok(None);
        };
        let s = ControllerState::decode(&bytes).map_err(|e| StoreError::Failed(format!("{STATE_KEY}: {e}")))?;
        Ok(Some((s, v)))
    }

    pub async fn write_state(
        &self,
        state: &ControllerState,
        expected: Option<&ObjectVersion>,
    ) -> Result<ObjectVersion, StoreError> {
        Ok(self.storage.put_if(STATE_KEY, Bytes::from(state.encode()), expected).await?)
    }

    pub async fn read_lease(&self) -> Result<Option<(LeaderLease, ObjectVersion)>, StoreError> {
        let Some((bytes, v)) =
            self.storage.get_versioned(LEADER_KEY).await.map_err(|e| StoreError::Failed(e.to_string()))?
        else {
            return Ok(None);
        };
        let l: LeaderLease =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Failed(format!("{LEADER_KEY}: {e}")))?;
        Ok(Some((l, v)))
    }

    pub async fn write_lease(
        &self,
        lease: &LeaderLease,
        expected: Option<&ObjectVersion>,
    ) -> Result<ObjectVersion, StoreError> {
        let bytes = serde_json::to_vec(lease).expect("a lease always encodes");
        Ok(self.storage.put_if(LEADER_KEY, Bytes::from(bytes), expected).await?)
    }

    /// The highest generation any object of `tenant` carries (layer and
    /// index names end in `-<generation:08x>`): a tenant the controller
    /// places for the first time gets generations above the ones issued
    /// before there was a controller.
    pub async fn max_generation(&self, tenant: TenantId) -> Result<u32, StoreError> {
        let objects =
            self.storage.list(&format!("tenants/{tenant}")).await.map_err(|e| StoreError::Failed(e.to_string()))?;
        Ok(objects.iter().filter_map(|o| generation_of(&o.key)).max().unwrap_or(0))
    }
}

/// The generation in an object name, if it has one.
fn generation_of(key: &str) -> Option<u32> {
    let name = key.rsplit('/').next()?;
    let name = name.strip_suffix(".json").unwrap_or(name);
    let (_, hex) = name.rsplit_once('-')?;
    (hex.len() == 8).then(|| u32::from_str_radix(hex, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_are_read_from_object_names() {
        assert_eq!(generation_of("tenants/t/timelines/l/index-0000000a.json"), Some(10));
        assert_eq!(generation_of("tenants/t/timelines/l/0000-FFFF__0001-0002.delta-00000003"), Some(3));
        assert_eq!(generation_of("tenants/t/heatmap-v1.json"), None);
        assert_eq!(generation_of("tenants/t/timelines/l/wal/000000010000000000000001"), None);
    }
}
