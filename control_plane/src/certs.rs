//! The cluster's certificate authority (`tls/` in the workdir), made by
//! `strata init`:
//!
//! - `ca.pem`: the CA's certificate, the only root every client trusts;
//! - `ca.key` (0600): its key; only the CLI reads it, to issue certificates;
//! - `<host>.pem`, `<host>.key` (0600): each host's certificate, naming its
//!   address (and `localhost` for a loopback host), and its key.
//!
//! A compute gets a certificate of its own at every start
//! ([`issue_compute`]), never a host's.
//!
//! See `docs/security.md`, "TLS".

use std::path::{Path, PathBuf};

use strata_service::tls::{self, ClientTls, TlsConfig};

use super::error::{Error, Result};

/// The CA's directory, relative to the workdir.
pub const TLS_DIR: &str = "tls";

pub fn ca_cert(root: &Path) -> PathBuf {
    root.join(TLS_DIR).join("ca.pem")
}

fn ca_key(root: &Path) -> PathBuf {
    root.join(TLS_DIR).join("ca.key")
}

fn host_files(root: &Path, host: &str) -> (PathBuf, PathBuf) {
    let dir = root.join(TLS_DIR);
    (dir.join(format!("{host}.pem")), dir.join(format!("{host}.key")))
}

/// What the config of a service on `host` says about TLS.
pub fn service_tls(root: &Path, host: &str) -> TlsConfig {
    let (cert, key) = host_files(root, host);
    TlsConfig { ca: ca_cert(root), cert, key }
}

fn failed(e: impl std::fmt::Display) -> Error {
    Error::Failed(e.to_string())
}

/// Writes a new CA under `root` and a certificate for each of `hosts`.
pub fn create(root: &Path, hosts: &[&str]) -> Result<()> {
    let dir = root.join(TLS_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let (cert, key) = tls::generate_ca().map_err(failed)?;
    strata_service::auth::write_secret(&ca_key(root), &key).map_err(failed)?;
    strata_service::durable::replace_file(&ca_cert(root), cert.as_bytes(), true).map_err(failed)?;
    for host in hosts {
        issue(root, host)?;
    }
    Ok(())
}

/// Issues (again) the certificate of `host`: its address, and `localhost`
/// too for a loopback address.
pub fn issue(root: &Path, host: &str) -> Result<()> {
    let (cert, key) = issue_for(root, host).map_err(|e| Error::Failed(format!("{host}: {e}")))?;
    let (cert_path, key_path) = host_files(root, host);
    strata_service::auth::write_secret(&key_path, &key).map_err(failed)?;
    strata_service::durable::replace_file(&cert_path, cert.as_bytes(), true).map_err(failed)
}

/// A new certificate and key (PEM) naming `address`, and `localhost` too
/// for a loopback address, signed by the CA at `root`.
fn issue_for(root: &Path, address: &str) -> Result<(String, String)> {
    let mut names = vec![address.to_string()];
    if address.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
        names.push("localhost".into());
    }
    issue_names(root, &names)
}

fn issue_names(root: &Path, names: &[String]) -> Result<(String, String)> {
    let path = ca_key(root);
    // Refused when others may read it, as the services refuse their keys.
    let pem = strata_service::auth::read_private(&path).map_err(|e| Error::Failed(format!("the CA key: {e}")))?;
    let ca_key = String::from_utf8(pem).map_err(|_| Error::Failed(format!("{}: not UTF-8", path.display())))?;
    tls::issue(&ca_key, names).map_err(failed)
}

/// A certificate and key (PEM) of the cluster's CA for `names`: the
/// console's (`strata console`), which serves the operator's browser.
pub fn issue_names_of(root: &Path, names: &[String]) -> Result<(String, String)> {
    issue_names(root, names)
}

/// The proxy's certificate and key files (`tls.pem`, `tls.key`) in its
/// service's directory: an operator may put a certificate of their own
/// there (or name other files in `proxy.toml`).
pub fn proxy_files(root: &Path, service: &str) -> (PathBuf, PathBuf) {
    let dir = root.join(service);
    (dir.join("tls.pem"), dir.join("tls.key"))
}

/// Issues the proxy's certificate: `*.<domain>` (a client names the
/// endpoint as the first label), `<domain>`, its host's address, and
/// loopback's names for a loopback host.
pub fn issue_proxy(root: &Path, service: &str, domain: &str, address: std::net::IpAddr) -> Result<()> {
    let mut names = vec![format!("*.{domain}"), domain.to_string(), address.to_string()];
    if address.is_loopback() && domain != "localhost" {
        names.push("localhost".into());
    }
    let (cert, key) = issue_names(root, &names).map_err(|e| Error::Failed(format!("the proxy: {e}")))?;
    let (cert_path, key_path) = proxy_files(root, service);
    std::fs::create_dir_all(root.join(service)).map_err(|e| Error::Failed(format!("{service}: {e}")))?;
    strata_service::auth::write_secret(&key_path, &key).map_err(failed)?;
    strata_service::durable::replace_file(&cert_path, cert.as_bytes(), true).map_err(failed)
}

/// A compute's own certificate and key, issued for one start of one
/// endpoint. A compute's PostgreSQL keeps its key in its data directory,
/// which its superuser reads (`pg_read_file('server.key')`): that key must
/// be worth nothing beyond that endpoint, so it is never a host's, which
/// the host's services present (`docs/security.md`, "Computes").
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct ComputeCert {
    /// The certificate (PEM), naming the endpoint's address.
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

impl std::fmt::Debug for ComputeCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ComputeCert(..)")
    }
}

/// A new certificate for an endpoint on the host at `address`, if the
/// cluster at `root` has a CA (none: it speaks plaintext on loopback). It
/// names loopback too, on every host: the connection string of a client on
/// the compute's own host verifies it there.
pub fn issue_compute(root: &Path, endpoint: &str, address: std::net::IpAddr) -> Result<Option<ComputeCert>> {
    if !ca_cert(root).exists() {
        return Ok(None);
    }
    let mut names = vec![address.to_string()];
    for name in ["127.0.0.1", "localhost"] {
        if !names.iter().any(|n| n == name) {
            names.push(name.into());
        }
    }
    let (cert, key) = issue_names(root, &names).map_err(|e| Error::Failed(format!("endpoint {endpoint}: {e}")))?;
    Ok(Some(ComputeCert { cert, key }))
}

/// The trust of the cluster at `root`, if it has a CA (clusters made
/// before TLS have none, and speak plaintext on loopback).
pub fn client(root: &Path) -> Result<Option<ClientTls>> {
    let path = ca_cert(root);
    if !path.exists() {
        return Ok(None);
    }
    ClientTls::load(&path).map(Some).map_err(failed)
}
