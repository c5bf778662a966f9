//! Pages from the pageserver's page service for the lazy file system: a
//! few pipelined connections (`crate::page_client`), each opened on first
//! use and again after any failure, driven from the file system's threads
//! by a runtime of its own. Several, so that concurrent reads (the workers
//! of a parallel scan) are served by the pageserver at once. A sharded
//! tenant's pages come from [`ShardedSource`]: one such source per shard,
//! each read split by the key mapping and fetched from all shards at once.
//! A [`SwitchableSource`] lets a running compute replace its source when
//! the tenant's shard count changes (a split).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::version::BLCKSZ;
use strata_formats::Lsn;
use strata_protocol::pageserver::{ErrorCode, PageRequest, ServerMessage};
use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantShardId, TimelineId};

use super::fs::{FetchError, PageSource};
use crate::page_client::{PageClient, PageClientConfig, PageClientError};

/// The page service of one timeline.
pub struct PageServiceSource {
    addr: String,
    tenant: TenantShardId,
    timeline: TimelineId,
    config: PageClientConfig,
    /// How long a fetch keeps trying ([`crate::limits::LAZY_FETCH_RETRY_FOR`] by default).
    retry_for: std::time::Duration,
    runtime: tokio::runtime::Runtime,
    /// Where the pageserver is now (a failover moves it); `addr` without.
    target: Option<crate::pageserver_target::PageserverTarget>,
    /// Each `None` until connected, and after a failure (the next call
    /// on it reconnects); with the address it is connected to.
    clients: Vec<Mutex<Option<(PageClient, String)>>>,
    /// Replaced by another source ([`PageSource::retire`]): no more retries.
    retired: AtomicBool,
}

impl PageServiceSource {
    /// A source for `tenant`/`timeline` at the page service `addr` (`host:port`).
    pub fn new(
        addr: String,
        tenant: impl Into<TenantShardId>,
        timeline: TimelineId,
        config: PageClientConfig,
    ) -> std::io::Result<PageServiceSource> {
        let tenant = tenant.into();
        // A current-thread runtime may be entered from several threads at
        // once: each drives its own future, one of them the I/O driver.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let clients = (0..crate::limits::PAGE_SOURCE_CONNECTIONS).map(|_| Mutex::new(None)).collect();
        Ok(PageServiceSource {
            addr,
            tenant,
            timeline,
            config,
            retry_for: crate::limits::LAZY_FETCH_RETRY_FOR,
            runtime,
            target: None,
            clients,
            retired: AtomicBool::new(false),
        })
    }

    /// Connects to where `target` says the page service is: connections
    /// to an address it no longer names are replaced before their next use.
    pub fn following(mut self, target: crate::pageserver_target::PageserverTarget) -> PageServiceSource {
        self.target = Some(target);
        self
    }

    /// The page service's address now.
    fn current_addr(&self) -> String {
        self.target.as_ref().and_then(|t| t.pg()).unwrap_or_else(|| self.addr.clone())
    }

    /// Fetches keep trying for `retry_for` while the pageserver cannot be
    /// reached (zero: one try).
    pub fn retry_for(mut self, retry_for: std::time::Duration) -> PageServiceSource {
        self.retry_for = retry_for;
        self
    }

    /// The pages of `blocks` at `lsn`, one after another.
    async fn fetch(
        client: &mut PageClient,
        rel: RelFileNode,
        fork: ForkNumber,
        blocks: &[u32],
        lsn: Lsn,
    ) -> Result<Vec<u8>, Failure> {
        let mut pages = Vec::with_capacity(blocks.len() * BLCKSZ);
        let mut next = 0;
        while pages.len() < blocks.len() * BLCKSZ {
            // Keep the pipeline full: queue what fits, then take one answer.
            while next < blocks.len() && client.in_flight() < client.max_in_flight() {
                let request = PageRequest::GetPage { id: 0, lsn, rel, fork, block: blocks[next] };
                client.queue(request).map_err(Failure::Transport)?;
                next += 1;
            }
            match client.recv_page_into(&mut pages).await.map_err(Failure::Transport)? {
                None => {}
                Some(ServerMessage::Error { code, message, .. }) => {
                    let block = blocks[pages.len() / BLCKSZ];
                    let text = format!("block {block} of {rel:?} fork {fork:?} at {lsn}: {code:?}: {message}");
                    return Err(match code {
                        ErrorCode::NotFound if message.contains("below the GC cutoff") => {
                            Failure::Final(FetchError::BelowGcCutoff(text))
                        }
                        ErrorCode::Overloaded => Failure::Busy(text),
                        // Moved (a failover or a move under way): ask where it is now.
                        ErrorCode::NotAttached => Failure::Transport(PageClientError::Refused { code, message }),
                        _ => Failure::Final(FetchError::Other(text)),
                    });
                }
                Some(other) => {
                    return Err(Failure::Final(FetchError::Other(format!("{} in answer to GetPage", other.name()))))
                }
            }
        }
        Ok(pages)
    }
}

