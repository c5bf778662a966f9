//! The page service protocol (version 2): how a compute asks a pageserver for
//! pages, relation sizes and SLRU segments of one timeline at an LSN, with
//! many requests in flight on one connection. Specified in
//! `docs/pageserver-protocol.md`; the byte layout is implemented in `codec`.

pub mod codec;

use std::fmt;

use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;

use crate::ids::TimelineId;
use crate::shard::TenantShardId;
use crate::token::Token;

/// Protocol version spoken by this build.
pub const PAGE_PROTOCOL_VERSION: u32 = 3;
/// The oldest version a server still accepts (its hello has no token).
pub const PAGE_PROTOCOL_MIN_VERSION: u32 = 1;

/// Size of a page carried by [`ServerMessage::Page`] (PostgreSQL's `BLCKSZ`).
pub const PAGE_SIZE: usize = strata_formats::version::BLCKSZ;

/// Pages in one SLRU segment file (PostgreSQL's `SLRU_PAGES_PER_SEGMENT`).
pub const SLRU_PAGES_PER_SEGMENT: usize = 32;

/// Largest SLRU segment carried by [`ServerMessage::Segment`], in bytes.
pub const MAX_SEGMENT_SIZE: usize = SLRU_PAGES_PER_SEGMENT * PAGE_SIZE;

/// Most requests in flight on one connection (see [`crate::limits`]).
pub use crate::limits::MAX_PIPELINE_DEPTH;

/// The SLRUs a compute may ask for, whole segment by segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SlruKind {
    /// Transaction commit status (`pg_xact`).
    Clog = 0,
    /// Multixact offsets (`pg_multixact/offsets`).
    MultiXactOffsets = 1,
    /// Multixact members (`pg_multixact/members`).
    MultiXactMembers = 2,
}

impl SlruKind {
    /// The kind with wire number `n`, if valid.
    pub fn from_u8(n: u8) -> Option<SlruKind> {
        match n {
            0 => Some(SlruKind::Clog),
            1 => Some(SlruKind::MultiXactOffsets),
            2 => Some(SlruKind::MultiXactMembers),
            _ => None,
        }
    }

    /// The directory of the SLRU below the data directory.
    pub fn name(self) -> &'static str {
        match self {
            SlruKind::Clog => "pg_xact",
            SlruKind::MultiXactOffsets => "pg_multixact/offsets",
            SlruKind::MultiXactMembers => "pg_multixact/members",
        }
    }
}

impl fmt::Display for SlruKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// First message of a connection: which timeline all its requests are
/// about, and (version 2) the token that allows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub protocol_version: u32,
    /// The tenant's shard (version 3; unsharded before).
    pub tenant_id: TenantShardId,
    pub timeline_id: TimelineId,
    /// A token signed by the cluster's key (`docs/security.md`); none in
    /// version 1, or sent empty.
    pub token: Option<Token>,
}

/// A request about the connection's timeline, as of `lsn` (`Lsn::INVALID`:
/// the latest LSN the pageserver has ingested when it handles the request).
/// `id` is chosen by the client and echoed in the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageRequest {
    /// The image of one block.
    GetPage { id: u64, lsn: Lsn, rel: RelFileNode, fork: ForkNumber, block: u32 },
    /// Whether a relation fork exists.
    RelExists { id: u64, lsn: Lsn, rel: RelFileNode, fork: ForkNumber },
    /// A relation fork's size in blocks.
    RelSize { id: u64, lsn: Lsn, rel: RelFileNode, fork: ForkNumber },
    /// A database's total size in bytes (every fork of every relation in it).
    DbSize { id: u64, lsn: Lsn, spc: u32, db: u32 },
    /// One segment file of an SLRU.
    SlruSegment { id: u64, lsn: Lsn, kind: SlruKind, segno: u32 },
}

impl PageRequest {
    /// The client's id of the request.
    pub fn id(&self) -> u64 {
        match *self {
            PageRequest::GetPage { id, .. }
            | PageRequest::RelExists { id, .. }
            | PageRequest::RelSize { id, .. }
            | PageRequest::DbSize { id, .. }
            | PageRequest::SlruSegment { id, .. } => id,
        }
    }

    /// The LSN the request is about; `Lsn::INVALID` means the latest.
    pub fn lsn(&self) -> Lsn {
        match *self {
            PageRequest::GetPage { lsn, .. }
            | PageRequest::RelExists { lsn, .. }
            | PageRequest::RelSize { lsn, .. }
            | PageRequest::DbSize { lsn, .. }
            | PageRequest::SlruSegment { lsn, .. } => lsn,
        }
    }

    /// The same request with another id.
    pub fn with_id(mut self, new_id: u64) -> PageRequest {
        match &mut self {
            PageRequest::GetPage { id, .. }
            | PageRequest::RelExists { id, .. }
            | PageRequest::RelSize { id, .. }
            | PageRequest::DbSize { id, .. }
            | PageRequest::SlruSegment { id, .. } => *id = new_id,
        }
        self
    }

    /// The message's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            PageRequest::GetPage { .. } => "GetPage",
            PageRequest::RelExists { .. } => "RelExists",
            PageRequest::RelSize { .. } => "RelSize",
            PageRequest::DbSize { .. } => "DbSize",
            PageRequest::SlruSegment { .. } => "SlruSegment",
        }
    }
}

