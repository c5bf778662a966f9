//! The local disk as a cache: when the layer files on local disk pass
//! `local_cache_bytes`, the uploaded ones read longest ago are deleted
//! locally (they stay in object storage and are downloaded again by the
//! first read that needs them). A layer that is not uploaded yet, or that
//! a read holds, is never evicted; nor is one that no uploaded index
//! lists yet (after a crash the pageserver finds layers through the index).
//!
//! Memory is a cache the same way: what layers keep in memory of their
//! files (index summaries, key filters) grows with the history kept
//! locally, so above `layer_index_cache_bytes` the layers read longest ago
//! drop it, and their next read opens the file again
//! ([`unload_to_limit`]).

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

/// What a round of [`unload_to_limit`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnloadOutcome {
    /// Bytes layers keep in memory of their files afterwards.
    pub index_bytes: u64,
    pub unloaded: usize,
    pub unloaded_bytes: u64,
}

/// Drops the in-memory part of the layers read longest ago until what all
/// layers keep in memory of their files is at most `limit`. A layer a read
/// holds keeps it (that read releases it when done, and the next round
/// tries again).
pub fn unload_to_limit(tenants: &Tenants, limit: u64) -> UnloadOutcome {
    let mut candidates: Vec<(u64, u64, Arc<LayerFile>)> = Vec::new();
    let mut total = 0u64;
    for entry in tenants.all() {
        for layer in entry.tl.historic().iter() {
            let bytes = layer.index_memory() as u64;
            if bytes > 0 {
                total += bytes;
                candidates.push((layer.last_read_ms(), bytes, layer.clone()));
            }
        }
    }
    let mut outcome = UnloadOutcome { index_bytes: total, ..Default::default() };
    if total > limit {
        candidates.sort_by_key(|(read, _, _)| *read);
        for (_, _, layer) in candidates {
            if outcome.index_bytes <= limit {
                break;
            }
            let freed = layer.unload() as u64;
            if freed > 0 {
                outcome.index_bytes = outcome.index_bytes.saturating_sub(freed);
                outcome.unloaded += 1;
                outcome.unloaded_bytes += freed;
            }
        }
        if outcome.unloaded > 0 {
            tenants.metrics.layer_index_unloads.inc_by(outcome.unloaded as u64);
            info!(
                layers = outcome.unloaded,
                bytes = outcome.unloaded_bytes,
                index_bytes = outcome.index_bytes,
                limit,
                "dropped the in-memory index of layers read longest ago"
            );
        }
    }
    tenants.metrics.layer_index_bytes.set(outcome.index_bytes as i64);
    outcome
}
