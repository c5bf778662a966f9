//! A pipelined client of the pageserver's page service
//! (`docs/pageserver-protocol.md`): one connection to one timeline, many
//! requests in flight, responses taken in request order.
//!
//! Requests are queued with [`PageClient::queue`] (or [`PageClient::send`],
//! which also writes them out) and answered by [`PageClient::recv`], oldest
//! first. The convenience calls (`get_page`, `rel_size`, …) do one round trip
//! each on an idle connection. Every network wait is bounded by a timeout;
//! after any transport or protocol failure the client refuses further use
//! (its position in the response stream is unknown) and a new one must be
//! connected.

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use std::time::Instant;
use strata_service::tls::{ClientTls, Stream};

use strata_service::clock::timeout;
use tokio::io::AsyncWriteExt;

use crate::clock::SharedClock;

use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_protocol::framed::{FrameError, FrameReader};
use strata_protocol::pageserver::codec::{self, DecodeError};
use strata_protocol::pageserver::{
    ClientMessage, ErrorCode, Hello, PageRequest, ServerMessage, SlruKind, MAX_PIPELINE_DEPTH, PAGE_PROTOCOL_VERSION,
};
use strata_protocol::{TenantShardId, TimelineId};

/// Timeouts and limits of a [`PageClient`].
#[derive(Clone, Debug)]
pub struct PageClientConfig {
    /// Limit for the TCP connection and the handshake together.
    pub connect_timeout: Duration,
    /// Longest wait for one response (or for the socket to take a write).
    /// Must exceed the server's own wait for an LSN to be ingested, so that
    /// a slow LSN shows as a `LsnTimeout` error rather than a dead connection.
    pub response_timeout: Duration,
    /// Most requests in flight; at most [`MAX_PIPELINE_DEPTH`].
    pub max_in_flight: usize,
    /// The token sent in the hello (`docs/security.md`).
    pub token: Option<strata_service::auth::Token>,
    /// TLS with the cluster's CA; none: plaintext.
    pub tls: Option<ClientTls>,
    /// What the timeouts are measured on.
    pub clock: SharedClock,
}

impl Default for PageClientConfig {
    fn default() -> PageClientConfig {
        PageClientConfig {
            connect_timeout: crate::limits::PAGE_CONNECT_TIMEOUT,
            response_timeout: crate::limits::PAGE_RESPONSE_TIMEOUT,
            max_in_flight: MAX_PIPELINE_DEPTH,
            token: None,
            tls: None,
            clock: SharedClock::default(),
        }
    }
}

