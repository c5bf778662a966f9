//! Where things run: whether a host of the cluster is this machine, and
//! calls to another host's `strata node` (`docs/deployment.md`).
//!
//! A service or endpoint on a host of this machine is started and stopped
//! here, as processes of this binary; one on another host through that
//! host's node, which runs the same code there. The one-host cluster of
//! `strata init` is simply the case where every host is this machine.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::{failed, Error, Result};
use super::http;
use super::layout::{Host, Workdir};
use super::report::{Notice, Progress};
use crate::limits::{SEND_CALL, SYNC_CALL};

/// `STRATA_HOST`: names this machine's host, when its addresses do not tell.
pub const HOST_ENV: &str = "STRATA_HOST";

/// Whether `address` belongs to this machine: it can be bound here.
fn is_own_address(address: IpAddr) -> bool {
    address.is_loopback() || TcpListener::bind(SocketAddr::new(address, 0)).is_ok()
}

/// Whether `host` is this machine. `STRATA_HOST` decides when set;
/// otherwise a host is this machine when its address is one of its own.
pub fn is_local(host: &Host) -> bool {
    match std::env::var(HOST_ENV) {
        Ok(name) if !name.is_empty() => name == host.name,
        _ => is_own_address(host.address),
    }
}

/// The host named `name`, or a usage error naming the hosts there are.
pub fn host<'a>(wd: &'a Workdir, name: &str) -> Result<&'a Host> {
    wd.cluster.host(name).ok_or_else(|| {
        let known: Vec<&str> = wd.cluster.hosts.iter().map(|h| h.name.as_str()).collect();
        Error::Usage(format!("no host named {name:?} (hosts: {})", known.join(", ")))
    })
}

/// This machine's host: `STRATA_HOST`, else the one host whose address is
/// this machine's (none if no host or several are).
pub fn this_host(wd: &Workdir) -> Result<Option<&Host>> {
    if let Ok(name) = std::env::var(HOST_ENV) {
        if !name.is_empty() {
            return host(wd, &name).map(Some).map_err(|e| Error::Usage(format!("{HOST_ENV}: {e}")));
        }
    }
    let mine: Vec<&Host> = wd.cluster.hosts.iter().filter(|h| is_own_address(h.address)).collect();
    Ok(if mine.len() == 1 { Some(mine[0]) } else { None })
}

/// The base URL of a host's node API.
pub fn node_url(host: &Host) -> Result<String> {
    if host.node_port == 0 {
        return failed(format!("host {}: cluster.toml gives it no node_port", host.name));
    }
    Ok(format!("{}://{}", http::scheme(), SocketAddr::new(host.address, host.node_port)))
}

/// `POST /v1/services/start` and `/stop` of the node API: services of its host by name.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ServicesRequest {
    pub names: Vec<String>,
    #[serde(default)]
    pub immediate: bool,
}

/// `POST /v1/endpoints/stop` and `/forget` of the node API.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct EndpointRequest {
    pub name: String,
    #[serde(default)]
    pub immediate: bool,
}

/// What a node's command printed, for the caller to print.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct Lines {
    pub lines: Vec<String>,
}

/// Calls `method path` on `host`'s node with a JSON body; the answer's
/// body as `T`, or an error naming the host and what its node said.
pub fn call<T: DeserializeOwned>(
    host: &Host,
    method: &str,
    path: &str,
    body: Option<&impl Serialize>,
    timeout: Duration,
) -> Result<T> {
    let url = format!("{}{path}", node_url(host)?);
    let reply = match (method, body) {
        ("GET", _) => http::get(&url, timeout),
        ("POST", Some(b)) => http::post(&url, b, timeout),
        ("POST", None) => http::post(&url, &serde_json::Value::Null, timeout),
        _ => unreachable!("node calls are GET or POST"),
    }
    .map_err(|e| {
        Error::Failed(format!(
            "host {}: its node does not answer ({e}); is `strata node --host {}` running there?",
            host.name, host.name
        ))
    })?;
    if !(200..300).contains(&reply.status) {
        return failed(format!("host {}: {}", host.name, reply.error_text()));
    }
    reply.json().map_err(|e| Error::Failed(format!("host {}: {path}: {e}", host.name)))
}

