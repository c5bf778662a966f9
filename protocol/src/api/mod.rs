//! The management APIs' documents: every request and answer of the
//! pageserver's, the safekeepers' and the compute agent's HTTP APIs, and
//! `strata status --json`, as serde types, used by the servers that write
//! them and by the CLI and the agent that read them, so that a changed field breaks the build, not a client at
//! run time. `docs/openapi/` specifies the same documents;
//! `test_runner/test_openapi.py` checks the servers' answers against it.
//!
//! Requests refuse unknown fields (a misspelled option is an error);
//! answers accept them, so that a client reads a newer server's answer.

pub mod cluster;
pub mod compute;
pub mod controller;
pub mod pageserver;
pub mod safekeeper;

/// The body of every error answer (4xx and 5xx) of the JSON APIs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ErrorBody {
    pub error: String,
}
