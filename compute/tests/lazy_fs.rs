//! The lazy file system mounted for real (FUSE), over a page source that
//! counts what it is asked: reads of listed files fetch each block once at
//! the start LSN, writes win, partial writes merge with the fetched block,
//! truncation and re-extension read zeros (also when the truncation comes
//! while blocks past it are being fetched), a re-created file is local, a
//! second segment maps to the fork's later blocks, a failing source is an
//! I/O error for that read only, large sequential reads are kept from
//! their second pass, and listed files are created when first looked up
//! (listed before that) without a descriptor held per file.
//!
//! Needs /dev/fuse (and root, or fusermount3).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_compute::lazy::cache::{Cache, CacheStats};
use strata_compute::lazy::fs::{mount, FetchError, LazyHooks, LazyStats, Mount, PageSource};
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_fusefs::testing::Mounted;
use strata_protocol::lazy_manifest::{ManifestEntry, ManifestFork};
use strata_service::clock::{Clock, SystemClock};

const S: Lsn = Lsn(0x300_0000);
const B: usize = 8192;

/// Pages whose bytes say which block and LSN they are; every request logged.
#[derive(Default)]
struct FakeSource {
    asked: Mutex<Vec<(u32, u32, Lsn)>>,
    fail: AtomicBool,
    /// Reads below this LSN are refused as below the GC cutoff.
    cutoff: std::sync::atomic::AtomicU64,
    /// While set, requests wait (counted in `held`) until it is cleared.
    hold: Mutex<bool>,
    held: std::sync::atomic::AtomicUsize,
    released: parking_lot::Condvar,
}

fn page_of(rel: u32, block: u32, lsn: Lsn) -> Vec<u8> {
    let mut p = vec![0u8; B];
    p[8..12].copy_from_slice(&rel.to_le_bytes());
    p[12..16].copy_from_slice(&block.to_le_bytes());
    p[16..24].copy_from_slice(&lsn.0.to_le_bytes());
    p[100..B].fill((block % 251) as u8 + 1);
    p
}

impl PageSource for FakeSource {
    fn get_pages(&self, rel: RelFileNode, _fork: ForkNumber, blocks: &[u32], lsn: Lsn) -> Result<Vec<u8>, FetchError> {
        {
            let mut hold = self.hold.lock();
            if *hold {
                self.held.fetch_add(1, Ordering::SeqCst);
                while *hold {
                    self.released.wait(&mut hold);
                }
            }
        }
        if self.fail.load(Ordering::Relaxed) {
            return Err(FetchError::Other("the pageserver is down".into()));
        }
        if lsn.0 < self.cutoff.load(Ordering::Relaxed) {
            return Err(FetchError::BelowGcCutoff(format!("{lsn} is below the GC cutoff")));
        }
        let mut asked = self.asked.lock();
        Ok(blocks
            .iter()
            .flat_map(|b| {
                asked.push((rel.rel, *b, lsn));
                page_of(rel.rel, *b, lsn)
            })
            .collect())
    }

    fn latest_lsn(&self) -> Result<Lsn, String> {
        Ok(Lsn(self.cutoff.load(Ordering::Relaxed) + 0x1000))
    }
}

fn setup(name: &str, entries: &[ManifestEntry], source: Arc<FakeSource>) -> (Mounted, Arc<LazyStats>) {
    let cache = Arc::new(Cache::new(1 << 20, Arc::new(CacheStats::default())));
    setup_with_cache(name, entries, source, cache)
}

