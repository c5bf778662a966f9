//! Encryption at rest (`docs/security.md`, "Encryption at rest"): with a
//! cluster storage key configured, every object of a tenant is sealed by
//! [`RemoteStorage`](crate::RemoteStorage) before it leaves the process and
//! authenticated when it comes back; a plaintext or tampered object is
//! refused, never served.
//!
//! - [`format`]: the sealed object format (`docs/sealed-objects.md`).
//! - [`keys`]: cluster keys (a file) and tenants' data keys (an object each).
//! - [`names`]: which objects are a tenant's, and where its keys live.
//! - `store`: reading, creating and rotating the data key objects.
//! - `stream`: opening a download as it arrives.
//! - [`fuzz`]: the fuzz entry point of these decoders.
//! - `refusal`: refusals as remote errors.

pub mod format;
pub mod fuzz;
pub mod keys;
pub mod names;
mod refusal;
mod store;
pub(crate) mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use strata_protocol::TenantId;

use keys::{ClusterKeys, TenantKeys};

/// Why a sealed object (or a key) was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("not a sealed object (encryption at rest is on: every object of a tenant must be sealed)")]
    NotSealed,
    #[error("a sealed object cut short")]
    Truncated,
    #[error("bad sealed object header: {0}")]
    Header(String),
    #[error("chunk {chunk} fails authentication (tampered, cut short, or not this object)")]
    Authentication { chunk: u64 },
    #[error("{0}")]
    Key(String),
}

/// The cluster keys of a storage and the data keys it has unwrapped.
pub(crate) struct Sealing {
    pub(crate) cluster: ClusterKeys,
    /// Unwrapped data keys per tenant and when they were read; bounded by
    /// [`MAX_CACHED_TENANTS`](crate::limits::MAX_CACHED_TENANTS).
    cache: Mutex<HashMap<TenantId, (Arc<TenantKeys>, Instant)>>,
}

impl std::fmt::Debug for Sealing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealing {{ cluster key ids: {:?} }}", self.cluster.ids())
    }
}

impl Sealing {
    pub(crate) fn new(cluster: ClusterKeys) -> Sealing {
        Sealing { cluster, cache: Mutex::new(HashMap::new()) }
    }

    /// The cached keys of `tenant`, unless older than
    /// [`DATA_KEYS_REFRESH`](crate::limits::DATA_KEYS_REFRESH) (a rotation by
    /// another process is then seen).
    fn cached(&self, tenant: TenantId) -> Option<Arc<TenantKeys>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (keys, at) = cache.get(&tenant)?;
        (at.elapsed() < crate::limits::DATA_KEYS_REFRESH).then(|| keys.clone())
    }

    fn remember(&self, tenant: TenantId, keys: Arc<TenantKeys>) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= crate::limits::MAX_CACHED_TENANTS && !cache.contains_key(&tenant) {
            // Rare (more tenants than any one service holds): start over
            // rather than track use; keys are read again on demand.
            cache.clear();
        }
        cache.insert(tenant, (keys, Instant::now()));
    }

    fn forget(&self, tenant: TenantId) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).remove(&tenant);
    }
}

#[cfg(test)]
mod tests;
