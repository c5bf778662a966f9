//! The controller's two objects in object storage, both written by
//! compare-and-swap (`strata_remote_storage::cas`): the state
//! (`controller/state.json`) and the leader's lease (`controller/leader.json`).
//! The storage itself is behind [`Objects`], so that a simulation can put a
//! fake one (failing, slow) under the same encoding.

use std::sync::Arc;

use bytes::Bytes;
use strata_protocol::api::controller::{ControllerState, LEADER_KEY, STATE_KEY};
use strata_protocol::TenantShardId;
use strata_remote_storage::cas::{CasError, ObjectVersion};
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};

use crate::limits::{STORE_ATTEMPTS, STORE_ATTEMPT_TIMEOUT, STORE_RETRY_MAX, STORE_RETRY_MIN};
use crate::tasks::BoxFuture;

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

/// Object storage as the controller uses it: versioned reads, conditional
/// writes and listings. [`RemoteStorage`] in the process. Every call ends
/// within a bound (a hung storage is an error, not a wait).
pub trait Objects: Send + Sync {
    /// Where it is (for status pages).
    fn describe(&self) -> String;
    /// The object `key` and its version; `None` if it does not exist.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<(Bytes, ObjectVersion)>, StoreError>>;
    /// Writes `key` if it is still at `expected` (`None`: does not exist yet).
    fn put_if<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        expected: Option<&'a ObjectVersion>,
    ) -> BoxFuture<'a, Result<ObjectVersion, StoreError>>;
    /// The names of the objects under `prefix`.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;
    /// Deletes `key` (done if it does not exist).
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
}

impl Objects for RemoteStorage {
    fn describe(&self) -> String {
        RemoteStorage::describe(self).to_string()
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<(Bytes, ObjectVersion)>, StoreError>> {
        Box::pin(async move { self.get_versioned(key).await.map_err(|e| StoreError::Failed(e.to_string())) })
    }

    fn put_if<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        expected: Option<&'a ObjectVersion>,
    ) -> BoxFuture<'a, Result<ObjectVersion, StoreError>> {
        Box::pin(async move { Ok(RemoteStorage::put_if(self, key, bytes, expected).await?) })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let objects = RemoteStorage::list(self, prefix).await.map_err(|e| StoreError::Failed(e.to_string()))?;
            Ok(objects.into_iter().map(|o| o.key).collect())
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { RemoteStorage::delete(self, key).await.map_err(|e| StoreError::Failed(e.to_string())) })
    }
}

/// Both objects.
#[derive(Clone)]
pub struct Store {
    objects: Arc<dyn Objects>,
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
    /// The configured object storage, each call bounded (two attempts of 2 s).
    pub fn open(cfg: &RemoteStorageConfig) -> Result<Store, String> {
        let storage = RemoteStorage::new(cfg).map_err(|e| e.to_string())?.with_retries(
            STORE_ATTEMPT_TIMEOUT,
            STORE_ATTEMPTS,
            STORE_RETRY_MIN,
            STORE_RETRY_MAX,
        );
        Ok(Store::new(Arc::new(storage)))
    }

    /// The objects in `objects`.
    pub fn new(objects: Arc<dyn Objects>) -> Store {
        Store { objects }
    }

    /// The object storage (for status pages).
    pub fn describe(&self) -> String {
        self.objects.describe()
    }

    /// `controller/state.json` and its version; `None` before the first write.
    pub async fn read_state(&self) -> Result<Option<(ControllerState, ObjectVersion)>, StoreError> {
        let Some((bytes, v)) = self.objects.get(STATE_KEY).await? else {
            return Ok(None);
        };
        let s = ControllerState::decode(&bytes).map_err(|e| StoreError::Failed(format!("{STATE_KEY}: {e}")))?;
        Ok(Some((s, v)))
    }

    /// Writes the state if it is still at `expected` (`None`: not written yet).
    pub async fn write_state(
        &self,
        state: &ControllerState,
        expected: Option<&ObjectVersion>,
    ) -> Result<ObjectVersion, StoreError> {
        self.objects.put_if(STATE_KEY, Bytes::from(state.encode()), expected).await
    }

    /// `controller/leader.json` and its version; `None` before anyone led.
    pub async fn read_lease(&self) -> Result<Option<(LeaderLease, ObjectVersion)>, StoreError> {
        let Some((bytes, v)) = self.objects.get(LEADER_KEY).await? else {
            return Ok(None);
        };
        let l: LeaderLease =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Failed(format!("{LEADER_KEY}: {e}")))?;
        Ok(Some((l, v)))
    }

    /// Writes the lease if it is still at `expected` (`None`: not written yet).
    pub async fn write_lease(
        &self,
        lease: &LeaderLease,
        expected: Option<&ObjectVersion>,
    ) -> Result<ObjectVersion, StoreError> {
        let bytes = serde_json::to_vec(lease).expect("a lease always encodes");
        self.objects.put_if(LEADER_KEY, Bytes::from(bytes), expected).await
    }

    /// Deletes every object under `tenants/{shard}/` (a rolled back
    /// split's child): its indexes first, so that nothing attaches from an
    /// index whose layers are going. How many went.
    pub async fn delete_shard_objects(&self, shard: TenantShardId) -> Result<usize, StoreError> {
        let mut keys = self.objects.list(&format!("tenants/{shard}/")).await?;
        keys.sort_by_key(|k| !k.rsplit('/').next().is_some_and(|n| n.starts_with("index-")));
        for k in &keys {
            self.objects.delete(k).await?;
        }
        Ok(keys.len())
    }

    /// The highest generation any object of `tenant` carries (layer and
    /// index names end in `-<generation:08x>`): a tenant the controller
    /// places for the first time gets generations above the ones issued
    /// before there was a controller.
    pub async fn max_generation(&self, tenant: TenantShardId) -> Result<u32, StoreError> {
        let keys = self.objects.list(&format!("tenants/{tenant}")).await?;
        Ok(keys.iter().filter_map(|k| generation_of(k)).max().unwrap_or(0))
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
