//! Link proxy configuration (`link-proxy.toml`, written by `strata init`
//! for clusters with sites).

use std::net::SocketAddr;
use std::time::Duration;

use strata_service::config::{
    check_duration, check_exposure, check_range, check_unique_names, load_toml, seconds, ConfigError, ConfigLoadError,
    Protection,
};

use crate::limits::{self, MAX_DELAY_MS, MAX_RETRANSMISSIONS, RETRANSMIT_TIMEOUT};

/// Everything a link proxy process needs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkProxyConfig {
    /// HTTP: status, latency changes, cut and heal, metrics.
    pub listen_http: SocketAddr,
    pub routes: Vec<RouteConfig>,
    /// Bytes of one direction of a connection held and not yet delivered;
    /// beyond it the proxy stops reading from the sender.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: usize,
    /// Connections per route at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Longest wait for a connection to a route's target.
    #[serde(default = "default_connect_timeout", with = "seconds")]
    pub connect_timeout: Duration,
    /// Tokens on the HTTP API (`docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<strata_service::auth::AuthConfig>,
    /// TLS on the HTTP API. Relayed bytes are never touched: TLS between
    /// the services passes through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<strata_service::tls::TlsConfig>,
}

/// One relayed link: every connection to `listen` goes on to `target`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Unique: the HTTP API and the metrics name it.
    pub name: String,
    pub listen: SocketAddr,
    /// `host:port` of what it relays to.
    pub target: String,
    /// One-way delay in milliseconds (half the round trip).
    #[serde(default)]
    pub delay_ms: f64,
    /// Uniform jitter in ± milliseconds around the delay (never reorders).
    #[serde(default)]
    pub jitter_ms: f64,
    /// Percent of chunks lost once or more (see [`Delay::loss_pct`]).
    #[serde(default)]
    pub loss_pct: f64,
}

impl RouteConfig {
    /// Its delay as configured.
    pub fn delay(&self) -> Delay {
        Delay { delay_ms: self.delay_ms, jitter_ms: self.jitter_ms, loss_pct: self.loss_pct }
    }
}

/// How long a byte takes through a route, each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delay {
    /// One-way delay in milliseconds (half the round trip).
    #[serde(default)]
    pub delay_ms: f64,
    /// Uniform jitter in ± milliseconds around the delay (never reorders).
    #[serde(default)]
    pub jitter_ms: f64,
    /// Percent of chunks lost. The relayed bytes travel over TCP, which
    /// loses nothing: a lost segment comes again after a retransmission
    /// timeout, and what follows it waits. So a lost chunk is delivered
    /// [`RETRANSMIT_TIMEOUT`] late, twice that if lost again, and so on.
    #[serde(default)]
    pub loss_pct: f64,
}

impl Delay {
    /// The delay of one chunk: uniform in the jitter around the delay,
    /// never negative, plus the retransmissions of its losses.
    pub fn sample(&self) -> Duration {
        let jitter = if self.jitter_ms > 0.0 { (fastrand::f64() * 2.0 - 1.0) * self.jitter_ms } else { 0.0 };
        let mut delay = Duration::from_secs_f64((self.delay_ms + jitter).max(0.0) / 1000.0);
        let mut timeout = RETRANSMIT_TIMEOUT;
        for _ in 0..MAX_RETRANSMISSIONS {
            if self.loss_pct <= 0.0 || fastrand::f64() * 100.0 >= self.loss_pct {
                break;
            }
            delay += timeout;
            timeout *= 2;
        }
        delay
    }
}

impl Delay {
    /// Refuses negative, non-finite or absurd values.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, v, max) in [
            ("delay_ms", self.delay_ms, MAX_DELAY_MS),
            ("jitter_ms", self.jitter_ms, MAX_DELAY_MS),
            ("loss_pct", self.loss_pct, 100.0),
        ] {
            if !v.is_finite() || !(0.0..=max).contains(&v) {
                return Err(ConfigError { key, message: format!("{v} is not between 0 and {max}") });
            }
        }
        Ok(())
    }
}

