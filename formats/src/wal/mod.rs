//! The WAL stream: page headers, record reassembly, record fragments, images.

pub mod encode;
pub mod image;
pub mod page;
pub mod pglz;
pub mod reader;
pub mod record;
pub mod segment;
pub mod strip;

pub use reader::{StartPosition, WalDecodeError, WalDecoder};
pub use record::{BlockImage, BlockRef, DecodedRecord, RecordHeader};
