//! The messages of the safekeeper protocol: what a proposer, an acceptor
//! and a consumer send one another. Their byte layout is in `codec`.

use strata_formats::Lsn;

use super::history::TermHistory;
use super::membership::Membership;
use super::term::Term;
use crate::ids::{NodeId, TenantId, TimelineId};
use crate::token::Token;

/// Protocol version spoken by this build (2: greetings carry the membership
/// configuration; 3: greetings and stream requests carry a token; 4:
/// acceptors send StandbyFeedback; 5: stream requests carry the
/// consumer's attachment generation; 6: membership configurations carry
/// each member's site and the placement; 7: the error code `Sealed`; 8:
/// stream requests carry the consumer's shard; 9: stream requests carry a
/// format and the tenant's stripe size, `DecodedWal` and the error code
/// `RecordTooLarge`).
pub const PROTOCOL_VERSION: u32 = 9;

/// The oldest greeting version an acceptor takes: greetings of versions 7
/// and 8 are laid out alike.
pub const OLDEST_GREETING_VERSION: u32 = 7;

/// Which timeline a connection is about, and the facts every party must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineIdentity {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// PostgreSQL's system identifier of the cluster.
    pub system_id: u64,
    /// PostgreSQL major version (e.g. 15).
    pub pg_version: u32,
    pub wal_segment_size: u32,
}

/// First message of a proposer connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProposerGreeting {
    pub protocol_version: u32,
    /// Random id of this proposer process (for logs and status).
    pub proposer_id: [u8; 16],
    pub timeline: TimelineIdentity,
    /// The configuration the proposer knows (the highest generation it saw).
    pub membership: Membership,
    /// The token that allows proposing for the timeline's tenant (version 3;
    /// none when sent empty).
    pub token: Option<Token>,
}

/// The proposer asks for the acceptor's vote in `term`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoteRequest {
    pub term: Term,
}

/// The proposer won `term`: the acceptor must make its WAL a prefix of the
/// proposer's history, truncating everything from `start_streaming_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProposerElected {
    pub term: Term,
    /// Where this acceptor's WAL stops agreeing with the proposer's history;
    /// WAL will be streamed from here.
    pub start_streaming_at: Lsn,
    /// The proposer's term history; its last entry is (`term`, epoch start).
    pub term_history: TermHistory,
    pub timeline_start_lsn: Lsn,
}

/// WAL bytes `[begin_lsn, begin_lsn + wal.len())`, plus the proposer's view
/// of what is committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    pub term: Term,
    pub begin_lsn: Lsn,
    /// Quorum-flushed LSN in this term.
    pub commit_lsn: Lsn,
    /// WAL below this is held by every acceptor (may be removed later).
    pub truncate_lsn: Lsn,
    pub wal: Vec<u8>,
}

impl AppendRequest {
    /// End of the WAL carried.
    pub fn end_lsn(&self) -> Lsn {
        // The codec rejects requests whose end would overflow.
        Lsn(self.begin_lsn.0.saturating_add(self.wal.len() as u64))
    }
}

/// Messages a proposer sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposerMessage {
    Greeting(ProposerGreeting),
    VoteRequest(VoteRequest),
    Elected(ProposerElected),
    Append(AppendRequest),
}

/// The acceptor's answer to a greeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptorGreeting {
    pub protocol_version: u32,
    pub node_id: NodeId,
    /// The highest term this acceptor has voted in.
    pub term: Term,
    /// The acceptor's configuration of the timeline.
    pub membership: Membership,
}

/// The acceptor's answer to a vote request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoteResponse {
    /// The acceptor's term after handling the request.
    pub term: Term,
    pub vote_given: bool,
    /// End of the acceptor's durable WAL (a record boundary).
    pub flush_lsn: Lsn,
    pub truncate_lsn: Lsn,
    /// The acceptor's term history, up to `flush_lsn`.
    pub term_history: TermHistory,
    pub timeline_start_lsn: Lsn,
}

/// The acceptor's answer to ProposerElected and to each append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendResponse {
    /// The acceptor's term: higher than the proposer's means it was superseded.
    pub term: Term,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
    /// The lowest LSN its WAL consumers (pageservers) report as durably
    /// processed; `Lsn::INVALID` without consumers. Drives backpressure.
    pub consumer_applied_lsn: Lsn,
}

/// The oldest snapshots the replicas streaming from an acceptor hold
/// (`hot_standby_feedback`), for the writer to keep what they may see.
/// Transaction ids are full 64-bit ids (epoch in the high half); 0: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StandbyFeedback {
    pub xmin: u64,
    pub catalog_xmin: u64,
}

/// Messages an acceptor sends to a proposer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorMessage {
    Greeting(AcceptorGreeting),
    VoteResponse(VoteResponse),
    AppendResponse(AppendResponse),
    /// Sent after an AppendResponse when the replicas' feedback changed.
    StandbyFeedback(StandbyFeedback),
    /// Sent before the acceptor closes a connection it refuses.
    Error(ErrorMessage),
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorMessage {
    pub code: ErrorCode,
    pub message: String,
}

