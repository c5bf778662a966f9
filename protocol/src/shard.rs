//! Shards: how one tenant's pages are spread over several pageservers
//! (`docs/sharding.md`).
//!
//! A tenant has a [`ShardLayout`]: a shard count and a stripe size in
//! blocks. Blocks of a relation are cut into stripes of `stripe_blocks`
//! consecutive blocks, and each stripe belongs to one shard, chosen by a
//! hash of the relation's file node and the stripe's number. Everything
//! else has one home, shard 0: the relations `initdb` made (the catalog),
//! and every key that is not a relation block. The function is pure — it
//! depends on nothing but the key and the layout — so the compute, the
//! safekeepers and the pageservers agree on it without asking anyone.
//!
//! The database is left out of the hash on purpose: `CREATE DATABASE`
//! copies every relation of its template under the same file node into
//! the new database, and so each block lands on the shard that already
//! holds its source.

use std::fmt;
use std::str::FromStr;

use strata_formats::types::ForkNumber;

use crate::ids::{IdParseError, TenantId};

/// Blocks per stripe unless the tenant says otherwise: 16 MiB of
/// consecutive blocks on one pageserver (why: `docs/sharding.md`).
pub const DEFAULT_STRIPE_BLOCKS: u32 = 2048;

/// The most shards a tenant may have.
pub const MAX_SHARDS: u8 = 64;

/// The smallest stripe: 8 blocks (64 KiB). Smaller stripes would send a
/// sequential scan to another pageserver every few pages.
pub const MIN_STRIPE_BLOCKS: u32 = 8;

/// File nodes below this were made by `initdb` (PostgreSQL's
/// `FirstNormalObjectId`): the catalog, which every compute start reads.
pub const FIRST_NORMAL_OBJECT_ID: u32 = 16384;

/// One shard of a tenant: its number and how many there are. A count of 0
/// is an unsharded tenant (the only shard, number 0), which keeps the ids,
/// paths and routes of tenants that were never split as they were.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct ShardIndex {
    pub number: u8,
    pub count: u8,
}

impl ShardIndex {
    /// The one shard of a tenant that has never been split.
    pub const UNSHARDED: ShardIndex = ShardIndex { number: 0, count: 0 };

    /// Shard `number` of `count` (a count of 1 is written as unsharded:
    /// one shard is no sharding).
    pub fn new(number: u8, count: u8) -> Result<ShardIndex, ShardError> {
        if count > MAX_SHARDS {
            return Err(ShardError::Count(count as u32));
        }
        if count <= 1 {
            return if number == 0 { Ok(ShardIndex::UNSHARDED) } else { Err(ShardError::Number { number, count }) };
        }
        if number >= count {
            return Err(ShardError::Number { number, count });
        }
        Ok(ShardIndex { number, count })
    }

    /// A shard as protocols carry it: count 0 and number 0 for an
    /// unsharded tenant, else a count of 2 to [`MAX_SHARDS`] (one encoding
    /// per shard: a count of 1 is refused).
    pub fn from_wire(number: u8, count: u8) -> Result<ShardIndex, ShardError> {
        if count == 1 {
            return Err(ShardError::Number { number, count });
        }
        ShardIndex::new(number, count)
    }

    pub fn is_unsharded(&self) -> bool {
        self.count == 0
    }

    /// The number of shards, at least 1.
    pub fn shards(&self) -> u8 {
        self.count.max(1)
    }
}

/// Why a shard, a count or a stripe size is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("a tenant has 1 to {MAX_SHARDS} shards, not {0}")]
    Count(u32),
    #[error("there is no shard {number} of {count}")]
    Number { number: u8, count: u8 },
    #[error("a stripe is a power of two of at least {MIN_STRIPE_BLOCKS} blocks, not {0}")]
    Stripe(u32),
    #[error("a split makes a multiple of the shards there are: {from} shards cannot become {to}")]
    Split { from: u8, to: u8 },
}

/// How a tenant's keys are spread: its shard count and stripe size.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct ShardLayout {
    /// 1 for an unsharded tenant.
    pub count: u8,
    pub stripe_blocks: u32,
}

