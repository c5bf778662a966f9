//! `strata tenant import` (`docs/import.md`): an existing database becomes
//! a tenant whose `main` branch equals it. The source is a running
//! PostgreSQL (copied with its own `pg_basebackup`) or a data directory
//! (cleanly shut down, or a base backup with its WAL). What is not cleanly
//! shut down is made so on a copy first, by the source major's own
//! PostgreSQL replaying the copy's WAL, so the pageserver imports files
//! that need no WAL; then the tenant is created as `tenant create` does,
//! its data sent to its pageserver as a tar stream.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use strata_formats::v15::control::DbState;
use strata_protocol::api::pageserver::TimelineStatus;
use strata_protocol::{TenantId, TenantShardId, TimelineId};

use super::error::{failed, Error, Result};
use super::layout::{Workdir, MAIN_BRANCH};
use super::report::{Progress, TenantEvent};
pub use super::stage::Ready;
use super::stage::{
    as_user, checkpoint_wal, fresh_stage, give_to, log_tail, read_control, run, server_major, shell_quote, SocketDir,
};
use super::tenant::TenantCreated;
use crate::limits::{IMPORT_RECOVERY_TIMEOUT, IMPORT_UPLOAD_TIMEOUT, QUICK};

/// Where the database comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A running PostgreSQL, by connection string (a replication
    /// connection is allowed for its user: `pg_basebackup` copies it).
    Server(String),
    /// A data directory: cleanly shut down, or a base backup whose WAL is
    /// in its `pg_wal/` or in `wal` (segment files).
    Directory { pgdata: PathBuf, wal: Option<PathBuf> },
}

/// `strata tenant import NAME`, its first half: `source` as a cleanly
/// shut-down data directory (a copy under the workdir's `imports/NAME/`
/// where it is not one). Takes no lock: a copy may take long, and changes
/// nothing of the cluster.
pub fn prepare(wd: &Workdir, name: &str, source: &Source, progress: &mut dyn Progress) -> Result<Ready> {
    prepare_in(wd, &check_new(wd, name)?, source, progress)
}

/// Refuses the name of a tenant that exists (one left `creating` is
/// finished); the import's staging directory.
pub fn check_new(wd: &Workdir, name: &str) -> Result<PathBuf> {
    super::tenant::check_name(name)?;
    if wd.cluster.tenant(name).is_some_and(|t| t.state != super::layout::TenantState::Creating) {
        return failed(format!("a tenant named {name:?} exists"));
    }
    Ok(stage_of(wd, name))
}

/// Its second half, under the cluster's lock: the tenant, of the source's
/// major, created as `tenant create` does, with `ready` sent to its
/// pageserver instead of `initdb`'s output.
pub fn import(wd: &Workdir, name: &str, ready: &Ready, progress: &mut dyn Progress) -> Result<TenantCreated> {
    let result = super::tenant::create_with(wd, name, ready.major, None, progress, &mut |wd, t, progress| {
        let timeline = t.branch(MAIN_BRANCH).map(|b| b.timeline_id).unwrap_or_default();
        send(wd, t.tenant_id, timeline, ready, progress)
    });
    // A streaming import's copy goes on as its relay (`super::follow`).
    if result.is_ok() && !ready.follow {
        // The copy is in the tenant now.
        let _ = std::fs::remove_dir_all(stage_of(wd, name));
    }
    result
}

fn stage_of(wd: &Workdir, name: &str) -> PathBuf {
    wd.root.join("imports").join(name)
}

