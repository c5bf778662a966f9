//! Serialized forms of the directory-like values: the database directory,
//! relation directories, SLRU segment lists and the two-phase directory.
//! Each is a u32 count followed by fixed-size little-endian entries.

use std::collections::BTreeSet;

use strata_formats::types::{Cursor, Truncated};

/// Encodes a set of (u32, u32) pairs (databases: tablespace, database).
pub fn encode_pairs(set: &BTreeSet<(u32, u32)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + set.len() * 8);
    out.extend_from_slice(&(set.len() as u32).to_le_bytes());
    for (a, b) in set {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out
}

/// Decodes what [`encode_pairs`] wrote.
pub fn decode_pairs(bytes: &[u8]) -> Result<BTreeSet<(u32, u32)>, Truncated> {
    let mut c = Cursor::new(bytes);
    let n = c.count(8)?;
    (0..n).map(|_| Ok((c.u32()?, c.u32()?))).collect()
}

/// Encodes a relation directory: (relfilenode, fork) entries.
pub fn encode_rels(set: &BTreeSet<(u32, u8)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + set.len() * 5);
    out.extend_from_slice(&(set.len() as u32).to_le_bytes());
    for (rel, fork) in set {
        out.extend_from_slice(&rel.to_le_bytes());
        out.push(*fork);
    }
    out
}

/// Decodes what [`encode_rels`] wrote.
pub fn decode_rels(bytes: &[u8]) -> Result<BTreeSet<(u32, u8)>, Truncated> {
    let mut c = Cursor::new(bytes);
    let n = c.count(5)?;
    (0..n).map(|_| Ok((c.u32()?, c.u8()?))).collect()
}

/// Encodes a set of u32 (SLRU segment numbers, prepared transaction ids).
pub fn encode_u32s(set: &BTreeSet<u32>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + set.len() * 4);
    out.extend_from_slice(&(set.len() as u32).to_le_bytes());
    for v in set {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Decodes what [`encode_u32s`] wrote.
pub fn decode_u32s(bytes: &[u8]) -> Result<BTreeSet<u32>, Truncated> {
    let mut c = Cursor::new(bytes);
    let n = c.count(4)?;
    (0..n).map(|_| c.u32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_short_input() {
        let pairs: BTreeSet<_> = [(1663, 5), (1664, 0)].into();
        assert_eq!(decode_pairs(&encode_pairs(&pairs)).unwrap(), pairs);
        let rels: BTreeSet<_> = [(16384, 0), (16384, 2)].into();
        let enc = encode_rels(&rels);
        assert_eq!(decode_rels(&enc).unwrap(), rels);
        assert!(decode_rels(&enc[..enc.len() - 1]).is_err());
        let ids: BTreeSet<_> = [3, 7].into();
        assert_eq!(decode_u32s(&encode_u32s(&ids)).unwrap(), ids);
        assert!(decode_u32s(&[0xff, 0xff, 0xff, 0x7f]).is_err());
    }
}
