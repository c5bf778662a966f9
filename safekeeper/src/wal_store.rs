//! A timeline's WAL on disk, in segment files named and laid out like
//! PostgreSQL's (so `pg_waldump` and `strata wal dump` read them directly).
//!
//! Segments are created at full size with `set_len` (sparse: no zero-fill
//! writes), written with positioned writes, and made durable by one
//! `sync_data` per dirty segment per flush — so all appends that arrived
//! while the previous flush ran share one fsync (group commit).
//!
//! **Recycled segments.** An append into a sparse region makes the file
//! system allocate blocks, and the fdatasync then commits that metadata
//! too: a journal commit per flush. Into blocks already written it flushes
//! data alone, with a quarter less latency and a tenth less CPU per 8 KiB
//! append and fdatasync on this kind of disk (`docs/safekeeper.md`,
//! "Segment files"). So a removed segment is kept under a spare name (up
//! to [`MAX_SPARE_SEGMENTS`]) and renamed into place as the next new
//! segment, as PostgreSQL recycles its own. Its old WAL is never read as
//! new: every page of it carries an older page address, which the decoder
//! takes as the end of the WAL, and on the old bytes that follow the last
//! record written into a page a record's CRC fails, or, where an old record
//! starts right there, its prev-link (which the end-of-WAL search checks for
//! every record after the durable hint, the first one too).
//!
//! A failed fsync poisons the store: after it the kernel may have dropped
//! the unwritten pages and report later fsyncs as successful, so nothing
//! written since the last good flush can be trusted. Every later call fails
//! until the store is opened again from disk, cut back to the last flush
//! that succeeded ([`SegmentStore::reopen`]).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use strata_formats::version::XLOG_BLCKSZ;
use strata_formats::wal::segment::SegmentName;
use strata_formats::wal::{StartPosition, WalDecodeError, WalDecoder};
use strata_formats::{Lsn, PgVersion};

use crate::acceptor::{StorageError, WalStore};
use crate::limits::MAX_SPARE_SEGMENTS;
use strata_service::durable::sync_dir;

/// PostgreSQL timeline id used in segment names.
const PG_TIMELINE: u32 = 1;

/// Segment files of one timeline in one directory.
pub struct SegmentStore {
    dir: PathBuf,
    segment_size: u64,
    /// Where the timeline's WAL begins (nothing before it is stored).
    start: Lsn,
    write_lsn: Lsn,
    flush_lsn: Lsn,
    open: BTreeMap<u64, File>,
    dirty: Vec<u64>,
    dir_dirty: bool,
    /// Disable fsync (tests and benchmarks only; said loudly at start-up).
    no_sync: bool,
    /// Set by a failed fsync: the store refuses everything from then on.
    poisoned: Option<StorageError>,
    /// The WAL below this was removed (see `removal`): its segments are gone.
    removed_before: Lsn,
    /// Removed segments kept to be recycled (`*.spare` files).
    spares: Vec<PathBuf>,
}

/// The suffix of a removed segment kept for recycling.
const SPARE_SUFFIX: &str = "spare";

/// Path of segment `segno` of the timeline stored in `dir`.
pub fn segment_path(dir: &Path, segno: u64, segment_size: u64) -> PathBuf {
    dir.join(SegmentName { timeline: PG_TIMELINE, segment_number: segno }.file_name(segment_size))
}

fn io_err(what: &'static str, path: &Path, e: std::io::Error) -> StorageError {
    StorageError::io(what, path, &e)
}

