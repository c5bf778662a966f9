//! Values stored under keys: full images, zero pages, native records to
//! apply on top of an older image, PostgreSQL WAL records that are redone
//! natively when the page is read, or changes to a relation directory.

use bytes::Bytes;
use strata_formats::version::{PgVersion, BLCKSZ};
use strata_formats::wal::record::DecodedRecord;
use strata_formats::Lsn;
use strata_redo::{NativeRecord, RedoError};

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// The whole value: a page with pd_lsn stamped, or a serialized directory/file.
    Image(Bytes),
    /// A page that reads as zeros (a truncated or never WAL-logged block).
    ZeroPage,
    /// A change to apply to the previous version.
    Native(NativeRecord),
    /// A WAL record to redo on one of its blocks.
    Wal(WalRedo),
    /// Entries added to and removed from a relation directory (a change to
    /// apply to its previous version: storing the whole directory for each
    /// relation created made a database's storage grow with the square of
    /// its relations).
    RelDirChange(RelDirChange),
}

/// Changes to a relation directory's set of (relfilenode, fork) entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelDirChange {
    pub added: Vec<(u32, u8)>,
    pub removed: Vec<(u32, u8)>,
}

impl RelDirChange {
    /// Applies the change to the set before it.
    pub fn apply(&self, set: &mut std::collections::BTreeSet<(u32, u8)>) {
        for e in &self.removed {
            set.remove(e);
        }
        set.extend(self.added.iter().copied());
    }
}

/// A PostgreSQL WAL record kept for native redo of its block `block_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRedo {
    pub block_id: u8,
    /// The record initializes the page: no older version is needed.
    pub will_init: bool,
    /// Where the record starts and ends in the WAL.
    pub lsn: Lsn,
    pub end_lsn: Lsn,
    /// The record as it is in the WAL (header included, no page headers).
    pub record: Bytes,
}

/// A stored WAL record that cannot be redone.
#[derive(Debug, thiserror::Error)]
pub enum WalRedoError {
    #[error("stored WAL record at {lsn} does not decode: {source}")]
    Decode {
        lsn: Lsn,
        #[source]
        source: strata_formats::wal::record::RecordError,
    },
    #[error("redo of block {block_id} of the WAL record at {lsn}: {source}")]
    Redo {
        lsn: Lsn,
        block_id: u8,
        #[source]
        source: RedoError,
    },
}

impl WalRedo {
    /// Applies the record, written by PostgreSQL `version`, to `page`, the
    /// version before it.
    pub fn apply(&self, version: PgVersion, page: &mut [u8; BLCKSZ]) -> Result<(), WalRedoError> {
        let rec = DecodedRecord::decode(version, self.lsn, self.end_lsn, self.record.to_vec())
            .map_err(|source| WalRedoError::Decode { lsn: self.lsn, source })?;
        strata_redo::redo_block(&rec, self.block_id, page).map_err(|source| WalRedoError::Redo {
            lsn: self.lsn,
            block_id: self.block_id,
            source,
        })
    }
}

const TAG_IMAGE: u8 = 1;
const TAG_ZERO: u8 = 2;
const TAG_NATIVE: u8 = 3;
const TAG_WAL: u8 = 4;
const TAG_REL_DIR_CHANGE: u8 = 5;
/// Bytes of one relation directory entry: relfilenode and fork.
const REL_ENTRY_SIZE: usize = 5;
/// Block id, flags and the two LSNs before the record bytes.
const WAL_HEADER_SIZE: usize = 1 + 1 + 8 + 8;
const WAL_WILL_INIT: u8 = 0x01;

impl Value {
    /// Whether this version does not depend on older ones.
    pub fn is_base(&self) -> bool {
        match self {
            Value::Native(_) | Value::RelDirChange(_) => false,
            Value::Wal(w) => w.will_init,
            Value::Image(_) | Value::ZeroPage => true,
        }
    }

