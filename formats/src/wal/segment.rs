//! WAL segment files: names, sizes, and reading a run of consecutive files
//! as one record stream.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::lsn::Lsn;
use crate::version::PgVersion;
use crate::wal::page::{PageHeader, XLP_LONG_HEADER};
use crate::wal::reader::{StartPosition, WalDecodeError, WalDecoder};
use crate::wal::record::DecodedRecord;

/// A parsed segment file name (`TTTTTTTTXXXXXXXXYYYYYYYY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentName {
    pub timeline: u32,
    pub segment_number: u64,
}

impl SegmentName {
    /// Parses a file name (an optional `.partial` suffix is accepted).
    pub fn parse(name: &str, segment_size: u64) -> Option<SegmentName> {
        let name = name.strip_suffix(".partial").unwrap_or(name);
        if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let timeline = u32::from_str_radix(&name[0..8], 16).ok()?;
        let log = u64::from_str_radix(&name[8..16], 16).ok()?;
        let seg = u64::from_str_radix(&name[16..24], 16).ok()?;
        let per_log = segments_per_xlog_id(segment_size);
        if seg >= per_log {
            return None;
        }
        Some(SegmentName { timeline, segment_number: log * per_log + seg })
    }

    /// The file name PostgreSQL gives this segment.
    pub fn file_name(&self, segment_size: u64) -> String {
        let per_log = segments_per_xlog_id(segment_size);
        format!("{:08X}{:08X}{:08X}", self.timeline, self.segment_number / per_log, self.segment_number % per_log)
    }

    /// LSN of the segment's first byte.
    pub fn start_lsn(&self, segment_size: u64) -> Lsn {
        Lsn(self.segment_number * segment_size)
    }
}

fn segments_per_xlog_id(segment_size: u64) -> u64 {
    0x1_0000_0000 / segment_size
}

/// Errors reading segment files.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: does not follow the previous segment (expected {expected})")]
    Gap { path: PathBuf, expected: String },
    #[error("{}: {error} (offset {offset:#x})", path.display())]
    Decode { path: PathBuf, offset: u64, error: WalDecodeError },
    #[error("input ends inside the record starting at {lsn}")]
    IncompleteRecord { lsn: Lsn },
}

/// The segment size and PostgreSQL version announced by a segment's first page.
pub fn probe_segment(path: &Path) -> Result<(u64, PgVersion), SegmentError> {
    let io = |source| SegmentError::Io { path: path.to_path_buf(), source };
    let invalid = |reason: &str| SegmentError::Invalid { path: path.to_path_buf(), reason: reason.to_string() };
    let mut file = File::open(path).map_err(io)?;
    let mut first = [0u8; 40];
    file.read_exact(&mut first).map_err(io)?;
    let header = PageHeader::decode(&first).ok_or_else(|| invalid("too short for a WAL page header"))?;
    let version = PgVersion::from_wal_page_magic(header.magic)
        .ok_or_else(|| invalid(&format!("unknown WAL page magic {:04X}", header.magic)))?;
    if header.info & XLP_LONG_HEADER == 0 {
        return Err(invalid("first page has no long header"));
    }
    let long = header.long.expect("long flag checked");
    let size = long.segment_size as u64;
    if !size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&size) {
        return Err(invalid(&format!("invalid WAL segment size {size}")));
    }
    Ok((size, version))
}

/// Reads consecutive segment files as one stream of records.
pub struct SegmentReader {
    files: Vec<(PathBuf, SegmentName)>,
    next_file: usize,
    segment_size: u64,
    decoder: WalDecoder,
    current: Option<(PathBuf, File)>,
    buf: Vec<u8>,
    done: bool,
}

impl SegmentReader {
    /// Opens `files` (in order, consecutive, one timeline). Decoding starts at
    /// the first record that begins in the first file, or at `start`.
    pub fn open(files: &[PathBuf], start: Option<Lsn>) -> Result<SegmentReader, SegmentError> {
        let first = files
            .first()
            .ok_or_else(|| SegmentError::Invalid { path: PathBuf::new(), reason: "no WAL files given".into() })?;
        let (segment_size, version) = probe_segment(first)?;
        let mut named = Vec::with_capacity(files.len());
        for path in files {
            let name = path.file_name().and_then(|n| n.to_str()).and_then(|n| SegmentName::parse(n, segment_size));
            let name = name.ok_or_else(|| SegmentError::Invalid {
                path: path.clone(),
                reason: "not a WAL segment file name".into(),
            })?;
            if let Some((_, prev)) = named.last() {
                let prev: &SegmentName = prev;
                if name.segment_number != prev.segment_number + 1 || name.timeline != prev.timeline {
                    let expected = SegmentName { timeline: prev.timeline, segment_number: prev.segment_number + 1 };
                    return Err(SegmentError::Gap { path: path.clone(), expected: expected.file_name(segment_size) });
                }
            }
            named.push((path.clone(), name));
        }
        let first_lsn = named[0].1.start_lsn(segment_size);
        let (decoder_start, mode) = match start {
            Some(lsn) => (lsn, StartPosition::RecordBoundary),
            None => (first_lsn, StartPosition::FindFirstRecord),
        };
        let last_end = Lsn(first_lsn.0 + named.len() as u64 * segment_size);
        if decoder_start < first_lsn || decoder_start >= last_end {
            return Err(SegmentError::Invalid {
                path: named[0].0.clone(),
                reason: format!("start {decoder_start} is outside the files ({first_lsn} to {last_end})"),
            });
        }
        let mut reader = SegmentReader {
            next_file: ((decoder_start.0 - first_lsn.0) / segment_size) as usize,
            files: named,
            segment_size,
            decoder: WalDecoder::new(version, decoder_start, segment_size, mode),
            current: None,
            buf: vec![0u8; crate::limits::SEGMENT_READ_CHUNK],
            done: false,
        };
        if start.is_some() {
            reader.open_next(Some(decoder_start))?;
        }
        Ok(reader)
    }