impl SegmentStore {
    /// Opens the WAL in `dir` whose durable end is at or after `hint`, finds
    /// the end of the last complete record (a torn write after a crash is
    /// cut off) and positions writes there.
    pub fn open(
        dir: &Path,
        segment_size: u64,
        start: Lsn,
        hint: Lsn,
        no_sync: bool,
    ) -> Result<SegmentStore, StorageError> {
        fs::create_dir_all(dir).map_err(|e| io_err("creating", dir, e))?;
        let mut store = SegmentStore {
            dir: dir.to_path_buf(),
            segment_size,
            start,
            write_lsn: hint.max(start),
            flush_lsn: hint.max(start),
            open: BTreeMap::new(),
            dirty: Vec::new(),
            dir_dirty: false,
            no_sync,
            poisoned: None,
            removed_before: start,
            spares: Vec::new(),
        };
        store.find_spares()?;
        // Segments removed before a restart: the first one on disk says where the WAL now begins.
        let first_on_disk = strata_formats::wal::segment::list_segments(dir)
            .map_err(|e| io_err("listing", dir, e))?
            .iter()
            .filter_map(|p| p.file_name()?.to_str())
            .filter_map(|n| SegmentName::parse(n, segment_size))
            .map(|s| s.segment_number)
            .min();
        if let Some(first) = first_on_disk {
            store.removed_before = Lsn(first * segment_size).max(start);
        }
        let end = store.find_end_of_wal(hint.max(store.removed_before))?;
        store.write_lsn = end;
        store.flush_lsn = end;
        // Whatever follows the last complete record is garbage from a torn write.
        store.truncate(end)?;
        Ok(store)
    }

    /// Opens the WAL again after a failure, keeping nothing past `durable`
    /// (the end of the last flush that succeeded: what follows may be lost
    /// however it reads now). Fails if the WAL on disk ends before `durable`:
    /// acknowledged WAL is gone and only an operator can decide what next.
    pub fn reopen(
        dir: &Path,
        segment_size: u64,
        start: Lsn,
        durable: Lsn,
        no_sync: bool,
    ) -> Result<SegmentStore, StorageError> {
        let mut store = SegmentStore::open(dir, segment_size, start, durable, no_sync)?;
        if store.flush_lsn < durable {
            return Err(StorageError::other(
                "reopening",
                dir,
                format!("the WAL ends at {} on disk, but it was durable up to {durable}", store.flush_lsn),
            ));
        }
        if store.flush_lsn > durable {
            store.truncate(durable)?;
        }
        debug_assert_eq!(store.flush_lsn, durable);
        Ok(store)
    }

    /// The failure that poisoned the store, if any.
    pub fn poisoned(&self) -> Option<&StorageError> {
        self.poisoned.as_ref()
    }

    fn check_usable(&self) -> Result<(), StorageError> {
        match &self.poisoned {
            Some(e) => Err(StorageError::other(
                "using",
                &self.dir,
                format!("the WAL store failed earlier ({e}) and must be reopened from disk"),
            )),
            None => Ok(()),
        }
    }

