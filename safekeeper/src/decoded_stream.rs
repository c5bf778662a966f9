//! Decoded streams (`strata_protocol::decoded_wal`): the WAL of a timeline
//! decoded once into chunks of records, each routed for every shard of
//! the layout at once, and shared by the streams of every shard; each
//! stream then encodes its shard's batch in its own zstd context.
//!
//! A chunk starts at the end of a record and holds the whole records
//! decoded from there up to about `DECODED_BATCH_TARGET` bytes or the
//! limit asked (the commit LSN). The streams of a tenant's shards follow
//! the same commits, so they ask for the same chunks: whichever comes
//! first decodes, the others take its chunk from the cache.

use std::collections::VecDeque;
use std::sync::Arc;

use strata_formats::version::PgVersion;
use strata_formats::wal::reader::{StartPosition, WalDecoder};
use strata_formats::wal::record::DecodedRecord;
use strata_formats::Lsn;
use strata_protocol::decoded_wal::{route, BatchBuilder, BatchEncoder, Routing, ShardFilter};
use strata_protocol::limits::{DECODED_BATCH_TARGET, DECODED_MAX_RECORD};
use strata_protocol::safekeeper::DecodedWal;
use strata_protocol::shard::ShardLayout;

use crate::limits::{DECODED_CACHE_BYTES, DECODED_CACHE_CHUNKS, DECODED_READ_STEP, RECENT_WAL_BYTES};
use crate::wal_reader::WalReader;

/// A record decoded once, with where it goes.
struct Routed {
    rec: DecodedRecord,
    routing: Routing,
}

/// Records decoded from `begin` (the end of the record before them).
pub struct Chunk {
    begin: Lsn,
    /// The end of the last record (`begin` when there is none).
    end: Lsn,
    /// The last record's start (`Lsn::INVALID` when there is none).
    last_record: Lsn,
    /// How far the WAL was read (a record may be cut there).
    read: Lsn,
    records: Vec<Routed>,
    bytes: usize,
}

impl Chunk {
    /// Where in this chunk a stream at `position` goes on: the index of
    /// the first record after it, if `position` is the chunk's begin or a
    /// record's end short of the last.
    fn resume_at(&self, position: Lsn) -> Option<usize> {
        if position == self.begin && !self.records.is_empty() {
            return Some(0);
        }
        if position <= self.begin || position >= self.end {
            return None;
        }
        let i = self.records.partition_point(|r| r.rec.end_lsn < position);
        (self.records.get(i)?.rec.end_lsn == position).then_some(i + 1)
    }
}

/// Why a stream cannot go on decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodedStreamError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The consumer must stream raw WAL past `lsn` (`ErrorCode::RecordTooLarge`).
    #[error("the record at {lsn} cannot be sent decoded: {reason}")]
    Undecodable { lsn: Lsn, reason: String },
}

/// The chunks of one timeline and layout, shared by its streams.
pub struct DecodedCache {
    layout: ShardLayout,
    version: PgVersion,
    system_id: u64,
    segment_size: u64,
    inner: tokio::sync::Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    chunks: VecDeque<Arc<Chunk>>,
    bytes: usize,
    /// A decoder at the end of the newest chunk, fed up to its `read`.
    tail: Option<(Lsn, WalDecoder)>,
}

impl DecodedCache {
    pub fn new(layout: ShardLayout, version: PgVersion, system_id: u64, segment_size: u64) -> DecodedCache {
        DecodedCache { layout, version, system_id, segment_size, inner: Default::default() }
    }

    pub fn layout(&self) -> ShardLayout {
        self.layout
    }

