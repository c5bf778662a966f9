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
//! - **Every connection gets its chance.** A connection is displaceable only
//!   once its handler has run (been polled) at least once, so a greeting or
//!   request that arrived with it is read before a flood can push it out,
//!   however quickly the flood's connections arrive and however busy the
//!   runtime is; until then the accept loop waits.
//! - **Descriptors are bounded too.** A displaced connection leaves the
//!   table at once, but its socket is closed by its task; the accept loop
//!   waits for those tasks before it starts more, so a listener never holds
//!   more than `max_connections` connection sockets, plus the one it is
//!   admitting and [`MAX_REFUSALS_IN_FLIGHT`] being refused
//!   ([`DESCRIPTORS_BEYOND_LIMIT`]).
//! - **Greetings have a deadline** (`handshake_timeout`), enforced by the
//!   protocol handler through [`Slot::handshake_deadline`].
//! - **The kernel's queue is deep** ([`LISTEN_BACKLOG`]): displacement can
//!   only help a client whose connection reaches `accept`. With a shallow
//!   backlog a flood fills the kernel's accept queue and the kernel drops the
//!   SYN of every client behind it, who then waits for a retransmission
//!   (1 s, then 3, 7, …) — or completes a SYN-cookie handshake the listener
//!   never sees. Queued connections cost the process no descriptor, and the
//!   accept loop drains the queue at full speed.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tracing::{debug, warn};

use crate::limits::{
    ERROR_LOG_INTERVAL, LISTEN_BACKLOG, MAX_ACCEPT_PAUSE, MAX_REFUSALS_IN_FLIGHT, MIN_ACCEPT_PAUSE, REFUSAL_WAIT,
};
use crate::metrics::{ListenerMetrics, OneListener};
use crate::tls::{ServerTls, Stream};

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

pub use crate::limits::DESCRIPTORS_BEYOND_LIMIT;

/// A bound TCP listener with a connection table.
pub struct Listener {
    name: &'static str,
    inner: TcpListener,
    table: Arc<Table>,
    handshake_timeout: Duration,
    refusal: Refusal,
    refusals: Arc<Semaphore>,
    /// One permit per connection task (held until its socket is closed).
    sockets: Arc<Semaphore>,
    metrics: OneListener,
    /// TLS for every connection, if this listener has it.
    tls: Option<ServerTls>,
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
    listen(addr).map_err(|source| BindError { key, addr, source })
}

/// Binds and listens on `addr` with `SO_REUSEADDR` (as tokio's `bind`) and a
/// backlog of [`LISTEN_BACKLOG`]. Must be called within a tokio runtime.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// An accepted connection and its place in the listener's table; dropping
/// the slot frees the place. Its stream is had through [`Connection::secure`]
/// (or, on a listener without TLS, [`Connection::into_plain`]), so no server
/// reads plaintext from a listener that has TLS.
pub struct Connection {
    stream: TcpStream,
    pub peer: SocketAddr,
    pub slot: Slot,
    tls: Option<ServerTls>,
}

impl Connection {
    /// The stream its protocol reads: after the TLS handshake when the
    /// listener has TLS, which must end by the handshake deadline.
    pub async fn secure(self) -> std::io::Result<(Stream, Slot)> {
        let _ = self.stream.set_nodelay(true);
        match &self.tls {
            None => Ok((Stream::Plain(self.stream), self.slot)),
            Some(tls) => match tokio::time::timeout_at(self.slot.handshake_deadline(), tls.accept(self.stream)).await {
                Ok(stream) => Ok((stream?.into(), self.slot)),
                Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no TLS handshake in time")),
            },
        }
    }

