//! Every bound of the proxy: what grows with load or time and where it
//! stops.

use std::time::Duration;

// ---- SCRAM

/// Longest SCRAM message taken: PostgreSQL's own are well under 1 KiB.
pub const MAX_SCRAM_MESSAGE: usize = 4096;
/// Iterations of a verifier made here (PostgreSQL's default).
pub const SCRAM_ITERATIONS: u32 = 4096;
/// Most iterations a verifier may ask: each login costs the proxy that
/// many HMACs, far above PostgreSQL's default a CPU-second.
pub const MAX_SCRAM_ITERATIONS: u32 = 100_000;

// ---- The wire

/// Longest startup packet (PostgreSQL's own bound is 10000 bytes).
pub const MAX_STARTUP_PACKET: usize = 10_000;
/// Most parameters of one startup packet.
pub const MAX_STARTUP_PARAMS: usize = 64;
/// Longest message read before the session is relayed (authentication,
/// parameter status, errors); relayed bytes are never parsed.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Startup packets taken on one connection (TLS, then GSS refused, then
/// the session): a client cannot keep a connection in the startup loop.
pub const MAX_STARTUP_ROUNDS: usize = 3;
/// Messages of a compute between its authentication and its first
/// `ReadyForQuery` (parameter status, notices, the key).
pub const MAX_COMPUTE_GREETING: usize = 256;

// ---- Connections and waits (defaults of `proxy.toml`)

/// Client connections at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
pub const MAX_CONNECTIONS: usize = 100_000;
/// Sessions of one tenant at once.
pub const DEFAULT_MAX_CONNECTIONS_PER_TENANT: usize = 100;
/// From a connection to its startup packet (and TLS).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The client's SCRAM exchange.
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(30);
/// A wake: the control plane starting a sleeping compute.
pub const DEFAULT_WAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connecting and logging in to a compute (retried while it starts).
pub const DEFAULT_COMPUTE_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two connection attempts to a compute that is starting.
pub const COMPUTE_RETRY: Duration = Duration::from_millis(25);
/// One TCP connect (a cancel request, an attempt of a login).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Catalog lookups running at once (each reads the workdir or asks a
/// host's node on a blocking thread).
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 32;
/// How long a login to a compute found running is tried before the
/// catalog is asked again whether it is suspending.
pub const SUSPENDING_POLL: Duration = Duration::from_millis(250);
/// Wakes of one endpoint per client: a compute that suspends again just
/// as a client arrives is woken once more, not forever.
pub const MAX_WAKES_PER_SESSION: usize = 2;

// ---- The HTTP API

pub const HTTP_MAX_CONNECTIONS: usize = 64;
pub const HTTP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const _: () = assert!(SCRAM_ITERATIONS <= MAX_SCRAM_ITERATIONS);
const _: () = assert!(MAX_SCRAM_MESSAGE >= 256);
const _: () = assert!(MAX_SCRAM_MESSAGE <= MAX_MESSAGE);
const _: () = assert!(DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS);
const _: () = assert!(DEFAULT_MAX_CONNECTIONS_PER_TENANT <= DEFAULT_MAX_CONNECTIONS);
const _: () = assert!(COMPUTE_RETRY.as_millis() < DEFAULT_COMPUTE_TIMEOUT.as_millis());
const _: () = assert!(MAX_STARTUP_ROUNDS >= 2);
