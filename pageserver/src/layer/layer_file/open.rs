//! Opening a layer file: its header, footer and whole index are checked
//! once, at open, and what reads need of them is kept in memory ([`Loaded`]:
//! where the index lies, one summary entry per index block and a key
//! filter). Reads then trust the layout and check only the bytes they read.

use std::path::Path;

use strata_formats::Lsn;

use super::decompress::decompress;
use super::format::{
    Entry, BLOCK_REF_SIZE, ENTRIES_PER_BLOCK, ENTRY_SIZE, FLAG_BASE, FOOTER_SIZE, FORMAT_VERSION, HEADER_SIZE,
    MAX_STORED_BLOCK,
};
use super::name::{LayerKind, LayerName};
use crate::key::{Key, KEY_SIZE};
use crate::layer::bloom::{self, KeyFilter};
use crate::layer::files::CachedFile;
use crate::layer::LayerError;

/// Ids of [`Loaded`] layers.
static NEXT_LOADED_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Where a layer's bytes come from: its file (through the descriptor
/// cache), or memory (tests and fuzzing).
pub(super) enum Source {
    File(CachedFile),
    Memory(Vec<u8>),
}

impl Source {
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Source::File(f) => f.read_exact_at(buf, offset),
            Source::Memory(m) => {
                let start = usize::try_from(offset).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
                let end =
                    start.checked_add(buf.len()).filter(|e| *e <= m.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buf.copy_from_slice(&m[start..end]);
                Ok(())
            }
        }
    }
}

/// Where a layer file's index lies.
enum IndexLayout {
    /// Version 1: the entries, uncompressed, from this offset.
    Plain { offset: u64 },
    /// Version 2: compressed blocks of entries; (offset, stored length, CRC-32C) of each.
    Blocks(Vec<(u64, u32, u32)>),
}

/// The part of a layer that exists only while its file is local: the
/// descriptor, the index position, the summary and the key filter.
pub(super) struct Loaded {
    /// Unique over the process's life: names this loading of this file in
    /// the per-thread group cache (an address could be reused).
    pub(super) id: u64,
    pub(super) file: Source,
    index: IndexLayout,
    pub(super) count: u64,
    /// First (key, LSN) of each index block.
    pub(super) summary: Vec<(Key, Lsn)>,
    pub(super) filter: KeyFilter,
}

