//! The proxy's side of a compute: connecting (over TLS with the cluster's
//! CA when the proxy has it), logging in with the ClientKey a client's
//! proof revealed, passing the greeting on with the proxy's own cancel
//! key, and passing cancel requests on.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use std::path::Path;

use strata_service::tls::{ClientTls, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::{timeout, timeout_at, Instant};

use crate::cancel::{CancelKey, CancelTarget, Cancels};
use crate::catalog::Target;
use crate::limits::{COMPUTE_RETRY, CONNECT_TIMEOUT, MAX_COMPUTE_GREETING};
use crate::refusal::{self as why, Refusal};
use crate::scram::{ClientExchange, ClientKey, Verifier, MECHANISM};
use crate::wire::{self, Auth};

/// SQLSTATE of "the database system is starting up" (and shutting down).
pub const CANNOT_CONNECT_NOW: &str = "57P03";

fn unreachable_compute(target: &Target, e: impl std::fmt::Display) -> Refusal {
    let message = format!("endpoint {}: its compute at {}: {e}", target.endpoint, target.address);
    Refusal::new(why::COMPUTE_UNREACHABLE, "08006", message)
}

/// Either end of a relayed session.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection to a compute: its Unix socket when it has one here (the
/// socket's directory is the compute's own, private), else `address`,
/// over TLS when `tls` is given (PostgreSQL's `SSLRequest` first; the
/// certificate must name the address).
/// Says whether it is the Unix socket.
async fn connect(
    address: SocketAddr,
    socket: Option<&Path>,
    tls: Option<&ClientTls>,
) -> io::Result<(Box<dyn Io>, bool)> {
    // A socket path beyond the kernel's limit (108 bytes) cannot be used.
    if let Some(path) = socket.filter(|p| p.as_os_str().len() < 108 && p.exists()) {
        if let Ok(Ok(unix)) = timeout(CONNECT_TIMEOUT, UnixStream::connect(path)).await {
            return Ok((Box::new(unix), true));
        }
    }
    Ok((tcp(address, tls).await?, false))
}

async fn tcp(address: SocketAddr, tls: Option<&ClientTls>) -> io::Result<Box<dyn Io>> {
    let mut tcp = timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no connection in time"))??;
    let _ = tcp.set_nodelay(true);
    crate::limits::watch_peer(&tcp);
    let Some(tls) = tls else { return Ok(Box::new(tcp)) };
    tcp.write_all(&wire::request(wire::SSL_REQUEST)).await?;
    // Exactly one byte: what follows is the TLS handshake.
    let answer = timeout(CONNECT_TIMEOUT, tcp.read_u8())
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to the TLS request in time"))??;
    if answer != b'S' {
        return Err(io::Error::other("it does not speak TLS"));
    }
    let tls = timeout(CONNECT_TIMEOUT, tls.connect(&address.ip().to_string(), tcp))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake in time"))??;
    Ok(Box::new(tls))
}

/// When a login to a compute gives up.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// No attempt runs past this.
    pub deadline: Instant,
    /// No attempt starts after this: a refused connection or "starting
    /// up" is retried until then.
    pub retry_until: Instant,
}

/// Connects and logs in to the compute of `target`, retrying while it
/// starts (refused connections, "starting up") as `patience` allows.
pub async fn login(
    target: &Target,
    params: &[(String, String)],
    key: &ClientKey,
    verifier: &Verifier,
    tls: Option<&ClientTls>,
    patience: Patience,
) -> Result<Box<dyn Io>, Refusal> {
    let Patience { deadline, retry_until } = patience;
    loop {
        let attempt = timeout_at(deadline, async {
            let (mut stream, unix) =
                connect(target.address, target.socket.as_deref(), tls).await.map_err(Attempt::Io)?;
            authenticate(&mut stream, unix, target, params, key, verifier).await?;
            Ok::<Box<dyn Io>, Attempt>(stream)
        })
        .await;
        let retry = match attempt {
            Err(_) => return Err(unreachable_compute(target, "no login in time")),
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(Attempt::Io(e))) if e.kind() == io::ErrorKind::ConnectionRefused => unreachable_compute(target, e),
            Ok(Err(Attempt::Io(e))) => return Err(unreachable_compute(target, e)),
            Ok(Err(Attempt::Refused(r))) if r.code == CANNOT_CONNECT_NOW => r,
            Ok(Err(Attempt::Refused(r))) => return Err(r),
        };
        if Instant::now() + COMPUTE_RETRY >= retry_until.min(deadline) {
            return Err(retry);
        }
        tokio::time::sleep(COMPUTE_RETRY).await;
    }
}

/// Why one login attempt failed.
enum Attempt {
    Io(io::Error),
    Refused(Refusal),
}

impl From<Refusal> for Attempt {
    fn from(r: Refusal) -> Attempt {
        Attempt::Refused(r)
    }
}

