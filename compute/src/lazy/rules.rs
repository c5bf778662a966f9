//! Which version of a relation file's block a lazy compute reads
//! (`docs/lazy-compute.md`, "Which version of a block"): the state of every
//! block of one segment file, changed by the file operations PostgreSQL
//! makes and asked where each read comes from.
//!
//! Pure bookkeeping, no I/O: the filesystem keeps the bytes of `Local`
//! blocks in a backing file and fetches the others from the pageserver.

use std::collections::BTreeMap;

use strata_formats::version::BLCKSZ;
use strata_formats::Lsn;
use strata_protocol::lazy_manifest::file_number as parse_number;

/// Blocks per segment file (1 GiB of 8 KiB blocks).
pub const SEGMENT_BLOCKS: u32 = 131_072;

/// What a relation file name says about its content (`docs/lazy-compute.md`, rule 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkKind {
    /// The main fork of a permanent relation: every change is WAL-logged
    /// with the page's LSN set.
    Main,
    /// A visibility map: bits are cleared without changing the page's LSN.
    VisibilityMap,
    /// A free space map: never WAL-logged.
    FreeSpaceMap,
    /// An unlogged relation's init fork.
    Init,
    /// A temporary relation (`t<backend>_<relfilenode>`): never WAL-logged.
    Temp,
}

/// A relation segment file's name parsed: `<relfilenode>[_fsm|_vm|_init][.<segment>]`
/// or `t<backend>_<relfilenode>[...]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelFileName {
    pub relfilenode: u32,
    pub kind: ForkKind,
    pub segment: u32,
}

impl RelFileName {
    /// `None` for anything that is not a relation file (`PG_VERSION`,
    /// `pg_filenode.map`, `pg_internal.init`, `pg_control`, ...).
    pub fn parse(name: &str) -> Option<RelFileName> {
        let (stem, segment) = match name.split_once('.') {
            Some((stem, seg)) => (stem, parse_number(seg)?),
            None => (name, 0),
        };
        let (temp, stem) = match stem.strip_prefix('t') {
            Some(rest) => {
                let (backend, rel) = rest.split_once('_')?;
                parse_number(backend)?;
                (true, rel)
            }
            None => (false, stem),
        };
        let (rel, kind) = match stem.split_once('_') {
            None => (stem, ForkKind::Main),
            Some((rel, "vm")) => (rel, ForkKind::VisibilityMap),
            Some((rel, "fsm")) => (rel, ForkKind::FreeSpaceMap),
            Some((rel, "init")) => (rel, ForkKind::Init),
            Some(_) => return None,
        };
        let relfilenode = parse_number(rel)?;
        Some(RelFileName { relfilenode, kind: if temp { ForkKind::Temp } else { kind }, segment })
    }
}

/// The LSN in a page's header (`pd_lsn`: two 32-bit halves, high first).
pub fn page_lsn(page: &[u8]) -> Lsn {
    debug_assert_eq!(page.len(), BLCKSZ);
    let hi = u32::from_le_bytes(page[0..4].try_into().expect("4 bytes"));
    let lo = u32::from_le_bytes(page[4..8].try_into().expect("4 bytes"));
    Lsn((u64::from(hi) << 32) | u64::from(lo))
}

/// Where a read of one block comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The backing file.
    Local,
    /// The pageserver, at this LSN.
    Remote(Lsn),
    /// Zeros (a block extended and not written, or written as zeros).
    Zero,
    /// Past the end of the file: a short read.
    PastEnd,
    /// A write of it failed: its bytes are nowhere, the read is an error.
    Failed,
}

/// A block whose state is not the file's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    /// In the backing file; `Some(lsn)`: may be dropped and read back from
    /// the pageserver at `lsn` (a fetched block, or a written one under
    /// rule 3); `None`: pinned (rules 4 and 5). `referenced`: read since
    /// the cache's hand last passed it (CLOCK's second chance).
    Local { read_back: Option<Lsn>, referenced: bool },
    /// Dropped from the backing file; read from the pageserver at this LSN.
    Evicted(Lsn),
    /// All zeros, nothing stored.
    Zero,
    /// A write failed to reach the backing file (or to be merged with the
    /// rest of the block): until written whole again, reads fail rather
    /// than return an older version. With the kernel's write-back cache
    /// PostgreSQL learns of the failure only at its next fsync.
    Failed,
}

