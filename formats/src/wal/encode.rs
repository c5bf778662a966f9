//! Writing WAL: encoding records and laying them out in segment pages with
//! correct page headers, continuation flags and CRCs.

use std::collections::BTreeMap;

use crate::lsn::Lsn;
use crate::types::TransactionId;
use crate::version::{PgVersion, MAXALIGN, XLOG_BLCKSZ};
use crate::wal::page::{header_size_at, LongHeaderFields, PageHeader, XLP_FIRST_IS_CONTRECORD, XLP_LONG_HEADER};
use crate::wal::reader::record_start_at;
use crate::wal::record::{
    record_crc, RecordHeader, RECORD_HEADER_SIZE, XLR_BLOCK_ID_DATA_LONG, XLR_BLOCK_ID_DATA_SHORT,
};
use crate::wal::segment::SegmentName;

/// Encodes a record without block references: header, main-data header, data.
pub fn encode_record(rmgr: u8, info: u8, xid: TransactionId, prev: Lsn, main_data: &[u8]) -> Vec<u8> {
    let data_header: Vec<u8> = if main_data.is_empty() {
        Vec::new()
    } else if main_data.len() < 256 {
        vec![XLR_BLOCK_ID_DATA_SHORT, main_data.len() as u8]
    } else {
        let mut h = vec![XLR_BLOCK_ID_DATA_LONG];
        h.extend_from_slice(&(main_data.len() as u32).to_le_bytes());
        h
    };
    let total = RECORD_HEADER_SIZE + data_header.len() + main_data.len();
    let header = RecordHeader { total_length: total as u32, xid, prev, info, rmgr, crc: 0 };
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&data_header);
    out.extend_from_slice(main_data);
    let crc = record_crc(&out);
    out[20..24].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Builds WAL in memory, segment by segment, from a start position.
/// Pages before the start position stay zero apart from the segment's long
/// header, which a server checks whenever it opens a segment.
pub struct WalBuilder {
    version: PgVersion,
    system_id: u64,
    timeline: u32,
    segment_size: u64,
    /// Next byte to write.
    pos: Lsn,
    prev_record: Lsn,
    segments: BTreeMap<u64, Vec<u8>>,
}

/// The page headers a reader checks before the first byte of a WAL that
/// begins at `start`, inside a segment whose earlier bytes it does not
/// have: the segment's long header (read whenever a segment is opened) and
/// the header of `start`'s page. Zeros elsewhere; full size, with its file
/// name. A hot standby of a timeline that begins mid-segment needs it
/// (`docs/replicas.md`).
pub fn headers_before(
    version: PgVersion,
    system_id: u64,
    timeline: u32,
    segment_size: u64,
    start: Lsn,
) -> (String, Vec<u8>) {
    let mut b = WalBuilder::new(version, system_id, timeline, segment_size, start, Lsn::INVALID);
    b.ensure_page_header(Lsn(start.0 - start.0 % XLOG_BLCKSZ as u64));
    b.into_segments().pop().expect("the segment of start")
}

impl WalBuilder {
    /// A builder whose first record will start at `start` (moved past a page
    /// header if it falls on a page boundary); `prev` is the record before it.
    pub fn new(
        version: PgVersion,
        system_id: u64,
        timeline: u32,
        segment_size: u64,
        start: Lsn,
        prev: Lsn,
    ) -> WalBuilder {
        WalBuilder {
            version,
            system_id,
            timeline,
            segment_size,
            pos: start.align_up(MAXALIGN),
            prev_record: prev,
            segments: BTreeMap::new(),
        }
    }

    /// LSN at which the next record will start.
    pub fn next_record_lsn(&self) -> Lsn {
        record_start_at(self.pos, self.segment_size)
    }

