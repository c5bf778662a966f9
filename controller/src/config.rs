//! Storage controller configuration (`controller.toml`), written by `strata init`.

use std::net::SocketAddr;
use std::time::Duration;

use strata_protocol::TenantShardId;
use strata_service::config::{
    check_duration, check_exposure, check_range, check_unique_names, load_toml, seconds, ConfigError, ConfigLoadError,
    Protection,
};

use crate::limits;

/// Everything a controller process needs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// Unique among the cluster's controllers: the leader's lease names it.
    pub id: u64,
    /// HTTP: status, where each tenant is attached, drain and fill, metrics.
    pub listen_http: SocketAddr,
    /// Where the state object and the leader's lease live (the cluster's
    /// object storage, shared with the pageservers).
    pub remote_storage: strata_remote_storage::RemoteStorageConfig,
    /// The pageservers it places tenants on, in order of preference.
    pub pageservers: Vec<PageserverRef>,
    /// The tenants it places.
    pub tenants: Vec<TenantShardId>,
    /// Tokens: callers' tokens are checked, and this controller's own is
    /// sent to the pageservers (`docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<strata_service::auth::AuthConfig>,
    /// The issuer's private key (PKCS#8 PEM, private to its owner), with
    /// which it renews the computes' tokens; without it, it renews none.
    /// Needs `auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_key: Option<std::path::PathBuf>,
    /// TLS on the listener, and to the pageservers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<strata_service::tls::TlsConfig>,
    /// How often every pageserver is asked for its status.
    #[serde(default = "default_heartbeat_interval", with = "seconds")]
    pub heartbeat_interval: Duration,
    /// A pageserver that has not answered for this long is offline: its
    /// attached tenants move to their secondaries.
    #[serde(default = "default_offline_after", with = "seconds")]
    pub offline_after: Duration,
    /// How long the leader's lease lasts without renewal; renewed four times within it.
    #[serde(default = "default_lease_ttl", with = "seconds")]
    pub lease_ttl: Duration,
    /// Most connections on `listen_http` at once (computes long-poll it).
    #[serde(default = "default_max_http_connections")]
    pub max_http_connections: usize,
    /// When the leader splits a tenant by itself (`docs/sharding.md`, "Size policy").
    #[serde(default)]
    pub split_policy: SplitPolicy,
}

/// `[split_policy]`: a tenant one of whose shards holds more than
/// `shard_bytes` of its own layers is split: an unsharded one into
/// `first_shards`, a sharded one into twice its shards, up to `max_shards`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitPolicy {
    /// 0: the leader splits nothing by itself.
    #[serde(default = "default_split_shard_bytes")]
    pub shard_bytes: u64,
    #[serde(default = "default_first_shards")]
    pub first_shards: u8,
    #[serde(default = "default_max_shards")]
    pub max_shards: u8,
    /// The stripe of an unsharded tenant's new shards (a sharded one keeps its own).
    #[serde(default = "default_split_stripe_blocks")]
    pub stripe_blocks: u32,
}

impl Default for SplitPolicy {
    fn default() -> SplitPolicy {
        SplitPolicy {
            shard_bytes: default_split_shard_bytes(),
            first_shards: default_first_shards(),
            max_shards: default_max_shards(),
            stripe_blocks: default_split_stripe_blocks(),
        }
    }
}

impl SplitPolicy {
    /// The shard count a tenant of `count` shards, its largest holding
    /// `largest` bytes of its own, is split into now, if any.
    pub fn next_count(&self, count: u8, largest: u64) -> Option<u8> {
        if self.shard_bytes == 0 || largest <= self.shard_bytes {
            return None;
        }
        let next = if count <= 1 { self.first_shards } else { count.checked_mul(2)? };
        (next > count && next <= self.max_shards).then_some(next)
    }
}

fn default_split_shard_bytes() -> u64 {
    limits::DEFAULT_SPLIT_SHARD_BYTES
}
fn default_first_shards() -> u8 {
    limits::DEFAULT_SPLIT_FIRST_SHARDS
}
fn default_max_shards() -> u8 {
    limits::DEFAULT_SPLIT_MAX_SHARDS
}
fn default_split_stripe_blocks() -> u32 {
    strata_protocol::shard::DEFAULT_STRIPE_BLOCKS
}

/// A pageserver the controller places tenants on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageserverRef {
    /// Its service name in the cluster.
    pub name: String,
    /// Its page service and HTTP API (`host:port`).
    pub pg: String,
    pub http: String,
    /// Its site (`docs/sites.md`): each other site's pageserver reads for
    /// that site's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

fn default_heartbeat_interval() -> Duration {
    limits::DEFAULT_HEARTBEAT_INTERVAL
}
fn default_offline_after() -> Duration {
    limits::DEFAULT_OFFLINE_AFTER
}
fn default_lease_ttl() -> Duration {
    limits::DEFAULT_LEASE_TTL
}
fn default_max_http_connections() -> usize {
    limits::DEFAULT_MAX_HTTP_CONNECTIONS
}

impl ControllerConfig {
    /// Reads and checks the file.
    pub fn load(path: &std::path::Path) -> Result<ControllerConfig, ConfigLoadError> {
        load_toml(path, ControllerConfig::validate)
    }