fn setup_with_cache(
    name: &str,
    entries: &[ManifestEntry],
    source: Arc<FakeSource>,
    cache: Arc<Cache>,
) -> (Mounted, Arc<LazyStats>) {
    let dir = std::env::temp_dir().join(format!("strata-lazy-fs-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (backing, mnt) = (dir.join("backing"), dir.join("mnt"));
    fs::create_dir_all(backing.join("5")).unwrap();
    fs::write(backing.join("5/PG_VERSION"), "15\n").unwrap();
    fs::create_dir_all(&mnt).unwrap();
    let stats = Arc::new(LazyStats::default());
    let hooks = LazyHooks::new(Mount::Base, backing, entries, S, None, source, stats.clone(), cache).unwrap();
    // A read-write compute's hooks (the floor stays 0 unless a test sets it).
    let hooks = hooks.with_floor(strata_compute::lazy::fs::ReadFloor::Ingested);
    let session = mount(&mnt, hooks).unwrap();
    (Mounted::new(dir, mnt, session), stats)
}

fn entry(rel: u32, blocks: u32) -> ManifestEntry {
    ManifestEntry { db: Some(5), relfilenode: rel, fork: ManifestFork::Main, blocks }
}

fn with_lsn(lsn: Lsn, fill: u8) -> Vec<u8> {
    let mut p = vec![fill; B];
    p[0..4].copy_from_slice(&((lsn.0 >> 32) as u32).to_le_bytes());
    p[4..8].copy_from_slice(&(lsn.0 as u32).to_le_bytes());
    p
}

#[test]
fn reads_writes_and_sizes_follow_the_rules() {
    let source = Arc::new(FakeSource::default());
    let (m, stats) = setup("rules", &[entry(1000, 4), entry(1001, 131_072 + 3)], source.clone());
    let path = m.mnt.join("5/1000");
    assert_eq!(fs::metadata(&path).unwrap().len(), 4 * B as u64, "the size comes from the manifest");
    assert_eq!(fs::read_to_string(m.mnt.join("5/PG_VERSION")).unwrap(), "15\n");
    let mut names: Vec<String> =
        fs::read_dir(m.mnt.join("5")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["1000", "1001", "1001.1", "PG_VERSION"]);

    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mut buf = vec![0u8; B];
    f.read_exact_at(&mut buf, 2 * B as u64).unwrap();
    assert_eq!(buf, page_of(1000, 2, S), "an unwritten block is the pageserver's at the start LSN");
    f.read_exact_at(&mut buf, 2 * B as u64).unwrap();
    assert_eq!(source.asked.lock().iter().filter(|a| a.1 == 2).count(), 1, "fetched once, then local");

    // A whole-block write wins and is never fetched.
    let mine = with_lsn(Lsn(S.0 + 0x100), 0x5A);
    f.write_all_at(&mine, B as u64).unwrap();
    f.read_exact_at(&mut buf, B as u64).unwrap();
    assert_eq!(buf, mine);
    assert!(!source.asked.lock().iter().any(|a| a.0 == 1000 && a.1 == 1));

    // A partial write keeps the rest of the block as the pageserver had it.
    f.write_all_at(b"hello", 3 * B as u64 + 200).unwrap();
    f.read_exact_at(&mut buf, 3 * B as u64).unwrap();
    let mut expected = page_of(1000, 3, S);
    expected[200..205].copy_from_slice(b"hello");
    assert_eq!(buf, expected);

    // Truncation, then a write past the end: the blocks between read zeros.
    f.set_len(B as u64).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), B as u64);
    f.write_all_at(&with_lsn(Lsn(S.0 + 0x200), 7), 3 * B as u64).unwrap();
    f.read_exact_at(&mut buf, 2 * B as u64).unwrap();
    assert!(buf.iter().all(|b| *b == 0), "a block cut off is not the pageserver's again");
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, page_of(1000, 0, S), "the block below the cut still is");
    drop(f);

    // Removed and created again: local and empty, never fetched.
    let before = source.asked.lock().len();
    fs::remove_file(&path).unwrap();
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 0);
    f.write_all_at(&with_lsn(Lsn(S.0 + 0x300), 9), 0).unwrap();
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, with_lsn(Lsn(S.0 + 0x300), 9));
    assert_eq!(source.asked.lock().len(), before);

    // The second segment of a fork over 1 GiB holds the fork's later blocks.
    let seg = OpenOptions::new().read(true).open(m.mnt.join("5/1001.1")).unwrap();
    assert_eq!(seg.metadata().unwrap().len(), 3 * B as u64);
    seg.read_exact_at(&mut buf, B as u64).unwrap();
    assert_eq!(buf, page_of(1001, 131_073, S));

    // A failing source fails that read only; the next one works again.
    source.fail.store(true, Ordering::Relaxed);
    let err = seg.read_exact_at(&mut buf, 2 * B as u64).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    source.fail.store(false, Ordering::Relaxed);
    seg.read_exact_at(&mut buf, 2 * B as u64).unwrap();
    assert_eq!(buf, page_of(1001, 131_074, S));
    // The kernel may try the failed range more than once (readahead, then the read).
    assert!(stats.fetch_errors.load(Ordering::Relaxed) >= 1);
    assert!(stats.blocks_fetched.load(Ordering::Relaxed) >= 4);
    let lsns: HashMap<Lsn, usize> = source.asked.lock().iter().fold(HashMap::new(), |mut m, a| {
        *m.entry(a.2).or_default() += 1;
        m
    });
    assert_eq!(lsns.keys().copied().collect::<Vec<_>>(), vec![S], "every read so far at the start LSN");
}

