//! Every bound of the formats crate: what grows with load or time and where
//! it stops.
//!
//! The decoders read untrusted bytes, so what they hold in memory is bounded
//! by the largest record they accept, and the positions they compute by the
//! highest LSN they work at. The sizes fixed by PostgreSQL's formats (page and
//! header sizes, flags, magic numbers) stay with their formats.

use crate::lsn::Lsn;
use crate::version::XLOG_BLCKSZ;
use crate::wal::record::RECORD_HEADER_SIZE;

/// Largest record the decoder accepts (PostgreSQL's allocation limit, 1 GiB - 1).
pub const MAX_RECORD_SIZE: u32 = 0x3fff_ffff;

/// Highest LSN the decoder works at (PostgreSQL would need exabytes of WAL to get here).
pub const MAX_LSN: Lsn = Lsn(u64::MAX - (1 << 40));

/// Bytes reserved for a record before its bytes arrive: a corrupt length
/// must not allocate a gigabyte up front, and most records are far smaller.
pub const RECORD_PREALLOC: usize = 1 << 16;

/// Bytes read from a segment file at once.
pub const SEGMENT_READ_CHUNK: usize = 1 << 20;

// A record holds at least its header.
const _: () = assert!(MAX_RECORD_SIZE as usize >= RECORD_HEADER_SIZE);
// The length field of the record header is a u32, and the size limit must
// also fit the usize the decoder buffers it in.
const _: () = assert!(MAX_RECORD_SIZE as u64 <= u32::MAX as u64 && MAX_RECORD_SIZE as u64 <= usize::MAX as u64);
// The up-front reservation never exceeds what a valid record may need.
const _: () = assert!(RECORD_PREALLOC <= MAX_RECORD_SIZE as usize);
// Whole WAL pages per read, so reads stay page-aligned.
const _: () = assert!(SEGMENT_READ_CHUNK >= XLOG_BLCKSZ && SEGMENT_READ_CHUNK.is_multiple_of(XLOG_BLCKSZ));
// Past MAX_LSN there is room for the largest record spread over pages
// (headers included) and a largest (1 GiB) segment's padding: the LSN
// arithmetic after the check cannot overflow.
const _: () = assert!(u64::MAX - MAX_LSN.0 >= 2 * MAX_RECORD_SIZE as u64 + (1 << 30));
