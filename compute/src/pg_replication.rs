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
//! Messages are encoded and decoded by `postgres-protocol` (which also does
//! SCRAM-SHA-256 and MD5); this module adds the replication-only messages
//! that crate does not know (CopyBothResponse, the walsender's CopyData
//! payloads) and the connection's state machine.
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

use crate::limits::MAX_SLOT_NAME_LEN;
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::{self, ErrorFields, Message};
use postgres_protocol::message::frontend;
use strata_formats::Lsn;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tracing::debug;

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
    /// A walsender (`replication=true`, the default); `false` opens a normal
    /// session for the agent's own SQL, such as setting the role's password.
    pub replication: bool,
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
            replication: true,
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
            .field("replication", &self.replication)
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
        let replication = if cfg.replication { "true" } else { "false" };
        let database = if cfg.replication { "replication" } else { "postgres" };
        let parameters = [
            ("user", cfg.user.as_str()),
            ("database", database),
            ("replication", replication),
            ("application_name", &cfg.application_name),
        ];
        frontend::startup_message(parameters, &mut conn.wbuf).map_err(|e| PgError::InvalidArgument(e.to_string()))?;
        conn.flush().await?;

        let mut parameters = HashMap::new();
        let mut backend_pid = None;
        let mut authenticated = false;
        let mut scram: Option<ScramSha256> = None;
        let mut server_proven = false;
        loop {
            let Some(msg) = conn.next_message().await? else {
                return Err(eof("during authentication"));
            };
            let msg = match msg {
                Frame::Pg(msg) => msg,
                // Only sent for a newer minor version or unknown `_pq_.`
                // options, neither of which is requested.
                Frame::NegotiateProtocolVersion => {
                    debug!("server sent NegotiateProtocolVersion");
                    continue;
                }
                Frame::CopyBothResponse => return Err(unexpected(b'W', "during connection startup")),
            };
            let msg = match skip_async_message(msg, &mut parameters) {
                Some(msg) => msg,
                None => continue,
            };
            let encode = |r: io::Result<()>| r.map_err(|e| PgError::InvalidArgument(e.to_string()));
            match msg {
                Message::AuthenticationOk => {
                    // A server that started SCRAM must also prove that it
                    // knows the password before the session counts.
                    if scram.is_some() && !server_proven {
                        return Err(PgError::Auth(
                            "the server ended SCRAM without proving it knows the password".into(),
                        ));
                    }
                    authenticated = true;
                }
                Message::AuthenticationCleartextPassword => {
                    let password = password_for(cfg, "cleartext password")?;
                    encode(frontend::password_message(password.as_bytes(), &mut conn.wbuf))?;
                    conn.flush().await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let password = password_for(cfg, "MD5")?;
                    let hash = postgres_protocol::authentication::md5_hash(
                        cfg.user.as_bytes(),
                        password.as_bytes(),
                        body.salt(),
                    );
                    encode(frontend::password_message(hash.as_bytes(), &mut conn.wbuf))?;
                    conn.flush().await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = Vec::new();
                    let mut it = body.mechanisms();
                    while let Some(m) = it.next().map_err(protocol)? {
                        mechanisms.push(m.to_string());
                    }
                    if !mechanisms.iter().any(|m| m == SCRAM_SHA_256) {
                        return Err(PgError::Auth(format!(
                            "the server offers SASL mechanisms {} but not {SCRAM_SHA_256}",
                            mechanisms.join(", ")
                        )));
                    }
                    let password = password_for(cfg, SCRAM_SHA_256)?;
                    // Channel binding is not used: the server's identity is
                    // established by TLS when the link leaves the host.
                    let s = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                    encode(frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut conn.wbuf))?;
                    scram = Some(s);
                    conn.flush().await?;
                }
                Message::AuthenticationSaslContinue(body) => {
                    let s = scram.as_mut().ok_or_else(|| protocol_msg("SASL continue before SASL start"))?;
                    s.update(body.data()).map_err(|e| PgError::Auth(format!("SCRAM: {e}")))?;
                    encode(frontend::sasl_response(s.message(), &mut conn.wbuf))?;
                    conn.flush().await?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let s = scram.as_mut().ok_or_else(|| protocol_msg("SASL final before SASL start"))?;
                    // Verifies the server's signature: a server that does not
                    // know the password cannot complete the exchange.
                    s.finish(body.data()).map_err(|e| PgError::Auth(format!("SCRAM: the server's proof: {e}")))?;
                    server_proven = true;
                }
                Message::AuthenticationKerberosV5 => return Err(unsupported_auth("Kerberos V5")),
                Message::AuthenticationScmCredential => return Err(unsupported_auth("SCM credentials")),
                Message::AuthenticationGss | Message::AuthenticationGssContinue(_) => {
                    return Err(unsupported_auth("GSSAPI"))
                }
                Message::AuthenticationSspi => return Err(unsupported_auth("SSPI")),
                Message::ErrorResponse(body) => return Err(parse_error_response(body.fields())),
                Message::BackendKeyData(body) => backend_pid = Some(body.process_id()),
                Message::ReadyForQuery(_) if authenticated => break,
                other => return Err(unexpected_message(&other, "during connection startup")),
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
            let Some(frame) = self.conn.next_message().await? else {
                return Err(eof("waiting for CopyBothResponse"));
            };
            let msg = match frame {
                Frame::CopyBothResponse => {
                    debug!("START_REPLICATION: streaming");
                    return Ok(false);
                }
                Frame::NegotiateProtocolVersion => return Err(unexpected(b'v', "in response to START_REPLICATION")),
                Frame::Pg(msg) => msg,
            };
            let Some(msg) = skip_async_message(msg, &mut self.parameters) else { continue };
            match msg {
                Message::ErrorResponse(body) => {
                    error.get_or_insert(parse_error_response(body.fields()));
                }
                Message::RowDescription(_) | Message::DataRow(_) | Message::CommandComplete(_) => {
                    debug!("START_REPLICATION answered without COPY mode")
                }
                Message::ReadyForQuery(_) => {
                    self.in_query = false;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(true),
                    };
                }
                other => return Err(unexpected_message(&other, "in response to START_REPLICATION")),
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
            let Some(frame) = self.conn.next_message().await? else {
                return Err(eof("waiting for a query result"));
            };
            let Frame::Pg(msg) = frame else { return Err(unexpected(frame.tag(), "in a query result")) };
            let Some(msg) = skip_async_message(msg, &mut self.parameters) else { continue };
            match msg {
                Message::RowDescription(body) => result.columns = parse_row_description(&body)?,
                Message::DataRow(body) => result.rows.push(parse_data_row(&body)?),
                Message::CommandComplete(body) => debug!(tag = body.tag().unwrap_or("?"), "command complete"),
                Message::EmptyQueryResponse => {}
                Message::ErrorResponse(body) => {
                    error.get_or_insert(parse_error_response(body.fields()));
                }
                Message::ReadyForQuery(_) => {
                    self.in_query = false;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(result),
                    };
                }
                other => return Err(unexpected_message(&other, "in a query result")),
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
            let Some(frame) = self.conn.next_message().await? else {
                return Err(eof("skipping an abandoned query's result"));
            };
            match frame {
                Frame::Pg(Message::ReadyForQuery(_)) => self.in_query = false,
                Frame::Pg(Message::CopyInResponse(_) | Message::CopyOutResponse(_)) | Frame::CopyBothResponse => {
                    return Err(unexpected(frame.tag(), "in an abandoned query's result"))
                }
                _ => {}
            }
        }
        frontend::query(sql, &mut self.conn.wbuf).map_err(|e| PgError::InvalidArgument(e.to_string()))?;
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
            let Some(frame) = self.conn.next_message().await? else {
                self.ended = true;
                return Ok(ReplicationEvent::End);
            };
            let Frame::Pg(msg) = frame else { return Err(unexpected(frame.tag(), "in the replication stream")) };
            let Some(msg) = skip_async_message(msg, &mut self.parameters) else { continue };
            return match msg {
                Message::CopyData(body) => parse_copy_data(body.data()),
                // CopyDone ends a historic timeline. At shutdown, once the
                // standby confirmed flushing everything, the walsender sends
                // CommandComplete ("COPY 0") without CopyDone and exits.
                // ReadyForQuery: copy mode is over (after an error).
                Message::CopyDone | Message::CommandComplete(_) | Message::ReadyForQuery(_) => {
                    self.ended = true;
                    Ok(ReplicationEvent::End)
                }
                // An error ends copy mode; ReadyForQuery or a closed
                // connection follows (FATAL).
                Message::ErrorResponse(body) => {
                    self.ended = true;
                    Err(parse_error_response(body.fields()))
                }
                other => Err(unexpected_message(&other, "in the replication stream")),
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
        self.send_copy_data(&body, "a standby status update").await
    }

    /// One CopyData message to the server, after whatever is still queued.
    async fn send_copy_data(&mut self, body: &[u8], what: &str) -> Result<(), PgError> {
        let timeout = self.timeout;
        with_timeout(timeout, || format!("sending {what}"), async {
            self.conn.flush().await?;
            frontend::CopyData::new(body)
                .map(|data| data.write(&mut self.conn.wbuf))
                .map_err(|e| PgError::InvalidArgument(e.to_string()))?;
            self.conn.flush().await
        })
        .await
    }

    /// Hot standby feedback ('h'): the oldest xmin and catalog xmin of the
    /// standbys behind this client, as full transaction ids (epoch in the
    /// high half); 0 for none, which releases the slot's xmin.
    pub async fn send_hot_standby_feedback(&mut self, xmin: u64, catalog_xmin: u64) -> Result<(), PgError> {
        let mut body = [0u8; 25];
        body[0] = b'h';
        body[1..9].copy_from_slice(&strata_formats::time::pg_now().to_be_bytes());
        body[9..13].copy_from_slice(&(xmin as u32).to_be_bytes());
        body[13..17].copy_from_slice(&((xmin >> 32) as u32).to_be_bytes());
        body[17..21].copy_from_slice(&(catalog_xmin as u32).to_be_bytes());
        body[21..25].copy_from_slice(&((catalog_xmin >> 32) as u32).to_be_bytes());
        self.send_copy_data(&body, "hot standby feedback").await
    }

    /// A run-time parameter the server reported.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }
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

