//! Why a cluster command failed, and the exit code it gives.

use std::fmt;

/// Why a cluster command failed; decides the exit code.
#[derive(Debug)]
pub enum Error {
    /// The command line asks for something impossible (exit code 2).
    Usage(String),
    /// The command was fine but did not succeed (exit code 1).
    Failed(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) | Error::Failed(m) => f.write_str(m),
        }
    }
}

/// Result of the cluster commands' internals.
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for a failure message.
pub(crate) fn failed<T>(message: impl Into<String>) -> Result<T> {
    Err(Error::Failed(message.into()))
}