/// Makes the source a cleanly shut-down data directory: the source itself
/// when it is one (it is only read), else a copy under `stage`.
fn prepare_in(wd: &Workdir, stage: &Path, source: &Source, progress: &mut dyn Progress) -> Result<Ready> {
    let user = &wd.cluster.pg_user;
    let pgdata = match source {
        Source::Directory { pgdata, wal: None } if state_of(pgdata)? == DbState::Shutdowned => pgdata.clone(),
        Source::Directory { pgdata, wal } => {
            fresh_stage(stage, user)?;
            let copy = stage.join("pgdata");
            progress.tell(TenantEvent::Importing { step: format!("copying {}", pgdata.display()) });
            // Links followed: a `pg_wal` made by `--waldir` is a link.
            run(
                Command::new("cp").args(["-R", "-L", "-p", "--"]).arg(pgdata).arg(&copy),
                "copying the data directory",
            )?;
            // A copy of a server's lock files would name its running processes.
            for lock in ["postmaster.pid", "postmaster.opts"] {
                let _ = std::fs::remove_file(copy.join(lock));
            }
            if let Some(wal) = wal {
                run(
                    Command::new("sh")
                        .arg("-c")
                        .arg("cp -p -- \"$1\"/[0-9A-F]* \"$2\"/pg_wal/")
                        .arg("sh")
                        .arg(wal)
                        .arg(&copy),
                    "copying the WAL",
                )?;
            }
            give_to(&copy, user)?;
            recover(wd, stage, &copy, major_of(&copy)?, progress)?;
            copy
        }
        Source::Server(conninfo) => {
            fresh_stage(stage, user)?;
            let major = server_major(wd, conninfo)?;
            let copy = stage.join("pgdata");
            progress.tell(TenantEvent::Importing { step: format!("pg_basebackup of PostgreSQL {major}") });
            let mut cmd = Command::new(wd.cluster.pg_bin_dir_for(major).join("pg_basebackup"));
            cmd.arg("--dbname").arg(conninfo).arg("--pgdata").arg(&copy);
            cmd.args(["--wal-method=stream", "--checkpoint=fast", "--no-sync", "--format=plain"]);
            as_user(&mut cmd, user)?;
            run(&mut cmd, "pg_basebackup")?;
            recover(wd, stage, &copy, major, progress)?;
            copy
        }
    };
    let control = read_control(&pgdata)?;
    if control.state != DbState::Shutdowned {
        return failed(format!("{}: still not shut down cleanly ({:?})", pgdata.display(), control.state));
    }
    let major = control.pg_version().major();
    super::tenant::check_pg_version(major)?;
    let tablespaces = pgdata.join("pg_tblspc");
    if std::fs::read_dir(&tablespaces).map(|mut d| d.next().is_some()).unwrap_or(false) {
        return failed(format!("{}: the database has tablespaces, which are not imported", tablespaces.display()));
    }
    Ok(Ready { wal: checkpoint_wal(&pgdata, &control), pgdata, major, follow: false })
}

/// The major of a data directory, from its `PG_VERSION`.
fn major_of(pgdata: &Path) -> Result<u32> {
    let path = pgdata.join("PG_VERSION");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    text.trim().parse().map_err(|_| Error::Failed(format!("{}: not a major version: {text:?}", path.display())))
}

fn state_of(pgdata: &Path) -> Result<DbState> {
    Ok(read_control(pgdata)?.state)
}