/// The states of the blocks of one segment file.
#[derive(Clone, Debug)]
pub struct SegmentRules {
    kind: ForkKind,
    /// `Some(start LSN)` for a file in the manifest: blocks below
    /// `remote_blocks` not otherwise recorded are read there (rule 1).
    /// `None` for a file this compute created or one the manifest does
    /// not list (its blocks are all local, rule 5).
    start: Option<Lsn>,
    /// Blocks of the manifest's size that no truncation has cut since.
    remote_blocks: u32,
    /// The file's size in blocks.
    size: u32,
    blocks: BTreeMap<u32, Block>,
}

/// What [`SegmentRules::evict`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// The block is dropped: the caller punches its hole.
    Done,
    /// It was read since the last pass: kept, and the mark cleared.
    SecondChance,
    /// A written block whose version the pageserver has not ingested yet.
    Waiting,
    /// Not local, or pinned: nothing to evict, now or later.
    Never,
}

/// What a write did to the file's local content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Store the page in the backing file.
    Store,
    /// The page is all zeros: nothing to store (punch a hole if one was there).
    Zero,
}

impl SegmentRules {
    /// A file listed in the manifest: `size` blocks as of `start`.
    pub fn remote(kind: ForkKind, size: u32, start: Lsn) -> SegmentRules {
        debug_assert!(size <= SEGMENT_BLOCKS);
        SegmentRules { kind, start: Some(start), remote_blocks: size, size, blocks: BTreeMap::new() }
    }

    /// A file the compute created (or one the manifest does not list),
    /// `size` blocks already in the backing file.
    pub fn local(kind: ForkKind, size: u32) -> SegmentRules {
        SegmentRules { kind, start: None, remote_blocks: 0, size, blocks: BTreeMap::new() }
    }

    /// The file's size in blocks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Whether blocks of this file may ever be read from the pageserver.
    pub fn is_remote_backed(&self) -> bool {
        self.start.is_some()
    }

    /// Where a read of `block` comes from.
    pub fn source(&self, block: u32) -> Source {
        if block >= self.size {
            return Source::PastEnd;
        }
        match self.blocks.get(&block) {
            Some(Block::Local { .. }) => Source::Local,
            Some(Block::Evicted(lsn)) => Source::Remote(*lsn),
            Some(Block::Zero) => Source::Zero,
            Some(Block::Failed) => Source::Failed,
            None => match self.start {
                Some(start) if block < self.remote_blocks => Source::Remote(start),
                // A local file's blocks are in its backing file; past the
                // manifest's size, a remote file's are zeros until written.
                None => Source::Local,
                Some(_) => Source::Zero,
            },
        }
    }

    /// `block` was fetched from the pageserver at `lsn` (its state's LSN,
    /// or a later read floor) and stored in the backing file: it may be
    /// dropped again and read back at `lsn`.
    pub fn fetched(&mut self, block: u32, lsn: Lsn) {
        debug_assert!(
            matches!(self.source(block), Source::Remote(l) if l <= lsn),
            "only a remote block is fetched, at or after its LSN"
        );
        self.blocks.insert(block, Block::Local { read_back: Some(lsn), referenced: false });
    }

    /// `block` was read: a local block gets a second chance from the cache.
    pub fn touch(&mut self, block: u32) {
        if let Some(Block::Local { referenced, .. }) = self.blocks.get_mut(&block) {
            *referenced = true;
        }
    }

    /// PostgreSQL wrote `page` at `block` (extending the file if past its end).
    pub fn write(&mut self, block: u32, page: &[u8]) -> WriteOutcome {
        debug_assert_eq!(page.len(), BLCKSZ);
        debug_assert!(block < SEGMENT_BLOCKS, "a segment file holds at most {SEGMENT_BLOCKS} blocks");
        // Blocks skipped by a write past the end read as zeros, as on disk.
        for b in self.size..block {
            self.blocks.insert(b, Block::Zero);
        }
        self.size = self.size.max(block + 1);
        if page.iter().all(|b| *b == 0) {
            self.blocks.insert(block, Block::Zero);
            return WriteOutcome::Zero;
        }
        let read_back = match (self.kind, self.start) {
            // Rule 3: the pageserver's version at the page's LSN is this
            // page up to hints; never below the start, where the relation
            // certainly exists on the pageserver.
            (ForkKind::Main, Some(start)) => {
                let lsn = page_lsn(page);
                (lsn != Lsn::INVALID).then(|| lsn.max(start))
            }
            // Rules 4 and 5: nothing on the pageserver describes this page.
            _ => None,
        };
        self.blocks.insert(block, Block::Local { read_back, referenced: false });
        WriteOutcome::Store
    }