    /// Approximate memory use, for bounding in-memory layers.
    pub fn size(&self) -> usize {
        match self {
            Value::Image(b) => b.len() + 16,
            Value::ZeroPage => 8,
            Value::Native(NativeRecord::ClearVmBits(v)) => 16 + v.len() * 8,
            Value::Native(NativeRecord::ClogSetStatus { xids, .. }) => 16 + xids.len() * 4,
            Value::Native(NativeRecord::MultiXactOffset { .. }) => 16,
            Value::Native(NativeRecord::MultiXactMembers(v)) => 16 + v.len() * 12,
            Value::Native(NativeRecord::SetPageLsn(_)) => 16,
            Value::Wal(w) => 48 + w.record.len(),
            Value::RelDirChange(c) => 16 + (c.added.len() + c.removed.len()) * REL_ENTRY_SIZE,
        }
    }

    /// Serializes: a tag byte, then the image bytes or the native record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Image(b) => {
                out.push(TAG_IMAGE);
                out.extend_from_slice(b);
            }
            Value::ZeroPage => out.push(TAG_ZERO),
            Value::Native(r) => {
                out.push(TAG_NATIVE);
                r.encode(out);
            }
            Value::Wal(w) => {
                out.push(TAG_WAL);
                out.push(w.block_id);
                out.push(if w.will_init { WAL_WILL_INIT } else { 0 });
                out.extend_from_slice(&w.lsn.0.to_le_bytes());
                out.extend_from_slice(&w.end_lsn.0.to_le_bytes());
                out.extend_from_slice(&w.record);
            }
            Value::RelDirChange(c) => {
                out.push(TAG_REL_DIR_CHANGE);
                for list in [&c.added, &c.removed] {
                    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
                    for (rel, fork) in list {
                        out.extend_from_slice(&rel.to_le_bytes());
                        out.push(*fork);
                    }
                }
            }
        }
    }

    /// Parses what [`Value::encode`] wrote (bytes from a layer file: untrusted).
    pub fn decode(bytes: &[u8]) -> Result<Value, ValueError> {
        Value::decode_shared(Bytes::copy_from_slice(bytes))
    }

    /// [`Value::decode`] of shared bytes: an image or record is a slice of
    /// them, not a copy.
    pub fn decode_shared(bytes: Bytes) -> Result<Value, ValueError> {
        let shared = |from: usize| bytes.slice(from..);
        match bytes.split_first() {
            Some((&TAG_IMAGE, _)) => Ok(Value::Image(shared(1))),
            Some((&TAG_ZERO, [])) => Ok(Value::ZeroPage),
            Some((&TAG_ZERO, rest)) => Err(ValueError::TrailingBytes(rest.len())),
            Some((&TAG_NATIVE, rest)) => Ok(Value::Native(NativeRecord::decode(rest)?)),
            Some((&TAG_WAL, rest)) => {
                if rest.len() < WAL_HEADER_SIZE {
                    return Err(ValueError::Truncated(rest.len()));
                }
                let flags = rest[1];
                if flags & !WAL_WILL_INIT != 0 {
                    return Err(ValueError::UnknownFlags(flags));
                }
                let lsn = |at: usize| Lsn(u64::from_le_bytes(rest[at..at + 8].try_into().expect("8 bytes")));
                Ok(Value::Wal(WalRedo {
                    block_id: rest[0],
                    will_init: flags & WAL_WILL_INIT != 0,
                    lsn: lsn(2),
                    end_lsn: lsn(10),
                    record: shared(1 + WAL_HEADER_SIZE),
                }))
            }
            Some((&TAG_REL_DIR_CHANGE, rest)) => decode_rel_dir_change(rest).map(Value::RelDirChange),
            Some((tag, _)) => Err(ValueError::UnknownTag(*tag)),
            None => Err(ValueError::Empty),
        }
    }
}

/// Two lists, each a u32 count and that many entries, and nothing after.
fn decode_rel_dir_change(mut rest: &[u8]) -> Result<RelDirChange, ValueError> {
    let mut list = || -> Result<Vec<(u32, u8)>, ValueError> {
        let (count, tail) = rest.split_first_chunk::<4>().ok_or(ValueError::Truncated(rest.len()))?;
        let count = u32::from_le_bytes(*count) as usize;
        let bytes = count.checked_mul(REL_ENTRY_SIZE).filter(|n| *n <= tail.len());
        let bytes = bytes.ok_or(ValueError::Truncated(rest.len()))?;
        let entries = tail[..bytes]
            .chunks_exact(REL_ENTRY_SIZE)
            .map(|e| (u32::from_le_bytes(e[..4].try_into().expect("4 bytes")), e[4]))
            .collect();
        rest = &tail[bytes..];
        Ok(entries)
    };
    let added = list()?;
    let removed = list()?;
    if !rest.is_empty() {
        return Err(ValueError::TrailingBytes(rest.len()));
    }
    Ok(RelDirChange { added, removed })
}