/// Messages a compute sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientMessage {
    Hello(Hello),
    Request(PageRequest),
}

/// Machine-readable reasons for an `Error` response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// Malformed or unexpected message; the server closes the connection.
    Protocol = 1,
    /// Protocol version not supported; the server closes the connection.
    Version = 2,
    /// Unknown tenant or timeline (connection-level), or a relation, fork,
    /// block, database or segment that does not exist at the LSN.
    NotFound = 3,
    /// The LSN was not ingested within the server's wait limit.
    LsnTimeout = 4,
    /// Stored data failed a check (checksum, reconstruction).
    Corrupt = 5,
    /// Anything else.
    Internal = 6,
    /// Too many connections: to the pageserver (refused before the hello
    /// was read), or of the hello's tenant (after its token was checked);
    /// the server closes the connection; retry later.
    Overloaded = 7,
    /// No token, or one that is malformed, not signed by the cluster's key
    /// or expired; the server closes the connection.
    Unauthorized = 8,
    /// A token whose scope or tenant does not allow this timeline; the
    /// server closes the connection.
    Forbidden = 9,
    /// The tenant is not attached to this pageserver (a secondary, or
    /// moved): ask the storage controller where it is, and retry there.
    NotAttached = 10,
    /// The block belongs to another shard of the tenant than the one the
    /// connection opened (`docs/sharding.md`): the client routed it wrong.
    WrongShard = 11,
}

impl ErrorCode {
    /// The code with wire number `n`, if valid.
    pub fn from_u16(n: u16) -> Option<ErrorCode> {
        Some(match n {
            1 => ErrorCode::Protocol,
            2 => ErrorCode::Version,
            3 => ErrorCode::NotFound,
            4 => ErrorCode::LsnTimeout,
            5 => ErrorCode::Corrupt,
            6 => ErrorCode::Internal,
            7 => ErrorCode::Overloaded,
            8 => ErrorCode::Unauthorized,
            9 => ErrorCode::Forbidden,
            10 => ErrorCode::NotAttached,
            11 => ErrorCode::WrongShard,
            _ => return None,
        })
    }

    /// Whether the server closes the connection after sending it.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            ErrorCode::Protocol
                | ErrorCode::Version
                | ErrorCode::Overloaded
                | ErrorCode::Unauthorized
                | ErrorCode::Forbidden
                | ErrorCode::NotAttached
        )
    }
}

/// Messages a pageserver sends. Every response echoes the `id` of the
/// request it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerMessage {
    /// The handshake succeeded; the timeline has been ingested up to `last_record_lsn`.
    HelloOk { last_record_lsn: Lsn },
    /// Answers `GetPage`: exactly [`PAGE_SIZE`] bytes.
    Page { id: u64, page: Vec<u8> },
    /// Answers `RelExists`.
    Exists { id: u64, exists: bool },
    /// Answers `RelSize`, in blocks.
    Size { id: u64, blocks: u32 },
    /// Answers `DbSize`, in bytes.
    DbSize { id: u64, bytes: u64 },
    /// Answers `SlruSegment`: whole pages, at most [`MAX_SEGMENT_SIZE`] bytes.
    Segment { id: u64, data: Vec<u8> },
    /// Answers one request that failed; `id` 0 refuses the connection itself
    /// (bad hello, protocol violation), which the server then closes.
    Error { id: u64, code: ErrorCode, message: String },
}

impl ServerMessage {
    /// The id of the request answered (0 for `HelloOk` and connection errors).
    pub fn id(&self) -> u64 {
        match *self {
            ServerMessage::HelloOk { .. } => 0,
            ServerMessage::Page { id, .. }
            | ServerMessage::Exists { id, .. }
            | ServerMessage::Size { id, .. }
            | ServerMessage::DbSize { id, .. }
            | ServerMessage::Segment { id, .. }
            | ServerMessage::Error { id, .. } => id,
        }
    }

    /// Whether this is a fitting answer to `request`: same id, and the
    /// response kind of the request or an error.
    pub fn answers(&self, request: &PageRequest) -> bool {
        let kind_fits = matches!(
            (self, request),
            (ServerMessage::Page { .. }, PageRequest::GetPage { .. })
                | (ServerMessage::Exists { .. }, PageRequest::RelExists { .. })
                | (ServerMessage::Size { .. }, PageRequest::RelSize { .. })
                | (ServerMessage::DbSize { .. }, PageRequest::DbSize { .. })
                | (ServerMessage::Segment { .. }, PageRequest::SlruSegment { .. })
                | (ServerMessage::Error { .. }, _)
        );
        kind_fits && self.id() == request.id()
    }

    /// The message's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            ServerMessage::HelloOk { .. } => "HelloOk",
            ServerMessage::Page { .. } => "Page",
            ServerMessage::Exists { .. } => "Exists",
            ServerMessage::Size { .. } => "Size",
            ServerMessage::DbSize { .. } => "DbSize",
            ServerMessage::Segment { .. } => "Segment",
            ServerMessage::Error { .. } => "Error",
        }
    }
}
