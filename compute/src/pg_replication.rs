//! A client for PostgreSQL's frontend/backend protocol (version 3.0) in
//! physical replication mode: how the compute agent receives the WAL of the
//! unmodified PostgreSQL next to it, like a standby's walreceiver does.
//!
//! The connection is opened with `replication=true`, so the server is a
//! walsender that only understands replication commands (`IDENTIFY_SYSTEM`,
//! `CREATE_REPLICATION_SLOT`, `START_REPLICATION`, `SHOW`, ...), sent as
//! simple queries. `START_REPLICATION` switches the connection to COPY BOTH
//! mode: the server streams WAL in CopyData messages and the client answers
//! with standby status updates, also in CopyData.
//!
//! Everything received is untrusted: lengths are bounded before anything is
//! allocated, and malformed messages are errors, never panics. Reads go
//! through an internal buffer from which whole messages are parsed, which
//! makes [`ReplicationStream::next`] cancel-safe.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use md5::{Digest, Md5};
use strata_formats::Lsn;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tracing::debug;

/// Largest message accepted from the server (type byte excluded, length
/// field included). WAL arrives in chunks of at most 128 KiB; the rest are
/// small.
pub const MAX_MESSAGE_LEN: usize = 64 << 20;

/// Protocol version 3.0, as sent in the StartupMessage.
const PROTOCOL_VERSION: i32 = 3 << 16;

/// How much room is made in the read buffer at least before each read.
const READ_CHUNK: usize = 16 << 10;

/// Read buffer capacity above which an emptied buffer is shrunk again.
const SHRINK_ABOVE: usize = 1 << 20;

/// Longest replication slot name (`NAMEDATALEN - 1`).
const MAX_SLOT_NAME_LEN: usize = 63;

/// SQLSTATE `duplicate_object`, returned for a slot that already exists.
pub const SQLSTATE_DUPLICATE_OBJECT: &str = "42710";

/// Where and how to connect.
#[derive(Clone)]
pub struct ReplicationConfig {
    /// A path starting with `/` is the directory of the server's Unix socket
    /// (`{host}/.s.PGSQL.{port}`), as in libpq; anything else is a TCP host.
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    /// Shown in `pg_stat_replication.application_name`; what
    /// `synchronous_standby_names` refers to.
    pub application_name: String,
    /// Bounds connecting (including authentication) and every query. Zero
    /// means no limit, as in libpq.
    pub connect_timeout: Duration,
}

impl ReplicationConfig {
    /// A configuration without password, named `strata_compute`, with a 10 s timeout.
    pub fn new(host: impl Into<String>, port: u16, user: impl Into<String>) -> ReplicationConfig {
        ReplicationConfig {
            host: host.into(),
            port,
            user: user.into(),
            password: None,
            application_name: "strata_compute".into(),
            connect_timeout: Duration::from_secs(10),
        }
    }

    fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
    }

    /// The server's address, for messages.
    fn describe(&self) -> String {
        if self.is_unix_socket() {
            format!("{}/.s.PGSQL.{}", self.host.trim_end_matches('/'), self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for ReplicationConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("application_name", &self.application_name)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdentifySystem {
    /// The cluster's system identifier (as in `pg_controldata` and WAL page headers).
    pub system_id: u64,
    /// The server's current timeline.
    pub timeline: u32,
    /// The server's current WAL flush position (on a primary), i.e. how far
    /// WAL can be streamed right now.
    pub xlogpos: Lsn,
}

/// What arrives on a replication stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationEvent {
    /// WAL bytes starting at `start`; `server_end` is the end of WAL on the server.
    XLogData { start: Lsn, server_end: Lsn, data: Vec<u8> },
    /// A primary keepalive; `reply_requested` asks for a status update right away.
    Keepalive { server_end: Lsn, reply_requested: bool },
    /// The server ended the stream: CopyDone (end of a historic timeline),
    /// CommandComplete (walsender shutting down after the standby confirmed
    /// flushing all WAL sent), or the connection closed between messages.
    End,
}

/// Why a replication connection failed.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// An ErrorResponse from the server.
    #[error("server error: {severity}: {message} (SQLSTATE {code})")]
    Server { severity: String, code: String, message: String },
    /// The server sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Connecting or a query took longer than the configured timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The server asks for an authentication method this client cannot do,
    /// or for a password that is not configured.
    #[error("authentication: {0}")]
    Auth(String),
    /// A caller-supplied value cannot be sent (e.g. a bad slot name or a NUL byte).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl PgError {
    /// The SQLSTATE of a server error.
    pub fn code(&self) -> Option<&str> {
        match self {
            PgError::Server { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A physical replication connection, before `START_REPLICATION`.
pub struct ReplicationConnection {
    conn: Conn,
    timeout: Duration,
    parameters: HashMap<String, String>,
    backend_pid: Option<i32>,
    /// A query was sent whose response has not been read up to ReadyForQuery
    /// (its future was dropped or timed out); the rest is skipped before the next query.
    in_query: bool,
    /// Set after an I/O or protocol error: the connection's state is unknown.
    broken: Option<String>,
}

impl fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationConnection")
            .field("server_version", &self.parameter("server_version"))
            .field("backend_pid", &self.backend_pid)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// Rows and column names of a simple query's result.
struct QueryResult {
    columns: Vec<String>,
    rows: Vec<Vec<Option<String>>>,
}

impl ReplicationConnection {
    /// Connects and authenticates (trust, cleartext password or MD5), and
    /// waits for the server to be ready.
    pub async fn connect(cfg: &ReplicationConfig) -> Result<ReplicationConnection, PgError> {
        let what = || format!("connecting to {}", cfg.describe());
        with_timeout(cfg.connect_timeout, what, Self::connect_inner(cfg)).await
    }

    async fn connect_inner(cfg: &ReplicationConfig) -> Result<ReplicationConnection, PgError> {
        for (name, value) in [("user", &cfg.user), ("application_name", &cfg.application_name)] {
            check_no_nul(name, value)?;
        }
        if let Some(password) = &cfg.password {
            check_no_nul("password", password)?;
        }
        let stream = if cfg.is_unix_socket() {
            Transport::Unix(UnixStream::connect(cfg.describe()).await?)
        } else {
            let s = TcpStream::connect((cfg.host.as_str(), cfg.port)).await?;
            s.set_nodelay(true)?;
            Transport::Tcp(s)
        };
        let mut conn = Conn::new(stream);

        let mut startup = Vec::with_capacity(128);
        startup.extend_from_slice(&[0; 4]);
        startup.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        for (key, value) in
            [("user", cfg.user.as_str()), ("replication", "true"), ("application_name", &cfg.application_name)]
        {
            put_cstr(&mut startup, key.as_bytes());
            put_cstr(&mut startup, value.as_bytes());
        }
        startup.push(0);
        let len =
            i32::try_from(startup.len()).map_err(|_| PgError::InvalidArgument("startup packet too long".into()))?;
        startup[..4].copy_from_slice(&len.to_be_bytes());
        conn.wbuf.extend_from_slice(&startup);
        conn.flush().await?;

        let mut parameters = HashMap::new();
        let mut backend_pid = None;
        let mut authenticated = false;
        loop {
            let Some((tag, body)) = conn.next_frame().await? else {
                return Err(eof("during authentication"));
            };
            if skip_async_message(tag, body, &mut parameters) {
                continue;
            }
            match tag {
                b'R' => {
                    let mut b = Body::new(body, "Authentication");
                    let reply: Vec<u8> = match b.i32()? {
                        0 => {
                            authenticated = true;
                            continue;
                        }
                        3 => {
                            let password = password_for(cfg, "cleartext password")?;
                            let mut r = Vec::with_capacity(password.len() + 1);
                            put_cstr(&mut r, password.as_bytes());
                            r
                        }
                        5 => {
                            let salt: [u8; 4] = b.array()?;
                            let password = password_for(cfg, "MD5")?;
                            let mut r = md5_password(&cfg.user, password, salt).into_bytes();
                            r.push(0);
                            r
                        }
                        10 => {
                            let mut mechanisms = Vec::new();
                            while let Ok(m) = b.cstr() {
                                if m.is_empty() {
                                    break;
                                }
                                mechanisms.push(String::from_utf8_lossy(m).into_owned());
                            }
                            return Err(PgError::Auth(format!(
                                "the server requires SASL authentication (mechanisms: {}); \
                                 SCRAM-SHA-256 is not supported yet",
                                mechanisms.join(", ")
                            )));
                        }
                        2 => return Err(unsupported_auth("Kerberos V5")),
                        6 => return Err(unsupported_auth("SCM credentials")),
                        7 => return Err(unsupported_auth("GSSAPI")),
                        9 => return Err(unsupported_auth("SSPI")),
                        other => {
                            return Err(PgError::Protocol(format!("unexpected authentication request {other}")));
                        }
                    };
                    conn.queue(b'p', &reply)?;
                    conn.flush().await?;
                }
                b'E' => return Err(parse_error_response(body)),
                b'K' => {
                    let mut b = Body::new(body, "BackendKeyData");
                    backend_pid = Some(b.i32()?);
                }
                b'v' => {
                    // NegotiateProtocolVersion: only sent for a newer minor
                    // version or unknown `_pq_.` options, neither of which is requested.
                    debug!("server sent NegotiateProtocolVersion");
                }
                b'Z' if authenticated => break,
                other => return Err(unexpected(other, "during connection startup")),
            }
        }
        debug!(server = %cfg.describe(), ?backend_pid, "replication connection established");
        Ok(ReplicationConnection {
            conn,
            timeout: cfg.connect_timeout,
            parameters,
            backend_pid,
            in_query: false,
            broken: None,
        })
    }

    /// A run-time parameter the server reported (`server_version`, `integer_datetimes`, ...).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }

    /// Process id of the walsender serving this connection.
    pub fn backend_pid(&self) -> Option<i32> {
        self.backend_pid
    }

    /// Runs `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<IdentifySystem, PgError> {
        let result = self.query("IDENTIFY_SYSTEM").await?;
        let [row] = result.rows.as_slice() else {
            return Err(PgError::Protocol(format!("IDENTIFY_SYSTEM returned {} rows", result.rows.len())));
        };
        let field = |name: &str, index: usize| -> Result<&str, PgError> {
            let i = result.columns.iter().position(|c| c == name).unwrap_or(index);
            row.get(i)
                .and_then(|v| v.as_deref())
                .ok_or_else(|| PgError::Protocol(format!("IDENTIFY_SYSTEM returned no {name}")))
        };
        let bad =
            |name: &str, value: &str| PgError::Protocol(format!("IDENTIFY_SYSTEM returned invalid {name} {value:?}"));
        let system_id = field("systemid", 0)?;
        let timeline = field("timeline", 1)?;
        let xlogpos = field("xlogpos", 2)?;
        Ok(IdentifySystem {
            system_id: system_id.parse().map_err(|_| bad("systemid", system_id))?,
            timeline: timeline.parse().map_err(|_| bad("timeline", timeline))?,
            xlogpos: xlogpos.parse().map_err(|_| bad("xlogpos", xlogpos))?,
        })
    }

    /// Runs a simple query and returns its rows as text (NULL as `None`).
    /// On a replication connection only replication commands and `SHOW` work.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, PgError> {
        Ok(self.query(sql).await?.rows)
    }

    /// Creates a physical slot that reserves WAL right away; `Ok(false)` if it already exists.
    pub async fn create_physical_slot(&mut self, name: &str) -> Result<bool, PgError> {
        check_slot_name(name)?;
        match self.query(&format!("CREATE_REPLICATION_SLOT \"{name}\" PHYSICAL RESERVE_WAL")).await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some(SQLSTATE_DUPLICATE_OBJECT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Starts streaming WAL from `start` (through `slot`, if given) on
    /// `timeline` (0: the server's current timeline).
    ///
    /// Errors found before streaming (unknown slot, timeline not in the
    /// server's history) are returned here; but PostgreSQL sends
    /// CopyBothResponse *before* checking that `start` is not ahead of its
    /// flush position, so that error comes from the first
    /// [`ReplicationStream::next`].
    ///
    /// If the server answers without entering COPY mode (a historic timeline
    /// that ends exactly at `start`), the stream is returned already ended.
    pub async fn start_physical(
        mut self,
        slot: Option<&str>,
        start: Lsn,
        timeline: u32,
    ) -> Result<ReplicationStream, PgError> {
        let mut command = String::from("START_REPLICATION");
        if let Some(slot) = slot {
            check_slot_name(slot)?;
            command.push_str(&format!(" SLOT \"{slot}\""));
        }
        command.push_str(&format!(" PHYSICAL {start}"));
        if timeline != 0 {
            command.push_str(&format!(" TIMELINE {timeline}"));
        }
        let timeout = self.timeout;
        let ended = with_timeout(timeout, || command.clone(), self.start_inner(&command)).await?;
        Ok(ReplicationStream { conn: self.conn, parameters: self.parameters, ended, timeout })
    }

    /// Sends START_REPLICATION; returns whether the server skipped COPY mode.
    async fn start_inner(&mut self, command: &str) -> Result<bool, PgError> {
        self.begin_query(command).await?;
        let mut error = None;
        loop {
            let Some((tag, body)) = self.conn.next_frame().await? else {
                return Err(eof("waiting for CopyBothResponse"));
            };
            if skip_async_message(tag, body, &mut self.parameters) {
                continue;
            }
            match tag {
                b'W' => {
                    let mut b = Body::new(body, "CopyBothResponse");
                    let format = b.u8()?;
                    debug!(format, "START_REPLICATION: streaming");
                    return Ok(false);
                }
                b'E' => {
                    error.get_or_insert(parse_error_response(body));
                }
                b'T' | b'D' | b'C' => debug!(tag = %char::from(tag), "START_REPLICATION answered without COPY mode"),
                b'Z' => {
                    self.in_query = false;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(true),
                    };
                }
                other => return Err(unexpected(other, "in response to START_REPLICATION")),
            }
        }
    }

    /// Runs a query under the timeout; I/O and protocol errors make the connection unusable.
    async fn query(&mut self, sql: &str) -> Result<QueryResult, PgError> {
        let timeout = self.timeout;
        let result = with_timeout(timeout, || format!("query {sql:?}"), self.query_inner(sql)).await;
        if let Err(e @ (PgError::Io(_) | PgError::Protocol(_))) = &result {
            self.broken = Some(e.to_string());
        }
        result
    }

    async fn query_inner(&mut self, sql: &str) -> Result<QueryResult, PgError> {
        self.begin_query(sql).await?;
        let mut result = QueryResult { columns: Vec::new(), rows: Vec::new() };
        let mut error = None;
        loop {
            let Some((tag, body)) = self.conn.next_frame().await? else {
                return Err(eof("waiting for a query result"));
            };
            if skip_async_message(tag, body, &mut self.parameters) {
                continue;
            }
            match tag {
                b'T' => result.columns = parse_row_description(body)?,
                b'D' => result.rows.push(parse_data_row(body)?),
                b'C' => {
                    debug!(tag = %String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body)), "command complete")
                }
                b'I' => {}
                b'E' => {
                    error.get_or_insert(parse_error_response(body));
                }
                b'Z' => {
                    self.in_query = false;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(result),
                    };
                }
                other => return Err(unexpected(other, "in a query result")),
            }
        }
    }

    /// Skips what is left of an abandoned query, then sends `sql` as a simple query.
    async fn begin_query(&mut self, sql: &str) -> Result<(), PgError> {
        if let Some(reason) = &self.broken {
            return Err(PgError::Protocol(format!("connection unusable after an earlier error: {reason}")));
        }
        check_no_nul("query", sql)?;
        self.conn.flush().await?;
        while self.in_query {
            let Some((tag, _)) = self.conn.next_frame().await? else {
                return Err(eof("skipping an abandoned query's result"));
            };
            match tag {
                b'Z' => self.in_query = false,
                b'W' | b'G' | b'H' => return Err(unexpected(tag, "in an abandoned query's result")),
                _ => {}
            }
        }
        let mut body = Vec::with_capacity(sql.len() + 1);
        put_cstr(&mut body, sql.as_bytes());
        self.conn.queue(b'Q', &body)?;
        self.in_query = true;
        self.conn.flush().await
    }
}

/// A connection in COPY BOTH mode after `START_REPLICATION`.
///
/// Reads wait as long as PostgreSQL is quiet (an idle server sends nothing,
/// and it is a local child whose exit the agent watches); every write waits
/// at most the connection's timeout.
pub struct ReplicationStream {
    conn: Conn,
    parameters: HashMap<String, String>,
    ended: bool,
    timeout: Duration,
}

impl fmt::Debug for ReplicationStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationStream").field("ended", &self.ended).finish_non_exhaustive()
    }
}

