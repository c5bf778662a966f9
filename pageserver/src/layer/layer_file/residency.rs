//! [`LayerFile`], the handle of one layer file, and where its bytes are:
//! on local disk, in memory, or only in remote storage until a read needs
//! them and downloads them ([`Fetch`]). Downloads, eviction and the
//! deletion of removed layers live together because they change what a
//! layer holds loaded and must not race one another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_formats::Lsn;

use super::name::LayerName;
use super::open::{Loaded, Source};
use crate::key::Key;
use crate::layer::files::FileCache;
use crate::layer::LayerError;

/// Downloads a layer file that is not on local disk (on-demand download
/// from remote storage). Implemented by the timeline's remote client.
pub trait Fetch: Send + Sync {
    /// Writes the whole layer `name` of `size` bytes to `path` (atomically:
    /// `path` is whole or absent afterwards), checked against its index entry.
    fn fetch(&self, name: &LayerName, path: &Path, size: u64) -> Result<(), String>;
}

/// A layer file of either kind. Holds only a sparse summary of its index
/// and its key filter in memory, and only while the file is local and
/// recently read: a layer evicted from local disk keeps its name and size,
/// and is downloaded again by the first read that needs it; one whose
/// in-memory part was dropped to keep within `layer_index_cache_bytes`
/// ([`LayerFile::unload`]) is opened again by that read.
pub struct LayerFile {
    /// Its kind, key range and LSN range.
    pub name: LayerName,
    path: PathBuf,
    /// Bytes of the file, known even while it is not local.
    pub file_size: u64,
    /// What reads need of the file (summary, filter); `None` while the
    /// file is not on local disk, or unloaded.
    loaded: parking_lot::Mutex<Option<Arc<Loaded>>>,
    /// Whether the file is on local disk.
    local: std::sync::atomic::AtomicBool,
    /// Versions stored (0 until the file was first opened here).
    count: std::sync::atomic::AtomicU64,
    /// Held while downloading or evicting: one download per layer at a
    /// time, and no eviction racing a download.
    residency: parking_lot::Mutex<()>,
    /// Where descriptors come from (`None` for a layer held in memory).
    files: Option<Arc<FileCache>>,
    /// How to get the file back once evicted (set when remote storage is on).
    remote: std::sync::OnceLock<Arc<dyn Fetch>>,
    /// Milliseconds since the Unix epoch of the last read (eviction order).
    last_read: std::sync::atomic::AtomicU64,
    /// Set once the layer is no longer part of its timeline: the file is
    /// deleted when the last read holding it lets go.
    removed: std::sync::atomic::AtomicBool,
}

