//! Lazy computes (`docs/lazy-compute.md`): PostgreSQL's relation files
//! served from a local cache and GetPage@LSN, so that a compute starts
//! without copying the database.

pub mod cache;
pub mod fs;
pub mod rules;
pub mod source;
