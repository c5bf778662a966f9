//! Listeners that survive their clients.
//!
//! Every port of every service accepts through a [`Listener`]:
//!
//! - **Accept errors never end it.** A per-connection error (the client gave
//!   up) is skipped; running out of descriptors or memory (EMFILE, ENFILE,
//!   ENOBUFS, ENOMEM) or anything else is logged at most once a second and
//!   retried after a pause that grows to a second, so the loop never spins.
//! - **Connections are bounded.** At most `max_connections` are open at
//!   once. A new connection beyond that displaces the connection that has
//!   waited longest *without proving itself* — one that has not completed
//!   its protocol's greeting, or an HTTP connection with no request in
//!   progress — and if every connection is established or busy it is
//!   refused with the protocol's own error (too many connections) and
//!   closed. Idle floods therefore cost nothing but churn: they displace
//!   each other, while a client that greets promptly gets in and stays.
//! - **Greetings have a deadline** (`handshake_timeout`), enforced by the
//!   protocol handler through [`Slot::handshake_deadline`].

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tracing::{debug, warn};

use crate::metrics::{ListenerMetrics, OneListener};

/// Limits of one listener (a section of each service's config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest a new connection may take to complete its greeting.
    pub handshake_timeout: Duration,
}

/// How a full listener answers a connection it refuses: given the first
/// bytes the client sent (possibly none), the bytes to send back before
/// closing — its protocol's "too many connections" error.
pub type Refusal = fn(first_bytes: &[u8]) -> Vec<u8>;

/// Refusals answered at once, each on its own short-lived task; beyond this
/// a refused connection is closed without an answer.
const MAX_REFUSALS_IN_FLIGHT: usize = 16;
/// How long a refused client gets to send its first bytes, and to take the answer.
const REFUSAL_WAIT: Duration = Duration::from_millis(300);
/// Pauses after accept errors that are not about one connection.
const MIN_ACCEPT_PAUSE: Duration = Duration::from_millis(10);
const MAX_ACCEPT_PAUSE: Duration = Duration::from_secs(1);
/// Accept errors are logged at most this often (each is counted in metrics).
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// A bound TCP listener with a connection table.
pub struct Listener {
    name: &'static str,
    inner: TcpListener,
    table: Arc<Table>,
    handshake_timeout: Duration,
    refusal: Refusal,
    refusals: Arc<Semaphore>,
    metrics: OneListener,
}

