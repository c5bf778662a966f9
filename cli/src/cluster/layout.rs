//! The workdir: `cluster.toml`, every path of a service or endpoint, the
//! command lock, and `strata init` which writes it all.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use strata_protocol::{TenantId, TimelineId};

use super::args::InitArgs;
use super::error::{failed, Error, Result};
use strata_service::ports;

/// Name of the cluster description inside the workdir.
pub const CLUSTER_FILE: &str = "cluster.toml";
/// Version of the `cluster.toml` format written by this binary (version 1,
/// from before hosts, is read as one host on loopback).
pub const FORMAT_VERSION: u32 = 2;
/// The one host of a cluster made without `--hosts`.
pub const LOCAL_HOST: &str = "local";
/// The address of that host.
pub const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
/// The branch every new cluster has.
pub const MAIN_BRANCH: &str = "main";

/// The comment at the top of `cluster.toml`.
pub const CLUSTER_HEADER: &str = "# Strata cluster (docs/local-cluster.md, docs/deployment.md).\n";
/// The pageserver's object storage (local backend) inside the workdir.
pub const REMOTE_STORAGE_DIR: &str = "remote_storage";
/// The attachment file beside each pageserver's config: what the storage
/// controller placed there.
pub const ATTACHMENTS_FILE: &str = "attachments.json";

/// How long a mutating command waits for another one to finish.
const LOCK_WAIT: Duration = Duration::from_secs(300);

/// `cluster.toml`: what `strata init` decided; read by every other command.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub format_version: u32,
    /// Counts the changes of this file and of the services' configs: the
    /// hosts' copies converge on the highest (`docs/deployment.md`).
    #[serde(default)]
    pub revision: u64,
    /// The tenant (one PostgreSQL cluster) every branch belongs to.
    pub tenant_id: TenantId,
    /// PostgreSQL 15 server binaries, for the pageserver's initdb and the computes.
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs initdb and PostgreSQL when Strata runs as root.
    pub pg_user: String,
    /// Computes log images of every change and the pageserver checks native redo against them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_redo: bool,
    /// The machines the cluster runs on (`docs/deployment.md`).
    #[serde(default = "local_hosts")]
    pub hosts: Vec<Host>,
    /// The object storage of the pageserver and the safekeepers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<strata_remote_storage::RemoteStorageConfig>,
    pub branches: Vec<Branch>,
    pub services: Vec<Service>,
    /// The link proxy's routes between the sites of a local cluster
    /// (`docs/sites.md`): who in which site reaches which service's port
    /// through it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// The generation the CLI issued last, before the storage controller
    /// issued them (read so that old files load; the controller issues
    /// generations above every one in object storage).
    #[serde(default)]
    pub generation: u32,
}

/// A machine of the cluster.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: String,
    /// Where its services listen and where the others reach them.
    pub address: std::net::IpAddr,
    /// Its data centre (or zone): hosts of one site share failures.
    pub site: String,
    /// The port of its `strata node` API (0: none).
    #[serde(default)]
    pub node_port: u16,
    /// Endpoints may run here.
    #[serde(default)]
    pub computes: bool,
}

impl Host {
    /// Whether only this machine can reach it.
    pub fn is_loopback(&self) -> bool {
        self.address.is_loopback()
    }
}

/// The hosts of a `cluster.toml` from before hosts: everything on loopback.
fn local_hosts() -> Vec<Host> {
    vec![Host { name: LOCAL_HOST.into(), address: LOOPBACK, site: LOCAL_HOST.into(), node_port: 0, computes: true }]
}

fn local_host_name() -> String {
    LOCAL_HOST.into()
}

/// One route of the link proxy: services and computes of `site` reach
/// `service`'s `role` port at the proxy's address and `port`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub site: String,
    pub service: String,
    pub role: String,
    pub port: u16,
}

impl Route {
    /// Its name in the link proxy's config and API.
    pub fn name(&self) -> String {
        format!("{}-{}-{}", self.site, self.service, self.role)
    }
}

/// A branch: a named timeline of the tenant.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Branch {
    pub name: String,
    pub timeline_id: TimelineId,
    /// The branch it was created from, and where (`docs/branches.md`);
    /// none for `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ancestor_lsn: Option<strata_formats::Lsn>,
    /// Its WAL placement (`docs/sites.md`); `strata start` brings the
    /// safekeepers' configuration to it. None: a majority of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<strata_protocol::safekeeper::Placement>,
    /// A site's history that a site failover left behind (`docs/sites.md`,
    /// "Site failover"): its timeline is sealed, read-only for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergent: Option<Divergence>,
}

/// Where a divergent branch's history parted from the branch that went on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Divergence {
    /// The site that was given up (`strata site promote` of another).
    pub site: String,
    /// The branch that went on in the promoted site, from `fork_lsn`.
    pub continued_as: String,
    /// Where the promoted site's WAL ended: the branch that went on starts
    /// here; this branch's WAL past it is the lost site's alone.
    pub fork_lsn: strata_formats::Lsn,
    /// What the lost site had acknowledged, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_lsn: Option<strata_formats::Lsn>,
}

/// What a service is; decides its subcommand and config format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Safekeeper,
    Pageserver,
    Controller,
    /// The relay that puts latency between the sites of a local cluster.
    #[serde(rename = "link-proxy")]
    LinkProxy,
}

impl Kind {
    /// The `strata` subcommand that runs this kind of service (and its config file stem).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Safekeeper => "safekeeper",
            Kind::Pageserver => "pageserver",
            Kind::Controller => "controller",
            Kind::LinkProxy => "link-proxy",
        }
    }
}

/// One long-running service of the cluster.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: String,
    pub kind: Kind,
    /// The host it runs on.
    #[serde(default = "local_host_name")]
    pub host: String,
    /// Its config file, relative to the workdir.
    pub config: PathBuf,
    /// Its ports on its host's address by role: `listen`, `http`, `pg`.
    pub ports: BTreeMap<String, u16>,
    /// Its host's address, filled in on load.
    #[serde(skip, default = "unresolved")]
    pub address: std::net::IpAddr,
}

fn unresolved() -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
}

impl Service {
    /// `<host address>:<port>` of one of its roles.
    pub fn addr(&self, role: &str) -> Option<String> {
        debug_assert!(!self.address.is_unspecified(), "{}: host not resolved", self.name);
        self.ports.get(role).map(|p| std::net::SocketAddr::new(self.address, *p).to_string())
    }

    /// Its HTTP API's base URL (every service has one).
    pub fn http_url(&self) -> String {
        let addr = self.addr("http").unwrap_or_else(|| std::net::SocketAddr::new(self.address, 0).to_string());
        format!("{}://{addr}", super::http::scheme())
    }
}

