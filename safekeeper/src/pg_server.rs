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

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tracing::{info, warn};

use strata_protocol::{TenantId, TimelineId};
use strata_service::auth::{Access, Verifier};
use strata_service::tls::{ServerTls, Stream};
use strata_service::Listener;

use strata_formats::wal::strip::ConsistencyStripper;
use strata_formats::{Lsn, PgVersion};

use crate::shared::Shared;
use crate::timeline::Timeline;
use crate::wal_reader::WalReader;

/// Largest message accepted from a client.
const MAX_MESSAGE: usize = 1 << 20;
const KEEPALIVE: Duration = Duration::from_secs(10);
/// Longest a client may take to send a message it started, or to take what we send.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a replication connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}: nothing for {IO_TIMEOUT:?}")]
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

/// Writes `bytes`, waiting at most `IO_TIMEOUT` for the client to take them.
async fn send<W: AsyncWriteExt + Unpin>(w: &mut W, bytes: &[u8]) -> Result<(), ReplicationError> {
    tokio::time::timeout(IO_TIMEOUT, w.write_all(bytes)).await.map_err(|_| ReplicationError::Timeout("sending"))??;
    Ok(())
}

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(body.len() + 5);
    m.push(tag);
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn error_response(code: &str, text: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for (field, value) in [(b'S', "ERROR"), (b'V', "ERROR"), (b'C', code), (b'M', text)] {
        b.push(field);
        b.extend_from_slice(value.as_bytes());
        b.push(0);
    }
    b.push(0);
    message(b'E', &b)
}

fn ready() -> Vec<u8> {
    message(b'Z', b"I")
}