#[test]
fn large_reads_are_answered_with_the_pages_fetched_for_them_and_kept_from_the_second_pass() {
    let source = Arc::new(FakeSource::default());
    let cache = Arc::new(Cache::new(16 << 20, Arc::new(CacheStats::default())));
    let (m, stats) = setup_with_cache("large", &[entry(1002, 600)], source.clone(), cache);
    let path = m.mnt.join("5/1002");
    let backing = m.dir.join("backing/5/1002");
    // Some blocks are local before the scan: one written, one read.
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mine = with_lsn(Lsn(S.0 + 0x100), 0x77);
    f.write_all_at(&mine, 130 * B as u64).unwrap();
    let mut one = vec![0u8; B];
    f.read_exact_at(&mut one, 260 * B as u64).unwrap();
    drop(f);
    let expected = |b: usize| if b == 130 { mine.clone() } else { page_of(1002, b as u32, S) };

    // Reads of 1 MiB (the kernel's read-ahead makes them as large), some
    // over local blocks, from a descriptor that has read nothing.
    let g = OpenOptions::new().read(true).open(&path).unwrap();
    let scan = || {
        let mut all = vec![0u8; 600 * B];
        for (i, chunk) in all.chunks_mut(128 * B).enumerate() {
            g.read_exact_at(chunk, (i * 128 * B) as u64).unwrap();
        }
        for b in 0..600 {
            assert!(all[b * B..(b + 1) * B] == expected(b), "block {b}");
        }
        all
    };
    let all = scan();
    // The first pass answered large reads from what it fetched without
    // keeping it: those blocks are holes in the backing file.
    let streamed = stats.blocks_streamed.load(Ordering::Relaxed);
    assert!(streamed >= 128, "{streamed} blocks streamed");
    assert!(allocated(&backing) <= (600 - streamed) * B as u64, "streamed blocks were stored");
    // A read that does not start at a block boundary is never streamed.
    let mut odd = vec![0u8; 3 * B];
    g.read_exact_at(&mut odd, 70 * B as u64 + 100).unwrap();
    assert_eq!(odd, all[70 * B + 100..73 * B + 100]);

    // The kernel lets the pages go and the scan comes back: the blocks
    // fetched again are kept this time, so the backing file holds all.
    drop_kernel_cache(&g);
    assert!(scan() == all);
    assert!(fs::read(&backing).unwrap() == all, "the backing file differs from what was read");
    // A streamed block was fetched twice, any other once (130 never).
    let asked = source.asked.lock();
    let mut times: HashMap<u32, usize> = HashMap::new();
    for a in asked.iter() {
        *times.entry(a.1).or_default() += 1;
    }
    assert!(!times.contains_key(&130));
    assert!((0..600).filter(|b| *b != 130).all(|b| matches!(times.get(&b), Some(1 | 2))), "{times:?}");
    let twice = times.values().filter(|n| **n == 2).count() as u64;
    assert_eq!(twice, stats.blocks_streamed.load(Ordering::Relaxed), "fetched twice: the blocks streamed");
}

