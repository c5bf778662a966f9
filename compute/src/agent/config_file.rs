//! The compute agent's configuration file (`agent.toml` in the endpoint's
//! directory): one serde type, written by the control plane at every
//! endpoint start and read by `strata compute start --config FILE`.
//!
//! Everything in it is plain data (addresses, paths, numbers); the files
//! it names (token, TLS, password) are read when the agent turns it into
//! its [`AgentConfig`], so that a missing or bad file is an error of the
//! start, with the file named. Unknown fields are refused: a typo must not
//! silently fall back to a default.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use strata_formats::Lsn;
use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantId, TimelineId};
use strata_service::auth::load_token;
use strata_service::tls::{ClientTls, ServerTls};

use super::config::{AgentConfig, ReplicaConfig};
use crate::limits::{MAX_LAZY_CACHE_MB, MAX_LAZY_FETCH_RETRY_SECS, MAX_SUSPEND_AFTER_SECS};

/// `agent.toml`: what one compute runs and where it finds everything.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    /// PostgreSQL's data directory; emptied and restored at every start.
    pub pgdata: PathBuf,
    /// PostgreSQL's TCP port (on 127.0.0.1, and on `pg_host_address`).
    pub pg_port: u16,
    /// The host's address: PostgreSQL listens there too, for clients of
    /// other hosts, over TLS only (needs `tls_cert`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_host_address: Option<IpAddr>,
    /// The safekeepers (host:port).
    pub safekeepers: Vec<String>,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The file with this compute's token (the tenant's), sent to the
    /// safekeepers and the pageserver (`docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The cluster CA's certificate: the safekeepers and the pageserver are
    /// reached over TLS and must present certificates it issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// The pageserver's HTTP API (host:port) at start.
    pub pageserver_http: String,
    /// The storage controllers' HTTP APIs: the compute follows the tenant
    /// when they move it (`docs/storage-controller.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controllers: Vec<String>,
    /// A replica's site: it reads that site's pageserver when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pageserver_site: Option<String>,
    /// Addresses the safekeepers' membership or a controller gives, and
    /// where this compute reaches them instead (routes, `docs/sites.md`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub address_map: BTreeMap<String, String>,
    /// Serve status (`/v1/status`) and Prometheus metrics (`/metrics`) here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    /// Most connections to the status server at once.
    #[serde(default = "default_http_max_connections")]
    pub http_max_connections: u16,
    /// Directory of the PostgreSQL binaries.
    #[serde(default = "default_pg_bin_dir")]
    pub pg_bin_dir: PathBuf,
    /// Operating-system user PostgreSQL runs as when the agent runs as root.
    #[serde(default = "default_pg_user")]
    pub pg_user: String,
    /// The role applications log in as over TCP: it owns the database
    /// `postgres` and is no superuser (`docs/security.md`, "Roles").
    #[serde(default = "default_app_role")]
    pub app_role: String,
    /// PostgreSQL's shared_buffers.
    #[serde(default = "default_shared_buffers")]
    pub shared_buffers: String,
    /// PostgreSQL 18's `io_method` (`sync`, `worker`, `io_uring`); absent:
    /// the major's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_method: Option<super::pgconf::IoMethod>,
    /// Log an image of every changed page, for the pageserver to check its
    /// native redo against.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_redo: bool,
    /// Hold commits back while WAL consumers lag more than this many MiB
    /// (0: never); bounds the pageserver's L0 layers too.
    #[serde(default = "default_max_consumer_lag_mb")]
    pub max_consumer_lag_mb: u64,
    /// How long the pageserver may take to ingest the WAL up to the start LSN.
    #[serde(default = "default_wait_timeout_secs")]
    pub wait_timeout_secs: u64,
    /// This many restarts of PostgreSQL within `crash_loop_window_secs`
    /// are reported as a crash loop (restarts go on, backed off).
    #[serde(default = "default_crash_loop_restarts")]
    pub crash_loop_restarts: u32,
    #[serde(default = "default_crash_loop_window_secs")]
    pub crash_loop_window_secs: u64,
    /// Longest pause between two restarts of PostgreSQL.
    #[serde(default = "default_restart_max_delay_secs")]
    pub restart_max_delay_secs: u64,
    /// A read-only compute at this LSN: a hot standby of the basebackup
    /// there, without safekeepers; the agent holds a lease on the LSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_at: Option<Lsn>,
    /// A replica: a hot standby streaming the branch's WAL (`docs/replicas.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<ReplicaFile>,
    /// A lazy compute: relation files through FUSE (`docs/lazy-compute.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy: Option<LazyFile>,
    /// A sharded tenant (`docs/sharding.md`): its layout and where each
    /// shard is served at start. Only lazy computes: no pageserver has
    /// every page for a restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardsFile>,
    /// The cluster's public key: callers of the status server must present
    /// a token signed by it (`docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_public_key: Option<PathBuf>,
    /// The file (mode 0600) with the password TCP clients log in with as
    /// `app_role` (SCRAM-SHA-256).
    pub password_file: PathBuf,
    /// The file (mode 0600) with the SCRAM verifier of that password that
    /// the role must have exactly (the proxy holds the same, `docs/proxy.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_verifier_file: Option<PathBuf>,
    /// This host's certificate and key: the status server and PostgreSQL
    /// speak TLS with them (both or neither).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Scale to zero: with no client connected for this many seconds, the
    /// compute stops and the agent exits with `exit::SUSPENDED` (`docs/compute.md`,
    /// "Suspend"); absent or 0: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_after_secs: Option<u64>,
}