    /// Refuses values that would break the service, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_duration("heartbeat_interval", self.heartbeat_interval)?;
        check_duration("offline_after", self.offline_after)?;
        check_duration("lease_ttl", self.lease_ttl)?;
        check_range("max_http_connections", self.max_http_connections, 1, limits::MAX_HTTP_CONNECTIONS)?;
        let p = &self.split_policy;
        let max = u32::from(strata_protocol::shard::MAX_SHARDS);
        check_range("split_policy.first_shards", u32::from(p.first_shards), 2, max)?;
        check_range("split_policy.max_shards", u32::from(p.max_shards), u32::from(p.first_shards), max)?;
        if let Err(e) = strata_protocol::shard::ShardLayout::new(u32::from(p.first_shards), p.stripe_blocks) {
            return Err(ConfigError { key: "split_policy.stripe_blocks", message: e.to_string() });
        }
        if self.offline_after < self.heartbeat_interval * 2 {
            return Err(ConfigError {
                key: "offline_after",
                message: "must be at least two heartbeat intervals (one lost answer is not a failure)".into(),
            });
        }
        if self.pageservers.is_empty() {
            return Err(ConfigError { key: "pageservers", message: "none: there is nowhere to place tenants".into() });
        }
        check_unique_names("pageservers", self.pageservers.iter().map(|p| p.name.as_str()))?;
        if self.issuer_key.is_some() && self.auth.is_none() {
            return Err(ConfigError {
                key: "issuer_key",
                message: "renewing tokens needs [auth]: without it no caller's token is checked".into(),
            });
        }
        check_exposure(
            "listen_http",
            self.listen_http,
            Protection { tls: self.tls.is_some(), auth: self.auth.is_some() },
        )
    }

    /// A pageserver by name.
    pub fn pageserver(&self, name: &str) -> Option<&PageserverRef> {
        self.pageservers.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
id = 1
listen_http = "127.0.0.1:7000"
tenants = ["0f3c9e5a27d14b6c8e1f2a3b4c5d6e7f"]
[remote_storage]
type = "local"
path = "/tmp/r"
[[pageservers]]
name = "pageserver"
pg = "127.0.0.1:7001"
http = "127.0.0.1:7002"
"#;

    #[test]
    fn a_config_is_checked() {
        let c: ControllerConfig = toml::from_str(OK).unwrap();
        c.validate().unwrap();
        assert_eq!((c.heartbeat_interval, c.offline_after), (Duration::from_millis(500), Duration::from_secs(2)));
        for (extra, key) in [
            ("offline_after = 0.5\n", "offline_after"),
            ("heartbeat_interval = 0\n", "heartbeat_interval"),
            ("max_http_connections = 0\n", "max_http_connections"),
        ] {
            let c: ControllerConfig = toml::from_str(&format!("{extra}{OK}")).unwrap();
            assert_eq!(c.validate().unwrap_err().key, key, "{extra}");
        }
        let two = format!("{OK}[[pageservers]]\nname = \"pageserver\"\npg = \"a:1\"\nhttp = \"a:2\"\n");
        let c: ControllerConfig = toml::from_str(&two).unwrap();
        assert!(c.validate().unwrap_err().message.contains("same name"));
        let open: ControllerConfig = toml::from_str(&OK.replace("127.0.0.1:7000", "10.0.0.1:7000")).unwrap();
        assert_eq!(open.validate().unwrap_err().key, "listen_http");
        assert!(toml::from_str::<ControllerConfig>(&format!("bogus = 1\n{OK}")).is_err());
    }

    #[test]
    fn the_size_policy_splits_past_its_bytes_and_stops_at_its_most_shards() {
        let p = SplitPolicy { shard_bytes: 100, first_shards: 4, max_shards: 16, stripe_blocks: 8 };
        assert_eq!(p.next_count(1, 100), None, "at the limit: not over it");
        assert_eq!(p.next_count(1, 101), Some(4));
        assert_eq!(p.next_count(4, 500), Some(8));
        assert_eq!(p.next_count(8, 500), Some(16));
        assert_eq!(p.next_count(16, 500), None);
        assert_eq!(SplitPolicy { shard_bytes: 0, ..p.clone() }.next_count(1, u64::MAX), None);
        let text = format!("{OK}\n[split_policy]\nshard_bytes = 1000\nfirst_shards = 2\n");
        let c: ControllerConfig = toml::from_str(&text).unwrap();
        assert_eq!((c.split_policy.shard_bytes, c.split_policy.first_shards, c.split_policy.max_shards), (1000, 2, 16));
        c.validate().unwrap();
        let bad: ControllerConfig = toml::from_str(&format!("{OK}\n[split_policy]\nfirst_shards = 1\n")).unwrap();
        assert_eq!(bad.validate().unwrap_err().key, "split_policy.first_shards");
        let bad: ControllerConfig = toml::from_str(&format!("{OK}\n[split_policy]\nstripe_blocks = 7\n")).unwrap();
        assert_eq!(bad.validate().unwrap_err().key, "split_policy.stripe_blocks");
    }
}
