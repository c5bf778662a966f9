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
/// Version of the `cluster.toml` format written by this binary.
pub const FORMAT_VERSION: u32 = 1;
/// Every service and endpoint listens on this address only.
pub const HOST: &str = "127.0.0.1";
/// The branch every new cluster has.
pub const MAIN_BRANCH: &str = "main";

/// The pageserver's object storage (local backend) inside the workdir.
pub const REMOTE_STORAGE_DIR: &str = "remote_storage";
/// The attachment file beside the pageserver's config.
pub const ATTACHMENTS_FILE: &str = "attachments.json";

/// How long a mutating command waits for another one to finish.
const LOCK_WAIT: Duration = Duration::from_secs(300);

/// `cluster.toml`: what `strata init` decided; read by every other command.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub format_version: u32,
    /// The tenant (one PostgreSQL cluster) every branch belongs to.
    pub tenant_id: TenantId,
    /// PostgreSQL 15 server binaries, for the pageserver's initdb and the computes.
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs initdb and PostgreSQL when Strata runs as root.
    pub pg_user: String,
    /// Computes log images of every change and the pageserver checks native redo against them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_redo: bool,
    pub branches: Vec<Branch>,
    pub services: Vec<Service>,
    /// The generation of the tenant's current attachment to the
    /// pageserver: `strata start` issues a new one each time it starts the
    /// pageserver (`docs/local-cluster.md`, "Generations").
    #[serde(default)]
    pub generation: u32,
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
}

/// What a service is; decides its subcommand and config format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Safekeeper,
    Pageserver,
}

impl Kind {
    /// The `strata` subcommand that runs this kind of service (and its config file stem).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Safekeeper => "safekeeper",
            Kind::Pageserver => "pageserver",
        }
    }
}

/// One long-running service of the cluster.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: String,
    pub kind: Kind,
    /// Its config file, relative to the workdir.
    pub config: PathBuf,
    /// Its ports on 127.0.0.1 by role: `listen`, `http`, `pg`.
    pub ports: BTreeMap<String, u16>,
}

impl Service {
    /// `127.0.0.1:<port>` of one of its roles.
    pub fn addr(&self, role: &str) -> Option<String> {
        self.ports.get(role).map(|p| format!("{HOST}:{p}"))
    }

    /// Its HTTP API's base URL (every service has one).
    pub fn http_url(&self) -> String {
        let addr = self.addr("http").unwrap_or_else(|| format!("{HOST}:0"));
        format!("{}://{addr}", super::http::scheme())
    }
}

