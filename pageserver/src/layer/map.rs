//! The layer map of a timeline: the open in-memory layer, frozen in-memory
//! layers waiting to be written, and the delta layer files.

use std::sync::Arc;

use strata_formats::Lsn;

use super::inmemory::InMemoryLayer;
use super::layer_file::LayerFile;
use super::{LayerError, Versions};
use crate::key::Key;

/// Last and previous record LSNs at some point of ingest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordLsns {
    /// End of the last record ingested.
    pub last: Lsn,
    /// Start of that record.
    pub prev: Lsn,
}

/// A layer of either kind, for reads.
#[derive(Clone)]
pub enum LayerRef {
    Memory(Arc<InMemoryLayer>),
    File(Arc<LayerFile>),
}

impl LayerRef {
    pub fn start_lsn(&self) -> Lsn {
        match self {
            LayerRef::Memory(l) => l.start_lsn,
            LayerRef::File(l) => l.name.lsn_start,
        }
    }

    pub fn collect(&self, key: &Key, lsn: Lsn, out: &mut Versions) -> Result<bool, LayerError> {
        match self {
            LayerRef::Memory(l) => Ok(l.collect(key, lsn, out)),
            LayerRef::File(l) => l.collect(key, lsn, out),
        }
    }
}

pub struct LayerMap {
    pub open: Arc<InMemoryLayer>,
    /// Oldest first, with the record LSNs at the moment each was frozen.
    pub frozen: Vec<(Arc<InMemoryLayer>, RecordLsns)>,
    /// Ordered by LSN range.
    pub deltas: Vec<Arc<LayerFile>>,
}

impl LayerMap {
    /// Every layer, newest first: the order a read visits them.
    pub fn newest_first(&self) -> Vec<LayerRef> {
        let mut out = Vec::with_capacity(1 + self.frozen.len() + self.deltas.len());
        out.push(LayerRef::Memory(self.open.clone()));
        out.extend(self.frozen.iter().rev().map(|(l, _)| LayerRef::Memory(l.clone())));
        out.extend(self.deltas.iter().rev().map(|l| LayerRef::File(l.clone())));
        out
    }
}
