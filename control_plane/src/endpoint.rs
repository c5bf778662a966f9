//! Endpoints: a compute (stock PostgreSQL plus the `strata compute start`
//! agent, under its supervisor) on a branch, each in `endpoints/<name>/`
//! with its remembered ports.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use strata_compute::agent::config_file::{AgentFile, LazyFile, ReplicaFile, ShardsFile};
use strata_compute::agent::pgconf::IoMethod;
use strata_compute::agent::DEFAULT_APP_ROLE as APP_ROLE;
use strata_compute::agent::{postgres, suspend};
use strata_protocol::api::compute::{AgentState, AgentStatus, ComputeStatus};
use strata_protocol::api::pageserver::LsnResponse;
use strata_proxy::scram::Verifier;
use strata_service::auth::{Claims, Scope};

use super::error::{failed, Error, Result};
use super::layout::{self, Kind, Tenant, Workdir, LOCAL_HOST, LOOPBACK, MAIN_BRANCH};
use super::options::AgentOptions;
use super::process::{self, Identity};
use super::report::{EndpointEvent, Event, Notice, Progress, StopReport};
use super::supervisor::{Liveness, StopOutcome, Supervised};
use super::{hosts, http, services};
use crate::limits::{
    CHECKPOINT_WAIT, ENDPOINT_START_WAIT, ENDPOINT_STOPS_AT_ONCE, ENDPOINT_STOP_GRACE, ENDPOINT_TAIL_LINES, KILL_WAIT,
    NODE_CALL, ORPHAN_GRACE, QUICK, START_POLL, SUSPENSION_WAIT,
};
use strata_service::ports;

/// File name of an endpoint's settings inside its directory.
const ENDPOINT_FILE: &str = "endpoint.toml";
/// The agent's configuration (`strata_compute::agent::config_file`), beside `endpoint.toml`.
const AGENT_CONFIG_FILE: &str = "agent.toml";
/// The agent's tenant token (mode 0600), beside `endpoint.toml`.
const AGENT_TOKEN_FILE: &str = "agent.token";
/// The password clients log in with (mode 0600), beside `endpoint.toml`.
const PASSWORD_FILE: &str = "password";
/// The SCRAM verifier of that password (mode 0600): the role's in the
/// branch, and what the proxy checks clients against (`docs/proxy.md`).
const VERIFIER_FILE: &str = "password.scram";
/// The compute's own certificate and key (mode 0600), beside `endpoint.toml`.
const COMPUTE_CERT_FILE: &str = "tls.pem";
const COMPUTE_KEY_FILE: &str = "tls.key";

/// `endpoints/<name>/endpoint.toml`: what a restart reuses.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointFile {
    pub name: String,
    /// The tenant whose branch it runs on (endpoints from before tenants
    /// are of the default one).
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// The host it runs on (`cluster.toml`).
    #[serde(default = "local_host")]
    pub host: String,
    /// The branch (name in the tenant's `cluster.toml` entry) it runs on.
    pub branch: String,
    /// PostgreSQL's port, on 127.0.0.1 and on its host's address.
    pub pg_port: u16,
    /// The agent's HTTP API port on its host's address.
    pub http_port: u16,
    /// A read-only compute pinned to this LSN of its branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_at: Option<strata_formats::Lsn>,
    /// A replica (`docs/replicas.md`), made of this endpoint's branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_of: Option<String>,
    /// A replica's site: it reads that site's pageserver (`docs/sites.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_site: Option<String>,
    /// A replica's `hot_standby_feedback`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hot_standby_feedback: bool,
    /// A lazy compute (`docs/lazy-compute.md`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    /// A lazy compute's cache size in MiB, when not the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_mb: Option<u64>,
    /// A lazy compute's fetch retry window in seconds, when not the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_retry_secs: Option<u64>,
    /// Its idle period before it suspends, in seconds (0: never), when
    /// given; otherwise the cluster's `default_suspend_after_secs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_after_secs: Option<u64>,
}

fn local_host() -> String {
    LOCAL_HOST.into()
}

fn default_tenant() -> String {
    layout::DEFAULT_TENANT.into()
}

impl EndpointFile {
    /// The branch's writer: neither read-only nor a replica.
    pub fn is_writer(&self) -> bool {
        self.read_only_at.is_none() && self.replica_of.is_none()
    }
}

/// An endpoint with its directory.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub dir: PathBuf,
    pub file: EndpointFile,
    /// Its host's address.
    pub address: std::net::IpAddr,
}

impl Endpoint {
    /// Its PostgreSQL data directory (written by the agent).
    pub fn pgdata(&self) -> PathBuf {
        self.dir.join("pgdata")
    }

    /// The agent's log (its own output and PostgreSQL's).
    pub fn log(&self) -> PathBuf {
        self.dir.join("compute.log")
    }

    /// The agent's configuration file, rewritten at every start.
    pub fn agent_config(&self) -> PathBuf {
        self.dir.join(AGENT_CONFIG_FILE)
    }

    /// How the agent process is recognised: `strata compute start --config
    /// <its agent.toml>`.
    pub fn identity(&self) -> Identity {
        Identity { subcommand: "compute", marker: self.agent_config(), pidfile: self.dir.join("compute.pid") }
    }

    /// The agent with its supervisor.
    pub fn supervised(&self) -> Supervised {
        let label = format!("endpoint {}", self.file.name);
        Supervised {
            suspend_marker: Some(self.suspend_marker()),
            ..Supervised::new(label, self.identity(), self.log(), ENDPOINT_STOP_GRACE)
        }
    }

    /// Where its agent keeps the marker of a suspension (`docs/compute.md`,
    /// "Suspend"): `suspended`, beside the data directory.
    pub fn suspend_marker(&self) -> PathBuf {
        suspend::marker_path(&self.pgdata())
    }

    /// The marker of its last suspension, if it sleeps (or is on its way
    /// to: a marker stays until the next start has PostgreSQL running).
    pub fn suspension(&self) -> Option<suspend::Marker> {
        suspend::read_marker(&self.suspend_marker())
    }

    /// Suspended: nothing of it runs and its marker is there (complete, or
    /// left by a crash while suspending: either way the next start wakes it).
    pub fn is_suspended(&self) -> bool {
        self.supervised().liveness() == Liveness::Stopped && self.suspension().is_some()
    }

    /// `address:port`, bracketed for IPv6.
    fn at(&self, port: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.address, port)
    }

    /// libpq connection string of its PostgreSQL, without the password.
    pub fn connstr(&self) -> String {
        format!("postgresql://{APP_ROLE}@{}/postgres", self.at(self.file.pg_port))
    }

    /// The connection string a client on this host uses: loopback, with
    /// the password, and over TLS verified against `ca` (the cluster's CA)
    /// when the cluster has one. TLS costs a little even on loopback, but
    /// without it a local process that takes the port while the compute
    /// restarts would be the server (`docs/security.md`, "Computes").
    pub fn local_connstr(&self, password: &str, ca: Option<&std::path::Path>) -> String {
        // Generated passwords are letters and digits: nothing to escape.
        let local = std::net::SocketAddr::new(LOOPBACK, self.file.pg_port);
        match ca {
            Some(ca) => format!(
                "postgresql://{APP_ROLE}:{password}@{local}/postgres?sslmode=verify-full&sslrootcert={}",
                uri_escape(&ca.to_string_lossy())
            ),
            None => format!("postgresql://{APP_ROLE}:{password}@{local}/postgres?sslmode=disable"),
        }
    }

    /// The connection string over TLS, verified against `ca` (the
    /// cluster's CA): what a client on another host uses.
    pub fn tls_connstr(&self, password: &str, ca: &std::path::Path) -> String {
        format!(
            "postgresql://{APP_ROLE}:{password}@{}/postgres?sslmode=verify-full&sslrootcert={}",
            self.at(self.file.pg_port),
            uri_escape(&ca.to_string_lossy())
        )
    }

    /// The file with the password clients log in with.
    pub fn password_file(&self) -> PathBuf {
        self.dir.join(PASSWORD_FILE)
    }

    /// The password clients log in with (the file's first line), once made.
    pub fn password(&self) -> Option<String> {
        let text = fs::read_to_string(self.password_file()).ok()?;
        text.lines().next().filter(|p| !p.is_empty()).map(str::to_string)
    }

    /// Its password's SCRAM verifier (`docs/proxy.md`).
    pub fn verifier_file(&self) -> PathBuf {
        self.dir.join(VERIFIER_FILE)
    }

    /// The verifier (the file's first line), once made.
    pub fn verifier(&self) -> Option<String> {
        let text = fs::read_to_string(self.verifier_file()).ok()?;
        text.lines().next().filter(|p| !p.is_empty()).map(str::to_string)
    }

    /// The agent's `/v1/status` URL.
    fn status_url(&self) -> String {
        format!("{}://{}/v1/status", super::http::scheme(), self.at(self.file.http_port))
    }

    /// What the agent and its WAL proposer report, if the agent answers.
    pub fn compute_status(&self) -> Option<ComputeStatus> {
        let r = http::get(&self.status_url(), QUICK).ok().filter(|r| r.status == 200)?;
        r.json::<ComputeStatus>().ok()
    }

    /// What the agent reports, if it answers.
    pub fn agent_view(&self) -> Option<AgentStatus> {
        self.compute_status().map(|s| s.agent)
    }
}

