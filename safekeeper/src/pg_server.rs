//! PostgreSQL's physical replication protocol, as much as stock tools such
//! as `pg_receivewal` need to stream a timeline's committed WAL from a
//! safekeeper: startup (trust), `IDENTIFY_SYSTEM`, `SHOW`, and
//! `START_REPLICATION`. The timeline is chosen with the startup option
//! `-c strata.timeline=<tenant_id>/<timeline_id>` (libpq sends the database
//! name "replication" for physical replication); the option
//! `-c strata.strip_consistency=on` (or the config's default) clears
//! `XLR_CHECK_CONSISTENCY` in what is sent. A safekeeper that checks
//! tokens asks for a cleartext password and takes a token as it
//! (`PGPASSWORD`), before it looks the timeline up (`docs/security.md`).
//!
//! Messages are decoded and encoded by `pgwire` (its message codec only,
//! not its server framework); the walsender's CopyData payloads (`w`, `k`)
//! are built here.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use bytes::BytesMut;
use pgwire::messages::copy::{CopyBothResponse, CopyData, CopyDone};
use pgwire::messages::data::{DataRow, FieldDescription, RowDescription};
use pgwire::messages::response::{CommandComplete, ErrorResponse, ReadyForQuery, SslResponse, TransactionStatus};
use pgwire::messages::startup::{Authentication, BackendKeyData, ParameterStatus, SecretKey};
use pgwire::messages::{DecodeContext, Message, PgWireFrontendMessage, ProtocolVersion, SslNegotiationMetaMessage};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tracing::{info, warn};

use strata_protocol::{TenantId, TimelineId};
use strata_service::auth::{Access, Verifier};
use strata_service::tls::{ServerTls, Stream};
use strata_service::Listener;

use strata_formats::wal::strip::ConsistencyStripper;
use strata_formats::{Lsn, PgVersion};

use crate::limits::{PG_IO_TIMEOUT, PG_KEEPALIVE, PG_MAX_MESSAGE, PG_READ_CHUNK};
use crate::shared::Shared;
use crate::timeline::Timeline;
use crate::wal_reader::WalReader;

/// Why a replication connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}: nothing for {PG_IO_TIMEOUT:?}")]
    Timeout(&'static str),
    #[error("no startup packet within {0:?}")]
    Handshake(Duration),
    #[error("protocol: {0}")]
    Protocol(String),
    /// Refused with an error sent to the client.
    #[error("refused: {0}")]
    Refused(String),
    #[error("reading WAL: {0}")]
    Wal(String),
}

/// The answer to a connection refused because the listener is full.
pub fn refusal(_first_bytes: &[u8]) -> Vec<u8> {
    error_response("53300", "too many connections to this safekeeper's replication port")
}

/// Accepts replication clients forever. With `tls`, a client must ask for
/// TLS (SSLRequest, as libpq's `sslmode=prefer` and stricter do) before
/// its startup; without, SSLRequest is declined.
pub async fn serve(listener: Listener, shared: Arc<Shared>, tls: Option<ServerTls>) {
    let tls = Arc::new(tls);
    listener
        .serve(move |conn| {
            let shared = shared.clone();
            let tls = tls.clone();
            async move {
                let peer = conn.peer;
                if let Err(e) = handle(conn, shared, tls.as_ref().as_ref()).await {
                    warn!(%peer, "replication client: {e}");
                }
            }
        })
        .await
}

/// Writes `bytes`, waiting at most `PG_IO_TIMEOUT` for the client to take them.
async fn send<W: AsyncWriteExt + Unpin>(w: &mut W, bytes: &[u8]) -> Result<(), ReplicationError> {
    tokio::time::timeout(PG_IO_TIMEOUT, w.write_all(bytes))
        .await
        .map_err(|_| ReplicationError::Timeout("sending"))??;
    Ok(())
}

/// Appends `msg` encoded to `out`. Our own messages are small and well
/// formed; an encoding failure is a bug, reported as a protocol error.
fn put(out: &mut BytesMut, msg: &impl Message) -> Result<(), ReplicationError> {
    msg.encode(out).map_err(|e| ReplicationError::Protocol(format!("encoding a reply: {e}")))
}

/// An ErrorResponse with `code` (SQLSTATE) and `text`.
fn error_message(code: &str, text: &str) -> ErrorResponse {
    let fields = [(b'S', "ERROR"), (b'V', "ERROR"), (b'C', code), (b'M', text)];
    ErrorResponse::new(fields.iter().map(|(k, v)| (*k, v.to_string())).collect())
}

