//! A service of the local cluster under its supervisor (`strata
//! supervise`): spawning the pair, telling whether the service runs, is
//! being restarted or is stopped, reading the supervisor's state, and
//! stopping both so that nothing is left behind.
//!
//! The service's pidfile always holds the service's own pid (the
//! supervisor rewrites it at every restart); `<name>.supervisor.pid` holds
//! the supervisor's. Both are recognised by their command lines
//! (`process::Identity`): the supervisor's has the service's command line,
//! marker included, after its own options.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use super::error::{Error, Result};
use super::process::{self, Identity, Stopped};
use crate::limits::{LEFTOVER_GRACE, SUPERVISOR_MARGIN};
use crate::supervisor_state::{unix_now, SupervisorState};

/// A supervised service: the service process and its supervisor.
#[derive(Clone, Debug)]
pub struct Supervised {
    /// How messages name it (`sk1`, `endpoint ep1`).
    pub label: String,
    /// The service process.
    pub service: Identity,
    /// Its supervisor.
    pub supervisor: Identity,
    /// The supervisor's state file.
    pub state_file: PathBuf,
    /// Where both write their output.
    pub log: PathBuf,
    /// How long the service gets to stop after SIGTERM.
    pub grace: Duration,
    /// A compute agent's suspension marker, handed to the supervisor so
    /// that its state names the idle time of a suspension.
    pub suspend_marker: Option<PathBuf>,
}

/// Whether the service runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The service runs; with its supervisor's pid unless that was killed.
    Running {
        pid: i32,
        supervisor: Option<i32>,
    },
    /// The supervisor runs and the service does not: it is about to be
    /// started again (or is failing to start: see the state's `last_exit`).
    Restarting {
        supervisor: i32,
    },
    Stopped,
}

impl Liveness {
    /// `running`, `restarting` or `stopped`.
    pub fn name(self) -> &'static str {
        match self {
            Liveness::Running { .. } => "running",
            Liveness::Restarting { .. } => "restarting",
            Liveness::Stopped => "stopped",
        }
    }

    pub fn pid(self) -> Option<i32> {
        match self {
            Liveness::Running { pid, .. } => Some(pid),
            _ => None,
        }
    }

    pub fn supervisor(self) -> Option<i32> {
        match self {
            Liveness::Running { supervisor, .. } => supervisor,
            Liveness::Restarting { supervisor } => Some(supervisor),
            Liveness::Stopped => None,
        }
    }
}

/// What the supervisor reports, as `strata status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restarts {
    pub restarts: u64,
    pub last_exit: Option<String>,
    pub last_exit_at: Option<u64>,
    pub crash_loop: bool,
}

/// How a stop went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopOutcome {
    NotRunning,
    /// A suspended endpoint: nothing runs, and it stays suspended (the
    /// next start wakes it).
    Suspended,
    /// The service (pid) ended: cleanly, or killed.
    Stopped {
        pid: Option<i32>,
        how: Stopped,
    },
}

/// The supervisor pidfile next to a service pidfile: `x.pid` → `x.supervisor.pid`.
pub fn supervisor_pidfile(pidfile: &Path) -> PathBuf {
    sibling(pidfile, "supervisor.pid")
}

/// The state file next to a service pidfile: `x.pid` → `x.supervisor.json`.
pub fn state_file(pidfile: &Path) -> PathBuf {
    sibling(pidfile, "supervisor.json")
}

fn sibling(pidfile: &Path, suffix: &str) -> PathBuf {
    let stem = pidfile.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    pidfile.with_file_name(format!("{stem}.{suffix}"))
}

impl Supervised {
    /// The supervised form of `service`, whose output goes to `log`.
    pub fn new(label: impl Into<String>, service: Identity, log: PathBuf, grace: Duration) -> Supervised {
        let supervisor = Identity {
            subcommand: "supervise",
            marker: service.marker.clone(),
            pidfile: supervisor_pidfile(&service.pidfile),
        };
        let state_file = state_file(&service.pidfile);
        Supervised { label: label.into(), service, supervisor, state_file, log, grace, suspend_marker: None }
    }

    /// Whether the service runs, or its supervisor is restarting it.
    pub fn liveness(&self) -> Liveness {
        let supervisor = self.supervisor.running();
        match (self.service.running(), supervisor) {
            (Some(pid), supervisor) => Liveness::Running { pid, supervisor },
            (None, Some(supervisor)) => Liveness::Restarting { supervisor },
            (None, None) => Liveness::Stopped,
        }
    }

    /// The running supervisor's state file.
    pub fn state(&self) -> Option<SupervisorState> {
        self.supervisor.running()?;
        SupervisorState::load(&self.state_file)
    }

    /// The state file the last supervisor left, whether or not it runs (one
    /// that stopped for good after a suspension wrote how it ended there).
    pub fn last_state(&self) -> Option<SupervisorState> {
        SupervisorState::load(&self.state_file)
    }

    /// The restarts the running supervisor reports (zeros without one).
    pub fn restarts(&self) -> Restarts {
        match self.state() {
            Some(st) => Restarts {
                restarts: st.restarts,
                crash_loop: st.crash_loop_at(unix_now()),
                last_exit: st.last_exit,
                last_exit_at: st.last_exit_at,
            },
            None => Restarts::default(),
        }
    }

