//! The supervisor's state file (`<name>.supervisor.json`): written by
//! `strata supervise` at every change, read by the control plane to tell a
//! service that is being restarted from one that is stopped.

use std::path::Path;
use std::time::SystemTime;

/// The supervisor's state file.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SupervisorState {
    pub name: String,
    pub supervisor_pid: u32,
    /// `starting`, `running`, `restarting` (waiting to start it again),
    /// `stopping`, or `stopped` (the supervisor has exited).
    pub state: String,
    /// The service's pid while it runs.
    pub child_pid: Option<u32>,
    /// Times the service was started again after it exited.
    pub restarts: u64,
    /// How it ended last: `exit code N` or `signal N: NAME`; for a compute
    /// agent the supervisor does not start again, `fenced by another
    /// writer` or `suspended after N s idle`.
    pub last_exit: Option<String>,
    /// When (Unix seconds).
    pub last_exit_at: Option<u64>,
    /// Whether the restarts were a crash loop when this was written.
    pub crash_loop: bool,
    /// Until when they are one (Unix seconds); readers compare with their clock.
    pub crash_loop_until: Option<u64>,
    /// How the last stop went: `clean` (the service exited after SIGTERM)
    /// or `killed` (after the grace period).
    pub stop: Option<String>,
}

impl SupervisorState {
    /// Reads a state file; `None` if missing or unreadable.
    pub fn load(path: &Path) -> Option<SupervisorState> {
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
    }

    /// Whether the restarts are a crash loop at Unix time `now`.
    pub fn crash_loop_at(&self, now: u64) -> bool {
        self.crash_loop_until.is_some_and(|until| now < until)
    }
}

/// Unix time in whole seconds.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_service::durable::replace_file;

    #[test]
    fn state_file_roundtrips_and_crash_loops_expire() {
        let dir = std::env::temp_dir().join(format!("strata-supervisor-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.supervisor.json");
        assert_eq!(SupervisorState::load(&path), None);
        let st = SupervisorState {
            name: "sk1".into(),
            supervisor_pid: 7,
            state: "restarting".into(),
            restarts: 2,
            last_exit: Some("signal 9: SIGKILL".into()),
            last_exit_at: Some(100),
            crash_loop: true,
            crash_loop_until: Some(400),
            ..Default::default()
        };
        replace_file(&path, serde_json::to_string(&st).unwrap().as_bytes(), true).unwrap();
        assert_eq!(SupervisorState::load(&path), Some(st.clone()));
        assert!(st.crash_loop_at(399) && !st.crash_loop_at(400));
        std::fs::write(&path, "{not json").unwrap();
        assert_eq!(SupervisorState::load(&path), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