impl Loaded {
    /// Opens and checks the layer file at `path` (which names it in errors)
    /// whose bytes `file` holds: header, footer, and every index entry
    /// (CRCs, order, flags, ranges, value bounds).
    pub(super) fn open(path: &Path, file: Source, file_size: u64) -> Result<(LayerName, Loaded), LayerError> {
        let p = path.display().to_string();
        let io = |source| LayerError::Io { path: p.clone(), source };
        let corrupt = |reason: String| LayerError::Corrupt { path: p.clone(), reason };
        if file_size < (HEADER_SIZE + FOOTER_SIZE) as u64 {
            return Err(corrupt(format!("{file_size} bytes is too short for a layer file")));
        }
        let mut header = [0u8; HEADER_SIZE];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let kind = match &header[..8] {
            m if m == LayerKind::Delta.magic() => LayerKind::Delta,
            m if m == LayerKind::Image.magic() => LayerKind::Image,
            _ => return Err(corrupt("bad magic".into())),
        };
        let crc = u32::from_le_bytes(header[HEADER_SIZE - 4..].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&header[..HEADER_SIZE - 4]) {
            return Err(corrupt("header CRC mismatch".into()));
        }
        let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(corrupt(format!("format version {version}, this build reads 1 to {FORMAT_VERSION}")));
        }
        let k = 16;
        let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().expect("8 bytes"));
        let name = LayerName {
            key_start: Key::decode(header[k..k + KEY_SIZE].try_into().expect("key")),
            key_end: Key::decode(header[k + KEY_SIZE..k + 2 * KEY_SIZE].try_into().expect("key")),
            lsn_start: Lsn(u64_at(k + 36)),
            lsn_end: Lsn(u64_at(k + 44)),
            kind,
        };
        if name.key_start > name.key_end || name.lsn_start >= name.lsn_end {
            return Err(corrupt(format!("empty or reversed ranges in the header: {name}")));
        }
        if kind == LayerKind::Image && name.lsn_end.0 != name.lsn_start.0.wrapping_add(1) {
            return Err(corrupt(format!("an image layer's LSN range is one LSN: {name}")));
        }
        let mut footer = [0u8; FOOTER_SIZE];
        let footer_at = file_size - FOOTER_SIZE as u64;
        file.read_exact_at(&mut footer, footer_at).map_err(io)?;
        if &footer[FOOTER_SIZE - 8..] != kind.end_magic() {
            return Err(corrupt("bad footer magic (incomplete file?)".into()));
        }
        let index_offset = u64::from_le_bytes(footer[0..8].try_into().expect("8 bytes"));
        let count = u64::from_le_bytes(footer[8..16].try_into().expect("8 bytes"));
        let index_crc = u32::from_le_bytes(footer[16..20].try_into().expect("4 bytes"));
        let (values_end, index) = if version == 1 {
            // The entries fill the space up to the footer; one CRC covers them.
            let index_len =
                count.checked_mul(ENTRY_SIZE as u64).ok_or_else(|| corrupt("entry count overflows".into()))?;
            if index_offset < HEADER_SIZE as u64 || index_offset.checked_add(index_len) != Some(footer_at) {
                return Err(corrupt(format!("index at {index_offset} with {count} entries does not fit the file")));
            }
            (index_offset, IndexLayout::Plain { offset: index_offset })
        } else {
            // The block table fills the space up to the footer; the blocks
            // lie back to back before it, right after the values.
            let table_len = count
                .div_ceil(ENTRIES_PER_BLOCK as u64)
                .checked_mul(BLOCK_REF_SIZE as u64)
                .ok_or_else(|| corrupt("entry count overflows".into()))?;
            if index_offset < HEADER_SIZE as u64 || index_offset.checked_add(table_len) != Some(footer_at) {
                return Err(corrupt(format!(
                    "block table at {index_offset} for {count} entries does not fit the file"
                )));
            }
            let mut table = vec![0u8; table_len as usize];
            file.read_exact_at(&mut table, index_offset).map_err(io)?;
            if crc32c::crc32c(&table) != index_crc {
                return Err(corrupt("block table CRC mismatch".into()));
            }
            let blocks: Vec<(u64, u32, u32)> = table
                .chunks_exact(BLOCK_REF_SIZE)
                .map(|b| {
                    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
                    (u64::from_le_bytes(b[..8].try_into().expect("8 bytes")), u32_at(8), u32_at(12))
                })
                .collect();
            let mut end = index_offset;
            for (i, &(offset, len, _)) in blocks.iter().enumerate().rev() {
                if offset.checked_add(u64::from(len)) != Some(end) || offset < HEADER_SIZE as u64 {
                    return Err(corrupt(format!("index block {i} does not end where the next one starts")));
                }
                end = offset;
            }
            (end, IndexLayout::Blocks(blocks))
        };
        let mut loaded = Loaded {
            id: NEXT_LOADED_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            file,
            index,
            count,
            summary: Vec::with_capacity((count as usize).div_ceil(ENTRIES_PER_BLOCK).min(1 << 20)),
            filter: KeyFilter::with_capacity(0),
        };
        // The distinct keys' hashes; the filter is sized by their number
        // once the pass is over (a version per key would be far too many).
        let mut key_hashes: Vec<u64> = Vec::new();
        // Stream the index once: check its CRCs, its order and value
        // bounds, and keep the summary.
        let mut crc = 0u32;
        let mut last: Option<(Key, Lsn)> = None;
        let mut done = 0u64;
        let mut block = 0usize;
        while done < count {
            let chunk = match loaded.index_block(block) {
                Ok(c) => c,
                Err(BlockError::Io(e)) => return Err(io(e)),
                Err(BlockError::Corrupt(reason)) => return Err(corrupt(reason)),
            };
            crc = crc32c::crc32c_append(crc, &chunk);
            for (i, raw) in chunk.chunks_exact(ENTRY_SIZE).enumerate() {
                let at = done + i as u64;
                let e = Entry::decode(raw);
                if last.is_some_and(|l| l > (e.key, e.lsn)) {
                    return Err(corrupt(format!("index entry {at} out of order")));
                }
                e.check_flags(version).map_err(|why| corrupt(format!("index entry {at}: {why}")))?;
                if e.offset < HEADER_SIZE as u64 || e.offset.saturating_add(u64::from(e.len)) > values_end {
                    return Err(corrupt(format!("value of index entry {at} lies outside the values")));
                }
                if e.key < name.key_start || e.key >= name.key_end || e.lsn < name.lsn_start || e.lsn >= name.lsn_end {
                    return Err(corrupt(format!("index entry {at} outside the layer's ranges")));
                }
                if kind == LayerKind::Image && (e.flags & FLAG_BASE == 0 || last.is_some_and(|(k, _)| k == e.key)) {
                    return Err(corrupt(format!("index entry {at} of an image layer is not one base version")));
                }
                if last.is_none_or(|(k, _)| k != e.key) {
                    key_hashes.push(bloom::hash(&e.key));
                }
                last = Some((e.key, e.lsn));
                if i == 0 {
                    loaded.summary.push((e.key, e.lsn));
                }
            }
            done += (chunk.len() / ENTRY_SIZE) as u64;
            block += 1;
        }
        if version == 1 && crc != index_crc {
            return Err(corrupt("index CRC mismatch".into()));
        }
        loaded.filter = KeyFilter::from_hashes(&key_hashes);
        Ok((name, loaded))
    }

    /// Bytes of memory held for reads: the summary, the index block table
    /// and the key filter (a layer held in memory counts its bytes too).
    pub(super) fn memory_bytes(&self) -> usize {
        let blocks = match &self.index {
            IndexLayout::Plain { .. } => 0,
            IndexLayout::Blocks(b) => b.capacity() * std::mem::size_of::<(u64, u32, u32)>(),
        };
        let bytes = match &self.file {
            Source::File(_) => 0,
            Source::Memory(m) => m.len(),
        };
        self.summary.capacity() * std::mem::size_of::<(Key, Lsn)>() + blocks + self.filter.size() + bytes
    }

    /// Where the values end: the index is written after the last of them.
    pub(super) fn values_end(&self) -> u64 {
        match &self.index {
            IndexLayout::Plain { offset } => *offset,
            IndexLayout::Blocks(blocks) => blocks.first().map_or(HEADER_SIZE as u64, |b| b.0),
        }
    }

    /// The entries of index block `block` as stored uncompressed: a
    /// version 2 block is checked against its CRC and its size.
    pub(super) fn index_block(&self, block: usize) -> Result<Vec<u8>, BlockError> {
        let first = block * ENTRIES_PER_BLOCK;
        let n = (self.count as usize).saturating_sub(first).min(ENTRIES_PER_BLOCK);
        match &self.index {
            IndexLayout::Plain { offset } => {
                let mut buf = vec![0u8; n * ENTRY_SIZE];
                self.file.read_exact_at(&mut buf, offset + (first * ENTRY_SIZE) as u64).map_err(BlockError::Io)?;
                Ok(buf)
            }
            IndexLayout::Blocks(blocks) => {
                let &(offset, len, crc) =
                    blocks.get(block).ok_or_else(|| BlockError::Corrupt(format!("no index block {block}")))?;
                if len > MAX_STORED_BLOCK {
                    return Err(BlockError::Corrupt(format!("index block {block} of {len} bytes")));
                }
                let mut stored = vec![0u8; len as usize];
                self.file.read_exact_at(&mut stored, offset).map_err(BlockError::Io)?;
                if crc32c::crc32c(&stored) != crc {
                    return Err(BlockError::Corrupt(format!("CRC mismatch in index block {block}")));
                }
                decompress(&stored, n * ENTRY_SIZE, true)
                    .map_err(|e| BlockError::Corrupt(format!("index block {block}: {e}")))
            }
        }
    }
}

/// Why an index block could not be had.
pub(super) enum BlockError {
    Io(std::io::Error),
    Corrupt(String),
}