/// One-row result with text columns.
fn row_result(columns: &[(&str, u32)], values: &[Option<String>], tag: &str) -> Vec<u8> {
    let mut desc = (columns.len() as i16).to_be_bytes().to_vec();
    for (name, type_oid) in columns {
        desc.extend_from_slice(name.as_bytes());
        desc.push(0);
        desc.extend_from_slice(&0i32.to_be_bytes());
        desc.extend_from_slice(&0i16.to_be_bytes());
        desc.extend_from_slice(&type_oid.to_be_bytes());
        desc.extend_from_slice(&(-1i16).to_be_bytes());
        desc.extend_from_slice(&(-1i32).to_be_bytes());
        desc.extend_from_slice(&0i16.to_be_bytes());
    }
    let mut row = (values.len() as i16).to_be_bytes().to_vec();
    for v in values {
        match v {
            Some(s) => {
                row.extend_from_slice(&(s.len() as i32).to_be_bytes());
                row.extend_from_slice(s.as_bytes());
            }
            None => row.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    let mut out = message(b'T', &desc);
    out.extend(message(b'D', &row));
    let mut t = tag.as_bytes().to_vec();
    t.push(0);
    out.extend(message(b'C', &t));
    out
}

async fn read_exact_bounded(s: &mut Stream, n: usize) -> Result<Vec<u8>, ReplicationError> {
    if n > MAX_MESSAGE {
        return Err(ReplicationError::Protocol(format!("message of {n} bytes is too large")));
    }
    let mut b = vec![0u8; n];
    tokio::time::timeout(IO_TIMEOUT, s.read_exact(&mut b))
        .await
        .map_err(|_| ReplicationError::Timeout("reading"))??;
    Ok(b)
}

/// Reads a typed message: (type, body).
async fn read_message(s: &mut Stream) -> Result<(u8, Vec<u8>), ReplicationError> {
    let head = read_exact_bounded(s, 5).await?;
    let len = i32::from_be_bytes(head[1..5].try_into().expect("4 bytes"));
    if len < 4 {
        return Err(ReplicationError::Protocol(format!("invalid message length {len}")));
    }
    Ok((head[0], read_exact_bounded(s, len as usize - 4).await?))
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
    let (s, params) = tokio::time::timeout_at(slot.handshake_deadline(), async {
        let (mut s, params) = startup(Stream::Plain(tcp), tls).await?;
        if let Some(verifier) = &shared.verifier {
            let tenant = timeline_ids(&params).map(|(t, _)| t);
            authenticate(&mut s, &shared, verifier, tenant).await?;
        }
        Ok::<_, ReplicationError>((s, params))
    })
    .await
    .map_err(|_| ReplicationError::Handshake(limit))??;
    slot.established();
    session(s, shared, params).await
}

/// The timeline named by `-c strata.timeline=<tenant>/<timeline>` (or the
/// database name), as given.
fn timeline_name(params: &std::collections::HashMap<String, String>) -> String {
    let options = params.get("options").cloned().unwrap_or_default();
    options
        .split_whitespace()
        .find_map(|o| o.strip_prefix("strata.timeline="))
        .map(str::to_string)
        .unwrap_or_else(|| params.get("database").cloned().unwrap_or_default())
}

/// The ids of [`timeline_name`], if it is a pair of ids.
fn timeline_ids(params: &std::collections::HashMap<String, String>) -> Option<(TenantId, TimelineId)> {
    let name = timeline_name(params);
    let (t, l) = name.split_once('/')?;
    Some((t.parse().ok()?, l.parse().ok()?))
}

/// SSLRequest and GSSENCRequest: the codes of their 8-byte packets.
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;

/// The startup packet's parameters, on the stream they came over: TLS
/// when the client asked for it and `tls` is given (then required);
/// GSS encryption is declined.
async fn startup(
    mut s: Stream,
    tls: Option<&ServerTls>,
) -> Result<(Stream, std::collections::HashMap<String, String>), ReplicationError> {
    loop {
        let len = i32::from_be_bytes(read_exact_bounded(&mut s, 4).await?.try_into().expect("4 bytes"));
        if !(8..=10_000).contains(&len) {
            return Err(ReplicationError::Protocol(format!("invalid startup length {len}")));
        }
        let body = read_exact_bounded(&mut s, len as usize - 4).await?;
        let code = i32::from_be_bytes(body[0..4].try_into().expect("4 bytes"));
        match code {
            SSL_REQUEST => match (s, tls) {
                (Stream::Plain(mut tcp), Some(tls)) => {
                    send(&mut tcp, b"S").await?;
                    s = tls.accept(tcp).await?.into();
                }
                (other, _) => {
                    // No TLS here, or a second request inside TLS.
                    s = other;
                    send(&mut s, b"N").await?;
                }
            },
            GSSENC_REQUEST => send(&mut s, b"N").await?,
            196_608 if tls.is_some() && matches!(s, Stream::Plain(_)) => {
                let msg = "this service requires TLS: connect with sslmode=require or stricter";
                let _ = send(&mut s, &error_response("28000", msg)).await;
                return Err(ReplicationError::Refused(msg.into()));
            }
            196_608 => {
                let mut params = std::collections::HashMap::new();
                let mut parts = body[4..].split(|b| *b == 0);
                while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
                    if k.is_empty() {
                        break;
                    }
                    params.insert(String::from_utf8_lossy(k).into_owned(), String::from_utf8_lossy(v).into_owned());
                }
                return Ok((s, params));
            }
            other => {
                let _ = send(&mut s, &error_response("08P01", &format!("unsupported protocol {other}"))).await;
                return Err(ReplicationError::Refused(format!("unsupported protocol code {other}")));
            }
        }
    }
}

/// Asks for a password and checks it as a token that allows `tenant` (a
/// service or management token when the startup named no valid timeline,
/// so that others learn nothing of what is held here).
async fn authenticate(
    s: &mut Stream,
    shared: &Shared,
    verifier: &Verifier,
    tenant: Option<TenantId>,
) -> Result<(), ReplicationError> {
    // AuthenticationCleartextPassword: the link is TLS, or loopback (a
    // listener beyond loopback needs TLS, `config.rs`).
    send(s, &message(b'R', &3i32.to_be_bytes())).await?;
    let (tag, body) = read_message(s).await?;
    if tag != b'p' {
        let msg = format!("expected a password message, got {:?}", tag as char);
        let _ = send(s, &error_response("08P01", &msg)).await;
        return Err(ReplicationError::Protocol(msg));
    }
    let password = std::str::from_utf8(body.strip_suffix(&[0]).unwrap_or(&body)).unwrap_or("");
    let need = tenant.map_or(Access::Service, Access::Tenant);
    match verifier.check(password, need) {
        Ok(()) => Ok(()),
        Err(refusal) => {
            shared.metrics.refusal_metrics().count("pg", &refusal);
            // 28P01 invalid_password; 28000 invalid_authorization_specification.
            let code = if refusal.unauthenticated() { "28P01" } else { "28000" };
            let _ = send(s, &error_response(code, &refusal.to_string())).await;
            Err(ReplicationError::Refused(refusal.to_string()))
        }
    }
}

async fn session(
    mut s: Stream,
    shared: Arc<Shared>,
    params: std::collections::HashMap<String, String>,
) -> Result<(), ReplicationError> {
    let database = timeline_name(&params);
    let timeline = timeline_ids(&params).and_then(|(t, l)| shared.timelines.get(t, l));
    let Some(timeline) = timeline else {
        let msg = format!("choose a timeline held here with options '-c strata.timeline=<tenant_id>/<timeline_id>' (got {database:?})");
        let _ = send(&mut s, &error_response("3D000", &msg)).await;
        return Err(ReplicationError::Refused(msg));
    };
    let strip = params.get("options").is_some_and(|o| o.contains("strata.strip_consistency=on"))
        || shared.config.strip_consistency_for_replication;
    let mut out = message(b'R', &0i32.to_be_bytes());
    for (k, v) in [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ] {
        let mut b = k.as_bytes().to_vec();
        b.push(0);
        b.extend_from_slice(v.as_bytes());
        b.push(0);
        out.extend(message(b'S', &b));
    }
    let mut key = 1i32.to_be_bytes().to_vec();
    key.extend_from_slice(&2i32.to_be_bytes());
    out.extend(message(b'K', &key));
    out.extend(ready());
    send(&mut s, &out).await?;

    loop {
        let (tag, body) = read_message(&mut s).await?;
        match tag {
            b'X' => return Ok(()),
            b'Q' => {
                let query = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body))
                    .trim()
                    .trim_end_matches(';')
                    .to_string();
                let upper = query.to_ascii_uppercase();
                let positions = timeline.positions();
                let reply = if upper == "IDENTIFY_SYSTEM" {
                    let mut r = row_result(
                        &[("systemid", 25), ("timeline", 23), ("xlogpos", 25), ("dbname", 25)],
                        &[
                            Some(timeline.identity.system_id.to_string()),
                            Some("1".into()),
                            Some(positions.commit_lsn.to_string()),
                            None,
                        ],
                        "IDENTIFY_SYSTEM",
                    );
                    r.extend(ready());
                    r
                } else if upper == "SHOW WAL_SEGMENT_SIZE" {
                    let mut r = row_result(
                        &[("wal_segment_size", 25)],
                        &[Some(format!("{}MB", timeline.identity.wal_segment_size >> 20))],
                        "SHOW",
                    );
                    r.extend(ready());
                    r
                } else if upper == "SHOW DATA_DIRECTORY_MODE" {
                    let mut r = row_result(&[("data_directory_mode", 25)], &[Some("0700".into())], "SHOW");
                    r.extend(ready());
                    r
                } else if upper.starts_with("START_REPLICATION") {
                    return stream(s, &shared, &timeline, &query, strip).await;
                } else {
                    let mut r = error_response("0A000", &format!("not supported by a Strata safekeeper: {query}"));
                    r.extend(ready());
                    r
                };
                send(&mut s, &reply).await?;
            }
            other => {
                let _ =
                    send(&mut s, &error_response("08P01", &format!("unexpected message type {}", other as char))).await;
                return Err(ReplicationError::Protocol(format!("unexpected message {other}")));
            }
        }
    }
}

