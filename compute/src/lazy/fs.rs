//! The lazy compute's file system (`docs/lazy-compute.md`): the shared
//! passthrough (`strata-fusefs`) over a backing directory that mirrors
//! `base/` or `global/`, with hooks that keep the block rules' state of
//! every relation file the manifest lists and fetch from the pageserver the
//! blocks a read needs that are not local.
//!
//! Relation files not in the manifest (created by this compute, or in the
//! basebackup's tar) and every other file are plain passthrough.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuser::Errno;
use parking_lot::Mutex;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::version::BLCKSZ;
use strata_formats::Lsn;
use strata_fusefs::{Hooks, Node, Result};
use strata_protocol::lazy_manifest::{ManifestEntry, ManifestFork};
use tracing::{debug, error, warn};

use super::cache::{Cache, Evictable};
use super::rules::{Eviction, ForkKind, SegmentRules, Source, SEGMENT_BLOCKS};
use crate::limits::READ_AHEAD_KB;

/// PostgreSQL's default and global tablespaces.
const DEFAULT_SPC: u32 = 1663;
const GLOBAL_SPC: u32 = 1664;
const BLOCK: u64 = BLCKSZ as u64;

/// Which directory of the data directory a mount serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mount {
    /// `base/`: paths `<database oid>/<file>`.
    Base,
    /// `global/`: paths `<file>`.
    Global,
}

/// Why the page source gave no pages.
#[derive(Debug)]
pub enum FetchError {
    /// The LSN is below the pageserver's GC cutoff: its versions may be gone.
    BelowGcCutoff(String),
    /// Anything else (after the source's own retries).
    Other(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::BelowGcCutoff(e) | FetchError::Other(e) => f.write_str(e),
        }
    }
}

/// Where the file system gets the blocks it does not hold.
pub trait PageSource: Send + Sync + 'static {
    /// The images of `blocks` of `rel`/`fork` as of `lsn`, one after
    /// another in that order (`blocks.len()` pages of `BLCKSZ` bytes).
    fn get_pages(
        &self,
        rel: RelFileNode,
        fork: ForkNumber,
        blocks: &[u32],
        lsn: Lsn,
    ) -> std::result::Result<Vec<u8>, FetchError>;

    /// How far the pageserver has ingested the timeline, now.
    fn latest_lsn(&self) -> std::result::Result<Lsn, String> {
        Err("this source cannot tell".into())
    }

    /// Another source took this one's place (a split's new shards): its
    /// reads under way stop retrying at their next failure, to be tried on
    /// the new one rather than wait for shards that are going away.
    fn retire(&self) {}
}

/// Counters of the file system, for the agent's status and metrics.
#[derive(Debug, Default)]
pub struct LazyStats {
    /// Blocks fetched from the pageserver.
    pub blocks_fetched: AtomicU64,
    /// Fetches that failed (each an EIO to PostgreSQL).
    pub fetch_errors: AtomicU64,
    /// Blocks fetched by a large sequential read for the first time and
    /// handed to the kernel without being kept in the cache.
    pub blocks_streamed: AtomicU64,
    /// The cache's counters.
    pub cache: Arc<super::cache::CacheStats>,
}

/// One relation segment file the manifest lists.
struct RemoteFile {
    rules: SegmentRules,
    rel: RelFileNode,
    fork: ForkNumber,
    /// The fork's block number of the file's block 0.
    first_block: u32,
    /// The backing file (absolute path). Opened for each use, never kept
    /// open: a database of many relations would otherwise hold a descriptor
    /// per segment file, past any limit.
    path: PathBuf,
    /// Whether the backing file exists yet: it is created when first
    /// looked up ([`LazyHooks::before_lookup`]), so a start does not create
    /// a file per relation.
    created: bool,
    /// Unlinked, or replaced by a create or a rename: nothing is stored in
    /// its backing file any more.
    gone: bool,
    /// The block after the furthest one read (sequential detection).
    next: u32,
    /// The prefetch window: 0 while reads are not sequential.
    window: u32,
    /// Blocks a request is fetching without the lock.
    in_flight: std::collections::HashSet<u32>,
    /// Blocks a large sequential read fetched and did not keep (see
    /// [`RemoteFile::keeps`]); allocated on the first such read.
    streamed: Option<Streamed>,
}

/// One bit per block of a segment file.
struct Streamed(Box<[u64]>);

impl Streamed {
    fn new() -> Streamed {
        Streamed(vec![0; SEGMENT_BLOCKS.div_ceil(64) as usize].into_boxed_slice())
    }

    fn get(&self, block: u32) -> bool {
        self.0.get(block as usize / 64).is_some_and(|w| w & (1 << (block % 64)) != 0)
    }

    fn set(&mut self, block: u32) {
        if let Some(w) = self.0.get_mut(block as usize / 64) {
            *w |= 1 << (block % 64);
        }
    }

    /// Forgets the blocks from `end` on (the file was cut there).
    fn cut(&mut self, end: u32) {
        let words = self.0.len();
        if !end.is_multiple_of(64) {
            if let Some(w) = self.0.get_mut(end as usize / 64) {
                *w &= (1 << (end % 64)) - 1;
            }
        }
        self.0[(end.div_ceil(64) as usize).min(words)..].fill(0);
    }
}

