//! Thin wrappers over the system calls the standard library does not offer.
//! Each returns `io::Error` carrying the errno, which the file system hands
//! back to the kernel unchanged.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::TimeOrNow;

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Turns a `-1` return into the errno.
fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// truncate(2): sets the size of the file at `path`.
pub fn truncate(path: &Path, size: u64) -> io::Result<()> {
    let size = libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let path = cpath(path)?;
    // SAFETY: `path` is a valid NUL-terminated string.
    check(unsafe { libc::truncate(path.as_ptr(), size) })
}

/// What `set_times` changes: a path (not following a final symlink) or an open file.
pub enum Target<'a> {
    Path(&'a Path),
    File(&'a std::fs::File),
}

fn timespec(time: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match time {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as libc::time_t, d.subsec_nanos() as libc::c_long),
            // Before 1970: whole seconds down, nanoseconds up.
            Err(e) => {
                let d = e.duration();
                let (secs, nanos) = (d.as_secs() as libc::time_t, d.subsec_nanos() as libc::c_long);
                if nanos == 0 {
                    (-secs, 0)
                } else {
                    (-secs - 1, 1_000_000_000 - nanos)
                }
            }
        },
    };
    libc::timespec { tv_sec, tv_nsec }
}

/// utimensat(2) / futimens(2): sets the access and modification times;
/// `None` leaves a time as it is.
pub fn set_times(target: Target, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) -> io::Result<()> {
    let times = [timespec(atime), timespec(mtime)];
    match target {
        Target::Path(path) => {
            let path = cpath(path)?;
            // SAFETY: valid string and a two-element array, as utimensat expects.
            check(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
        }
        // SAFETY: an open descriptor and a two-element array.
        Target::File(file) => check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) }),
    }
}

/// Converts a `stat` time to a `SystemTime`.
pub fn system_time(secs: i64, nanos: i64) -> SystemTime {
    let nanos = nanos.clamp(0, 999_999_999) as u32;
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::new(0, nanos)
    }
}

/// renameat2(2) with RENAME_NOREPLACE: fails with EEXIST instead of replacing `to`.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (cpath(from)?, cpath(to)?);
    // SAFETY: valid strings; AT_FDCWD with absolute paths.
    check(unsafe {
        libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE)
    })
}

/// access(2) with the daemon's credentials.
pub fn access(path: &Path, mask: i32) -> io::Result<()> {
    let path = cpath(path)?;
    // SAFETY: valid string.
    check(unsafe { libc::access(path.as_ptr(), mask) })
}

/// statvfs(3) of the file system holding `path`.
pub fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let path = cpath(path)?;
    // SAFETY: all-zero is a valid statvfs, which the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid string and a valid out pointer.
    check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
    Ok(st)
}

/// fallocate(2) on an open file.
pub fn fallocate(file: &std::fs::File, mode: i32, offset: u64, length: u64) -> io::Result<()> {
    let einval = || io::Error::from_raw_os_error(libc::EINVAL);
    let offset = libc::off_t::try_from(offset).map_err(|_| einval())?;
    let length = libc::off_t::try_from(length).map_err(|_| einval())?;
    // SAFETY: an open descriptor.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) })
}

/// Frees the bytes `[offset, offset + length)` of `file`, which then read as
/// zeros; the file's size stays.
pub fn punch_hole(file: &std::fs::File, offset: u64, length: u64) -> io::Result<()> {
    fallocate(file, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, length)
}

/// Sets the process umask, returning the previous one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// The effective user and group ids.
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: these cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Detaches the mount at `path` lazily (umount2 with MNT_DETACH): it
/// disappears from the namespace now, and goes once nothing uses it.
pub fn detach(path: &Path) -> io::Result<()> {
    let path = cpath(path)?;
    // SAFETY: valid string.
    check(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) })
}

/// SIGTERM and SIGINT, blocked in the calling thread (and so in every thread
/// it starts later) so that `wait` receives them instead of the default
/// action killing the process with the file system still mounted.
pub struct StopSignals {
    set: libc::sigset_t,
}

impl StopSignals {
    /// Blocks SIGTERM and SIGINT; call before starting any thread.
    pub fn block() -> io::Result<StopSignals> {
        // SAFETY: sigset_t is plain data, initialised by sigemptyset; the
        // mask is changed for this thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            let ret = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if ret != 0 {
                return Err(io::Error::from_raw_os_error(ret));
            }
            Ok(StopSignals { set })
        }
    }

    /// Waits up to `timeout` for SIGTERM or SIGINT; returns it, or `None`.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid set and timeout; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        for (secs, nanos) in [(0, 0), (1_700_000_000, 123), (-1, 500_000_000), (-5, 0)] {
            let t = system_time(secs, nanos);
            let ts = timespec(Some(TimeOrNow::SpecificTime(t)));
            assert_eq!((ts.tv_sec, ts.tv_nsec), (secs, nanos), "{secs}.{nanos}");
        }
        assert_eq!(timespec(None).tv_nsec, libc::UTIME_OMIT);
        assert_eq!(timespec(Some(TimeOrNow::Now)).tv_nsec, libc::UTIME_NOW);
    }
}