/// A stored value that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("empty value")]
    Empty,
    #[error("unknown value tag {0}")]
    UnknownTag(u8),
    #[error("{0} bytes after the end of a value")]
    TrailingBytes(usize),
    #[error("value cut short: {0} bytes left where more are needed")]
    Truncated(usize),
    #[error("unknown WAL record value flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("native record: {0}")]
    Native(#[from] strata_redo::RedoError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_shared_decoding_slices_instead_of_copying() {
        let page: Vec<u8> = (0..BLCKSZ).map(|i| (i % 253) as u8).collect();
        let values = [
            Value::Image(Bytes::from(page.clone())),
            Value::ZeroPage,
            Value::Native(NativeRecord::ClearVmBits(vec![(3, 1), (9, 2)])),
            Value::Wal(WalRedo {
                block_id: 2,
                will_init: true,
                lsn: Lsn(0x10),
                end_lsn: Lsn(0x40),
                record: vec![5; 48].into(),
            }),
            Value::RelDirChange(RelDirChange { added: vec![(16384, 0), (16384, 2)], removed: vec![(1259, 0)] }),
            Value::RelDirChange(RelDirChange::default()),
        ];
        for v in &values {
            let mut raw = Vec::new();
            v.encode(&mut raw);
            assert_eq!(&Value::decode(&raw).unwrap(), v);
            let shared = Bytes::from(raw);
            let decoded = Value::decode_shared(shared.clone()).unwrap();
            assert_eq!(&decoded, v);
            match decoded {
                Value::Image(b) => assert_eq!(b.as_ptr(), shared[1..].as_ptr(), "the image is a slice of the value"),
                Value::Wal(w) => assert_eq!(w.record.as_ptr(), shared[1 + WAL_HEADER_SIZE..].as_ptr()),
                _ => {}
            }
        }
        assert!(matches!(Value::decode(&[]), Err(ValueError::Empty)));
        assert!(matches!(Value::decode(&[9, 1]), Err(ValueError::UnknownTag(9))));
        assert!(matches!(Value::decode(&[TAG_ZERO, 0]), Err(ValueError::TrailingBytes(1))));
        assert!(matches!(Value::decode_shared(Bytes::from_static(&[TAG_WAL, 1, 0])), Err(ValueError::Truncated(2))));
        let mut bad_flags = vec![TAG_WAL, 0, 0x80];
        bad_flags.resize(1 + WAL_HEADER_SIZE, 0);
        assert!(matches!(Value::decode(&bad_flags), Err(ValueError::UnknownFlags(0x80))));
        // A relation directory change: counts that promise more than there
        // is, or bytes after the second list, are refused.
        let mut raw = Vec::new();
        Value::RelDirChange(RelDirChange { added: vec![(7, 1)], removed: vec![] }).encode(&mut raw);
        assert_eq!(raw, [TAG_REL_DIR_CHANGE, 1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0]);
        for cut in 1..raw.len() {
            assert!(matches!(Value::decode(&raw[..cut]), Err(ValueError::Truncated(_))), "cut at {cut}");
        }
        let mut long = raw.clone();
        long.push(0);
        assert!(matches!(Value::decode(&long), Err(ValueError::TrailingBytes(1))));
        let huge = [TAG_REL_DIR_CHANGE, 0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        assert!(matches!(Value::decode(&huge), Err(ValueError::Truncated(_))));
    }

    #[test]
    fn a_relation_directory_change_applies_removals_then_additions() {
        let mut set: std::collections::BTreeSet<(u32, u8)> = [(1, 0), (2, 0), (2, 1)].into();
        RelDirChange { added: vec![(3, 0), (2, 0)], removed: vec![(2, 0), (2, 1), (9, 9)] }.apply(&mut set);
        assert_eq!(set, [(1, 0), (2, 0), (3, 0)].into());
    }
}