    /// The TCP stream of a listener without TLS.
    ///
    /// # Panics
    /// If the listener has TLS: its server must call [`Connection::secure`].
    pub fn into_plain(self) -> (TcpStream, Slot) {
        assert!(self.tls.is_none(), "a listener with TLS is served by a server that reads plaintext");
        (self.stream, self.slot)
    }
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
        let metrics = metrics.for_listener(name);
        Listener {
            name,
            inner,
            table: Arc::new(Table::new(limits.max_connections, metrics.open.clone())),
            handshake_timeout: limits.handshake_timeout,
            refusal,
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
            sockets: Arc::new(Semaphore::new(limits.max_connections)),
            metrics,
            tls: None,
        }
    }

    /// Serves every connection with TLS (when `tls` is some).
    pub fn with_tls(mut self, tls: Option<ServerTls>) -> Listener {
        self.tls = tls;
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Accepts connections forever, running `handler` on each in its own
    /// task. A connection displaced to admit another has its task dropped
    /// (closing its socket) — only ever before it proved itself, and only
    /// after its handler ran once.
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
            let mut waits = 0u32;
            let admission = loop {
                match self.table.admit(self.handshake_timeout) {
                    // Only connections whose handler has not run yet could
                    // make room: let them run (they may prove themselves).
                    Admission::NotYetPolled => {
                        waits += 1;
                        if waits <= 3 {
                            tokio::task::yield_now().await;
                        } else {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                    other => break other,
                }
            };
            match admission {
                Admission::Admitted { slot, evicted, displaced } => {
                    self.metrics.accepted.inc();
                    if displaced {
                        self.metrics.displaced.inc();
                    }
                    // Wait until the tasks of displaced connections have
                    // closed their sockets: the table has room, the process
                    // may not have the descriptors.
                    let socket = self.sockets.clone().acquire_owned().await.expect("the semaphore is never closed");
                    let id = slot.id;
                    let task = handler(Connection { stream, peer, slot, tls: self.tls.clone() });
                    let (name, table) = (self.name, self.table.clone());
                    tokio::spawn(async move {
                        let mut task = Box::pin(task);
                        let mut evicted = evicted;
                        // The first run: a greeting or request that came with
                        // the connection is read (and proves it) before the
                        // connection can be displaced.
                        let first = std::future::poll_fn(|cx| Poll::Ready(task.as_mut().poll(cx))).await;
                        table.polled(id);
                        if first.is_pending() {
                            tokio::select! {
                                () = &mut task => {}
                                Ok(()) = &mut evicted => {
                                    debug!(listener = name, %peer, "closed to admit a newer connection")
                                }
                            }
                        }
                        drop(task); // closes the socket ...
                        drop(socket); // ... before the accept loop may count on its descriptor
                    });
                }
                Admission::NotYetPolled => unreachable!("waited for above"),
                Admission::Full => {
                    self.metrics.refused.inc();
                    self.refuse(stream, peer);
                }
            }
        }
    }

    /// Answers a refused connection with the protocol's error, on a bounded
    /// number of short tasks; closes it outright when those are all busy.
    /// On a TLS listener the connection is closed at once: a plaintext
    /// answer means nothing to a client in a handshake, and a handshake for
    /// a connection that cannot be served is work a flood would choose.
    fn refuse(&self, mut stream: TcpStream, peer: SocketAddr) {
        if self.tls.is_some() {
            debug!(listener = self.name, %peer, "refused: too many connections (closed)");
            return;
        }
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
        self.table.remove(self.id);
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
    /// `connections_open`, set under the lock at every change.
    open: Gauge,
}

struct TableInner {
    next_id: u64,
    entries: HashMap<u64, Entry>,
}

struct Entry {
    established: bool,
    busy: u32,
    /// Its handler has run once (only then may it be displaced).
    polled: bool,
    /// Since when it has been waiting without a request in progress.
    idle_since: Instant,
    /// Fired to close the connection when it is displaced.
    evict: Option<oneshot::Sender<()>>,
}

enum Admission {
    Admitted {
        slot: Slot,
        evicted: oneshot::Receiver<()>,
        displaced: bool,
    },
    /// Full, and only connections whose handler has not run yet could be
    /// displaced: ask again once they ran.
    NotYetPolled,
    Full,
}

impl Table {
    fn new(limit: usize, open: Gauge) -> Table {
        Table { limit, inner: Mutex::new(TableInner { next_id: 0, entries: HashMap::new() }), open }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    fn remove(&self, id: u64) {
        let mut inner = self.inner.lock();
        if inner.entries.remove(&id).is_some() {
            self.open.set(inner.entries.len() as i64);
        }
    }

    /// The connection's handler has run once: it may be displaced from now on.
    fn polled(&self, id: u64) {
        if let Some(e) = self.inner.lock().entries.get_mut(&id) {
            e.polled = true;
        }
    }

    /// Admits a connection, displacing the one idle the longest among those
    /// not established, not busy and polled if the table is full.
    fn admit(self: &Arc<Self>, handshake_timeout: Duration) -> Admission {
        let mut inner = self.inner.lock();
        let mut displaced = false;
        if inner.entries.len() >= self.limit {
            // O(limit) scan: limits are hundreds, and this runs only when full.
            let unproven = inner.entries.iter().filter(|(_, e)| !e.established && e.busy == 0);
            let victim =
                unproven.clone().filter(|(_, e)| e.polled).min_by_key(|(_, e)| e.idle_since).map(|(id, _)| *id);
            let Some(victim) = victim else {
                return if unproven.count() > 0 { Admission::NotYetPolled } else { Admission::Full };
            };
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
        let entry = Entry { established: false, busy: 0, polled: false, idle_since: Instant::now(), evict: Some(tx) };
        inner.entries.insert(id, entry);
        self.open.set(inner.entries.len() as i64);
        let deadline = tokio::time::Instant::now() + handshake_timeout;
        Admission::Admitted { slot: Slot { id, table: self.clone(), deadline }, evicted: rx, displaced }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Admits a connection whose handler then runs at once (as the listener
    /// does); None if it is refused.
    fn admit(t: &Arc<Table>) -> Option<(Slot, oneshot::Receiver<()>)> {
        match t.admit(Duration::from_secs(1)) {
            Admission::Admitted { slot, evicted, .. } => {
                t.polled(slot.id);
                Some((slot, evicted))
            }
            Admission::NotYetPolled => panic!("every handler ran"),
            Admission::Full => None,
        }
    }

    fn table(limit: usize) -> Arc<Table> {
        Arc::new(Table::new(limit, Gauge::default()))
    }

    #[test]
    fn displaces_the_longest_idle_unproven_connection() {
        let t = table(3);
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
        for e in t.inner.lock().entries.values_mut() {
            e.established = true;
        }
        assert!(admit(&t).is_none());
        drop(a);
        assert!(admit(&t).is_some(), "a place freed by a closed connection");
    }

    #[test]
    fn busy_connections_become_idle_again() {
        let t = table(1);
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
    fn connections_are_displaced_only_once_their_handler_ran() {
        let open = Gauge::default();
        let t = Arc::new(Table::new(2, open.clone()));
        let Admission::Admitted { slot: a, evicted: mut a_rx, .. } = t.admit(Duration::from_secs(1)) else {
            panic!("room")
        };
        let Admission::Admitted { slot: b, .. } = t.admit(Duration::from_secs(1)) else { panic!("room") };
        assert_eq!(open.get(), 2);
        assert!(matches!(t.admit(Duration::from_secs(1)), Admission::NotYetPolled), "neither ran yet");
        t.polled(b.id);
        b.established();
        assert!(matches!(t.admit(Duration::from_secs(1)), Admission::NotYetPolled), "a has not run yet");
        t.polled(a.id);
        let Admission::Admitted { slot: c, .. } = t.admit(Duration::from_secs(1)) else { panic!("a displaceable") };
        assert_eq!(a_rx.try_recv(), Ok(()), "a displaced");
        assert_eq!(open.get(), 2);
        c.established();
        assert!(matches!(t.admit(Duration::from_secs(1)), Admission::Full), "all established");
        drop(a); // its task ends: nothing changes, it had left the table
        assert_eq!(open.get(), 2);
        drop(c);
        assert_eq!(open.get(), 1, "the gauge follows the table");
    }

    /// Connections whose handler reads a 5-byte greeting ("hello", then
    /// established and answered "hi") and then holds the connection open
    /// until the client closes it; counts the handlers alive (which own the
    /// sockets) and the most ever alive at once.
    fn greeting_server(limit: usize) -> (Listener, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let limits = Limits { max_connections: limit, handshake_timeout: Duration::from_secs(30) };
        let l = Listener::new("test", listener, limits, |_| b"full".to_vec(), &ListenerMetrics::default());
        (l, Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)))
    }

    struct Alive(Arc<AtomicUsize>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn serve_greetings(l: Listener, alive: Arc<AtomicUsize>, most: Arc<AtomicUsize>) {
        tokio::spawn(l.serve(move |conn: Connection| {
            // The handler's future owns the socket from here until it is dropped.
            let now = alive.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let guard = Alive(alive.clone());
            async move {
                let _guard = guard;
                let Connection { mut stream, slot, .. } = conn;
                let mut hello = [0u8; 5];
                if tokio::time::timeout_at(slot.handshake_deadline(), stream.read_exact(&mut hello)).await.is_err() {
                    return;
                }
                slot.established();
                let _ = stream.write_all(b"hi").await;
                let mut rest = [0u8; 1];
                let _ = stream.read(&mut rest).await;
            }
        }));
    }

    /// Opens `n` idle connections (they wait in the kernel's queue).
    fn idle_connections(addr: SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
        (0..n).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect()
    }

    /// A client that greets at once gets in even when it arrives in the
    /// middle of a burst of idle connections many times the limit, which the
    /// accept loop could otherwise take (and displace it with) before its
    /// handler ever ran; and the sockets of displaced connections are
    /// closed before more are accepted.
    #[tokio::test(flavor = "current_thread")]
    async fn a_prompt_greeting_survives_a_burst_and_sockets_stay_bounded() {
        crate::config::raise_open_file_limit();
        const LIMIT: usize = 4;
        let (l, alive, most) = greeting_server(LIMIT);
        let addr = l.local_addr().unwrap();
        // Everything is queued before the listener accepts anything.
        let (before, greeter, after) = tokio::task::spawn_blocking(move || {
            let before = idle_connections(addr, 200);
            let mut greeter = std::net::TcpStream::connect(addr).unwrap();
            std::io::Write::write_all(&mut greeter, b"hello").unwrap();
            let after = idle_connections(addr, 200);
            (before, greeter, after)
        })
        .await
        .unwrap();
        serve_greetings(l, alive.clone(), most.clone());
        let answer = tokio::task::spawn_blocking(move || {
            let mut greeter = greeter;
            greeter.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut answer = [0u8; 2];
            std::io::Read::read_exact(&mut greeter, &mut answer).map(|()| (answer, greeter))
        })
        .await
        .unwrap();
        let (answer, greeter) = answer.expect("the greeter was displaced before its greeting was read");
        assert_eq!(&answer, b"hi");
        // Let the accept loop take the rest of the burst.
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(most.load(Ordering::SeqCst) <= LIMIT, "sockets held at once: {most:?}");
        drop((before, after, greeter));
    }

    /// A burst of connections beyond the 128 that tokio's own `bind` would
    /// queue all complete their handshake while nothing accepts: none has
    /// its SYN dropped (which would stall its connect for a second or more).
    #[tokio::test]
    async fn bound_listeners_queue_a_burst_of_connections() {
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        // The kernel queues backlog + 1 connections; leave room for that.
        let burst = 600.min(somaxconn).min(LISTEN_BACKLOG as usize);
        assert!(burst > 129, "net.core.somaxconn = {somaxconn} is too small for this test");
        let listener = bind("listen", "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::task::spawn_blocking(move || {
            let mut held = Vec::new();
            for i in 0..burst {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => held.push(s),
                    Err(e) => panic!("connection {i} of {burst}, none accepted: {e}"),
                }
            }
            held.len()
        })
        .await
        .unwrap();
        assert_eq!(held, burst);
        // And the listener still accepts them all.
        for _ in 0..burst {
            tokio::time::timeout(Duration::from_secs(5), listener.accept()).await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn bind_names_the_key() {
        let taken = bind("listen", "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = taken.local_addr().unwrap();
        let e = bind("listen_http", addr).await.err().unwrap();
        assert_eq!(e.key, "listen_http");
        assert!(e.to_string().starts_with(&format!("listen_http = {addr}: ")), "{e}");
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
