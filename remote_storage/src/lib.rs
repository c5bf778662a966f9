//! Remote storage: the objects that make a service's data outlive its disk
//! (layer files and index manifests of the pageserver, and the WAL
//! segments the safekeepers offload, see [`wal`]), in a local directory or in any S3 API,
//! through the `object_store` crate.
//!
//! Every operation has a timeout, and transient failures are retried a
//! bounded number of times with jittered backoff. Errors name the
//! operation, the object and the number of attempts. Object names are
//! relative to the configured prefix; a local directory holds them as files
//! under the same relative paths.
//!
//! With a cluster storage key ([`RemoteStorage::with_storage_key`]), the
//! objects of tenants are sealed before upload and authenticated on
//! download ([`seal`]); sizes and CRC-32Cs returned by transfers are those
//! of the content, listings give the stored (sealed) sizes.

pub mod cas;
pub mod config;
pub mod limits;
mod local_copy;
pub mod seal;
mod sidecar;
mod transfer;
pub mod wal;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tracing::warn;

pub use config::RemoteStorageConfig;
use limits::{DEFAULT_ATTEMPTS, DEFAULT_BACKOFF, DEFAULT_TIMEOUT};
use strata_service::backoff::Backoff;
pub use transfer::{Downloaded, Uploaded};