impl Default for ShardLayout {
    fn default() -> ShardLayout {
        ShardLayout::UNSHARDED
    }
}

impl ShardLayout {
    pub const UNSHARDED: ShardLayout = ShardLayout { count: 1, stripe_blocks: DEFAULT_STRIPE_BLOCKS };

    /// A checked layout.
    pub fn new(count: u32, stripe_blocks: u32) -> Result<ShardLayout, ShardError> {
        if count == 0 || count > MAX_SHARDS as u32 {
            return Err(ShardError::Count(count));
        }
        if stripe_blocks < MIN_STRIPE_BLOCKS || !stripe_blocks.is_power_of_two() {
            return Err(ShardError::Stripe(stripe_blocks));
        }
        Ok(ShardLayout { count: count as u8, stripe_blocks })
    }

    pub fn is_sharded(&self) -> bool {
        self.count > 1
    }

    /// The shards of the layout, in order.
    pub fn shards(&self) -> impl Iterator<Item = ShardIndex> + '_ {
        let count = if self.is_sharded() { self.count } else { 0 };
        (0..self.count.max(1)).map(move |number| ShardIndex { number, count })
    }

    /// The shard that holds block `block` of fork `fork` of the relation
    /// whose file node is `rel_node` (in any database and tablespace).
    /// Init forks stay home: every compute start copies them.
    pub fn shard_of_block(&self, rel_node: u32, fork: ForkNumber, block: u32) -> u8 {
        if !self.is_sharded() || rel_node < FIRST_NORMAL_OBJECT_ID || fork == ForkNumber::Init {
            return 0;
        }
        let stripe = block / self.stripe_blocks;
        (stripe_hash(rel_node, stripe) % self.count as u32) as u8
    }

    /// The layout after splitting into `to` shards: each new shard holds a
    /// subset of one old shard's keys (`to` is a multiple of the count).
    pub fn split(&self, to: u32) -> Result<ShardLayout, ShardError> {
        let next = ShardLayout::new(to, self.stripe_blocks)?;
        if next.count <= self.count || next.count % self.count != 0 {
            return Err(ShardError::Split { from: self.count, to: next.count });
        }
        Ok(next)
    }

    /// The layouts a tenant with this layout may have had before: every
    /// smaller count that divides this one (splits only multiply), with
    /// the same stripe. Their shards' objects are what a split leaves
    /// behind until the sweep.
    pub fn earlier(&self) -> impl Iterator<Item = ShardLayout> + '_ {
        (1..self.count).filter(|c| self.count.is_multiple_of(*c)).map(|count| ShardLayout { count, ..*self })
    }
}

/// What one shard holds: its index and the tenant's stripe size.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ShardIdentity {
    pub index: ShardIndex,
    pub stripe_blocks: u32,
}

impl ShardIdentity {
    /// The identity of an unsharded tenant's one shard.
    pub const UNSHARDED: ShardIdentity =
        ShardIdentity { index: ShardIndex::UNSHARDED, stripe_blocks: DEFAULT_STRIPE_BLOCKS };

    pub fn layout(&self) -> ShardLayout {
        ShardLayout { count: self.index.shards(), stripe_blocks: self.stripe_blocks }
    }

    /// Whether this shard holds block `block` of fork `fork` of relation `rel_node`.
    pub fn owns_block(&self, rel_node: u32, fork: ForkNumber, block: u32) -> bool {
        self.index.is_unsharded() || self.layout().shard_of_block(rel_node, fork, block) == self.index.number
    }

    /// Shard 0 holds every key that is not a striped relation block.
    pub fn is_home(&self) -> bool {
        self.index.number == 0
    }
}

/// MurmurHash3's 32-bit finalizer: every input bit moves every output bit,
/// so consecutive file nodes and stripes land on unrelated shards.
const fn mix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The hash a stripe's shard is chosen by (a specified function: it is
/// part of the on-disk and wire contract, `docs/sharding.md`).
pub const fn stripe_hash(rel_node: u32, stripe: u32) -> u32 {
    mix32(mix32(rel_node) ^ stripe.wrapping_mul(0x9e37_79b9))
}

