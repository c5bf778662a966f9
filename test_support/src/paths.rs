//! Paths of the clone the tests run in, read when the test runs.
//!
//! `env!("CARGO_MANIFEST_DIR")` and `env!("CARGO_BIN_EXE_…")` are fixed when
//! a test is compiled, and cargo does not rebuild a test when only the clone's
//! path changed. With a build cache shared between clones (docs/testing.md), a
//! test compiled in a clone that has since been removed would look for its
//! data and programs there. Cargo sets the same variables in the environment
//! of every test it runs, so the tests read them then.

use std::path::PathBuf;

/// The directory of the manifest of the crate whose test is running.
pub fn manifest_dir() -> PathBuf {
    PathBuf::from(var("CARGO_MANIFEST_DIR"))
}

/// A file under the running crate's directory (`tests/data/x`, `../service/...`).
pub fn in_crate(relative: &str) -> PathBuf {
    manifest_dir().join(relative)
}

/// The executable of binary target `name` of the running test's package, as
/// cargo built it for this run: where cargo says, or else beside the
/// directory of the test's own executable (`<profile>/deps/`), where cargo
/// puts both.
pub fn bin_exe(name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(format!("CARGO_BIN_EXE_{name}")) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test's own executable");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("a test runs from <target>/<profile>/deps");
    profile_dir.join(name)
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the Rust tests with `cargo test`"))
}
