//! The proxy's view of the control plane (`docs/proxy.md`): endpoints are
//! found in this host's workdir or through the other hosts' nodes, and
//! woken as `strata endpoint start` starts them. The proxy therefore runs
//! on a host that holds the cluster's keys, as the CLI does.

use std::net::SocketAddr;
use std::path::PathBuf;

use strata_proxy::catalog::{Backend, State, Target};

use super::endpoint::{self, EndpointRecord, Password, StartOptions};
use super::hosts::{self, EndpointRequest};
use super::layout::{Workdir, LOOPBACK};
use super::options::AgentOptions;
use super::supervisor::Liveness;
use crate::limits::{NODE_CALL, QUICK};

/// The control plane of the workdir at `root`.
pub struct Catalog {
    root: PathBuf,
}

impl Catalog {
    pub fn new(root: PathBuf) -> Catalog {
        Catalog { root }
    }

    fn workdir(&self) -> Result<Workdir, String> {
        Workdir::open(&self.root).map_err(|e| e.to_string())
    }

    /// Refuses a workdir that cannot wake computes: one of a secure
    /// cluster without the keys that sign a compute's token.
    pub fn check(&self) -> Result<(), String> {
        let wd = self.workdir()?;
        let secure = super::certs::client(&wd.root).map_err(|e| e.to_string())?.is_some();
        let signer = super::keys::signer(&wd.root).map_err(|e| e.to_string())?;
        if secure && signer.is_none() {
            return Err(format!(
                "{}: this host's workdir has no signing keys; the proxy wakes computes and runs where the CLI does",
                wd.root.display()
            ));
        }
        Ok(())
    }
}

/// An endpoint of this machine, reached on loopback.
fn local(wd: &Workdir, name: &str) -> Result<Option<Target>, String> {
    let Some(ep) = endpoint::load(wd, name).map_err(|e| e.to_string())? else { return Ok(None) };
    if !wd.cluster.host(&ep.file.host).is_some_and(hosts::is_local) {
        return Ok(None);
    }
    let verifier = ep.verifier().ok_or_else(|| no_verifier(name))?;
    let state = match ep.supervised().liveness() {
        Liveness::Running { .. } | Liveness::Restarting { .. } => State::Running,
        Liveness::Stopped if ep.suspension().is_some() => State::Suspended,
        Liveness::Stopped => State::Stopped,
    };
    let address = SocketAddr::new(LOOPBACK, ep.file.pg_port);
    let socket = Some(ep.pgdata().join(format!(".s.PGSQL.{}", ep.file.pg_port)));
    Ok(Some(Target { endpoint: name.into(), tenant: ep.file.tenant, verifier, address, socket, state }))
}

fn no_verifier(name: &str) -> String {
    format!("endpoint {name} has no SCRAM verifier yet (`strata endpoint start {name}` makes one)")
}

/// An endpoint of another host, through that host's node.
fn remote(wd: &Workdir, name: &str) -> Result<Option<Target>, String> {
    for host in wd.cluster.hosts.iter().filter(|h| h.computes && !hosts::is_local(h)) {
        let records: Vec<EndpointRecord> =
            hosts::call(host, "GET", "/v1/endpoints", None::<&()>, QUICK * 2).map_err(|e| e.to_string())?;
        let Some(r) = records.into_iter().find(|r| r.file.name == name && r.file.host == host.name) else { continue };
        let req = EndpointRequest { name: name.into(), immediate: false };
        let p: Password =
            hosts::call(host, "POST", "/v1/endpoints/verifier", Some(&req), NODE_CALL).map_err(|e| e.to_string())?;
        let state = match (r.state.as_str(), r.suspended) {
            ("stopped", true) => State::Suspended,
            ("stopped", false) => State::Stopped,
            _ => State::Running,
        };
        let verifier = p.verifier.ok_or_else(|| no_verifier(name))?;
        let address = SocketAddr::new(host.address, r.file.pg_port);
        let tenant = r.file.tenant;
        return Ok(Some(Target { endpoint: name.into(), tenant, verifier, address, socket: None, state }));
    }
    Ok(None)
}

impl Backend for Catalog {
    fn lookup(&self, name: &str) -> Result<Option<Target>, String> {
        if endpoint::check_name(name).is_err() {
            return Ok(None);
        }
        let wd = self.workdir()?;
        match local(&wd, name)? {
            Some(t) => Ok(Some(t)),
            None => remote(&wd, name),
        }
    }

    fn wake(&self, name: &str) -> Result<(), String> {
        let wd = self.workdir()?;
        // As `strata endpoint start` does: no other command spawns or
        // stops computes of this workdir meanwhile.
        let _lock =
            wd.lock(|| tracing::info!(endpoint = name, "waiting for the workdir's lock")).map_err(|e| e.to_string())?;
        let how = StartOptions {
            tenant: None,
            branch: None,
            port: None,
            at: None,
            replica_of: None,
            hot_standby_feedback: false,
            host: None,
            site: None,
            promote: false,
        };
        let mut events = Vec::new();
        endpoint::start(&wd, name, &how, &AgentOptions::default(), &mut events).map_err(|e| e.to_string())
    }
}
