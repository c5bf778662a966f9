//! `strata branch upgrade BRANCH --to MAJOR` (`docs/postgres-versions.md`,
//! "Major upgrade"): a new branch holding the branch's database at its
//! newest commit, upgraded by the new major's own `pg_upgrade`. The old
//! branch is not touched: its endpoints keep running, and it stays there
//! to compare against or to go back to.
//!
//! The steps, in a staging directory under the workdir's `upgrades/`: the
//! branch's full basebackup at its newest commit (a cleanly shut-down data
//! directory of the old major); its template0's encoding and locale, read
//! by the old major's server; the new major's `initdb` with those and the
//! old cluster's checksum setting; `pg_upgrade --link`; and the result,
//! cleanly shut down, imported as a new timeline of the tenant as
//! `tenant import` does (`docs/import.md`).

use std::path::Path;
use std::process::Command;

use strata_protocol::TimelineId;

use super::error::{failed, Error, Result};
use super::import::send;
use super::layout::{update_cluster, Branch, Tenant, Workdir};
use super::report::{Progress, TenantEvent};
use super::stage::{as_user, checkpoint_wal, fresh_stage, give_to, log_tail, read_control, run, Ready, SocketDir};
use crate::limits::{BASEBACKUP_FETCH_TIMEOUT, UPGRADE_STEP_TIMEOUT};

/// What `branch upgrade` made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchUpgraded {
    pub name: String,
    pub timeline: TimelineId,
    pub from: String,
    pub from_major: u32,
    pub to_major: u32,
}

impl std::fmt::Display for BranchUpgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BranchUpgraded { name, timeline, from, from_major, to_major } = self;
        write!(f, "branch {name}: timeline {timeline}, {from} upgraded from PostgreSQL {from_major} to {to_major}")
    }
}

/// The old cluster's superuser, as `initdb -U` made it (`pg_upgrade`
/// needs the same name on both sides).
const SUPERUSER: &str = "postgres";

/// `strata branch upgrade BRANCH --to MAJOR --name NAME`.
pub fn upgrade(
    wd: &Workdir,
    tenant: &str,
    branch: &str,
    to: u32,
    name: &str,
    progress: &mut dyn Progress,
) -> Result<BranchUpgraded> {
    super::branch::check_name(name)?;
    super::tenant::check_pg_version(to)?;
    let t = wd.cluster.tenant_named(tenant)?;
    super::split::refuse_while_open(wd, t, "upgrade a branch")?;
    if t.branch(name).is_some() {
        return failed(format!("a branch named {name:?} exists"));
    }
    let Some(b) = t.branch(branch).cloned() else {
        return failed(format!("no branch named {branch:?} (branches: {})", t.branch_names()));
    };
    let from = b.pg_version.unwrap_or(t.pg_version);
    if to <= from {
        return failed(format!("branch {branch} is of PostgreSQL {from}: {to} is not an upgrade of it"));
    }
    let user = wd.cluster.pg_user.clone();
    let (old_bin, new_bin) = (wd.cluster.pg_bin_dir_for(from), wd.cluster.pg_bin_dir_for(to));
    for bin in [&old_bin, &new_bin] {
        if !bin.join("postgres").exists() {
            return failed(format!("{}: no PostgreSQL there (docs/postgres-versions.md)", bin.display()));
        }
    }
    let stage = wd.root.join("upgrades").join(format!("{tenant}-{name}"));
    fresh_stage(&stage, &user)?;
    let (old, new) = (stage.join("old"), stage.join("new"));
    let socket_dir = SocketDir::new(&user)?;
    let sock = socket_dir.path();

    fetch_old(wd, t, &b, &old, progress)?;
    give_to(&stage, &user)?;

    progress.tell(TenantEvent::Importing { step: format!("the encoding and locale of PostgreSQL {from}'s template0") });
    let template0 = template0_of(&old_bin, &old, sock, &user, &stage.join("old.log"))?;
    let checksums = read_control(&old)?.data_checksum_version != 0;

    progress.tell(TenantEvent::Importing { step: format!("initdb of PostgreSQL {to} and pg_upgrade from {from}") });
    let sides = Sides { to, old_bin: &old_bin, new_bin: &new_bin, user: &user, sock };
    pg_upgrade(&sides, &stage, &template0, checksums)?;
    let control = read_control(&new)?;
    let ready = Ready { wal: checkpoint_wal(&new, &control), pgdata: new.clone(), major: to, follow: false };

    // The new timeline first, then the branch that names it: an
    // interruption leaves at most a timeline no branch names.
    let timeline = TimelineId::generate();
    send(wd, t.tenant_id, timeline, &ready, progress)?;
    update_cluster(&wd.root, |cluster| {
        let t = cluster.tenant_mut(tenant).ok_or_else(|| Error::Failed(format!("tenant {tenant} was deleted")))?;
        t.branches.push(Branch {
            name: name.to_string(),
            timeline_id: timeline,
            parent: None,
            ancestor_lsn: None,
            placement: b.placement.clone(),
            divergent: None,
            pg_version: Some(to),
            created_at: Some(crate::supervisor_state::unix_now()),
            point_time: None,
        });
        Ok(())
    })?;
    let wd = Workdir::open(&wd.root)?;
    super::services::ensure_branch(&wd, wd.cluster.tenant_named(tenant)?, name, progress)?;
    let _ = std::fs::remove_dir_all(&stage);
    Ok(BranchUpgraded { name: name.into(), timeline, from: branch.into(), from_major: from, to_major: to })
}

