//! Helpers for the services' TOML configs: durations in seconds, checks that
//! name the offending key, and the open-file budget.

/// A config value that would break the service, named by its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: &'static str,
    pub message: String,
}

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLoadError {
    #[error("{}: {source}", path.display())]
    Read { path: std::path::PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Parse { path: std::path::PathBuf, source: toml::de::Error },
    #[error("{}: {source}", path.display())]
    Invalid { path: std::path::PathBuf, source: ConfigError },
}

/// Reads a TOML config file and checks it with `validate`.
pub fn load_toml<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    validate: impl FnOnce(&T) -> Result<(), ConfigError>,
) -> Result<T, ConfigLoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigLoadError::Read { path: path.into(), source })?;
    let config: T = toml::from_str(&text).map_err(|source| ConfigLoadError::Parse { path: path.into(), source })?;
    validate(&config).map_err(|source| ConfigLoadError::Invalid { path: path.into(), source })?;
    Ok(config)
}

/// How a listener protects its links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protection {
    pub tls: bool,
    pub auth: bool,
}

/// Refuses a listener (config key `key`) beyond loopback without both TLS
/// and tokens: on a network anyone could call it, or read what it sends.
/// An unspecified address (`0.0.0.0`, `::`) is beyond loopback.
pub fn check_exposure(key: &'static str, addr: std::net::SocketAddr, p: Protection) -> Result<(), ConfigError> {
    if addr.ip().is_loopback() || (p.tls && p.auth) {
        return Ok(());
    }
    let missing = match (p.tls, p.auth) {
        (false, false) => "TLS and tokens",
        (false, true) => "TLS",
        _ => "tokens",
    };
    Err(ConfigError {
        key,
        message: format!("{addr} is beyond loopback, and this listener has no {missing} (`[tls]`, `[auth]`)"),
    })
}

/// Checks that `value` (of config key `key`) lies in `min..=max`.
pub fn check_range<T: PartialOrd + std::fmt::Display>(
    key: &'static str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError { key, message: format!("must be between {min} and {max}, not {value}") });
    }
    Ok(())
}

/// Checks that a duration is positive and at most a day.
pub fn check_duration(key: &'static str, value: std::time::Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError { key, message: "must be more than 0 seconds".into() });
    }
    Ok(())
}

/// Refuses a list (config key `key`) in which two entries have the same name.
pub fn check_unique_names<'a>(key: &'static str, names: impl Iterator<Item = &'a str>) -> Result<(), ConfigError> {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(ConfigError { key, message: "two have the same name".into() });
    }
    Ok(())
}

/// Raises this process's soft limit on open files to its hard limit and
/// returns the result: the services size their connection limits and file
/// caches to fit in it.
pub fn raise_open_file_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 1024;
        }
        if rl.rlim_cur < rl.rlim_max {
            let raised = libc::rlimit { rlim_cur: rl.rlim_max, rlim_max: rl.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
        rl.rlim_cur
    }
}

/// Checks that the descriptors a config allows (`uses`: key and count)
/// plus `reserve` for everything else fit in the open-file limit `limit`.
pub fn check_open_files(uses: &[(&'static str, usize)], reserve: usize, limit: u64) -> Result<(), ConfigError> {
    let total: usize = uses.iter().map(|(_, n)| n).sum::<usize>() + reserve;
    if total as u64 > limit {
        let keys: Vec<String> = uses.iter().map(|(k, n)| format!("{k} = {n}")).collect();
        return Err(ConfigError {
            key: uses.first().map_or("open files", |(k, _)| k),
            message: format!(
                "{} and {reserve} descriptors for files and peers need {total} open files, more than this \
                 process may open ({limit}); lower them or raise the limit (ulimit -n)",
                keys.join(", ")
            ),
        });
    }
    Ok(())
}

/// Serde for a duration written as seconds (an integer or a fraction), at
/// most a day.
pub mod seconds {
    use std::time::Duration;

    use crate::limits::MAX_CONFIG_SECONDS as MAX;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = <f64 as serde::Deserialize>::deserialize(d)?;
        if !(0.0..=MAX).contains(&v) {
            return Err(serde::de::Error::custom(format!("must be between 0 and {MAX} seconds")));
        }
        Ok(Duration::from_secs_f64(v))
    }
}

/// Like [`seconds`], for retention periods: up to ten years.
pub mod retention_seconds {
    use std::time::Duration;

    pub use super::seconds::serialize;

    use crate::limits::MAX_RETENTION_SECONDS as MAX;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = <f64 as serde::Deserialize>::deserialize(d)?;
        if !(0.0..=MAX).contains(&v) {
            return Err(serde::de::Error::custom(format!("must be between 0 and {MAX} seconds (ten years)")));
        }
        Ok(Duration::from_secs_f64(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_beyond_loopback_need_tls_and_tokens() {
        let both = Protection { tls: true, auth: true };
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        for a in ["127.0.0.1:1", "127.8.9.10:1", "[::1]:1"] {
            for tls in [false, true] {
                for auth in [false, true] {
                    assert!(check_exposure("k", addr(a), Protection { tls, auth }).is_ok(), "{a}");
                }
            }
        }
        for a in ["0.0.0.0:1", "10.1.2.3:1", "[::]:1"] {
            assert!(check_exposure("k", addr(a), both).is_ok(), "{a}");
            for (p, missing) in [
                (Protection { tls: false, auth: false }, "no TLS and tokens"),
                (Protection { tls: false, auth: true }, "no TLS ("),
                (Protection { tls: true, auth: false }, "no tokens"),
            ] {
                let e = check_exposure("listen_http", addr(a), p).unwrap_err();
                assert_eq!(e.key, "listen_http");
                assert!(e.message.contains("beyond loopback") && e.message.contains(missing), "{e}");
            }
        }
    }

    #[test]
    fn checks_name_the_key() {
        assert!(check_range("max_connections", 5usize, 1, 10).is_ok());
        let e = check_range("max_connections", 0usize, 1, 10).unwrap_err();
        assert_eq!(e.to_string(), "max_connections: must be between 1 and 10, not 0");
        assert!(check_duration("idle_timeout", std::time::Duration::ZERO)
            .unwrap_err()
            .to_string()
            .starts_with("idle_timeout"));
        let e = check_open_files(&[("max_connections", 900), ("max_http_connections", 100)], 100, 1024).unwrap_err();
        assert!(e.to_string().contains("max_connections = 900") && e.to_string().contains("1100"), "{e}");
        assert!(check_open_files(&[("max_connections", 500)], 100, 1024).is_ok());
        assert!(raise_open_file_limit() >= 1);
    }
}
