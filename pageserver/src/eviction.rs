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
pub struct RoundOutcome {
    /// Bytes held afterwards: layer files on local disk ([`evict_to_limit`]),
    /// or what layers keep in memory of their files ([`unload_to_limit`]).
    pub bytes: u64,
    /// Layers that let go of theirs, and the bytes they released.
    pub released: usize,
    pub released_bytes: u64,
}

/// Releases the `candidates` read longest ago, one after another, until
/// the `total` bytes held are at most `limit`. `release` lets go of one
/// layer's bytes and returns how many (0: it could not, a read holds them).
fn release_oldest(
    mut candidates: Vec<(u64, Arc<LayerFile>)>,
    total: u64,
    limit: u64,
    mut release: impl FnMut(&LayerFile) -> u64,
) -> RoundOutcome {
    let mut outcome = RoundOutcome { bytes: total, ..Default::default() };
    if total <= limit {
        return outcome;
    }
    candidates.sort_by_key(|(read, _)| *read);
    for (_, layer) in candidates {
        if outcome.bytes <= limit {
            break;
        }
        let freed = release(&layer);
        if freed > 0 {
            outcome.bytes = outcome.bytes.saturating_sub(freed);
            outcome.released += 1;
            outcome.released_bytes += freed;
        }
    }
    outcome
}

/// Evicts until the local layer bytes are at most `limit` (0: no limit,
/// only the gauge is updated).
pub fn evict_to_limit(tenants: &Tenants, limit: u64) -> RoundOutcome {
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
    let limit_or_none = if limit > 0 { limit } else { u64::MAX };
    let outcome = release_oldest(candidates, total, limit_or_none, |layer| match layer.evict() {
        Ok(true) => layer.file_size,
        Ok(false) => 0,
        Err(e) => {
            warn!("evicting {}: {e}", layer.name);
            0
        }
    });
    if outcome.released > 0 {
        tenants.metrics.layers_evicted.inc_by(outcome.released as u64);
        info!(
            layers = outcome.released,
            bytes = outcome.released_bytes,
            local_bytes = outcome.bytes,
            limit,
            "evicted layers from local disk"
        );
    }
    tenants.metrics.local_layer_bytes.set(outcome.bytes as i64);
    outcome
}

/// Drops the in-memory part of the layers read longest ago until what all
/// layers keep in memory of their files is at most `limit`. A layer a read
/// holds keeps it (that read releases it when done, and the next round
/// tries again).
pub fn unload_to_limit(tenants: &Tenants, limit: u64) -> RoundOutcome {
    let mut candidates: Vec<(u64, Arc<LayerFile>)> = Vec::new();
    let mut total = 0u64;
    for entry in tenants.all() {
        for layer in entry.tl.historic().iter() {
            let bytes = layer.index_memory() as u64;
            if bytes > 0 {
                total += bytes;
                candidates.push((layer.last_read_ms(), layer.clone()));
            }
        }
    }
    let outcome = release_oldest(candidates, total, limit, |layer| layer.unload() as u64);
    if outcome.released > 0 {
        tenants.metrics.layer_index_unloads.inc_by(outcome.released as u64);
        info!(
            layers = outcome.released,
            bytes = outcome.released_bytes,
            index_bytes = outcome.bytes,
            limit,
            "dropped the in-memory index of layers read longest ago"
        );
    }
    tenants.metrics.layer_index_bytes.set(outcome.bytes as i64);
    outcome
}