impl ReplicationStream {
    /// Next message; CANCEL-SAFE (used inside `tokio::select!`): all socket
    /// reads go into an internal buffer and messages are parsed from the
    /// buffer, so cancelling never loses bytes. After [`ReplicationEvent::End`]
    /// or a server error it returns `End`.
    pub async fn next(&mut self) -> Result<ReplicationEvent, PgError> {
        if self.ended {
            return Ok(ReplicationEvent::End);
        }
        loop {
            let Some((tag, body)) = self.conn.next_frame().await? else {
                self.ended = true;
                return Ok(ReplicationEvent::End);
            };
            if skip_async_message(tag, body, &mut self.parameters) {
                continue;
            }
            return match tag {
                b'd' => parse_copy_data(body),
                // CopyDone ends a historic timeline. At shutdown, once the
                // standby confirmed flushing everything, the walsender sends
                // CommandComplete ("COPY 0") without CopyDone and exits.
                // ReadyForQuery: copy mode is over (after an error).
                b'c' | b'C' | b'Z' => {
                    self.ended = true;
                    Ok(ReplicationEvent::End)
                }
                // An error ends copy mode; ReadyForQuery or a closed
                // connection follows (FATAL).
                b'E' => {
                    self.ended = true;
                    Err(parse_error_response(body))
                }
                other => Err(unexpected(other, "in the replication stream")),
            };
        }
    }

