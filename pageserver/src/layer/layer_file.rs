//! Layer files: immutable, sorted versions of keys over a key range, with an
//! index so that a lookup reads one index block and the values it needs —
//! never the whole file. Two kinds share the format (version 2, which reads
//! version 1 too; `docs/pageserver-storage.md`): a *delta* layer holds the
//! versions of an LSN range; an *image* layer holds, at one LSN, the value
//! of every key of its range that has one (so a key it lacks had none).

use bytes::Bytes;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_formats::Lsn;

use super::files::{CachedFile, FileCache};
use super::group::{Group, GroupBuilder};
use super::{LayerError, Versions};
use crate::key::{Key, KEY_SIZE};
use crate::value::Value;
use std::collections::VecDeque;

/// The version this build writes.
pub const FORMAT_VERSION: u32 = 2;
const HEADER_SIZE: usize = 8 + 4 + 4 + KEY_SIZE * 2 + 8 + 8 + 4;
const FOOTER_SIZE: usize = 8 + 8 + 4 + 4 + 8;
/// key | lsn | offset | len | crc | flags | slot
const ENTRY_SIZE: usize = KEY_SIZE + 8 + 8 + 4 + 4 + 2;
/// Index entries per block: one in-memory summary entry per block.
const ENTRIES_PER_BLOCK: usize = 128;
/// Version 2: offset, stored length and CRC-32C of one index block.
const BLOCK_REF_SIZE: usize = 8 + 4 + 4;
/// Version 2: the most a compressed index block may take (zstd's bound
/// for a full block, with slack).
const MAX_STORED_BLOCK: u32 = (ENTRY_SIZE * ENTRIES_PER_BLOCK + 1024) as u32;
/// Flag: the stored bytes are zstd-compressed.
const FLAG_ZSTD: u8 = 1;
/// Flag: the value is a base version (image or zero page).
const FLAG_BASE: u8 = 2;
/// Flag (version 2): the stored bytes are a zstd frame of a value group;
/// the entry's slot says which value of it.
const FLAG_GROUP: u8 = 4;
/// Values at least this large are compressed.
const COMPRESS_MIN: usize = 256;
/// Largest value accepted when reading (a page plus slack, or a directory).
const MAX_VALUE: u32 = 64 << 20;
/// zstd level of delta layers' values: flushes are on the ingest path.
/// Negative levels skip Huffman coding of literals, whose tables, built for
/// every value, were most of the flush's CPU.
const DELTA_LEVEL: i32 = -1;
/// zstd level of index blocks (one per 128 entries, so their tables cost
/// little).
const INDEX_LEVEL: i32 = 1;
/// zstd level of image layers, over groups of pages: level 3 stores about
/// what level 6 does (better on heaps, a fifth more on B-trees) at about
/// three times its speed; level 6 was most of image creation's CPU after a
/// bulk load (`docs/decisions.md`, "Image layers at zstd level 3").
const IMAGE_LEVEL: i32 = 3;
/// An image layer's group closes at this many values...
const GROUP_VALUES: usize = 16;
/// ...or once it holds this many bytes; a value this large is stored alone.
const GROUP_BYTES: usize = 128 << 10;
/// A delta layer groups values smaller than this: the WAL records stored
/// for native redo, which compress poorly alone (too short for zstd to
/// find anything) and well side by side (their headers and a table's
/// tuples repeat). Page images and larger values stay alone, so that a
/// read of one page decompresses only that page.
const DELTA_GROUP_VALUE: usize = 2 << 10;
/// A delta layer's group closes at this many values or bytes: a read of
/// one version decompresses at most about this much.
const DELTA_GROUP_VALUES: usize = 64;
const DELTA_GROUP_BYTES: usize = 16 << 10;

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
const _: () = assert!(DELTA_GROUP_VALUES <= super::group::MAX_VALUES);
// A delta group, closed at DELTA_GROUP_BYTES with one more value below
// DELTA_GROUP_VALUE, fits what readers decompress.
const _: () = assert!(2 + 4 * DELTA_GROUP_VALUES + DELTA_GROUP_BYTES + DELTA_GROUP_VALUE <= super::group::MAX_PAYLOAD);
// A group closes once it reaches GROUP_BYTES, and takes only values smaller
// than that: compressed, it stays within the largest value readers accept.
const _: () = assert!(zstd_bound(2 * GROUP_BYTES) <= MAX_VALUE as usize);
// A page, compressed or not, is a value readers accept.
const _: () = assert!(zstd_bound(8192) <= MAX_VALUE as usize);
// Index blocks, values and the table are addressed by u32 lengths.
const _: () = assert!(ENTRY_SIZE * ENTRIES_PER_BLOCK <= u32::MAX as usize);
// The header ends with its CRC; the footer with the 8-byte end magic.
const _: () = assert!(HEADER_SIZE > 4 && FOOTER_SIZE >= 8 + 8 + 4 + 4 + 8);

thread_local! {
    /// A decompression context per thread: creating one per value costs more
    /// than decompressing a page.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Ids of [`Loaded`] layers.
static NEXT_LOADED_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A decoded part of a loaded layer file: (loaded id, position, the part).
type Recent<T> = (u64, usize, Arc<T>);

/// Groups each thread keeps decompressed.
const RECENT_GROUPS: usize = 8;

thread_local! {
    /// The value groups this thread decompressed last, newest first:
    /// (loaded layer id, offset) and the group. Sequential reads (scans
    /// served batch by batch, several at once over several connections)
    /// read a group's values one after the other, and without this pay a
    /// whole group's decompression for each.
    static RECENT: std::cell::RefCell<VecDeque<Recent<Group>>> = const { std::cell::RefCell::new(VecDeque::new()) };
    /// The index blocks this thread decoded last, newest first: (loaded
    /// layer id, block) and the entries. Lookups of neighbouring keys
    /// (a batch of consecutive pages) share an index block.
    static RECENT_INDEX: std::cell::RefCell<VecDeque<Recent<Vec<Entry>>>> = const { std::cell::RefCell::new(VecDeque::new()) };
}

/// Index blocks each thread keeps decoded (128 entries each).
const RECENT_INDEX_BLOCKS: usize = 16;

/// The part at `(id, at)` from a thread's recent list (`keep` long), a hit
/// moved to the front; else `load`s it and puts it in front.
fn recent_or_load<T, E>(
    list: &'static std::thread::LocalKey<std::cell::RefCell<VecDeque<Recent<T>>>>,
    keep: usize,
    (id, at): (u64, usize),
    load: impl FnOnce() -> Result<T, E>,
) -> Result<Arc<T>, E> {
    let hit = list.with(|c| {
        let mut recent = c.borrow_mut();
        let i = recent.iter().position(|(i, a, _)| *i == id && *a == at)?;
        let found = recent.remove(i).expect("found above");
        let value = found.2.clone();
        recent.push_front(found);
        Some(value)
    });
    if let Some(value) = hit {
        return Ok(value);
    }
    let value = Arc::new(load()?);
    list.with(|c| {
        let mut recent = c.borrow_mut();
        recent.truncate(keep - 1);
        recent.push_front((id, at, value.clone()));
    });
    Ok(value)
}

/// Decompresses one zstd frame that states its size, refusing one larger
/// than `max` (or, with `exact`, of any other size).
fn decompress(data: &[u8], max: usize, exact: bool) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        // The frame states its size (the writer compresses whole values); an
        // output buffer of exactly that size avoids a huge allocation per value.
        let size = match zstd::zstd_safe::get_frame_content_size(data) {
            Ok(Some(n)) if n <= max as u64 && (!exact || n == max as u64) => n as usize,
            Ok(Some(n)) => {
                return Err(std::io::Error::other(format!("zstd frame of {n} bytes, expected at most {max}")))
            }
            _ => return Err(std::io::Error::other("zstd frame without a valid content size")),
        };
        let out = slot.as_mut().expect("set above").decompress(data, size)?;
        if out.len() != size {
            return Err(std::io::Error::other("zstd frame shorter than it states"));
        }
        Ok(out)
    })
}

