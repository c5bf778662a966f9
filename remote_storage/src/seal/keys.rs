//! The two levels of keys (`docs/security.md`, "Encryption at rest"): the
//! cluster's storage keys, in a file on the hosts of the services, and each
//! tenant's data keys, in the object store wrapped by a cluster key.

use std::collections::BTreeMap;
use std::path::Path;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use strata_protocol::TenantId;

/// Bytes of every key (AES-256).
pub const KEY_LEN: usize = 32;
/// Most cluster keys a key file holds (the newest and those still being
/// retired).
pub const MAX_CLUSTER_KEYS: usize = 8;
/// Most data keys one tenant's key object holds.
pub const MAX_DATA_KEYS: usize = 64;
/// Largest key file or key object read (far above what the limits above allow).
pub const MAX_KEY_BYTES: usize = 64 << 10;
/// Version of the wrapped data keys object.
pub const DATA_KEYS_VERSION: u32 = 1;
/// Bound into every wrapped data key: the purpose of the wrapping.
const WRAP_CONTEXT: &[u8] = b"strata data key v1";

/// A 256-bit key. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct DataKey([u8; KEY_LEN]);

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    /// The key's bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> DataKey {
        DataKey(bytes)
    }

    /// A new random key.
    pub fn random() -> DataKey {
        let mut k = [0u8; KEY_LEN];
        aws_lc_rs::rand::fill(&mut k).expect("the system's random source works");
        DataKey(k)
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

/// The cluster's storage keys, newest first: the newest wraps new data
/// keys, the others still unwrap the data keys they wrapped.
#[derive(Clone, Debug)]
pub struct ClusterKeys {
    keys: Vec<(u32, DataKey)>,
}

impl ClusterKeys {
    /// Parses a key file: one key a line, `<id> <64 hex digits>`, newest
    /// first; blank lines and lines starting with `#` are skipped. `what`
    /// names the file in errors (never a key's bytes).
    pub fn parse(text: &[u8], what: &str) -> Result<ClusterKeys, String> {
        if text.len() > MAX_KEY_BYTES {
            return Err(format!("{what}: larger than {MAX_KEY_BYTES} bytes"));
        }
        let text = std::str::from_utf8(text).map_err(|_| format!("{what}: not UTF-8 text"))?;
        let mut keys: Vec<(u32, DataKey)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("{what}: line {}: {why}", n + 1);
            let mut parts = line.split_whitespace();
            let (Some(id), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("expected `<id> <64 hex digits>`"));
            };
            let id: u32 = id.parse().ok().filter(|&i| i > 0).ok_or_else(|| bad("the id is not a number above 0"))?;
            let bytes = decode_hex::<KEY_LEN>(hex).ok_or_else(|| bad("the key is not 64 hex digits"))?;
            if keys.iter().any(|(k, _)| *k == id) {
                return Err(bad(&format!("key id {id} appears twice")));
            }
            if keys.len() == MAX_CLUSTER_KEYS {
                return Err(bad(&format!("more than {MAX_CLUSTER_KEYS} keys")));
            }
            keys.push((id, DataKey(bytes)));
        }
        if keys.is_empty() {
            return Err(format!("{what}: no key"));
        }
        Ok(ClusterKeys { keys })
    }

    /// Reads a key file, refusing one that group or others may access.
    pub fn load(path: &Path) -> Result<ClusterKeys, String> {
        let bytes = strata_service::auth::read_private(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ClusterKeys::parse(&bytes, &path.display().to_string())
    }

    /// The text of a new key file holding one random key, id 1.
    pub fn new_file_text() -> String {
        format!(
            "# Strata cluster storage keys, newest first: <id> <key in hex>.\n\
             # Keep this file private (mode 0600); see docs/security.md.\n1 {}\n",
            encode_hex(DataKey::random().bytes())
        )
    }

    /// The newest key and its id.
    pub fn newest(&self) -> (u32, &DataKey) {
        let (id, key) = &self.keys[0];
        (*id, key)
    }

    /// The key of id `id`, if the file holds it.
    pub fn get(&self, id: u32) -> Option<&DataKey> {
        self.keys.iter().find(|(k, _)| *k == id).map(|(_, key)| key)
    }

    /// The ids, newest first.
    pub fn ids(&self) -> Vec<u32> {
        self.keys.iter().map(|(id, _)| *id).collect()
    }
}

/// A tenant's data keys, unwrapped: the newest seals new objects.
#[derive(Clone, Debug, Default)]
pub struct TenantKeys {
    keys: BTreeMap<u32, DataKey>,
}

impl TenantKeys {
    /// The newest data key and its id.
    pub fn newest(&self) -> Option<(u32, &DataKey)> {
        self.keys.iter().next_back().map(|(id, k)| (*id, k))
    }

    /// The data key of id `id`.
    pub fn get(&self, id: u32) -> Option<&DataKey> {
        self.keys.get(&id)
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The object that holds a tenant's data keys, each wrapped by a cluster key.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataKeysObject {
    pub format_version: u32,
    pub tenant: TenantId,
    pub keys: Vec<WrappedKey>,
}

/// One data key, wrapped: AES-256-GCM under cluster key `cluster_key`,
/// with the tenant, the data key's id and the cluster key's id
/// authenticated alongside.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WrappedKey {
    pub id: u32,
    pub cluster_key: u32,
    /// 12 bytes, hex.
    pub nonce: String,
    /// The 32 key bytes sealed, then the 16-byte tag, hex.
    pub wrapped: String,
}

fn wrap_aad(tenant: TenantId, id: u32, cluster_key: u32) -> Vec<u8> {
    let mut a = WRAP_CONTEXT.to_vec();
    a.extend_from_slice(&tenant.0);
    a.extend_from_slice(&id.to_le_bytes());
    a.extend_from_slice(&cluster_key.to_le_bytes());
    a
}