/// The bytes of [`error_message`].
fn error_response(code: &str, text: &str) -> Vec<u8> {
    let mut out = BytesMut::new();
    match put(&mut out, &error_message(code, text)) {
        Ok(()) => out.to_vec(),
        Err(_) => Vec::new(),
    }
}

/// A one-row result with text columns, its CommandComplete and ReadyForQuery.
fn row_result(
    out: &mut BytesMut,
    columns: &[(&str, u32)],
    values: &[Option<String>],
    tag: &str,
) -> Result<(), ReplicationError> {
    let fields = columns
        .iter()
        .map(|(name, type_oid)| FieldDescription::new(name.to_string(), 0, 0, *type_oid, -1, -1, 0))
        .collect();
    put(out, &RowDescription::new(fields))?;
    let mut row = BytesMut::new();
    for v in values {
        match v {
            Some(s) => {
                row.extend_from_slice(&(s.len() as i32).to_be_bytes());
                row.extend_from_slice(s.as_bytes());
            }
            None => row.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    put(out, &DataRow::new(row, values.len() as i16))?;
    put(out, &CommandComplete::new(tag.to_string()))?;
    put(out, &ReadyForQuery::new(TransactionStatus::Idle))
}

/// Frontend messages read from a stream's read side, decoded by pgwire.
struct Reader<R> {
    r: R,
    buf: BytesMut,
    ctx: DecodeContext,
    /// Before the startup: its messages have no tag, a length first, and
    /// at least 8 bytes (length and code).
    untagged: bool,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    fn new(r: R, ctx: DecodeContext) -> Reader<R> {
        Reader { r, buf: BytesMut::with_capacity(PG_READ_CHUNK), ctx, untagged: false }
    }

    /// The next message; every wait for bytes is bounded by `PG_IO_TIMEOUT`,
    /// and no message may be larger than `PG_MAX_MESSAGE`.
    async fn next(&mut self) -> Result<PgWireFrontendMessage, ReplicationError> {
        loop {
            if let Some(msg) = PgWireFrontendMessage::decode(&mut self.buf, &self.ctx)
                .map_err(|e| ReplicationError::Protocol(e.to_string()))?
            {
                return Ok(msg);
            }
            if self.buf.len() > PG_MAX_MESSAGE {
                return Err(ReplicationError::Protocol(format!("a message larger than {PG_MAX_MESSAGE} bytes")));
            }
            // A length too short for any startup message would otherwise
            // keep the connection waiting for bytes that complete nothing.
            if self.untagged && self.buf.len() >= 4 {
                let len = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if len < 8 {
                    return Err(ReplicationError::Protocol(format!("a startup message of length {len}")));
                }
            }
            self.buf.reserve(PG_READ_CHUNK);
            let n = tokio::time::timeout(PG_IO_TIMEOUT, self.r.read_buf(&mut self.buf))
                .await
                .map_err(|_| ReplicationError::Timeout("reading"))??;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
    }
}

/// A connection after its startup: messages in, bytes out.
struct Session {
    reader: Reader<ReadHalf<Stream>>,
    w: WriteHalf<Stream>,
}

async fn handle(
    conn: strata_service::Connection,
    shared: Arc<Shared>,
    tls: Option<&ServerTls>,
) -> Result<(), ReplicationError> {
    let (tcp, slot) = conn.into_plain();
    let _ = tcp.set_nodelay(true);
    let limit = shared.config.handshake_timeout;
    // The TLS negotiation, the startup and, with tokens, the password
    // exchange: a client holds an established (not displaceable) place
    // only once it has proven itself.
    let (conn, params) = tokio::time::timeout_at(slot.handshake_deadline(), async {
        let (mut conn, params) = startup(tcp, tls).await?;
        if let Some(verifier) = &shared.verifier {
            let need = timeline_ids(&params).map_or(Access::Service, |(t, l)| Access::Timeline(t, l));
            authenticate(&mut conn, &shared, verifier, need).await?;
        }
        Ok::<_, ReplicationError>((conn, params))
    })
    .await
    .map_err(|_| ReplicationError::Handshake(limit))??;
    slot.established();
    session(conn, shared, params).await
}

/// The timeline named by `-c strata.timeline=<tenant>/<timeline>` (or the
/// database name), as given.
fn timeline_name(params: &BTreeMap<String, String>) -> String {
    let options = params.get("options").cloned().unwrap_or_default();
    options
        .split_whitespace()
        .find_map(|o| o.strip_prefix("strata.timeline="))
        .map(str::to_string)
        .unwrap_or_else(|| params.get("database").cloned().unwrap_or_default())
}

/// The ids of [`timeline_name`], if it is a pair of ids.
fn timeline_ids(params: &BTreeMap<String, String>) -> Option<(TenantId, TimelineId)> {
    let name = timeline_name(params);
    let (t, l) = name.split_once('/')?;
    Some((t.parse().ok()?, l.parse().ok()?))
}

/// The startup packet's parameters, on the stream they came over: TLS
/// when the client asked for it and `tls` is given (then required);
/// GSS encryption is declined.
async fn startup(
    tcp: tokio::net::TcpStream,
    tls: Option<&ServerTls>,
) -> Result<(Session, BTreeMap<String, String>), ReplicationError> {
    // Before any encryption: SSLRequest, GSSENCRequest or the startup.
    let mut plain = Reader::new(tcp, DecodeContext::new(ProtocolVersion::PROTOCOL3_0));
    plain.untagged = true;
    // The settled stream and what was read of it beyond the negotiation.
    let (stream, read_ahead) = loop {
        match plain.next().await? {
            PgWireFrontendMessage::SslNegotiation(SslNegotiationMetaMessage::PostgresSsl(_)) => {
                let Some(tls) = tls else {
                    send(&mut plain.r, &[SslResponse::BYTE_REFUSE]).await?;
                    continue;
                };
                // Bytes sent before the handshake would be taken as if
                // they had come over TLS: refuse them.
                if !plain.buf.is_empty() {
                    return Err(ReplicationError::Protocol("data after SSLRequest before the handshake".into()));
                }
                send(&mut plain.r, &[SslResponse::BYTE_ACCEPT]).await?;
                break (Stream::from(tls.accept(plain.r).await?), BytesMut::new());
            }
            PgWireFrontendMessage::SslNegotiation(SslNegotiationMetaMessage::PostgresGss(_)) => {
                send(&mut plain.r, &[SslResponse::BYTE_REFUSE]).await?;
            }
            PgWireFrontendMessage::SslNegotiation(_) if tls.is_some() => {
                let msg = "this service requires TLS: connect with sslmode=require or stricter";
                let _ = send(&mut plain.r, &error_response("28000", msg)).await;
                return Err(ReplicationError::Refused(msg.into()));
            }
            // A startup (or a cancel request) follows, in plaintext.
            PgWireFrontendMessage::SslNegotiation(_) => break (Stream::Plain(plain.r), plain.buf),
            other => return Err(unexpected(&other, "before the startup")),
        }
    };
    let mut ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
    ctx.awaiting_frontend_ssl = false;
    let (r, w) = tokio::io::split(stream);
    let mut reader = Reader::new(r, ctx);
    reader.buf = read_ahead;
    finish_startup(Session { reader, w }).await
}

/// Reads the startup message of a session whose encryption is settled.
async fn finish_startup(mut conn: Session) -> Result<(Session, BTreeMap<String, String>), ReplicationError> {
    match conn.reader.next().await? {
        PgWireFrontendMessage::Startup(startup) if startup.protocol_number_major == 3 => {
            conn.reader.ctx.awaiting_frontend_startup = false;
            Ok((conn, startup.parameters))
        }
        PgWireFrontendMessage::Startup(startup) => {
            let version = format!("{}.{}", startup.protocol_number_major, startup.protocol_number_minor);
            let _ = send(&mut conn.w, &error_response("08P01", &format!("unsupported protocol {version}"))).await;
            Err(ReplicationError::Refused(format!("unsupported protocol {version}")))
        }
        PgWireFrontendMessage::CancelRequest(_) => Err(ReplicationError::Refused("a cancel request".into())),
        other => Err(unexpected(&other, "as the startup")),
    }
}

fn unexpected(msg: &PgWireFrontendMessage, when: &str) -> ReplicationError {
    let name = format!("{msg:?}");
    let name = name.split(['(', ' ', '{']).next().unwrap_or("?").to_string();
    ReplicationError::Protocol(format!("unexpected {name} {when}"))
}

/// Asks for a password and checks it as a token that allows `need`:
/// reading the timeline the startup named (a service or management token
/// when it named no valid one, so that others learn nothing of what is
/// held here).
async fn authenticate(
    conn: &mut Session,
    shared: &Shared,
    verifier: &Verifier,
    need: Access,
) -> Result<(), ReplicationError> {
    // AuthenticationCleartextPassword: the link is TLS, or loopback (a
    // listener beyond loopback needs TLS, `config.rs`).
    let mut out = BytesMut::new();
    put(&mut out, &Authentication::CleartextPassword)?;
    send(&mut conn.w, &out).await?;
    let password = match conn.reader.next().await? {
        PgWireFrontendMessage::PasswordMessageFamily(p) => {
            p.into_password().map_err(|e| ReplicationError::Protocol(e.to_string()))?.password
        }
        other => {
            let e = unexpected(&other, "instead of a password");
            let _ = send(&mut conn.w, &error_response("08P01", &e.to_string())).await;
            return Err(e);
        }
    };
    match verifier.check_for("pg", &format!("start_replication {need}"), &password, need) {
        Ok(_) => Ok(()),
        Err(refusal) => {
            shared.metrics.refusal_metrics().count("pg", &refusal);
            // 28P01 invalid_password; 28000 invalid_authorization_specification.
            let code = if refusal.unauthenticated() { "28P01" } else { "28000" };
            let _ = send(&mut conn.w, &error_response(code, &refusal.to_string())).await;
            Err(ReplicationError::Refused(refusal.to_string()))
        }
    }
}

async fn session(
    mut conn: Session,
    shared: Arc<Shared>,
    params: BTreeMap<String, String>,
) -> Result<(), ReplicationError> {
    let database = timeline_name(&params);
    let timeline = timeline_ids(&params).and_then(|(t, l)| shared.timelines.get(t, l));
    let Some(timeline) = timeline else {
        let msg = format!("choose a timeline held here with options '-c strata.timeline=<tenant_id>/<timeline_id>' (got {database:?})");
        let _ = send(&mut conn.w, &error_response("3D000", &msg)).await;
        return Err(ReplicationError::Refused(msg));
    };
    let strip = params.get("options").is_some_and(|o| o.contains("strata.strip_consistency=on"))
        || shared.config.strip_consistency_for_replication;
    let mut out = BytesMut::new();
    put(&mut out, &Authentication::Ok)?;
    for (k, v) in [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ] {
        put(&mut out, &ParameterStatus::new(k.to_string(), v.to_string()))?;
    }
    put(&mut out, &BackendKeyData::new(1, SecretKey::I32(2)))?;
    put(&mut out, &ReadyForQuery::new(TransactionStatus::Idle))?;
    send(&mut conn.w, &out).await?;

    loop {
        let query = match conn.reader.next().await? {
            PgWireFrontendMessage::Terminate(_) => return Ok(()),
            PgWireFrontendMessage::Query(q) => q.query.trim().trim_end_matches(';').to_string(),
            other => {
                let mut out = BytesMut::new();
                put(&mut out, &error_message("08P01", &unexpected(&other, "in a session").to_string()))?;
                put(&mut out, &ReadyForQuery::new(TransactionStatus::Idle))?;
                let _ = send(&mut conn.w, &out).await;
                continue;
            }
        };
        let upper = query.to_ascii_uppercase();
        let positions = timeline.positions();
        let mut out = BytesMut::new();
        if upper == "IDENTIFY_SYSTEM" {
            row_result(
                &mut out,
                &[("systemid", 25), ("timeline", 23), ("xlogpos", 25), ("dbname", 25)],
                &[
                    Some(timeline.identity.system_id.to_string()),
                    Some("1".into()),
                    Some(positions.commit_lsn.to_string()),
                    None,
                ],
                "IDENTIFY_SYSTEM",
            )?;
        } else if upper == "SHOW WAL_SEGMENT_SIZE" {
            row_result(
                &mut out,
                &[("wal_segment_size", 25)],
                &[Some(format!("{}MB", timeline.identity.wal_segment_size >> 20))],
                "SHOW",
            )?;
        } else if upper == "SHOW DATA_DIRECTORY_MODE" {
            row_result(&mut out, &[("data_directory_mode", 25)], &[Some("0700".into())], "SHOW")?;
        } else if upper.starts_with("START_REPLICATION") {
            return stream(conn, &shared, &timeline, &query, strip).await;
        } else {
            put(&mut out, &error_message("0A000", &format!("not supported by a Strata safekeeper: {query}")))?;
            put(&mut out, &ReadyForQuery::new(TransactionStatus::Idle))?;
        }
        send(&mut conn.w, &out).await?;
    }
}

/// The client ended the copy (CopyDone): end ours and the command.
async fn end_copy(w: &mut WriteHalf<Stream>) -> Result<(), ReplicationError> {
    let mut out = BytesMut::new();
    put(&mut out, &CopyDone::new())?;
    put(&mut out, &CommandComplete::new("START_STREAMING".into()))?;
    put(&mut out, &ReadyForQuery::new(TransactionStatus::Idle))?;
    send(w, &out).await
}

/// A CopyData message carrying a walsender payload (`w` or `k`).
fn copy_data(payload: Vec<u8>) -> Result<BytesMut, ReplicationError> {
    let mut out = BytesMut::with_capacity(payload.len() + 5);
    put(&mut out, &CopyData::new(payload.into()))?;
    Ok(out)
}

/// The offloaded segment a stream last read from object storage: a replica
/// that lags behind what this safekeeper keeps reads a whole segment from
/// there, one at a time (bounded: one segment per stream).
#[derive(Default)]
struct OffloadedSegment {
    segment: Option<(u64, Vec<u8>)>,
}

impl OffloadedSegment {
    /// Reads WAL at `from` into `buf`, up to the end of its segment, from
    /// the segment offloaded to object storage; how many bytes it read.
    async fn read(&mut self, shared: &Shared, timeline: &Timeline, from: Lsn, buf: &mut [u8]) -> Result<usize, String> {
        let Some(remote) = shared.remote.as_ref() else {
            return Err("no object storage to read it back from".into());
        };
        let size = u64::from(timeline.identity.wal_segment_size);
        let segno = from.0 / size;
        if self.segment.as_ref().is_none_or(|(s, _)| *s != segno) {
            let (tenant, id) = (timeline.identity.tenant_id, timeline.identity.timeline_id);
            let fetched = strata_remote_storage::wal::fetch_segment(remote, tenant, id, segno, size)
                .await
                .map_err(|e| format!("reading segment {segno} back from object storage: {e}"))?;
            let Some((_, bytes)) = fetched else {
                return Err(format!("segment {segno} is not in object storage either"));
            };
            if bytes.len() as u64 != size {
                return Err(format!("segment {segno} in object storage has {} bytes, not {size}", bytes.len()));
            }
            info!(timeline = %id, segno, "a replication client reads WAL offloaded to object storage");
            self.segment = Some((segno, bytes));
        }
        let bytes = &self.segment.as_ref().expect("fetched above").1;
        let offset = (from.0 % size) as usize;
        let n = buf.len().min(bytes.len() - offset);
        buf[..n].copy_from_slice(&bytes[offset..offset + n]);
        Ok(n)
    }
}

/// `START_REPLICATION [SLOT name] [PHYSICAL] X/X [TIMELINE n]`.
async fn stream(
    conn: Session,
    shared: &Shared,
    timeline: &Arc<Timeline>,
    query: &str,
    strip: bool,
) -> Result<(), ReplicationError> {
    let requested: Option<Lsn> = query.split_whitespace().find_map(|w| w.parse().ok());
    // PostgreSQL's walreceiver asks for the start of the segment that holds
    // where it starts. A timeline that begins inside a segment has nothing
    // before its start there, so such a stream begins at the start (the
    // data's position travels in every message).
    let segment_size = u64::from(timeline.identity.wal_segment_size);
    let first_segment = Lsn(timeline.start_lsn.0 - timeline.start_lsn.0 % segment_size);
    let start =
        requested.map(|l| if (first_segment..timeline.start_lsn).contains(&l) { timeline.start_lsn } else { l });
    let positions = timeline.positions();
    let Some(start) = start.filter(|l| *l >= timeline.start_lsn && *l <= positions.commit_lsn) else {
        let msg =
            format!("start position must lie in the committed WAL, {} to {}", timeline.start_lsn, positions.commit_lsn);
        let Session { mut w, .. } = conn;
        let mut out = BytesMut::new();
        put(&mut out, &error_message("58P01", &msg))?;
        put(&mut out, &ReadyForQuery::new(TransactionStatus::Idle))?;
        let _ = send(&mut w, &out).await;
        return Err(ReplicationError::Refused(msg));
    };
    info!(timeline = %timeline.identity.timeline_id, %start, strip, "replication client streaming");
    let Session { mut reader, mut w } = conn;
    let mut out = BytesMut::new();
    put(&mut out, &CopyBothResponse::new(0, 0, Vec::new()))?;
    send(&mut w, &out).await?;
    let version = PgVersion::from_major(timeline.identity.pg_version).unwrap_or(PgVersion::V15);
    let mut stripper = strip.then(|| ConsistencyStripper::new(version, start, segment_size));
    // Client messages: hot standby feedback goes to the timeline's
    // registry (for the writer's proposer), status updates are dropped;
    // CopyDone ends the stream. A client quiet for longer than `PG_IO_TIMEOUT`
    // is fine: the reader then only stops listening, the WAL keeps flowing.
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    let tl = timeline.clone();
    let reader = tokio::spawn(async move {
        let feedback = tl.standby_feedback.slot();
        loop {
            match reader.next().await {
                Ok(PgWireFrontendMessage::CopyDone(_) | PgWireFrontendMessage::Terminate(_)) => {
                    let _ = done_tx.send(());
                    return;
                }
                Ok(PgWireFrontendMessage::CopyData(d)) if d.data.first() == Some(&b'h') => {
                    if let Some(f) = crate::standby_feedback::parse_hot_standby_feedback(&d.data[1..]) {
                        feedback.set(f);
                    }
                }
                Ok(_) | Err(ReplicationError::Timeout(_)) => {}
                Err(_) => return,
            }
        }
    });
    let mut watch = timeline.subscribe();
    let mut sent = start;
    let mut out_lsn = start;
    let mut buf = vec![0u8; shared.config.max_send_bytes];
    // Only committed WAL is sent: the segment being read stays open.
    let mut wal = WalReader::new(&timeline.dir, segment_size, true);
    let mut offloaded = OffloadedSegment::default();
    let result: Result<(), ReplicationError> = async {
        loop {
            match done_rx.try_recv() {
                Ok(()) => return end_copy(&mut w).await,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => return Ok(()),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
            }
            let commit = watch.borrow_and_update().commit_lsn;
            if sent < commit {
                let mut n = ((commit.0 - sent.0) as usize).min(buf.len());
                let read = tokio::task::block_in_place(|| wal.read(sent, &mut buf[..n]));
                if let Err(e) = read {
                    // Removed here once offloaded: a lagging replica's WAL comes back from object storage.
                    if e.kind() != std::io::ErrorKind::NotFound {
                        return Err(ReplicationError::Wal(e.to_string()));
                    }
                    n = offloaded
                        .read(shared, timeline, sent, &mut buf[..n])
                        .await
                        .map_err(|why| ReplicationError::Wal(format!("{e}; {why}")))?;
                }
                sent = Lsn(sent.0 + n as u64);
                let data = match stripper.as_mut() {
                    Some(st) => st.push(&buf[..n]).map_err(|e| ReplicationError::Wal(e.to_string()))?,
                    None => buf[..n].to_vec(),
                };
                if !data.is_empty() {
                    let mut m = vec![b'w'];
                    m.extend_from_slice(&out_lsn.0.to_be_bytes());
                    m.extend_from_slice(&commit.0.to_be_bytes());
                    m.extend_from_slice(&strata_formats::time::from_system_time(shared.clock.system_now()).to_be_bytes());
                    m.extend_from_slice(&data);
                    out_lsn = Lsn(out_lsn.0 + data.len() as u64);
                    send(&mut w, &copy_data(m)?).await?;
                }
                continue;
            }
            tokio::select! {
                done = &mut done_rx => {
                    return match done {
                        Ok(()) => end_copy(&mut w).await,
                        Err(_) => Ok(()), // the client went away
                    };
                }
                changed = watch.changed() => { if changed.is_err() { return Ok(()); } }
                () = shared.clock.sleep(PG_KEEPALIVE) => {
                    let mut m = vec![b'k'];
                    m.extend_from_slice(&out_lsn.0.to_be_bytes());
                    m.extend_from_slice(&strata_formats::time::from_system_time(shared.clock.system_now()).to_be_bytes());
                    m.push(0);
                    send(&mut w, &copy_data(m)?).await?;
                }
            }
        }
    }
    .await;
    reader.abort();
    result
}