/// The files of the cluster's state: `cluster.toml` and every service's
/// config, by path relative to the workdir, at one revision.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Spec {
    pub revision: u64,
    pub files: std::collections::BTreeMap<std::path::PathBuf, String>,
}

/// The files of the cluster's trust a spec carries besides its state: the
/// keys every service trusts, the deny list, and the tokens the services
/// and controllers show each other (secret: written 0600), so that a key's
/// rotation or a token's revocation reaches every host
/// (`docs/security.md`).
pub const TRUST_FILES: [(&str, bool); 7] = [
    ("auth/public.pem", false),
    ("auth/issuer-public.pem", false),
    ("auth/revoked.json", false),
    ("auth/service.token", true),
    ("auth/controller.token", true),
    ("auth/issuer.pem", true),
    ("auth/storage.key", true),
];

/// The controllers' own: only hosts that run a controller get them.
const CONTROLLERS_ONLY: [&str; 2] = ["auth/controller.token", "auth/issuer.pem"];

/// The storage services' own: the cluster storage key goes only to hosts
/// that run a pageserver or a safekeeper (never to a compute-only host).
const STORAGE_SERVICES_ONLY: [&str; 1] = ["auth/storage.key"];

/// This machine's copy of the cluster's state.
pub fn spec(wd: &Workdir) -> Result<Spec> {
    let mut files = std::collections::BTreeMap::new();
    let mut read = |rel: &std::path::Path| -> Result<()> {
        let path = wd.root.join(rel);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
        files.insert(rel.to_path_buf(), text);
        Ok(())
    };
    read(std::path::Path::new(super::layout::CLUSTER_FILE))?;
    for s in &wd.cluster.services {
        read(&s.config)?;
    }
    for (rel, _) in TRUST_FILES {
        if wd.root.join(rel).exists() {
            read(std::path::Path::new(rel))?;
        }
    }
    Ok(Spec { revision: wd.cluster.revision, files })
}

/// The state as `host` gets it: without the controllers' token and issuer
/// key unless it runs a controller, without the storage key unless it runs
/// a pageserver or a safekeeper.
pub fn spec_for(wd: &Workdir, host: &Host) -> Result<Spec> {
    use super::layout::Kind;
    let mut spec = spec(wd)?;
    let runs = |kinds: &[Kind]| wd.cluster.services.iter().any(|s| s.host == host.name && kinds.contains(&s.kind));
    let mut withheld: Vec<&str> = Vec::new();
    if !runs(&[Kind::Controller]) {
        withheld.extend(CONTROLLERS_ONLY);
    }
    if !runs(&[Kind::Pageserver, Kind::Safekeeper]) {
        withheld.extend(STORAGE_SERVICES_ONLY);
    }
    for rel in withheld {
        spec.files.remove(std::path::Path::new(rel));
    }
    Ok(spec)
}