/// `text` with every byte outside RFC 3986's unreserved set and `/`
/// percent-encoded, for a path in a connection URI's query.
fn uri_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The endpoint's password, made at its first start: the one the launch
/// brought (its own from the host it moved from, or for a read-only
/// endpoint or a replica its branch's writer's: the password the role has
/// in the branch, which a standby cannot set), else a new random one.
fn ensure_password(ep: &Endpoint, given: Option<&str>) -> Result<String> {
    if let Some(password) = ep.password() {
        return Ok(password);
    }
    let password = given.map(str::to_string).unwrap_or_else(strata_service::auth::generate_password);
    strata_service::auth::write_secret(&ep.password_file(), &password).map_err(|e| Error::Failed(e.to_string()))?;
    Ok(password)
}

/// The verifier of the endpoint's password, made with it: the one the
/// launch brought (the writer's: a standby's role is the writer's, with
/// its salt; or its own from the host it moved from) if it is of this
/// password, else one with a new salt. Kept while it is of the password.
fn ensure_verifier(ep: &Endpoint, given: Option<&str>, password: &str) -> Result<()> {
    let of_password = |text: &str| Verifier::parse(text).ok().filter(|v| v.is_of(password));
    if ep.verifier().as_deref().and_then(of_password).is_some() {
        return Ok(());
    }
    let v = given.and_then(of_password).unwrap_or_else(|| Verifier::generate(password));
    strata_service::auth::write_secret(&ep.verifier_file(), &v.to_text()).map_err(|e| Error::Failed(e.to_string()))
}

/// The LSN of `--at`: an LSN as given, or the branch's point at a time
/// (after every commit stamped by then), as the pageserver resolves it.
fn resolve_point(wd: &Workdir, t: &Tenant, branch: &layout::Branch, at: &str) -> Result<strata_formats::Lsn> {
    if let Ok(lsn) = at.parse::<strata_formats::Lsn>() {
        return Ok(lsn);
    }
    let time = super::options::parse_time(at, "--at")?;
    let ps = super::controller::attached(wd, t.home())?;
    let url = format!(
        "{}/v1/tenant/{}/timeline/{}/lsn_by_time?time={}",
        ps.http_url(),
        t.home(),
        branch.timeline_id,
        time.replace('+', "%2B")
    );
    let r = http::get(&url, QUICK).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
    if r.status != 200 {
        return failed(format!("--at {at}: {} (HTTP {})", r.error_text(), r.status));
    }
    r.json::<LsnResponse>().map(|r| r.lsn).map_err(|e| Error::Failed(format!("{}: its LSN for {at}: {e}", ps.name)))
}

/// Endpoint names become directory names: keep them plain.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!("invalid endpoint name {name:?}: use letters, digits, '-' and '_' (at most 63)")))
    }
}

/// One endpoint of this machine, if it was ever started here.
pub fn load(wd: &Workdir, name: &str) -> Result<Option<Endpoint>> {
    let dir = wd.endpoint_dir(name);
    let path = dir.join(ENDPOINT_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let file: EndpointFile = layout::read_toml(&path)?;
    let Some(host) = wd.cluster.host(&file.host) else {
        return failed(format!("{}: no host named {:?} in the cluster", path.display(), file.host));
    };
    Ok(Some(Endpoint { dir, address: host.address, file }))
}

/// Every endpoint, by name.
pub fn load_all(wd: &Workdir) -> Result<Vec<Endpoint>> {
    let dir = wd.endpoints_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return failed(format!("{}: {e}", dir.display())),
    };
    let mut all = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
        if let Some(name) = entry.file_name().to_str() {
            if let Some(ep) = load(wd, name)? {
                all.push(ep);
            }
        }
    }
    all.sort_by(|a, b| a.file.name.cmp(&b.file.name));
    Ok(all)
}

/// Chooses the endpoint's ports: the requested or remembered PostgreSQL port
/// (which must be free: clients know it), the remembered agent port if free,
/// else new ones clear of every port the cluster has handed out.
fn choose_ports(wd: &Workdir, name: &str, port: Option<u16>, old: Option<&EndpointFile>) -> Result<(u16, u16)> {
    let mut reserved = wd.cluster.ports();
    for ep in load_all(wd)? {
        if ep.file.name != name {
            reserved.extend([ep.file.pg_port, ep.file.http_port]);
        }
    }
    let pg_port = match port.or(old.map(|o| o.pg_port)) {
        Some(p) => {
            if reserved.contains(&p) {
                return failed(format!("port {p} belongs to another service or endpoint of this cluster"));
            }
            if !ports::is_free(p) {
                return failed(format!("endpoint {name}: port {p} is in use (choose another with --port)"));
            }
            p
        }
        None => ports::allocate(1, &reserved).map_err(|e| Error::Failed(format!("finding a free port: {e}")))?[0],
    };
    reserved.push(pg_port);
    let http_port = match old.map(|o| o.http_port) {
        Some(p) if p != pg_port && !reserved.contains(&p) && ports::is_free(p) => p,
        _ => ports::allocate(1, &reserved).map_err(|e| Error::Failed(format!("finding a free port: {e}")))?[0],
    };
    Ok((pg_port, http_port))
}

/// An endpoint as a host reports it: its settings and whether it runs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct EndpointRecord {
    pub file: EndpointFile,
    /// `running`, `restarting` or `stopped` (its agent, by its supervisor).
    pub state: String,
    /// The agent's pid, or its supervisor's while it restarts it.
    pub pid: Option<i32>,
    /// Stopped by its suspension (or a crash while suspending or waking):
    /// a client through the proxy wakes it.
    #[serde(default)]
    pub suspended: bool,
}

/// The endpoints of this machine's workdir, with their state.
pub fn records(wd: &Workdir) -> Result<Vec<EndpointRecord>> {
    Ok(load_all(wd)?
        .into_iter()
        .map(|ep| {
            let liveness = ep.supervised().liveness();
            EndpointRecord {
                suspended: liveness == Liveness::Stopped && ep.suspension().is_some(),
                state: liveness.name().into(),
                pid: liveness.pid().or(liveness.supervisor()),
                file: ep.file,
            }
        })
        .collect())
}

/// Every endpoint of the cluster, from every host: those of this
/// machine's hosts from the workdir, the others from their hosts' nodes.
pub fn inventory(wd: &Workdir) -> Result<Vec<EndpointRecord>> {
    let mut all: Vec<EndpointRecord> =
        records(wd)?.into_iter().filter(|r| wd.cluster.host(&r.file.host).is_some_and(hosts::is_local)).collect();
    for host in wd.cluster.hosts.iter().filter(|h| h.computes && !hosts::is_local(h)) {
        let theirs: Vec<EndpointRecord> = hosts::call(host, "GET", "/v1/endpoints", None::<&()>, QUICK * 2)?;
        all.extend(theirs.into_iter().filter(|r| r.file.host == host.name));
    }
    all.sort_by(|a, b| a.file.name.cmp(&b.file.name));
    Ok(all)
}

/// What an endpoint's agent and WAL proposer report, wherever it runs, if
/// the agent answers.
pub fn compute_status_of(wd: &Workdir, file: EndpointFile) -> Option<ComputeStatus> {
    let address = wd.cluster.host(&file.host)?.address;
    Endpoint { dir: wd.endpoint_dir(&file.name), file, address }.compute_status()
}

/// Removes a stopped endpoint's directory on its host (its branch goes).
pub fn remove(wd: &Workdir, file: &EndpointFile, progress: &mut dyn Progress) -> Result<()> {
    let host = hosts::host(wd, &file.host)?;
    if hosts::is_local(host) {
        forget(wd, &file.name, progress).map(drop)
    } else {
        let req = hosts::EndpointRequest { name: file.name.clone(), immediate: false };
        hosts::call::<Forgotten>(host, "POST", "/v1/endpoints/forget", Some(&req), NODE_CALL).map(drop)
    }
}

