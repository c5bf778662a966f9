//! What the Rust tests of every Strata crate share, so that no test file
//! carries its own copy: a seeded random generator whose seed can be set to
//! reproduce a failure, fresh scratch directories, commands that fail the
//! test with their output, the PostgreSQL binaries, free ports, and the
//! clone's paths as they are when the test runs.
//!
//! A dev-dependency only: nothing here reaches a binary users run.

pub mod command;
pub mod paths;
pub mod rng;
pub mod scratch;

pub use command::{as_root, pg_bin, pg_command, run};
pub use rng::seeded;
pub use scratch::scratch_dir;

/// A port no other test of this run has taken (`STRATA_PORT_RANGE` honoured).
pub fn free_port() -> u16 {
    strata_service::ports::allocate(1, &[]).expect("a free port")[0]
}

/// Runs blocking `f` on tokio's blocking pool and waits for it.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("the blocking task finishes")
}
