//! The SQL editor: one statement batch on an endpoint, in a session of its
//! own that ends with it (so the console never keeps a compute awake).
//! It logs in as a client does: role `app` (the database's owner, never
//! the superuser) with the endpoint's password, through the proxy over TLS
//! (which wakes a suspended endpoint), or straight to the compute in a
//! cluster without a proxy. A statement timeout bounds it, and the rows
//! kept of each result are bounded (the rest are counted).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use strata_control_plane::endpoint;
use strata_control_plane::layout::{Kind, Workdir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::SimpleQueryMessage;

use crate::limits::{SQL_CONNECT_TIMEOUT, SQL_DEFAULT_TIMEOUT, SQL_MAX_ROWS, SQL_MAX_TIMEOUT, SQL_MAX_VALUE};

/// The most bytes of values one answer carries (past it, rows are counted only).
const MAX_ANSWER_BYTES: usize = 8 << 20;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlRequest {
    pub endpoint: String,
    pub sql: String,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// One statement's result.
#[derive(Debug, Default, serde::Serialize)]
pub struct ResultSet {
    pub command: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
    pub row_count: u64,
    /// Rows past the bound were counted, not kept.
    pub truncated: bool,
}

#[derive(Debug, serde::Serialize)]
pub struct SqlAnswer {
    pub results: Vec<ResultSet>,
    pub elapsed_ms: u64,
}

/// Why a run failed: PostgreSQL's error (with its SQLSTATE and position)
/// or the console's.
#[derive(Debug, serde::Serialize)]
pub struct SqlError {
    pub error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
}

impl SqlError {
    fn plain(text: impl Into<String>) -> SqlError {
        SqlError { error: text.into(), sqlstate: None, position: None }
    }

    fn of(e: tokio_postgres::Error) -> SqlError {
        match e.as_db_error() {
            Some(db) => SqlError {
                error: format!("{}: {}", db.severity(), db.message()),
                sqlstate: Some(db.code().code().to_string()),
                position: match db.position() {
                    Some(tokio_postgres::error::ErrorPosition::Original(p)) => Some(*p),
                    _ => None,
                },
            },
            None => SqlError::plain(e.to_string()),
        }
    }
}

/// The statement timeout of a request: the default when none, at most the bound.
pub fn timeout_of(secs: Option<u64>) -> Duration {
    secs.map_or(SQL_DEFAULT_TIMEOUT, |s| Duration::from_secs(s.max(1))).min(SQL_MAX_TIMEOUT)
}

/// Where and how to log in to an endpoint.
pub struct Target {
    address: SocketAddr,
    /// The name its certificate is checked against (none: no TLS).
    tls: Option<(strata_service::tls::ClientTls, String)>,
    /// The proxy routes by it (`options=endpoint=NAME`).
    through_proxy: bool,
    password: String,
}

/// Finds how to reach endpoint `name` (blocking: reads the workdir, may ask a node).
pub fn target(root: &Path, name: &str) -> Result<Target, String> {
    let wd = Workdir::open(root).map_err(|e| e.to_string())?;
    let password = endpoint::password_of(&wd, name)
        .map_err(|e| e.to_string())?
        .password
        .ok_or_else(|| format!("endpoint {name} has no password yet (it has never started)"))?;
    let tls = strata_control_plane::certs::client(&wd.root).map_err(|e| e.to_string())?;
    let proxy = wd.cluster.of_kind(Kind::Proxy).next().and_then(|p| p.addr("pg"));
    match (proxy, tls) {
        (Some(addr), Some(tls)) => {
            let address: SocketAddr = addr.parse().map_err(|e| format!("the proxy's address {addr}: {e}"))?;
            Ok(Target { address, tls: Some((tls, address.ip().to_string())), through_proxy: true, password })
        }
        (_, tls) => {
            let rec = endpoint::inventory(&wd)
                .map_err(|e| e.to_string())?
                .into_iter()
                .find(|r| r.file.name == name)
                .ok_or_else(|| format!("no endpoint named {name:?}"))?;
            if rec.state != "running" {
                return Err(format!("endpoint {name} is {}: start it first", rec.state));
            }
            let host = wd.cluster.host(&rec.file.host).ok_or_else(|| format!("no host {}", rec.file.host))?;
            let address = SocketAddr::new(host.address, rec.file.pg_port);
            Ok(Target { address, tls: tls.map(|t| (t, host.address.to_string())), through_proxy: false, password })
        }
    }
}

/// PostgreSQL's SSLRequest: TLS follows when the server answers `S`.
async fn start_tls(
    mut tcp: tokio::net::TcpStream,
    tls: &strata_service::tls::ClientTls,
    name: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await.map_err(|e| e.to_string())?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(|e| e.to_string())?;
    if answer[0] != b'S' {
        return Err("the server does not speak TLS".into());
    }
    tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))
}

