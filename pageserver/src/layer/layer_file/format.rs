//! The on-disk layout of layer files (format version 2, which reads version
//! 1 too; `docs/pageserver-storage.md`): sizes, flags, limits and
//! compression levels, the index entry and the header. The writer and the
//! readers share these, so the layout is stated once, with its limits
//! checked at compile time rather than found out by a reader refusing a
//! file this build wrote.

use strata_formats::Lsn;

use super::name::{LayerKind, LayerName};
use crate::key::{Key, KEY_SIZE};
use crate::layer::group;

/// The version this build writes.
pub const FORMAT_VERSION: u32 = 2;
pub(super) const HEADER_SIZE: usize = 8 + 4 + 4 + KEY_SIZE * 2 + 8 + 8 + 4;
pub(super) const FOOTER_SIZE: usize = 8 + 8 + 4 + 4 + 8;
/// key | lsn | offset | len | crc | flags | slot
pub(super) const ENTRY_SIZE: usize = KEY_SIZE + 8 + 8 + 4 + 4 + 2;
/// Index entries per block: one in-memory summary entry per block.
pub(super) const ENTRIES_PER_BLOCK: usize = 128;
/// Version 2: offset, stored length and CRC-32C of one index block.
pub(super) const BLOCK_REF_SIZE: usize = 8 + 4 + 4;
/// Version 2: the most a compressed index block may take (zstd's bound
/// for a full block, with slack).
pub(super) const MAX_STORED_BLOCK: u32 = (ENTRY_SIZE * ENTRIES_PER_BLOCK + 1024) as u32;
/// Flag: the stored bytes are zstd-compressed.
pub(super) const FLAG_ZSTD: u8 = 1;
/// Flag: the value is a base version (image or zero page).
pub(super) const FLAG_BASE: u8 = 2;
/// Flag (version 2): the stored bytes are a zstd frame of a value group;
/// the entry's slot says which value of it.
pub(super) const FLAG_GROUP: u8 = 4;
/// Values at least this large are compressed.
pub(super) const COMPRESS_MIN: usize = 256;
/// Largest value accepted when reading (a page plus slack, or a directory).
pub(super) const MAX_VALUE: u32 = 64 << 20;
/// zstd level of delta layers' values: flushes are on the ingest path.
/// Negative levels skip Huffman coding of literals, whose tables, built for
/// every value, were most of the flush's CPU.
pub(super) const DELTA_LEVEL: i32 = -1;
/// zstd level of index blocks (one per 128 entries, so their tables cost
/// little).
pub(super) const INDEX_LEVEL: i32 = 1;
/// zstd level of image layers, over groups of pages: level 3 stores about
/// what level 6 does (better on heaps, a fifth more on B-trees) at about
/// three times its speed; level 6 was most of image creation's CPU after a
/// bulk load (`docs/decisions.md`, "Image layers at zstd level 3").
pub(super) const IMAGE_LEVEL: i32 = 3;
/// An image layer's group closes at this many values...
pub(super) const GROUP_VALUES: usize = 16;
/// ...or once it holds this many bytes; a value this large is stored alone.
pub(super) const GROUP_BYTES: usize = 128 << 10;
/// A delta layer groups values smaller than this: the WAL records stored
/// for native redo, which compress poorly alone (too short for zstd to
/// find anything) and well side by side (their headers and a table's
/// tuples repeat). Page images and larger values stay alone, so that a
/// read of one page decompresses only that page.
pub(super) const DELTA_GROUP_VALUE: usize = 2 << 10;
/// A delta layer's group closes at this many values or bytes: a read of
/// one version decompresses at most about this much.
pub(super) const DELTA_GROUP_VALUES: usize = 64;
pub(super) const DELTA_GROUP_BYTES: usize = 16 << 10;

/// zstd's bound on the compressed size of `n` bytes (`ZSTD_COMPRESSBOUND`).
const fn zstd_bound(n: usize) -> usize {
    n + (n >> 8) + if n < (128 << 10) { ((128 << 10) - n) >> 11 } else { 0 }
}

