//! Why the agent stopped: the phase it was in and what went wrong.

/// Why the agent stopped with an error: the phase, and what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("{phase}: {message}")]
pub struct AgentError {
    pub phase: &'static str,
    pub message: String,
}

/// An error of `phase`.
pub(super) fn fail(phase: &'static str, message: impl std::fmt::Display) -> AgentError {
    AgentError { phase, message: message.to_string() }
}

/// The phase of a writer whose branch another writer took over (a higher
/// safekeeper term): it must not start again.
pub const FENCED: &str = "fenced";

impl AgentError {
    /// Whether another writer took the branch over.
    pub fn is_fenced(&self) -> bool {
        self.phase == FENCED
    }
}