/// What the host of an endpoint needs to start it: the CLI resolved the
/// branch and the read-only point from the cluster's state.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LaunchRequest {
    pub name: String,
    pub host: String,
    /// The tenant (name and id) of its branch.
    pub tenant: String,
    pub tenant_id: strata_protocol::TenantId,
    pub branch: String,
    pub timeline_id: strata_protocol::TimelineId,
    pub read_only_at: Option<strata_formats::Lsn>,
    /// A replica: how it starts.
    #[serde(default)]
    pub replica: Option<ReplicaLaunch>,
    /// A promotion: started as a writer while another may still run.
    #[serde(default)]
    pub promote: bool,
    /// `--port`, or the port it had on the host it moves from.
    pub port: Option<u16>,
    pub agent: AgentOptions,
    /// The settings and password it had on the host it moves from.
    pub moved: Option<Forgotten>,
    /// For a replica or a read-only endpoint: the branch's writer's
    /// password, its clients' password too (used at its first start).
    #[serde(default)]
    pub writer_password: Option<String>,
    /// Its SCRAM verifier (a standby's role is the writer's, salt included).
    #[serde(default)]
    pub writer_verifier: Option<String>,
    /// The agent's own token (this tenant's data only), minted by the CLI,
    /// so that a compute host needs no signing key; none without tokens.
    pub agent_token: Option<String>,
    /// The compute's own certificate, issued by the CLI for this start, so
    /// that a compute host needs no CA key; none without TLS.
    #[serde(default)]
    pub compute_tls: Option<super::certs::ComputeCert>,
}

/// How a replica starts (`docs/replicas.md`, "Where a replica starts").
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ReplicaLaunch {
    /// The endpoint it was made a replica of.
    pub of: String,
    /// The checkpoint the branch's writer just made, if it runs: the
    /// replica starts from it or a later one.
    pub after: Option<strata_formats::Lsn>,
    pub hot_standby_feedback: bool,
    /// The site whose pageserver it reads (its own site's reader, when the
    /// controllers have one there).
    #[serde(default)]
    pub site: Option<String>,
}

/// What `strata endpoint start` was asked besides the name.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartOptions<'a> {
    /// `--tenant` (default: the endpoint's, a replica's writer's, else the default tenant).
    pub tenant: Option<&'a str>,
    pub branch: Option<&'a str>,
    pub port: Option<u16>,
    /// `--at`: a read-only endpoint at this point.
    pub at: Option<&'a str>,
    /// `--replica-of`.
    pub replica_of: Option<&'a str>,
    pub hot_standby_feedback: bool,
    pub host: Option<&'a str>,
    /// `--site`: a host of that site; a replica reads its pageserver.
    pub site: Option<&'a str>,
    /// `strata endpoint promote`: the replica starts again as its branch's
    /// writer; the writer still recorded as running is fenced.
    pub promote: bool,
}

/// Records endpoint `name` of this machine on `branch`: a site failover
/// left its timeline behind as a divergent branch (`docs/sites.md`).
pub fn rebranch(wd: &Workdir, name: &str, branch: &str) -> Result<()> {
    let Some(mut ep) = load(wd, name)? else { return failed(format!("no endpoint named {name:?} on this machine")) };
    ep.file.branch = branch.to_string();
    layout::write_toml(
        &ep.dir.join(ENDPOINT_FILE),
        "# Written by `strata endpoint start`; reused by restarts.\n",
        &ep.file,
    )
}

/// An endpoint's client password (the node API's answer).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Password {
    pub password: Option<String>,
    /// Its SCRAM verifier, once made.
    #[serde(default)]
    pub verifier: Option<String>,
}

/// The password of endpoint `name` of this machine, if it has one yet.
pub fn password_of(wd: &Workdir, name: &str) -> Result<Password> {
    let Some(ep) = load(wd, name)? else { return failed(format!("no endpoint named {name:?} here")) };
    Ok(Password { password: ep.password(), verifier: ep.verifier() })
}

/// The password of the branch's writer, wherever it runs: a replica or a
/// read-only endpoint logs its clients in with it (the role's password
/// is the writer's, replayed from its WAL).
fn writer_password(wd: &Workdir, mine: &[EndpointRecord], branch: &str, name: &str) -> Option<Password> {
    let writer = mine.iter().find(|o| o.file.branch == branch && o.file.is_writer() && o.file.name != name)?;
    let host = hosts::host(wd, &writer.file.host).ok()?;
    if hosts::is_local(host) {
        return password_of(wd, &writer.file.name).ok();
    }
    let req = hosts::EndpointRequest { name: writer.file.name.clone(), immediate: false };
    hosts::call::<Password>(host, "POST", "/v1/endpoints/password", Some(&req), NODE_CALL).ok()
}

/// An endpoint removed from a host to move to another: its settings and
/// password go with it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Forgotten {
    pub file: EndpointFile,
    pub password: Option<String>,
    #[serde(default)]
    pub verifier: Option<String>,
}

/// Removes a stopped endpoint from this machine (it moves to another
/// host): its directory goes, its settings and password are returned.
pub fn forget(wd: &Workdir, name: &str, progress: &mut dyn Progress) -> Result<Forgotten> {
    let Some(ep) = load(wd, name)? else { return failed(format!("no endpoint named {name:?} here")) };
    if ep.supervised().liveness() != Liveness::Stopped {
        return failed(format!("endpoint {name} runs; stop it before it moves"));
    }
    stop_orphan_postgres(&ep, true, progress)?;
    let (password, verifier) = (ep.password(), ep.verifier());
    fs::remove_dir_all(&ep.dir).map_err(|e| Error::Failed(format!("{}: {e}", ep.dir.display())))?;
    Ok(Forgotten { file: ep.file, password, verifier })
}

/// `strata endpoint start`: decides the branch, the point and the host,
/// then starts it there (here, or through that host's node); the last line
/// reported is the connection string.
pub fn start(
    wd: &Workdir,
    name: &str,
    how: &StartOptions<'_>,
    agent: &AgentOptions,
    progress: &mut dyn Progress,
) -> Result<()> {
    let all = inventory(wd)?;
    let replica_of = replica_source(name, how, all.iter().find(|r| r.file.name == name))?;
    let tenant = tenant_of(wd, name, how.tenant, &all, replica_of.as_deref())?;
    // A split the controllers finished reaches the cluster file first: the
    // compute starts with the tenant's shards as they are.
    if let Some(now) = super::split::adopt_layout(wd, tenant)? {
        return start(&now, name, how, agent, progress);
    }
    // The tenant's endpoints: branch names mean something within a tenant only.
    let all: Vec<EndpointRecord> = all.into_iter().filter(|r| r.file.tenant == tenant.name).collect();
    let old = all.iter().find(|r| r.file.name == name);
    let (branch_name, branch) = branch_of(tenant, name, how.branch, &all, old, replica_of.as_deref())?;
    let target = target_host(wd, how, old)?;
    let moving = old.filter(|o| o.file.host != target.name);
    if let Some(o) = moving {
        if o.state != "stopped" {
            return failed(format!(
                "endpoint {name} runs on host {}; stop it (`strata endpoint stop {name}`) before it moves to {}",
                o.file.host, target.name
            ));
        }
    }
    // Read-only at a point given now, or as it was before.
    let read_only_at = match how.at {
        Some(at) => Some(resolve_point(wd, tenant, &branch, at)?),
        None => old.and_then(|o| o.file.read_only_at),
    };
    if read_only_at.is_none() && replica_of.is_none() {
        if tenant.follows.is_some() && branch_name == layout::MAIN_BRANCH {
            return failed(format!(
                "tenant {}: main follows the source of its streaming import and takes no writer until `strata \
                 tenant cutover {}` (read it with --at LSN)",
                tenant.name, tenant.name
            ));
        }
        check_writer_may_start(name, &branch, &all, how.promote)?;
    }
    check_storage_runs(wd, tenant, branch.placement.as_ref())?;
    let writer = match replica_of.is_some() || read_only_at.is_some() {
        true => writer_password(wd, &all, &branch_name, name),
        false => None,
    };
    let (writer_password, writer_verifier) = writer.map_or((None, None), |w| (w.password, w.verifier));
    let replica = replica_of.map(|of| replica_launch(wd, name, of, &branch_name, how, &all, old, target, progress));
    let moved = match moving {
        Some(o) => Some(move_away(wd, name, &o.file.host, &target.name, progress)?),
        None => None,
    };
    let reads_only = replica.is_some() || read_only_at.is_some();
    let req = LaunchRequest {
        name: name.into(),
        host: target.name.clone(),
        tenant: tenant.name.clone(),
        tenant_id: tenant.tenant_id,
        branch: branch_name,
        timeline_id: branch.timeline_id,
        read_only_at,
        writer_password,
        writer_verifier,
        replica,
        promote: how.promote,
        port: how.port.or(moved.as_ref().map(|m| m.file.pg_port)),
        agent: agent.clone(),
        moved,
        agent_token: super::keys::signer(&wd.root)?.map(|signer| {
            // Its own branch only; a replica or a read-only endpoint may not
            // propose WAL (`docs/security.md`, "Scopes"). It expires when
            // the controllers can renew it.
            let ttl = controllers_renew(wd).then_some(crate::limits::COMPUTE_TOKEN_TTL);
            let claims = Claims::new(Scope::Tenant, Some(tenant.tenant_id), ttl).for_timeline(branch.timeline_id);
            signer.sign(&if reads_only { claims.reading_only() } else { claims })
        }),
        compute_tls: super::certs::issue_compute(&wd.root, name, target.address)?,
    };
    if hosts::is_local(target) {
        return launch(wd, &req, progress);
    }
    // Its copy of the state (safekeepers, pageserver) must be ours.
    hosts::send(wd, target)?;
    let lines = hosts::call::<hosts::Lines>(target, "POST", "/v1/endpoints/start", Some(&req), NODE_CALL)?.lines;
    for line in lines {
        progress.report(Event::Relayed { line, host: None });
    }
    Ok(())
}