/// Why one attempt failed.
enum Failure {
    /// The connection failed (or could not be made): retried on a new one.
    Transport(PageClientError),
    /// The pageserver is overloaded: retried after a pause.
    Busy(String),
    /// An answer that another attempt would not change.
    Final(FetchError),
}

impl PageSource for PageServiceSource {
    fn latest_lsn(&self) -> Result<Lsn, String> {
        // A fresh connection's hello says how far the timeline is ingested.
        let addr = self.current_addr();
        self.runtime.block_on(async {
            PageClient::connect(&addr, self.tenant, self.timeline, self.config.clone())
                .await
                .map(|c| c.last_record_lsn())
                .map_err(|e| format!("page service {addr}: {e}"))
        })
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    fn get_pages(&self, rel: RelFileNode, fork: ForkNumber, blocks: &[u32], lsn: Lsn) -> Result<Vec<u8>, FetchError> {
        // Blocking: the deadline is read from the clock, the pauses slept on this thread.
        let clock = &self.config.clock;
        let deadline = clock.now() + self.retry_for;
        let mut pause = crate::limits::LAZY_FETCH_FIRST_PAUSE;
        loop {
            let error = match self.attempt(rel, fork, blocks, lsn) {
                Ok(pages) => return Ok(pages),
                Err(Failure::Final(e)) => return Err(e),
                Err(Failure::Transport(e)) => e.to_string(),
                Err(Failure::Busy(e)) => e,
            };
            if self.retired.load(Ordering::Relaxed) {
                return Err(FetchError::Other(format!("{error} (this source was replaced: not retried)")));
            }
            if clock.now() + pause > deadline {
                return Err(FetchError::Other(format!("{error} (still failing after {:?})", self.retry_for)));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(crate::limits::LAZY_FETCH_MAX_PAUSE);
        }
    }
}

impl PageServiceSource {
    /// One try on one connection (made first if need be).
    fn attempt(&self, rel: RelFileNode, fork: ForkNumber, blocks: &[u32], lsn: Lsn) -> Result<Vec<u8>, Failure> {
        // A free connection, else wait for one (chosen by thread, so that
        // the waits spread).
        let mut slot = match self.clients.iter().find_map(|c| c.try_lock()) {
            Some(slot) => slot,
            None => {
                let n = std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    std::thread::current().id(),
                );
                self.clients[n as usize % self.clients.len()].lock()
            }
        };
        let addr = self.current_addr();
        if slot.as_ref().is_some_and(|(_, a)| *a != addr) {
            // The tenant moved: this connection is to where it was.
            *slot = None;
        }
        self.runtime.block_on(async {
            if slot.is_none() {
                let c =
                    PageClient::connect(&addr, self.tenant, self.timeline, self.config.clone()).await.map_err(|e| {
                        match e {
                            // Not attached there (any more): the next try asks where it is now.
                            PageClientError::Refused { code: ErrorCode::NotAttached, .. } => Failure::Transport(e),
                            // The timeline itself refused: no retry changes that.
                            PageClientError::Refused { code, message } if code != ErrorCode::Overloaded => {
                                Failure::Final(FetchError::Other(format!("page service {addr}: {code:?}: {message}")))
                            }
                            e => Failure::Transport(e),
                        }
                    })?;
                *slot = Some((c, addr.clone()));
            }
            let (client, _) = slot.as_mut().expect("connected above");
            let result = Self::fetch(client, rel, fork, blocks, lsn).await;
            if result.is_err() || client.in_flight() > 0 {
                // Its place in the response stream is unknown: a new one next time.
                *slot = None;
            }
            result
        })
    }
}

/// The pages of a sharded tenant: each block from the shard the mapping
/// gives it (`docs/sharding.md`), the shards of one read fetched at once.
pub struct ShardedSource {
    layout: ShardLayout,
    /// One source per shard, in shard order.
    shards: Vec<PageServiceSource>,
}

impl ShardedSource {
    /// `shards` in shard order, one per shard of `layout`.
    pub fn new(layout: ShardLayout, shards: Vec<PageServiceSource>) -> Result<ShardedSource, String> {
        if shards.len() != usize::from(layout.count) {
            return Err(format!("{} shard sources for {} shards", shards.len(), layout.count));
        }
        Ok(ShardedSource { layout, shards })
    }