/// A tenant's shard as the pageservers know it. Printed as the tenant id
/// for an unsharded tenant and `<tenant>-<number>of<count>` otherwise.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TenantShardId {
    pub tenant: TenantId,
    pub shard: ShardIndex,
}

impl TenantShardId {
    /// The only shard of an unsharded tenant.
    pub fn unsharded(tenant: TenantId) -> TenantShardId {
        TenantShardId { tenant, shard: ShardIndex::UNSHARDED }
    }

    /// A new unsharded tenant.
    pub fn generate() -> TenantShardId {
        TenantShardId::unsharded(TenantId::generate())
    }
}

impl From<TenantId> for TenantShardId {
    fn from(tenant: TenantId) -> TenantShardId {
        TenantShardId::unsharded(tenant)
    }
}

impl fmt::Display for TenantShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shard.is_unsharded() {
            write!(f, "{}", self.tenant)
        } else {
            write!(f, "{}-{}of{}", self.tenant, self.shard.number, self.shard.count)
        }
    }
}

impl fmt::Debug for TenantShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for TenantShardId {
    type Err = IdParseError;
    fn from_str(s: &str) -> Result<TenantShardId, IdParseError> {
        let bad = || IdParseError { what: "tenant shard", input: s.to_string() };
        let Some((tenant, shard)) = s.split_once('-') else {
            return Ok(TenantShardId::unsharded(s.parse()?));
        };
        let (number, count) = shard.split_once("of").ok_or_else(bad)?;
        let digits = |x: &str| -> Result<u8, IdParseError> {
            // Canonical decimal only, so one shard has one name.
            if x.is_empty() || (x.len() > 1 && x.starts_with('0')) || !x.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            x.parse().map_err(|_| bad())
        };
        let (number, count) = (digits(number)?, digits(count)?);
        if count < 2 {
            return Err(bad());
        }
        let shard = ShardIndex::new(number, count).map_err(|_| bad())?;
        Ok(TenantShardId { tenant: tenant.parse()?, shard })
    }
}