/// `[replica]` of `agent.toml`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaFile {
    /// Its name (the endpoint's): its read floor's lease is held under it.
    pub name: String,
    /// The safekeepers' replication services (host:port).
    pub safekeeper_replication: Vec<String>,
    /// Start from a checkpoint record at or after this LSN (the writer's,
    /// just made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Lsn>,
    /// The replica's oldest snapshot holds back the writer's cleanup.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hot_standby_feedback: bool,
    /// Restarted at the newest WAL when it lags more than this many MiB (0: no bound).
    #[serde(default = "default_max_replica_lag_mb")]
    pub max_lag_mb: u64,
    /// ... or more than this many seconds (0: no bound).
    #[serde(default = "default_max_replica_lag_secs")]
    pub max_lag_secs: u64,
}

/// `[lazy]` of `agent.toml`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LazyFile {
    /// The pageserver's page service (host:port) blocks are fetched from.
    pub page_service: String,
    /// The local file cache: the most MiB of blocks it may fetch again.
    #[serde(default = "default_lazy_cache_mb")]
    pub cache_mb: u64,
    /// How long a read keeps trying an unreachable pageserver before the
    /// query fails with an I/O error (0: at once).
    #[serde(default = "default_lazy_fetch_retry_secs")]
    pub fetch_retry_secs: u64,
}

/// `[shards]` of `agent.toml`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardsFile {
    pub count: u8,
    pub stripe_blocks: u32,
    /// Each shard's page service (host:port), in shard order; shard 0's is
    /// `lazy.page_service`.
    pub page_services: Vec<String>,
    /// Each shard's pageserver HTTP API, in shard order; shard 0's is
    /// `pageserver_http`.
    pub pageservers_http: Vec<String>,
}

impl ReplicaFile {
    /// A replica with the default lag bounds, starting from the last checkpoint.
    pub fn new(name: String, safekeeper_replication: Vec<String>) -> ReplicaFile {
        ReplicaFile {
            name,
            safekeeper_replication,
            after: None,
            hot_standby_feedback: false,
            max_lag_mb: default_max_replica_lag_mb(),
            max_lag_secs: default_max_replica_lag_secs(),
        }
    }
}

impl LazyFile {
    /// A lazy compute with the default cache and retry window.
    pub fn new(page_service: String) -> LazyFile {
        LazyFile { page_service, cache_mb: default_lazy_cache_mb(), fetch_retry_secs: default_lazy_fetch_retry_secs() }
    }
}

fn default_http_max_connections() -> u16 {
    32
}
fn default_pg_bin_dir() -> PathBuf {
    PathBuf::from("/usr/lib/postgresql/15/bin")
}
fn default_pg_user() -> String {
    "postgres".into()
}
fn default_app_role() -> String {
    crate::agent::config::DEFAULT_APP_ROLE.into()
}
fn default_shared_buffers() -> String {
    "128MB".into()
}
fn default_max_consumer_lag_mb() -> u64 {
    1024
}
fn default_wait_timeout_secs() -> u64 {
    60
}
fn default_crash_loop_restarts() -> u32 {
    5
}
fn default_crash_loop_window_secs() -> u64 {
    300
}
fn default_restart_max_delay_secs() -> u64 {
    30
}
fn default_max_replica_lag_mb() -> u64 {
    1024
}
fn default_max_replica_lag_secs() -> u64 {
    crate::limits::DEFAULT_MAX_REPLICA_LAG_SECS
}
fn default_lazy_cache_mb() -> u64 {
    1024
}
fn default_lazy_fetch_retry_secs() -> u64 {
    crate::limits::LAZY_FETCH_RETRY_FOR.as_secs()
}

