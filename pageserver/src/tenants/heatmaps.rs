//! The attached side of warm secondaries: each attached tenant's heatmap,
//! published for its secondaries (`crate::secondary`).

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use strata_protocol::api::pageserver::LocationMode;
use strata_protocol::{TenantShardId, TimelineId};
use tracing::warn;

use super::Tenants;
use crate::remote::index::IndexLayer;
use crate::secondary::{heatmap_key, Heatmap, HeatmapTimeline, HEATMAP_FORMAT_VERSION};

impl Tenants {
    /// The heatmap of an attached tenant as it is now.
    pub fn current_heatmap(&self, tenant: TenantShardId, generation: u32) -> Heatmap {
        let mut timelines = Vec::new();
        for e in self.all().iter().filter(|e| e.tl.tenant_id == tenant) {
            let Some(index) = e.tl.remote().and_then(|r| r.index()) else { continue };
            let uploaded: HashMap<&str, &IndexLayer> = index.layers.iter().map(|l| (l.name.as_str(), l)).collect();
            let mut hot: Vec<(u64, IndexLayer)> =
                e.tl.historic()
                    .iter()
                    .filter(|l| l.is_resident())
                    .filter_map(|l| uploaded.get(l.name.to_string().as_str()).map(|u| (l.last_read_ms(), (*u).clone())))
                    .collect();
            // Most recently read first; ties in name order, so an idle
            // tenant's heatmap does not change.
            hot.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
            timelines.push(HeatmapTimeline {
                timeline_id: e.tl.timeline_id,
                layers: hot.into_iter().map(|(_, l)| l).collect(),
            });
        }
        timelines.sort_by_key(|t| t.timeline_id);
        Heatmap { format_version: HEATMAP_FORMAT_VERSION, generation, timelines }
    }

    /// Publishes the heatmap of every attached tenant whose set of hot layers
    /// changed since the last one (the order within it changes with every read).
    pub fn publish_heatmaps(&self, published: &mut HashMap<TenantShardId, BTreeSet<(TimelineId, String)>>) {
        let Some(remote) = self.remote.clone() else { return };
        for l in self.locations().into_iter().filter(|l| l.mode == LocationMode::Attached) {
            let Some(generation) = l.generation else { continue };
            let heatmap = self.current_heatmap(l.tenant_id, generation);
            let set: BTreeSet<(TimelineId, String)> = heatmap
                .timelines
                .iter()
                .flat_map(|t| t.layers.iter().map(|x| (t.timeline_id, x.name.clone())))
                .collect();
            if published.get(&l.tenant_id) == Some(&set) {
                continue;
            }
            let key = heatmap_key(l.tenant_id);
            let storage = remote.storage.clone();
            let bytes = Bytes::from(heatmap.encode());
            match remote.block_on(async move { storage.put(&key, bytes).await }) {
                Ok(Ok(())) => {
                    published.insert(l.tenant_id, set);
                }
                Ok(Err(e)) => warn!(tenant = %l.tenant_id, "publishing the heatmap: {e}"),
                Err(e) => warn!(tenant = %l.tenant_id, "publishing the heatmap: {e}"),
            }
        }
        published.retain(|t, _| self.is_attached(*t));
    }
}
