//! Entry points shared by the fuzz targets (`fuzz/`) and the randomized tests:
//! every decoder of untrusted bytes is driven from here.

use crate::lsn::Lsn;
use crate::v15::control::ControlFile;
use crate::v15::records;
use crate::version::PgVersion;
use crate::wal::{StartPosition, WalDecodeError, WalDecoder};

/// What decoding a byte string produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DecodeSummary {
    pub records: usize,
    pub images: usize,
    /// The error that stopped decoding, if it was not simply the end of input.
    pub error: Option<WalDecodeError>,
}

/// Decodes `bytes` as WAL starting at the page boundary `start`, restoring
/// every image and parsing every record; never panics.
pub fn decode_wal(bytes: &[u8], start: Lsn, segment_size: u64, chunk: usize) -> DecodeSummary {
    let mut summary = DecodeSummary::default();
    // The version whose magic the first page carries, as a reader of
    // segments picks it.
    let magic = bytes.get(0..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let version = magic.and_then(PgVersion::from_wal_page_magic).unwrap_or(PgVersion::V15);
    let mut decoder = WalDecoder::new(version, start, segment_size, StartPosition::FindFirstRecord);
    for piece in bytes.chunks(chunk.max(1)) {
        decoder.feed(piece);
        loop {
            match decoder.next_record() {
                Ok(Some(record)) => {
                    summary.records += 1;
                    for block in &record.blocks {
                        if let Ok(Some(_)) = record.block_image(block) {
                            summary.images += 1;
                        }
                    }
                    let _ = records::parse(&record);
                }
                Ok(None) => break,
                Err(e) => {
                    summary.error = Some(e);
                    return summary;
                }
            }
        }
    }
    summary
}

/// One fuzz input: the first byte picks the decoder, the rest is its input.
pub fn fuzz_one(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    match selector % 4 {
        // WAL starting at the page its first header claims (so real WAL decodes
        // deeply), fed whole and in small chunks.
        0 | 1 => {
            let claimed = rest.get(8..16).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
            let start = Lsn(claimed - claimed % crate::version::XLOG_BLCKSZ as u64);
            let chunk = if selector % 4 == 0 { rest.len() } else { 1 + usize::from(selector) * 31 };
            let _ = decode_wal(rest, start, 16 << 20, chunk);
        }
        // A single record's fragments, as if reassembled already.
        2 => {
            let version = PgVersion::ALL[usize::from(selector >> 2) % PgVersion::ALL.len()];
            if let Ok(record) =
                crate::wal::DecodedRecord::decode(version, Lsn(0x100_0000), Lsn(0x100_0000), rest.to_vec())
            {
                for block in &record.blocks {
                    let _ = record.block_image(block);
                }
                let _ = records::parse(&record);
            }
        }
        // pg_control and page masking.
        _ => {
            let _ = ControlFile::decode(rest);
            let mut page = [0u8; crate::version::BLCKSZ];
            let n = rest.len().min(page.len());
            page[..n].copy_from_slice(&rest[..n]);
            let kind = crate::page::mask::PageKind::detect(&page);
            crate::page::mask::mask_page(&mut page, kind);
        }
    }
}
