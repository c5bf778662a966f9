//! Running PostgreSQL programs as an unprivileged user: PostgreSQL refuses
//! to run as root, and the pageserver may be started as root.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The uid and gid of a user, from the system's user database.
pub fn lookup(user: &str) -> Result<(u32, u32), String> {
    let name = std::ffi::CString::new(user).map_err(|_| format!("bad user name {user:?}"))?;
    // SAFETY: getpwnam returns a pointer into static storage or null; the
    // fields are copied out before any other call can overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(format!("user {user:?} does not exist"));
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok((uid, gid))
}

/// When running as root, makes `cmd` run as `user` and gives `dir` to that user.
pub fn run_as(cmd: &mut Command, dir: &Path, user: &str) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let (uid, gid) = lookup(user)?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|e| format!("{}: {e}", dir.display()))?;
    cmd.uid(uid).gid(gid);
    Ok(())
}
