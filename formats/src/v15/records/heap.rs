//! Heap and Heap2: the visibility-map changes that heap records make without
//! a block reference to the VM page (redo derives the VM page from the heap
//! block), so a page server must apply them itself.

use crate::types::{BlockNumber, Cursor, RelFileNode, Truncated};
use crate::version::BLCKSZ;
use crate::wal::record::DecodedRecord;

pub const XLOG_HEAP_INSERT: u8 = 0x00;
pub const XLOG_HEAP_DELETE: u8 = 0x10;
pub const XLOG_HEAP_UPDATE: u8 = 0x20;
pub const XLOG_HEAP_TRUNCATE: u8 = 0x30;
pub const XLOG_HEAP_HOT_UPDATE: u8 = 0x40;
pub const XLOG_HEAP_CONFIRM: u8 = 0x50;
pub const XLOG_HEAP_LOCK: u8 = 0x60;
pub const XLOG_HEAP_INPLACE: u8 = 0x70;
pub const XLOG_HEAP_OPMASK: u8 = 0x70;
/// The record initializes its target page.
pub const XLOG_HEAP_INIT_PAGE: u8 = 0x80;

pub const XLOG_HEAP2_REWRITE: u8 = 0x00;
pub const XLOG_HEAP2_PRUNE: u8 = 0x10;
pub const XLOG_HEAP2_VACUUM: u8 = 0x20;
pub const XLOG_HEAP2_FREEZE_PAGE: u8 = 0x30;
pub const XLOG_HEAP2_VISIBLE: u8 = 0x40;
pub const XLOG_HEAP2_MULTI_INSERT: u8 = 0x50;
pub const XLOG_HEAP2_LOCK_UPDATED: u8 = 0x60;
pub const XLOG_HEAP2_NEW_CID: u8 = 0x70;

const XLH_INSERT_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
const XLH_DELETE_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
const XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
const XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED: u8 = 1 << 1;
const XLH_LOCK_ALL_FROZEN_CLEARED: u8 = 1 << 0;

/// Visibility-map bit: every tuple on the heap page is visible to everyone.
pub const VISIBILITYMAP_ALL_VISIBLE: u8 = 0x01;
/// Visibility-map bit: every tuple on the heap page is frozen.
pub const VISIBILITYMAP_ALL_FROZEN: u8 = 0x02;
/// Both bits.
pub const VISIBILITYMAP_VALID_BITS: u8 = 0x03;
/// Heap blocks covered by one VM page: 2 bits each in the page minus its header.
pub const HEAPBLOCKS_PER_VM_PAGE: u32 = ((BLCKSZ - 24) * 4) as u32;

/// Clear `bits` for `heap_block` of `rel` in the visibility map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VmClear {
    pub rel: RelFileNode,
    pub heap_block: BlockNumber,
    pub bits: u8,
}

impl VmClear {
    /// The VM page holding this heap block's bits.
    pub fn vm_block(&self) -> BlockNumber {
        self.heap_block / HEAPBLOCKS_PER_VM_PAGE
    }

    /// Byte offset within the VM page's map area, and the bit shift within that byte.
    pub fn vm_byte_and_shift(&self) -> (usize, u32) {
        let within = self.heap_block % HEAPBLOCKS_PER_VM_PAGE;
        ((within / 4) as usize, (within % 4) * 2)
    }
}

/// Error for a heap record whose block references do not fit its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeapParseError {
    #[error(transparent)]
    Truncated(#[from] Truncated),
    #[error("heap record has no block reference 0")]
    MissingBlock,
}

fn flags_at(data: &[u8], offset: usize) -> Result<u8, Truncated> {
    let mut c = Cursor::new(data);
    c.skip(offset)?;
    c.u8()
}

/// The visibility-map bits a Heap (`heap2 = false`) or Heap2 record clears.
pub fn vm_clears(record: &DecodedRecord, heap2: bool) -> Result<Vec<VmClear>, HeapParseError> {
    let info = record.rmgr_info();
    let data = record.main_data();
    let block0 = || record.block(0).ok_or(HeapParseError::MissingBlock);
    let mut out = Vec::new();
    let mut push = |rel, heap_block, bits| out.push(VmClear { rel, heap_block, bits });
    if heap2 {
        match info & XLOG_HEAP_OPMASK {
            XLOG_HEAP2_MULTI_INSERT if flags_at(data, 0)? & XLH_INSERT_ALL_VISIBLE_CLEARED != 0 => {
                let b = block0()?;
                push(b.rel, b.block, VISIBILITYMAP_VALID_BITS);
            }
            XLOG_HEAP2_LOCK_UPDATED if flags_at(data, 7)? & XLH_LOCK_ALL_FROZEN_CLEARED != 0 => {
                let b = block0()?;
                push(b.rel, b.block, VISIBILITYMAP_ALL_FROZEN);
            }
            _ => {}
        }
        return Ok(out);
    }
    match info & XLOG_HEAP_OPMASK {
        XLOG_HEAP_INSERT if flags_at(data, 2)? & XLH_INSERT_ALL_VISIBLE_CLEARED != 0 => {
            let b = block0()?;
            push(b.rel, b.block, VISIBILITYMAP_VALID_BITS);
        }
        XLOG_HEAP_DELETE if flags_at(data, 7)? & XLH_DELETE_ALL_VISIBLE_CLEARED != 0 => {
            let b = block0()?;
            push(b.rel, b.block, VISIBILITYMAP_VALID_BITS);
        }
        XLOG_HEAP_UPDATE | XLOG_HEAP_HOT_UPDATE => {
            let flags = flags_at(data, 7)?;
            let new = block0()?;
            // Block 1 is the old page when the new version went elsewhere.
            let old_block = record.block(1).map_or(new.block, |b| b.block);
            if flags & XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED != 0 {
                push(new.rel, old_block, VISIBILITYMAP_VALID_BITS);
            }
            if flags & XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED != 0 {
                push(new.rel, new.block, VISIBILITYMAP_VALID_BITS);
            }
        }
        XLOG_HEAP_LOCK if flags_at(data, 7)? & XLH_LOCK_ALL_FROZEN_CLEARED != 0 => {
            let b = block0()?;
            push(b.rel, b.block, VISIBILITYMAP_ALL_FROZEN);
        }
        _ => {}
    }
    Ok(out)
}
