//! Safekeeper configuration (`safekeeper.toml`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_protocol::NodeId;

/// A peer safekeeper (for peer recovery).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Peer {
    pub id: NodeId,
    /// Its protocol address (`host:port`).
    pub address: String,
}

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
    /// fsync WAL and control files. Turning it off loses acknowledged WAL on a power failure.
    #[serde(default = "default_true")]
    pub fsync: bool,
    /// Longest silence on a proposer or consumer connection before it is closed.
    #[serde(default = "default_idle_timeout", with = "seconds")]
    pub idle_timeout: Duration,
    /// Most WAL sent to a consumer in one message.
    #[serde(default = "default_max_send")]
    pub max_send_bytes: usize,
}

fn default_true() -> bool {
    true
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_max_send() -> usize {
    1 << 20
}

mod seconds {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = <f64 as serde::Deserialize>::deserialize(d)?;
        if !(0.0..=86_400.0).contains(&v) {
            return Err(serde::de::Error::custom("must be between 0 and 86400 seconds"));
        }
        Ok(Duration::from_secs_f64(v))
    }
}

impl SafekeeperConfig {
    /// Reads and checks a TOML config file.
    pub fn load(path: &std::path::Path) -> Result<SafekeeperConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: SafekeeperConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if config.max_send_bytes == 0 || config.max_send_bytes > 16 << 20 {
            return Err(format!("{}: max_send_bytes must be between 1 and 16 MiB", path.display()));
        }
        Ok(config)
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
        assert!(toml::from_str::<SafekeeperConfig>(&format!("bogus = 1\n{ok}")).is_err());
        assert!(toml::from_str::<SafekeeperConfig>("id = 1").is_err());
    }
}