/// Why a page service call failed.
#[derive(Debug, thiserror::Error)]
pub enum PageClientError {
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
    #[error("connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("the pageserver closed the connection")]
    Closed,
    #[error("malformed message from the pageserver: {0}")]
    Decode(#[from] DecodeError),
    #[error("protocol violation by the pageserver: {0}")]
    Protocol(String),
    /// An error with id 0: the pageserver refused the connection itself
    /// (unknown timeline, unsupported version) and closes it.
    #[error("the pageserver refused the connection ({code:?}): {message}")]
    Refused { code: ErrorCode, message: String },
    /// An `Error` response to a request of a convenience call.
    #[error("{request} failed ({code:?}): {message}")]
    Server { request: &'static str, code: ErrorCode, message: String },
    #[error("{0} requests already in flight, the most allowed")]
    PipelineFull(usize),
    #[error("no request is in flight")]
    NothingInFlight,
    #[error("{0} requests are still in flight; receive their responses first")]
    Busy(usize),
    #[error("the connection failed earlier and cannot be used")]
    Broken,
}

/// One page service connection to one timeline of a pageserver.
#[derive(Debug)]
pub struct PageClient {
    /// The connection, read as frames (the protocol crate's frame reader).
    stream: FrameReader<Stream>,
    config: PageClientConfig,
    last_record_lsn: Lsn,
    /// Requests sent or queued and not yet answered, oldest first.
    in_flight: VecDeque<PageRequest>,
    /// Encoded requests not yet written to the socket.
    out: Vec<u8>,
    next_id: u64,
    broken: bool,
}

impl PageClient {
    /// Connects to the page service at `addr` (`host:port`) and opens
    /// `tenant_id`/`timeline_id`.
    pub async fn connect(
        addr: &str,
        tenant_id: impl Into<TenantShardId>,
        timeline_id: TimelineId,
        config: PageClientConfig,
    ) -> Result<PageClient, PageClientError> {
        let tenant_id = tenant_id.into();
        let limit = config.connect_timeout;
        let deadline = config.clock.now() + limit;
        // With no delay (requests are small and latency-bound), and TLS if configured.
        let stream = timeout(&*config.clock, limit, Stream::connect(addr, config.tls.as_ref()))
            .await
            .map_err(|_| PageClientError::Timeout { what: "connecting", after: limit })?
            .map_err(|source| PageClientError::Connect { addr: addr.to_string(), source })?;
        let max_in_flight = config.max_in_flight.clamp(1, MAX_PIPELINE_DEPTH);
        let mut client = PageClient {
            stream: FrameReader::new(stream, codec::MAX_FRAME_SIZE),
            config: PageClientConfig { max_in_flight, ..config },
            last_record_lsn: Lsn::INVALID,
            in_flight: VecDeque::new(),
            out: Vec::new(),
            next_id: 1,
            broken: false,
        };
        let token = client.config.token.clone();
        let hello = Hello { protocol_version: PAGE_PROTOCOL_VERSION, tenant_id, timeline_id, token };
        codec::encode_client(&ClientMessage::Hello(hello), &mut client.out);
        client.write_out(deadline, "sending the hello", limit).await?;
        match client.read_message(deadline, "the hello answer", limit).await? {
            ServerMessage::HelloOk { last_record_lsn } => {
                client.last_record_lsn = last_record_lsn;
                Ok(client)
            }
            ServerMessage::Error { code, message, .. } => Err(PageClientError::Refused { code, message }),
            other => Err(PageClientError::Protocol(format!("{} in answer to the hello", other.name()))),
        }
    }

    /// How far the timeline was ingested when the connection was opened.
    pub fn last_record_lsn(&self) -> Lsn {
        self.last_record_lsn
    }

    /// Requests sent or queued and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The most requests this client keeps in flight.
    pub fn max_in_flight(&self) -> usize {
        self.config.max_in_flight
    }

    /// A request id not used before on this connection (never 0).
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        id
    }

    /// Queues `request` without writing it; [`flush`](Self::flush),
    /// [`send`](Self::send) or [`recv`](Self::recv) write it out, together
    /// with everything queued before, in one system call.
    ///
    /// Fails when [`max_in_flight`](Self::max_in_flight) requests are
    /// unanswered already. A request id of 0 is replaced by a fresh one (0 is
    /// reserved); the id used is returned.
    pub fn queue(&mut self, request: PageRequest) -> Result<u64, PageClientError> {
        if self.broken {
            return Err(PageClientError::Broken);
        }
        if self.in_flight.len() >= self.config.max_in_flight {
            return Err(PageClientError::PipelineFull(self.in_flight.len()));
        }
        let request = if request.id() == 0 {
            let id = self.next_id();
            request.with_id(id)
        } else {
            request
        };
        codec::encode_request(&request, &mut self.out);
        let id = request.id();
        self.in_flight.push_back(request);
        Ok(id)
    }

    /// Queues `request` and writes out everything queued; returns its id.
    pub async fn send(&mut self, request: PageRequest) -> Result<u64, PageClientError> {
        let id = self.queue(request)?;
        self.flush().await?;
        Ok(id)
    }

    /// Writes out every queued request.
    pub async fn flush(&mut self) -> Result<(), PageClientError> {
        if self.broken {
            return Err(PageClientError::Broken);
        }
        if self.out.is_empty() {
            return Ok(());
        }
        let limit = self.config.response_timeout;
        self.write_out(self.config.clock.now() + limit, "sending requests", limit).await
    }

    /// The response to the oldest request in flight (after writing out any
    /// queued requests). An `Error` response is returned as a message: it
    /// answers just that request. It is an error if the pageserver refuses
    /// the whole connection or breaks the protocol.
    pub async fn recv(&mut self) -> Result<ServerMessage, PageClientError> {
        let limit = self.before_recv().await?;
        let msg = self.read_message(self.config.clock.now() + limit, "waiting for a response", limit).await?;
        self.accept(msg)
    }

    /// [`recv`](Self::recv), except that a page answering the oldest
    /// request is appended to `pages` (`Ok(None)`) instead of returned in
    /// a message of its own: bulk readers save a copy and an allocation
    /// per page. Any other answer is returned as `recv` returns it.
    pub async fn recv_page_into(&mut self, pages: &mut Vec<u8>) -> Result<Option<ServerMessage>, PageClientError> {
        let limit = self.before_recv().await?;
        let deadline = self.config.clock.now() + limit;
        let got =
            match Self::next_frame(&mut self.stream, &self.config.clock, deadline, "waiting for a response", limit)
                .await
            {
                Ok(frame) => page_or_message(frame, &mut self.in_flight, pages),
                Err(e) => Err(e),
            };
        match got {
            Ok(None) => Ok(None),
            Ok(Some(msg)) => self.accept(msg).map(Some),
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    /// Checks that a response can be awaited, and writes out queued
    /// requests; returns the wait's limit.
    async fn before_recv(&mut self) -> Result<Duration, PageClientError> {
        if self.broken {
            return Err(PageClientError::Broken);
        }
        if self.in_flight.is_empty() {
            return Err(PageClientError::NothingInFlight);
        }
        self.flush().await?;
        Ok(self.config.response_timeout)
    }

    /// Matches a response to the oldest request in flight.
    fn accept(&mut self, msg: ServerMessage) -> Result<ServerMessage, PageClientError> {
        if let ServerMessage::Error { id: 0, code, message } = msg {
            self.broken = true;
            return Err(PageClientError::Refused { code, message });
        }
        let Some(request) = self.in_flight.pop_front() else { return Err(PageClientError::NothingInFlight) };
        if !msg.answers(&request) {
            self.broken = true;
            return Err(PageClientError::Protocol(format!(
                "{} with id {} in answer to {} with id {}",
                msg.name(),
                msg.id(),
                request.name(),
                request.id()
            )));
        }
        if let ServerMessage::Error { code, .. } = &msg {
            // The server closes the connection after these.
            if code.closes_connection() {
                self.broken = true;
            }
        }
        Ok(msg)
    }

    /// The image of `block` of `rel`/`fork` as of `lsn` (`Lsn::INVALID`: latest).
    pub async fn get_page(
        &mut self,
        lsn: Lsn,
        rel: RelFileNode,
        fork: ForkNumber,
        block: u32,
    ) -> Result<Vec<u8>, PageClientError> {
        match self.round_trip(PageRequest::GetPage { id: 0, lsn, rel, fork, block }).await? {
            ServerMessage::Page { page, .. } => Ok(page),
            other => Err(unexpected(other)),
        }
    }

    /// Whether `rel`/`fork` exists as of `lsn`.
    pub async fn rel_exists(&mut self, lsn: Lsn, rel: RelFileNode, fork: ForkNumber) -> Result<bool, PageClientError> {
        match self.round_trip(PageRequest::RelExists { id: 0, lsn, rel, fork }).await? {
            ServerMessage::Exists { exists, .. } => Ok(exists),
            other => Err(unexpected(other)),
        }
    }

    /// The size of `rel`/`fork` in blocks as of `lsn`.
    pub async fn rel_size(&mut self, lsn: Lsn, rel: RelFileNode, fork: ForkNumber) -> Result<u32, PageClientError> {
        match self.round_trip(PageRequest::RelSize { id: 0, lsn, rel, fork }).await? {
            ServerMessage::Size { blocks, .. } => Ok(blocks),
            other => Err(unexpected(other)),
        }
    }

    /// The size of database `db` in tablespace `spc` in bytes as of `lsn`.
    pub async fn db_size(&mut self, lsn: Lsn, spc: u32, db: u32) -> Result<u64, PageClientError> {
        match self.round_trip(PageRequest::DbSize { id: 0, lsn, spc, db }).await? {
            ServerMessage::DbSize { bytes, .. } => Ok(bytes),
            other => Err(unexpected(other)),
        }
    }

    /// Segment `segno` of an SLRU as of `lsn`.
    pub async fn slru_segment(&mut self, lsn: Lsn, kind: SlruKind, segno: u32) -> Result<Vec<u8>, PageClientError> {
        match self.round_trip(PageRequest::SlruSegment { id: 0, lsn, kind, segno }).await? {
            ServerMessage::Segment { data, .. } => Ok(data),
            other => Err(unexpected(other)),
        }
    }

    /// Sends one request on an idle connection and returns its answer, with
    /// an `Error` response turned into [`PageClientError::Server`].
    async fn round_trip(&mut self, request: PageRequest) -> Result<ServerMessage, PageClientError> {
        if !self.in_flight.is_empty() {
            return Err(PageClientError::Busy(self.in_flight.len()));
        }
        let name = request.name();
        self.send(request).await?;
        match self.recv().await? {
            ServerMessage::Error { code, message, .. } => Err(PageClientError::Server { request: name, code, message }),
            msg => Ok(msg),
        }
    }

    /// Writes `out` entirely by `deadline`; any failure breaks the client.
    async fn write_out(
        &mut self,
        deadline: Instant,
        what: &'static str,
        limit: Duration,
    ) -> Result<(), PageClientError> {
        let clock = self.config.clock.clone();
        let stream = self.stream.get_mut();
        let write = async {
            stream.write_all(&self.out).await?;
            // TLS may hold written bytes back until flushed.
            stream.flush().await
        };
        let result = match timeout(&*clock, until(&*clock, deadline), write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(PageClientError::Io(e)),
            Err(_) => Err(PageClientError::Timeout { what, after: limit }),
        };
        self.out.clear();
        if result.is_err() {
            self.broken = true;
        }
        result
    }

    /// Reads and decodes the next message by `deadline`; any failure breaks the client.
    async fn read_message(
        &mut self,
        deadline: Instant,
        what: &'static str,
        limit: Duration,
    ) -> Result<ServerMessage, PageClientError> {
        let result = self.read_message_inner(deadline, what, limit).await;
        if result.is_err() {
            self.broken = true;
        }
        result
    }

    async fn read_message_inner(
        &mut self,
        deadline: Instant,
        what: &'static str,
        limit: Duration,
    ) -> Result<ServerMessage, PageClientError> {
        let frame = Self::next_frame(&mut self.stream, &self.config.clock, deadline, what, limit).await?;
        Ok(codec::decode_server(frame)?)
    }

    /// The next frame from the connection, by `deadline` on `clock`.
    async fn next_frame<'a>(
        stream: &'a mut FrameReader<Stream>,
        clock: &SharedClock,
        deadline: Instant,
        what: &'static str,
        limit: Duration,
    ) -> Result<&'a [u8], PageClientError> {
        let frame = timeout(&**clock, until(&**clock, deadline), stream.read_frame(limit))
            .await
            .map_err(|_| PageClientError::Timeout { what, after: limit })?;
        match frame {
            Ok(frame) => Ok(frame),
            Err(FrameError::Timeout(_)) => Err(PageClientError::Timeout { what, after: limit }),
            Err(FrameError::Closed | FrameError::ClosedMidFrame(_)) => Err(PageClientError::Closed),
            Err(FrameError::Io(e)) => Err(PageClientError::Io(e)),
            Err(FrameError::Empty) => Err(DecodeError::EmptyFrame.into()),
            Err(FrameError::TooLarge { len, .. }) => Err(DecodeError::FrameTooLarge { len }.into()),
            Err(e @ FrameError::WriteTimeout(_)) => Err(PageClientError::Protocol(e.to_string())),
        }
    }
}

/// How long until `deadline` on `clock` (zero once it has passed).
fn until(clock: &dyn strata_service::clock::Clock, deadline: Instant) -> Duration {
    deadline.saturating_duration_since(clock.now())
}

/// A `Page` frame answering the oldest request in flight: the page is
/// appended to `pages` and the request taken off (`None`). Any other frame
/// (an error, or a page with another id) decoded as a message, for the
/// general path to check and name what is wrong.
fn page_or_message(
    frame: &[u8],
    in_flight: &mut VecDeque<PageRequest>,
    pages: &mut Vec<u8>,
) -> Result<Option<ServerMessage>, PageClientError> {
    if let Some(page) = codec::decode_page_frame(frame) {
        let (id, page) = page?;
        if matches!(in_flight.front(), Some(PageRequest::GetPage { id: want, .. }) if *want == id) {
            pages.extend_from_slice(page);
            in_flight.pop_front();
            return Ok(None);
        }
    }
    Ok(Some(codec::decode_server(frame)?))
}

fn unexpected(msg: ServerMessage) -> PageClientError {
    // `recv` already checked that the answer fits the request.
    PageClientError::Protocol(format!("unexpected {}", msg.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::pageserver::PAGE_SIZE;
    use tokio::net::TcpListener;

    const REL: RelFileNode = RelFileNode { spc: 1663, db: 5, rel: 16384 };

    /// How the fake page service behaves.
    #[derive(Clone, Copy)]
    enum Script {
        /// Answers everything; block N's page is filled with N as a byte,
        /// blocks ≥ 1000 are `NotFound`.
        Normal,
        /// Refuses the hello as an unknown timeline.
        RefuseHello,
        /// Never answers the hello.
        Silent,
        /// Answers requests with the wrong id.
        WrongId,
        /// Answers requests with a frame length beyond the maximum.
        HugeFrame,
    }

    fn answer(request: &PageRequest, script: Script) -> Vec<u8> {
        let mut out = Vec::new();
        if let Script::HugeFrame = script {
            out.extend(u32::MAX.to_le_bytes());
            return out;
        }
        let id = if let Script::WrongId = script { request.id() + 1 } else { request.id() };
        let msg = match *request {
            PageRequest::GetPage { block, .. } if block >= 1000 => {
                ServerMessage::Error { id, code: ErrorCode::NotFound, message: format!("no block {block}") }
            }
            PageRequest::GetPage { block, .. } => ServerMessage::Page { id, page: vec![block as u8; PAGE_SIZE] },
            PageRequest::RelExists { .. } => ServerMessage::Exists { id, exists: true },
            PageRequest::RelSize { .. } => ServerMessage::Size { id, blocks: 42 },
            PageRequest::DbSize { .. } => ServerMessage::DbSize { id, bytes: 8192 * 42 },
            PageRequest::SlruSegment { .. } => ServerMessage::Segment { id, data: vec![7; 2 * PAGE_SIZE] },
        };
        codec::encode_server(&msg, &mut out);
        out
    }

    /// Serves one connection following `script`; returns its address.
    async fn fake_server(script: Script) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let Ok((stream, _)) = listener.accept().await else { return };
            let mut frames = FrameReader::new(stream, codec::MAX_FRAME_SIZE);
            loop {
                let Ok(frame) = frames.read_frame(Duration::from_secs(30)).await else { return };
                let mut out = Vec::new();
                let mut next = Some(frame.to_vec());
                while let Some(frame) = next.take() {
                    match codec::decode_client(&frame).unwrap() {
                        ClientMessage::Hello(h) => match script {
                            Script::Silent => {}
                            Script::RefuseHello => codec::encode_server(
                                &ServerMessage::Error {
                                    id: 0,
                                    code: ErrorCode::NotFound,
                                    message: format!("no timeline {}", h.timeline_id),
                                },
                                &mut out,
                            ),
                            _ => {
                                codec::encode_server(&ServerMessage::HelloOk { last_record_lsn: Lsn(0x1234) }, &mut out)
                            }
                        },
                        ClientMessage::Request(r) => out.extend(answer(&r, script)),
                    }
                    // Answer every request already received in one write.
                    next = frames.buffered_frame().ok().flatten().map(<[u8]>::to_vec);
                }
                if frames.get_mut().write_all(&out).await.is_err() {
                    return;
                }
            }
        });
        addr
    }

