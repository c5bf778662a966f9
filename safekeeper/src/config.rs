//! Safekeeper configuration (`safekeeper.toml`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_protocol::NodeId;
use strata_service::config::{
    check_duration, check_exposure, check_open_files, check_range, load_toml, retention_seconds, seconds, ConfigError,
    ConfigLoadError, Protection,
};

use crate::limits;

/// A peer safekeeper (for peer recovery and the choice of the offloader).
pub use strata_protocol::api::safekeeper::Peer;

/// Everything a safekeeper process needs; written by `strata init`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafekeeperConfig {
    pub id: NodeId,
    /// Safekeeper protocol (proposers, consumers, peers).
    pub listen: SocketAddr,
    /// HTTP: status, timeline management, metrics.
    pub listen_http: SocketAddr,
    /// PostgreSQL's replication protocol, for stock tools such as pg_receivewal (off if unset).
    #[serde(default)]
    pub listen_pg: Option<SocketAddr>,
    /// Clear XLR_CHECK_CONSISTENCY in WAL sent over `listen_pg` even if the client does not ask.
    #[serde(default)]
    pub strip_consistency_for_replication: bool,
    pub data_dir: PathBuf,
    #[serde(default)]
    pub peers: Vec<Peer>,
    /// Tokens: the key that callers' tokens must be signed with, and this
    /// safekeeper's own (`docs/security.md`). Without it every call is
    /// accepted, which `strata init` never writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<strata_service::auth::AuthConfig>,
    /// TLS on the safekeeper protocol and the HTTP API, and to peers
    /// (`docs/security.md`); without it the listeners must be on loopback.
    /// The PostgreSQL-protocol service has no TLS yet and must be on
    /// loopback anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<strata_service::tls::TlsConfig>,
    /// fsync WAL and control files. Turning it off loses acknowledged WAL on a power failure.
    #[serde(default = "default_true")]
    pub fsync: bool,
    /// Longest silence on a proposer or consumer connection before it is closed.
    #[serde(default = "default_idle_timeout", with = "seconds")]
    pub idle_timeout: Duration,
    /// How long a pageserver of a superseded attachment generation is still
    /// fed once a newer one has streamed (long enough for a live move to
    /// switch the computes; see `fence`).
    #[serde(default = "default_stale_stream_grace", with = "seconds")]
    pub stale_stream_grace: Duration,
    /// Most WAL sent to a consumer in one message.
    #[serde(default = "default_max_send")]
    pub max_send_bytes: usize,
    /// Most connections on `listen` (proposers, consumers, peers) at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most connections on `listen_http` at once.
    #[serde(default = "default_max_http_connections")]
    pub max_http_connections: usize,
    /// Most connections on `listen_pg` at once.
    #[serde(default = "default_max_pg_connections")]
    pub max_pg_connections: usize,
    /// Longest a new connection may take to send its greeting (or startup packet).
    #[serde(default = "default_handshake_timeout", with = "seconds")]
    pub handshake_timeout: Duration,
    /// Object storage that completed WAL segments are offloaded to (none: no offload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<strata_remote_storage::RemoteStorageConfig>,
    /// The cluster's storage key file (mode 0600): with it, offloaded WAL is
    /// encrypted and refused unless authentic (`docs/security.md`,
    /// "Encryption at rest"). Needs `remote_storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_key: Option<PathBuf>,
    /// Longest committed WAL stays on the safekeepers' disks only: the
    /// committed part of a segment not yet complete is then offloaded as a
    /// partial segment (a compute that stops leaves its last segment so).
    #[serde(default = "default_partial_offload_after", with = "seconds")]
    pub partial_offload_after: Duration,
    /// How long offloaded WAL is kept in object storage (for restores from
    /// a base backup and for a pageserver rebuilt from an older index);
    /// older segments go once the pageserver's `remote_consistent_lsn` is
    /// past them.
    #[serde(default = "default_wal_archive_retention", with = "retention_seconds")]
    pub wal_archive_retention: Duration,
}

fn default_true() -> bool {
    true
}
fn default_idle_timeout() -> Duration {
    limits::DEFAULT_IDLE_TIMEOUT
}
fn default_stale_stream_grace() -> Duration {
    limits::DEFAULT_STALE_STREAM_GRACE
}
fn default_max_send() -> usize {
    limits::DEFAULT_MAX_SEND_BYTES
}
fn default_max_connections() -> usize {
    limits::DEFAULT_MAX_CONNECTIONS
}
fn default_max_http_connections() -> usize {
    limits::DEFAULT_MAX_HTTP_CONNECTIONS
}
fn default_max_pg_connections() -> usize {
    limits::DEFAULT_MAX_PG_CONNECTIONS
}
fn default_handshake_timeout() -> Duration {
    limits::DEFAULT_HANDSHAKE_TIMEOUT
}
fn default_partial_offload_after() -> Duration {
    limits::DEFAULT_PARTIAL_OFFLOAD_AFTER
}
fn default_wal_archive_retention() -> Duration {
    limits::DEFAULT_WAL_ARCHIVE_RETENTION
}

