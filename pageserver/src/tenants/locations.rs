//! Locations set at run time by the storage controller
//! (`docs/storage-controller.md`): a tenant is attached here under a
//! generation, kept warm as a secondary, or detached.
//!
//! - **Attach** takes every timeline of the tenant from object storage
//!   (the newest index at or below the generation), with the layer files a
//!   secondary downloaded ahead of time moved in instead of fetched again.
//!   Each timeline's first upload round writes an index of the new
//!   generation at once: from then on no upload of an older generation is
//!   read by anyone.
//! - **Secondary** (from attached) stops the WAL receivers and uploads,
//!   keeps the uploaded layer files as the warm cache, and removes the
//!   timelines; then the secondary's downloader keeps the cache warm.
//! - **Detach** removes everything local of the tenant.
//!
//! Changes are serialized with timeline creation (the `creating` lock) and
//! recorded in the attachment file before they take effect, so a restart
//! comes back as the controller last said.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_protocol::api::pageserver::{LocationMode, LocationStatus};
use strata_protocol::TenantId;
use tracing::{info, warn};

use super::Tenants;
use crate::remote::attachments::{Attachment, Attachments, ATTACHMENTS_FORMAT_VERSION};
use crate::secondary;
use crate::timeline::StorageError;

/// Why a location could not be set.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("tenant {0}: an attached location needs a generation")]
    NoGeneration(TenantId),
    #[error("tenant {tenant}: already attached under generation {current}, newer than {asked}")]
    Older { tenant: TenantId, current: u32, asked: u32 },
    #[error("this pageserver has no object storage (locations need one)")]
    NoRemote,
    #[error("tenant {tenant}: {reason}")]
    Failed { tenant: TenantId, reason: String },
}

impl Tenants {
    /// The tenants' directory of `tenant`.
    pub(crate) fn tenant_dir(&self, tenant: TenantId) -> PathBuf {
        self.conf.data_dir.join("tenants").join(tenant.to_string())
    }

    /// What this pageserver holds of each tenant.
    pub fn locations(&self) -> Vec<LocationStatus> {
        let attaching = self.attaching.lock().clone();
        let attached: BTreeMap<TenantId, u32> =
            self.generations.lock().iter().filter(|(t, _)| !attaching.contains(*t)).map(|(t, g)| (*t, *g)).collect();
        let mut out: Vec<LocationStatus> = attached
            .iter()
            .map(|(t, g)| {
                let (mut layers, mut bytes) = (0u64, 0u64);
                for e in self.all().iter().filter(|e| e.tl.tenant_id == *t) {
                    let (n, b) = e.tl.resident_layers();
                    layers += n as u64;
                    bytes += b;
                }
                LocationStatus {
                    tenant_id: *t,
                    mode: LocationMode::Attached,
                    generation: Some(*g),
                    local_layers: layers,
                    local_layer_bytes: bytes,
                    heatmap_age_seconds: None,
                    error: None,
                }
            })
            .collect();
        out.extend(self.reader_statuses());
        out.extend(self.secondaries.statuses(&*self.resources.clock));
        out.sort_by_key(|l| l.tenant_id);
        out
    }

    /// Starts keeping `tenant` warm here.
    pub(crate) fn start_secondary(&self, tenant: TenantId) {
        if let Some(remote) = &self.remote {
            let (budget, period) = (self.conf.secondary_cache_bytes, self.conf.heatmap_period);
            self.secondaries.start(remote, tenant, self.tenant_dir(tenant), budget, period);
        }
    }

    /// Whether `tenant` is attached here, every timeline loaded (pages can be asked for).
    pub fn is_attached(&self, tenant: TenantId) -> bool {
        self.generations.lock().contains_key(&tenant) && !self.attaching.lock().contains(&tenant)
    }

    /// Whether `tenant` is being attached here (its timelines still loading).
    pub fn is_attaching(&self, tenant: TenantId) -> bool {
        self.attaching.lock().contains(&tenant)
    }

