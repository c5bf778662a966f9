//! Pageserver configuration (`pageserver.toml`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_protocol::NodeId;

use crate::limits;
use strata_service::config::{
    check_duration, check_exposure, check_open_files, check_range, load_toml, seconds, ConfigError, ConfigLoadError,
    Protection,
};

/// The `wal_stream` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalStreamChoice {
    #[default]
    Auto,
    Decoded,
    Raw,
}

impl WalStreamChoice {
    /// Whether a timeline of a tenant so laid out streams decoded WAL.
    pub fn decoded(self, sharded: bool) -> bool {
        match self {
            WalStreamChoice::Auto => sharded,
            WalStreamChoice::Decoded => true,
            WalStreamChoice::Raw => false,
        }
    }
}

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
    /// HTTP addresses (`host:port`) of the safekeepers: a watcher reads
    /// their positions of every timeline at once (`GET /v1/positions`) to
    /// wake idle timelines when one has WAL for them. Without them no
    /// timeline goes idle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub safekeepers_http: Vec<String>,
    /// A timeline that receives no WAL for this long (seconds; 0: never)
    /// makes everything it ingested durable and ends its WAL stream and its
    /// threads until there is WAL for it or a read waits (`docs/pageserver.md`,
    /// "Idle timelines").
    #[serde(default = "default_idle_after", with = "seconds")]
    pub idle_after: Duration,
    /// How often the safekeepers' positions are read while a timeline
    /// idles (seconds).
    #[serde(default = "default_idle_poll_period", with = "seconds")]
    pub idle_poll_period: Duration,
    /// How many of `safekeepers`, from the first, are in this pageserver's
    /// own site (`docs/sites.md`): WAL streams from them while one answers
    /// and is not far behind, so it crosses the link between sites once.
    /// 0: no site preference.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub site_safekeepers: usize,
    /// Tokens: the key that callers' tokens must be signed with, and this
    /// pageserver's own (`docs/security.md`). Without it every call is
    /// accepted, which `strata init` never writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<strata_service::auth::AuthConfig>,
    /// TLS on both listeners (`docs/security.md`); without it they must be
    /// on loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<strata_service::tls::TlsConfig>,
    /// Where `initdb` of the installed PostgreSQL 15 is (tenant bootstrap).
    #[serde(default = "default_pg_bin_dir")]
    pub pg_bin_dir: PathBuf,
    /// Where other majors' programs are, by major; a major not listed is
    /// looked for in `/usr/lib/postgresql/<major>/bin` (Debian's layout).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pg_bin_dirs: std::collections::BTreeMap<u32, PathBuf>,
    /// Where the kept output of `initdb` that new tenants are imported from
    /// lives (`pageserver/src/initdb_template.rs`); default
    /// `<data_dir>/initdb-template`. Pageservers of one machine may share one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_template_dir: Option<PathBuf>,
    /// The most file data one `strata tenant import` may send
    /// (`docs/import.md`); the import also needs that much free disk.
    #[serde(default = "default_import_max_bytes")]
    pub import_max_bytes: u64,
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
    /// Most page service connections at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most page service connections one tenant (the tenant its hello
    /// names) may hold at once, so that one tenant cannot take every place
    /// of `max_connections`; at most `max_connections`. Unset: a quarter of
    /// `max_connections`, at least 4 ([`PageserverConfig::connections_per_tenant`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_tenant: Option<usize>,
    /// Most connections on `listen_http` at once.
    #[serde(default = "default_max_http_connections")]
    pub max_http_connections: usize,
    /// Longest a new page service connection may take to send its hello.
    #[serde(default = "default_handshake_timeout", with = "seconds")]
    pub handshake_timeout: Duration,
    /// Most layer files open at once (a cache of descriptors shared by all timelines).
    #[serde(default = "default_max_open_layer_files")]
    pub max_open_layer_files: usize,
    /// Compare native redo with the images computes log when they run with
    /// `wal_consistency_checking = 'all'` (a verification mode for tests;
    /// mismatches are counted, logged and shown in the timeline's status).
    #[serde(default)]
    pub verify_redo: bool,
    /// How timelines ask the safekeepers for WAL: `decoded` (records
    /// decoded once on the safekeepers and routed per shard, compressed),
    /// `raw` (the WAL's bytes), or `auto`: decoded for sharded tenants and
    /// raw for the rest, which measured cheaper in CPU (`docs/sharding.md`).
    #[serde(default)]
    pub wal_stream: WalStreamChoice,
    /// L0 deltas (one per flush) that start a compaction into L1 deltas.
    #[serde(default = "default_compaction_threshold")]
    pub compaction_threshold: usize,
    /// Size at which compaction and image creation start a new file (at the next key).
    #[serde(default = "default_compaction_target_size")]
    pub compaction_target_size: u64,
    /// L1 delta runs above the newest image that start an image creation.
    #[serde(default = "default_image_creation_threshold")]
    pub image_creation_threshold: usize,
    /// L0 deltas at which ingest is slowed until compaction catches up.
    #[serde(default = "default_l0_backpressure_threshold")]
    pub l0_backpressure_threshold: usize,
    /// Bytes of fresh pages (initialized or imaged in the flush) of one
    /// relation fork from which a flush writes them as their own deltas,
    /// which compaction does not rewrite (0: every flush is one L0).
    #[serde(default = "default_fresh_page_min_bytes")]
    pub fresh_page_min_bytes: u64,
    /// Bytes per second compaction and image creation may read (0: no limit).
    #[serde(default = "default_compaction_max_bytes_per_second")]
    pub compaction_max_bytes_per_second: u64,
    /// How often each timeline is checked for compaction and image creation.
    #[serde(default = "default_compaction_period", with = "seconds")]
    pub compaction_period: Duration,
    /// Pages stay readable at any LSN committed within this long (seconds; 0: none kept).
    #[serde(default = "default_pitr_interval", with = "strata_service::config::retention_seconds")]
    pub pitr_interval: Duration,
    /// ... and within this many bytes of WAL behind the newest durable LSN.
    #[serde(default = "default_gc_horizon")]
    pub gc_horizon: u64,
    /// How often each timeline is garbage collected.
    #[serde(default = "default_gc_period", with = "seconds")]
    pub gc_period: Duration,
    /// Object storage, the truth of every layer (`docs/bottomless-pageserver.md`);
    /// without it layers live on local disk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<strata_remote_storage::RemoteStorageConfig>,
    /// The cluster's storage key file (mode 0600): with it, tenants' objects
    /// are encrypted in `remote_storage` and refused unless authentic
    /// (`docs/security.md`, "Encryption at rest"). Needs `remote_storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_key: Option<PathBuf>,
    /// The file in which the control plane names each attached tenant's
    /// generation (required with `remote_storage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<PathBuf>,
    /// A storage controller places tenants here (`docs/storage-controller.md`):
    /// it sets each location through the API, this pageserver records them
    /// in `attachments`, and generations are checked against the
    /// controller's state object in `remote_storage`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub controller: bool,
    /// Warm layer bytes the secondary locations of this pageserver hold
    /// together (split equally among its secondary tenants).
    #[serde(default = "default_secondary_cache_bytes")]
    pub secondary_cache_bytes: u64,
    /// How often an attached location publishes its heatmap, and a
    /// secondary reads it.
    #[serde(default = "default_heatmap_period", with = "seconds")]
    pub heatmap_period: std::time::Duration,
    /// Local bytes of layer files above which uploaded layers read longest
    /// ago are evicted (0: no limit). Needs `remote_storage`.
    #[serde(default)]
    pub local_cache_bytes: u64,
    /// Memory that layers keep of their files (index summaries, key
    /// filters), all timelines together: above it, the layers read longest
    /// ago drop theirs and their next read opens the file again.
    #[serde(default = "default_layer_index_cache_bytes")]
    pub layer_index_cache_bytes: u64,
    /// Bytes of layer files not yet in object storage above which ingest
    /// is slowed (the applied LSN reported stops at the uploaded one).
    #[serde(default = "default_max_upload_lag_bytes")]
    pub max_upload_lag_bytes: u64,
    /// A replica's lease more than this many bytes behind the ingested WAL
    /// is refused, and its agent restarts it at the newest WAL (0: no bound).
    #[serde(default = "default_max_replica_lag_bytes")]
    pub max_replica_lag_bytes: u64,
}

