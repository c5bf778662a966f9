//! A Bloom filter over the keys of a layer file, built when the file is
//! opened: a lookup of a key the layer does not hold then costs no index
//! read. Reads visit layers newest first, and most layers do not hold the
//! key asked for, so this removes most of a read's I/O.

use crate::key::Key;

/// Probes per key.
const PROBES: u32 = 4;

pub struct KeyFilter {
    bits: Vec<u64>,
    mask: u64,
}

fn hash(key: &Key) -> u64 {
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
    /// A filter for up to `keys` distinct keys (about 8 bits per key).
    pub fn with_capacity(keys: usize) -> KeyFilter {
        let bits = (keys.max(64) * 8).next_power_of_two();
        KeyFilter { bits: vec![0; bits / 64], mask: bits as u64 - 1 }
    }

    fn positions(&self, key: &Key) -> impl Iterator<Item = u64> + '_ {
        let h = hash(key);
        let (h1, h2) = (h, (h >> 32) | 1);
        (0..u64::from(PROBES)).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & self.mask)
    }

    pub fn insert(&mut self, key: &Key) {
        let h = hash(key);
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
}
