//! A Bloom filter over the keys of a layer file, built when the file is
//! opened: a lookup of a key the layer does not hold then costs no index
//! read. Reads visit layers newest first, and most layers do not hold the
//! key asked for, so this removes most of a read's I/O.
//!
//! The filter is sized by the layer's distinct keys, not its versions: an
//! L1 delta of a busy table holds millions of versions of a few thousand
//! pages, and a filter per version cost 16 MiB per such layer, for as long
//! as the layer was local — the pageserver's memory then grew with its
//! history (`bench/results/memory_soak.md`, run 3).

use crate::key::Key;

/// Probes per key.
const PROBES: u32 = 4;

pub struct KeyFilter {
    bits: Vec<u64>,
    mask: u64,
}

/// The hash a filter keeps of `key` (collect these to build one).
pub fn hash(key: &Key) -> u64 {
    // Two rounds of a 64-bit mixer over the key's fields: keys differ mostly
    // in their low fields (block numbers), which must spread over all bits.
    let mut h = u64::from(key.kind) << 56 ^ u64::from(key.field4) << 48 ^ u64::from(key.field1);
    for part in [u64::from(key.field2) << 32 | u64::from(key.field3), u64::from(key.field5)] {
        h ^= part;
        h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
        h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 32;
    }
    h
}

impl KeyFilter {
    /// A filter for up to `keys` distinct keys (8 to 16 bits per key).
    pub fn with_capacity(keys: usize) -> KeyFilter {
        let bits = (keys.max(64) * 8).next_power_of_two();
        KeyFilter { bits: vec![0; bits / 64], mask: bits as u64 - 1 }
    }

    /// The filter of the keys whose [`hash`]es these are, one per distinct
    /// key, sized by their number.
    pub fn from_hashes(hashes: &[u64]) -> KeyFilter {
        let mut f = KeyFilter::with_capacity(hashes.len());
        for &h in hashes {
            f.insert_hash(h);
        }
        f
    }

    fn positions(&self, key: &Key) -> impl Iterator<Item = u64> + '_ {
        let h = hash(key);
        let (h1, h2) = (h, (h >> 32) | 1);
        (0..u64::from(PROBES)).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & self.mask)
    }

    pub fn insert(&mut self, key: &Key) {
        self.insert_hash(hash(key));
    }

    fn insert_hash(&mut self, h: u64) {
        let (h1, h2) = (h, (h >> 32) | 1);
        for i in 0..u64::from(PROBES) {
            let p = h1.wrapping_add(i.wrapping_mul(h2)) & self.mask;
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
        }
    }

    /// False only if the key was never inserted.
    pub fn may_contain(&self, key: &Key) -> bool {
        self.positions(key).all(|p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }

    /// Memory held, in bytes.
    pub fn size(&self) -> usize {
        self.bits.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let key = |b: u32| Key { kind: 0, field1: 1663, field2: 5, field3: 16384, field4: 0, field5: b };
        let mut f = KeyFilter::with_capacity(10_000);
        for b in (0..20_000).step_by(2) {
            f.insert(&key(b));
        }
        assert!((0..20_000).step_by(2).all(|b| f.may_contain(&key(b))));
        let false_positives = (1..20_000).step_by(2).filter(|b| f.may_contain(&key(*b))).count();
        assert!(false_positives < 500, "{false_positives} false positives of 10000");
    }

    #[test]
    fn a_filter_built_from_hashes_is_sized_by_its_keys_and_finds_them() {
        let key = |b: u32| Key { kind: 0, field1: 1663, field2: 5, field3: 16384, field4: 0, field5: b };
        let hashes: Vec<u64> = (0..3000).map(|b| hash(&key(b))).collect();
        let f = KeyFilter::from_hashes(&hashes);
        // 3000 keys × 8 bits, rounded up to a power of two: 4 KiB, whatever
        // the number of versions the keys had.
        assert_eq!(f.size(), 4096);
        assert!((0..3000).all(|b| f.may_contain(&key(b))));
        let false_positives = (3000..13_000).filter(|b| f.may_contain(&key(*b))).count();
        assert!(false_positives < 600, "{false_positives} false positives of 10000");
    }
}
