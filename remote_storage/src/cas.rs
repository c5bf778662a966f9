//! Conditional writes: objects updated by compare-and-swap, so several
//! processes can share one small object (the storage controller's state and
//! its leader lease, `docs/storage-controller.md`) without a lock service.
//!
//! Every read returns the object's [`ObjectVersion`]; a write names the
//! version it replaces (or that the object must not exist yet) and fails
//! with [`CasError::Conflict`] if another write came in between.
//!
//! - **S3**: the object's ETag, with `If-Match` / `If-None-Match: *` on the
//!   put (AWS S3 and MinIO both support them).
//! - **A local directory**: one machine only. Each object `NAME` has a
//!   counter in `NAME#version` and a lock file `NAME#lock` (names that
//!   listings skip); a reader holds the lock shared, a writer exclusively
//!   (`flock`), so every process of the machine sees one order of writes.
//!   The counter is replaced before the object: a crash in between leaves a
//!   newer counter over the old bytes, which fails the next writer that
//!   read the old counter (safe), never the reverse.
//!
//! A retried S3 write whose first attempt landed but whose answer was lost
//! fails its retry as a conflict; the object is then read back, and a write
//! whose bytes are there succeeded (writers put something unique in their
//! objects, such as a counter and their own id).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::{RemoteError, RemoteStorage};

/// Which write of an object a reader saw.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectVersion(pub String);

impl std::fmt::Display for ObjectVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a conditional write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// Another write came first (or the object exists / does not exist).
    #[error("{key}: changed by another writer (expected version {expected})")]
    Conflict { key: String, expected: String },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

use crate::sidecar::path as sidecar;

