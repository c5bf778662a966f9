//! Byte layout of the safekeeper protocol (specified in
//! `docs/safekeeper-protocol.md`).
//!
//! Every message travels in one frame:
//!
//! ```text
//! u32 length (little-endian) | u8 tag | payload
//! ```
//!
//! `length` counts the tag and the payload (never the length field itself)
//! and is between 1 and [`MAX_FRAME_SIZE`]. Fields are laid out one after the
//! other without padding:
//!
//! - integers are fixed-width little-endian; an LSN or a term is a `u64`;
//! - a bool is one byte, 0 or 1 (any other value is rejected);
//! - tenant, timeline and proposer ids are their 16 raw bytes;
//! - a string is a `u32` byte count and that many bytes of UTF-8 (at most
//!   [`MAX_STRING_LEN`] bytes);
//! - a term history is a `u32` entry count and that many `(u64 term, u64 lsn)`
//!   pairs (at most [`MAX_HISTORY_ENTRIES`], and it must be a valid history);
//! - WAL bytes come last in their message and extend to the end of the frame.
//!
//! Decoding never panics, whatever the input, and rejects trailing bytes, so
//! every message has exactly one encoding.

use strata_formats::types::Truncated;
use strata_formats::Lsn;

use super::history::{HistoryError, TermHistory, TermLsn};
use super::membership::{Member, Membership, OnAsyncLag, Placement};
use super::messages::{
    AcceptorGreeting, AcceptorMessage, AppendRequest, AppendResponse, ConsumerFeedback, ConsumerMessage, DecodedWal,
    ErrorCode, ErrorMessage, ProposerElected, ProposerGreeting, ProposerMessage, StandbyFeedback, StartStreaming,
    StreamMessage, StreamStart, TimelineIdentity, VoteRequest, VoteResponse, WalData, PROTOCOL_VERSION,
};
use super::term::Term;
use crate::decoded_wal::StreamFormat;
use crate::frame::{self, FieldError, Fields, FrameWriter};
use crate::ids::{NodeId, TenantId, TimelineId};
use crate::shard::{ShardIndex, DEFAULT_STRIPE_BLOCKS};
use crate::token::Token;

/// The wire codes of placements (`docs/safekeeper-protocol.md`).
mod placement_kind {
    pub const MAJORITY: u8 = 0;
    pub const LOCAL_QUORUM: u8 = 1;
    pub const STRETCHED: u8 = 2;
}

/// Size of the length prefix of a frame.
pub const LENGTH_SIZE: usize = frame::LENGTH_SIZE;
/// Largest value of a frame's length field (see [`crate::limits`]).
pub use crate::limits::SAFEKEEPER_MAX_FRAME_SIZE as MAX_FRAME_SIZE;
use crate::limits::{MAX_HISTORY_ENTRIES, MAX_MEMBERS, SAFEKEEPER_MAX_STRING_LEN as MAX_STRING_LEN};
/// The oldest version of stream requests still decoded and served
/// (versions 1 and 2 differ from 3 only in carrying no token).
pub const OLDEST_CONSUMER_VERSION: u32 = 1;

/// Message tags. The high bit is set on messages sent by a safekeeper;
/// `0x00..=0x0F` are proposer messages, `0x10..=0x1F` consumer messages.
pub mod tag {
    pub const PROPOSER_GREETING: u8 = 0x01;
    pub const VOTE_REQUEST: u8 = 0x02;
    pub const PROPOSER_ELECTED: u8 = 0x03;
    pub const APPEND_REQUEST: u8 = 0x04;

    pub const ACCEPTOR_GREETING: u8 = 0x81;
    pub const VOTE_RESPONSE: u8 = 0x82;
    pub const APPEND_RESPONSE: u8 = 0x83;
    pub const STANDBY_FEEDBACK: u8 = 0x84;
    pub const ACCEPTOR_ERROR: u8 = 0x8F;

    pub const START_STREAMING: u8 = 0x10;
    pub const CONSUMER_FEEDBACK: u8 = 0x11;

    pub const STREAM_START: u8 = 0x90;
    pub const WAL_DATA: u8 = 0x91;
    pub const KEEPALIVE: u8 = 0x92;
    pub const DECODED_WAL: u8 = 0x93;
    pub const STREAM_ERROR: u8 = 0x9F;
}

