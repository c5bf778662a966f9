//! Reader locations (`docs/sites.md`, "A pageserver per site"): a
//! pageserver of another site than the attached one serves that site's
//! replicas. It loads each timeline from the newest index in object
//! storage and ingests the WAL from its own site's safekeepers, so the WAL
//! crosses the link between sites once (to those safekeepers) and pages
//! never do.
//!
//! A reader never writes to object storage: no uploads, no deletions, no
//! heatmaps. Its WAL streams carry generation 0, so they neither fence the
//! attached pageserver nor are fenced, and its feedback reports nothing
//! (a remote site's ingest must not hold back the writer nor let WAL go).
//! What it ingests itself lives on its local disk only and is never
//! evicted; a restart loads the tenant from object storage again.
//!
//! The attached pageserver's compaction and GC delete layers from object
//! storage that a reader may not have downloaded yet. So a reader
//! downloads every layer of its timelines in the background; when a
//! layer it still lacks is gone from the newest index, or a read failed on
//! a layer, it loads the tenant again from the newest index (the computes
//! are told the tenant moved meanwhile, and retry). The same round picks up
//! timelines created or deleted on the attached pageserver.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use strata_protocol::api::pageserver::{LocationMode, LocationStatus};
use strata_protocol::{TenantShardId, TimelineId};
use tracing::{info, warn};

use super::locations::{LayerTotals, LocationError};
use super::Tenants;
use crate::remote::{Remote, RemoteTimeline};
use crate::secondary;
use crate::timeline::Timeline;

use crate::limits::DOWNLOADS_PER_ROUND;

impl Tenants {
    /// Whether `tenant` is held here as a loaded reader.
    pub fn is_reader(&self, tenant: TenantShardId) -> bool {
        self.readers.lock().contains(&tenant)
    }

    /// Whether computes may read `tenant` here: attached, or a loaded reader.
    pub fn serves(&self, tenant: TenantShardId) -> bool {
        self.is_attached(tenant) || self.is_reader(tenant)
    }

    /// The reader locations, for the status.
    pub(super) fn reader_statuses(&self, totals: &BTreeMap<TenantShardId, LayerTotals>) -> Vec<LocationStatus> {
        let readers: Vec<TenantShardId> = self.readers.lock().iter().copied().collect();
        readers
            .into_iter()
            .map(|t| {
                let local = totals.get(&t).copied().unwrap_or_default();
                LocationStatus {
                    tenant_id: t,
                    mode: LocationMode::Reader,
                    generation: None,
                    local_layers: local.layers,
                    local_layer_bytes: local.bytes,
                    heatmap_age_seconds: None,
                    error: None,
                }
            })
            .collect()
    }