impl RemoteStorage {
    /// The object `key` and its version; `None` if it does not exist.
    pub async fn get_versioned(&self, key: &str) -> Result<Option<(Bytes, ObjectVersion)>, RemoteError> {
        self.refuse_tenant_object("reading", key)?;
        let path = self.path("reading", key)?;
        if let Some(fs) = &self.local {
            let file = crate::local_path(fs, "reading", key, &path)?;
            return blocking(file.clone(), move || local_get(&file)).await;
        }
        let got = self
            .retrying("reading", key, || async {
                let r = self.store.get(&path).await?;
                let etag = r.meta.e_tag.clone();
                Ok((r.bytes().await?, etag))
            })
            .await;
        match got {
            Ok((bytes, Some(etag))) => Ok(Some((bytes, ObjectVersion(etag)))),
            Ok((_, None)) => Err(RemoteError::Failed {
                op: "reading",
                key: key.to_string(),
                attempts: 1,
                message: "the store returned no ETag: conditional writes need one".into(),
            }),
            Err(RemoteError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `bytes` as `key` if the object is still at `expected` (or, for
    /// `None`, does not exist yet); returns the new version.
    pub async fn put_if(
        &self,
        key: &str,
        bytes: Bytes,
        expected: Option<&ObjectVersion>,
    ) -> Result<ObjectVersion, CasError> {
        self.refuse_tenant_object("writing", key)?;
        let path = self.path("writing", key)?;
        let expected_text = expected.map_or_else(|| "none".to_string(), |v| v.0.clone());
        let conflict = || CasError::Conflict { key: key.to_string(), expected: expected_text.clone() };
        if let Some(fs) = &self.local {
            let file = crate::local_path(fs, "writing", key, &path)?;
            let want = expected.map(|v| v.0.clone());
            let written = blocking(file.clone(), move || local_put(&file, &bytes, want.as_deref())).await?;
            return written.ok_or_else(conflict);
        }
        let mode = match expected {
            None => PutMode::Create,
            Some(v) => PutMode::Update(UpdateVersion { e_tag: Some(v.0.clone()), version: None }),
        };
        let mut attempts = 0u32;
        let put = self
            .retrying("writing", key, || {
                attempts += 1;
                let opts = PutOptions { mode: mode.clone(), ..Default::default() };
                let payload = PutPayload::from_bytes(bytes.clone());
                let path = &path;
                async move {
                    match self.store.put_opts(path, payload, opts).await {
                        Ok(r) => Ok(Ok(r.e_tag)),
                        Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => {
                            Ok(Err(()))
                        }
                        Err(e) => Err(e),
                    }
                }
            })
            .await;
        let put = match put {
            // An update of an object that is gone.
            Err(RemoteError::NotFound { .. }) => Ok(Err(())),
            other => other,
        }?;
        match put {
            Ok(Some(etag)) => Ok(ObjectVersion(etag)),
            Ok(None) => self.version_of_own_write(key, &bytes).await?.ok_or_else(conflict),
            // Refused on a retry: the first attempt may have been the write.
            Err(()) if attempts > 1 => self.version_of_own_write(key, &bytes).await?.ok_or_else(conflict),
            Err(()) => Err(conflict()),
        }
    }

    /// Conditional writes store objects as they are: with encryption at
    /// rest on, a tenant's object never goes through them.
    fn refuse_tenant_object(&self, op: &'static str, key: &str) -> Result<(), RemoteError> {
        match self.sealing_for(op, key)? {
            None => Ok(()),
            Some(_) => Err(RemoteError::Failed {
                op,
                key: key.to_string(),
                attempts: 0,
                message: "a tenant's object is sealed: conditional writes are for unsealed objects".into(),
            }),
        }
    }

    /// The version of `key` if it holds exactly `bytes`.
    async fn version_of_own_write(&self, key: &str, bytes: &[u8]) -> Result<Option<ObjectVersion>, RemoteError> {
        Ok(self.get_versioned(key).await?.filter(|(b, _)| b.as_ref() == bytes).map(|(_, v)| v))
    }
}

async fn blocking<T: Send + 'static>(
    file: PathBuf,
    f: impl FnOnce() -> Result<T, (&'static str, PathBuf, std::io::Error)> + Send + 'static,
) -> Result<T, RemoteError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RemoteError::Local { op: "writing", path: file, source: std::io::Error::other(e) })?
        .map_err(|(op, path, source)| RemoteError::Local { op, path, source })
}

type LocalResult<T> = Result<T, (&'static str, PathBuf, std::io::Error)>;

/// Holds `NAME#lock` (shared or exclusive) until dropped.
struct FileLock(#[allow(dead_code)] std::fs::File);

impl FileLock {
    fn take(file: &Path, exclusive: bool) -> LocalResult<FileLock> {
        use std::os::fd::AsRawFd;
        let path = sidecar(file, "lock");
        let open = || std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path);
        let f = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = strata_service::durable::parent_of(file);
                std::fs::create_dir_all(dir).map_err(|e| ("creating directory", dir.to_path_buf(), e))?;
                open().map_err(|e| ("creating", path.clone(), e))?
            }
            Err(e) => return Err(("creating", path, e)),
        };
        let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
                return Ok(FileLock(f));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(("locking", path, e));
            }
        }
    }
}

fn read_optional(path: &Path) -> LocalResult<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(("reading", path.to_path_buf(), e)),
    }
}

/// The counter of a local object (0 before its first write).
fn local_counter(file: &Path) -> LocalResult<u64> {
    let path = sidecar(file, "version");
    let Some(bytes) = read_optional(&path)? else { return Ok(0) };
    std::str::from_utf8(&bytes).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
        ("reading", path.clone(), std::io::Error::new(std::io::ErrorKind::InvalidData, "not a version counter"))
    })
}

fn local_get(file: &Path) -> LocalResult<Option<(Bytes, ObjectVersion)>> {
    let _lock = FileLock::take(file, false)?;
    let Some(bytes) = read_optional(file)? else { return Ok(None) };
    Ok(Some((Bytes::from(bytes), ObjectVersion(local_counter(file)?.to_string()))))
}

/// `None`: the object is not at `expected`.
fn local_put(file: &Path, bytes: &[u8], expected: Option<&str>) -> LocalResult<Option<ObjectVersion>> {
    let _lock = FileLock::take(file, true)?;
    let counter = local_counter(file)?;
    let current = file.exists().then(|| counter.to_string());
    if current.as_deref() != expected {
        return Ok(None);
    }
    let next = counter + 1;
    let durable = |path: &Path, b: &[u8]| {
        strata_service::durable::replace_file(path, b, true).map_err(|e| (e.op, e.path, e.source))
    };
    durable(&sidecar(file, "version"), next.to_string().as_bytes())?;
    durable(file, bytes)?;
    Ok(Some(ObjectVersion(next.to_string())))
}