/// Takes `spec` as this machine's copy if it is newer: the services'
/// configs first, `cluster.toml` last, keeping the higher generation of
/// the two (the pageserver host's node issues them without a new
/// revision). Returns whether it was taken. Called with the lock held.
pub fn adopt(wd: &Workdir, spec: &Spec) -> Result<bool> {
    if spec.revision <= wd.cluster.revision {
        return Ok(false);
    }
    let cluster_rel = std::path::Path::new(super::layout::CLUSTER_FILE);
    let Some(text) = spec.files.get(cluster_rel) else {
        return failed(format!("revision {}: no {}", spec.revision, cluster_rel.display()));
    };
    let mut cluster = super::layout::ClusterFile::parse(text)
        .map_err(|e| Error::Failed(format!("revision {}: cluster.toml: {e}", spec.revision)))?;
    if cluster.cluster_id != wd.cluster.cluster_id {
        return failed(format!(
            "revision {} is of another cluster ({}, not {})",
            spec.revision, cluster.cluster_id, wd.cluster.cluster_id
        ));
    }
    cluster.generation = cluster.generation.max(wd.cluster.generation);
    // What this host runs, as root or as PostgreSQL's user, comes from
    // this host's own copy, never from a spec: a management token must not
    // be able to name a program that a root process starts.
    cluster.pg_bin_dir = wd.cluster.pg_bin_dir.clone();
    cluster.pg_user = wd.cluster.pg_user.clone();
    // Every trust file is checked before anything is written.
    for (rel, text) in &spec.files {
        if let Some((_, secret)) = TRUST_FILES.iter().find(|(name, _)| std::path::Path::new(name) == rel) {
            check_trust_file(rel, text, *secret)
                .map_err(|e| Error::Failed(format!("revision {}: {}: {e}", spec.revision, rel.display())))?;
        }
    }
    for (rel, text) in &spec.files {
        // Only files inside the workdir, named as cluster.toml names them,
        // and the trust files.
        let trust = TRUST_FILES.iter().find(|(name, _)| std::path::Path::new(name) == rel);
        let known = rel == cluster_rel || trust.is_some() || cluster.services.iter().any(|s| &s.config == rel);
        if !known || rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return failed(format!(
                "revision {}: {} is not a file of the cluster's state",
                spec.revision,
                rel.display()
            ));
        }
        if let Some((_, secret)) = trust {
            write_trust_file(wd, rel, text, *secret)
                .map_err(|e| Error::Failed(format!("revision {}: {}: {e}", spec.revision, rel.display())))?;
        } else if rel != cluster_rel {
            let path = wd.root.join(rel);
            if let Some(dir) = path.parent() {
                // A service's directory: its data, config and log are its own.
                super::layout::create_private_dir(dir)?;
            }
            let text = with_local_programs(text, &cluster)
                .map_err(|e| Error::Failed(format!("revision {}: {}: {e}", spec.revision, rel.display())))?;
            super::layout::write_atomic(&path, &text)?;
        }
    }
    super::layout::write_toml(&wd.root.join(cluster_rel), super::layout::CLUSTER_HEADER, &cluster)?;
    Ok(true)
}

/// Whether a trust file the spec carries is one its host's processes can
/// use: a spec cannot leave a host with keys, a deny list or a token that
/// its services would refuse to start on.
fn check_trust_file(rel: &std::path::Path, text: &str, secret: bool) -> std::result::Result<(), String> {
    use strata_service::auth;
    match rel.file_name().and_then(|n| n.to_str()) {
        Some(name @ ("public.pem" | auth::ISSUER_PUBLIC_FILE)) => {
            auth::keys::parse(text.as_bytes(), name).map(drop).map_err(|e| e.to_string())
        }
        Some(auth::REVOKED_FILE) => auth::DenyList::parse(text.as_bytes()).map(drop),
        Some("issuer.pem") => {
            auth::keys::private_key_id(text.as_bytes(), "issuer.pem").map(drop).map_err(|e| e.to_string())
        }
        Some(name @ "storage.key") => {
            strata_remote_storage::seal::keys::ClusterKeys::parse(text.as_bytes(), name).map(drop)
        }
        _ if secret && (text.trim().is_empty() || text.trim().chars().any(char::is_whitespace)) => {
            Err("does not hold one token".into())
        }
        _ => Ok(()),
    }
}

/// Writes a checked trust file: in the private `auth/`, a secret readable
/// by its owner only.
fn write_trust_file(wd: &Workdir, rel: &std::path::Path, text: &str, secret: bool) -> std::result::Result<(), String> {
    let path = wd.root.join(rel);
    if let Some(dir) = path.parent() {
        super::layout::create_private_dir(dir).map_err(|e| e.to_string())?;
    }
    match secret {
        true => strata_service::auth::write_secret(&path, text),
        false => strata_service::durable::replace_file(&path, text.as_bytes(), true),
    }
    .map_err(|e| e.to_string())
}

