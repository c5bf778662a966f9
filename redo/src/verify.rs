//! The oracle of native redo: apply a record to the page as it was before,
//! and compare the result with the image PostgreSQL logged of the page after
//! the change (`wal_consistency_checking`, or a full-page write), under
//! PostgreSQL's masking rules.
//!
//! Visibility-map pages: PostgreSQL masks them as heap pages, which hides
//! the whole map, but computes read these bits (index-only scans). Only the
//! bits of the heap block the record is about are compared (and the
//! header): other blocks' bits may already have been cleared in memory by a
//! change whose WAL record comes later, when PostgreSQL took the image.

use strata_formats::page::mask::{mask_page_at, PageKind};
use strata_formats::types::ForkNumber;
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::DecodedRecord;

use crate::{redo_block, RedoError};

/// Where native redo and PostgreSQL's image of a block differ (after masking).
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// First differing byte in the page.
    pub offset: usize,
    /// PostgreSQL's byte there, and ours.
    pub expected: u8,
    pub got: u8,
    /// Both pages, masked, for a closer look.
    pub expected_page: Box<[u8; BLCKSZ]>,
    pub got_page: Box<[u8; BLCKSZ]>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "first difference at byte {}: PostgreSQL has {:#04x}, native redo {:#04x}",
            self.offset, self.expected, self.got
        )
    }
}

/// The masking rules for a block of a record.
pub fn mask_kind(rmgr: u8, fork: ForkNumber) -> PageKind {
    if fork == ForkNumber::VisibilityMap {
        return PageKind::Unknown;
    }
    PageKind::from_rmgr(rmgr).unwrap_or(PageKind::Unknown)
}

/// Redoes block `block_id` of `rec` on `before` and compares the result with
/// `image`, PostgreSQL's page after the record. Returns our page and the
/// mismatch, if any.
pub fn check_block(
    rec: &DecodedRecord,
    block_id: u8,
    before: &[u8; BLCKSZ],
    image: &[u8; BLCKSZ],
) -> Result<(Box<[u8; BLCKSZ]>, Option<Mismatch>), RedoError> {
    let block = rec.block(block_id).ok_or(RedoError::NoBlock(block_id))?;
    let mut ours = Box::new(*before);
    redo_block(rec, block_id, &mut ours)?;
    let kind = mask_kind(rec.rmgr(), block.fork);
    let mut got = ours.clone();
    let mut expected = Box::new(*image);
    mask_page_at(&mut got, kind, block.block);
    mask_page_at(&mut expected, kind, block.block);
    if block.fork == ForkNumber::VisibilityMap {
        let heap_block = rec.blocks.iter().find(|b| b.fork == ForkNumber::Main).map(|b| b.block);
        keep_only_vm_bits(&mut got, heap_block);
        keep_only_vm_bits(&mut expected, heap_block);
    }
    let mismatch = expected.iter().zip(got.iter()).position(|(a, b)| a != b).map(|offset| Mismatch {
        offset,
        expected: expected[offset],
        got: got[offset],
        expected_page: expected,
        got_page: got,
    });
    Ok((ours, mismatch))
}

/// Zeroes a visibility-map page's map except the two bits of `heap_block`.
fn keep_only_vm_bits(page: &mut [u8; BLCKSZ], heap_block: Option<u32>) {
    const HEADER: usize = 24;
    let keep = heap_block.map(|b| {
        let in_page = (b % crate::HEAPBLOCKS_PER_VM_PAGE) as usize;
        (HEADER + in_page / 4, 0x03u8 << (2 * (in_page % 4)))
    });
    for (i, byte) in page.iter_mut().enumerate().skip(HEADER) {
        match keep {
            Some((at, mask)) if at == i => *byte &= mask,
            _ => *byte = 0,
        }
    }
}
