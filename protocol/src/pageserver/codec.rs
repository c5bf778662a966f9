//! Byte layout of the page service protocol (specified in
//! `docs/pageserver-protocol.md`).
//!
//! Every message travels in one frame, as in the safekeeper protocol:
//!
//! ```text
//! u32 length (little-endian) | u8 tag | payload
//! ```
//!
//! `length` counts the tag and the payload (never the length field itself)
//! and is between 1 and [`MAX_FRAME_SIZE`]. Fields follow each other without
//! padding:
//!
//! - integers are fixed-width little-endian; an LSN or a request id is a `u64`;
//! - a bool is one byte, 0 or 1 (any other value is rejected);
//! - tenant and timeline ids are their 16 raw bytes;
//! - a page address is laid out like PostgreSQL's `BufferTag`: `u32`
//!   tablespace, database, relfilenode, fork number, block number;
//! - a string is a `u32` byte count and that many bytes of UTF-8 (at most
//!   [`MAX_STRING_LEN`] bytes);
//! - page and segment bytes come last in their message and extend to the end
//!   of the frame.
//!
//! Decoding never panics, whatever the input, and rejects trailing bytes, so
//! every message has exactly one encoding.

use strata_formats::types::{ForkNumber, RelFileNode};

use super::{
    ClientMessage, ErrorCode, Hello, PageRequest, ServerMessage, SlruKind, MAX_SEGMENT_SIZE, PAGE_PROTOCOL_MIN_VERSION,
    PAGE_PROTOCOL_VERSION, PAGE_SIZE,
};
use crate::frame::{self, FieldError, Fields, FrameWriter};
use crate::ids::{TenantId, TimelineId};
use crate::shard::{ShardIndex, TenantShardId};
use crate::token::Token;

/// Size of the length prefix of a frame.
pub const LENGTH_SIZE: usize = frame::LENGTH_SIZE;
/// Largest value of a frame's length field (see [`crate::limits`]).
pub use crate::limits::PAGESERVER_MAX_FRAME_SIZE as MAX_FRAME_SIZE;
use crate::limits::PAGESERVER_MAX_STRING_LEN as MAX_STRING_LEN;
/// Length field of every `GetPage` frame (tag and payload).
pub const GET_PAGE_LEN: usize = 37;
/// Length field of every `Page` frame (tag, id and page).
pub const PAGE_LEN: usize = 1 + 8 + PAGE_SIZE;

// The largest answers (a page; a whole SLRU segment after its tag and id)
// fit a frame.
const _: () = assert!(PAGE_LEN <= MAX_FRAME_SIZE && 1 + 8 + MAX_SEGMENT_SIZE <= MAX_FRAME_SIZE);
// A full pipeline of the largest request fits easily in socket buffers.
const _: () = assert!(crate::limits::MAX_PIPELINE_DEPTH * (LENGTH_SIZE + GET_PAGE_LEN) < 8192);

/// Message tags: `0x01` the greeting, `0x10..=0x1F` requests; the high bit is
/// set on messages sent by the pageserver. `0x00` is never used.
pub mod tag {
    pub const HELLO: u8 = 0x01;
    pub const GET_PAGE: u8 = 0x10;
    pub const REL_EXISTS: u8 = 0x11;
    pub const REL_SIZE: u8 = 0x12;
    pub const DB_SIZE: u8 = 0x13;
    pub const SLRU_SEGMENT: u8 = 0x14;

    pub const HELLO_OK: u8 = 0x81;
    pub const PAGE: u8 = 0x90;
    pub const EXISTS: u8 = 0x91;
    pub const SIZE: u8 = 0x92;
    pub const DB_SIZE_RESPONSE: u8 = 0x93;
    pub const SEGMENT: u8 = 0x94;
    pub const ERROR: u8 = 0x9F;
}