    fn config() -> PageClientConfig {
        PageClientConfig {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            max_in_flight: 16,
            token: None,
            tls: None,
            clock: SharedClock::default(),
        }
    }

    async fn connect(script: Script, config: PageClientConfig) -> Result<PageClient, PageClientError> {
        let addr = fake_server(script).await;
        PageClient::connect(&addr, strata_protocol::TenantId([1; 16]), TimelineId([2; 16]), config).await
    }

    fn get(block: u32) -> PageRequest {
        PageRequest::GetPage { id: 0, lsn: Lsn::INVALID, rel: REL, fork: ForkNumber::Main, block }
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order() {
        let mut client = connect(Script::Normal, config()).await.unwrap();
        assert_eq!(client.last_record_lsn(), Lsn(0x1234));
        for round in 0..3u32 {
            let mut ids = Vec::new();
            for i in 0..16 {
                ids.push(client.queue(get(round * 16 + i)).unwrap());
            }
            assert!(matches!(client.queue(get(0)), Err(PageClientError::PipelineFull(16))));
            for (i, id) in ids.into_iter().enumerate() {
                match client.recv().await.unwrap() {
                    ServerMessage::Page { id: got, page } => {
                        assert_eq!(got, id);
                        assert!(page.iter().all(|&b| b == (round * 16) as u8 + i as u8));
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(client.in_flight(), 0);
        }
        assert!(matches!(client.recv().await, Err(PageClientError::NothingInFlight)));
        assert_eq!(client.rel_size(Lsn::INVALID, REL, ForkNumber::Main).await.unwrap(), 42);
        assert!(client.rel_exists(Lsn(5), REL, ForkNumber::Fsm).await.unwrap());
        assert_eq!(client.db_size(Lsn::INVALID, 1663, 5).await.unwrap(), 8192 * 42);
        assert_eq!(client.slru_segment(Lsn::INVALID, SlruKind::Clog, 0).await.unwrap().len(), 2 * PAGE_SIZE);
        assert_eq!(client.get_page(Lsn::INVALID, REL, ForkNumber::Main, 9).await.unwrap(), vec![9; PAGE_SIZE]);
    }

    #[tokio::test]
    async fn an_error_response_answers_one_request_only() {
        let mut client = connect(Script::Normal, config()).await.unwrap();
        client.queue(get(1)).unwrap();
        client.queue(get(1000)).unwrap();
        client.queue(get(2)).unwrap();
        assert!(matches!(client.recv().await.unwrap(), ServerMessage::Page { .. }));
        match client.recv().await.unwrap() {
            ServerMessage::Error { code: ErrorCode::NotFound, message, .. } => assert_eq!(message, "no block 1000"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(client.recv().await.unwrap(), ServerMessage::Page { .. }));
        // Convenience calls report it as an error, and refuse a busy connection.
        let err = client.get_page(Lsn::INVALID, REL, ForkNumber::Main, 5000).await.unwrap_err();
        assert!(matches!(err, PageClientError::Server { request: "GetPage", code: ErrorCode::NotFound, .. }), "{err}");
        client.queue(get(3)).unwrap();
        assert!(matches!(client.rel_size(Lsn::INVALID, REL, ForkNumber::Main).await, Err(PageClientError::Busy(1))));
        assert!(matches!(client.recv().await.unwrap(), ServerMessage::Page { .. }));
    }

    #[tokio::test]
    async fn pages_received_into_a_buffer_land_in_order_and_other_answers_are_returned() {
        let mut client = connect(Script::Normal, config()).await.unwrap();
        let mut pages = Vec::new();
        for block in [4, 1000, 5, 6] {
            client.queue(get(block)).unwrap();
        }
        assert!(client.recv_page_into(&mut pages).await.unwrap().is_none());
        match client.recv_page_into(&mut pages).await.unwrap() {
            Some(ServerMessage::Error { code: ErrorCode::NotFound, message, .. }) => {
                assert_eq!(message, "no block 1000")
            }
            other => panic!("{other:?}"),
        }
        assert!(client.recv_page_into(&mut pages).await.unwrap().is_none());
        assert!(client.recv_page_into(&mut pages).await.unwrap().is_none());
        assert_eq!(pages.len(), 3 * PAGE_SIZE);
        for (page, fill) in pages.chunks(PAGE_SIZE).zip([4u8, 5, 6]) {
            assert!(page.iter().all(|&b| b == fill));
        }
        assert!(matches!(client.recv_page_into(&mut pages).await, Err(PageClientError::NothingInFlight)));
        // Not a GetPage: the answer comes back whole.
        client.queue(PageRequest::RelSize { id: 0, lsn: Lsn::INVALID, rel: REL, fork: ForkNumber::Main }).unwrap();
        assert!(matches!(
            client.recv_page_into(&mut pages).await.unwrap(),
            Some(ServerMessage::Size { blocks: 42, .. })
        ));
        assert_eq!(pages.len(), 3 * PAGE_SIZE);

        // A page with the wrong id is a protocol violation, as for `recv`.
        let mut client = connect(Script::WrongId, config()).await.unwrap();
        client.queue(get(1)).unwrap();
        let err = client.recv_page_into(&mut pages).await.unwrap_err();
        assert!(matches!(err, PageClientError::Protocol(_)), "{err}");
        assert_eq!(pages.len(), 3 * PAGE_SIZE, "nothing appended");
        assert!(matches!(client.recv_page_into(&mut pages).await, Err(PageClientError::Broken)));
    }

    #[tokio::test]
    async fn a_refused_hello_is_reported() {
        let err = connect(Script::RefuseHello, config()).await.unwrap_err();
        match err {
            PageClientError::Refused { code: ErrorCode::NotFound, message } => {
                assert!(message.contains(&TimelineId([2; 16]).to_string()))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn every_wait_is_bounded() {
        let mut cfg = config();
        cfg.connect_timeout = Duration::from_millis(200);
        let err = connect(Script::Silent, cfg).await.unwrap_err();
        assert!(matches!(err, PageClientError::Timeout { what: "the hello answer", .. }), "{err}");
    }

    #[tokio::test]
    async fn protocol_violations_break_the_client() {
        let mut client = connect(Script::WrongId, config()).await.unwrap();
        client.queue(get(1)).unwrap();
        assert!(matches!(client.recv().await, Err(PageClientError::Protocol(_))));
        assert!(matches!(client.queue(get(1)), Err(PageClientError::Broken)));
        assert!(matches!(client.recv().await, Err(PageClientError::Broken)));

        let mut client = connect(Script::HugeFrame, config()).await.unwrap();
        client.queue(get(1)).unwrap();
        let err = client.recv().await.unwrap_err();
        assert!(matches!(err, PageClientError::Decode(DecodeError::FrameTooLarge { .. })), "{err}");
        assert!(matches!(client.flush().await, Err(PageClientError::Broken)));
    }

    #[tokio::test]
    async fn connection_failures_are_reported() {
        // A port that was just free: nothing listens there.
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        let err = PageClient::connect(&addr, strata_protocol::TenantId([1; 16]), TimelineId([2; 16]), config())
            .await
            .unwrap_err();
        assert!(matches!(err, PageClientError::Connect { .. }), "{err}");
    }
}
