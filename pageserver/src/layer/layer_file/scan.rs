//! Sequential reads of a layer file: every version in key, then LSN
//! order, as stored (the input of compaction), or only the keys. A scan
//! reads the file in large windows rather than one read per value, and
//! still checks each value against its CRC.

use std::sync::Arc;

use super::decompress::decompress;
use super::format::{Entry, RawVersion, ENTRIES_PER_BLOCK, FLAG_BASE, FLAG_GROUP, FLAG_ZSTD, MAX_VALUE};
use super::open::Loaded;
use super::residency::LayerFile;
use crate::layer::group::Group;
use crate::layer::LayerError;
use crate::value::Value;

impl LayerFile {
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

use crate::limits::SCAN_READ_AHEAD;

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
    use bytes::Bytes;

    use strata_formats::Lsn;
    use strata_redo::NativeRecord;

    use super::*;
    use crate::layer::files::FileCache;
    use crate::layer::layer_file::test_util::{key, page, write};

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
        let files = FileCache::new(4, Default::default(), crate::clock::system());
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
}
