//! Clearing `XLR_CHECK_CONSISTENCY` in a WAL byte stream, for stock
//! consumers: a stock standby replaying records that carry the flag runs the
//! consistency check itself and can stop on a benign difference. Each
//! record's flag is cleared and its CRC recomputed; lengths and LSNs do not
//! change, so the stream stays byte-for-byte aligned with the original.

use std::collections::VecDeque;

use crate::lsn::Lsn;
use crate::version::{PgVersion, XLOG_BLCKSZ};
use crate::wal::page::header_size_at;
use crate::wal::reader::{StartPosition, WalDecodeError, WalDecoder};
use crate::wal::record::{record_crc, XLR_CHECK_CONSISTENCY};

/// Rewrites a WAL stream that starts at a record boundary. Output lags the
/// input by at most one incomplete record, since a record's header can only
/// be rewritten once all of it (and so its CRC) is known.
pub struct ConsistencyStripper {
    decoder: WalDecoder,
    segment_size: u64,
    /// Bytes received and not yet released, starting at `buf_start`.
    buf: VecDeque<u8>,
    buf_start: Lsn,
    /// Bytes before this LSN may be released.
    releasable: Lsn,
}

impl ConsistencyStripper {
    /// `start` is a record boundary, or a page boundary (e.g. a segment
    /// start, as pg_receivewal asks for): then the tail of a record that
    /// began earlier is passed through unchanged (its header is not ours to fix).
    pub fn new(version: PgVersion, start: Lsn, segment_size: u64) -> ConsistencyStripper {
        let mode = if start.0.is_multiple_of(XLOG_BLCKSZ as u64) {
            StartPosition::FindFirstRecord
        } else {
            StartPosition::RecordBoundary
        };
        ConsistencyStripper {
            decoder: WalDecoder::new(version, start, segment_size, mode),
            segment_size,
            buf: VecDeque::new(),
            buf_start: start,
            releasable: start,
        }
    }

    /// Where the next output byte is.
    pub fn output_lsn(&self) -> Lsn {
        self.buf_start
    }

    /// Feeds stream bytes and returns the bytes that can be sent now.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<u8>, WalDecodeError> {
        self.buf.extend(bytes);
        self.decoder.feed(bytes);
        loop {
            match self.decoder.next_record() {
                Ok(Some(record)) => {
                    if record.header.info & XLR_CHECK_CONSISTENCY != 0 {
                        let mut raw = record.raw.clone();
                        raw[16] &= !XLR_CHECK_CONSISTENCY;
                        let crc = record_crc(&raw);
                        raw[20..24].copy_from_slice(&crc.to_le_bytes());
                        // Only the 24-byte header changed; write it back, skipping page headers.
                        self.overwrite(record.lsn, &raw[..24]);
                    }
                    self.releasable = record.end_lsn.min(Lsn(self.buf_start.0 + self.buf.len() as u64));
                }
                Ok(None) => break,
                Err(e @ WalDecodeError::Corrupt { .. }) => return Err(e),
                Err(WalDecodeError::EndOfWal { .. }) => break,
            }
        }
        let n = (self.releasable.0 - self.buf_start.0) as usize;
        self.buf_start = self.releasable;
        Ok(self.buf.drain(..n).collect())
    }

    /// Ends the stream: the bytes held back (an incomplete last record, or
    /// what follows the end of the WAL), unchanged.
    pub fn finish(self) -> Vec<u8> {
        self.buf.into_iter().collect()
    }

    fn overwrite(&mut self, lsn: Lsn, bytes: &[u8]) {
        let mut pos = lsn.0;
        for &b in bytes {
            if pos.is_multiple_of(XLOG_BLCKSZ as u64) {
                pos += header_size_at(Lsn(pos), self.segment_size) as u64;
            }
            let i = (pos - self.buf_start.0) as usize;
            self.buf[i] = b;
            pos += 1;
        }
    }
}