    /// Standby status update ('r'): write, flush, apply LSNs, client time
    /// (microseconds since 2000-01-01), reply flag.
    ///
    /// If cancelled, the unsent rest of the message stays queued and is sent
    /// first by the next call, so the stream stays well-formed.
    pub async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply_requested: bool,
    ) -> Result<(), PgError> {
        let mut body = [0u8; 34];
        body[0] = b'r';
        body[1..9].copy_from_slice(&write.0.to_be_bytes());
        body[9..17].copy_from_slice(&flush.0.to_be_bytes());
        body[17..25].copy_from_slice(&apply.0.to_be_bytes());
        body[25..33].copy_from_slice(&strata_formats::time::pg_now().to_be_bytes());
        body[33] = u8::from(reply_requested);
        let timeout = self.timeout;
        with_timeout(timeout, || "sending a standby status update".to_string(), async {
            self.conn.flush().await?;
            self.conn.queue(b'd', &body)?;
            self.conn.flush().await
        })
        .await
    }

    /// A run-time parameter the server reported.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }
}

/// The MD5 password response: `"md5" + hex(md5(hex(md5(password + user)) + salt))`.
fn md5_password(user: &str, password: &str, salt: [u8; 4]) -> String {
    let inner = hex(&Md5::new().chain_update(password).chain_update(user).finalize());
    let outer = hex(&Md5::new().chain_update(inner).chain_update(salt).finalize());
    format!("md5{outer}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn password_for<'a>(cfg: &'a ReplicationConfig, method: &str) -> Result<&'a str, PgError> {
    cfg.password.as_deref().ok_or_else(|| {
        PgError::Auth(format!("the server requested {method} authentication but no password is configured"))
    })
}

fn unsupported_auth(method: &str) -> PgError {
    PgError::Auth(format!("the server requested {method} authentication, which is not supported"))
}

fn check_no_nul(what: &str, value: &str) -> Result<(), PgError> {
    if value.contains('\0') {
        return Err(PgError::InvalidArgument(format!("{what} contains a NUL byte")));
    }
    Ok(())
}

/// Slot names are what PostgreSQL accepts: 1..=63 of `[a-z0-9_]`.
fn check_slot_name(name: &str) -> Result<(), PgError> {
    let valid_chars = name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
    if name.is_empty() || name.len() > MAX_SLOT_NAME_LEN || !valid_chars {
        return Err(PgError::InvalidArgument(format!(
            "replication slot name {name:?} must be 1 to {MAX_SLOT_NAME_LEN} lower case letters, digits and underscores"
        )));
    }
    Ok(())
}

fn put_cstr(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(s);
    buf.push(0);
}

fn eof(when: &str) -> PgError {
    PgError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, format!("server closed the connection {when}")))
}

