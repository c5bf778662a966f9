//! One client connection, from its first byte to its last: TLS, the
//! startup packet, the endpoint, SCRAM, the tenant's limit, the wake, the
//! compute's login, then the relay (`docs/proxy.md`, "What it does").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use strata_service::listener::{Connection, Slot};
use strata_service::tls::Stream;
use tokio::io::AsyncWriteExt;
use tokio::time::{timeout, Instant};

use crate::catalog::{State, Target};
use crate::compute;
use crate::limits::{MAX_STARTUP_ROUNDS, MAX_WAKES_PER_SESSION, SUSPENDING_POLL};
use crate::refusal::{self as why, Refusal};
use crate::route::{route, Route, RouteError};
use crate::scram::{ClientKey, ScramError, ServerExchange, Verifier, MECHANISM};
use crate::state::Proxy;
use crate::wire::{self, Startup, WireError};

/// The role every endpoint's clients log in as; its verifier is the one
/// the proxy holds. Other roles connect to the compute directly.
pub const APP_ROLE: &str = "app";

/// A connection's startup, done: its stream, TLS server name and packet.
struct Opened {
    stream: Stream,
    sni: Option<String>,
    minor: u16,
    params: Vec<(String, String)>,
}

/// Serves one client connection.
pub async fn serve(conn: Connection, proxy: Arc<Proxy>) {
    let peer = conn.peer;
    let (tcp, slot) = conn.into_plain();
    let _ = tcp.set_nodelay(true);
    crate::limits::watch_peer(&tcp);
    let opened = match timeout(proxy.config.startup_timeout, open(Stream::Plain(tcp), &proxy)).await {
        Ok(Ok(Some(o))) => o,
        Ok(Ok(None)) => return,
        Ok(Err((stream, r))) => return refuse(&proxy, stream, peer, None, r).await,
        Err(_) => {
            return refuse(&proxy, None, peer, None, Refusal::new(why::TIMEOUT, "08006", "no startup in time")).await
        }
    };
    let Opened { mut stream, sni, minor, params } = opened;
    let route = match route(sni.as_deref(), &proxy.config.domain, params) {
        Ok(r) => r,
        Err(e) => {
            let reason = if matches!(e, RouteError::NoEndpoint(_)) { why::NO_ENDPOINT } else { why::MALFORMED };
            let r = Refusal::new(reason, "08004", e.to_string());
            return refuse(&proxy, Some(stream), peer, None, r).await;
        }
    };
    let endpoint = route.endpoint.clone();
    if let Err(r) = session(&mut stream, route, minor, &slot, &proxy).await {
        refuse(&proxy, Some(stream), peer, Some(&endpoint), r).await;
    }
}

/// Answers a refusal: counted, logged, and told to the client (if its
/// stream is still there to tell).
async fn refuse(proxy: &Proxy, stream: Option<Stream>, peer: SocketAddr, endpoint: Option<&str>, r: Refusal) {
    if r.is_closed() {
        tracing::debug!(%peer, endpoint, "the client went away");
        return;
    }
    proxy.refused(r.reason);
    tracing::info!(%peer, endpoint, reason = r.reason, "refused: {}", r.message);
    if let Some(mut stream) = stream {
        let _ = timeout(Duration::from_secs(1), async {
            stream.write_all(&wire::error(&r.code, &r.message)).await?;
            stream.flush().await
        })
        .await;
    }
}

fn wire_refusal(e: WireError) -> Refusal {
    match e {
        WireError::Io(_) => Refusal::closed(),
        e => Refusal::new(why::MALFORMED, "08P01", e.to_string()),
    }
}

/// TLS and the startup packet; `None` when the connection carried a
/// cancel request (served here) instead of a session. A refusal comes with
/// the stream to answer on, unless a failed handshake took it.
async fn open(mut stream: Stream, proxy: &Proxy) -> Result<Option<Opened>, (Option<Stream>, Refusal)> {
    let mut sni = None;
    for _ in 0..MAX_STARTUP_ROUNDS {
        let startup = match wire::read_startup(&mut stream).await {
            Ok(s) => s,
            Err(e) => return Err((Some(stream), wire_refusal(e))),
        };
        let answer: &[u8] = match startup {
            Startup::Ssl => match (&proxy.server_tls, stream) {
                (Some(tls), Stream::Plain(mut tcp)) => {
                    if tcp.write_all(b"S").await.is_err() {
                        return Err((None, Refusal::closed()));
                    }
                    let tls = tls
                        .accept(tcp)
                        .await
                        .map_err(|e| (None, Refusal::new(why::MALFORMED, "08P01", format!("TLS handshake: {e}"))))?;
                    sni = tls.get_ref().1.server_name().map(str::to_string);
                    stream = tls.into();
                    continue;
                }
                (_, s) => {
                    stream = s;
                    b"N"
                }
            },
            Startup::GssEnc => b"N",
            Startup::Cancel { pid, key } => {
                cancel(proxy, pid, &key).await;
                return Ok(None);
            }
            Startup::Session { minor, params } => {
                if proxy.config.require_tls && !stream.is_tls() {
                    let r = Refusal::new(why::NO_TLS, "28000", "this proxy requires TLS (sslmode=require or stronger)");
                    return Err((Some(stream), r));
                }
                return Ok(Some(Opened { stream, sni, minor, params }));
            }
        };
        if stream.write_all(answer).await.is_err() {
            return Err((None, Refusal::closed()));
        }
    }
    let r = Refusal::new(why::MALFORMED, "08P01", format!("no session after {MAX_STARTUP_ROUNDS} startup packets"));
    Err((Some(stream), r))
}

