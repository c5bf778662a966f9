//! Detached service processes: spawning, pidfiles, liveness, stopping, logs.
//!
//! A pidfile alone is not proof: the process may have died and its pid been
//! reused. A process counts as ours only if it is alive (not a zombie) and
//! its command line is `<strata> <subcommand> … <marker> …`, where the
//! marker is the absolute config path or pgdata only that process uses.

use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{Error, Result};
use super::layout;
use crate::limits::{FAST_POLL, FAST_POLL_SPAN, KILL_WAIT, POLL};

/// How to recognise a process of ours: its subcommand and a unique argument.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `safekeeper`, `pageserver` or `compute`.
    pub subcommand: &'static str,
    /// An argument only this process has (its absolute config path or pgdata).
    pub marker: PathBuf,
    /// Where its pid is kept.
    pub pidfile: PathBuf,
}

impl Identity {
    /// The pid from the pidfile, if that process is still ours and alive.
    pub fn running(&self) -> Option<i32> {
        read_pid(&self.pidfile).filter(|&pid| self.is(pid))
    }

    /// Whether `pid` is alive and is this process.
    pub fn is(&self, pid: i32) -> bool {
        if !alive(pid) {
            return false;
        }
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { return false };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let marker = self.marker.as_os_str().as_encoded_bytes();
        args.get(1) == Some(&self.subcommand.as_bytes()) && args.contains(&marker)
    }

    /// Records a freshly spawned pid.
    pub fn write_pid(&self, pid: u32) -> Result<()> {
        layout::write_atomic(&self.pidfile, &format!("{pid}\n"))
    }

    /// Forgets the pid (the process is gone).
    pub fn remove_pidfile(&self) {
        let _ = fs::remove_file(&self.pidfile);
    }
}

/// Whether `pid` exists and is not a zombie (a dead child nobody reaped yet).
///
/// Every thread counts: a thread-group leader turns zombie before its other
/// threads have finished exiting, and those still hold the process's files
/// (its listening sockets among them) until they are gone.
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks.flatten().any(|task| running(&task.path().join("stat"))),
        Err(_) => running(Path::new(&format!("/proc/{pid}/stat"))),
    }
}

/// Whether the task whose `stat` file this is exists and is not a zombie.
fn running(stat: &Path) -> bool {
    let Ok(stat) = fs::read_to_string(stat) else { return false };
    // `pid (comm) S …`: the state follows the last ')' since comm may hold anything.
    match stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) {
        Some(state) => state != "Z" && state != "X",
        None => false,
    }
}

/// The command name (`comm`) of a live process.
pub fn comm(pid: i32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    Some(stat.get(open + 1..close)?.to_string())
}

/// The pid in a pidfile (first line), if there is one.
pub fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.lines().next()?.trim().parse().ok().filter(|&p: &i32| p > 0)
}

/// Starts `exe args…` detached from the caller: in a new session (no
/// controlling terminal, its own process group, so it outlives the command
/// and terminal signals do not reach it), stdin from /dev/null, stdout and
/// stderr appended to `log`.
pub fn spawn(exe: &Path, args: &[&OsStr], log: &Path, cwd: &Path) -> Result<Child> {
    let open_log = || {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::Failed(format!("{}: {e}", log.display())))
    };
    let out = open_log()?;
    let err = open_log()?;
    let mut cmd = Command::new(exe);
    cmd.args(args).current_dir(cwd).stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| Error::Failed(format!("running {}: {e}", exe.display())))
}

/// How a process ended when asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It exited after SIGTERM within the grace period.
    Clean,
    /// It had to be killed with SIGKILL.
    Killed,
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory effects; errors (already gone) are fine.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Stops our process `pid`: SIGTERM and up to `grace` for it to exit, then
/// SIGKILL to its whole process group (what it started dies with it). With
/// `immediate`, SIGKILL at once.
pub fn terminate(id: &Identity, pid: i32, grace: Duration, immediate: bool) -> Result<Stopped> {
    if !id.is(pid) {
        return Ok(Stopped::Clean);
    }
    // From here on the wait is for the pid itself, not for its identity: a
    // dying process loses its command line (its memory goes first) while it
    // still exists, and nobody else can have its pid before it is gone.
    if !immediate {
        signal(pid, libc::SIGTERM);
        if wait_gone(|| alive(pid), grace) {
            return Ok(Stopped::Clean);
        }
    }
    kill_group(pid);
    if wait_gone(|| alive(pid), KILL_WAIT) {
        Ok(Stopped::Killed)
    } else {
        Err(Error::Failed(format!("pid {pid} is still alive {}s after SIGKILL", KILL_WAIT.as_secs())))
    }
}

