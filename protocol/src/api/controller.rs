//! The storage controller: its state object in object storage and its HTTP
//! API (`docs/storage-controller.md`, `docs/openapi/controller.yaml`).
//!
//! The state object is read by the controllers (one leader writes it by
//! compare-and-swap) and by the pageservers, which check their generation
//! against it before they delete objects.

use std::collections::BTreeMap;

use crate::limits::MAX_STATE_BYTES;
use crate::TenantId;

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
    pub tenants: BTreeMap<TenantId, TenantPlacement>,
    /// Scheduling policy of each pageserver (by name) that is not active.
    #[serde(default)]
    pub pageservers: BTreeMap<String, PageserverPolicy>,
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
            if p.generation == 0 && p.attached.is_some() {
                return Err(format!("tenant {t}: attached under generation 0"));
            }
            if let Some(a) = &p.attached {
                if p.secondaries.contains(a) {
                    return Err(format!("tenant {t}: {a} is both attached and a secondary"));
                }
            }
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
    pub fn generation(&self, tenant: TenantId) -> Option<u32> {
        self.tenants.get(&tenant).map(|p| p.generation).filter(|g| *g > 0)
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
    pub tenant_id: TenantId,
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
