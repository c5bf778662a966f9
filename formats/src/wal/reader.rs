//! Reassembly of WAL records from the raw WAL byte stream.
//!
//! The stream is what segment files and physical replication carry: 8 KiB
//! pages, each starting with a page header, records laid end to end at
//! 8-byte-aligned positions and continued across pages (and segments). The
//! decoder is fed bytes in LSN order, in chunks of any size, and yields
//! complete, CRC-checked records. Memory is bounded by the largest record plus
//! the unconsumed input.

use crate::limits::{MAX_LSN, MAX_RECORD_SIZE, RECORD_PREALLOC};
use crate::lsn::Lsn;
use crate::v15::rmgr::{RM_XLOG_ID, XLOG_SWITCH};
use crate::version::{PgVersion, MAXALIGN, XLOG_BLCKSZ};
use crate::wal::page::{
    header_size_at, PageHeader, LONG_HEADER_SIZE, SHORT_HEADER_SIZE, XLP_ALL_FLAGS, XLP_FIRST_IS_CONTRECORD,
    XLP_FIRST_IS_OVERWRITE_CONTRECORD, XLP_LONG_HEADER,
};
use crate::wal::record::{record_crc, DecodedRecord, RecordHeader, RECORD_HEADER_SIZE};

/// Why decoding stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalDecodeError {
    /// The WAL ends cleanly here: zeros, or a page left over from a recycled segment.
    #[error("end of WAL at {lsn}")]
    EndOfWal { lsn: Lsn },
    /// The bytes at `lsn` are not valid WAL.
    #[error("invalid WAL at {lsn}: {reason}")]
    Corrupt { lsn: Lsn, reason: String },
}

impl WalDecodeError {
    /// LSN the error refers to.
    pub fn lsn(&self) -> Lsn {
        match self {
            WalDecodeError::EndOfWal { lsn } | WalDecodeError::Corrupt { lsn, .. } => *lsn,
        }
    }
}

/// Where the first byte fed to the decoder stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartPosition {
    /// At the start of a record (or at a page boundary before one).
    RecordBoundary,
    /// Anywhere on a page boundary, e.g. the start of a segment file: a
    /// continued record at the start of the page is skipped.
    FindFirstRecord,
}

/// A record being reassembled.
struct Partial {
    start: Lsn,
    bytes: Vec<u8>,
    /// Known once the length field has arrived.
    total_length: Option<u32>,
}

/// Streaming WAL record decoder.
pub struct WalDecoder {
    version: PgVersion,
    segment_size: u64,
    system_id: Option<u64>,
    /// Unconsumed input; `input[input_pos]` is at LSN `pos`.
    input: Vec<u8>,
    input_pos: usize,
    /// LSN of the next byte to consume.
    pos: Lsn,
    /// Whether the page header of the page containing `pos` has been checked.
    header_checked_for: Option<Lsn>,
    /// Bytes of a continued record still to skip (only while finding the first record).
    skip: u64,
    finding_first: bool,
    partial: Option<Partial>,
    prev_record: Option<Lsn>,
    /// After XLOG SWITCH: input up to here is padding.
    skip_until: Option<Lsn>,
    /// Set once an error was returned: the decoder does not resume after one.
    failed: Option<WalDecodeError>,
}

impl WalDecoder {
    /// A decoder whose first input byte is at `start`.
    pub fn new(version: PgVersion, start: Lsn, segment_size: u64, mode: StartPosition) -> WalDecoder {
        assert!(segment_size.is_power_of_two() && segment_size >= XLOG_BLCKSZ as u64);
        WalDecoder {
            version,
            segment_size,
            system_id: None,
            input: Vec::new(),
            input_pos: 0,
            pos: start,
            header_checked_for: None,
            skip: 0,
            finding_first: mode == StartPosition::FindFirstRecord,
            partial: None,
            prev_record: None,
            skip_until: None,
            failed: None,
        }
    }

    /// Requires long page headers to carry this system identifier.
    pub fn set_system_id(&mut self, system_id: u64) {
        self.system_id = Some(system_id);
    }

    /// The system identifier seen in (or set for) long page headers.
    pub fn system_id(&self) -> Option<u64> {
        self.system_id
    }

    /// Requires the next record's `xl_prev` to equal `prev`.
    pub fn set_prev_record(&mut self, prev: Lsn) {
        self.prev_record = Some(prev);
    }

    /// LSN of the next byte the decoder expects.
    pub fn input_lsn(&self) -> Lsn {
        Lsn(self.pos.0.saturating_add((self.input.len() - self.input_pos) as u64))
    }

    /// LSN up to which input has been consumed.
    pub fn position(&self) -> Lsn {
        self.pos
    }

    /// Whether a record is partly assembled (input ended inside it).
    pub fn in_record(&self) -> Option<Lsn> {
        self.partial.as_ref().map(|p| p.start)
    }