fn protocol(e: io::Error) -> PgError {
    PgError::Protocol(e.to_string())
}

fn protocol_msg(what: &str) -> PgError {
    PgError::Protocol(what.to_string())
}

/// The type byte of a decoded message.
fn message_tag(msg: &Message) -> u8 {
    match msg {
        Message::AuthenticationCleartextPassword
        | Message::AuthenticationGss
        | Message::AuthenticationKerberosV5
        | Message::AuthenticationMd5Password(_)
        | Message::AuthenticationOk
        | Message::AuthenticationScmCredential
        | Message::AuthenticationSspi
        | Message::AuthenticationGssContinue(_)
        | Message::AuthenticationSasl(_)
        | Message::AuthenticationSaslContinue(_)
        | Message::AuthenticationSaslFinal(_) => b'R',
        Message::BackendKeyData(_) => b'K',
        Message::BindComplete => b'2',
        Message::CloseComplete => b'3',
        Message::CommandComplete(_) => b'C',
        Message::CopyData(_) => b'd',
        Message::CopyDone => b'c',
        Message::CopyInResponse(_) => b'G',
        Message::CopyOutResponse(_) => b'H',
        Message::DataRow(_) => b'D',
        Message::EmptyQueryResponse => b'I',
        Message::ErrorResponse(_) => b'E',
        Message::NoData => b'n',
        Message::NoticeResponse(_) => b'N',
        Message::NotificationResponse(_) => b'A',
        Message::ParameterDescription(_) => b't',
        Message::ParameterStatus(_) => b'S',
        Message::ParseComplete => b'1',
        Message::PortalSuspended => b's',
        Message::ReadyForQuery(_) => b'Z',
        Message::RowDescription(_) => b'T',
        _ => b'?',
    }
}

