//! The control plane of a Strata cluster: its state, its plans and the
//! operations on it (`init`, `start`, `stop`, tenants, endpoints, branches, replica
//! promote, site promote and rejoin, safekeeper replace, drain), as
//! functions of the cluster's state and its services' clients. The `strata`
//! CLI parses a command line and calls them; `strata node` serves the same
//! operations over HTTP to the CLI of any host.
//!
//! A cluster lives in one directory (the *workdir*): `cluster.toml` names
//! every service with its ports and config, each service has a directory
//! with its config, data, log and pidfiles, and each endpoint (a compute:
//! stock PostgreSQL plus its agent) has one under `endpoints/`. Services are
//! detached processes of the `strata` binary, each run by its own supervisor
//! (`strata supervise`) that restarts it when it exits; liveness is decided
//! from the pidfiles, so any operation can be run at any time. See
//! `docs/local-cluster.md`.

pub mod branch;
pub mod certs;
pub mod controller;
pub mod endpoint;
pub mod error;
#[cfg(test)]
mod fakes;
pub mod follow;
pub mod hosts;
pub mod http;
pub mod import;
pub mod init;
pub mod keys;
pub mod layout;
pub mod limits;
pub mod membership;
pub mod node;
pub mod options;
pub mod placement;
pub mod process;
pub mod proxy;
pub mod reconfigure;
pub mod report;
pub mod services;
pub mod site;
pub mod split;
pub mod stage;
pub mod status;
pub mod supervisor;
pub mod supervisor_state;
pub mod tenant;
pub mod timeline;
pub mod upgrade;

pub use error::{Error, Result};
pub use layout::Workdir;

/// Opens the workdir of an operation, with the newest state any host has
/// (`hosts::refresh`; nothing to compare on a cluster of this machine only).
pub fn open(dir: &std::path::Path, progress: &mut dyn report::Progress) -> Result<Workdir> {
    hosts::refresh(Workdir::open(dir)?, progress)
}
