//! The safekeeper protocol (version 7): how a proposer (the compute's WAL
//! sender) gets elected by a quorum of acceptors (safekeepers) and streams
//! WAL to them, and how consumers (pageservers, recovering peers) stream WAL
//! from a safekeeper. Specified in `docs/safekeeper-protocol.md`; the byte
//! layout is implemented in `codec`.

pub mod codec;
pub mod election;
pub mod history;
pub mod membership;
mod messages;
mod quorum;
mod term;

pub use history::{TermHistory, TermLsn};
pub use membership::{Member, Membership, OnAsyncLag, Placement};
pub use messages::{
    AcceptorGreeting, AcceptorMessage, AppendRequest, AppendResponse, ConsumerFeedback, ConsumerMessage, DecodedWal,
    ErrorCode, ErrorMessage, ProposerElected, ProposerGreeting, ProposerMessage, StandbyFeedback, StartStreaming,
    StreamMessage, StreamStart, TimelineIdentity, VoteRequest, VoteResponse, WalData, OLDEST_GREETING_VERSION,
    PROTOCOL_VERSION,
};
pub use term::Term;
