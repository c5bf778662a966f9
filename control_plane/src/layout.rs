//! The workdir: `cluster.toml`, every path of a service or endpoint, the
//! command lock, and `strata init` which writes it all.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::de::DeserializeOwned;
use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantId, TenantShardId, TimelineId};

use super::error::{failed, Error, Result};
use crate::limits::{LOCK_POLL, LOCK_WAIT};

/// Name of the cluster description inside the workdir.
pub const CLUSTER_FILE: &str = "cluster.toml";
/// Version of the `cluster.toml` format written by this binary (version 1,
/// from before hosts, is read as one host on loopback; version 2, from
/// before tenants, as one tenant named [`DEFAULT_TENANT`]).
pub const FORMAT_VERSION: u32 = 3;
/// The tenant every new cluster has, and the one a cluster from before
/// tenants is read as; commands without `--tenant` use it.
pub const DEFAULT_TENANT: &str = "default";
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
/// The pageservers' kept initdb output inside the workdir: outside their
/// private directories, since initdb runs as `pg_user` and must reach it.
pub const INITDB_TEMPLATE_DIR: &str = "initdb-template";

/// `cluster.toml`: what `strata init` decided; read by every other command.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub format_version: u32,
    /// Counts the changes of this file and of the services' configs: the
    /// hosts' copies converge on the highest (`docs/deployment.md`).
    #[serde(default)]
    pub revision: u64,
    /// Names this cluster: hosts refuse a copy of another cluster's files.
    /// For a cluster made before tenants, its one tenant's id.
    pub cluster_id: TenantId,
    /// PostgreSQL 15 server binaries, for the pageserver's initdb and the computes.
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs initdb and PostgreSQL when Strata runs as root.
    pub pg_user: String,
    /// Computes log images of every change and the pageserver checks native redo against them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_redo: bool,
    /// Scale to zero: an endpoint that does not set its own idle period
    /// (`strata endpoint start --suspend-after`) suspends after this many
    /// seconds without a client (`docs/compute.md`, "Suspend"); absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_suspend_after_secs: Option<u64>,
    /// The machines the cluster runs on (`docs/deployment.md`).
    #[serde(default = "local_hosts")]
    pub hosts: Vec<Host>,
    /// The object storage of the pageserver and the safekeepers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<strata_remote_storage::RemoteStorageConfig>,
    /// Its tenants, each a PostgreSQL cluster of its own with its branches.
    #[serde(default)]
    pub tenants: Vec<Tenant>,
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
pub(crate) fn local_hosts() -> Vec<Host> {
    vec![Host { name: LOCAL_HOST.into(), address: LOOPBACK, site: LOCAL_HOST.into(), node_port: 0, computes: true }]
}

pub(crate) fn local_host_name() -> String {
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

/// A tenant: one PostgreSQL cluster (one system identifier) with its branches.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Unique in the cluster; a DNS label (endpoints' names are too).
    pub name: String,
    pub tenant_id: TenantId,
    /// Where `strata tenant create` or `delete` got to, so that either
    /// resumes after a crash; absent once created.
    #[serde(default, skip_serializing_if = "TenantState::is_active")]
    pub state: TenantState,
    /// Its PostgreSQL major, set at creation (15 when absent); every
    /// branch has it (`docs/postgres-versions.md`).
    #[serde(default = "default_pg_version", skip_serializing_if = "is_default_pg_version")]
    pub pg_version: u32,
    /// While a streaming import follows its source: the source's slot for
    /// the relay. `main` takes no writer until `strata tenant cutover`
    /// (`docs/import.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<String>,
    /// A sharded tenant's layout (`docs/sharding.md`); absent: unsharded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardLayout>,
    pub branches: Vec<Branch>,
}

/// The major of tenants made before majors could be chosen.
pub const DEFAULT_PG_VERSION: u32 = 15;

fn default_pg_version() -> u32 {
    DEFAULT_PG_VERSION
}

/// The majors a tenant can have (`docs/postgres-versions.md`): 16 has no
/// build here to check Strata's formats against.
pub const TENANT_PG_VERSIONS: [u32; 3] = [15, 17, 18];

/// Refuses a major a tenant cannot have, by name.
pub fn check_pg_version(v: u32) -> Result<()> {
    if TENANT_PG_VERSIONS.contains(&v) {
        Ok(())
    } else {
        Err(Error::Usage(format!("PostgreSQL {v} is not a major a tenant can have: 15, 17 or 18")))
    }
}

fn is_default_pg_version(v: &u32) -> bool {
    *v == DEFAULT_PG_VERSION
}

