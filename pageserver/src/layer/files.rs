//! Open layer files, bounded: every read of a layer file goes through one
//! cache of file descriptors per pageserver, which keeps at most
//! `capacity` files open and closes the least recently used one to open
//! another. A timeline with tens of thousands of layer files therefore
//! runs under a small `ulimit -n`; a layer costs memory (its index summary
//! and filter), not a descriptor.
//!
//! A descriptor evicted while a read still uses it closes when that read
//! ends, so at most `capacity` plus the number of concurrent reads are open.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use strata_service::clock::Clock;

/// The descriptor cache.
pub struct FileCache {
    capacity: usize,
    /// The pageserver's clock: when layers read through the cache were
    /// last read (which layers are evicted first, and are hot).
    clock: Arc<dyn Clock>,
    next_id: AtomicU64,
    inner: Mutex<Inner>,
    metrics: CacheMetrics,
}

/// Counters of the cache (registered by the pageserver's metrics).
#[derive(Clone, Default)]
pub struct CacheMetrics {
    pub open: Gauge,
    pub opens: Counter,
    pub evictions: Counter,
    /// Layers whose dropped in-memory index a read loaded again from the
    /// local file (`LayerFile::unload`).
    pub index_reloads: Counter,
}

#[derive(Default)]
struct Inner {
    /// File id → descriptor and the tick of its last use.
    files: HashMap<u64, (Arc<File>, u64)>,
    /// Tick of last use → file id: the oldest is evicted first.
    by_use: BTreeMap<u64, u64>,
    tick: u64,
}

/// A file read through the cache; opened on demand.
pub struct CachedFile {
    id: u64,
    path: PathBuf,
    cache: Arc<FileCache>,
}

impl FileCache {
    /// A cache of at most `capacity` open files, for layers read on `clock`'s time.
    pub fn new(capacity: usize, metrics: CacheMetrics, clock: Arc<dyn Clock>) -> Arc<FileCache> {
        assert!(capacity > 0, "checked with the config");
        Arc::new(FileCache {
            capacity,
            clock,
            next_id: AtomicU64::new(1),
            inner: Mutex::new(Inner::default()),
            metrics,
        })
    }

    /// Counts a layer's in-memory index loaded again from its local file.
    pub fn count_index_reload(&self) {
        self.metrics.index_reloads.inc();
    }

    /// The clock of the layers read through this cache.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A file whose reads go through the cache (nothing is opened yet).
    pub fn file(self: &Arc<Self>, path: &Path) -> CachedFile {
        CachedFile { id: self.next_id.fetch_add(1, Ordering::Relaxed), path: path.to_path_buf(), cache: self.clone() }
    }

    /// Descriptors the cache holds now.
    pub fn len(&self) -> usize {
        self.inner.lock().files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, id: u64, path: &Path) -> std::io::Result<Arc<File>> {
        {
            let mut inner = self.inner.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some((file, used)) = inner.files.get_mut(&id) {
                let (file, old) = (file.clone(), std::mem::replace(used, tick));
                inner.by_use.remove(&old);
                inner.by_use.insert(tick, id);
                return Ok(file);
            }
        }
        // Opened without the lock: other reads go on meanwhile.
        let file = Arc::new(File::open(path)?);
        self.metrics.opens.inc();
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((existing, used)) = inner.files.get_mut(&id) {
            // Opened by a concurrent read meanwhile: use that one.
            let (existing, old) = (existing.clone(), std::mem::replace(used, tick));
            inner.by_use.remove(&old);
            inner.by_use.insert(tick, id);
            return Ok(existing);
        }
        while inner.files.len() >= self.capacity {
            let Some((_, victim)) = inner.by_use.pop_first() else { break };
            inner.files.remove(&victim);
            self.metrics.evictions.inc();
        }
        inner.files.insert(id, (file.clone(), tick));
        inner.by_use.insert(tick, id);
        debug_assert_eq!(inner.files.len(), inner.by_use.len());
        debug_assert!(inner.files.len() <= self.capacity);
        self.metrics.open.set(inner.files.len() as i64);
        Ok(file)
    }

    fn forget(&self, id: u64) {
        let mut inner = self.inner.lock();
        if let Some((_, used)) = inner.files.remove(&id) {
            inner.by_use.remove(&used);
        }
        self.metrics.open.set(inner.files.len() as i64);
    }
}

impl CachedFile {
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.cache.get(self.id, &self.path)?.read_exact_at(buf, offset)
    }

    /// The file's size (opens it through the cache).
    pub fn size(&self) -> std::io::Result<u64> {
        Ok(self.cache.get(self.id, &self.path)?.metadata()?.len())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CachedFile {
    /// A layer no longer used (e.g. removed) gives its descriptor back.
    fn drop(&mut self) {
        self.cache.forget(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Descriptors open on files in `dir` (other tests run in parallel).
    fn open_fds(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.starts_with(dir))
            .count()
    }

    #[test]
    fn keeps_at_most_capacity_files_open() {
        let dir = std::env::temp_dir().join(format!("strata-filecache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cache = FileCache::new(8, CacheMetrics::default(), crate::clock::system());
        let files: Vec<CachedFile> = (0..200)
            .map(|i| {
                let p = dir.join(format!("f{i}"));
                std::fs::write(&p, format!("file number {i:05}")).unwrap();
                cache.file(&p)
            })
            .collect();
        let before = open_fds(&dir);
        for round in 0..3 {
            for (i, f) in files.iter().enumerate() {
                let mut buf = [0u8; 5];
                f.read_exact_at(&mut buf, 12).unwrap();
                assert_eq!(&buf, format!("{i:05}").as_bytes(), "round {round}");
                assert!(cache.len() <= 8);
            }
        }
        assert!(open_fds(&dir) <= before + 8, "descriptors stay bounded");
        // Recently used files stay open: a hot file is read without reopening.
        let opens = cache.metrics.opens.get();
        for _ in 0..100 {
            files[199].read_exact_at(&mut [0u8; 1], 0).unwrap();
        }
        assert_eq!(cache.metrics.opens.get(), opens);
        assert_eq!(cache.metrics.evictions.get(), opens - 8);
        // A missing file is an error naming nothing but the OS error; the caller adds the path.
        let gone = cache.file(&dir.join("missing"));
        assert_eq!(gone.read_exact_at(&mut [0u8; 1], 0).unwrap_err().kind(), std::io::ErrorKind::NotFound);
        drop(files);
        assert_eq!(cache.len(), 0, "dropped files give their descriptors back");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