impl ClusterFile {
    /// The services of one kind, in `cluster.toml` order.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Service> {
        self.services.iter().filter(move |s| s.kind == kind)
    }

    /// A service's site (its host's).
    pub fn site_of<'a>(&'a self, s: &'a Service) -> &'a str {
        self.host(&s.host).map_or(s.host.as_str(), |h| h.site.as_str())
    }

    /// The address of one of `s`'s ports as seen from `site`: through the
    /// link proxy when a route leads there, else its own.
    pub fn addr_from(&self, site: &str, s: &Service, role: &str) -> Option<String> {
        let route = self.routes.iter().find(|r| r.site == site && r.service == s.name && r.role == role);
        match (route, self.of_kind(Kind::LinkProxy).next()) {
            (Some(r), Some(proxy)) => Some(std::net::SocketAddr::new(proxy.address, r.port).to_string()),
            _ => s.addr(role),
        }
    }

    /// How many safekeepers `site` has, for a pageserver's
    /// `site_safekeepers` (0 when every safekeeper is there: no preference).
    pub fn site_safekeepers(&self, site: &str) -> usize {
        let all: Vec<&Service> = self.of_kind(Kind::Safekeeper).collect();
        let own = all.iter().filter(|s| self.site_of(s) == site).count();
        if own == all.len() {
            0
        } else {
            own
        }
    }

    /// Every safekeeper's protocol address as seen from `site`, those of
    /// `site` first (ties in choosing a WAL source go to them).
    pub fn safekeeper_addrs_from(&self, site: &str) -> Vec<String> {
        let mut sks: Vec<&Service> = self.of_kind(Kind::Safekeeper).collect();
        sks.sort_by_key(|s| self.site_of(s) != site);
        sks.into_iter().filter_map(|s| self.addr_from(site, s, "listen")).collect()
    }

    /// Each direct address of another site's service and the route `site`
    /// reaches it by (for addresses learnt at run time, e.g. from a
    /// storage controller).
    pub fn address_map_from(&self, site: &str) -> Vec<(String, String)> {
        let mut map = Vec::new();
        for s in &self.services {
            for role in s.ports.keys() {
                if let (Some(direct), Some(routed)) = (s.addr(role), self.addr_from(site, s, role)) {
                    if direct != routed {
                        map.push((direct, routed));
                    }
                }
            }
        }
        map
    }

    /// The site of each host with safekeepers and how many run there, in
    /// the order of the safekeepers.
    pub fn safekeeper_sites(&self) -> Vec<(String, usize)> {
        let mut sites: Vec<(String, usize)> = Vec::new();
        for s in self.of_kind(Kind::Safekeeper) {
            let site = self.host(&s.host).map_or_else(|| s.host.clone(), |h| h.site.clone());
            match sites.iter_mut().find(|(x, _)| *x == site) {
                Some((_, n)) => *n += 1,
                None => sites.push((site, 1)),
            }
        }
        sites
    }

    /// A branch by name.
    pub fn branch(&self, name: &str) -> Option<&Branch> {
        self.branches.iter().find(|b| b.name == name)
    }

    /// Every port a service was given, so new endpoints stay clear of them.
    pub fn ports(&self) -> Vec<u16> {
        self.services.iter().flat_map(|s| s.ports.values().copied()).collect()
    }

    /// A host by name.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Whether the file describes a cluster this binary can run; fills in
    /// each service's address from its host.
    fn check(&mut self) -> std::result::Result<(), String> {
        if !(1..=FORMAT_VERSION).contains(&self.format_version) {
            return Err(format!("format_version {} is not supported (expected {FORMAT_VERSION})", self.format_version));
        }
        if self.hosts.is_empty() {
            return Err("no hosts".into());
        }
        let mut hosts: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
        hosts.sort_unstable();
        if hosts.windows(2).any(|w| w[0] == w[1]) {
            return Err("two hosts have the same name".into());
        }
        if let Some(h) = self.hosts.iter().find(|h| h.address.is_unspecified() || h.address.is_multicast()) {
            return Err(format!("host {}: {} is not an address others can reach", h.name, h.address));
        }
        let addresses: BTreeMap<String, std::net::IpAddr> =
            self.hosts.iter().map(|h| (h.name.clone(), h.address)).collect();
        for s in &mut self.services {
            s.address =
                *addresses.get(&s.host).ok_or_else(|| format!("service {}: no host named {:?}", s.name, s.host))?;
        }
        if self.of_kind(Kind::Pageserver).count() == 0 {
            return Err("no pageserver".into());
        }
        if self.of_kind(Kind::Controller).count() == 0 {
            return Err("no storage controller".into());
        }
        if self.of_kind(Kind::Safekeeper).count() == 0 {
            return Err("no safekeepers".into());
        }
        let mut names: Vec<&str> = self.services.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err("two services have the same name".into());
        }
        for s in &self.services {
            let roles: &[&str] = match s.kind {
                Kind::Safekeeper => &["listen", "http"],
                Kind::Pageserver => &["pg", "http"],
                Kind::Controller | Kind::LinkProxy => &["http"],
            };
            if let Some(r) = roles.iter().find(|r| !s.ports.contains_key(**r)) {
                return Err(format!("service {} has no `{r}` port", s.name));
            }
        }
        Ok(())
    }
}

/// An opened workdir: its absolute path and its `cluster.toml`.
pub struct Workdir {
    pub root: PathBuf,
    pub cluster: ClusterFile,
}

/// Held while a command changes the cluster; released on drop.
pub struct Lock {
    _file: fs::File,
}