fn unexpected(tag: u8, when: &str) -> PgError {
    PgError::Protocol(format!("unexpected message type {} {when}", describe_tag(tag)))
}

fn describe_tag(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("'{}'", char::from(tag))
    } else {
        format!("0x{tag:02x}")
    }
}

async fn with_timeout<T>(
    timeout: Duration,
    what: impl FnOnce() -> String,
    fut: impl Future<Output = Result<T, PgError>>,
) -> Result<T, PgError> {
    if timeout.is_zero() {
        return fut.await;
    }
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(PgError::Timeout(format!("{} took longer than {timeout:?}", what()))),
    }
}

/// Handles messages the server may send at any time (NoticeResponse,
/// ParameterStatus, NotificationResponse); returns whether `tag` was one.
fn skip_async_message(tag: u8, body: &[u8], parameters: &mut HashMap<String, String>) -> bool {
    match tag {
        b'N' => {
            let fields = parse_fields(body);
            debug!(
                severity = fields.get(&b'S').map(String::as_str).unwrap_or(""),
                message = fields.get(&b'M').map(String::as_str).unwrap_or(""),
                "server notice"
            );
            true
        }
        b'S' => {
            let mut b = Body::new(body, "ParameterStatus");
            if let (Ok(name), Ok(value)) = (b.cstr(), b.cstr()) {
                let (name, value) = (String::from_utf8_lossy(name), String::from_utf8_lossy(value));
                debug!(%name, %value, "server parameter");
                parameters.insert(name.into_owned(), value.into_owned());
            }
            true
        }
        b'A' => true,
        _ => false,
    }
}

