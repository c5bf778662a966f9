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
use strata_protocol::TenantShardId;
use tracing::{info, warn};

use super::Tenants;
use crate::metrics::TenantSizes;
use crate::remote::attachments::{Attachment, Attachments, ATTACHMENTS_FORMAT_VERSION};
use crate::secondary;
use crate::timeline::StorageError;

/// Why a location could not be set.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("tenant {0}: an attached location needs a generation")]
    NoGeneration(TenantShardId),
    #[error("tenant {tenant}: already attached under generation {current}, newer than {asked}")]
    Older { tenant: TenantShardId, current: u32, asked: u32 },
    #[error("this pageserver has no object storage (locations need one)")]
    NoRemote,
    #[error("tenant {tenant}: {reason}")]
    Failed { tenant: TenantShardId, reason: String },
}

impl Tenants {
    /// The tenants' directory of `tenant`.
    pub(crate) fn tenant_dir(&self, tenant: TenantShardId) -> PathBuf {
        self.conf.data_dir.join("tenants").join(tenant.to_string())
    }

    /// What this pageserver holds of each tenant.
    pub fn locations(&self) -> Vec<LocationStatus> {
        self.locations_with(&self.layer_totals())
    }

    /// [`Self::locations`], with the layer totals of the loaded timelines.
    fn locations_with(&self, totals: &BTreeMap<TenantShardId, LayerTotals>) -> Vec<LocationStatus> {
        let attaching = self.attaching.lock().clone();
        let attached: BTreeMap<TenantShardId, u32> =
            self.generations.lock().iter().filter(|(t, _)| !attaching.contains(*t)).map(|(t, g)| (*t, *g)).collect();
        let mut out: Vec<LocationStatus> = attached
            .iter()
            .map(|(t, g)| {
                let local = totals.get(t).copied().unwrap_or_default();
                LocationStatus {
                    tenant_id: *t,
                    mode: LocationMode::Attached,
                    generation: Some(*g),
                    local_layers: local.layers,
                    local_layer_bytes: local.bytes,
                    heatmap_age_seconds: None,
                    error: None,
                }
            })
            .collect();
        out.extend(self.reader_statuses(totals));
        out.extend(self.secondaries.statuses(&*self.resources.clock));
        out.sort_by_key(|l| l.tenant_id);
        out
    }

    /// Per tenant with timelines loaded here: its layer files on local
    /// disk and its layers in object storage. One pass over the timelines.
    pub(super) fn layer_totals(&self) -> BTreeMap<TenantShardId, LayerTotals> {
        let mut out: BTreeMap<TenantShardId, LayerTotals> = BTreeMap::new();
        for e in self.all() {
            let t = out.entry(e.tl.tenant_id).or_default();
            let (n, b) = e.tl.resident_layers();
            t.layers += n as u64;
            t.bytes += b;
            if let Some(r) = e.tl.remote() {
                *t.remote_bytes.get_or_insert(0) += r.remote_bytes();
            }
        }
        out
    }

    /// Each tenant held here with its sizes, as the metrics show them: the
    /// locations, and, where no storage controller places tenants, every
    /// other tenant whose timelines are loaded (without object storage, or
    /// outside the attachment file), which is served as an attached one is.
    /// Under a controller every tenant held has a location, and timelines
    /// without one belong to a location still changing (a reader loading):
    /// like a tenant still attaching, it shows once the change is done.
    pub fn tenant_sizes(&self) -> Vec<TenantSizes> {
        let totals = self.layer_totals();
        let mut out: Vec<TenantSizes> = self
            .locations_with(&totals)
            .into_iter()
            .map(|l| TenantSizes {
                tenant: l.tenant_id,
                mode: l.mode,
                local_layer_bytes: l.local_layer_bytes,
                // A secondary holds no timeline: its remote layers are the attached location's.
                remote_layer_bytes: totals.get(&l.tenant_id).and_then(|t| t.remote_bytes),
            })
            .collect();
        if self.conf.controller {
            return out;
        }
        let attaching = self.attaching.lock().clone();
        for (t, total) in &totals {
            if !attaching.contains(t) && !out.iter().any(|s| s.tenant == *t) {
                out.push(TenantSizes {
                    tenant: *t,
                    mode: LocationMode::Attached,
                    local_layer_bytes: total.bytes,
                    remote_layer_bytes: total.remote_bytes,
                });
            }
        }
        out
    }