impl Workdir {
    /// Opens an initialised workdir; the error says how to make one.
    pub fn open(dir: &Path) -> Result<Workdir> {
        let file = dir.join(CLUSTER_FILE);
        let text = match fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return failed(format!(
                    "{}: no cluster here (create one with `strata init --workdir {}`)",
                    file.display(),
                    dir.display()
                ))
            }
            Err(e) => return failed(format!("{}: {e}", file.display())),
        };
        let mut cluster: ClusterFile =
            toml::from_str(&text).map_err(|e| Error::Failed(format!("{}: {e}", file.display())))?;
        cluster.check().map_err(|e| Error::Failed(format!("{}: {e}", file.display())))?;
        // Absolute, so configs and pidfile markers do not depend on the caller's directory.
        let root = fs::canonicalize(dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
        super::keys::use_management_token(&root)?;
        if let Some(tls) = super::certs::client(&root)? {
            super::http::use_tls(tls);
        }
        Ok(Workdir { root, cluster })
    }

    /// Takes the workdir's command lock, waiting (bounded) for another
    /// `start`/`stop`/`endpoint` command to finish, so that two commands
    /// never spawn the same service or two writers on one branch.
    pub fn lock(&self) -> Result<Lock> {
        let path = self.root.join("cluster.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
        let deadline = Instant::now() + LOCK_WAIT;
        let mut told = false;
        loop {
            // SAFETY: flock on a file descriptor we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Lock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return failed(format!("{}: {err}", path.display()));
            }
            if Instant::now() > deadline {
                return failed(format!("{}: another strata command still holds the lock", path.display()));
            }
            if !told {
                eprintln!("waiting for another strata command on {} to finish", self.root.display());
                told = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A service by name.
    pub fn service(&self, name: &str) -> Option<&Service> {
        self.cluster.services.iter().find(|s| s.name == name)
    }

    /// The directory of a service (config, data, log, pidfile).
    pub fn service_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// A service's config file, absolute.
    pub fn config_path(&self, s: &Service) -> PathBuf {
        self.root.join(&s.config)
    }

    /// A service's pidfile.
    pub fn pid_path(&self, name: &str) -> PathBuf {
        self.service_dir(name).join(format!("{name}.pid"))
    }

    /// A service's log (stdout and stderr, appended across restarts).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.service_dir(name).join(format!("{name}.log"))
    }

    /// Where endpoints live.
    pub fn endpoints_dir(&self) -> PathBuf {
        self.root.join("endpoints")
    }

    /// One endpoint's directory (`endpoint.toml`, pgdata, log, pidfile).
    pub fn endpoint_dir(&self, name: &str) -> PathBuf {
        self.endpoints_dir().join(name)
    }
}

/// Writes `cluster.toml` as a new revision: every change of the cluster's
/// state goes through here, so the hosts' copies can tell the newest.
pub fn save_cluster(root: &Path, cluster: &mut ClusterFile) -> Result<()> {
    cluster.revision += 1;
    cluster.format_version = FORMAT_VERSION;
    write_toml(&root.join(CLUSTER_FILE), CLUSTER_HEADER, cluster)
}

/// Reads a TOML file into `T`, naming the file in the error.
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = fs::read_to_string(path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

/// Replaces a file atomically and durably, so a crash never leaves a
/// half-written config or pidfile behind.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    strata_service::durable::replace_file(path, contents.as_bytes(), true).map_err(|e| Error::Failed(e.to_string()))
}

/// Serializes `value` as TOML under a comment header and writes it atomically.
pub fn write_toml<T: serde::Serialize>(path: &Path, header: &str, value: &T) -> Result<()> {
    let body = toml::to_string(value).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    write_atomic(path, &format!("{header}{body}"))
}

fn mkdir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

/// Builds a service config from the fields `init` decides and checks it by
/// deserializing into the service's own config type, so every field the
/// service adds later with a default keeps that default here.
fn service_config<T: DeserializeOwned>(fields: serde_json::Value, what: &str) -> Result<T> {
    serde_json::from_value(fields).map_err(|e| Error::Failed(format!("building the {what} config: {e}")))
}

/// `--hosts FILE` of `strata init`: the machines and what each runs.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsSpec {
    pub hosts: Vec<HostSpec>,
    /// Object storage every host reaches (default: `remote_storage/` in the
    /// workdir, which then must be one shared directory on every host).
    #[serde(default)]
    pub remote_storage: Option<strata_remote_storage::RemoteStorageConfig>,
}

/// One host of `--hosts`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub name: String,
    pub address: std::net::IpAddr,
    #[serde(default = "local_host_name")]
    pub site: String,
    /// `safekeeper` (once per safekeeper), `pageserver` (once per
    /// pageserver; a storage controller runs beside each), `compute`.
    pub run: Vec<String>,
}

impl HostsSpec {
    /// The one-host cluster of `strata init` without `--hosts`.
    fn local(safekeepers: usize, pageservers: usize) -> HostsSpec {
        let mut run = vec!["safekeeper".to_string(); safekeepers];
        run.extend(std::iter::repeat_n("pageserver".to_string(), pageservers));
        run.push("compute".to_string());
        HostsSpec {
            hosts: vec![HostSpec { name: LOCAL_HOST.into(), address: LOOPBACK, site: LOCAL_HOST.into(), run }],
            remote_storage: None,
        }
    }

    /// The cluster of `strata init --sites K`: one loopback host per site
    /// (`dc1`…), the safekeepers spread with the remainder in the first
    /// sites, `pageservers` in each site, computes everywhere.
    fn sites(k: usize, safekeepers: usize, pageservers: usize) -> std::result::Result<HostsSpec, String> {
        if !(2..=4).contains(&k) {
            return Err(format!("--sites must be between 2 and 4, not {k}"));
        }
        if pageservers * k > 9 {
            return Err(format!("{pageservers} pageservers in each of {k} sites: a cluster has at most 9"));
        }
        let hosts = (0..k)
            .map(|i| {
                let count = safekeepers / k + usize::from(i < safekeepers % k);
                let mut run = vec!["safekeeper".to_string(); count];
                run.extend(std::iter::repeat_n("pageserver".to_string(), pageservers));
                run.push("compute".to_string());
                let name = format!("dc{}", i + 1);
                HostSpec { name: name.clone(), address: LOOPBACK, site: name, run }
            })
            .collect();
        Ok(HostsSpec { hosts, remote_storage: None })
    }

    /// What each host runs: `(host index, kind)` of every service, the
    /// safekeepers first in the order given.
    fn services(&self) -> std::result::Result<Vec<(usize, Kind)>, String> {
        let mut sks = Vec::new();
        let mut ps = Vec::new();
        for (i, h) in self.hosts.iter().enumerate() {
            for role in &h.run {
                match role.as_str() {
                    "safekeeper" => sks.push((i, Kind::Safekeeper)),
                    "pageserver" => ps.push((i, Kind::Pageserver)),
                    "compute" => {}
                    other => {
                        return Err(format!(
                            "host {}: cannot run {other:?} (safekeeper, pageserver or compute)",
                            h.name
                        ))
                    }
                }
            }
        }
        if !(1..=9).contains(&sks.len()) {
            return Err(format!("{} safekeepers: a cluster has between 1 and 9", sks.len()));
        }
        if !(1..=9).contains(&ps.len()) {
            return Err(format!("{} pageservers: a cluster has between 1 and 9", ps.len()));
        }
        if !self.hosts.iter().any(|h| h.run.iter().any(|r| r == "compute")) {
            return Err("no host runs computes (add \"compute\" to a host's `run`)".into());
        }
        sks.extend(ps);
        Ok(sks)
    }
}

