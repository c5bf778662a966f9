//! Pages from the pageserver's page service for the lazy file system: a
//! few pipelined connections (`crate::page_client`), each opened on first
//! use and again after any failure, driven from the file system's threads
//! by a runtime of its own. Several, so that concurrent reads (the workers
//! of a parallel scan) are served by the pageserver at once.

use parking_lot::Mutex;
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_protocol::pageserver::{PageRequest, ServerMessage};
use strata_protocol::{TenantId, TimelineId};

use super::fs::PageSource;
use crate::page_client::{PageClient, PageClientConfig};

/// The page service of one timeline.
pub struct PageServiceSource {
    addr: String,
    tenant: TenantId,
    timeline: TimelineId,
    config: PageClientConfig,
    runtime: tokio::runtime::Runtime,
    /// Each `None` until connected, and after a failure (the next call
    /// on it reconnects).
    clients: Vec<Mutex<Option<PageClient>>>,
}

/// Connections per source: as many as the file system has threads.
pub const CONNECTIONS: usize = 4;

impl PageServiceSource {
    /// A source for `tenant`/`timeline` at the page service `addr` (`host:port`).
    pub fn new(
        addr: String,
        tenant: TenantId,
        timeline: TimelineId,
        config: PageClientConfig,
    ) -> std::io::Result<PageServiceSource> {
        // A current-thread runtime may be entered from several threads at
        // once: each drives its own future, one of them the I/O driver.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let clients = (0..CONNECTIONS).map(|_| Mutex::new(None)).collect();
        Ok(PageServiceSource { addr, tenant, timeline, config, runtime, clients })
    }

    async fn fetch(
        client: &mut PageClient,
        rel: RelFileNode,
        fork: ForkNumber,
        blocks: &[u32],
        lsn: Lsn,
    ) -> Result<Vec<Vec<u8>>, String> {
        let mut pages = Vec::with_capacity(blocks.len());
        let mut next = 0;
        while pages.len() < blocks.len() {
            // Keep the pipeline full: queue what fits, then take one answer.
            while next < blocks.len() && client.in_flight() < client.max_in_flight() {
                let request = PageRequest::GetPage { id: 0, lsn, rel, fork, block: blocks[next] };
                client.queue(request).map_err(|e| e.to_string())?;
                next += 1;
            }
            match client.recv().await.map_err(|e| e.to_string())? {
                ServerMessage::Page { page, .. } => pages.push(page),
                ServerMessage::Error { code, message, .. } => {
                    let block = blocks[pages.len()];
                    return Err(format!("block {block} of {rel:?} fork {fork:?} at {lsn}: {code:?}: {message}"));
                }
                other => return Err(format!("{} in answer to GetPage", other.name())),
            }
        }
        Ok(pages)
    }
}

impl PageSource for PageServiceSource {
    fn get_pages(&self, rel: RelFileNode, fork: ForkNumber, blocks: &[u32], lsn: Lsn) -> Result<Vec<Vec<u8>>, String> {
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
        self.runtime.block_on(async {
            if slot.is_none() {
                let c = PageClient::connect(&self.addr, self.tenant, self.timeline, self.config.clone())
                    .await
                    .map_err(|e| format!("page service {}: {e}", self.addr))?;
                *slot = Some(c);
            }
            let client = slot.as_mut().expect("connected above");
            let result = Self::fetch(client, rel, fork, blocks, lsn).await;
            if result.is_err() || client.in_flight() > 0 {
                // Its place in the response stream is unknown: a new one next time.
                *slot = None;
            }
            result
        })
    }
}
