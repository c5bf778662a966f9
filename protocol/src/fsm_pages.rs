//! Free space map pages carried in the WAL (`docs/free-space-maps.md`).
//!
//! PostgreSQL never WAL-logs its free space maps, so a compute's agent
//! sends the pages PostgreSQL wrote as the payload of a non-transactional
//! logical message (`pg_logical_emit_message(false, 'strata.fsm', …)`),
//! and the pageserver stores them at the message's LSN. Any database user
//! can emit such a message: the pageserver treats the payload as
//! untrusted and the pages as hints (PostgreSQL checks every page the map
//! names before using its space).
//!
//! Version 1, every integer little-endian:
//!
//! ```text
//! "SFSM"  u8 version (1)  u16 count (1..=64)
//! zstd frame of count entries: u32 spc, u32 db, u32 relfilenode, u32 block, 8192 bytes page
//! ```

use strata_formats::types::RelFileNode;
use strata_formats::version::BLCKSZ;

/// The logical message prefix the pages travel under.
pub const PREFIX: &str = "strata.fsm";
/// The payload format's version.
pub const VERSION: u8 = 1;
/// The most pages one message carries: 512 KiB before compression, so
/// that one record stays small next to the WAL around it.
pub const MAX_PAGES: usize = 64;

const MAGIC: &[u8; 4] = b"SFSM";
const HEADER: usize = 4 + 1 + 2;
const ENTRY: usize = 16 + BLCKSZ;

/// One free space map page: block `block` of `rel`'s FSM fork.
#[derive(Clone, PartialEq, Eq)]
pub struct FsmPage {
    pub rel: RelFileNode,
    pub block: u32,
    pub page: Box<[u8; BLCKSZ]>,
}

impl std::fmt::Debug for FsmPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FsmPage({}/{}/{}_fsm block {})", self.rel.spc, self.rel.db, self.rel.rel, self.block)
    }
}

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsmMessageError {
    #[error("free space map message: {0} bytes is shorter than its header")]
    Short(usize),
    #[error("free space map message: not one (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("free space map message: version {0} is not supported (only {VERSION})")]
    Version(u8),
    #[error("free space map message: {0} pages (1 to {MAX_PAGES})")]
    Count(u16),
    #[error("free space map message: the pages do not decompress to {expected} bytes: {reason}")]
    Body { expected: usize, reason: String },
}

/// Encodes up to [`MAX_PAGES`] pages into one payload.
pub fn encode(pages: &[FsmPage]) -> Vec<u8> {
    assert!(!pages.is_empty() && pages.len() <= MAX_PAGES, "1 to {MAX_PAGES} pages per message");
    let mut body = Vec::with_capacity(pages.len() * ENTRY);
    for p in pages {
        for n in [p.rel.spc, p.rel.db, p.rel.rel, p.block] {
            body.extend_from_slice(&n.to_le_bytes());
        }
        body.extend_from_slice(&p.page[..]);
    }
    // Level 3: the maps are mostly zeros and runs of equal bytes.
    let compressed = zstd::bulk::compress(&body, 3).expect("compressing to memory cannot fail");
    let mut out = Vec::with_capacity(HEADER + compressed.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(pages.len() as u16).to_le_bytes());
    out.extend_from_slice(&compressed);
    out
}

