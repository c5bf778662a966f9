//! The deletion queue: objects are deleted from remote storage only after
//! the attachment file confirms, just before each batch, that the
//! generation which decided the deletion is still the tenant's current
//! one. A pageserver whose attachment is stale therefore never deletes
//! what a newer attachment's index may list.

use std::sync::Arc;

use strata_protocol::TenantShardId;
use strata_remote_storage::RemoteStorage;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::metrics::Metrics;

use crate::limits::DELETION_BATCHES_PER_CHECK as BATCHES_PER_CHECK;

/// Objects that one generation of a tenant decided to delete, after an
/// index that no longer lists them was uploaded.
#[derive(Debug)]
pub struct DeletionBatch {
    pub tenant: TenantShardId,
    pub generation: u32,
    pub keys: Vec<String>,
}

/// Runs the queue until every sender is gone.
pub(super) async fn run(
    mut rx: mpsc::Receiver<DeletionBatch>,
    storage: RemoteStorage,
    authority: super::authority::Authority,
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
        let current = match authority.deleting_generations(&storage).await {
            Ok(a) => a,
            Err(e) => {
                // Unknown: nothing is deleted (left behind is safe, deleted is not).
                let n: usize = batches.iter().map(|b| b.keys.len()).sum();
                warn!(objects = n, "cannot read {}, so no deletion is validated: {e}", authority.describe());
                metrics.remote_deletions_refused.inc_by(n as u64);
                continue;
            }
        };
        for b in batches {
            match current.get(&b.tenant).copied() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::attachments::{Attachment, Attachments};
    use bytes::Bytes;
    use strata_remote_storage::RemoteStorageConfig;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deletions_of_a_generation_that_is_not_current_are_dropped() {
        let dir = std::env::temp_dir().join(format!("strata-deletion-queue-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let storage = RemoteStorage::new(&RemoteStorageConfig::Local { path: dir.join("store") }).unwrap();
        for key in ["old/a", "old/b", "new/c"] {
            storage.put(key, Bytes::from_static(b"x")).await.unwrap();
        }
        let tenant: TenantShardId = "0f3c9e5a27d14b6c8e1f2a3b4c5d6e7f".parse().unwrap();
        let other: TenantShardId = "1f3c9e5a27d14b6c8e1f2a3b4c5d6e7f".parse().unwrap();
        let attachments = dir.join("attachments.json");
        let file = Attachments {
            format_version: 1,
            tenants: std::collections::BTreeMap::from([(tenant, Attachment::attached(2))]),
        };
        std::fs::write(&attachments, file.encode()).unwrap();
        let metrics = Arc::new(Metrics::new());
        let (tx, rx) = mpsc::channel(8);
        let queue = tokio::spawn(run(
            rx,
            storage.clone(),
            crate::remote::Authority::AttachmentFile(attachments),
            metrics.clone(),
        ));
        // Generation 1 is stale, the other tenant is not attached at all; generation 2 is current.
        let batch = |tenant, generation, keys: &[&str]| DeletionBatch {
            tenant,
            generation,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        tx.send(batch(tenant, 1, &["old/a", "old/b"])).await.unwrap();
        tx.send(batch(other, 2, &["old/a"])).await.unwrap();
        tx.send(batch(tenant, 2, &["new/c"])).await.unwrap();
        drop(tx);
        queue.await.unwrap();
        assert!(storage.get("old/a").await.is_ok() && storage.get("old/b").await.is_ok());
        assert!(storage.get("new/c").await.is_err(), "the current generation's deletion happened");
        assert_eq!(metrics.remote_deletions_refused.get(), 3);
        assert_eq!(metrics.remote_deletions.get(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