fn unexpected_message(msg: &Message, when: &str) -> PgError {
    unexpected(message_tag(msg), when)
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
/// ParameterStatus, NotificationResponse): `None` if `msg` was one.
fn skip_async_message(msg: Message, parameters: &mut HashMap<String, String>) -> Option<Message> {
    match msg {
        Message::NoticeResponse(body) => {
            let fields = error_fields(body.fields());
            debug!(
                severity = fields.get(&b'S').map(String::as_str).unwrap_or(""),
                message = fields.get(&b'M').map(String::as_str).unwrap_or(""),
                "server notice"
            );
            None
        }
        Message::ParameterStatus(body) => {
            if let (Ok(name), Ok(value)) = (body.name(), body.value()) {
                debug!(%name, %value, "server parameter");
                parameters.insert(name.to_string(), value.to_string());
            }
            None
        }
        Message::NotificationResponse(_) => None,
        other => Some(other),
    }
}

/// The fields of an ErrorResponse or NoticeResponse, by field type; a
/// malformed rest is ignored (the fields before it are kept).
fn error_fields(mut it: ErrorFields<'_>) -> HashMap<u8, String> {
    let mut fields = HashMap::new();
    while let Ok(Some(field)) = it.next() {
        fields.insert(field.type_(), String::from_utf8_lossy(field.value_bytes()).into_owned());
    }
    fields
}

fn parse_error_response(it: ErrorFields<'_>) -> PgError {
    let mut fields = error_fields(it);
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

fn parse_row_description(body: &backend::RowDescriptionBody) -> Result<Vec<String>, PgError> {
    body.fields().map(|f| Ok(f.name().to_string())).collect().map_err(protocol)
}

fn parse_data_row(body: &backend::DataRowBody) -> Result<Vec<Option<String>>, PgError> {
    let buf = body.buffer();
    body.ranges().map(|r| Ok(r.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()))).collect().map_err(protocol)
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

    fn u64(&mut self) -> Result<u64, PgError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// What arrives from the server: a message `postgres-protocol` decodes,
/// or one of the two it does not know.
enum Frame {
    Pg(Message),
    /// 'W': the walsender entered COPY BOTH mode.
    CopyBothResponse,
    /// 'v': the server speaks an older minor version of the protocol.
    NegotiateProtocolVersion,
}

impl Frame {
    /// The message's type byte, for errors.
    fn tag(&self) -> u8 {
        match self {
            Frame::CopyBothResponse => b'W',
            Frame::NegotiateProtocolVersion => b'v',
            Frame::Pg(msg) => message_tag(msg),
        }
    }
}

/// The socket with read and write buffers.
struct Conn {
    stream: Transport,
    /// Received bytes not consumed yet.
    rbuf: BytesMut,
    /// Bytes to send; `wbuf[wpos..]` is not sent yet.
    wbuf: BytesMut,
    wpos: usize,
}

impl Conn {
    fn new(stream: Transport) -> Conn {
        Conn { stream, rbuf: BytesMut::with_capacity(crate::limits::READ_CHUNK), wbuf: BytesMut::new(), wpos: 0 }
    }

    /// Size (type byte included) of the message at the head of the buffer, if
    /// its header has arrived; an error if its length is out of bounds.
    fn head_size(&self) -> Result<Option<usize>, PgError> {
        let [tag, a, b, c, d, ..] = *self.rbuf else { return Ok(None) };
        let len = i32::from_be_bytes([a, b, c, d]);
        match usize::try_from(len) {
            Ok(len) if (4..=crate::limits::MAX_MESSAGE_LEN).contains(&len) => Ok(Some(1 + len)),
            _ => Err(PgError::Protocol(format!("message type {} has invalid length {len}", describe_tag(tag)))),
        }
    }

    /// The next message, or `None` if the server closed the connection
    /// between messages.
    ///
    /// Cancel-safe: the only await is a read into the buffer, and a message
    /// leaves the buffer only once it is whole and returned.
    async fn next_message(&mut self) -> Result<Option<Frame>, PgError> {
        loop {
            let head = self.head_size()?;
            if let Some(size) = head.filter(|&size| size <= self.rbuf.len()) {
                let tag = self.rbuf[0];
                if tag == b'W' || tag == b'v' {
                    let _ = self.rbuf.split_to(size);
                    return Ok(Some(if tag == b'W' {
                        Frame::CopyBothResponse
                    } else {
                        Frame::NegotiateProtocolVersion
                    }));
                }
                let msg = Message::parse(&mut self.rbuf).map_err(protocol)?;
                // The whole message is buffered, so the parser consumed it.
                let msg = msg.ok_or_else(|| protocol_msg("a whole message did not parse"))?;
                if self.rbuf.is_empty() && self.rbuf.capacity() > crate::limits::SHRINK_ABOVE {
                    self.rbuf = BytesMut::with_capacity(crate::limits::READ_CHUNK);
                }
                return Ok(Some(Frame::Pg(msg)));
            }
            let missing = head.unwrap_or(5) - self.rbuf.len();
            self.rbuf.reserve(missing.max(crate::limits::READ_CHUNK));
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                if self.rbuf.is_empty() {
                    return Ok(None);
                }
                return Err(eof("in the middle of a message"));
            }
        }
    }

    /// Sends everything queued in `wbuf`. If cancelled, the rest stays queued.
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

    /// The message `tag` with `body`, as `postgres-protocol` decodes it.
    fn decode(tag: u8, body: &[u8]) -> io::Result<Option<Message>> {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[tag]);
        buf.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        buf.extend_from_slice(body);
        Message::parse(&mut buf)
    }

    fn error_of(body: &[u8]) -> Option<PgError> {
        match decode(b'E', body) {
            Ok(Some(Message::ErrorResponse(e))) => Some(parse_error_response(e.fields())),
            _ => None,
        }
    }

    #[test]
    fn error_response_fields() {
        let mut body = Vec::new();
        for (k, v) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', "28000"), (b'M', "role \"x\" does not exist")] {
            body.push(k);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        match error_of(&body) {
            Some(PgError::Server { severity, code, message }) => {
                assert_eq!((severity.as_str(), code.as_str()), ("FATAL", "28000"));
                assert_eq!(message, "role \"x\" does not exist");
            }
            other => panic!("unexpected {other:?}"),
        }
        // Truncated or garbage error bodies still give an error (or are
        // refused by the decoder), never a panic.
        for garbage in [&b""[..], b"S", b"SFATAL", b"\xff\xfe", b"C28000\0M"] {
            if let Some(e) = error_of(garbage) {
                assert!(matches!(e, PgError::Server { .. }));
            }
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
        let row = |body: &[u8]| match decode(b'D', body) {
            Ok(Some(Message::DataRow(r))) => parse_data_row(&r),
            Ok(_) => panic!("not a row"),
            Err(e) => Err(protocol(e)),
        };
        let description = |body: &[u8]| match decode(b'T', body) {
            Ok(Some(Message::RowDescription(r))) => parse_row_description(&r),
            Ok(_) => panic!("not a description"),
            Err(e) => Err(protocol(e)),
        };
        // Claims 32767 columns in a tiny message.
        assert!(description(&[0x7f, 0xff, b'a', 0]).is_err());
        assert!(row(&[0x7f, 0xff, 0, 0, 0, 1]).is_err());
        assert!(row(&[0, 1, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert_eq!(row(&[0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, b'7']).unwrap(), vec![None, Some("7".into())]);
    }

    #[test]
    fn copy_both_and_negotiation_are_framed_here() {
        // postgres-protocol does not know these two; the connection frames them itself.
        assert!(decode(b'W', &[0, 0, 0]).is_err());
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