impl RemoteFile {
    /// The backing file, opened read-write (whatever the caller opened).
    fn backing(&self) -> std::io::Result<File> {
        if self.gone {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "the file was removed"));
        }
        OpenOptions::new().read(true).write(true).open(&self.path)
    }

    /// The backing file held in `slot`, opened there on first use (a
    /// request that touches several blocks opens it once); `why` names the
    /// use in the error logged when it cannot be opened.
    fn backing_once<'a>(&self, slot: &'a mut Option<File>, node: &Node, why: &str) -> Result<&'a File> {
        match slot {
            Some(f) => Ok(f),
            None => Ok(slot.insert(self.backing().map_err(|e| {
                error!(file = %node, "opening the backing file {why}: {e}");
                Errno::EIO
            })?)),
        }
    }

    /// The blocks to fetch ahead of a read of `blocks`: sequential reads
    /// (each starting near where the last ones ended, as one scan or the
    /// interleaved chunks of a parallel scan do) grow a window, and the
    /// blocks after the read are fetched once half the window is not local,
    /// so that each fetch is a batch of at least half a window.
    /// `max`: the largest window (a quarter of the cache, so that what is
    /// fetched ahead is still there when it is read).
    fn readahead(&mut self, blocks: &std::ops::Range<u32>, max: u32) -> std::ops::Range<u32> {
        let near = blocks.start <= self.next && blocks.start.saturating_add(crate::limits::PREFETCH_MAX) >= self.next;
        if near && blocks.start > 0 && max > 0 {
            self.window = (self.window * 2).clamp(crate::limits::PREFETCH_MIN.min(max), max);
            self.next = self.next.max(blocks.end);
        } else {
            self.window = 0;
            self.next = blocks.end;
        }
        // A read as large as the largest window is the kernel's own
        // read-ahead at work (a mount reads ahead a megabyte at a time):
        // fetching beyond it would only make part of the kernel's next read
        // local already, and that read could no longer be answered straight
        // from the pages fetched for it.
        if blocks.len() >= crate::limits::PREFETCH_MAX as usize {
            return blocks.end..blocks.end;
        }
        let ahead = blocks.end..blocks.end.saturating_add(self.window).min(self.rules.size());
        let remote = ahead.clone().filter(|b| matches!(self.rules.source(*b), Source::Remote(_))).count();
        if self.window > 0 && remote as u32 * 2 >= self.window {
            ahead
        } else {
            blocks.end..blocks.end
        }
    }

    /// The file's length set to `blocks`: the rules learn it, and blocks
    /// cut off are new blocks if the file grows back.
    fn set_size(&mut self, blocks: u32) {
        self.rules.set_size(blocks);
        if let Some(streamed) = &mut self.streamed {
            streamed.cut(blocks);
        }
    }

    /// Whether the cache keeps `blocks`, just fetched for a read of
    /// exactly them that is as large as [`crate::limits::PREFETCH_MAX`]: the kernel's
    /// read-ahead of a sequential scan. Its blocks are kept only if one of
    /// them was fetched that way before (the kernel's page cache let it go
    /// and the scan came back for it), so one pass over a large table does
    /// not push the working set out of the cache, as PostgreSQL's own ring
    /// buffers keep a large scan out of shared buffers. The blocks not kept
    /// stay remote: their next read fetches them again, as it would read
    /// them back after an eviction. Every other fetch is kept.
    fn keeps(&mut self, blocks: &[u32]) -> bool {
        let streamed = self.streamed.get_or_insert_with(Streamed::new);
        if blocks.iter().any(|b| streamed.get(*b)) {
            return true;
        }
        for &b in blocks {
            streamed.set(b);
        }
        false
    }
}

/// A listed file: its state, and a signal for requests waiting on blocks
/// another request is fetching.
struct FileEntry(Mutex<RemoteFile>, parking_lot::Condvar);

impl FileEntry {
    fn new(rf: RemoteFile) -> FileEntry {
        FileEntry(Mutex::new(rf), parking_lot::Condvar::new())
    }
}

impl Evictable for FileEntry {
    fn evict(&self, block: u32, ingested: Lsn, wait: bool) -> Eviction {
        // A request holds the lock while it waits on the pageserver: a
        // request's pass goes by, the cache's thread waits.
        let mut rf = match wait {
            true => self.0.lock(),
            false => match self.0.try_lock() {
                Some(rf) => rf,
                None => return Eviction::Waiting,
            },
        };
        let outcome = rf.rules.evict(block, ingested);
        if outcome == Eviction::Done {
            // The block reads from the pageserver from now on; a hole not
            // punched only costs disk (and a removed file has none to punch).
            let punched =
                rf.backing().and_then(|f| strata_fusefs::sys::punch_hole(&f, u64::from(block) * BLOCK, BLOCK));
            if let (Err(e), false) = (punched, rf.gone) {
                warn!(rel = ?rf.rel, block = rf.first_block + block, "punching a hole for an evicted block: {e}");
            }
        }
        outcome
    }
}

