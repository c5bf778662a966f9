//! One WAL record: the `XLogRecord` header, its block references and main data.
//!
//! Layout (all little-endian, no padding between fragments):
//! header (24 bytes) · block headers · optional origin / top-level xid ·
//! main-data header · block images and block data, block by block · main data.
//! The CRC-32C covers everything after the header, then the header up to the
//! CRC field.

use std::ops::Range;

use crate::lsn::Lsn;
use crate::types::{BlockNumber, Cursor, ForkNumber, RelFileNode, TransactionId};
use crate::version::{PgVersion, BLCKSZ};

/// Size of `XLogRecord`.
pub const RECORD_HEADER_SIZE: usize = 24;
/// Bits of `xl_info` reserved for the WAL machinery; the rest belong to the rmgr.
pub const XLR_INFO_MASK: u8 = 0x0F;
/// Bits of `xl_info` owned by the resource manager.
pub const XLR_RMGR_INFO_MASK: u8 = 0xF0;
/// The record changes relation files in ways redo must know about.
pub const XLR_SPECIAL_REL_UPDATE: u8 = 0x01;
/// Every block of the record carries an image for `wal_consistency_checking`.
pub const XLR_CHECK_CONSISTENCY: u8 = 0x02;
/// Largest block id a record may reference.
pub const XLR_MAX_BLOCK_ID: u8 = 32;
/// Fragment ids that are not block references.
pub const XLR_BLOCK_ID_DATA_SHORT: u8 = 255;
pub const XLR_BLOCK_ID_DATA_LONG: u8 = 254;
pub const XLR_BLOCK_ID_ORIGIN: u8 = 253;
pub const XLR_BLOCK_ID_TOPLEVEL_XID: u8 = 252;

/// Flags of a block header's `fork_flags` byte.
pub const BKPBLOCK_FORK_MASK: u8 = 0x0F;
pub const BKPBLOCK_HAS_IMAGE: u8 = 0x10;
pub const BKPBLOCK_HAS_DATA: u8 = 0x20;
pub const BKPBLOCK_WILL_INIT: u8 = 0x40;
pub const BKPBLOCK_SAME_REL: u8 = 0x80;

/// Flags of a block image's `bimg_info` byte.
pub const BKPIMAGE_HAS_HOLE: u8 = 0x01;
pub const BKPIMAGE_APPLY: u8 = 0x02;
pub const BKPIMAGE_COMPRESS_PGLZ: u8 = 0x04;
pub const BKPIMAGE_COMPRESS_LZ4: u8 = 0x08;
pub const BKPIMAGE_COMPRESS_ZSTD: u8 = 0x10;
const BKPIMAGE_COMPRESSED_MASK: u8 = BKPIMAGE_COMPRESS_PGLZ | BKPIMAGE_COMPRESS_LZ4 | BKPIMAGE_COMPRESS_ZSTD;

/// The fixed record header (`XLogRecord`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub total_length: u32,
    pub xid: TransactionId,
    pub prev: Lsn,
    pub info: u8,
    pub rmgr: u8,
    pub crc: u32,
}

impl RecordHeader {
    /// Decodes the header from the first 24 bytes of `bytes`.
    pub fn decode(bytes: &[u8]) -> Option<RecordHeader> {
        if bytes.len() < RECORD_HEADER_SIZE {
            return None;
        }
        Some(RecordHeader {
            total_length: u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
            xid: u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
            prev: Lsn(u64::from_le_bytes(bytes[8..16].try_into().unwrap())),
            info: bytes[16],
            rmgr: bytes[17],
            crc: u32::from_le_bytes(bytes[20..24].try_into().unwrap()),
        })
    }

    /// Encodes the header (padding zeroed).
    pub fn encode(&self) -> [u8; RECORD_HEADER_SIZE] {
        let mut out = [0u8; RECORD_HEADER_SIZE];
        out[0..4].copy_from_slice(&self.total_length.to_le_bytes());
        out[4..8].copy_from_slice(&self.xid.to_le_bytes());
        out[8..16].copy_from_slice(&self.prev.0.to_le_bytes());
        out[16] = self.info;
        out[17] = self.rmgr;
        out[20..24].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// The resource-manager-owned bits of `xl_info`.
    pub fn rmgr_info(&self) -> u8 {
        self.info & XLR_RMGR_INFO_MASK
    }
}

/// Computes the CRC-32C of a complete record as PostgreSQL does.
pub fn record_crc(record: &[u8]) -> u32 {
    debug_assert!(record.len() >= RECORD_HEADER_SIZE);
    let crc = crc32c::crc32c(&record[RECORD_HEADER_SIZE..]);
    crc32c::crc32c_append(crc, &record[..20])
}

/// Compression of a block image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageCompression {
    None,
    Pglz,
    Lz4,
    Zstd,
}