/// The writer a replica follows: asked for now, or as it was before (not
/// once promoted). An endpoint is a replica from its first start or never.
fn replica_source(name: &str, how: &StartOptions<'_>, old: Option<&EndpointRecord>) -> Result<Option<String>> {
    let replica_of = match how.promote {
        true => None,
        false => how.replica_of.map(str::to_string).or(old.and_then(|o| o.file.replica_of.clone())),
    };
    if let (Some(_), Some(o)) = (&replica_of, old) {
        if o.file.replica_of.is_none() {
            return failed(format!("endpoint {name} is not a replica (use a new endpoint name for one)"));
        }
    }
    if replica_of.is_some() && (how.at.is_some() || old.is_some_and(|o| o.file.read_only_at.is_some())) {
        return Err(Error::Usage("a replica follows its branch: --at does not apply".into()));
    }
    Ok(replica_of)
}

/// The tenant an endpoint runs in: the one it ran in before, a replica's
/// writer's, else the one asked for, else the default one; never another
/// than it ran in.
fn tenant_of<'a>(
    wd: &'a Workdir,
    name: &str,
    asked: Option<&str>,
    all: &[EndpointRecord],
    replica_of: Option<&str>,
) -> Result<&'a Tenant> {
    let old = all.iter().find(|r| r.file.name == name).map(|r| r.file.tenant.as_str());
    let writer = replica_of.and_then(|of| all.iter().find(|r| r.file.name == of)).map(|r| r.file.tenant.as_str());
    let known = old.or(writer);
    let tenant = match (asked, known) {
        (Some(a), Some(k)) if a != k => {
            let what = if old.is_some() { format!("endpoint {name}") } else { "its writer".to_string() };
            return failed(format!("{what} runs in tenant {k}, not {a} (use a new endpoint name for another tenant)"));
        }
        (a, k) => a.or(k).unwrap_or(layout::DEFAULT_TENANT),
    };
    let t = wd.cluster.tenant_named(tenant)?;
    if t.state != layout::TenantState::Active {
        return failed(format!("tenant {tenant} is {}: it runs no endpoints", t.state.as_str()));
    }
    Ok(t)
}

/// The branch an endpoint runs on: its writer's for a replica, the one it
/// ran on before, else the one asked for, else `main`.
fn branch_of(
    t: &Tenant,
    name: &str,
    asked: Option<&str>,
    all: &[EndpointRecord],
    old: Option<&EndpointRecord>,
    replica_of: Option<&str>,
) -> Result<(String, layout::Branch)> {
    let writer_branch = match replica_of {
        Some(of) => {
            let Some(w) = all.iter().find(|r| r.file.name == of) else {
                return failed(format!("--replica-of {of}: no endpoint named {of:?}"));
            };
            if !w.file.is_writer() {
                return failed(format!("--replica-of {of}: {of} is not its branch's writer"));
            }
            Some(w.file.branch.as_str())
        }
        None => None,
    };
    let branch = match (asked, writer_branch) {
        (Some(b), Some(wb)) if b != wb => {
            return failed(format!("a replica of {} runs on its branch {wb}, not {b}", replica_of.unwrap_or_default()))
        }
        (None, Some(wb)) => Some(wb),
        (b, _) => b,
    };
    let branch_name = match (branch, old) {
        (Some(b), Some(o)) if b != o.file.branch => {
            return failed(format!(
                "endpoint {name} runs on branch {}, not {b} (use a new endpoint name for another branch)",
                o.file.branch
            ))
        }
        (Some(b), _) => b.to_string(),
        (None, Some(o)) => o.file.branch.clone(),
        (None, None) => MAIN_BRANCH.to_string(),
    };
    let Some(branch) = t.branch(&branch_name).cloned() else {
        return Err(
            t.context(Error::Failed(format!("no branch named {branch_name:?} (branches: {})", t.branch_names())))
        );
    };
    Ok((branch_name, branch))
}