#[test]
fn a_file_cut_while_its_blocks_are_fetched_stays_cut() {
    let source = Arc::new(FakeSource::default());
    let (m, _) = setup("cut", &[entry(1003, 64)], source.clone());
    let path = m.mnt.join("5/1003");
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    f.read_exact_at(&mut vec![0u8; B], 0).unwrap();
    // A read of the blocks past the cut waits on the page source...
    *source.hold.lock() = true;
    let reader = {
        let path = path.clone();
        std::thread::spawn(move || {
            let g = OpenOptions::new().read(true).open(&path).unwrap();
            let mut buf = vec![0u8; 4 * B];
            g.read_at(&mut buf, 40 * B as u64).map(|n| (n, buf))
        })
    };
    let deadline = SystemClock.now() + std::time::Duration::from_secs(10);
    while source.held.load(Ordering::SeqCst) == 0 {
        assert!(SystemClock.now() < deadline, "the read never reached the page source");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // ...while the file is cut to 10 blocks (the kernel may hold the cut
    // until the read is answered); then the source answers.
    let cutter = {
        let f = f.try_clone().unwrap();
        std::thread::spawn(move || f.set_len(10 * B as u64))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    *source.hold.lock() = false;
    source.released.notify_all();
    cutter.join().unwrap().unwrap();
    let read = reader.join().unwrap();
    // The pages that came back are not stored past the new end: the file
    // keeps its size, and grown again it reads zeros there, not them.
    let backing = m.dir.join("backing/5/1003");
    assert_eq!(fs::metadata(&backing).unwrap().len(), 10 * B as u64, "the read was answered {read:?}");
    f.set_len(64 * B as u64).unwrap();
    let mut page = vec![1u8; B];
    f.read_exact_at(&mut page, 41 * B as u64).unwrap();
    assert!(page.iter().all(|b| *b == 0), "block 41 reads old bytes after the cut");
    f.read_exact_at(&mut page, 5 * B as u64).unwrap();
    assert!(page == page_of(1003, 5, S), "block 5 is not its page");
}

/// Bytes the file system holds of a backing file (holes not counted).
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().blocks() * 512
}

/// Waits (a little: the cache's thread finishes a pass that concurrent
/// requests left over budget) for a backing file to hold at most `blocks`.
fn within_budget(path: &std::path::Path, blocks: u64) {
    let deadline = SystemClock.now() + std::time::Duration::from_secs(10);
    while allocated(path) > blocks * B as u64 {
        assert!(SystemClock.now() < deadline, "{} bytes held, budget {blocks} blocks", allocated(path));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The offset of the first byte of a file that is not in a hole (its
/// length if it is all holes).
fn first_data(path: &std::path::Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    // SAFETY: an open descriptor.
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    if at < 0 {
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENXIO));
        return f.metadata().unwrap().len();
    }
    at as u64
}

/// Drops the kernel's cached pages of an open file, so that the next read
/// reaches the file system.
fn drop_kernel_cache(f: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: an open descriptor.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

/// Turns the kernel's read-ahead off for an open file.
fn random_reads(f: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: an open descriptor.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) }, 0);
}