    /// Runs a durability step; its failure poisons the store.
    fn durable<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T, StorageError>) -> Result<T, StorageError> {
        let result = step(self);
        if let Err(e) = &result {
            tracing::error!(dir = %self.dir.display(), "WAL store failed and stops: {e}");
            self.poisoned = Some(e.clone());
        }
        result
    }

    fn segment_path(&self, segno: u64) -> PathBuf {
        segment_path(&self.dir, segno, self.segment_size)
    }

    fn segment(&mut self, segno: u64, create: bool) -> Result<Option<&File>, StorageError> {
        if !self.open.contains_key(&segno) {
            let path = self.segment_path(segno);
            let file = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && create && !self.spares.is_empty() => {
                    self.recycle(&path)?
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                    // Created under a temporary name at full size, then renamed:
                    // a crash never leaves a short segment behind.
                    let tmp = path.with_extension("partial-create");
                    let f = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&tmp)
                        .map_err(|e| io_err("creating", &tmp, e))?;
                    f.set_len(self.segment_size).map_err(|e| io_err("sizing", &tmp, e))?;
                    fs::rename(&tmp, &path).map_err(|e| io_err("renaming", &tmp, e))?;
                    self.dir_dirty = true;
                    f
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_err("opening", &path, e)),
            };
            if self.open.len() >= crate::limits::MAX_OPEN_SEGMENTS {
                // Close the oldest clean segment.
                let victim = self.open.keys().copied().find(|s| !self.dirty.contains(s));
                if let Some(v) = victim {
                    self.open.remove(&v);
                }
            }
            self.open.insert(segno, file);
        }
        Ok(self.open.get(&segno))
    }

    /// Reads durable-or-written WAL `[from, from + buf.len())`; returns bytes read
    /// (short at the end of the written WAL).
    pub fn read(&mut self, from: Lsn, buf: &mut [u8]) -> Result<usize, StorageError> {
        if from < self.removed_before && from >= self.start {
            let why = format!("WAL at {from} was removed (this safekeeper holds it from {})", self.removed_before);
            return Err(StorageError::other("reading", &self.dir, why));
        }
        if from < self.start || from >= self.write_lsn {
            return Ok(0);
        }
        let want = buf.len().min((self.write_lsn.0 - from.0) as usize);
        let mut done = 0;
        while done < want {
            let pos = from.0 + done as u64;
            let segno = pos / self.segment_size;
            let offset = pos % self.segment_size;
            let n = (want - done).min((self.segment_size - offset) as usize);
            let path = self.segment_path(segno);
            let file = self.segment(segno, false)?.ok_or_else(|| StorageError::other("reading", &path, "missing"))?;
            file.read_exact_at(&mut buf[done..done + n], offset).map_err(|e| io_err("reading", &path, e))?;
            done += n;
        }
        Ok(done)
    }

    /// The major whose magic the WAL page holding `from` carries (WAL says
    /// what wrote it), read from the segment file whatever the positions
    /// say. A page never written (or damaged) says nothing; 15 is assumed,
    /// and the decoder then finds the end of the WAL there.
    fn version_at(&mut self, from: Lsn) -> Result<PgVersion, StorageError> {
        let page = from.0 - from.0 % XLOG_BLCKSZ as u64;
        let (segno, offset) = (page / self.segment_size, page % self.segment_size);
        let path = self.segment_path(segno);
        let mut magic = [0u8; 2];
        let found = match self.segment(segno, false)? {
            Some(file) => match file.read_exact_at(&mut magic, offset) {
                Ok(()) => PgVersion::from_wal_page_magic(u16::from_le_bytes(magic)),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
                Err(e) => return Err(io_err("reading", &path, e)),
            },
            None => None,
        };
        Ok(found.unwrap_or(PgVersion::V15))
    }

    /// Finds where the last complete record ends, from `hint` (a record
    /// boundary that was durable) on.
    ///
    /// A record's prev-link is what tells the WAL written into a recycled
    /// segment from the older segment's records after it: those follow at
    /// the same offsets, whole and with valid CRCs, and one may start right
    /// where the new WAL ends. So decoding starts a page or more before the
    /// hint, at the first record found there, and the record at the hint
    /// is checked against the one before it.
    fn find_end_of_wal(&mut self, hint: Lsn) -> Result<Lsn, StorageError> {
        let floor = self.removed_before.max(self.start);
        let hint = hint.max(floor);
        let page = XLOG_BLCKSZ as u64;
        let mut back = page;
        loop {
            let from = if hint == floor {
                floor
            } else {
                Lsn(((hint.0 - 1) / page * page).saturating_sub(back - page).max(floor.0))
            };
            let (first, end) = self.decode_from(from)?;
            // A record that begins at the hint or later was not checked
            // against its predecessor: start further back (a long record
            // may span many pages).
            if from == floor || first.is_some_and(|f| f < hint) {
                return Ok(end.max(hint));
            }
            back = back.saturating_mul(2);
        }
    }

    /// Decodes records from `from` (the start of the WAL held, or a page
    /// boundary: the first record there is searched for) while they chain;
    /// returns where the first one began and where the last one ends.
    fn decode_from(&mut self, from: Lsn) -> Result<(Option<Lsn>, Lsn), StorageError> {
        let version = self.version_at(from)?;
        let mut decoder = WalDecoder::new(version, from, self.segment_size, StartPosition::FindFirstRecord);
        let (mut first, mut end) = (None, from);
        let mut pos = from;
        let mut buf = vec![0u8; 1 << 20];
        'outer: loop {
            let segno = pos.0 / self.segment_size;
            let path = self.segment_path(segno);
            let offset = pos.0 % self.segment_size;
            let n = buf.len().min((self.segment_size - offset) as usize);
            let Some(file) = self.segment(segno, false)? else { break };
            file.read_exact_at(&mut buf[..n], offset).map_err(|e| io_err("reading", &path, e))?;
            decoder.feed(&buf[..n]);
            pos = Lsn(pos.0 + n as u64);
            loop {
                match decoder.next_record() {
                    Ok(Some(record)) => {
                        first.get_or_insert(record.lsn);
                        end = record.end_lsn;
                    }
                    Ok(None) => break,
                    Err(WalDecodeError::EndOfWal { .. } | WalDecodeError::Corrupt { .. }) => break 'outer,
                }
            }
        }
        Ok((first, end))
    }

    pub fn start_lsn(&self) -> Lsn {
        self.start
    }

    /// Where the WAL held now begins: the timeline's start, or the first
    /// segment not removed.
    pub fn removed_before(&self) -> Lsn {
        self.removed_before
    }

    /// Removes every segment that ends at or below `lsn` (which must not
    /// pass the flushed WAL); returns how many files went. The directory is
    /// synced with the next flush: a segment that comes back after a crash
    /// is removed again.
    pub fn remove_before(&mut self, lsn: Lsn) -> Result<u64, StorageError> {
        self.check_usable()?;
        debug_assert!(lsn <= self.flush_lsn, "removing WAL that is not flushed");
        let end = lsn.0.min(self.flush_lsn.0) / self.segment_size;
        let first = self.removed_before.0 / self.segment_size;
        let mut removed = 0;
        for segno in first..end {
            self.open.remove(&segno);
            self.dirty.retain(|s| *s != segno);
            let path = self.segment_path(segno);
            let kept = self.spares.len() < MAX_SPARE_SEGMENTS && self.segment_is_whole(&path);
            let gone = if kept {
                let spare = path.with_extension(SPARE_SUFFIX);
                fs::rename(&path, &spare).map(|()| self.spares.push(spare))
            } else {
                fs::remove_file(&path)
            };
            match gone {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &path, e)),
            }
        }
        if end > first {
            self.removed_before = Lsn(end * self.segment_size);
            self.dir_dirty = true;
        }
        Ok(removed)
    }
}