    /// The records after `position`, up to about a batch and at most to
    /// `limit`: from the cache, or decoded now. `wal` reads the segments.
    pub async fn chunk_at(
        &self,
        wal: &mut WalReader,
        position: Lsn,
        limit: Lsn,
    ) -> Result<(Arc<Chunk>, usize), DecodedStreamError> {
        let mut cached = self.inner.lock().await;
        if let Some(found) = cached.chunks.iter().rev().find_map(|c| c.resume_at(position).map(|i| (c.clone(), i))) {
            return Ok(found);
        }
        let decoder = match cached.tail.take() {
            Some((end, d)) if end == position => d,
            _ => {
                let mut d = WalDecoder::new(self.version, position, self.segment_size, StartPosition::RecordBoundary);
                d.set_system_id(self.system_id);
                d
            }
        };
        let (chunk, decoder) = if limit.0.saturating_sub(position.0) <= RECENT_WAL_BYTES {
            // Just written: in the page cache, a few kilobytes to decode.
            decode_chunk(self.layout, decoder, wal, position, limit)?
        } else {
            tokio::task::block_in_place(|| decode_chunk(self.layout, decoder, wal, position, limit))?
        };
        let chunk = Arc::new(chunk);
        cached.tail = decoder.map(|d| (chunk.end, d));
        cached.bytes += chunk.bytes;
        cached.chunks.push_back(chunk.clone());
        while cached.chunks.len() > DECODED_CACHE_CHUNKS
            || (cached.bytes > DECODED_CACHE_BYTES && cached.chunks.len() > 1)
        {
            let old = cached.chunks.pop_front().expect("more than one chunk");
            cached.bytes -= old.bytes;
        }
        Ok((chunk, 0))
    }
}

/// Decodes from `decoder`'s position to about a batch or `limit`. The
/// decoder comes back to go on from the chunk's end, unless it failed.
/// Records decoded before a failure are still a chunk: the failure is
/// answered when a stream asks past them.
fn decode_chunk(
    layout: ShardLayout,
    mut decoder: WalDecoder,
    wal: &mut WalReader,
    begin: Lsn,
    limit: Lsn,
) -> Result<(Chunk, Option<WalDecoder>), DecodedStreamError> {
    let mut chunk = Chunk {
        begin,
        end: begin,
        last_record: Lsn::INVALID,
        read: decoder.input_lsn(),
        records: Vec::new(),
        bytes: 0,
    };
    let mut buf = Vec::new();
    while chunk.bytes < DECODED_BATCH_TARGET && chunk.read < limit {
        let n = ((limit.0 - chunk.read.0) as usize).min(DECODED_READ_STEP);
        buf.resize(n, 0);
        wal.read(chunk.read, &mut buf)?;
        decoder.feed(&buf);
        chunk.read = Lsn(chunk.read.0 + n as u64);
        if let Err(e) = decode_records(layout, &mut decoder, &mut chunk) {
            return if chunk.records.is_empty() { Err(e) } else { Ok((chunk, None)) };
        }
        if chunk.end > chunk.read {
            // A segment switch: the rest of its segment is padding, which
            // ends no record. The chunk covers it unread (a consumer checks
            // that what it was sent was read), and the next chunk begins at
            // the next segment with a decoder of its own.
            chunk.read = chunk.end;
            return Ok((chunk, None));
        }
    }
    Ok((chunk, Some(decoder)))
}

/// Adds the whole records `decoder` holds to `chunk`.
fn decode_records(layout: ShardLayout, decoder: &mut WalDecoder, chunk: &mut Chunk) -> Result<(), DecodedStreamError> {
    loop {
        let rec = match decoder.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => {
                let lsn = decoder.in_record().unwrap_or(chunk.end);
                return Err(DecodedStreamError::Undecodable { lsn, reason: e.to_string() });
            }
        };
        if rec.raw.len() > DECODED_MAX_RECORD {
            let reason = format!("{} bytes, more than the {DECODED_MAX_RECORD} sent whole", rec.raw.len());
            return Err(DecodedStreamError::Undecodable { lsn: rec.lsn, reason });
        }
        chunk.bytes += rec.raw.len();
        chunk.end = rec.end_lsn;
        chunk.last_record = rec.lsn;
        let routing = route(&rec, layout);
        chunk.records.push(Routed { rec, routing });
    }
    // A record being reassembled is bounded too: the decoder holds it whole.
    if let Some(start) = decoder.in_record().filter(|s| chunk.read.0 - s.0 > DECODED_MAX_RECORD as u64) {
        let reason = format!("more than the {DECODED_MAX_RECORD} bytes sent whole");
        return Err(DecodedStreamError::Undecodable { lsn: start, reason });
    }
    Ok(())
}

