//! Why a client is turned away: a reason (the metrics' label), a SQLSTATE
//! and a message the client reads. Only an unknown endpoint's message is
//! not its own: it reads as a wrong password (`docs/proxy.md`).

/// A client turned away.
#[derive(Debug)]
pub struct Refusal {
    pub reason: &'static str,
    /// The SQLSTATE of the error the client gets.
    pub code: String,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: &'static str, code: &str, message: impl Into<String>) -> Refusal {
        Refusal { reason, code: code.to_string(), message: message.into() }
    }

    /// The client went away: nothing to answer, nothing to count.
    pub fn closed() -> Refusal {
        Refusal::new(CLOSED, "08006", "the client closed the connection")
    }

    pub fn is_closed(&self) -> bool {
        self.reason == CLOSED
    }
}

/// The client closed its connection (not counted).
pub const CLOSED: &str = "closed";
/// A client without TLS where TLS is required.
pub const NO_TLS: &str = "no_tls";
/// Bytes that are not the protocol, or a SCRAM exchange gone wrong.
pub const MALFORMED: &str = "malformed";
/// A startup packet that names no endpoint.
pub const NO_ENDPOINT: &str = "no_endpoint";
/// A role other than the endpoints' application role.
pub const ROLE: &str = "role";
/// An endpoint that does not exist (the client reads a wrong password).
pub const UNKNOWN_ENDPOINT: &str = "unknown_endpoint";
pub const WRONG_PASSWORD: &str = "wrong_password";
/// The tenant has `max_connections_per_tenant` sessions already.
pub const TENANT_LIMIT: &str = "tenant_limit";
/// An endpoint its operator stopped.
pub const STOPPED: &str = "stopped";
pub const WAKE_FAILED: &str = "wake_failed";
/// The compute could not be reached, or did not answer in time.
pub const COMPUTE_UNREACHABLE: &str = "compute_unreachable";
/// The compute's authentication is not the endpoint's verifier.
pub const COMPUTE_AUTH: &str = "compute_auth";
/// The compute refused the session (its error is passed on).
pub const COMPUTE_ERROR: &str = "compute_error";
/// A wait of the startup or the authentication ran out.
pub const TIMEOUT: &str = "timeout";
/// The control plane could not be read.
pub const CATALOG: &str = "catalog";
/// A cancel request with a key of no open session.
pub const UNKNOWN_CANCEL_KEY: &str = "unknown_cancel_key";