/// The hooks of one mount.
pub struct LazyHooks {
    mount: Mount,
    backing: PathBuf,
    files: Mutex<HashMap<PathBuf, Arc<FileEntry>>>,
    /// Listed files not created in the backing directory yet, by directory
    /// (relative to the mount): directory listings show them.
    pending: Mutex<HashMap<PathBuf, std::collections::HashSet<std::ffi::OsString>>>,
    /// Who owns the backing files created (PostgreSQL's user), if not us.
    owner: Option<(u32, u32)>,
    source: Arc<dyn PageSource>,
    stats: Arc<LazyStats>,
    cache: Arc<Cache>,
    /// Whether blocks may be read at the cache's read floor when it is
    /// past their rules' LSN, and who moves it.
    floor: ReadFloor,
}

/// Who moves a mount's read floor (`docs/lazy-compute.md`, rule 1;
/// `docs/replicas.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFloor {
    /// None: a read-only compute reads at its pinned LSN.
    Fixed,
    /// A writer's: the pageserver's ingested LSN, and its latest LSN when
    /// a read falls below the GC cutoff.
    Ingested,
    /// A replica's: set by the agent, never above the replay position;
    /// a read below the GC cutoff fails (it would read past replay).
    Replay,
}

/// The relation and fork a manifest entry lists.
pub fn entry_rel(e: &ManifestEntry) -> (RelFileNode, ForkNumber) {
    let rel = match e.db {
        None => RelFileNode { spc: GLOBAL_SPC, db: 0, rel: e.relfilenode },
        Some(db) => RelFileNode { spc: DEFAULT_SPC, db, rel: e.relfilenode },
    };
    let fork = match e.fork {
        ManifestFork::Main => ForkNumber::Main,
        ManifestFork::VisibilityMap => ForkNumber::VisibilityMap,
        ManifestFork::FreeSpaceMap => ForkNumber::Fsm,
    };
    (rel, fork)
}

/// The backing file's path (relative to the mount) of segment `segment` of
/// a manifest entry, and its relation, or `None` if the entry is not under
/// this mount.
fn segment_path(mount: Mount, e: &ManifestEntry, segment: u32) -> Option<(PathBuf, RelFileNode)> {
    let (dir, rel) = match (mount, e.db) {
        (Mount::Global, None) => ("global/", RelFileNode { spc: GLOBAL_SPC, db: 0, rel: e.relfilenode }),
        (Mount::Base, Some(db)) => ("base/", RelFileNode { spc: DEFAULT_SPC, db, rel: e.relfilenode }),
        _ => return None,
    };
    let first = e.path();
    let under_mount = first.strip_prefix(dir).expect("a manifest path starts with its directory");
    let name = if segment == 0 { under_mount.to_string() } else { format!("{under_mount}.{segment}") };
    Some((PathBuf::from(name), rel))
}