/// One consumer's decoded stream: its shard, its compressor and where it is.
pub struct DecodedStream {
    cache: Arc<DecodedCache>,
    encoder: BatchEncoder,
    /// The end of the last record sent (or skipped): the next batch's begin.
    position: Lsn,
    last_record: Lsn,
    /// How far the WAL sent was read.
    read: Lsn,
    /// What of each record the shard is sent.
    filter: ShardFilter,
}

impl DecodedStream {
    pub fn new(cache: Arc<DecodedCache>, shard: u8, start: Lsn) -> std::io::Result<DecodedStream> {
        Ok(DecodedStream {
            cache,
            encoder: BatchEncoder::new()?,
            position: start,
            last_record: Lsn::INVALID,
            read: start,
            filter: ShardFilter::new(shard),
        })
    }

    /// How far the WAL sent was read.
    pub fn read_lsn(&self) -> Lsn {
        self.read
    }

    /// The next batch, up to `limit`; its raw WAL bytes covered.
    pub async fn next_batch(
        &mut self,
        wal: &mut WalReader,
        limit: Lsn,
        commit_lsn: Lsn,
        flush_lsn: Lsn,
    ) -> Result<(DecodedWal, u64), DecodedStreamError> {
        let (chunk, from) = self.cache.chunk_at(wal, self.position, limit).await?;
        let mut batch = BatchBuilder::new(self.position);
        for r in &chunk.records[from..] {
            self.filter.add(&mut batch, &r.rec, &r.routing);
        }
        let encoded = self.encoder.encode(&batch.finish())?;
        if chunk.end > self.position {
            self.last_record = chunk.last_record;
        }
        let begin = self.position;
        let covered = chunk.read.0.saturating_sub(self.read.0);
        self.position = self.position.max(chunk.end);
        self.read = self.read.max(chunk.read);
        let message = DecodedWal {
            begin_lsn: begin,
            end_lsn: self.position,
            last_record_lsn: self.last_record,
            read_lsn: self.read,
            commit_lsn,
            flush_lsn,
            batch_len: encoded.batch_len,
            crc32c: encoded.crc,
            payload: encoded.payload,
        };
        Ok((message, covered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::wal::encode::{encode_record, WalBuilder};

    const SEG: u64 = 16 << 20;
    const START: Lsn = Lsn(0x100_0028);

    /// Segments of `n` no-op records of `size` bytes of data each, written
    /// under `dir`; the end of each record.
    fn write_wal(dir: &std::path::Path, n: usize, size: usize) -> Vec<Lsn> {
        let mut b = WalBuilder::new(PgVersion::V15, 7, 1, SEG, START, Lsn(0));
        let mut ends = Vec::new();
        for i in 0..n {
            let data = vec![i as u8; size];
            b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &data));
            ends.push(b.end_lsn());
        }
        std::fs::create_dir_all(dir).unwrap();
        for (name, bytes) in b.into_segments() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        ends
    }

    /// Reads a whole stream through `cache` and, after every chunk, checks
    /// the cache's bounds and its count of bytes; returns the most chunks
    /// and bytes it ever held.
    async fn read_through(cache: &DecodedCache, wal: &mut WalReader, end: Lsn) -> (usize, usize) {
        let (mut position, mut most) = (START, (0, 0));
        while position < end {
            let (chunk, from) = cache.chunk_at(wal, position, end).await.unwrap();
            assert!(chunk.records.len() > from, "a chunk with records after {position}");
            position = chunk.end;
            let held = cache.inner.lock().await;
            let counted: usize = held.chunks.iter().map(|c| c.bytes).sum();
            assert_eq!(held.bytes, counted, "the cache's count of its bytes");
            assert!(held.chunks.len() <= DECODED_CACHE_CHUNKS, "{} chunks", held.chunks.len());
            assert!(held.bytes <= DECODED_CACHE_BYTES || held.chunks.len() == 1, "{} bytes", held.bytes);
            assert!(Arc::ptr_eq(held.chunks.back().unwrap(), &chunk), "the newest chunk is kept");
            most = (most.0.max(held.chunks.len()), most.1.max(held.bytes));
        }
        assert_eq!(position, end);
        most
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_cache_keeps_its_bounds_in_chunks_and_bytes() {
        let dir = std::env::temp_dir().join(format!("strata-sk-decoded-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let layout = ShardLayout::new(4, 8).unwrap();

        // Small records: many chunks of about a batch; the count bounds them.
        let small = dir.join("small");
        let ends = write_wal(&small, 4000, 4000);
        let cache = DecodedCache::new(layout, PgVersion::V15, 7, SEG);
        let mut wal = WalReader::new(&small, SEG, true);
        let (chunks, _) = read_through(&cache, &mut wal, *ends.last().unwrap()).await;
        assert_eq!(chunks, DECODED_CACHE_CHUNKS, "the count bound was reached");

        // Records of 6 MiB: one per chunk; the bytes bound them first.
        let large = dir.join("large");
        let ends = write_wal(&large, 10, 6 << 20);
        let cache = DecodedCache::new(layout, PgVersion::V15, 7, SEG);
        let mut wal = WalReader::new(&large, SEG, true);
        let (chunks, bytes) = read_through(&cache, &mut wal, *ends.last().unwrap()).await;
        assert!(
            chunks < DECODED_CACHE_CHUNKS && bytes > DECODED_CACHE_BYTES - (6 << 20),
            "{chunks} chunks, {bytes} bytes"
        );

        // A stream that fell behind what the cache holds decodes again, and
        // finds the same records.
        let (chunk, from) = cache.chunk_at(&mut wal, START, ends[1]).await.unwrap();
        assert_eq!((chunk.begin, chunk.end, from), (START, ends[0], 0));
        assert!(cache.inner.lock().await.bytes <= DECODED_CACHE_BYTES);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_segment_switch_ends_a_batch_at_the_next_segment_with_its_padding_read() {
        use strata_formats::v15::rmgr::{RM_XLOG_ID, XLOG_SWITCH};
        let dir = std::env::temp_dir().join(format!("strata-sk-decoded-switch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Just over a batch of records, a switch (pg_switch_wal) as the
        // last record a chunk reads, then records in the next segment.
        let mut b = WalBuilder::new(PgVersion::V15, 7, 1, SEG, START, Lsn(0));
        for i in 0..270 {
            let data = vec![i as u8; 4000];
            b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &data));
        }
        let switch = b.append_with(|_, prev| encode_record(RM_XLOG_ID, XLOG_SWITCH, 0, prev, &[]));
        let next_segment = Lsn(SEG * (switch.0 / SEG + 1));
        let mut segments = b.into_segments();
        let mut b = WalBuilder::new(PgVersion::V15, 7, 1, SEG, next_segment, switch);
        b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, b"after the switch"));
        let end = b.end_lsn();
        segments.extend(b.into_segments());
        for (name, bytes) in segments {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        let cache = Arc::new(DecodedCache::new(ShardLayout::new(2, 8).unwrap(), PgVersion::V15, 7, SEG));
        let mut wal = WalReader::new(&dir, SEG, true);
        let mut stream = DecodedStream::new(cache, 1, START).unwrap();
        let mut ends = Vec::new();
        while ends.last() != Some(&end) {
            let (m, _) = stream.next_batch(&mut wal, end, end, end).await.unwrap();
            // What the pageserver checks of every message.
            assert!(m.begin_lsn <= m.end_lsn && m.end_lsn <= m.read_lsn && m.last_record_lsn <= m.end_lsn, "{m:?}");
            assert!(ends.len() < 10, "no progress: {ends:?}");
            ends.push(m.end_lsn);
        }
        assert!(ends.contains(&next_segment), "a batch ends where the switch's padding does: {ends:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
