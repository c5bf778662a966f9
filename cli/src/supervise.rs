//! `strata supervise` (hidden, internal): runs one service of the local
//! cluster as its child and starts it again whenever it exits, paced by the
//! same backoff and crash-loop policy the compute agent uses for PostgreSQL.
//!
//! One supervisor per service, like runit's `runsv`: it writes the
//! service's pid to the service's pidfile at every start, its own pid to the
//! supervisor pidfile, and its state (restarts, last exit, crash loop) to a
//! JSON file next to them. Its output, and the service's, go to the
//! service's log. On SIGTERM or SIGINT it forwards SIGTERM to the service,
//! waits up to the grace period, SIGKILLs the service's process group if it
//! is still there, removes the pidfiles and exits. If the supervisor itself
//! is killed, the service keeps running on its own. A compute agent that
//! exits with `FENCED`, `SUSPENDED` or `SOURCE_ENDED` is not started again: the supervisor
//! records why and exits.

use crate::out::errln;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use strata_compute::agent::restart::{random_jitter, RestartPolicy, RestartTracker};
use strata_compute::agent::{exit, suspend};
use strata_control_plane::supervisor_state::{unix_now, SupervisorState};
use strata_service::durable::replace_file;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::{error, info, warn};

/// `strata supervise …`.
#[derive(Args, Debug)]
pub struct SuperviseArgs {
    /// The service's name, for the log.
    #[arg(long)]
    name: String,
    /// Where the service's pid is written while it runs.
    #[arg(long)]
    pidfile: PathBuf,
    /// Where this supervisor's pid is written.
    #[arg(long)]
    supervisor_pidfile: PathBuf,
    /// The state file (JSON), rewritten atomically at every change.
    #[arg(long)]
    state: PathBuf,
    /// On SIGTERM: how long the service gets to exit before it is killed.
    #[arg(long, default_value_t = crate::limits::DEFAULT_GRACE_SECS)]
    grace_secs: u64,
    /// A compute agent's suspension marker (`strata_compute::agent::suspend`):
    /// when the agent exits with `SUSPENDED`, the idle time it names goes
    /// into the state's `last_exit`.
    #[arg(long, value_name = "FILE")]
    suspend_marker: Option<PathBuf>,
    /// The service's command line (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<OsString>,
}

/// Removes a pidfile if it still names `pid` (a newer process may own it).
fn remove_pidfile_of(path: &Path, pid: u32) {
    let names = std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse::<u32>().ok());
    if names == Some(pid) {
        let _ = std::fs::remove_file(path);
    }
}

/// `strata supervise`: the exit code.
pub fn run(args: SuperviseArgs) -> i32 {
    crate::logging::init();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            errln!("strata supervise: starting a runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(Supervisor::new(args).run()) {
        Ok(()) => 0,
        Err(e) => {
            error!("supervisor: {e}");
            1
        }
    }
}

/// SIGTERM or SIGINT (a stop); SIGHUP is logged and otherwise ignored.
struct StopSignals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves at the first SIGTERM or SIGINT, with its name.
    async fn next(&mut self) -> &'static str {
        loop {
            tokio::select! {
                _ = self.term.recv() => return "SIGTERM",
                _ = self.int.recv() => return "SIGINT",
                _ = self.hup.recv() => info!("supervisor: SIGHUP ignored"),
            }
        }
    }
}

struct Supervisor {
    args: SuperviseArgs,
    state: SupervisorState,
    tracker: RestartTracker,
}

impl Supervisor {
    fn new(args: SuperviseArgs) -> Supervisor {
        let state = SupervisorState {
            name: args.name.clone(),
            supervisor_pid: std::process::id(),
            state: "starting".into(),
            ..Default::default()
        };
        Supervisor { args, state, tracker: RestartTracker::new(RestartPolicy::default()) }
    }