/// The fields of an ErrorResponse or NoticeResponse, by field type.
fn parse_fields(body: &[u8]) -> HashMap<u8, String> {
    let mut fields = HashMap::new();
    let mut b = Body::new(body, "ErrorResponse");
    while let Ok(kind) = b.u8() {
        if kind == 0 {
            break;
        }
        let Ok(value) = b.cstr() else { break };
        fields.insert(kind, String::from_utf8_lossy(value).into_owned());
    }
    fields
}

fn parse_error_response(body: &[u8]) -> PgError {
    let mut fields = parse_fields(body);
    if let Some(detail) = fields.get(&b'D') {
        debug!(%detail, "server error detail");
    }
    // 'V' is the severity never localized; 'S' may be translated.
    let severity = fields.remove(&b'V').or_else(|| fields.remove(&b'S')).unwrap_or_else(|| "ERROR".into());
    PgError::Server {
        severity,
        code: fields.remove(&b'C').unwrap_or_default(),
        message: fields.remove(&b'M').unwrap_or_default(),
    }
}

fn parse_row_description(body: &[u8]) -> Result<Vec<String>, PgError> {
    let mut b = Body::new(body, "RowDescription");
    let count = b.i16()?;
    let count = usize::try_from(count).map_err(|_| PgError::Protocol(format!("RowDescription with {count} fields")))?;
    // Each field takes at least 19 bytes, so `count` is bounded by the message length.
    let mut columns = Vec::with_capacity(count.min(body.len() / 19));
    for _ in 0..count {
        let name = String::from_utf8_lossy(b.cstr()?).into_owned();
        b.take(18)?; // table oid, column number, type oid, type size, type modifier, format
        columns.push(name);
    }
    Ok(columns)
}

fn parse_data_row(body: &[u8]) -> Result<Vec<Option<String>>, PgError> {
    let mut b = Body::new(body, "DataRow");
    let count = b.i16()?;
    let count = usize::try_from(count).map_err(|_| PgError::Protocol(format!("DataRow with {count} columns")))?;
    let mut row = Vec::with_capacity(count.min(body.len() / 4));
    for _ in 0..count {
        let len = b.i32()?;
        if len == -1 {
            row.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| PgError::Protocol(format!("DataRow value of length {len}")))?;
        row.push(Some(String::from_utf8_lossy(b.take(len)?).into_owned()));
    }
    Ok(row)
}