/// Why a listener could not be bound: names the config key and address.
#[derive(Debug, thiserror::Error)]
#[error("{key} = {addr}: {source}")]
pub struct BindError {
    pub key: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` (the value of config key `key`), naming both in the error.
pub async fn bind(key: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|source| BindError { key, addr, source })
}

/// An accepted connection and its place in the listener's table; dropping
/// the slot frees the place.
pub struct Connection {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub slot: Slot,
}

impl Listener {
    /// Wraps a bound listener. `name` labels its metrics and logs.
    pub fn new(
        name: &'static str,
        inner: TcpListener,
        limits: Limits,
        refusal: Refusal,
        metrics: &ListenerMetrics,
    ) -> Listener {
        assert!(limits.max_connections > 0, "a listener admits at least one connection (checked with the config)");
        Listener {
            name,
            inner,
            table: Arc::new(Table::new(limits.max_connections)),
            handshake_timeout: limits.handshake_timeout,
            refusal,
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
            metrics: metrics.for_listener(name),
        }
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Accepts connections forever, running `handler` on each in its own
    /// task. A connection displaced to admit another has its task dropped
    /// (closing its socket) — only ever before it proved itself.
    pub async fn serve<H, F>(self, handler: H)
    where
        H: Fn(Connection) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let mut pause = MIN_ACCEPT_PAUSE;
        let mut last_logged: Option<Instant> = None;
        let mut unlogged = 0u64;
        loop {
            let (stream, peer) = match self.inner.accept().await {
                Ok(accepted) => {
                    pause = MIN_ACCEPT_PAUSE;
                    accepted
                }
                Err(e) => {
                    self.metrics.accept_errors.inc();
                    if is_about_one_connection(&e) {
                        debug!(listener = self.name, "accept: {e}");
                        continue;
                    }
                    if last_logged.is_none_or(|t| t.elapsed() >= ERROR_LOG_INTERVAL) {
                        warn!(
                            listener = self.name,
                            suppressed = unlogged,
                            "accept failed: {e}; retrying in {pause:?} (the listener keeps running)"
                        );
                        last_logged = Some(Instant::now());
                        unlogged = 0;
                    } else {
                        unlogged += 1;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_ACCEPT_PAUSE);
                    continue;
                }
            };
            match self.table.admit(self.handshake_timeout) {
                Admission::Admitted { slot, evicted, displaced } => {
                    self.metrics.accepted.inc();
                    if displaced {
                        self.metrics.displaced.inc();
                    }
                    self.metrics.open.set(self.table.len() as i64);
                    let task = handler(Connection { stream, peer, slot });
                    let (name, open, table) = (self.name, self.metrics.open.clone(), self.table.clone());
                    tokio::spawn(async move {
                        tokio::select! {
                            () = task => {}
                            Ok(()) = evicted => debug!(listener = name, %peer, "closed to admit a newer connection"),
                        }
                        open.set(table.len() as i64);
                    });
                }
                Admission::Full => {
                    self.metrics.refused.inc();
                    self.refuse(stream, peer);
                }
            }
        }
    }

    /// Answers a refused connection with the protocol's error, on a bounded
    /// number of short tasks; closes it outright when those are all busy.
    fn refuse(&self, mut stream: TcpStream, peer: SocketAddr) {
        let Ok(permit) = self.refusals.clone().try_acquire_owned() else {
            debug!(listener = self.name, %peer, "refused without an answer: too many refusals in flight");
            return;
        };
        let (refusal, name, limit) = (self.refusal, self.name, self.table.limit);
        tokio::spawn(async move {
            let _permit = permit;
            // Read what the client sent first: the answer may depend on it,
            // and closing with unread bytes would reset the connection
            // before the client reads the answer.
            let mut first = [0u8; 512];
            let n = match tokio::time::timeout(REFUSAL_WAIT, stream.read(&mut first)).await {
                Ok(Ok(n)) => n,
                _ => 0,
            };
            let answer = refusal(&first[..n]);
            let sent = tokio::time::timeout(REFUSAL_WAIT, async {
                stream.write_all(&answer).await?;
                stream.shutdown().await
            })
            .await;
            debug!(listener = name, %peer, limit, answered = matches!(sent, Ok(Ok(()))), "refused: too many connections");
        });
    }
}

/// Errors of `accept` that concern only the connection being accepted.
fn is_about_one_connection(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::ECONNRESET | libc::EPROTO | libc::EPERM | libc::ETIMEDOUT | libc::EHOSTUNREACH)
    ) || matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset)
}

/// A connection's place in its listener's table.
pub struct Slot {
    id: u64,
    table: Arc<Table>,
    deadline: tokio::time::Instant,
}

impl Slot {
    /// The connection completed its greeting: it is never displaced again.
    pub fn established(&self) {
        if let Some(e) = self.table.inner.lock().entries.get_mut(&self.id) {
            e.established = true;
        }
    }

    /// When the greeting must be complete (`handshake_timeout` after accept).
    pub fn handshake_deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// Marks a request in progress until the guard is dropped (HTTP): a busy
    /// connection is not displaced.
    pub fn busy(&self) -> BusyGuard {
        if let Some(e) = self.table.inner.lock().entries.get_mut(&self.id) {
            e.busy += 1;
        }
        BusyGuard { id: self.id, table: self.table.clone() }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.inner.lock().entries.remove(&self.id);
    }
}

/// A request in progress on a connection; see [`Slot::busy`].
pub struct BusyGuard {
    id: u64,
    table: Arc<Table>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        if let Some(e) = self.table.inner.lock().entries.get_mut(&self.id) {
            debug_assert!(e.busy > 0);
            e.busy = e.busy.saturating_sub(1);
            if e.busy == 0 {
                e.idle_since = Instant::now();
            }
        }
    }
}

/// The open connections of one listener.
struct Table {
    limit: usize,
    inner: Mutex<TableInner>,
}

struct TableInner {
    next_id: u64,
    entries: HashMap<u64, Entry>,
}

struct Entry {
    established: bool,
    busy: u32,
    /// Since when it has been waiting without a request in progress.
    idle_since: Instant,
    /// Fired to close the connection when it is displaced.
    evict: Option<oneshot::Sender<()>>,
}

enum Admission {
    Admitted { slot: Slot, evicted: oneshot::Receiver<()>, displaced: bool },
    Full,
}

impl Table {
    fn new(limit: usize) -> Table {
        Table { limit, inner: Mutex::new(TableInner { next_id: 0, entries: HashMap::new() }) }
    }

    fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// Admits a connection, displacing the one idle the longest among those
    /// not established and not busy if the table is full.
    fn admit(self: &Arc<Self>, handshake_timeout: Duration) -> Admission {
        let mut inner = self.inner.lock();
        let mut displaced = false;
        if inner.entries.len() >= self.limit {
            // O(limit) scan: limits are hundreds, and this runs only when full.
            let victim = inner
                .entries
                .iter()
                .filter(|(_, e)| !e.established && e.busy == 0)
                .min_by_key(|(_, e)| e.idle_since)
                .map(|(id, _)| *id);
            let Some(victim) = victim else { return Admission::Full };
            if let Some(mut e) = inner.entries.remove(&victim) {
                if let Some(tx) = e.evict.take() {
                    let _ = tx.send(());
                }
            }
            displaced = true;
        }
        debug_assert!(inner.entries.len() < self.limit);
        inner.next_id += 1;
        let id = inner.next_id;
        let (tx, rx) = oneshot::channel();
        inner.entries.insert(id, Entry { established: false, busy: 0, idle_since: Instant::now(), evict: Some(tx) });
        let deadline = tokio::time::Instant::now() + handshake_timeout;
        Admission::Admitted { slot: Slot { id, table: self.clone(), deadline }, evicted: rx, displaced }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(t: &Arc<Table>) -> Option<(Slot, oneshot::Receiver<()>)> {
        match t.admit(Duration::from_secs(1)) {
            Admission::Admitted { slot, evicted, .. } => Some((slot, evicted)),
            Admission::Full => None,
        }
    }

    #[test]
    fn displaces_the_longest_idle_unproven_connection() {
        let t = Arc::new(Table::new(3));
        let (a, mut a_rx) = admit(&t).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let (b, mut b_rx) = admit(&t).unwrap();
        let (c, mut c_rx) = admit(&t).unwrap();
        a.established();
        let _busy_c = c.busy();
        // Full: b is the only one neither established nor busy.
        let (d, _d_rx) = admit(&t).unwrap();
        assert_eq!(b_rx.try_recv(), Ok(()), "b displaced");
        assert!(a_rx.try_recv().is_err() && c_rx.try_recv().is_err());
        assert_eq!(t.len(), 3);
        drop(b); // its task ends later; the place was already given to d
        assert_eq!(t.len(), 3);
        // Now a (established), c (busy) and d (idle): d goes next.
        let (_e, _) = admit(&t).unwrap();
        d.established();
        assert_eq!(t.len(), 3);
        // Everything established or busy: refused.
        let (e2, _) = (t.inner.lock().entries.keys().copied().collect::<Vec<_>>(), ());
        assert_eq!(e2.len(), 3);
        for e in t.inner.lock().entries.values_mut() {
            e.established = true;
        }
        assert!(admit(&t).is_none());
        drop(a);
        assert!(admit(&t).is_some(), "a place freed by a closed connection");
    }

    #[test]
    fn busy_connections_become_idle_again() {
        let t = Arc::new(Table::new(1));
        let (s, _rx) = admit(&t).unwrap();
        let g1 = s.busy();
        let g2 = s.busy();
        assert!(admit(&t).is_none(), "busy: not displaced");
        drop(g1);
        assert!(admit(&t).is_none(), "still one request in progress");
        drop(g2);
        assert!(admit(&t).is_some(), "idle: displaced");
    }

    #[test]
    fn accept_errors_are_classified() {
        for errno in [libc::ECONNABORTED, libc::ECONNRESET, libc::EPROTO] {
            assert!(is_about_one_connection(&std::io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(!is_about_one_connection(&std::io::Error::from_raw_os_error(errno)));
        }
    }
}