/// A cancel request: passed on to the compute of the session whose key it
/// names, if one is open. The client gets no answer either way, as with
/// PostgreSQL.
async fn cancel(proxy: &Proxy, pid: u32, key: &[u8]) {
    let Some(target) = proxy.cancels.find(pid, key) else {
        proxy.refused(why::UNKNOWN_CANCEL_KEY);
        return;
    };
    match compute::cancel(&target, proxy.compute_tls.as_ref()).await {
        Ok(()) => {
            proxy.metrics.cancels.inc();
        }
        Err(e) => tracing::warn!(compute = %target.address, "passing a cancel request on: {e}"),
    }
}

/// From the startup packet on: authenticates, wakes, logs in, relays.
async fn session(
    stream: &mut Stream,
    route: Route,
    minor: u16,
    slot: &Slot,
    proxy: &Arc<Proxy>,
) -> Result<(), Refusal> {
    if route.user != APP_ROLE {
        let message = format!("the proxy logs in role {APP_ROLE} only, not {:?}", route.user);
        return Err(Refusal::new(why::ROLE, "28000", message));
    }
    let target = proxy.lookup(&route.endpoint).await?;
    let verifier = match &target {
        Some(t) => Verifier::parse(&t.verifier)
            .map_err(|e| Refusal::new(why::CATALOG, "XX000", format!("endpoint {}: its verifier: {e}", t.endpoint)))?,
        None => Verifier::decoy(&[&proxy.decoy_secret[..], route.endpoint.as_bytes()].concat()),
    };
    if minor > 0 {
        // The proxy speaks 3.0 (and takes no `_pq_.` options).
        stream.write_all(&wire::negotiate_protocol(&[])).await.map_err(|_| Refusal::closed())?;
    }
    let auth = timeout(proxy.config.auth_timeout, authenticate(stream, &verifier)).await;
    let (key, server_final) = match auth {
        Err(_) => return Err(Refusal::new(why::TIMEOUT, "08006", "no authentication in time")),
        Ok(Err(r)) if r.reason == why::WRONG_PASSWORD && target.is_none() => {
            return Err(Refusal { reason: why::UNKNOWN_ENDPOINT, ..r })
        }
        Ok(r) => r?,
    };
    let target = target.ok_or_else(|| Refusal::new(why::UNKNOWN_ENDPOINT, "28P01", failed_login()))?;
    let Some(_admitted) = proxy.admission.admit(&target.tenant) else {
        let message = format!(
            "too many connections for tenant {} (max_connections_per_tenant = {})",
            target.tenant, proxy.config.max_connections_per_tenant
        );
        return Err(Refusal::new(why::TENANT_LIMIT, "53300", message));
    };
    slot.established();
    let mut reply = wire::auth_sasl_final(server_final.as_bytes());
    reply.extend_from_slice(&wire::auth_ok());
    stream.write_all(&reply).await.map_err(|_| Refusal::closed())?;
    stream.flush().await.map_err(|_| Refusal::closed())?;
    let (mut compute, cancel_key) = reach(stream, target, &route, &key, &verifier, proxy).await?;
    proxy.metrics.sessions.inc();
    proxy.metrics.sessions_started.inc();
    let relayed = tokio::io::copy_bidirectional(stream, &mut compute).await;
    proxy.metrics.sessions.dec();
    if let Ok((up, down)) = relayed {
        proxy.metrics.relayed_bytes.inc_by(up + down);
    }
    drop(cancel_key);
    Ok(())
}

/// What a wrong password reads (PostgreSQL's words).
fn failed_login() -> String {
    format!("password authentication failed for user \"{APP_ROLE}\"")
}

/// The client's SCRAM exchange: its ClientKey and the server-final message.
async fn authenticate(stream: &mut Stream, verifier: &Verifier) -> Result<(ClientKey, String), Refusal> {
    stream.write_all(&wire::auth_sasl(MECHANISM)).await.map_err(|_| Refusal::closed())?;
    stream.flush().await.map_err(|_| Refusal::closed())?;
    let body = sasl_message(stream).await?;
    let (mechanism, first) = wire::parse_sasl_initial(&body).map_err(wire_refusal)?;
    if mechanism != MECHANISM {
        let message = format!("SASL mechanism {mechanism:?} is not offered ({MECHANISM} is)");
        return Err(Refusal::new(why::MALFORMED, "28000", message));
    }
    let scram = |e: ScramError| match e {
        ScramError::WrongProof => Refusal::new(why::WRONG_PASSWORD, "28P01", failed_login()),
        e => Refusal::new(why::MALFORMED, "08P01", format!("SCRAM: {e}")),
    };
    let (exchange, server_first) = ServerExchange::start(verifier, first, &crate::scram::nonce()).map_err(scram)?;
    stream.write_all(&wire::auth_sasl_continue(server_first.as_bytes())).await.map_err(|_| Refusal::closed())?;
    stream.flush().await.map_err(|_| Refusal::closed())?;
    let last = sasl_message(stream).await?;
    exchange.finish(&last).map_err(scram)
}

