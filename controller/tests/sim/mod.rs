//! A deterministic simulation of the storage controller: several
//! controllers on one simulated clock (each seeing it at its own rate),
//! fake object storage and fake
//! pageservers that fail, hang and come back, one seeded generator behind
//! every choice, and invariants checked after every step
//! (`docs/storage-controller.md`, "Simulation").

pub mod checker;
pub mod drift;
pub mod executor;
pub mod objects;
pub mod pageservers;
pub mod world;

use std::sync::Arc;

use parking_lot::Mutex;

/// The one generator of a run: the executor's order, the fakes' latencies
/// and failures, and the world's faults all draw from it.
pub type SharedRng = Arc<Mutex<fastrand::Rng>>;