    /// The blocks of one read grouped by shard: for each shard, its blocks
    /// and their places in the read.
    fn split(&self, rel: RelFileNode, fork: ForkNumber, blocks: &[u32]) -> Vec<(Vec<u32>, Vec<usize>)> {
        let mut groups = vec![(Vec::new(), Vec::new()); self.shards.len()];
        for (i, b) in blocks.iter().enumerate() {
            let shard = usize::from(self.layout.shard_of_block(rel.rel, fork, *b));
            groups[shard].0.push(*b);
            groups[shard].1.push(i);
        }
        groups
    }
}

impl PageSource for ShardedSource {
    fn get_pages(&self, rel: RelFileNode, fork: ForkNumber, blocks: &[u32], lsn: Lsn) -> Result<Vec<u8>, FetchError> {
        let groups = self.split(rel, fork, blocks);
        let used: Vec<usize> = (0..groups.len()).filter(|s| !groups[*s].0.is_empty()).collect();
        if let [only] = used[..] {
            // A read within one stripe (the common case): no reassembly.
            return self.shards[only].get_pages(rel, fork, blocks, lsn);
        }
        // Each shard's part on a thread of its own, so the shards' round
        // trips overlap rather than add up.
        let fetched: Vec<(usize, Result<Vec<u8>, FetchError>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = used
                .iter()
                .map(|s| {
                    let (source, part) = (&self.shards[*s], &groups[*s].0);
                    (*s, scope.spawn(move || source.get_pages(rel, fork, part, lsn)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(s, h)| {
                    let r =
                        h.join().unwrap_or_else(|_| Err(FetchError::Other(format!("shard {s}: its fetch panicked"))));
                    (s, r)
                })
                .collect()
        });
        let mut pages = vec![0u8; blocks.len() * BLCKSZ];
        for (s, result) in fetched {
            let part = result?;
            debug_assert_eq!(part.len(), groups[s].1.len() * BLCKSZ);
            for (k, place) in groups[s].1.iter().enumerate() {
                pages[place * BLCKSZ..(place + 1) * BLCKSZ].copy_from_slice(&part[k * BLCKSZ..(k + 1) * BLCKSZ]);
            }
        }
        Ok(pages)
    }

    fn latest_lsn(&self) -> Result<Lsn, String> {
        // Shard 0 ingests every record; each GetPage waits for its LSN on
        // its own shard anyway.
        self.shards[0].latest_lsn()
    }

    fn retire(&self) {
        self.shards.iter().for_each(PageSource::retire);
    }
}

/// A page source that another can replace while it serves: a lazy
/// compute's, whose tenant may be split while it runs. Each call takes the
/// source of the moment, so calls under way finish on the old one and new
/// ones go to the new one; a call that fails on a source replaced while it
/// ran is tried once more on the new one (a split's old shards are
/// detached soon after: their failure is not the read's).
pub struct SwitchableSource {
    /// The source now, and the switches before it.
    current: RwLock<(u64, Arc<dyn PageSource>)>,
    /// Calls that failed on a replaced source and were tried again.
    retried: AtomicU64,
}

impl SwitchableSource {
    pub fn new(inner: Arc<dyn PageSource>) -> SwitchableSource {
        SwitchableSource { current: RwLock::new((0, inner)), retried: AtomicU64::new(0) }
    }

    /// Serves every call from `next` from now on. Returns the old source,
    /// retired: the caller drops it where blocking is allowed (a page
    /// service source's runtime may not be dropped in an async context).
    pub fn switch(&self, next: Arc<dyn PageSource>) -> Arc<dyn PageSource> {
        let old = {
            let mut current = self.current.write();
            let switches = current.0 + 1;
            std::mem::replace(&mut *current, (switches, next)).1
        };
        old.retire();
        old
    }

    /// Times the source was replaced.
    pub fn switches(&self) -> u64 {
        self.current.read().0
    }

    /// Calls that failed on a replaced source and were tried on its successor.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    fn current(&self) -> (u64, Arc<dyn PageSource>) {
        let current = self.current.read();
        (current.0, current.1.clone())
    }

    /// `call` on the source now, and once more on the new one if it failed
    /// and the source was replaced meanwhile.
    fn call<T, E: std::fmt::Display>(&self, call: impl Fn(&dyn PageSource) -> Result<T, E>) -> Result<T, E> {
        let (seen, source) = self.current();
        let error = match call(&*source) {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        let (now, next) = self.current();
        if now == seen {
            return Err(error);
        }
        self.retried.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("a read failed on the page source replaced meanwhile, tried on the new one: {error}");
        call(&*next)
    }
}

impl PageSource for SwitchableSource {
    fn get_pages(&self, rel: RelFileNode, fork: ForkNumber, blocks: &[u32], lsn: Lsn) -> Result<Vec<u8>, FetchError> {
        self.call(|s| s.get_pages(rel, fork, blocks, lsn))
    }

    fn latest_lsn(&self) -> Result<Lsn, String> {
        self.call(|s| s.latest_lsn())
    }

    fn retire(&self) {
        self.current().1.retire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use strata_protocol::framed::FrameReader;
    use strata_protocol::pageserver::codec;
    use strata_protocol::pageserver::{ClientMessage, PAGE_SIZE};
    use strata_protocol::shard::ShardIndex;
    use strata_protocol::TenantId;
    use tokio::io::AsyncWriteExt;

    const TENANT: TenantId = TenantId([3; 16]);

    /// The page a fake shard serves for `block`: its number and the shard's.
    fn page_of(shard: u8, block: u32) -> Vec<u8> {
        let mut page = vec![shard; PAGE_SIZE];
        page[..4].copy_from_slice(&block.to_le_bytes());
        page
    }

    /// A page service of shard `number` of `layout` on a thread of its
    /// own: it refuses a hello for another shard, and answers a block of
    /// another shard `WrongShard`, as a pageserver does.
    fn fake_shard(layout: ShardLayout, number: u8) -> String {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                std_listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        let mut frames = FrameReader::new(stream, codec::MAX_FRAME_SIZE);
                        while let Ok(frame) = frames.read_frame(Duration::from_secs(30)).await {
                            let mut out = Vec::new();
                            let msg = match codec::decode_client(frame).unwrap() {
                                ClientMessage::Hello(h)
                                    if h.tenant_id.shard == ShardIndex::new(number, layout.count).unwrap() =>
                                {
                                    ServerMessage::HelloOk { last_record_lsn: Lsn(0x1000 + u64::from(number)) }
                                }
                                ClientMessage::Hello(_) => ServerMessage::Error {
                                    id: 0,
                                    code: ErrorCode::NotAttached,
                                    message: "not here".into(),
                                },
                                ClientMessage::Request(PageRequest::GetPage { id, rel, fork, block, .. }) => {
                                    match layout.shard_of_block(rel.rel, fork, block) == number {
                                        true => ServerMessage::Page { id, page: page_of(number, block) },
                                        false => ServerMessage::Error {
                                            id,
                                            code: ErrorCode::WrongShard,
                                            message: format!("block {block}"),
                                        },
                                    }
                                }
                                ClientMessage::Request(other) => panic!("unexpected {other:?}"),
                            };
                            codec::encode_server(&msg, &mut out);
                            if frames.get_mut().write_all(&out).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
        });
        addr
    }

    #[test]
    fn each_block_of_a_read_comes_from_its_shard_and_in_order() {
        let layout = ShardLayout::new(3, 8).unwrap();
        let shards = (0..3)
            .map(|n| {
                let id = TenantShardId { tenant: TENANT, shard: ShardIndex::new(n, 3).unwrap() };
                PageServiceSource::new(fake_shard(layout, n), id, TimelineId([4; 16]), PageClientConfig::default())
                    .unwrap()
                    .retry_for(Duration::ZERO)
            })
            .collect();
        let source = ShardedSource::new(layout, shards).unwrap();
        let rel = RelFileNode { spc: 1663, db: 5, rel: 16390 };
        // 100 blocks in one read span every shard (stripes of 8).
        let blocks: Vec<u32> = (0..100).collect();
        let pages = source.get_pages(rel, ForkNumber::Main, &blocks, Lsn(0x1000)).unwrap();
        assert_eq!(pages.len(), blocks.len() * BLCKSZ);
        let mut used = [false; 3];
        for (i, b) in blocks.iter().enumerate() {
            let owner = layout.shard_of_block(rel.rel, ForkNumber::Main, *b);
            used[usize::from(owner)] = true;
            assert_eq!(&pages[i * BLCKSZ..(i + 1) * BLCKSZ], &page_of(owner, *b)[..], "block {b}");
        }
        assert_eq!(used, [true; 3], "the read crossed every shard");
        // A read within one stripe, out of order blocks, and the catalog (shard 0's).
        let scattered = [93, 5, 40, 6];
        let pages = source.get_pages(rel, ForkNumber::Main, &scattered, Lsn(0x1000)).unwrap();
        for (i, b) in scattered.iter().enumerate() {
            let owner = layout.shard_of_block(rel.rel, ForkNumber::Main, *b);
            assert_eq!(&pages[i * BLCKSZ..(i + 1) * BLCKSZ], &page_of(owner, *b)[..]);
        }
        let catalog = RelFileNode { rel: 1259, ..rel };
        let pages = source.get_pages(catalog, ForkNumber::Main, &[0, 9, 17], Lsn(0x1000)).unwrap();
        assert!(pages.chunks(BLCKSZ).all(|p| p[PAGE_SIZE - 1] == 0));
        // Shard 0 says how far the tenant is ingested.
        assert_eq!(source.latest_lsn().unwrap(), Lsn(0x1000));
        // Sources in the wrong order are refused by the shards themselves.
        let swapped: Vec<PageServiceSource> = [1u8, 0]
            .iter()
            .map(|n| {
                let id = TenantShardId { tenant: TENANT, shard: ShardIndex::new(1 - n, 2).unwrap() };
                let two = ShardLayout::new(2, 8).unwrap();
                PageServiceSource::new(fake_shard(two, *n), id, TimelineId([4; 16]), PageClientConfig::default())
                    .unwrap()
                    .retry_for(Duration::ZERO)
            })
            .collect();
        let wrong = ShardedSource::new(ShardLayout::new(2, 8).unwrap(), swapped).unwrap();
        assert!(wrong.get_pages(rel, ForkNumber::Main, &blocks, Lsn(0x1000)).is_err());
        assert!(ShardedSource::new(layout, Vec::new()).is_err(), "one source per shard");
    }

    /// A source that answers every block with pages of `tag`, or fails;
    /// with a gate, each call waits there until the test opens it.
    struct Fake {
        tag: u8,
        fail: bool,
        calls: AtomicU64,
        retired: AtomicBool,
        /// Tells the test a call arrived, then waits for its go.
        gate: Option<Gate>,
    }

    /// The two ends of a gate: where a call says it arrived, where it waits.
    type Gate = (Mutex<std::sync::mpsc::Sender<()>>, Mutex<std::sync::mpsc::Receiver<()>>);

    impl Fake {
        fn new(tag: u8, fail: bool) -> Arc<Fake> {
            Fake::gated(tag, fail, None)
        }

        fn gated(tag: u8, fail: bool, gate: Option<Gate>) -> Arc<Fake> {
            Arc::new(Fake { tag, fail, calls: AtomicU64::new(0), retired: AtomicBool::new(false), gate })
        }
    }

    impl PageSource for Fake {
        fn get_pages(&self, _: RelFileNode, _: ForkNumber, blocks: &[u32], _: Lsn) -> Result<Vec<u8>, FetchError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if let Some((arrived, go)) = &self.gate {
                arrived.lock().send(()).unwrap();
                go.lock().recv().unwrap();
            }
            match self.fail {
                true => Err(FetchError::Other(format!("source {} refuses", self.tag))),
                false => Ok(vec![self.tag; blocks.len() * BLCKSZ]),
            }
        }

        fn latest_lsn(&self) -> Result<Lsn, String> {
            Ok(Lsn(u64::from(self.tag)))
        }

        fn retire(&self) {
            self.retired.store(true, Ordering::Relaxed);
        }
    }

    const REL: RelFileNode = RelFileNode { spc: 1663, db: 5, rel: 16390 };

    #[test]
    fn after_a_switch_reads_go_to_the_new_source_and_the_old_one_is_retired() {
        let (old, new) = (Fake::new(1, false), Fake::new(2, false));
        let source = SwitchableSource::new(old.clone());
        assert_eq!(source.get_pages(REL, ForkNumber::Main, &[0, 1], Lsn(8)).unwrap(), vec![1; 2 * BLCKSZ]);
        assert_eq!(source.latest_lsn().unwrap(), Lsn(1));
        let replaced = source.switch(new.clone());
        assert!(Arc::ptr_eq(&replaced, &(old.clone() as Arc<dyn PageSource>)));
        assert!(old.retired.load(Ordering::Relaxed) && !new.retired.load(Ordering::Relaxed));
        assert_eq!(source.get_pages(REL, ForkNumber::Main, &[0, 1], Lsn(8)).unwrap(), vec![2; 2 * BLCKSZ]);
        assert_eq!(source.latest_lsn().unwrap(), Lsn(2));
        assert_eq!((old.calls.load(Ordering::Relaxed), new.calls.load(Ordering::Relaxed)), (1, 1));
        assert_eq!((source.switches(), source.retried()), (1, 0));
        // Without a switch, a failure is the read's: no second try.
        let failing = Fake::new(3, true);
        source.switch(failing.clone());
        assert!(source.get_pages(REL, ForkNumber::Main, &[0], Lsn(8)).is_err());
        assert_eq!((failing.calls.load(Ordering::Relaxed), source.retried()), (1, 0));
    }

    #[test]
    fn a_read_that_fails_on_the_old_source_after_a_switch_is_tried_on_the_new_one() {
        let (arrived_tx, arrived) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let old = Fake::gated(1, true, Some((Mutex::new(arrived_tx), Mutex::new(go_rx))));
        let new = Fake::new(2, false);
        let source = Arc::new(SwitchableSource::new(old.clone()));
        let reader = std::thread::spawn({
            let source = source.clone();
            move || source.get_pages(REL, ForkNumber::Main, &[4, 5, 6], Lsn(8))
        });
        // The read is under way on the old source (its shards detached)
        // when the new layout's source takes over.
        arrived.recv().unwrap();
        source.switch(new.clone());
        go.send(()).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), vec![2; 3 * BLCKSZ], "answered by the new source");
        assert_eq!((old.calls.load(Ordering::Relaxed), new.calls.load(Ordering::Relaxed)), (1, 1));
        assert_eq!(source.retried(), 1);
    }

