//! The storage controller: its state object in object storage and its HTTP
//! API (`docs/storage-controller.md`, `docs/openapi/controller.yaml`).
//!
//! The state object is read by the controllers (one leader writes it by
//! compare-and-swap) and by the pageservers, which check their generation
//! against it before they delete objects.

use std::collections::BTreeMap;

use crate::limits::MAX_STATE_BYTES;
use crate::shard::ShardLayout;
use crate::{TenantId, TenantShardId};

/// Where the state object lives, relative to the storage's prefix.
pub const STATE_KEY: &str = "controller/state.json";
/// Where the leader's lease lives.
pub const LEADER_KEY: &str = "controller/leader.json";
/// The state object's format version this build reads and writes.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// `controller/state.json`: every tenant's placement.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerState {
    pub format_version: u32,
    /// Incremented by every write: computes wait for a version above the
    /// one they know.
    pub version: u64,
    /// The term of the leader that wrote it last: a leader whose term is
    /// lower has been replaced and writes nothing more.
    pub leader_term: u64,
    pub tenants: BTreeMap<TenantShardId, TenantPlacement>,
    /// Scheduling policy of each pageserver (by name) that is not active.
    #[serde(default)]
    pub pageservers: BTreeMap<String, PageserverPolicy>,
    /// Tombstones of the tenants deleted through the API: the config's list
    /// does not place them again, and pageservers that still hold one are
    /// told to detach it. Never a tenant of `tenants`. Absent when empty,
    /// so states without it read as before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deleted_tenants: BTreeMap<TenantShardId, DeletedTenant>,
    /// Each tenant's newest split (`docs/sharding.md`, "Split, step by
    /// step"), kept once ended so that it says how it ended. Absent when
    /// empty, so states without it read as before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub splits: BTreeMap<TenantId, TenantSplit>,
}

impl ControllerState {
    /// Parses and checks a state object.
    pub fn decode(bytes: &[u8]) -> Result<ControllerState, String> {
        if bytes.len() > MAX_STATE_BYTES {
            return Err(format!("larger than {MAX_STATE_BYTES} bytes"));
        }
        let s: ControllerState =
            serde_json::from_slice(bytes).map_err(|e| format!("not a controller state object: {e}"))?;
        if s.format_version != STATE_FORMAT_VERSION {
            return Err(format!("format version {}, this build reads {STATE_FORMAT_VERSION}", s.format_version));
        }
        for (t, p) in &s.tenants {
            if s.deleted_tenants.contains_key(t) {
                return Err(format!("tenant {t}: both placed and deleted"));
            }
            if p.generation == 0 && p.attached.is_some() {
                return Err(format!("tenant {t}: attached under generation 0"));
            }
            if let Some(a) = &p.attached {
                if p.secondaries.contains(a) {
                    return Err(format!("tenant {t}: {a} is both attached and a secondary"));
                }
            }
        }
        for (t, split) in &s.splits {
            split.check().map_err(|e| format!("tenant {t}: split: {e}"))?;
        }
        Ok(s)
    }

    /// The bytes of the object.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("the state always encodes");
        out.push(b'\n');
        out
    }

    /// The current generation of `tenant`, if it has one.
    pub fn generation(&self, tenant: TenantShardId) -> Option<u32> {
        self.tenants.get(&tenant).map(|p| p.generation).filter(|g| *g > 0)
    }

    /// Whether `shard` may delete objects: not while a split that may
    /// reference its layers is under way (its children's indexes name
    /// them), nor once it ended in the children (the parent's objects
    /// then go only with the sweep that knows what the children use).
    pub fn may_delete(&self, shard: TenantShardId) -> bool {
        self.splits.get(&shard.tenant).is_none_or(|s| !s.is_parent(shard) || s.phase == SplitPhase::RolledBack)
    }

    /// The shards the bare tenant id stands for now: the parents while a
    /// split is under way, the children once it is done.
    pub fn current_count(&self, tenant: TenantId) -> Option<u8> {
        let split = self.splits.get(&tenant)?;
        Some(match split.phase {
            SplitPhase::Done => split.to.count,
            _ => split.from.count,
        })
    }
}

/// A split of a tenant's shards into more (`strata tenant split`): what
/// the controllers record so that, after any crash, it either completes
/// or rolls back.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantSplit {
    pub from: ShardLayout,
    pub to: ShardLayout,
    pub phase: SplitPhase,
    /// Each child's first generation, in shard order (`to.count` of them).
    pub generations: Vec<u32>,
    /// Where each parent was attached when the split was prepared, in
    /// shard order: its children are attached there.
    pub parents: Vec<String>,
    /// The state version that prepared it.
    pub version: u64,
    /// Why it rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Once done: whether the parents' objects that no child uses are gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub swept: bool,
}

/// Where a split is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitPhase {
    /// Recorded; the parents delete nothing from here on. Each parent's
    /// pageserver writes its children's indexes.
    Prepared,
    /// Every child's index is written: the children are placed where their
    /// parents are and catch up. From here the split completes.
    Copied,
    /// The children serve the tenant; the parents are detached.
    Done,
    /// Given up before `Copied`: the children's objects are removed, the
    /// parents go on.
    RolledBack,
}