    /// Sets the location of `tenant` (blocking: an attach reads every
    /// index and may move many files).
    pub fn set_location(
        self: &Arc<Self>,
        tenant: TenantId,
        mode: LocationMode,
        generation: Option<u32>,
    ) -> Result<LocationStatus, LocationError> {
        let remote = self.remote.clone().ok_or(LocationError::NoRemote)?;
        let _one_at_a_time = self.creating.lock();
        let current = self.generations.lock().get(&tenant).copied();
        match mode {
            LocationMode::Attached => {
                let g = generation.ok_or(LocationError::NoGeneration(tenant))?;
                match current {
                    Some(c) if c == g => {}
                    Some(c) if c > g => return Err(LocationError::Older { tenant, current: c, asked: g }),
                    _ => {
                        self.record(tenant, Attachment::attached(g))?;
                        self.secondaries.stop(tenant);
                        self.stop_reader(tenant);
                        if current.is_some() {
                            self.stop_timelines(tenant, false);
                        }
                        self.attaching.lock().insert(tenant);
                        self.generations.lock().insert(tenant, g);
                        let attached = self.attach_tenant(&remote, tenant, g);
                        self.attaching.lock().remove(&tenant);
                        attached?;
                    }
                }
            }
            LocationMode::Secondary => {
                self.record(tenant, Attachment { generation: 0, mode: LocationMode::Secondary })?;
                self.stop_reader(tenant);
                if current.is_some() {
                    self.stop_timelines(tenant, true);
                    self.generations.lock().remove(&tenant);
                }
                self.start_secondary(tenant);
            }
            LocationMode::Reader => {
                self.record(tenant, Attachment { generation: 0, mode: LocationMode::Reader })?;
                self.secondaries.stop(tenant);
                if current.is_some() {
                    self.stop_timelines(tenant, true);
                    self.generations.lock().remove(&tenant);
                }
                if !self.is_reader(tenant) {
                    self.attach_reader(&remote, tenant)?;
                }
            }
            LocationMode::Detached => {
                self.secondaries.stop(tenant);
                self.stop_reader(tenant);
                if current.is_some() {
                    self.stop_timelines(tenant, false);
                    self.generations.lock().remove(&tenant);
                }
                let dir = self.tenant_dir(tenant);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(LocationError::Failed {
                            tenant,
                            reason: format!("removing {}: {e}", dir.display()),
                        })
                    }
                }
                self.forget(tenant)?;
            }
        }
        info!(%tenant, ?mode, ?generation, "location set");
        Ok(self.locations().into_iter().find(|l| l.tenant_id == tenant).unwrap_or(LocationStatus {
            tenant_id: tenant,
            mode: LocationMode::Detached,
            generation: None,
            local_layers: 0,
            local_layer_bytes: 0,
            heatmap_age_seconds: None,
            error: None,
        }))
    }

    /// Records the location of `tenant` in the attachment file, durably.
    pub(super) fn record(&self, tenant: TenantId, at: Attachment) -> Result<(), LocationError> {
        self.rewrite_attachments(tenant, |tenants| {
            tenants.insert(tenant, at);
        })
    }

    fn forget(&self, tenant: TenantId) -> Result<(), LocationError> {
        self.rewrite_attachments(tenant, |tenants| {
            tenants.remove(&tenant);
        })
    }

    fn rewrite_attachments(
        &self,
        tenant: TenantId,
        change: impl FnOnce(&mut BTreeMap<TenantId, Attachment>),
    ) -> Result<(), LocationError> {
        let remote = self.remote.as_ref().ok_or(LocationError::NoRemote)?;
        let path = remote.attachments_path();
        let failed = |reason: String| LocationError::Failed { tenant, reason };
        let mut a = Attachments::load(path).map_err(failed)?;
        a.format_version = ATTACHMENTS_FORMAT_VERSION;
        change(&mut a.tenants);
        strata_service::durable::replace_file(path, &a.encode(), self.conf.fsync)
            .map_err(|e| failed(format!("writing {}: {e}", path.display())))
    }

    /// Stops every timeline of `tenant` and takes them out of service: WAL
    /// receivers, then uploads (a round under way finishes). With `keep`,
    /// the uploaded layer files become the secondary's warm cache.
    pub(super) fn stop_timelines(&self, tenant: TenantId, keep: bool) {
        let entries: Vec<_> = self.all().into_iter().filter(|e| e.tl.tenant_id == tenant).collect();
        for e in &entries {
            e.tl.detach();
            if let Some(r) = e.handle.lock().take() {
                r.shutdown();
            }
        }
        for e in &entries {
            if let Some(r) = e.tl.remote() {
                r.stop_and_wait();
            }
            self.timelines.write().remove(&(tenant, e.tl.timeline_id));
        }
        for e in &entries {
            let dir = e.tl.dir.clone();
            if keep {
                if let Some(r) = e.tl.remote() {
                    let uploaded: Vec<(String, u32)> = r
                        .index()
                        .map(|i| i.layers.iter().map(|l| (l.name.clone(), l.generation)).collect())
                        .unwrap_or_default();
                    let kept = secondary::keep_as_warm(&self.tenant_dir(tenant), e.tl.timeline_id, &dir, &uploaded);
                    info!(%tenant, timeline = %e.tl.timeline_id, kept, "timeline stopped; its uploaded layers stay warm");
                }
            }
            if let Err(e) = remove_timeline_dir(&dir) {
                warn!(%tenant, "{e}");
            }
        }
    }

    /// Ends a reader location of `tenant`, if there is one: its downloaded
    /// layers stay as the warm cache (an attach or a secondary takes them).
    fn stop_reader(&self, tenant: TenantId) {
        if self.readers.lock().remove(&tenant) {
            self.stop_timelines(tenant, true);
        }
    }

    /// Attaches every timeline of `tenant` from object storage under `generation`.
    fn attach_tenant(
        self: &Arc<Self>,
        remote: &Arc<crate::remote::Remote>,
        tenant: TenantId,
        generation: u32,
    ) -> Result<(), LocationError> {
        let failed = |reason: String| LocationError::Failed { tenant, reason };
        let timelines = crate::remote::remote_timelines(remote, tenant).map_err(failed)?;
        let mut loaded = Vec::new();
        for timeline in timelines {
            let dir = self.timeline_dir(tenant, timeline);
            let Some((rt, _)) = self.remote_timeline(tenant, timeline, &dir).map_err(failed)? else { continue };
            let Some(index) = rt.index() else {
                info!(%tenant, %timeline, "objects in remote storage but no index: nothing to attach");
                continue;
            };
            let warm = secondary::take_warm(&self.tenant_dir(tenant), timeline, &index);
            match self.attach_from_remote_with(&dir, rt, dir.exists(), &warm) {
                Ok(tl) => loaded.push(tl),
                Err(e) => {
                    tracing::error!(%tenant, %timeline, "attaching from remote storage: {e}");
                    self.attach_unloadable(dir, tenant, timeline, e.to_string());
                }
            }
        }
        let n = loaded.len();
        self.attach_in_order(loaded);
        secondary::clear_warm(&self.tenant_dir(tenant));
        info!(%tenant, generation, timelines = n, "tenant attached");
        Ok(())
    }
}

/// Removes a stopped timeline's directory (a secondary keeps none).
fn remove_timeline_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::Io { op: "removing", path: dir.to_path_buf(), source: e }),
    }
}
