//! The key space: 18-byte keys that order every piece of a timeline's state
//! so that related keys sit together in layer files.
//!
//! Layout (big-endian so byte order is key order):
//! `kind u8 | field1 u32 | field2 u32 | field3 u32 | field4 u8 | field5 u32`.
//!
//! | kind | what | fields |
//! |------|------|--------|
//! | 0x00 | relation block | spc, db, rel, fork, block |
//! | 0x00 | relation size (after all blocks) | spc, db, rel, fork, 0xFFFFFFFF |
//! | 0x10 | database directory | — |
//! | 0x11 | relation directory of a database | spc, db |
//! | 0x12 | relation map file | spc, db (0 for `global/`) |
//! | 0x20 | SLRU page | slru kind, —, —, —, page number |
//! | 0x21 | SLRU segment directory | slru kind |
//! | 0x30 | two-phase directory | — |
//! | 0x31 | two-phase state file | xid |
//! | 0x40 | checkpoint counters | — |
//! | 0x41 | `pg_control` template | — |

use std::fmt;

use strata_formats::types::{BlockNumber, ForkNumber, Oid, RelFileNode};
use strata_protocol::pageserver::SlruKind;
use strata_protocol::ShardIdentity;

/// Encoded size of a key.
pub const KEY_SIZE: usize = 18;

/// A key of the timeline key space (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub kind: u8,
    pub field1: u32,
    pub field2: u32,
    pub field3: u32,
    pub field4: u8,
    pub field5: u32,
}

pub const KIND_REL: u8 = 0x00;
pub const KIND_DB_DIR: u8 = 0x10;
pub const KIND_REL_DIR: u8 = 0x11;
pub const KIND_RELMAP: u8 = 0x12;
pub const KIND_SLRU_PAGE: u8 = 0x20;
pub const KIND_SLRU_DIR: u8 = 0x21;
pub const KIND_TWOPHASE_DIR: u8 = 0x30;
pub const KIND_TWOPHASE_FILE: u8 = 0x31;
pub const KIND_CHECKPOINT: u8 = 0x40;
pub const KIND_CONTROL: u8 = 0x41;
pub const KIND_COMMIT_TIME: u8 = 0x42;
pub const KIND_CHECKPOINT_RECORD: u8 = 0x43;

/// Block number field of a relation-size key.
const REL_SIZE_BLOCK: u32 = u32::MAX;

/// A fork of a relation: what relation blocks and sizes are keyed by.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RelTag {
    pub rel: RelFileNode,
    pub fork: ForkNumber,
}

impl fmt::Display for RelTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.rel, self.fork.file_suffix())
    }
}

impl Key {
    pub const MIN: Key = Key { kind: 0, field1: 0, field2: 0, field3: 0, field4: 0, field5: 0 };
    pub const MAX: Key =
        Key { kind: 0xff, field1: u32::MAX, field2: u32::MAX, field3: u32::MAX, field4: 0xff, field5: u32::MAX };

    const fn simple(kind: u8) -> Key {
        Key { kind, field1: 0, field2: 0, field3: 0, field4: 0, field5: 0 }
    }

    /// Block `block` of a relation fork.
    pub fn rel_block(tag: RelTag, block: BlockNumber) -> Key {
        debug_assert!(block != REL_SIZE_BLOCK, "block {block} is reserved for the size key");
        Key {
            kind: KIND_REL,
            field1: tag.rel.spc,
            field2: tag.rel.db,
            field3: tag.rel.rel,
            field4: tag.fork as u8,
            field5: block,
        }
    }
    /// The size (in blocks) of a relation fork.
    pub fn rel_size(tag: RelTag) -> Key {
        Key { field5: REL_SIZE_BLOCK, ..Key::rel_block(tag, 0) }
    }
    pub const fn db_dir() -> Key {
        Key::simple(KIND_DB_DIR)
    }
    /// The set of relation forks of a database.
    pub fn rel_dir(spc: Oid, db: Oid) -> Key {
        Key { field1: spc, field2: db, ..Key::simple(KIND_REL_DIR) }
    }
    /// `pg_filenode.map` of a database, or of `global/` (db 0).
    pub fn relmap(spc: Oid, db: Oid) -> Key {
        Key { field1: spc, field2: db, ..Key::simple(KIND_RELMAP) }
    }
    pub fn slru_page(kind: SlruKind, page: u32) -> Key {
        Key { field1: kind as u32, field5: page, ..Key::simple(KIND_SLRU_PAGE) }
    }
    /// The set of existing segments of an SLRU.
    pub fn slru_dir(kind: SlruKind) -> Key {
        Key { field1: kind as u32, ..Key::simple(KIND_SLRU_DIR) }
    }
    pub const fn twophase_dir() -> Key {
        Key::simple(KIND_TWOPHASE_DIR)
    }
    pub fn twophase_file(xid: u32) -> Key {
        Key { field1: xid, ..Key::simple(KIND_TWOPHASE_FILE) }
    }
    pub const fn checkpoint() -> Key {
        Key::simple(KIND_CHECKPOINT)
    }
    pub const fn control() -> Key {
        Key::simple(KIND_CONTROL)
    }
    /// The commit time of the last commit at or before an LSN (sparse: see ingest).
    pub const fn commit_time() -> Key {
        Key::simple(KIND_COMMIT_TIME)
    }
    /// The last checkpoint record (`crate::checkpoint_record`).
    pub const fn checkpoint_record() -> Key {
        Key::simple(KIND_CHECKPOINT_RECORD)
    }