    /// Part of `block` was written; `page` is the whole block as it now
    /// is, the rest of its bytes having been local already. The block is
    /// pinned until it is written whole again: with the kernel's write-back
    /// cache, PostgreSQL's 8 KiB write may reach this file in two parts,
    /// and a block whose header half is older than its other half is not
    /// the pageserver's version at any LSN.
    pub fn write_part(&mut self, block: u32, page: &[u8]) -> WriteOutcome {
        let outcome = self.write(block, page);
        if let Some(Block::Local { read_back, .. }) = self.blocks.get_mut(&block) {
            *read_back = None;
        }
        outcome
    }

    /// A write of `block` failed ([`Block::Failed`]).
    pub fn failed(&mut self, block: u32) {
        debug_assert!(block < SEGMENT_BLOCKS);
        for b in self.size..block {
            self.blocks.insert(b, Block::Zero);
        }
        self.size = self.size.max(block + 1);
        self.blocks.insert(block, Block::Failed);
    }

    /// The LSN `block` would be read back at if dropped now, if it may be
    /// dropped at all. `ingested`: how far the pageserver has ingested the
    /// WAL; a written block is dropped only once its version is there, so
    /// reading it back never waits for ingest.
    pub fn evictable(&self, block: u32, ingested: Lsn) -> Option<Lsn> {
        match self.blocks.get(&block) {
            Some(Block::Local { read_back: Some(lsn), .. }) if *lsn <= ingested => Some(*lsn),
            _ => None,
        }
    }

    /// The cache's hand at `block`: drops it from the backing file (the
    /// caller punches the hole) if the rules allow it and it was not read
    /// since the last pass.
    pub fn evict(&mut self, block: u32, ingested: Lsn) -> Eviction {
        match self.blocks.get_mut(&block) {
            Some(Block::Local { read_back: Some(_), referenced }) if *referenced => {
                *referenced = false;
                Eviction::SecondChance
            }
            Some(Block::Local { read_back: Some(lsn), .. }) => {
                if *lsn > ingested {
                    return Eviction::Waiting;
                }
                let lsn = *lsn;
                self.blocks.insert(block, Block::Evicted(lsn));
                Eviction::Done
            }
            _ => Eviction::Never,
        }
    }

    /// The file's length set to `blocks` (truncation, or `ftruncate`
    /// growing it, which reads as zeros).
    pub fn set_size(&mut self, blocks: u32) {
        if blocks < self.size {
            self.blocks.split_off(&blocks);
            // A block cut off and written again later is a new block, never
            // the manifest's (rule 6).
            self.remote_blocks = self.remote_blocks.min(blocks);
        } else {
            for b in self.size..blocks {
                self.blocks.insert(b, Block::Zero);
            }
        }
        self.size = blocks;
    }