/// The client ended the copy (CopyDone): end ours and the command.
async fn end_copy(w: &mut WriteHalf<Stream>) -> Result<(), ReplicationError> {
    let mut end = message(b'c', &[]);
    end.extend(message(b'C', b"START_STREAMING\0"));
    end.extend(ready());
    send(w, &end).await
}

/// `START_REPLICATION [SLOT name] [PHYSICAL] X/X [TIMELINE n]`.
async fn stream(
    mut s: Stream,
    shared: &Shared,
    timeline: &Arc<Timeline>,
    query: &str,
    strip: bool,
) -> Result<(), ReplicationError> {
    let start: Option<Lsn> = query.split_whitespace().find_map(|w| w.parse().ok());
    let positions = timeline.positions();
    let Some(start) = start.filter(|l| *l >= timeline.start_lsn && *l <= positions.commit_lsn) else {
        let msg =
            format!("start position must lie in the committed WAL, {} to {}", timeline.start_lsn, positions.commit_lsn);
        let mut r = error_response("58P01", &msg);
        r.extend(ready());
        let _ = send(&mut s, &r).await;
        return Err(ReplicationError::Refused(msg));
    };
    info!(timeline = %timeline.identity.timeline_id, %start, strip, "replication client streaming");
    let mut body = vec![0u8];
    body.extend_from_slice(&0i16.to_be_bytes());
    send(&mut s, &message(b'W', &body)).await?;
    let segment_size = u64::from(timeline.identity.wal_segment_size);
    let mut stripper = strip.then(|| ConsistencyStripper::new(PgVersion::V15, start, segment_size));
    let (mut r, mut w) = tokio::io::split(s);
    // Client messages: status updates are dropped; CopyDone ends the stream.
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        loop {
            let mut head = [0u8; 5];
            if r.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = i32::from_be_bytes(head[1..5].try_into().expect("4 bytes"));
            if !(4..=MAX_MESSAGE as i32).contains(&len) {
                return;
            }
            let mut body = vec![0u8; len as usize - 4];
            if r.read_exact(&mut body).await.is_err() {
                return;
            }
            if head[0] == b'c' || head[0] == b'X' {
                let _ = done_tx.send(());
                return;
            }
        }
    });
    let mut watch = timeline.subscribe();
    let mut sent = start;
    let mut out_lsn = start;
    let mut buf = vec![0u8; shared.config.max_send_bytes];
    // Only committed WAL is sent: the segment being read stays open.
    let mut wal = WalReader::new(&timeline.dir, segment_size, true);
    let result: Result<(), ReplicationError> = async {
        loop {
            match done_rx.try_recv() {
                Ok(()) => return end_copy(&mut w).await,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => return Ok(()),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
            }
            let commit = watch.borrow_and_update().commit_lsn;
            if sent < commit {
                let n = ((commit.0 - sent.0) as usize).min(buf.len());
                tokio::task::block_in_place(|| wal.read(sent, &mut buf[..n]))
                    .map_err(|e| ReplicationError::Wal(e.to_string()))?;
                sent = Lsn(sent.0 + n as u64);
                let data = match stripper.as_mut() {
                    Some(st) => st.push(&buf[..n]).map_err(|e| ReplicationError::Wal(e.to_string()))?,
                    None => buf[..n].to_vec(),
                };
                if !data.is_empty() {
                    let mut m = vec![b'w'];
                    m.extend_from_slice(&out_lsn.0.to_be_bytes());
                    m.extend_from_slice(&commit.0.to_be_bytes());
                    m.extend_from_slice(&strata_formats::time::pg_now().to_be_bytes());
                    m.extend_from_slice(&data);
                    out_lsn = Lsn(out_lsn.0 + data.len() as u64);
                    send(&mut w, &message(b'd', &m)).await?;
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
                _ = tokio::time::sleep(KEEPALIVE) => {
                    let mut m = vec![b'k'];
                    m.extend_from_slice(&out_lsn.0.to_be_bytes());
                    m.extend_from_slice(&strata_formats::time::pg_now().to_be_bytes());
                    m.push(0);
                    send(&mut w, &message(b'd', &m)).await?;
                }
            }
        }
    }
    .await;
    reader.abort();
    result
}