impl Tenant {
    /// A branch by name.
    pub fn branch(&self, name: &str) -> Option<&Branch> {
        self.branches.iter().find(|b| b.name == name)
    }

    /// How reports name one of its branches: `acme/dev`, or just `dev`
    /// in the default tenant (as before there were tenants).
    pub fn label(&self, branch: &str) -> String {
        match self.name == DEFAULT_TENANT {
            true => branch.to_string(),
            false => format!("{}/{branch}", self.name),
        }
    }

    /// `e` saying which tenant it is about (unless the default one).
    pub fn context(&self, e: Error) -> Error {
        match (self.name == DEFAULT_TENANT, e) {
            (true, e) => e,
            (false, Error::Usage(m)) => Error::Usage(format!("tenant {}: {m}", self.name)),
            (false, e) => Error::Failed(format!("tenant {}: {e}", self.name)),
        }
    }

    /// How its keys are spread (one shard when unsharded).
    pub fn layout(&self) -> ShardLayout {
        self.shards.unwrap_or_default()
    }

    pub fn is_sharded(&self) -> bool {
        self.layout().is_sharded()
    }

    /// Its shards, in order: the pageservers' names of its locations.
    pub fn shard_ids(&self) -> Vec<TenantShardId> {
        self.layout().shards().map(|shard| TenantShardId { tenant: self.tenant_id, shard }).collect()
    }

    /// Shard 0 (the tenant itself when unsharded): where basebackups,
    /// timeline questions and every non-relation key are.
    pub fn home(&self) -> TenantShardId {
        self.shard_ids()[0]
    }

    /// Its branches' names, for errors that list them.
    pub fn branch_names(&self) -> String {
        self.branches.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// A tenant's life cycle in `cluster.toml`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TenantState {
    /// Recorded, but its storage may not all exist yet.
    Creating,
    #[default]
    Active,
    /// Being removed: its endpoints, placement, timelines and objects go,
    /// then this entry.
    Deleting,
}

impl TenantState {
    fn is_active(&self) -> bool {
        *self == TenantState::Active
    }

    /// How status pages show it.
    pub fn as_str(self) -> &'static str {
        match self {
            TenantState::Creating => "creating",
            TenantState::Active => "active",
            TenantState::Deleting => "deleting",
        }
    }
}

/// A branch: a named timeline of a tenant.
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
    /// Its PostgreSQL major when not its tenant's: a branch made by
    /// `strata branch upgrade` (`docs/postgres-versions.md`, "Major
    /// upgrade"), and the branches of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_version: Option<u32>,
    /// When it was made, or last reset to its parent (Unix seconds);
    /// absent for branches made before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    /// The time it was made at (`--at-time`, RFC 3339), when it was made
    /// at a time rather than at an LSN or its parent's newest commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_time: Option<String>,
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
    /// The PostgreSQL address of every endpoint (`docs/proxy.md`).
    Proxy,
}

