//! The batch encoding: Protobuf entries (`prost`), compressed by one zstd
//! stream per connection, each batch flushed so that it decodes alone on
//! arrival. The stream's history makes the small batches of a busy OLTP
//! load compress as well as large ones.

use std::io;

use prost::Message;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::wal::record::{DecodedRecord, RECORD_HEADER_SIZE};
use strata_formats::Lsn;
use zstd::stream::raw::{Decoder, Encoder, InBuffer, Operation, OutBuffer};
use zstd::zstd_safe::{CParameter, DParameter};

use super::types::{BlockExtent, DecodedWalError, Entry, Skeleton};
use crate::limits::{DECODED_MAX_BATCH, DECODED_WINDOW_LOG, DECODED_ZSTD_LEVEL};

/// One batch on the wire.
#[derive(Clone, PartialEq, Message)]
struct BatchProto {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<EntryProto>,
}

/// One record of a batch. LSNs are deltas, so that they stay small
/// varints: the record starts `gap` bytes after the previous entry's end
/// (the batch's begin for the first) and is `len` bytes long.
#[derive(Clone, PartialEq, Message)]
struct EntryProto {
    #[prost(uint64, tag = "1")]
    gap: u64,
    #[prost(uint64, tag = "2")]
    len: u64,
    /// The whole record; absent for a skeleton.
    #[prost(bytes = "vec", optional, tag = "3")]
    record: Option<Vec<u8>>,
    /// A skeleton's transaction ids.
    #[prost(uint32, tag = "4")]
    xid: u32,
    #[prost(uint32, optional, tag = "5")]
    toplevel_xid: Option<u32>,
    /// A skeleton's blocks, five numbers each: tablespace, database,
    /// relation, fork, block.
    #[prost(uint32, repeated, tag = "6")]
    blocks: Vec<u32>,
}

/// Numbers per block of a skeleton.
const BLOCK_FIELDS: usize = 5;
/// Most block references a record may have (PostgreSQL's `XLR_MAX_BLOCK_ID` + 1).
const MAX_BLOCKS: usize = 33;

/// Collects the entries of one batch, starting at `begin`.
pub struct BatchBuilder {
    proto: BatchProto,
    prev_end: Lsn,
}

impl BatchBuilder {
    pub fn new(begin: Lsn) -> BatchBuilder {
        BatchBuilder { proto: BatchProto::default(), prev_end: begin }
    }

    fn entry(&mut self, lsn: Lsn, end_lsn: Lsn) -> EntryProto {
        debug_assert!(lsn >= self.prev_end && end_lsn > lsn, "entries in LSN order: {lsn} after {}", self.prev_end);
        let gap = lsn.0 - self.prev_end.0;
        self.prev_end = end_lsn;
        EntryProto { gap, len: end_lsn.0 - lsn.0, ..EntryProto::default() }
    }

    /// Adds a whole record, its `xl_prev` and `xl_crc` zeroed.
    pub fn add_whole(&mut self, rec: &DecodedRecord) {
        let mut raw = rec.raw[..(rec.header.total_length as usize).min(rec.raw.len())].to_vec();
        without_prev_and_crc(&mut raw);
        let mut e = self.entry(rec.lsn, rec.end_lsn);
        e.record = Some(raw);
        self.proto.entries.push(e);
    }

    pub fn add_skeleton(&mut self, s: &Skeleton) {
        let mut e = self.entry(s.lsn, s.end_lsn);
        e.xid = s.xid;
        e.toplevel_xid = s.toplevel_xid;
        e.blocks.reserve(s.blocks.len() * BLOCK_FIELDS);
        for b in &s.blocks {
            e.blocks.extend_from_slice(&[b.rel.spc, b.rel.db, b.rel.rel, b.fork as u32, b.block]);
        }
        self.proto.entries.push(e);
    }

    /// The batch's Protobuf bytes.
    pub fn finish(self) -> Vec<u8> {
        self.proto.encode_to_vec()
    }
}

/// `xl_prev` (bytes 8..16) and `xl_crc` (20..24) of a record, zeroed.
pub fn without_prev_and_crc(raw: &mut [u8]) {
    if raw.len() >= RECORD_HEADER_SIZE {
        raw[8..16].fill(0);
        raw[20..24].fill(0);
    }
}

/// A batch ready to send: its compressed bytes, its length before
/// compression and the CRC-32C of those uncompressed bytes.
pub struct EncodedBatch {
    pub payload: Vec<u8>,
    pub batch_len: u32,
    pub crc: u32,
}

/// The compressing side of one stream.
pub struct BatchEncoder {
    zstd: Encoder<'static>,
}

impl BatchEncoder {
    pub fn new() -> io::Result<BatchEncoder> {
        let mut zstd = Encoder::new(DECODED_ZSTD_LEVEL)?;
        zstd.set_parameter(CParameter::WindowLog(DECODED_WINDOW_LOG))?;
        Ok(BatchEncoder { zstd })
    }

    /// Compresses one batch and flushes, so the consumer can decode it
    /// before the next one comes.
    pub fn encode(&mut self, batch: &[u8]) -> io::Result<EncodedBatch> {
        debug_assert!(batch.len() <= DECODED_MAX_BATCH, "a batch within its bound");
        let mut out: Vec<u8> = Vec::with_capacity(zstd::zstd_safe::compress_bound(batch.len()) + 64);
        let mut input = InBuffer::around(batch);
        while input.pos() < batch.len() {
            reserve(&mut out);
            let at = out.len();
            self.zstd.run(&mut input, &mut OutBuffer::around_pos(&mut out, at))?;
        }
        loop {
            reserve(&mut out);
            let at = out.len();
            if self.zstd.flush(&mut OutBuffer::around_pos(&mut out, at))? == 0 {
                break;
            }
        }
        Ok(EncodedBatch { payload: out, batch_len: batch.len() as u32, crc: crc32c::crc32c(batch) })
    }
}