/// One index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    key: Key,
    lsn: Lsn,
    offset: u64,
    len: u32,
    crc: u32,
    flags: u8,
    /// Which value of a group (`FLAG_GROUP`); 0 otherwise.
    slot: u8,
}

impl Entry {
    fn encode(&self, out: &mut Vec<u8>) {
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

    fn decode(b: &[u8]) -> Entry {
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
    fn check_flags(&self, version: u32) -> Result<(), String> {
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

/// The two kinds of layer file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LayerKind {
    /// Versions of the keys of a key range over an LSN range.
    Delta,
    /// The value of every key of a key range that has one, at one LSN.
    Image,
}

impl LayerKind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            LayerKind::Delta => b"STRDELTA",
            LayerKind::Image => b"STRIMAGE",
        }
    }

    fn end_magic(self) -> &'static [u8; 8] {
        match self {
            LayerKind::Delta => b"STRDLEND",
            LayerKind::Image => b"STRIMEND",
        }
    }
}

/// The name of a layer file: its kind, key range and LSN range (an image
/// layer at LSN `L` has the range `[L, L+1)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LayerName {
    pub lsn_start: Lsn,
    pub lsn_end: Lsn,
    pub key_start: Key,
    pub key_end: Key,
    pub kind: LayerKind,
}

impl LayerName {
    /// A delta layer of keys `[key_start, key_end)` at LSNs `[lsn_start, lsn_end)`.
    pub fn delta(key_start: Key, key_end: Key, lsn_start: Lsn, lsn_end: Lsn) -> LayerName {
        LayerName { lsn_start, lsn_end, key_start, key_end, kind: LayerKind::Delta }
    }

    /// An image layer of keys `[key_start, key_end)` at `lsn`.
    pub fn image(key_start: Key, key_end: Key, lsn: Lsn) -> LayerName {
        LayerName { lsn_start: lsn, lsn_end: Lsn(lsn.0 + 1), key_start, key_end, kind: LayerKind::Image }
    }
}

impl std::fmt::Display for LayerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            LayerKind::Delta => {
                write!(
                    f,
                    "{}-{}__{:016X}-{:016X}.delta",
                    self.key_start, self.key_end, self.lsn_start.0, self.lsn_end.0
                )
            }
            LayerKind::Image => write!(f, "{}-{}__{:016X}.image", self.key_start, self.key_end, self.lsn_start.0),
        }
    }
}

/// Text that is not a layer file name.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a layer file name")]
pub struct LayerNameError(pub String);

impl std::str::FromStr for LayerName {
    type Err = LayerNameError;
    fn from_str(s: &str) -> Result<LayerName, LayerNameError> {
        let bad = || LayerNameError(s.to_string());
        let lsn = |x: &str| u64::from_str_radix(x, 16).map(Lsn).map_err(|_| bad());
        let key = |x: &str| x.parse::<Key>().map_err(|_| bad());
        let keys = |keys: &str| -> Result<(Key, Key), LayerNameError> {
            let (k1, k2) = keys.split_once('-').ok_or_else(bad)?;
            Ok((key(k1)?, key(k2)?))
        };
        let name = if let Some(body) = s.strip_suffix(".delta") {
            let (k, lsns) = body.split_once("__").ok_or_else(bad)?;
            let (l1, l2) = lsns.split_once('-').ok_or_else(bad)?;
            let (key_start, key_end) = keys(k)?;
            LayerName::delta(key_start, key_end, lsn(l1)?, lsn(l2)?)
        } else if let Some(body) = s.strip_suffix(".image") {
            let (k, at) = body.split_once("__").ok_or_else(bad)?;
            let (key_start, key_end) = keys(k)?;
            let at = lsn(at)?;
            if at.0 == u64::MAX {
                return Err(bad());
            }
            LayerName::image(key_start, key_end, at)
        } else {
            return Err(bad());
        };
        if name.key_start > name.key_end || name.lsn_start >= name.lsn_end || name.to_string() != s {
            return Err(bad());
        }
        Ok(name)
    }
}