    /// How many blocks of the file are in its backing file, and how many
    /// of those may never be dropped.
    pub fn local_blocks(&self) -> (u32, u32) {
        let mut local = 0;
        let mut pinned = 0;
        for b in self.blocks.values() {
            if let Block::Local { read_back, .. } = b {
                local += 1;
                pinned += u32::from(read_back.is_none());
            }
        }
        if self.start.is_none() {
            // A local file's unrecorded blocks are in its backing file too.
            let unrecorded = self.size - u32::try_from(self.blocks.len()).unwrap_or(u32::MAX).min(self.size);
            local += unrecorded;
            pinned += unrecorded;
        }
        (local, pinned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Lsn = Lsn(0x100_0000);

    fn page(lsn: u64, fill: u8) -> Vec<u8> {
        let mut p = vec![fill; BLCKSZ];
        p[0..4].copy_from_slice(&((lsn >> 32) as u32).to_le_bytes());
        p[4..8].copy_from_slice(&(lsn as u32).to_le_bytes());
        p
    }

    #[test]
    fn names() {
        let p = |s| RelFileName::parse(s);
        assert_eq!(p("16384"), Some(RelFileName { relfilenode: 16384, kind: ForkKind::Main, segment: 0 }));
        assert_eq!(p("16384.2"), Some(RelFileName { relfilenode: 16384, kind: ForkKind::Main, segment: 2 }));
        assert_eq!(p("16384_vm").map(|n| n.kind), Some(ForkKind::VisibilityMap));
        assert_eq!(p("16384_fsm.1").map(|n| (n.kind, n.segment)), Some((ForkKind::FreeSpaceMap, 1)));
        assert_eq!(p("16384_init").map(|n| n.kind), Some(ForkKind::Init));
        assert_eq!(p("t3_16384").map(|n| (n.kind, n.relfilenode)), Some((ForkKind::Temp, 16384)));
        assert_eq!(p("t3_16384_fsm").map(|n| n.kind), Some(ForkKind::Temp));
        for bad in [
            "PG_VERSION",
            "pg_filenode.map",
            "pg_internal.init",
            "pg_control",
            "",
            "16384_xx",
            "016384",
            "16384.",
            "16384.01",
            "-1",
            "99999999999",
            "t_16384",
            "tx_1",
            "16384.1.2",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unwritten_blocks_read_at_the_start() {
        let r = SegmentRules::remote(ForkKind::Main, 10, S);
        assert_eq!(r.source(0), Source::Remote(S));
        assert_eq!(r.source(9), Source::Remote(S));
        assert_eq!(r.source(10), Source::PastEnd);
        assert!(r.is_remote_backed());
    }

    #[test]
    fn written_main_blocks_read_back_at_their_lsn_never_below_the_start() {
        let mut r = SegmentRules::remote(ForkKind::Main, 10, S);
        assert_eq!(r.write(3, &page(S.0 + 0x500, 7)), WriteOutcome::Store);
        assert_eq!(r.source(3), Source::Local);
        // Not before the pageserver has the page's version.
        assert_eq!(r.evictable(3, Lsn(S.0 + 0x4F8)), None);
        assert_eq!(r.evict(3, Lsn(S.0 + 0x4F8)), Eviction::Waiting);
        assert_eq!(r.source(3), Source::Local);
        // Read since the last pass: kept once.
        r.touch(3);
        assert_eq!(r.evict(3, Lsn(S.0 + 0x500)), Eviction::SecondChance);
        assert_eq!(r.evict(3, Lsn(S.0 + 0x500)), Eviction::Done);
        assert_eq!(r.evict(3, Lsn(S.0 + 0x500)), Eviction::Never, "already gone");
        assert_eq!(r.source(3), Source::Remote(Lsn(S.0 + 0x500)));
        // A page whose only change since the start was a hint: its LSN is older.
        r.write(4, &page(0x20, 7));
        assert_eq!(r.evict(4, S), Eviction::Done);
        assert_eq!(r.source(4), Source::Remote(S));
        // Fetched blocks go back to where they came from.
        r.fetched(5, S);
        assert_eq!(r.source(5), Source::Local);
        assert_eq!(r.evict(5, S), Eviction::Done);
        assert_eq!(r.source(5), Source::Remote(S));
        r.fetched(3, Lsn(S.0 + 0x500));
        assert_eq!(r.evict(3, Lsn(S.0 + 0x500)), Eviction::Done);
        assert_eq!(r.source(3), Source::Remote(Lsn(S.0 + 0x500)));
    }

    #[test]
    fn a_block_written_in_part_is_pinned_until_written_whole() {
        let mut r = SegmentRules::remote(ForkKind::Main, 10, S);
        r.fetched(2, S);
        let newer = Lsn(S.0 + 0x300);
        // The second half arrived first: the header still says S, which
        // would read back a page without it.
        assert_eq!(r.write_part(2, &page(S.0, 9)), WriteOutcome::Store);
        assert_eq!(r.evictable(2, Lsn(u64::MAX)), None);
        assert_eq!(r.evict(2, Lsn(u64::MAX)), Eviction::Never);
        // The header half too, still in part: pinned.
        r.write_part(2, &page(newer.0, 9));
        assert_eq!(r.evictable(2, Lsn(u64::MAX)), None);
        // Written whole: the page's own LSN again.
        r.write(2, &page(newer.0, 9));
        assert_eq!(r.evictable(2, newer), Some(newer));
        assert_eq!(r.evict(2, newer), Eviction::Done);
        assert_eq!(r.source(2), Source::Remote(newer));
        assert_eq!(r.local_blocks(), (0, 0));
        r.write_part(4, &page(newer.0, 1));
        assert_eq!(r.local_blocks(), (1, 1), "counted as pinned");
    }

    #[test]
    fn a_block_whose_write_failed_fails_to_read_until_written_whole() {
        let mut r = SegmentRules::remote(ForkKind::Main, 4, S);
        r.failed(1);
        assert_eq!(r.source(1), Source::Failed);
        assert_eq!(r.evict(1, Lsn(u64::MAX)), Eviction::Never);
        // A failed extension: the file is as long as the kernel made it.
        r.failed(6);
        assert_eq!((r.size(), r.source(5), r.source(6)), (7, Source::Zero, Source::Failed));
        r.write(1, &page(S.0 + 0x10, 3));
        assert_eq!(r.source(1), Source::Local);
        assert_eq!(r.local_blocks(), (1, 0));
    }

    #[test]
    fn what_no_wal_describes_stays_local() {
        for kind in [ForkKind::VisibilityMap, ForkKind::FreeSpaceMap, ForkKind::Init, ForkKind::Temp] {
            let mut r = SegmentRules::remote(kind, 4, S);
            r.write(1, &page(S.0 + 0x800, 1));
            assert_eq!(r.evictable(1, Lsn(u64::MAX)), None, "{kind:?}");
            assert_eq!(r.evict(1, Lsn(u64::MAX)), Eviction::Never);
            assert_eq!(r.source(1), Source::Local);
            // An unwritten block fetched from the pageserver may still go.
            r.fetched(2, S);
            assert_eq!(r.evict(2, S), Eviction::Done, "{kind:?}");
        }
        // A page without an LSN (only extended, or never logged) neither.
        let mut r = SegmentRules::remote(ForkKind::Main, 4, S);
        r.write(1, &page(0, 9));
        assert_eq!(r.evict(1, Lsn(u64::MAX)), Eviction::Never);
        assert_eq!(r.local_blocks(), (1, 1));
    }

    #[test]
    fn created_files_are_local_for_good() {
        let mut r = SegmentRules::local(ForkKind::Main, 0);
        assert!(!r.is_remote_backed());
        r.write(0, &page(S.0 + 0x100, 1));
        r.write(1, &page(S.0 + 0x200, 1));
        assert_eq!(r.source(0), Source::Local);
        assert_eq!(r.evict(0, Lsn(u64::MAX)), Eviction::Never, "FILE_COPY copies pages with LSNs from before the file");
        assert_eq!(r.local_blocks(), (2, 2));
        // A file the manifest does not list but the tar had (init forks, unlogged main forks).
        let r = SegmentRules::local(ForkKind::Init, 3);
        assert_eq!((r.source(2), r.source(3)), (Source::Local, Source::PastEnd));
        assert_eq!(r.local_blocks(), (3, 3));
    }

    #[test]
    fn zeros_and_extension() {
        let mut r = SegmentRules::remote(ForkKind::Main, 2, S);
        // PostgreSQL extends with a zero page, then writes it.
        assert_eq!(r.write(2, &page(0, 0)), WriteOutcome::Zero);
        assert_eq!((r.size(), r.source(2)), (3, Source::Zero));
        assert_eq!(r.write(2, &page(S.0 + 0x40, 5)), WriteOutcome::Store);
        assert_eq!(r.source(2), Source::Local);
        // A write past the end leaves a hole of zeros, as on disk.
        r.write(6, &page(S.0 + 0x48, 5));
        assert_eq!(r.size(), 7);
        assert_eq!((r.source(4), r.source(6)), (Source::Zero, Source::Local));
        // Growing by ftruncate reads zeros.
        r.set_size(9);
        assert_eq!(r.source(8), Source::Zero);
    }

    #[test]
    fn truncation_cuts_states_and_the_manifest_size() {
        let mut r = SegmentRules::remote(ForkKind::Main, 10, S);
        r.write(8, &page(S.0 + 0x100, 3));
        r.set_size(5);
        assert_eq!((r.size(), r.source(4), r.source(5)), (5, Source::Remote(S), Source::PastEnd));
        // Blocks written again after the cut are new: never the manifest's.
        r.set_size(10);
        assert_eq!(r.source(7), Source::Zero);
        assert_eq!(r.source(8), Source::Zero, "the old local block is gone");
        r.write(9, &page(S.0 + 0x200, 3));
        assert_eq!(r.source(9), Source::Local);
        assert_eq!(r.local_blocks(), (1, 0));
        r.set_size(0);
        assert_eq!((r.size(), r.source(0), r.local_blocks()), (0, Source::PastEnd, (0, 0)));
    }

    #[test]
    fn page_lsn_reads_both_halves() {
        assert_eq!(page_lsn(&page(0x1_0000_0028, 0)), Lsn(0x1_0000_0028));
    }
}
