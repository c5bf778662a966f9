//! The local disk as a cache: when the layer files on local disk pass
//! `local_cache_bytes`, the uploaded ones read longest ago are deleted
//! locally (they stay in object storage and are downloaded again by the
//! first read that needs them). A layer that is not uploaded yet, or that
//! a read holds, is never evicted; nor is one that no uploaded index
//! lists yet (after a crash the pageserver finds layers through the index).

use std::sync::Arc;

use tracing::{info, warn};

use crate::layer::layer_file::LayerFile;
use crate::tenants::Tenants;

/// What a round found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictionOutcome {
    /// Bytes of layer files on local disk afterwards.
    pub local_bytes: u64,
    pub evicted: usize,
    pub evicted_bytes: u64,
}

/// Evicts until the local layer bytes are at most `limit` (0: no limit,
/// only the gauge is updated).
pub fn evict_to_limit(tenants: &Tenants, limit: u64) -> EvictionOutcome {
    let mut total = 0u64;
    let mut candidates: Vec<(u64, Arc<LayerFile>)> = Vec::new();
    for entry in tenants.all() {
        let remote = entry.tl.remote().cloned();
        for layer in entry.tl.historic().iter() {
            if !layer.is_resident() {
                continue;
            }
            total += layer.file_size;
            // A reader keeps what it has: the attached pageserver may delete it from object storage.
            if remote.as_ref().is_some_and(|r| !r.is_reader() && r.is_in_index(&layer.name.to_string())) {
                candidates.push((layer.last_read_ms(), layer.clone()));
            }
        }
    }
    let mut outcome = EvictionOutcome { local_bytes: total, ..Default::default() };
    if limit > 0 && total > limit {
        candidates.sort_by_key(|(read, _)| *read);
        for (_, layer) in candidates {
            if outcome.local_bytes <= limit {
                break;
            }
            match layer.evict() {
                Ok(true) => {
                    outcome.local_bytes -= layer.file_size;
                    outcome.evicted += 1;
                    outcome.evicted_bytes += layer.file_size;
                }
                Ok(false) => {}
                Err(e) => warn!("evicting {}: {e}", layer.name),
            }
        }
        if outcome.evicted > 0 {
            tenants.metrics.layers_evicted.inc_by(outcome.evicted as u64);
            info!(
                layers = outcome.evicted,
                bytes = outcome.evicted_bytes,
                local_bytes = outcome.local_bytes,
                limit,
                "evicted layers from local disk"
            );
        }
    }
    tenants.metrics.local_layer_bytes.set(outcome.local_bytes as i64);
    outcome
}