/// A service's config (TOML) with the programs it runs (`pg_bin_dir`) and
/// the user it runs them as (`pg_user`) set to this host's, where it names
/// them; unchanged, comments included, when they already are.
fn with_local_programs(text: &str, local: &super::layout::ClusterFile) -> std::result::Result<String, String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let bin_dir = local.pg_bin_dir.to_str().ok_or("this host's pg_bin_dir is not UTF-8")?;
    let mut changed = false;
    for (key, value) in [("pg_bin_dir", bin_dir), ("pg_user", local.pg_user.as_str())] {
        if let Some(v) = table.get_mut(key) {
            if v.as_str() != Some(value) {
                *v = toml::Value::String(value.to_string());
                changed = true;
            }
        }
    }
    match changed {
        false => Ok(text.to_string()),
        true => toml::to_string(&table).map_err(|e| e.to_string()),
    }
}

/// Brings this machine's copy of the cluster's state up to the newest
/// revision any other host's node has; a host that does not answer is
/// skipped. Returns the workdir as it is now.
pub fn refresh(wd: Workdir, progress: &mut dyn Progress) -> Result<Workdir> {
    if wd.cluster.hosts.iter().all(is_local) {
        return Ok(wd);
    }
    let mut newest: Option<Spec> = None;
    for host in wd.cluster.hosts.iter().filter(|h| !is_local(h) && h.node_port != 0) {
        if let Ok(theirs) = call::<Spec>(host, "GET", "/v1/spec", None::<&()>, SYNC_CALL) {
            if theirs.revision > newest.as_ref().map_or(wd.cluster.revision, |n| n.revision) {
                newest = Some(theirs);
            }
        }
    }
    let Some(newest) = newest else { return Ok(wd) };
    let adopted = {
        let _lock = wd.lock(|| progress.tell(Notice::WaitingForLock { root: wd.root.clone() }))?;
        adopt(&wd, &newest)?
    };
    if adopted {
        progress.tell(Notice::RevisionTaken { revision: newest.revision });
    }
    Workdir::open(&wd.root)
}

/// The other hosts whose node does not have this machine's revision of the
/// state (or does not answer), by name.
pub fn behind(wd: &Workdir) -> Vec<String> {
    wd.cluster
        .hosts
        .iter()
        .filter(|h| !is_local(h) && h.node_port != 0)
        .filter(|h| {
            call::<Spec>(h, "GET", "/v1/spec", None::<&()>, SYNC_CALL)
                .map_or(true, |theirs| theirs.revision < wd.cluster.revision)
        })
        .map(|h| h.name.clone())
        .collect()
}

/// Hands this machine's state to one host's node (before a call that
/// depends on it, such as an endpoint's start there).
pub fn send(wd: &Workdir, host: &Host) -> Result<()> {
    let spec = spec_for(wd, host)?;
    // The node takes it under its lock, which it holds while it starts a
    // service (half a minute at most).
    call::<serde_json::Value>(host, "POST", "/v1/spec", Some(&spec), SEND_CALL).map(drop)
}