    /// The segment size of the files.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// The decoder (for its position and system identifier).
    pub fn decoder(&self) -> &WalDecoder {
        &self.decoder
    }

    fn open_next(&mut self, seek_to: Option<Lsn>) -> Result<bool, SegmentError> {
        let Some((path, name)) = self.files.get(self.next_file).cloned() else {
            return Ok(false);
        };
        self.next_file += 1;
        let io = |source| SegmentError::Io { path: path.clone(), source };
        let mut file = File::open(&path).map_err(io)?;
        if let Some(lsn) = seek_to {
            use std::io::Seek;
            let offset = lsn.0 - name.start_lsn(self.segment_size).0;
            file.seek(std::io::SeekFrom::Start(offset)).map_err(io)?;
        }
        self.current = Some((path, file));
        Ok(true)
    }

    /// File and offset holding `lsn`.
    pub fn locate(&self, lsn: Lsn) -> (PathBuf, u64) {
        let segment = lsn.0 / self.segment_size;
        let path =
            self.files.iter().find(|(_, n)| n.segment_number == segment).map(|(p, _)| p.clone()).unwrap_or_else(|| {
                PathBuf::from(
                    SegmentName { timeline: self.files[0].1.timeline, segment_number: segment }
                        .file_name(self.segment_size),
                )
            });
        (path, lsn.0 % self.segment_size)
    }

    /// The next record; `Ok(None)` at the end of the WAL or of the files.
    pub fn next_record(&mut self) -> Result<Option<DecodedRecord>, SegmentError> {
        if self.done {
            return Ok(None);
        }
        loop {
            match self.decoder.next_record() {
                Ok(Some(record)) => return Ok(Some(record)),
                Ok(None) => {}
                Err(WalDecodeError::EndOfWal { .. }) => {
                    self.done = true;
                    return Ok(None);
                }
                Err(error) => {
                    self.done = true;
                    let (path, offset) = self.locate(error.lsn());
                    return Err(SegmentError::Decode { path, offset, error });
                }
            }
            // The decoder needs more input.
            if self.current.is_none() && !self.open_next(None)? {
                self.done = true;
                return match self.decoder.in_record() {
                    Some(lsn) => Err(SegmentError::IncompleteRecord { lsn }),
                    None => Ok(None),
                };
            }
            let (path, file) = self.current.as_mut().expect("opened above");
            let n = file.read(&mut self.buf).map_err(|source| SegmentError::Io { path: path.clone(), source })?;
            if n == 0 {
                // A short (partial) file ends the stream where it ends.
                let expected_end = self.files[self.next_file - 1].1.start_lsn(self.segment_size).0 + self.segment_size;
                self.current = None;
                if self.decoder.input_lsn().0 < expected_end {
                    self.next_file = self.files.len();
                }
                continue;
            }
            self.decoder.feed(&self.buf[..n]);
        }
    }

    /// Where decoding stopped: the end of the last complete record.
    pub fn end_lsn(&self) -> Lsn {
        self.decoder.position()
    }
}

/// The segment files in `dir`, sorted, optionally only those of `timeline`.
pub fn list_segments(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                let n = n.strip_suffix(".partial").unwrap_or(n);
                n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit())
            })
        })
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names() {
        let size = 16 << 20;
        let n = SegmentName::parse("000000010000000A000000FE", size).unwrap();
        assert_eq!(n, SegmentName { timeline: 1, segment_number: 0xA * 256 + 0xFE });
        assert_eq!(n.file_name(size), "000000010000000A000000FE");
        assert_eq!(n.start_lsn(size).to_string(), "A/FE000000");
        assert!(SegmentName::parse("000000010000000A00000100", size).is_none());
        assert!(SegmentName::parse("00000001000000", size).is_none());
        assert!(SegmentName::parse("00000001000000000000001.partial", size).is_none());
        assert_eq!(SegmentName::parse("000000010000000000000003.partial", size).unwrap().segment_number, 3);
    }
}
