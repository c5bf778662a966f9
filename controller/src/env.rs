//! What a controller runs on: where it reads the time, its object storage,
//! its calls to the pageservers, how it starts tasks, the seed of its
//! randomness and its decision rule. The process gives it the real ones
//! ([`Env::production`]); a simulation gives fakes driven by one seed.

use std::sync::Arc;

use strata_service::clock::{Clock, SystemClock};

use crate::client::{Client, Pageservers};
use crate::schedule::{self, Planner};
use crate::store::Store;
use crate::tasks::{Spawn, TokioSpawn};

/// A controller's time, I/O and randomness.
#[derive(Clone)]
pub struct Env {
    /// Every lease, heartbeat, timeout and retry is timed by it.
    pub clock: Arc<dyn Clock>,
    /// The state and lease objects.
    pub store: Store,
    /// Heartbeats and location changes.
    pub pageservers: Arc<dyn Pageservers>,
    /// Tasks that outlive a round (location calls).
    pub spawn: Arc<dyn Spawn>,
    /// Seeds the jitter of retries, its only random choice.
    pub seed: u64,
    /// The next state from the state and the heartbeats
    /// ([`schedule::plan`]). Only a test of the simulation's own checks
    /// gives another (a deliberately broken rule).
    pub planner: Planner,
}

impl Env {
    /// The process's: real time, tokio, the configured object storage, the
    /// pageservers over HTTP, a seed from the operating system's entropy.
    pub fn production(store: Store, client: Client) -> Env {
        Env {
            clock: Arc::new(SystemClock),
            store,
            pageservers: Arc::new(client),
            spawn: Arc::new(TokioSpawn),
            seed: entropy_seed(),
            planner: schedule::plan,
        }
    }
}

/// A seed nobody chose (jitter only needs to differ between processes).
#[allow(clippy::disallowed_methods)]
fn entropy_seed() -> u64 {
    fastrand::u64(..)
}
