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
