//! Scratch directories: one per test and process, emptied when taken, so
//! a rerun never sees an earlier run's files and two test processes never
//! share one.

use std::path::PathBuf;

/// A fresh, empty directory `strata-<name>-<pid>` under the system's
/// temporary directory.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-{name}-{}", std::process::id()));
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("emptying {}: {e}", dir.display()),
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}
