//! `strata init`: a new cluster's plan (hosts, services, ports, routes
//! between sites) and the workdir written from it: `cluster.toml`, every
//! service's config, the keys and the certificates.
//!
//! `init` reads as its steps: the options are checked into a [`HostsSpec`]
//! (what each host runs), the ports are chosen at once (so that they
//! differ), each kind of service gets its config from the shared
//! [`Plan`], and the workdir is written with `cluster.toml` last, whose
//! presence means the workdir is complete.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Each service's audit log, in its directory (`docs/security.md`, "Audit log").
pub const AUDIT_LOG: &str = "audit.jsonl";
/// The proxy's domain unless `--proxy-domain` says otherwise: names under
/// `localhost` stay on this machine (RFC 6761).
pub const DEFAULT_PROXY_DOMAIN: &str = "localhost";

use serde::de::DeserializeOwned;
use strata_protocol::safekeeper::Placement;
use strata_protocol::{TenantId, TimelineId};
use strata_remote_storage::RemoteStorageConfig;
use strata_service::ports;

use super::error::{failed, Error, Result};
use super::layout::{
    create_private_dir, save_cluster, write_atomic, Branch, ClusterFile, Host, Kind, Route, Service, Tenant,
    TenantState, ATTACHMENTS_FILE, CLUSTER_FILE, DEFAULT_TENANT, FORMAT_VERSION, INITDB_TEMPLATE_DIR, LOCAL_HOST,
    LOOPBACK, MAIN_BRANCH, REMOTE_STORAGE_DIR,
};
use super::options::InitOptions;
use crate::limits::{MAX_SERVICES_OF_A_KIND, MAX_SITE_LATENCY_MS};
use strata_service::auth::AuthConfig;
use strata_service::tls::TlsConfig;

/// What `init` made: the workdir (as named and as resolved) and its
/// cluster file, for the caller to report.
#[derive(Debug)]
pub struct Initialised {
    /// The workdir as the caller named it (for the commands it prints).
    pub workdir: PathBuf,
    /// The workdir's canonical path.
    pub root: PathBuf,
    /// `cluster.toml` as written.
    pub cluster: ClusterFile,
}

impl Initialised {
    /// Whether every host is this machine (started with `strata start`),
    /// rather than a cluster of several hosts (a `strata node` on each).
    pub fn is_local(&self) -> bool {
        self.cluster.hosts.iter().all(Host::is_loopback)
    }
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
    #[serde(default = "super::layout::local_host_name")]
    pub site: String,
    /// `safekeeper` (once per safekeeper), `pageserver` (once per
    /// pageserver; a storage controller runs beside each), `compute`,
    /// `proxy` (on one host, which must hold the cluster's keys).
    pub run: Vec<String>,
}