impl ImageCompression {
    /// Name as pg_waldump prints it.
    pub fn name(self) -> &'static str {
        match self {
            ImageCompression::None => "none",
            ImageCompression::Pglz => "pglz",
            ImageCompression::Lz4 => "lz4",
            ImageCompression::Zstd => "zstd",
        }
    }
}

/// A full-page image carried by a block reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockImage {
    /// `bimg_info` flags.
    pub info: u8,
    pub hole_offset: u16,
    pub hole_length: u16,
    /// Where the (possibly compressed) image bytes are in the record.
    pub data: Range<usize>,
}

impl BlockImage {
    /// Whether redo restores this image (false: it is only for consistency checking).
    pub fn apply(&self) -> bool {
        self.info & BKPIMAGE_APPLY != 0
    }

    /// How the image bytes are compressed.
    pub fn compression(&self) -> ImageCompression {
        if self.info & BKPIMAGE_COMPRESS_PGLZ != 0 {
            ImageCompression::Pglz
        } else if self.info & BKPIMAGE_COMPRESS_LZ4 != 0 {
            ImageCompression::Lz4
        } else if self.info & BKPIMAGE_COMPRESS_ZSTD != 0 {
            ImageCompression::Zstd
        } else {
            ImageCompression::None
        }
    }
}

/// One block reference of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub id: u8,
    pub rel: RelFileNode,
    pub fork: ForkNumber,
    pub block: BlockNumber,
    /// `fork_flags` byte as written.
    pub flags: u8,
    pub image: Option<BlockImage>,
    /// Where the block's rmgr-specific data is in the record (may be empty).
    pub data: Range<usize>,
}

impl BlockRef {
    /// Redo initializes the page from scratch (the old contents do not matter).
    pub fn will_init(&self) -> bool {
        self.flags & BKPBLOCK_WILL_INIT != 0
    }
}

/// A complete, CRC-checked WAL record with its fragments located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedRecord {
    /// The PostgreSQL major that wrote it: resource managers' record
    /// layouts differ between majors (`PgVersion`).
    pub version: PgVersion,
    /// LSN of the first byte of the record.
    pub lsn: Lsn,
    /// LSN where the next record may start (MAXALIGNed end; a segment boundary after XLOG SWITCH).
    pub end_lsn: Lsn,
    pub header: RecordHeader,
    /// Replication origin, if the record carries one.
    pub origin: Option<u16>,
    /// Top-level transaction of a subtransaction's record, if logged.
    pub toplevel_xid: Option<TransactionId>,
    pub blocks: Vec<BlockRef>,
    /// Where the main data is in `raw`.
    pub main_data: Range<usize>,
    /// The whole record, header included, without page headers.
    pub raw: Vec<u8>,
}

