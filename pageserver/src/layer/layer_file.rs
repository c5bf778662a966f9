//! Layer files: immutable, sorted versions of keys over a key range, with an
//! index so that a lookup reads one index block and the values it needs —
//! never the whole file. Two kinds share the format (version 2, which reads
//! version 1 too; `docs/pageserver-storage.md`): a *delta* layer holds the
//! versions of an LSN range; an *image* layer holds, at one LSN, the value
//! of every key of its range that has one (so a key it lacks had none).
//!
//! One module per concern; callers use the items re-exported here:
//! - `name`: layer file names ([`LayerName`], [`LayerKind`]);
//! - `format`: the on-disk layout the writer and readers share;
//! - `writer`: writing a file ([`LayerFileWriter`]);
//! - `open`: checking a file at open and what reads keep of it;
//! - `residency`: the [`LayerFile`] handle, on-demand download ([`Fetch`]),
//!   eviction and deletion;
//! - `reader`: point lookups ([`LayerFile::collect`]);
//! - `scan`: reading a whole file in order ([`Scan`]);
//! - `cache` and `decompress`: per-thread decoded blocks and groups, and
//!   zstd contexts.

mod cache;
mod decompress;
mod format;
mod name;
mod open;
mod reader;
mod residency;
mod scan;
#[cfg(test)]
mod test_util;
mod writer;

pub use format::{RawVersion, FORMAT_VERSION};
pub use name::{LayerKind, LayerName, LayerNameError};
pub use residency::{Fetch, LayerFile};
pub use scan::Scan;
pub use writer::{LayerFileWriter, WriteError};
