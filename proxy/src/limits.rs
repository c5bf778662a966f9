//! Every bound of the proxy: what grows with load or time and where it
//! stops.

use std::time::Duration;

// ---- SCRAM

/// Longest SCRAM message taken: PostgreSQL's own are well under 1 KiB.
pub const MAX_SCRAM_MESSAGE: usize = 4096;
/// Iterations of a verifier made here (PostgreSQL's default).
pub const SCRAM_ITERATIONS: u32 = 4096;
/// Most iterations a verifier may ask: each login costs the proxy that
/// many HMACs, far above PostgreSQL's default a CPU-second.
pub const MAX_SCRAM_ITERATIONS: u32 = 100_000;

// ---- The wire

/// Longest startup packet (PostgreSQL's own bound is 10000 bytes).
pub const MAX_STARTUP_PACKET: usize = 10_000;
/// Most parameters of one startup packet.
pub const MAX_STARTUP_PARAMS: usize = 64;
/// Longest message read before the session is relayed (authentication,
/// parameter status, errors); relayed bytes are never parsed.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Startup packets taken on one connection (TLS, then GSS refused, then
/// the session): a client cannot keep a connection in the startup loop.
pub const MAX_STARTUP_ROUNDS: usize = 3;
/// Messages of a compute between its authentication and its first
/// `ReadyForQuery` (parameter status, notices, the key).
pub const MAX_COMPUTE_GREETING: usize = 256;

// ---- Connections and waits (defaults of `proxy.toml`)

/// Client connections at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
pub const MAX_CONNECTIONS: usize = 100_000;
/// Sessions of one tenant at once.
pub const DEFAULT_MAX_CONNECTIONS_PER_TENANT: usize = 100;
/// From a connection to its startup packet (and TLS).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The client's SCRAM exchange.
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(30);
/// A wake: the control plane starting a sleeping compute.
pub const DEFAULT_WAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connecting and logging in to a compute (retried while it starts).
pub const DEFAULT_COMPUTE_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two connection attempts to a compute that is starting.
pub const COMPUTE_RETRY: Duration = Duration::from_millis(25);
/// One TCP connect (a cancel request, an attempt of a login).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer of a relayed session (a client, a compute) that vanished
/// without closing (its host cut off, powered off) is found by TCP: an
/// idle session is probed after `KEEPALIVE_IDLE`, every
/// `KEEPALIVE_INTERVAL`, `KEEPALIVE_PROBES` times; bytes sent and not
/// acknowledged for `USER_TIMEOUT` end it too. Without them the other side
/// waited on the proxy for good (the kernel's retransmissions take ~15
/// minutes, and an idle connection is never probed).
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_PROBES: u32 = 3;
pub const USER_TIMEOUT: Duration = Duration::from_secs(30);
/// Catalog lookups running at once (each reads the workdir or asks a
/// host's node on a blocking thread).
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 32;
/// How long a login to a compute found running is tried before the
/// catalog is asked again whether it is suspending.
pub const SUSPENDING_POLL: Duration = Duration::from_millis(250);
/// Wakes of one endpoint per client: a compute that suspends again just
/// as a client arrives is woken once more, not forever.
pub const MAX_WAKES_PER_SESSION: usize = 2;

/// Sets the keepalives and the user timeout above on a session's socket.
/// A socket that refuses them (not TCP) is used as it is.
pub fn watch_peer(tcp: &tokio::net::TcpStream) {
    let sock = socket2::SockRef::from(tcp);
    let probes = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = sock.set_tcp_keepalive(&probes).and_then(|()| sock.set_tcp_user_timeout(Some(USER_TIMEOUT))) {
        tracing::debug!("keepalives not set on a session's socket: {e}");
    }
}

// ---- The HTTP API

pub const HTTP_MAX_CONNECTIONS: usize = 64;
pub const HTTP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const _: () = assert!(SCRAM_ITERATIONS <= MAX_SCRAM_ITERATIONS);
const _: () = assert!(MAX_SCRAM_MESSAGE >= 256);
const _: () = assert!(MAX_SCRAM_MESSAGE <= MAX_MESSAGE);
const _: () = assert!(DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS);
const _: () = assert!(DEFAULT_MAX_CONNECTIONS_PER_TENANT <= DEFAULT_MAX_CONNECTIONS);
const _: () = assert!(COMPUTE_RETRY.as_millis() < DEFAULT_COMPUTE_TIMEOUT.as_millis());
const _: () = assert!(MAX_STARTUP_ROUNDS >= 2);
const _: () = assert!(KEEPALIVE_IDLE.as_secs() + KEEPALIVE_INTERVAL.as_secs() * KEEPALIVE_PROBES as u64 <= 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sessions_socket_probes_its_peer_and_gives_up_on_unacknowledged_bytes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        for tcp in [&client, &accepted] {
            let sock = socket2::SockRef::from(tcp);
            assert!(!sock.keepalive().unwrap(), "off until the proxy sets it");
            watch_peer(tcp);
            assert!(sock.keepalive().unwrap());
            assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
            assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
            assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
            assert_eq!(sock.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
        }
    }
}
