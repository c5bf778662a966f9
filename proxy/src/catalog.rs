//! What the proxy asks the control plane: where an endpoint runs, its
//! verifier and state, and to wake it. The proxy's binary supplies the
//! control plane's answers ([`Backend`]); tests supply their own.

use std::net::SocketAddr;

/// An endpoint as the control plane knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub endpoint: String,
    /// Its tenant's name (the connection limit is per tenant).
    pub tenant: String,
    /// The SCRAM verifier of its role's password, as PostgreSQL stores it.
    pub verifier: String,
    /// Its PostgreSQL's address.
    pub address: SocketAddr,
    /// Its PostgreSQL's Unix socket, when the compute runs on the proxy's
    /// own machine: in the compute's private data directory, where no
    /// other user can put a socket of their own, so the session needs no
    /// TLS there (and costs the compute none).
    pub socket: Option<std::path::PathBuf>,
    pub state: State,
}

/// Whether an endpoint's compute runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Its agent runs (PostgreSQL may still be starting).
    Running,
    /// Asleep (or left by a crash while suspending or waking): a client wakes it.
    Suspended,
    /// Stopped by its operator: it stays stopped.
    Stopped,
}

/// The control plane, as the proxy uses it. Both calls block (they read
/// files or ask other hosts); the proxy runs them on blocking threads.
pub trait Backend: Send + Sync + 'static {
    /// The endpoint named `name`, if there is one.
    fn lookup(&self, name: &str) -> Result<Option<Target>, String>;
    /// Starts the compute of endpoint `name`; returns once it runs.
    fn wake(&self, name: &str) -> Result<(), String>;
}
