//! PostgreSQL's data page checksum (clusters initialized with `initdb -k`).
//!
//! The algorithm is a vectorizable variant of FNV-1a: the page is read as
//! 32-bit words and spread over 32 independent lanes (word `i` goes to lane
//! `i % 32`), each seeded with a fixed random offset. Each step is
//! `t = sum ^ word; sum = t * FNV_PRIME ^ (t >> 17)` — the extra shift mixes
//! high bits back down, which plain FNV-1a on whole words would not. After
//! the page, every lane absorbs two zero words, the lanes are xor-folded to
//! one u32, the block number is xor-ed in (so a page written to the wrong
//! block fails verification) and the result is reduced to `1..=65535`
//! (never 0, so "checksum missing" and "checksum present" are distinguishable).
//!
//! The stored `pd_checksum` field is treated as zero while computing.
//! Words are read little-endian: a page checksum depends on the byte order
//! of the machine that wrote it, and Strata only supports little-endian.

use super::PAGE_SIZE;

/// Number of parallel lanes.
const N_SUMS: usize = 32;
/// The 32-bit FNV prime.
const FNV_PRIME: u32 = 16_777_619;
/// Number of 32-word rows in a page.
const ROWS: usize = PAGE_SIZE / (4 * N_SUMS);
/// Index (in 32-bit words) of the word holding `pd_checksum` (low half) and `pd_flags` (high half).
const CHECKSUM_WORD: usize = 2;

/// Initial value of each lane.
const BASE_OFFSETS: [u32; N_SUMS] = [
    0x5B1F36E9, 0xB8525960, 0x02AB50AA, 0x1DE66D2A, 0x79FF467A, 0x9BB9F8A3, 0x217E7CD2, 0x83E13D2C, 0xF8D4474F,
    0xE39EB970, 0x42C6AE16, 0x993216FA, 0x7B093B5D, 0x98DAFF3C, 0xF718902A, 0x0B1C9CDB, 0xE58F764B, 0x187636BC,
    0x5D7B3BB1, 0xE73DE7DE, 0x92BEC979, 0xCCA6C0B2, 0x304A0979, 0x85AA43D4, 0x783125BB, 0x6CA8EAA2, 0xE407EAC6,
    0x4B5CFC3E, 0x9FBF8C76, 0x15CA20BE, 0xF2CA9FD3, 0x959BD756,
];

#[inline(always)]
fn mix(sum: u32, value: u32) -> u32 {
    let t = sum ^ value;
    t.wrapping_mul(FNV_PRIME) ^ (t >> 17)
}

/// The 32-bit block hash before the block number and final reduction are applied.
fn checksum_block(page: &[u8; PAGE_SIZE]) -> u32 {
    let mut sums = BASE_OFFSETS;
    for row in 0..ROWS {
        for (lane, sum) in sums.iter_mut().enumerate() {
            let idx = row * N_SUMS + lane;
            let b = &page[idx * 4..idx * 4 + 4];
            let mut word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if idx == CHECKSUM_WORD {
                // Ignore the stored checksum, keep pd_flags.
                word &= 0xFFFF_0000;
            }
            *sum = mix(*sum, word);
        }
    }
    for _ in 0..2 {
        for sum in sums.iter_mut() {
            *sum = mix(*sum, 0);
        }
    }
    sums.iter().fold(0, |acc, s| acc ^ s)
}

/// Computes the checksum PostgreSQL would store in `pd_checksum` for this page at `block_number`.
///
/// `block_number` is the block's position within its relation fork
/// (segment files do not restart the numbering). PostgreSQL never checksums
/// new (`pd_upper == 0`) pages; this function computes a value anyway.
pub fn page_checksum(page: &[u8; PAGE_SIZE], block_number: u32) -> u16 {
    let hash = checksum_block(page) ^ block_number;
    ((hash % 65535) + 1) as u16
}

/// Computes the checksum and stores it in `pd_checksum`; returns the stored value.
pub fn set_checksum(page: &mut [u8; PAGE_SIZE], block_number: u32) -> u16 {
    let c = page_checksum(page, block_number);
    page[8..10].copy_from_slice(&c.to_le_bytes());
    c
}

/// True if the stored `pd_checksum` matches, or if the page is all zeros
/// (PostgreSQL accepts never-written pages, which carry no checksum).
pub fn verify_checksum(page: &[u8; PAGE_SIZE], block_number: u32) -> bool {
    let stored = u16::from_le_bytes([page[8], page[9]]);
    stored == page_checksum(page, block_number) || super::is_all_zeros(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages from a PostgreSQL 15 cluster created with data checksums, with their block numbers.
    const VECTORS: [(&str, &[u8; PAGE_SIZE], u32); 4] = [
        ("heap_blk0", include_bytes!("../../tests/data/page/heap_blk0.page"), 0),
        ("heap_blk1", include_bytes!("../../tests/data/page/heap_blk1.page"), 1),
        ("pg_class_blk0", include_bytes!("../../tests/data/page/pg_class_blk0.page"), 0),
        ("btree_blk1", include_bytes!("../../tests/data/page/btree_blk1.page"), 1),
    ];

    fn stored(page: &[u8; PAGE_SIZE]) -> u16 {
        u16::from_le_bytes([page[8], page[9]])
    }

    #[test]
    fn real_pages_match_stored_checksum() {
        for (name, page, blkno) in VECTORS {
            assert_ne!(stored(page), 0, "{name} has no checksum");
            assert_eq!(page_checksum(page, blkno), stored(page), "{name}");
            assert!(verify_checksum(page, blkno), "{name}");
        }
    }

    #[test]
    fn block_number_is_mixed_in() {
        for (name, page, blkno) in VECTORS {
            assert_ne!(page_checksum(page, blkno + 1), stored(page), "{name}");
            assert!(!verify_checksum(page, blkno ^ 0x10), "{name}");
        }
    }

    #[test]
    fn any_flipped_byte_changes_checksum() {
        let (_, page, blkno) = VECTORS[0];
        let mut copy = *page;
        // A sample of positions across the page, skipping the checksum field itself.
        for pos in (0..PAGE_SIZE).step_by(61).filter(|p| !(8..10).contains(p)) {
            copy[pos] ^= 0x01;
            assert_ne!(page_checksum(&copy, blkno), stored(page), "flip at {pos}");
            copy[pos] ^= 0x01;
        }
        copy[4000] ^= 0x80;
        assert!(!verify_checksum(&copy, blkno));
    }

    #[test]
    fn stored_checksum_is_ignored_and_set_checksum_restores_it() {
        let (_, page, blkno) = VECTORS[1];
        let mut copy = *page;
        copy[8] = 0x12;
        copy[9] = 0x34;
        assert_eq!(page_checksum(&copy, blkno), stored(page));
        assert_eq!(set_checksum(&mut copy, blkno), stored(page));
        assert_eq!(&copy, page);
    }

    #[test]
    fn checksum_is_never_zero_and_zero_page_verifies() {
        let zero = [0u8; PAGE_SIZE];
        for blkno in [0, 1, 2, 1000, u32::MAX] {
            assert_ne!(page_checksum(&zero, blkno), 0);
            assert!(verify_checksum(&zero, blkno));
        }
    }
}
