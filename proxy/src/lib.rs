//! The Strata proxy (`docs/proxy.md`): one PostgreSQL address for every
//! endpoint of every tenant. It finds the endpoint a client asks for,
//! authenticates the client itself with SCRAM-SHA-256 from the endpoint's
//! verifier, wakes the endpoint's compute if it sleeps, and relays the
//! session to it.

pub mod limits;
pub mod scram;