impl HostsSpec {
    /// The one-host cluster of `strata init` without `--hosts`.
    fn local(safekeepers: usize, pageservers: usize) -> HostsSpec {
        let mut run = vec!["safekeeper".to_string(); safekeepers];
        run.extend(std::iter::repeat_n("pageserver".to_string(), pageservers));
        run.extend(["compute".to_string(), "proxy".to_string()]);
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
                if i == 0 {
                    run.push("proxy".to_string());
                }
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
                    "compute" | "proxy" => {}
                    other => {
                        return Err(format!(
                            "host {}: cannot run {other:?} (safekeeper, pageserver, compute or proxy)",
                            h.name
                        ))
                    }
                }
            }
        }
        if self.proxy_host()?.is_some_and(|h| self.hosts[h].run.iter().filter(|r| *r == "proxy").count() > 1) {
            return Err("a host runs one proxy".into());
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

impl HostsSpec {
    /// The host that runs the proxy, if one does (at most one).
    fn proxy_host(&self) -> std::result::Result<Option<usize>, String> {
        let hosts: Vec<usize> =
            (0..self.hosts.len()).filter(|&i| self.hosts[i].run.iter().any(|r| r == "proxy")).collect();
        match hosts.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(*one)),
            _ => Err("more than one host runs a proxy (a cluster has one)".into()),
        }
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
pub fn init(args: &InitOptions) -> Result<Initialised> {
    let spec = hosts_spec(args)?;
    let pg_version = args.pg_version.unwrap_or(crate::layout::DEFAULT_PG_VERSION);
    crate::tenant::check_pg_version(pg_version)?;
    let latency_ms = args.site_latency_ms.unwrap_or(0.0);
    if !(0.0..=MAX_SITE_LATENCY_MS).contains(&latency_ms) {
        return Err(Error::Usage(format!(
            "--site-latency-ms must be between 0 and {MAX_SITE_LATENCY_MS}, not {latency_ms}"
        )));
    }
    let placement = spec.services().map_err(Error::Usage)?;
    let main_placement = main_placement(args, &spec, &placement)?;
    let secure = !args.insecure_loopback;
    if !secure {
        if let Some(h) = spec.hosts.iter().find(|h| !h.address.is_loopback()) {
            return Err(Error::Usage(format!(
                "--insecure-loopback: host {} is at {}, not on loopback; beyond loopback every link needs TLS and tokens",
                h.name, h.address
            )));
        }
    }
    let dir = &args.workdir;
    let file = dir.join(CLUSTER_FILE);
    if file.exists() {
        return failed(format!("{}: exists; a cluster is already initialised in {}", file.display(), dir.display()));
    }
    mkdir(dir)?;
    let root = fs::canonicalize(dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let mut plan = Plan::new(&spec, placement, args.sites.is_some(), secure, root)?;
    plan.storage_key = (!args.no_encryption_at_rest).then(|| super::keys::storage_key(&plan.root));

    let tenant_id = TenantId::generate();
    let mut out = Written::default();
    plan.safekeepers(&mut out)?;
    let pageservers = plan.pageservers(args, &mut out)?;
    plan.controllers(&pageservers, tenant_id, &mut out)?;
    if args.sites.is_some() {
        plan.link_proxy(latency_ms, &mut out)?;
    }
    let domain = args.proxy_domain.clone().unwrap_or_else(|| DEFAULT_PROXY_DOMAIN.into());
    if let Some(host) = spec.proxy_host().map_err(Error::Usage)? {
        plan.proxy(host, &domain, &mut out)?;
    }
    let Plan { root, hosts, routes, remote_storage, storage_key, .. } = plan;
    let mut cluster = ClusterFile {
        format_version: FORMAT_VERSION,
        revision: 0,
        cluster_id: TenantId::generate(),
        pg_bin_dir: args.pg_bin_dir.clone(),
        pg_user: args.pg_user.clone(),
        verify_redo: args.verify_redo,
        default_suspend_after_secs: args.suspend_after_secs.filter(|s| *s > 0),
        hosts,
        remote_storage: Some(remote_storage),
        tenants: vec![Tenant {
            name: DEFAULT_TENANT.into(),
            tenant_id,
            state: TenantState::Active,
            pg_version,
            follows: None,
            shards: None,
            branches: vec![Branch {
                name: MAIN_BRANCH.into(),
                timeline_id: TimelineId::generate(),
                parent: None,
                ancestor_lsn: None,
                placement: main_placement,
                divergent: None,
                pg_version: None,
                created_at: Some(crate::supervisor_state::unix_now()),
                point_time: None,
            }],
        }],
        services: out.services,
        routes,
        generation: 0,
    };
    cluster.check().map_err(Error::Usage)?;
    let cluster = write_workdir(&root, cluster, &out.configs, secure, storage_key.is_some())?;
    if let (true, Some(proxy)) = (secure, cluster.services.iter().find(|s| s.kind == Kind::Proxy)) {
        super::certs::issue_proxy(&root, &proxy.name, &domain, proxy.address)?;
    }
    Ok(Initialised { workdir: dir.clone(), root, cluster })
}

/// What the hosts run: the `--hosts` file, or the hosts of a cluster on
/// this machine (one, or one per site).
fn hosts_spec(args: &InitOptions) -> Result<HostsSpec> {
    let in_range = |n: usize, what: &str| match (1..=MAX_SERVICES_OF_A_KIND).contains(&n) {
        true => Ok(n),
        false => Err(Error::Usage(format!("--{what} must be between 1 and {MAX_SERVICES_OF_A_KIND}, not {n}"))),
    };
    match (&args.hosts, args.safekeepers, args.pageservers) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(Error::Usage(
            "--safekeepers and --pageservers apply without --hosts (the hosts file places them)".into(),
        )),
        (Some(path), None, None) => super::layout::read_toml::<HostsSpec>(path),
        (None, n, p) => {
            let n = in_range(n.unwrap_or(3), "safekeepers")?;
            let p = in_range(p.unwrap_or(1), "pageservers")?;
            match args.sites {
                Some(k) => HostsSpec::sites(k, n, p).map_err(Error::Usage),
                None => Ok(HostsSpec::local(n, p)),
            }
        }
    }
}

/// The WAL placement of `main`: with sites, local-quorum at home in the
/// first site unless another is asked for; `stretched` needs safekeepers
/// in two sites.
fn main_placement(args: &InitOptions, spec: &HostsSpec, placement: &[(usize, Kind)]) -> Result<Option<Placement>> {
    let chosen = match (args.sites, args.placement.as_deref()) {
        (None, _) | (Some(_), Some("majority")) => None,
        (Some(_), Some("stretched")) => Some(Placement::Stretched),
        (Some(_), _) => Some(Placement::LocalQuorum {
            home: spec.hosts[0].site.clone(),
            max_async_lag: strata_protocol::safekeeper::membership::DEFAULT_MAX_ASYNC_LAG,
            on_async_lag: Default::default(),
        }),
    };
    if chosen == Some(Placement::Stretched) {
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
    Ok(chosen)
}

/// The services and config files `init` has planned so far.
#[derive(Default)]
struct Written {
    services: Vec<Service>,
    /// (path relative to the workdir, TOML text).
    configs: Vec<(PathBuf, String)>,
}

impl Written {
    /// Adds a service with its config, serialized to where `cluster.toml` says it is.
    fn add<T: serde::Serialize>(&mut self, service: Service, config: &T) -> Result<()> {
        let text = toml::to_string(config).map_err(|e| Error::Failed(format!("{}: {e}", service.name)))?;
        self.configs.push((service.config.clone(), text));
        self.services.push(service);
        Ok(())
    }
}

/// Everything the services' configs are written from: the hosts, where each
/// service runs, the ports chosen for them and the link proxy's routes.
///
/// The ports are one block, bound at once so that they differ: three per
/// safekeeper, two per pageserver, one per controller (one beside each
/// pageserver), one per host's node API, then with sites the link proxy's
/// HTTP port and one per route.
struct Plan {
    root: PathBuf,
    hosts: Vec<Host>,
    /// The host (index) of each safekeeper and of each pageserver.
    sk_hosts: Vec<usize>,
    ps_hosts: Vec<usize>,
    ports: Vec<u16>,
    routes: Vec<Route>,
    secure: bool,
    remote_storage: RemoteStorageConfig,
    /// The storage key file the pageservers and safekeepers encrypt with.
    storage_key: Option<PathBuf>,
}

impl Plan {
    fn new(spec: &HostsSpec, placement: Vec<(usize, Kind)>, sites: bool, secure: bool, root: PathBuf) -> Result<Plan> {
        let of_kind = |kind: Kind| placement.iter().filter(|(_, k)| *k == kind).map(|(h, _)| *h).collect::<Vec<_>>();
        let (sk_hosts, ps_hosts) = (of_kind(Kind::Safekeeper), of_kind(Kind::Pageserver));
        let first_node_port = 3 * sk_hosts.len() + 3 * ps_hosts.len();
        let proxy_port = first_node_port + spec.hosts.len();
        let wanted_routes = if sites { routes_between_sites(spec, &placement) } else { Vec::new() };
        let extra = if sites { 1 + wanted_routes.len() } else { 0 };
        let ports =
            ports::allocate(proxy_port + extra, &[]).map_err(|e| Error::Failed(format!("finding free ports: {e}")))?;
        debug_assert_eq!(ports.len(), proxy_port + extra);
        let routes = wanted_routes
            .into_iter()
            .enumerate()
            .map(|(i, (site, service, role))| Route {
                site,
                service,
                role: role.into(),
                port: ports[proxy_port + 1 + i],
            })
            .collect();
        let hosts = spec
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
        let remote_storage = spec
            .remote_storage
            .clone()
            .unwrap_or_else(|| RemoteStorageConfig::Local { path: root.join(REMOTE_STORAGE_DIR) });
        Ok(Plan { root, hosts, sk_hosts, ps_hosts, ports, routes, secure, remote_storage, storage_key: None })
    }

    fn sk_port(&self, i: usize, role: usize) -> u16 {
        self.ports[3 * i + role]
    }

    fn ps_port(&self, i: usize, role: usize) -> u16 {
        self.ports[3 * self.sk_hosts.len() + 2 * i + role]
    }

    fn controller_port(&self, i: usize) -> u16 {
        self.ports[3 * self.sk_hosts.len() + 2 * self.ps_hosts.len() + i]
    }

    /// The link proxy's HTTP port (with sites).
    fn proxy_port(&self) -> u16 {
        self.ports[3 * self.sk_hosts.len() + 3 * self.ps_hosts.len() + self.hosts.len()]
    }

    fn at(&self, host: usize, port: u16) -> String {
        std::net::SocketAddr::new(self.hosts[host].address, port).to_string()
    }

    /// How a service on host `from` reaches `service`'s `role` port: through
    /// the link proxy (on the first host) when a route exists, else `direct`.
    fn via(&self, from: usize, service: &str, role: &str, direct: String) -> String {
        self.routes
            .iter()
            .find(|r| r.site == self.hosts[from].site && r.service == service && r.role == role)
            .map_or(direct, |r| std::net::SocketAddr::new(self.hosts[0].address, r.port).to_string())
    }

    fn host_tls(&self, host: usize) -> Option<TlsConfig> {
        self.secure.then(|| super::certs::service_tls(&self.root, &self.hosts[host].address.to_string()))
    }

    /// Service `name`'s, with its audit log in its directory (`AUDIT_LOG`).
    fn auth(&self, name: &str) -> Option<AuthConfig> {
        let audit_log = Some(self.root.join(name).join(AUDIT_LOG));
        self.secure.then(|| AuthConfig { audit_log, ..super::keys::service_auth(&self.root) })
    }

    /// A controller's: its own token, which may place tenants.
    fn controller_auth(&self, name: &str) -> Option<AuthConfig> {
        let audit_log = Some(self.root.join(name).join(AUDIT_LOG));
        self.secure.then(|| AuthConfig { audit_log, ..super::keys::controller_auth(&self.root) })
    }

    fn service(&self, name: String, kind: Kind, host: usize, file: &str, ports: &[(&str, u16)]) -> Service {
        Service {
            config: PathBuf::from(&name).join(file),
            name,
            kind,
            host: self.hosts[host].name.clone(),
            ports: ports.iter().map(|(r, p)| (r.to_string(), *p)).collect::<BTreeMap<_, _>>(),
            address: self.hosts[host].address,
        }
    }

    /// `sk1`…: each knows its peers (through routes across sites).
    fn safekeepers(&self, out: &mut Written) -> Result<()> {
        let n = self.sk_hosts.len();
        for (i, &host) in self.sk_hosts.iter().enumerate() {
            let name = format!("sk{}", i + 1);
            let peers: Vec<_> = (0..n)
                .filter(|&j| j != i)
                .map(|j| {
                    let peer = format!("sk{}", j + 1);
                    serde_json::json!({
                        "id": j + 1,
                        "address": self.via(host, &peer, "listen", self.at(self.sk_hosts[j], self.sk_port(j, 0))),
                        "http": self.via(host, &peer, "http", self.at(self.sk_hosts[j], self.sk_port(j, 1))),
                    })
                })
                .collect();
            let config: strata_safekeeper::config::SafekeeperConfig = service_config(
                serde_json::json!({
                    "id": i + 1,
                    "listen": self.at(host, self.sk_port(i, 0)),
                    "listen_http": self.at(host, self.sk_port(i, 1)),
                    "listen_pg": self.at(host, self.sk_port(i, 2)),
                    "data_dir": self.root.join(&name).join("data"),
                    "peers": peers,
                    "auth": self.auth(&name),
                    "tls": self.host_tls(host),
                    // Completed WAL segments go to the same object storage as the layers.
                    "remote_storage": self.remote_storage,
                    "storage_key": self.storage_key,
                }),
                "safekeeper",
            )?;
            let ports = [("listen", self.sk_port(i, 0)), ("http", self.sk_port(i, 1)), ("pg", self.sk_port(i, 2))];
            out.add(self.service(name, Kind::Safekeeper, host, "safekeeper.toml", &ports), &config)?;
        }
        Ok(())
    }

    /// The pageservers, each streaming WAL from its own site's safekeepers
    /// first; returns how the storage controllers reach them.
    fn pageservers(&self, args: &InitOptions, out: &mut Written) -> Result<Vec<serde_json::Value>> {
        let n = self.sk_hosts.len();
        let mut refs = Vec::new();
        for (i, &host) in self.ps_hosts.iter().enumerate() {
            let name = ps_service_name(i);
            let site = &self.hosts[host].site;
            // Its own site's safekeepers first: ties in choosing a WAL source go to them.
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&j| self.hosts[self.sk_hosts[j]].site != *site);
            let own_site = order.iter().filter(|&&j| self.hosts[self.sk_hosts[j]].site == *site).count();
            // With every safekeeper in its site, there is no preference to state.
            let site_safekeepers = if own_site == n { 0 } else { own_site };
            let wal_sources: Vec<String> = order
                .iter()
                .map(|&j| {
                    self.via(host, &format!("sk{}", j + 1), "listen", self.at(self.sk_hosts[j], self.sk_port(j, 0)))
                })
                .collect();
            // Their positions wake the pageserver's idle timelines.
            let positions: Vec<String> = order
                .iter()
                .map(|&j| {
                    self.via(host, &format!("sk{}", j + 1), "http", self.at(self.sk_hosts[j], self.sk_port(j, 1)))
                })
                .collect();
            let config: strata_pageserver::config::PageserverConfig = service_config(
                serde_json::json!({
                    // Node ids are unique within the deployment: the safekeepers have 1..=n.
                    "id": n + 1 + i,
                    "listen_pg": self.at(host, self.ps_port(i, 0)),
                    "listen_http": self.at(host, self.ps_port(i, 1)),
                    "data_dir": self.root.join(&name).join("data"),
                    "safekeepers": wal_sources,
                    "safekeepers_http": positions,
                    "site_safekeepers": site_safekeepers,
                    "auth": self.auth(&name),
                    "tls": self.host_tls(host),
                    "pg_bin_dir": args.pg_bin_dir,
                    "pg_user": args.pg_user,
                    "verify_redo": args.verify_redo,
                    "wal_stream": args.wal_stream,
                    "remote_storage": self.remote_storage,
                    "storage_key": self.storage_key,
                    "attachments": self.root.join(&name).join(ATTACHMENTS_FILE),
                    // Not the default inside `data_dir`: that is private, and
                    // initdb runs as `pg_user` when the pageserver runs as root.
                    "initdb_template_dir": self.root.join(INITDB_TEMPLATE_DIR),
                    // The storage controller places the tenant.
                    "controller": true,
                }),
                "pageserver",
            )?;
            refs.push(serde_json::json!({
                "name": name,
                "pg": self.at(host, self.ps_port(i, 0)),
                "http": self.at(host, self.ps_port(i, 1)),
                "site": site,
            }));
            let ports = [("pg", self.ps_port(i, 0)), ("http", self.ps_port(i, 1))];
            out.add(self.service(name, Kind::Pageserver, host, "pageserver.toml", &ports), &config)?;
        }
        Ok(refs)
    }

    /// A storage controller beside each pageserver: one leads, the others
    /// take over when it dies (`docs/storage-controller.md`).
    fn controllers(&self, pageservers: &[serde_json::Value], tenant_id: TenantId, out: &mut Written) -> Result<()> {
        for (i, &host) in self.ps_hosts.iter().enumerate() {
            let port = self.controller_port(i);
            let config: strata_controller::config::ControllerConfig = service_config(
                serde_json::json!({
                    "id": i + 1,
                    "listen_http": self.at(host, port),
                    "remote_storage": self.remote_storage,
                    "pageservers": pageservers,
                    "tenants": [tenant_id],
                    "auth": self.controller_auth(&controller_name(i)),
                    "issuer_key": self.secure.then(|| super::keys::issuer_key(&self.root)),
                    "tls": self.host_tls(host),
                }),
                "controller",
            )?;
            let service =
                self.service(controller_name(i), Kind::Controller, host, "controller.toml", &[("http", port)]);
            out.add(service, &config)?;
        }
        Ok(())
    }

    /// The proxy (`docs/proxy.md`) on `host`: TLS with a certificate for
    /// `*.<domain>` (issued once the CA exists) when the cluster is secure,
    /// the cluster's CA to check the computes' certificates.
    fn proxy(&self, host: usize, domain: &str, out: &mut Written) -> Result<()> {
        let taken: Vec<u16> =
            self.ports.iter().copied().chain(out.services.iter().flat_map(|s| s.ports.values().copied())).collect();
        let ports = ports::allocate(2, &taken).map_err(|e| Error::Failed(format!("finding free ports: {e}")))?;
        let address = self.hosts[host].address;
        let name = "proxy";
        let pg_tls = self.secure.then(|| {
            let (cert, key) = super::certs::proxy_files(&self.root, name);
            strata_proxy::config::PgTls { cert, key }
        });
        let config = strata_proxy::config::ProxyConfig {
            listen_pg: std::net::SocketAddr::new(address, ports[0]),
            listen_http: std::net::SocketAddr::new(address, ports[1]),
            domain: domain.to_string(),
            workdir: self.root.clone(),
            require_tls: self.secure,
            pg_tls,
            auth: self.auth(name),
            tls: self.host_tls(host),
            ..service_config(
                serde_json::json!({
                    "listen_pg": "127.0.0.1:1", "listen_http": "127.0.0.1:1", "domain": domain, "workdir": "/"
                }),
                "proxy",
            )?
        };
        config.validate().map_err(|e| Error::Usage(format!("the proxy: {e}")))?;
        out.add(
            self.service(name.into(), Kind::Proxy, host, "proxy.toml", &[("pg", ports[0]), ("http", ports[1])]),
            &config,
        )
    }

    /// The link proxy on the first host, a route for every link between
    /// sites with half the round trip each way; it is the first service, so
    /// that it starts before the services whose links it carries.
    fn link_proxy(&self, latency_ms: f64, out: &mut Written) -> Result<()> {
        let port = self.proxy_port();
        let listen_http = std::net::SocketAddr::new(self.hosts[0].address, port);
        let routes = self
            .routes
            .iter()
            .map(|r| {
                let target = out.services.iter().find(|s| s.name == r.service).expect("routes name services");
                strata_link_proxy::config::RouteConfig {
                    name: r.name(),
                    listen: std::net::SocketAddr::new(self.hosts[0].address, r.port),
                    target: std::net::SocketAddr::new(target.address, target.ports[&r.role]).to_string(),
                    delay_ms: latency_ms / 2.0,
                    jitter_ms: 0.0,
                    loss_pct: 0.0,
                }
            })
            .collect();
        let config = strata_link_proxy::config::LinkProxyConfig {
            listen_http,
            routes,
            auth: self.auth("link-proxy"),
            tls: self.host_tls(0),
            ..service_config(serde_json::json!({"listen_http": listen_http, "routes": []}), "link proxy")?
        };
        out.add(self.service("link-proxy".into(), Kind::LinkProxy, 0, "link-proxy.toml", &[("http", port)]), &config)?;
        // First in `cluster.toml`: started before everything it relays.
        let proxy = out.services.pop().expect("just added");
        out.services.insert(0, proxy);
        Ok(())
    }
}

/// With sites: a route from every site to every port of every service in
/// another site, as (site, service, role).
fn routes_between_sites(spec: &HostsSpec, placement: &[(usize, Kind)]) -> Vec<(String, String, &'static str)> {
    let mut sites: Vec<&str> = spec.hosts.iter().map(|h| h.site.as_str()).collect();
    sites.dedup();
    let ps_count = |upto: usize| placement[..upto].iter().filter(|(_, k)| *k == Kind::Pageserver).count();
    let mut wanted = Vec::new();
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
                wanted.extend(roles.iter().map(|r| (site.to_string(), name.clone(), *r)));
            }
        }
    }
    wanted
}

