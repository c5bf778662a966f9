//! WAL page headers (`XLogPageHeaderData` / `XLogLongPageHeaderData`).

use crate::lsn::Lsn;
use crate::version::XLOG_BLCKSZ;

/// Size of the short page header (20 bytes, MAXALIGNed).
pub const SHORT_HEADER_SIZE: usize = 24;
/// Size of the long page header on the first page of each segment.
pub const LONG_HEADER_SIZE: usize = 40;

/// The first record on the page is the continuation of one from a previous page.
pub const XLP_FIRST_IS_CONTRECORD: u16 = 0x0001;
/// This page has the long header.
pub const XLP_LONG_HEADER: u16 = 0x0002;
/// Backup blocks are not needed (unused by modern servers, tolerated).
pub const XLP_BKP_REMOVABLE: u16 = 0x0004;
/// A partial record before this page was abandoned and is overwritten here.
pub const XLP_FIRST_IS_OVERWRITE_CONTRECORD: u16 = 0x0008;
/// All flags a valid page may carry.
pub const XLP_ALL_FLAGS: u16 = 0x000F;

/// A decoded WAL page header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub magic: u16,
    pub info: u16,
    pub timeline: u32,
    pub page_address: Lsn,
    /// Bytes of a continued record that remain at the start of this page.
    pub remaining_length: u32,
    /// Present on long headers only.
    pub long: Option<LongHeaderFields>,
}

/// Extra fields of the long header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongHeaderFields {
    pub system_id: u64,
    pub segment_size: u32,
    pub block_size: u32,
}

impl PageHeader {
    /// Size of this header in the page.
    pub fn size(&self) -> usize {
        if self.long.is_some() {
            LONG_HEADER_SIZE
        } else {
            SHORT_HEADER_SIZE
        }
    }

    /// Whether `info` says the long header is present.
    pub fn is_long(info: u16) -> bool {
        info & XLP_LONG_HEADER != 0
    }

    /// Decodes a header; `bytes` must hold at least the long header size if
    /// the info flags say it is long. Returns `None` if `bytes` is too short.
    pub fn decode(bytes: &[u8]) -> Option<PageHeader> {
        if bytes.len() < SHORT_HEADER_SIZE {
            return None;
        }
        let info = u16::from_le_bytes([bytes[2], bytes[3]]);
        let long = if Self::is_long(info) {
            if bytes.len() < LONG_HEADER_SIZE {
                return None;
            }
            Some(LongHeaderFields {
                system_id: u64::from_le_bytes(bytes[24..32].try_into().unwrap()),
                segment_size: u32::from_le_bytes(bytes[32..36].try_into().unwrap()),
                block_size: u32::from_le_bytes(bytes[36..40].try_into().unwrap()),
            })
        } else {
            None
        };
        Some(PageHeader {
            magic: u16::from_le_bytes([bytes[0], bytes[1]]),
            info,
            timeline: u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
            page_address: Lsn(u64::from_le_bytes(bytes[8..16].try_into().unwrap())),
            remaining_length: u32::from_le_bytes(bytes[16..20].try_into().unwrap()),
            long,
        })
    }

    /// Encodes the header into the start of `out` (which must be large enough);
    /// padding bytes are zeroed.
    pub fn encode(&self, out: &mut [u8]) {
        let size = self.size();
        out[..size].fill(0);
        out[0..2].copy_from_slice(&self.magic.to_le_bytes());
        out[2..4].copy_from_slice(&self.info.to_le_bytes());
        out[4..8].copy_from_slice(&self.timeline.to_le_bytes());
        out[8..16].copy_from_slice(&self.page_address.0.to_le_bytes());
        out[16..20].copy_from_slice(&self.remaining_length.to_le_bytes());
        if let Some(long) = &self.long {
            out[24..32].copy_from_slice(&long.system_id.to_le_bytes());
            out[32..36].copy_from_slice(&long.segment_size.to_le_bytes());
            out[36..40].copy_from_slice(&long.block_size.to_le_bytes());
        }
    }
}

/// Size of the page header at `lsn`, which must be at a page boundary.
pub fn header_size_at(lsn: Lsn, segment_size: u64) -> usize {
    debug_assert_eq!(lsn.0 % XLOG_BLCKSZ as u64, 0);
    if lsn.0.is_multiple_of(segment_size) {
        LONG_HEADER_SIZE
    } else {
        SHORT_HEADER_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_header_roundtrip() {
        let h = PageHeader {
            magic: 0xD110,
            info: XLP_LONG_HEADER | XLP_FIRST_IS_CONTRECORD,
            timeline: 1,
            page_address: Lsn(0x0300_0000),
            remaining_length: 77,
            long: Some(LongHeaderFields { system_id: 7, segment_size: 16 << 20, block_size: 8192 }),
        };
        let mut buf = [0xAAu8; 64];
        h.encode(&mut buf);
        assert_eq!(PageHeader::decode(&buf).unwrap(), h);
        assert_eq!(&buf[20..24], &[0, 0, 0, 0], "padding is zeroed");
        assert!(PageHeader::decode(&buf[..30]).is_none());
    }
}
