//! One direction of a relayed connection: what is read is held for the
//! route's delay, then written on, in order, with at most
//! `max_in_flight_bytes` held at once. While a direction of the route is
//! cut nothing moves that way (a partition is silence, not an error); a
//! route cut one way only is a one-way partition: what is sent the other
//! way still arrives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::config::Delay;
use crate::limits::{RELAY_CHUNK, RELAY_QUEUE};
use crate::metrics::Metrics;

/// A direction of a relayed connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client that connected to the route's target.
    Forward,
    /// From the target back to the client.
    Back,
}

/// Which directions of a route are cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    pub forward: bool,
    pub back: bool,
}

impl Cut {
    /// Both ways.
    pub const BOTH: Cut = Cut { forward: true, back: true };

    fn blocks(&self, d: Direction) -> bool {
        match d {
            Direction::Forward => self.forward,
            Direction::Back => self.back,
        }
    }

    /// Whether anything is cut.
    pub fn any(&self) -> bool {
        self.forward || self.back
    }
}

/// What every connection of a route shares: the delay, which directions of
/// the link are cut, and what crossed it.
pub struct Link {
    delay: Mutex<Delay>,
    /// Nothing moves a cut way; new connections wait while either is cut
    /// (a handshake needs both).
    cut: watch::Sender<Cut>,
    delivered_bytes: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Link {
    pub fn new(delay: Delay, metrics: Arc<Metrics>) -> Link {
        Link {
            delay: Mutex::new(delay),
            cut: watch::channel(Cut::default()).0,
            delivered_bytes: AtomicU64::new(0),
            metrics,
        }
    }

    /// The delay now (it may change while connections are open).
    pub fn delay(&self) -> Delay {
        *self.delay.lock()
    }

    pub fn set_delay(&self, d: Delay) {
        *self.delay.lock() = d;
    }

    pub fn cut(&self) -> Cut {
        *self.cut.borrow()
    }

    /// Cuts the directions `cut` names and heals the others.
    pub fn set_cut(&self, cut: Cut) {
        self.cut.send_replace(cut);
    }

    /// Returns once direction `d` is not cut, or, without one, once
    /// neither is.
    pub async fn wait_while_cut(&self, d: Option<Direction>) {
        let mut rx = self.cut.subscribe();
        // The sender lives as long as the link: an error cannot happen.
        let _ = rx.wait_for(|cut| d.map_or(!cut.any(), |d| !cut.blocks(d))).await;
    }

    /// Bytes delivered, both directions.
    pub fn delivered_bytes(&self) -> u64 {
        self.delivered_bytes.load(Ordering::Relaxed)
    }

    fn delivered(&self, n: usize) {
        self.delivered_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.metrics.relayed_bytes.inc_by(n as u64);
    }
}

/// Relays `from` to `to` (direction `dir` of the route) until `from` ends
/// (then shuts `to` down) or either fails; returns the bytes delivered.
pub async fn pump<R, W>(
    mut from: R,
    mut to: W,
    route: Arc<Link>,
    dir: Direction,
    max_in_flight: usize,
) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    debug_assert!(max_in_flight > 0);
    let budget = Arc::new(Semaphore::new(max_in_flight));
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(RELAY_QUEUE);
    let chunk = RELAY_CHUNK.min(max_in_flight);
    let reader = {
        let (route, budget) = (route.clone(), budget.clone());
        async move {
            let mut buf = vec![0u8; chunk];
            // Chunks leave in the order they came: no earlier than the one before.
            let mut last = Instant::now();
            loop {
                route.wait_while_cut(Some(dir)).await;
                // Room for a whole chunk first: a full budget stops the reading.
                let permit = budget.acquire_many(chunk as u32).await.expect("the budget is never closed");
                permit.forget();
                let n = from.read(&mut buf).await?;
                budget.add_permits(chunk - n);
                if n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
                let at = (Instant::now() + route.delay().sample()).max(last);
                last = at;
                if tx.send((at, buf[..n].to_vec())).await.is_err() {
                    // The writer failed; its error is the one reported.
                    return Ok(());
                }
            }
        }
    };
    let writer = async {
        let mut delivered = 0u64;
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            route.wait_while_cut(Some(dir)).await;
            to.write_all(&bytes).await?;
            delivered += bytes.len() as u64;
            route.delivered(bytes.len());
            budget.add_permits(bytes.len());
        }
        to.shutdown().await?;
        Ok::<u64, std::io::Error>(delivered)
    };
    let (mut reader, mut writer) = (std::pin::pin!(reader), std::pin::pin!(writer));
    tokio::select! {
        // The sender is done: what is held is still delivered.
        read = &mut reader => {
            read?;
            writer.await
        }
        // Only by failing (it ends normally after the reader): the reader
        // may wait on a sender that has nothing more to say.
        delivered = &mut writer => delivered,
    }
}