impl LazyHooks {
    /// Hooks over `backing` (which holds the basebackup's files of this
    /// mount) that serve every segment of every listed fork under this
    /// mount, its blocks read from `source` at `start`. Each is created in
    /// the backing directory when first looked up, as a sparse file of the
    /// manifest's size owned by `owner` if given; until then directory
    /// listings show it. `cache` bounds the blocks kept (it may be shared
    /// with other mounts).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mount: Mount,
        backing: PathBuf,
        entries: &[ManifestEntry],
        start: Lsn,
        owner: Option<(u32, u32)>,
        source: Arc<dyn PageSource>,
        stats: Arc<LazyStats>,
        cache: Arc<Cache>,
    ) -> std::io::Result<LazyHooks> {
        let mut files = HashMap::new();
        let mut pending: HashMap<PathBuf, std::collections::HashSet<std::ffi::OsString>> = HashMap::new();
        for e in entries {
            let (fork, kind) = match e.fork {
                ManifestFork::Main => (ForkNumber::Main, ForkKind::Main),
                ManifestFork::VisibilityMap => (ForkNumber::VisibilityMap, ForkKind::VisibilityMap),
                ManifestFork::FreeSpaceMap => (ForkNumber::Fsm, ForkKind::FreeSpaceMap),
            };
            // Every segment up to the one holding the last block; an empty
            // fork still has its first segment file.
            let segments = e.blocks.div_ceil(SEGMENT_BLOCKS).max(1);
            for segment in 0..segments {
                let Some((rel_path, rel)) = segment_path(mount, e, segment) else { break };
                let first_block = segment * SEGMENT_BLOCKS;
                let blocks = (e.blocks - first_block.min(e.blocks)).min(SEGMENT_BLOCKS);
                let dir = rel_path.parent().map(Path::to_path_buf).unwrap_or_default();
                let name = rel_path.file_name().expect("a segment path names a file").to_os_string();
                if !pending.contains_key(&dir) && !backing.join(&dir).is_dir() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{}: no directory for the listed file {}", backing.display(), rel_path.display()),
                    ));
                }
                pending.entry(dir).or_default().insert(name);
                let rules = SegmentRules::remote(kind, blocks, start);
                let rf = RemoteFile {
                    rules,
                    rel,
                    fork,
                    first_block,
                    path: backing.join(&rel_path),
                    created: false,
                    gone: false,
                    next: 0,
                    window: 0,
                    in_flight: Default::default(),
                    streamed: None,
                };
                files.insert(rel_path, Arc::new(FileEntry::new(rf)));
            }
        }
        Ok(LazyHooks {
            mount,
            backing,
            files: Mutex::new(files),
            pending: Mutex::new(pending),
            owner,
            source,
            stats,
            cache,
            floor: ReadFloor::Fixed,
        })
    }

    /// Lets reads go to the read floor, moved as `floor` says (see `get`).
    pub fn with_floor(mut self, floor: ReadFloor) -> LazyHooks {
        self.floor = floor;
        self
    }

    /// The mount's directory of the data directory.
    pub fn mount(&self) -> Mount {
        self.mount
    }

    /// The backing directory.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// How many listed files the mount holds rules for.
    pub fn remote_files(&self) -> usize {
        self.files.lock().len()
    }

    fn remote(&self, node: &Node) -> Option<Arc<FileEntry>> {
        let path = node.path.as_ref()?;
        self.files.lock().get(path).cloned()
    }

    /// Creates `rf`'s backing file (at `path`, relative to the mount): a
    /// sparse file of its size. The file's lock is held.
    fn create_backing(&self, path: &Path, rf: &mut RemoteFile) -> std::io::Result<()> {
        let file = OpenOptions::new().write(true).create_new(true).open(&rf.path)?;
        file.set_len(u64::from(rf.rules.size()) * BLOCK)?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        rf.created = true;
        self.forget_pending(path);
        Ok(())
    }

    /// `path` (relative to the mount) is no longer a file to list.
    fn forget_pending(&self, path: &Path) {
        let dir = path.parent().unwrap_or(Path::new(""));
        if let (Some(names), Some(name)) = (self.pending.lock().get_mut(dir), path.file_name()) {
            names.remove(name);
        }
    }

    /// Takes `path`'s entry out of the listed files: its backing file is
    /// gone or is another file now.
    fn forget(&self, path: &Path) -> Option<Arc<FileEntry>> {
        let entry = self.files.lock().remove(path)?;
        self.forget_pending(path);
        entry.0.lock().gone = true;
        Some(entry)
    }

    /// The pages of `wanted` (file blocks by the LSN their rules name)
    /// from the page source, checked, each group with the LSN it was read
    /// at: the rules' LSN or, unless the floor is fixed, the read floor if
    /// later (`docs/lazy-compute.md`, rule 1). A writer's read refused as
    /// below the GC cutoff moves the floor to the pageserver's latest LSN
    /// and is tried once more. The file's lock need not be held.
    fn get(
        &self,
        node: &Node,
        (rel, fork, first_block): (RelFileNode, ForkNumber, u32),
        wanted: &BTreeMap<Lsn, Vec<u32>>,
    ) -> Result<Vec<(Lsn, Vec<u8>)>> {
        let mut out = Vec::new();
        for (lsn, blocks) in wanted {
            let fork_blocks: Vec<u32> = blocks.iter().map(|b| first_block + b).collect();
            let floating = self.floor != ReadFloor::Fixed;
            let mut at = if floating { (*lsn).max(self.cache.floor()) } else { *lsn };
            let mut result = self.source.get_pages(rel, fork, &fork_blocks, at);
            if let (Err(FetchError::BelowGcCutoff(e)), ReadFloor::Ingested) = (&result, self.floor) {
                match self.source.latest_lsn() {
                    Ok(latest) => {
                        warn!(file = %node, %at, %latest, "reading at the pageserver's latest LSN: {e}");
                        self.cache.set_floor(latest);
                        at = (*lsn).max(self.cache.floor());
                        result = self.source.get_pages(rel, fork, &fork_blocks, at);
                    }
                    Err(le) => warn!(file = %node, "{e}; asking for the latest LSN: {le}"),
                }
            }
            match result {
                Ok(pages) if pages.len() == blocks.len() * BLCKSZ => {
                    self.stats.blocks_fetched.fetch_add(blocks.len() as u64, Ordering::Relaxed);
                    out.push((at, pages));
                }
                Ok(pages) => {
                    self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
                    error!(file = %node, %at, asked = blocks.len(), got_bytes = pages.len(), "the page source answered wrong");
                    return Err(Errno::EIO);
                }
                Err(e) => {
                    self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(file = %node, %at, first = fork_blocks[0], blocks = blocks.len(), "fetching pages: {e}");
                    return Err(Errno::EIO);
                }
            }
        }
        Ok(out)
    }

    /// Stores fetched `pages` of `wanted` in the backing file, each only if
    /// its block is still remote at the LSN it was fetched at (a write, a
    /// truncation or another fetch may have come first); adds the blocks
    /// stored to `fetched`, and returns how many that was.
    fn store(
        &self,
        node: &Node,
        rf: &mut RemoteFile,
        wanted: &BTreeMap<Lsn, Vec<u32>>,
        got: &[(Lsn, Vec<u8>)],
        fetched: &mut Vec<u32>,
    ) -> Result<usize> {
        let before = fetched.len();
        let mut file: Option<File> = None;
        for ((lsn, blocks), (at, pages)) in wanted.iter().zip(got) {
            debug_assert_eq!(pages.len(), blocks.len() * BLCKSZ, "`get` checks the source's answer");
            // Runs of blocks that are consecutive in the file and still
            // remote go to the backing file in one write, straight from
            // the pages as they came.
            let mut i = 0;
            while i < blocks.len() {
                if rf.rules.source(blocks[i]) != Source::Remote(*lsn) {
                    i += 1;
                    continue;
                }
                let mut end = i + 1;
                while end < blocks.len()
                    && blocks[end] == blocks[end - 1] + 1
                    && rf.rules.source(blocks[end]) == Source::Remote(*lsn)
                {
                    end += 1;
                }
                let bytes = &pages[i * BLCKSZ..end * BLCKSZ];
                let f = rf.backing_once(&mut file, node, "to store fetched pages")?;
                f.write_all_at(bytes, u64::from(blocks[i]) * BLOCK).map_err(|e| {
                    error!(file = %node, block = blocks[i], "storing fetched pages: {e}");
                    Errno::EIO
                })?;
                for &b in &blocks[i..end] {
                    rf.rules.fetched(b, *at);
                    fetched.push(b);
                }
                i = end;
            }
        }
        Ok(fetched.len() - before)
    }

    /// Fetches the blocks in `blocks` whose rules say they are remote and
    /// stores them, the file's lock held throughout (for a partial write:
    /// the block must be local before the write's bytes land on it).
    fn fetch(
        &self,
        node: &Node,
        rf: &mut RemoteFile,
        blocks: impl Iterator<Item = u32>,
        fetched: &mut Vec<u32>,
    ) -> Result<()> {
        let mut wanted: BTreeMap<Lsn, Vec<u32>> = BTreeMap::new();
        for b in blocks {
            if let Source::Remote(lsn) = rf.rules.source(b) {
                wanted.entry(lsn).or_default().push(b);
            }
        }
        let pages = self.get(node, (rf.rel, rf.fork, rf.first_block), &wanted)?;
        self.store(node, rf, &wanted, &pages, fetched).map(|_| ())
    }

    /// Makes the remote blocks of `demanded` local, fetching them with the
    /// blocks `ahead` without holding the file's lock, so that readers of
    /// other blocks of the file (a parallel scan's workers) go on; blocks
    /// another request is fetching are waited for. Returns with the lock
    /// held and every block of `demanded` local or not remote, and, when
    /// one fetch of this call got and stored every block of `demanded` at
    /// one LSN, their bytes (the read is answered from them instead of reading back
    /// what was just written). `bulk`: the read is a block-aligned read of
    /// the kernel's read-ahead size, whose blocks, when fetched exactly for
    /// it, the cache may decline ([`RemoteFile::keeps`]); they are then
    /// answered from the bytes fetched and stay remote.
    #[allow(clippy::too_many_arguments)]
    fn make_local<'a>(
        &self,
        node: &Node,
        entry: &'a FileEntry,
        mut rf: parking_lot::MutexGuard<'a, RemoteFile>,
        demanded: std::ops::Range<u32>,
        ahead: std::ops::Range<u32>,
        bulk: bool,
        fetched: &mut Vec<u32>,
    ) -> Result<(parking_lot::MutexGuard<'a, RemoteFile>, Option<Vec<u8>>)> {
        let mut ahead = Some(ahead);
        loop {
            let mut missing = demanded.clone().filter(|b| matches!(rf.rules.source(*b), Source::Remote(_))).peekable();
            if missing.peek().is_none() {
                return Ok((rf, None));
            }
            let mut mine: BTreeMap<Lsn, Vec<u32>> = BTreeMap::new();
            let candidates: Vec<u32> = missing.chain(ahead.take().into_iter().flatten()).collect();
            for b in candidates {
                if let Source::Remote(lsn) = rf.rules.source(b) {
                    if rf.in_flight.insert(b) {
                        mine.entry(lsn).or_default().push(b);
                    }
                }
            }
            if mine.is_empty() {
                // Every missing block is on its way in another request.
                entry.1.wait_for(&mut rf, std::time::Duration::from_secs(1));
                continue;
            }
            let which = (rf.rel, rf.fork, rf.first_block);
            let pages = parking_lot::MutexGuard::unlocked(&mut rf, || self.get(node, which, &mine));
            for blocks in mine.values() {
                for b in blocks {
                    rf.in_flight.remove(b);
                }
            }
            entry.1.notify_all();
            let mut pages = pages?;
            // Exactly the blocks of the read, each still remote at the LSN
            // it was fetched for (nothing wrote, cut or stored it meanwhile).
            let exact = match mine.first_key_value() {
                Some((lsn, blocks)) if mine.len() == 1 => {
                    blocks.iter().copied().eq(demanded.clone())
                        && blocks.iter().all(|b| rf.rules.source(*b) == Source::Remote(*lsn))
                }
                _ => false,
            };
            if bulk && exact && !rf.keeps(&mine.values().next().expect("one group")[..]) {
                self.stats.blocks_streamed.fetch_add(demanded.len() as u64, Ordering::Relaxed);
                let (_, bytes) = pages.pop().expect("one group");
                debug_assert_eq!(bytes.len(), demanded.len() * BLCKSZ);
                return Ok((rf, Some(bytes)));
            }
            let stored = self.store(node, &mut rf, &mine, &pages, fetched)?;
            // One group that starts with all of `demanded`, every block of
            // it stored just now: the group's first bytes are the read's
            // answer, as the backing file holds them.
            let one_group = if mine.len() == 1 { mine.values().next() } else { None };
            let whole = one_group.is_some_and(|blocks| {
                stored == blocks.len() && blocks.iter().copied().take(demanded.len()).eq(demanded.clone())
            });
            if whole {
                let (_, mut bytes) = pages.pop().expect("one group");
                bytes.truncate(demanded.len() * BLCKSZ);
                return Ok((rf, Some(bytes)));
            }
        }
    }

    /// Tells the rules about a write of `data` at `offset` before it lands
    /// (the file's lock held); adds the blocks that became local and
    /// evictable to `admitted`.
    fn learn_write(
        &self,
        node: &Node,
        rf: &mut RemoteFile,
        offset: u64,
        data: &[u8],
        admitted: &mut Vec<u32>,
    ) -> Result<()> {
        let end = offset + data.len() as u64;
        let first = u32::try_from(offset / BLOCK).map_err(|_| Errno::EFBIG)?;
        let last = u32::try_from(end.div_ceil(BLOCK)).map_err(|_| Errno::EFBIG)?;
        if last > SEGMENT_BLOCKS {
            return Err(Errno::EFBIG);
        }
        // Blocks only partly written keep the rest of their bytes: those
        // must be local first.
        let size = rf.rules.size();
        for b in [first, last.saturating_sub(1)] {
            let start = u64::from(b) * BLOCK;
            if b < size && (offset > start || end < start + BLOCK) {
                if rf.rules.source(b) == Source::Failed {
                    // The rest of the block is lost with an earlier write.
                    return Err(Errno::EIO);
                }
                self.fetch(node, rf, b..b + 1, admitted)?;
            }
        }
        let mut page = vec![0u8; BLCKSZ];
        let mut file: Option<File> = None;
        for b in first..last {
            let was_evictable = rf.rules.evictable(b, Lsn(u64::MAX)).is_some();
            let start = u64::from(b) * BLOCK;
            let whole = offset <= start && start + BLOCK <= end;
            if whole {
                let at = (start - offset) as usize;
                rf.rules.write(b, &data[at..at + BLCKSZ]);
            } else {
                page.fill(0);
                if b < size {
                    let f = rf.backing_once(&mut file, node, "to merge a partial write")?;
                    let mut read = 0;
                    while read < BLCKSZ {
                        match f.read_at(&mut page[read..], start + read as u64) {
                            Ok(0) => break,
                            Ok(n) => read += n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                error!(file = %node, block = b, "reading a block to merge a partial write: {e}");
                                return Err(Errno::EIO);
                            }
                        }
                    }
                }
                let from = offset.max(start);
                let to = end.min(start + BLOCK);
                page[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                rf.rules.write_part(b, &page);
            }
            // Once the pageserver has its version, the cache may drop it. A
            // block pinned by a partial write and whole again may still be
            // in the ring: a second entry finds it gone or evicts it once.
            if !was_evictable && rf.rules.evictable(b, Lsn(u64::MAX)).is_some() {
                admitted.push(b);
            }
        }
        Ok(())
    }
}