/// A step of writing a layer file that failed, naming the step and the file.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct WriteError {
    /// `creating`, `writing`, `syncing` or `renaming`.
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The header of a layer file named `name`.
fn encode_header(name: &LayerName) -> Vec<u8> {
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

/// Writes a layer file from versions given in key, then LSN order.
pub struct LayerFileWriter {
    path: PathBuf,
    out: BufWriter<File>,
    offset: u64,
    index: Vec<u8>,
    count: u64,
    last: Option<(Key, Lsn)>,
    name: LayerName,
    /// The name the header and the temporary file were written with.
    initial_name: LayerName,
    scratch: Vec<u8>,
    /// One compression context per file for values (creating one per value
    /// costs more than compressing), one for index blocks.
    compressor: zstd::bulk::Compressor<'static>,
    index_compressor: zstd::bulk::Compressor<'static>,
    /// An image layer's values not yet written: (key, LSN, flags) and the group.
    pending: Vec<(Key, Lsn, u8)>,
    group: GroupBuilder,
}

impl LayerFileWriter {
    /// Starts writing `name` as a temporary file in `dir`.
    pub fn new(dir: &Path, name: LayerName) -> Result<LayerFileWriter, WriteError> {
        let path = dir.join(format!("{name}.tmp"));
        let at = &path;
        let failed = |op: &'static str| move |source| WriteError { op, path: at.clone(), source };
        let file = File::create(&path).map_err(failed("creating"))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&encode_header(&name)).map_err(failed("writing"))?;
        let level = if name.kind == LayerKind::Image { IMAGE_LEVEL } else { DELTA_LEVEL };
        let compressor = zstd::bulk::Compressor::new(level).map_err(failed("compressing"))?;
        let index_compressor = zstd::bulk::Compressor::new(INDEX_LEVEL).map_err(failed("compressing"))?;
        Ok(LayerFileWriter {
            path,
            out,
            offset: HEADER_SIZE as u64,
            index: Vec::new(),
            count: 0,
            last: None,
            name,
            initial_name: name,
            scratch: Vec::new(),
            compressor,
            index_compressor,
            pending: Vec::new(),
            group: GroupBuilder::default(),
        })
    }

    /// Sets the end of the key range, known only once the last key is
    /// written (compaction and image creation cut files by size). The
    /// header and the temporary name follow at `finish`.
    pub fn set_key_end(&mut self, key_end: Key) {
        debug_assert!(self.last.is_none_or(|(k, _)| k < key_end), "a written key lies beyond the new end");
        debug_assert!(key_end >= self.name.key_start);
        self.name.key_end = key_end;
    }

    /// The name the file will have.
    pub fn name(&self) -> LayerName {
        self.name
    }

    /// The temporary file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn failed(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
        move |source| WriteError { op, path: self.path.clone(), source }
    }

    fn refuse_image_version(&self, key: &Key, lsn: Lsn, base: bool) -> Result<(), WriteError> {
        if self.name.kind == LayerKind::Image
            && (!base || lsn != self.name.lsn_start || self.last.is_some_and(|(k, _)| k == *key))
        {
            let why = format!("an image layer holds one base version per key, at its LSN (key {key}, {lsn})");
            return Err(WriteError { op: "writing", path: self.path.clone(), source: std::io::Error::other(why) });
        }
        Ok(())
    }

    /// Appends one version; keys and LSNs must not go backwards. An image
    /// layer takes one base version per key, at its LSN.
    pub fn put(&mut self, key: &Key, lsn: Lsn, value: &Value) -> Result<(), WriteError> {
        self.refuse_image_version(key, lsn, value.is_base())?;
        debug_assert!(self.last.is_none_or(|l| l <= (*key, lsn)), "versions out of order");
        debug_assert!(*key >= self.name.key_start && *key < self.name.key_end);
        debug_assert!(lsn >= self.name.lsn_start && lsn < self.name.lsn_end);
        self.last = Some((*key, lsn));
        let mut encoded = std::mem::take(&mut self.scratch);
        encoded.clear();
        value.encode(&mut encoded);
        let flags = if value.is_base() { FLAG_BASE } else { 0 };
        let result = if encoded.len() < self.group_limits().0 {
            self.add_to_group(*key, lsn, flags, &encoded)
        } else {
            // Entries stay in key order: a pending group goes first.
            self.write_group().and_then(|()| self.write_single(*key, lsn, flags, &encoded))
        };
        self.scratch = encoded;
        result
    }

    /// This kind's groups: values smaller than the first go into them, and
    /// a group closes at the second's values or the third's bytes.
    fn group_limits(&self) -> (usize, usize, usize) {
        match self.name.kind {
            LayerKind::Image => (GROUP_BYTES, GROUP_VALUES, GROUP_BYTES),
            LayerKind::Delta => (DELTA_GROUP_VALUE, DELTA_GROUP_VALUES, DELTA_GROUP_BYTES),
        }
    }

    /// Adds an uncompressed encoded value to the pending group, and writes
    /// the group once it is full.
    fn add_to_group(&mut self, key: Key, lsn: Lsn, flags: u8, encoded: &[u8]) -> Result<(), WriteError> {
        debug_assert!(flags & (FLAG_ZSTD | FLAG_GROUP) == 0, "a group takes values uncompressed");
        self.pending.push((key, lsn, flags));
        self.group.push(encoded);
        let (_, values, bytes) = self.group_limits();
        if self.group.len() == values || self.group.bytes() >= bytes {
            self.write_group()
        } else {
            Ok(())
        }
    }

    /// Writes one value on its own, compressed if that makes it smaller.
    fn write_single(&mut self, key: Key, lsn: Lsn, mut flags: u8, encoded: &[u8]) -> Result<(), WriteError> {
        let compressed;
        let stored: &[u8] = if encoded.len() >= COMPRESS_MIN {
            compressed = self.compressor.compress(encoded).map_err(self.failed("compressing"))?;
            if compressed.len() < encoded.len() {
                flags |= FLAG_ZSTD;
                &compressed
            } else {
                encoded
            }
        } else {
            encoded
        };
        self.out.write_all(stored).map_err(self.failed("writing"))?;
        let crc = crc32c::crc32c(stored);
        Entry { key, lsn, offset: self.offset, len: stored.len() as u32, crc, flags, slot: 0 }.encode(&mut self.index);
        self.offset += stored.len() as u64;
        self.count += 1;
        Ok(())
    }

    /// Writes the pending values of an image layer as one compressed group
    /// (a lone value on its own).
    fn write_group(&mut self) -> Result<(), WriteError> {
        if let Some(one) = self.group.single() {
            let one = one.to_vec();
            let (key, lsn, flags) = self.pending[0];
            self.pending.clear();
            self.group.take_payload();
            return self.write_single(key, lsn, flags, &one);
        }
        if self.group.is_empty() {
            return Ok(());
        }
        let payload = self.group.take_payload();
        let stored = self.compressor.compress(&payload).map_err(self.failed("compressing"))?;
        self.out.write_all(&stored).map_err(self.failed("writing"))?;
        let crc = crc32c::crc32c(&stored);
        for (slot, (key, lsn, flags)) in self.pending.drain(..).enumerate() {
            let flags = flags | FLAG_GROUP;
            Entry { key, lsn, offset: self.offset, len: stored.len() as u32, crc, flags, slot: slot as u8 }
                .encode(&mut self.index);
            self.count += 1;
        }
        self.offset += stored.len() as u64;
        Ok(())
    }

    /// Appends a version copied as stored from another layer file (no
    /// decompression); the same order rules as [`LayerFileWriter::put`].
    pub fn put_raw(&mut self, v: &RawVersion) -> Result<(), WriteError> {
        self.refuse_image_version(&v.key, v.lsn, v.is_base())?;
        debug_assert!(v.flags & FLAG_GROUP == 0, "a scan hands out a group's values one by one");
        debug_assert!(self.last.is_none_or(|l| l <= (v.key, v.lsn)), "versions out of order");
        debug_assert!(v.key >= self.name.key_start && v.key < self.name.key_end);
        debug_assert!(v.lsn >= self.name.lsn_start && v.lsn < self.name.lsn_end);
        self.last = Some((v.key, v.lsn));
        // A small value (as it came out of a group, or stored alone
        // uncompressed) joins this file's groups: compaction regroups
        // what it merges rather than storing it uncompressed.
        if self.name.kind == LayerKind::Delta && v.flags & FLAG_ZSTD == 0 && v.bytes.len() < DELTA_GROUP_VALUE {
            return self.add_to_group(v.key, v.lsn, v.flags & FLAG_BASE, &v.bytes);
        }
        self.write_group()?;
        self.out.write_all(&v.bytes).map_err(self.failed("writing"))?;
        let crc = crc32c::crc32c(&v.bytes);
        let flags = v.flags & (FLAG_ZSTD | FLAG_BASE);
        Entry { key: v.key, lsn: v.lsn, offset: self.offset, len: v.bytes.len() as u32, crc, flags, slot: 0 }
            .encode(&mut self.index);
        self.offset += v.bytes.len() as u64;
        self.count += 1;
        Ok(())
    }

    /// Bytes written so far (values only; a pending group by its size
    /// before compression).
    pub fn written(&self) -> u64 {
        self.offset + self.group.bytes() as u64
    }

    /// Versions written so far.
    pub fn count(&self) -> u64 {
        self.count + self.pending.len() as u64
    }

    /// Writes the index and footer, fsyncs (if asked) and renames the file to its final name.
    pub fn finish(self, fsync: bool) -> Result<PathBuf, WriteError> {
        let path = self.finish_unrenamed(fsync)?;
        let name = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".tmp")).map(str::to_string);
        let final_path = path.with_file_name(name.expect("the writer names its file <name>.tmp"));
        std::fs::rename(&path, &final_path).map_err(|source| WriteError { op: "renaming", path, source })?;
        Ok(final_path)
    }

    /// Writes the index and footer and fsyncs (if asked), leaving the file
    /// under its temporary name `<name>.tmp`, which it returns: the caller
    /// renames it once the metadata that lists it is durable.
    pub fn finish_unrenamed(mut self, fsync: bool) -> Result<PathBuf, WriteError> {
        self.write_group()?;
        let index = std::mem::take(&mut self.index);
        debug_assert_eq!(index.len() as u64, self.count * ENTRY_SIZE as u64);
        // The index as compressed blocks, then the table of the blocks.
        let mut table = Vec::with_capacity(index.len().div_ceil(ENTRY_SIZE * ENTRIES_PER_BLOCK) * BLOCK_REF_SIZE);
        for block in index.chunks(ENTRY_SIZE * ENTRIES_PER_BLOCK) {
            let stored = self.index_compressor.compress(block).map_err(self.failed("compressing"))?;
            debug_assert!(stored.len() as u32 <= MAX_STORED_BLOCK);
            self.out.write_all(&stored).map_err(self.failed("writing"))?;
            table.extend_from_slice(&self.offset.to_le_bytes());
            table.extend_from_slice(&(stored.len() as u32).to_le_bytes());
            table.extend_from_slice(&crc32c::crc32c(&stored).to_le_bytes());
            self.offset += stored.len() as u64;
        }
        let table_offset = self.offset;
        self.out.write_all(&table).map_err(self.failed("writing"))?;
        let mut footer = Vec::with_capacity(FOOTER_SIZE);
        footer.extend_from_slice(&table_offset.to_le_bytes());
        footer.extend_from_slice(&self.count.to_le_bytes());
        footer.extend_from_slice(&crc32c::crc32c(&table).to_le_bytes());
        footer.extend_from_slice(&0u32.to_le_bytes());
        footer.extend_from_slice(self.name.kind.end_magic());
        self.out.write_all(&footer).map_err(self.failed("writing"))?;
        let LayerFileWriter { mut path, out, name, initial_name, .. } = self;
        let failed = |op: &'static str, at: &Path| {
            let at = at.to_path_buf();
            move |source| WriteError { op, path: at, source }
        };
        let file = out.into_inner().map_err(|e| failed("writing", &path)(e.into_error()))?;
        if name != initial_name {
            use std::os::unix::fs::FileExt;
            file.write_all_at(&encode_header(&name), 0).map_err(failed("writing", &path))?;
            let renamed = path.with_file_name(format!("{name}.tmp"));
            std::fs::rename(&path, &renamed).map_err(failed("renaming", &path))?;
            path = renamed;
        }
        if fsync {
            file.sync_all().map_err(failed("syncing", &path))?;
        }
        Ok(path)
    }
}