/// Machine-readable reasons for refusing a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// Malformed or unexpected message.
    Protocol = 1,
    /// Protocol version not supported.
    Version = 2,
    /// Unknown tenant or timeline.
    NotFound = 3,
    /// System id, PostgreSQL version or segment size differ from the timeline's.
    Mismatch = 4,
    /// A newer term exists.
    TermSuperseded = 5,
    /// Storage failed (e.g. disk full); the request may be retried.
    Storage = 6,
    /// Anything else.
    Internal = 7,
    /// Too many connections: refused before the greeting was read; retry later.
    Overloaded = 8,
    /// The start of a stream lies in WAL this safekeeper removed (it is in
    /// object storage, or on peers); the message says where the WAL held begins.
    WalRemoved = 9,
    /// The acceptor's membership configuration is of another generation
    /// than the connection's: the proposer reconnects with the newer one.
    MembershipChanged = 10,
    /// No token, or one that is malformed, badly signed or expired.
    Unauthorized = 11,
    /// A valid token that does not allow this (another tenant, too narrow a scope).
    Forbidden = 12,
    /// The consumer's attachment generation is older than one this
    /// safekeeper has streamed to: the consumer is a fenced pageserver.
    StaleGeneration = 13,
    /// The timeline was sealed by a site failover (`docs/sites.md`): it
    /// accepts no proposer, ever; its history goes on in another timeline.
    Sealed = 14,
    /// A decoded stream met a record larger than it sends whole
    /// (`limits::DECODED_MAX_RECORD`); the message names its LSN. The
    /// consumer streams raw WAL past it.
    RecordTooLarge = 15,
}

/// First message of a consumer connection (pageserver, peer recovery,
/// replication tools): stream WAL of a timeline from `start_lsn`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartStreaming {
    pub protocol_version: u32,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub start_lsn: Lsn,
    /// Stop at this LSN (peer recovery); `Lsn::INVALID` to follow the WAL as it grows.
    pub stop_lsn: Lsn,
    /// Send WAL beyond the commit LSN too (peer recovery needs it).
    pub include_uncommitted: bool,
    /// Who is asking (for status).
    pub consumer_id: String,
    /// The token that allows reading the tenant's WAL (version 3; none in
    /// older versions or when sent empty).
    pub token: Option<Token>,
    /// The generation under which the consumer (a pageserver) holds the
    /// tenant attached (version 5); 0 for consumers that are not attached
    /// pageservers (peer recovery, tools) and in older versions. A
    /// safekeeper stops feeding generations older than the newest it has
    /// seen for the timeline.
    pub generation: u32,
    /// The shard of the tenant the consumer streams for (version 8;
    /// unsharded in older versions): attachment generations are fenced
    /// per shard, since each shard fails over on its own.
    pub shard: crate::shard::ShardIndex,
    /// Raw WAL or decoded records (version 9; raw in older versions).
    pub format: crate::decoded_wal::StreamFormat,
    /// The tenant's stripe size, which with `shard` says what the shard
    /// holds (version 9; the default in older versions). Only a decoded
    /// stream uses it.
    pub stripe_blocks: u32,
}

/// Periodic report from a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerFeedback {
    /// WAL durably processed by the consumer.
    pub applied_lsn: Lsn,
    /// WAL whose versions are in the consumer's object storage (the
    /// pageserver's remote index); 0 if it has none. Safekeepers may remove
    /// WAL below the lowest of these.
    pub remote_consistent_lsn: Lsn,
}

/// Messages a consumer sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsumerMessage {
    Start(StartStreaming),
    Feedback(ConsumerFeedback),
}

/// Answer to StartStreaming: the history of the WAL about to be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamStart {
    pub term: Term,
    pub term_history: TermHistory,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
    pub timeline: TimelineIdentity,
}

/// WAL bytes `[begin_lsn, begin_lsn + wal.len())`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalData {
    pub begin_lsn: Lsn,
    pub commit_lsn: Lsn,
    pub flush_lsn: Lsn,
    pub wal: Vec<u8>,
}

/// A batch of decoded records (`crate::decoded_wal`) covering the WAL
/// `[begin_lsn, end_lsn)`: `end_lsn` is the end of the last record the
/// safekeeper decoded for it, `last_record_lsn` that record's start, and
/// `read_lsn` how far the safekeeper has read (a record may be cut there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedWal {
    pub begin_lsn: Lsn,
    pub end_lsn: Lsn,
    pub last_record_lsn: Lsn,
    pub read_lsn: Lsn,
    pub commit_lsn: Lsn,
    pub flush_lsn: Lsn,
    /// The batch's length before compression, and its CRC-32C.
    pub batch_len: u32,
    pub crc32c: u32,
    /// The batch, compressed in the stream's zstd context.
    pub payload: Vec<u8>,
}

/// Messages a safekeeper sends to a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamMessage {
    Start(StreamStart),
    Wal(WalData),
    Decoded(DecodedWal),
    /// No new WAL; positions as of now.
    Keepalive {
        commit_lsn: Lsn,
        flush_lsn: Lsn,
    },
    Error(ErrorMessage),
}