/// Mounts `hooks`' backing directory at `mountpoint`. As root, every user
/// may use the mount (PostgreSQL runs as its own user) and the kernel
/// checks permissions against the backing files' modes. The mount lasts
/// until the returned session is unmounted or dropped.
pub fn mount(mountpoint: &Path, hooks: LazyHooks) -> std::io::Result<fuser::BackgroundSession> {
    // Nothing but this mount changes the backing directory.
    // PostgreSQL keeps up to max_files_per_process files open in every
    // process, and each open is a backing file here: without a bound, a
    // database of many relations takes more descriptors than this process
    // may have. Half the limit for them, half for everything else.
    let limit = strata_service::config::raise_open_file_limit();
    let max_open = usize::try_from(limit / 2).unwrap_or(usize::MAX).max(crate::limits::LAZY_MIN_OPEN_FILES);
    let fs = strata_fusefs::Passthrough::new(hooks.backing.clone(), hooks)
        .exclusive(crate::limits::KERNEL_CACHE_TTL)
        .writeback_cache()
        .max_open_files(max_open);
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("strata-lazy".into())];
    if strata_fusefs::sys::effective_ids().0 == 0 {
        config.acl = fuser::SessionACL::All;
        config.mount_options.push(fuser::MountOption::DefaultPermissions);
    }
    // Several threads: a read waiting on the pageserver does not hold up
    // the others (each file has its own lock).
    config.n_threads = Some(crate::limits::LAZY_FS_THREADS);
    let session = fuser::Session::new(fs, mountpoint, &config)?.spawn()?;
    if let Err(e) = set_read_ahead(mountpoint) {
        debug!(mount = %mountpoint.display(), "keeping the kernel's read-ahead: {e}");
    }
    Ok(session)
}

