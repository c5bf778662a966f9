//! Identifiers shared by WAL records, pages and the key space.

use std::fmt;

/// A transaction id (`TransactionId`).
pub type TransactionId = u32;
/// An object id (`Oid`).
pub type Oid = u32;
/// A block number within one fork of a relation.
pub type BlockNumber = u32;

/// The physical identity of a relation: tablespace, database, relfilenode.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct RelFileNode {
    pub spc: Oid,
    pub db: Oid,
    pub rel: Oid,
}

impl RelFileNode {
    /// Size of the on-disk struct.
    pub const SIZE: usize = 12;

    /// Decodes the 12-byte struct; `bytes` must be at least that long.
    pub fn decode(bytes: &[u8]) -> RelFileNode {
        RelFileNode {
            spc: u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
            db: u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
            rel: u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        }
    }

    /// Encodes the 12-byte struct.
    pub fn encode(&self) -> [u8; 12] {
        let mut out = [0u8; 12];
        out[0..4].copy_from_slice(&self.spc.to_le_bytes());
        out[4..8].copy_from_slice(&self.db.to_le_bytes());
        out[8..12].copy_from_slice(&self.rel.to_le_bytes());
        out
    }
}

impl fmt::Display for RelFileNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.spc, self.db, self.rel)
    }
}

impl fmt::Debug for RelFileNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A relation fork.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub enum ForkNumber {
    Main = 0,
    Fsm = 1,
    VisibilityMap = 2,
    Init = 3,
}

impl ForkNumber {
    /// The fork with number `n`, if valid.
    pub fn from_u8(n: u8) -> Option<ForkNumber> {
        match n {
            0 => Some(ForkNumber::Main),
            1 => Some(ForkNumber::Fsm),
            2 => Some(ForkNumber::VisibilityMap),
            3 => Some(ForkNumber::Init),
            _ => None,
        }
    }

    /// The name PostgreSQL uses (`forkNames[]`): main, fsm, vm, init.
    pub fn name(self) -> &'static str {
        match self {
            ForkNumber::Main => "main",
            ForkNumber::Fsm => "fsm",
            ForkNumber::VisibilityMap => "vm",
            ForkNumber::Init => "init",
        }
    }

    /// The suffix of the fork's files (`_fsm`, …), empty for the main fork.
    pub fn file_suffix(self) -> &'static str {
        match self {
            ForkNumber::Main => "",
            ForkNumber::Fsm => "_fsm",
            ForkNumber::VisibilityMap => "_vm",
            ForkNumber::Init => "_init",
        }
    }
}

/// A little-endian cursor over untrusted bytes: every read is bounds-checked.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// A read past the end of a structure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("truncated: needed {needed} bytes at offset {offset}, only {available} left")]
pub struct Truncated {
    pub offset: usize,
    pub needed: usize,
    pub available: usize,
}

impl<'a> Cursor<'a> {
    /// Starts reading at the beginning of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if self.remaining() < n {
            return Err(Truncated { offset: self.pos, needed: n, available: self.remaining() });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<(), Truncated> {
        self.take(n).map(|_| ())
    }

    /// Skips padding up to the next multiple of `align` from the start.
    pub fn align(&mut self, align: usize) -> Result<(), Truncated> {
        let pad = (align - self.pos % align) % align;
        self.skip(pad)
    }

    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn i32(&mut self) -> Result<i32, Truncated> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn i64(&mut self) -> Result<i64, Truncated> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn rel_file_node(&mut self) -> Result<RelFileNode, Truncated> {
        Ok(RelFileNode::decode(self.take(RelFileNode::SIZE)?))
    }
    /// A count that must be non-negative and, at `elem_size` bytes each, fit in
    /// what is left: guards allocations against hostile counts.
    pub fn count(&mut self, elem_size: usize) -> Result<usize, Truncated> {
        let offset = self.pos;
        let n = self.i32()?;
        let n =
            usize::try_from(n).map_err(|_| Truncated { offset, needed: usize::MAX, available: self.remaining() })?;
        match n.checked_mul(elem_size) {
            Some(bytes) if bytes <= self.remaining() => Ok(n),
            _ => Err(Truncated { offset, needed: n.saturating_mul(elem_size), available: self.remaining() }),
        }
    }
}
