//! The cluster's certificate authority (`tls/` in the workdir), made by
//! `strata init`:
//!
//! - `ca.pem`: the CA's certificate, the only root every client trusts;
//! - `ca.key` (0600): its key; only the CLI reads it, to issue certificates;
//! - `<host>.pem`, `<host>.key` (0600): each host's certificate, naming its
//!   address (and `localhost` for a loopback host), and its key.
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
    let ca_key =
        std::fs::read_to_string(ca_key(root)).map_err(|e| Error::Failed(format!("{host}: the CA key: {e}")))?;
    let mut names = vec![host.to_string()];
    if host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
        names.push("localhost".into());
    }
    let (cert, key) = tls::issue(&ca_key, &names).map_err(failed)?;
    let (cert_path, key_path) = host_files(root, host);
    strata_service::auth::write_secret(&key_path, &key).map_err(failed)?;
    strata_service::durable::replace_file(&cert_path, cert.as_bytes(), true).map_err(failed)
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