// The format's limits, checked where they are set rather than found out by
// a reader refusing a file this build wrote.
// A compressed index block always fits the limit readers apply.
const _: () = assert!(zstd_bound(ENTRY_SIZE * ENTRIES_PER_BLOCK) <= MAX_STORED_BLOCK as usize);
// A group's slot is one byte.
const _: () = assert!(GROUP_VALUES <= u8::MAX as usize + 1);
const _: () = assert!(DELTA_GROUP_VALUES <= group::MAX_VALUES);
// A delta group, closed at DELTA_GROUP_BYTES with one more value below
// DELTA_GROUP_VALUE, fits what readers decompress.
const _: () = assert!(2 + 4 * DELTA_GROUP_VALUES + DELTA_GROUP_BYTES + DELTA_GROUP_VALUE <= group::MAX_PAYLOAD);
// A group closes once it reaches GROUP_BYTES, and takes only values smaller
// than that: compressed, it stays within the largest value readers accept.
const _: () = assert!(zstd_bound(2 * GROUP_BYTES) <= MAX_VALUE as usize);
// A page, compressed or not, is a value readers accept.
const _: () = assert!(zstd_bound(8192) <= MAX_VALUE as usize);
// Index blocks, values and the table are addressed by u32 lengths.
const _: () = assert!(ENTRY_SIZE * ENTRIES_PER_BLOCK <= u32::MAX as usize);
// The header ends with its CRC; the footer with the 8-byte end magic.
const _: () = assert!(HEADER_SIZE > 4 && FOOTER_SIZE >= 8 + 8 + 4 + 4 + 8);

impl LayerKind {
    /// The first bytes of a file of this kind.
    pub(super) fn magic(self) -> &'static [u8; 8] {
        match self {
            LayerKind::Delta => b"STRDELTA",
            LayerKind::Image => b"STRIMAGE",
        }
    }

    /// The last bytes of a file of this kind: a file without them was not
    /// written to the end.
    pub(super) fn end_magic(self) -> &'static [u8; 8] {
        match self {
            LayerKind::Delta => b"STRDLEND",
            LayerKind::Image => b"STRIMEND",
        }
    }
}

/// One index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) key: Key,
    pub(super) lsn: Lsn,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) crc: u32,
    pub(super) flags: u8,
    /// Which value of a group (`FLAG_GROUP`); 0 otherwise.
    pub(super) slot: u8,
}

impl Entry {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        // Checked before writing: readers refuse a longer value.
        debug_assert!(self.len <= MAX_VALUE, "a value of {} bytes is past the format's limit", self.len);
        debug_assert!(self.flags & FLAG_GROUP != 0 || self.slot == 0, "a slot outside a group");
        let start = out.len();
        out.extend_from_slice(&self.key.encode());
        out.extend_from_slice(&self.lsn.0.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.push(self.flags);
        out.push(self.slot);
        debug_assert_eq!(out.len() - start, ENTRY_SIZE);
    }

    pub(super) fn decode(b: &[u8]) -> Entry {
        debug_assert_eq!(b.len(), ENTRY_SIZE);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Entry {
            key: Key::decode(b[..KEY_SIZE].try_into().expect("key bytes")),
            lsn: Lsn(u64_at(KEY_SIZE)),
            offset: u64_at(KEY_SIZE + 8),
            len: u32_at(KEY_SIZE + 16),
            crc: u32_at(KEY_SIZE + 20),
            flags: b[KEY_SIZE + 24],
            slot: b[KEY_SIZE + 25],
        }
    }

    /// Why the flags and slot are not valid in a file of `version`, if so.
    pub(super) fn check_flags(&self, version: u32) -> Result<(), String> {
        if self.flags & !(FLAG_ZSTD | FLAG_BASE | FLAG_GROUP) != 0 {
            return Err(format!("unknown flags {:#04x}", self.flags));
        }
        let group = self.flags & FLAG_GROUP != 0;
        if group && (version < 2 || self.flags & FLAG_ZSTD != 0) {
            return Err(format!("group flag with flags {:#04x} in format version {version}", self.flags));
        }
        if !group && self.slot != 0 {
            return Err(format!("slot {} outside a value group", self.slot));
        }
        Ok(())
    }
}

/// The header of a layer file named `name`.
pub(super) fn encode_header(name: &LayerName) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_SIZE);
    header.extend_from_slice(name.kind.magic());
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&name.key_start.encode());
    header.extend_from_slice(&name.key_end.encode());
    header.extend_from_slice(&name.lsn_start.0.to_le_bytes());
    header.extend_from_slice(&name.lsn_end.0.to_le_bytes());
    let crc = crc32c::crc32c(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(header.len(), HEADER_SIZE);
    header
}

/// A version as a layer file stores it: possibly compressed, with its
/// flags. A value of a group comes out on its own, uncompressed. A scan
/// hands these out and a writer takes them, so compaction copies values
/// without decompressing them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawVersion {
    pub key: Key,
    pub lsn: Lsn,
    pub flags: u8,
    /// Empty when only keys are scanned.
    pub bytes: Vec<u8>,
}

impl RawVersion {
    /// Whether the value is a base version (an image or a zero page).
    pub fn is_base(&self) -> bool {
        self.flags & FLAG_BASE != 0
    }
}
