//! A PostgreSQL left running in the data directory by an earlier agent
//! process that was killed before it could stop it. It cannot commit (its
//! synchronous standby died with that agent) and it holds the port and the
//! directory, so a starting agent stops it before restoring: an immediate
//! shutdown, then SIGKILL to whatever of it still runs in the directory.

use std::path::Path;
use std::time::Duration;

use strata_service::clock::Clock;

use tracing::{info, warn};

use super::postgres;

/// The pid of a PostgreSQL serving `pgdata`: `postmaster.pid` names a live
/// `postgres` process whose data directory (the pidfile's second line, and
/// its working directory where that can be read) is `pgdata`.
pub fn find(pgdata: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
    let mut lines = text.lines();
    let pid: i32 = lines.next()?.trim().parse().ok().filter(|&p: &i32| p > 0)?;
    let dir = Path::new(lines.next()?.trim());
    if !same_dir(dir, pgdata) || !postgres::is_live_postgres(pid) {
        return None;
    }
    // The postmaster runs in its data directory; another user's process may
    // not let us look, which leaves the pidfile's word.
    match std::fs::read_link(format!("/proc/{pid}/cwd")) {
        Ok(cwd) if !same_dir(&cwd, pgdata) => None,
        _ => Some(pid),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Stops the leftover server `pid` of `pgdata`: SIGQUIT (immediate
/// shutdown), SIGKILL if it is still there after a few seconds, then
/// SIGKILL to any of its processes still in the directory; each step is
/// bounded on `clock`.
pub async fn stop(pgdata: &Path, pid: i32, clock: &dyn Clock) -> Result<(), String> {
    warn!(pid, pgdata = %pgdata.display(), "a PostgreSQL left by an earlier agent runs in the data directory; stopping it");
    let started = clock.now();
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(pid, libc::SIGQUIT);
    }
    if !gone(pid, crate::limits::LEFTOVER_STEP_TIMEOUT, clock).await {
        warn!(pid, "PostgreSQL ignored the immediate shutdown; killing it");
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        if !gone(pid, crate::limits::LEFTOVER_STEP_TIMEOUT, clock).await {
            return Err(format!("PostgreSQL (pid {pid}) left in {} does not die", pgdata.display()));
        }
    }
    if !postgres::kill_processes_in(pgdata, crate::limits::LEFTOVER_STEP_TIMEOUT, clock).await {
        return Err(format!("processes of the PostgreSQL left in {} do not die", pgdata.display()));
    }
    info!(pid, seconds = clock.since(started).as_secs_f64(), "stopped the leftover PostgreSQL");
    Ok(())
}

/// Waits until `pid` is no longer a live postgres process, at most `timeout`.
async fn gone(pid: i32, timeout: Duration, clock: &dyn Clock) -> bool {
    let deadline = clock.now() + timeout;
    loop {
        if !postgres::is_live_postgres(pid) {
            return true;
        }
        if clock.now() >= deadline {
            return false;
        }
        clock.sleep(crate::limits::PROCESS_EXIT_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn finds_only_a_live_postgres_of_this_directory() {
        let dir = std::env::temp_dir().join(format!("strata-leftover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(find(&dir), None, "no pidfile");
        // This test process is alive but is no postgres.
        std::fs::write(dir.join("postmaster.pid"), format!("{}\n{}\n", std::process::id(), dir.display())).unwrap();
        assert_eq!(find(&dir), None);
        std::fs::write(dir.join("postmaster.pid"), "garbage\n").unwrap();
        assert_eq!(find(&dir), None);
        std::fs::write(dir.join("postmaster.pid"), "2147483646\n/elsewhere\n").unwrap();
        assert_eq!(find(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A stand-in for server processes: `sleep` copied to a file named
    /// `postgres` (so that is its command name), run in `dir`.
    fn fake_postgres_binary(dir: &Path) -> PathBuf {
        let exe = dir.join("bin").join("postgres");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        std::fs::copy("/bin/sleep", &exe).unwrap();
        exe
    }

    fn spawn_in(exe: &Path, dir: &Path) -> std::process::Child {
        // Another test forking while the copy was open for writing can make
        // exec fail with ETXTBSY for a moment.
        use std::os::unix::process::CommandExt;
        for _ in 0..50 {
            let mut cmd = std::process::Command::new(exe);
            cmd.arg("30").current_dir(dir);
            // A test run started in the background of a shell inherits an
            // ignored SIGQUIT; PostgreSQL sets its own handler, `sleep` does not.
            // SAFETY: signal() is async-signal-safe, as pre_exec requires.
            unsafe {
                cmd.pre_exec(|| {
                    libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                    Ok(())
                });
            }
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => std::thread::sleep(Duration::from_millis(20)),
                other => return other.unwrap(),
            }
        }
        panic!("{} stays busy", exe.display());
    }

    #[tokio::test]
    async fn stops_a_leftover_server_and_its_processes() {
        let dir = std::env::temp_dir().join(format!("strata-leftover-stop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        let exe = fake_postgres_binary(&dir);
        let mut server = spawn_in(&exe, &dir);
        let mut backend = spawn_in(&exe, &dir);
        let pid = server.id() as i32;
        std::fs::write(dir.join("postmaster.pid"), format!("{pid}\n{}\n", dir.display())).unwrap();
        let clock = strata_service::clock::SystemClock;
        let wait_live = clock.now();
        while !postgres::is_live_postgres(pid) && clock.since(wait_live) < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(find(&dir), Some(pid));
        assert_eq!(find(&std::env::temp_dir()), None, "another directory");
        let mut all = postgres::processes_in(&dir);
        all.sort();
        let mut expected = vec![pid, backend.id() as i32];
        expected.sort();
        assert_eq!(all, expected);

        stop(&dir, pid, &clock).await.unwrap();
        assert_eq!(postgres::processes_in(&dir), Vec::<i32>::new());
        assert_eq!(find(&dir), None);
        // SIGQUIT ended the server, SIGKILL the other one.
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(server.wait().unwrap().signal(), Some(libc::SIGQUIT));
        assert_eq!(backend.wait().unwrap().signal(), Some(libc::SIGKILL));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn directories_compare_by_identity() {
        let dir = std::env::temp_dir();
        assert!(same_dir(&dir, &dir.join(".")));
        assert!(!same_dir(&dir, Path::new("/nonexistent-strata")));
    }
}
