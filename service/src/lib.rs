//! What every Strata service shares: listeners that bound and survive their
//! clients, the HTTP server of the management APIs, the open-file budget,
//! and config helpers.

pub mod backoff;
pub mod config;
pub mod http;
pub mod listener;
pub mod metrics;

pub use listener::{bind, BindError, Connection, Limits, Listener, Slot};
pub use metrics::ListenerMetrics;