/// Sets the mount's read-ahead through its backing device info in sysfs
/// (root only; elsewhere the default stays).
fn set_read_ahead(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint)?.dev();
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    std::fs::write(path, format!("{READ_AHEAD_KB}\n"))
}

/// The blocks of a file of `size` bytes.
fn size_blocks(size: u64) -> u32 {
    u32::try_from(size.div_ceil(BLOCK)).unwrap_or(u32::MAX).min(SEGMENT_BLOCKS)
}

/// The blocks `[offset, offset + len)` touches, cut at `size` blocks.
fn block_range(offset: u64, len: u64, size: u32) -> std::ops::Range<u32> {
    if len == 0 {
        return 0..0;
    }
    let first = u32::try_from(offset / BLOCK).unwrap_or(u32::MAX);
    let end = u32::try_from((offset + len).div_ceil(BLOCK)).unwrap_or(u32::MAX);
    first.min(size)..end.min(size)
}

impl Hooks for LazyHooks {
    fn serve_read(
        &self,
        node: &Node,
        _file: &File,
        offset: u64,
        size: u32,
        read: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let Some(entry) = self.remote(node) else { return read() };
        let mut admitted = Vec::new();
        let data = {
            let mut rf = entry.0.lock();
            let blocks = block_range(offset, u64::from(size), rf.rules.size());
            if let Some(b) = blocks.clone().find(|b| rf.rules.source(*b) == Source::Failed) {
                error!(file = %node, block = b, "reading a block whose last write failed");
                return Err(Errno::EIO);
            }
            let max = u32::try_from(self.cache.budget() / 4).unwrap_or(u32::MAX).min(crate::limits::PREFETCH_MAX);
            let ahead = rf.readahead(&blocks, max);
            let aligned =
                offset == u64::from(blocks.start) * BLOCK && u64::from(size) == u64::from(blocks.len() as u32) * BLOCK;
            let bulk = aligned && blocks.len() >= crate::limits::PREFETCH_MAX as usize;
            let (mut rf, fetched) = self.make_local(node, &entry, rf, blocks.clone(), ahead, bulk, &mut admitted)?;
            for b in blocks.clone() {
                rf.rules.touch(b);
            }
            match fetched {
                // Exactly the blocks just fetched: their bytes as they came.
                Some(bytes) if aligned => bytes,
                // Under the lock: the cache's hand cannot drop a block while
                // its bytes are being read.
                _ => read()?,
            }
        };
        let entry: Arc<dyn Evictable> = entry;
        self.cache.admit(&entry, &admitted);
        Ok(data)
    }