/// Why a remote operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("remote storage {0}")]
    Config(String),
    #[error("{op} {key}: no such object")]
    NotFound { op: &'static str, key: String },
    #[error("{op} {key}: {message} (after {attempts} attempts)")]
    Failed { op: &'static str, key: String, attempts: u32, message: String },
    /// An object refused on download (not sealed, tampered, cut short,
    /// moved from another name) or a key object that cannot be used.
    #[error("{key}: refused: {message}")]
    Refused { key: String, message: String },
    #[error("{op} {}: {source}", path.display())]
    Local {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An object, its size and when it was last written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Relative to the storage's prefix.
    pub key: String,
    /// Bytes stored: a sealed object's are more than its content's.
    pub size: u64,
    pub last_modified: std::time::SystemTime,
}

/// A connection to one object store, under one prefix.
#[derive(Clone, Debug)]
pub struct RemoteStorage {
    store: Arc<dyn ObjectStore>,
    /// The same store when it is a local directory: files are uploaded into
    /// it by streaming copies instead of through memory (see `upload_file`).
    local: Option<Arc<object_store::local::LocalFileSystem>>,
    /// Prepended to every key (empty for none).
    prefix: String,
    describe: String,
    timeout: Duration,
    attempts: u32,
    /// Shortest and longest wait between attempts.
    backoff: (Duration, Duration),
    /// Encryption at rest of tenants' objects, when a storage key is set.
    sealing: Option<Arc<seal::Sealing>>,
}

impl RemoteStorage {
    /// Opens the storage `cfg` describes; a local directory is created if
    /// missing (mode 0700). Nothing is read or written yet.
    pub fn new(cfg: &RemoteStorageConfig) -> Result<RemoteStorage, RemoteError> {
        let mut local = None;
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match cfg {
            RemoteStorageConfig::Local { path } => {
                use std::os::unix::fs::DirBuilderExt;
                // Its objects are the tenants' data: the store is its owner's
                // alone, whoever creates it first (not only a service, whose
                // umask keeps it private anyway).
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .map_err(|source| RemoteError::Local { op: "creating", path: path.clone(), source })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(path)
                    .map_err(|e| RemoteError::Config(format!("{}: {e}", path.display())))?;
                // Writes go to a temporary file that is renamed: no reader
                // sees half an object. An object that was written survives a
                // crash of the machine, as it would in S3: the pageserver and
                // the safekeepers delete their own copies once it is.
                let fs = Arc::new(fs.with_automatic_cleanup(true).with_fsync(true));
                local = Some(fs.clone());
                (fs, String::new())
            }
            RemoteStorageConfig::S3 { bucket, prefix, endpoint, region, access_key_id, secret_access_key } => {
                // Retries are ours (bounded, jittered, logged, with a timeout
                // per attempt): the client's own would hide an unreachable
                // server for minutes inside one attempt.
                let retry = object_store::RetryConfig { max_retries: 0, ..Default::default() };
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(retry);
                if let Some(e) = endpoint {
                    b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
                }
                let region = region.clone().or_else(|| std::env::var("AWS_DEFAULT_REGION").ok());
                b = b.with_region(region.unwrap_or_else(|| "us-east-1".into()));
                if let Some(k) = access_key_id {
                    b = b.with_access_key_id(k);
                }
                if let Some(s) = secret_access_key {
                    b = b.with_secret_access_key(s);
                }
                let s3 = b.build().map_err(|e| RemoteError::Config(format!("{}: {e}", cfg.describe())))?;
                (Arc::new(s3), prefix.trim_matches('/').to_string())
            }
        };
        Ok(RemoteStorage {
            store,
            local,
            prefix,
            describe: cfg.describe(),
            timeout: DEFAULT_TIMEOUT,
            attempts: DEFAULT_ATTEMPTS,
            backoff: DEFAULT_BACKOFF,
            sealing: None,
        })
    }

    /// Changes the timeout per attempt, the number of attempts and the
    /// shortest and longest (jittered) wait between them.
    pub fn with_retries(mut self, timeout: Duration, attempts: u32, min: Duration, max: Duration) -> RemoteStorage {
        self.timeout = timeout;
        self.attempts = attempts.max(1);
        self.backoff = (min.max(Duration::from_millis(1)), max.max(min));
        self
    }

    /// The directory, or the `s3://` URL (for status pages).
    pub fn describe(&self) -> &str {
        &self.describe
    }

    fn path(&self, op: &'static str, key: &str) -> Result<ObjectPath, RemoteError> {
        let full = if self.prefix.is_empty() { key.to_string() } else { format!("{}/{key}", self.prefix) };
        ObjectPath::parse(&full).map_err(|e| RemoteError::Failed {
            op,
            key: key.to_string(),
            attempts: 0,
            message: format!("not a valid object name: {e}"),
        })
    }

    /// Runs `f` until it succeeds, fails for good, or has used every attempt.
    async fn retrying<T, F, Fut>(&self, op: &'static str, key: &str, mut f: F) -> Result<T, RemoteError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let mut attempt = 0;
        let mut backoff = Backoff::new(self.backoff.0, self.backoff.1);
        loop {
            attempt += 1;
            let message = match tokio::time::timeout(self.timeout, f()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(object_store::Error::NotFound { .. })) => {
                    return Err(RemoteError::NotFound { op, key: key.to_string() })
                }
                Ok(Err(e)) if !transient(&e) => {
                    return Err(RemoteError::Failed {
                        op,
                        key: key.to_string(),
                        attempts: attempt,
                        message: e.to_string(),
                    })
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", self.timeout),
            };
            if attempt >= self.attempts {
                return Err(RemoteError::Failed { op, key: key.to_string(), attempts: attempt, message });
            }
            let delay = backoff.next_delay();
            warn!(storage = %self.describe, op, key, attempt, ?delay, "{message}; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// Writes `bytes` as the object `key`, replacing any object of that name.
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), RemoteError> {
        let stored = self.seal_for(key, bytes).await?;
        self.put_stored(key, stored).await
    }

    /// Writes `bytes` as they are.
    async fn put_stored(&self, key: &str, bytes: Bytes) -> Result<(), RemoteError> {
        let path = self.path("uploading", key)?;
        if let Some(fs) = &self.local {
            // Our own staging (not `object_store`'s), whose leftovers the
            // next put of the name removes.
            let dest = local_path(fs, "uploading", key, &path)?;
            return local_write(dest.clone(), move || local_copy::put(&bytes, &dest)).await.map(|_| ());
        }
        self.retrying("uploading", key, || self.store.put(&path, PutPayload::from_bytes(bytes.clone()))).await?;
        Ok(())
    }

    /// Uploads the file at `local` as the object `key`; returns its size and
    /// CRC-32C (of the file, not of the sealed object). Into a local
    /// directory the file is copied (and sealed) in 1 MiB chunks (staged,
    /// fsynced, renamed); to S3 it is read whole: its size bounds the
    /// memory an upload takes.
    pub async fn upload_file(&self, key: &str, local: &Path) -> Result<Uploaded, RemoteError> {
        if let Some(fs) = &self.local {
            let dest = local_path(fs, "uploading", key, &self.path("uploading", key)?)?;
            let sealer = self.sealer_for(key).await?;
            let src = local.to_path_buf();
            return local_write(src.clone(), move || local_copy::upload(&src, &dest, sealer)).await;
        }
        let bytes = tokio::fs::read(local).await.map_err(|source| RemoteError::Local {
            op: "reading",
            path: local.to_path_buf(),
            source,
        })?;
        let uploaded = Uploaded { size: bytes.len() as u64, crc32c: crc32c::crc32c(&bytes) };
        let stored = self.seal_for(key, Bytes::from(bytes)).await?;
        self.put_stored(key, stored).await?;
        Ok(uploaded)
    }

    /// The whole object `key` (opened and authenticated when sealed).
    pub async fn get(&self, key: &str) -> Result<Bytes, RemoteError> {
        let path = self.path("downloading", key)?;
        let stored = self.retrying("downloading", key, || async { self.store.get(&path).await?.bytes().await }).await?;
        self.open_for(key, stored).await
    }

    /// Downloads the object `key` to `local`, streamed: written chunk by
    /// chunk (the object's size does not bound the memory taken) to a
    /// temporary file next to it, synced, then renamed, so `local` is whole
    /// or absent. Returns the size and CRC-32C of what was written. A stream
    /// that breaks off starts over, within the storage's attempts. A sealed
    /// object is opened chunk by chunk; one that fails authentication is
    /// refused at once (not retried) and nothing is left at `local`.
    pub async fn download_file(&self, key: &str, local: &Path) -> Result<Downloaded, RemoteError> {
        use futures_util::StreamExt;
        let path = self.path("downloading", key)?;
        let tmp = PathBuf::from(format!("{}.download", local.display()));
        let local_err = |op: &'static str, source: std::io::Error| RemoteError::Local { op, path: tmp.clone(), source };
        let mut backoff = Backoff::new(self.backoff.0, self.backoff.1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let got = self.retrying("downloading", key, || self.store.get(&path)).await?;
            let file = tokio::fs::File::create(&tmp).await.map_err(|e| local_err("creating", e))?;
            let mut file = PlainFile::new(file);
            let mut stream = got.into_stream();
            let mut incoming = self.incoming(key)?;
            let mut plain = Vec::new();
            let broken = loop {
                match tokio::time::timeout(self.timeout, stream.next()).await {
                    Ok(Some(Ok(chunk))) => {
                        plain.clear();
                        if let Err(e) = incoming.push(self, key, &chunk, &mut plain).await {
                            return discard(&tmp, e).await;
                        }
                        file.write(&plain).await.map_err(|e| local_err("writing", e))?;
                    }
                    Ok(Some(Err(e))) => break Some(e.to_string()),
                    Ok(None) => break None,
                    Err(_) => break Some(format!("no data within {:?}", self.timeout)),
                }
            };
            let Some(message) = broken else {
                plain.clear();
                if let Err(e) = incoming.finish(key, &mut plain) {
                    return discard(&tmp, e).await;
                }
                file.write(&plain).await.map_err(|e| local_err("writing", e))?;
                let downloaded = file.sync().await.map_err(|(op, e)| local_err(op, e))?;
                tokio::fs::rename(&tmp, local).await.map_err(|e| local_err("renaming", e))?;
                return Ok(downloaded);
            };
            drop(file);
            if attempt >= self.attempts {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(RemoteError::Failed {
                    op: "downloading",
                    key: key.to_string(),
                    attempts: attempt,
                    message,
                });
            }
            let delay = backoff.next_delay();
            warn!(storage = %self.describe, key, attempt, ?delay, "download broke off: {message}; starting over");
            tokio::time::sleep(delay).await;
        }
    }

    /// Every object whose name starts with `prefix` (a directory-like
    /// prefix: `a/b` lists `a/b/…`), names relative to the storage's prefix.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, RemoteError> {
        let path = self.path("listing", prefix)?;
        let strip = if self.prefix.is_empty() { 0 } else { self.prefix.len() + 1 };
        let metas: Vec<object_store::ObjectMeta> =
            self.retrying("listing", prefix, || self.store.list(Some(&path)).try_collect()).await?;
        let mut out: Vec<ObjectInfo> = metas
            .into_iter()
            // A local directory's bookkeeping of conditional writes (`cas`).
            .filter(|m| self.local.is_none() || !m.location.as_ref().contains('#'))
            .map(|m| ObjectInfo {
                key: m.location.as_ref().get(strip..).unwrap_or("").to_string(),
                size: m.size,
                last_modified: m.last_modified.into(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes the object `key`; deleting one that does not exist succeeds.
    pub async fn delete(&self, key: &str) -> Result<(), RemoteError> {
        let path = self.path("deleting", key)?;
        match self.retrying("deleting", key, || self.store.delete(&path)).await {
            Err(RemoteError::NotFound { .. }) => {}
            other => other?,
        }
        // An object written by compare-and-swap in a local directory has
        // its counter and lock files beside it: they go with it.
        if let Some(fs) = &self.local {
            let file = local_path(fs, "deleting", key, &path)?;
            sidecar::remove_all(&file).map_err(|source| RemoteError::Local { op: "deleting", path: file, source })?;
        }
        Ok(())
    }
}

/// The file a download writes: the content, with its size and CRC-32C
/// computed on the way.
struct PlainFile {
    /// Chunks are small (kilobytes): written a MiB at a time.
    file: tokio::io::BufWriter<tokio::fs::File>,
    done: Downloaded,
}

impl PlainFile {
    fn new(file: tokio::fs::File) -> PlainFile {
        let file = tokio::io::BufWriter::with_capacity(crate::limits::DOWNLOAD_WRITE_BUFFER, file);
        PlainFile { file, done: Downloaded { size: 0, crc32c: 0 } }
    }

    async fn write(&mut self, plain: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.done.crc32c = crc32c::crc32c_append(self.done.crc32c, plain);
        self.done.size += plain.len() as u64;
        self.file.write_all(plain).await
    }

    /// Flushes and syncs the file; what was written. Fails with the step.
    async fn sync(mut self) -> Result<Downloaded, (&'static str, std::io::Error)> {
        use tokio::io::AsyncWriteExt;
        self.file.flush().await.map_err(|e| ("writing", e))?;
        self.file.get_ref().sync_all().await.map_err(|e| ("syncing", e))?;
        Ok(self.done)
    }
}

/// Removes a download's temporary file, whose content was refused, and
/// returns the refusal.
async fn discard<T>(tmp: &Path, refusal: RemoteError) -> Result<T, RemoteError> {
    let _ = tokio::fs::remove_file(tmp).await;
    Err(refusal)
}

/// Whether an error may go away by itself (network, server, timeouts).
fn transient(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. } | object_store::Error::JoinError { .. })
}

/// Runs a write into a local-directory store on a blocking thread; `path`
/// names the write if the thread itself fails.
async fn local_write(
    path: PathBuf,
    write: impl FnOnce() -> Result<Uploaded, local_copy::CopyError> + Send + 'static,
) -> Result<Uploaded, RemoteError> {
    tokio::task::spawn_blocking(write)
        .await
        .map_err(|e| RemoteError::Local { op: "uploading", path, source: std::io::Error::other(e) })?
        .map_err(|(op, path, source)| RemoteError::Local { op, path, source })
}

/// The file of object `key` (at `path`) in a local-directory store.
fn local_path(
    fs: &object_store::local::LocalFileSystem,
    op: &'static str,
    key: &str,
    path: &ObjectPath,
) -> Result<PathBuf, RemoteError> {
    fs.path_to_filesystem(path).map_err(|e| RemoteError::Failed {
        op,
        key: key.to_string(),
        attempts: 0,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
