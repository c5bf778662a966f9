//! What a decoded stream carries.

use strata_formats::types::{ForkNumber, RelFileNode, TransactionId};
use strata_formats::Lsn;

/// How a consumer asks for WAL (the stream request's `format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StreamFormat {
    /// The WAL's bytes as written.
    #[default]
    Raw,
    /// Decoded records routed to the consumer's shard ([`super`]).
    Decoded,
}

impl StreamFormat {
    pub fn to_wire(self) -> u8 {
        match self {
            StreamFormat::Raw => 0,
            StreamFormat::Decoded => 1,
        }
    }

    pub fn from_wire(v: u8) -> Option<StreamFormat> {
        match v {
            0 => Some(StreamFormat::Raw),
            1 => Some(StreamFormat::Decoded),
            _ => None,
        }
    }
}

/// A block a record touches, without its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockExtent {
    pub rel: RelFileNode,
    pub fork: ForkNumber,
    pub block: u32,
}

/// What a shard keeps of a record whose blocks are all another shard's:
/// the relation sizes it implies and the transaction ids it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skeleton {
    pub lsn: Lsn,
    pub end_lsn: Lsn,
    pub xid: TransactionId,
    pub toplevel_xid: Option<TransactionId>,
    pub blocks: Vec<BlockExtent>,
}

impl Skeleton {
    /// Whether ingesting `other` after `self` changes nothing more: the
    /// same blocks (so the same sizes) and the same transaction ids.
    pub fn same_effect(&self, other: &Skeleton) -> bool {
        self.xid == other.xid && self.toplevel_xid == other.toplevel_xid && self.blocks == other.blocks
    }
}

/// One record of a batch, as the consumer's shard needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The record's bytes (`xl_prev` and `xl_crc` zeroed).
    Whole {
        lsn: Lsn,
        end_lsn: Lsn,
        raw: Vec<u8>,
    },
    Skeleton(Skeleton),
}

impl Entry {
    pub fn lsn(&self) -> Lsn {
        match self {
            Entry::Whole { lsn, .. } => *lsn,
            Entry::Skeleton(s) => s.lsn,
        }
    }

    pub fn end_lsn(&self) -> Lsn {
        match self {
            Entry::Whole { end_lsn, .. } => *end_lsn,
            Entry::Skeleton(s) => s.end_lsn,
        }
    }
}

/// Why a batch does not decode. The stream cannot go on after one: the
/// consumer reconnects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodedWalError {
    #[error("batch of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("decompression: {0}")]
    Decompress(String),
    #[error("the batch decompressed to {got} bytes, not the {want} announced")]
    Length { got: usize, want: usize },
    #[error("batch checksum {got:#010x} is not the announced {want:#010x}")]
    Checksum { got: u32, want: u32 },
    #[error("Protobuf: {0}")]
    Protobuf(String),
    #[error("entry {index}: {reason}")]
    Entry { index: usize, reason: String },
}