/// What was wrong with a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("empty frame: a frame holds at least a tag")]
    EmptyFrame,
    #[error("frame of {len} bytes exceeds the maximum of {MAX_FRAME_SIZE}")]
    FrameTooLarge { len: usize },
    #[error("unknown {direction} message tag {tag:#04x}")]
    UnknownTag { direction: &'static str, tag: u8 },
    #[error("{message}: truncated in field `{field}` at offset {offset}: needed {needed} bytes, {available} left")]
    Truncated { message: &'static str, field: &'static str, offset: usize, needed: usize, available: usize },
    #[error("{message}: {count} trailing bytes after the last field")]
    TrailingBytes { message: &'static str, count: usize },
    #[error("{message}: field `{field}` is a bool but holds {value}")]
    InvalidBool { message: &'static str, field: &'static str, value: u8 },
    #[error("{message}: field `{field}` is not valid UTF-8 (valid up to byte {valid_up_to})")]
    BadUtf8 { message: &'static str, field: &'static str, valid_up_to: usize },
    #[error("{message}: field `{field}` is {len} bytes long, at most {MAX_STRING_LEN} allowed")]
    StringTooLong { message: &'static str, field: &'static str, len: usize },
    #[error("{message}: term history of {count} entries, at most {MAX_HISTORY_ENTRIES} allowed")]
    HistoryTooLong { message: &'static str, count: usize },
    #[error("{message}: {detail}")]
    InvalidHistory { message: &'static str, detail: HistoryError },
    #[error("{message}: invalid membership configuration: {detail}")]
    InvalidMembership { message: &'static str, detail: String },
    #[error("{message}: unknown error code {code}")]
    UnknownErrorCode { message: &'static str, code: u16 },
    #[error("StartStreaming: unknown stream format {value}")]
    InvalidFormat { value: u8 },
    #[error("DecodedWal: positions out of order (begin {begin}, end {end}, last record {last_record}, read {read})")]
    DecodedPositions { begin: Lsn, end: Lsn, last_record: Lsn, read: Lsn },
    #[error("{message}: invalid shard: {detail}")]
    InvalidShard { message: &'static str, detail: crate::shard::ShardError },
    #[error("{message}: {len} WAL bytes from LSN {begin_lsn} run past the end of the LSN space")]
    LsnOverflow { message: &'static str, begin_lsn: Lsn, len: usize },
    /// A greeting or stream request of another protocol version that this
    /// build cannot decode; the answer is an error with [`ErrorCode::Version`].
    #[error("protocol version {version} is not supported (this build speaks {PROTOCOL_VERSION}): {detail}")]
    UnsupportedVersion { version: u32, detail: Box<CodecError> },
}

// ---------------------------------------------------------------------------
// Framing
// ---------------------------------------------------------------------------

/// Finds the first frame in `buf`: `Ok(Some((consumed, frame)))` where
/// `consumed` counts the length prefix too and `frame` is the tag and payload;
/// `Ok(None)` if `buf` does not hold a whole frame yet. Fails as soon as the
/// length prefix is 0 or larger than [`MAX_FRAME_SIZE`].
pub fn split_frame(buf: &[u8]) -> Result<Option<(usize, &[u8])>, CodecError> {
    frame::split(buf, MAX_FRAME_SIZE).map_err(|e| match e {
        frame::BadLength::Empty => CodecError::EmptyFrame,
        frame::BadLength::TooLarge(len) => CodecError::FrameTooLarge { len },
    })
}

/// The protocol version of a proposer greeting or a stream request, read
/// without decoding the rest (its position is the same in every version).
pub fn peek_version(frame: &[u8]) -> Option<u32> {
    match frame.split_first() {
        Some((&(tag::PROPOSER_GREETING | tag::START_STREAMING), rest)) => {
            rest.first_chunk::<4>().map(|b| u32::from_le_bytes(*b))
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/// Starts a frame of this protocol (its frame and string limits).
fn begin_frame(out: &mut Vec<u8>, tag: u8) -> FrameWriter<'_> {
    FrameWriter::begin(out, tag, MAX_FRAME_SIZE, MAX_STRING_LEN)
}

/// Field helpers of this protocol.
impl FrameWriter<'_> {
    fn id(&mut self, v: &[u8; 16]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }
    fn history(&mut self, h: &TermHistory) -> &mut Self {
        assert!(
            h.0.len() <= MAX_HISTORY_ENTRIES,
            "term history of {} entries exceeds the protocol limit of {MAX_HISTORY_ENTRIES}",
            h.0.len()
        );
        debug_assert!(h.validate().is_ok(), "encoding an invalid term history {h:?}");
        self.u32(h.0.len() as u32);
        for e in &h.0 {
            self.u64(e.term).lsn(e.lsn);
        }
        self
    }
    fn identity(&mut self, t: &TimelineIdentity) -> &mut Self {
        self.id(&t.tenant_id.0).id(&t.timeline_id.0).u64(t.system_id).u32(t.pg_version).u32(t.wal_segment_size)
    }
    fn members(&mut self, set: &[Member]) -> &mut Self {
        assert!(set.len() <= MAX_MEMBERS, "a set of {} members exceeds the protocol limit of {MAX_MEMBERS}", set.len());
        self.u16(set.len() as u16);
        for m in set {
            self.u64(m.id.0).string(&m.address).string(m.site.as_deref().unwrap_or(""));
        }
        self
    }
    fn placement(&mut self, p: &Placement) -> &mut Self {
        match p {
            Placement::Majority => self.u8(placement_kind::MAJORITY),
            Placement::LocalQuorum { home, max_async_lag, on_async_lag } => {
                self.u8(placement_kind::LOCAL_QUORUM).string(home).u64(*max_async_lag).u8(match on_async_lag {
                    OnAsyncLag::FallBehind => 0,
                    OnAsyncLag::Throttle => 1,
                })
            }
            Placement::Stretched => self.u8(placement_kind::STRETCHED),
        }
    }
    fn membership(&mut self, m: &Membership) -> &mut Self {
        self.u32(m.generation).members(&m.members).bool(m.new_members.is_some());
        if let Some(new) = &m.new_members {
            self.members(new);
        }
        self.placement(&m.placement).bool(m.new_placement.is_some());
        if let Some(p) = &m.new_placement {
            self.placement(p);
        }
        self
    }
    fn error(&mut self, e: &ErrorMessage) -> &mut Self {
        self.u16(e.code as u16).string(&e.message)
    }
}

/// Appends the frame of a proposer message to `out`.
///
/// # Panics
/// If the message cannot be represented: a frame over [`MAX_FRAME_SIZE`]
/// (WAL chunks must be at most [`MAX_WAL_CHUNK`]) or a history over
/// [`MAX_HISTORY_ENTRIES`]. The same holds for the other encoders; strings
/// over [`MAX_STRING_LEN`] bytes are cut instead.
pub fn encode_proposer(msg: &ProposerMessage, out: &mut Vec<u8>) {
    match msg {
        ProposerMessage::Greeting(g) => begin_frame(out, tag::PROPOSER_GREETING)
            .u32(g.protocol_version)
            .id(&g.proposer_id)
            .identity(&g.timeline)
            .membership(&g.membership)
            .string(&crate::token::wire(&g.token))
            .finish(),
        ProposerMessage::VoteRequest(v) => begin_frame(out, tag::VOTE_REQUEST).u64(v.term).finish(),
        ProposerMessage::Elected(e) => begin_frame(out, tag::PROPOSER_ELECTED)
            .u64(e.term)
            .lsn(e.start_streaming_at)
            .lsn(e.timeline_start_lsn)
            .history(&e.term_history)
            .finish(),
        ProposerMessage::Append(a) => begin_frame(out, tag::APPEND_REQUEST)
            .u64(a.term)
            .lsn(a.begin_lsn)
            .lsn(a.commit_lsn)
            .lsn(a.truncate_lsn)
            .bytes(&a.wal)
            .finish(),
    }
}

/// Appends the frame of an [`AppendRequest`] whose WAL is given in parts
/// (a ring buffer's two halves): the same bytes as [`encode_proposer`] of
/// the request, without first gathering the WAL into one vector. The
/// proposer encodes an append once and sends the frame to every safekeeper
/// at that position.
///
/// # Panics
/// As [`encode_proposer`], if the frame would exceed [`MAX_FRAME_SIZE`].
pub fn encode_append(
    term: Term,
    begin_lsn: Lsn,
    commit_lsn: Lsn,
    truncate_lsn: Lsn,
    wal: [&[u8]; 2],
    out: &mut Vec<u8>,
) {
    out.reserve(LENGTH_SIZE + 1 + 32 + wal[0].len() + wal[1].len());
    begin_frame(out, tag::APPEND_REQUEST)
        .u64(term)
        .lsn(begin_lsn)
        .lsn(commit_lsn)
        .lsn(truncate_lsn)
        .bytes(wal[0])
        .bytes(wal[1])
        .finish();
}

/// Appends the frame of an acceptor message to `out` (see [`encode_proposer`]).
pub fn encode_acceptor(msg: &AcceptorMessage, out: &mut Vec<u8>) {
    match msg {
        AcceptorMessage::Greeting(g) => begin_frame(out, tag::ACCEPTOR_GREETING)
            .u32(g.protocol_version)
            .u64(g.node_id.0)
            .u64(g.term)
            .membership(&g.membership)
            .finish(),
        AcceptorMessage::VoteResponse(v) => begin_frame(out, tag::VOTE_RESPONSE)
            .u64(v.term)
            .bool(v.vote_given)
            .lsn(v.flush_lsn)
            .lsn(v.truncate_lsn)
            .lsn(v.timeline_start_lsn)
            .history(&v.term_history)
            .finish(),
        AcceptorMessage::AppendResponse(a) => begin_frame(out, tag::APPEND_RESPONSE)
            .u64(a.term)
            .lsn(a.flush_lsn)
            .lsn(a.commit_lsn)
            .lsn(a.consumer_applied_lsn)
            .finish(),
        AcceptorMessage::StandbyFeedback(f) => {
            begin_frame(out, tag::STANDBY_FEEDBACK).u64(f.xmin).u64(f.catalog_xmin).finish()
        }
        AcceptorMessage::Error(e) => begin_frame(out, tag::ACCEPTOR_ERROR).error(e).finish(),
    }
}

/// Appends the frame of a consumer message to `out` (see [`encode_proposer`]).
pub fn encode_consumer(msg: &ConsumerMessage, out: &mut Vec<u8>) {
    match msg {
        ConsumerMessage::Start(s) => {
            let mut f = begin_frame(out, tag::START_STREAMING);
            f.u32(s.protocol_version)
                .id(&s.tenant_id.0)
                .id(&s.timeline_id.0)
                .lsn(s.start_lsn)
                .lsn(s.stop_lsn)
                .bool(s.include_uncommitted)
                .string(&s.consumer_id);
            // Versions 1 and 2 have no token field; later ones always have one.
            if s.protocol_version >= 3 {
                f.string(&crate::token::wire(&s.token));
            }
            // Version 5 adds the attachment generation.
            if s.protocol_version >= 5 {
                f.u32(s.generation);
            }
            // Version 8 adds the shard (number, count; 0, 0 unsharded).
            if s.protocol_version >= 8 {
                f.u8(s.shard.number).u8(s.shard.count);
            }
            // Version 9 adds the format and the stripe size.
            if s.protocol_version >= 9 {
                f.u8(s.format.to_wire()).u32(s.stripe_blocks);
            }
            f.finish()
        }
        ConsumerMessage::Feedback(f) => {
            begin_frame(out, tag::CONSUMER_FEEDBACK).lsn(f.applied_lsn).lsn(f.remote_consistent_lsn).finish()
        }
    }
}

/// Appends the frame of a stream message to `out` (see [`encode_proposer`]).
pub fn encode_stream(msg: &StreamMessage, out: &mut Vec<u8>) {
    match msg {
        StreamMessage::Start(s) => begin_frame(out, tag::STREAM_START)
            .u64(s.term)
            .lsn(s.flush_lsn)
            .lsn(s.commit_lsn)
            .identity(&s.timeline)
            .history(&s.term_history)
            .finish(),
        StreamMessage::Wal(w) => {
            begin_frame(out, tag::WAL_DATA).lsn(w.begin_lsn).lsn(w.commit_lsn).lsn(w.flush_lsn).bytes(&w.wal).finish()
        }
        StreamMessage::Decoded(d) => begin_frame(out, tag::DECODED_WAL)
            .lsn(d.begin_lsn)
            .lsn(d.end_lsn)
            .lsn(d.last_record_lsn)
            .lsn(d.read_lsn)
            .lsn(d.commit_lsn)
            .lsn(d.flush_lsn)
            .u32(d.batch_len)
            .u32(d.crc32c)
            .bytes(&d.payload)
            .finish(),
        StreamMessage::Keepalive { commit_lsn, flush_lsn } => {
            begin_frame(out, tag::KEEPALIVE).lsn(*commit_lsn).lsn(*flush_lsn).finish()
        }
        StreamMessage::Error(e) => begin_frame(out, tag::STREAM_ERROR).error(e).finish(),
    }
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// Fields of this protocol, on the reader shared with the page service codec.
type Reader<'a> = Fields<'a, CodecError>;

impl From<FieldError> for CodecError {
    fn from(e: FieldError) -> CodecError {
        match e {
            FieldError::Truncated { message, field, offset, needed, available } => {
                CodecError::Truncated { message, field, offset, needed, available }
            }
            FieldError::TrailingBytes { message, count } => CodecError::TrailingBytes { message, count },
            FieldError::InvalidBool { message, field, value } => CodecError::InvalidBool { message, field, value },
            FieldError::BadUtf8 { message, field, valid_up_to } => CodecError::BadUtf8 { message, field, valid_up_to },
            FieldError::StringTooLong { message, field, len } => CodecError::StringTooLong { message, field, len },
        }
    }
}

impl Fields<'_, CodecError> {
    fn history(&mut self, field: &'static str) -> Result<TermHistory, CodecError> {
        let count = self.u32(field)? as usize;
        if count > MAX_HISTORY_ENTRIES {
            return Err(CodecError::HistoryTooLong { message: self.message, count });
        }
        // Check the whole size up front: one precise error, no allocation for absent entries.
        let size = count * 16;
        if self.cur.remaining() < size {
            let t = Truncated { offset: self.cur.position(), needed: size, available: self.cur.remaining() };
            return Err(self.truncated(field, t));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let term = self.u64(field)?;
            let lsn = self.lsn(field)?;
            entries.push(TermLsn { term, lsn });
        }
        let history = TermHistory(entries);
        history.validate().map_err(|detail| CodecError::InvalidHistory { message: self.message, detail })?;
        Ok(history)
    }
    fn members(&mut self, field: &'static str) -> Result<Vec<Member>, CodecError> {
        let count = self.u16(field)? as usize;
        if count > MAX_MEMBERS {
            return Err(CodecError::InvalidMembership {
                message: self.message,
                detail: format!("a set of {count} members, at most {MAX_MEMBERS} allowed"),
            });
        }
        let mut set = Vec::with_capacity(count);
        for _ in 0..count {
            let id = NodeId(self.u64(field)?);
            let address = self.string(field)?;
            let site = Some(self.string(field)?).filter(|s| !s.is_empty());
            set.push(Member { id, address, site });
        }
        Ok(set)
    }
    fn placement(&mut self, field: &'static str) -> Result<Placement, CodecError> {
        let message = self.message;
        let invalid = |detail: String| CodecError::InvalidMembership { message, detail };
        Ok(match self.u8(field)? {
            placement_kind::MAJORITY => Placement::Majority,
            placement_kind::LOCAL_QUORUM => {
                let home = self.string(field)?;
                let max_async_lag = self.u64(field)?;
                let on_async_lag = match self.u8(field)? {
                    0 => OnAsyncLag::FallBehind,
                    1 => OnAsyncLag::Throttle,
                    other => return Err(invalid(format!("unknown on_async_lag {other}"))),
                };
                Placement::LocalQuorum { home, max_async_lag, on_async_lag }
            }
            placement_kind::STRETCHED => Placement::Stretched,
            other => return Err(invalid(format!("unknown placement {other}"))),
        })
    }
    fn membership(&mut self) -> Result<Membership, CodecError> {
        let generation = self.u32("generation")?;
        let members = self.members("members")?;
        let new_members = if self.bool("joint")? { Some(self.members("new_members")?) } else { None };
        let placement = self.placement("placement")?;
        let new_placement = if self.bool("joint_placement")? { Some(self.placement("new_placement")?) } else { None };
        let m = Membership { generation, members, new_members, placement, new_placement };
        m.validate().map_err(|detail| CodecError::InvalidMembership { message: self.message, detail })?;
        Ok(m)
    }
    fn identity(&mut self) -> Result<TimelineIdentity, CodecError> {
        Ok(TimelineIdentity {
            tenant_id: TenantId(self.id16("tenant_id")?),
            timeline_id: TimelineId(self.id16("timeline_id")?),
            system_id: self.u64("system_id")?,
            pg_version: self.u32("pg_version")?,
            wal_segment_size: self.u32("wal_segment_size")?,
        })
    }
    fn error(&mut self) -> Result<ErrorMessage, CodecError> {
        let raw = self.u16("code")?;
        let code = error_code(raw).ok_or(CodecError::UnknownErrorCode { message: self.message, code: raw })?;
        Ok(ErrorMessage { code, message: self.string("message")? })
    }
    /// WAL: everything up to the end of the frame, which must fit in the LSN space after `begin_lsn`.
    fn wal(&mut self, begin_lsn: Lsn) -> Result<Vec<u8>, CodecError> {
        let wal = self.rest("wal")?;
        if begin_lsn.checked_add(wal.len() as u64).is_none() {
            return Err(CodecError::LsnOverflow { message: self.message, begin_lsn, len: wal.len() });
        }
        Ok(wal.to_vec())
    }
}

fn error_code(code: u16) -> Option<ErrorCode> {
    Some(match code {
        1 => ErrorCode::Protocol,
        2 => ErrorCode::Version,
        3 => ErrorCode::NotFound,
        4 => ErrorCode::Mismatch,
        5 => ErrorCode::TermSuperseded,
        6 => ErrorCode::Storage,
        7 => ErrorCode::Internal,
        8 => ErrorCode::Overloaded,
        9 => ErrorCode::WalRemoved,
        10 => ErrorCode::MembershipChanged,
        11 => ErrorCode::Unauthorized,
        12 => ErrorCode::Forbidden,
        13 => ErrorCode::StaleGeneration,
        14 => ErrorCode::Sealed,
        15 => ErrorCode::RecordTooLarge,
        _ => return None,
    })
}

/// The tag of a frame (tag and payload), after the size checks.
fn frame_tag(frame: &[u8]) -> Result<u8, CodecError> {
    if frame.len() > MAX_FRAME_SIZE {
        return Err(CodecError::FrameTooLarge { len: frame.len() });
    }
    frame.first().copied().ok_or(CodecError::EmptyFrame)
}

/// Decodes the payload of `frame` (tag and payload) as `message` and checks
/// that nothing follows.
fn read<'a, T>(
    frame: &'a [u8],
    message: &'static str,
    fields: impl FnOnce(&mut Reader<'a>) -> Result<T, CodecError>,
) -> Result<T, CodecError> {
    frame::read_fields(frame, message, MAX_STRING_LEN, fields)
}

/// A greeting or stream request that does not decode is reported as a
/// version problem when it announces a version outside `oldest..=PROTOCOL_VERSION`.
fn version_aware(frame: &[u8], e: CodecError, oldest: u32) -> CodecError {
    match peek_version(frame) {
        Some(version) if !(oldest..=PROTOCOL_VERSION).contains(&version) => {
            CodecError::UnsupportedVersion { version, detail: Box::new(e) }
        }
        _ => e,
    }
}

/// Decodes a proposer message from a frame's tag and payload.
pub fn decode_proposer(frame: &[u8]) -> Result<ProposerMessage, CodecError> {
    match frame_tag(frame)? {
        tag::PROPOSER_GREETING => read(frame, "ProposerGreeting", |r| {
            Ok(ProposerMessage::Greeting(ProposerGreeting {
                protocol_version: r.u32("protocol_version")?,
                proposer_id: r.id16("proposer_id")?,
                timeline: r.identity()?,
                membership: r.membership()?,
                token: Token::from_wire(r.string("token")?),
            }))
        })
        .map_err(|e| version_aware(frame, e, super::messages::OLDEST_GREETING_VERSION)),
        tag::VOTE_REQUEST => {
            read(frame, "VoteRequest", |r| Ok(ProposerMessage::VoteRequest(VoteRequest { term: r.u64("term")? })))
        }
        tag::PROPOSER_ELECTED => read(frame, "ProposerElected", |r| {
            Ok(ProposerMessage::Elected(ProposerElected {
                term: r.u64("term")?,
                start_streaming_at: r.lsn("start_streaming_at")?,
                timeline_start_lsn: r.lsn("timeline_start_lsn")?,
                term_history: r.history("term_history")?,
            }))
        }),
        tag::APPEND_REQUEST => read(frame, "AppendRequest", |r| {
            let term = r.u64("term")?;
            let begin_lsn = r.lsn("begin_lsn")?;
            let commit_lsn = r.lsn("commit_lsn")?;
            let truncate_lsn = r.lsn("truncate_lsn")?;
            let wal = r.wal(begin_lsn)?;
            Ok(ProposerMessage::Append(AppendRequest { term, begin_lsn, commit_lsn, truncate_lsn, wal }))
        }),
        tag => Err(CodecError::UnknownTag { direction: "proposer", tag }),
    }
}

/// Decodes an acceptor message from a frame's tag and payload.
pub fn decode_acceptor(frame: &[u8]) -> Result<AcceptorMessage, CodecError> {
    match frame_tag(frame)? {
        tag::ACCEPTOR_GREETING => read(frame, "AcceptorGreeting", |r| {
            Ok(AcceptorMessage::Greeting(AcceptorGreeting {
                protocol_version: r.u32("protocol_version")?,
                node_id: NodeId(r.u64("node_id")?),
                term: r.u64("term")?,
                membership: r.membership()?,
            }))
        }),
        tag::VOTE_RESPONSE => read(frame, "VoteResponse", |r| {
            Ok(AcceptorMessage::VoteResponse(VoteResponse {
                term: r.u64("term")?,
                vote_given: r.bool("vote_given")?,
                flush_lsn: r.lsn("flush_lsn")?,
                truncate_lsn: r.lsn("truncate_lsn")?,
                timeline_start_lsn: r.lsn("timeline_start_lsn")?,
                term_history: r.history("term_history")?,
            }))
        }),
        tag::APPEND_RESPONSE => read(frame, "AppendResponse", |r| {
            Ok(AcceptorMessage::AppendResponse(AppendResponse {
                term: r.u64("term")?,
                flush_lsn: r.lsn("flush_lsn")?,
                commit_lsn: r.lsn("commit_lsn")?,
                consumer_applied_lsn: r.lsn("consumer_applied_lsn")?,
            }))
        }),
        tag::STANDBY_FEEDBACK => read(frame, "StandbyFeedback", |r| {
            Ok(AcceptorMessage::StandbyFeedback(StandbyFeedback {
                xmin: r.u64("xmin")?,
                catalog_xmin: r.u64("catalog_xmin")?,
            }))
        }),
        tag::ACCEPTOR_ERROR => read(frame, "AcceptorError", |r| Ok(AcceptorMessage::Error(r.error()?))),
        tag => Err(CodecError::UnknownTag { direction: "acceptor", tag }),
    }
}

/// Decodes a consumer message from a frame's tag and payload.
pub fn decode_consumer(frame: &[u8]) -> Result<ConsumerMessage, CodecError> {
    match frame_tag(frame)? {
        tag::START_STREAMING => read(frame, "StartStreaming", |r| {
            let protocol_version = r.u32("protocol_version")?;
            Ok(ConsumerMessage::Start(StartStreaming {
                protocol_version,
                tenant_id: TenantId(r.id16("tenant_id")?),
                timeline_id: TimelineId(r.id16("timeline_id")?),
                start_lsn: r.lsn("start_lsn")?,
                stop_lsn: r.lsn("stop_lsn")?,
                include_uncommitted: r.bool("include_uncommitted")?,
                consumer_id: r.string("consumer_id")?,
                // Versions 1 and 2 have no token field.
                token: if protocol_version >= 3 { Token::from_wire(r.string("token")?) } else { None },
                generation: if protocol_version >= 5 { r.u32("generation")? } else { 0 },
                shard: if protocol_version >= 8 {
                    let (number, count) = (r.u8("shard_number")?, r.u8("shard_count")?);
                    ShardIndex::from_wire(number, count)
                        .map_err(|detail| CodecError::InvalidShard { message: "StartStreaming", detail })?
                } else {
                    ShardIndex::UNSHARDED
                },
                format: if protocol_version >= 9 {
                    let v = r.u8("format")?;
                    StreamFormat::from_wire(v).ok_or(CodecError::InvalidFormat { value: v })?
                } else {
                    StreamFormat::Raw
                },
                stripe_blocks: if protocol_version >= 9 { r.u32("stripe_blocks")? } else { DEFAULT_STRIPE_BLOCKS },
            }))
        })
        .map_err(|e| version_aware(frame, e, OLDEST_CONSUMER_VERSION)),
        tag::CONSUMER_FEEDBACK => read(frame, "ConsumerFeedback", |r| {
            let applied_lsn = r.lsn("applied_lsn")?;
            let remote_consistent_lsn = r.lsn("remote_consistent_lsn")?;
            Ok(ConsumerMessage::Feedback(ConsumerFeedback { applied_lsn, remote_consistent_lsn }))
        }),
        tag => Err(CodecError::UnknownTag { direction: "consumer", tag }),
    }
}

/// Decodes a stream message from a frame's tag and payload.
pub fn decode_stream(frame: &[u8]) -> Result<StreamMessage, CodecError> {
    match frame_tag(frame)? {
        tag::STREAM_START => read(frame, "StreamStart", |r| {
            Ok(StreamMessage::Start(StreamStart {
                term: r.u64("term")?,
                flush_lsn: r.lsn("flush_lsn")?,
                commit_lsn: r.lsn("commit_lsn")?,
                timeline: r.identity()?,
                term_history: r.history("term_history")?,
            }))
        }),
        tag::WAL_DATA => read(frame, "WalData", |r| {
            let begin_lsn = r.lsn("begin_lsn")?;
            let commit_lsn = r.lsn("commit_lsn")?;
            let flush_lsn = r.lsn("flush_lsn")?;
            let wal = r.wal(begin_lsn)?;
            Ok(StreamMessage::Wal(WalData { begin_lsn, commit_lsn, flush_lsn, wal }))
        }),
        tag::DECODED_WAL => read(frame, "DecodedWal", |r| {
            let d = DecodedWal {
                begin_lsn: r.lsn("begin_lsn")?,
                end_lsn: r.lsn("end_lsn")?,
                last_record_lsn: r.lsn("last_record_lsn")?,
                read_lsn: r.lsn("read_lsn")?,
                commit_lsn: r.lsn("commit_lsn")?,
                flush_lsn: r.lsn("flush_lsn")?,
                batch_len: r.u32("batch_len")?,
                crc32c: r.u32("crc32c")?,
                payload: r.rest("payload")?.to_vec(),
            };
            if d.end_lsn < d.begin_lsn || d.read_lsn < d.end_lsn || d.last_record_lsn > d.end_lsn {
                return Err(CodecError::DecodedPositions {
                    begin: d.begin_lsn,
                    end: d.end_lsn,
                    last_record: d.last_record_lsn,
                    read: d.read_lsn,
                });
            }
            Ok(StreamMessage::Decoded(d))
        }),
        tag::KEEPALIVE => read(frame, "Keepalive", |r| {
            Ok(StreamMessage::Keepalive { commit_lsn: r.lsn("commit_lsn")?, flush_lsn: r.lsn("flush_lsn")? })
        }),
        tag::STREAM_ERROR => read(frame, "StreamError", |r| Ok(StreamMessage::Error(r.error()?))),
        tag => Err(CodecError::UnknownTag { direction: "stream", tag }),
    }
}

// ---------------------------------------------------------------------------
// Fuzzing
// ---------------------------------------------------------------------------

/// Fuzz entry point: every decoder over `data` as one frame and over each
/// frame in it; what decodes must re-encode to the same bytes
/// (`frame::fuzz_frames`).
pub fn fuzz_decode(data: &[u8]) {
    frame::fuzz_frames(data, split_frame, |frame, out| {
        if let Ok(m) = decode_proposer(frame) {
            encode_proposer(&m, out);
        }
        if let Ok(m) = decode_acceptor(frame) {
            encode_acceptor(&m, out);
        }
        if let Ok(m) = decode_consumer(frame) {
            encode_consumer(&m, out);
        }
        if let Ok(m) = decode_stream(frame) {
            encode_stream(&m, out);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_WAL_CHUNK;
    use strata_test_support::rng::{seeded, Rng, RngExt};

    fn history(entries: &[(u64, u64)]) -> TermHistory {
        TermHistory(entries.iter().map(|&(term, lsn)| TermLsn { term, lsn: Lsn(lsn) }).collect())
    }

    fn identity() -> TimelineIdentity {
        TimelineIdentity {
            tenant_id: TenantId(*b"tenant-id-16-byt"),
            timeline_id: TimelineId([0xA5; 16]),
            system_id: 0x0123_4567_89AB_CDEF,
            pg_version: 15,
            wal_segment_size: 16 << 20,
        }
    }

    /// One message of every variant, with non-trivial field values.
    #[derive(Clone, Debug, PartialEq)]
    enum Any {
        P(ProposerMessage),
        A(AcceptorMessage),
        C(ConsumerMessage),
        S(StreamMessage),
    }

    impl Any {
        /// The whole frame, length prefix included.
        fn encode(&self) -> Vec<u8> {
            let mut out = Vec::new();
            match self {
                Any::P(m) => encode_proposer(m, &mut out),
                Any::A(m) => encode_acceptor(m, &mut out),
                Any::C(m) => encode_consumer(m, &mut out),
                Any::S(m) => encode_stream(m, &mut out),
            }
            out
        }

        /// Decodes `frame` (tag and payload) with this message's decoder.
        fn decode_like(&self, frame: &[u8]) -> Result<Any, CodecError> {
            match self {
                Any::P(_) => decode_proposer(frame).map(Any::P),
                Any::A(_) => decode_acceptor(frame).map(Any::A),
                Any::C(_) => decode_consumer(frame).map(Any::C),
                Any::S(_) => decode_stream(frame).map(Any::S),
            }
        }

        /// Ends with WAL bytes (whose truncation only framing detects).
        fn ends_with_wal(&self) -> bool {
            matches!(
                self,
                Any::P(ProposerMessage::Append(_)) | Any::S(StreamMessage::Wal(_)) | Any::S(StreamMessage::Decoded(_))
            )
        }
    }

    fn samples() -> Vec<Any> {
        let h = history(&[(1, 0x0100_0028), (4, 0x0200_0000), (9, 0x0300_1234)]);
        vec![
            Any::P(ProposerMessage::Greeting(ProposerGreeting {
                protocol_version: PROTOCOL_VERSION,
                proposer_id: [0x5C; 16],
                timeline: identity(),
                membership: Membership::default(),
                token: Some(Token::new("eyJ0.eyJ0.c2ln".into())),
            })),
            Any::P(ProposerMessage::VoteRequest(VoteRequest { term: 0xDEAD_BEEF_0000_0007 })),
            Any::P(ProposerMessage::Elected(ProposerElected {
                term: 9,
                start_streaming_at: Lsn(0x0200_0100),
                term_history: h.clone(),
                timeline_start_lsn: Lsn(0x0100_0028),
            })),
            Any::P(ProposerMessage::Append(AppendRequest {
                term: 9,
                begin_lsn: Lsn(0x0300_1234),
                commit_lsn: Lsn(0x0300_1000),
                truncate_lsn: Lsn(0x0200_0000),
                wal: (0..=255u8).collect(),
            })),
            Any::P(ProposerMessage::Append(AppendRequest {
                term: 2,
                begin_lsn: Lsn(u64::MAX),
                commit_lsn: Lsn(1),
                truncate_lsn: Lsn(0),
                wal: Vec::new(),
            })),
            Any::A(AcceptorMessage::Greeting(AcceptorGreeting {
                protocol_version: PROTOCOL_VERSION,
                node_id: NodeId(u64::MAX - 3),
                term: 8,
                membership: Membership {
                    generation: 7,
                    members: vec![
                        Member::new(NodeId(1), "sk1:5454"),
                        Member::new(NodeId(2), "sk2:5454"),
                        Member::new(NodeId(3), "sk3:5454"),
                    ],
                    new_members: Some(vec![
                        Member::new(NodeId(1), "sk1:5454"),
                        Member::new(NodeId(2), "sk2:5454"),
                        Member::new(NodeId(4), "sk4:5454"),
                    ]),
                    ..Default::default()
                },
            })),
            Any::A(AcceptorMessage::VoteResponse(VoteResponse {
                term: 9,
                vote_given: true,
                flush_lsn: Lsn(0x0300_2000),
                truncate_lsn: Lsn(0x0200_0000),
                term_history: h.clone(),
                timeline_start_lsn: Lsn(0x0100_0028),
            })),
            Any::A(AcceptorMessage::VoteResponse(VoteResponse {
                term: 10,
                vote_given: false,
                flush_lsn: Lsn(0),
                truncate_lsn: Lsn(0),
                term_history: TermHistory::default(),
                timeline_start_lsn: Lsn(0),
            })),
            Any::A(AcceptorMessage::AppendResponse(AppendResponse {
                term: 9,
                flush_lsn: Lsn(0x0300_1334),
                commit_lsn: Lsn(0x0300_1234),
                consumer_applied_lsn: Lsn(0x0300_1000),
            })),
            Any::A(AcceptorMessage::Error(ErrorMessage {
                code: ErrorCode::TermSuperseded,
                message: "term 9 superseded by 11 — ünïcödé".into(),
            })),
            Any::C(ConsumerMessage::Start(StartStreaming {
                protocol_version: PROTOCOL_VERSION,
                tenant_id: TenantId([1; 16]),
                timeline_id: TimelineId([2; 16]),
                start_lsn: Lsn(0x0100_0028),
                stop_lsn: Lsn(0x0300_0000),
                include_uncommitted: true,
                consumer_id: "pageserver-7".into(),
                token: None,
                generation: 4,
                shard: ShardIndex::new(1, 2).unwrap(),
                format: StreamFormat::Decoded,
                stripe_blocks: 256,
            })),
            Any::C(ConsumerMessage::Feedback(ConsumerFeedback {
                applied_lsn: Lsn(0x0250_0000),
                remote_consistent_lsn: Lsn(0x0240_0000),
            })),
            Any::S(StreamMessage::Start(StreamStart {
                term: 9,
                term_history: h,
                flush_lsn: Lsn(0x0300_2000),
                commit_lsn: Lsn(0x0300_1234),
                timeline: identity(),
            })),
            Any::S(StreamMessage::Wal(WalData {
                begin_lsn: Lsn(0x0300_0000),
                commit_lsn: Lsn(0x0300_1234),
                flush_lsn: Lsn(0x0300_2000),
                wal: b"some WAL bytes".to_vec(),
            })),
            Any::S(StreamMessage::Keepalive { commit_lsn: Lsn(77), flush_lsn: Lsn(78) }),
            Any::S(StreamMessage::Decoded(DecodedWal {
                begin_lsn: Lsn(0x0300_0000),
                end_lsn: Lsn(0x0300_1000),
                last_record_lsn: Lsn(0x0300_0f80),
                read_lsn: Lsn(0x0300_1010),
                commit_lsn: Lsn(0x0300_1234),
                flush_lsn: Lsn(0x0300_2000),
                batch_len: 4096,
                crc32c: 0xdead_beef,
                payload: b"compressed".to_vec(),
            })),
            Any::S(StreamMessage::Error(ErrorMessage {
                code: ErrorCode::RecordTooLarge,
                message: "at 0/3000F80".into(),
            })),
            Any::S(StreamMessage::Error(ErrorMessage { code: ErrorCode::NotFound, message: String::new() })),
            Any::A(AcceptorMessage::StandbyFeedback(StandbyFeedback { xmin: (1 << 32) | 731, catalog_xmin: 0 })),
            Any::A(AcceptorMessage::Greeting(AcceptorGreeting {
                protocol_version: PROTOCOL_VERSION,
                node_id: NodeId(2),
                term: 9,
                membership: Membership {
                    generation: 8,
                    members: [(1, "dc1"), (2, "dc1"), (3, "dc2")]
                        .map(|(i, site)| Member {
                            site: Some(site.into()),
                            ..Member::new(NodeId(i), format!("sk{i}:1"))
                        })
                        .to_vec(),
                    new_members: None,
                    placement: Placement::Stretched,
                    new_placement: Some(Placement::LocalQuorum {
                        home: "dc2".into(),
                        max_async_lag: 1 << 30,
                        on_async_lag: OnAsyncLag::Throttle,
                    }),
                },
            })),
        ]
    }

    #[test]
    fn every_variant_round_trips() {
        for m in samples() {
            let bytes = m.encode();
            let (consumed, frame) = split_frame(&bytes).unwrap().expect("a whole frame");
            assert_eq!(consumed, bytes.len());
            assert_eq!(m.decode_like(frame).unwrap(), m);
            // Only the decoder of its direction accepts it.
            let accepted = [
                decode_proposer(frame).is_ok(),
                decode_acceptor(frame).is_ok(),
                decode_consumer(frame).is_ok(),
                decode_stream(frame).is_ok(),
            ];
            assert_eq!(accepted.iter().filter(|&&ok| ok).count(), 1, "{m:?}");
            fuzz_decode(&bytes);
        }
    }

    #[test]
    fn frames_concatenate() {
        let all = samples();
        let mut stream = Vec::new();
        for m in &all {
            stream.extend(m.encode());
        }
        let mut rest = &stream[..];
        for m in &all {
            let (consumed, frame) = split_frame(rest).unwrap().unwrap();
            assert_eq!(m.decode_like(frame).unwrap(), *m);
            rest = &rest[consumed..];
        }
        assert_eq!(split_frame(rest), Ok(None));
    }

    #[test]
    fn truncation_is_detected_everywhere() {
        for m in samples() {
            let bytes = m.encode();
            // Framing: any prefix of the frame is incomplete.
            for cut in 0..bytes.len() {
                assert_eq!(split_frame(&bytes[..cut]), Ok(None), "{m:?} cut at {cut}");
            }
            // Decoding: a cut frame fails, except inside the WAL that ends a
            // message (its length comes from the frame, checked above).
            let frame = &bytes[LENGTH_SIZE..];
            let fixed = match &m {
                Any::P(ProposerMessage::Append(a)) => frame.len() - a.wal.len(),
                Any::S(StreamMessage::Wal(w)) => frame.len() - w.wal.len(),
                Any::S(StreamMessage::Decoded(d)) => frame.len() - d.payload.len(),
                _ => frame.len(),
            };
            for cut in 0..frame.len() {
                let result = m.decode_like(&frame[..cut]);
                if cut < fixed {
                    let err = result.expect_err("a cut frame must not decode");
                    let expected = if cut == 0 { "EmptyFrame" } else { "Truncated" };
                    assert!(format!("{err:?}").starts_with(expected), "{m:?} cut at {cut}: {err:?}");
                } else {
                    assert!(m.ends_with_wal());
                    assert!(result.is_ok());
                }
            }
        }
    }

    #[test]
    fn standby_feedback_vector() {
        let f = StandbyFeedback { xmin: 0x0000_0002_0000_02DB, catalog_xmin: 0x0000_0002_0000_0100 };
        let bytes = Any::A(AcceptorMessage::StandbyFeedback(f)).encode();
        // Little-endian, as every field: the frame's length, the tag, xmin, catalog_xmin.
        let mut expect = vec![17, 0, 0, 0, 0x84];
        expect.extend_from_slice(&[0xDB, 2, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 0]);
        assert_eq!(bytes, expect);
        assert_eq!(decode_acceptor(&bytes[LENGTH_SIZE..]).unwrap(), AcceptorMessage::StandbyFeedback(f));
    }

    #[test]
    fn truncation_error_names_message_and_field() {
        let bytes = Any::A(AcceptorMessage::AppendResponse(AppendResponse {
            term: 1,
            flush_lsn: Lsn(2),
            commit_lsn: Lsn(3),
            consumer_applied_lsn: Lsn(4),
        }))
        .encode();
        let err = decode_acceptor(&bytes[LENGTH_SIZE..bytes.len() - 1]).unwrap_err();
        assert_eq!(
            err,
            CodecError::Truncated {
                message: "AppendResponse",
                field: "consumer_applied_lsn",
                offset: 25,
                needed: 8,
                available: 7
            }
        );
        assert!(err.to_string().contains("AppendResponse") && err.to_string().contains("consumer_applied_lsn"));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        for m in samples().into_iter().filter(|m| !m.ends_with_wal()) {
            let mut bytes = m.encode();
            bytes.push(0);
            let err = m.decode_like(&bytes[LENGTH_SIZE..]).unwrap_err();
            assert!(matches!(err, CodecError::TrailingBytes { count: 1, .. }), "{m:?}: {err:?}");
        }
    }

    #[test]
    fn unknown_tags_are_rejected() {
        for tag in 0..=255u8 {
            let frame = [tag, 0, 0, 0, 0, 0, 0, 0, 0];
            if !(0x01..=0x04).contains(&tag) {
                assert_eq!(decode_proposer(&frame), Err(CodecError::UnknownTag { direction: "proposer", tag }));
            }
            if !(0x81..=0x84).contains(&tag) && tag != 0x8F {
                assert_eq!(decode_acceptor(&frame), Err(CodecError::UnknownTag { direction: "acceptor", tag }));
            }
            if !(0x10..=0x11).contains(&tag) {
                assert_eq!(decode_consumer(&frame), Err(CodecError::UnknownTag { direction: "consumer", tag }));
            }
            if !(0x90..=0x93).contains(&tag) && tag != 0x9F {
                assert_eq!(decode_stream(&frame), Err(CodecError::UnknownTag { direction: "stream", tag }));
            }
        }
        for decode in [
            |f: &[u8]| decode_proposer(f).map(drop),
            |f: &[u8]| decode_acceptor(f).map(drop),
            |f: &[u8]| decode_consumer(f).map(drop),
            |f: &[u8]| decode_stream(f).map(drop),
        ] {
            assert_eq!(decode(&[]), Err(CodecError::EmptyFrame));
        }
    }

    #[test]
    fn frame_lengths_are_bounded() {
        assert_eq!(split_frame(&[0, 0, 0, 0, 1]), Err(CodecError::EmptyFrame));
        let too_big = (MAX_FRAME_SIZE as u32 + 1).to_le_bytes();
        assert_eq!(split_frame(&too_big), Err(CodecError::FrameTooLarge { len: MAX_FRAME_SIZE + 1 }));
        assert_eq!(split_frame(&u32::MAX.to_le_bytes()), Err(CodecError::FrameTooLarge { len: u32::MAX as usize }));
        // The largest frame is only waited for.
        assert_eq!(split_frame(&(MAX_FRAME_SIZE as u32).to_le_bytes()), Ok(None));
        assert_eq!(split_frame(&[1, 0, 0]), Ok(None));

        // A maximal WAL chunk fits; one more byte than a frame may hold does not decode.
        let append = |wal: Vec<u8>| {
            ProposerMessage::Append(AppendRequest {
                term: 1,
                begin_lsn: Lsn(0),
                commit_lsn: Lsn(0),
                truncate_lsn: Lsn(0),
                wal,
            })
        };
        let msg = append(vec![7; MAX_WAL_CHUNK]);
        let mut out = Vec::new();
        encode_proposer(&msg, &mut out);
        let (consumed, frame) = split_frame(&out).unwrap().unwrap();
        assert_eq!(consumed, out.len());
        assert_eq!(decode_proposer(frame).unwrap(), msg);
        let mut huge = vec![tag::APPEND_REQUEST];
        huge.resize(MAX_FRAME_SIZE + 1, 0);
        assert_eq!(decode_proposer(&huge), Err(CodecError::FrameTooLarge { len: MAX_FRAME_SIZE + 1 }));
    }

    #[test]
    fn an_append_encoded_from_parts_is_the_append_encoded_whole() {
        let wal: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let whole = ProposerMessage::Append(AppendRequest {
            term: 9,
            begin_lsn: Lsn(0x0100_0028),
            commit_lsn: Lsn(0x0100_0000),
            truncate_lsn: Lsn(0x00F0_0000),
            wal: wal.clone(),
        });
        let mut expected = Vec::new();
        encode_proposer(&whole, &mut expected);
        // Every way a ring may split the WAL, after a frame already in the buffer.
        for cut in [0, 1, 2500, 4999, 5000] {
            let mut out = vec![0xAA; 3];
            let (a, b) = wal.split_at(cut);
            encode_append(9, Lsn(0x0100_0028), Lsn(0x0100_0000), Lsn(0x00F0_0000), [a, b], &mut out);
            assert_eq!(out[..3], [0xAA; 3]);
            assert_eq!(out[3..], expected[..], "cut at {cut}");
        }
        // An empty append (a commit LSN update alone).
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_proposer(
            &ProposerMessage::Append(AppendRequest {
                term: 2,
                begin_lsn: Lsn(8),
                commit_lsn: Lsn(8),
                truncate_lsn: Lsn(0),
                wal: Vec::new(),
            }),
            &mut a,
        );
        encode_append(2, Lsn(8), Lsn(8), Lsn(0), [&[], &[]], &mut b);
        assert_eq!(a, b);
    }

    #[test]
    #[should_panic(expected = "exceeds the protocol limit")]
    fn encoding_an_oversized_frame_panics() {
        let msg = StreamMessage::Wal(WalData {
            begin_lsn: Lsn(0),
            commit_lsn: Lsn(0),
            flush_lsn: Lsn(0),
            wal: vec![0; MAX_FRAME_SIZE],
        });
        encode_stream(&msg, &mut Vec::new());
    }

    #[test]
    fn placements_that_are_unknown_or_unsatisfiable_are_rejected() {
        // The last sample: members in dc1 and dc2, stretched moving to
        // local-quorum at home in dc2 with `throttle` (its last byte).
        let frame = samples().last().unwrap().encode()[LENGTH_SIZE..].to_vec();
        assert!(decode_acceptor(&frame).is_ok());
        let invalid = |bytes: &[u8], needle: &str| match decode_acceptor(bytes) {
            Err(CodecError::InvalidMembership { detail, .. }) => assert!(detail.contains(needle), "{detail}"),
            other => panic!("accepted or another error: {other:?}"),
        };
        let mut bad = frame.clone();
        *bad.last_mut().unwrap() = 2;
        invalid(&bad, "on_async_lag");
        // The new placement's kind: before the home (4 + 3 bytes), the lag (8) and the action (1).
        let mut bad = frame.clone();
        let at = bad.len() - 17;
        assert_eq!(bad[at], 1, "local-quorum's kind");
        bad[at] = 9;
        invalid(&bad, "unknown placement");
        // Both members in dc1: stretched cannot be satisfied.
        let mut bad = frame.clone();
        let dc2 = bad.windows(3).position(|w| w == b"dc2").unwrap();
        bad[dc2 + 2] = b'1';
        invalid(&bad, "stretched");
    }

    #[test]
    fn invalid_bools_are_rejected() {
        let vote = samples()[6].encode();
        // Tag, then the u64 term: vote_given is at frame offset 9.
        for value in [2u8, 0x80, 0xFF] {
            let mut frame = vote[LENGTH_SIZE..].to_vec();
            frame[9] = value;
            assert_eq!(
                decode_acceptor(&frame),
                Err(CodecError::InvalidBool { message: "VoteResponse", field: "vote_given", value })
            );
        }
        let start = samples()[10].encode();
        let mut frame = start[LENGTH_SIZE..].to_vec();
        // Tag, version, two ids, two LSNs: include_uncommitted is at 1 + 4 + 32 + 16.
        frame[53] = 7;
        assert_eq!(
            decode_consumer(&frame),
            Err(CodecError::InvalidBool { message: "StartStreaming", field: "include_uncommitted", value: 7 })
        );
    }

    #[test]
    fn strings_are_checked() {
        let error = |message: &[u8]| {
            let mut frame = vec![tag::ACCEPTOR_ERROR, 1, 0];
            frame.extend((message.len() as u32).to_le_bytes());
            frame.extend(message);
            decode_acceptor(&frame)
        };
        assert!(error(b"fine").is_ok());
        assert!(matches!(error(b"bad \xFF utf-8"), Err(CodecError::BadUtf8 { valid_up_to: 4, .. })));
        assert!(matches!(error(&[b'x'; MAX_STRING_LEN + 1]), Err(CodecError::StringTooLong { len: 4097, .. })));
        assert!(error(&[b'x'; MAX_STRING_LEN]).is_ok());
        // A hostile length fails before anything is allocated.
        let frame = [tag::STREAM_ERROR, 1, 0, 0xFF, 0xFF, 0xFF, 0xFF];
        assert!(matches!(decode_stream(&frame), Err(CodecError::StringTooLong { .. })));
        // Unknown error codes.
        let frame = [tag::STREAM_ERROR, 8, 0, 0, 0, 0, 0];
        assert!(decode_stream(&frame).is_ok(), "Overloaded");
        let frame = [tag::STREAM_ERROR, 9, 0, 0, 0, 0, 0];
        assert!(decode_stream(&frame).is_ok(), "WalRemoved");
        let frame = [tag::ACCEPTOR_ERROR, 10, 0, 0, 0, 0, 0];
        assert!(decode_acceptor(&frame).is_ok(), "MembershipChanged");
        let frame = [tag::STREAM_ERROR, 12, 0, 0, 0, 0, 0];
        assert!(decode_stream(&frame).is_ok(), "Forbidden");
        let frame = [tag::STREAM_ERROR, 13, 0, 0, 0, 0, 0];
        assert!(decode_stream(&frame).is_ok(), "StaleGeneration");
        let frame = [tag::ACCEPTOR_ERROR, 14, 0, 0, 0, 0, 0];
        assert!(
            matches!(decode_acceptor(&frame), Ok(AcceptorMessage::Error(ErrorMessage { code: ErrorCode::Sealed, .. }))),
            "Sealed"
        );
        let frame = [tag::STREAM_ERROR, 15, 0, 0, 0, 0, 0];
        assert!(
            matches!(
                decode_stream(&frame),
                Ok(StreamMessage::Error(ErrorMessage { code: ErrorCode::RecordTooLarge, .. }))
            ),
            "RecordTooLarge"
        );
        let frame = [tag::STREAM_ERROR, 16, 0, 0, 0, 0, 0];
        assert!(matches!(decode_stream(&frame), Err(CodecError::UnknownErrorCode { code: 16, .. })));
        let frame = [tag::STREAM_ERROR, 0, 0, 0, 0, 0, 0];
        assert!(matches!(decode_stream(&frame), Err(CodecError::UnknownErrorCode { code: 0, .. })));

        // Encoding cuts long strings at a character boundary.
        let long = "é".repeat(MAX_STRING_LEN);
        let mut out = Vec::new();
        encode_acceptor(&AcceptorMessage::Error(ErrorMessage { code: ErrorCode::Internal, message: long }), &mut out);
        let Ok(AcceptorMessage::Error(e)) = decode_acceptor(&out[LENGTH_SIZE..]) else { panic!("decodes") };
        assert_eq!(e.message, "é".repeat(MAX_STRING_LEN / 2));
    }

    #[test]
    fn histories_are_checked() {
        let elected = |count: u32, entries: &[(u64, u64)]| {
            let mut frame = vec![tag::PROPOSER_ELECTED];
            frame.extend([0u8; 24]);
            frame.extend(count.to_le_bytes());
            for &(term, lsn) in entries {
                frame.extend(term.to_le_bytes());
                frame.extend(lsn.to_le_bytes());
            }
            decode_proposer(&frame)
        };
        assert!(elected(2, &[(1, 10), (2, 10)]).is_ok());
        assert!(matches!(elected(2, &[(2, 10), (2, 20)]), Err(CodecError::InvalidHistory { .. })));
        assert!(matches!(elected(2, &[(1, 20), (2, 10)]), Err(CodecError::InvalidHistory { .. })));
        assert!(matches!(elected(3, &[(1, 20), (2, 30)]), Err(CodecError::Truncated { needed: 48, .. })));
        assert!(matches!(elected(u32::MAX, &[]), Err(CodecError::HistoryTooLong { .. })));
        let max: Vec<(u64, u64)> = (1..=MAX_HISTORY_ENTRIES as u64).map(|t| (t, t * 8)).collect();
        assert!(elected(MAX_HISTORY_ENTRIES as u32, &max).is_ok());
        let over: Vec<(u64, u64)> = (1..=MAX_HISTORY_ENTRIES as u64 + 1).map(|t| (t, t * 8)).collect();
        assert!(matches!(elected(over.len() as u32, &over), Err(CodecError::HistoryTooLong { count: 10_001, .. })));
    }

    #[test]
    fn wal_must_fit_in_the_lsn_space() {
        let mut frame = vec![tag::WAL_DATA];
        frame.extend((u64::MAX - 1).to_le_bytes());
        frame.extend([0u8; 16]);
        frame.push(0xAA);
        assert!(decode_stream(&frame).is_ok(), "ends exactly at u64::MAX");
        frame.push(0xBB);
        assert!(matches!(decode_stream(&frame), Err(CodecError::LsnOverflow { len: 2, .. })));
    }

    #[test]
    fn other_versions_are_reported_as_such() {
        let Any::P(ProposerMessage::Greeting(mut g)) = samples()[0].clone() else { unreachable!() };
        g.protocol_version = PROTOCOL_VERSION + 1;
        let mut out = Vec::new();
        encode_proposer(&ProposerMessage::Greeting(g.clone()), &mut out);
        // Same layout: decodes, and the acceptor refuses the version itself.
        assert_eq!(decode_proposer(&out[LENGTH_SIZE..]), Ok(ProposerMessage::Greeting(g)));
        assert_eq!(peek_version(&out[LENGTH_SIZE..]), Some(PROTOCOL_VERSION + 1));
        // A longer greeting of the other version.
        out.extend([1, 2, 3]);
        let err = decode_proposer(&out[LENGTH_SIZE..]).unwrap_err();
        assert!(
            matches!(err, CodecError::UnsupportedVersion { version, .. } if version == PROTOCOL_VERSION + 1),
            "{err:?}"
        );
        // The same damage to a greeting of this version is a plain decoding error.
        let mut out = samples()[0].encode();
        out.push(0);
        assert!(matches!(decode_proposer(&out[LENGTH_SIZE..]), Err(CodecError::TrailingBytes { count: 1, .. })));
        // Stream requests likewise.
        let next = PROTOCOL_VERSION as u8 + 1;
        let frame = [tag::START_STREAMING, next, 0, 0, 0, 9];
        assert!(
            matches!(decode_consumer(&frame), Err(CodecError::UnsupportedVersion { version, .. }) if version == u32::from(next))
        );
        // Damaged stream requests of the older versions consumers may still
        // speak are plain decoding errors.
        for version in 1..PROTOCOL_VERSION as u8 {
            let frame = [tag::START_STREAMING, version, 0, 0, 0, 9];
            assert!(matches!(decode_consumer(&frame), Err(CodecError::Truncated { .. })), "version {version}");
        }
        assert_eq!(peek_version(&[tag::VOTE_REQUEST, 1, 0, 0, 0]), None);
    }

    /// Random protocol values for the randomized test, from the tests' seeded generator.
    struct Gen(Rng);

    impl Gen {
        fn next_u64(&mut self) -> u64 {
            self.0.u64(..)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.0.below(n)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            self.0.bytes(n)
        }
        fn lsn(&mut self) -> Lsn {
            // Mostly small values, sometimes anything.
            Lsn(if self.below(4) == 0 { self.next_u64() } else { self.below(1 << 32) })
        }
        fn history(&mut self) -> TermHistory {
            let mut term = 0;
            let mut lsn = 0;
            let n = self.below(6);
            TermHistory(
                (0..n)
                    .map(|_| {
                        term += 1 + self.below(3);
                        lsn += self.below(1000);
                        TermLsn { term, lsn: Lsn(lsn) }
                    })
                    .collect(),
            )
        }
        fn string(&mut self) -> String {
            const PIECES: [&str; 5] = ["a", "Ω", "ß", "🦀", "-"];
            (0..self.below(12)).map(|_| PIECES[self.below(5) as usize]).collect()
        }
        fn identity(&mut self) -> TimelineIdentity {
            TimelineIdentity {
                tenant_id: TenantId(self.bytes(16).try_into().unwrap()),
                timeline_id: TimelineId(self.bytes(16).try_into().unwrap()),
                system_id: self.next_u64(),
                pg_version: self.next_u64() as u32,
                wal_segment_size: self.next_u64() as u32,
            }
        }
        fn error(&mut self) -> ErrorMessage {
            ErrorMessage { code: error_code(1 + self.below(15) as u16).unwrap(), message: self.string() }
        }
        fn membership(&mut self) -> Membership {
            if self.below(3) == 0 {
                return Membership::default();
            }
            let sited = self.below(2) == 0;
            let set = |first: u64, n: u64| -> Vec<Member> {
                (0..n)
                    .map(|i| Member {
                        site: sited.then(|| format!("dc{}", i % 2 + 1)),
                        ..Member::new(NodeId(first + i), format!("sk{i}:1"))
                    })
                    .collect()
            };
            let members = set(1, 2 + self.below(4));
            let n = 2 + self.below(4);
            let new_members = (self.below(2) == 0).then(|| set(3, n));
            let placement = |r: &mut Self| match (sited, r.below(3)) {
                (true, 1) => Placement::LocalQuorum {
                    home: "dc1".into(),
                    max_async_lag: 1 + r.below(1 << 40),
                    on_async_lag: if r.below(2) == 0 { OnAsyncLag::FallBehind } else { OnAsyncLag::Throttle },
                },
                (true, 2) => Placement::Stretched,
                _ => Placement::Majority,
            };
            let first = placement(self);
            let new_placement = (self.below(3) == 0).then(|| placement(self));
            Membership { generation: 1 + self.below(100) as u32, members, new_members, placement: first, new_placement }
        }

        fn wal(&mut self) -> Vec<u8> {
            let n = self.below(40) as usize;
            self.bytes(n)
        }

        fn message(&mut self) -> Any {
            match self.below(16) {
                0 => Any::P(ProposerMessage::Greeting(ProposerGreeting {
                    protocol_version: self.below(3) as u32,
                    proposer_id: self.bytes(16).try_into().unwrap(),
                    timeline: self.identity(),
                    membership: self.membership(),
                    token: Token::from_wire(self.string()),
                })),
                1 => Any::P(ProposerMessage::VoteRequest(VoteRequest { term: self.next_u64() })),
                2 => Any::P(ProposerMessage::Elected(ProposerElected {
                    term: self.next_u64(),
                    start_streaming_at: self.lsn(),
                    term_history: self.history(),
                    timeline_start_lsn: self.lsn(),
                })),
                3 => Any::P(ProposerMessage::Append(AppendRequest {
                    term: self.next_u64(),
                    begin_lsn: Lsn(self.below(1 << 40)),
                    commit_lsn: self.lsn(),
                    truncate_lsn: self.lsn(),
                    wal: self.wal(),
                })),
                4 => Any::A(AcceptorMessage::Greeting(AcceptorGreeting {
                    protocol_version: self.next_u64() as u32,
                    node_id: NodeId(self.next_u64()),
                    term: self.next_u64(),
                    membership: self.membership(),
                })),
                5 => Any::A(AcceptorMessage::VoteResponse(VoteResponse {
                    term: self.next_u64(),
                    vote_given: self.below(2) == 1,
                    flush_lsn: self.lsn(),
                    truncate_lsn: self.lsn(),
                    term_history: self.history(),
                    timeline_start_lsn: self.lsn(),
                })),
                6 => Any::A(AcceptorMessage::AppendResponse(AppendResponse {
                    term: self.next_u64(),
                    flush_lsn: self.lsn(),
                    commit_lsn: self.lsn(),
                    consumer_applied_lsn: self.lsn(),
                })),
                7 => Any::A(AcceptorMessage::Error(self.error())),
                8 => {
                    let protocol_version = 1 + self.below(PROTOCOL_VERSION as u64) as u32;
                    let shard = match (protocol_version >= 8, self.below(3)) {
                        (true, 1) => ShardIndex::new(0, 2).unwrap(),
                        (true, 2) => ShardIndex::new(3, 4).unwrap(),
                        _ => ShardIndex::UNSHARDED,
                    };
                    Any::C(ConsumerMessage::Start(StartStreaming {
                        protocol_version,
                        tenant_id: TenantId(self.bytes(16).try_into().unwrap()),
                        timeline_id: TimelineId(self.bytes(16).try_into().unwrap()),
                        start_lsn: self.lsn(),
                        stop_lsn: self.lsn(),
                        include_uncommitted: self.below(2) == 0,
                        consumer_id: self.string(),
                        // Only version 3 and later carry a token.
                        token: if protocol_version >= 3 { Token::from_wire(self.string()) } else { None },
                        generation: if protocol_version >= 5 { self.next_u64() as u32 } else { 0 },
                        shard,
                        format: if protocol_version >= 9 && self.below(2) == 1 {
                            StreamFormat::Decoded
                        } else {
                            StreamFormat::Raw
                        },
                        stripe_blocks: if protocol_version >= 9 {
                            self.next_u64() as u32
                        } else {
                            DEFAULT_STRIPE_BLOCKS
                        },
                    }))
                }
                9 => Any::C(ConsumerMessage::Feedback(ConsumerFeedback {
                    applied_lsn: self.lsn(),
                    remote_consistent_lsn: self.lsn(),
                })),
                10 => Any::S(StreamMessage::Start(StreamStart {
                    term: self.next_u64(),
                    term_history: self.history(),
                    flush_lsn: self.lsn(),
                    commit_lsn: self.lsn(),
                    timeline: self.identity(),
                })),
                11 => Any::S(StreamMessage::Wal(WalData {
                    begin_lsn: Lsn(self.below(1 << 40)),
                    commit_lsn: self.lsn(),
                    flush_lsn: self.lsn(),
                    wal: self.wal(),
                })),
                12 => Any::S(StreamMessage::Keepalive { commit_lsn: self.lsn(), flush_lsn: self.lsn() }),
                14 => {
                    let begin = self.below(1 << 40);
                    let end = begin + self.below(1 << 20);
                    Any::S(StreamMessage::Decoded(DecodedWal {
                        begin_lsn: Lsn(begin),
                        end_lsn: Lsn(end),
                        last_record_lsn: Lsn(end.saturating_sub(self.below(100)).max(begin)),
                        read_lsn: Lsn(end + self.below(100)),
                        commit_lsn: self.lsn(),
                        flush_lsn: self.lsn(),
                        batch_len: self.next_u64() as u32,
                        crc32c: self.next_u64() as u32,
                        payload: self.wal(),
                    }))
                }
                13 => Any::A(AcceptorMessage::StandbyFeedback(StandbyFeedback {
                    xmin: self.next_u64(),
                    catalog_xmin: self.next_u64(),
                })),
                _ => Any::S(StreamMessage::Error(self.error())),
            }
        }

        /// Damages an encoded frame (length prefix included) in one of several ways.
        fn mutate(&mut self, bytes: &mut Vec<u8>) {
            let len = bytes.len() as u64;
            // Short inputs only get the mutations that need no frame structure.
            let kinds = if bytes.len() > LENGTH_SIZE + 1 { 7 } else { 4 };
            match self.below(kinds) {
                0 => {
                    let i = self.below(len) as usize;
                    bytes[i] ^= 1 << self.below(8);
                }
                1 => {
                    let i = self.below(len) as usize;
                    bytes[i] = self.next_u64() as u8;
                }
                2 => bytes.truncate(self.below(len) as usize),
                3 => {
                    let i = self.below(len + 1) as usize;
                    bytes.insert(i, self.next_u64() as u8);
                }
                4 => bytes[LENGTH_SIZE] = self.next_u64() as u8,
                5 => {
                    // A plausible length prefix that disagrees with the content.
                    let n = (len - 4).saturating_add_signed(self.below(9) as i64 - 4) as u32;
                    bytes[..LENGTH_SIZE].copy_from_slice(&n.to_le_bytes());
                }
                _ => {
                    // A count or length field made large.
                    let i = LENGTH_SIZE + 1 + self.below(len - 5).min(64) as usize;
                    if i < bytes.len() {
                        bytes[i] = 0xFF;
                    }
                }
            }
        }
    }

    #[test]
    fn randomized_frames_never_panic() {
        let mut rng = Gen(seeded("safekeeper codec round trips", 0x9E37_79B9_7F4A_7C15));
        let (mut decoded, mut rejected) = (0usize, 0usize);
        for i in 0..20_000 {
            let m = rng.message();
            let mut bytes = m.encode();
            // Valid frames round-trip.
            assert_eq!(m.decode_like(&bytes[LENGTH_SIZE..]).as_ref(), Ok(&m));
            match i % 4 {
                0 => {}
                1 | 2 => {
                    for _ in 0..1 + rng.below(3) {
                        if !bytes.is_empty() {
                            rng.mutate(&mut bytes);
                        }
                    }
                }
                _ => {
                    let n = rng.below(80) as usize;
                    bytes = rng.bytes(n);
                }
            }
            fuzz_decode(&bytes);
            // Count outcomes to make sure both paths are exercised.
            if bytes.len() > LENGTH_SIZE && m.decode_like(&bytes[LENGTH_SIZE..]).is_ok() {
                decoded += 1;
            } else {
                rejected += 1;
            }
            // A stream of two frames: the second may be damaged.
            let mut two = rng.message().encode();
            two.extend(&bytes);
            fuzz_decode(&two);
        }
        assert!(decoded > 6_000 && rejected > 8_000, "decoded {decoded}, rejected {rejected}");
    }
}