/// Room for one more step of the compressor.
fn reserve(out: &mut Vec<u8>) {
    if out.capacity() - out.len() < 1024 {
        out.reserve(64 * 1024);
    }
}

/// The decompressing side of one stream. After an error the stream's
/// history is lost: the consumer reconnects with a new decoder.
pub struct BatchDecoder {
    zstd: Decoder<'static>,
}

impl BatchDecoder {
    pub fn new() -> BatchDecoder {
        let mut zstd = Decoder::new().expect("a zstd decoder");
        // The window bounds what a decoder holds whatever a peer sends.
        zstd.set_parameter(DParameter::WindowLogMax(DECODED_WINDOW_LOG)).expect("a valid window bound");
        BatchDecoder { zstd }
    }

    /// Decodes one batch whose entries follow `begin`.
    pub fn decode(
        &mut self,
        payload: &[u8],
        batch_len: usize,
        crc: u32,
        begin: Lsn,
    ) -> Result<Vec<Entry>, DecodedWalError> {
        if batch_len > DECODED_MAX_BATCH {
            return Err(DecodedWalError::TooLarge { len: batch_len, max: DECODED_MAX_BATCH });
        }
        let bytes = self.decompress(payload, batch_len)?;
        let got = crc32c::crc32c(&bytes);
        if got != crc {
            return Err(DecodedWalError::Checksum { got, want: crc });
        }
        parse_batch(&bytes, begin)
    }

    fn decompress(&mut self, payload: &[u8], batch_len: usize) -> Result<Vec<u8>, DecodedWalError> {
        let err = |e: io::Error| DecodedWalError::Decompress(e.to_string());
        let mut out = vec![0u8; batch_len];
        let mut input = InBuffer::around(payload);
        let mut output = OutBuffer::around(&mut out[..]);
        loop {
            let (read, written) = (input.pos(), output.pos());
            self.zstd.run(&mut input, &mut output).map_err(err)?;
            let stalled = input.pos() == read && output.pos() == written;
            if stalled || (input.pos() == payload.len() && output.pos() == batch_len) {
                break;
            }
        }
        let got = output.pos();
        // Nothing may be left over: a batch decodes to its announced length.
        let mut extra = [0u8; 1];
        let mut extra_out = OutBuffer::around(&mut extra[..]);
        self.zstd.run(&mut InBuffer::around(&[]), &mut extra_out).map_err(err)?;
        if got != batch_len || input.pos() != payload.len() || extra_out.pos() > 0 {
            return Err(DecodedWalError::Length { got, want: batch_len });
        }
        Ok(out)
    }
}

impl Default for BatchDecoder {
    fn default() -> BatchDecoder {
        BatchDecoder::new()
    }
}

/// The entries of a batch's Protobuf bytes, checked, following `begin`.
pub fn parse_batch(bytes: &[u8], begin: Lsn) -> Result<Vec<Entry>, DecodedWalError> {
    let proto = BatchProto::decode(bytes).map_err(|e| DecodedWalError::Protobuf(e.to_string()))?;
    let mut prev_end = begin;
    let mut entries = Vec::with_capacity(proto.entries.len());
    for (index, e) in proto.entries.into_iter().enumerate() {
        let entry = entry(e, prev_end).map_err(|reason| DecodedWalError::Entry { index, reason })?;
        prev_end = entry.end_lsn();
        entries.push(entry);
    }
    Ok(entries)
}

/// One entry, checked: its LSNs, its record's length, its blocks.
fn entry(e: EntryProto, prev_end: Lsn) -> Result<Entry, String> {
    let lsn = prev_end.0.checked_add(e.gap).ok_or("its LSN overflows")?;
    let end = lsn.checked_add(e.len).ok_or("its end LSN overflows")?;
    if e.len == 0 {
        return Err("it is empty".into());
    }
    let (lsn, end_lsn) = (Lsn(lsn), Lsn(end));
    if let Some(raw) = e.record {
        if raw.len() < RECORD_HEADER_SIZE {
            return Err(format!("a record of {} bytes is shorter than its header", raw.len()));
        }
        let total = u32::from_le_bytes(raw[..4].try_into().expect("four bytes")) as usize;
        if total != raw.len() || raw.len() as u64 > e.len {
            return Err(format!("a record of {} bytes says it has {total}, in {} bytes of WAL", raw.len(), e.len));
        }
        return Ok(Entry::Whole { lsn, end_lsn, raw });
    }
    if !e.blocks.len().is_multiple_of(BLOCK_FIELDS) || e.blocks.len() / BLOCK_FIELDS > MAX_BLOCKS {
        return Err(format!("{} block numbers are not whole blocks, or too many", e.blocks.len()));
    }
    let mut blocks = Vec::with_capacity(e.blocks.len() / BLOCK_FIELDS);
    for b in e.blocks.chunks_exact(BLOCK_FIELDS) {
        let fork = u8::try_from(b[3]).ok().and_then(ForkNumber::from_u8).ok_or(format!("fork {}", b[3]))?;
        blocks.push(BlockExtent { rel: RelFileNode { spc: b[0], db: b[1], rel: b[2] }, fork, block: b[4] });
    }
    Ok(Entry::Skeleton(Skeleton { lsn, end_lsn, xid: e.xid, toplevel_xid: e.toplevel_xid, blocks }))
}