fn default_secondary_cache_bytes() -> u64 {
    limits::DEFAULT_SECONDARY_CACHE_BYTES
}
fn default_heatmap_period() -> Duration {
    limits::DEFAULT_HEATMAP_PERIOD
}
fn default_pg_bin_dir() -> PathBuf {
    PathBuf::from("/usr/lib/postgresql/15/bin")
}
fn default_pg_user() -> String {
    "postgres".into()
}
fn default_checkpoint_distance() -> u64 {
    limits::DEFAULT_CHECKPOINT_DISTANCE
}
fn default_idle_after() -> Duration {
    limits::DEFAULT_IDLE_AFTER
}
fn default_idle_poll_period() -> Duration {
    limits::DEFAULT_IDLE_POLL_PERIOD
}
fn default_wait_lsn_timeout() -> Duration {
    limits::DEFAULT_WAIT_LSN_TIMEOUT
}
fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn default_true() -> bool {
    true
}
fn default_import_max_bytes() -> u64 {
    limits::DEFAULT_IMPORT_MAX_BYTES
}
fn default_max_connections() -> usize {
    limits::DEFAULT_MAX_CONNECTIONS
}
fn default_max_http_connections() -> usize {
    limits::DEFAULT_MAX_HTTP_CONNECTIONS
}
fn default_handshake_timeout() -> Duration {
    limits::DEFAULT_HANDSHAKE_TIMEOUT
}
fn default_max_open_layer_files() -> usize {
    limits::DEFAULT_MAX_OPEN_LAYER_FILES
}
fn default_compaction_threshold() -> usize {
    limits::DEFAULT_COMPACTION_THRESHOLD
}
fn default_compaction_target_size() -> u64 {
    limits::DEFAULT_COMPACTION_TARGET_SIZE
}
fn default_fresh_page_min_bytes() -> u64 {
    limits::DEFAULT_FRESH_PAGE_MIN_BYTES
}
fn default_image_creation_threshold() -> usize {
    limits::DEFAULT_IMAGE_CREATION_THRESHOLD
}
fn default_l0_backpressure_threshold() -> usize {
    limits::DEFAULT_L0_BACKPRESSURE_THRESHOLD
}
fn default_compaction_max_bytes_per_second() -> u64 {
    limits::DEFAULT_COMPACTION_MAX_BYTES_PER_SECOND
}
fn default_compaction_period() -> Duration {
    limits::DEFAULT_COMPACTION_PERIOD
}
fn default_pitr_interval() -> Duration {
    limits::DEFAULT_PITR_INTERVAL
}
fn default_gc_horizon() -> u64 {
    limits::DEFAULT_GC_HORIZON
}
fn default_gc_period() -> Duration {
    limits::DEFAULT_GC_PERIOD
}
fn default_layer_index_cache_bytes() -> u64 {
    limits::DEFAULT_LAYER_INDEX_CACHE_BYTES
}
fn default_max_upload_lag_bytes() -> u64 {
    limits::DEFAULT_MAX_UPLOAD_LAG_BYTES
}
fn default_max_replica_lag_bytes() -> u64 {
    limits::DEFAULT_MAX_REPLICA_LAG_BYTES
}

