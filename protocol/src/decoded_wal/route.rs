//! Which shard needs which part of a record.

use strata_formats::types::ForkNumber;
use strata_formats::v15::records::xlog::{self, XlogRecord};
use strata_formats::v15::records::{self, ParsedRecord};
use strata_formats::version::BLCKSZ;
use strata_formats::wal::record::DecodedRecord;

use super::types::{BlockExtent, Skeleton};
use super::wire::BatchBuilder;
use crate::shard::ShardLayout;

/// Heap blocks whose bits one visibility-map page holds (two bits each on
/// the page after its 24-byte header).
const HEAP_BLOCKS_PER_VM_PAGE: u32 = ((BLCKSZ - 24) * 4) as u32;

/// What one shard receives of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Whole,
    Skeleton,
    Omit,
}

/// How a record reaches every shard of a layout, worked out once per
/// record however many shards stream it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routing {
    /// Bit `n` set: shard `n` needs the whole record.
    whole: u64,
    /// Whether a skeleton changes anything: the record touches a block
    /// (whose relation's size every shard keeps) or carries a transaction id.
    skeleton: bool,
}

impl Routing {
    pub fn for_shard(&self, number: u8) -> Route {
        debug_assert!(number < 64, "at most 64 shards");
        if self.whole & (1u64 << number) != 0 {
            Route::Whole
        } else if self.skeleton {
            Route::Skeleton
        } else {
            Route::Omit
        }
    }
}

/// Routes `rec` for `layout`. Records that change what every shard keeps
/// (and records that do not parse, so that each shard reports them as its
/// own ingest would) go whole to all; a record of blocks only goes whole
/// to the shards that hold one of its blocks or a visibility-map page it
/// clears bits on, and as a skeleton to the rest.
pub fn route(rec: &DecodedRecord, layout: ShardLayout) -> Routing {
    let all = if layout.count >= 64 { u64::MAX } else { (1u64 << layout.count.max(1)) - 1 };
    let skeleton = skeleton_matters(rec);
    let parsed = match records::parse(rec) {
        Ok(p) => p,
        Err(_) => return Routing { whole: all, skeleton },
    };
    let mut whole = 0u64;
    match &parsed {
        None | Some(ParsedRecord::GistFollowRight { .. }) => {}
        Some(ParsedRecord::Xlog(XlogRecord::FullPageImage { .. })) => {}
        // Free space map pages change every shard's fork sizes; other
        // messages are for logical decoding, which no shard does.
        Some(ParsedRecord::LogicalMessage(m)) if m.prefix != crate::fsm_pages::PREFIX.as_bytes() => {}
        Some(ParsedRecord::VmClear(clears)) => {
            for c in clears {
                let vm_block = c.heap_block / HEAP_BLOCKS_PER_VM_PAGE;
                whole |= 1u64 << layout.shard_of_block(c.rel.rel, ForkNumber::VisibilityMap, vm_block);
            }
        }
        Some(_) => return Routing { whole: all, skeleton },
    }
    for b in &rec.blocks {
        whole |= 1u64 << layout.shard_of_block(b.rel.rel, b.fork, b.block);
    }
    Routing { whole: whole & all, skeleton }
}

/// The blocks a skeleton carries: every block reference but a hint's
/// without an image (ingest skips those: hints are never needed).
fn sized_blocks(rec: &DecodedRecord) -> impl Iterator<Item = BlockExtent> + '_ {
    let hint = xlog::is_fpi_for_hint(rec);
    rec.blocks.iter().filter(move |b| !(hint && b.image.is_none())).map(|b| BlockExtent {
        rel: b.rel,
        fork: b.fork,
        block: b.block,
    })
}

fn skeleton_matters(rec: &DecodedRecord) -> bool {
    rec.header.xid != 0 || rec.toplevel_xid.is_some_and(|x| x != 0) || sized_blocks(rec).next().is_some()
}

/// The skeleton of `rec`.
pub fn skeleton(rec: &DecodedRecord) -> Skeleton {
    Skeleton {
        lsn: rec.lsn,
        end_lsn: rec.end_lsn,
        xid: rec.header.xid,
        toplevel_xid: rec.toplevel_xid,
        blocks: sized_blocks(rec).collect(),
    }
}

/// What one shard's stream sends of each record, in order. A skeleton
/// with the same blocks and transaction ids as the last one sent, and no
/// whole record between them, changes nothing on the shard (the sizes are
/// already that large, the ids already seen) and is dropped: a bulk load's
/// rows into one page of another shard cost that shard one skeleton per
/// page, not one per row. A whole record resets it, since it may change a
/// size a later skeleton must set again (a truncation).
pub struct ShardFilter {
    shard: u8,
    last_skeleton: Option<Skeleton>,
}

impl ShardFilter {
    pub fn new(shard: u8) -> ShardFilter {
        ShardFilter { shard, last_skeleton: None }
    }

    /// Adds `rec`, routed by `routing`, to `batch` as this shard needs it;
    /// says what was added (`Omit`: nothing).
    pub fn add(&mut self, batch: &mut BatchBuilder, rec: &DecodedRecord, routing: &Routing) -> Route {
        match routing.for_shard(self.shard) {
            Route::Whole => {
                batch.add_whole(rec);
                self.last_skeleton = None;
                Route::Whole
            }
            Route::Skeleton => {
                let s = skeleton(rec);
                if self.last_skeleton.as_ref().is_some_and(|last| last.same_effect(&s)) {
                    return Route::Omit;
                }
                batch.add_skeleton(&s);
                self.last_skeleton = Some(s);
                Route::Skeleton
            }
            Route::Omit => Route::Omit,
        }
    }
}