impl serde::Serialize for TenantShardId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for TenantShardId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TenantShardId, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: ForkNumber = ForkNumber::Main;

    #[test]
    fn the_hash_is_the_documented_function() {
        // Vectors of docs/sharding.md: changing them moves every stored key.
        assert_eq!(mix32(0), 0);
        assert_eq!(mix32(1), 0x514e_28b7);
        assert_eq!(stripe_hash(16384, 0), 0x11e4_7b74);
        assert_eq!(stripe_hash(16384, 1), 0x04c6_7877);
        assert_eq!(stripe_hash(24576, 7), 0x918e_2fba);
        let four = ShardLayout::new(4, 8).unwrap();
        assert_eq!(four.shard_of_block(16384, MAIN, 0), (0x11e4_7b74u32 % 4) as u8);
        assert_eq!(four.shard_of_block(16384, MAIN, 9), (0x04c6_7877u32 % 4) as u8);
    }

    #[test]
    fn the_catalog_and_unsharded_tenants_have_one_home() {
        let four = ShardLayout::new(4, 8).unwrap();
        assert!((0..64).any(|b| four.shard_of_block(20000, MAIN, b * 8) != 0), "a user relation is spread");
        for b in 0..64 {
            assert_eq!(four.shard_of_block(20000, ForkNumber::Init, b), 0, "init forks stay home");
        }
        for block in 0..10_000 {
            assert_eq!(four.shard_of_block(1259, MAIN, block), 0, "pg_class stays on shard 0");
            assert_eq!(ShardLayout::UNSHARDED.shard_of_block(16384 + block, MAIN, block), 0);
        }
        assert!(ShardIdentity::UNSHARDED.owns_block(99999, MAIN, 5));
    }

    #[test]
    fn stripes_stay_together_and_spread_evenly() {
        let layout = ShardLayout::new(4, 16).unwrap();
        let mut per_shard = [0u32; 4];
        for rel in 16384..16384 + 200 {
            for stripe in 0..50 {
                let first = layout.shard_of_block(rel, MAIN, stripe * 16);
                for block in stripe * 16..stripe * 16 + 16 {
                    assert_eq!(layout.shard_of_block(rel, MAIN, block), first);
                }
                per_shard[first as usize] += 1;
            }
        }
        // 10,000 stripes: each shard within 10% of a quarter.
        for n in per_shard {
            assert!((2250..=2750).contains(&n), "{per_shard:?}");
        }
    }

    #[test]
    fn a_split_refines_every_shard() {
        let two = ShardLayout::new(2, 8).unwrap();
        let eight = two.split(8).unwrap();
        for rel in 16384..16484 {
            for block in (0..800).step_by(8) {
                let child = eight.shard_of_block(rel, MAIN, block);
                assert_eq!(child % 2, two.shard_of_block(rel, MAIN, block), "rel {rel} block {block}");
            }
        }
        assert_eq!(two.split(3), Err(ShardError::Split { from: 2, to: 3 }));
        assert_eq!(two.split(2), Err(ShardError::Split { from: 2, to: 2 }));
        assert_eq!(two.split(65), Err(ShardError::Count(65)));
    }

    #[test]
    fn layouts_and_indexes_are_checked() {
        assert_eq!(ShardLayout::new(0, 8), Err(ShardError::Count(0)));
        assert_eq!(ShardLayout::new(4, 12), Err(ShardError::Stripe(12)));
        assert_eq!(ShardLayout::new(4, 4), Err(ShardError::Stripe(4)));
        assert_eq!(ShardIndex::new(0, 1), Ok(ShardIndex::UNSHARDED));
        assert_eq!(ShardIndex::new(4, 4), Err(ShardError::Number { number: 4, count: 4 }));
        assert_eq!(ShardIndex::new(1, 1), Err(ShardError::Number { number: 1, count: 1 }));
        let shards: Vec<_> = ShardLayout::new(3, 8).unwrap().shards().collect();
        assert_eq!(
            shards,
            vec![
                ShardIndex { number: 0, count: 3 },
                ShardIndex { number: 1, count: 3 },
                ShardIndex { number: 2, count: 3 }
            ]
        );
        assert_eq!(ShardLayout::UNSHARDED.shards().collect::<Vec<_>>(), vec![ShardIndex::UNSHARDED]);
    }

    #[test]
    fn shard_ids_print_and_parse_one_way() {
        let t = TenantId::generate();
        let unsharded = TenantShardId::unsharded(t);
        assert_eq!(unsharded.to_string(), t.to_string());
        assert_eq!(unsharded.to_string().parse::<TenantShardId>().unwrap(), unsharded);
        let s = TenantShardId { tenant: t, shard: ShardIndex::new(2, 4).unwrap() };
        assert_eq!(s.to_string(), format!("{t}-2of4"));
        assert_eq!(s.to_string().parse::<TenantShardId>().unwrap(), s);
        for bad in ["-2of4", "02of4", "2of04", "4of4", "0of1", "2of", "of4", "+2of4", "2of65", "1of999"] {
            assert!(format!("{t}-{bad}").parse::<TenantShardId>().is_err(), "{bad}");
        }
        assert!("nothex-1of2".parse::<TenantShardId>().is_err());
    }

    #[test]
    fn earlier_layouts_are_the_dividing_counts() {
        let counts = |n: u32| -> Vec<u8> { ShardLayout::new(n, 64).unwrap().earlier().map(|l| l.count).collect() };
        assert_eq!(counts(1), Vec::<u8>::new());
        assert_eq!(counts(2), vec![1]);
        assert_eq!(counts(8), vec![1, 2, 4]);
        assert_eq!(counts(12), vec![1, 2, 3, 4, 6]);
        assert!(ShardLayout::new(8, 64).unwrap().earlier().all(|l| l.stripe_blocks == 64));
    }
}