/// Milliseconds since the Unix epoch on the clock of `files` (0 for a
/// layer held in memory, which is never evicted).
fn now_ms(files: Option<&Arc<FileCache>>) -> u64 {
    let Some(f) = files else { return 0 };
    f.clock().system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl LayerFile {
    /// Opens and checks a layer file: header, footer and index CRC. Its
    /// descriptor is taken from `files` on each read, not kept.
    pub fn open(path: &Path, files: &Arc<FileCache>) -> Result<LayerFile, LayerError> {
        let (name, file_size, loaded) = LayerFile::load(path, files)?;
        Ok(LayerFile::assemble(name, path, file_size, Some(loaded), Some(files.clone())))
    }

    /// A layer whose file is not on local disk: `fetch` downloads it to
    /// `path` at its first read.
    pub fn remote(
        path: &Path,
        name: LayerName,
        file_size: u64,
        files: &Arc<FileCache>,
        fetch: Arc<dyn Fetch>,
    ) -> LayerFile {
        let l = LayerFile::assemble(name, path, file_size, None, Some(files.clone()));
        let _ = l.remote.set(fetch);
        l
    }

    /// Opens a layer held in memory; `path` only names it in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<LayerFile, LayerError> {
        let len = bytes.len() as u64;
        let (name, loaded) = Loaded::open(path, Source::Memory(bytes), len)?;
        Ok(LayerFile::assemble(name, path, len, Some(loaded), None))
    }

    fn assemble(
        name: LayerName,
        path: &Path,
        file_size: u64,
        loaded: Option<Loaded>,
        files: Option<Arc<FileCache>>,
    ) -> LayerFile {
        let last_read = now_ms(files.as_ref());
        let (local, count) = (loaded.is_some(), loaded.as_ref().map_or(0, |l| l.count));
        LayerFile {
            name,
            path: path.to_path_buf(),
            file_size,
            loaded: parking_lot::Mutex::new(loaded.map(Arc::new)),
            local: std::sync::atomic::AtomicBool::new(local),
            count: std::sync::atomic::AtomicU64::new(count),
            residency: parking_lot::Mutex::new(()),
            files,
            remote: std::sync::OnceLock::new(),
            last_read: std::sync::atomic::AtomicU64::new(last_read),
            removed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn load(path: &Path, files: &Arc<FileCache>) -> Result<(LayerName, u64, Loaded), LayerError> {
        let io = |source| LayerError::Io { path: path.display().to_string(), source };
        let file = files.file(path);
        let file_size = file.size().map_err(io)?;
        let (name, loaded) = Loaded::open(path, Source::File(file), file_size)?;
        Ok((name, file_size, loaded))
    }

    /// Lets the layer be evicted and downloaded again through `fetch`.
    pub fn set_remote(&self, fetch: Arc<dyn Fetch>) {
        let _ = self.remote.set(fetch);
    }

    /// Whether the file is on local disk.
    pub fn is_resident(&self) -> bool {
        self.local.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Bytes of memory the layer keeps of its file now (0 if unloaded).
    pub fn index_memory(&self) -> usize {
        self.loaded.lock().as_ref().map_or(0, |l| l.memory_bytes())
    }

    /// Drops what the layer keeps in memory of its file (index summary,
    /// key filter) while the file stays on local disk; the next read opens
    /// and checks the file again. Returns the bytes released: 0 if nothing
    /// was loaded, a read holds it, or the layer has no file.
    pub fn unload(&self) -> usize {
        if self.files.is_none() {
            return 0;
        }
        let _one = self.residency.lock();
        let mut loaded = self.loaded.lock();
        let bytes = match &*loaded {
            Some(l) if Arc::strong_count(l) == 1 => l.memory_bytes(),
            _ => return 0,
        };
        *loaded = None;
        bytes
    }

    /// When the layer was last read (ms since the Unix epoch).
    pub fn last_read_ms(&self) -> u64 {
        self.last_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Downloads the file if it is not local (a reader location fetches
    /// every layer ahead of its reads, `docs/sites.md`).
    pub fn make_resident(&self) -> Result<(), LayerError> {
        self.loaded().map(drop)
    }

    /// The readable layer, downloading its file first if it is not local.
    pub(super) fn loaded(&self) -> Result<Arc<Loaded>, LayerError> {
        self.last_read.store(now_ms(self.files.as_ref()), std::sync::atomic::Ordering::Relaxed);
        if let Some(l) = &*self.loaded.lock() {
            return Ok(l.clone());
        }
        let _one = self.residency.lock();
        if let Some(l) = &*self.loaded.lock() {
            return Ok(l.clone());
        }
        let p = self.path.display().to_string();
        let not_here = || std::io::Error::new(std::io::ErrorKind::NotFound, "not on local disk and no remote storage");
        let Some(files) = self.files.as_ref() else { return Err(LayerError::Io { path: p, source: not_here() }) };
        let local = self.is_resident();
        if !local {
            let Some(fetch) = self.remote.get() else { return Err(LayerError::Io { path: p, source: not_here() }) };
            fetch
                .fetch(&self.name, &self.path, self.file_size)
                .map_err(|e| LayerError::Io { path: p.clone(), source: std::io::Error::other(e) })?;
        }
        let (name, size, loaded) = LayerFile::load(&self.path, files)?;
        if name != self.name || size != self.file_size {
            let what = if local { "local file" } else { "downloaded file" };
            return Err(LayerError::Corrupt {
                path: p,
                reason: format!("{what} is {name} of {size} bytes, expected {} of {}", self.name, self.file_size),
            });
        }
        if local {
            files.count_index_reload();
        }
        self.count.store(loaded.count, std::sync::atomic::Ordering::Relaxed);
        self.local.store(true, std::sync::atomic::Ordering::SeqCst);
        let loaded = Arc::new(loaded);
        *self.loaded.lock() = Some(loaded.clone());
        Ok(loaded)
    }

    /// Deletes the local file if no read uses it and it can be downloaded
    /// again; returns whether it did. The caller makes sure the file is in
    /// remote storage.
    pub fn evict(&self) -> Result<bool, LayerError> {
        if self.remote.get().is_none() {
            return Ok(false);
        }
        let _one = self.residency.lock();
        let mut loaded = self.loaded.lock();
        if !self.is_resident() || loaded.as_ref().is_some_and(|l| Arc::strong_count(l) > 1) {
            return Ok(false);
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(LayerError::Io { path: self.path.display().to_string(), source }),
        }
        *loaded = None;
        self.local.store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(true)
    }

    /// Marks the layer as no longer part of its timeline: its file is
    /// deleted when the last holder drops it (reads in flight finish first).
    pub fn mark_removed(&self) {
        self.removed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// First key and LSN of every index block (for tests and fuzzing).
    pub fn summary(&self) -> Result<Vec<(Key, Lsn)>, LayerError> {
        Ok(self.loaded()?.summary.clone())
    }

    /// Where the file is (or will be, once downloaded).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of versions stored (0 if the file was never opened here).
    pub fn len(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether no version is stored (or the file was never opened here).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for LayerFile {
    fn drop(&mut self) {
        if self.removed.load(std::sync::atomic::Ordering::SeqCst) && self.files.is_some() {
            match std::fs::remove_file(&self.path) {
                Ok(()) => tracing::debug!(file = %self.path.display(), "deleted a removed layer file"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Left for the next load, which deletes the files the metadata lists as removed.
                Err(e) => tracing::warn!(file = %self.path.display(), "deleting a removed layer file: {e}"),
            }
        }
    }
}