impl Kind {
    /// The `strata` subcommand that runs this kind of service (and its config file stem).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Safekeeper => "safekeeper",
            Kind::Pageserver => "pageserver",
            Kind::Controller => "controller",
            Kind::LinkProxy => "link-proxy",
            Kind::Proxy => "proxy",
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
        self.safekeeper_addrs_from_role(site, "listen")
    }

    /// [`Self::safekeeper_addrs_from`] for another of their ports (`http`:
    /// where a pageserver reads their positions), in the same order.
    pub fn safekeeper_addrs_from_role(&self, site: &str, role: &str) -> Vec<String> {
        let mut sks: Vec<&Service> = self.of_kind(Kind::Safekeeper).collect();
        sks.sort_by_key(|s| self.site_of(s) != site);
        sks.into_iter().filter_map(|s| self.addr_from(site, s, role)).collect()
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

    /// A tenant by name.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// The PostgreSQL major of the tenant with this id (15 if unknown).
    pub fn tenant_pg_version(&self, tenant_id: TenantId) -> u32 {
        self.tenants.iter().find(|t| t.tenant_id == tenant_id).map_or(DEFAULT_PG_VERSION, |t| t.pg_version)
    }

    /// The PostgreSQL major of a tenant's timeline: its branch's own, else
    /// the tenant's.
    pub fn timeline_pg_version(&self, tenant_id: TenantId, timeline_id: TimelineId) -> u32 {
        let tenant = self.tenants.iter().find(|t| t.tenant_id == tenant_id);
        let branch = tenant.and_then(|t| t.branches.iter().find(|b| b.timeline_id == timeline_id));
        branch.and_then(|b| b.pg_version).unwrap_or_else(|| self.tenant_pg_version(tenant_id))
    }

    /// Where PostgreSQL `major`'s programs are: `pg_bin_dir` for 15; for
    /// another major its sibling in Debian's layout when `pg_bin_dir` is
    /// `<root>/15/bin` (`<root>/<major>/bin`), else
    /// `/usr/lib/postgresql/<major>/bin`.
    pub fn pg_bin_dir_for(&self, major: u32) -> PathBuf {
        if major == DEFAULT_PG_VERSION {
            return self.pg_bin_dir.clone();
        }
        let root = self.pg_bin_dir.parent().filter(|d| d.ends_with("15")).and_then(|d| d.parent());
        match root {
            Some(root) => root.join(major.to_string()).join("bin"),
            None => PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")),
        }
    }

    /// A tenant by name, to change it.
    pub fn tenant_mut(&mut self, name: &str) -> Option<&mut Tenant> {
        self.tenants.iter_mut().find(|t| t.name == name)
    }

    /// A tenant by name, or an error that lists the tenants there are.
    pub fn tenant_named(&self, name: &str) -> Result<&Tenant> {
        self.tenant(name).ok_or_else(|| {
            let known: Vec<&str> = self.tenants.iter().map(|t| t.name.as_str()).collect();
            Error::Usage(format!("no tenant named {name:?} (tenants: {})", known.join(", ")))
        })
    }

    /// A tenant by id.
    pub fn tenant_by_id(&self, id: TenantId) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.tenant_id == id)
    }

    /// Every branch of every tenant, with its tenant.
    pub fn all_branches(&self) -> impl Iterator<Item = (&Tenant, &Branch)> {
        self.tenants.iter().flat_map(|t| t.branches.iter().map(move |b| (t, b)))
    }

    /// Parses `cluster.toml`, reading the formats of older versions as
    /// this one (a cluster from before tenants has one, [`DEFAULT_TENANT`]).
    pub fn parse(text: &str) -> std::result::Result<ClusterFile, String> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        let version = table.get("format_version").and_then(|v| v.as_integer()).unwrap_or(0);
        if version < 3 && !table.contains_key("tenants") {
            let id = table.remove("tenant_id").ok_or("no tenant_id (format version 2 has one)")?;
            let branches = table.remove("branches").unwrap_or_else(|| toml::Value::Array(Vec::new()));
            let mut tenant = toml::Table::new();
            tenant.insert("name".into(), toml::Value::String(DEFAULT_TENANT.into()));
            tenant.insert("tenant_id".into(), id.clone());
            tenant.insert("branches".into(), branches);
            table.insert("cluster_id".into(), id);
            table.insert("tenants".into(), toml::Value::Array(vec![toml::Value::Table(tenant)]));
        }
        toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| e.to_string())
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
    pub(crate) fn check(&mut self) -> std::result::Result<(), String> {
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
        let mut tenants: Vec<&str> = self.tenants.iter().map(|t| t.name.as_str()).collect();
        tenants.sort_unstable();
        if tenants.windows(2).any(|w| w[0] == w[1]) {
            return Err("two tenants have the same name".into());
        }
        let mut ids: Vec<TenantId> = self.tenants.iter().map(|t| t.tenant_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err("two tenants have the same id".into());
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
                Kind::Pageserver | Kind::Proxy => &["pg", "http"],
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
        let mut cluster = ClusterFile::parse(&text).map_err(|e| Error::Failed(format!("{}: {e}", file.display())))?;
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
    /// never spawn the same service or two writers on one branch. Calls
    /// `waiting` once if it has to wait, so the caller can say why it does.
    pub fn lock(&self, waiting: impl FnOnce()) -> Result<Lock> {
        let path = self.root.join("cluster.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
        let deadline = Instant::now() + LOCK_WAIT;
        let mut waiting = Some(waiting);
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
            if let Some(tell) = waiting.take() {
                tell();
            }
            std::thread::sleep(LOCK_POLL);
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

/// Reads `cluster.toml` afresh, changes it with `change` and writes it as
/// a new revision (nothing is written if `change` fails).
pub fn update_cluster<T>(root: &Path, change: impl FnOnce(&mut ClusterFile) -> Result<T>) -> Result<T> {
    let path = root.join(CLUSTER_FILE);
    let text = fs::read_to_string(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    let mut cluster = ClusterFile::parse(&text).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    let out = change(&mut cluster)?;
    save_cluster(root, &mut cluster)?;
    Ok(out)
}

/// Reads a TOML file into `T`, naming the file in the error.
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = fs::read_to_string(path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

/// Creates the directory `path` and its missing parents, each private to
/// its owner (0700): a service's directory holds its data (WAL, layers),
/// its config and its log; `auth/` and `tls/` hold keys.
pub fn create_private_dir(path: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
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