    /// The metrics in Prometheus text format, with the per-tenant series
    /// of the tenants held now. One scrape at a time: another one's
    /// refill would otherwise empty the families under this one's render.
    pub fn render_metrics(&self) -> String {
        let _one_at_a_time = self.scrape.lock();
        self.metrics.set_tenants(&self.tenant_sizes());
        let all = self.all();
        let idle = all.iter().filter(|e| e.tl.activity.state().is_idle()).count();
        self.metrics.set_timeline_activity(all.len() - idle, idle);
        self.metrics.render()
    }

    /// Starts keeping `tenant` warm here.
    pub(crate) fn start_secondary(&self, tenant: TenantShardId) {
        if let Some(remote) = &self.remote {
            let (budget, period) = (self.conf.secondary_cache_bytes, self.conf.heatmap_period);
            self.secondaries.start(remote, tenant, self.tenant_dir(tenant), budget, period);
        }
    }

    /// Whether `tenant` is attached here, every timeline loaded (pages can be asked for).
    pub fn is_attached(&self, tenant: TenantShardId) -> bool {
        self.generations.lock().contains_key(&tenant) && !self.attaching.lock().contains(&tenant)
    }

    /// Whether `tenant` is being attached here (its timelines still loading).
    pub fn is_attaching(&self, tenant: TenantShardId) -> bool {
        self.attaching.lock().contains(&tenant)
    }

