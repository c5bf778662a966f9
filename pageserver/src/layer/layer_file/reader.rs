//! Point reads of a layer file: [`LayerFile::collect`] finds a key's
//! versions through the in-memory summary, one index block and the values
//! it needs, never the whole file. Also the helpers that read, check and
//! decode stored values, which scans share.

use bytes::Bytes;
use std::sync::Arc;

use strata_formats::Lsn;

use super::cache;
use super::decompress::decompress;
use super::format::{Entry, ENTRY_SIZE, FLAG_BASE, FLAG_GROUP, FLAG_ZSTD, MAX_VALUE};
use super::name::LayerKind;
use super::open::{BlockError, Loaded};
use super::residency::LayerFile;
use crate::key::Key;
use crate::layer::group::Group;
use crate::layer::{LayerError, Versions};
use crate::value::Value;

impl LayerFile {
    /// The file is corrupt, for `reason`; names the file.
    pub(super) fn corrupt(&self, reason: String) -> LayerError {
        LayerError::Corrupt { path: self.path().display().to_string(), reason }
    }

    /// [`Self::read_block`] through this thread's recent index blocks (a
    /// loaded file never changes; a new loading has a new id).
    fn read_block_cached(&self, l: &Loaded, block: usize) -> Result<Arc<Vec<Entry>>, LayerError> {
        cache::index_block((l.id, block), || self.read_block(l, block))
    }

    /// The entries of index block `block`, decoded.
    pub(super) fn read_block(&self, l: &Loaded, block: usize) -> Result<Vec<Entry>, LayerError> {
        match l.index_block(block) {
            Ok(buf) => Ok(buf.chunks_exact(ENTRY_SIZE).map(Entry::decode).collect()),
            Err(BlockError::Io(source)) => Err(LayerError::Io { path: self.path().display().to_string(), source }),
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

    /// Refuses an entry whose value is longer than the format allows.
    pub(super) fn check_len(&self, e: &Entry) -> Result<(), LayerError> {
        if e.len > MAX_VALUE {
            return Err(self.corrupt(format!("value of {} bytes at offset {}", e.len, e.offset)));
        }
        Ok(())
    }

    /// Refuses stored bytes that do not match their entry's CRC.
    pub(super) fn check_crc(&self, e: &Entry, stored: &[u8]) -> Result<(), LayerError> {
        if crc32c::crc32c(stored) != e.crc {
            return Err(self.corrupt(format!("CRC mismatch in the value of key {} at offset {}", e.key, e.offset)));
        }
        Ok(())
    }

    /// A read of the file failed; names the file.
    pub(super) fn io(&self, source: std::io::Error) -> LayerError {
        LayerError::Io { path: self.path().display().to_string(), source }
    }

    /// The group an entry's value belongs to (`FLAG_GROUP`).
    fn read_group(&self, l: &Loaded, e: &Entry) -> Result<Group, LayerError> {
        let stored = self.read_stored(l, e)?;
        self.decode_group(e, &stored)
    }

    /// A group from its stored (checked) bytes.
    pub(super) fn decode_group(&self, e: &Entry, stored: &[u8]) -> Result<Group, LayerError> {
        decompress(stored, crate::layer::group::MAX_PAYLOAD, false)
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
        cache::group((l.id, at), || self.read_group(l, e))
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
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use strata_redo::NativeRecord;

    use super::*;
    use crate::layer::files::FileCache;
    use crate::layer::layer_file::format::{FOOTER_SIZE, GROUP_BYTES, HEADER_SIZE};
    use crate::layer::layer_file::name::LayerName;
    use crate::layer::layer_file::test_util::{key, page, write};
    use crate::layer::layer_file::writer::LayerFileWriter;

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
        let files = FileCache::new(4, Default::default(), crate::clock::system());
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
    fn a_layer_that_dropped_its_index_opens_its_file_again_at_the_next_read() {
        let dir = std::env::temp_dir().join(format!("strata-unload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 600 versions of key 1, one of each of keys 2..500.
        let mut versions: Vec<(Key, Lsn, Value)> =
            (0..600u64).map(|i| (key(1), Lsn(0x100 + i * 8), page(i as u8))).collect();
        versions.extend((2..500).map(|n| (key(n), Lsn(0x200), page(n as u8))));
        let path = write(&dir, &versions);
        let files = FileCache::new(4, Default::default(), crate::clock::system());
        let layer = LayerFile::open(&path, &files).unwrap();
        let loaded = layer.loaded().unwrap();
        // The filter is sized by the 499 distinct keys (499 × 8 bits, to a
        // power of two), not by the 1098 versions.
        assert_eq!(loaded.filter.size(), 512);
        let kept = layer.index_memory();
        assert!(kept >= 512 + 9 * 32, "{kept}");
        // A read in progress keeps what it uses.
        assert_eq!(layer.unload(), 0);
        drop(loaded);
        assert_eq!(layer.unload(), kept);
        assert_eq!((layer.index_memory(), layer.unload()), (0, 0));
        assert!(layer.is_resident(), "the file stays on local disk");
        assert_eq!(layer.len(), versions.len() as u64);
        // The next read opens the file again and finds the same versions.
        let mut out = Versions::default();
        assert!(layer.collect(&key(1), Lsn(0x100 + 599 * 8), &mut out).unwrap());
        assert_eq!(out.list, vec![(Lsn(0x100 + 599 * 8), page(599u64 as u8))]);
        assert_eq!(layer.index_memory(), kept);

        // A file replaced behind the layer's back is refused at that open.
        assert_eq!(layer.unload(), kept);
        for sub in ["other", "mem"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(&path, std::fs::read(write(&dir.join("other"), &versions[..700])).unwrap()).unwrap();
        let err = layer.collect(&key(1), Lsn(0x200), &mut Versions::default()).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains("local file is"), "{err}");

        // A layer held in memory has no file to open again: it never unloads.
        let bytes = std::fs::read(write(&dir.join("mem"), &versions)).unwrap();
        let in_memory = LayerFile::from_bytes(&path, bytes).unwrap();
        assert!(in_memory.index_memory() > kept);
        assert_eq!(in_memory.unload(), 0);
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
        let files = FileCache::new(4, Default::default(), crate::clock::system());
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

        let files = FileCache::new(4, Default::default(), crate::clock::system());
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
}