    /// Loads every timeline of `tenant` from its newest index as a reader
    /// (with the warm files a secondary or an earlier location left) and
    /// starts their WAL receivers. The caller serializes location changes.
    pub(super) fn attach_reader(&self, remote: &Arc<Remote>, tenant: TenantShardId) -> Result<(), LocationError> {
        let failed = |reason: String| LocationError::Failed { tenant, reason };
        let timelines = crate::remote::remote_timelines(remote, tenant).map_err(failed)?;
        let mut loaded = Vec::new();
        for timeline in timelines {
            match self.load_reader_timeline(remote, tenant, timeline) {
                Ok(Some(tl)) => loaded.push(tl),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(%tenant, %timeline, "loading as a reader: {e}");
                    self.attach_unloadable(self.timeline_dir(tenant, timeline), tenant, timeline, e);
                }
            }
        }
        let n = loaded.len();
        self.attach_in_order(loaded);
        secondary::clear_warm(&self.tenant_dir(tenant));
        self.readers.lock().insert(tenant);
        info!(%tenant, timelines = n, "reader location loaded");
        Ok(())
    }

    /// One timeline from its newest index, read-only (`None`: no index yet).
    fn load_reader_timeline(
        &self,
        remote: &Arc<Remote>,
        tenant: TenantShardId,
        timeline: TimelineId,
    ) -> Result<Option<Arc<Timeline>>, String> {
        if self.being_deleted(tenant, timeline) {
            return Ok(None);
        }
        let dir = self.timeline_dir(tenant, timeline);
        let Some(found) = RemoteTimeline::find_index(remote, tenant, timeline, u32::MAX)? else {
            return Ok(None);
        };
        let warm = secondary::take_warm(&self.tenant_dir(tenant), timeline, &found.index);
        let rt = RemoteTimeline::reader(remote.clone(), tenant, timeline, dir.clone(), Some(found));
        self.attach_from_remote_with(&dir, rt, dir.exists(), &warm).map(Some).map_err(|e| e.to_string())
    }

    /// One round for every reader location: timelines created on the
    /// attached pageserver are loaded, deleted ones dropped, and layers
    /// not yet local downloaded; a tenant that lacks a layer the newest
    /// index no longer lists is loaded again.
    pub fn refresh_readers(&self) {
        let Some(remote) = self.remote.clone() else { return };
        let readers: Vec<TenantShardId> = self.readers.lock().iter().copied().collect();
        for tenant in readers {
            if let Err(e) = self.refresh_reader(&remote, tenant) {
                warn!(%tenant, "refreshing the reader location: {e}");
            }
        }
    }

    fn refresh_reader(&self, remote: &Arc<Remote>, tenant: TenantShardId) -> Result<(), String> {
        let listed: BTreeSet<TimelineId> = crate::remote::remote_timelines(remote, tenant)?.into_iter().collect();
        let held: Vec<_> = self.all().into_iter().filter(|e| e.tl.tenant_id == tenant).collect();
        let held_ids: BTreeSet<TimelineId> = held.iter().map(|e| e.tl.timeline_id).collect();
        let mut reload = held_ids.iter().any(|t| !listed.contains(t))
            || held.iter().any(|e| e.tl.remote().is_some_and(|r| r.reload_wanted()));
        if !reload {
            let mut budget = DOWNLOADS_PER_ROUND;
            'timelines: for e in &held {
                let Some(rt) = e.tl.remote() else { continue };
                for layer in e.tl.historic().iter() {
                    if layer.is_resident() || !rt.is_in_index(&layer.name.to_string()) {
                        continue;
                    }
                    if budget == 0 {
                        break 'timelines;
                    }
                    budget -= 1;
                    if let Err(err) = layer.make_resident() {
                        let newest = RemoteTimeline::find_index(remote, tenant, e.tl.timeline_id, u32::MAX)?;
                        let name = layer.name.to_string();
                        if newest.is_some_and(|f| !f.index.layers.iter().any(|l| l.name == name)) {
                            info!(%tenant, timeline = %e.tl.timeline_id, layer = %name, "a layer not yet downloaded was replaced on the attached pageserver; loading the tenant again");
                            reload = true;
                            break 'timelines;
                        }
                        return Err(format!("timeline {}: downloading {name}: {err}", e.tl.timeline_id));
                    }
                }
            }
        }
        let _one_at_a_time = self.creating.lock();
        if !self.is_reader(tenant) {
            // Its location changed meanwhile.
            return Ok(());
        }
        if reload {
            self.metrics.reader_reloads.inc();
            self.readers.lock().remove(&tenant);
            self.stop_timelines(tenant, true);
            return self.attach_reader(remote, tenant).map_err(|e| e.to_string());
        }
        let mut loaded = Vec::new();
        for timeline in listed.iter().filter(|t| !held_ids.contains(t)) {
            match self.load_reader_timeline(remote, tenant, *timeline) {
                Ok(Some(tl)) => loaded.push(tl),
                Ok(None) => {}
                Err(e) => warn!(%tenant, %timeline, "loading a new timeline as a reader (retried): {e}"),
            }
        }
        if !loaded.is_empty() {
            info!(%tenant, timelines = loaded.len(), "the reader loaded new timelines");
            self.attach_in_order(loaded);
        }
        Ok(())
    }
}
