//! The PostgreSQL server process: started as the unprivileged PostgreSQL
//! user with its output in a log file, waited for until it accepts
//! connections, and stopped with a signal.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use strata_service::clock::{timeout, Clock};

use crate::clock::SharedClock;
use crate::limits::{IMMEDIATE_STOP_TIMEOUT, PROCESS_EXIT_POLL};
use crate::pg_replication::{ReplicationConfig, ReplicationConnection};

/// What the postmaster logs when a child crashed, or when it panics itself.
const CRASH_MARKERS: &[&str] =
    &["was terminated by signal", "was terminated by exception", "exited with exit code", "PANIC:"];

/// An operating-system user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Why the server could not be run.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    #[error("no operating-system user {0:?} to run PostgreSQL as")]
    NoSuchUser(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("PostgreSQL exited ({status}); the end of {log}:\n{tail}")]
    Exited { status: ExitStatus, log: String, tail: String },
    #[error(
        "PostgreSQL did not accept connections within {timeout:?} (last attempt: {last}); the end of {log}:\n{tail}"
    )]
    NotReady { timeout: Duration, last: String, log: String, tail: String },
    #[error("PostgreSQL did not stop within {0:?}")]
    NotStopped(Duration),
    #[error("PostgreSQL (pid {pid}) is still running from {pgdata}")]
    StillRunning { pid: i32, pgdata: String },
}

/// Looks up a user in the password database.
pub fn lookup_user(name: &str) -> Result<OsUser, PostgresError> {
    let c_name = CString::new(name).map_err(|_| PostgresError::NoSuchUser(name.to_string()))?;
    let mut buffer = vec![0u8; 16 << 10];
    // SAFETY: an all-zero passwd is a valid value to be filled in.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live, correctly sized memory for the
    // duration of the call; getpwnam_r is thread-safe.
    let rc =
        unsafe { libc::getpwnam_r(c_name.as_ptr(), &mut entry, buffer.as_mut_ptr().cast(), buffer.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return Err(PostgresError::NoSuchUser(name.to_string()));
    }
    Ok(OsUser { name: name.to_string(), uid: entry.pw_uid, gid: entry.pw_gid })
}

/// The user PostgreSQL runs as: `name` when this process is root (PostgreSQL
/// refuses to run as root), else `None` (this process's own user).
pub fn server_user(name: &str) -> Result<Option<OsUser>, PostgresError> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        lookup_user(name).map(Some)
    } else {
        Ok(None)
    }
}

/// Where the server's output goes: `postgres.log` next to the data directory.
pub fn log_path(pgdata: &Path) -> PathBuf {
    pgdata.parent().unwrap_or(Path::new("/")).join("postgres.log")
}

/// The last few KiB of the log (for error messages).
pub fn log_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(crate::limits::LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        f.take(crate::limits::LOG_TAIL_BYTES).read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_else(|e| format!("({}: {e})", path.display()))
}

/// The last crash report in the log after byte `from` (within the last
/// 64 KiB), without the line prefix and shortened.
pub fn crash_reason(path: &Path, from: u64) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = from.max(len.saturating_sub(crate::limits::LOG_REASON_BYTES));
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut bytes = Vec::new();
    f.take(crate::limits::LOG_REASON_BYTES).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().rev().find(|l| CRASH_MARKERS.iter().any(|m| l.contains(m)))?;
    // `2024-01-01 00:00:00.000 UTC [42] LOG:  server process …`: keep the message.
    let message = ["LOG:  ", "PANIC:  "].iter().find_map(|p| line.split_once(p).map(|(_, m)| m)).unwrap_or(line).trim();
    Some(message.chars().take(crate::limits::MAX_REASON_CHARS).collect())
}

/// Fails if `postmaster.pid` in `pgdata` names a live process: a server is
/// still running there and its directory must not be replaced.
pub fn check_not_running(pgdata: &Path) -> Result<(), PostgresError> {
    let Ok(text) = std::fs::read_to_string(pgdata.join("postmaster.pid")) else { return Ok(()) };
    let Some(pid) = text.lines().next().and_then(|l| l.trim().parse::<i32>().ok()) else { return Ok(()) };
    if pid <= 0 {
        return Ok(());
    }
    // SAFETY: signal 0 only checks that the process exists.
    let exists =
        unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A killed postmaster waiting to be reaped (a zombie) no longer runs.
    let alive = exists && !is_zombie(pid);
    if alive {
        return Err(PostgresError::StillRunning { pid, pgdata: pgdata.display().to_string() });
    }
    Ok(())
}