    /// Spawns the supervisor (detached, see `process::spawn`), which spawns
    /// `exe service_args…`. Returns the supervisor's child handle.
    pub fn spawn(&self, exe: &Path, service_args: &[&OsStr], cwd: &Path) -> Result<Child> {
        // A state file left by a supervisor that was killed is not this one's.
        let _ = std::fs::remove_file(&self.state_file);
        let mut args: Vec<OsString> = vec![
            "supervise".into(),
            "--name".into(),
            self.label.clone().into(),
            "--pidfile".into(),
            self.service.pidfile.clone().into(),
            "--supervisor-pidfile".into(),
            self.supervisor.pidfile.clone().into(),
            "--state".into(),
            self.state_file.clone().into(),
            "--grace-secs".into(),
            self.grace.as_secs().to_string().into(),
        ];
        if let Some(marker) = &self.suspend_marker {
            args.extend(["--suspend-marker".into(), marker.clone().into()]);
        }
        args.extend(["--".into(), exe.into()]);
        args.extend(service_args.iter().map(|a| a.to_os_string()));
        let args: Vec<&OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let child = process::spawn(exe, &args, &self.log, cwd)?;
        self.supervisor.write_pid(child.id())?;
        Ok(child)
    }

    /// While a start waits for the service to be ready: why it failed, if
    /// it did (the supervisor is gone, or the service exited once already).
    pub fn start_failure(&self, supervisor: &mut Child) -> Option<String> {
        if let Ok(Some(status)) = supervisor.try_wait() {
            return Some(format!("its supervisor exited ({status})"));
        }
        let st = SupervisorState::load(&self.state_file)?;
        (st.restarts > 0).then(|| {
            format!("exited during start-up ({})", st.last_exit.as_deref().unwrap_or("no exit status recorded"))
        })
    }

    /// Stops the supervisor and the service, whatever runs of the two.
    /// Gracefully: SIGTERM to the supervisor, which stops the service within
    /// the grace period; `immediate`: SIGKILL to both. Nothing is left.
    pub fn stop(&self, immediate: bool) -> Result<StopOutcome> {
        let fail = |e: Error| Error::Failed(format!("{}: {e}", self.label));
        let supervisor = self.supervisor.running();
        let mut service = self.service.running();
        if supervisor.is_none() && service.is_none() {
            self.remove_files();
            return Ok(StopOutcome::NotRunning);
        }
        let mut how = Stopped::Clean;
        if let Some(sup) = supervisor {
            if immediate {
                // First the supervisor, so that it cannot start the service again.
                process::terminate(&self.supervisor, sup, Duration::ZERO, true).map_err(fail)?;
                how = Stopped::Killed;
            } else {
                // It stops the service (SIGTERM, grace, SIGKILL) and records how.
                match process::terminate(&self.supervisor, sup, self.grace + SUPERVISOR_MARGIN, false).map_err(fail)? {
                    Stopped::Clean => {
                        if SupervisorState::load(&self.state_file).and_then(|s| s.stop).as_deref() == Some("killed") {
                            how = Stopped::Killed;
                        }
                    }
                    Stopped::Killed => how = Stopped::Killed,
                }
            }
            // The service as the supervisor last recorded it (it may have
            // been started again just before the stop).
            service = service.or_else(|| process::read_pid(&self.service.pidfile));
        }
        // The service outlived its supervisor (killed, or never there).
        if let Some(pid) = self.service.running() {
            let grace = if supervisor.is_some() { LEFTOVER_GRACE } else { self.grace };
            match process::terminate(&self.service, pid, grace, immediate).map_err(fail)? {
                Stopped::Clean if supervisor.is_none() => how = Stopped::Clean,
                Stopped::Clean => {}
                Stopped::Killed => how = Stopped::Killed,
            }
            service = Some(pid);
        }
        self.remove_files();
        Ok(StopOutcome::Stopped { pid: service, how })
    }

    /// The service runs without a supervisor (it was killed): stops the
    /// service, so that a new supervisor can start it. Returns its pid.
    pub fn stop_unsupervised(&self) -> Result<Option<i32>> {
        if self.supervisor.running().is_some() {
            return Ok(None);
        }
        let Some(pid) = self.service.running() else { return Ok(None) };
        process::terminate(&self.service, pid, self.grace, false)
            .map_err(|e| Error::Failed(format!("{}: {e}", self.label)))?;
        self.service.remove_pidfile();
        Ok(Some(pid))
    }

    fn remove_files(&self) {
        self.service.remove_pidfile();
        self.supervisor.remove_pidfile();
        let _ = std::fs::remove_file(&self.state_file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_next_to_the_pidfile() {
        assert_eq!(supervisor_pidfile(Path::new("/w/sk1/sk1.pid")), Path::new("/w/sk1/sk1.supervisor.pid"));
        assert_eq!(state_file(Path::new("/w/e/compute.pid")), Path::new("/w/e/compute.supervisor.json"));
        let s = Supervised::new(
            "sk1",
            Identity {
                subcommand: "safekeeper",
                marker: "/w/sk1/safekeeper.toml".into(),
                pidfile: "/w/sk1/sk1.pid".into(),
            },
            "/w/sk1/sk1.log".into(),
            Duration::from_secs(30),
        );
        assert_eq!(s.supervisor.subcommand, "supervise");
        assert_eq!(s.supervisor.marker, s.service.marker);
        assert_eq!(s.liveness(), Liveness::Stopped);
        assert_eq!(s.restarts(), Restarts::default());
        assert_eq!(Liveness::Restarting { supervisor: 3 }.name(), "restarting");
        assert_eq!(Liveness::Running { pid: 1, supervisor: None }.supervisor(), None);
    }
}