/// Why a record's fragments could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record truncated: {0}")]
    Truncated(#[from] crate::types::Truncated),
    #[error("out-of-order block_id {0}")]
    OutOfOrderBlock(u8),
    #[error("invalid block_id {0}")]
    InvalidBlockId(u8),
    #[error("invalid fork number {fork} in block {block_id}")]
    InvalidFork { block_id: u8, fork: u8 },
    #[error("block {0}: BKPBLOCK_HAS_DATA and data length disagree")]
    DataLengthMismatch(u8),
    #[error("block {block_id}: invalid image header: {reason}")]
    InvalidImage { block_id: u8, reason: &'static str },
    #[error("block {0}: BKPBLOCK_SAME_REL set but no previous relation")]
    NoPreviousRel(u8),
    #[error("fragment lengths add up to {declared} bytes but {actual} bytes follow the headers")]
    LengthMismatch { declared: usize, actual: usize },
}

impl DecodedRecord {
    /// Decodes the fragments of `raw`, a complete record whose header and CRC
    /// the caller has already validated.
    pub fn decode(version: PgVersion, lsn: Lsn, end_lsn: Lsn, raw: Vec<u8>) -> Result<DecodedRecord, RecordError> {
        let header = RecordHeader::decode(&raw).ok_or(crate::types::Truncated {
            offset: 0,
            needed: RECORD_HEADER_SIZE,
            available: raw.len(),
        })?;
        let body_len = (header.total_length as usize).min(raw.len());
        let mut cur = Cursor::new(&raw[..body_len]);
        cur.skip(RECORD_HEADER_SIZE)?;

        // Fragment headers; lengths are collected and turned into ranges below.
        struct Pending {
            block: BlockRef,
            image_len: usize,
            data_len: usize,
        }
        let mut pending: Vec<Pending> = Vec::new();
        let mut origin = None;
        let mut toplevel_xid = None;
        let mut main_len = 0usize;
        let mut last_rel: Option<RelFileNode> = None;
        let mut max_block_id: i32 = -1;
        // Bytes of image, block and main data announced so far: headers end
        // where only that much is left.
        let mut declared = 0usize;

        while cur.remaining() > declared {
            let id = cur.u8()?;
            match id {
                XLR_BLOCK_ID_DATA_SHORT => {
                    main_len = cur.u8()? as usize;
                    declared += main_len;
                    break;
                }
                XLR_BLOCK_ID_DATA_LONG => {
                    main_len = cur.u32()? as usize;
                    declared += main_len;
                    break;
                }
                XLR_BLOCK_ID_ORIGIN => origin = Some(cur.u16()?),
                XLR_BLOCK_ID_TOPLEVEL_XID => toplevel_xid = Some(cur.u32()?),
                id if id <= XLR_MAX_BLOCK_ID => {
                    if (id as i32) <= max_block_id {
                        return Err(RecordError::OutOfOrderBlock(id));
                    }
                    max_block_id = id as i32;
                    let flags = cur.u8()?;
                    let fork = ForkNumber::from_u8(flags & BKPBLOCK_FORK_MASK)
                        .ok_or(RecordError::InvalidFork { block_id: id, fork: flags & BKPBLOCK_FORK_MASK })?;
                    let data_len = cur.u16()? as usize;
                    if (flags & BKPBLOCK_HAS_DATA != 0) != (data_len > 0) {
                        return Err(RecordError::DataLengthMismatch(id));
                    }
                    let mut image = None;
                    let mut image_len = 0;
                    if flags & BKPBLOCK_HAS_IMAGE != 0 {
                        let bimg_len = cur.u16()?;
                        let hole_offset = cur.u16()?;
                        let info = cur.u8()?;
                        let compressed = info & BKPIMAGE_COMPRESSED_MASK != 0;
                        let has_hole = info & BKPIMAGE_HAS_HOLE != 0;
                        let hole_length = if compressed {
                            if has_hole {
                                cur.u16()?
                            } else {
                                0
                            }
                        } else {
                            (BLCKSZ as u16).wrapping_sub(bimg_len)
                        };
                        let bad = |reason| Err(RecordError::InvalidImage { block_id: id, reason });
                        if has_hole && (hole_offset == 0 || hole_length == 0 || bimg_len as usize == BLCKSZ) {
                            return bad("hole flag set but offset, length or image length is invalid");
                        }
                        if !has_hole && (hole_offset != 0 || hole_length != 0) {
                            return bad("no hole flag but a hole offset or length");
                        }
                        if compressed && bimg_len as usize >= BLCKSZ {
                            return bad("compressed image is not smaller than a page");
                        }
                        if !has_hole && !compressed && bimg_len as usize != BLCKSZ {
                            return bad("uncompressed image without hole is not a whole page");
                        }
                        if info & BKPIMAGE_COMPRESSED_MASK & (info & BKPIMAGE_COMPRESSED_MASK).wrapping_sub(1) != 0 {
                            return bad("more than one compression method");
                        }
                        if hole_offset as usize + hole_length as usize > BLCKSZ {
                            return bad("hole extends past the page");
                        }
                        image_len = bimg_len as usize;
                        image = Some(BlockImage { info, hole_offset, hole_length, data: 0..0 });
                    }
                    let rel = if flags & BKPBLOCK_SAME_REL == 0 {
                        cur.rel_file_node()?
                    } else {
                        last_rel.ok_or(RecordError::NoPreviousRel(id))?
                    };
                    last_rel = Some(rel);
                    let block = cur.u32()?;
                    declared += image_len + data_len;
                    pending.push(Pending {
                        block: BlockRef { id, rel, fork, block, flags, image, data: 0..0 },
                        image_len,
                        data_len,
                    });
                }
                other => return Err(RecordError::InvalidBlockId(other)),
            }
        }

        if declared != cur.remaining() {
            return Err(RecordError::LengthMismatch { declared, actual: cur.remaining() });
        }
        let mut offset = cur.position();
        let mut blocks = Vec::with_capacity(pending.len());
        for mut p in pending {
            if let Some(image) = p.block.image.as_mut() {
                image.data = offset..offset + p.image_len;
                offset += p.image_len;
            }
            p.block.data = offset..offset + p.data_len;
            offset += p.data_len;
            blocks.push(p.block);
        }
        let main_data = offset..offset + main_len;
        debug_assert_eq!(main_data.end, body_len);
        Ok(DecodedRecord { version, lsn, end_lsn, header, origin, toplevel_xid, blocks, main_data, raw })
    }

    /// The record's main data.
    pub fn main_data(&self) -> &[u8] {
        &self.raw[self.main_data.clone()]
    }

    /// The rmgr-specific data of a block reference.
    pub fn block_data(&self, block: &BlockRef) -> &[u8] {
        &self.raw[block.data.clone()]
    }

    /// The block reference with id `id`, if present.
    pub fn block(&self, id: u8) -> Option<&BlockRef> {
        self.blocks.iter().find(|b| b.id == id)
    }

    /// Resource manager id.
    pub fn rmgr(&self) -> u8 {
        self.header.rmgr
    }

    /// The rmgr-owned bits of `xl_info`.
    pub fn rmgr_info(&self) -> u8 {
        self.header.rmgr_info()
    }
}