/// What was wrong with a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
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
    #[error("{message}: unknown error code {code}")]
    UnknownErrorCode { message: &'static str, code: u16 },
    #[error("{message}: unknown fork number {fork}")]
    UnknownFork { message: &'static str, fork: u32 },
    #[error("{message}: unknown SLRU kind {kind}")]
    UnknownSlruKind { message: &'static str, kind: u8 },
    #[error("{message}: request id 0 is reserved for connection-level errors")]
    ZeroId { message: &'static str },
    #[error("Hello: {detail}")]
    BadShard { detail: String },
    #[error("Page: {len} page bytes, a page is exactly {PAGE_SIZE}")]
    BadPageSize { len: usize },
    #[error("Segment: {len} bytes, a segment is a whole number of {PAGE_SIZE}-byte pages, at most {MAX_SEGMENT_SIZE}")]
    BadSegmentSize { len: usize },
    /// A hello of another protocol version that this build cannot decode; the
    /// answer is an error with [`ErrorCode::Version`].
    #[error("protocol version {version} is not supported (this build speaks {PAGE_PROTOCOL_VERSION}): {detail}")]
    UnsupportedVersion { version: u32, detail: Box<DecodeError> },
}

// ---------------------------------------------------------------------------
// Framing
// ---------------------------------------------------------------------------

/// Finds the first frame in `buf`: `Ok(Some((consumed, frame)))` where
/// `consumed` counts the length prefix too and `frame` is the tag and payload;
/// `Ok(None)` if `buf` does not hold a whole frame yet. Fails as soon as the
/// length prefix is 0 or larger than [`MAX_FRAME_SIZE`], so a receiver never
/// buffers more than that for one frame.
pub fn split_frame(buf: &[u8]) -> Result<Option<(usize, &[u8])>, DecodeError> {
    frame::split(buf, MAX_FRAME_SIZE).map_err(|e| match e {
        frame::BadLength::Empty => DecodeError::EmptyFrame,
        frame::BadLength::TooLarge(len) => DecodeError::FrameTooLarge { len },
    })
}

/// The protocol version of a hello, read without decoding the rest (its
/// position is the same in every version).
pub fn peek_version(frame: &[u8]) -> Option<u32> {
    match frame.split_first() {
        Some((&tag::HELLO, rest)) => rest.first_chunk::<4>().map(|b| u32::from_le_bytes(*b)),
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
    /// A request id; 0 would be taken for a connection-level error.
    fn request_id(&mut self, id: u64, message: &str) -> &mut Self {
        assert!(id != 0, "{message}: request id 0 is reserved for connection-level errors");
        self.u64(id)
    }
    /// `rel` and `fork`, the first four fields of a `BufferTag`.
    fn rel_fork(&mut self, rel: &RelFileNode, fork: ForkNumber) -> &mut Self {
        self.u32(rel.spc).u32(rel.db).u32(rel.rel).u32(fork as u32)
    }
}

/// Appends the frame (length prefix included) of a client message to `out`.
///
/// Panics on a request id of 0, which no valid request carries.
pub fn encode_client(msg: &ClientMessage, out: &mut Vec<u8>) {
    match msg {
        ClientMessage::Hello(h) => {
            let mut f = begin_frame(out, tag::HELLO);
            f.u32(h.protocol_version).bytes(&h.tenant_id.tenant.0).bytes(&h.timeline_id.0);
            // Version 3 names the shard: its number and count (0 unsharded).
            if h.protocol_version >= 3 {
                f.u8(h.tenant_id.shard.number).u8(h.tenant_id.shard.count);
            } else {
                debug_assert!(h.tenant_id.shard.is_unsharded(), "a shard needs protocol version 3");
            }
            // Version 1 has no token field; later ones always have one.
            if h.protocol_version >= 2 {
                f.string(&crate::token::wire(&h.token));
            }
            f.finish()
        }
        ClientMessage::Request(r) => encode_request(r, out),
    }
}

/// Appends the frame of one request to `out` (see [`encode_client`]).
pub fn encode_request(req: &PageRequest, out: &mut Vec<u8>) {
    match req {
        PageRequest::GetPage { id, lsn, rel, fork, block } => begin_frame(out, tag::GET_PAGE)
            .request_id(*id, "GetPage")
            .lsn(*lsn)
            .rel_fork(rel, *fork)
            .u32(*block)
            .finish(),
        PageRequest::RelExists { id, lsn, rel, fork } => {
            begin_frame(out, tag::REL_EXISTS).request_id(*id, "RelExists").lsn(*lsn).rel_fork(rel, *fork).finish()
        }
        PageRequest::RelSize { id, lsn, rel, fork } => {
            begin_frame(out, tag::REL_SIZE).request_id(*id, "RelSize").lsn(*lsn).rel_fork(rel, *fork).finish()
        }
        PageRequest::DbSize { id, lsn, spc, db } => {
            begin_frame(out, tag::DB_SIZE).request_id(*id, "DbSize").lsn(*lsn).u32(*spc).u32(*db).finish()
        }
        PageRequest::SlruSegment { id, lsn, kind, segno } => begin_frame(out, tag::SLRU_SEGMENT)
            .request_id(*id, "SlruSegment")
            .lsn(*lsn)
            .u8(*kind as u8)
            .u32(*segno)
            .finish(),
    }
}

/// Appends the frame (length prefix included) of a server message to `out`.
///
/// Panics if the message could not be decoded again: a page that is not
/// [`PAGE_SIZE`] bytes, a segment that is not whole pages or is larger than
/// [`MAX_SEGMENT_SIZE`], or a response other than `Error` with id 0.
pub fn encode_server(msg: &ServerMessage, out: &mut Vec<u8>) {
    match msg {
        ServerMessage::HelloOk { last_record_lsn } => begin_frame(out, tag::HELLO_OK).lsn(*last_record_lsn).finish(),
        ServerMessage::Page { id, page } => {
            let page: &[u8; PAGE_SIZE] = match page.as_slice().try_into() {
                Ok(p) => p,
                Err(_) => panic!("Page: {} page bytes, a page is exactly {PAGE_SIZE}", page.len()),
            };
            encode_page(*id, page, out)
        }
        ServerMessage::Exists { id, exists } => {
            begin_frame(out, tag::EXISTS).request_id(*id, "Exists").bool(*exists).finish()
        }
        ServerMessage::Size { id, blocks } => begin_frame(out, tag::SIZE).request_id(*id, "Size").u32(*blocks).finish(),
        ServerMessage::DbSize { id, bytes } => {
            begin_frame(out, tag::DB_SIZE_RESPONSE).request_id(*id, "DbSize").u64(*bytes).finish()
        }
        ServerMessage::Segment { id, data } => {
            assert!(valid_segment_size(data.len()), "{}", DecodeError::BadSegmentSize { len: data.len() });
            begin_frame(out, tag::SEGMENT).request_id(*id, "Segment").bytes(data).finish()
        }
        ServerMessage::Error { id, code, message } => {
            begin_frame(out, tag::ERROR).u64(*id).u16(*code as u16).string(message).finish()
        }
    }
}

/// Appends a `Page` response frame to `out` straight from a borrowed page,
/// which spares a server the copy into a [`ServerMessage::Page`].
pub fn encode_page(id: u64, page: &[u8; PAGE_SIZE], out: &mut Vec<u8>) {
    out.reserve(LENGTH_SIZE + PAGE_LEN);
    begin_frame(out, tag::PAGE).request_id(id, "Page").bytes(page).finish()
}

/// Bytes of a `Page` frame before its page: the frame is these followed by
/// the page's [`PAGE_SIZE`] bytes.
pub const PAGE_HEADER_LEN: usize = LENGTH_SIZE + PAGE_LEN - PAGE_SIZE;

/// Appends the start of a `Page` response frame, everything but the page,
/// to `out`: a server that sends the page from where it lies (a vectored
/// write) never copies it. Panics on a request id of 0.
pub fn encode_page_header(id: u64, out: &mut Vec<u8>) {
    assert!(id != 0, "Page: request id 0 is reserved for connection-level errors");
    out.extend_from_slice(&(PAGE_LEN as u32).to_le_bytes());
    out.push(tag::PAGE);
    out.extend_from_slice(&id.to_le_bytes());
}

fn valid_segment_size(len: usize) -> bool {
    len <= MAX_SEGMENT_SIZE && len.is_multiple_of(PAGE_SIZE)
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// Fields of this protocol, on the reader shared with the safekeeper codec.
type Reader<'a> = Fields<'a, DecodeError>;

impl From<FieldError> for DecodeError {
    fn from(e: FieldError) -> DecodeError {
        match e {
            FieldError::Truncated { message, field, offset, needed, available } => {
                DecodeError::Truncated { message, field, offset, needed, available }
            }
            FieldError::TrailingBytes { message, count } => DecodeError::TrailingBytes { message, count },
            FieldError::InvalidBool { message, field, value } => DecodeError::InvalidBool { message, field, value },
            FieldError::BadUtf8 { message, field, valid_up_to } => DecodeError::BadUtf8 { message, field, valid_up_to },
            FieldError::StringTooLong { message, field, len } => DecodeError::StringTooLong { message, field, len },
        }
    }
}

impl Fields<'_, DecodeError> {
    /// A request id, which is never 0.
    fn request_id(&mut self) -> Result<u64, DecodeError> {
        match self.u64("id")? {
            0 => Err(DecodeError::ZeroId { message: self.message }),
            id => Ok(id),
        }
    }
    fn rel(&mut self) -> Result<RelFileNode, DecodeError> {
        Ok(RelFileNode { spc: self.u32("spc")?, db: self.u32("db")?, rel: self.u32("rel")? })
    }
    fn fork(&mut self) -> Result<ForkNumber, DecodeError> {
        let fork = self.u32("fork")?;
        u8::try_from(fork)
            .ok()
            .and_then(ForkNumber::from_u8)
            .ok_or(DecodeError::UnknownFork { message: self.message, fork })
    }
}

/// The tag of a frame (tag and payload), after the size checks.
fn frame_tag(frame: &[u8]) -> Result<u8, DecodeError> {
    if frame.len() > MAX_FRAME_SIZE {
        return Err(DecodeError::FrameTooLarge { len: frame.len() });
    }
    frame.first().copied().ok_or(DecodeError::EmptyFrame)
}

/// Decodes the payload of `frame` (tag and payload) as `message` and checks
/// that nothing follows.
fn read<'a, T>(
    frame: &'a [u8],
    message: &'static str,
    fields: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    frame::read_fields(frame, message, MAX_STRING_LEN, fields)
}

/// Decodes a client message from a frame's tag and payload.
pub fn decode_client(frame: &[u8]) -> Result<ClientMessage, DecodeError> {
    match frame_tag(frame)? {
        tag::HELLO => read(frame, "Hello", |r| {
            let protocol_version = r.u32("protocol_version")?;
            let tenant = TenantId(r.id16("tenant_id")?);
            let timeline_id = TimelineId(r.id16("timeline_id")?);
            let shard = if protocol_version >= 3 {
                let (number, count) = (r.u8("shard_number")?, r.u8("shard_count")?);
                ShardIndex::from_wire(number, count).map_err(|e| DecodeError::BadShard { detail: e.to_string() })?
            } else {
                ShardIndex::UNSHARDED
            };
            let tenant_id = TenantShardId { tenant, shard };
            let token = if protocol_version >= 2 { Token::from_wire(r.string("token")?) } else { None };
            Ok(ClientMessage::Hello(Hello { protocol_version, tenant_id, timeline_id, token }))
        })
        .map_err(|e| match peek_version(frame) {
            Some(version) if !(PAGE_PROTOCOL_MIN_VERSION..=PAGE_PROTOCOL_VERSION).contains(&version) => {
                DecodeError::UnsupportedVersion { version, detail: Box::new(e) }
            }
            _ => e,
        }),
        tag::GET_PAGE => read(frame, "GetPage", |r| {
            Ok(PageRequest::GetPage {
                id: r.request_id()?,
                lsn: r.lsn("lsn")?,
                rel: r.rel()?,
                fork: r.fork()?,
                block: r.u32("block")?,
            })
        })
        .map(ClientMessage::Request),
        tag::REL_EXISTS => read(frame, "RelExists", |r| {
            Ok(PageRequest::RelExists { id: r.request_id()?, lsn: r.lsn("lsn")?, rel: r.rel()?, fork: r.fork()? })
        })
        .map(ClientMessage::Request),
        tag::REL_SIZE => read(frame, "RelSize", |r| {
            Ok(PageRequest::RelSize { id: r.request_id()?, lsn: r.lsn("lsn")?, rel: r.rel()?, fork: r.fork()? })
        })
        .map(ClientMessage::Request),
        tag::DB_SIZE => read(frame, "DbSize", |r| {
            Ok(PageRequest::DbSize { id: r.request_id()?, lsn: r.lsn("lsn")?, spc: r.u32("spc")?, db: r.u32("db")? })
        })
        .map(ClientMessage::Request),
        tag::SLRU_SEGMENT => read(frame, "SlruSegment", |r| {
            let id = r.request_id()?;
            let lsn = r.lsn("lsn")?;
            let raw = r.u8("kind")?;
            let kind = SlruKind::from_u8(raw).ok_or(DecodeError::UnknownSlruKind { message: r.message, kind: raw })?;
            Ok(PageRequest::SlruSegment { id, lsn, kind, segno: r.u32("segno")? })
        })
        .map(ClientMessage::Request),
        tag => Err(DecodeError::UnknownTag { direction: "client", tag }),
    }
}

/// The request id and page of a `Page` frame, borrowed from the frame:
/// `None` if the frame is another message. Readers of many pages copy each
/// straight to where it goes instead of into a message of its own.
pub fn decode_page_frame(frame: &[u8]) -> Option<Result<(u64, &[u8; PAGE_SIZE]), DecodeError>> {
    match frame_tag(frame) {
        Ok(tag::PAGE) => Some(decode_page(frame)),
        _ => None,
    }
}

fn decode_page(frame: &[u8]) -> Result<(u64, &[u8; PAGE_SIZE]), DecodeError> {
    read(frame, "Page", |r| {
        let id = r.request_id()?;
        let page = r.rest("page")?;
        let page = page.try_into().map_err(|_| DecodeError::BadPageSize { len: page.len() })?;
        Ok((id, page))
    })
}

/// Decodes a server message from a frame's tag and payload.
pub fn decode_server(frame: &[u8]) -> Result<ServerMessage, DecodeError> {
    match frame_tag(frame)? {
        tag::HELLO_OK => {
            read(frame, "HelloOk", |r| Ok(ServerMessage::HelloOk { last_record_lsn: r.lsn("last_record_lsn")? }))
        }
        tag::PAGE => decode_page(frame).map(|(id, page)| ServerMessage::Page { id, page: page.to_vec() }),
        tag::EXISTS => {
            read(frame, "Exists", |r| Ok(ServerMessage::Exists { id: r.request_id()?, exists: r.bool("exists")? }))
        }
        tag::SIZE => read(frame, "Size", |r| Ok(ServerMessage::Size { id: r.request_id()?, blocks: r.u32("blocks")? })),
        tag::DB_SIZE_RESPONSE => {
            read(frame, "DbSize", |r| Ok(ServerMessage::DbSize { id: r.request_id()?, bytes: r.u64("bytes")? }))
        }
        tag::SEGMENT => read(frame, "Segment", |r| {
            let id = r.request_id()?;
            let data = r.rest("data")?;
            if !valid_segment_size(data.len()) {
                return Err(DecodeError::BadSegmentSize { len: data.len() });
            }
            Ok(ServerMessage::Segment { id, data: data.to_vec() })
        }),
        tag::ERROR => read(frame, "Error", |r| {
            let id = r.u64("id")?;
            let raw = r.u16("code")?;
            let code =
                ErrorCode::from_u16(raw).ok_or(DecodeError::UnknownErrorCode { message: r.message, code: raw })?;
            Ok(ServerMessage::Error { id, code, message: r.string("message")? })
        }),
        tag => Err(DecodeError::UnknownTag { direction: "server", tag }),
    }
}

// ---------------------------------------------------------------------------
// Fuzzing
// ---------------------------------------------------------------------------

/// Fuzz entry point: both decoders over `data` as one frame and over each
/// frame in it; what decodes must re-encode to the same bytes
/// (`frame::fuzz_frames`).
pub fn fuzz_decode(data: &[u8]) {
    frame::fuzz_frames(data, split_frame, |frame, out| {
        if let Ok(m) = decode_client(frame) {
            encode_client(&m, out);
        }
        if let Ok(m) = decode_server(frame) {
            encode_server(&m, out);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_formats::Lsn;
    use strata_test_support::rng::{seeded, RngExt};

    /// `1663/5/16384`: a table of the `postgres` database in `pg_default`.
    const REL: RelFileNode = RelFileNode { spc: 1663, db: 5, rel: 16384 };

    fn unhex(spaced: &str) -> Vec<u8> {
        let compact: String = spaced.split_whitespace().collect();
        hex::decode(compact).expect("valid hex in a test vector")
    }

    fn client_bytes(m: &ClientMessage) -> Vec<u8> {
        let mut out = Vec::new();
        encode_client(m, &mut out);
        out
    }

    fn server_bytes(m: &ServerMessage) -> Vec<u8> {
        let mut out = Vec::new();
        encode_server(m, &mut out);
        out
    }

    fn request(r: PageRequest) -> ClientMessage {
        ClientMessage::Request(r)
    }

    /// The test vectors of `docs/pageserver-protocol.md`, in the same order.
    fn client_vectors() -> Vec<(ClientMessage, &'static str)> {
        vec![
            (
                ClientMessage::Hello(Hello {
                    protocol_version: 2,
                    tenant_id: TenantId([0x11; 16]).into(),
                    timeline_id: TimelineId([0x22; 16]),
                    token: Some(Token::new("tok".into())),
                }),
                "2c000000 01 02000000 11111111111111111111111111111111 22222222222222222222222222222222 \
                 03000000 746f6b",
            ),
            (
                request(PageRequest::GetPage {
                    id: 7,
                    lsn: Lsn(0x0100_0028),
                    rel: REL,
                    fork: ForkNumber::Main,
                    block: 3,
                }),
                "25000000 10 0700000000000000 2800000100000000 7f060000 05000000 00400000 00000000 03000000",
            ),
            (
                request(PageRequest::RelExists { id: 9, lsn: Lsn(0x0100_0028), rel: REL, fork: ForkNumber::Fsm }),
                "21000000 11 0900000000000000 2800000100000000 7f060000 05000000 00400000 01000000",
            ),
            (
                request(PageRequest::RelSize { id: 8, lsn: Lsn::INVALID, rel: REL, fork: ForkNumber::VisibilityMap }),
                "21000000 12 0800000000000000 0000000000000000 7f060000 05000000 00400000 02000000",
            ),
            (
                request(PageRequest::DbSize { id: 10, lsn: Lsn(0x0200_0000), spc: 1663, db: 5 }),
                "19000000 13 0a00000000000000 0000000200000000 7f060000 05000000",
            ),
            (
                request(PageRequest::SlruSegment { id: 11, lsn: Lsn::INVALID, kind: SlruKind::Clog, segno: 2 }),
                "16000000 14 0b00000000000000 0000000000000000 00 02000000",
            ),
            (
                ClientMessage::Hello(Hello {
                    protocol_version: 3,
                    tenant_id: TenantShardId { tenant: TenantId([0x11; 16]), shard: ShardIndex::new(1, 4).unwrap() },
                    timeline_id: TimelineId([0x22; 16]),
                    token: Some(Token::new("tok".into())),
                }),
                "2e000000 01 03000000 11111111111111111111111111111111 22222222222222222222222222222222 \
                 01 04 03000000 746f6b",
            ),
        ]
    }

    /// Server vectors whose bytes are printed in full in the spec.
    fn server_vectors() -> Vec<(ServerMessage, &'static str)> {
        vec![
            (ServerMessage::HelloOk { last_record_lsn: Lsn(0x0300_0028) }, "09000000 81 2800000300000000"),
            (ServerMessage::Exists { id: 9, exists: true }, "0a000000 91 0900000000000000 01"),
            (ServerMessage::Size { id: 8, blocks: 1234 }, "0d000000 92 0800000000000000 d2040000"),
            (ServerMessage::DbSize { id: 10, bytes: 7_880_704 }, "11000000 93 0a00000000000000 0040780000000000"),
            (ServerMessage::Segment { id: 11, data: Vec::new() }, "09000000 94 0b00000000000000"),
            (
                ServerMessage::Error { id: 0, code: ErrorCode::NotFound, message: "no timeline".into() },
                "1a000000 9f 0000000000000000 0300 0b000000 6e6f2074696d656c696e65",
            ),
            (
                ServerMessage::Error { id: 7, code: ErrorCode::LsnTimeout, message: "0/5000000".into() },
                "18000000 9f 0700000000000000 0400 09000000 302f35303030303030",
            ),
        ]
    }

    #[test]
    fn test_vectors() {
        for (msg, vector) in client_vectors() {
            let bytes = unhex(vector);
            assert_eq!(hex::encode(client_bytes(&msg)), hex::encode(&bytes), "{msg:?}");
            let (consumed, frame) = split_frame(&bytes).unwrap().expect("a whole frame");
            assert_eq!(consumed, bytes.len());
            assert_eq!(decode_client(frame).as_ref(), Ok(&msg));
        }
        for (msg, vector) in server_vectors() {
            let bytes = unhex(vector);
            assert_eq!(hex::encode(server_bytes(&msg)), hex::encode(&bytes), "{msg:?}");
            let (consumed, frame) = split_frame(&bytes).unwrap().expect("a whole frame");
            assert_eq!(consumed, bytes.len());
            assert_eq!(decode_server(frame).as_ref(), Ok(&msg));
        }
        // Page, id 7, every byte 0xab: a 9-byte header, then the page.
        let page = ServerMessage::Page { id: 7, page: vec![0xAB; PAGE_SIZE] };
        let bytes = server_bytes(&page);
        assert_eq!(hex::encode(&bytes[..13]), "09200000900700000000000000");
        assert_eq!(bytes.len(), 13 + PAGE_SIZE);
        assert!(bytes[13..].iter().all(|&b| b == 0xAB));
        assert_eq!(decode_server(&bytes[LENGTH_SIZE..]), Ok(page));
        // Segment, id 11, one page of zeros.
        let segment = ServerMessage::Segment { id: 11, data: vec![0; PAGE_SIZE] };
        let bytes = server_bytes(&segment);
        assert_eq!(hex::encode(&bytes[..13]), "09200000940b00000000000000");
        assert_eq!(decode_server(&bytes[LENGTH_SIZE..]), Ok(segment));
    }

    #[test]
    fn fixed_sizes() {
        let get_page = client_bytes(&client_vectors()[1].0);
        assert_eq!(get_page.len(), LENGTH_SIZE + GET_PAGE_LEN);
        let page = server_bytes(&ServerMessage::Page { id: 1, page: vec![0; PAGE_SIZE] });
        assert_eq!(page.len(), LENGTH_SIZE + PAGE_LEN);
        let mut direct = Vec::new();
        encode_page(1, &[0; PAGE_SIZE], &mut direct);
        assert_eq!(direct, page);
        // A header and the page after it are the same frame, whatever the id and page.
        let filled: [u8; PAGE_SIZE] = std::array::from_fn(|i| (i * 7) as u8);
        for id in [1, 0x0102_0304_0506_0708, u64::MAX] {
            let (mut whole, mut split) = (Vec::new(), Vec::new());
            encode_page(id, &filled, &mut whole);
            encode_page_header(id, &mut split);
            assert_eq!(split.len(), PAGE_HEADER_LEN);
            split.extend_from_slice(&filled);
            assert_eq!(split, whole);
        }
        let full = server_bytes(&ServerMessage::Segment { id: 1, data: vec![0; MAX_SEGMENT_SIZE] });
        assert!(full.len() - LENGTH_SIZE <= MAX_FRAME_SIZE);
    }

    /// One message of every variant, with non-trivial field values.
    fn samples() -> (Vec<ClientMessage>, Vec<ServerMessage>) {
        let mut clients: Vec<ClientMessage> = client_vectors().into_iter().map(|(m, _)| m).collect();
        clients.push(request(PageRequest::GetPage {
            id: u64::MAX,
            lsn: Lsn(u64::MAX),
            rel: RelFileNode { spc: u32::MAX, db: 0, rel: 1 },
            fork: ForkNumber::Init,
            block: u32::MAX,
        }));
        clients.push(request(PageRequest::SlruSegment {
            id: 1,
            lsn: Lsn(5),
            kind: SlruKind::MultiXactMembers,
            segno: 0xABCD,
        }));
        let mut servers: Vec<ServerMessage> = server_vectors().into_iter().map(|(m, _)| m).collect();
        servers.push(ServerMessage::Page { id: 3, page: (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect() });
        servers.push(ServerMessage::Segment { id: 4, data: vec![0x5A; MAX_SEGMENT_SIZE] });
        servers.push(ServerMessage::Exists { id: 5, exists: false });
        servers.push(ServerMessage::Error {
            id: 6,
            code: ErrorCode::Corrupt,
            message: "checksum mismatch — ünïcödé".into(),
        });
        (clients, servers)
    }

    #[test]
    fn every_variant_round_trips_and_only_its_decoder_accepts_it() {
        let (clients, servers) = samples();
        for m in clients {
            let bytes = client_bytes(&m);
            let frame = &bytes[LENGTH_SIZE..];
            assert_eq!(decode_client(frame).as_ref(), Ok(&m));
            assert!(decode_server(frame).is_err(), "{m:?}");
            fuzz_decode(&bytes);
        }
        for m in servers {
            let bytes = server_bytes(&m);
            let frame = &bytes[LENGTH_SIZE..];
            assert_eq!(decode_server(frame).as_ref(), Ok(&m));
            assert!(decode_client(frame).is_err(), "{}", m.name());
            fuzz_decode(&bytes);
        }
    }

    #[test]
    fn frames_concatenate_and_split_incrementally() {
        let (clients, servers) = samples();
        let mut stream = Vec::new();
        for m in &servers {
            encode_server(m, &mut stream);
        }
        // Fed one prefix at a time, a frame appears exactly when it is complete.
        let mut start = 0;
        let mut decoded = Vec::new();
        for end in 0..=stream.len() {
            if let Some((consumed, frame)) = split_frame(&stream[start..end]).unwrap() {
                decoded.push(decode_server(frame).unwrap());
                start += consumed;
                assert_eq!(start, end, "a frame is found as soon as its last byte arrives");
            }
        }
        assert_eq!(decoded, servers);
        let mut stream = Vec::new();
        for m in &clients {
            encode_client(m, &mut stream);
        }
        let mut rest = &stream[..];
        for m in &clients {
            let (consumed, frame) = split_frame(rest).unwrap().unwrap();
            assert_eq!(&decode_client(frame).unwrap(), m);
            rest = &rest[consumed..];
        }
        assert!(rest.is_empty());
    }

    #[test]
    fn lengths_are_checked_before_the_body_arrives() {
        assert_eq!(split_frame(&[0, 0, 0]), Ok(None));
        assert_eq!(split_frame(&[0, 0, 0, 0]), Err(DecodeError::EmptyFrame));
        let too_big = ((MAX_FRAME_SIZE + 1) as u32).to_le_bytes();
        assert_eq!(split_frame(&too_big), Err(DecodeError::FrameTooLarge { len: MAX_FRAME_SIZE + 1 }));
        assert_eq!(split_frame(&[0xFF; 4]), Err(DecodeError::FrameTooLarge { len: u32::MAX as usize }));
        assert_eq!(split_frame(&(MAX_FRAME_SIZE as u32).to_le_bytes()), Ok(None));
        assert_eq!(decode_client(&[]), Err(DecodeError::EmptyFrame));
        assert_eq!(
            decode_server(&vec![tag::PAGE; MAX_FRAME_SIZE + 1]),
            Err(DecodeError::FrameTooLarge { len: MAX_FRAME_SIZE + 1 })
        );
    }

    #[test]
    fn every_truncation_and_extension_is_rejected() {
        let (clients, servers) = samples();
        for m in &clients {
            let bytes = client_bytes(m);
            let frame = &bytes[LENGTH_SIZE..];
            for cut in 0..frame.len() {
                assert!(decode_client(&frame[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut longer = frame.to_vec();
            longer.push(0);
            assert!(decode_client(&longer).is_err(), "{m:?} with a trailing byte");
        }
        for m in &servers {
            let bytes = server_bytes(m);
            let frame = &bytes[LENGTH_SIZE..];
            // Pages and segments end with their bytes: every cut shows as a bad size.
            for cut in (0..frame.len()).step_by(97).chain(frame.len().saturating_sub(20)..frame.len()) {
                let result = decode_server(&frame[..cut]);
                let segment_of_whole_pages =
                    matches!(m, ServerMessage::Segment { .. }) && cut >= 9 && (cut - 9) % PAGE_SIZE == 0;
                assert_eq!(result.is_ok(), segment_of_whole_pages, "{} cut at {cut}: {result:?}", m.name());
            }
            let mut longer = frame.to_vec();
            longer.push(0);
            assert!(decode_server(&longer).is_err(), "{} with a trailing byte", m.name());
        }
    }

    #[test]
    fn field_values_are_checked() {
        let get_page = client_bytes(&client_vectors()[1].0)[LENGTH_SIZE..].to_vec();
        // Fork at frame offset 1 + 8 + 8 + 12 = 29.
        for fork in [4u32, 0x100, u32::MAX] {
            let mut frame = get_page.clone();
            frame[29..33].copy_from_slice(&fork.to_le_bytes());
            assert_eq!(decode_client(&frame), Err(DecodeError::UnknownFork { message: "GetPage", fork }));
        }
        // Request id 0 is reserved.
        let mut frame = get_page.clone();
        frame[1..9].fill(0);
        assert_eq!(decode_client(&frame), Err(DecodeError::ZeroId { message: "GetPage" }));
        let frame = [tag::SIZE, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        assert_eq!(decode_server(&frame), Err(DecodeError::ZeroId { message: "Size" }));
        // SLRU kinds.
        let mut frame = client_bytes(&client_vectors()[5].0)[LENGTH_SIZE..].to_vec();
        frame[17] = 3;
        assert_eq!(decode_client(&frame), Err(DecodeError::UnknownSlruKind { message: "SlruSegment", kind: 3 }));
        // Bools.
        let frame = [tag::EXISTS, 1, 0, 0, 0, 0, 0, 0, 0, 2];
        assert!(matches!(decode_server(&frame), Err(DecodeError::InvalidBool { value: 2, .. })));
        // Pages must be exactly one page, segments whole pages up to 32.
        let page = |n: usize| {
            let mut f = vec![tag::PAGE, 1, 0, 0, 0, 0, 0, 0, 0];
            f.resize(9 + n, 0);
            decode_server(&f)
        };
        assert!(page(PAGE_SIZE).is_ok());
        assert_eq!(page(PAGE_SIZE - 1), Err(DecodeError::BadPageSize { len: PAGE_SIZE - 1 }));
        assert_eq!(page(PAGE_SIZE + 1), Err(DecodeError::BadPageSize { len: PAGE_SIZE + 1 }));
        assert_eq!(page(0), Err(DecodeError::BadPageSize { len: 0 }));
        let segment = |n: usize| {
            let mut f = vec![tag::SEGMENT, 1, 0, 0, 0, 0, 0, 0, 0];
            f.resize(9 + n, 0);
            decode_server(&f)
        };
        assert!(segment(MAX_SEGMENT_SIZE).is_ok());
        assert!(segment(3 * PAGE_SIZE).is_ok());
        assert_eq!(segment(100), Err(DecodeError::BadSegmentSize { len: 100 }));
        assert_eq!(
            segment(MAX_SEGMENT_SIZE + PAGE_SIZE),
            Err(DecodeError::BadSegmentSize { len: MAX_SEGMENT_SIZE + PAGE_SIZE })
        );
    }

    #[test]
    fn error_messages_are_checked() {
        let error = |code: u16, message: &[u8]| {
            let mut frame = vec![tag::ERROR, 4, 0, 0, 0, 0, 0, 0, 0];
            frame.extend(code.to_le_bytes());
            frame.extend((message.len() as u32).to_le_bytes());
            frame.extend(message);
            decode_server(&frame)
        };
        assert!(error(6, b"fine").is_ok());
        assert!(matches!(error(6, b"bad \xFF utf-8"), Err(DecodeError::BadUtf8 { valid_up_to: 4, .. })));
        assert!(matches!(error(6, &[b'x'; MAX_STRING_LEN + 1]), Err(DecodeError::StringTooLong { len: 4097, .. })));
        assert!(error(6, &[b'x'; MAX_STRING_LEN]).is_ok());
        assert!(matches!(error(0, b""), Err(DecodeError::UnknownErrorCode { code: 0, .. })));
        assert!(error(7, b"").is_ok(), "Overloaded");
        assert!(error(8, b"").is_ok(), "Unauthorized");
        assert!(error(9, b"").is_ok(), "Forbidden");
        assert!(error(10, b"").is_ok(), "NotAttached");
        assert!(error(11, b"").is_ok(), "WrongShard");
        assert!(matches!(error(12, b""), Err(DecodeError::UnknownErrorCode { code: 12, .. })));
        // A hostile length fails before anything is allocated.
        let frame = [tag::ERROR, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0xFF, 0xFF, 0xFF, 0xFF];
        assert!(matches!(decode_server(&frame), Err(DecodeError::StringTooLong { .. })));
        // Encoding cuts long messages at a character boundary.
        let long = "é".repeat(MAX_STRING_LEN);
        let bytes = server_bytes(&ServerMessage::Error { id: 1, code: ErrorCode::Internal, message: long });
        let Ok(ServerMessage::Error { message, .. }) = decode_server(&bytes[LENGTH_SIZE..]) else { panic!("decodes") };
        assert_eq!(message, "é".repeat(MAX_STRING_LEN / 2));
        // Which codes end the connection.
        for n in 1..=6 {
            let code = ErrorCode::from_u16(n).unwrap();
            assert_eq!(code as u16, n);
            assert_eq!(code.closes_connection(), n <= 2);
        }
        assert!(ErrorCode::NotAttached.closes_connection(), "the client asks where the tenant went");
        assert_eq!(ErrorCode::from_u16(11), Some(ErrorCode::WrongShard));
        assert!(!ErrorCode::WrongShard.closes_connection(), "one request was misrouted, not the connection");
        assert_eq!(ErrorCode::from_u16(12), None);
    }

    #[test]
    fn other_versions_are_reported_as_such() {
        let mut hello = client_bytes(&ClientMessage::Hello(Hello {
            protocol_version: 4,
            tenant_id: TenantId([1; 16]).into(),
            timeline_id: TimelineId([2; 16]),
            token: None,
        }));
        // Same layout: decodes, and the server refuses the version itself.
        assert!(decode_client(&hello[LENGTH_SIZE..]).is_ok());
        assert_eq!(peek_version(&hello[LENGTH_SIZE..]), Some(4));
        hello.extend([9, 9]);
        let err = decode_client(&hello[LENGTH_SIZE..]).unwrap_err();
        assert!(matches!(err, DecodeError::UnsupportedVersion { version: 4, .. }), "{err:?}");
        // The same damage to a version 2 hello is a plain decoding error.
        let mut hello = client_bytes(&client_vectors()[0].0);
        hello.push(0);
        assert!(matches!(decode_client(&hello[LENGTH_SIZE..]), Err(DecodeError::TrailingBytes { count: 1, .. })));
        assert_eq!(peek_version(&[tag::GET_PAGE, 1, 0, 0, 0]), None);
        // Version 1 hellos (no token field) still decode, with no token; an
        // empty token of version 2 is none as well.
        let v1 = unhex("25000000 01 01000000 11111111111111111111111111111111 22222222222222222222222222222222");
        let want = |protocol_version| {
            ClientMessage::Hello(Hello {
                protocol_version,
                tenant_id: TenantId([0x11; 16]).into(),
                timeline_id: TimelineId([0x22; 16]),
                token: None,
            })
        };
        // Version 3 names a shard; a pair that is no shard is refused.
        let v3 = client_bytes(&client_vectors().last().unwrap().0);
        for (number, count) in [(4u8, 4u8), (1, 1), (0, 1), (1, 0), (0, 65)] {
            let mut frame = v3[LENGTH_SIZE..].to_vec();
            frame[37] = number;
            frame[38] = count;
            assert!(matches!(decode_client(&frame), Err(DecodeError::BadShard { .. })), "{number} of {count}");
        }
        assert_eq!(decode_client(&v1[LENGTH_SIZE..]), Ok(want(1)));
        assert_eq!(hex::encode(client_bytes(&want(1))), hex::encode(&v1));
        let empty = client_bytes(&want(2));
        assert_eq!(empty.len(), v1.len() + 4);
        assert_eq!(decode_client(&empty[LENGTH_SIZE..]), Ok(want(2)));
        // The token never shows in debug output.
        let debug = format!("{:?}", client_vectors()[0].0);
        assert!(!debug.contains("tok\"") && debug.contains("token: Some(Token(..))"), "{debug}");
    }

    #[test]
    fn page_frames_decode_borrowed_and_other_frames_are_left_alone() {
        let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        let bytes = server_bytes(&ServerMessage::Page { id: 7, page: page.clone() });
        let frame = &bytes[LENGTH_SIZE..];
        let (id, got) = decode_page_frame(frame).expect("a page frame").unwrap();
        assert_eq!((id, &got[..]), (7, &page[..]));
        assert!(std::ptr::eq(got.as_ptr(), frame[frame.len() - PAGE_SIZE..].as_ptr()), "borrowed, not copied");
        let size = server_bytes(&ServerMessage::Size { id: 7, blocks: 3 });
        assert!(decode_page_frame(&size[LENGTH_SIZE..]).is_none());
        assert!(decode_page_frame(&[]).is_none());
        // A page frame one byte short, and one with id 0: errors, as decode_server gives.
        let short = &frame[..frame.len() - 1];
        assert!(
            matches!(decode_page_frame(short), Some(Err(DecodeError::BadPageSize { len })) if len == PAGE_SIZE - 1)
        );
        assert!(matches!(decode_server(short), Err(DecodeError::BadPageSize { .. })));
        let mut zero = frame.to_vec();
        zero[1..9].fill(0);
        assert!(matches!(decode_page_frame(&zero), Some(Err(DecodeError::ZeroId { .. }))));
    }

    #[test]
    #[should_panic(expected = "a page is exactly 8192")]
    fn encoding_a_short_page_panics() {
        server_bytes(&ServerMessage::Page { id: 1, page: vec![0; 100] });
    }

    #[test]
    #[should_panic(expected = "request id 0 is reserved")]
    fn encoding_request_id_zero_panics() {
        client_bytes(&request(PageRequest::RelSize { id: 0, lsn: Lsn(0), rel: REL, fork: ForkNumber::Main }));
    }

    #[test]
    fn answers_match_kind_and_id() {
        let get = PageRequest::GetPage { id: 5, lsn: Lsn(0), rel: REL, fork: ForkNumber::Main, block: 0 };
        assert!(ServerMessage::Page { id: 5, page: vec![] }.answers(&get));
        assert!(!ServerMessage::Page { id: 6, page: vec![] }.answers(&get));
        assert!(!ServerMessage::Size { id: 5, blocks: 1 }.answers(&get));
        assert!(ServerMessage::Error { id: 5, code: ErrorCode::NotFound, message: String::new() }.answers(&get));
        assert!(!ServerMessage::HelloOk { last_record_lsn: Lsn(1) }.answers(&get));
        let size = get.clone().with_id(9);
        assert_eq!((size.id(), size.lsn(), size.name()), (9, Lsn(0), "GetPage"));
    }

    #[test]
    fn randomized_damage_never_panics() {
        let (clients, servers) = samples();
        let mut frames: Vec<Vec<u8>> = clients.iter().map(client_bytes).collect();
        frames.extend(servers.iter().filter(|m| !matches!(m, ServerMessage::Segment { .. })).map(server_bytes));
        let mut rng = seeded("page service codec damage", 0x9E37_79B9_7F4A_7C15);
        let (mut decoded, mut rejected) = (0usize, 0usize);
        for i in 0..20_000 {
            let mut bytes = frames[rng.below(frames.len() as u64) as usize].clone();
            match i % 4 {
                0 => {
                    let j = LENGTH_SIZE + rng.below((bytes.len() - LENGTH_SIZE) as u64) as usize;
                    bytes[j] ^= 1 << rng.below(8);
                }
                1 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
                2 => {
                    let j = rng.below(bytes.len().min(40) as u64) as usize;
                    bytes[j] = rng.u64(..) as u8;
                }
                _ => {
                    let n = rng.below(60) as usize;
                    bytes = rng.bytes(n);
                }
            }
            fuzz_decode(&bytes);
            let ok = bytes.len() > LENGTH_SIZE
                && (decode_client(&bytes[LENGTH_SIZE..]).is_ok() || decode_server(&bytes[LENGTH_SIZE..]).is_ok());
            if ok {
                decoded += 1;
            } else {
                rejected += 1;
            }
        }
        assert!(decoded > 2_000 && rejected > 8_000, "decoded {decoded}, rejected {rejected}");
    }
}