impl SegmentStore {
    /// The spare segments left in the directory (kept up to
    /// [`MAX_SPARE_SEGMENTS`], the rest removed).
    fn find_spares(&mut self) -> Result<(), StorageError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| io_err("listing", &self.dir, e))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == SPARE_SUFFIX))
            .collect();
        found.sort();
        for extra in found.split_off(found.len().min(MAX_SPARE_SEGMENTS)) {
            fs::remove_file(&extra).map_err(|e| io_err("removing", &extra, e))?;
            self.dir_dirty = true;
        }
        self.spares = found;
        Ok(())
    }

    /// Whether `path` is a segment of full size (only those are recycled).
    fn segment_is_whole(&self, path: &Path) -> bool {
        fs::metadata(path).is_ok_and(|m| m.len() == self.segment_size)
    }

    /// Renames a spare segment to `path` (which does not exist) and opens
    /// it; the directory is synced with the next flush, before any append
    /// into it is acknowledged.
    fn recycle(&mut self, path: &Path) -> Result<File, StorageError> {
        let spare = self.spares.pop().expect("a spare to recycle");
        fs::rename(&spare, path).map_err(|e| io_err("recycling", &spare, e))?;
        self.dir_dirty = true;
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io_err("opening", path, e))?;
        if file.metadata().map_err(|e| io_err("sizing", path, e))?.len() != self.segment_size {
            file.set_len(self.segment_size).map_err(|e| io_err("sizing", path, e))?;
        }
        Ok(file)
    }

    /// How many removed segments are kept to be recycled.
    pub fn spare_segments(&self) -> usize {
        self.spares.len()
    }
}