/// Writes the workdir: data directories, keys and certificates (unless
/// insecure), every config, and `cluster.toml` last: its presence means the
/// workdir is complete. A service's directory and the key stores are
/// private to their owner (docs/security.md, "Files and their modes");
/// `endpoints/` stays traversable, for PostgreSQL reaches its data
/// directory inside as `pg_user`.
fn write_workdir(
    root: &Path,
    mut cluster: ClusterFile,
    configs: &[(PathBuf, String)],
    secure: bool,
    encrypted: bool,
) -> Result<ClusterFile> {
    for s in &cluster.services {
        create_private_dir(&root.join(&s.name).join("data"))?;
    }
    mkdir(&root.join("endpoints"))?;
    if secure {
        create_private_dir(&root.join(super::keys::AUTH_DIR))?;
        create_private_dir(&root.join(super::certs::TLS_DIR))?;
        super::keys::create(root)?;
        let mut addresses: Vec<String> = cluster.hosts.iter().map(|h| h.address.to_string()).collect();
        addresses.dedup();
        super::certs::create(root, &addresses.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    if encrypted {
        create_private_dir(&root.join(super::keys::AUTH_DIR))?;
        super::keys::create_storage_key(root)?;
    }
    for (rel, text) in configs {
        let header = "# Written by `strata init`; ports and paths must match cluster.toml.\n";
        write_atomic(&root.join(rel), &format!("{header}{text}"))?;
    }
    save_cluster(root, &mut cluster)?;
    Ok(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::*;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("strata-layout-{tag}-{}", TimelineId::generate()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn init_writes_loadable_configs_with_distinct_ports() {
        let dir = tempdir("init");
        init(&InitOptions::for_test(&dir, 3)).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        // Three safekeepers, a pageserver and its storage controller, the proxy.
        assert_eq!(wd.cluster.services.len(), 6);
        let px = strata_proxy::config::ProxyConfig::load(&wd.config_path(wd.service("proxy").unwrap())).unwrap();
        assert!(px.domain == "localhost" && px.workdir == wd.root && px.pg_tls.unwrap().cert.exists());
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
        assert_eq!(psc.safekeepers_http, wd.cluster.safekeeper_addrs_from_role(LOCAL_HOST, "http"));
        assert_eq!(psc.listen_http.port(), ps.ports["http"]);
        assert_eq!(psc.data_dir, wd.root.join("pageserver/data"));
        assert_eq!(psc.id.0, 4);
        assert!(psc.controller, "the storage controller places the tenant");
        let cc = strata_controller::config::ControllerConfig::load(&wd.config_path(wd.service("controller").unwrap()))
            .unwrap();
        assert_eq!(cc.tenants, vec![wd.cluster.tenants[0].tenant_id.into()]);
        assert_eq!(cc.pageservers[0].http, ps.addr("http").unwrap());
        // Several pageservers: a controller beside each, every port distinct.
        let dir2 = tempdir("init2");
        init(&InitOptions { pageservers: Some(3), ..InitOptions::for_test(&dir2, 3) }).unwrap();
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
                "controller3",
                "proxy"
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
        // Services' directories and the key stores are their owner's alone;
        // initdb's output is kept outside them.
        let mode = |p: PathBuf| fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        for s in &wd.cluster.services {
            assert_eq!(mode(dir.join(&s.name)), 0o700, "{}", s.name);
            assert_eq!(mode(dir.join(&s.name).join("data")), 0o700, "{}", s.name);
        }
        assert_eq!((mode(dir.join("auth")), mode(dir.join("tls"))), (0o700, 0o700));
        assert_eq!(psc.initdb_template_dir, Some(wd.root.join(INITDB_TEMPLATE_DIR)));

        assert!(
            matches!(init(&InitOptions::for_test(&dir, 3)), Err(Error::Failed(_))),
            "a second init must be refused"
        );
        let zero = tempdir("zero");
        assert!(matches!(init(&InitOptions::for_test(&zero, 0)), Err(Error::Usage(_))));
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&zero).unwrap();
    }

    #[test]
    fn a_new_cluster_encrypts_at_rest_unless_told_not_to() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempdir("encrypted");
        init(&InitOptions::for_test(&dir, 1)).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        let key = wd.root.join("auth/storage.key");
        let psc = strata_pageserver::config::PageserverConfig::load(&wd.config_path(wd.service("pageserver").unwrap()));
        let skc = strata_safekeeper::config::SafekeeperConfig::load(&wd.config_path(wd.service("sk1").unwrap()));
        assert_eq!(psc.unwrap().storage_key.as_ref(), Some(&key));
        assert_eq!(skc.unwrap().storage_key.as_ref(), Some(&key));
        assert_eq!(fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(strata_remote_storage::seal::keys::ClusterKeys::load(&key).unwrap().ids(), vec![1]);
        fs::remove_dir_all(&dir).unwrap();

        let plain = tempdir("unencrypted");
        init(&InitOptions { no_encryption_at_rest: true, ..InitOptions::for_test(&plain, 1) }).unwrap();
        let wd = Workdir::open(&plain).unwrap();
        let psc = strata_pageserver::config::PageserverConfig::load(&wd.config_path(wd.service("pageserver").unwrap()));
        assert_eq!(psc.unwrap().storage_key, None);
        assert!(!wd.root.join("auth/storage.key").exists());
        fs::remove_dir_all(&plain).unwrap();
    }

    #[test]
    fn the_default_tenants_major_and_where_each_majors_programs_are() {
        let dir = tempdir("pg-version");
        init(&InitOptions { pg_version: Some(18), ..InitOptions::for_test(&dir, 1) }).unwrap();
        let mut wd = Workdir::open(&dir).unwrap();
        let tenant = wd.cluster.tenants[0].tenant_id;
        assert_eq!(wd.cluster.tenant_pg_version(tenant), 18);
        assert!(fs::read_to_string(dir.join(CLUSTER_FILE)).unwrap().contains("pg_version = 18"));
        // Debian's layout: the sibling of 15's directory; elsewhere Debian's path.
        assert_eq!(wd.cluster.pg_bin_dir_for(15), std::path::PathBuf::from("/usr/lib/postgresql/15/bin"));
        assert_eq!(wd.cluster.pg_bin_dir_for(18), std::path::PathBuf::from("/usr/lib/postgresql/18/bin"));
        wd.cluster.pg_bin_dir = "/opt/pg15/lib/postgresql/15/bin".into();
        assert_eq!(wd.cluster.pg_bin_dir_for(17), std::path::PathBuf::from("/opt/pg15/lib/postgresql/17/bin"));
        wd.cluster.pg_bin_dir = "/opt/postgres/bin".into();
        assert_eq!(wd.cluster.pg_bin_dir_for(17), std::path::PathBuf::from("/usr/lib/postgresql/17/bin"));
        fs::remove_dir_all(&dir).unwrap();
        // 16 (and anything else) is refused before anything is written.
        let refused = tempdir("pg-version-16");
        assert!(init(&InitOptions { pg_version: Some(16), ..InitOptions::for_test(&refused, 1) }).is_err());
        assert!(!refused.join(CLUSTER_FILE).exists());
        let _ = fs::remove_dir_all(&refused);
    }

    #[test]
    fn the_default_idle_period_is_kept_in_cluster_toml() {
        let dir = tempdir("suspend-default");
        init(&InitOptions { suspend_after_secs: Some(300), ..InitOptions::for_test(&dir, 1) }).unwrap();
        assert_eq!(Workdir::open(&dir).unwrap().cluster.default_suspend_after_secs, Some(300));
        let text = fs::read_to_string(dir.join(CLUSTER_FILE)).unwrap();
        assert!(text.contains("default_suspend_after_secs = 300"), "{text}");
        fs::remove_dir_all(&dir).unwrap();
        // 0 is never, which is what no setting says.
        let never = tempdir("suspend-never");
        init(&InitOptions { suspend_after_secs: Some(0), ..InitOptions::for_test(&never, 1) }).unwrap();
        assert_eq!(Workdir::open(&never).unwrap().cluster.default_suspend_after_secs, None);
        assert!(!fs::read_to_string(never.join(CLUSTER_FILE)).unwrap().contains("default_suspend_after_secs"));
        fs::remove_dir_all(&never).unwrap();
    }

    #[test]
    fn an_insecure_cluster_has_neither_tokens_nor_tls() {
        let dir = tempdir("insecure");
        init(&InitOptions { insecure_loopback: true, ..InitOptions::for_test(&dir, 3) }).unwrap();
        let wd = Workdir::open(&dir).unwrap();
        let ps = wd.service("pageserver").unwrap();
        let psc = strata_pageserver::config::PageserverConfig::load(&wd.config_path(ps)).unwrap();
        assert_eq!((psc.auth, psc.tls), (None, None));
        let sk1 =
            strata_safekeeper::config::SafekeeperConfig::load(&wd.config_path(wd.service("sk1").unwrap())).unwrap();
        assert_eq!((sk1.auth, sk1.tls), (None, None));
        // The auth directory holds the storage key only: encryption at rest
        // does not depend on TLS and tokens.
        let auth: Vec<_> = fs::read_dir(dir.join("auth")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(auth, ["storage.key"]);
        assert!(!dir.join("tls").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cluster_file_roundtrips_and_is_checked() {
        let dir = tempdir("rt");
        init(&InitOptions::for_test(&dir, 1)).unwrap();
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
        init(&InitOptions { hosts: Some(spec), safekeepers: None, ..InitOptions::for_test(&wd_dir, 3) }).unwrap();
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
            match init(&InitOptions { hosts: Some(spec), safekeepers: None, ..InitOptions::for_test(&wd_dir, 3) }) {
                Err(Error::Usage(e)) | Err(Error::Failed(e)) => assert!(e.contains(needle), "{e} (wanted {needle})"),
                Ok(_) => panic!("accepted: {text}"),
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
        let insecure = InitOptions {
            hosts: Some(spec),
            safekeepers: None,
            insecure_loopback: true,
            ..InitOptions::for_test(&dir.join("w"), 3)
        };
        assert!(matches!(init(&insecure), Err(Error::Usage(e)) if e.contains("not on loopback")));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cluster_file_from_before_tenants_is_one_default_tenant() {
        let dir = tempdir("v2");
        init(&InitOptions::for_test(&dir, 1)).unwrap();
        let now = Workdir::open(&dir).unwrap().cluster;
        let text = fs::read_to_string(dir.join(CLUSTER_FILE)).unwrap();
        let mut v2: toml::Table = toml::from_str(&text).unwrap();
        v2.insert("format_version".into(), 2.into());
        v2.remove("cluster_id");
        let mut tenants = v2.remove("tenants").unwrap();
        let t = tenants.as_array_mut().unwrap().remove(0);
        v2.insert("tenant_id".into(), t["tenant_id"].clone());
        v2.insert("branches".into(), t["branches"].clone());
        fs::write(dir.join(CLUSTER_FILE), toml::to_string(&v2).unwrap()).unwrap();
        let old = Workdir::open(&dir).unwrap().cluster;
        assert_eq!(old.tenants, now.tenants);
        assert_eq!(old.tenants[0].name, DEFAULT_TENANT);
        // The cluster is named by its one tenant, as hosts' copies of it were.
        assert_eq!(old.cluster_id, now.tenants[0].tenant_id);
        // Written back in this version's format, the same cluster.
        let mut again = old.clone();
        save_cluster(&dir, &mut again).unwrap();
        let reread = Workdir::open(&dir).unwrap().cluster;
        assert_eq!((reread.format_version, &reread.tenants), (FORMAT_VERSION, &now.tenants));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cluster_file_from_before_hosts_is_one_host_on_loopback() {
        let dir = tempdir("v1");
        init(&InitOptions::for_test(&dir, 1)).unwrap();
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
        let args = InitOptions { sites: Some(2), site_latency_ms: Some(6.0), ..InitOptions::for_test(&dir, 3) };
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
                ("proxy", "dc1"),
            ]
        );
        assert_eq!(
            c.tenants[0].branches[0].placement,
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
            let args = InitOptions {
                sites: Some(sites),
                placement: placement.map(str::to_string),
                ..InitOptions::for_test(&d, n)
            };
            assert!(matches!(init(&args), Err(Error::Usage(_))), "{sites} sites, {n} safekeepers, {placement:?}");
            fs::remove_dir_all(&d).unwrap();
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
