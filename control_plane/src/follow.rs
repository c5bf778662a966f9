//! Streaming import (`strata tenant import --from CONNINFO --follow`,
//! `docs/import.md`, "Streaming import"): the new tenant's `main` keeps
//! following the source until `strata tenant cutover`.
//!
//! A *relay*, the source major's own PostgreSQL on the import's copy, is a
//! standby of the source (libpq reaches it: its TLS, its passwords). A
//! *follower*, `strata compute proposer --follow-end`, is the relay's WAL
//! receiver and the branch's proposer: the WAL goes on to the safekeepers
//! and the pageserver as a compute's does. The copy is made where the
//! source's WAL can continue without a record of ours: the relay replays
//! the base backup up to a checkpoint the source wrote after it and stops
//! there, and its shutdown restartpoint writes every page replayed, so the
//! pageserver imports the files at the end of that checkpoint record.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use strata_formats::v15::control::DbState;
use strata_formats::Lsn;
use strata_service::auth::{Claims, Scope};

use super::error::{failed, Error, Result};
use super::layout::{create_private_dir, update_cluster, Tenant, Workdir, MAIN_BRANCH};
use super::process::{self, Identity};
use super::report::{Progress, TenantEvent};
use super::stage::{as_user, give_to, log_tail, psql_query, read_control, run, shell_quote, source_query, Ready};
use super::supervisor::{Liveness, Supervised};
use crate::limits::{FOLLOWER_START_CHECK, FOLLOW_CUTOVER_WAIT, IMPORT_RECOVERY_TIMEOUT};

/// The relay's slot for the follower: the relay keeps its WAL until the
/// safekeepers hold it.
const FOLLOWER_SLOT: &str = "strata_follower";

/// The relay's port, on its private socket directory only.
const RELAY_PORT: &str = "5432";

/// Settings of the source that a hot standby may not have lower.
const AT_LEAST_THE_SOURCE: [(&str, u32); 5] = [
    ("max_connections", 100),
    ("max_worker_processes", 8),
    ("max_wal_senders", 10),
    ("max_prepared_transactions", 0),
    ("max_locks_per_transaction", 64),
];

/// The source's replication slot for the relay, named after the tenant.
pub fn source_slot(name: &str) -> String {
    format!("strata_import_{}", name.replace('-', "_"))
}

/// Where the relay and the follower keep their files.
struct Places {
    /// The import's stage: the copy (`pgdata`) and the relay's files, the
    /// user of PostgreSQL's.
    stage: PathBuf,
    /// The follower's own directory (its token, pidfile, log, end file):
    /// the CLI user's alone.
    follower: PathBuf,
    /// The relay's Unix socket directory, short enough for a socket path.
    sockets: PathBuf,
}

impl Places {
    fn of(wd: &Workdir, name: &str, tenant_id: impl std::fmt::Display) -> Places {
        let imports = wd.root.join("imports");
        Places {
            stage: imports.join(name),
            follower: imports.join(format!("{name}.follower")),
            sockets: std::env::temp_dir().join(format!("strata-relay-{tenant_id}")),
        }
    }

    fn pgdata(&self) -> PathBuf {
        self.stage.join("pgdata")
    }

    /// The relay's configuration file (no secret in it).
    fn conf(&self) -> PathBuf {
        self.stage.join("relay.conf")
    }

    /// `primary_conninfo` and `primary_slot_name`: the connection string
    /// may hold a password, so the file is the relay user's alone.
    fn source_conf(&self) -> PathBuf {
        self.stage.join("source.conf")
    }

    fn log(&self) -> PathBuf {
        self.stage.join("relay.log")
    }

    fn end_file(&self) -> PathBuf {
        self.follower.join("end.json")
    }

    fn supervised(&self, name: &str) -> Supervised {
        let identity =
            Identity { subcommand: "compute", marker: self.end_file(), pidfile: self.follower.join("follower.pid") };
        Supervised::new(
            format!("follower of {name}"),
            identity,
            self.follower.join("follower.log"),
            Duration::from_secs(10),
        )
    }
}

/// Writes a file of the relay's, `user`'s alone.
fn write_private(path: &Path, text: &str, user: &str) -> Result<()> {
    strata_service::auth::write_secret(path, text).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    give_to(path, user)
}