/// Whether `/proc` shows the process as a zombie (exited, not yet reaped).
fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat_fields(&stat).is_some_and(|f| f.state == "Z" || f.state == "X")
}

/// The fields of `/proc/PID/stat` used here.
struct StatFields<'a> {
    /// The command name (`comm`).
    comm: &'a str,
    state: &'a str,
}

fn stat_fields(stat: &str) -> Option<StatFields<'_>> {
    // `pid (comm) state …`: comm is in parentheses and may contain anything.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let comm = stat.get(open + 1..close)?;
    let state = stat.get(close + 1..)?.split_whitespace().next()?;
    Some(StatFields { comm, state })
}

/// Whether `pid` is a live (not zombie) process whose command name is `postgres`.
pub fn is_live_postgres(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat_fields(&stat).is_some_and(|f| f.comm == "postgres" && f.state != "Z" && f.state != "X")
}

/// The live `postgres` processes whose working directory is `pgdata`: a
/// server's postmaster and every process it started. (Each child of the
/// postmaster leads its own session, so no process group holds them all;
/// they all run in the data directory.)
pub fn processes_in(pgdata: &Path) -> Vec<i32> {
    let target = std::fs::canonicalize(pgdata).unwrap_or_else(|_| pgdata.to_path_buf());
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found: Vec<i32> = dir
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            is_live_postgres(pid) && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == target)
        })
        .collect();
    found.sort_unstable();
    found
}

/// SIGKILL to every process of [`processes_in`] `pgdata`, until none is
/// left (at most `timeout` of `clock`'s time). True if none is left. Only for a data
/// directory whose server has died or is being killed: a server started
/// there meanwhile would be killed too.
pub async fn kill_processes_in(pgdata: &Path, timeout: Duration, clock: &dyn Clock) -> bool {
    let deadline = clock.now() + timeout;
    loop {
        let pids = processes_in(pgdata);
        if pids.is_empty() {
            return true;
        }
        for pid in pids {
            // SAFETY: kill has no memory effects; a process that is gone gives ESRCH.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        if clock.now() >= deadline {
            return false;
        }
        clock.sleep(PROCESS_EXIT_POLL).await;
    }
}

/// A running `postgres` server, the child of this process.
#[derive(Debug)]
pub struct Postgres {
    child: tokio::process::Child,
    pid: i32,
    pgdata: PathBuf,
    log: PathBuf,
    /// Length of the log when this server was started: what follows is its own.
    log_start: u64,
    exited: Option<ExitStatus>,
    /// What its waits and timeouts are measured on.
    clock: SharedClock,
}

