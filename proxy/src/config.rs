//! The proxy's configuration (`proxy/proxy.toml`, written by `strata init`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_service::config::{check_duration, check_exposure, check_range, load_toml, seconds, ConfigError};
use strata_service::config::{ConfigLoadError, Protection};

use crate::limits;

/// Everything a proxy process needs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// The PostgreSQL address of every endpoint.
    pub listen_pg: SocketAddr,
    /// HTTP: status and metrics.
    pub listen_http: SocketAddr,
    /// Server names `<endpoint>.<domain>` name an endpoint by their first label.
    pub domain: String,
    /// The cluster's workdir: where the proxy finds endpoints and wakes them.
    pub workdir: PathBuf,
    /// The certificate clients see (for `*.<domain>`); without it the
    /// proxy speaks plaintext only, which is for loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_tls: Option<PgTls>,
    /// Refuse clients that do not ask for TLS.
    #[serde(default = "yes")]
    pub require_tls: bool,
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    #[serde(default = "default_max_connections_per_tenant")]
    pub max_connections_per_tenant: usize,
    #[serde(default = "default_startup_timeout", with = "seconds")]
    pub startup_timeout: Duration,
    #[serde(default = "default_auth_timeout", with = "seconds")]
    pub auth_timeout: Duration,
    #[serde(default = "default_wake_timeout", with = "seconds")]
    pub wake_timeout: Duration,
    #[serde(default = "default_compute_timeout", with = "seconds")]
    pub compute_timeout: Duration,
    /// Tokens on the HTTP API (`docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<strata_service::auth::AuthConfig>,
    /// TLS of the HTTP API, and the CA the computes' certificates are
    /// checked against (connections to computes use TLS when it is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<strata_service::tls::TlsConfig>,
}

/// The certificate and key clients are served.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgTls {
    pub cert: PathBuf,
    /// Private to its owner (else refused).
    pub key: PathBuf,
}

fn yes() -> bool {
    true
}
fn default_max_connections() -> usize {
    limits::DEFAULT_MAX_CONNECTIONS
}
fn default_max_connections_per_tenant() -> usize {
    limits::DEFAULT_MAX_CONNECTIONS_PER_TENANT
}
fn default_startup_timeout() -> Duration {
    limits::DEFAULT_STARTUP_TIMEOUT
}
fn default_auth_timeout() -> Duration {
    limits::DEFAULT_AUTH_TIMEOUT
}
fn default_wake_timeout() -> Duration {
    limits::DEFAULT_WAKE_TIMEOUT
}
fn default_compute_timeout() -> Duration {
    limits::DEFAULT_COMPUTE_TIMEOUT
}

impl ProxyConfig {
    /// Reads and checks the file.
    pub fn load(path: &std::path::Path) -> Result<ProxyConfig, ConfigLoadError> {
        load_toml(path, ProxyConfig::validate)
    }

    /// Refuses values that would break the service, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("max_connections", self.max_connections, 1, limits::MAX_CONNECTIONS)?;
        check_range("max_connections_per_tenant", self.max_connections_per_tenant, 1, self.max_connections)?;
        for (key, d) in [
            ("startup_timeout", self.startup_timeout),
            ("auth_timeout", self.auth_timeout),
            ("wake_timeout", self.wake_timeout),
            ("compute_timeout", self.compute_timeout),
        ] {
            check_duration(key, d)?;
        }
        let domain_ok = !self.domain.is_empty()
            && self
                .domain
                .split('.')
                .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !domain_ok {
            return Err(ConfigError { key: "domain", message: format!("{:?} is not a DNS name", self.domain) });
        }
        if self.require_tls && self.pg_tls.is_none() {
            return Err(ConfigError {
                key: "require_tls",
                message: "TLS is required but `[pg_tls]` is not given".into(),
            });
        }
        // Sessions carry the clients' data: beyond loopback, only over TLS.
        let protected = self.require_tls && self.pg_tls.is_some();
        if !(self.listen_pg.ip().is_loopback() || protected) {
            return Err(ConfigError {
                key: "listen_pg",
                message: format!("{} is beyond loopback: give `[pg_tls]` and require_tls = true", self.listen_pg),
            });
        }
        check_exposure(
            "listen_http",
            self.listen_http,
            Protection { tls: self.tls.is_some(), auth: self.auth.is_some() },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
listen_pg = "127.0.0.1:6432"
listen_http = "127.0.0.1:6433"
domain = "db.localhost"
workdir = "/srv/cluster"
[pg_tls]
cert = "proxy/tls.pem"
key = "proxy/tls.key"
"#;

    fn check(text: &str) -> Result<ProxyConfig, String> {
        let c: ProxyConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn a_config_is_checked() {
        let c = check(OK).unwrap();
        assert!(c.require_tls);
        assert_eq!(c.max_connections_per_tenant, limits::DEFAULT_MAX_CONNECTIONS_PER_TENANT);
        assert_eq!(c.wake_timeout, limits::DEFAULT_WAKE_TIMEOUT);
        let no_tls = OK.split("[pg_tls]").next().unwrap().to_string();
        assert!(check(&no_tls).unwrap_err().contains("require_tls"));
        let plain = format!("require_tls = false\n{no_tls}");
        check(&plain).unwrap();
        assert!(check(&plain.replace("127.0.0.1:6432", "0.0.0.0:6432")).unwrap_err().contains("listen_pg"));
        assert!(check(&OK.replace("127.0.0.1:6433", "0.0.0.0:6433")).unwrap_err().contains("listen_http"));
        assert!(check(&OK.replace("db.localhost", "db..localhost")).unwrap_err().contains("domain"));
        assert!(check(&format!("max_connections_per_tenant = 0\n{OK}")).unwrap_err().contains("per_tenant"));
        assert!(check(&format!("bogus = 1\n{OK}")).is_err());
    }
}