impl TenantSplit {
    /// The parents' shard ids.
    pub fn parent_ids(&self, tenant: TenantId) -> Vec<TenantShardId> {
        self.from.shards().map(|shard| TenantShardId { tenant, shard }).collect()
    }

    /// The children's shard ids.
    pub fn child_ids(&self, tenant: TenantId) -> Vec<TenantShardId> {
        self.to.shards().map(|shard| TenantShardId { tenant, shard }).collect()
    }

    /// Whether `shard` is one of the parents.
    pub fn is_parent(&self, shard: TenantShardId) -> bool {
        shard.shard.shards() == self.from.count
    }

    /// Whether the split is under way (neither done nor rolled back).
    pub fn is_open(&self) -> bool {
        matches!(self.phase, SplitPhase::Prepared | SplitPhase::Copied)
    }

    fn check(&self) -> Result<(), String> {
        self.from.split(u32::from(self.to.count)).map_err(|e| e.to_string())?;
        if self.from.stripe_blocks != self.to.stripe_blocks {
            return Err("the stripe changes".into());
        }
        if self.generations.len() != usize::from(self.to.count) || self.generations.contains(&0) {
            return Err(format!("{} generations for {} children", self.generations.len(), self.to.count));
        }
        if self.parents.len() != usize::from(self.from.count) {
            return Err(format!("{} parents' pageservers for {} parents", self.parents.len(), self.from.count));
        }
        Ok(())
    }
}

/// Where a tenant is.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantPlacement {
    /// The generation of its newest attachment (0: never attached).
    pub generation: u32,
    /// The pageserver that serves it (its name in the cluster).
    pub attached: Option<String>,
    /// Pageservers that keep its layers warm.
    #[serde(default)]
    pub secondaries: Vec<String>,
    /// A live move under way: `to` is attached under `generation` and
    /// catches up while `attached` still serves the computes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<Migration>,
}

/// A deleted tenant's tombstone (`DELETE /v1/tenant/{tenant}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeletedTenant {
    /// Its generation when it was deleted: registered again, it is placed
    /// above it, so no generation is issued twice.
    pub generation: u32,
    /// The state version that recorded the deletion: the oldest tombstones
    /// are dropped first.
    pub version: u64,
}

/// A live move of a tenant to another pageserver (a drain or a rebalance).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Migration {
    pub to: String,
}

/// Whether tenants are placed on a pageserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageserverPolicy {
    /// Takes attachments and secondaries.
    Active,
    /// Everything moves off it (maintenance); it takes nothing new.
    Draining,
    /// Gone with its site (`strata site promote`, `docs/sites.md`): taken
    /// as offline whatever its heartbeats say, so its tenants fail over at
    /// once; nothing is placed there until it is made active again.
    Lost,
}

/// `GET /v1/tenant/{tenant}/attachment`: where a tenant's pages are served.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttachmentInfo {
    pub tenant_id: TenantShardId,
    /// The state's version this answer comes from.
    pub version: u64,
    pub generation: u32,
    /// The attached pageserver's name, page service and HTTP API (`host:port`).
    pub pageserver: String,
    pub pg: String,
    pub http: String,
    /// The answer names a site's reader (asked with `site=`), not the
    /// attached pageserver: it serves replicas, not writers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reader: bool,
    /// Asked for a sharded tenant by its bare id: every shard's location,
    /// in shard order (the fields above are shard 0's). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardAttachment>,
    /// The stripe of `shards`' layout, when the controllers know it (a
    /// tenant that was split): a compute started unsharded, or with fewer
    /// shards, switches to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_blocks: Option<u32>,
}

/// Where one shard of a sharded tenant is served ([`AttachmentInfo::shards`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardAttachment {
    pub shard: TenantShardId,
    pub generation: u32,
    pub pageserver: String,
    pub pg: String,
    pub http: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reader: bool,
}

/// `GET /v1/status` of a controller.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ControllerStatus {
    pub id: u64,
    /// Whether this controller leads now, and the term of the leader it knows.
    pub leader: bool,
    pub leader_term: u64,
    /// The leader's HTTP API, as its lease names it.
    pub leader_http: Option<String>,
    /// The state as this controller last read or wrote it.
    pub state: Option<ControllerState>,
    /// What the heartbeats say of each pageserver.
    pub pageservers: Vec<PageserverHealth>,
    /// What failed last (reading or writing the state, a call to a pageserver).
    pub last_error: Option<String>,
}

/// One pageserver as the controller sees it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PageserverHealth {
    pub name: String,
    /// `online` or `offline` (no answer to heartbeats for the offline period).
    pub availability: String,
    pub policy: PageserverPolicy,
    /// Seconds since its last answer.
    pub last_answer_seconds: Option<f64>,
}

/// `POST /v1/pageserver/{name}/drain` and `/fill`: the answer.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PolicyChanged {
    pub pageserver: String,
    pub policy: PageserverPolicy,
}