    async fn run(mut self) -> Result<(), String> {
        let mut signals = StopSignals::install().map_err(|e| format!("installing signal handlers: {e}"))?;
        let me = std::process::id();
        replace_file(&self.args.supervisor_pidfile, format!("{me}\n").as_bytes(), true)
            .map_err(|e| format!("{}: {e}", self.args.supervisor_pidfile.display()))?;
        let name = self.args.name.clone();
        info!(pid = me, "supervisor: starting {}", self.command_text());
        loop {
            let began = Instant::now();
            let cause = match self.spawn() {
                Ok(mut child) => {
                    let pid = child.id().unwrap_or(0);
                    // The state file first, then the pidfile: whoever sees the
                    // new pid in the pidfile (`strata status`) then also finds
                    // the state naming it, never the "restarting" one before.
                    self.state.child_pid = Some(pid);
                    self.state.state = "running".into();
                    self.save();
                    if let Err(e) = replace_file(&self.args.pidfile, format!("{pid}\n").as_bytes(), true) {
                        warn!("supervisor: writing {}: {e}", self.args.pidfile.display());
                    }
                    info!("supervisor: {name} runs (pid {pid})");
                    tokio::select! {
                        status = child.wait() => {
                            remove_pidfile_of(&self.args.pidfile, pid);
                            match status {
                                Ok(status) => match self.final_exit(status) {
                                    Some(last_exit) => {
                                        self.state.last_exit = Some(last_exit);
                                        self.state.last_exit_at = Some(unix_now());
                                        return self.finish(None);
                                    }
                                    None => exit::describe(status),
                                },
                                Err(e) => format!("lost track of it: {e}"),
                            }
                        }
                        sig = signals.next() => {
                            info!("supervisor: {sig}: stopping {name} (pid {pid})");
                            let how = self.stop_child(&mut child, pid).await;
                            return self.finish(Some(how));
                        }
                    }
                }
                Err(e) => format!("could not be started: {e}"),
            };
            let uptime = began.elapsed();
            let delay = self.tracker.failed(uptime, random_jitter());
            let now = Instant::now();
            self.tracker.restarting(now);
            let crash_loop_until = self.tracker.crash_loop_until(now);
            self.state.child_pid = None;
            self.state.state = "restarting".into();
            self.state.restarts = self.tracker.total();
            self.state.last_exit = Some(cause.clone());
            self.state.last_exit_at = Some(unix_now());
            self.state.crash_loop = crash_loop_until.is_some();
            self.state.crash_loop_until =
                crash_loop_until.map(|until| unix_now() + until.saturating_duration_since(now).as_secs());
            self.save();
            warn!(
                "supervisor: {name} exited ({cause}) after {:.1} s; restart {} in {} ms",
                uptime.as_secs_f64(),
                self.state.restarts,
                delay.as_millis()
            );
            if self.state.crash_loop {
                let p = self.tracker.policy();
                error!(
                    "supervisor: crash loop: {} restarts within {} s; restarting at most every {} s",
                    p.crash_loop_restarts,
                    p.crash_loop_window.as_secs(),
                    p.max_delay.as_secs()
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                sig = signals.next() => {
                    info!("supervisor: {sig} while waiting to restart {name}: stopping");
                    return self.finish(None);
                }
            }
        }
    }

    /// An exit after which the service is not started again, and how the
    /// state names it: a writer another took the branch from (starting it
    /// again would take the branch back), or a compute that suspended
    /// itself (the next `strata endpoint start` wakes it). Any other exit
    /// (a kill -9 while suspending among them) is followed by a restart.
    fn final_exit(&self, status: std::process::ExitStatus) -> Option<String> {
        let name = &self.args.name;
        match status.code() {
            Some(exit::FENCED) => {
                warn!(
                    "supervisor: {name} was fenced (another writer, or a site failover's seal); not starting it again"
                );
                Some("fenced: another writer took the branch, or a site failover sealed it".into())
            }
            Some(exit::SUSPENDED) => {
                let marker = self.args.suspend_marker.as_deref().and_then(suspend::read_marker);
                let why = match marker {
                    Some(m) => format!("suspended after {} s idle", m.idle_secs),
                    None => "suspended".to_string(),
                };
                info!("supervisor: {name} {why}; not starting it again");
                Some(why)
            }
            Some(exit::SOURCE_ENDED) => {
                info!("supervisor: {name}: the WAL it followed ended; not starting it again");
                Some("the WAL it followed ended".into())
            }
            _ => None,
        }
    }

    fn command_text(&self) -> String {
        self.args.command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    }

    /// Starts the service in its own process group (so that it and what it
    /// starts can be killed together), its output going where ours goes.
    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        let (program, args) = self.args.command.split_first().expect("clap requires a command");
        tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()
    }

    /// SIGTERM, up to the grace period, then SIGKILL to the process group.
    /// Returns `clean` or `killed`.
    async fn stop_child(&mut self, child: &mut tokio::process::Child, pid: u32) -> &'static str {
        self.state.state = "stopping".into();
        self.save();
        let name = &self.args.name;
        let grace = Duration::from_secs(self.args.grace_secs);
        signal_pid(pid as i32, libc::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
            info!("supervisor: {name} stopped ({})", status.map(exit::describe).unwrap_or_else(|e| e.to_string()));
            return "clean";
        }
        warn!("supervisor: {name} did not stop within {} s; killing its process group", grace.as_secs());
        signal_pid(-(pid as i32), libc::SIGKILL);
        signal_pid(pid as i32, libc::SIGKILL);
        if tokio::time::timeout(crate::limits::KILL_WAIT, child.wait()).await.is_err() {
            error!("supervisor: {name} (pid {pid}) survived SIGKILL for {} s", crate::limits::KILL_WAIT.as_secs());
        }
        "killed"
    }

    /// Removes the pidfiles, records how the stop went, and ends.
    fn finish(mut self, stop: Option<&'static str>) -> Result<(), String> {
        if let Some(pid) = self.state.child_pid.take() {
            remove_pidfile_of(&self.args.pidfile, pid);
        }
        self.state.state = "stopped".into();
        self.state.stop = stop.map(str::to_string);
        self.save();
        remove_pidfile_of(&self.args.supervisor_pidfile, std::process::id());
        info!("supervisor: {} is stopped; exiting", self.args.name);
        Ok(())
    }

    /// Writes the state file; a failure is logged, not fatal.
    fn save(&self) {
        let text = serde_json::to_string_pretty(&self.state).expect("the state serializes");
        if let Err(e) = replace_file(&self.args.state, (text + "\n").as_bytes(), true) {
            warn!("supervisor: writing {}: {e}", self.args.state.display());
        }
    }
}

fn signal_pid(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory effects; errors (already gone) are fine.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_its_own_pidfile_is_removed() {
        let dir = std::env::temp_dir().join(format!("strata-supervise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("x.pid");
        std::fs::write(&pidfile, "42\n").unwrap();
        remove_pidfile_of(&pidfile, 43);
        assert!(pidfile.exists(), "another process's pidfile stays");
        remove_pidfile_of(&pidfile, 42);
        assert!(!pidfile.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