impl AgentFile {
    /// A file with every optional setting at its default.
    pub fn new(
        pgdata: PathBuf,
        pg_port: u16,
        safekeepers: Vec<String>,
        (tenant_id, timeline_id): (TenantId, TimelineId),
        pageserver_http: String,
        password_file: PathBuf,
    ) -> AgentFile {
        AgentFile {
            pgdata,
            pg_port,
            pg_host_address: None,
            safekeepers,
            tenant_id,
            timeline_id,
            token_file: None,
            tls_ca: None,
            pageserver_http,
            controllers: Vec::new(),
            pageserver_site: None,
            address_map: BTreeMap::new(),
            http: None,
            http_max_connections: default_http_max_connections(),
            pg_bin_dir: default_pg_bin_dir(),
            pg_user: default_pg_user(),
            app_role: default_app_role(),
            shared_buffers: default_shared_buffers(),
            io_method: None,
            verify_redo: false,
            max_consumer_lag_mb: default_max_consumer_lag_mb(),
            wait_timeout_secs: default_wait_timeout_secs(),
            crash_loop_restarts: default_crash_loop_restarts(),
            crash_loop_window_secs: default_crash_loop_window_secs(),
            restart_max_delay_secs: default_restart_max_delay_secs(),
            read_only_at: None,
            replica: None,
            lazy: None,
            shards: None,
            auth_public_key: None,
            password_file,
            password_verifier_file: None,
            tls_cert: None,
            tls_key: None,
            suspend_after_secs: None,
        }
    }

    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<AgentFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and checks the text of a file.
    pub fn parse(text: &str) -> Result<AgentFile, String> {
        let file: AgentFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.check()?;
        Ok(file)
    }

