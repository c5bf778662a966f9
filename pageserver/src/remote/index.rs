//! The index manifest of a timeline in remote storage, and the names of
//! its objects (`docs/pageserver-storage.md`, "Remote storage").
//!
//! The index lists every layer the timeline consists of, with its size and
//! CRC, and the LSNs that say how far the layers go. An object becomes part
//! of the timeline only when an uploaded index lists it, so the index is
//! written after the layers it lists. Every object name carries the
//! generation of the attachment that wrote it; a pageserver reads the
//! newest index at or below its own generation.

use serde::{Deserialize, Serialize};
use strata_formats::Lsn;
use strata_protocol::{TenantShardId, TimelineId};

use crate::layer::layer_file::LayerName;

/// The version this build writes and reads.
pub const INDEX_FORMAT_VERSION: u32 = 1;

/// Largest index accepted.
pub use crate::limits::MAX_INDEX_BYTES;

/// One layer file in remote storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexLayer {
    /// The layer file's name (its kind, key range and LSN range).
    pub name: String,
    pub size: u64,
    /// CRC-32C of the whole file.
    pub crc32c: u32,
    /// The generation that uploaded it (part of its object name).
    pub generation: u32,
    /// The shard whose objects hold it, when not this one: a split's
    /// child names its parent's layers until compaction replaces them
    /// (`docs/sharding.md`). Absent, so older indexes keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<TenantShardId>,
}

impl IndexLayer {
    /// The object's name, under its owner's prefix.
    pub fn object_key(&self, tenant: TenantShardId, timeline: TimelineId) -> String {
        layer_key(self.owner.unwrap_or(tenant), timeline, &self.name, self.generation)
    }

    /// Whether another shard's objects hold it: this shard never deletes it.
    pub fn is_foreign(&self) -> bool {
        self.owner.is_some()
    }
}

/// What a timeline's index says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteIndex {
    /// The generation that wrote this index.
    pub generation: u32,
    /// The PostgreSQL cluster the timeline belongs to (what attaching it
    /// from object storage alone needs to serve it).
    pub pg_version: u32,
    pub system_id: u64,
    pub wal_segment_size: u32,
    /// Where the timeline's WAL begins.
    pub start_lsn: Lsn,
    /// Every version up to here is in the listed layers.
    pub disk_consistent_lsn: Lsn,
    /// Start of the record that ends at `disk_consistent_lsn`.
    pub prev_record_lsn: Lsn,
    pub ancestor_timeline_id: Option<TimelineId>,
    pub ancestor_lsn: Option<Lsn>,
    /// Reads below this LSN are refused (garbage collection).
    pub gc_cutoff_lsn: Lsn,
    /// LSNs that garbage collection must keep readable (branch points).
    pub retain_lsns: Vec<Lsn>,
    /// Sorted by name, each name once.
    pub layers: Vec<IndexLayer>,
    /// Blocks per stripe of a sharded tenant's shard (`docs/sharding.md`);
    /// absent, so older indexes keep their bytes and CRC, when unsharded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_blocks: Option<u32>,
}

/// The file: the index with its format version and a CRC-32C of the
/// compact JSON encoding of `index`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexFile {
    format_version: u32,
    crc32c: u32,
    index: RemoteIndex,
}

/// An index object that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("index of {0} bytes exceeds the limit of {MAX_INDEX_BYTES}")]
    TooLarge(usize),
    #[error("not an index: {0}")]
    Json(#[from] serde_json::Error),
    #[error("index format version {0}, this build reads {INDEX_FORMAT_VERSION}")]
    Version(u32),
    #[error("index CRC mismatch: stored {stored:08x}, computed {computed:08x}")]
    Crc { stored: u32, computed: u32 },
    #[error("invalid index: {0}")]
    Invalid(String),
}

impl RemoteIndex {
    /// The bytes of the index object.
    pub fn encode(&self) -> Vec<u8> {
        let crc32c = crc32c::crc32c(&serde_json::to_vec(self).expect("an index always encodes"));
        let file = IndexFile { format_version: INDEX_FORMAT_VERSION, crc32c, index: self.clone() };
        let mut out = serde_json::to_vec_pretty(&file).expect("an index always encodes");
        out.push(b'\n');
        out
    }

    /// Reads and checks an index object: version, CRC, layer names, order.
    pub fn decode(bytes: &[u8]) -> Result<RemoteIndex, IndexError> {
        if bytes.len() > MAX_INDEX_BYTES {
            return Err(IndexError::TooLarge(bytes.len()));
        }
        // The version first, so a newer format is named as such.
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let v: Version = serde_json::from_slice(bytes)?;
        if v.format_version != INDEX_FORMAT_VERSION {
            return Err(IndexError::Version(v.format_version));
        }
        let file: IndexFile = serde_json::from_slice(bytes)?;
        let computed = crc32c::crc32c(&serde_json::to_vec(&file.index).expect("an index always encodes"));
        if computed != file.crc32c {
            return Err(IndexError::Crc { stored: file.crc32c, computed });
        }
        let index = file.index;
        for pair in index.layers.windows(2) {
            if pair[0].name >= pair[1].name {
                return Err(IndexError::Invalid(format!("layers out of order at {}", pair[1].name)));
            }
        }
        for l in &index.layers {
            let name = l.name.parse::<LayerName>().map_err(|e| IndexError::Invalid(e.to_string()))?;
            if name.lsn_start > index.disk_consistent_lsn {
                return Err(IndexError::Invalid(format!(
                    "layer {} starts after disk_consistent_lsn {}",
                    l.name, index.disk_consistent_lsn
                )));
            }
            // A parent's layer carries the parent's generation, which may be above the child's.
            if l.owner.is_none() && l.generation > index.generation {
                return Err(IndexError::Invalid(format!(
                    "layer {} of generation {} in an index of generation {}",
                    l.name, l.generation, index.generation
                )));
            }
        }
        if index.start_lsn > index.disk_consistent_lsn {
            return Err(IndexError::Invalid("start_lsn beyond disk_consistent_lsn".into()));
        }
        if index.prev_record_lsn > index.disk_consistent_lsn {
            return Err(IndexError::Invalid("prev_record_lsn beyond disk_consistent_lsn".into()));
        }
        Ok(index)
    }
}

