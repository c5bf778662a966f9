//! Every bound of the service crate: what grows with load or time and where
//! it stops.
//!
//! The listeners bound their connections and descriptors, the HTTP server
//! what a client may make it wait for or hold, the API client what it reads,
//! and token checks what they parse; configured durations are bounded too.

use std::time::Duration;

// ---- listeners

/// Refusals answered at once, each on its own short-lived task; beyond this
/// a refused connection is closed without an answer.
pub const MAX_REFUSALS_IN_FLIGHT: usize = 16;
/// Descriptors a listener may hold beyond its `max_connections`: the
/// connection being admitted and those being refused. Services count them
/// in their open-file budget.
pub const DESCRIPTORS_BEYOND_LIMIT: usize = 1 + MAX_REFUSALS_IN_FLIGHT;
/// How long a refused client gets to send its first bytes, and to take the answer.
pub const REFUSAL_WAIT: Duration = Duration::from_millis(300);
/// Pauses after accept errors that are not about one connection: from the
/// shortest, doubling up to the longest, so the accept loop never spins.
pub const MIN_ACCEPT_PAUSE: Duration = Duration::from_millis(10);
pub const MAX_ACCEPT_PAUSE: Duration = Duration::from_secs(1);
/// Accept errors are logged at most this often (each is counted in metrics).
pub const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// Connections the kernel queues for a listener until it accepts them
/// (the kernel caps it at `net.core.somaxconn`, 4096 by default). Tokio's
/// and the standard library's `bind` ask for 128, which a flood of idle
/// connections fills at once; see the listener's documentation.
pub const LISTEN_BACKLOG: u32 = 4096;

// ---- HTTP server (defaults of `HttpLimits`)

/// Time for a request's headers to arrive (and for the next request on a
/// kept-alive connection).
pub const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a response write may make no progress before the connection ends.
pub const HTTP_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Time for a request body to arrive whole.
pub const HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request body: management requests are small JSON documents.
pub const HTTP_MAX_BODY_BYTES: usize = 1 << 20;

// ---- API client

/// Largest answer read by default (a status may list every timeline).
pub const DEFAULT_MAX_ANSWER: u64 = 16 << 20;
/// The longest part of an unexpected error body kept in a message.
pub const MAX_ERROR_TEXT: usize = 500;

// ---- tokens

/// Seconds an expired token is still accepted, for clocks that differ
/// between hosts (NTP keeps them within milliseconds).
pub const LEEWAY_SECS: u64 = 10;
/// Longest token accepted; anything longer is refused before it is parsed.
/// Ours are about 250 bytes.
pub const MAX_TOKEN_LEN: usize = 2048;
/// Most public keys trusted at once: the current one, the one being
/// rotated out, and room for one staged ahead.
pub const MAX_TRUSTED_KEYS: usize = 3;
/// Longest token id (`jti`); ours are 32 hex digits.
pub const MAX_JTI_LEN: usize = 64;
/// Most tokens on the deny list; past it, rotating the key revokes every
/// token at once (a full list is about 1 MB to read).
pub const MAX_REVOKED: usize = 10_000;
/// How often, at most, a verifier looks whether its key file or deny list
/// changed (one `stat` of each), and a process whether its own token file did.
pub const AUTH_RELOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest life of a token an issuer's key signs (a renewed compute token):
/// a day, so that a controller's key, stolen, mints nothing lasting.
pub const MAX_ISSUED_TTL: std::time::Duration = std::time::Duration::from_secs(86_400);
/// Largest audit log file; one older file is kept beside it.
pub const MAX_AUDIT_FILE_BYTES: u64 = 16 << 20;
/// Largest key file or deny list read.
pub const MAX_TRUST_FILE_BYTES: u64 = 2 << 20;

// ---- configured durations

/// Longest duration a config key in seconds accepts: a day.
pub const MAX_CONFIG_SECONDS: f64 = 86_400.0;
/// Longest retention period a config key accepts: ten years.
pub const MAX_RETENTION_SECONDS: f64 = 10.0 * 366.0 * 86_400.0;

// The descriptors beyond the limit are the one being admitted and the refusals.
const _: () = assert!(DESCRIPTORS_BEYOND_LIMIT == 1 + MAX_REFUSALS_IN_FLIGHT);
// The accept pause grows from its floor to its cap.
const _: () = assert!(0 < MIN_ACCEPT_PAUSE.as_millis() && MIN_ACCEPT_PAUSE.as_millis() < MAX_ACCEPT_PAUSE.as_millis());
// The kernel takes the backlog as a C int.
const _: () = assert!(LISTEN_BACKLOG <= i32::MAX as u32);
// A refusal (read the first bytes, then answer) holds its descriptor for less
// time than an admitted client gets for its headers: refused clients cannot
// hold more descriptors for longer than admitted ones.
const _: () = assert!(2 * REFUSAL_WAIT.as_millis() < HTTP_HEADER_TIMEOUT.as_millis());
// The default HTTP timeouts can be written in a config's seconds.
const _: () = assert!(
    HTTP_HEADER_TIMEOUT.as_secs() as f64 <= MAX_CONFIG_SECONDS
        && HTTP_WRITE_TIMEOUT.as_secs() as f64 <= MAX_CONFIG_SECONDS
        && HTTP_BODY_TIMEOUT.as_secs() as f64 <= MAX_CONFIG_SECONDS
);
// A retention period may be at least as long as any other configured duration.
const _: () = assert!(MAX_CONFIG_SECONDS <= MAX_RETENTION_SECONDS);
// An error text kept in a message is part of an answer that was read.
const _: () = assert!(MAX_ERROR_TEXT as u64 <= DEFAULT_MAX_ANSWER);
// Tokens travel in a header, which a request body's bound also covers.
const _: () = assert!(MAX_TOKEN_LEN <= HTTP_MAX_BODY_BYTES);
// A full deny list fits the bound on what is read of it (about 100 bytes an entry).
const _: () = assert!((MAX_REVOKED as u64) * (MAX_JTI_LEN as u64 + 40) <= MAX_TRUST_FILE_BYTES);
// Rotation needs the new key and the old one at once.
const _: () = assert!(MAX_TRUSTED_KEYS >= 2);