/// `PUT /v1/tenant/{tenant}`: the tenant is placed (201 when it was new,
/// 200 when it was known already).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantRegistered {
    pub tenant_id: TenantShardId,
    /// Its generation in the state when answered; a new tenant's first
    /// attachment is issued the next one.
    pub generation: u32,
}

/// `DELETE /v1/tenant/{tenant}`: the tenant is deleted; the caller repeats
/// the call until `still_located_on` is empty.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantDeleted {
    pub tenant_id: TenantShardId,
    /// Online pageservers that still hold a location of it (or are being
    /// sent one): each is told to detach it, which removes its local files.
    pub still_located_on: Vec<String>,
    /// Pageservers not online (silent for the offline period, or lost):
    /// whether they hold it is unknown; one that comes back is told to
    /// detach it while its tombstone is kept.
    pub offline: Vec<String>,
}

/// `POST /v1/tenant/{tenant}/split`: split the tenant (its bare id) into
/// `shards` shards of `stripe_blocks` blocks (its stripe; the default for
/// an unsharded tenant). Answered with the recorded [`TenantSplit`] (202);
/// `GET` on the same path answers the newest split.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitRequest {
    pub shards: u8,
    pub stripe_blocks: u32,
}

/// `POST /v1/tenant/{tenant}/token`: the caller's own tenant token issued
/// again with a new expiry (the same claims and id), signed by the
/// controller's issuer key (`docs/security.md`, "Renewal").
/// Its debug output hides the token, as [`crate::Token`]'s does.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RenewedToken {
    pub token: crate::Token,
    /// When it expires, seconds since 1970.
    pub exp: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_DELETED_TENANTS, STATE_PLACEMENT_BYTES, STATE_SIZED_FOR_TENANTS, STATE_TOMBSTONE_BYTES};

    fn tenant(n: usize) -> TenantShardId {
        let mut id = [0xab; 16];
        id[..8].copy_from_slice(&(n as u64).to_be_bytes());
        TenantShardId::unsharded(crate::TenantId(id))
    }

    /// A placement as large as the state's size is planned for: names of
    /// 64 bytes, a move under way, and secondaries in three sites.
    fn large_placement(n: usize) -> TenantPlacement {
        let name = |i: usize| format!("{:-<64}", format!("pageserver{}", n * 7 + i));
        TenantPlacement {
            generation: u32::MAX,
            attached: Some(name(0)),
            secondaries: vec![name(1), name(2), name(3), name(4)],
            migration: Some(Migration { to: name(5) }),
        }
    }

    #[test]
    fn state_size_is_bounded() {
        // One entry of each kind, measured as written.
        let empty = ControllerState { format_version: STATE_FORMAT_VERSION, ..Default::default() };
        let base = empty.encode().len();
        let mut one = empty.clone();
        one.tenants.insert(tenant(1), large_placement(1));
        let placement = one.encode().len() - base;
        assert!(placement <= STATE_PLACEMENT_BYTES, "a placement takes {placement} bytes");
        let mut one = empty.clone();
        one.deleted_tenants.insert(tenant(1), DeletedTenant { generation: u32::MAX, version: u64::MAX });
        let tombstone = one.encode().len() - base;
        assert!(tombstone <= STATE_TOMBSTONE_BYTES, "a tombstone takes {tombstone} bytes");
        // The whole: every planned tenant and every tombstone still decodes.
        let mut full = empty;
        for n in 0..STATE_SIZED_FOR_TENANTS {
            full.tenants.insert(tenant(n), large_placement(n));
        }
        for n in 0..MAX_DELETED_TENANTS {
            let t = tenant(STATE_SIZED_FOR_TENANTS + n);
            full.deleted_tenants.insert(t, DeletedTenant { generation: u32::MAX, version: u64::MAX });
        }
        let bytes = full.encode();
        assert!(bytes.len() * 2 <= MAX_STATE_BYTES, "{} bytes", bytes.len());
        assert_eq!(ControllerState::decode(&bytes).unwrap(), full);
    }

    #[test]
    fn tombstones_are_optional_and_never_of_a_placed_tenant() {
        // A state written before tombstones existed reads as before, and one
        // without tombstones is written as before.
        let old = br#"{"format_version": 1, "version": 3, "leader_term": 2, "tenants": {}}"#;
        let s = ControllerState::decode(old).unwrap();
        assert!(s.deleted_tenants.is_empty());
        assert!(!String::from_utf8(s.encode()).unwrap().contains("deleted_tenants"));
        let mut both = s.clone();
        both.tenants.insert(tenant(1), TenantPlacement::default());
        both.deleted_tenants.insert(tenant(1), DeletedTenant::default());
        let e = ControllerState::decode(&both.encode()).unwrap_err();
        assert!(e.contains(&tenant(1).to_string()) && e.contains("deleted"), "{e}");
        both.tenants.clear();
        assert_eq!(ControllerState::decode(&both.encode()).unwrap(), both);
    }
}