impl WrappedKey {
    /// Wraps `key` (data key `id` of `tenant`) with the newest cluster key.
    pub fn wrap(cluster: &ClusterKeys, tenant: TenantId, id: u32, key: &DataKey) -> WrappedKey {
        let (cluster_key, ck) = cluster.newest();
        let mut n = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut n).expect("the system's random source works");
        let sealing = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, ck.bytes()).expect("a 32-byte key"));
        let mut buf = key.bytes().to_vec();
        sealing
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(n),
                Aad::from(&wrap_aad(tenant, id, cluster_key)[..]),
                &mut buf,
            )
            .expect("a key is far below AES-GCM's length limit");
        WrappedKey { id, cluster_key, nonce: encode_hex(&n), wrapped: encode_hex(&buf) }
    }

    /// Unwraps the key of `tenant`; an unknown cluster key or a failed
    /// authentication is an error naming the ids.
    pub fn unwrap_key(&self, cluster: &ClusterKeys, tenant: TenantId) -> Result<DataKey, String> {
        let ck = cluster.get(self.cluster_key).ok_or_else(|| {
            format!(
                "data key {} is wrapped by cluster key {}, which the storage key file does not hold (it holds {:?})",
                self.id,
                self.cluster_key,
                cluster.ids()
            )
        })?;
        let n = decode_hex::<NONCE_LEN>(&self.nonce).ok_or_else(|| format!("data key {}: bad nonce", self.id))?;
        let mut buf = decode_hex::<{ KEY_LEN + 16 }>(&self.wrapped)
            .ok_or_else(|| format!("data key {}: bad wrapped key", self.id))?;
        let opening = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, ck.bytes()).expect("a 32-byte key"));
        let plain = opening
            .open_in_place(
                Nonce::assume_unique_for_key(n),
                Aad::from(&wrap_aad(tenant, self.id, self.cluster_key)[..]),
                &mut buf,
            )
            .map_err(|_| {
                format!(
                    "data key {} fails authentication under cluster key {} (tampered, another tenant's, or another cluster's)",
                    self.id, self.cluster_key
                )
            })?;
        let mut k = [0u8; KEY_LEN];
        k.copy_from_slice(plain);
        Ok(DataKey(k))
    }
}

impl DataKeysObject {
    /// Decodes a key object and checks it belongs to `tenant`; keys are
    /// not unwrapped yet.
    pub fn decode(bytes: &[u8], tenant: TenantId) -> Result<DataKeysObject, String> {
        if bytes.len() > MAX_KEY_BYTES {
            return Err(format!("larger than {MAX_KEY_BYTES} bytes"));
        }
        let o: DataKeysObject = serde_json::from_slice(bytes).map_err(|e| format!("malformed data keys: {e}"))?;
        if o.format_version != DATA_KEYS_VERSION {
            return Err(format!("data keys format version {}, this build reads {DATA_KEYS_VERSION}", o.format_version));
        }
        if o.tenant != tenant {
            return Err(format!("the data keys of tenant {}, not {tenant}", o.tenant));
        }
        if o.keys.is_empty() || o.keys.len() > MAX_DATA_KEYS {
            return Err(format!("{} data keys, expected 1 to {MAX_DATA_KEYS}", o.keys.len()));
        }
        let mut ids: Vec<u32> = o.keys.iter().map(|k| k.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != o.keys.len() {
            return Err("a data key id appears twice".into());
        }
        Ok(o)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("plain data serializes")
    }

    /// Every data key, unwrapped.
    pub fn unwrap_all(&self, cluster: &ClusterKeys) -> Result<TenantKeys, String> {
        let mut keys = BTreeMap::new();
        for w in &self.keys {
            keys.insert(w.id, w.unwrap_key(cluster, self.tenant)?);
        }
        Ok(TenantKeys { keys })
    }

    /// Whether a key is wrapped by another cluster key than the newest.
    pub fn needs_rewrap(&self, cluster: &ClusterKeys) -> bool {
        let newest = cluster.newest().0;
        self.keys.iter().any(|k| k.cluster_key != newest)
    }

    /// The same keys, every one wrapped again by the newest cluster key.
    pub fn rewrapped(&self, cluster: &ClusterKeys) -> Result<DataKeysObject, String> {
        let unwrapped = self.unwrap_all(cluster)?;
        let keys = unwrapped.keys.iter().map(|(id, k)| WrappedKey::wrap(cluster, self.tenant, *id, k)).collect();
        Ok(DataKeysObject { keys, ..self.clone() })
    }

    /// A key object holding one new random key, id 1.
    pub fn first(cluster: &ClusterKeys, tenant: TenantId) -> DataKeysObject {
        let key = WrappedKey::wrap(cluster, tenant, 1, &DataKey::random());
        DataKeysObject { format_version: DATA_KEYS_VERSION, tenant, keys: vec![key] }
    }

    /// The same keys and a new random one (the newest), for rotation.
    pub fn with_new_key(&self, cluster: &ClusterKeys) -> Result<(DataKeysObject, u32), String> {
        if self.keys.len() >= MAX_DATA_KEYS {
            return Err(format!("already {MAX_DATA_KEYS} data keys: retire old ones first"));
        }
        let id = self.keys.iter().map(|k| k.id).max().unwrap_or(0).checked_add(1).ok_or("data key ids exhausted")?;
        let mut o = self.clone();
        o.keys.push(WrappedKey::wrap(cluster, self.tenant, id, &DataKey::random()));
        Ok((o, id))
    }
}

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex<const N: usize>(hex: &str) -> Option<[u8; N]> {
    if hex.len() != 2 * N || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