    /// The text of the file.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("an agent file serializes")
    }

    /// Refuses settings that cannot work together or are out of range.
    pub fn check(&self) -> Result<(), String> {
        if self.safekeepers.is_empty() && self.read_only_at.is_none() {
            return Err("safekeepers: at least one is needed (only a read-only compute has none)".into());
        }
        super::config::check_role_name(&self.app_role).map_err(|e| format!("app_role: {e}"))?;
        if self.app_role == super::config::SUPERUSER {
            return Err(format!("app_role: {:?} is the superuser, which stays with the agent", self.app_role));
        }
        if self.http_max_connections == 0 {
            return Err("http_max_connections must be at least 1".into());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("tls_cert and tls_key go together".into());
        }
        if self.pg_host_address.is_some() && self.tls_cert.is_none() {
            return Err("pg_host_address needs tls_cert: beyond loopback PostgreSQL speaks TLS only".into());
        }
        if let Some(replica) = &self.replica {
            if self.read_only_at.is_some() {
                return Err("a replica follows its branch: read_only_at does not apply".into());
            }
            if replica.safekeeper_replication.is_empty() {
                return Err("replica.safekeeper_replication: at least one is needed".into());
            }
        }
        if let Some(secs) = self.suspend_after_secs.filter(|s| *s > MAX_SUSPEND_AFTER_SECS) {
            return Err(format!("suspend_after_secs must be at most {MAX_SUSPEND_AFTER_SECS} (0: never), not {secs}"));
        }
        if let Some(lazy) = &self.lazy {
            if !(1..=MAX_LAZY_CACHE_MB).contains(&lazy.cache_mb) {
                return Err(format!("lazy.cache_mb must be between 1 and {MAX_LAZY_CACHE_MB}, not {}", lazy.cache_mb));
            }
            if lazy.fetch_retry_secs > MAX_LAZY_FETCH_RETRY_SECS {
                return Err(format!(
                    "lazy.fetch_retry_secs must be at most {MAX_LAZY_FETCH_RETRY_SECS}, not {}",
                    lazy.fetch_retry_secs
                ));
            }
        }
        if let Some(shards) = &self.shards {
            let layout =
                ShardLayout::new(shards.count.into(), shards.stripe_blocks).map_err(|e| format!("shards: {e}"))?;
            if !layout.is_sharded() {
                return Err("shards.count: a sharded tenant has at least 2 shards".into());
            }
            let n = usize::from(shards.count);
            if shards.page_services.len() != n || shards.pageservers_http.len() != n {
                return Err(format!("shards: page_services and pageservers_http name each of the {n} shards"));
            }
            // Without `[lazy]`, the compute writes its relation files from
            // the shards before PostgreSQL starts (`agent::materialize`).
            let lazy_elsewhere = self.lazy.as_ref().is_some_and(|l| l.page_service != shards.page_services[0]);
            if lazy_elsewhere || shards.pageservers_http[0] != self.pageserver_http {
                return Err("shards: shard 0 is served where lazy.page_service and pageserver_http say".into());
            }
        }
        Ok(())
    }

    /// The agent's configuration: the token and TLS files are read now.
    pub fn into_config(self) -> Result<AgentConfig, String> {
        self.check()?;
        let token = self.token_file.as_deref().map(load_token).transpose().map_err(|e| e.to_string())?;
        let tls_client = self.tls_ca.as_deref().map(ClientTls::load).transpose().map_err(|e| e.to_string())?;
        let tls_server = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls::load(cert, key).map_err(|e| e.to_string())?),
            _ => None,
        };
        let address_map: Vec<(String, String)> = self.address_map.into_iter().collect();
        let mut cfg = AgentConfig::new(
            self.pgdata,
            self.pg_port,
            self.safekeepers,
            self.tenant_id,
            self.timeline_id,
            self.pageserver_http,
            self.password_file,
        );
        cfg.controllers = self.controllers;
        cfg.pageserver_site = self.pageserver_site;
        cfg.pageserver.set_address_map(address_map.clone());
        cfg.address_map = address_map;
        cfg.http = self.http;
        cfg.http_max_connections = usize::from(self.http_max_connections);
        cfg.pg_bin_dir = self.pg_bin_dir;
        cfg.pg_user = self.pg_user;
        cfg.app_role = self.app_role;
        cfg.password_verifier_file = self.password_verifier_file;
        cfg.shared_buffers = self.shared_buffers;
        cfg.io_method = self.io_method;
        cfg.verify_redo = self.verify_redo;
        cfg.max_consumer_lag_bytes = (self.max_consumer_lag_mb > 0).then_some(self.max_consumer_lag_mb << 20);
        cfg.wait_timeout = Duration::from_secs(self.wait_timeout_secs);
        cfg.restart.crash_loop_restarts = self.crash_loop_restarts;
        cfg.restart.crash_loop_window = Duration::from_secs(self.crash_loop_window_secs);
        cfg.restart.max_delay = Duration::from_secs(self.restart_max_delay_secs);
        cfg.read_only_at = self.read_only_at;
        cfg.replica = self.replica.map(|r| ReplicaConfig {
            name: r.name,
            replication: r.safekeeper_replication,
            after: r.after,
            ca_file: self.tls_ca.clone(),
            hot_standby_feedback: r.hot_standby_feedback,
            max_lag_bytes: r.max_lag_mb << 20,
            max_lag: Duration::from_secs(r.max_lag_secs),
        });
        if let Some(shards) = self.shards {
            let layout = ShardLayout::new(shards.count.into(), shards.stripe_blocks).map_err(|e| e.to_string())?;
            cfg.set_shards(layout, shards.pageservers_http.into_iter().zip(shards.page_services).collect());
        }
        if let Some(lazy) = self.lazy {
            cfg.lazy_page_service = Some(lazy.page_service);
            cfg.lazy_cache_bytes = lazy.cache_mb << 20;
            cfg.lazy_fetch_retry = Duration::from_secs(lazy.fetch_retry_secs);
        }
        cfg.token = token;
        cfg.token_file = self.token_file;
        cfg.auth_public_key = self.auth_public_key;
        cfg.tls_client = tls_client;
        cfg.tls_server = tls_server;
        cfg.pg_tls_files = self.tls_cert.zip(self.tls_key);
        cfg.pg_host_address = self.pg_host_address;
        cfg.suspend_after = self.suspend_after_secs.filter(|s| *s > 0).map(Duration::from_secs);
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> AgentFile {
        AgentFile::new(
            "/w/endpoints/e/pgdata".into(),
            5432,
            vec!["127.0.0.1:7000".into()],
            (TenantId::generate(), TimelineId::generate()),
            "127.0.0.1:9898".into(),
            "/w/endpoints/e/password".into(),
        )
    }

    #[test]
    fn a_file_roundtrips_and_omitted_settings_take_their_defaults() {
        let mut file = minimal();
        file.lazy = Some(LazyFile { page_service: "127.0.0.1:6400".into(), cache_mb: 64, fetch_retry_secs: 3 });
        file.replica = Some(ReplicaFile {
            name: "r".into(),
            safekeeper_replication: vec!["127.0.0.1:7002".into()],
            after: Some(Lsn(0x016B_3748)),
            hot_standby_feedback: true,
            max_lag_mb: 8,
            max_lag_secs: 9,
        });
        file.address_map.insert("127.0.0.1:1".into(), "127.0.0.1:2".into());
        file.suspend_after_secs = Some(300);
        assert_eq!(AgentFile::parse(&file.to_toml()).unwrap(), file);
        assert_eq!(file.clone().into_config().unwrap().suspend_after, Some(Duration::from_secs(300)));
        // 0 is never, as is no setting.
        let never = AgentFile { suspend_after_secs: Some(0), ..minimal() };
        assert_eq!(AgentFile::parse(&never.to_toml()).unwrap().into_config().unwrap().suspend_after, None);

        let text = format!(
            "pgdata = \"/p\"\npg_port = 1\nsafekeepers = [\"a:1\"]\ntenant_id = \"{}\"\ntimeline_id = \"{}\"\n\
             pageserver_http = \"b:2\"\npassword_file = \"/pw\"\n[lazy]\npage_service = \"c:3\"\n",
            file.tenant_id, file.timeline_id
        );
        let parsed = AgentFile::parse(&text).unwrap();
        assert_eq!(parsed.shared_buffers, "128MB");
        assert_eq!(parsed.max_consumer_lag_mb, 1024);
        assert_eq!(parsed.lazy.as_ref().unwrap().cache_mb, 1024);
        assert_eq!(parsed.suspend_after_secs, None);
        let cfg = parsed.into_config().unwrap();
        assert_eq!(cfg.suspend_after, None);
        assert_eq!(cfg.lazy_page_service.as_deref(), Some("c:3"));
        assert_eq!(cfg.lazy_cache_bytes, 1 << 30);
        assert_eq!(cfg.restart.crash_loop_restarts, 5);
        assert_eq!(cfg.max_consumer_lag_bytes, Some(1 << 30));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let refused = |text: &str, why: &str| {
            let e = AgentFile::parse(text).unwrap_err();
            assert!(e.contains(why), "{e:?} should say {why:?}");
        };
        let refused_file = |f: AgentFile, why: &str| refused(&f.to_toml(), why);
        refused(&format!("{}\nshared_bufers = \"1GB\"\n", minimal().to_toml()), "unknown field");
        refused("pg_port = \"x\"", "pg_port");
        refused_file(AgentFile { tls_cert: Some("/c".into()), ..minimal() }, "tls_cert and tls_key go together");
        refused_file(AgentFile { pg_host_address: Some([10, 0, 0, 1].into()), ..minimal() }, "needs tls_cert");
        refused_file(AgentFile { http_max_connections: 0, ..minimal() }, "at least 1");
        refused_file(AgentFile { safekeepers: vec![], ..minimal() }, "safekeepers");
        let lazy =
            |cache_mb, fetch_retry_secs| Some(LazyFile { page_service: "x:1".into(), cache_mb, fetch_retry_secs });
        refused_file(AgentFile { lazy: lazy(0, 20), ..minimal() }, "lazy.cache_mb");
        refused_file(AgentFile { lazy: lazy(1, 3601), ..minimal() }, "fetch_retry_secs");
        let replica = |replication: Vec<String>| Some(ReplicaFile::new("r".into(), replication));
        refused_file(
            AgentFile { read_only_at: Some(Lsn(1)), replica: replica(vec!["a:1".into()]), ..minimal() },
            "read_only_at does not apply",
        );
        refused_file(AgentFile { replica: replica(vec![]), ..minimal() }, "at least one");
        refused_file(
            AgentFile { suspend_after_secs: Some(MAX_SUSPEND_AFTER_SECS + 1), ..minimal() },
            "suspend_after_secs must be at most",
        );
        // Role names go into SQL and pg_hba.conf unquoted: plain names only,
        // and never the superuser or one of PostgreSQL's own.
        for bad in ["", "App", "a b", "a\"b", "1app", "pg_monitor", &"a".repeat(64)] {
            refused_file(AgentFile { app_role: bad.into(), ..minimal() }, "app_role");
        }
        refused_file(AgentFile { app_role: "postgres".into(), ..minimal() }, "stays with the agent");
        assert!(AgentFile::parse(&AgentFile { app_role: "shop_owner2".into(), ..minimal() }.to_toml()).is_ok());
        // A read-only compute needs no safekeepers.
        assert!(AgentFile::parse(
            &AgentFile { safekeepers: vec![], read_only_at: Some(Lsn(1)), ..minimal() }.to_toml()
        )
        .is_ok());
        let missing_token = AgentFile { token_file: Some("/nonexistent/agent.token".into()), ..minimal() };
        assert!(missing_token.into_config().is_err(), "a token file that cannot be read fails the start");
    }
}