/// The name of the `i`th pageserver (from 0).
fn ps_service_name(i: usize) -> String {
    if i == 0 {
        "pageserver".to_string()
    } else {
        format!("pageserver{}", i + 1)
    }
}

/// The name of the storage controller beside the `i`th pageserver.
fn controller_name(i: usize) -> String {
    if i == 0 {
        "controller".to_string()
    } else {
        format!("controller{}", i + 1)
    }
}

/// `strata init`: chooses ports and ids and writes `cluster.toml` and every
/// service's config; refuses an already initialised workdir.
pub fn init(args: &InitArgs) -> Result<()> {
    let spec = match (&args.hosts, args.safekeepers, args.pageservers) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(Error::Usage(
                "--safekeepers and --pageservers apply without --hosts (the hosts file places them)".into(),
            ))
        }
        (Some(path), None, None) => read_toml::<HostsSpec>(path)?,
        (None, n, p) => {
            let n = n.unwrap_or(3);
            if !(1..=9).contains(&n) {
                return Err(Error::Usage(format!("--safekeepers must be between 1 and 9, not {n}")));
            }
            let p = p.unwrap_or(1);
            if !(1..=9).contains(&p) {
                return Err(Error::Usage(format!("--pageservers must be between 1 and 9, not {p}")));
            }
            match args.sites {
                Some(k) => HostsSpec::sites(k, n, p).map_err(Error::Usage)?,
                None => HostsSpec::local(n, p),
            }
        }
    };
    let latency_ms = args.site_latency_ms.unwrap_or(0.0);
    if !(0.0..=10_000.0).contains(&latency_ms) {
        return Err(Error::Usage(format!("--site-latency-ms must be between 0 and 10000, not {latency_ms}")));
    }
    let placement = spec.services().map_err(Error::Usage)?;
    let main_placement = match (args.sites, args.placement.as_deref()) {
        (None, _) | (Some(_), Some("majority")) => None,
        (Some(_), Some("stretched")) => Some(strata_protocol::safekeeper::Placement::Stretched),
        (Some(_), _) => Some(strata_protocol::safekeeper::Placement::LocalQuorum {
            home: spec.hosts[0].site.clone(),
            max_async_lag: strata_protocol::safekeeper::membership::DEFAULT_MAX_ASYNC_LAG,
            on_async_lag: Default::default(),
        }),
    };
    if main_placement == Some(strata_protocol::safekeeper::Placement::Stretched) {
        let mut sites: Vec<&str> = placement
            .iter()
            .filter(|(_, k)| *k == Kind::Safekeeper)
            .map(|(h, _)| spec.hosts[*h].site.as_str())
            .collect();
        sites.dedup();
        if sites.len() < 2 {
            return Err(Error::Usage("--placement stretched needs safekeepers in two sites".into()));
        }
    }
    let secure = !args.insecure_loopback;
    if !secure {
        if let Some(h) = spec.hosts.iter().find(|h| !h.address.is_loopback()) {
            return Err(Error::Usage(format!(
                "--insecure-loopback: host {} is at {}, not on loopback; beyond loopback every link needs TLS and tokens",
                h.name, h.address
            )));
        }
    }
    let dir = &args.workdir.workdir;
    let file = dir.join(CLUSTER_FILE);
    if file.exists() {
        return failed(format!("{}: exists; a cluster is already initialised in {}", file.display(), dir.display()));
    }
    mkdir(dir)?;
    let root = fs::canonicalize(dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let remote_storage = spec
        .remote_storage
        .clone()
        .unwrap_or_else(|| strata_remote_storage::RemoteStorageConfig::Local { path: root.join(REMOTE_STORAGE_DIR) });

    // Three ports per safekeeper, two per pageserver, one per controller
    // (one beside each pageserver) and one per host's node API, bound at
    // once so they differ.
    let n = placement.iter().filter(|(_, k)| *k == Kind::Safekeeper).count();
    let np = placement.iter().filter(|(_, k)| *k == Kind::Pageserver).count();
    let first_node_port = 3 * n + 3 * np;
    // With sites: the link proxy's HTTP port, then a route from every site
    // to every port of every service in another site.
    let mut sites: Vec<&str> = spec.hosts.iter().map(|h| h.site.as_str()).collect();
    sites.dedup();
    let proxy_port = first_node_port + spec.hosts.len();
    let mut wanted_routes: Vec<(String, String, &'static str)> = Vec::new();
    if args.sites.is_some() {
        let ps_count = |upto: usize| placement[..upto].iter().filter(|(_, k)| *k == Kind::Pageserver).count();
        for (i, (host, kind)) in placement.iter().enumerate() {
            let (name, roles): (String, &[&'static str]) = match kind {
                Kind::Safekeeper => (format!("sk{}", i + 1), &["listen", "http", "pg"]),
                _ => (ps_service_name(ps_count(i)), &["pg", "http"]),
            };
            let mut names = vec![(name, roles)];
            if *kind == Kind::Pageserver {
                names.push((controller_name(ps_count(i)), &["http"]));
            }
            for site in sites.iter().filter(|s| **s != spec.hosts[*host].site) {
                for (name, roles) in &names {
                    wanted_routes.extend(roles.iter().map(|r| (site.to_string(), name.clone(), *r)));
                }
            }
        }
    }
    let extra = if args.sites.is_some() { 1 + wanted_routes.len() } else { 0 };
    let ports =
        ports::allocate(proxy_port + extra, &[]).map_err(|e| Error::Failed(format!("finding free ports: {e}")))?;
    let routes: Vec<Route> = wanted_routes
        .into_iter()
        .enumerate()
        .map(|(i, (site, service, role))| Route { site, service, role: role.into(), port: ports[proxy_port + 1 + i] })
        .collect();
    // The proxy runs on the first host; a route is reached at its address.
    let via = |from: usize, service: &str, role: &str, direct: String| -> String {
        routes
            .iter()
            .find(|r| r.site == spec.hosts[from].site && r.service == service && r.role == role)
            .map_or(direct, |r| std::net::SocketAddr::new(spec.hosts[0].address, r.port).to_string())
    };
    let hosts: Vec<Host> = spec
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| Host {
            name: h.name.clone(),
            address: h.address,
            site: h.site.clone(),
            node_port: ports[first_node_port + i],
            computes: h.run.iter().any(|r| r == "compute"),
        })
        .collect();
    let sk_port = |i: usize, role: usize| ports[3 * i + role];
    let at = |host: usize, port: u16| std::net::SocketAddr::new(hosts[host].address, port).to_string();
    let host_tls = |host: usize| secure.then(|| super::certs::service_tls(&root, &hosts[host].address.to_string()));
    let sk_hosts: Vec<usize> = placement.iter().filter(|(_, k)| *k == Kind::Safekeeper).map(|(h, _)| *h).collect();

    let mut services = Vec::new();
    let mut configs: Vec<(PathBuf, String)> = Vec::new();
    for (i, &host) in sk_hosts.iter().enumerate() {
        let name = format!("sk{}", i + 1);
        let peers: Vec<_> = (0..n)
            .filter(|&j| j != i)
            .map(|j| {
                let peer = format!("sk{}", j + 1);
                serde_json::json!({
                    "id": j + 1,
                    "address": via(host, &peer, "listen", at(sk_hosts[j], sk_port(j, 0))),
                    "http": via(host, &peer, "http", at(sk_hosts[j], sk_port(j, 1))),
                })
            })
            .collect();
        let config: strata_safekeeper::config::SafekeeperConfig = service_config(
            serde_json::json!({
                "id": i + 1,
                "listen": at(host, sk_port(i, 0)),
                "listen_http": at(host, sk_port(i, 1)),
                "listen_pg": at(host, sk_port(i, 2)),
                "data_dir": root.join(&name).join("data"),
                "peers": peers,
                "auth": secure.then(|| super::keys::service_auth(&root)),
                "tls": host_tls(host),
                // Completed WAL segments go to the same object storage as the layers.
                "remote_storage": remote_storage,
            }),
            "safekeeper",
        )?;
        let rel = PathBuf::from(&name).join("safekeeper.toml");
        configs.push((rel.clone(), toml::to_string(&config).map_err(|e| Error::Failed(format!("{name}: {e}")))?));
        services.push(Service {
            name,
            kind: Kind::Safekeeper,
            host: hosts[host].name.clone(),
            config: rel,
            ports: BTreeMap::from([
                ("listen".to_string(), sk_port(i, 0)),
                ("http".to_string(), sk_port(i, 1)),
                ("pg".to_string(), sk_port(i, 2)),
            ]),
            address: hosts[host].address,
        });
    }
    let ps_hosts: Vec<usize> = placement.iter().filter(|(_, k)| *k == Kind::Pageserver).map(|(h, _)| *h).collect();
    let ps_name = ps_service_name;
    let ps_port = |i: usize, role: usize| ports[3 * n + 2 * i + role];
    let mut ps_refs = Vec::new();
    for (i, &host) in ps_hosts.iter().enumerate() {
        let name = ps_name(i);
        // Its own site's safekeepers first: ties in choosing a WAL source go to them.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&j| hosts[sk_hosts[j]].site != hosts[host].site);
        let own_site = order.iter().filter(|&&j| hosts[sk_hosts[j]].site == hosts[host].site).count();
        // With every safekeeper in its site, there is no preference to state.
        let site_safekeepers = if own_site == n { 0 } else { own_site };
        let wal_sources: Vec<String> = order
            .into_iter()
            .map(|j| via(host, &format!("sk{}", j + 1), "listen", at(sk_hosts[j], sk_port(j, 0))))
            .collect();
        let config: strata_pageserver::config::PageserverConfig = service_config(
            serde_json::json!({
                // Node ids are unique within the deployment: the safekeepers have 1..=n.
                "id": n + 1 + i,
                "listen_pg": at(host, ps_port(i, 0)),
                "listen_http": at(host, ps_port(i, 1)),
                "data_dir": root.join(&name).join("data"),
                "safekeepers": wal_sources,
                "site_safekeepers": site_safekeepers,
                "auth": secure.then(|| super::keys::service_auth(&root)),
                "tls": host_tls(host),
                "pg_bin_dir": args.pg_bin_dir,
                "pg_user": args.pg_user,
                "verify_redo": args.verify_redo,
                "remote_storage": remote_storage,
                "attachments": root.join(&name).join(ATTACHMENTS_FILE),
                // The storage controller places the tenant.
                "controller": true,
            }),
            "pageserver",
        )?;
        let rel = PathBuf::from(&name).join("pageserver.toml");
        configs.push((rel.clone(), toml::to_string(&config).map_err(|e| Error::Failed(format!("{name}: {e}")))?));
        ps_refs.push(serde_json::json!({
            "name": name,
            "pg": at(host, ps_port(i, 0)),
            "http": at(host, ps_port(i, 1)),
            "site": hosts[host].site,
        }));
        services.push(Service {
            name,
            kind: Kind::Pageserver,
            host: hosts[host].name.clone(),
            config: rel,
            ports: BTreeMap::from([("pg".to_string(), ps_port(i, 0)), ("http".to_string(), ps_port(i, 1))]),
            address: hosts[host].address,
        });
    }
    let tenant_id = TenantId::generate();
    // A storage controller beside each pageserver: one leads, the others
    // take over when it dies (`docs/storage-controller.md`).
    for (i, &host) in ps_hosts.iter().enumerate() {
        let name = controller_name(i);
        let port = ports[3 * n + 2 * np + i];
        let config: strata_controller::config::ControllerConfig = service_config(
            serde_json::json!({
                "id": i + 1,
                "listen_http": at(host, port),
                "remote_storage": remote_storage,
                "pageservers": ps_refs,
                "tenants": [tenant_id],
                "auth": secure.then(|| super::keys::service_auth(&root)),
                "tls": host_tls(host),
            }),
            "controller",
        )?;
        let rel = PathBuf::from(&name).join("controller.toml");
        configs.push((rel.clone(), toml::to_string(&config).map_err(|e| Error::Failed(format!("{name}: {e}")))?));
        services.push(Service {
            name,
            kind: Kind::Controller,
            host: hosts[host].name.clone(),
            config: rel,
            ports: BTreeMap::from([("http".to_string(), port)]),
            address: hosts[host].address,
        });
    }

    if args.sites.is_some() {
        let name = "link-proxy".to_string();
        let port = ports[proxy_port];
        let config = strata_link_proxy::config::LinkProxyConfig {
            listen_http: std::net::SocketAddr::new(hosts[0].address, port),
            routes: routes
                .iter()
                .map(|r| {
                    let target = services.iter().find(|s| s.name == r.service).expect("routes name services");
                    strata_link_proxy::config::RouteConfig {
                        name: r.name(),
                        listen: std::net::SocketAddr::new(hosts[0].address, r.port),
                        target: std::net::SocketAddr::new(target.address, target.ports[&r.role]).to_string(),
                        // The round trip, half each way.
                        delay_ms: latency_ms / 2.0,
                        jitter_ms: 0.0,
                    }
                })
                .collect(),
            auth: secure.then(|| super::keys::service_auth(&root)),
            tls: host_tls(0),
            ..service_config(
                serde_json::json!({"listen_http": std::net::SocketAddr::new(hosts[0].address, port), "routes": []}),
                "link proxy",
            )?
        };
        let rel = PathBuf::from(&name).join("link-proxy.toml");
        configs.push((rel.clone(), toml::to_string(&config).map_err(|e| Error::Failed(format!("{name}: {e}")))?));
        services.insert(
            0,
            Service {
                name,
                kind: Kind::LinkProxy,
                host: hosts[0].name.clone(),
                config: rel,
                ports: BTreeMap::from([("http".to_string(), port)]),
                address: hosts[0].address,
            },
        );
    }

    let mut cluster = ClusterFile {
        format_version: FORMAT_VERSION,
        revision: 0,
        tenant_id,
        pg_bin_dir: args.pg_bin_dir.clone(),
        pg_user: args.pg_user.clone(),
        verify_redo: args.verify_redo,
        hosts,
        remote_storage: Some(remote_storage),
        branches: vec![Branch {
            name: MAIN_BRANCH.into(),
            timeline_id: TimelineId::generate(),
            parent: None,
            ancestor_lsn: None,
            placement: main_placement,
            divergent: None,
        }],
        services,
        routes,
        generation: 0,
    };
    cluster.check().map_err(Error::Usage)?;

    for s in &cluster.services {
        mkdir(&root.join(&s.name).join("data"))?;
    }
    mkdir(&root.join("endpoints"))?;
    if secure {
        super::keys::create(&root)?;
        let mut addresses: Vec<String> = cluster.hosts.iter().map(|h| h.address.to_string()).collect();
        addresses.dedup();
        super::certs::create(&root, &addresses.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    for (rel, text) in &configs {
        let header = "# Written by `strata init`; ports and paths must match cluster.toml.\n";
        write_atomic(&root.join(rel), &format!("{header}{text}"))?;
    }
    // cluster.toml last: its presence means the workdir is complete.
    save_cluster(&root, &mut cluster)?;

    println!("initialised a cluster in {}", root.display());
    println!("tenant {}, branch {MAIN_BRANCH} = timeline {}", cluster.tenant_id, cluster.branches[0].timeline_id);
    for s in &cluster.services {
        let ports: Vec<String> = s.ports.iter().map(|(r, p)| format!("{r}={p}")).collect();
        println!("{:<12} {:<11} {:<15} {}", s.name, s.kind.as_str(), s.address, ports.join(" "));
    }
    if cluster.hosts.iter().all(Host::is_loopback) {
        println!("start it with `strata start --workdir {}`", dir.display());
    } else {
        println!(
            "copy {} to the same path on every host and run `strata node --workdir {} --host NAME` on each (docs/deployment.md)",
            root.display(),
            root.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::WorkdirArgs;

    fn init_args(dir: &Path, n: usize) -> InitArgs {
        InitArgs {
            workdir: WorkdirArgs { workdir: dir.to_path_buf(), only: vec![], immediate: false },
            safekeepers: Some(n),
            pageservers: None,
            hosts: None,
            pg_bin_dir: "/usr/lib/postgresql/15/bin".into(),
            pg_user: "postgres".into(),
            verify_redo: false,
            insecure_loopback: false,
            sites: None,
            site_latency_ms: None,
            placement: None,
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("strata-layout-{tag}-{}", TimelineId::generate()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn init_writes_loadable_configs_with_distinct_ports() {
        let dir = tempdir("init");
        init(&init_args(&dir, 3)).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        // Three safekeepers, a pageserver and its storage controller.
        assert_eq!(wd.cluster.services.len(), 5);
        let mut ports = wd.cluster.ports();
        let count = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), count, "ports must be distinct");

        let sk2 =
            strata_safekeeper::config::SafekeeperConfig::load(&wd.config_path(wd.service("sk2").unwrap())).unwrap();
        assert_eq!(sk2.id.0, 2);
        assert_eq!(sk2.peers.iter().map(|p| p.id.0).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(sk2.listen.port(), wd.service("sk2").unwrap().ports["listen"]);
        assert_eq!(sk2.listen_pg.unwrap().port(), wd.service("sk2").unwrap().ports["pg"]);
        assert_eq!(sk2.peers[0].address, wd.service("sk1").unwrap().addr("listen").unwrap());

        let ps = wd.service("pageserver").unwrap();
        let psc = strata_pageserver::config::PageserverConfig::load(&wd.config_path(ps)).unwrap();
        assert_eq!(psc.safekeepers, wd.cluster.safekeeper_addrs_from(LOCAL_HOST));
        assert_eq!(psc.listen_http.port(), ps.ports["http"]);
        assert_eq!(psc.data_dir, wd.root.join("pageserver/data"));
        assert_eq!(psc.id.0, 4);
        assert!(psc.controller, "the storage controller places the tenant");
        let cc = strata_controller::config::ControllerConfig::load(&wd.config_path(wd.service("controller").unwrap()))
            .unwrap();
        assert_eq!(cc.tenants, vec![wd.cluster.tenant_id]);
        assert_eq!(cc.pageservers[0].http, ps.addr("http").unwrap());
        // Several pageservers: a controller beside each, every port distinct.
        let dir2 = tempdir("init2");
        init(&InitArgs { pageservers: Some(3), ..init_args(&dir2, 3) }).unwrap();
        let wd2 = Workdir::open(&dir2).unwrap();
        let names: Vec<&str> = wd2.cluster.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sk1",
                "sk2",
                "sk3",
                "pageserver",
                "pageserver2",
                "pageserver3",
                "controller",
                "controller2",
                "controller3"
            ]
        );
        let mut ports = wd2.cluster.ports();
        let count = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), count, "ports must be distinct");
        let ids: Vec<u64> = ["pageserver", "pageserver2", "pageserver3"]
            .iter()
            .map(|n| {
                strata_pageserver::config::PageserverConfig::load(&wd2.config_path(wd2.service(n).unwrap()))
                    .unwrap()
                    .id
                    .0
            })
            .collect();
        assert_eq!(ids, [4, 5, 6]);
        fs::remove_dir_all(&dir2).unwrap();
        // Tokens and TLS, with the secrets readable by their owner only.
        let (auth, tls) = (psc.auth.expect("[auth]"), psc.tls.expect("[tls]"));
        assert_eq!(sk2.tls.as_ref(), Some(&tls));
        use std::os::unix::fs::PermissionsExt;
        for secret in [tls.key.clone(), dir.join("tls/ca.key"), auth.token_file.unwrap(), dir.join("auth/private.pem")]
        {
            let mode = fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", secret.display());
        }
        strata_service::tls::ServerTls::load(&tls.cert, &tls.key).unwrap();
        strata_service::tls::ClientTls::load(&tls.ca).unwrap();

        assert!(matches!(init(&init_args(&dir, 3)), Err(Error::Failed(_))), "a second init must be refused");
        let zero = tempdir("zero");
        assert!(matches!(init(&init_args(&zero, 0)), Err(Error::Usage(_))));
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&zero).unwrap();
    }

    #[test]
    fn an_insecure_cluster_has_neither_tokens_nor_tls() {
        let dir = tempdir("insecure");
        init(&InitArgs { insecure_loopback: true, ..init_args(&dir, 3) }).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        let ps = wd.service("pageserver").unwrap();
        let psc = strata_pageserver::config::PageserverConfig::load(&wd.config_path(ps)).unwrap();
        assert_eq!((psc.auth, psc.tls), (None, None));
        let sk1 =
            strata_safekeeper::config::SafekeeperConfig::load(&wd.config_path(wd.service("sk1").unwrap())).unwrap();
        assert_eq!((sk1.auth, sk1.tls), (None, None));
        assert!(!dir.join("auth").exists() && !dir.join("tls").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cluster_file_roundtrips_and_is_checked() {
        let dir = tempdir("rt");
        init(&init_args(&dir, 1)).unwrap();
        let text = fs::read_to_string(dir.join(CLUSTER_FILE)).unwrap();
        let mut parsed: ClusterFile = toml::from_str(&text).unwrap();
        parsed.check().unwrap();
        assert_eq!(parsed, Workdir::open(&dir).unwrap().cluster);
        assert!(parsed.services.iter().all(|s| s.address == LOOPBACK && s.host == LOCAL_HOST));
        let mut broken = parsed.clone();
        broken.services.retain(|s| s.kind != Kind::Pageserver);
        assert!(broken.check().is_err());
        let mut dup = parsed;
        dup.services[1].name = dup.services[0].name.clone();
        assert!(dup.check().is_err());
        assert!(Workdir::open(&dir.join("nowhere")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    fn hosts_file(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("hosts.toml");
        fs::write(&path, text).unwrap();
        path
    }

    const SIX_HOSTS: &str = r#"
[[hosts]]
name = "sk-a"
address = "10.9.0.11"
site = "dc1"
run = ["safekeeper"]
[[hosts]]
name = "sk-b"
address = "10.9.0.12"
site = "dc1"
run = ["safekeeper"]
[[hosts]]
name = "sk-c"
address = "10.9.0.13"
site = "dc2"
run = ["safekeeper"]
[[hosts]]
name = "ps"
address = "10.9.0.14"
site = "dc1"
run = ["pageserver", "compute"]
[[hosts]]
name = "cp"
address = "10.9.0.15"
site = "dc2"
run = ["compute"]
"#;

    #[test]
    fn init_places_services_on_their_hosts() {
        let dir = tempdir("hosts");
        let spec = hosts_file(&dir, SIX_HOSTS);
        let wd_dir = dir.join("w");
        init(&InitArgs { hosts: Some(spec), safekeepers: None, ..init_args(&wd_dir, 3) }).unwrap();
        let wd = Workdir::open(&wd_dir).unwrap();
        let placed: Vec<(&str, &str)> =
            wd.cluster.services.iter().map(|s| (s.name.as_str(), s.host.as_str())).collect();
        assert_eq!(
            placed,
            [("sk1", "sk-a"), ("sk2", "sk-b"), ("sk3", "sk-c"), ("pageserver", "ps"), ("controller", "ps")]
        );
        let computes: Vec<&str> = wd.cluster.hosts.iter().filter(|h| h.computes).map(|h| h.name.as_str()).collect();
        assert_eq!(computes, ["ps", "cp"]);
        assert_eq!(wd.cluster.hosts[2].site, "dc2");
        // Every address is the host's, in every config; each host has its certificate.
        let sk3 =
            strata_safekeeper::config::SafekeeperConfig::load(&wd.config_path(wd.service("sk3").unwrap())).unwrap();
        assert_eq!(sk3.listen.ip().to_string(), "10.9.0.13");
        assert_eq!(sk3.peers[0].address, wd.service("sk1").unwrap().addr("listen").unwrap());
        assert!(sk3.peers[0].address.starts_with("10.9.0.11:"));
        let ps = strata_pageserver::config::PageserverConfig::load(&wd.config_path(wd.service("pageserver").unwrap()))
            .unwrap();
        assert_eq!(ps.listen_pg.ip().to_string(), "10.9.0.14");
        assert_eq!(ps.safekeepers, wd.cluster.safekeeper_addrs_from("dc1"));
        assert_eq!(ps.tls.as_ref().unwrap().cert, wd_dir.canonicalize().unwrap().join("tls/10.9.0.14.pem"));
        for h in &wd.cluster.hosts {
            assert!(wd_dir.join(format!("tls/{}.pem", h.address)).exists(), "{}", h.name);
            assert_ne!(h.node_port, 0);
        }
        assert_eq!(wd.cluster.revision, 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_hosts_file_that_cannot_make_a_cluster_is_refused() {
        let dir = tempdir("badhosts");
        let refused = |text: &str, needle: &str| {
            let spec = hosts_file(&dir, text);
            let wd_dir = dir.join("w");
            match init(&InitArgs { hosts: Some(spec), safekeepers: None, ..init_args(&wd_dir, 3) }) {
                Err(Error::Usage(e)) | Err(Error::Failed(e)) => assert!(e.contains(needle), "{e} (wanted {needle})"),
                Ok(()) => panic!("accepted: {text}"),
            }
            assert!(!wd_dir.join(CLUSTER_FILE).exists());
        };
        let one = |name: &str, addr: &str, run: &str| {
            format!("[[hosts]]\nname = \"{name}\"\naddress = \"{addr}\"\nrun = [{run}]\n")
        };
        refused(&(one("a", "10.0.0.1", "\"safekeeper\", \"compute\"")), "pageservers");
        refused(
            &(one("a", "10.0.0.1", &format!("\"safekeeper\", \"compute\"{}", ", \"pageserver\"".repeat(10)))),
            "10 pageservers",
        );
        refused(&(one("a", "10.0.0.1", "\"safekeeper\", \"pageserver\"")), "no host runs computes");
        refused(&(one("a", "10.0.0.1", "\"safekeeper\", \"pageserver\", \"bouncer\"")), "bouncer");
        refused(&(one("a", "10.0.0.1", "\"pageserver\", \"compute\"")), "0 safekeepers");
        refused(
            &(one("a", "10.0.0.1", "\"safekeeper\"") + &one("a", "10.0.0.2", "\"pageserver\", \"compute\"")),
            "same name",
        );
        refused(&(one("a", "0.0.0.0", "\"safekeeper\", \"pageserver\", \"compute\"")), "not an address");
        refused("[[hosts]]\nname = \"a\"\naddress = \"nowhere\"\nrun = []\n", "address");
        // Without TLS and tokens, only loopback.
        let spec = hosts_file(&dir, SIX_HOSTS);
        let insecure =
            InitArgs { hosts: Some(spec), safekeepers: None, insecure_loopback: true, ..init_args(&dir.join("w"), 3) };
        assert!(matches!(init(&insecure), Err(Error::Usage(e)) if e.contains("not on loopback")));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cluster_file_from_before_hosts_is_one_host_on_loopback() {
        let dir = tempdir("v1");
        init(&init_args(&dir, 1)).unwrap();
        let text = fs::read_to_string(dir.join(CLUSTER_FILE)).unwrap();
        let mut v1: toml::Table = toml::from_str(&text).unwrap();
        v1.insert("format_version".into(), 1.into());
        v1.remove("hosts");
        v1.remove("revision");
        for s in v1["services"].as_array_mut().unwrap() {
            s.as_table_mut().unwrap().remove("host");
        }
        fs::write(dir.join(CLUSTER_FILE), toml::to_string(&v1).unwrap()).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        assert_eq!(wd.cluster.hosts, local_hosts());
        assert!(wd.cluster.services.iter().all(|s| s.address == LOOPBACK));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn init_with_sites_routes_every_link_between_sites_through_the_proxy() {
        let dir = tempdir("sites");
        let args = InitArgs { sites: Some(2), site_latency_ms: Some(6.0), ..init_args(&dir, 3) };
        init(&args).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        let c = &wd.cluster;
        let placed: Vec<(&str, &str)> = c.services.iter().map(|s| (s.name.as_str(), c.site_of(s))).collect();
        assert_eq!(
            placed,
            [
                ("link-proxy", "dc1"),
                ("sk1", "dc1"),
                ("sk2", "dc1"),
                ("sk3", "dc2"),
                ("pageserver", "dc1"),
                ("pageserver2", "dc2"),
                ("controller", "dc1"),
                ("controller2", "dc2"),
            ]
        );
        assert_eq!(
            c.branches[0].placement,
            Some(strata_protocol::safekeeper::Placement::LocalQuorum {
                home: "dc1".into(),
                max_async_lag: strata_protocol::safekeeper::membership::DEFAULT_MAX_ASYNC_LAG,
                on_async_lag: Default::default(),
            })
        );
        // dc1 reaches every port of dc2's services through a route and its
        // own directly; likewise dc2.
        let proxy =
            strata_link_proxy::config::LinkProxyConfig::load(&wd.config_path(wd.service("link-proxy").unwrap()))
                .unwrap();
        assert_eq!(proxy.routes.len(), c.routes.len());
        // sk3: 3 ports, pageserver2: 2, controller2: 1; and the same of dc1 (sk1, sk2, pageserver, controller) from dc2.
        assert_eq!(c.routes.len(), 6 + 3 + 3 + 2 + 1);
        for r in &proxy.routes {
            assert_eq!(r.delay_ms, 3.0, "half the round trip each way");
            let route = c.routes.iter().find(|x| x.name() == r.name).unwrap();
            let target = wd.service(&route.service).unwrap();
            assert_eq!(r.target, target.addr(&route.role).unwrap());
            assert_ne!(c.site_of(target), route.site);
        }
        let sk3 = wd.service("sk3").unwrap();
        let sk1 = wd.service("sk1").unwrap();
        let routed = c.addr_from("dc1", sk3, "listen").unwrap();
        assert_ne!(routed, sk3.addr("listen").unwrap());
        assert_eq!(c.addr_from("dc2", sk3, "listen"), sk3.addr("listen"));
        // The configs use the routes: sk3's peers, each pageserver's WAL
        // sources (its own site's first).
        let sk3c = strata_safekeeper::config::SafekeeperConfig::load(&wd.config_path(sk3)).unwrap();
        assert_eq!(sk3c.peers[0].address, c.addr_from("dc2", sk1, "listen").unwrap());
        assert_ne!(sk3c.peers[0].address, sk1.addr("listen").unwrap());
        let ps2 =
            strata_pageserver::config::PageserverConfig::load(&wd.config_path(wd.service("pageserver2").unwrap()))
                .unwrap();
        assert_eq!(ps2.safekeepers[0], sk3.addr("listen").unwrap());
        assert_eq!(ps2.safekeepers[1], c.addr_from("dc2", sk1, "listen").unwrap());
        let ps1 = strata_pageserver::config::PageserverConfig::load(&wd.config_path(wd.service("pageserver").unwrap()))
            .unwrap();
        assert_eq!(ps1.safekeepers[2], routed);
        // Each streams from its own site's safekeepers while they keep up.
        assert_eq!((ps1.site_safekeepers, ps2.site_safekeepers), (2, 1));
        assert_eq!((c.site_safekeepers("dc1"), c.site_safekeepers("dc2")), (2, 1));
        // The controllers know each pageserver's site (a reader per other site).
        let ctl = strata_controller::config::ControllerConfig::load(&wd.config_path(wd.service("controller").unwrap()))
            .unwrap();
        let sites: Vec<Option<&str>> = ctl.pageservers.iter().map(|p| p.site.as_deref()).collect();
        assert_eq!(sites, [Some("dc1"), Some("dc2")]);
        assert_eq!(c.address_map_from("dc2").len(), 6 + 3);
        // Ports stay distinct, routes included.
        let mut ports = c.ports();
        ports.extend(c.routes.iter().map(|r| r.port));
        let count = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), count);
        // Refused: one site, too many, stretched with every safekeeper in dc1.
        for (sites, n, placement) in [(1, 3, None), (5, 3, None), (2, 1, Some("stretched"))] {
            let d = tempdir("badsites");
            let args = InitArgs { sites: Some(sites), placement: placement.map(str::to_string), ..init_args(&d, n) };
            assert!(matches!(init(&args), Err(Error::Usage(_))), "{sites} sites, {n} safekeepers, {placement:?}");
            fs::remove_dir_all(&d).unwrap();
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