/// The next message of a SCRAM exchange (`p`).
async fn sasl_message(stream: &mut Stream) -> Result<Vec<u8>, Refusal> {
    let (tag, body) = wire::read_message(stream).await.map_err(wire_refusal)?;
    match tag {
        b'p' if body.len() <= crate::limits::MAX_SCRAM_MESSAGE => Ok(body),
        b'p' => Err(Refusal::new(why::MALFORMED, "08P01", "a SCRAM message too long")),
        // Terminate: psql asks for a password after it sees the request.
        b'X' => Err(Refusal::closed()),
        t => Err(Refusal::new(why::MALFORMED, "08P01", format!("message {:?} during authentication", char::from(t)))),
    }
}

/// The compute, running and logged in: wakes it if it sleeps, connects
/// (retrying while it starts), logs in and passes its greeting on.
///
/// A compute found running may be suspending just as the client comes:
/// PostgreSQL stops (its connections reset or are refused) before its
/// agent exits and the catalog says suspended. So a running compute that
/// cannot be reached is looked up again every [`SUSPENDING_POLL`] for up
/// to `compute_timeout`, and woken once it is suspended.
async fn reach(
    client: &mut Stream,
    mut target: Target,
    route: &Route,
    key: &ClientKey,
    verifier: &Verifier,
    proxy: &Arc<Proxy>,
) -> Result<(Box<dyn compute::Io>, crate::cancel::CancelKey), Refusal> {
    let mut wakes = 0;
    let mut woken = false;
    let mut unreachable_until = None;
    loop {
        match target.state {
            State::Running => {}
            State::Stopped => {
                let message = format!("endpoint {} is stopped (`strata endpoint start {0}`)", target.endpoint);
                return Err(Refusal::new(why::STOPPED, "57P03", message));
            }
            State::Suspended if wakes < MAX_WAKES_PER_SESSION => {
                wakes += 1;
                woken = true;
                let wake =
                    proxy.wakes.wake(&proxy.backend, &proxy.metrics, &target.endpoint, proxy.config.wake_timeout);
                if let Err(e) = wake.await {
                    // Another start may have won the race: look again.
                    target = proxy.lookup(&target.endpoint).await?.ok_or_else(|| gone(&target.endpoint))?;
                    if target.state != State::Running {
                        return Err(Refusal::new(why::WAKE_FAILED, "57P03", e));
                    }
                }
                target.state = State::Running;
            }
            State::Suspended => {
                let message = format!("endpoint {} went back to sleep {wakes} times while waking", target.endpoint);
                return Err(Refusal::new(why::WAKE_FAILED, "57P03", message));
            }
        }
        // A compute just woken may still be starting: its login is retried
        // for the whole timeout. One found running is asked briefly, then
        // looked up again.
        let now = Instant::now();
        let deadline = now + proxy.config.compute_timeout;
        let retry_until = if woken { deadline } else { now + SUSPENDING_POLL };
        let patience = compute::Patience { deadline, retry_until };
        match compute::login(&target, &route.params, key, verifier, proxy.compute_tls.as_ref(), patience).await {
            Ok(mut compute) => {
                let key = compute::greet(&mut compute, client, &target, &proxy.cancels).await?;
                return Ok((compute, key));
            }
            Err(r) if may_be_suspending(&r) && wakes < MAX_WAKES_PER_SESSION => {
                let until = *unreachable_until.get_or_insert_with(|| Instant::now() + proxy.config.compute_timeout);
                target = proxy.lookup(&target.endpoint).await?.ok_or_else(|| gone(&target.endpoint))?;
                match target.state {
                    State::Suspended => woken = false,
                    State::Running if Instant::now() < until => tokio::time::sleep(SUSPENDING_POLL).await,
                    _ => return Err(r),
                }
            }
            Err(r) => return Err(r),
        }
    }
}

/// Whether a failed login may be a compute shutting down to suspend:
/// unreachable, or "the database system is shutting down".
fn may_be_suspending(r: &Refusal) -> bool {
    r.reason == why::COMPUTE_UNREACHABLE || (r.reason == why::COMPUTE_ERROR && r.code == compute::CANNOT_CONNECT_NOW)
}

fn gone(endpoint: &str) -> Refusal {
    Refusal::new(why::WAKE_FAILED, "57P03", format!("endpoint {endpoint} was removed"))
}