impl SafekeeperConfig {
    /// Reads and checks a TOML config file.
    pub fn load(path: &std::path::Path) -> Result<SafekeeperConfig, ConfigLoadError> {
        load_toml(path, SafekeeperConfig::validate)
    }

    /// Refuses values that would break the service, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("max_send_bytes", self.max_send_bytes, 1, limits::MAX_SEND_BYTES_LIMIT)?;
        check_duration("idle_timeout", self.idle_timeout)?;
        check_duration("handshake_timeout", self.handshake_timeout)?;
        check_duration("stale_stream_grace", self.stale_stream_grace)?;
        check_duration("partial_offload_after", self.partial_offload_after)?;
        check_duration("wal_archive_retention", self.wal_archive_retention)?;
        check_range("max_connections", self.max_connections, 1, limits::MAX_CONNECTIONS_LIMIT)?;
        check_range("max_http_connections", self.max_http_connections, 1, limits::MAX_CONNECTIONS_LIMIT)?;
        check_range("max_pg_connections", self.max_pg_connections, 1, limits::MAX_CONNECTIONS_LIMIT)?;
        let listeners = [("listen", self.listen), ("listen_http", self.listen_http)];
        for (i, (key, addr)) in listeners.iter().chain(self.listen_pg.map(|a| ("listen_pg", a)).iter()).enumerate() {
            for (other, other_addr) in listeners.iter().take(i) {
                if addr == other_addr && addr.port() != 0 {
                    return Err(ConfigError { key, message: format!("{addr} is also `{other}`") });
                }
            }
        }
        if self.remote_storage.is_none() && self.storage_key.is_some() {
            return Err(ConfigError {
                key: "storage_key",
                message: "needs `remote_storage`: it encrypts the WAL offloaded there".into(),
            });
        }
        if self.peers.iter().any(|p| p.id == self.id) {
            return Err(ConfigError { key: "peers", message: format!("lists this safekeeper's own id {}", self.id) });
        }
        let auth = self.auth.is_some();
        check_exposure("listen", self.listen, Protection { tls: self.tls.is_some(), auth })?;
        check_exposure("listen_http", self.listen_http, Protection { tls: self.tls.is_some(), auth })?;
        if let Some(addr) = self.listen_pg {
            check_exposure("listen_pg", addr, Protection { tls: self.tls.is_some(), auth })?;
        }
        Ok(())
    }

    /// Checks that the connection limits fit in the open-file limit `limit`
    /// (each listener may hold a few descriptors beyond its limit: the
    /// connection it is admitting and those it is refusing).
    pub fn check_open_files(&self, limit: u64) -> Result<(), ConfigError> {
        let mut uses =
            vec![("max_connections", self.max_connections), ("max_http_connections", self.max_http_connections)];
        if self.listen_pg.is_some() {
            uses.push(("max_pg_connections", self.max_pg_connections));
        }
        let listeners = uses.len() * strata_service::listener::DESCRIPTORS_BEYOND_LIMIT;
        check_open_files(&uses, limits::RESERVED_FILES + listeners, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let ok = "id = 1\nlisten = \"127.0.0.1:5454\"\nlisten_http = \"127.0.0.1:7676\"\ndata_dir = \"/tmp/x\"\n\
                  [[peers]]\nid = 2\naddress = \"127.0.0.1:5455\"\n";
        let c: SafekeeperConfig = toml::from_str(ok).unwrap();
        assert!(c.fsync);
        assert_eq!(c.peers.len(), 1);
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        // What `strata init` writes is read back (a week of retention included).
        let again: SafekeeperConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(again.wal_archive_retention, Duration::from_secs(7 * 24 * 3600));
        assert!(toml::from_str::<SafekeeperConfig>(&format!("bogus = 1\n{ok}")).is_err());
        assert!(toml::from_str::<SafekeeperConfig>("id = 1").is_err());
        c.validate().unwrap();
        assert_eq!(c.max_connections, 256);
        c.check_open_files(1024).unwrap();
        assert!(c.check_open_files(256).unwrap_err().to_string().starts_with("max_connections"));
    }

    #[test]
    fn values_that_break_the_service_are_refused_by_key() {
        let base = "id = 1\nlisten = \"127.0.0.1:5454\"\nlisten_http = \"127.0.0.1:7676\"\ndata_dir = \"/tmp/x\"\n";
        for (extra, key) in [
            ("idle_timeout = 0", "idle_timeout"),
            ("handshake_timeout = 0", "handshake_timeout"),
            ("partial_offload_after = 0", "partial_offload_after"),
            ("wal_archive_retention = 0", "wal_archive_retention"),
            ("max_connections = 0", "max_connections"),
            ("max_http_connections = 0", "max_http_connections"),
            ("max_pg_connections = 0", "max_pg_connections"),
            ("max_send_bytes = 0", "max_send_bytes"),
            ("listen_pg = \"127.0.0.1:7676\"", "listen_pg"),
            ("[[peers]]\nid = 1\naddress = \"x:1\"", "peers"),
        ] {
            let c: SafekeeperConfig = toml::from_str(&format!("{base}{extra}\n")).unwrap();
            let e = c.validate().unwrap_err();
            assert_eq!(e.key, key, "{extra}: {e}");
        }
    }
}