/// Hands this machine's state to every other host's node after a change;
/// a host that does not take it now takes it at its next command or from
/// the next change (each command compares first, see [`refresh`]).
pub fn publish(wd: &Workdir, progress: &mut dyn Progress) {
    if wd.cluster.hosts.iter().all(is_local) {
        return;
    }
    for host in wd.cluster.hosts.iter().filter(|h| !is_local(h) && h.node_port != 0) {
        let spec = match spec_for(wd, host) {
            Ok(s) => s,
            Err(e) => return progress.tell(Notice::StateNotSent { error: e.to_string() }),
        };
        if let Err(e) = call::<serde_json::Value>(host, "POST", "/v1/spec", Some(&spec), SYNC_CALL) {
            let (revision, host, error) = (spec.revision, host.name.clone(), e.to_string());
            progress.tell(Notice::RevisionNotSent { revision, host, error });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Kind;
    use crate::options::InitOptions;
    use std::path::PathBuf;

    fn cluster(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("strata-hosts-{tag}-{}", strata_protocol::TimelineId::generate()));
        crate::init::init(&InitOptions { insecure_loopback: true, ..InitOptions::for_test(&d, 1) }).unwrap();
        d
    }

    #[test]
    fn the_newest_revision_is_taken_whole_and_the_highest_generation_kept() {
        let (a, b) = (cluster("a"), cluster("b"));
        let wd_a = Workdir::open(&a).unwrap();
        // b's state becomes a's cluster at a later revision, with a branch more.
        let mut newer = spec(&wd_a).unwrap();
        newer.revision = 5;
        let text = newer.files.get_mut(std::path::Path::new("cluster.toml")).unwrap();
        *text = text.replace("revision = 1", "revision = 5")
            + "\n[[tenants.branches]]\nname = \"dev\"\ntimeline_id = \"00112233445566778899aabbccddeeff\"\n";
        let sk1 = PathBuf::from("sk1/safekeeper.toml");
        newer.files.insert(sk1.clone(), "# changed\n".to_string() + &newer.files[&sk1]);

        // Another cluster's state is refused.
        assert!(adopt(&Workdir::open(&b).unwrap(), &newer).is_err());
        // A file outside the state is refused, and nothing is written.
        let mut outside = spec(&wd_a).unwrap();
        outside.revision = 9;
        outside.files.insert(PathBuf::from("../escape"), "x".into());
        assert!(adopt(&wd_a, &outside).is_err());
        assert!(!a.parent().unwrap().join("escape").exists());

        // The pageserver host issued generation 3 meanwhile.
        let mut here = Workdir::open(&a).unwrap();
        here.cluster.generation = 3;
        assert!(adopt(&here, &newer).unwrap());
        let now = Workdir::open(&a).unwrap();
        assert_eq!((now.cluster.revision, now.cluster.generation), (5, 3));
        assert!(now.cluster.tenants[0].branch("dev").is_some());
        assert!(std::fs::read_to_string(a.join(&sk1)).unwrap().starts_with("# changed"));
        // Not again, nor an older one.
        assert!(!adopt(&now, &newer).unwrap());
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn a_spec_never_names_the_programs_a_host_runs() {
        let a = cluster("programs");
        let wd = Workdir::open(&a).unwrap();
        let (bin_dir, user) = (wd.cluster.pg_bin_dir.clone(), wd.cluster.pg_user.clone());
        let ps = wd.cluster.services.iter().find(|s| s.kind == Kind::Pageserver).unwrap().config.clone();
        assert!(spec(&wd).unwrap().files[&ps].contains("pg_bin_dir"), "the pageserver's config names its programs");
        // A newer spec points every program at another directory and user.
        let mut evil = spec(&wd).unwrap();
        evil.revision = 7;
        for (rel, text) in evil.files.iter_mut() {
            if TRUST_FILES.iter().any(|(name, _)| std::path::Path::new(name) == rel) {
                continue; // keys, not configs
            }
            let mut table: toml::Table = toml::from_str(text).unwrap();
            for (key, value) in [("pg_bin_dir", "/tmp/not-postgres"), ("pg_user", "root")] {
                // Named where the config names programs, even if it left the user to its default.
                if table.contains_key(key) || rel == &ps {
                    table.insert(key.into(), toml::Value::String(value.into()));
                }
            }
            if rel == std::path::Path::new("cluster.toml") {
                table.insert("revision".into(), toml::Value::Integer(7));
            }
            *text = toml::to_string(&table).unwrap();
        }
        assert!(adopt(&wd, &evil).unwrap());
        let now = Workdir::open(&a).unwrap();
        assert_eq!(now.cluster.revision, 7);
        assert_eq!((&now.cluster.pg_bin_dir, &now.cluster.pg_user), (&bin_dir, &user));
        let config: toml::Table = toml::from_str(&std::fs::read_to_string(a.join(&ps)).unwrap()).unwrap();
        assert_eq!(config["pg_bin_dir"].as_str(), bin_dir.to_str());
        assert_eq!(config["pg_user"].as_str(), Some(user.as_str()));
        std::fs::remove_dir_all(&a).unwrap();
    }

    #[test]
    fn keys_the_deny_list_and_tokens_travel_with_the_state_to_the_hosts_they_belong_to() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("strata-hosts-trust-{}", strata_protocol::TimelineId::generate()));
        crate::init::init(&InitOptions::for_test(&d, 1)).unwrap();
        let wd = Workdir::open(&d).unwrap();
        let full = spec(&wd).unwrap();
        for (rel, _) in TRUST_FILES.iter().filter(|(rel, _)| !rel.ends_with("revoked.json")) {
            assert!(full.files.contains_key(std::path::Path::new(rel)), "{rel}");
        }
        // The controllers' token and issuer key go to controllers' hosts only.
        let here = wd.cluster.hosts[0].clone();
        let elsewhere = Host { name: "elsewhere".into(), ..here.clone() };
        for rel in CONTROLLERS_ONLY.iter().chain(&STORAGE_SERVICES_ONLY) {
            assert!(spec_for(&wd, &here).unwrap().files.contains_key(std::path::Path::new(rel)), "{rel}");
            assert!(!spec_for(&wd, &elsewhere).unwrap().files.contains_key(std::path::Path::new(rel)), "{rel}");
        }
        // A newer state with a key more, a deny list and new tokens is taken,
        // each file with its mode.
        let newer = |revision: u64, edit: &dyn Fn(&mut Spec)| {
            let mut s = spec(&Workdir::open(&d).unwrap()).unwrap();
            let now = s.revision;
            s.revision = revision;
            let text = s.files.get_mut(std::path::Path::new("cluster.toml")).unwrap();
            *text = text.replace(&format!("revision = {now}"), &format!("revision = {revision}"));
            edit(&mut s);
            s
        };
        let (_, extra_key) = strata_service::auth::generate_key_pair();
        let deny = r#"{"version":1,"revoked":[{"jti":"abc"}]}"#;
        let taken = newer(5, &|s| {
            let public = s.files[std::path::Path::new("auth/public.pem")].clone();
            s.files.insert("auth/public.pem".into(), format!("{extra_key}{public}"));
            s.files.insert("auth/revoked.json".into(), deny.into());
            s.files.insert("auth/service.token".into(), "a.b.c".into());
        });
        assert!(adopt(&wd, &taken).unwrap());
        let mode = |rel: &str| std::fs::metadata(d.join(rel)).unwrap().permissions().mode() & 0o777;
        assert_eq!(std::fs::read_to_string(d.join("auth/revoked.json")).unwrap(), deny);
        assert!(std::fs::read_to_string(d.join("auth/public.pem")).unwrap().starts_with(&extra_key));
        assert_eq!(std::fs::read_to_string(d.join("auth/service.token")).unwrap(), "a.b.c");
        assert_eq!(mode("auth/service.token"), 0o600);
        assert_eq!(mode("auth/issuer.pem"), 0o600);
        assert_eq!(mode("auth"), 0o700);
        // What no service could read is refused, and nothing of it written.
        for (rel, bad) in [
            ("auth/public.pem", "not a key"),
            ("auth/revoked.json", "{"),
            ("auth/service.token", "two tokens"),
            ("auth/issuer.pem", "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"),
            ("auth/storage.key", "1 not-a-key"),
        ] {
            let wd = Workdir::open(&d).unwrap();
            let before = std::fs::read_to_string(d.join(rel)).unwrap();
            let spec = newer(wd.cluster.revision + 1, &|s| {
                s.files.insert(rel.into(), bad.into());
            });
            assert!(adopt(&wd, &spec).is_err(), "{rel}");
            assert_eq!(std::fs::read_to_string(d.join(rel)).unwrap(), before, "{rel}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