    /// Appends a record built by `build(lsn, prev)`; returns its start LSN.
    /// Records need their own LSN (e.g. a checkpoint's redo pointer) and the
    /// previous record's.
    pub fn append_with(&mut self, build: impl FnOnce(Lsn, Lsn) -> Vec<u8>) -> Lsn {
        let lsn = self.next_record_lsn();
        let record = build(lsn, self.prev_record);
        debug_assert_eq!(RecordHeader::decode(&record).map(|h| h.total_length as usize), Some(record.len()));
        self.ensure_page_header(Lsn(lsn.0 - lsn.0 % XLOG_BLCKSZ as u64));
        self.pos = lsn;
        let mut remaining = &record[..];
        loop {
            let page_left = XLOG_BLCKSZ - (self.pos.0 % XLOG_BLCKSZ as u64) as usize;
            let n = page_left.min(remaining.len());
            self.write_bytes(self.pos, &remaining[..n]);
            self.pos = Lsn(self.pos.0 + n as u64);
            remaining = &remaining[n..];
            if remaining.is_empty() {
                break;
            }
            // At a page boundary with more to write: a continuation page.
            self.write_page_header(self.pos, remaining.len() as u32);
        }
        self.pos = self.pos.align_up(MAXALIGN);
        self.prev_record = lsn;
        lsn
    }

    /// Position after the last record (where the server continues writing).
    pub fn end_lsn(&self) -> Lsn {
        self.pos
    }

    /// The segments written, full size, with their file names.
    pub fn into_segments(self) -> Vec<(String, Vec<u8>)> {
        let (timeline, size) = (self.timeline, self.segment_size);
        self.segments
            .into_iter()
            .map(|(segno, bytes)| (SegmentName { timeline, segment_number: segno }.file_name(size), bytes))
            .collect()
    }

    fn segment(&mut self, segno: u64) -> &mut Vec<u8> {
        let size = self.segment_size as usize;
        if !self.segments.contains_key(&segno) {
            let mut seg = vec![0u8; size];
            let header = self.page_header(Lsn(segno * self.segment_size), 0);
            header.encode(&mut seg);
            self.segments.insert(segno, seg);
        }
        self.segments.get_mut(&segno).expect("inserted above")
    }

    fn page_header(&self, page: Lsn, remaining: u32) -> PageHeader {
        let long = page.0.is_multiple_of(self.segment_size);
        let mut info = 0;
        if long {
            info |= XLP_LONG_HEADER;
        }
        if remaining > 0 {
            info |= XLP_FIRST_IS_CONTRECORD;
        }
        PageHeader {
            magic: self.version.wal_page_magic(),
            info,
            timeline: self.timeline,
            page_address: page,
            remaining_length: remaining,
            long: long.then_some(LongHeaderFields {
                system_id: self.system_id,
                segment_size: self.segment_size as u32,
                block_size: XLOG_BLCKSZ as u32,
            }),
        }
    }

    fn write_page_header(&mut self, page: Lsn, remaining: u32) {
        let header = self.page_header(page, remaining);
        let offset = (page.0 % self.segment_size) as usize;
        let seg = self.segment(page.0 / self.segment_size);
        header.encode(&mut seg[offset..]);
        self.pos = Lsn(page.0 + header_size_at(page, self.segment_size) as u64);
    }

    /// Writes a header for `page` if it has none yet (its magic is zero).
    fn ensure_page_header(&mut self, page: Lsn) {
        let offset = (page.0 % self.segment_size) as usize;
        let magic_missing = {
            let seg = self.segment(page.0 / self.segment_size);
            seg[offset] == 0 && seg[offset + 1] == 0
        };
        if magic_missing {
            let header = self.page_header(page, 0);
            let seg = self.segment(page.0 / self.segment_size);
            header.encode(&mut seg[offset..]);
        }
    }

    fn write_bytes(&mut self, at: Lsn, bytes: &[u8]) {
        let offset = (at.0 % self.segment_size) as usize;
        debug_assert!(offset + bytes.len() <= self.segment_size as usize);
        let seg = self.segment(at.0 / self.segment_size);
        seg[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
}
