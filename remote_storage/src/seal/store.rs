//! The data key objects in the store: read and unwrapped on first use,
//! created by the first process that needs one (a conditional create, so a
//! pageserver and a safekeeper starting a tenant at once agree on one key),
//! wrapped again under the newest cluster key when read under an older
//! one, rotated and deleted on request.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use strata_protocol::TenantId;

use super::format::{self, ObjectSealer};
use super::keys::{ClusterKeys, DataKey, DataKeysObject, TenantKeys};
use super::names::{data_keys_key, object_tenant, KEYS_PREFIX};
use super::refusal::{about, refused};
use super::{SealError, Sealing};
use crate::cas::{CasError, ObjectVersion};
use crate::limits::KEY_OBJECT_ATTEMPTS;
use crate::{RemoteError, RemoteStorage};

fn cas_error(e: CasError) -> RemoteError {
    match e {
        CasError::Remote(e) => e,
        CasError::Conflict { key, expected } => RemoteError::Failed {
            op: "writing",
            key,
            attempts: KEY_OBJECT_ATTEMPTS,
            message: format!("changed by other writers each time (expected version {expected})"),
        },
    }
}

impl RemoteStorage {
    /// Turns on encryption at rest with the cluster keys in the file at
    /// `path` (refused when group or others may read it).
    pub fn with_storage_key(self, path: &Path) -> Result<RemoteStorage, RemoteError> {
        let keys = ClusterKeys::load(path).map_err(|e| RemoteError::Config(format!("storage key: {e}")))?;
        Ok(self.with_cluster_keys(keys))
    }

    /// Turns on encryption at rest with `keys`.
    pub fn with_cluster_keys(mut self, keys: ClusterKeys) -> RemoteStorage {
        self.sealing = Some(Arc::new(Sealing::new(keys)));
        self
    }

    /// Whether tenants' objects are sealed.
    pub fn encrypted(&self) -> bool {
        self.sealing.is_some()
    }

    /// The sealing and tenant of object `key` when it is to be sealed.
    pub(crate) fn sealing_for(&self, op: &'static str, key: &str) -> Result<Option<(&Sealing, TenantId)>, RemoteError> {
        let Some(sealing) = self.sealing.as_deref() else { return Ok(None) };
        match object_tenant(key) {
            None => Ok(None),
            Some(Ok(tenant)) => Ok(Some((sealing, tenant))),
            Some(Err(message)) => Err(RemoteError::Failed { op, key: key.to_string(), attempts: 0, message }),
        }
    }

    /// `tenant`'s data keys, holding `want` if given (an object sealed by
    /// a key newer than the cached ones reads them again); created when
    /// there are none yet and none is wanted.
    pub(crate) async fn tenant_keys(
        &self,
        sealing: &Sealing,
        tenant: TenantId,
        want: Option<u32>,
    ) -> Result<Arc<TenantKeys>, RemoteError> {
        if let Some(keys) = sealing.cached(tenant) {
            if want.is_none_or(|id| keys.get(id).is_some()) {
                return Ok(keys);
            }
        }
        let name = data_keys_key(tenant);
        let (object, version) = match self.read_data_keys(sealing, tenant).await? {
            Some(found) => found,
            None if want.is_some() => {
                return Err(refused(&name, "no data keys for this tenant: its objects cannot be opened"));
            }
            None => self.create_data_keys(sealing, tenant).await?,
        };
        let keys = Arc::new(object.unwrap_all(&sealing.cluster).map_err(|e| refused(&name, e))?);
        if object.needs_rewrap(&sealing.cluster) {
            // Under the newest cluster key, so the older ones can be retired.
            // Another writer may change it first; it is rewrapped next time.
            let again = object.rewrapped(&sealing.cluster).map_err(|e| refused(&name, e))?;
            match self.put_if(&name, Bytes::from(again.encode()), Some(&version)).await {
                Ok(_) => tracing::info!(%tenant, "wrapped the tenant's data keys under the newest cluster key"),
                Err(e) => tracing::warn!(%tenant, "could not wrap the data keys again: {e}"),
            }
        }
        sealing.remember(tenant, keys.clone());
        Ok(keys)
    }

    async fn read_data_keys(
        &self,
        sealing: &Sealing,
        tenant: TenantId,
    ) -> Result<Option<(DataKeysObject, ObjectVersion)>, RemoteError> {
        let name = data_keys_key(tenant);
        let Some((bytes, version)) = self.get_versioned(&name).await? else { return Ok(None) };
        let object = DataKeysObject::decode(&bytes, tenant).map_err(|e| refused(&name, e))?;
        // Checked here too, so a broken object is refused before use.
        object.unwrap_all(&sealing.cluster).map_err(|e| refused(&name, e))?;
        Ok(Some((object, version)))
    }

    /// Creates `tenant`'s first data key, or reads the one another process
    /// created meanwhile.
    async fn create_data_keys(
        &self,
        sealing: &Sealing,
        tenant: TenantId,
    ) -> Result<(DataKeysObject, ObjectVersion), RemoteError> {
        let name = data_keys_key(tenant);
        let object = DataKeysObject::first(&sealing.cluster, tenant);
        match self.put_if(&name, Bytes::from(object.encode()), None).await {
            Ok(version) => {
                tracing::info!(%tenant, "created the tenant's data key");
                Ok((object, version))
            }
            Err(CasError::Conflict { .. }) => self
                .read_data_keys(sealing, tenant)
                .await?
                .ok_or_else(|| refused(&name, "created by another process, then gone")),
            Err(CasError::Remote(e)) => Err(e),
        }
    }

