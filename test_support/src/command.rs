//! Commands a test runs: PostgreSQL's programs (as its own user when the
//! test runs as root) and anything else, failing the test with the
//! command's output when it fails.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Output};

/// PostgreSQL 15's programs: `PG_BIN`, or Debian's directory.
pub fn pg_bin() -> PathBuf {
    std::env::var_os("PG_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// Whether the test runs as root (PostgreSQL then runs as `postgres`).
pub fn as_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// A PostgreSQL program, run as the `postgres` user when the test is root
/// (the server refuses to run as root).
pub fn pg_command(program: &str) -> Command {
    let path = pg_bin().join(program);
    if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

/// Runs `cmd` to its end; a failure fails the test with the command's output.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
