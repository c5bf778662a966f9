//! Writing layer files: versions go in in key, then LSN order; small
//! values are gathered into compressed groups, larger ones stored alone,
//! and the index and footer follow at `finish`. The file is written under
//! a temporary name (`<name>.tmp`) and takes its layer's name only once
//! whole, so a file under a layer's name is always complete.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use strata_formats::Lsn;

use super::format::{
    encode_header, Entry, RawVersion, BLOCK_REF_SIZE, COMPRESS_MIN, DELTA_GROUP_BYTES, DELTA_GROUP_VALUE,
    DELTA_GROUP_VALUES, DELTA_LEVEL, ENTRIES_PER_BLOCK, ENTRY_SIZE, FLAG_BASE, FLAG_GROUP, FLAG_ZSTD, FOOTER_SIZE,
    GROUP_BYTES, GROUP_VALUES, HEADER_SIZE, IMAGE_LEVEL, INDEX_LEVEL, MAX_STORED_BLOCK,
};
use super::name::{LayerKind, LayerName};
use crate::key::Key;
use crate::layer::group::GroupBuilder;
use crate::value::Value;

/// A step of writing a layer file that failed, naming the step and the file.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct WriteError {
    /// `creating`, `writing`, `syncing` or `renaming`.
    pub op: &'static str,
    /// The file being written.
    pub path: PathBuf,
    /// Why the step failed.
    #[source]
    pub source: std::io::Error,
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

#[cfg(test)]
mod tests {
    use strata_redo::NativeRecord;

    use super::*;
    use crate::layer::files::FileCache;
    use crate::layer::layer_file::residency::LayerFile;
    use crate::layer::layer_file::test_util::{key, page, write};
    use crate::layer::Versions;

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
        let files = FileCache::new(4, Default::default(), crate::clock::system());
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