    /// Sets the location of `tenant` (blocking: an attach reads every
    /// index and may move many files).
    pub fn set_location(
        self: &Arc<Self>,
        tenant: TenantShardId,
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
    pub(super) fn record(&self, tenant: TenantShardId, at: Attachment) -> Result<(), LocationError> {
        self.rewrite_attachments(tenant, |tenants| {
            tenants.insert(tenant, at);
        })
    }

    fn forget(&self, tenant: TenantShardId) -> Result<(), LocationError> {
        self.rewrite_attachments(tenant, |tenants| {
            tenants.remove(&tenant);
        })
    }

    fn rewrite_attachments(
        &self,
        tenant: TenantShardId,
        change: impl FnOnce(&mut BTreeMap<TenantShardId, Attachment>),
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
    pub(super) fn stop_timelines(&self, tenant: TenantShardId, keep: bool) {
        let entries: Vec<_> = self.all().into_iter().filter(|e| e.tl.tenant_id == tenant).collect();
        for e in &entries {
            e.tl.detach();
            e.stop_receiver();
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
    fn stop_reader(&self, tenant: TenantShardId) {
        if self.readers.lock().remove(&tenant) {
            self.stop_timelines(tenant, true);
        }
    }

    /// Attaches every timeline of `tenant` from object storage under `generation`.
    fn attach_tenant(
        self: &Arc<Self>,
        remote: &Arc<crate::remote::Remote>,
        tenant: TenantShardId,
        generation: u32,
    ) -> Result<(), LocationError> {
        let failed = |reason: String| LocationError::Failed { tenant, reason };
        let timelines = crate::remote::remote_timelines(remote, tenant).map_err(failed)?;
        let mut loaded = Vec::new();
        for timeline in timelines {
            if self.being_deleted(tenant, timeline) {
                continue;
            }
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

/// What a tenant's loaded timelines hold, summed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LayerTotals {
    /// Layer files on local disk, and their bytes.
    pub layers: u64,
    pub bytes: u64,
    /// Bytes their indexes list in object storage; none if no timeline
    /// has object storage.
    pub remote_bytes: Option<u64>,
}

/// Removes a stopped timeline's directory (a secondary keeps none).
fn remove_timeline_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::Io { op: "removing", path: dir.to_path_buf(), source: e }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use strata_formats::v15::control::ControlFile;
    use strata_formats::Lsn;
    use strata_protocol::TimelineId;

    use super::*;
    use crate::config::PageserverConfig;
    use crate::key::Key;
    use crate::layer::files::FileCache;
    use crate::layer::map::RecordLsns;
    use crate::metrics::Metrics;
    use crate::remote::{Remote, RemoteTimeline};
    use crate::timeline::{Timeline, TimelineMetadata, TimelineResources};
    use crate::value::Value;

    /// A pageserver's tenants over object storage in `root` (a local directory).
    fn tenants(root: &Path) -> Arc<Tenants> {
        let conf: PageserverConfig = toml::from_str(&format!(
            "id = 1\nlisten_pg = \"127.0.0.1:1\"\nlisten_http = \"127.0.0.1:2\"\ndata_dir = {:?}\nfsync = false\n\
             attachments = {:?}\n[remote_storage]\ntype = 'local'\npath = {:?}\n",
            root.join("data").display().to_string(),
            root.join("attachments.json").display().to_string(),
            root.join("remote").display().to_string(),
        ))
        .unwrap();
        std::fs::create_dir_all(root.join("remote")).unwrap();
        let clock = crate::clock::system();
        let metrics = Arc::new(Metrics::new());
        let resources = TimelineResources {
            fsync: false,
            checkpoint_distance: 1 << 20,
            metrics: metrics.clone(),
            files: FileCache::new(16, metrics.layer_files(), clock.clone()),
            verify_redo: false,
            policy: Default::default(),
            clock: clock.clone(),
        };
        let storage = crate::remote::open_storage(conf.remote_storage.as_ref().unwrap(), None).unwrap();
        let attachments = conf.attachments.clone().unwrap();
        let remote =
            Remote::start(storage, attachments, false, conf.max_upload_lag_bytes, false, metrics, clock).unwrap();
        Tenants::load(Arc::new(conf), resources, Some(remote), None, None).unwrap()
    }

    /// A new timeline of `tenant` holding one layer file, attached here
    /// (uploading under `generation`, if given).
    fn timeline_with_a_layer(tenants: &Tenants, tenant: TenantShardId, generation: Option<u32>) -> Arc<Timeline> {
        let timeline = TimelineId::generate();
        let dir = tenants.timeline_dir(tenant, timeline);
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        let start = Lsn(0x100_0000);
        // What an import leaves, pg_control and the checkpoint: ingest starts from them.
        let control_bytes =
            std::fs::read(strata_test_support::paths::in_crate("../formats/tests/data/pg_control_v15")).unwrap();
        let control = ControlFile::decode(&control_bytes).unwrap();
        let meta = TimelineMetadata {
            format_version: crate::timeline::METADATA_VERSION,
            tenant_id: tenant,
            timeline_id: timeline,
            ancestor_timeline_id: None,
            ancestor_lsn: None,
            pg_version: 15,
            system_id: control.system_identifier,
            wal_segment_size: 16 << 20,
            start_lsn: start,
            disk_consistent_lsn: Lsn::INVALID,
            prev_record_lsn: Lsn::INVALID,
            layers: Vec::new(),
            removed_layers: Vec::new(),
            gc_cutoff_lsn: Lsn::INVALID,
            retain_lsns: Vec::new(),
            stripe_blocks: None,
        };
        let tl = Timeline::create(dir.clone(), meta, &tenants.resources).unwrap();
        tl.commit_record(
            vec![
                (Key::control(), start, Value::Image(Bytes::from(control_bytes))),
                (Key::checkpoint(), start, Value::Image(Bytes::copy_from_slice(&control.checkpoint_copy.encode()))),
            ],
            RecordLsns { last: start, prev: Lsn::INVALID },
        );
        tl.checkpoint().unwrap();
        if let (Some(remote), Some(g)) = (&tenants.remote, generation) {
            tl.set_remote(RemoteTimeline::new(remote.clone(), tenant, timeline, g, dir, None));
        }
        tenants.attach(tl.clone()).unwrap();
        tl
    }

    /// The value of `name{label="value"}` in `text`, if it has that series.
    fn series(text: &str, name: &str, label: &str, value: &str) -> Option<u64> {
        let prefix = format!("{name}{{{label}=\"{value}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap())
    }

    const LOCAL: &str = "strata_pageserver_tenant_local_layer_bytes";
    const REMOTE: &str = "strata_pageserver_tenant_remote_layer_bytes";
    const MODES: &str = "strata_pageserver_tenants";

    #[test]
    fn tenant_series_follow_the_tenants_held_and_match_their_status() {
        let root = strata_test_support::scratch_dir("tenant-metrics");
        let tenants = tenants(&root);
        let (placed, unplaced) = (TenantShardId::generate(), TenantShardId::generate());
        let (p, u) = (placed.to_string(), unplaced.to_string());
        assert!(series(&tenants.render_metrics(), LOCAL, "tenant", &p).is_none());

        tenants.set_location(placed, LocationMode::Attached, Some(1)).unwrap();
        let timelines =
            [timeline_with_a_layer(&tenants, placed, Some(1)), timeline_with_a_layer(&tenants, placed, Some(1))];
        for tl in &timelines {
            tl.wait_uploaded(Duration::from_secs(30)).unwrap();
        }
        // Outside the attachment file (as every tenant without object
        // storage): counted as attached, with nothing in object storage.
        timeline_with_a_layer(&tenants, unplaced, None);

        let text = tenants.render_metrics();
        let statuses: Vec<_> =
            timelines.iter().map(|tl| tenants.get(placed, tl.timeline_id).unwrap().status()).collect();
        let local: u64 = statuses.iter().map(|s| s.local_layer_bytes).sum();
        let remote: u64 = statuses.iter().map(|s| s.remote.as_ref().unwrap().remote_bytes).sum();
        assert!(local > 0 && remote > 0, "{statuses:?}");
        assert_eq!(series(&text, LOCAL, "tenant", &p), Some(local), "{text}");
        assert_eq!(series(&text, REMOTE, "tenant", &p), Some(remote), "{text}");
        let location = tenants.locations().into_iter().find(|l| l.tenant_id == placed).unwrap();
        assert_eq!(location.local_layer_bytes, local, "the locations and the metrics count alike");
        assert!(series(&text, LOCAL, "tenant", &u).unwrap() > 0, "{text}");
        assert_eq!(series(&text, REMOTE, "tenant", &u), None, "nothing of it is in object storage: {text}");
        assert_eq!(series(&text, MODES, "mode", "attached"), Some(2), "{text}");
        assert_eq!(series(&text, MODES, "mode", "secondary"), Some(0), "{text}");

        // A secondary: its warm cache is local, its remote layers are the attached location's.
        tenants.set_location(placed, LocationMode::Secondary, None).unwrap();
        let text = tenants.render_metrics();
        assert!(series(&text, LOCAL, "tenant", &p).is_some(), "{text}");
        assert_eq!(series(&text, REMOTE, "tenant", &p), None, "{text}");
        assert_eq!(series(&text, MODES, "mode", "secondary"), Some(1), "{text}");
        assert_eq!(series(&text, MODES, "mode", "attached"), Some(1), "{text}");

        // Detached: its series go; the other tenant's stay.
        tenants.set_location(placed, LocationMode::Detached, None).unwrap();
        let text = tenants.render_metrics();
        assert!(!text.contains(&p), "{text}");
        assert!(series(&text, LOCAL, "tenant", &u).is_some(), "{text}");
        assert_eq!(series(&text, MODES, "mode", "secondary"), Some(0), "{text}");
        tenants.shutdown();
        std::fs::remove_dir_all(&root).unwrap();
    }
}