/// The compute's SCRAM exchange, answered with the client's key.
async fn authenticate(
    stream: &mut Box<dyn Io>,
    unix: bool,
    target: &Target,
    params: &[(String, String)],
    key: &ClientKey,
    verifier: &Verifier,
) -> Result<(), Attempt> {
    let auth_error =
        |message: String| Refusal::new(why::COMPUTE_AUTH, "28000", format!("endpoint {}: {message}", target.endpoint));
    stream.write_all(&wire::startup_message(params)).await.map_err(Attempt::Io)?;
    stream.flush().await.map_err(Attempt::Io)?;
    let mut exchange = None;
    loop {
        let (tag, body) = wire::read_message(stream).await.map_err(|e| match e {
            wire::WireError::Io(e) => Attempt::Io(e),
            e => Attempt::Refused(unreachable_compute(target, e)),
        })?;
        match tag {
            b'R' => {}
            b'E' => {
                let (code, message) = wire::parse_error(&body);
                return Err(Refusal { reason: why::COMPUTE_ERROR, code, message }.into());
            }
            // Notices and a protocol negotiation before authentication.
            b'N' | b'v' => continue,
            t => return Err(auth_error(format!("message {:?} during its authentication", char::from(t))).into()),
        }
        let auth = wire::parse_auth(&body).map_err(|e| Attempt::Refused(unreachable_compute(target, e)))?;
        let reply = match (auth, exchange.as_mut()) {
            (Auth::Ok, Some(_)) => return Ok(()),
            // Its own socket trusts whoever can reach it: only its owner
            // (and the proxy) can; over TCP a compute always asks.
            (Auth::Ok, None) if unix => return Ok(()),
            (Auth::Ok, None) => return Err(auth_error("its role logs in without a password".into()).into()),
            (Auth::Sasl(mechanisms), None) if mechanisms.contains(&MECHANISM) => {
                let (e, first) = ClientExchange::start(&crate::scram::nonce());
                exchange = Some(e);
                wire::sasl_initial_response(MECHANISM, first.as_bytes())
            }
            (Auth::SaslContinue(data), Some(e)) => {
                let last = e.server_first(data, key, verifier).map_err(|e| auth_error(e.to_string()))?;
                wire::sasl_response(last.as_bytes())
            }
            (Auth::SaslFinal(data), Some(e)) => {
                e.server_final(data, verifier).map_err(|e| auth_error(e.to_string()))?;
                continue;
            }
            (Auth::Other(code), _) => {
                let message = format!("it asks for authentication method {code}; the proxy answers {MECHANISM} only");
                return Err(auth_error(message).into());
            }
            (other, _) => return Err(auth_error(format!("an unexpected authentication step {other:?}")).into()),
        };
        stream.write_all(&reply).await.map_err(Attempt::Io)?;
        stream.flush().await.map_err(Attempt::Io)?;
    }
}

/// Passes the compute's greeting (parameters, notices, its key, the first
/// `ReadyForQuery`) on to the client in one write, its key replaced by one
/// of the proxy's; an error the compute sends instead is passed on.
pub async fn greet(
    compute: &mut Box<dyn Io>,
    client: &mut Stream,
    target: &Target,
    cancels: &Arc<Cancels>,
) -> Result<CancelKey, Refusal> {
    let mut out = Vec::new();
    let mut key = None;
    for _ in 0..MAX_COMPUTE_GREETING {
        let (tag, body) = wire::read_message(compute).await.map_err(|e| unreachable_compute(target, e))?;
        match tag {
            b'K' if body.len() >= 8 => {
                let pid = u32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
                let socket = target.socket.clone();
                let k =
                    cancels.register(CancelTarget { address: target.address, socket, pid, key: body[4..].to_vec() });
                out.extend_from_slice(&wire::backend_key_data(k.pid, &k.key));
                key = Some(k);
            }
            b'E' => {
                let (code, message) = wire::parse_error(&body);
                return Err(Refusal { reason: why::COMPUTE_ERROR, code, message });
            }
            b'Z' => {
                out.extend_from_slice(&wire::message(tag, &body));
                client.write_all(&out).await.map_err(|_| Refusal::closed())?;
                client.flush().await.map_err(|_| Refusal::closed())?;
                return key.ok_or_else(|| unreachable_compute(target, "it sent no cancel key"));
            }
            _ => out.extend_from_slice(&wire::message(tag, &body)),
        }
    }
    Err(unreachable_compute(target, format!("no ReadyForQuery within {MAX_COMPUTE_GREETING} messages")))
}

/// Passes a cancel request on to the compute with its own key.
pub async fn cancel(target: &CancelTarget, tls: Option<&ClientTls>) -> io::Result<()> {
    let (mut stream, _) = connect(target.address, target.socket.as_deref(), tls).await?;
    stream.write_all(&wire::cancel_request(target.pid, &target.key)).await?;
    stream.flush().await?;
    // PostgreSQL closes the connection once it has the request.
    let mut rest = [0u8; 16];
    let _ = timeout(CONNECT_TIMEOUT, stream.read(&mut rest)).await;
    Ok(())
}