#[test]
fn a_write_back_that_fails_leaves_its_block_unreadable_until_written_whole() {
    let source = Arc::new(FakeSource::default());
    let (m, _) = setup("failed-write-back", &[entry(1000, 4)], source.clone());
    let f = OpenOptions::new().read(true).write(true).open(m.mnt.join("5/1000")).unwrap();
    random_reads(&f);
    // One kernel page, half a block: written back alone, so the daemon
    // needs the block's other half, and the pageserver is down.
    source.fail.store(true, Ordering::Relaxed);
    f.write_all_at(&[0x77; 4096], 2 * B as u64).unwrap();
    let err = f.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    source.fail.store(false, Ordering::Relaxed);
    drop_kernel_cache(&f);
    let mut buf = vec![0u8; B];
    let err = f.read_exact_at(&mut buf, 2 * B as u64).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "never the older version: {err}");
    f.read_exact_at(&mut buf, B as u64).unwrap();
    assert_eq!(buf, page_of(1000, 1, S), "the other blocks read as before");
    // Half of it again: still nothing to merge with.
    f.write_all_at(&[0x78; 4096], 2 * B as u64 + 4096).unwrap();
    assert!(f.sync_all().is_err());
    // Written whole: readable again, as written.
    let mine = with_lsn(Lsn(S.0 + 0x100), 0x33);
    f.write_all_at(&mine, 2 * B as u64).unwrap();
    f.sync_all().unwrap();
    drop_kernel_cache(&f);
    f.read_exact_at(&mut buf, 2 * B as u64).unwrap();
    assert_eq!(buf, mine);
}

#[test]
fn a_cache_smaller_than_the_file_drops_blocks_and_reads_them_back_at_their_version() {
    let source = Arc::new(FakeSource::default());
    let cache_stats = Arc::new(CacheStats::default());
    let cache = Arc::new(Cache::new(8, cache_stats.clone()));
    cache.set_ingested(S);
    cache.spawn_evictor().unwrap();
    let (m, _stats) = setup_with_cache("cache", &[entry(1000, 64)], source.clone(), cache.clone());
    let path = m.mnt.join("5/1000");
    let backing = m.dir.join("backing/5/1000");
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // Block by block, as random reads come: no read-ahead (whose large
    // reads the cache would not keep on their first pass).
    random_reads(&f);
    let mut buf = vec![0u8; B];

    // Four blocks written at LSNs the pageserver has not ingested yet.
    let mine = |b: u32| with_lsn(Lsn(S.0 + 0x100 * (u64::from(b) + 1)), b as u8 + 1);
    for b in 0..4u32 {
        f.write_all_at(&mine(b), u64::from(b) * B as u64).unwrap();
    }
    // Every other block read, twice over: the disk stays within the budget
    // (the written blocks count towards it and wait), every read is right.
    for round in 0..2 {
        drop_kernel_cache(&f);
        for b in 4..64u32 {
            f.read_exact_at(&mut buf, u64::from(b) * B as u64).unwrap();
            assert_eq!(buf, page_of(1000, b, S), "round {round} block {b}");
            within_budget(&backing, 8);
        }
    }
    assert!(cache_stats.evictions.load(Ordering::Relaxed) >= 2 * 60 - 8);
    let fetched_again = source.asked.lock().iter().filter(|a| a.1 == 10).count();
    assert!(fetched_again >= 2, "a dropped block is fetched again");
    drop_kernel_cache(&f);
    for b in 0..4u32 {
        f.read_exact_at(&mut buf, u64::from(b) * B as u64).unwrap();
        assert_eq!(buf, mine(b), "a written block stays until the pageserver has it");
    }
    assert!(!source.asked.lock().iter().any(|a| a.1 < 4));

    // The pageserver catches up: the written blocks may go, and come back
    // from the pageserver at their own LSN. The hand drops them once other
    // reads have taken it round (they were just read: a second chance
    // first); the backing file then has holes where they were.
    cache.set_ingested(Lsn(S.0 + 0x1000));
    let deadline = SystemClock.now() + std::time::Duration::from_secs(20);
    while first_data(&backing) < 4 * B as u64 {
        assert!(SystemClock.now() < deadline, "the written blocks were never dropped");
        drop_kernel_cache(&f);
        for b in 4..64u32 {
            f.read_exact_at(&mut buf, u64::from(b) * B as u64).unwrap();
        }
    }
    drop_kernel_cache(&f);
    for b in 0..4u32 {
        f.read_exact_at(&mut buf, u64::from(b) * B as u64).unwrap();
        let lsn = Lsn(S.0 + 0x100 * (u64::from(b) + 1));
        assert_eq!(buf, page_of(1000, b, lsn), "block {b} read back at its page LSN");
    }
    within_budget(&backing, 8);
}

