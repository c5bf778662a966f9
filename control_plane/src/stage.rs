//! A staging directory and the source major's PostgreSQL programs run on
//! it, for what makes a data directory to send to a pageserver: `strata
//! tenant import` (plain and streaming) and `strata branch upgrade`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use strata_formats::v15::control::ControlFile;
use strata_protocol::TimelineId;

use super::error::{failed, Error, Result};
use super::layout::Workdir;

/// A cleanly shut-down data directory to send.
pub struct Ready {
    pub pgdata: PathBuf,
    pub major: u32,
    /// The WAL files the import reads (the checkpoint record's), relative
    /// to the data directory.
    pub wal: Vec<String>,
    /// A streaming import's copy: its relay and follower start after the
    /// import (`follow`).
    pub follow: bool,
}

pub fn read_control(pgdata: &Path) -> Result<ControlFile> {
    let path = pgdata.join("global/pg_control");
    let bytes = std::fs::read(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    ControlFile::decode(&bytes).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))
}

/// The WAL segment files holding the last checkpoint record (it may cross
/// into the next segment), relative to the data directory.
pub fn checkpoint_wal(pgdata: &Path, control: &ControlFile) -> Vec<String> {
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
pub fn fresh_stage(stage: &Path, user: &str) -> Result<()> {
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
pub fn give_to(dir: &Path, user: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    run(Command::new("chown").arg("-R").arg(format!("{user}:")).arg("--").arg(dir), "giving the copy to its user")
}

/// When running as root: `cmd` runs as `user` (PostgreSQL refuses root).
pub fn as_user(cmd: &mut Command, user: &str) -> Result<()> {
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
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
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

/// Runs `sql` through psql (unaligned, tuples only, stopping at the first
/// error) on the server `connect` names (`--dbname CONNINFO`, or `-h`,
/// `-p`, ...), at most 10 s to connect; its rows, fields separated by `|`.
/// Errors name `server` and the statement.
pub fn psql_query(wd: &Workdir, server: &str, connect: &[&OsStr], sql: &str) -> Result<String> {
    let psql = wd.cluster.pg_bin_dir.join("psql");
    let out = Command::new(&psql)
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .args(connect)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Failed(format!("running {}: {e}", psql.display())))?;
    if !out.status.success() {
        return failed(format!("{server}: {sql}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `sql` on the server `conninfo` reaches ([`psql_query`]).
pub fn source_query(wd: &Workdir, conninfo: &str, sql: &str) -> Result<String> {
    psql_query(wd, "the source", &["--dbname".as_ref(), conninfo.as_ref()], sql)
}

/// The major of the PostgreSQL `conninfo` reaches.
pub fn server_major(wd: &Workdir, conninfo: &str) -> Result<u32> {
    let text = source_query(wd, conninfo, "SHOW server_version_num")?;
    let number: u32 = text.parse().map_err(|_| Error::Failed(format!("server_version_num {text:?}")))?;
    let major = number / 10_000;
    super::layout::check_pg_version(major)?;
    Ok(major)
}

/// A private directory for the Unix sockets of the servers an import or
/// an upgrade runs, short enough for a socket's path (107 bytes: a
/// workdir's path may be longer), removed when dropped.
pub struct SocketDir(PathBuf);

impl SocketDir {
    /// A new one under the system's temporary directory, `user`'s alone.
    pub fn new(user: &str) -> Result<SocketDir> {
        // A random name (a new id's 128 random bits).
        let dir = std::env::temp_dir().join(format!("strata-sock-{}", TimelineId::generate()));
        super::layout::create_private_dir(&dir)?;
        let made = SocketDir(dir);
        give_to(&made.0, user)?;
        Ok(made)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The last lines of a server log.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// `value` quoted for the single string of `pg_ctl -o`, which PostgreSQL
/// splits on spaces (a backslash escapes the next character).
pub fn shell_quote(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if c == ' ' || c == '\\' || c == '\'' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
