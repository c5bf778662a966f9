//! The deletion queue: objects are deleted from remote storage only after
//! the attachment file confirms, just before each batch, that the
//! generation which decided the deletion is still the tenant's current
//! one. A pageserver whose attachment is stale therefore never deletes
//! what a newer attachment's index may list.

use std::path::PathBuf;
use std::sync::Arc;

use strata_protocol::TenantId;
use strata_remote_storage::RemoteStorage;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::Attachments;
use crate::metrics::Metrics;

/// Most batches validated against one read of the attachment file.
const BATCHES_PER_CHECK: usize = 64;

/// Objects that one generation of a tenant decided to delete, after an
/// index that no longer lists them was uploaded.
#[derive(Debug)]
pub struct DeletionBatch {
    pub tenant: TenantId,
    pub generation: u32,
    pub keys: Vec<String>,
}

/// Runs the queue until every sender is gone.
pub(super) async fn run(
    mut rx: mpsc::Receiver<DeletionBatch>,
    storage: RemoteStorage,
    attachments: PathBuf,
    metrics: Arc<Metrics>,
) {
    while let Some(first) = rx.recv().await {
        let mut batches = vec![first];
        while batches.len() < BATCHES_PER_CHECK {
            match rx.try_recv() {
                Ok(b) => batches.push(b),
                Err(_) => break,
            }
        }
        let current = {
            let path = attachments.clone();
            tokio::task::spawn_blocking(move || Attachments::load(&path)).await
        };
        let current = match current {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                // Unknown: nothing is deleted (left behind is safe, deleted is not).
                let n: usize = batches.iter().map(|b| b.keys.len()).sum();
                warn!(objects = n, "cannot read the attachment file, so no deletion is validated: {e}");
                metrics.remote_deletions_refused.inc_by(n as u64);
                continue;
            }
            Err(e) => {
                warn!("reading the attachment file: {e}");
                continue;
            }
        };
        for b in batches {
            match current.generation(b.tenant) {
                Some(g) if g == b.generation => {
                    for key in &b.keys {
                        match storage.delete(key).await {
                            Ok(()) => {
                                metrics.remote_deletions.inc();
                            }
                            // Left behind: unreferenced, so only space is lost.
                            Err(e) => warn!(tenant = %b.tenant, "deleting {key}: {e}"),
                        }
                    }
                }
                other => {
                    info!(
                        tenant = %b.tenant, generation = b.generation, current = ?other, objects = b.keys.len(),
                        "dropping deletions of a generation that is no longer current"
                    );
                    metrics.remote_deletions_refused.inc_by(b.keys.len() as u64);
                }
            }
        }
    }
}
