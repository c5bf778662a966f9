//! WAL decoded once (`docs/safekeeper-protocol.md`, "Decoded WAL"): a
//! safekeeper decodes each record once and sends each shard of a tenant
//! only what that shard stores, as batches of Protobuf entries compressed
//! with one zstd stream per connection.
//!
//! A record reaches a shard in one of three forms ([`route`]):
//! - **whole**, the record's bytes, when the shard stores one of its
//!   blocks, or the record changes what every shard keeps (transactions,
//!   relation sizes and directories, databases, checkpoints, SLRUs);
//! - a **skeleton** — its LSNs, transaction ids and the blocks it touches,
//!   without their contents — when its blocks are all another shard's:
//!   the shard still keeps each relation's size and the counters of the
//!   transaction ids it has seen;
//! - **nothing**, when even the skeleton would change nothing.
//!
//! A whole record is sent with its `xl_prev` and `xl_crc` zeroed: the
//! safekeeper checked both when it decoded the record, and the batch's
//! CRC-32C covers it on the wire. Zeros compress; the two fields are
//! unpredictable and a tenth of a small record.

mod route;
mod types;
mod wire;

pub use route::{route, skeleton, Route, Routing, ShardFilter};
pub use types::{BlockExtent, DecodedWalError, Entry, Skeleton, StreamFormat};
pub use wire::{without_prev_and_crc, BatchBuilder, BatchDecoder, BatchEncoder, EncodedBatch};

#[cfg(test)]
mod tests;

use strata_formats::version::PgVersion;
use strata_formats::wal::record::DecodedRecord;

/// Fuzz entry point. The first byte chooses: 0, `data` is a batch's
/// Protobuf bytes; else `data` is a stream of compressed batches, each
/// `[payload length u32][batch length u32][CRC-32C u32][payload]`, through
/// one decoder. Whatever the bytes, the answer is an error or entries
/// within their bounds, never a panic.
pub fn fuzz_one(data: &[u8]) {
    let begin = strata_formats::Lsn(0x0100_0028);
    let Some((&mode, data)) = data.split_first() else { return };
    if mode == 0 {
        if let Ok(entries) = wire::parse_batch(data, begin) {
            decode_whole(entries);
        }
        return;
    }
    let mut decoder = BatchDecoder::new();
    let mut rest = data;
    while rest.len() >= 12 {
        let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().expect("four bytes"));
        let (len, batch_len, crc) = (word(0) as usize, word(4) as usize, word(8));
        rest = &rest[12..];
        let (payload, next) = rest.split_at(len.min(rest.len()));
        rest = next;
        match decoder.decode(payload, batch_len, crc, begin) {
            Ok(entries) => decode_whole(entries),
            // A failed batch leaves the stream unusable: start over.
            Err(_) => decoder = BatchDecoder::new(),
        }
    }
}

/// What the pageserver does with a whole record next.
fn decode_whole(entries: Vec<Entry>) {
    for e in entries {
        if let Entry::Whole { lsn, end_lsn, raw } = e {
            let _ = DecodedRecord::decode(PgVersion::V15, lsn, end_lsn, raw);
        }
    }
}