/// Runs `sql` on endpoint `name` as `app`.
pub async fn run(target: Target, name: &str, sql: &str, timeout: Duration) -> Result<SqlAnswer, SqlError> {
    let started = Instant::now();
    let mut config = tokio_postgres::Config::new();
    config.user("app").password(target.password.as_bytes()).dbname("postgres").application_name("strata_console");
    if target.through_proxy {
        config.options(format!("endpoint={name}"));
    }
    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    let connect = async {
        let tcp =
            tokio::net::TcpStream::connect(target.address).await.map_err(|e| format!("{}: {e}", target.address))?;
        match &target.tls {
            Some((tls, server)) => {
                let stream = start_tls(tcp, tls, server).await?;
                let (client, conn) =
                    config.connect_raw(stream, tokio_postgres::NoTls).await.map_err(|e| SqlError::of(e).error)?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok::<_, String>(client)
            }
            None => {
                let (client, conn) =
                    config.connect_raw(tcp, tokio_postgres::NoTls).await.map_err(|e| SqlError::of(e).error)?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(client)
            }
        }
    };
    let client = tokio::time::timeout(SQL_CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| SqlError::plain(format!("no session on endpoint {name} within {SQL_CONNECT_TIMEOUT:?}")))?
        .map_err(|e| SqlError::plain(format!("endpoint {name}: {e}")))?;
    client.batch_execute(&format!("SET statement_timeout = {}", timeout.as_millis())).await.map_err(SqlError::of)?;
    // The server cancels at its timeout; this one is for a server that does not answer.
    let results = tokio::time::timeout(timeout + Duration::from_secs(5), collect(&client, sql))
        .await
        .map_err(|_| SqlError::plain(format!("no answer within {timeout:?}")))??;
    Ok(SqlAnswer { results, elapsed_ms: started.elapsed().as_millis() as u64 })
}

async fn collect(client: &tokio_postgres::Client, sql: &str) -> Result<Vec<ResultSet>, SqlError> {
    use futures_core::Stream;
    let stream = client.simple_query_raw(sql).await.map_err(SqlError::of)?;
    let mut stream = std::pin::pin!(stream);
    let mut results = Vec::new();
    let mut current = ResultSet::default();
    let mut bytes = 0usize;
    while let Some(message) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        match message.map_err(SqlError::of)? {
            SimpleQueryMessage::RowDescription(columns) => {
                current.columns = columns.iter().map(|c| c.name().to_string()).collect();
            }
            SimpleQueryMessage::Row(row) => {
                current.row_count += 1;
                if current.rows.len() >= SQL_MAX_ROWS || bytes >= MAX_ANSWER_BYTES {
                    current.truncated = true;
                    continue;
                }
                let values: Vec<Option<String>> = (0..row.len())
                    .map(|i| {
                        row.get(i).map(|v| {
                            let mut v = v.to_string();
                            if v.len() > SQL_MAX_VALUE {
                                let mut cut = SQL_MAX_VALUE;
                                while !v.is_char_boundary(cut) {
                                    cut -= 1;
                                }
                                v.truncate(cut);
                                v.push('…');
                            }
                            v
                        })
                    })
                    .collect();
                bytes += values.iter().map(|v| v.as_ref().map_or(4, |s| s.len())).sum::<usize>();
                current.rows.push(values);
            }
            SimpleQueryMessage::CommandComplete(n) => {
                let mut done = std::mem::take(&mut current);
                done.command = match done.columns.is_empty() {
                    true => format!("{n} rows affected"),
                    false => format!("{n} rows"),
                };
                results.push(done);
            }
            _ => {}
        }
    }
    Ok(results)
}