fn parse_copy_data(body: &[u8]) -> Result<ReplicationEvent, PgError> {
    let mut b = Body::new(body, "replication message");
    match b.u8()? {
        b'w' => {
            let mut b = Body::new(b.rest(), "XLogData");
            let start = Lsn(b.u64()?);
            let server_end = Lsn(b.u64()?);
            let _send_time = b.u64()?;
            Ok(ReplicationEvent::XLogData { start, server_end, data: b.rest().to_vec() })
        }
        b'k' => {
            let mut b = Body::new(b.rest(), "primary keepalive");
            let server_end = Lsn(b.u64()?);
            let _send_time = b.u64()?;
            let reply_requested = b.u8()? != 0;
            Ok(ReplicationEvent::Keepalive { server_end, reply_requested })
        }
        other => {
            Err(PgError::Protocol(format!("unknown replication message type {} in CopyData", describe_tag(other))))
        }
    }
}

/// A cursor over a message body; running out of bytes is a protocol error.
struct Body<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Body<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Body<'a> {
        Body { buf, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PgError> {
        if self.buf.len() < n {
            return Err(PgError::Protocol(format!("truncated {} message", self.what)));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], PgError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, PgError> {
        Ok(self.array::<1>()?[0])
    }

    fn i16(&mut self) -> Result<i16, PgError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, PgError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, PgError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A NUL-terminated string, without the NUL.
    fn cstr(&mut self) -> Result<&'a [u8], PgError> {
        let Some(end) = self.buf.iter().position(|&c| c == 0) else {
            return Err(PgError::Protocol(format!("unterminated string in {} message", self.what)));
        };
        let s = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// The socket with read and write buffers.
struct Conn {
    stream: Transport,
    /// Received bytes; `rbuf[rpos..]` is not consumed yet.
    rbuf: Vec<u8>,
    rpos: usize,
    /// Size of the message last returned by `next_frame`, consumed on the next call.
    returned: usize,
    /// Bytes to send; `wbuf[wpos..]` is not sent yet.
    wbuf: Vec<u8>,
    wpos: usize,
}

impl Conn {
    fn new(stream: Transport) -> Conn {
        Conn { stream, rbuf: Vec::with_capacity(READ_CHUNK), rpos: 0, returned: 0, wbuf: Vec::new(), wpos: 0 }
    }

    /// Size (type byte included) of the message at the head of the buffer, if
    /// its header has arrived; an error if its length is out of bounds.
    fn head_size(&self) -> Result<Option<usize>, PgError> {
        let avail = &self.rbuf[self.rpos..];
        let [tag, a, b, c, d, ..] = *avail else { return Ok(None) };
        let len = i32::from_be_bytes([a, b, c, d]);
        match usize::try_from(len) {
            Ok(len) if (4..=MAX_MESSAGE_LEN).contains(&len) => Ok(Some(1 + len)),
            _ => Err(PgError::Protocol(format!("message type {} has invalid length {len}", describe_tag(tag)))),
        }
    }

    /// The next message as type and body, or `None` if the server closed the
    /// connection between messages. The body stays valid until the next call.
    ///
    /// Cancel-safe: the only await is a read into the buffer, and a message is
    /// consumed only when the next call starts.
    async fn next_frame(&mut self) -> Result<Option<(u8, &[u8])>, PgError> {
        self.rpos += std::mem::take(&mut self.returned);
        loop {
            let head = self.head_size()?;
            let avail = self.rbuf.len() - self.rpos;
            if let Some(size) = head.filter(|&size| size <= avail) {
                self.returned = size;
                let msg = &self.rbuf[self.rpos..self.rpos + size];
                return Ok(Some((msg[0], &msg[5..])));
            }
            // Move the partial message to the front and make room for the rest.
            if self.rpos > 0 {
                self.rbuf.drain(..self.rpos);
                self.rpos = 0;
                if self.rbuf.capacity() > SHRINK_ABOVE && self.rbuf.len() < READ_CHUNK {
                    self.rbuf.shrink_to(READ_CHUNK);
                }
            }
            let missing = head.unwrap_or(5) - avail;
            self.rbuf.reserve(missing.max(READ_CHUNK));
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                if self.rbuf.is_empty() {
                    return Ok(None);
                }
                return Err(eof("in the middle of a message"));
            }
        }
    }

    /// Queues a message for `flush`.
    fn queue(&mut self, tag: u8, body: &[u8]) -> Result<(), PgError> {
        let len = i32::try_from(body.len() + 4)
            .map_err(|_| PgError::InvalidArgument(format!("message of {} bytes is too long", body.len())))?;
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        }
        self.wbuf.push(tag);
        self.wbuf.extend_from_slice(&len.to_be_bytes());
        self.wbuf.extend_from_slice(body);
        Ok(())
    }

    /// Sends everything queued. If cancelled, the rest stays queued.
    async fn flush(&mut self) -> Result<(), PgError> {
        while self.wpos < self.wbuf.len() {
            let n = self.stream.write(&self.wbuf[self.wpos..]).await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero).into());
            }
            self.wpos += n;
        }
        self.wbuf.clear();
        self.wpos = 0;
        self.stream.flush().await?;
        Ok(())
    }
}