    /// Appends input; it must continue exactly where the previous input ended.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.input_pos > 0 && self.input_pos * 2 >= self.input.len() {
            self.input.drain(..self.input_pos);
            self.input_pos = 0;
        }
        self.input.extend_from_slice(bytes);
    }

    fn available(&self) -> &[u8] {
        &self.input[self.input_pos..]
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.input.len() - self.input_pos);
        self.input_pos += n;
        self.pos = Lsn(self.pos.0.saturating_add(n as u64));
    }

    fn corrupt<T>(&mut self, lsn: Lsn, reason: String) -> Result<T, WalDecodeError> {
        let err = WalDecodeError::Corrupt { lsn, reason };
        self.failed = Some(err.clone());
        Err(err)
    }

    fn end_of_wal<T>(&mut self, lsn: Lsn) -> Result<T, WalDecodeError> {
        let err = WalDecodeError::EndOfWal { lsn };
        self.failed = Some(err.clone());
        Err(err)
    }

    /// Returns the next complete record, `Ok(None)` if more input is needed,
    /// or an error (after which the decoder stays failed).
    pub fn next_record(&mut self) -> Result<Option<DecodedRecord>, WalDecodeError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        loop {
            // Keeps all LSN arithmetic below (next page, next segment, record
            // end) far from overflow, whatever start position was given.
            if self.pos >= MAX_LSN {
                let pos = self.pos;
                return self.corrupt(pos, "LSN out of range".into());
            }
            // Padding after XLOG SWITCH up to the segment boundary.
            if let Some(until) = self.skip_until {
                let n = ((until.0 - self.pos.0) as usize).min(self.available().len());
                self.consume(n);
                if self.pos < until {
                    return Ok(None);
                }
                self.skip_until = None;
            }

            let page_offset = self.pos.0 % XLOG_BLCKSZ as u64;
            if page_offset == 0 && self.header_checked_for != Some(self.pos) {
                if !self.check_page_header()? {
                    return Ok(None);
                }
                continue;
            }
            let page_left = XLOG_BLCKSZ - page_offset as usize;
            if page_offset < SHORT_HEADER_SIZE as u64 {
                // Only reachable by starting mid-header: the header was not checked.
                let pos = self.pos;
                return self.corrupt(pos, "position is inside a page header".into());
            }

            if self.skip > 0 {
                let n = (self.skip as usize).min(page_left).min(self.available().len());
                if n == 0 {
                    return Ok(None);
                }
                self.consume(n);
                self.skip -= n as u64;
                continue;
            }

            if self.partial.is_none() {
                // Records start MAXALIGNed.
                let pad = (self.pos.align_up(MAXALIGN).0 - self.pos.0) as usize;
                if pad > 0 {
                    if self.available().len() < pad {
                        return Ok(None);
                    }
                    self.consume(pad);
                    continue;
                }
                if self.available().len() < 4 {
                    return Ok(None);
                }
                let total = u32::from_le_bytes(self.available()[..4].try_into().unwrap());
                let start = self.pos;
                if total == 0 {
                    return self.end_of_wal(start);
                }
                if (total as usize) < RECORD_HEADER_SIZE || total > MAX_RECORD_SIZE {
                    return self.corrupt(start, format!("invalid record length {total}"));
                }
                self.partial = Some(Partial {
                    start,
                    bytes: Vec::with_capacity((total as usize).min(RECORD_PREALLOC)),
                    total_length: Some(total),
                });
            }

            // Copy as much of the record as this page and the input allow.
            let partial = self.partial.as_mut().expect("set above");
            let total = partial.total_length.expect("set with the record") as usize;
            let want = total - partial.bytes.len();
            let n = want.min(page_left).min(self.input.len() - self.input_pos);
            if n == 0 {
                return Ok(None);
            }
            let had = partial.bytes.len();
            partial.bytes.extend_from_slice(&self.input[self.input_pos..self.input_pos + n]);
            self.consume(n);
            let partial = self.partial.as_ref().expect("still set");
            if had < RECORD_HEADER_SIZE && partial.bytes.len() >= RECORD_HEADER_SIZE {
                let header = RecordHeader::decode(&partial.bytes).expect("24 bytes present");
                let start = partial.start;
                if let Err(reason) = self.check_record_header(start, &header) {
                    return self.corrupt(start, reason);
                }
            }
            if partial.bytes.len() == total {
                let partial = self.partial.take().expect("still set");
                return self.finish_record(partial).map(Some);
            }
        }
    }

    /// Validates the page header at `self.pos` (a page boundary). Returns false
    /// if more input is needed.
    fn check_page_header(&mut self) -> Result<bool, WalDecodeError> {
        let page = self.pos;
        let expected_size = header_size_at(page, self.segment_size);
        let avail = self.available();
        if avail.len() < expected_size {
            return Ok(false);
        }
        let Some(header) = PageHeader::decode(avail) else {
            // Only possible when a short header claims to be long.
            return self.corrupt(page, "long page header flag does not match the segment boundary".into());
        };
        let in_record = self.partial.is_some();

        // A page never written (zeros) or left over from a recycled segment
        // marks the end of the WAL, unless a record was being continued.
        let never_written = header.magic == 0 && avail[..SHORT_HEADER_SIZE].iter().all(|b| *b == 0);
        let stale = header.magic == self.version.wal_page_magic() && header.page_address < page;
        if (never_written || stale) && !in_record {
            return self.end_of_wal(page);
        }
        if header.magic != self.version.wal_page_magic() {
            return self.corrupt(page, format!("invalid magic number {:04X} in WAL page header", header.magic));
        }
        if header.info & !XLP_ALL_FLAGS != 0 {
            return self.corrupt(page, format!("invalid info bits {:04X} in WAL page header", header.info));
        }
        if header.page_address != page {
            return self.corrupt(page, format!("unexpected page address {} in WAL page header", header.page_address));
        }
        let is_long = header.info & XLP_LONG_HEADER != 0;
        if is_long != (expected_size == LONG_HEADER_SIZE) {
            return self.corrupt(page, "long page header flag does not match the segment boundary".into());
        }
        if let Some(long) = &header.long {
            if long.segment_size as u64 != self.segment_size {
                return self.corrupt(
                    page,
                    format!("WAL segment size {} differs from {}", long.segment_size, self.segment_size),
                );
            }
            if long.block_size as usize != XLOG_BLCKSZ {
                return self.corrupt(page, format!("WAL block size {} is not supported", long.block_size));
            }
            match self.system_id {
                Some(id) if id != long.system_id => {
                    return self.corrupt(page, format!("system identifier {} differs from {}", long.system_id, id));
                }
                _ => self.system_id = Some(long.system_id),
            }
        }

        let contrecord = header.info & XLP_FIRST_IS_CONTRECORD != 0;
        if let Some(partial) = &self.partial {
            let total = partial.total_length.expect("set with the record") as u64;
            let got = partial.bytes.len() as u64;
            if !contrecord {
                if header.info & XLP_FIRST_IS_OVERWRITE_CONTRECORD != 0 {
                    // The server abandoned the partial record (crash during
                    // its write) and continued here; so do we.
                    self.partial = None;
                } else {
                    let start = partial.start;
                    return self.corrupt(start, format!("there is no contrecord flag at {page}"));
                }
            } else if header.remaining_length as u64 != total - got {
                let start = partial.start;
                return self.corrupt(
                    start,
                    format!(
                        "invalid contrecord length {} at {page}, expected {}",
                        header.remaining_length,
                        total - got
                    ),
                );
            }
        } else if contrecord {
            if !self.finding_first {
                return self.corrupt(page, "contrecord flag set where a new record should start".into());
            }
            // Skip the tail of a record that began before our input; a tail
            // longer than this page continues on the next one, whose header
            // must again carry the contrecord flag.
            let room = (XLOG_BLCKSZ - header.size()) as u64;
            let tail = (header.remaining_length as u64 + MAXALIGN - 1) & !(MAXALIGN - 1);
            self.skip = tail.min(room);
            self.finding_first = tail > room;
        } else {
            self.finding_first = false;
        }
        self.header_checked_for = Some(page);
        self.consume(header.size());
        Ok(true)
    }

    fn check_record_header(&self, start: Lsn, header: &RecordHeader) -> Result<(), String> {
        if !crate::v15::rmgr::is_valid(header.rmgr) {
            return Err(format!("invalid resource manager ID {}", header.rmgr));
        }
        if let Some(prev) = self.prev_record {
            if header.prev != prev {
                return Err(format!("record with incorrect prev-link {} (expected {prev})", header.prev));
            }
        } else if header.prev >= start {
            return Err(format!("record with incorrect prev-link {}", header.prev));
        }
        Ok(())
    }

    fn finish_record(&mut self, partial: Partial) -> Result<DecodedRecord, WalDecodeError> {
        let start = partial.start;
        let header = RecordHeader::decode(&partial.bytes).expect("complete record");
        let crc = record_crc(&partial.bytes);
        if crc != header.crc {
            return self.corrupt(
                start,
                format!(
                    "incorrect resource manager data checksum in record (stored {:08X}, computed {crc:08X})",
                    header.crc
                ),
            );
        }
        let mut end = self.pos.align_up(MAXALIGN);
        if header.rmgr == RM_XLOG_ID && header.rmgr_info() == XLOG_SWITCH {
            // The rest of the segment is padding.
            end = Lsn(self.pos.0.div_ceil(self.segment_size) * self.segment_size);
            self.skip_until = Some(end);
        }
        match DecodedRecord::decode(self.version, start, end, partial.bytes) {
            Ok(record) => {
                self.prev_record = Some(start);
                Ok(record)
            }
            Err(e) => self.corrupt(start, e.to_string()),
        }
    }
}

/// LSN at which a record written at `lsn` would actually start: records never
/// start at a page boundary but after its header.
pub fn record_start_at(lsn: Lsn, segment_size: u64) -> Lsn {
    let lsn = lsn.align_up(MAXALIGN);
    if lsn.0.is_multiple_of(XLOG_BLCKSZ as u64) {
        Lsn(lsn.0 + header_size_at(lsn, segment_size) as u64)
    } else {
        lsn
    }
}