    /// Adds a new data key for `tenant`, which seals its new objects from
    /// now on (in other processes once they read the keys again, within
    /// [`DATA_KEYS_REFRESH`](crate::limits::DATA_KEYS_REFRESH)); returns its id.
    pub async fn rotate_data_key(&self, tenant: TenantId) -> Result<u32, RemoteError> {
        let sealing = self.sealing.as_deref().ok_or_else(|| RemoteError::Config("no storage key configured".into()))?;
        let name = data_keys_key(tenant);
        let mut last = None;
        for _ in 0..KEY_OBJECT_ATTEMPTS {
            let (object, version) = match self.read_data_keys(sealing, tenant).await? {
                Some((o, v)) => (o, Some(v)),
                None => (DataKeysObject::first(&sealing.cluster, tenant), None),
            };
            let (object, id) = if version.is_some() {
                object.with_new_key(&sealing.cluster).map_err(|e| refused(&name, e))?
            } else {
                (object, 1)
            };
            match self.put_if(&name, Bytes::from(object.encode()), version.as_ref()).await {
                Ok(_) => {
                    sealing.forget(tenant);
                    tracing::info!(%tenant, key_id = id, "added a data key");
                    return Ok(id);
                }
                Err(e @ CasError::Conflict { .. }) => last = Some(e),
                Err(CasError::Remote(e)) => return Err(e),
            }
        }
        Err(cas_error(last.expect("at least one attempt")))
    }

    /// Wraps every tenant's data keys again under the newest cluster key
    /// (the step of a cluster key rotation after which the older keys can
    /// go); returns how many key objects were rewritten.
    pub async fn rewrap_data_keys(&self) -> Result<usize, RemoteError> {
        let sealing = self.sealing.as_deref().ok_or_else(|| RemoteError::Config("no storage key configured".into()))?;
        let mut rewritten = 0;
        for o in self.list(KEYS_PREFIX).await? {
            let Some(tenant) = o.key.split('/').nth(1).and_then(|t| t.parse::<TenantId>().ok()) else { continue };
            if o.key != data_keys_key(tenant) {
                continue;
            }
            let mut last = None;
            for _ in 0..KEY_OBJECT_ATTEMPTS {
                let Some((object, version)) = self.read_data_keys(sealing, tenant).await? else { break };
                if !object.needs_rewrap(&sealing.cluster) {
                    last = None;
                    break;
                }
                let again = object.rewrapped(&sealing.cluster).map_err(|e| refused(&o.key, e))?;
                match self.put_if(&o.key, Bytes::from(again.encode()), Some(&version)).await {
                    Ok(_) => {
                        rewritten += 1;
                        last = None;
                        break;
                    }
                    Err(e @ CasError::Conflict { .. }) => last = Some(e),
                    Err(CasError::Remote(e)) => return Err(e),
                }
            }
            if let Some(e) = last {
                return Err(cas_error(e));
            }
        }
        Ok(rewritten)
    }

    /// Deletes `tenant`'s data keys: whatever of its objects remain can no
    /// longer be opened by anyone (crypto-shredding).
    pub async fn delete_data_keys(&self, tenant: TenantId) -> Result<(), RemoteError> {
        if let Some(sealing) = &self.sealing {
            sealing.forget(tenant);
        }
        let name = data_keys_key(tenant);
        self.delete(&name).await?;
        // The local store's bookkeeping of conditional writes goes too.
        if let Some(fs) = &self.local {
            let file = crate::local_path(fs, "deleting", &name, &self.path("deleting", &name)?)?;
            for side in ["version", "lock"] {
                let _ = std::fs::remove_file(format!("{}#{side}", file.display()));
            }
        }
        Ok(())
    }

    /// `bytes` as stored under `key`: sealed when it is a tenant's object.
    pub(crate) async fn seal_for(&self, key: &str, bytes: Bytes) -> Result<Bytes, RemoteError> {
        let Some((sealing, tenant)) = self.sealing_for("uploading", key)? else { return Ok(bytes) };
        let keys = self.tenant_keys(sealing, tenant, None).await.map_err(|e| about(key, e))?;
        let (id, data_key) = keys.newest().ok_or_else(|| refused(key, "the tenant has no data key"))?;
        Ok(Bytes::from(format::seal(data_key, id, key, &bytes)))
    }

    /// A streaming sealer for `key`, when it is a tenant's object.
    pub(crate) async fn sealer_for(&self, key: &str) -> Result<Option<ObjectSealer>, RemoteError> {
        let Some((sealing, tenant)) = self.sealing_for("uploading", key)? else { return Ok(None) };
        let keys = self.tenant_keys(sealing, tenant, None).await.map_err(|e| about(key, e))?;
        let (id, data_key) = keys.newest().ok_or_else(|| refused(key, "the tenant has no data key"))?;
        Ok(Some(ObjectSealer::new(data_key, id, key)))
    }

    /// The content of the object `key` as downloaded: opened and
    /// authenticated when it is a tenant's object.
    pub(crate) async fn open_for(&self, key: &str, stored: Bytes) -> Result<Bytes, RemoteError> {
        let Some((sealing, tenant)) = self.sealing_for("downloading", key)? else { return Ok(stored) };
        let header = format::Header::decode(&stored).map_err(|e| refused(key, e))?;
        let keys = self.tenant_keys(sealing, tenant, Some(header.key_id)).await.map_err(|e| about(key, e))?;
        let key_for = |id: u32| -> Result<DataKey, SealError> {
            keys.get(id).cloned().ok_or_else(|| SealError::Key(format!("no data key {id} for tenant {tenant}")))
        };
        format::open(key, &stored, key_for).map(Bytes::from).map_err(|e| refused(key, e))
    }
}
