//! Value groups of layer format version 2: an image layer compresses runs
//! of adjacent values together, because neighbouring pages share most of
//! their bytes (tuple layouts, fill) and one zstd frame over sixteen pages
//! finds that where sixteen frames of one page cannot. The group's
//! decompressed payload is `u16 count | count × u32 length | the values`.

/// Most values in one group (an index entry's slot is one byte).
pub const MAX_VALUES: usize = 255;
/// Largest decompressed payload a reader accepts.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Values being gathered into a group by a writer.
#[derive(Default)]
pub struct GroupBuilder {
    lens: Vec<u32>,
    data: Vec<u8>,
}

impl GroupBuilder {
    /// Adds one encoded value.
    pub fn push(&mut self, value: &[u8]) {
        debug_assert!(self.lens.len() < MAX_VALUES, "a group holds at most {MAX_VALUES} values");
        self.lens.push(value.len() as u32);
        self.data.extend_from_slice(value);
    }

    /// Values gathered so far.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Bytes of the values gathered so far.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The one value of a group of one (stored on its own instead).
    pub fn single(&self) -> Option<&[u8]> {
        (self.lens.len() == 1).then_some(&self.data[..])
    }

    /// The payload of the values gathered; empties the builder.
    pub fn take_payload(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + 4 * self.lens.len() + self.data.len());
        out.extend_from_slice(&(self.lens.len() as u16).to_le_bytes());
        for l in &self.lens {
            out.extend_from_slice(&l.to_le_bytes());
        }
        out.extend_from_slice(&self.data);
        debug_assert!(out.len() <= MAX_PAYLOAD, "the writer keeps groups under the readers' limit");
        self.lens.clear();
        self.data.clear();
        out
    }
}

/// A decoded group: its payload and where each value lies in it.
pub struct Group {
    payload: bytes::Bytes,
    bounds: Vec<(usize, usize)>,
}

impl Group {
    /// Checks a decompressed payload: the count, and that the lengths
    /// exactly fill the rest.
    pub fn decode(payload: Vec<u8>) -> Result<Group, String> {
        let count = match payload.get(..2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]) as usize,
            None => return Err("value group shorter than its count".into()),
        };
        if !(2..=MAX_VALUES).contains(&count) {
            return Err(format!("value group of {count} values (2 to {MAX_VALUES})"));
        }
        let lens = payload.get(2..2 + 4 * count).ok_or("value group shorter than its lengths")?;
        let mut start = 2 + 4 * count;
        let mut bounds = Vec::with_capacity(count);
        for l in lens.chunks_exact(4) {
            let len = u32::from_le_bytes(l.try_into().expect("4 bytes")) as usize;
            let end = start.checked_add(len).filter(|e| *e <= payload.len()).ok_or("value group lengths overrun it")?;
            bounds.push((start, end));
            start = end;
        }
        if start != payload.len() {
            return Err(format!("value group has {} bytes after its values", payload.len() - start));
        }
        Ok(Group { payload: payload.into(), bounds })
    }

    /// The value in `slot`.
    pub fn get(&self, slot: u8) -> Result<&[u8], String> {
        let (s, e) = self
            .bounds
            .get(usize::from(slot))
            .ok_or_else(|| format!("slot {slot} of a value group of {}", self.bounds.len()))?;
        Ok(&self.payload[*s..*e])
    }

    /// The value in `slot`, sharing the payload's memory: readers hand
    /// pages on without copying them (the payload lives as long as any).
    pub fn value(&self, slot: u8) -> Result<bytes::Bytes, String> {
        let value = self.get(slot)?;
        Ok(self.payload.slice_ref(value))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_round_trip_and_damaged_payloads_are_refused() {
        let mut b = GroupBuilder::default();
        b.push(b"first");
        b.push(b"");
        b.push(&[7u8; 300]);
        assert_eq!((b.len(), b.bytes()), (3, 305));
        let payload = b.take_payload();
        assert!(b.is_empty());
        assert_eq!(&payload[..6], &[3, 0, 5, 0, 0, 0]);
        let g = Group::decode(payload.clone()).unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g.get(0).unwrap(), b"first");
        assert_eq!(g.get(1).unwrap(), b"");
        assert_eq!(g.get(2).unwrap(), &[7u8; 300][..]);
        assert_eq!(g.value(2).unwrap(), &[7u8; 300][..]);
        assert!(g.value(3).is_err());
        assert!(g.get(3).unwrap_err().contains("slot 3"));

        let mut short = payload.clone();
        short.pop();
        let mut long = payload.clone();
        long.push(0);
        let mut one = payload.clone();
        one[0] = 1;
        let mut many = payload;
        many[..2].copy_from_slice(&u16::MAX.to_le_bytes());
        for bad in [short, long, one, many, vec![], vec![2, 0, 1]] {
            assert!(Group::decode(bad).is_err());
        }
    }
}
