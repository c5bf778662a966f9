//! A route: its listener, the connections it relays to its target, and
//! what can be changed while it runs (delay, cut, reset).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{Delay, RouteConfig};
use crate::metrics::Metrics;
use crate::relay::{pump, Cut, Direction, Link};

/// The state of one route, shared by its connections and the HTTP API.
pub struct RouteState {
    pub name: String,
    pub listen: SocketAddr,
    pub target: String,
    link: Arc<Link>,
    /// Bumped by a reset: every connection open then is dropped.
    resets: watch::Sender<u64>,
    connections: AtomicUsize,
    accepted: AtomicU64,
    metrics: Arc<Metrics>,
}

/// A route in the status.
#[derive(Clone, Debug, Serialize)]
pub struct RouteStatus {
    pub name: String,
    pub listen: SocketAddr,
    pub target: String,
    pub delay_ms: f64,
    pub jitter_ms: f64,
    pub loss_pct: f64,
    /// Whether either direction is cut.
    pub cut: bool,
    pub cut_forward: bool,
    pub cut_back: bool,
    pub connections: usize,
    pub accepted: u64,
    pub delivered_bytes: u64,
}

impl RouteState {
    /// The state of the route `config`, listening on `listen` (bound already).
    pub fn new(config: &RouteConfig, listen: SocketAddr, metrics: Arc<Metrics>) -> Arc<RouteState> {
        Arc::new(RouteState {
            name: config.name.clone(),
            listen,
            target: config.target.clone(),
            link: Arc::new(Link::new(config.delay(), metrics.clone())),
            resets: watch::channel(0).0,
            connections: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            metrics,
        })
    }

    pub fn set_delay(&self, d: Delay) {
        info!(route = %self.name, delay_ms = d.delay_ms, jitter_ms = d.jitter_ms, loss_pct = d.loss_pct, "delay changed");
        self.link.set_delay(d);
    }

    /// Cuts the directions `cut` names, and heals the others.
    pub fn set_cut(&self, cut: Cut) {
        let what = match (cut.forward, cut.back) {
            (true, true) => "cut: nothing moves",
            (true, false) => "cut forward: nothing reaches the target",
            (false, true) => "cut back: nothing comes back from the target",
            (false, false) => "healed",
        };
        info!(route = %self.name, forward = cut.forward, back = cut.back, "{what}");
        self.link.set_cut(cut);
    }

    /// Drops every connection open now.
    pub fn reset(&self) {
        info!(route = %self.name, connections = self.connections.load(Ordering::SeqCst), "reset");
        self.resets.send_modify(|n| *n += 1);
    }

    pub fn status(&self) -> RouteStatus {
        let (d, cut) = (self.link.delay(), self.link.cut());
        RouteStatus {
            name: self.name.clone(),
            listen: self.listen,
            target: self.target.clone(),
            delay_ms: d.delay_ms,
            jitter_ms: d.jitter_ms,
            loss_pct: d.loss_pct,
            cut: cut.any(),
            cut_forward: cut.forward,
            cut_back: cut.back,
            connections: self.connections.load(Ordering::SeqCst),
            accepted: self.accepted.load(Ordering::SeqCst),
            delivered_bytes: self.link.delivered_bytes(),
        }
    }
}

/// What every connection of a route is bounded by.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub max_connections: usize,
    pub max_in_flight_bytes: usize,
    pub connect_timeout: Duration,
}

/// Accepts connections on `listener` for `route` until dropped.
pub async fn serve(listener: TcpListener, route: Arc<RouteState>, bounds: Bounds) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                warn!(route = %route.name, "accepting: {e}");
                tokio::time::sleep(crate::limits::ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        route.accepted.fetch_add(1, Ordering::SeqCst);
        if route.connections.fetch_add(1, Ordering::SeqCst) >= bounds.max_connections {
            route.connections.fetch_sub(1, Ordering::SeqCst);
            route.metrics.connections_refused.inc();
            warn!(route = %route.name, %peer, max = bounds.max_connections, "too many connections; closed");
            continue;
        }
        route.metrics.connections.inc();
        let route = route.clone();
        tokio::spawn(async move {
            relay(client, &route, bounds).await;
            route.connections.fetch_sub(1, Ordering::SeqCst);
            route.metrics.connections.dec();
        });
    }
}

/// One connection, from connecting to the target until both directions end,
/// either fails, or the route is reset.
async fn relay(client: TcpStream, route: &Arc<RouteState>, bounds: Bounds) {
    let mut resets = route.resets.subscribe();
    resets.mark_unchanged();
    let work = async {
        // A cut route connects nothing: the client waits, as behind a partition.
        route.link.wait_while_cut(None).await;
        let target = match tokio::time::timeout(bounds.connect_timeout, TcpStream::connect(&route.target)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(format!("connecting to {}: {e}", route.target)),
            Err(_) => {
                return Err(format!("connecting to {}: no answer within {:?}", route.target, bounds.connect_timeout))
            }
        };
        let _ = (client.set_nodelay(true), target.set_nodelay(true));
        let (cr, cw) = client.into_split();
        let (tr, tw) = target.into_split();
        let up = pump(cr, tw, route.link.clone(), Direction::Forward, bounds.max_in_flight_bytes);
        let down = pump(tr, cw, route.link.clone(), Direction::Back, bounds.max_in_flight_bytes);
        let (mut up, mut down) = (std::pin::pin!(up), std::pin::pin!(down));
        // A direction that ends cleanly (a half-close) leaves the other
        // running; one that fails ends the connection.
        let rest = tokio::select! {
            r = &mut up => r.map(|_| down.as_mut()).map_err(|e| e.to_string()),
            r = &mut down => r.map(|_| up.as_mut()).map_err(|e| e.to_string()),
        };
        rest?.await.map(|_| ()).map_err(|e| e.to_string())
    };
    tokio::select! {
        result = work => {
            if let Err(e) = result {
                if e.starts_with("connecting") {
                    route.metrics.connect_errors.inc();
                    warn!(route = %route.name, "{e}");
                }
            }
        }
        _ = resets.changed() => {
            route.metrics.resets.inc();
        }
    }
}
