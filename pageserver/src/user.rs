//! Running PostgreSQL programs as an unprivileged user: PostgreSQL refuses
//! to run as root, and the pageserver may be started as root.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Why a program could not be set up to run as a user.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user {0:?} does not exist")]
    NoSuchUser(String),
    #[error("giving {} to {user}: {source}", path.display())]
    Chown {
        user: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The uid and gid of a user, from the system's user database.
pub fn lookup(user: &str) -> Result<(u32, u32), UserError> {
    let name = std::ffi::CString::new(user).map_err(|_| UserError::NoSuchUser(user.to_string()))?;
    // SAFETY: getpwnam returns a pointer into static storage or null; the
    // fields are copied out before any other call can overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(UserError::NoSuchUser(user.to_string()));
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok((uid, gid))
}

/// When running as root, makes `cmd` run as `user` and gives `dir` to that user.
pub fn run_as(cmd: &mut Command, dir: &Path, user: &str) -> Result<(), UserError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let (uid, gid) = lookup(user)?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|source| UserError::Chown {
        user: user.to_string(),
        path: dir.to_path_buf(),
        source,
    })?;
    cmd.uid(uid).gid(gid);
    Ok(())
}