fn default_max_in_flight_bytes() -> usize {
    limits::DEFAULT_MAX_IN_FLIGHT_BYTES
}
fn default_max_connections() -> usize {
    limits::DEFAULT_MAX_CONNECTIONS
}
fn default_connect_timeout() -> Duration {
    limits::DEFAULT_CONNECT_TIMEOUT
}

impl LinkProxyConfig {
    /// Reads and checks the file.
    pub fn load(path: &std::path::Path) -> Result<LinkProxyConfig, ConfigLoadError> {
        load_toml(path, LinkProxyConfig::validate)
    }

    /// Refuses values that would break the service, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "max_in_flight_bytes",
            self.max_in_flight_bytes,
            limits::MIN_IN_FLIGHT_BYTES,
            limits::MAX_IN_FLIGHT_BYTES,
        )?;
        check_range("max_connections", self.max_connections, 1, limits::MAX_CONNECTIONS)?;
        check_duration("connect_timeout", self.connect_timeout)?;
        check_unique_names("routes", self.routes.iter().map(|r| r.name.as_str()))?;
        for r in &self.routes {
            r.delay().validate()?;
            if r.name.is_empty() || !r.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                return Err(ConfigError {
                    key: "routes",
                    message: format!("route name {:?}: use letters, digits, '-', '_' and '.'", r.name),
                });
            }
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
listen_http = "127.0.0.1:7000"
[[routes]]
name = "dc1-to-sk3"
listen = "127.0.0.1:7001"
target = "127.0.0.1:7002"
delay_ms = 5
jitter_ms = 0.5
"#;

    #[test]
    fn a_config_is_checked() {
        let c: LinkProxyConfig = toml::from_str(OK).unwrap();
        c.validate().unwrap();
        assert_eq!(c.routes[0].delay(), Delay { delay_ms: 5.0, jitter_ms: 0.5, loss_pct: 0.0 });
        assert_eq!(c.max_in_flight_bytes, 1 << 20);
        let bad = |text: &str| {
            toml::from_str::<LinkProxyConfig>(text)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map_err(|e| e.to_string()))
        };
        assert!(bad(&OK.replace("delay_ms = 5", "delay_ms = -1")).unwrap_err().contains("delay_ms"));
        assert!(bad(&OK.replace("jitter_ms = 0.5", "jitter_ms = 1e9")).unwrap_err().contains("jitter_ms"));
        assert!(bad(&OK.replace("dc1-to-sk3", "a b")).unwrap_err().contains("route name"));
        assert!(bad(&OK.replace("jitter_ms = 0.5", "loss_pct = 101")).unwrap_err().contains("loss_pct"));
        assert!(bad(&OK.replace("jitter_ms = 0.5", "loss_pct = 2.5")).is_ok());
        assert!(bad(&format!("{OK}[[routes]]\nname = \"dc1-to-sk3\"\nlisten = \"127.0.0.1:1\"\ntarget = \"x:1\"\n"))
            .unwrap_err()
            .contains("same name"));
        assert!(bad(&OK.replace("127.0.0.1:7000", "0.0.0.0:7000")).unwrap_err().contains("listen_http"));
        assert!(bad(&format!("{OK}bogus = 1\n")).is_err());
    }

    #[test]
    fn a_lost_chunk_comes_a_retransmission_later() {
        let none = Delay { delay_ms: 3.0, jitter_ms: 0.0, loss_pct: 0.0 };
        assert!((0..1000).all(|_| none.sample() == Duration::from_millis(3)));
        let all = Delay { loss_pct: 100.0, ..none };
        let most = RETRANSMIT_TIMEOUT * ((1 << MAX_RETRANSMISSIONS) - 1);
        assert!((0..100).all(|_| all.sample() == Duration::from_millis(3) + most));
        let some = Delay { loss_pct: 10.0, ..none };
        let late = (0..10_000).filter(|_| some.sample() > Duration::from_millis(3)).count();
        assert!((700..1300).contains(&late), "{late} of 10000 chunks lost at 10%");
    }
}