/// SIGKILL to `pid`, and to its process group if it leads one (it was
/// spawned with `setsid`), so that no child of it lingers.
pub fn kill_group(pid: i32) {
    // SAFETY: getpgid(2) only reads.
    if unsafe { libc::getpgid(pid) } == pid {
        signal(-pid, libc::SIGKILL);
    }
    signal(pid, libc::SIGKILL);
}

/// Sends `sig` to a process.
pub fn send(pid: i32, sig: libc::c_int) {
    signal(pid, sig);
}

/// Polls until `alive()` is false, at most `limit`; true if it went away.
pub fn wait_gone(alive: impl Fn() -> bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut poll = Poll::new();
    loop {
        if !alive() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        poll.pause();
    }
}

/// The pauses of a wait for a process or a service: every [`FAST_POLL`]
/// at first, since most such waits end within a few hundred milliseconds
/// and a command waits on each (a check is a few reads of `/proc` or one
/// local request), then every [`POLL`] (or the wait's own interval).
pub struct Poll {
    began: Instant,
    then: Duration,
}

impl Poll {
    pub fn new() -> Poll {
        Poll::every(POLL)
    }

    /// Fast at first, then every `then`.
    pub fn every(then: Duration) -> Poll {
        Poll { began: Instant::now(), then }
    }

    /// Sleeps until the next check is due.
    pub fn pause(&mut self) {
        let fast = self.began.elapsed() < FAST_POLL_SPAN;
        std::thread::sleep(if fast { FAST_POLL.min(self.then) } else { self.then });
    }
}

impl Default for Poll {
    fn default() -> Poll {
        Poll::new()
    }
}

/// The current length of a log, to show later only what a new run wrote.
pub fn log_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The last `lines` lines a log got after byte `from`, indented for an error message.
pub fn log_tail(path: &Path, from: u64, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        // Only the end matters; never read a huge log whole.
        let start = from.max(len.saturating_sub(64 * 1024));
        if f.seek(SeekFrom::Start(start)).is_ok() {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    let all: Vec<&str> = text.lines().collect();
    if all.is_empty() {
        return format!("  ({} has nothing new)", path.display());
    }
    let shown = &all[all.len().saturating_sub(lines)..];
    let mut out = format!("  last lines of {}:", path.display());
    for l in shown {
        out.push_str("\n    ");
        out.push_str(l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_its_own_process() {
        let dir = std::env::temp_dir().join(format!("strata-process-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("marker");
        let log = dir.join("log");
        // `sleep` stands in for a service: argv[1] is the "subcommand".
        let mut child =
            spawn(Path::new("/bin/sh"), &[OsStr::new("-c"), OsStr::new("sleep 30"), marker.as_os_str()], &log, &dir)
                .unwrap();
        let pid = child.id() as i32;
        let id = Identity { subcommand: "-c", marker: marker.clone(), pidfile: dir.join("pid") };
        assert_eq!(id.running(), None, "no pidfile yet");
        id.write_pid(child.id()).unwrap();
        assert_eq!(id.running(), Some(pid));
        let other = Identity { subcommand: "-c", marker: dir.join("other"), pidfile: dir.join("pid") };
        assert_eq!(other.running(), None, "another marker is another process");
        // New session: the child leads its own process group.
        assert_eq!(unsafe { libc::getpgid(pid) }, pid);

        // A dead but unreaped child (zombie) is not running.
        kill_group(pid);
        assert!(wait_gone(|| id.is(pid), Duration::from_secs(5)));
        assert_eq!(id.running(), None);
        child.wait().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn terminate_escalates_and_tail_shows_new_lines() {
        let dir = std::env::temp_dir().join(format!("strata-process-t-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        fs::write(&log, "old line\n").unwrap();
        let from = log_len(&log);
        let marker = dir.join("m");
        // Ignores SIGTERM, so only SIGKILL ends it.
        let script = "trap '' TERM; echo hello; echo world; while :; do sleep 0.1; done";
        let child =
            spawn(Path::new("/bin/sh"), &[OsStr::new("-c"), OsStr::new(script), marker.as_os_str()], &log, &dir)
                .unwrap();
        let id = Identity { subcommand: "-c", marker, pidfile: dir.join("pid") };
        let pid = child.id() as i32;
        // Reap it in the background, as init would for a detached service.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(terminate(&id, pid, Duration::from_millis(500), false).unwrap(), Stopped::Killed);
        let tail = log_tail(&log, from, 1);
        assert!(tail.contains("world") && !tail.contains("hello") && !tail.contains("old"), "{tail}");
        assert!(log_tail(&dir.join("none"), 0, 5).contains("nothing new"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