impl ClusterFile {
    /// The services of one kind, in `cluster.toml` order.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Service> {
        self.services.iter().filter(move |s| s.kind == kind)
    }

    /// The pageserver (a cluster has exactly one; checked on load).
    pub fn pageserver(&self) -> &Service {
        self.of_kind(Kind::Pageserver).next().expect("checked on load: one pageserver")
    }

    /// Every safekeeper's protocol address, in order.
    pub fn safekeeper_addrs(&self) -> Vec<String> {
        self.of_kind(Kind::Safekeeper).filter_map(|s| s.addr("listen")).collect()
    }

    /// A branch by name.
    pub fn branch(&self, name: &str) -> Option<&Branch> {
        self.branches.iter().find(|b| b.name == name)
    }

    /// Every port a service was given, so new endpoints stay clear of them.
    pub fn ports(&self) -> Vec<u16> {
        self.services.iter().flat_map(|s| s.ports.values().copied()).collect()
    }

    /// Whether the file describes a cluster this binary can run.
    fn check(&self) -> std::result::Result<(), String> {
        if self.format_version != FORMAT_VERSION {
            return Err(format!("format_version {} is not supported (expected {FORMAT_VERSION})", self.format_version));
        }
        if self.of_kind(Kind::Pageserver).count() != 1 {
            return Err("expected exactly one pageserver".into());
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
        let cluster: ClusterFile =
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

impl Workdir {
    /// Issues the next generation of the tenant's attachment to the
    /// pageserver: recorded in `cluster.toml` first, then written to the
    /// pageserver's attachment file (if its config names one). Called with
    /// the command lock held, before the pageserver starts.
    pub fn attach_next_generation(&self) -> Result<u32> {
        let path = self.root.join(CLUSTER_FILE);
        let mut cluster: ClusterFile = read_toml(&path)?;
        cluster.generation =
            cluster.generation.checked_add(1).ok_or_else(|| Error::Failed("generation overflow".into()))?;
        write_toml(&path, "# Strata local cluster (docs/local-cluster.md).\n", &cluster)?;
        let ps = self.cluster.pageserver();
        let conf: strata_pageserver::config::PageserverConfig = read_toml(&self.config_path(ps))?;
        if let Some(file) = conf.attachments {
            let attachments = strata_pageserver::remote::Attachments {
                format_version: strata_pageserver::remote::attachments::ATTACHMENTS_FORMAT_VERSION,
                tenants: BTreeMap::from([(
                    cluster.tenant_id,
                    strata_pageserver::remote::attachments::Attachment { generation: cluster.generation },
                )]),
            };
            let text = String::from_utf8(attachments.encode()).expect("JSON is UTF-8");
            write_atomic(&file, &text)?;
        }
        Ok(cluster.generation)
    }
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

/// `strata init`: chooses ports and ids and writes `cluster.toml` and every
/// service's config; refuses an already initialised workdir.
pub fn init(args: &InitArgs) -> Result<()> {
    let n = args.safekeepers;
    if !(1..=9).contains(&n) {
        return Err(Error::Usage(format!("--safekeepers must be between 1 and 9, not {n}")));
    }
    let dir = &args.workdir.workdir;
    let file = dir.join(CLUSTER_FILE);
    if file.exists() {
        return failed(format!("{}: exists; a cluster is already initialised in {}", file.display(), dir.display()));
    }
    mkdir(dir)?;
    let root = fs::canonicalize(dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;

    // Three ports per safekeeper and two for the pageserver, bound at once so they differ.
    let ports = ports::allocate(3 * n + 2, &[]).map_err(|e| Error::Failed(format!("finding free ports: {e}")))?;
    let sk_port = |i: usize, role: usize| ports[3 * i + role];
    let (ps_pg, ps_http) = (ports[3 * n], ports[3 * n + 1]);

    let mut services = Vec::new();
    let mut configs: Vec<(PathBuf, String)> = Vec::new();
    // Tokens and TLS, unless the cluster is made to measure their cost.
    let secure = !args.insecure_loopback;
    for i in 0..n {
        let name = format!("sk{}", i + 1);
        let peers: Vec<_> = (0..n)
            .filter(|&j| j != i)
            .map(|j| {
                serde_json::json!({
                    "id": j + 1,
                    "address": format!("{HOST}:{}", sk_port(j, 0)),
                    "http": format!("{HOST}:{}", sk_port(j, 1)),
                })
            })
            .collect();
        let config: strata_safekeeper::config::SafekeeperConfig = service_config(
            serde_json::json!({
                "id": i + 1,
                "listen": format!("{HOST}:{}", sk_port(i, 0)),
                "listen_http": format!("{HOST}:{}", sk_port(i, 1)),
                "listen_pg": format!("{HOST}:{}", sk_port(i, 2)),
                "data_dir": root.join(&name).join("data"),
                "peers": peers,
                "auth": secure.then(|| super::keys::service_auth(&root)),
                "tls": secure.then(|| super::certs::service_tls(&root, HOST)),
                // Completed WAL segments go to the same object storage as the layers.
                "remote_storage": { "type": "local", "path": root.join(REMOTE_STORAGE_DIR) },
            }),
            "safekeeper",
        )?;
        let rel = PathBuf::from(&name).join("safekeeper.toml");
        configs.push((rel.clone(), toml::to_string(&config).map_err(|e| Error::Failed(format!("{name}: {e}")))?));
        services.push(Service {
            name,
            kind: Kind::Safekeeper,
            config: rel,
            ports: BTreeMap::from([
                ("listen".to_string(), sk_port(i, 0)),
                ("http".to_string(), sk_port(i, 1)),
                ("pg".to_string(), sk_port(i, 2)),
            ]),
        });
    }
    let name = "pageserver".to_string();
    let config: strata_pageserver::config::PageserverConfig = service_config(
        serde_json::json!({
            // Node ids are unique within the deployment: the safekeepers have 1..=n.
            "id": n + 1,
            "listen_pg": format!("{HOST}:{ps_pg}"),
            "listen_http": format!("{HOST}:{ps_http}"),
            "data_dir": root.join(&name).join("data"),
            "safekeepers": (0..n).map(|i| format!("{HOST}:{}", sk_port(i, 0))).collect::<Vec<_>>(),
            "auth": secure.then(|| super::keys::service_auth(&root)),
            "tls": secure.then(|| super::certs::service_tls(&root, HOST)),
            "pg_bin_dir": args.pg_bin_dir,
            "pg_user": args.pg_user,
            "verify_redo": args.verify_redo,
            // Object storage in a local directory: nothing else to set up.
            "remote_storage": { "type": "local", "path": root.join(REMOTE_STORAGE_DIR) },
            "attachments": root.join(&name).join(ATTACHMENTS_FILE),
        }),
        "pageserver",
    )?;
    let rel = PathBuf::from(&name).join("pageserver.toml");
    configs.push((rel.clone(), toml::to_string(&config).map_err(|e| Error::Failed(format!("{name}: {e}")))?));
    services.push(Service {
        name,
        kind: Kind::Pageserver,
        config: rel,
        ports: BTreeMap::from([("pg".to_string(), ps_pg), ("http".to_string(), ps_http)]),
    });

    let cluster = ClusterFile {
        format_version: FORMAT_VERSION,
        tenant_id: TenantId::generate(),
        pg_bin_dir: args.pg_bin_dir.clone(),
        pg_user: args.pg_user.clone(),
        verify_redo: args.verify_redo,
        branches: vec![Branch {
            name: MAIN_BRANCH.into(),
            timeline_id: TimelineId::generate(),
            parent: None,
            ancestor_lsn: None,
        }],
        services,
        generation: 0,
    };
    cluster.check().map_err(Error::Failed)?;

    for s in &cluster.services {
        mkdir(&root.join(&s.name).join("data"))?;
    }
    mkdir(&root.join("endpoints"))?;
    if secure {
        super::keys::create(&root)?;
        super::certs::create(&root, &[HOST])?;
    }
    for (rel, text) in &configs {
        let header = "# Written by `strata init`; ports and paths must match cluster.toml.\n";
        write_atomic(&root.join(rel), &format!("{header}{text}"))?;
    }
    // cluster.toml last: its presence means the workdir is complete.
    write_toml(&root.join(CLUSTER_FILE), "# Strata local cluster (docs/local-cluster.md).\n", &cluster)?;

    println!("initialised a cluster in {}", root.display());
    println!("tenant {}, branch {MAIN_BRANCH} = timeline {}", cluster.tenant_id, cluster.branches[0].timeline_id);
    for s in &cluster.services {
        let ports: Vec<String> = s.ports.iter().map(|(r, p)| format!("{r}={p}")).collect();
        println!("{:<12} {:<11} {}", s.name, s.kind.as_str(), ports.join(" "));
    }
    println!("start it with `strata start --workdir {}`", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::WorkdirArgs;

    fn init_args(dir: &Path, n: usize) -> InitArgs {
        InitArgs {
            workdir: WorkdirArgs { workdir: dir.to_path_buf(), only: vec![], immediate: false },
            safekeepers: n,
            pg_bin_dir: "/usr/lib/postgresql/15/bin".into(),
            pg_user: "postgres".into(),
            verify_redo: false,
            insecure_loopback: false,
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
        assert_eq!(wd.cluster.services.len(), 4);
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
        assert_eq!(psc.safekeepers, wd.cluster.safekeeper_addrs());
        assert_eq!(psc.listen_http.port(), ps.ports["http"]);
        assert_eq!(psc.data_dir, wd.root.join("pageserver/data"));
        assert_eq!(psc.id.0, 4);
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
        let parsed: ClusterFile = toml::from_str(&text).unwrap();
        assert_eq!(parsed, Workdir::open(&dir).unwrap().cluster);
        let mut broken = parsed.clone();
        broken.services.retain(|s| s.kind != Kind::Pageserver);
        assert!(broken.check().is_err());
        let mut dup = parsed;
        dup.services[1].name = dup.services[0].name.clone();
        assert!(dup.check().is_err());
        assert!(Workdir::open(&dir.join("nowhere")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
