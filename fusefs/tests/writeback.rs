//! The passthrough mounted with the kernel's write-back cache: writes are
//! gathered by the kernel and reach the daemon in fewer, larger requests,
//! fsync brings them to the backing file, and handles opened write-only or
//! for appending still work (the kernel reads pages through them and places
//! appends itself).
//!
//! Needs /dev/fuse (and root, or fusermount3).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata_fusefs::testing::Mounted;
use strata_fusefs::{Hooks, Node, Passthrough};

/// Counts the write requests that reach the daemon, and their bytes.
#[derive(Default)]
struct Counting {
    writes: AtomicU64,
    bytes: AtomicU64,
}

struct Hooked(Arc<Counting>);
impl Hooks for Hooked {
    fn after_write(&self, _node: &Node, _file: &File, _offset: u64, data: &[u8]) {
        self.0.writes.fetch_add(1, Ordering::Relaxed);
        self.0.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
}

fn mount(name: &str) -> (Mounted, Arc<Counting>) {
    let dir = std::env::temp_dir().join(format!("strata-fusefs-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (backing, mnt) = (dir.join("backing"), dir.join("mnt"));
    fs::create_dir_all(&backing).unwrap();
    fs::create_dir_all(&mnt).unwrap();
    let counting = Arc::new(Counting::default());
    let fs = Passthrough::new(backing.canonicalize().unwrap(), Hooked(counting.clone()))
        .exclusive(Duration::from_secs(60))
        .writeback_cache();
    let mut config = fuser::Config::default();
    config.n_threads = Some(2);
    let session = fuser::Session::new(fs, &mnt, &config).unwrap().spawn().unwrap();
    (Mounted::new(dir, mnt, session), counting)
}

fn backing(m: &Mounted, name: &str) -> Vec<u8> {
    fs::read(m.dir.join("backing").join(name)).unwrap()
}

fn block(i: usize) -> Vec<u8> {
    vec![i as u8 + 1; 8192]
}

#[test]
fn writes_are_gathered_by_the_kernel_and_fsync_brings_them_to_the_backing_file() {
    const BLOCKS: usize = 64;
    let (m, counting) = mount("writeback");
    let path = m.mnt.join("rel");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    for i in 0..BLOCKS {
        f.write_all_at(&block(i), (i * 8192) as u64).unwrap();
    }
    // The kernel owns the size while pages wait for write-back.
    assert_eq!(f.metadata().unwrap().len(), (BLOCKS * 8192) as u64);
    assert_eq!(fs::metadata(&path).unwrap().len(), (BLOCKS * 8192) as u64);
    f.sync_all().unwrap();
    let expected: Vec<u8> = (0..BLOCKS).flat_map(block).collect();
    assert_eq!(backing(&m, "rel"), expected, "fsync wrote every page to the backing file");
    assert_eq!(counting.bytes.load(Ordering::Relaxed), expected.len() as u64, "each byte written back once");
    let writes = counting.writes.load(Ordering::Relaxed);
    assert!(writes < BLOCKS as u64 / 2, "{BLOCKS} writes of a block reached the daemon as {writes} requests");

    // A page rewritten in the cache: the last version is what lands.
    f.write_all_at(&block(100), 8192).unwrap();
    let mut buf = vec![0u8; 8192];
    f.read_exact_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, block(100));
    drop(f);
    // Closing a file writes its pages back.
    assert_eq!(&backing(&m, "rel")[8192..16384], &block(100)[..]);
}

#[test]
fn write_only_and_append_handles_work_with_the_kernel_placing_the_bytes() {
    let (m, _) = mount("writeback-modes");
    let path = m.mnt.join("log");
    fs::write(&path, b"0123456789").unwrap();
    drop_cache(&path);

    // A part of a page written through a write-only handle: the kernel
    // reads the rest of the page through that handle.
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"AB", 3).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(backing(&m, "log"), b"012AB56789");

    // Appends land after what is there, each once.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"ab").unwrap();
    f.write_all(b"cd").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(backing(&m, "log"), b"012AB56789abcd");
    assert_eq!(fs::read(&path).unwrap(), b"012AB56789abcd");
}

/// Drops the kernel's cached pages of a file on the mount, so that the next
/// partial write has to read its page.
fn drop_cache(path: &Path) {
    let f = File::open(path).unwrap();
    // SAFETY: a valid descriptor; advice only.
    let rc = unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}
