//! Pageserver configuration (`pageserver.toml`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_protocol::NodeId;

/// Everything a pageserver process needs; written by `strata init`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageserverConfig {
    pub id: NodeId,
    /// The page service: GetPage@LSN and friends (`docs/pageserver-protocol.md`).
    pub listen_pg: SocketAddr,
    /// HTTP: status, tenant bootstrap, basebackup, metrics.
    pub listen_http: SocketAddr,
    /// Tenants, timelines and their layer files live here.
    pub data_dir: PathBuf,
    /// Safekeeper protocol addresses (`host:port`) to stream WAL from.
    #[serde(default)]
    pub safekeepers: Vec<String>,
    /// Where `initdb` of the installed PostgreSQL is (tenant bootstrap).
    #[serde(default = "default_pg_bin_dir")]
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs `initdb` when the pageserver runs as root.
    #[serde(default = "default_pg_user")]
    pub pg_user: String,
    /// WAL bytes ingested into the in-memory layer before it is frozen and
    /// written to a delta layer file.
    #[serde(default = "default_checkpoint_distance")]
    pub checkpoint_distance: u64,
    /// Longest a request waits for WAL up to its LSN to be ingested.
    #[serde(default = "default_wait_lsn_timeout", with = "seconds")]
    pub wait_lsn_timeout: Duration,
    /// fsync layer files and metadata. Off only for tests.
    #[serde(default = "default_true")]
    pub fsync: bool,
}

fn default_pg_bin_dir() -> PathBuf {
    PathBuf::from("/usr/lib/postgresql/15/bin")
}
fn default_pg_user() -> String {
    "postgres".into()
}
fn default_checkpoint_distance() -> u64 {
    64 << 20
}
fn default_wait_lsn_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_true() -> bool {
    true
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

impl PageserverConfig {
    /// Reads and checks a TOML config file.
    pub fn load(path: &std::path::Path) -> Result<PageserverConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: PageserverConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !(1 << 20..=1 << 30).contains(&config.checkpoint_distance) {
            return Err(format!("{}: checkpoint_distance must be between 1 MiB and 1 GiB", path.display()));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_defaults_and_rejects_unknown_fields() {
        let ok = "id = 1\nlisten_pg = \"127.0.0.1:6400\"\nlisten_http = \"127.0.0.1:9898\"\n\
                  data_dir = \"/tmp/ps\"\nsafekeepers = [\"127.0.0.1:5454\"]\n";
        let c: PageserverConfig = toml::from_str(ok).unwrap();
        assert_eq!(c.checkpoint_distance, 64 << 20);
        assert_eq!(c.pg_user, "postgres");
        assert!(c.fsync);
        assert!(toml::from_str::<PageserverConfig>(&format!("bogus = 1\n{ok}")).is_err());
    }
}