    fn serve_write(
        &self,
        node: &Node,
        _file: &File,
        offset: u64,
        data: &[u8],
        _sync: bool,
        write: &mut dyn FnMut() -> Result<u32>,
    ) -> Result<u32> {
        let Some(entry) = self.remote(node) else { return write() };
        let mut admitted = Vec::new();
        let written = {
            let mut rf = entry.0.lock();
            // Under the lock, so that no read fetches over these bytes.
            let result = self.learn_write(node, &mut rf, offset, data, &mut admitted).and_then(|()| write());
            match result {
                Ok(n) if n as usize == data.len() => n,
                failed => {
                    // With the write-back cache the writer has gone on, and
                    // the kernel may drop these pages: a later read must
                    // fail, not return an older version or a hole.
                    let first = offset / BLOCK;
                    let last = (offset + data.len() as u64).div_ceil(BLOCK).min(u64::from(SEGMENT_BLOCKS));
                    for b in first..last {
                        rf.rules.failed(b as u32);
                    }
                    error!(file = %node, offset, len = data.len(), "a write did not reach the backing file: {failed:?}");
                    failed?
                }
            }
        };
        let entry: Arc<dyn Evictable> = entry;
        self.cache.admit(&entry, &admitted);
        Ok(written)
    }

    fn serve_set_size(&self, node: &Node, size: u64, set: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let Some(entry) = self.remote(node) else { return set() };
        // Under the lock: pages fetched without it are not stored between
        // the new size and the rules learning it (they would grow the
        // file back past its end).
        let mut rf = entry.0.lock();
        set()?;
        rf.set_size(size_blocks(size));
        Ok(())
    }

    fn after_set_size(&self, node: &Node, size: u64) {
        // O_TRUNC on open: the size was set before the rules could learn
        // it, and pages fetched meanwhile may have been stored past it; the
        // file is cut again once none can be.
        let Some(entry) = self.remote(node) else { return };
        let mut rf = entry.0.lock();
        rf.set_size(size_blocks(size));
        if let Ok(file) = rf.backing() {
            if file.metadata().is_ok_and(|m| m.len() > size) {
                if let Err(e) = file.set_len(size) {
                    error!(file = %node, size, "cutting a truncated file again: {e}");
                }
            }
        }
    }

    fn after_create(&self, node: &Node) {
        // A file created now is local for good (rule 5), whatever was
        // listed under its name before.
        if let Some(path) = &node.path {
            self.forget(path);
        }
    }

    fn after_unlink(&self, path: &Path) {
        self.forget(path);
    }

    fn after_rename(&self, from: &Path, to: &Path) {
        self.forget(to);
        let Some(entry) = self.files.lock().remove(from) else { return };
        {
            let mut rf = entry.0.lock();
            rf.path = self.backing.join(to);
            // Renamed before it was ever looked up (nothing does): it exists
            // under its new name only once created there.
            if !rf.created {
                rf.gone = true;
            }
        }
        self.forget_pending(from);
        self.files.lock().insert(to.to_path_buf(), entry);
    }

    fn before_lookup(&self, path: &Path) -> Result<()> {
        let Some(entry) = self.files.lock().get(path).cloned() else { return Ok(()) };
        let mut rf = entry.0.lock();
        if rf.created || rf.gone {
            return Ok(());
        }
        self.create_backing(path, &mut rf).map_err(|e| {
            error!(file = %path.display(), "creating the backing file of a listed file: {e}");
            Errno::EIO
        })
    }

