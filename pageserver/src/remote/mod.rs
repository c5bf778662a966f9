//! Object storage for the pageserver (`docs/bottomless-pageserver.md`):
//! the truth of every layer file, with the local disk as a cache.
//!
//! [`Remote`] is what a pageserver shares across timelines: the storage,
//! a small runtime of its own for the transfers (so a download that a
//! read waits for never waits on the page service's workers), the limit
//! of uploads in flight, and the deletion queue. [`RemoteTimeline`] is a
//! timeline's side: its upload loop, the index, on-demand downloads.

pub mod attachments;
mod authority;
mod deletion;
pub mod index;
mod timeline;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use strata_protocol::TenantShardId;
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};
use strata_service::clock::Clock;
use tokio::sync::{mpsc, Semaphore};

pub use attachments::Attachments;
pub use authority::Authority;
pub use deletion::DeletionBatch;
pub use timeline::{
    delete_timeline_objects, metadata_from_index, remote_timelines, FoundIndex, RemoteTimeline, UploadSource,
    UploadStatus,
};

use crate::metrics::Metrics;

/// Layer uploads in flight at once, per pageserver.
pub use crate::limits::MAX_UPLOADS_IN_FLIGHT;
use crate::limits::{DELETION_QUEUE, TRANSFER_THREADS};

/// A runtime shut down without waiting when dropped (it may be dropped on
/// any thread, even one of another runtime).
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Why a remote operation could not be waited for.
#[derive(Debug, thiserror::Error)]
#[error("remote storage transfers stopped (the pageserver is shutting down)")]
pub struct TransfersStopped;

/// A pageserver's object storage.
pub struct Remote {
    pub storage: RemoteStorage,
    runtime: OwnedRuntime,
    uploads: Arc<Semaphore>,
    attachments: PathBuf,
    pub authority: Authority,
    deletions: mpsc::Sender<DeletionBatch>,
    pub metrics: Arc<Metrics>,
    /// Local layer bytes not yet uploaded at which ingest is slowed.
    pub max_upload_lag_bytes: u64,
    /// fsync downloaded files.
    pub fsync: bool,
    /// Times the upload loops' periods and retries, and the warmers'.
    pub clock: Arc<dyn Clock>,
}

/// The object storage of `cfg` (nothing is transferred yet), encrypting
/// tenants' objects with the cluster key in `storage_key` if given.
pub fn open_storage(cfg: &RemoteStorageConfig, storage_key: Option<&std::path::Path>) -> Result<RemoteStorage, String> {
    let storage = RemoteStorage::new(cfg).map_err(|e| e.to_string())?;
    match storage_key {
        Some(key) => storage.with_storage_key(key).map_err(|e| e.to_string()),
        None => Ok(storage),
    }
}

impl Remote {
    /// Starts the transfer runtime and the deletion queue over `storage`.
    pub fn start(
        storage: RemoteStorage,
        attachments: PathBuf,
        controller: bool,
        max_upload_lag_bytes: u64,
        fsync: bool,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Remote>, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(TRANSFER_THREADS)
            .thread_name("remote-storage")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the remote storage runtime: {e}"))?;
        let (tx, rx) = mpsc::channel(DELETION_QUEUE);
        let authority = if controller { Authority::Controller } else { Authority::AttachmentFile(attachments.clone()) };
        runtime.spawn(deletion::run(rx, storage.clone(), authority.clone(), metrics.clone()));
        Ok(Arc::new(Remote {
            storage,
            runtime: OwnedRuntime(Some(runtime)),
            uploads: Arc::new(Semaphore::new(MAX_UPLOADS_IN_FLIGHT)),
            attachments,
            authority,
            deletions: tx,
            metrics,
            max_upload_lag_bytes,
            fsync,
            clock,
        }))
    }

    /// The directory or URL (status pages).
    pub fn describe(&self) -> &str {
        self.storage.describe()
    }

    /// The attachment file's path.
    pub fn attachments_path(&self) -> &std::path::Path {
        &self.attachments
    }

    /// The generation of `tenant` that this pageserver was given, from
    /// the attachment file.
    pub fn generation(&self, tenant: TenantShardId) -> Result<Option<u32>, String> {
        Ok(Attachments::load(&self.attachments)?.generation(tenant))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.0.as_ref().expect("present until dropped").handle()
    }

    /// Runs `f` on the transfer runtime.
    pub fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle().spawn(f);
    }

    /// Runs `f` on the transfer runtime and waits for it from a thread
    /// that may block (a worker of another multi-thread runtime hands its
    /// other tasks off meanwhile).
    pub fn block_on<F>(&self, f: F) -> Result<F::Output, TransfersStopped>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let _ = tx.send(f.await);
        });
        let wait = move || rx.recv().map_err(|_| TransfersStopped);
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }

    /// Queues deletions decided by `generation`; they happen only if it is
    /// still the tenant's current generation when the batch is run.
    async fn delete_later(&self, batch: DeletionBatch) {
        if batch.keys.is_empty() {
            return;
        }
        if self.deletions.send(batch).await.is_err() {
            tracing::warn!("the deletion queue stopped; objects are left in remote storage");
        }
    }
}