/// The host an endpoint runs on: `--host`, else where it ran before, else
/// a host of `--site`, else the default; it must run computes.
fn target_host<'a>(wd: &'a Workdir, how: &StartOptions<'_>, old: Option<&EndpointRecord>) -> Result<&'a layout::Host> {
    if let Some(site) = how.site {
        if !wd.cluster.hosts.iter().any(|h| h.site == site) {
            let sites: std::collections::BTreeSet<&str> = wd.cluster.hosts.iter().map(|h| h.site.as_str()).collect();
            return Err(Error::Usage(format!(
                "--site {site}: no host of the cluster is in that site (sites: {})",
                sites.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let in_site = how.site.and_then(|s| wd.cluster.hosts.iter().find(|h| h.site == s && h.computes));
    let target = match how.host.or(old.map(|o| o.file.host.as_str())) {
        Some(h) => hosts::host(wd, h)?,
        None => match in_site {
            Some(h) => h,
            None => default_host(wd)?,
        },
    };
    if !target.computes {
        return Err(Error::Usage(format!("host {} does not run computes (cluster.toml)", target.name)));
    }
    Ok(target)
}

/// A writer may start on `branch`: not a divergent one, and no other writer
/// runs there (a second PostgreSQL would fork its WAL; its host checks
/// again under its lock). A promotion fences the writer instead: its WAL
/// can no longer commit.
fn check_writer_may_start(name: &str, branch: &layout::Branch, all: &[EndpointRecord], promote: bool) -> Result<()> {
    if branch.divergent.is_some() {
        return failed(format!(
            "branch {} is the history a site failover left behind (its timeline is sealed): it takes no \
             writer; read it with --at LSN",
            branch.name
        ));
    }
    if promote {
        return Ok(());
    }
    let running = all.iter().find(|other| {
        other.file.name != name
            && other.file.is_writer()
            && other.file.branch == branch.name
            && other.state != "stopped"
    });
    match running {
        Some(other) => failed(format!(
            "endpoint {} (pid {}) already runs on branch {}; one writer per branch",
            other.file.name,
            other.pid.unwrap_or(0),
            branch.name
        )),
        None => Ok(()),
    }
}

/// How a replica starts: from a fresh checkpoint of its branch's running
/// writer, if any, reading the pageserver of its site.
#[allow(clippy::too_many_arguments)]
fn replica_launch(
    wd: &Workdir,
    name: &str,
    of: String,
    branch: &str,
    how: &StartOptions<'_>,
    all: &[EndpointRecord],
    old: Option<&EndpointRecord>,
    target: &layout::Host,
    progress: &mut dyn Progress,
) -> ReplicaLaunch {
    let writer = all.iter().find(|o| o.file.branch == branch && o.file.is_writer() && o.state == "running");
    let after = writer.and_then(|w| match writer_checkpoint(wd, &w.file) {
        Ok(lsn) => Some(lsn),
        Err(e) => {
            let (endpoint, writer, error) = (name.to_string(), w.file.name.clone(), e.to_string());
            progress.tell(EndpointEvent::NoFreshCheckpoint { endpoint, writer, error });
            None
        }
    });
    let feedback = how.hot_standby_feedback || old.is_some_and(|o| o.file.hot_standby_feedback);
    let site = how.site.map(str::to_string).or_else(|| old.and_then(|o| o.file.read_site.clone()));
    ReplicaLaunch { of, after, hot_standby_feedback: feedback, site: site.or_else(|| Some(target.site.clone())) }
}

/// Removes a stopped endpoint from the host it ran on, to start on `to`:
/// its settings and password.
fn move_away(wd: &Workdir, name: &str, from: &str, to: &str, progress: &mut dyn Progress) -> Result<Forgotten> {
    let from_host = hosts::host(wd, from)?;
    let forgotten = if hosts::is_local(from_host) {
        forget(wd, name, progress)?
    } else {
        let req = hosts::EndpointRequest { name: name.into(), immediate: false };
        hosts::call(from_host, "POST", "/v1/endpoints/forget", Some(&req), NODE_CALL)?
    };
    progress.tell(EndpointEvent::Moves { endpoint: name.into(), from: from.into(), to: to.into() });
    Ok(forgotten)
}

/// `strata endpoint promote`: the replica `name` becomes its branch's
/// writer (`docs/replicas.md`, "Promotion"). Its standby stops at once
/// (nothing of it needs saving) and the endpoint starts again, on the same
/// host and port, as a writer: a new safekeeper term, at the end of the
/// committed WAL. A writer still running is fenced by that term; it is
/// then stopped, if it can be reached.
pub fn promote(wd: &Workdir, name: &str, progress: &mut dyn Progress) -> Result<()> {
    let t = Instant::now();
    let all = inventory(wd)?;
    let Some(record) = all.iter().find(|r| r.file.name == name) else {
        return failed(format!("no endpoint named {name:?}"));
    };
    if record.file.replica_of.is_none() {
        return failed(format!("endpoint {name} is not a replica"));
    }
    let writers: Vec<EndpointRecord> = all
        .iter()
        .filter(|o| o.file.tenant == record.file.tenant && o.file.branch == record.file.branch)
        .filter(|o| o.file.is_writer() && o.state != "stopped")
        .cloned()
        .collect();
    stop(wd, name, true, progress)?;
    let how = StartOptions { promote: true, ..StartOptions::default() };
    start(wd, name, &how, &AgentOptions::default(), progress)?;
    let (endpoint, branch, seconds) = (name.to_string(), record.file.branch.clone(), t.elapsed().as_secs_f64());
    progress.tell(EndpointEvent::Promoted { endpoint, branch, seconds });
    // The old writer can no longer commit; stop what is left of it.
    for w in writers {
        if let Err(e) = stop(wd, &w.file.name, true, progress) {
            progress.tell(EndpointEvent::FencedNotStopped { endpoint: w.file.name, error: e.to_string() });
        }
    }
    Ok(())
}

/// Asks a running writer's agent for a checkpoint; the checkpoint record's LSN.
fn writer_checkpoint(wd: &Workdir, writer: &EndpointFile) -> Result<strata_formats::Lsn> {
    let host = hosts::host(wd, &writer.host)?;
    let at = std::net::SocketAddr::new(host.address, writer.http_port);
    let url = format!("{}://{at}/v1/checkpoint", super::http::scheme());
    let r = http::post(&url, &serde_json::json!({}), CHECKPOINT_WAIT).map_err(Error::Failed)?;
    if r.status != 200 {
        return failed(format!("HTTP {}: {}", r.status, r.error_text()));
    }
    r.json::<strata_protocol::api::compute::CheckpointResponse>()
        .map(|c| c.checkpoint_lsn)
        .map_err(|e| Error::Failed(format!("{url}: {e}")))
}

/// Where a new endpoint goes without `--host`: this machine's host if it
/// runs computes, else the first host that does.
fn default_host(wd: &Workdir) -> Result<&layout::Host> {
    if let Some(h) = hosts::this_host(wd)?.filter(|h| h.computes) {
        return Ok(h);
    }
    wd.cluster.hosts.iter().find(|h| h.computes).ok_or_else(|| Error::Failed("no host runs computes".into()))
}

/// Starts an endpoint on this machine: writes its agent's configuration,
/// spawns the agent under its supervisor and waits until PostgreSQL runs;
/// reports where it runs, the connection string last.
pub fn launch(wd: &Workdir, req: &LaunchRequest, progress: &mut dyn Progress) -> Result<()> {
    let name = req.name.as_str();
    check_name(name)?;
    let host = hosts::host(wd, &req.host)?.clone();
    let old = load(wd, name)?;
    if let Some(o) = &old {
        wait_for_suspension(o)?;
        check_relaunch(o, req, progress)?;
    }
    check_one_writer_here(wd, req)?;
    // A PostgreSQL whose agent was killed still holds the port and pgdata.
    if let Some(o) = &old {
        stop_orphan_postgres(o, false, progress)?;
    }
    let ep = record(wd, req, &host, old.as_ref())?;
    let given = req.moved.as_ref().and_then(|m| m.password.as_deref()).or(req.writer_password.as_deref());
    let password = ensure_password(&ep, given)?;
    let given = req.moved.as_ref().and_then(|m| m.verifier.as_deref()).or(req.writer_verifier.as_deref());
    ensure_verifier(&ep, given, &password)?;
    let config = agent_file(wd, &ep, req, &host)?;
    write_agent_config(&ep, &config)?;
    let (pid, supervisor) = spawn_agent(wd, &ep, progress)?;
    progress.tell(EndpointEvent::Running {
        endpoint: name.into(),
        branch: req.branch.clone(),
        timeline: req.timeline_id,
        host: host.name.clone(),
        pid,
        supervisor,
        log: ep.log(),
    });
    let ca = super::certs::client(&wd.root)?.map(|_| super::certs::ca_cert(&wd.root));
    if let (Some(ca), false) = (&ca, host.is_loopback()) {
        progress.tell(EndpointEvent::OverTls(ep.tls_connstr(&password, ca)));
    }
    // Last line: scripts take the connection string from here.
    progress.tell(EndpointEvent::Connstr(ep.local_connstr(&password, ca.as_deref())));
    Ok(())
}

/// Writes the agent's `agent.toml`, readable by its owner only: it names
/// where the endpoint's token, password and keys are (never the secrets
/// themselves), which nobody else needs to know.
fn write_agent_config(ep: &Endpoint, config: &AgentFile) -> Result<()> {
    let text = format!("# Written by `strata endpoint start` at every start.\n{}", config.to_toml());
    let path = ep.agent_config();
    strata_service::durable::replace_file_with_mode(&path, text.as_bytes(), true, 0o600)
        .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

/// A suspension under way (the agent stopping after its idle period, its
/// marker written) is waited for: a wake that comes just then starts the
/// compute again instead of failing as already running. The marker goes
/// once a new agent runs PostgreSQL, so a crash while suspending, after
/// which the supervisor starts the agent again, ends the wait too.
fn wait_for_suspension(o: &Endpoint) -> Result<()> {
    let deadline = Instant::now() + SUSPENSION_WAIT;
    while o.supervised().liveness() != Liveness::Stopped && o.suspension().is_some() {
        if Instant::now() > deadline {
            return failed(format!(
                "endpoint {}: still suspending after {}s (see {})",
                o.file.name,
                SUSPENSION_WAIT.as_secs(),
                o.log().display()
            ));
        }
        std::thread::sleep(START_POLL);
    }
    Ok(())
}

/// An endpoint recorded here may start again: same branch, not running
/// (an agent without its supervisor is stopped, to start anew under one).
fn check_relaunch(o: &Endpoint, req: &LaunchRequest, progress: &mut dyn Progress) -> Result<()> {
    let name = &req.name;
    if o.file.tenant != req.tenant || o.file.branch != req.branch {
        let (was, now) = (format!("{}/{}", o.file.tenant, o.file.branch), format!("{}/{}", req.tenant, req.branch));
        return failed(format!("endpoint {name} runs on branch {was}, not {now}"));
    }
    match o.supervised().liveness() {
        Liveness::Running { pid, supervisor: Some(_) } => {
            failed(format!("endpoint {name} is already running (pid {pid}): {}", o.connstr()))
        }
        Liveness::Restarting { supervisor } => failed(format!(
            "endpoint {name} is already running: its supervisor (pid {supervisor}) is restarting its agent"
        )),
        Liveness::Running { pid, supervisor: None } => {
            // Never two agents on one data directory: stop it, start anew.
            progress.tell(EndpointEvent::Unsupervised { endpoint: name.clone(), pid });
            o.supervised().stop_unsupervised().map(|_| ())
        }
        Liveness::Stopped => Ok(()),
    }
}

/// One writer per timeline, among this host's endpoints, under the lock.
fn check_one_writer_here(wd: &Workdir, req: &LaunchRequest) -> Result<()> {
    if req.read_only_at.is_some() || req.replica.is_some() || req.promote {
        return Ok(());
    }
    for other in load_all(wd)? {
        let same_branch = other.file.tenant == req.tenant && other.file.branch == req.branch;
        if other.file.is_writer() && other.file.name != req.name && same_branch {
            let liveness = other.supervised().liveness();
            if let Some(pid) = liveness.pid().or(liveness.supervisor()) {
                return failed(format!(
                    "endpoint {} (pid {pid}) already runs on branch {}; one writer per branch",
                    other.file.name, req.branch
                ));
            }
        }
    }
    Ok(())
}

/// Writes `endpoint.toml` for this start: the settings of earlier starts
/// (here, or on the host it moved from) unless the request changes them.
fn record(wd: &Workdir, req: &LaunchRequest, host: &layout::Host, old: Option<&Endpoint>) -> Result<Endpoint> {
    let name = req.name.as_str();
    let agent = &req.agent;
    let before = old.map(|o| &o.file).or(req.moved.as_ref().map(|m| &m.file));
    // Lazy unless asked otherwise, now or at an earlier start of the
    // endpoint (an eager compute of a sharded tenant writes its relation
    // files from every shard before PostgreSQL starts).
    let lazy = agent.lazy || (!agent.eager && before.is_none_or(|o| o.lazy));
    let (pg_port, http_port) = choose_ports(wd, name, req.port, old.map(|o| &o.file))?;
    let dir = wd.endpoint_dir(name);
    fs::create_dir_all(&dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let ep = Endpoint {
        dir,
        address: host.address,
        file: EndpointFile {
            name: name.into(),
            tenant: req.tenant.clone(),
            host: host.name.clone(),
            branch: req.branch.clone(),
            pg_port,
            http_port,
            read_only_at: req.read_only_at,
            replica_of: req.replica.as_ref().map(|r| r.of.clone()),
            read_site: req.replica.as_ref().and_then(|r| r.site.clone()),
            hot_standby_feedback: req.replica.as_ref().is_some_and(|r| r.hot_standby_feedback),
            lazy,
            cache_mb: agent.cache_mb.or(before.and_then(|o| o.cache_mb)),
            fetch_retry_secs: agent.fetch_retry_secs.or(before.and_then(|o| o.fetch_retry_secs)),
            suspend_after_secs: agent.suspend_after_secs.or(before.and_then(|o| o.suspend_after_secs)),
        },
    };
    layout::write_toml(
        &ep.dir.join(ENDPOINT_FILE),
        "# Written by `strata endpoint start`; reused by restarts.\n",
        &ep.file,
    )?;
    Ok(ep)
}

/// Each shard's pageserver, in shard order (the only one's when
/// unsharded): a replica reads its site's reader of a shard where there is one.
fn serving_pageservers<'a>(
    wd: &'a Workdir,
    tenant: &Tenant,
    read_site: Option<&str>,
) -> Result<Vec<&'a layout::Service>> {
    let mut serving = Vec::new();
    for shard in tenant.shard_ids() {
        serving.push(match read_site.and_then(|s| super::controller::site_reader(wd, shard, s)) {
            Some(reader) => reader,
            None => super::controller::attached(wd, shard)?,
        });
    }
    Ok(serving)
}

/// The agent's configuration for this start. Everything of another site
/// is reached through the link proxy's routes; a replica reads its site's
/// reader when there is one (`docs/sites.md`).
fn agent_file(wd: &Workdir, ep: &Endpoint, req: &LaunchRequest, host: &layout::Host) -> Result<AgentFile> {
    let c = &wd.cluster;
    let site = host.site.as_str();
    let read_site = req.replica.as_ref().and_then(|r| r.site.as_deref());
    let tenant = wd.cluster.tenant_named(&req.tenant)?;
    let serving = serving_pageservers(wd, tenant, read_site)?;
    let ps = serving[0];
    let mut f = AgentFile::new(
        ep.pgdata(),
        ep.file.pg_port,
        c.safekeeper_addrs_from(site),
        (req.tenant_id, req.timeline_id),
        c.addr_from(site, ps, "http").unwrap_or_default(),
        ep.password_file(),
    );
    f.password_verifier_file = Some(ep.verifier_file());
    f.controllers = c.of_kind(Kind::Controller).filter_map(|s| c.addr_from(site, s, "http")).collect();
    f.http = Some(std::net::SocketAddr::new(ep.address, ep.file.http_port));
    f.pg_bin_dir = c.pg_bin_dir_for(c.timeline_pg_version(req.tenant_id, req.timeline_id));
    f.pg_user = c.pg_user.clone();
    f.verify_redo = c.verify_redo;
    f.pageserver_site = read_site.map(str::to_string);
    // The safekeepers' membership configuration and the storage
    // controllers name services at their own addresses.
    f.address_map = c.address_map_from(site).into_iter().collect();
    f.read_only_at = req.read_only_at;
    if let Some(token) = &req.agent_token {
        // Rewritten at every start, so a new key takes effect with the next one.
        let path = ep.dir.join(AGENT_TOKEN_FILE);
        strata_service::auth::write_secret(&path, token).map_err(|e| Error::Failed(e.to_string()))?;
        f.auth_public_key = Some(super::keys::public_key(&wd.root));
        f.token_file = Some(path);
    }
    if super::certs::client(&wd.root)?.is_some() {
        // Never the host's certificate: its key ends up in PostgreSQL's
        // data directory (see `ComputeCert`).
        let Some(own) = &req.compute_tls else {
            return failed(format!(
                "endpoint {}: the request brings no certificate for the compute (a CLI older than this host's node \
                 sent it); start it with a CLI of this version",
                req.name
            ));
        };
        let (cert, key) = (ep.dir.join(COMPUTE_CERT_FILE), ep.dir.join(COMPUTE_KEY_FILE));
        let write = |path: &Path, pem: &str| {
            strata_service::auth::write_secret(path, pem)
                .map_err(|e| Error::Failed(format!("endpoint {}: {e}", req.name)))
        };
        write(&key, &own.key)?;
        write(&cert, &own.cert)?;
        (f.tls_ca, f.tls_cert, f.tls_key) = (Some(super::certs::ca_cert(&wd.root)), Some(cert), Some(key));
        if !host.is_loopback() {
            // Clients of other hosts reach PostgreSQL at the host's address, over TLS.
            f.pg_host_address = Some(host.address);
        }
    }
    let agent = &req.agent;
    f.replica = req.replica.as_ref().map(|replica| {
        // Its own site's safekeepers first: the others are reached across
        // the link, which a partition may have cut.
        let replication = c.safekeeper_addrs_from_role(site, "pg");
        let mut r = ReplicaFile::new(req.name.clone(), replication);
        r.after = replica.after;
        r.hot_standby_feedback = replica.hot_standby_feedback;
        r.max_lag_mb = agent.max_replica_lag_mb.unwrap_or(r.max_lag_mb);
        r
    });
    if ep.file.lazy {
        let mut lazy = LazyFile::new(c.addr_from(site, ps, "pg").unwrap_or_default());
        lazy.cache_mb = ep.file.cache_mb.unwrap_or(lazy.cache_mb);
        lazy.fetch_retry_secs = ep.file.fetch_retry_secs.unwrap_or(lazy.fetch_retry_secs);
        f.lazy = Some(lazy);
    }
    f.shards = tenant.shards.map(|layout| ShardsFile {
        count: layout.count,
        stripe_blocks: layout.stripe_blocks,
        page_services: serving.iter().map(|ps| c.addr_from(site, ps, "pg").unwrap_or_default()).collect(),
        pageservers_http: serving.iter().map(|ps| c.addr_from(site, ps, "http").unwrap_or_default()).collect(),
    });
    if let Some(size) = &agent.shared_buffers {
        f.shared_buffers = size.clone();
    }
    if let Some(method) = &agent.io_method {
        let major = c.timeline_pg_version(req.tenant_id, req.timeline_id);
        if major < 18 {
            return failed(format!("endpoint {}: io_method is PostgreSQL 18's; the branch is {major}'s", req.name));
        }
        f.io_method = Some(
            IoMethod::parse(method)
                .ok_or_else(|| Error::Usage(format!("io_method {method:?}: sync, worker or io_uring")))?,
        );
    }
    f.crash_loop_restarts = agent.crash_loop_restarts.unwrap_or(f.crash_loop_restarts);
    f.crash_loop_window_secs = agent.crash_loop_window_secs.unwrap_or(f.crash_loop_window_secs);
    f.suspend_after_secs = suspend_after(ep.file.suspend_after_secs, c.default_suspend_after_secs);
    f.check().map_err(|e| Error::Failed(format!("endpoint {}: the agent's configuration: {e}", req.name)))?;
    Ok(f)
}

/// The agent's idle period: the endpoint's own (kept from the start that
/// gave it), else the cluster's default; 0 is never.
fn suspend_after(endpoint: Option<u64>, cluster: Option<u64>) -> Option<u64> {
    endpoint.or(cluster).filter(|s| *s > 0)
}

/// Spawns the agent under its supervisor and waits until its PostgreSQL
/// runs; the agent's and the supervisor's pids. A failed start leaves
/// nothing running: the agent (which stops its PostgreSQL), its
/// supervisor, and a PostgreSQL it could not stop.
fn spawn_agent(wd: &Workdir, ep: &Endpoint, progress: &mut dyn Progress) -> Result<(i32, u32)> {
    let name = &ep.file.name;
    let exe = std::env::current_exe().map_err(|e| Error::Failed(format!("finding the strata binary: {e}")))?;
    let config = ep.agent_config();
    let args: Vec<&std::ffi::OsStr> =
        vec!["compute".as_ref(), "start".as_ref(), "--config".as_ref(), config.as_os_str()];
    let log = ep.log();
    let from = process::log_len(&log);
    let sv = ep.supervised();
    let mut child = sv.spawn(&exe, &args, &wd.root)?;
    let mut abort = |child: &mut std::process::Child, why: String| {
        let _ = sv.stop(false);
        let _ = stop_orphan_postgres(ep, true, progress);
        let _ = child.try_wait();
        failed(format!("endpoint {name}: {why}\n{}", process::log_tail(&log, from, ENDPOINT_TAIL_LINES)))
    };
    let deadline = Instant::now() + ENDPOINT_START_WAIT;
    let mut last_state = String::from("(no answer)");
    loop {
        if let Some(why) = sv.start_failure(&mut child) {
            return abort(&mut child, format!("the compute agent {why} in state {last_state}"));
        }
        if let Some(view) = ep.agent_view() {
            match view.state {
                AgentState::Running => {
                    if let Some(pid) = sv.service.running() {
                        return Ok((pid, child.id()));
                    }
                }
                AgentState::Failed => {
                    let error = view.error.unwrap_or_else(|| "(no error given)".into());
                    return abort(&mut child, format!("failed: {error}"));
                }
                other => last_state = other.name().to_string(),
            }
        }
        if Instant::now() > deadline {
            return abort(
                &mut child,
                format!("not running after {}s (last state: {last_state}); stopped it", ENDPOINT_START_WAIT.as_secs()),
            );
        }
        // Often: a start takes well under a second, and the caller waits on this.
        std::thread::sleep(START_POLL);
    }
}

/// A compute needs the pageserver (its basebackup) and a majority of the
/// safekeepers (its commits); say so now rather than time out later.
/// The branch's WAL can be committed: enough of its safekeepers run for
/// its placement (a majority of its home site's under `local-quorum`,
/// which after a site failover is all that runs), a storage controller
/// and the attached pageserver.
fn check_storage_runs(
    wd: &Workdir,
    t: &Tenant,
    placement: Option<&strata_protocol::safekeeper::Placement>,
) -> Result<()> {
    let how = format!("start it with `strata start --workdir {}`", wd.root.display());
    if let Some(ps) = wd.cluster.of_kind(Kind::Pageserver).find(|s| !services::is_up(wd, s)) {
        if !wd.cluster.of_kind(Kind::Pageserver).any(|s| services::is_up(wd, s)) {
            return failed(format!("{} is not running; {how}", ps.name));
        }
    }
    if !wd.cluster.of_kind(Kind::Controller).any(|s| services::is_up(wd, s)) {
        return failed(format!("no storage controller is running; {how}"));
    }
    for shard in t.shard_ids() {
        let ps = super::controller::attached(wd, shard)?;
        if !services::is_up(wd, ps) {
            return failed(format!("{} is not running; {how}", ps.name));
        }
    }
    let nodes = super::reconfigure::nodes(wd)?;
    let up: Vec<strata_protocol::NodeId> = nodes
        .iter()
        .filter(|n| wd.service(&n.name).is_some_and(|s| services::is_up(wd, s)))
        .map(|n| n.member.id)
        .collect();
    let rule = strata_protocol::safekeeper::Membership::of(
        1,
        nodes.iter().map(|n| n.member.clone()).collect(),
        placement.cloned().unwrap_or_default(),
    );
    if !rule.has_quorum(&up) {
        return failed(format!(
            "only {} of {} safekeepers run, not a quorum for the branch's placement ({}); {how}",
            up.len(),
            nodes.len(),
            rule.placement.policy()
        ));
    }
    Ok(())
}

/// The pid of a PostgreSQL running in the endpoint's pgdata while neither
/// its agent nor the agent's supervisor does (both were killed).
pub fn orphan_postgres(ep: &Endpoint) -> Option<i32> {
    if ep.supervised().liveness() != Liveness::Stopped {
        return None;
    }
    let pid = process::read_pid(&ep.pgdata().join("postmaster.pid"))?;
    (process::alive(pid) && process::comm(pid).as_deref() == Some("postgres")).then_some(pid)
}

/// Stops a PostgreSQL that outlived its agent, so nothing of a stopped
/// endpoint runs and a restart finds its port and pgdata free; then kills
/// any postgres process still running in the data directory (the
/// postmaster's children each lead their own session, so they are found by
/// their working directory).
fn stop_orphan_postgres(ep: &Endpoint, immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    if let Some(pid) = orphan_postgres(ep) {
        let is_postgres = || process::alive(pid) && process::comm(pid).as_deref() == Some("postgres");
        // SIGINT: fast shutdown.
        process::send(pid, if immediate { libc::SIGKILL } else { libc::SIGINT });
        if !process::wait_gone(is_postgres, ORPHAN_GRACE) {
            process::kill_group(pid);
            if !process::wait_gone(is_postgres, KILL_WAIT) {
                return failed(format!("endpoint {}: PostgreSQL (pid {pid}) does not die", ep.file.name));
            }
        }
        progress.tell(EndpointEvent::OrphanStopped { endpoint: ep.file.name.clone(), pid });
    }
    if ep.supervised().liveness() != Liveness::Stopped {
        return Ok(());
    }
    let pgdata = ep.pgdata();
    let left = || !postgres::processes_in(&pgdata).is_empty();
    for pid in postgres::processes_in(&pgdata) {
        process::send(pid, libc::SIGKILL);
    }
    if !process::wait_gone(left, KILL_WAIT) {
        return failed(format!("endpoint {}: postgres processes in {} do not die", ep.file.name, pgdata.display()));
    }
    // A lazy compute's mounts outlive an agent that was killed.
    strata_compute::agent::lazy::detach_left_behind(&pgdata);
    // A deep data directory has its socket in a directory of its own in
    // the temporary directory: it goes with the processes that used it
    // (the next start makes it again).
    let sockets = strata_compute::agent::pgconf::socket_dir(&pgdata, ep.file.pg_port);
    if sockets != pgdata {
        match std::fs::remove_dir_all(&sockets) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                let (endpoint, error) = (ep.file.name.clone(), e.to_string());
                progress.tell(Notice::SocketDirLeft { endpoint, dir: sockets, error });
            }
        }
    }
    Ok(())
}

/// `strata endpoint stop`: SIGTERM to the supervisor, which passes it to
/// the agent (it stops PostgreSQL and flushes the WAL) and kills it after
/// the grace period; on the endpoint's host, here or through its node.
/// Idempotent.
pub fn stop(wd: &Workdir, name: &str, immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    let all = inventory(wd)?;
    let Some(record) = all.iter().find(|r| r.file.name == name) else {
        let known: Vec<&str> = all.iter().map(|r| r.file.name.as_str()).collect();
        return failed(format!(
            "no endpoint named {name:?} (endpoints: {})",
            if known.is_empty() { "none".into() } else { known.join(", ") }
        ));
    };
    let host = hosts::host(wd, &record.file.host)?;
    if hosts::is_local(host) {
        let stopped = stop_local(wd, name, immediate, progress)?;
        progress.tell(stopped);
        return Ok(());
    }
    let req = hosts::EndpointRequest { name: name.into(), immediate };
    for line in hosts::call::<hosts::Lines>(host, "POST", "/v1/endpoints/stop", Some(&req), NODE_CALL)?.lines {
        progress.report(Event::Relayed { line, host: None });
    }
    Ok(())
}

/// `strata endpoint suspend NAME`: puts a running endpoint of this
/// machine to sleep now, as its idle period would (`docs/compute.md`,
/// "Suspend"): the marker first, so that a crash midway leaves it to be
/// woken, then a clean stop (its last WAL reaches the safekeepers), then
/// the marker of a finished suspension. The next `endpoint start`, or a
/// client's connection through the proxy, wakes it.
pub fn suspend(wd: &Workdir, name: &str, progress: &mut dyn Progress) -> Result<()> {
    let Some(ep) = load(wd, name)? else {
        return match inventory(wd)?.into_iter().find(|r| r.file.name == name) {
            Some(r) => {
                failed(format!("endpoint {name} runs on host {}: suspend it from there (or stop it)", r.file.host))
            }
            None => failed(format!("no endpoint named {name:?}")),
        };
    };
    if ep.is_suspended() {
        return failed(format!("endpoint {name} is suspended already"));
    }
    if !matches!(ep.supervised().liveness(), Liveness::Running { .. }) {
        return failed(format!("endpoint {name} is not running: only a running endpoint is suspended"));
    }
    let decided_at = crate::supervisor_state::unix_now();
    let mut marker =
        suspend::Marker { phase: suspend::Phase::Suspending, idle_secs: 0, decided_at, suspended_at: None };
    suspend::write_marker(&ep.suspend_marker(), &marker).map_err(|e| Error::Failed(format!("endpoint {name}: {e}")))?;
    let report = match ep.supervised().stop(false) {
        Ok(outcome) => {
            StopReport { label: format!("endpoint {name}"), outcome, immediate: false, grace: ENDPOINT_STOP_GRACE }
        }
        Err(e) => {
            // Not stopped: it runs on, awake.
            let _ = suspend::clear_marker(&ep.suspend_marker());
            return Err(e);
        }
    };
    stop_orphan_postgres(&ep, false, progress)?;
    marker.phase = suspend::Phase::Suspended;
    marker.suspended_at = Some(crate::supervisor_state::unix_now());
    suspend::write_marker(&ep.suspend_marker(), &marker).map_err(|e| Error::Failed(format!("endpoint {name}: {e}")))?;
    progress.tell(report);
    Ok(())
}

/// Stops an endpoint of this machine; how it went.
pub fn stop_local(wd: &Workdir, name: &str, immediate: bool, progress: &mut dyn Progress) -> Result<StopReport> {
    let Some(ep) = load(wd, name)? else { return failed(format!("no endpoint named {name:?} here")) };
    stop_endpoint(&ep, immediate, progress)
}

/// Stops the agent and its supervisor, then whatever PostgreSQL they left.
/// A suspended endpoint is left suspended (its marker and its supervisor's
/// last state stay, so that the next connection still wakes it); only a
/// PostgreSQL that a crash while suspending left running is stopped.
fn stop_endpoint(ep: &Endpoint, immediate: bool, progress: &mut dyn Progress) -> Result<StopReport> {
    let outcome = match ep.is_suspended() {
        true => StopOutcome::Suspended,
        false => ep.supervised().stop(immediate)?,
    };
    stop_orphan_postgres(ep, immediate, progress)?;
    Ok(StopReport { label: format!("endpoint {}", ep.file.name), outcome, immediate, grace: ENDPOINT_STOP_GRACE })
}

/// Stops every endpoint of this machine (the first step of `strata stop`
/// and of a node's), several at once; reports them by name, keeps going
/// past a failure and reports them all.
pub fn stop_all(wd: &Workdir, immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    let all = load_all(wd)?;
    let mut errors = Vec::new();
    for batch in all.chunks(ENDPOINT_STOPS_AT_ONCE) {
        let outcomes: Vec<(Vec<Event>, Result<StopReport>)> = std::thread::scope(|scope| {
            let threads: Vec<_> = batch
                .iter()
                .map(|ep| {
                    scope.spawn(move || {
                        let mut events = Vec::new();
                        let stopped = stop_endpoint(ep, immediate, &mut events);
                        (events, stopped)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("an endpoint's stop does not panic")).collect()
        });
        for (events, stopped) in outcomes {
            events.into_iter().for_each(|e| progress.report(e));
            match stopped {
                Ok(report) => progress.tell(report),
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        failed(errors.join("; "))
    }
}

/// Stops every endpoint of the cluster: this machine's, then each other
/// host's through its node. Keeps going past a failure and reports all.
pub fn stop_everywhere(wd: &Workdir, immediate: bool, progress: &mut dyn Progress) -> Result<()> {
    let mut errors: Vec<String> = stop_all(wd, immediate, progress).err().map(|e| e.to_string()).into_iter().collect();
    for host in wd.cluster.hosts.iter().filter(|h| h.computes && !hosts::is_local(h)) {
        let result = hosts::call::<Vec<EndpointRecord>>(host, "GET", "/v1/endpoints", None::<&()>, QUICK * 2).and_then(
            |records| {
                for r in records.iter().filter(|r| r.file.host == host.name && r.state != "stopped") {
                    let req = hosts::EndpointRequest { name: r.file.name.clone(), immediate };
                    let out: hosts::Lines = hosts::call(host, "POST", "/v1/endpoints/stop", Some(&req), NODE_CALL)?;
                    out.lines.into_iter().for_each(|line| progress.report(Event::Relayed { line, host: None }));
                }
                Ok(())
            },
        );
        if let Err(e) = result {
            errors.push(e.to_string());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        failed(errors.join("; "))
    }
}

/// Whether every storage controller of the cluster renews the computes'
/// tokens (its config names an issuer key): only then do the tokens handed
/// to agents expire. Clusters made before renewal have none.
pub fn controllers_renew(wd: &Workdir) -> bool {
    let mut controllers = wd.cluster.services.iter().filter(|s| s.kind == super::layout::Kind::Controller).peekable();
    controllers.peek().is_some()
        && controllers.all(|s| {
            strata_controller::config::ControllerConfig::load(&wd.config_path(s))
                .is_ok_and(|c| c.issuer_key.is_some() && c.auth.is_some())
        })
}

/// The running endpoints whose agent still holds a token that a key other
/// than the signing ones signed (it renews it within seconds of a rotation,
/// when its controllers answer), by name.
pub fn endpoints_on_old_keys(wd: &Workdir) -> Result<Vec<String>> {
    let signing = [
        super::keys::key_id_of(&super::keys::private_key(&wd.root))?,
        super::keys::key_id_of(&super::keys::issuer_key(&wd.root))?,
    ];
    let mut old = Vec::new();
    for ep in load_all(wd)? {
        let kid = ep.agent_view().and_then(|a| a.token).and_then(|t| t.kid);
        if let Some(kid) = kid {
            if !signing.iter().any(|s| s.as_deref() == Some(kid.as_str())) {
                old.push(ep.file.name.clone());
            }
        }
    }
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["main", "ep-1", "a_b", "X9"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "a/b", "..", "a b", &"x".repeat(64)] {
            assert!(matches!(check_name(bad), Err(Error::Usage(_))), "{bad}");
        }
    }

    /// Endpoint `e` on `main`, lazy or not.
    fn endpoint_file(lazy: bool) -> EndpointFile {
        EndpointFile {
            name: "e".into(),
            tenant: layout::DEFAULT_TENANT.into(),
            host: LOCAL_HOST.into(),
            branch: "main".into(),
            pg_port: 5432,
            http_port: 8080,
            read_only_at: None,
            replica_of: None,
            read_site: None,
            hot_standby_feedback: false,
            lazy,
            cache_mb: None,
            fetch_retry_secs: Some(3),
            suspend_after_secs: Some(0),
        }
    }

    #[test]
    fn the_endpoints_idle_period_wins_over_the_clusters() {
        assert_eq!(suspend_after(None, None), None);
        assert_eq!(suspend_after(None, Some(60)), Some(60));
        assert_eq!(suspend_after(Some(5), Some(60)), Some(5));
        // An endpoint told 0 never suspends, whatever the cluster's default.
        assert_eq!(suspend_after(Some(0), Some(60)), None);
    }

    #[test]
    fn a_suspended_endpoint_is_one_whose_marker_is_there_and_nothing_runs() {
        let dir = std::env::temp_dir().join(format!("strata-suspended-{}", strata_protocol::TimelineId::generate()));
        fs::create_dir_all(&dir).unwrap();
        let ep = Endpoint { dir: dir.clone(), file: endpoint_file(true), address: LOOPBACK };
        assert_eq!(ep.suspend_marker(), dir.join("suspended"));
        assert!(!ep.is_suspended());
        let m =
            suspend::Marker { phase: suspend::Phase::Suspended, idle_secs: 2, decided_at: 1, suspended_at: Some(2) };
        suspend::write_marker(&ep.suspend_marker(), &m).unwrap();
        assert!(ep.is_suspended());
        assert_eq!(crate::status::endpoint_state_text(&ep), "suspended");
        assert_eq!(crate::status::endpoint_state_name(&ep, Liveness::Stopped), "suspended");
        // While its agent still runs it is not (the agent is stopping, or
        // was started again after a crash while suspending).
        assert_eq!(crate::status::endpoint_state_name(&ep, Liveness::Running { pid: 1, supervisor: None }), "running");
        // Stopping it leaves it suspended.
        let mut events = Vec::new();
        let report = stop_endpoint(&ep, false, &mut events).unwrap();
        assert_eq!(report.outcome, StopOutcome::Suspended);
        assert!(ep.is_suspended());
        // The supervisor's path to the marker is handed to it.
        assert_eq!(ep.supervised().suspend_marker, Some(ep.suspend_marker()));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn endpoint_file_roundtrips() {
        let f = endpoint_file(false);
        let text = toml::to_string(&f).unwrap();
        assert_eq!(toml::from_str::<EndpointFile>(&text).unwrap(), f);
        let ep = Endpoint { dir: "/w/endpoints/e".into(), file: f, address: LOOPBACK };
        assert_eq!(ep.connstr(), "postgresql://app@127.0.0.1:5432/postgres");
        assert_eq!(ep.local_connstr("pw9", None), "postgresql://app:pw9@127.0.0.1:5432/postgres?sslmode=disable");
        assert_eq!(
            ep.local_connstr("pw9", Some(std::path::Path::new("/w/tls/ca.pem"))),
            "postgresql://app:pw9@127.0.0.1:5432/postgres?sslmode=verify-full&sslrootcert=/w/tls/ca.pem"
        );
        assert_eq!(
            ep.tls_connstr("pw9", std::path::Path::new("/w x/tls/ca.pem")),
            "postgresql://app:pw9@127.0.0.1:5432/postgres?sslmode=verify-full&sslrootcert=/w%20x/tls/ca.pem"
        );
        assert_eq!(ep.identity().marker, PathBuf::from("/w/endpoints/e/agent.toml"));
    }

    #[test]
    fn the_agent_config_is_its_owners_alone_and_loads_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("strata-agent-config-{}", strata_protocol::TimelineId::generate()));
        fs::create_dir_all(&dir).unwrap();
        let file = endpoint_file(true);
        let ep = Endpoint { dir: dir.clone(), file, address: LOOPBACK };
        let ids = (strata_protocol::TenantId::generate(), strata_protocol::TimelineId::generate());
        let mut config = AgentFile::new(
            ep.pgdata(),
            5432,
            vec!["127.0.0.1:1".into()],
            ids,
            "127.0.0.1:2".into(),
            ep.password_file(),
        );
        config.lazy = Some(LazyFile::new("127.0.0.1:3".into()));
        write_agent_config(&ep, &config).unwrap();
        let mode = fs::metadata(ep.agent_config()).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "agent.toml is readable by others: {mode:o}");
        assert_eq!(AgentFile::load(&ep.agent_config()).unwrap(), config);
        fs::remove_dir_all(&dir).unwrap();
    }
}