/// The prefix of every object of a timeline.
pub fn timeline_prefix(tenant: TenantShardId, timeline: TimelineId) -> String {
    format!("tenants/{tenant}/timelines/{timeline}")
}

/// The object name of a layer file uploaded by `generation`.
pub fn layer_key(tenant: TenantShardId, timeline: TimelineId, layer: &str, generation: u32) -> String {
    format!("{}/{layer}-{generation:08x}", timeline_prefix(tenant, timeline))
}

/// The object name of an index written by `generation`.
pub fn index_key(tenant: TenantShardId, timeline: TimelineId, generation: u32) -> String {
    format!("{}/index-{generation:08x}.json", timeline_prefix(tenant, timeline))
}

/// Of the object names `keys` (of one timeline), the index with the highest
/// generation at or below `generation`, and that generation. Indexes of
/// newer generations belong to a later attachment and are never read.
pub fn newest_index<'a>(keys: impl IntoIterator<Item = &'a str>, generation: u32) -> Option<(u32, &'a str)> {
    keys.into_iter()
        .filter_map(|k| {
            let file = k.rsplit('/').next()?;
            let hex = file.strip_prefix("index-")?.strip_suffix(".json")?;
            if hex.len() != 8 {
                return None;
            }
            let g = u32::from_str_radix(hex, 16).ok()?;
            (g <= generation).then_some((g, k))
        })
        .max_by_key(|(g, _)| *g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> RemoteIndex {
        RemoteIndex {
            generation: 3,
            pg_version: 15,
            system_id: 7,
            wal_segment_size: 16 << 20,
            start_lsn: Lsn(0x0100_0028),
            disk_consistent_lsn: Lsn(0x0200_0000),
            prev_record_lsn: Lsn(0x01FF_FFC8),
            ancestor_timeline_id: None,
            ancestor_lsn: None,
            gc_cutoff_lsn: Lsn(0),
            retain_lsns: vec![],
            layers: vec![IndexLayer {
                name:
                    "000000067F00000005000040000000000000-000000067F00000005000040000000000004__0000000001000060.image"
                        .into(),
                size: 300,
                crc32c: 0xDEAD_BEEF,
                generation: 2,
                owner: None,
            }],
            stripe_blocks: None,
        }
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let i = index();
        let bytes = i.encode();
        assert_eq!(RemoteIndex::decode(&bytes).unwrap(), i);
        // A changed value breaks the CRC.
        let text = String::from_utf8(bytes.clone()).unwrap();
        let damaged = text.replace("\"size\": 300", "\"size\": 301");
        assert!(matches!(RemoteIndex::decode(damaged.as_bytes()), Err(IndexError::Crc { .. })));
        let newer = text.replace("\"format_version\": 1", "\"format_version\": 2");
        assert!(RemoteIndex::decode(newer.as_bytes()).unwrap_err().to_string().contains("version 2"));
        let extra = text.replacen('{', "{\"extra\": 1,", 1);
        assert!(RemoteIndex::decode(extra.as_bytes()).is_err());
        assert!(RemoteIndex::decode(b"").is_err());
        assert!(RemoteIndex::decode(&bytes[..bytes.len() / 2]).is_err());
        // Well-formed but inconsistent indexes are refused with the reason.
        let mut bad = index();
        bad.layers[0].generation = 4;
        assert!(RemoteIndex::decode(&bad.encode()).unwrap_err().to_string().contains("generation 4"));
        let mut bad = index();
        bad.layers[0].name = "no-layer".into();
        assert!(RemoteIndex::decode(&bad.encode()).unwrap_err().to_string().contains("not a layer file name"));
        let mut bad = index();
        bad.disk_consistent_lsn = Lsn(0x0100_0000);
        bad.prev_record_lsn = Lsn(0x0100_0000);
        assert!(RemoteIndex::decode(&bad.encode()).unwrap_err().to_string().contains("starts after"));
        let mut bad = index();
        bad.layers.push(bad.layers[0].clone());
        assert!(RemoteIndex::decode(&bad.encode()).unwrap_err().to_string().contains("out of order"));
    }

    #[test]
    fn object_names_carry_the_generation_and_the_newest_index_at_or_below_wins() {
        let t = "11111111111111111111111111111111".parse::<TenantShardId>().unwrap();
        let l = "22222222222222222222222222222222".parse::<TimelineId>().unwrap();
        assert_eq!(
            index_key(t, l, 0x1a),
            "tenants/11111111111111111111111111111111/timelines/22222222222222222222222222222222/index-0000001a.json"
        );
        assert!(layer_key(t, l, "x.delta", 3).ends_with("/x.delta-00000003"));
        let keys = [index_key(t, l, 1), index_key(t, l, 5), index_key(t, l, 9), layer_key(t, l, "a.delta", 9)];
        let found = |g| newest_index(keys.iter().map(String::as_str), g).map(|(g, _)| g);
        assert_eq!(
            (found(0), found(1), found(4), found(5), found(8), found(100)),
            (None, Some(1), Some(1), Some(5), Some(5), Some(9))
        );
        assert_eq!(newest_index(["t/index-zz.json", "t/index-1.json", "t/index-000000001.json"], 100), None);
    }
}