/// Where a layer's bytes come from: its file (through the descriptor
/// cache), or memory (tests and fuzzing).
enum Source {
    File(CachedFile),
    Memory(Vec<u8>),
}

impl Source {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
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

/// Downloads a layer file that is not on local disk (on-demand download
/// from remote storage). Implemented by the timeline's remote client.
pub trait Fetch: Send + Sync {
    /// Writes the whole layer `name` of `size` bytes to `path` (atomically:
    /// `path` is whole or absent afterwards), checked against its index entry.
    fn fetch(&self, name: &LayerName, path: &Path, size: u64) -> Result<(), String>;
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
struct Loaded {
    /// Unique over the process's life: names this loading of this file in
    /// the per-thread group cache (an address could be reused).
    id: u64,
    file: Source,
    index: IndexLayout,
    count: u64,
    /// First (key, LSN) of each index block.
    summary: Vec<(Key, Lsn)>,
    filter: super::bloom::KeyFilter,
}

impl Loaded {
    /// Where the values end: the index is written after the last of them.
    fn values_end(&self) -> u64 {
        match &self.index {
            IndexLayout::Plain { offset } => *offset,
            IndexLayout::Blocks(blocks) => blocks.first().map_or(HEADER_SIZE as u64, |b| b.0),
        }
    }