/// Descriptors kept for everything but client connections and layer files.
pub use crate::limits::RESERVED_FILES;

impl PageserverConfig {
    /// The directory of PostgreSQL `version`'s programs.
    pub fn bin_dir(&self, version: strata_formats::PgVersion) -> PathBuf {
        match (self.pg_bin_dirs.get(&version.major()), version) {
            (Some(dir), _) => dir.clone(),
            (None, strata_formats::PgVersion::V15) => self.pg_bin_dir.clone(),
            (None, v) => PathBuf::from(format!("/usr/lib/postgresql/{}/bin", v.major())),
        }
    }

    /// Reads and checks a TOML config file.
    pub fn load(path: &std::path::Path) -> Result<PageserverConfig, ConfigLoadError> {
        load_toml(path, PageserverConfig::validate)
    }

    /// Refuses values that would break the service, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (min, max) = limits::CHECKPOINT_DISTANCE_RANGE;
        check_range("checkpoint_distance", self.checkpoint_distance, min, max)?;
        check_duration("wait_lsn_timeout", self.wait_lsn_timeout)?;
        if !self.idle_after.is_zero() && self.idle_after < limits::MIN_IDLE_AFTER {
            return Err(ConfigError {
                key: "idle_after",
                message: format!(
                    "must be 0 (never idle) or at least {:?}: the safekeepers are told what is durable first",
                    limits::MIN_IDLE_AFTER
                ),
            });
        }
        check_duration("idle_poll_period", self.idle_poll_period)?;
        check_duration("handshake_timeout", self.handshake_timeout)?;
        let (min, max) = limits::CONNECTIONS_RANGE;
        check_range("max_connections", self.max_connections, min, max)?;
        check_range("max_http_connections", self.max_http_connections, min, max)?;
        if let Some(per_tenant) = self.max_connections_per_tenant {
            check_range("max_connections_per_tenant", per_tenant, min, max)?;
            if per_tenant > self.max_connections {
                return Err(ConfigError {
                    key: "max_connections_per_tenant",
                    message: format!(
                        "{per_tenant} is more than `max_connections` ({}): a tenant can never hold more than all",
                        self.max_connections
                    ),
                });
            }
        }
        let (min, max) = limits::OPEN_LAYER_FILES_RANGE;
        check_range("max_open_layer_files", self.max_open_layer_files, min, max)?;
        let (min, max) = limits::COMPACTION_THRESHOLD_RANGE;
        check_range("compaction_threshold", self.compaction_threshold, min, max)?;
        let (min, max) = limits::COMPACTION_TARGET_SIZE_RANGE;
        check_range("compaction_target_size", self.compaction_target_size, min, max)?;
        let (min, max) = limits::IMAGE_CREATION_THRESHOLD_RANGE;
        check_range("image_creation_threshold", self.image_creation_threshold, min, max)?;
        let max = limits::MAX_L0_BACKPRESSURE_THRESHOLD;
        check_range("l0_backpressure_threshold", self.l0_backpressure_threshold, self.compaction_threshold, max)?;
        check_duration("compaction_period", self.compaction_period)?;
        check_duration("gc_period", self.gc_period)?;
        check_duration("heatmap_period", self.heatmap_period)?;
        if self.remote_storage.is_some() && self.attachments.is_none() {
            return Err(ConfigError {
                key: "attachments",
                message: "is required with `remote_storage`: it names each tenant's generation".into(),
            });
        }
        if self.remote_storage.is_none() && self.storage_key.is_some() {
            return Err(ConfigError {
                key: "storage_key",
                message: "needs `remote_storage`: it encrypts the objects stored there".into(),
            });
        }
        if self.layer_index_cache_bytes < limits::MIN_LAYER_INDEX_CACHE_BYTES {
            return Err(ConfigError {
                key: "layer_index_cache_bytes",
                message: format!(
                    "{} is below the smallest accepted, {} (64 KiB)",
                    self.layer_index_cache_bytes,
                    limits::MIN_LAYER_INDEX_CACHE_BYTES
                ),
            });
        }
        if self.remote_storage.is_none() && self.local_cache_bytes != 0 {
            return Err(ConfigError {
                key: "local_cache_bytes",
                message: "needs `remote_storage`: an evicted layer is downloaded from there".into(),
            });
        }
        check_range("max_upload_lag_bytes", self.max_upload_lag_bytes, limits::MIN_UPLOAD_LAG_BYTES, u64::MAX)?;
        if self.listen_pg == self.listen_http && self.listen_pg.port() != 0 {
            return Err(ConfigError {
                key: "listen_http",
                message: format!("{} is also `listen_pg`", self.listen_http),
            });
        }
        if self.site_safekeepers > self.safekeepers.len() {
            return Err(ConfigError {
                key: "site_safekeepers",
                message: format!(
                    "{} is more than the {} safekeepers listed",
                    self.site_safekeepers,
                    self.safekeepers.len()
                ),
            });
        }
        if let Some(bad) = self.safekeepers.iter().find(|a| !a.contains(':')) {
            return Err(ConfigError { key: "safekeepers", message: format!("{bad:?} is not host:port") });
        }
        let protection = Protection { tls: self.tls.is_some(), auth: self.auth.is_some() };
        check_exposure("listen_pg", self.listen_pg, protection)?;
        check_exposure("listen_http", self.listen_http, protection)?;
        Ok(())
    }

    /// The page service connections one tenant may hold at once:
    /// `max_connections_per_tenant`, or by default a share of `max_connections`.
    pub fn connections_per_tenant(&self) -> usize {
        self.max_connections_per_tenant.unwrap_or_else(|| limits::default_connections_per_tenant(self.max_connections))
    }

    /// How long a timeline receives no WAL before it goes idle; none when
    /// timelines never do (`idle_after = 0`, or no `safekeepers_http` to
    /// learn from when to wake them).
    pub fn idle_after(&self) -> Option<std::time::Duration> {
        (!self.idle_after.is_zero() && !self.safekeepers_http.is_empty()).then_some(self.idle_after)
    }

    /// When timelines compact and create images.
    pub fn layer_policy(&self) -> crate::timeline::LayerPolicy {
        crate::timeline::LayerPolicy {
            compaction_threshold: self.compaction_threshold,
            compaction_target_size: self.compaction_target_size,
            image_creation_threshold: self.image_creation_threshold,
            l0_backpressure_threshold: self.l0_backpressure_threshold,
            fresh_page_min_bytes: self.fresh_page_min_bytes,
        }
    }

    /// How much history timelines keep.
    pub fn gc_policy(&self) -> crate::timeline::GcPolicy {
        crate::timeline::GcPolicy { pitr_interval: self.pitr_interval, gc_horizon: self.gc_horizon }
    }

    /// Checks that the connection limits and open layer files fit in the
    /// open-file limit `limit` (each of the two listeners may hold a few
    /// descriptors beyond its limit: the connection it is admitting and those
    /// it is refusing).
    pub fn check_open_files(&self, limit: u64) -> Result<(), ConfigError> {
        check_open_files(
            &[
                ("max_connections", self.max_connections),
                ("max_http_connections", self.max_http_connections),
                ("max_open_layer_files", self.max_open_layer_files),
            ],
            RESERVED_FILES + 2 * strata_service::listener::DESCRIPTORS_BEYOND_LIMIT,
            limit,
        )
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
        assert_eq!(c.idle_after, Duration::from_secs(30));
        assert_eq!(c.idle_after(), None, "no safekeeper to learn from when to wake");
        let c2: PageserverConfig =
            toml::from_str(&format!("{ok}safekeepers_http = [\"127.0.0.1:7676\"]\nidle_after = 2\n")).unwrap();
        assert_eq!(c2.idle_after(), Some(Duration::from_secs(2)));
        c2.validate().unwrap();
        let p = c.layer_policy();
        assert_eq!((p.compaction_threshold, p.image_creation_threshold, p.l0_backpressure_threshold), (10, 3, 30));
        assert!(toml::from_str::<PageserverConfig>(&format!("bogus = 1\n{ok}")).is_err());
        c.validate().unwrap();
        c.check_open_files(1024).unwrap();
        assert_eq!(c.check_open_files(512).unwrap_err().key, "max_connections");
        for (extra, key) in [
            ("wait_lsn_timeout = 0", "wait_lsn_timeout"),
            ("handshake_timeout = 0", "handshake_timeout"),
            ("max_connections = 0", "max_connections"),
            ("max_http_connections = 0", "max_http_connections"),
            ("max_open_layer_files = 0", "max_open_layer_files"),
            ("checkpoint_distance = 0", "checkpoint_distance"),
            ("compaction_threshold = 1", "compaction_threshold"),
            ("compaction_target_size = 10", "compaction_target_size"),
            ("image_creation_threshold = 0", "image_creation_threshold"),
            ("l0_backpressure_threshold = 5", "l0_backpressure_threshold"),
            ("compaction_period = 0", "compaction_period"),
            ("idle_after = 0.5", "idle_after"),
            ("idle_poll_period = 0", "idle_poll_period"),
            ("local_cache_bytes = 1000000", "local_cache_bytes"),
            ("layer_index_cache_bytes = 1000", "layer_index_cache_bytes"),
            ("max_upload_lag_bytes = 10", "max_upload_lag_bytes"),
            ("[remote_storage]\ntype = 'local'\npath = '/tmp/r'", "attachments"),
        ] {
            let c: PageserverConfig = toml::from_str(&format!("{ok}{extra}\n")).unwrap();
            assert_eq!(c.validate().unwrap_err().key, key, "{extra}");
        }
        let c: PageserverConfig = toml::from_str(&ok.replace("9898", "6400")).unwrap();
        assert_eq!(c.validate().unwrap_err().key, "listen_http");
    }

    fn with(extra: &str) -> PageserverConfig {
        let ok = "id = 1\nlisten_pg = \"127.0.0.1:6400\"\nlisten_http = \"127.0.0.1:9898\"\n\
                  data_dir = \"/tmp/ps\"\n";
        toml::from_str(&format!("{ok}{extra}\n")).unwrap()
    }

    #[test]
    fn connections_per_tenant_default_to_a_share_and_stay_within_max_connections() {
        // Unset: a quarter of max_connections, at least 4, at most all of them.
        for (max, per_tenant) in [(256, 64), (100, 25), (16, 4), (8, 4), (4, 4), (3, 3), (1, 1)] {
            let c = with(&format!("max_connections = {max}"));
            c.validate().unwrap();
            assert_eq!(c.connections_per_tenant(), per_tenant, "max_connections = {max}");
        }
        assert_eq!(with("").connections_per_tenant(), limits::DEFAULT_MAX_CONNECTIONS_PER_TENANT);
        // Left out of a written config when unset.
        assert!(!toml::to_string(&with("")).unwrap().contains("max_connections_per_tenant"));

        let c = with("max_connections = 10\nmax_connections_per_tenant = 10");
        c.validate().unwrap();
        assert_eq!(c.connections_per_tenant(), 10);
        let c = with("max_connections_per_tenant = 1");
        c.validate().unwrap();
        assert_eq!(c.connections_per_tenant(), 1);
        assert!(toml::to_string(&c).unwrap().contains("max_connections_per_tenant = 1"));

        for extra in [
            "max_connections_per_tenant = 0",
            "max_connections = 10\nmax_connections_per_tenant = 11",
            "max_connections_per_tenant = 257",
            "max_connections = 100000\nmax_connections_per_tenant = 100001",
        ] {
            let err = with(extra).validate().unwrap_err();
            assert_eq!(err.key, "max_connections_per_tenant", "{extra}");
        }
        let err = with("max_connections = 10\nmax_connections_per_tenant = 11").validate().unwrap_err();
        assert!(err.message.contains("max_connections") && err.message.contains("11"), "{}", err.message);
    }
}