/// The branch's data directory at its newest commit, unpacked into `old`
/// with what the old major's server needs to start there.
fn fetch_old(wd: &Workdir, t: &Tenant, b: &Branch, old: &Path, progress: &mut dyn Progress) -> Result<()> {
    progress.tell(TenantEvent::Importing { step: format!("the basebackup of {} at its newest commit", b.name) });
    let lsn = super::branch::newest_commit(wd, t, b)?;
    let ps = super::controller::attached(wd, t.home())?;
    // No shard of a sharded tenant holds every page: shard 0's lazy
    // basebackup, then every relation file from its shards.
    let what = if t.is_sharded() { "lazy" } else { "full" };
    let mut url = format!("{}/v1/tenant/{}/timeline/{}/basebackup?{what}=true", ps.http_url(), t.home(), b.timeline_id);
    if let Some(lsn) = lsn {
        url.push_str(&format!("&lsn={lsn}"));
    }
    let reader = super::http::get_reader(&url, BASEBACKUP_FETCH_TIMEOUT).map_err(|e| match e {
        Ok(reply) => Error::Failed(format!("{}: basebackup: HTTP {}: {}", ps.name, reply.status, reply.error_text())),
        Err(e) => Error::Failed(format!("{}: basebackup: {e}", ps.name)),
    })?;
    tar::Archive::new(reader)
        .unpack(old)
        .map_err(|e| Error::Failed(format!("{}: unpacking the basebackup into {}: {e}", ps.name, old.display())))?;
    if t.is_sharded() {
        progress.tell(TenantEvent::Importing { step: format!("the relation files of {} from its shards", b.name) });
        materialize_from_shards(wd, t, b, old)?;
    }
    // PostgreSQL reads its configuration from the data directory; what the
    // old server needs to answer pg_upgrade on its socket, and no more.
    for (file, text) in [("postgresql.conf", ""), ("pg_hba.conf", "local all all trust\n"), ("pg_ident.conf", "")] {
        let path = old.join(file);
        std::fs::write(&path, text).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(old, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::Failed(format!("{}: {e}", old.display())))?;
    }
    Ok(())
}

/// Writes the relation files the lazy basebackup in `old` lists from the
/// shards that hold them (`docs/sharding.md`, "Eager computes"), over
/// their page services with this process's token.
fn materialize_from_shards(wd: &Workdir, t: &Tenant, b: &Branch, old: &Path) -> Result<()> {
    use strata_compute::lazy::source::{PageServiceSource, ShardedSource};
    use strata_compute::page_client::PageClientConfig;
    let client = PageClientConfig { token: super::http::token(), tls: super::http::tls(), ..Default::default() };
    let mut sources = Vec::new();
    for shard in t.shard_ids() {
        let ps = super::controller::attached(wd, shard)?;
        let addr = ps.addr("pg").ok_or_else(|| Error::Failed(format!("{}: no page service port", ps.name)))?;
        let source = PageServiceSource::new(addr, shard, b.timeline_id, client.clone())
            .map_err(|e| Error::Failed(format!("the page service client of {shard}: {e}")))?;
        sources.push(source);
    }
    let source = ShardedSource::new(t.layout(), sources).map_err(Error::Failed)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    strata_compute::agent::materialize::materialize(old, &source, &stop)
        .map_err(|e| Error::Failed(format!("branch {}: {e}", b.name)))?;
    Ok(())
}

/// The new major, both majors' programs, and who runs them.
struct Sides<'a> {
    to: u32,
    /// Where the servers' sockets go.
    sock: &'a Path,
    old_bin: &'a Path,
    new_bin: &'a Path,
    user: &'a str,
}