/// The relay's `postgresql.conf`: its own settings and the source's
/// (included when present), nothing of the source's configuration.
fn relay_conf(wd: &Workdir, conninfo: &str) -> Result<String> {
    let names: Vec<String> = AT_LEAST_THE_SOURCE.iter().map(|(n, _)| format!("'{n}'")).collect();
    let rows = source_query(
        wd,
        conninfo,
        &format!("SELECT name, setting FROM pg_settings WHERE name IN ({})", names.join(",")),
    )?;
    let mut text = String::from("# The relay of a streaming import (docs/import.md); written by strata.\n");
    for (name, default) in AT_LEAST_THE_SOURCE {
        let source = rows
            .lines()
            .filter_map(|l| l.split_once('|'))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse::<u32>().ok())
            .unwrap_or(default);
        text.push_str(&format!("{name} = {}\n", source.max(default)));
    }
    text.push_str("include_if_exists 'source.conf'\n");
    Ok(text)
}

/// `strata tenant import --from CONNINFO --follow`, its first half: a copy
/// under `stage` that holds the database at the end of a checkpoint record
/// of the source's, made by its relay stopping right there.
pub fn prepare(wd: &Workdir, name: &str, stage: &Path, conninfo: &str, progress: &mut dyn Progress) -> Result<Ready> {
    let user = &wd.cluster.pg_user;
    super::stage::fresh_stage(stage, user)?;
    let major = super::stage::server_major(wd, conninfo)?;
    let slot = source_slot(name);
    // One left by an interrupted import of the same name is taken afresh.
    source_query(
        wd,
        conninfo,
        &format!("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}' AND NOT active"),
    )?;
    let copy = stage.join("pgdata");
    progress.tell(TenantEvent::Importing { step: format!("pg_basebackup of PostgreSQL {major}, slot {slot}") });
    let mut cmd = Command::new(wd.cluster.pg_bin_dir_for(major).join("pg_basebackup"));
    cmd.arg("--dbname").arg(conninfo).arg("--pgdata").arg(&copy);
    cmd.args(["--wal-method=stream", "--checkpoint=fast", "--no-sync", "--format=plain", "--create-slot", "--slot"]);
    cmd.arg(&slot);
    as_user(&mut cmd, user)?;
    run(&mut cmd, "pg_basebackup")?;
    // The role the follower connects to the relay as.
    let superuser = source_query(wd, conninfo, "SELECT rolname FROM pg_roles WHERE oid = 10")?;
    std::fs::write(stage.join("superuser"), format!("{superuser}\n")).map_err(|e| Error::Failed(e.to_string()))?;
    // The copy can continue the source's WAL only where a restartpoint
    // wrote its pages: at a checkpoint the source writes after the backup.
    if let Err(e) = source_query(wd, conninfo, "CHECKPOINT") {
        return failed(format!(
            "{e}\na streaming import asks the source for a checkpoint: its role needs CHECKPOINT (a superuser, or a \
             member of pg_checkpoint)"
        ));
    }
    let at = source_query(wd, conninfo, "SELECT checkpoint_lsn FROM pg_control_checkpoint()")?;
    let checkpoint: Lsn = at.parse().map_err(|_| Error::Failed(format!("the source's checkpoint LSN {at:?}")))?;
    let places = Places { stage: stage.to_path_buf(), follower: PathBuf::new(), sockets: PathBuf::new() };
    write_private(&places.conf(), &relay_conf(wd, conninfo)?, user)?;
    let source = format!("primary_conninfo = {}\nprimary_slot_name = '{slot}'\n", quote_setting(conninfo));
    write_private(&places.source_conf(), &source, user)?;
    std::fs::write(copy.join("standby.signal"), "").map_err(|e| Error::Failed(format!("standby.signal: {e}")))?;
    for (file, text) in [("relay.hba", "local all all trust\nlocal replication all trust\n"), ("relay.ident", "")] {
        write_private(&stage.join(file), text, user)?;
    }
    give_to(stage, user)?;
    progress
        .tell(TenantEvent::Importing { step: format!("the relay replays up to the source's checkpoint {checkpoint}") });
    catch_up(wd, &places, major, checkpoint)?;
    let control = read_control(&copy)?;
    if control.state != DbState::ShutdownedInRecovery || control.checkpoint != checkpoint {
        return failed(format!(
            "the relay stopped in state {:?} at checkpoint {} (the source's is {checkpoint}); its log ends:\n{}",
            control.state,
            control.checkpoint,
            log_tail(&places.log())
        ));
    }
    Ok(Ready { wal: super::stage::checkpoint_wal(&copy, &control), pgdata: copy, major, follow: true })
}