    fn pending_entries(&self, dir: &Path) -> Vec<std::ffi::OsString> {
        self.pending.lock().get(dir).map(|names| names.iter().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ranges() {
        assert_eq!(block_range(0, 8192, 10), 0..1);
        assert_eq!(block_range(0, 128 * 1024, 10), 0..10);
        assert_eq!(block_range(8191, 2, 10), 0..2);
        assert_eq!(block_range(8192 * 12, 8192, 10), 10..10);
        assert_eq!(block_range(5, 0, 10), 0..0);
    }

    fn remote_file(blocks: u32) -> RemoteFile {
        let rel = RelFileNode { spc: DEFAULT_SPC, db: 5, rel: 1000 };
        let rules = SegmentRules::remote(ForkKind::Main, blocks, Lsn(0x100));
        RemoteFile {
            rules,
            rel,
            fork: ForkNumber::Main,
            first_block: 0,
            path: PathBuf::from("/nonexistent/5/1000"),
            created: false,
            gone: false,
            next: 0,
            window: 0,
            in_flight: Default::default(),
            streamed: None,
        }
    }

    #[test]
    fn sequential_reads_grow_a_window_and_fetch_it_in_batches() {
        let mut f = remote_file(1000);
        // The first read of a file, and a random one, fetch nothing ahead.
        assert_eq!(f.readahead(&(0..1), 256), 1..1);
        assert_eq!(f.readahead(&(500..501), 256), 501..501);
        // Reads that go on where the last ended: 16, 32, 64, ... blocks ahead.
        assert_eq!(f.readahead(&(501..502), 256), 502..518);
        // Half of the next window is not local (nothing was stored): fetch it.
        assert_eq!(f.readahead(&(502..503), 256), 503..535);
        // Once the window (64 now) is mostly local, reads go on without fetching.
        for b in 503..550 {
            f.rules.fetched(b, Lsn(0x100));
        }
        assert_eq!(f.readahead(&(503..504), 256), 504..504);
        // The window stops at the largest, and at the end of the file.
        for b in 504..700 {
            f.readahead(&(b..b + 1), 64);
        }
        assert_eq!(f.window, 64);
        assert_eq!(f.readahead(&(990..1000), 64), 1000..1000);
        // Interleaved chunks of a parallel scan count as sequential.
        let mut f = remote_file(1000);
        f.readahead(&(0..8), 256);
        f.readahead(&(16..24), 256);
        assert_eq!(f.readahead(&(8..16), 256), 16..32, "behind the furthest read, within a window");
        // Reads as large as the largest window fetch nothing ahead, but count
        // as sequential for the smaller reads after them.
        let mut f = remote_file(1000);
        assert_eq!(f.readahead(&(0..128), 256), 128..128);
        assert_eq!(f.readahead(&(128..256), 256), 256..256);
        assert_eq!(f.readahead(&(256..257), 256), 257..289);
        // A cache too small to prefetch into.
        let mut f = remote_file(1000);
        f.readahead(&(0..1), 0);
        assert_eq!(f.readahead(&(1..2), 0), 2..2);
    }

    #[test]
    fn a_large_read_is_kept_once_its_blocks_come_back_and_a_cut_forgets_them() {
        let run = |from: u32, to: u32| (from..to).collect::<Vec<u32>>();
        let mut f = remote_file(1000);
        assert!(!f.keeps(&run(0, 128)));
        assert!(!f.keeps(&run(128, 256)));
        assert!(f.keeps(&run(100, 228)), "blocks streamed before come back");
        assert!(!f.keeps(&run(256, 384)));
        // Cut to 130 blocks and grown again: the blocks cut off are new.
        f.set_size(130);
        f.set_size(1000);
        assert!(!f.keeps(&run(130, 258)));
        assert!(f.keeps(&run(0, 128)));
        assert_eq!(f.rules.source(500), Source::Zero);

        let mut s = Streamed::new();
        for b in [0, 63, 64, 65, 127, 128, SEGMENT_BLOCKS - 1] {
            s.set(b);
        }
        s.cut(65);
        assert_eq!([0, 63, 64, 65, 127, 128].map(|b| s.get(b)), [true, true, true, false, false, false]);
        assert!(!s.get(SEGMENT_BLOCKS - 1));
        s.cut(64);
        assert!(s.get(63) && !s.get(64));
        s.cut(0);
        assert!(!s.get(0) && !s.get(63));
        assert!(!s.get(SEGMENT_BLOCKS), "past the segment: never set");
    }

    #[test]
    fn segment_paths() {
        let e = ManifestEntry { db: Some(5), relfilenode: 1249, fork: ManifestFork::VisibilityMap, blocks: 1 };
        assert_eq!(segment_path(Mount::Base, &e, 0).unwrap().0, PathBuf::from("5/1249_vm"));
        assert_eq!(segment_path(Mount::Base, &e, 2).unwrap().0, PathBuf::from("5/1249_vm.2"));
        assert_eq!(segment_path(Mount::Global, &e, 0), None);
        let g = ManifestEntry { db: None, relfilenode: 1262, fork: ManifestFork::Main, blocks: 1 };
        let (path, rel) = segment_path(Mount::Global, &g, 0).unwrap();
        assert_eq!((path, rel), (PathBuf::from("1262"), RelFileNode { spc: GLOBAL_SPC, db: 0, rel: 1262 }));
        assert_eq!(segment_path(Mount::Base, &g, 0), None);
    }
}