/// The new major's `initdb` into `stage/new` alike the old cluster, then
/// `pg_upgrade` from `stage/old`.
fn pg_upgrade(sides: &Sides<'_>, stage: &Path, template0: &Template0, checksums: bool) -> Result<()> {
    let Sides { to, old_bin, new_bin, user, sock } = *sides;
    let new = stage.join("new");
    let mut initdb = Command::new(new_bin.join("initdb"));
    initdb.arg("-D").arg(&new).args(["-U", SUPERUSER, "--no-instructions", "--no-sync"]);
    initdb.arg(format!("--encoding={}", template0.encoding));
    initdb.arg(format!("--lc-collate={}", template0.collate)).arg(format!("--lc-ctype={}", template0.ctype));
    if let Some(icu) = &template0.icu_locale {
        initdb.arg("--locale-provider=icu").arg(format!("--icu-locale={icu}"));
    }
    // pg_upgrade needs the same setting on both sides; 18's initdb turns
    // checksums on unless told.
    if checksums {
        initdb.arg("--data-checksums");
    } else if to >= 18 {
        initdb.arg("--no-data-checksums");
    }
    as_user(&mut initdb, user)?;
    run(&mut initdb, "initdb")?;

    let old = stage.join("old");
    let mut upgrade = Command::new(new_bin.join("pg_upgrade"));
    upgrade.arg("--old-bindir").arg(old_bin).arg("--new-bindir").arg(new_bin);
    upgrade.arg("--old-datadir").arg(&old).arg("--new-datadir").arg(&new);
    upgrade.arg("--socketdir").arg(sock).args(["--old-port", "50432", "--new-port", "50433"]);
    upgrade.args(["--username", SUPERUSER, "--link", "--no-sync"]);
    // pg_upgrade writes its scripts into the current directory.
    upgrade.current_dir(stage);
    as_user(&mut upgrade, user)?;
    if let Err(e) = run(&mut upgrade, "pg_upgrade") {
        return failed(format!("{e}\n(its logs: {})", new.join("pg_upgrade_output.d").display()));
    }
    Ok(())
}

/// How a cluster's template0 is encoded and sorted: `initdb` of the new
/// major must say the same for `pg_upgrade`.
struct Template0 {
    encoding: String,
    collate: String,
    ctype: String,
    icu_locale: Option<String>,
}

/// Starts the old cluster on a socket only, reads its template0's row of
/// `pg_database` (as JSON, whatever the major's columns), stops it.
fn template0_of(bin: &Path, pgdata: &Path, sock: &Path, user: &str, log: &Path) -> Result<Template0> {
    let timeout = UPGRADE_STEP_TIMEOUT.as_secs().to_string();
    let options = format!(
        "-c listen_addresses= -c unix_socket_directories={} -c port=50432",
        super::stage::shell_quote(&sock.to_string_lossy())
    );
    let mut start = Command::new(bin.join("pg_ctl"));
    start.arg("start").arg("-D").arg(pgdata).arg("-l").arg(log).args(["-w", "-t", &timeout, "-o", &options]);
    as_user(&mut start, user)?;
    if let Err(e) = run(&mut start, "starting the old major's server") {
        return failed(format!("{e}; its log ends:\n{}", log_tail(log)));
    }
    let query = Command::new(bin.join("psql"))
        .args(["-X", "-A", "-t", "-p", "50432", "-U", SUPERUSER, "-d", "template1", "-h"])
        .arg(sock)
        .args([
            "-c",
            "SELECT to_jsonb(d) || jsonb_build_object('encoding_name', pg_encoding_to_char(d.encoding)) \
             FROM pg_database d WHERE datname = 'template0'",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    let mut stop = Command::new(bin.join("pg_ctl"));
    stop.arg("stop").arg("-D").arg(pgdata).args(["-m", "fast", "-w", "-t", &timeout]);
    as_user(&mut stop, user)?;
    run(&mut stop, "stopping the old major's server")?;
    let out = query.map_err(|e| Error::Failed(format!("running psql: {e}")))?;
    if !out.status.success() {
        return failed(format!("reading template0: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let row: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Failed(format!("template0's row {:?}: {e}", String::from_utf8_lossy(&out.stdout))))?;
    let text = |key: &str| row.get(key).and_then(|v| v.as_str()).map(str::to_string);
    let Some(encoding) = text("encoding_name") else {
        return failed(format!("template0's row has no encoding: {row}"));
    };
    let (Some(collate), Some(ctype)) = (text("datcollate"), text("datctype")) else {
        return failed(format!("template0's row has no datcollate and datctype: {row}"));
    };
    // The provider: `c` libc, `i` ICU (its locale is `daticulocale`
    // before 17, `datlocale` from 17), `b` the builtin provider (17).
    let icu_locale = match text("datlocprovider").as_deref() {
        Some("i") => Some(text("datlocale").or_else(|| text("daticulocale")).unwrap_or_default()),
        Some("b") => {
            return failed("template0 uses the builtin locale provider, which is not upgraded yet".to_string())
        }
        _ => None,
    };
    Ok(Template0 { encoding, collate, ctype, icu_locale })
}
