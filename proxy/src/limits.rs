//! Every bound of the proxy: what grows with load or time and where it
//! stops.

// ---- SCRAM

/// Longest SCRAM message taken: PostgreSQL's own are well under 1 KiB.
pub const MAX_SCRAM_MESSAGE: usize = 4096;
/// Iterations of a verifier made here (PostgreSQL's default).
pub const SCRAM_ITERATIONS: u32 = 4096;
/// Most iterations a verifier may ask: each login costs the proxy that
/// many HMACs, far above PostgreSQL's default a CPU-second.
pub const MAX_SCRAM_ITERATIONS: u32 = 100_000;

const _: () = assert!(SCRAM_ITERATIONS <= MAX_SCRAM_ITERATIONS);
const _: () = assert!(MAX_SCRAM_MESSAGE >= 256);