/// Replays the copy's WAL with the source major's own PostgreSQL, then
/// shuts it down cleanly: the copy then needs no WAL. PostgreSQL runs
/// with nothing of the source's configuration that could reach out (no
/// TCP, no archiving, no preloaded libraries, no standby mode).
fn recover(wd: &Workdir, stage: &Path, pgdata: &Path, major: u32, progress: &mut dyn Progress) -> Result<()> {
    super::tenant::check_pg_version(major)?;
    progress.tell(TenantEvent::Importing { step: format!("replaying the copy's WAL with PostgreSQL {major}") });
    for signal in ["standby.signal", "recovery.signal"] {
        let _ = std::fs::remove_file(pgdata.join(signal));
    }
    let user = &wd.cluster.pg_user;
    let (conf, hba, ident, log) = (
        stage.join("recovery.conf"),
        stage.join("recovery.hba"),
        stage.join("recovery.ident"),
        stage.join("recovery.log"),
    );
    for (path, text) in [(&conf, ""), (&hba, "local all all reject\n"), (&ident, "")] {
        std::fs::write(path, text).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    }
    let socket_dir = SocketDir::new(user)?;
    let sock = socket_dir.path();
    give_to(stage, user)?;
    let settings = [
        format!("config_file={}", conf.display()),
        format!("hba_file={}", hba.display()),
        format!("ident_file={}", ident.display()),
        "listen_addresses=".into(),
        format!("unix_socket_directories={}", sock.display()),
        "archive_mode=off".into(),
        "shared_preload_libraries=".into(),
        "hot_standby=off".into(),
        "logging_collector=off".into(),
        "max_wal_senders=0".into(),
    ];
    let options: Vec<String> = settings.iter().map(|s| format!("-c {}", shell_quote(s))).collect();
    let pg_ctl = wd.cluster.pg_bin_dir_for(major).join("pg_ctl");
    let timeout = IMPORT_RECOVERY_TIMEOUT.as_secs().to_string();
    let mut start = Command::new(&pg_ctl);
    start
        .arg("start")
        .arg("-D")
        .arg(pgdata)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", &timeout, "-o"])
        .arg(options.join(" "));
    as_user(&mut start, user)?;
    if let Err(e) = run(&mut start, "replaying the copy's WAL") {
        return failed(format!("{e}; the server's log ends:\n{}", log_tail(&log)));
    }
    // `pg_ctl -w` may return while the replay still runs (18 reports the
    // server started once it runs at all); `pg_control` says when it ended.
    let deadline = std::time::Instant::now() + IMPORT_RECOVERY_TIMEOUT;
    loop {
        // A read may meet a write of the file half done: its CRC fails, and
        // the next read is whole.
        if read_control(pgdata).is_ok_and(|c| c.state == DbState::InProduction) {
            break;
        }
        if !pgdata.join("postmaster.pid").exists() {
            return failed(format!("the replay ended without finishing; the server's log ends:\n{}", log_tail(&log)));
        }
        if std::time::Instant::now() > deadline {
            return failed(format!("the replay did not end within {IMPORT_RECOVERY_TIMEOUT:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut stop = Command::new(&pg_ctl);
    stop.arg("stop").arg("-D").arg(pgdata).args(["-m", "fast", "-w", "-t", &timeout]);
    as_user(&mut stop, user)?;
    run(&mut stop, "shutting the copy down")
}

/// Sends the data directory to the tenant's pageserver as timeline
/// `timeline`, unless it holds that timeline already (an interrupted
/// import run again); to each shard's of a sharded tenant (a major
/// upgrade's new branch), which keeps its own keys of it.
pub(crate) fn send(
    wd: &Workdir,
    tenant: TenantId,
    timeline: TimelineId,
    ready: &Ready,
    progress: &mut dyn Progress,
) -> Result<()> {
    match wd.cluster.tenants.iter().find(|t| t.tenant_id == tenant).filter(|t| t.is_sharded()) {
        Some(t) => t.shard_ids().into_iter().try_for_each(|shard| send_to(wd, shard, timeline, ready, progress)),
        None => {
            super::controller::register(wd, tenant.into())?;
            send_to(wd, tenant.into(), timeline, ready, progress)
        }
    }
}

/// [`send`] to one shard (or an unsharded tenant).
fn send_to(
    wd: &Workdir,
    tenant: TenantShardId,
    timeline: TimelineId,
    ready: &Ready,
    progress: &mut dyn Progress,
) -> Result<()> {
    let ps = super::controller::attached(wd, tenant)?;
    let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", ps.http_url());
    let reply = super::http::get(&url, QUICK).map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
    if reply.status == 200 {
        let status: TimelineStatus = reply.json().map_err(|e| Error::Failed(format!("{}: {e}", ps.name)))?;
        let control = read_control(&ready.pgdata)?;
        if status.system_id != control.system_identifier {
            return failed(format!(
                "{}: timeline {timeline} exists with another system identifier than {}'s",
                ps.name,
                ready.pgdata.display()
            ));
        }
        return Ok(());
    }
    progress.tell(TenantEvent::Importing { step: format!("sending the data directory to {}", ps.name) });
    let mut tar = Command::new("tar");
    tar.arg("--create").arg("--file=-").arg("--directory").arg(&ready.pgdata);
    tar.args(["PG_VERSION", "global", "base", "pg_xact", "pg_multixact", "pg_twophase"]).args(&ready.wal);
    let mut child = tar
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Failed(format!("running tar: {e}")))?;
    let mut stdout = child.stdout.take().expect("piped");
    let sent =
        super::http::put_stream(&format!("{url}/import"), "application/x-tar", &mut stdout, IMPORT_UPLOAD_TIMEOUT);
    drop(stdout);
    let out = child.wait_with_output().map_err(|e| Error::Failed(format!("tar: {e}")))?;
    if !out.status.success() {
        return failed(format!("tar of {}: {}", ready.pgdata.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    let reply = sent.map_err(|e| Error::Failed(format!("{}: sending the data directory: {e}", ps.name)))?;
    match reply.status {
        201 => Ok(()),
        s => failed(format!("{}: importing tenant {tenant}: HTTP {s}: {}", ps.name, reply.error_text())),
    }
}
