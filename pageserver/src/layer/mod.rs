//! Layers: where versions of keys live. An in-memory layer takes the WAL as
//! it is ingested; when it is large enough it is frozen and written to an
//! immutable delta layer file. A read collects versions of a key from the
//! newest layer to the oldest until it meets a base version (an image).

pub mod bloom;
pub mod files;
pub mod group;
pub mod inmemory;
pub mod layer_file;
pub mod map;

use strata_formats::Lsn;

use crate::value::Value;

/// Versions of one key gathered for a read, newest first.
#[derive(Default, Debug)]
pub struct Versions {
    pub list: Vec<(Lsn, Value)>,
    /// No older version is needed: a base was reached, or an image layer
    /// showed that the key had no value before the versions gathered.
    closed: bool,
}

impl Versions {
    /// Whether the search is over (no older version is needed).
    pub fn complete(&self) -> bool {
        self.closed
    }

    /// Adds an older version; returns true once a base is reached.
    pub fn push(&mut self, lsn: Lsn, value: Value) -> bool {
        debug_assert!(!self.closed, "no version is older than a base");
        debug_assert!(self.list.last().is_none_or(|(l, _)| *l >= lsn), "versions must be added newest first");
        let base = value.is_base();
        self.list.push((lsn, value));
        self.closed = base;
        base
    }

    /// Adds the versions found further back (in a branch's parent), all
    /// older than these; the search ends where theirs ended.
    pub fn append_older(&mut self, older: Versions) {
        debug_assert!(!self.closed, "no version is older than a base");
        debug_assert!(
            match (self.list.last(), older.list.first()) {
                (Some((ours, _)), Some((theirs, _))) => theirs <= ours,
                _ => true,
            },
            "the parent's versions are older"
        );
        self.list.extend(older.list);
        self.closed = older.closed;
    }

    /// Ends the search without a base: the key had no value before the
    /// versions gathered (an image layer of its range does not hold it).
    pub fn close(&mut self) {
        self.closed = true;
    }
}

/// A layer file that cannot be read. Always names the file.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("layer file {path} is corrupt: {reason}")]
    Corrupt { path: String, reason: String },
    /// A scan that already reported its error.
    #[error("the layer file could not be read (reported before)")]
    Gone,
}
