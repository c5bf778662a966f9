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

use strata_formats::v15::control::{ControlFile, DbState};
use strata_protocol::api::pageserver::TimelineStatus;
use strata_protocol::{TenantId, TimelineId};

use super::error::{failed, Error, Result};
use super::layout::{Workdir, MAIN_BRANCH};
use super::report::{Progress, TenantEvent};
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
    super::tenant::check_name(name)?;
    if wd.cluster.tenant(name).is_some_and(|t| t.state != super::layout::TenantState::Creating) {
        return failed(format!("a tenant named {name:?} exists"));
    }
    prepare_in(wd, &stage_of(wd, name), source, progress)
}

/// Its second half, under the cluster's lock: the tenant, of the source's
/// major, created as `tenant create` does, with `ready` sent to its
/// pageserver instead of `initdb`'s output.
pub fn import(wd: &Workdir, name: &str, ready: &Ready, progress: &mut dyn Progress) -> Result<TenantCreated> {
    let result = super::tenant::create_with(wd, name, ready.major, progress, &mut |wd, t, progress| {
        let timeline = t.branch(MAIN_BRANCH).map(|b| b.timeline_id).unwrap_or_default();
        send(wd, t.tenant_id, timeline, ready, progress)
    });
    if result.is_ok() {
        // The copy is in the tenant now.
        let _ = std::fs::remove_dir_all(stage_of(wd, name));
    }
    result
}

fn stage_of(wd: &Workdir, name: &str) -> PathBuf {
    wd.root.join("imports").join(name)
}

/// A cleanly shut-down data directory to send.
pub struct Ready {
    pub(crate) pgdata: PathBuf,
    pub(crate) major: u32,
    /// The WAL files the import reads (the checkpoint record's), relative
    /// to the data directory.
    pub(crate) wal: Vec<String>,
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
    Ok(Ready { wal: checkpoint_wal(&pgdata, &control), pgdata, major })
}

/// The major of a data directory, from its `PG_VERSION`.
fn major_of(pgdata: &Path) -> Result<u32> {
    let path = pgdata.join("PG_VERSION");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    text.trim().parse().map_err(|_| Error::Failed(format!("{}: not a major version: {text:?}", path.display())))
}

pub(crate) fn read_control(pgdata: &Path) -> Result<ControlFile> {
    let path = pgdata.join("global/pg_control");
    let bytes = std::fs::read(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    ControlFile::decode(&bytes).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

fn state_of(pgdata: &Path) -> Result<DbState> {
    Ok(read_control(pgdata)?.state)
}

/// The WAL segment files holding the last checkpoint record (it may cross
/// into the next segment), relative to the data directory.
pub(crate) fn checkpoint_wal(pgdata: &Path, control: &ControlFile) -> Vec<String> {
    let size = u64::from(control.wal_segment_size).max(1);
    let tli = control.checkpoint_copy.this_timeline;
    let segment = control.checkpoint.0 / size;
    let per_xlogid = 0x1_0000_0000u64 / size;
    let name = |s: u64| format!("pg_wal/{tli:08X}{:08X}{:08X}", s / per_xlogid, s % per_xlogid);
    let mut out = vec![name(segment)];
    if pgdata.join(name(segment + 1)).exists() {
        out.push(name(segment + 1));
    }
    out
}

/// An empty staging directory for this import, private to the user that
/// runs PostgreSQL (which owns the copy in it).
pub(crate) fn fresh_stage(stage: &Path, user: &str) -> Result<()> {
    if stage.exists() {
        std::fs::remove_dir_all(stage).map_err(|e| Error::Failed(format!("{}: {e}", stage.display())))?;
    }
    // `imports/` is traversable (PostgreSQL's user reaches its copy inside);
    // each stage is that user's alone.
    if let Some(parent) = stage.parent() {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let made = std::fs::DirBuilder::new().recursive(true).mode(0o711).create(parent);
        made.and_then(|()| std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711)))
            .map_err(|e| Error::Failed(format!("{}: {e}", parent.display())))?;
    }
    super::layout::create_private_dir(stage)?;
    give_to(stage, user)
}

/// When running as root: makes `dir` and everything in it `user`'s.
pub(crate) fn give_to(dir: &Path, user: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    run(Command::new("chown").arg("-R").arg(format!("{user}:")).arg("--").arg(dir), "giving the copy to its user")
}

/// When running as root: `cmd` runs as `user` (PostgreSQL refuses root).
pub(crate) fn as_user(cmd: &mut Command, user: &str) -> Result<()> {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let (uid, gid) =
        strata_pageserver::user::lookup(user).map_err(|e| Error::Failed(format!("pg_user {user:?}: {e}")))?;
    cmd.uid(uid).gid(gid);
    Ok(())
}

/// Runs `cmd` to its end; its error output in the error.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Failed(format!("{what}: running {}: {e}", cmd.get_program().to_string_lossy())))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return failed(format!("{what} failed ({}): {}", out.status, stderr.trim()));
    }
    Ok(())
}

/// The major of the PostgreSQL `conninfo` reaches.
fn server_major(wd: &Workdir, conninfo: &str) -> Result<u32> {
    let psql = wd.cluster.pg_bin_dir.join("psql");
    let out = Command::new(&psql)
        .args(["-X", "-A", "-t", "-c", "SHOW server_version_num", "--dbname"])
        .arg(conninfo)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Failed(format!("running {}: {e}", psql.display())))?;
    if !out.status.success() {
        return failed(format!("connecting to the source: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let number: u32 = text.trim().parse().map_err(|_| Error::Failed(format!("server_version_num {text:?}")))?;
    let major = number / 10_000;
    super::tenant::check_pg_version(major)?;
    Ok(major)
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

/// A private directory for the Unix sockets of the servers an import or
/// an upgrade runs, short enough for a socket's path (107 bytes: a
/// workdir's path may be longer), removed when dropped.
pub(crate) struct SocketDir(PathBuf);

impl SocketDir {
    /// A new one under the system's temporary directory, `user`'s alone.
    pub(crate) fn new(user: &str) -> Result<SocketDir> {
        // A random name (a new id's 128 random bits).
        let dir = std::env::temp_dir().join(format!("strata-sock-{}", TimelineId::generate()));
        super::layout::create_private_dir(&dir)?;
        let made = SocketDir(dir);
        give_to(&made.0, user)?;
        Ok(made)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The last lines of a server log.
pub(crate) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// `value` quoted for the single string of `pg_ctl -o`, which PostgreSQL
/// splits on spaces (a backslash escapes the next character).
pub(crate) fn shell_quote(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if c == ' ' || c == '\\' || c == '\'' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Sends the data directory to the tenant's pageserver as timeline
/// `timeline`, unless it holds that timeline already (an interrupted
/// import run again).
pub(crate) fn send(
    wd: &Workdir,
    tenant: TenantId,
    timeline: TimelineId,
    ready: &Ready,
    progress: &mut dyn Progress,
) -> Result<()> {
    super::controller::register(wd, tenant)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_ctl_options_keep_spaces_and_quotes_in_their_value() {
        assert_eq!(shell_quote("unix_socket_directories=/a b/c"), "unix_socket_directories=/a\\ b/c");
        assert_eq!(shell_quote("x='y'"), "x=\\'y\\'");
    }
}
