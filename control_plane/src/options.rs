//! What the operations are asked to do: the options of `init` and of an
//! endpoint's agent, and the timestamps users type. The CLI fills these
//! from its command line; `strata node` from its requests.

use std::path::PathBuf;

use super::error::{Error, Result};

/// `init`: what the new cluster looks like.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The cluster's directory (configs, data, logs).
    pub workdir: PathBuf,
    /// Number of safekeepers of a cluster on this machine (default 3).
    pub safekeepers: Option<usize>,
    /// Number of pageservers (default 1): two or more fail over.
    pub pageservers: Option<usize>,
    /// A cluster across machines: its hosts file (`docs/deployment.md`).
    pub hosts: Option<PathBuf>,
    /// Where the installed PostgreSQL server binaries are.
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs initdb and PostgreSQL when Strata runs as root.
    pub pg_user: String,
    /// Computes log an image of every page they change, checked by the pageserver.
    pub verify_redo: bool,
    /// How pageservers ask the safekeepers for WAL (`pageserver.toml`'s `wal_stream`).
    pub wal_stream: strata_pageserver::config::WalStreamChoice,
    /// A cluster on this machine in this many sites (`docs/sites.md`).
    pub sites: Option<usize>,
    /// The round trip between two sites, in milliseconds.
    pub site_latency_ms: Option<f64>,
    /// The WAL placement of `main` with sites.
    pub placement: Option<String>,
    /// No TLS and no tokens anywhere (loopback only, to measure their cost).
    pub insecure_loopback: bool,
    /// Tenants' objects stored unencrypted (no storage key).
    pub no_encryption_at_rest: bool,
    /// The endpoints' default idle period before they suspend, in seconds
    /// (`cluster.toml`'s `default_suspend_after_secs`); none or 0: never.
    pub suspend_after_secs: Option<u64>,
    /// The proxy's domain: `<endpoint>.<domain>` names an endpoint
    /// (`docs/proxy.md`); default `localhost`.
    pub proxy_domain: Option<String>,
    /// The default tenant's PostgreSQL major (15 when absent;
    /// `docs/postgres-versions.md`).
    pub pg_version: Option<u32>,
}

/// `endpoint start`: options handed to the compute agent for this run
/// (each `None` keeps the endpoint's previous choice, else the default).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentOptions {
    /// Restarts of PostgreSQL within the window reported as a crash loop.
    pub crash_loop_restarts: Option<u32>,
    /// The window of `crash_loop_restarts`, in seconds.
    pub crash_loop_window_secs: Option<u64>,
    /// A lazy compute (relation files through FUSE).
    pub lazy: bool,
    /// An eager compute (the whole database restored first).
    pub eager: bool,
    /// A lazy compute's local file cache in MiB.
    pub cache_mb: Option<u64>,
    /// How long a lazy read waits for an unreachable pageserver, in seconds.
    pub fetch_retry_secs: Option<u64>,
    /// A replica lagging more than this many MiB is restarted at the newest WAL.
    pub max_replica_lag_mb: Option<u64>,
    /// PostgreSQL's shared_buffers for this run.
    pub shared_buffers: Option<String>,
    /// PostgreSQL 18's `io_method` for this run (`sync`, `worker`, `io_uring`).
    #[serde(default)]
    pub io_method: Option<String>,
    /// Suspend after this many seconds without a client (0: never); kept
    /// for the endpoint's later starts.
    #[serde(default)]
    pub suspend_after_secs: Option<u64>,
}

/// An RFC 3339 timestamp from what a user types: RFC 3339 itself, or
/// PostgreSQL's text form (`2026-11-24 14:03:05.123456+00`, as `now()`
/// prints it).
pub fn parse_time(text: &str, option: &str) -> Result<String> {
    let t = text.trim();
    let parsed = chrono::DateTime::parse_from_rfc3339(t)
        .or_else(|_| chrono::DateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .map_err(|_| {
            Error::Usage(format!(
                "{option} {text:?}: expected a timestamp with a time zone, e.g. 2026-11-24T14:03:05Z or 2026-11-24 14:03:05.123+00"
            ))
        })?;
    Ok(parsed.to_rfc3339_opts(chrono::SecondsFormat::Micros, false))
}

#[cfg(test)]
impl InitOptions {
    /// A cluster of `safekeepers` safekeepers on this machine with every
    /// other option at its default (the unit tests' starting point).
    pub(crate) fn for_test(workdir: &std::path::Path, safekeepers: usize) -> InitOptions {
        InitOptions {
            workdir: workdir.to_path_buf(),
            safekeepers: Some(safekeepers),
            pageservers: None,
            hosts: None,
            pg_bin_dir: "/usr/lib/postgresql/15/bin".into(),
            pg_user: "postgres".into(),
            pg_version: None,
            verify_redo: false,
            wal_stream: Default::default(),
            insecure_loopback: false,
            no_encryption_at_rest: false,
            sites: None,
            site_latency_ms: None,
            placement: None,
            suspend_after_secs: None,
            proxy_domain: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_time_(t: &str) -> Result<String> {
        parse_time(t, "--at-time")
    }

    #[test]
    fn times_in_rfc3339_and_postgres_form() {
        assert_eq!(parse_time_("2026-11-24T14:03:05Z").unwrap(), "2026-11-24T14:03:05.000000+00:00");
        assert_eq!(parse_time_("2026-11-24 14:03:05.123456+00").unwrap(), "2026-11-24T14:03:05.123456+00:00");
        assert_eq!(parse_time_("2026-11-24 16:03:05.5+02:00").unwrap(), "2026-11-24T16:03:05.500000+02:00");
        assert!(matches!(parse_time_("2026-11-24 14:03:05"), Err(Error::Usage(_))), "a time zone is required");
        assert!(matches!(parse_time_("yesterday"), Err(Error::Usage(_))));
    }
}
