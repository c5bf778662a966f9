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
use tracing::{error, warn};

use super::rules::{ForkKind, SegmentRules, Source, SEGMENT_BLOCKS};

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

/// Where the file system gets the blocks it does not hold.
pub trait PageSource: Send + Sync + 'static {
    /// The images of `blocks` of `rel`/`fork` as of `lsn`, in that order.
    fn get_pages(
        &self,
        rel: RelFileNode,
        fork: ForkNumber,
        blocks: &[u32],
        lsn: Lsn,
    ) -> std::result::Result<Vec<Vec<u8>>, String>;
}

/// Counters of the file system, for the agent's status and metrics.
#[derive(Debug, Default)]
pub struct LazyStats {
    /// Blocks fetched from the pageserver.
    pub blocks_fetched: AtomicU64,
    /// Fetches that failed (each an EIO to PostgreSQL).
    pub fetch_errors: AtomicU64,
}

/// One relation segment file the manifest lists.
struct RemoteFile {
    rules: SegmentRules,
    rel: RelFileNode,
    fork: ForkNumber,
    /// The fork's block number of the file's block 0.
    first_block: u32,
    /// Read-write, whatever the caller opened: fetched blocks are stored here.
    file: File,
}

/// The hooks of one mount.
pub struct LazyHooks {
    mount: Mount,
    backing: PathBuf,
    files: Mutex<HashMap<PathBuf, Arc<Mutex<RemoteFile>>>>,
    source: Arc<dyn PageSource>,
    stats: Arc<LazyStats>,
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
    /// mount): creates a sparse backing file of the manifest's size for
    /// every segment of every listed fork under this mount, owned by
    /// `owner` if given, whose blocks are read from `source` at `start`.
    pub fn new(
        mount: Mount,
        backing: PathBuf,
        entries: &[ManifestEntry],
        start: Lsn,
        owner: Option<(u32, u32)>,
        source: Arc<dyn PageSource>,
        stats: Arc<LazyStats>,
    ) -> std::io::Result<LazyHooks> {
        let mut files = HashMap::new();
        for e in entries {
            let (fork, kind) = match e.fork {
                ManifestFork::Main => (ForkNumber::Main, ForkKind::Main),
                ManifestFork::VisibilityMap => (ForkNumber::VisibilityMap, ForkKind::VisibilityMap),
            };
            // Every segment up to the one holding the last block; an empty
            // fork still has its first segment file.
            let segments = e.blocks.div_ceil(SEGMENT_BLOCKS).max(1);
            for segment in 0..segments {
                let Some((rel_path, rel)) = segment_path(mount, e, segment) else { break };
                let first_block = segment * SEGMENT_BLOCKS;
                let blocks = (e.blocks - first_block.min(e.blocks)).min(SEGMENT_BLOCKS);
                let path = backing.join(&rel_path);
                let io = |what: &str, err: std::io::Error| {
                    std::io::Error::new(err.kind(), format!("{what} {}: {err}", path.display()))
                };
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|err| io("creating", err))?;
                file.set_len(u64::from(blocks) * BLOCK).map_err(|err| io("sizing", err))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(|err| io("chown", err))?;
                }
                let rules = SegmentRules::remote(kind, blocks, start);
                files.insert(rel_path, Arc::new(Mutex::new(RemoteFile { rules, rel, fork, first_block, file })));
            }
        }
        Ok(LazyHooks { mount, backing, files: Mutex::new(files), source, stats })
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

    fn remote(&self, node: &Node) -> Option<Arc<Mutex<RemoteFile>>> {
        let path = node.path.as_ref()?;
        self.files.lock().get(path).cloned()
    }

    /// Fetches the blocks in `blocks` whose rules say they are remote and
    /// stores them in the backing file (the file's lock held: a write of
    /// the same block waits for this and then overwrites it).
    fn fetch(&self, node: &Node, rf: &mut RemoteFile, blocks: std::ops::Range<u32>) -> Result<()> {
        let mut wanted: BTreeMap<Lsn, Vec<u32>> = BTreeMap::new();
        for b in blocks {
            if let Source::Remote(lsn) = rf.rules.source(b) {
                wanted.entry(lsn).or_default().push(b);
            }
        }
        for (lsn, blocks) in wanted {
            let fork_blocks: Vec<u32> = blocks.iter().map(|b| rf.first_block + b).collect();
            let pages = match self.source.get_pages(rf.rel, rf.fork, &fork_blocks, lsn) {
                Ok(pages) if pages.len() == blocks.len() && pages.iter().all(|p| p.len() == BLCKSZ) => pages,
                Ok(pages) => {
                    self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
                    error!(file = %node, %lsn, asked = blocks.len(), got = pages.len(), "the page source answered wrong");
                    return Err(Errno::EIO);
                }
                Err(e) => {
                    self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(file = %node, %lsn, first = fork_blocks[0], blocks = blocks.len(), "fetching pages: {e}");
                    return Err(Errno::EIO);
                }
            };
            for (b, page) in blocks.iter().zip(&pages) {
                rf.file.write_all_at(page, u64::from(*b) * BLOCK).map_err(|e| {
                    error!(file = %node, block = b, "storing a fetched page: {e}");
                    Errno::EIO
                })?;
                rf.rules.fetched(*b, lsn);
            }
            self.stats.blocks_fetched.fetch_add(blocks.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Mounts `hooks`' backing directory at `mountpoint`. As root, every user
/// may use the mount (PostgreSQL runs as its own user) and the kernel
/// checks permissions against the backing files' modes. The mount lasts
/// until the returned session is unmounted or dropped.
pub fn mount(mountpoint: &Path, hooks: LazyHooks) -> std::io::Result<fuser::BackgroundSession> {
    let fs = strata_fusefs::Passthrough::new(hooks.backing.clone(), hooks);
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("strata-lazy".into())];
    if strata_fusefs::sys::effective_ids().0 == 0 {
        config.acl = fuser::SessionACL::All;
        config.mount_options.push(fuser::MountOption::DefaultPermissions);
    }
    // Several threads: a read waiting on the pageserver does not hold up
    // the others (each file has its own lock).
    config.n_threads = Some(4);
    fuser::Session::new(fs, mountpoint, &config)?.spawn()
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
    fn before_read(&self, node: &Node, _file: &File, offset: u64, size: u32) -> Result<()> {
        let Some(rf) = self.remote(node) else { return Ok(()) };
        let mut rf = rf.lock();
        let blocks = block_range(offset, u64::from(size), rf.rules.size());
        self.fetch(node, &mut rf, blocks)
    }

    fn before_write(&self, node: &Node, _file: &File, offset: u64, data: &[u8], _sync: bool) -> Result<()> {
        let Some(rf) = self.remote(node) else { return Ok(()) };
        let mut rf = rf.lock();
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
                self.fetch(node, &mut rf, b..b + 1)?;
            }
        }
        // The rules learn each block's new content now, under the lock, so
        // that no read fetches over it once the write lands.
        let mut page = vec![0u8; BLCKSZ];
        for b in first..last {
            let start = u64::from(b) * BLOCK;
            let whole = offset <= start && start + BLOCK <= end;
            if whole {
                let at = (start - offset) as usize;
                rf.rules.write(b, &data[at..at + BLCKSZ]);
                continue;
            }
            page.fill(0);
            if b < size {
                let mut read = 0;
                while read < BLCKSZ {
                    match rf.file.read_at(&mut page[read..], start + read as u64) {
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
            rf.rules.write(b, &page);
        }
        Ok(())
    }

    fn after_set_size(&self, node: &Node, size: u64) {
        let Some(rf) = self.remote(node) else { return };
        let blocks = u32::try_from(size.div_ceil(BLOCK)).unwrap_or(u32::MAX).min(SEGMENT_BLOCKS);
        rf.lock().rules.set_size(blocks);
    }

    fn after_create(&self, node: &Node) {
        // A file created now is local for good (rule 5), whatever was
        // listed under its name before.
        if let Some(path) = &node.path {
            self.files.lock().remove(path);
        }
    }

    fn after_unlink(&self, path: &Path) {
        self.files.lock().remove(path);
    }

    fn after_rename(&self, from: &Path, to: &Path) {
        let mut files = self.files.lock();
        files.remove(to);
        if let Some(rf) = files.remove(from) {
            files.insert(to.to_path_buf(), rf);
        }
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