    /// The entries of index block `block` as stored uncompressed: a
    /// version 2 block is checked against its CRC and its size.
    fn index_block(&self, block: usize) -> Result<Vec<u8>, BlockError> {
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
enum BlockError {
    Io(std::io::Error),
    Corrupt(String),
}

/// A layer file of either kind. Holds only a sparse summary of its index
/// in memory, and only while the file is local: a layer evicted from local
/// disk keeps its name and size, and is downloaded again by the first read
/// that needs it.
pub struct LayerFile {
    pub name: LayerName,
    path: PathBuf,
    pub file_size: u64,
    /// `None` while the file is not on local disk.
    loaded: parking_lot::Mutex<Option<Arc<Loaded>>>,
    /// Held while downloading or evicting: one download per layer at a
    /// time, and no eviction racing a download.
    residency: parking_lot::Mutex<()>,
    /// Where descriptors come from (`None` for a layer held in memory).
    files: Option<Arc<FileCache>>,
    /// How to get the file back once evicted (set when remote storage is on).
    remote: std::sync::OnceLock<Arc<dyn Fetch>>,
    /// Milliseconds since the Unix epoch of the last read (eviction order).
    last_read: std::sync::atomic::AtomicU64,
    /// Set once the layer is no longer part of its timeline: the file is
    /// deleted when the last read holding it lets go.
    removed: std::sync::atomic::AtomicBool,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl LayerFile {
    /// Opens and checks a layer file: header, footer and index CRC. Its
    /// descriptor is taken from `files` on each read, not kept.
    pub fn open(path: &Path, files: &Arc<FileCache>) -> Result<LayerFile, LayerError> {
        let (name, file_size, loaded) = LayerFile::load(path, files)?;
        Ok(LayerFile::assemble(name, path, file_size, Some(loaded), Some(files.clone())))
    }

    /// A layer whose file is not on local disk: `fetch` downloads it to
    /// `path` at its first read.
    pub fn remote(
        path: &Path,
        name: LayerName,
        file_size: u64,
        files: &Arc<FileCache>,
        fetch: Arc<dyn Fetch>,
    ) -> LayerFile {
        let l = LayerFile::assemble(name, path, file_size, None, Some(files.clone()));
        let _ = l.remote.set(fetch);
        l
    }

    /// Opens a layer held in memory; `path` only names it in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<LayerFile, LayerError> {
        let len = bytes.len() as u64;
        let (name, loaded) = LayerFile::open_source(path, Source::Memory(bytes), len)?;
        Ok(LayerFile::assemble(name, path, len, Some(loaded), None))
    }

    fn assemble(
        name: LayerName,
        path: &Path,
        file_size: u64,
        loaded: Option<Loaded>,
        files: Option<Arc<FileCache>>,
    ) -> LayerFile {
        LayerFile {
            name,
            path: path.to_path_buf(),
            file_size,
            loaded: parking_lot::Mutex::new(loaded.map(Arc::new)),
            residency: parking_lot::Mutex::new(()),
            files,
            remote: std::sync::OnceLock::new(),
            last_read: std::sync::atomic::AtomicU64::new(now_ms()),
            removed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn load(path: &Path, files: &Arc<FileCache>) -> Result<(LayerName, u64, Loaded), LayerError> {
        let io = |source| LayerError::Io { path: path.display().to_string(), source };
        let file = files.file(path);
        let file_size = file.size().map_err(io)?;
        let (name, loaded) = LayerFile::open_source(path, Source::File(file), file_size)?;
        Ok((name, file_size, loaded))
    }

    /// Lets the layer be evicted and downloaded again through `fetch`.
    pub fn set_remote(&self, fetch: Arc<dyn Fetch>) {
        let _ = self.remote.set(fetch);
    }

    /// Whether the file is on local disk.
    pub fn is_resident(&self) -> bool {
        self.loaded.lock().is_some()
    }

    /// When the layer was last read (ms since the Unix epoch).
    pub fn last_read_ms(&self) -> u64 {
        self.last_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Downloads the file if it is not local (a reader location fetches
    /// every layer ahead of its reads, `docs/sites.md`).
    pub fn make_resident(&self) -> Result<(), LayerError> {
        self.loaded().map(drop)
    }

    /// The readable layer, downloading its file first if it is not local.
    fn loaded(&self) -> Result<Arc<Loaded>, LayerError> {
        self.last_read.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
        if let Some(l) = &*self.loaded.lock() {
            return Ok(l.clone());
        }
        let _one = self.residency.lock();
        if let Some(l) = &*self.loaded.lock() {
            return Ok(l.clone());
        }
        let p = self.path.display().to_string();
        let (Some(fetch), Some(files)) = (self.remote.get(), self.files.as_ref()) else {
            return Err(LayerError::Io {
                path: p,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not on local disk and no remote storage"),
            });
        };
        fetch
            .fetch(&self.name, &self.path, self.file_size)
            .map_err(|e| LayerError::Io { path: p.clone(), source: std::io::Error::other(e) })?;
        let (name, size, loaded) = LayerFile::load(&self.path, files)?;
        if name != self.name || size != self.file_size {
            return Err(LayerError::Corrupt {
                path: p,
                reason: format!(
                    "downloaded file is {name} of {size} bytes, expected {} of {}",
                    self.name, self.file_size
                ),
            });
        }
        let loaded = Arc::new(loaded);
        *self.loaded.lock() = Some(loaded.clone());
        Ok(loaded)
    }

    /// Deletes the local file if no read uses it and it can be downloaded
    /// again; returns whether it did. The caller makes sure the file is in
    /// remote storage.
    pub fn evict(&self) -> Result<bool, LayerError> {
        if self.remote.get().is_none() {
            return Ok(false);
        }
        let _one = self.residency.lock();
        let mut loaded = self.loaded.lock();
        match &*loaded {
            Some(l) if Arc::strong_count(l) == 1 => {}
            _ => return Ok(false),
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(LayerError::Io { path: self.path.display().to_string(), source }),
        }
        *loaded = None;
        Ok(true)
    }

    fn open_source(path: &Path, file: Source, file_size: u64) -> Result<(LayerName, Loaded), LayerError> {
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
            filter: super::bloom::KeyFilter::with_capacity(usize::try_from(count).unwrap_or(usize::MAX).min(1 << 28)),
        };
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
                    loaded.filter.insert(&e.key);
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
        Ok((name, loaded))
    }

    /// Marks the layer as no longer part of its timeline: its file is
    /// deleted when the last holder drops it (reads in flight finish first).
    pub fn mark_removed(&self) {
        self.removed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// First key and LSN of every index block (for tests and fuzzing).
    pub fn summary(&self) -> Result<Vec<(Key, Lsn)>, LayerError> {
        Ok(self.loaded()?.summary.clone())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, reason: String) -> LayerError {
        LayerError::Corrupt { path: self.path.display().to_string(), reason }
    }

    /// [`Self::read_block`] through this thread's recent index blocks (a
    /// loaded file never changes; a new loading has a new id).
    fn read_block_cached(&self, l: &Loaded, block: usize) -> Result<Arc<Vec<Entry>>, LayerError> {
        recent_or_load(&RECENT_INDEX, RECENT_INDEX_BLOCKS, (l.id, block), || self.read_block(l, block))
    }

    fn read_block(&self, l: &Loaded, block: usize) -> Result<Vec<Entry>, LayerError> {
        match l.index_block(block) {
            Ok(buf) => Ok(buf.chunks_exact(ENTRY_SIZE).map(Entry::decode).collect()),
            Err(BlockError::Io(source)) => Err(LayerError::Io { path: self.path.display().to_string(), source }),
            Err(BlockError::Corrupt(reason)) => Err(self.corrupt(reason)),
        }
    }

    /// The stored bytes of a value (or of its group), checked against their CRC.
    fn read_stored(&self, l: &Loaded, e: &Entry) -> Result<Vec<u8>, LayerError> {
        self.check_len(e)?;
        let mut buf = vec![0u8; e.len as usize];
        l.file.read_exact_at(&mut buf, e.offset).map_err(|source| self.io(source))?;
        self.check_crc(e, &buf)?;
        Ok(buf)
    }

    fn check_len(&self, e: &Entry) -> Result<(), LayerError> {
        if e.len > MAX_VALUE {
            return Err(self.corrupt(format!("value of {} bytes at offset {}", e.len, e.offset)));
        }
        Ok(())
    }

    fn check_crc(&self, e: &Entry, stored: &[u8]) -> Result<(), LayerError> {
        if crc32c::crc32c(stored) != e.crc {
            return Err(self.corrupt(format!("CRC mismatch in the value of key {} at offset {}", e.key, e.offset)));
        }
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> LayerError {
        LayerError::Io { path: self.path.display().to_string(), source }
    }

    /// The group an entry's value belongs to (`FLAG_GROUP`).
    fn read_group(&self, l: &Loaded, e: &Entry) -> Result<Group, LayerError> {
        let stored = self.read_stored(l, e)?;
        self.decode_group(e, &stored)
    }

    /// A group from its stored (checked) bytes.
    fn decode_group(&self, e: &Entry, stored: &[u8]) -> Result<Group, LayerError> {
        decompress(stored, super::group::MAX_PAYLOAD, false)
            .map_err(|err| err.to_string())
            .and_then(Group::decode)
            .map_err(|err| self.corrupt(format!("value group at offset {}: {err}", e.offset)))
    }

    /// [`Self::read_group`] through this thread's recent groups. A cached
    /// group was read and checked from the same loaded file, which never
    /// changes (layer files are immutable; a new loading has a new id).
    fn read_group_cached(&self, l: &Loaded, e: &Entry) -> Result<Arc<Group>, LayerError> {
        // Offsets past usize (32-bit hosts) are not cached.
        let Ok(at) = usize::try_from(e.offset) else { return self.read_group(l, e).map(Arc::new) };
        recent_or_load(&RECENT, RECENT_GROUPS, (l.id, at), || self.read_group(l, e))
    }

    /// A value's encoding, uncompressed (a value of a group shares the
    /// group's memory).
    fn read_encoded(&self, l: &Loaded, e: &Entry) -> Result<Bytes, LayerError> {
        if e.flags & FLAG_GROUP != 0 {
            let group = self.read_group_cached(l, e)?;
            return group.value(e.slot).map_err(|err| self.corrupt(format!("group at offset {}: {err}", e.offset)));
        }
        let buf = self.read_stored(l, e)?;
        if e.flags & FLAG_ZSTD != 0 {
            decompress(&buf, MAX_VALUE as usize, false)
                .map(Bytes::from)
                .map_err(|err| self.corrupt(format!("value at offset {}: {err}", e.offset)))
        } else {
            Ok(buf.into())
        }
    }

    fn read_value(&self, l: &Loaded, e: &Entry) -> Result<Value, LayerError> {
        let raw = self.read_encoded(l, e)?;
        Value::decode_shared(raw).map_err(|err| self.corrupt(format!("value at offset {}: {err}", e.offset)))
    }

    /// Gathers versions of `key` at or below `lsn`, newest first; true once
    /// no older version is needed: a base was found, or this is an image
    /// layer of the key's range (which holds the key's value at its LSN if
    /// it had one), and `out` is closed.
    pub fn collect(&self, key: &Key, lsn: Lsn, out: &mut Versions) -> Result<bool, LayerError> {
        if *key < self.name.key_start || *key >= self.name.key_end || lsn < self.name.lsn_start {
            return Ok(false);
        }
        let l = self.loaded()?;
        if !l.filter.may_contain(key) {
            return Ok(self.absent(out));
        }
        // The last block whose first entry is at or before (key, lsn).
        let mut block = match l.summary.partition_point(|s| *s <= (*key, lsn)) {
            0 => return Ok(self.absent(out)),
            n => n - 1,
        };
        let mut entries = self.read_block_cached(&l, block)?;
        let mut i = entries.partition_point(|e| (e.key, e.lsn) <= (*key, lsn));
        loop {
            if i == 0 {
                if block == 0 {
                    return Ok(self.absent(out));
                }
                block -= 1;
                entries = self.read_block_cached(&l, block)?;
                i = entries.len();
                continue;
            }
            i -= 1;
            let e = entries[i];
            if e.key != *key {
                return Ok(self.absent(out));
            }
            let value = self.read_value(&l, &e)?;
            if value.is_base() != (e.flags & FLAG_BASE != 0) {
                return Err(self
                    .corrupt(format!("value kind of key {} at offset {} disagrees with the index", e.key, e.offset)));
            }
            if out.push(e.lsn, value) {
                return Ok(true);
            }
        }
    }

    /// The key has no version here: for an image layer, the key had no
    /// value at its LSN, and the search ends (`out` is closed).
    fn absent(&self, out: &mut Versions) -> bool {
        let image = self.name.kind == LayerKind::Image;
        if image {
            out.close();
        }
        image
    }

    /// Every version in key, then LSN order, as stored (each checked
    /// against its CRC): the input of compaction.
    pub fn scan(&self) -> Scan<'_> {
        Scan::new(self, true)
    }

    /// Every (key, LSN) in order, from the index alone.
    pub fn scan_keys(&self) -> Scan<'_> {
        Scan::new(self, false)
    }

    /// Decodes a version read by [`LayerFile::scan`].
    pub fn decode_raw(&self, v: &RawVersion) -> Result<Value, LayerError> {
        let raw = if v.flags & FLAG_ZSTD != 0 {
            decompress(&v.bytes, MAX_VALUE as usize, false)
                .map_err(|err| self.corrupt(format!("value of key {} at {}: {err}", v.key, v.lsn)))?
        } else {
            v.bytes.clone()
        };
        Value::decode_shared(raw.into())
            .map_err(|err| self.corrupt(format!("value of key {} at {}: {err}", v.key, v.lsn)))
    }

    /// Number of versions stored (0 while the file is not local).
    pub fn len(&self) -> u64 {
        self.loaded.lock().as_ref().map_or(0, |l| l.count)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for LayerFile {
    fn drop(&mut self) {
        if self.removed.load(std::sync::atomic::Ordering::SeqCst) && self.files.is_some() {
            match std::fs::remove_file(&self.path) {
                Ok(()) => tracing::debug!(file = %self.path.display(), "deleted a removed layer file"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Left for the next load, which deletes the files the metadata lists as removed.
                Err(e) => tracing::warn!(file = %self.path.display(), "deleting a removed layer file: {e}"),
            }
        }
    }
}

/// A version as a layer file stores it: possibly compressed, with its
/// flags. A value of a group comes out on its own, uncompressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawVersion {
    pub key: Key,
    pub lsn: Lsn,
    pub flags: u8,
    /// Empty when only keys are scanned.
    pub bytes: Vec<u8>,
}

impl RawVersion {
    pub fn is_base(&self) -> bool {
        self.flags & FLAG_BASE != 0
    }
}

/// Iterator over a layer file's versions in order (see [`LayerFile::scan`]).
pub struct Scan<'a> {
    layer: &'a LayerFile,
    /// The layer's file, held for the whole scan (it is not evicted meanwhile).
    loaded: Result<Arc<Loaded>, LayerError>,
    block: usize,
    entries: Vec<Entry>,
    next: usize,
    values: bool,
    /// The last value group read (by its offset): its values come in a row.
    group: Option<(u64, Group)>,
    /// Stored bytes read ahead from this file offset: values lie in the
    /// file in the order of their entries, so a scan reads the file in
    /// large reads instead of one read per value.
    window: (u64, Vec<u8>),
}

/// Bytes a [`Scan`] reads at a time (more when one value is larger).
const SCAN_READ_AHEAD: u64 = 256 << 10;

impl Scan<'_> {
    fn new(layer: &LayerFile, values: bool) -> Scan<'_> {
        let loaded = layer.loaded();
        Scan { layer, loaded, block: 0, entries: Vec::new(), next: 0, values, group: None, window: (0, Vec::new()) }
    }

    /// An entry's stored bytes (checked against its CRC), from the window,
    /// which moves forward to the entry when it does not hold them.
    fn stored(&mut self, l: &Loaded, e: &Entry) -> Result<&[u8], LayerError> {
        self.layer.check_len(e)?;
        let (start, buf) = &self.window;
        let held = e.offset >= *start && e.offset + e.len as u64 <= *start + buf.len() as u64;
        if !held {
            let ahead = l.values_end().saturating_sub(e.offset).min(SCAN_READ_AHEAD);
            let mut buf = std::mem::take(&mut self.window.1);
            buf.resize(ahead.max(e.len as u64) as usize, 0);
            l.file.read_exact_at(&mut buf, e.offset).map_err(|source| self.layer.io(source))?;
            self.window = (e.offset, buf);
        }
        let from = (e.offset - self.window.0) as usize;
        let stored = &self.window.1[from..from + e.len as usize];
        self.layer.check_crc(e, stored)?;
        Ok(stored)
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<RawVersion, LayerError>;

    fn next(&mut self) -> Option<Self::Item> {
        let l = match &self.loaded {
            Ok(l) => l.clone(),
            // The file could not be had: the caller gets the error once.
            Err(_) => {
                return std::mem::replace(&mut self.loaded, Err(LayerError::Gone)).err().and_then(|e| match e {
                    LayerError::Gone => None,
                    e => Some(Err(e)),
                })
            }
        };
        if self.next == self.entries.len() {
            if self.block.saturating_mul(ENTRIES_PER_BLOCK) >= l.count as usize {
                return None;
            }
            match self.layer.read_block(&l, self.block) {
                Ok(entries) => self.entries = entries,
                Err(e) => {
                    // Stop after an error: the caller gets it once.
                    self.block = usize::MAX / ENTRIES_PER_BLOCK;
                    return Some(Err(e));
                }
            }
            self.block += 1;
            self.next = 0;
        }
        let e = self.entries[self.next];
        self.next += 1;
        if !self.values {
            let flags = e.flags & FLAG_BASE;
            return Some(Ok(RawVersion { key: e.key, lsn: e.lsn, flags, bytes: Vec::new() }));
        }
        if e.flags & FLAG_GROUP == 0 {
            let read = self.stored(&l, &e).map(<[u8]>::to_vec);
            return Some(read.map(|bytes| RawVersion { key: e.key, lsn: e.lsn, flags: e.flags, bytes }));
        }
        if self.group.as_ref().is_none_or(|(offset, _)| *offset != e.offset) {
            let layer = self.layer;
            match self.stored(&l, &e).and_then(|stored| layer.decode_group(&e, stored)) {
                Ok(g) => self.group = Some((e.offset, g)),
                Err(err) => return Some(Err(err)),
            }
        }
        let (_, group) = self.group.as_ref().expect("read above");
        let value = group.get(e.slot).map_err(|err| self.layer.corrupt(format!("group at offset {}: {err}", e.offset)));
        let flags = e.flags & FLAG_BASE;
        Some(value.map(|v| RawVersion { key: e.key, lsn: e.lsn, flags, bytes: v.to_vec() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use strata_redo::NativeRecord;

    fn key(n: u32) -> Key {
        Key { kind: 0, field1: 1663, field2: 5, field3: 16384, field4: 0, field5: n }
    }

    fn write(dir: &Path, versions: &[(Key, Lsn, Value)]) -> PathBuf {
        let name = LayerName::delta(
            versions.iter().map(|v| v.0).min().unwrap(),
            versions.iter().map(|v| v.0).max().unwrap().next(),
            Lsn(0x100),
            Lsn(0x10000),
        );
        let mut w = LayerFileWriter::new(dir, name).unwrap();
        for (k, l, v) in versions {
            w.put(k, *l, v).unwrap();
        }
        w.finish(false).unwrap()
    }

    fn page(fill: u8) -> Value {
        Value::Image(Bytes::from(vec![fill; 8192]))
    }

    #[test]
    fn lookups_cross_index_blocks_and_stop_at_images() {
        let dir = std::env::temp_dir().join(format!("strata-delta-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut versions = Vec::new();
        // Key 1 has 300 versions (crossing index blocks): an image at the start and
        // every 100th; the rest are native records.
        for i in 0..300u64 {
            let v = if i % 100 == 0 {
                page(i as u8)
            } else {
                Value::Native(NativeRecord::ClearVmBits(vec![(i as u32, 1)]))
            };
            versions.push((key(1), Lsn(0x100 + i * 8), v));
        }
        for n in 2..500 {
            versions.push((key(n), Lsn(0x200), page(n as u8)));
        }
        let path = write(&dir, &versions);
        let files = FileCache::new(4, Default::default());
        let layer = LayerFile::open(&path, &files).unwrap();
        assert_eq!(layer.len(), versions.len() as u64);
        assert_eq!(path.file_name().unwrap().to_str().unwrap().parse::<LayerName>().unwrap(), layer.name);

        let mut out = Versions::default();
        assert!(layer.collect(&key(1), Lsn(0x100 + 250 * 8), &mut out).unwrap());
        assert_eq!(out.list.len(), 51, "versions 250 down to the image at 200");
        assert_eq!(out.list[0].0, Lsn(0x100 + 250 * 8));
        assert_eq!(out.list[50].1, page(200));

        let mut out = Versions::default();
        assert!(layer.collect(&key(499), Lsn(0x300), &mut out).unwrap());
        assert_eq!(out.list, vec![(Lsn(0x200), page(243))]);
        let mut out = Versions::default();
        assert!(!layer.collect(&key(499), Lsn(0x1ff), &mut out).unwrap(), "older than every version");
        assert!(!layer.collect(&key(600), Lsn(0x300), &mut out).unwrap(), "outside the key range");
        assert!(out.list.is_empty());

        // Flip a byte in a value: the read names the file; no panic.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_SIZE + 3] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let layer = LayerFile::open(&path, &files).unwrap();
        let err = layer.collect(&key(1), Lsn(0x100), &mut Versions::default()).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains("CRC"), "{err}");
        // Damage anywhere in the index or footer is caught at open.
        let len = bytes.len();
        for at in [len - 1, len - FOOTER_SIZE, len - FOOTER_SIZE - 5, 0, 20] {
            let mut b = std::fs::read(&path).unwrap();
            b[at] ^= 0x55;
            let p = dir.join(format!("damaged-{at}"));
            std::fs::write(&p, &b).unwrap();
            let err = LayerFile::open(&p, &files).err().expect("damage detected").to_string();
            assert!(err.contains(&p.display().to_string()), "{err}");
        }
        std::fs::write(dir.join("short"), b"STRDELTA").unwrap();
        assert!(LayerFile::open(&dir.join("short"), &files).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn delta_layers_group_small_values_and_compaction_regroups_them() {
        let dir = strata_test_support::scratch_dir("delta-groups");
        // Ten pages, each an image and then 300 small records (alike, as a
        // table's inserts are), one page image in the middle of each run.
        let mut versions = Vec::new();
        for n in 0..10u32 {
            versions.push((key(n), Lsn(0x1000), page(n as u8)));
            for i in 1..=300u64 {
                let v = if i == 150 {
                    page(i as u8)
                } else {
                    Value::Native(NativeRecord::ClearVmBits(vec![(n, 1), (i as u32, 3), (7, 1)]))
                };
                versions.push((key(n), Lsn(0x1000 + i * 8), v));
            }
        }
        let path = write(&dir, &versions);
        let files = FileCache::new(4, Default::default());
        let layer = LayerFile::open(&path, &files).unwrap();
        let encoded: usize = versions
            .iter()
            .filter(|v| !v.2.is_base())
            .map(|v| {
                let mut b = Vec::new();
                v.2.encode(&mut b);
                b.len()
            })
            .sum();
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(size < encoded, "grouped records take less than their encodings alone: {size} >= {encoded}");
        // Every version reads back, by lookup and by scan.
        for n in 0..10u32 {
            let mut out = Versions::default();
            assert!(layer.collect(&key(n), Lsn(0x1000 + 300 * 8), &mut out).unwrap());
            assert_eq!(out.list.len(), 151, "300 back to the image at 150");
            assert_eq!(out.list[150].1, page(150));
            assert_eq!(out.list[0].1, versions[n as usize * 301 + 300].2);
        }
        let scanned: Vec<_> = layer.scan().map(|v| v.unwrap()).collect();
        let decoded: Vec<_> = scanned.iter().map(|v| (v.key, v.lsn, layer.decode_raw(v).unwrap())).collect();
        assert_eq!(decoded, versions);

        // Rewritten as compaction does (stored values copied raw): the
        // small values are grouped again, not stored uncompressed.
        let name = LayerName::delta(key(0), key(10), Lsn(0x100), Lsn(0x10000));
        let out_dir = dir.join("out");
        std::fs::create_dir_all(&out_dir).unwrap();
        let mut w = LayerFileWriter::new(&out_dir, name).unwrap();
        for v in &scanned {
            w.put_raw(v).unwrap();
        }
        let rewritten = w.finish(false).unwrap();
        let again = LayerFile::open(&rewritten, &files).unwrap();
        let size_again = std::fs::metadata(&rewritten).unwrap().len() as usize;
        assert!(size_again * 10 < size * 11, "rewritten {size_again} bytes against {size}");
        let decoded_again: Vec<_> =
            again.scan().map(|v| v.unwrap()).map(|v| (v.key, v.lsn, again.decode_raw(&v).unwrap())).collect();
        assert_eq!(decoded_again, versions);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_scan_reads_ahead_across_windows_and_still_checks_every_value() {
        let dir = strata_test_support::scratch_dir("scan");
        // Small records, pages and now and then a value larger than the
        // read-ahead window, over several windows' worth of bytes.
        let mut versions = Vec::new();
        for n in 0..900u32 {
            let v = match n % 150 {
                // Incompressible, so that it is stored larger than a window.
                149 => {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ n as u64;
                    let noise = (0..SCAN_READ_AHEAD + 4099).map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    });
                    Value::Image(Bytes::from(noise.collect::<Vec<u8>>()))
                }
                k if k % 3 == 0 => page(n as u8),
                _ => Value::Native(NativeRecord::ClearVmBits(vec![(n, 1)])),
            };
            versions.push((key(n), Lsn(0x200 + n as u64), v));
        }
        let path = write(&dir, &versions);
        let files = FileCache::new(4, Default::default());
        let layer = LayerFile::open(&path, &files).unwrap();
        let scanned: Vec<_> = layer.scan().map(|v| v.unwrap()).collect();
        assert_eq!(scanned.len(), versions.len());
        let largest = scanned.iter().map(|v| v.bytes.len()).max().unwrap();
        assert!(largest as u64 > SCAN_READ_AHEAD, "a value stored larger than the window: {largest}");
        assert!(std::fs::metadata(&path).unwrap().len() > 4 * SCAN_READ_AHEAD, "several windows");
        for (raw, (k, l, v)) in scanned.iter().zip(&versions) {
            assert_eq!((raw.key, raw.lsn), (*k, *l));
            assert_eq!(&layer.decode_raw(raw).unwrap(), v, "key {k}");
        }
        // A flipped byte in one value fails that value alone, naming the file.
        let victim = scanned.len() / 2;
        let offset = {
            let l = layer.loaded().unwrap();
            let block = layer.read_block(&l, victim / ENTRIES_PER_BLOCK).unwrap();
            block[victim % ENTRIES_PER_BLOCK].offset
        };
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[offset as usize] ^= 0xff;
        let damaged = dir.join("damaged");
        std::fs::write(&damaged, &bytes).unwrap();
        let layer = LayerFile::open(&damaged, &files).unwrap();
        let results: Vec<_> = layer.scan().collect();
        assert_eq!(results.len(), versions.len());
        for (i, r) in results.iter().enumerate() {
            match r {
                Err(e) if i == victim => {
                    assert!(e.to_string().contains("CRC") && e.to_string().contains("damaged"), "{e}")
                }
                Err(e) => panic!("version {i} failed: {e}"),
                Ok(_) => assert_ne!(i, victim, "the damaged value was not caught"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn image_layers_hold_one_base_version_per_key_and_end_the_search() {
        let dir = std::env::temp_dir().join(format!("strata-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let at = Lsn(0x500);
        let name = LayerName::image(key(0), key(1000), at);
        let mut w = LayerFileWriter::new(&dir, name).unwrap();
        // Every other key, over several index blocks.
        for n in (0..1000).step_by(2) {
            w.put(&key(n), at, &page(n as u8)).unwrap();
        }
        // What an image layer cannot hold is refused, naming the file.
        for (k, l, v) in [
            (key(998), at, page(1)),
            (key(999), Lsn(0x400), page(1)),
            (key(999), at, Value::Native(NativeRecord::ClearVmBits(vec![(1, 1)]))),
        ] {
            let err = w.put(&k, l, &v).expect_err("not an image layer's version").to_string();
            assert!(err.contains("image layer") && err.contains(&format!("{name}.tmp")), "{err}");
        }
        let path = w.finish(false).unwrap();
        assert_eq!(path.file_name().unwrap().to_str().unwrap().parse::<LayerName>().unwrap(), name);
        let files = FileCache::new(4, Default::default());
        let layer = LayerFile::open(&path, &files).unwrap();
        assert_eq!(layer.name.kind, LayerKind::Image);
        for n in [0u32, 1, 254, 255, 256, 511, 998, 999] {
            let mut out = Versions::default();
            assert!(layer.collect(&key(n), Lsn(0x900), &mut out).unwrap(), "key {n}");
            assert!(out.complete());
            let expected = if n % 2 == 0 { vec![(at, page(n as u8))] } else { vec![] };
            assert_eq!(out.list, expected, "key {n}");
        }
        // Newer versions gathered before stay; the image is their base.
        let mut out = Versions::default();
        out.push(Lsn(0x600), Value::Native(NativeRecord::ClearVmBits(vec![(1, 1)])));
        assert!(layer.collect(&key(3), Lsn(0x600), &mut out).unwrap());
        assert_eq!(out.list.len(), 1, "key 3 had no value at the image's LSN: the page starts from zeros");

        // A file that claims to be an image layer but holds a delta's
        // versions (a non-base value; two versions of a key) is refused at open.
        for versions in [
            vec![(key(1), at, Value::Native(NativeRecord::ClearVmBits(vec![(1, 1)])))],
            vec![(key(1), at, page(1)), (key(1), at, page(2))],
        ] {
            let delta = LayerName::delta(key(0), key(1000), at, Lsn(at.0 + 1));
            let mut w = LayerFileWriter::new(&dir, delta).unwrap();
            for (k, l, v) in &versions {
                w.put(k, *l, v).unwrap();
            }
            let mut bytes = std::fs::read(w.finish(false).unwrap()).unwrap();
            bytes[..8].copy_from_slice(b"STRIMAGE");
            let crc = crc32c::crc32c(&bytes[..HEADER_SIZE - 4]);
            bytes[HEADER_SIZE - 4..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
            let len = bytes.len();
            bytes[len - 8..].copy_from_slice(b"STRIMEND");
            let err = LayerFile::from_bytes(Path::new("forged.image"), bytes).err().expect("refused").to_string();
            assert!(err.contains("forged.image") && err.contains("not one base version"), "{err}");
        }
        // Names: both kinds round-trip; anything else is refused.
        let delta = LayerName::delta(key(0), key(9), Lsn(1), Lsn(5));
        assert_eq!(delta.to_string().parse::<LayerName>().unwrap(), delta);
        for bad in [
            format!("{}-{}__{:016X}.delta", key(0), key(9), 5),
            format!("{}-{}__{:016X}-{:016X}.image", key(0), key(9), 1, 5),
            format!("{}-{}__{:016X}.image", key(0), key(9), u64::MAX),
            format!("{}-{}__{:016x}.image", key(0), key(9), 0xab),
        ] {
            assert!(bad.parse::<LayerName>().is_err(), "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A page like PostgreSQL's: mostly shared structure, a few bytes of its own.
    fn heap_like_page(n: u32) -> Value {
        let mut p = vec![0u8; 8192];
        for (i, chunk) in p.chunks_mut(64).enumerate() {
            chunk[..4].copy_from_slice(&(n * 128 + i as u32).to_le_bytes());
            chunk[4..].fill(b' ');
        }
        Value::Image(Bytes::from(p))
    }

    #[test]
    fn image_layers_store_groups_of_values_and_read_each_alone() {
        let dir = std::env::temp_dir().join(format!("strata-image-groups-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let at = Lsn(0x500);
        let n = 1000u32;
        let mut w = LayerFileWriter::new(&dir, LayerName::image(key(0), key(n + 1), at)).unwrap();
        for i in 0..n {
            // A value too large for a group now and then: stored alone, in key order.
            let v = if i % 300 == 7 {
                Value::Image(Bytes::from(vec![i as u8; GROUP_BYTES + 1]))
            } else {
                heap_like_page(i)
            };
            w.put(&key(i), at, &v).unwrap();
        }
        assert_eq!(w.count(), u64::from(n));
        let path = w.finish(false).unwrap();
        // Each page alone at level 1 is what format version 1 stored.
        let mut alone = zstd::bulk::Compressor::new(1).unwrap();
        let single: usize = (0..n)
            .filter(|i| i % 300 != 7)
            .map(|i| {
                let mut enc = Vec::new();
                heap_like_page(i).encode(&mut enc);
                alone.compress(&enc).unwrap().len() + ENTRY_SIZE
            })
            .sum();
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(size * 10 < single * 8, "grouped {size} bytes against {single} page by page");

        let files = FileCache::new(4, Default::default());
        let layer = LayerFile::open(&path, &files).unwrap();
        for i in [0u32, 1, 6, 7, 8, 15, 16, 17, 307, 500, 999] {
            let mut out = Versions::default();
            assert!(layer.collect(&key(i), at, &mut out).unwrap());
            let expected = if i % 300 == 7 {
                Value::Image(Bytes::from(vec![i as u8; GROUP_BYTES + 1]))
            } else {
                heap_like_page(i)
            };
            assert_eq!(out.list, vec![(at, expected)], "key {i}");
        }
        // A scan hands out every value on its own, uncompressed, in order.
        let mut seen = 0u32;
        for v in layer.scan() {
            let v = v.unwrap();
            assert_eq!(v.key, key(seen));
            assert_eq!(v.flags & (FLAG_GROUP | FLAG_ZSTD), if seen % 300 == 7 { FLAG_ZSTD } else { 0 });
            if seen % 300 != 7 {
                assert_eq!(layer.decode_raw(&v).unwrap(), heap_like_page(seen));
            }
            seen += 1;
        }
        assert_eq!(seen, n);

        // Damage in the first group fails the reads of its values only, naming
        // the file. This thread just read the same offsets of the undamaged
        // file: its recent groups and index blocks are not this loading's.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_SIZE + 10] ^= 0xff;
        let layer = LayerFile::from_bytes(Path::new("damaged.image"), bytes).unwrap();
        for i in 0..7 {
            let err = layer.collect(&key(i), at, &mut Versions::default()).unwrap_err().to_string();
            assert!(err.contains("damaged.image") && err.contains("CRC"), "{err}");
        }
        assert!(layer.collect(&key(8), at, &mut Versions::default()).is_ok());
        assert!(layer.scan().any(|v| v.is_err()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_errors_name_the_step_and_the_file() {
        let dir = std::env::temp_dir().join(format!("strata-delta-errors-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let name = LayerName::delta(key(1), key(2), Lsn(0x100), Lsn(0x200));
        let tmp_name = format!("{name}.tmp");

        let missing = dir.join("missing");
        let err = LayerFileWriter::new(&missing, name).err().expect("no directory");
        assert_eq!((err.op, err.path.as_path()), ("creating", missing.join(&tmp_name).as_path()));
        assert_eq!(err.source.kind(), std::io::ErrorKind::NotFound);
        assert!(err.to_string().starts_with(&format!("creating {}: ", missing.join(&tmp_name).display())), "{err}");

        // The temporary file disappears before the rename (the sync of the open file still works).
        let mut w = LayerFileWriter::new(&dir, name).unwrap();
        assert_eq!(w.path(), dir.join(&tmp_name));
        w.put(&key(1), Lsn(0x100), &page(1)).unwrap();
        std::fs::remove_file(dir.join(&tmp_name)).unwrap();
        let err = w.finish(true).expect_err("nothing to rename");
        assert_eq!((err.op, err.path.as_path()), ("renaming", dir.join(&tmp_name).as_path()));
        assert!(err.to_string().contains(&tmp_name), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