impl Postgres {
    /// Starts `{bin_dir}/postgres -D {pgdata}` as `user` (if given), in its
    /// own process group (a terminal's Ctrl-C reaches only the agent, which
    /// stops the server in order), output appended to `log`; its waits are
    /// timed on `clock`.
    pub fn spawn(
        bin_dir: &Path,
        pgdata: &Path,
        log: &Path,
        user: Option<&OsUser>,
        clock: SharedClock,
    ) -> Result<Postgres, PostgresError> {
        let io = |context: String| move |source| PostgresError::Io { context, source };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("opening the log {}", log.display())))?;
        let stderr = file.try_clone().map_err(io(format!("opening the log {}", log.display())))?;
        let log_start = file.metadata().map(|m| m.len()).unwrap_or(0);
        let binary = bin_dir.join("postgres");
        let mut cmd = tokio::process::Command::new(&binary);
        cmd.arg("-D")
            .arg(pgdata)
            .current_dir(pgdata)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(user) = user {
            // When a root parent sets the uid, the standard library also drops
            // supplementary groups.
            cmd.uid(user.uid).gid(user.gid).env("USER", &user.name).env("LOGNAME", &user.name);
        }
        let child = cmd.spawn().map_err(io(format!("starting {}", binary.display())))?;
        let pid = child.id().map(|p| p as i32).ok_or_else(|| PostgresError::Io {
            context: "starting PostgreSQL".into(),
            source: std::io::Error::other("the child exited at once"),
        })?;
        Ok(Postgres {
            child,
            pid,
            pgdata: pgdata.to_path_buf(),
            log: log.to_path_buf(),
            log_start,
            exited: None,
            clock,
        })
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    fn exited_error(&self, status: ExitStatus) -> PostgresError {
        PostgresError::Exited { status, log: self.log.display().to_string(), tail: log_tail(&self.log) }
    }

    /// Polls until a replication connection as `conn` succeeds (the server
    /// accepts connections and is out of startup), at most `timeout`.
    pub async fn wait_ready(&mut self, conn: &ReplicationConfig, timeout: Duration) -> Result<(), PostgresError> {
        let clock = self.clock.clone();
        let deadline = clock.now() + timeout;
        let mut pause = crate::limits::READY_FIRST_PAUSE;
        loop {
            if let Some(status) = self.try_wait()? {
                return Err(self.exited_error(status));
            }
            let last = match ReplicationConnection::connect(conn).await {
                Ok(mut c) => match c.identify_system().await {
                    Ok(_) => return Ok(()),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            if clock.now() + pause > deadline {
                return Err(PostgresError::NotReady {
                    timeout,
                    last,
                    log: self.log.display().to_string(),
                    tail: log_tail(&self.log),
                });
            }
            clock.sleep(pause).await;
            pause = (pause * 2).min(crate::limits::READY_MAX_PAUSE);
        }
    }

    /// The exit status if the server has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, PostgresError> {
        if self.exited.is_none() {
            self.exited = self
                .child
                .try_wait()
                .map_err(|source| PostgresError::Io { context: "waiting for PostgreSQL".into(), source })?;
        }
        Ok(self.exited)
    }

    /// Waits for the server to exit (cancel-safe).
    pub async fn wait(&mut self) -> Result<ExitStatus, PostgresError> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        let status = self
            .child
            .wait()
            .await
            .map_err(|source| PostgresError::Io { context: "waiting for PostgreSQL".into(), source })?;
        self.exited = Some(status);
        Ok(status)
    }

    /// Sends `signal` to the postmaster (nothing if it has exited).
    pub fn signal(&mut self, signal: libc::c_int) {
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: kill has no memory effects; the pid is our unreaped child.
        unsafe {
            libc::kill(self.pid, signal);
        }
    }

    /// The error for a server that exited when it should not have.
    pub fn unexpected_exit(&self, status: ExitStatus) -> PostgresError {
        self.exited_error(status)
    }

    /// One line on why the server exited: its exit status, and the crash
    /// this server logged last, if it logged one (`server process (PID 7)
    /// was terminated by signal 9: Killed`).
    pub fn exit_cause(&self, status: ExitStatus) -> String {
        let how = super::exit::describe(status);
        match crash_reason(&self.log, self.log_start) {
            Some(reason) => format!("PostgreSQL exited ({how}): {reason}"),
            None => format!("PostgreSQL exited ({how})"),
        }
    }

    /// Stops the server: fast shutdown (SIGINT), then after `timeout` an
    /// immediate one (SIGQUIT), then SIGKILL. Returns its exit status.
    pub async fn stop(&mut self, limit: Duration) -> Result<ExitStatus, PostgresError> {
        self.signal(libc::SIGINT);
        let clock = self.clock.clone();
        if let Ok(status) = timeout(&*clock, limit, self.wait()).await {
            return status;
        }
        self.stop_immediately().await?;
        Err(PostgresError::NotStopped(limit))
    }

    /// Ends the server and everything it started: an immediate shutdown if
    /// the postmaster still runs, then SIGKILL to every postgres process
    /// left in the data directory (backends that have not noticed a dead
    /// postmaster yet, which could still write into it). Bounded.
    pub async fn stop_everything(&mut self) -> Result<ExitStatus, PostgresError> {
        let status = match self.try_wait()? {
            Some(status) => status,
            None => self.stop_immediately().await?,
        };
        if !kill_processes_in(&self.pgdata, IMMEDIATE_STOP_TIMEOUT, &*self.clock).await {
            return Err(PostgresError::Io {
                context: format!("killing the processes left by PostgreSQL in {}", self.pgdata.display()),
                source: std::io::Error::other(format!("still running after {IMMEDIATE_STOP_TIMEOUT:?}")),
            });
        }
        Ok(status)
    }

    /// Immediate shutdown (SIGQUIT), then SIGKILL if that does not end it.
    pub async fn stop_immediately(&mut self) -> Result<ExitStatus, PostgresError> {
        tracing::warn!(pid = self.pid, "stopping PostgreSQL immediately");
        self.signal(libc::SIGQUIT);
        let clock = self.clock.clone();
        if let Ok(status) = timeout(&*clock, IMMEDIATE_STOP_TIMEOUT, self.wait()).await {
            return status;
        }
        self.signal(libc::SIGKILL);
        timeout(&*clock, IMMEDIATE_STOP_TIMEOUT, self.wait())
            .await
            .map_err(|_| PostgresError::NotStopped(IMMEDIATE_STOP_TIMEOUT * 2))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_up_users() {
        let root = lookup_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(matches!(lookup_user("no-such-user-strata"), Err(PostgresError::NoSuchUser(_))));
        assert!(matches!(lookup_user("a\0b"), Err(PostgresError::NoSuchUser(_))));
    }

    #[test]
    fn log_next_to_the_data_directory() {
        assert_eq!(log_path(Path::new("/srv/ep/main/pgdata")), Path::new("/srv/ep/main/postgres.log"));
    }

    #[test]
    fn log_tail_is_bounded() {
        let path = std::env::temp_dir().join(format!("strata-logtail-{}", std::process::id()));
        std::fs::write(&path, format!("{}\nTHE END\n", "x".repeat(10_000))).unwrap();
        let tail = log_tail(&path);
        assert!(tail.len() <= crate::limits::LOG_TAIL_BYTES as usize && tail.ends_with("THE END\n"));
        std::fs::remove_file(&path).unwrap();
        assert!(log_tail(&path).contains("No such file"));
    }

    #[test]
    fn crash_reasons_come_from_this_run_only() {
        let path = std::env::temp_dir().join(format!("strata-crash-reason-{}", std::process::id()));
        let old = "2024-01-01 00:00:00.000 UTC [7] LOG:  server process (PID 9) was terminated by signal 11: Segmentation fault\n";
        std::fs::write(&path, old).unwrap();
        assert!(crash_reason(&path, 0).unwrap().starts_with("server process (PID 9) was terminated by signal 11"));
        let from = old.len() as u64;
        assert_eq!(crash_reason(&path, from), None, "an earlier server's crash is not this one's");
        let new = "2024-01-01 00:00:01.000 UTC [8] LOG:  server process (PID 12) was terminated by signal 9: Killed\n\
                   2024-01-01 00:00:01.001 UTC [8] LOG:  terminating any other active server processes\n\
                   2024-01-01 00:00:01.002 UTC [8] LOG:  shutting down because restart_after_crash is off\n";
        std::fs::write(&path, format!("{old}{new}")).unwrap();
        assert_eq!(
            crash_reason(&path, from).as_deref(),
            Some("server process (PID 12) was terminated by signal 9: Killed")
        );
        std::fs::write(&path, format!("{old}PANIC:  could not write {}\n", "x".repeat(1000))).unwrap();
        assert_eq!(crash_reason(&path, from).unwrap().chars().count(), crate::limits::MAX_REASON_CHARS);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(crash_reason(&path, 0), None);
    }

    #[test]
    fn detects_a_running_server() {
        let dir = std::env::temp_dir().join(format!("strata-pidcheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        check_not_running(&dir).unwrap();
        std::fs::write(dir.join("postmaster.pid"), format!("{}\n{}\n", std::process::id(), dir.display())).unwrap();
        assert!(matches!(check_not_running(&dir), Err(PostgresError::StillRunning { .. })));
        // A pid that cannot be running (beyond pid_max).
        std::fs::write(dir.join("postmaster.pid"), "2147483646\n").unwrap();
        check_not_running(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