#[test]
fn a_read_write_compute_reads_at_its_floor_and_moves_it_past_the_gc_cutoff() {
    let source = Arc::new(FakeSource::default());
    let cache = Arc::new(Cache::new(1 << 20, Arc::new(CacheStats::default())));
    let (m, _stats) = setup_with_cache("floor", &[entry(1000, 256)], source.clone(), cache.clone());
    let f = OpenOptions::new().read(true).open(m.mnt.join("5/1000")).unwrap();
    let mut buf = vec![0u8; B];
    // A floor past the start: unwritten blocks are read there.
    let floor = Lsn(S.0 + 0x800);
    cache.set_floor(floor);
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, page_of(1000, 0, floor));
    // GC passed the floor: the read is refused once, the floor moves to
    // the latest LSN, and the read is served there.
    source.cutoff.store(S.0 + 0x10_000, Ordering::Relaxed);
    // (Far from block 0: the kernel's read-ahead did not fetch it.)
    f.read_exact_at(&mut buf, 200 * B as u64).unwrap();
    let latest = Lsn(S.0 + 0x11_000);
    assert_eq!(buf, page_of(1000, 200, latest));
    assert_eq!(cache.floor(), latest);
}

/// Descriptors this process has open.
fn open_descriptors() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn listed_files_are_created_when_first_looked_up_and_hold_no_descriptor() {
    const FILES: u32 = 3000;
    let source = Arc::new(FakeSource::default());
    let entries: Vec<ManifestEntry> = (0..FILES).map(|i| entry(20_000 + i, 2)).collect();
    let before = open_descriptors();
    let (m, _) = setup("many", &entries, source.clone());
    let names = |dir: &std::path::Path| -> std::collections::BTreeSet<String> {
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
    };
    // The mount starts without a file per relation, yet lists them all.
    assert_eq!(names(&m.dir.join("backing/5")).len(), 1, "only PG_VERSION in the backing directory");
    let listed = names(&m.mnt.join("5"));
    assert_eq!(listed.len(), FILES as usize + 1);
    assert!(listed.contains("PG_VERSION") && listed.contains("20000") && listed.contains("22999"));

    // An O_CREAT open of a listed name the kernel never looked up opens the
    // listed file, with its pages, instead of making an empty one.
    let created =
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.mnt.join("5/22999")).unwrap();
    assert_eq!(created.metadata().unwrap().len(), 2 * B as u64);
    let mut buf = vec![0u8; B];
    created.read_exact_at(&mut buf, B as u64).unwrap();
    assert!(buf == page_of(22_999, 1, S), "the listed file's page");
    drop(created);

    // Every file read through the mount: each created on its lookup, sparse
    // and of its size; no descriptor stays open per file.
    for i in 0..FILES - 1 {
        let f = fs::File::open(m.mnt.join(format!("5/{}", 20_000 + i))).unwrap();
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf == page_of(20_000 + i, 0, S), "file {i}");
    }
    let held = open_descriptors().saturating_sub(before);
    assert!(held < 64, "{held} descriptors held for {FILES} files");
    let backing = m.dir.join("backing/5/20000");
    assert_eq!(fs::metadata(&backing).unwrap().len(), 2 * B as u64);
    assert!(allocated(&backing) <= 2 * B as u64);
    // Listed once each, now from the backing directory.
    assert_eq!(names(&m.mnt.join("5")), listed);
    assert_eq!(names(&m.dir.join("backing/5")), listed);
    // Each block fetched once at most (the kernel reads ahead the second).
    let asked = source.asked.lock();
    let distinct: std::collections::HashSet<(u32, u32)> = asked.iter().map(|a| (a.0, a.1)).collect();
    assert_eq!(distinct.len(), asked.len());
}