/// Decodes a payload; never allocates more than [`MAX_PAGES`] entries.
pub fn decode(msg: &[u8]) -> Result<Vec<FsmPage>, FsmMessageError> {
    if msg.len() < HEADER {
        return Err(FsmMessageError::Short(msg.len()));
    }
    let magic: [u8; 4] = msg[..4].try_into().expect("4 bytes");
    if &magic != MAGIC {
        return Err(FsmMessageError::Magic(magic));
    }
    if msg[4] != VERSION {
        return Err(FsmMessageError::Version(msg[4]));
    }
    let count = u16::from_le_bytes([msg[5], msg[6]]);
    if count == 0 || usize::from(count) > MAX_PAGES {
        return Err(FsmMessageError::Count(count));
    }
    let expected = usize::from(count) * ENTRY;
    let body = zstd::bulk::decompress(&msg[HEADER..], expected)
        .map_err(|e| FsmMessageError::Body { expected, reason: e.to_string() })?;
    if body.len() != expected {
        return Err(FsmMessageError::Body { expected, reason: format!("{} bytes", body.len()) });
    }
    Ok(body
        .chunks_exact(ENTRY)
        .map(|e| {
            let n = |i: usize| u32::from_le_bytes(e[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
            let page: Box<[u8; BLCKSZ]> = e[16..].to_vec().into_boxed_slice().try_into().expect("one page");
            FsmPage { rel: RelFileNode { spc: n(0), db: n(1), rel: n(2) }, block: n(3), page }
        })
        .collect())
}

/// Heap blocks one free space map leaf page covers (`SlotsPerFSMPage` for
/// 8 KiB pages: the page's nodes after its header and `fp_next_slot`, less
/// the inner nodes of its binary tree).
pub const SLOTS_PER_PAGE: u32 = {
    let nodes = BLCKSZ as u32 - 24 - 4;
    let inner = BLCKSZ as u32 / 2 - 1;
    nodes - inner
};

/// The block of the free space map's leaf page with logical number
/// `leaf`: the map's three levels are stored depth first, each inner page
/// before the pages below it.
fn leaf_block(leaf: u32) -> u64 {
    let leaf = u64::from(leaf);
    let slots = u64::from(SLOTS_PER_PAGE);
    leaf + leaf / slots + leaf / (slots * slots) + 2
}

/// How many blocks a free space map needs to describe `heap_blocks` heap
/// blocks: pages at or past this cannot be PostgreSQL's for that size.
pub fn blocks_for_heap(heap_blocks: u32) -> u64 {
    match heap_blocks {
        0 => 0,
        n => leaf_block((n - 1) / SLOTS_PER_PAGE) + 1,
    }
}

/// The size PostgreSQL cuts a free space map to when its heap is truncated
/// to `heap_blocks` (`FreeSpaceMapPrepareTruncateRel`): the leaf holding
/// the first removed block is kept when it also holds blocks that remain.
pub fn blocks_after_truncate(heap_blocks: u32) -> u64 {
    let (leaf, slot) = (heap_blocks / SLOTS_PER_PAGE, heap_blocks % SLOTS_PER_PAGE);
    leaf_block(leaf) + u64::from(slot > 0)
}

/// Fuzzing entry: whatever decodes encodes back to pages that decode the same.
pub fn fuzz_decode(bytes: &[u8]) {
    if let Ok(pages) = decode(bytes) {
        assert!(!pages.is_empty() && pages.len() <= MAX_PAGES);
        assert_eq!(decode(&encode(&pages)).as_ref(), Ok(&pages));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(fill: u8) -> Box<[u8; BLCKSZ]> {
        let mut p = Box::new([0u8; BLCKSZ]);
        p[24..4120].fill(fill);
        p
    }

    #[test]
    fn pages_round_trip_and_compress() {
        let pages: Vec<FsmPage> = (0..MAX_PAGES as u32)
            .map(|i| FsmPage {
                rel: RelFileNode { spc: 1663, db: 5, rel: 16384 + i },
                block: i % 3,
                page: page(i as u8),
            })
            .collect();
        let bytes = encode(&pages);
        assert!(bytes.len() < MAX_PAGES * ENTRY / 20, "{} bytes", bytes.len());
        assert_eq!(decode(&bytes).unwrap(), pages);
    }

    #[test]
    fn the_vector_decodes() {
        // One all-zero page of 1663/5/16384_fsm block 2, as version 1 writes it.
        let one = FsmPage { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, block: 2, page: Box::new([0; BLCKSZ]) };
        let bytes = encode(std::slice::from_ref(&one));
        assert_eq!(&bytes[..7], b"SFSM\x01\x01\x00");
        assert_eq!(decode(&bytes).unwrap(), vec![one]);
    }

    #[test]
    fn bad_payloads_are_refused() {
        let good = encode(&[FsmPage { rel: RelFileNode { spc: 1663, db: 5, rel: 1 }, block: 0, page: page(7) }]);
        assert_eq!(decode(&good[..5]), Err(FsmMessageError::Short(5)));
        let mut m = good.clone();
        m[0] = b'X';
        assert!(matches!(decode(&m), Err(FsmMessageError::Magic(_))));
        let mut m = good.clone();
        m[4] = 2;
        assert_eq!(decode(&m), Err(FsmMessageError::Version(2)));
        for count in [0u16, 65] {
            let mut m = good.clone();
            m[5..7].copy_from_slice(&count.to_le_bytes());
            assert_eq!(decode(&m), Err(FsmMessageError::Count(count)));
        }
        // A count above what the frame holds, a frame cut short, one too large.
        let mut m = good.clone();
        m[5] = 2;
        assert!(matches!(decode(&m), Err(FsmMessageError::Body { .. })));
        assert!(matches!(decode(&good[..good.len() - 3]), Err(FsmMessageError::Body { .. })));
        let two = encode(&[
            FsmPage { rel: RelFileNode { spc: 1663, db: 5, rel: 1 }, block: 0, page: page(7) },
            FsmPage { rel: RelFileNode { spc: 1663, db: 5, rel: 1 }, block: 1, page: page(8) },
        ]);
        let mut m = two.clone();
        m[5] = 1;
        assert!(matches!(decode(&m), Err(FsmMessageError::Body { .. })));
    }

    #[test]
    fn map_sizes_follow_postgres_layout() {
        assert_eq!(SLOTS_PER_PAGE, 4069);
        // Root, one inner page, one leaf: three blocks for up to 4069 heap blocks.
        assert_eq!(blocks_for_heap(0), 0);
        assert_eq!(blocks_for_heap(1), 3);
        assert_eq!(blocks_for_heap(4069), 3);
        assert_eq!(blocks_for_heap(4070), 4);
        // The second inner page comes after the first one's 4069 leaves.
        assert_eq!(blocks_for_heap(4069 * 4069), 2 + 4069);
        assert_eq!(blocks_for_heap(4069 * 4069 + 1), 2 + 4069 + 2);
        // A cut inside the first leaf keeps it; a cut at a leaf's start drops it.
        assert_eq!(blocks_after_truncate(0), 2);
        assert_eq!(blocks_after_truncate(10), 3);
        assert_eq!(blocks_after_truncate(4069), 3);
        assert_eq!(blocks_after_truncate(4070), 4);
    }
}