enum Transport {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for Transport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_flush(cx),
            Transport::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_response_matches_postgres() {
        // pg_authid stores "md5" + md5(password + user); for password
        // "secret" and user "md5user" that is md5("secretmd5user").
        let inner = hex(&Md5::digest(b"secretmd5user"));
        let expected = format!("md5{}", hex(&Md5::digest(format!("{inner}abcd").as_bytes())));
        assert_eq!(md5_password("md5user", "secret", *b"abcd"), expected);
        assert_eq!(md5_password("md5user", "secret", *b"abcd").len(), 35);
    }

    #[test]
    fn error_response_fields() {
        let mut body = Vec::new();
        for (k, v) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', "28000"), (b'M', "role \"x\" does not exist")] {
            body.push(k);
            put_cstr(&mut body, v.as_bytes());
        }
        body.push(0);
        match parse_error_response(&body) {
            PgError::Server { severity, code, message } => {
                assert_eq!((severity.as_str(), code.as_str()), ("FATAL", "28000"));
                assert_eq!(message, "role \"x\" does not exist");
            }
            other => panic!("unexpected {other:?}"),
        }
        // Truncated or garbage error bodies still give an error, not a panic.
        for garbage in [&b""[..], b"S", b"SFATAL", b"\xff\xfe", b"C28000\0M"] {
            assert!(matches!(parse_error_response(garbage), PgError::Server { .. }));
        }
    }

    #[test]
    fn copy_data_parsing() {
        let mut w = vec![b'w'];
        w.extend_from_slice(&0x1_0000_0028u64.to_be_bytes());
        w.extend_from_slice(&0x1_0000_1000u64.to_be_bytes());
        w.extend_from_slice(&7i64.to_be_bytes());
        w.extend_from_slice(b"wal");
        assert_eq!(
            parse_copy_data(&w).unwrap(),
            ReplicationEvent::XLogData {
                start: Lsn(0x1_0000_0028),
                server_end: Lsn(0x1_0000_1000),
                data: b"wal".to_vec()
            }
        );
        let mut k = vec![b'k'];
        k.extend_from_slice(&42u64.to_be_bytes());
        k.extend_from_slice(&0i64.to_be_bytes());
        k.push(1);
        assert_eq!(
            parse_copy_data(&k).unwrap(),
            ReplicationEvent::Keepalive { server_end: Lsn(42), reply_requested: true }
        );
        // Every truncation is an error.
        for msg in [&w, &k] {
            for len in 0..msg.len() {
                if msg[0] == b'w' && len >= 25 {
                    continue;
                }
                assert!(matches!(parse_copy_data(&msg[..len]), Err(PgError::Protocol(_))), "len {len}");
            }
        }
        assert!(matches!(parse_copy_data(b"x123"), Err(PgError::Protocol(_))));
    }

    #[test]
    fn row_parsing_is_bounded() {
        // Claims 32767 columns in a tiny message.
        assert!(parse_row_description(&[0x7f, 0xff, b'a', 0]).is_err());
        assert!(parse_data_row(&[0x7f, 0xff, 0, 0, 0, 1]).is_err());
        assert!(parse_data_row(&[0xff, 0xff]).is_err());
        assert!(parse_data_row(&[0, 1, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert_eq!(
            parse_data_row(&[0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, b'7']).unwrap(),
            vec![None, Some("7".into())]
        );
    }

    #[test]
    fn slot_names() {
        assert!(check_slot_name("strata_1").is_ok());
        assert!(check_slot_name("1abc").is_ok());
        for bad in ["", "Upper", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(check_slot_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pg_epoch() {
        // 2020-01-01 is 20 years (7305 days) after the PostgreSQL epoch; now is later.
        assert!(strata_formats::time::pg_now() > 7305 * 86_400 * 1_000_000);
    }
}