    /// The relation fork and block of a relation block key.
    pub fn as_rel_block(&self) -> Option<(RelTag, BlockNumber)> {
        if self.kind != KIND_REL || self.field5 == REL_SIZE_BLOCK {
            return None;
        }
        let fork = ForkNumber::from_u8(self.field4)?;
        Some((RelTag { rel: RelFileNode { spc: self.field1, db: self.field2, rel: self.field3 }, fork }, self.field5))
    }

    /// Whether `shard` stores this key (`docs/sharding.md`): relation
    /// blocks by the stripe mapping; SLRU pages and two-phase state files
    /// only on shard 0, the home of what a compute start reads; every other
    /// key (sizes, directories, the relation map, checkpoint counters,
    /// `pg_control`) on every shard, since each shard's ingest and reads
    /// need them and they are small.
    pub fn is_stored_on(&self, shard: &ShardIdentity) -> bool {
        if shard.index.is_unsharded() {
            return true;
        }
        match self.kind {
            KIND_REL if self.field5 != REL_SIZE_BLOCK => match ForkNumber::from_u8(self.field4) {
                Some(fork) => shard.owns_block(self.field3, fork, self.field5),
                None => shard.is_home(),
            },
            KIND_SLRU_PAGE | KIND_TWOPHASE_FILE => shard.is_home(),
            _ => true,
        }
    }

    /// Whether reading this key without any stored version means a zero page
    /// (relation blocks that were extended but never WAL-logged, SLRU pages).
    pub fn is_page(&self) -> bool {
        (self.kind == KIND_REL && self.field5 != REL_SIZE_BLOCK) || self.kind == KIND_SLRU_PAGE
    }

    pub fn encode(&self) -> [u8; KEY_SIZE] {
        let mut out = [0u8; KEY_SIZE];
        out[0] = self.kind;
        out[1..5].copy_from_slice(&self.field1.to_be_bytes());
        out[5..9].copy_from_slice(&self.field2.to_be_bytes());
        out[9..13].copy_from_slice(&self.field3.to_be_bytes());
        out[13] = self.field4;
        out[14..18].copy_from_slice(&self.field5.to_be_bytes());
        out
    }

    pub fn decode(b: &[u8; KEY_SIZE]) -> Key {
        let u = |r: std::ops::Range<usize>| u32::from_be_bytes(b[r].try_into().expect("4 bytes"));
        Key { kind: b[0], field1: u(1..5), field2: u(5..9), field3: u(9..13), field4: b[13], field5: u(14..18) }
    }

    /// The next key in order (saturating at `Key::MAX`).
    pub fn next(&self) -> Key {
        let mut b = self.encode();
        for i in (0..KEY_SIZE).rev() {
            if b[i] == 0xff {
                b[i] = 0;
            } else {
                b[i] += 1;
                return Key::decode(&b);
            }
        }
        Key::MAX
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.encode() {
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_rel_block() {
            Some((tag, block)) => write!(f, "{tag} block {block}"),
            None => write!(f, "{self}"),
        }
    }
}

/// Text that is not a key in its hex form.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a {len}-digit hex key", len = KEY_SIZE * 2)]
pub struct KeyParseError(pub String);

impl std::str::FromStr for Key {
    type Err = KeyParseError;
    fn from_str(s: &str) -> Result<Key, KeyParseError> {
        let bad = || KeyParseError(s.to_string());
        // All ASCII hex digits, so slicing at even offsets cannot split a character.
        if s.len() != KEY_SIZE * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut b = [0u8; KEY_SIZE];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Key::decode(&b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_orders_like_the_struct_and_round_trips() {
        let tag = RelTag { rel: RelFileNode { spc: 1663, db: 5, rel: 16384 }, fork: ForkNumber::Main };
        let keys = [
            Key::rel_block(tag, 0),
            Key::rel_block(tag, 1),
            Key::rel_block(tag, 70000),
            Key::rel_size(tag),
            Key::rel_block(RelTag { fork: ForkNumber::VisibilityMap, ..tag }, 0),
            Key::db_dir(),
            Key::rel_dir(1663, 5),
            Key::slru_page(SlruKind::Clog, 3),
            Key::checkpoint(),
            Key::commit_time(),
            Key::checkpoint_record(),
        ];
        for w in keys.windows(2) {
            assert!(w[0] < w[1]);
            assert!(w[0].encode() < w[1].encode());
        }
        for k in keys {
            assert_eq!(Key::decode(&k.encode()), k);
            assert_eq!(k.to_string().parse::<Key>().unwrap(), k);
        }
        assert_eq!(Key::rel_block(tag, 7).as_rel_block(), Some((tag, 7)));
        assert_eq!(Key::rel_size(tag).as_rel_block(), None);
        assert_eq!(Key::rel_block(tag, 0xff).next(), Key::rel_block(tag, 0x100));
        assert!("zz".parse::<Key>().is_err());
    }
}
