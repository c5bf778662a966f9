//! Restoring full-page images: decompression and filling the hole.

use crate::version::BLCKSZ;
use crate::wal::pglz;
use crate::wal::record::{BlockImage, BlockRef, DecodedRecord, ImageCompression};

/// A page image that cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("pglz: {0}")]
    Pglz(#[from] pglz::PglzError),
    #[error("lz4 image does not decompress to {expected} bytes: {reason}")]
    Lz4 { expected: usize, reason: String },
    #[error("zstd image does not decompress to {expected} bytes: {reason}")]
    Zstd { expected: usize, reason: String },
    #[error("image is {actual} bytes, expected {expected}")]
    WrongSize { expected: usize, actual: usize },
}

impl DecodedRecord {
    /// The 8 KiB page image of a block reference, decompressed and with its hole zero-filled.
    pub fn block_image(&self, block: &BlockRef) -> Result<Option<Box<[u8; BLCKSZ]>>, ImageError> {
        match &block.image {
            None => Ok(None),
            Some(image) => restore(image, &self.raw[image.data.clone()]).map(Some),
        }
    }
}

/// Rebuilds the 8 KiB page from an image's stored bytes.
pub fn restore(image: &BlockImage, stored: &[u8]) -> Result<Box<[u8; BLCKSZ]>, ImageError> {
    let hole_offset = image.hole_offset as usize;
    let hole_length = image.hole_length as usize;
    debug_assert!(hole_offset + hole_length <= BLCKSZ, "checked when the record was decoded");
    let expected = BLCKSZ - hole_length;
    let owned;
    let bytes: &[u8] = match image.compression() {
        ImageCompression::None => stored,
        ImageCompression::Pglz => {
            owned = pglz::decompress(stored, expected)?;
            &owned
        }
        ImageCompression::Lz4 => {
            let mut out = vec![0u8; expected];
            match lz4_flex::block::decompress_into(stored, &mut out) {
                Ok(n) if n == expected => {}
                Ok(n) => return Err(ImageError::Lz4 { expected, reason: format!("got {n} bytes") }),
                Err(e) => return Err(ImageError::Lz4 { expected, reason: e.to_string() }),
            }
            owned = out;
            &owned
        }
        ImageCompression::Zstd => {
            let mut out = vec![0u8; expected];
            match zstd::bulk::decompress_to_buffer(stored, &mut out[..]) {
                Ok(n) if n == expected => {}
                Ok(n) => return Err(ImageError::Zstd { expected, reason: format!("got {n} bytes") }),
                Err(e) => return Err(ImageError::Zstd { expected, reason: e.to_string() }),
            }
            owned = out;
            &owned
        }
    };
    if bytes.len() != expected {
        return Err(ImageError::WrongSize { expected, actual: bytes.len() });
    }
    let mut page = Box::new([0u8; BLCKSZ]);
    page[..hole_offset].copy_from_slice(&bytes[..hole_offset]);
    page[hole_offset + hole_length..].copy_from_slice(&bytes[hole_offset..]);
    Ok(page)
}
