//! Fault control: which operations fail, read from the control file before
//! each operation that can fail, so a test arms and disarms faults by writing
//! one small file.
//!
//! The file holds whitespace-separated tokens; absent or empty means no
//! faults. `fsync`: every fsync, fdatasync and directory fsync fails with EIO
//! without syncing (and so does a write to a file opened with O_SYNC or
//! O_DSYNC, which would sync). `write`: every write (and fallocate) fails with
//! ENOSPC.

use std::fmt::Display;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The faults armed at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Active {
    /// fsync, fdatasync and directory fsync fail with EIO.
    pub fsync: bool,
    /// Writes fail with ENOSPC.
    pub write: bool,
}

impl Active {
    /// Parses the control file's content; also returns the tokens it does not know.
    pub fn parse(text: &str) -> (Active, Vec<&str>) {
        let mut active = Active::default();
        let mut unknown = Vec::new();
        for token in text.split_whitespace() {
            match token {
                "fsync" => active.fsync = true,
                "write" => active.write = true,
                other => unknown.push(other),
            }
        }
        (active, unknown)
    }
}

/// The control file and the count of injected failures.
#[derive(Debug)]
pub struct Faults {
    control: PathBuf,
    injected: AtomicU64,
    /// The control file's content last read (or the error reading it), so
    /// that a change is logged once rather than on every operation.
    last: Mutex<String>,
}

impl Faults {
    /// Faults controlled by the file at `control` (which need not exist yet).
    pub fn new(control: PathBuf) -> Faults {
        Faults { control, injected: AtomicU64::new(0), last: Mutex::new(String::new()) }
    }

    /// Reads the control file now and returns the faults it arms.
    pub fn active(&self) -> Active {
        let text = match std::fs::read_to_string(&self.control) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                // An unreadable control file arms nothing, and says so once.
                self.note(format!("error: {e}"), || {
                    log(format_args!("cannot read control file {}: {e}; no faults", self.control.display()))
                });
                return Active::default();
            }
        };
        let (active, unknown) = Active::parse(&text);
        self.note(text.clone(), || {
            log(format_args!("faults now: fsync={} write={}", active.fsync, active.write));
            if !unknown.is_empty() {
                log(format_args!("ignoring unknown control tokens: {}", unknown.join(" ")));
            }
        });
        active
    }

    /// Counts and logs one injected failure of `op` on `path`.
    pub fn inject(&self, op: &str, path: impl Display, error: &str) {
        let n = self.injected.fetch_add(1, Ordering::Relaxed) + 1;
        log(format_args!("injected {error} into {op} of {path} (failure {n})"));
    }

    /// How many failures were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Runs `report` if `state` differs from the state last seen.
    fn note(&self, state: String, report: impl FnOnce()) {
        let mut last = self.last.lock();
        if *last != state {
            *last = state;
            report();
        }
    }
}

/// One log line on stderr.
pub fn log(message: std::fmt::Arguments) {
    eprintln!("strata-faultfs: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tokens() {
        assert_eq!(Active::parse(""), (Active::default(), vec![]));
        assert_eq!(Active::parse(" \n"), (Active::default(), vec![]));
        assert_eq!(Active::parse("fsync\n"), (Active { fsync: true, write: false }, vec![]));
        assert_eq!(Active::parse("write fsync bogus"), (Active { fsync: true, write: true }, vec!["bogus"]));
    }

    #[test]
    fn reads_the_control_file_each_time() {
        let dir = std::env::temp_dir().join(format!("strata-faultfs-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let control = dir.join("control");
        let faults = Faults::new(control.clone());
        assert_eq!(faults.active(), Active::default());
        std::fs::write(&control, "write").unwrap();
        assert_eq!(faults.active(), Active { fsync: false, write: true });
        std::fs::write(&control, "").unwrap();
        assert_eq!(faults.active(), Active::default());
        faults.inject("fsync", "a/b", "EIO");
        assert_eq!(faults.injected(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