/// A value in a configuration file: single-quoted, quotes doubled.
fn quote_setting(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// The relay's command-line settings (none secret).
fn relay_settings(places: &Places, sockets: &Path, hot_standby: bool) -> Vec<String> {
    vec![
        format!("config_file={}", places.conf().display()),
        format!("hba_file={}", places.stage.join("relay.hba").display()),
        format!("ident_file={}", places.stage.join("relay.ident").display()),
        "listen_addresses=".into(),
        format!("unix_socket_directories={}", sockets.display()),
        format!("port={RELAY_PORT}"),
        "archive_mode=off".into(),
        "shared_preload_libraries=".into(),
        "logging_collector=off".into(),
        format!("hot_standby={}", if hot_standby { "on" } else { "off" }),
    ]
}

fn pg_ctl(wd: &Workdir, major: u32) -> Command {
    Command::new(wd.cluster.pg_bin_dir_for(major).join("pg_ctl"))
}

/// Replays the copy, streaming from the source, up to and including the
/// checkpoint record at `checkpoint`, then stops it (PostgreSQL's
/// `recovery_target_action = shutdown`).
fn catch_up(wd: &Workdir, places: &Places, major: u32, checkpoint: Lsn) -> Result<()> {
    let user = &wd.cluster.pg_user;
    let sockets = super::stage::SocketDir::new(user)?;
    let mut settings = relay_settings(places, sockets.path(), false);
    settings.extend([
        format!("recovery_target_lsn={checkpoint}"),
        "recovery_target_inclusive=on".into(),
        "recovery_target_action=shutdown".into(),
    ]);
    let options: Vec<String> = settings.iter().map(|s| format!("-c {}", shell_quote(s))).collect();
    let pgdata = places.pgdata();
    let mut start = pg_ctl(wd, major);
    start.arg("start").arg("-D").arg(&pgdata).arg("-l").arg(places.log()).args(["-W", "-o"]).arg(options.join(" "));
    as_user(&mut start, user)?;
    run(&mut start, "starting the relay")?;
    let deadline = Instant::now() + IMPORT_RECOVERY_TIMEOUT;
    // Gone once the target is reached: the server then shuts down.
    std::thread::sleep(Duration::from_millis(200));
    while pgdata.join("postmaster.pid").exists() {
        if Instant::now() > deadline {
            let mut stop = pg_ctl(wd, major);
            stop.arg("stop").arg("-D").arg(&pgdata).args(["-m", "immediate"]);
            let _ = as_user(&mut stop, user).and_then(|()| run(&mut stop, "stopping the relay"));
            return failed(format!("the relay did not reach {checkpoint} within {IMPORT_RECOVERY_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// After the import: the relay runs again as the source's standby, and
/// the follower under its supervisor streams its WAL to the safekeepers.
pub fn start(wd: &Workdir, name: &str, progress: &mut dyn Progress) -> Result<()> {
    let t = wd.cluster.tenant_named(name)?.clone();
    let places = Places::of(wd, name, t.tenant_id);
    let major = t.pg_version;
    start_relay(wd, &places, major)?;
    start_follower(wd, &t, &places)?;
    update_cluster(&wd.root, |c| {
        if let Some(t) = c.tenant_mut(name) {
            t.follows = Some(source_slot(name));
        }
        Ok(())
    })?;
    progress
        .tell(TenantEvent::Importing { step: format!("main follows the source until `strata tenant cutover {name}`") });
    Ok(())
}

/// Starts the relay as a hot standby of the source. The first time, its
/// slot for the follower is made before it streams, so that its WAL from
/// the import's end on is kept.
fn start_relay(wd: &Workdir, places: &Places, major: u32) -> Result<()> {
    let user = &wd.cluster.pg_user;
    create_private_dir(&places.sockets)?;
    give_to(&places.sockets, user)?;
    let first = !places.stage.join("relay.started").exists();
    let held = places.stage.join("source.conf.held");
    if first {
        std::fs::rename(places.source_conf(), &held).map_err(|e| Error::Failed(format!("source.conf: {e}")))?;
    }
    let options: Vec<String> =
        relay_settings(places, &places.sockets, true).iter().map(|s| format!("-c {}", shell_quote(s))).collect();
    let mut start = pg_ctl(wd, major);
    let timeout = IMPORT_RECOVERY_TIMEOUT.as_secs().to_string();
    start
        .arg("start")
        .arg("-D")
        .arg(places.pgdata())
        .arg("-l")
        .arg(places.log())
        .args(["-w", "-t", &timeout, "-o"])
        .arg(options.join(" "));
    as_user(&mut start, user)?;
    if let Err(e) = run(&mut start, "starting the relay") {
        return failed(format!("{e}; its log ends:\n{}", log_tail(&places.log())));
    }
    if first {
        relay_sql(wd, places, &format!("SELECT pg_create_physical_replication_slot('{FOLLOWER_SLOT}', true)"))?;
        std::fs::rename(&held, places.source_conf()).map_err(|e| Error::Failed(format!("source.conf: {e}")))?;
        let mut reload = pg_ctl(wd, major);
        reload.arg("reload").arg("-D").arg(places.pgdata());
        as_user(&mut reload, user)?;
        run(&mut reload, "the relay reading source.conf")?;
        std::fs::write(places.stage.join("relay.started"), "").map_err(|e| Error::Failed(e.to_string()))?;
    }
    Ok(())
}

/// Runs `sql` on the relay, as its bootstrap superuser.
fn relay_sql(wd: &Workdir, places: &Places, sql: &str) -> Result<String> {
    let user = relay_superuser(places)?;
    let connect: [&std::ffi::OsStr; 8] = [
        "-h".as_ref(),
        places.sockets.as_os_str(),
        "-p".as_ref(),
        RELAY_PORT.as_ref(),
        "-d".as_ref(),
        "template1".as_ref(),
        "-U".as_ref(),
        user.as_ref(),
    ];
    psql_query(wd, "the relay", &connect, sql)
}

/// The copy's bootstrap superuser: the owner of `template1`'s files.
fn relay_superuser(places: &Places) -> Result<String> {
    let path = places.stage.join("superuser");
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

/// Spawns the follower under its supervisor; fails if it exits at once.
fn start_follower(wd: &Workdir, t: &Tenant, places: &Places) -> Result<()> {
    create_private_dir(&places.follower)?;
    let _ = std::fs::remove_file(places.end_file());
    let branch = t.branch(MAIN_BRANCH).ok_or_else(|| Error::Failed(format!("tenant {}: no main branch", t.name)))?;
    let site = super::hosts::this_host(wd)?.map(|h| h.site.clone()).unwrap_or_default();
    let c = &wd.cluster;
    let superuser = relay_superuser(places)?;
    let mut args: Vec<std::ffi::OsString> = vec![
        "compute".into(),
        "proposer".into(),
        "--safekeepers".into(),
        c.safekeeper_addrs_from(&site).join(",").into(),
        "--tenant-id".into(),
        t.tenant_id.to_string().into(),
        "--timeline-id".into(),
        branch.timeline_id.to_string().into(),
        "--pg-host".into(),
        places.sockets.clone().into(),
        "--pg-port".into(),
        RELAY_PORT.into(),
        "--pg-user".into(),
        superuser.into(),
        "--application-name".into(),
        FOLLOWER_SLOT.into(),
        "--slot".into(),
        FOLLOWER_SLOT.into(),
        "--follow-end".into(),
        places.end_file().into(),
    ];
    if let Some(signer) = super::keys::signer(&wd.root)? {
        // This branch's WAL only; it lives as long as the follower, which
        // cannot renew it (`docs/security.md`, "Scopes").
        let claims = Claims::new(Scope::Tenant, Some(t.tenant_id), None).for_timeline(branch.timeline_id);
        let path = places.follower.join("follower.token");
        strata_service::auth::write_secret(&path, &signer.sign(&claims)).map_err(|e| Error::Failed(e.to_string()))?;
        args.extend(["--token-file".into(), path.into()]);
    }
    if super::certs::client(&wd.root)?.is_some() {
        args.extend(["--tls-ca".into(), super::certs::ca_cert(&wd.root).into()]);
    }
    let exe = std::env::current_exe().map_err(|e| Error::Failed(format!("finding the strata binary: {e}")))?;
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let sv = places.supervised(&t.name);
    let mut child = sv.spawn(&exe, &args, &wd.root)?;
    let deadline = Instant::now() + FOLLOWER_START_CHECK;
    while Instant::now() < deadline {
        if let Some(why) = sv.start_failure(&mut child) {
            let _ = sv.stop(true);
            return failed(format!("the follower {why}; its log ends:\n{}", process::log_tail(&sv.log, 0, 10)));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// What a cut-over found.
pub struct CutOver {
    pub tenant: String,
    /// Where the source's WAL ended: `main` continues from there.
    pub end_lsn: String,
    /// The source's slot for the relay, left on the source (it was stopped).
    pub source_slot: String,
    pub seconds: f64,
}

impl std::fmt::Display for CutOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant {} cut over at {} in {:.1} s: its main branch takes a writer now. On the source, if it runs \
             again, drop its slot: SELECT pg_drop_replication_slot('{}')",
            self.tenant, self.end_lsn, self.seconds, self.source_slot
        )
    }
}

/// What the follower wrote at its end.
#[derive(serde::Deserialize)]
struct FollowEnd {
    end_lsn: String,
    shut_down: bool,
}

/// `strata tenant cutover NAME`: the source stopped, its relay is stopped
/// too; the follower, at the end of the relay's stream, waits until a
/// quorum holds all of it. When that WAL ends with the source's shutdown
/// checkpoint, `main` is the tenant's to write; otherwise the relay and
/// the follower go on and the cut-over fails.
pub fn cutover(wd: &Workdir, name: &str, wait: Option<Duration>, progress: &mut dyn Progress) -> Result<CutOver> {
    let began = Instant::now();
    let t = wd.cluster.tenant_named(name)?.clone();
    let Some(slot) = t.follows.clone() else {
        return failed(format!("tenant {name} follows no source (it was not imported with --follow, or was cut over)"));
    };
    let places = Places::of(wd, name, t.tenant_id);
    progress.tell(TenantEvent::Importing { step: "stopping the relay".into() });
    stop_relay(wd, &places, t.pg_version, "fast")?;
    let sv = places.supervised(name);
    let deadline = Instant::now() + wait.unwrap_or(FOLLOW_CUTOVER_WAIT);
    while sv.liveness() != Liveness::Stopped && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let end: Option<FollowEnd> = std::fs::read(places.end_file()).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let why = match &end {
        Some(e) if e.shut_down => None,
        Some(e) => Some(format!(
            "the source's WAL did not end with its shutdown checkpoint (it ended at {}): the source still runs",
            e.end_lsn
        )),
        None => Some(format!(
            "the follower did not end within {:?}; its log: {}",
            wait.unwrap_or(FOLLOW_CUTOVER_WAIT),
            sv.log.display()
        )),
    };
    if let Some(why) = why {
        let _ = sv.stop(false);
        start_relay(wd, &places, t.pg_version)?;
        start_follower(wd, &t, &places)?;
        return failed(format!("{why}; main follows it still. Stop the source (pg_ctl stop), then cut over again"));
    }
    let end = end.expect("checked");
    let _ = sv.stop(false);
    update_cluster(&wd.root, |c| {
        if let Some(t) = c.tenant_mut(name) {
            t.follows = None;
        }
        Ok(())
    })?;
    remove_places(&places);
    Ok(CutOver { tenant: name.into(), end_lsn: end.end_lsn, source_slot: slot, seconds: began.elapsed().as_secs_f64() })
}

fn stop_relay(wd: &Workdir, places: &Places, major: u32, mode: &str) -> Result<()> {
    // Not running (a pidfile a reboot left behind among the cases):
    // `pg_ctl status` exits with 3.
    let mut status = pg_ctl(wd, major);
    status.arg("status").arg("-D").arg(places.pgdata()).stdout(Stdio::null()).stderr(Stdio::null());
    as_user(&mut status, &wd.cluster.pg_user)?;
    if status.status().map(|s| s.code() == Some(3)).unwrap_or(false) {
        return Ok(());
    }
    let mut stop = pg_ctl(wd, major);
    stop.arg("stop").arg("-D").arg(places.pgdata()).args(["-m", mode, "-w", "-t", "60"]);
    as_user(&mut stop, &wd.cluster.pg_user)?;
    match run(&mut stop, "stopping the relay") {
        Ok(()) => Ok(()),
        // A relay's fast shutdown waits for its walsender to hand the
        // follower all it has, which a follower behind a busy quorum may
        // not confirm in time. Stopped at once, the relay may cut its stream
        // short of the source's end: the cut-over then finds no shutdown
        // checkpoint at the end, starts the relay again and fails safely,
        // to be run again.
        Err(e) if mode != "immediate" => {
            tracing::warn!("{e}; stopping the relay at once");
            stop_relay(wd, places, major, "immediate")
        }
        Err(e) => Err(e),
    }
}

fn remove_places(places: &Places) {
    for dir in [&places.stage, &places.follower, &places.sockets] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A deleted tenant's follower and relay: stopped, their files removed.
pub(crate) fn abandon(wd: &Workdir, t: &Tenant) -> Result<()> {
    if t.follows.is_none() {
        return Ok(());
    }
    let places = Places::of(wd, &t.name, t.tenant_id);
    places.supervised(&t.name).stop(true)?;
    stop_relay(wd, &places, t.pg_version, "immediate")?;
    remove_places(&places);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_what_postgresql_allows() {
        let slot = source_slot("shop-eu-1");
        assert_eq!(slot, "strata_import_shop_eu_1");
        assert!(slot.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
    }

    #[test]
    fn settings_are_quoted_for_a_configuration_file() {
        assert_eq!(quote_setting("host=a password='x y'"), "'host=a password=''x y'''");
        assert_eq!(quote_setting(r"a\b"), r"'a\\b'");
    }
}
