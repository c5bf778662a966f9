//! Strata's wire protocols and the identifiers they carry.

pub mod api;
pub mod decoded_wal;
mod frame;
pub mod framed;
pub mod fsm_pages;
pub mod ids;
pub mod lazy_manifest;
pub mod limits;
pub mod pageserver;
pub mod safekeeper;
pub mod shard;
pub mod token;

pub use ids::{NodeId, TenantId, TimelineId};
pub use shard::{ShardIdentity, ShardIndex, ShardLayout, TenantShardId};
pub use token::Token;