    #[test]
    fn a_retired_page_service_source_stops_retrying() {
        // A port that was free a moment ago: connections are refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let id = TenantShardId { tenant: TENANT, shard: ShardIndex::UNSHARDED };
        let source = PageServiceSource::new(format!("127.0.0.1:{port}"), id, TimelineId([4; 16]), Default::default())
            .unwrap()
            .retry_for(Duration::from_secs(600));
        source.retire();
        let clock = strata_service::clock::SystemClock;
        let started = strata_service::clock::Clock::now(&clock);
        let error = source.get_pages(REL, ForkNumber::Main, &[0], Lsn(8)).unwrap_err();
        assert!(error.to_string().contains("replaced"), "{error}");
        assert!(strata_service::clock::Clock::since(&clock, started) < Duration::from_secs(60));
    }

    #[test]
    fn a_split_switches_reads_to_the_new_layouts_shards() {
        let source_of = |layout: ShardLayout| {
            let shards = (0..layout.count)
                .map(|n| {
                    let id = TenantShardId { tenant: TENANT, shard: ShardIndex::new(n, layout.count).unwrap() };
                    PageServiceSource::new(fake_shard(layout, n), id, TimelineId([4; 16]), PageClientConfig::default())
                        .unwrap()
                        .retry_for(Duration::ZERO)
                })
                .collect();
            Arc::new(ShardedSource::new(layout, shards).unwrap())
        };
        let (two, four) = (ShardLayout::new(2, 8).unwrap(), ShardLayout::new(4, 8).unwrap());
        let source = SwitchableSource::new(source_of(two));
        let blocks: Vec<u32> = (0..64).collect();
        let check = |layout: ShardLayout| {
            let pages = source.get_pages(REL, ForkNumber::Main, &blocks, Lsn(0x1000)).unwrap();
            for (i, b) in blocks.iter().enumerate() {
                let owner = layout.shard_of_block(REL.rel, ForkNumber::Main, *b);
                assert_eq!(&pages[i * BLCKSZ..(i + 1) * BLCKSZ], &page_of(owner, *b)[..], "block {b} of {layout:?}");
            }
        };
        check(two);
        // Dropped here, on a thread where its runtimes may be.
        drop(source.switch(source_of(four)));
        check(four);
        assert_eq!(source.latest_lsn().unwrap(), Lsn(0x1000));
    }
}