impl WalStore for SegmentStore {
    fn write(&mut self, at: Lsn, bytes: &[u8]) -> Result<(), StorageError> {
        self.check_usable()?;
        if at != self.write_lsn {
            return Err(StorageError::other(
                "writing",
                &self.dir,
                format!("at {at}, but the WAL ends at {}", self.write_lsn),
            ));
        }
        let mut done = 0;
        while done < bytes.len() {
            let pos = at.0 + done as u64;
            let segno = pos / self.segment_size;
            let offset = pos % self.segment_size;
            let n = (bytes.len() - done).min((self.segment_size - offset) as usize);
            let path = self.segment_path(segno);
            let file = self.segment(segno, true)?.expect("created on demand");
            file.write_all_at(&bytes[done..done + n], offset).map_err(|e| io_err("writing", &path, e))?;
            if !self.dirty.contains(&segno) {
                self.dirty.push(segno);
            }
            done += n;
        }
        self.write_lsn = Lsn(at.0 + bytes.len() as u64);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StorageError> {
        self.check_usable()?;
        if !self.no_sync {
            self.durable(|store| {
                for segno in std::mem::take(&mut store.dirty) {
                    let path = store.segment_path(segno);
                    if let Some(file) = store.segment(segno, false)? {
                        file.sync_data().map_err(|e| io_err("syncing", &path, e))?;
                    }
                }
                if store.dir_dirty {
                    sync_dir(&store.dir)?;
                    store.dir_dirty = false;
                }
                Ok(())
            })?;
        } else {
            self.dirty.clear();
        }
        debug_assert!(self.flush_lsn <= self.write_lsn);
        self.flush_lsn = self.write_lsn;
        Ok(())
    }

    fn truncate(&mut self, at: Lsn) -> Result<(), StorageError> {
        self.check_usable()?;
        self.durable(|store| store.truncate_files(at))
    }

    fn write_lsn(&self) -> Lsn {
        self.write_lsn
    }

    fn flush_lsn(&self) -> Lsn {
        self.flush_lsn
    }
}

impl SegmentStore {
    /// Durably removes the WAL from `at` on (zeroes the rest of its
    /// segment, removes later segments).
    fn truncate_files(&mut self, at: Lsn) -> Result<(), StorageError> {
        let at = at.max(self.start);
        // From here on nothing past `at` is held, whether or not the files
        // are cut in the end.
        self.flush_lsn = self.flush_lsn.min(at);
        self.write_lsn = self.write_lsn.min(at);
        let segno = at.0 / self.segment_size;
        let offset = at.0 % self.segment_size;
        // Zero the rest of the segment holding `at` (sparse), drop later ones.
        let path = self.segment_path(segno);
        let (size, no_sync) = (self.segment_size, self.no_sync);
        if let Some(file) = self.segment(segno, false)? {
            file.set_len(offset).and_then(|()| file.set_len(size)).map_err(|e| io_err("truncating", &path, e))?;
            if !no_sync {
                file.sync_all().map_err(|e| io_err("syncing", &path, e))?;
            }
        }
        let mut later = segno + 1;
        loop {
            let path = self.segment_path(later);
            self.open.remove(&later);
            match fs::remove_file(&path) {
                Ok(()) => self.dir_dirty = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(io_err("removing", &path, e)),
            }
            later += 1;
        }
        self.dirty.retain(|s| *s <= segno);
        self.write_lsn = at;
        self.flush_lsn = self.flush_lsn.min(at);
        if !self.no_sync && self.dir_dirty {
            sync_dir(&self.dir)?;
            self.dir_dirty = false;
        }
        Ok(())
    }
}
