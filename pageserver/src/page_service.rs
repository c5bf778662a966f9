//! The page service: GetPage@LSN and the other reads of
//! `docs/pageserver-protocol.md`, over a pipelined TCP protocol.
//!
//! Requests that arrive together are answered together: consecutive
//! GetPage requests at one LSN become one lookup that visits the layer map
//! once, and all responses go out in one write.
//!
//! Each tenant may hold at most `max_connections_per_tenant` connections
//! ([`TenantConnections`]); the listener's `max_connections` bounds them all.

use bytes::Bytes;
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use strata_formats::version::BLCKSZ;
use strata_formats::Lsn;
use strata_protocol::framed::{self, FrameError, FrameReader};
use strata_protocol::pageserver::codec;
use strata_protocol::pageserver::{
    ClientMessage, ErrorCode, PageRequest, ServerMessage, MAX_PIPELINE_DEPTH, PAGE_PROTOCOL_MIN_VERSION,
    PAGE_PROTOCOL_VERSION,
};
use strata_protocol::TenantShardId;
use strata_service::auth::{Access, Verifier};
use strata_service::tls::Stream;
use strata_service::Listener;
use tokio::io::WriteHalf;
use tracing::{debug, info};

use crate::key::{Key, RelTag};
use crate::metrics::{Metrics, PageRefusal};
use crate::tenants::Tenants;
use crate::timeline::{ReadError, Timeline};

use crate::limits::{PAGE_IDLE_TIMEOUT as IDLE_TIMEOUT, PAGE_WRITE_TIMEOUT as WRITE_TIMEOUT};

/// Why a page service connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("no hello within {0:?}")]
    Handshake(Duration),
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    /// Refused with an error sent to the client.
    #[error("refused: {0}")]
    Refused(String),
}

/// The answer to a connection refused because the listener is full.
pub fn refusal(_first_bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let message = "too many connections to this pageserver; retry later".to_string();
    codec::encode_server(&ServerMessage::Error { id: 0, code: ErrorCode::Overloaded, message }, &mut out);
    out
}

/// The open page service connections of each tenant, each tenant's at most
/// `limit`, so that one tenant's clients cannot take every place of the
/// listener from the others.
///
/// A tenant has an entry only while it holds a connection (a
/// [`TenantConnection`]): the map never has more entries than the listener
/// has connections, whatever tenants come and go.
pub struct TenantConnections {
    limit: usize,
    state: Mutex<TenantCounts>,
    /// Tenants with an entry.
    connected: Gauge,
    /// Tenants at `limit`.
    at_limit: Gauge,
}

#[derive(Default)]
struct TenantCounts {
    /// Open connections by tenant; never 0 (the entry goes with the last one).
    open: HashMap<TenantShardId, usize>,
    /// Entries at the limit.
    at_limit: usize,
}

/// A tenant already holds as many page service connections as it may.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "too many connections for tenant {tenant}: it already has {limit} open on this pageserver \
     (max_connections_per_tenant); retry later"
)]
pub struct TenantAtLimit {
    pub tenant: TenantShardId,
    pub limit: usize,
}

/// One connection's place among its tenant's, given back when dropped.
#[must_use = "the place is given back when this is dropped"]
pub struct TenantConnection {
    owner: Arc<TenantConnections>,
    tenant: TenantShardId,
}

impl TenantConnections {
    /// At most `limit` connections per tenant (at least 1), reported in
    /// `connected` and `at_limit` (tenants with a connection, tenants at the limit).
    pub fn new(limit: usize, connected: Gauge, at_limit: Gauge) -> TenantConnections {
        TenantConnections { limit: limit.max(1), state: Mutex::default(), connected, at_limit }
    }

    /// The limits and gauges of the pageserver's configuration and metrics.
    pub fn for_pageserver(conf: &crate::config::PageserverConfig, metrics: &Metrics) -> TenantConnections {
        TenantConnections::new(
            conf.connections_per_tenant(),
            metrics.page_tenants_connected.clone(),
            metrics.page_tenants_at_limit.clone(),
        )
    }

    /// A place for one more connection of `tenant`, unless it holds its limit.
    pub fn open(self: &Arc<Self>, tenant: TenantShardId) -> Result<TenantConnection, TenantAtLimit> {
        let mut state = self.state.lock();
        let n = state.open.get(&tenant).copied().unwrap_or(0);
        if n >= self.limit {
            return Err(TenantAtLimit { tenant, limit: self.limit });
        }
        state.open.insert(tenant, n + 1);
        if n + 1 == self.limit {
            state.at_limit += 1;
        }
        self.report(&state);
        Ok(TenantConnection { owner: self.clone(), tenant })
    }

    /// How many connections `tenant` holds.
    pub fn open_of(&self, tenant: TenantShardId) -> usize {
        self.state.lock().open.get(&tenant).copied().unwrap_or(0)
    }

    /// How many tenants hold a connection (the map's entries).
    pub fn tenants(&self) -> usize {
        self.state.lock().open.len()
    }

    fn close(&self, tenant: TenantShardId) {
        let mut state = self.state.lock();
        let Some(&n) = state.open.get(&tenant) else {
            debug_assert!(false, "a place of tenant {tenant} given back twice");
            return;
        };
        if n == self.limit {
            state.at_limit -= 1;
        }
        if n == 1 {
            state.open.remove(&tenant);
        } else {
            state.open.insert(tenant, n - 1);
        }
        self.report(&state);
    }

    fn report(&self, state: &TenantCounts) {
        self.connected.set(state.open.len() as i64);
        self.at_limit.set(state.at_limit as i64);
    }
}

impl Drop for TenantConnection {
    fn drop(&mut self) {
        self.owner.close(self.tenant);
    }
}

/// Serves page service connections on `listener` forever; with a
/// verifier, each hello must carry a token that allows its tenant, and
/// each tenant holds at most `max_connections_per_tenant` connections.
pub async fn serve(listener: Listener, tenants: Arc<Tenants>, verifier: Option<Arc<Verifier>>) {
    let per_tenant = Arc::new(TenantConnections::for_pageserver(&tenants.conf, &tenants.metrics));
    // Shown at 0 before the first refusal.
    tenants.metrics.page_connections_refused.get_or_create(&PageRefusal::TENANT_LIMIT).inc_by(0);
    listener
        .serve(move |conn| {
            let (tenants, verifier, per_tenant) = (tenants.clone(), verifier.clone(), per_tenant.clone());
            async move {
                let peer = conn.peer;
                tenants.metrics.page_connections.inc();
                if let Err(e) = connection(conn, &tenants, verifier.as_deref(), &per_tenant).await {
                    debug!(%peer, "page service connection closed: {e}");
                }
                tenants.metrics.page_connections.dec();
            }
        })
        .await
}

fn error_code(e: &ReadError) -> ErrorCode {
    match e {
        // The message names the cutoff.
        ReadError::NotFound(_) | ReadError::BelowGcCutoff { .. } => ErrorCode::NotFound,
        ReadError::LsnTimeout { .. } => ErrorCode::LsnTimeout,
        ReadError::Layer(_) | ReadError::Corrupt { .. } | ReadError::Broken { .. } => ErrorCode::Corrupt,
        ReadError::NotAttached { .. } => ErrorCode::NotAttached,
    }
}

/// [`error_code`] for a read of `tl`. A reader whose layer read failed
/// (the attached pageserver deleted a layer it had not downloaded yet) is
/// loaded again at its next refresh; meanwhile the compute is told the
/// tenant moved, so it retries instead of failing (`docs/sites.md`).
fn read_error_code(tl: &crate::timeline::Timeline, e: &ReadError) -> ErrorCode {
    match (e, tl.remote()) {
        (ReadError::Layer(_), Some(r)) if r.is_reader() => {
            r.want_reload();
            ErrorCode::NotAttached
        }
        _ => error_code(e),
    }
}

async fn refuse(w: &mut WriteHalf<Stream>, code: ErrorCode, message: String) -> Result<(), ConnectionError> {
    let mut out = Vec::new();
    codec::encode_server(&ServerMessage::Error { id: 0, code, message: message.clone() }, &mut out);
    framed::write_all(w, &out, WRITE_TIMEOUT).await?;
    Err(ConnectionError::Refused(message))
}

async fn connection(
    conn: strata_service::Connection,
    tenants: &Tenants,
    verifier: Option<&Verifier>,
    per_tenant: &Arc<TenantConnections>,
) -> Result<(), ConnectionError> {
    let (stream, slot) = conn.secure().await.map_err(ConnectionError::Tls)?;
    let (r, mut w) = tokio::io::split(stream);
    let mut frames = FrameReader::new(r, codec::MAX_FRAME_SIZE);
    let limit = tenants.conf.handshake_timeout;
    let hello = match tokio::time::timeout_at(slot.handshake_deadline(), frames.read_frame(limit)).await {
        Err(_) => return Err(ConnectionError::Handshake(limit)),
        Ok(Err(e @ (FrameError::Empty | FrameError::TooLarge { .. }))) => {
            return refuse(&mut w, ErrorCode::Protocol, e.to_string()).await
        }
        Ok(frame) => codec::decode_client(frame?),
    };
    let hello = match hello {
        Ok(ClientMessage::Hello(h)) => h,
        Ok(_) => return refuse(&mut w, ErrorCode::Protocol, "the first message must be Hello".into()).await,
        // A hello of another version whose fields this build cannot read.
        Err(e @ codec::DecodeError::UnsupportedVersion { .. }) => {
            return refuse(&mut w, ErrorCode::Version, e.to_string()).await
        }
        Err(e) => return refuse(&mut w, ErrorCode::Protocol, e.to_string()).await,
    };
    if !(PAGE_PROTOCOL_MIN_VERSION..=PAGE_PROTOCOL_VERSION).contains(&hello.protocol_version) {
        let msg = format!(
            "protocol version {} is not supported (this server speaks {PAGE_PROTOCOL_MIN_VERSION} to {PAGE_PROTOCOL_VERSION})",
            hello.protocol_version
        );
        return refuse(&mut w, ErrorCode::Version, msg).await;
    }
    if let Some(verifier) = verifier {
        let token = strata_protocol::token::wire(&hello.token);
        let action = format!("hello {}/{}", hello.tenant_id, hello.timeline_id);
        if let Err(refusal) =
            verifier.check_for("page", &action, &token, Access::Timeline(hello.tenant_id.tenant, hello.timeline_id))
        {
            tenants.metrics.refusal_metrics().count("page", &refusal);
            let code = if refusal.unauthenticated() { ErrorCode::Unauthorized } else { ErrorCode::Forbidden };
            return refuse(&mut w, code, refusal.to_string()).await;
        }
    }
    // Only a hello whose token allows the tenant takes one of its places (a
    // forged hello cannot use up another tenant's), and the place is held
    // until the connection closes. `Overloaded`, as when the listener is
    // full: clients already retry it later, and the message says whose limit.
    let _place = match per_tenant.open(hello.tenant_id) {
        Ok(place) => place,
        Err(e) => {
            tenants.metrics.page_connections_refused.get_or_create(&PageRefusal::TENANT_LIMIT).inc();
            return refuse(&mut w, ErrorCode::Overloaded, e.to_string()).await;
        }
    };
    slot.established();
    let Some(entry) = tenants.get(hello.tenant_id, hello.timeline_id) else {
        if tenants.conf.controller && !tenants.serves(hello.tenant_id) {
            let msg = format!("tenant {} is not attached to this pageserver", hello.tenant_id);
            return refuse(&mut w, ErrorCode::NotAttached, msg).await;
        }
        let msg = format!("timeline {}/{} not found on this pageserver", hello.tenant_id, hello.timeline_id);
        return refuse(&mut w, ErrorCode::NotFound, msg).await;
    };
    let tl = entry.tl.clone();
    info!(tenant = %hello.tenant_id, timeline = %hello.timeline_id, "page service connection");
    let mut out = Vec::new();
    codec::encode_server(&ServerMessage::HelloOk { last_record_lsn: tl.record_lsns().last }, &mut out);
    framed::write_all(&mut w, &out, WRITE_TIMEOUT).await?;
    let wait_timeout = tenants.conf.wait_lsn_timeout;
    loop {
        // Take every complete request already received (up to the pipeline
        // depth); wait for one if none is.
        let mut requests = Vec::new();
        let mut protocol_error = None;
        while requests.len() < MAX_PIPELINE_DEPTH {
            let frame = if requests.is_empty() {
                match frames.read_frame(IDLE_TIMEOUT).await {
                    Ok(f) => Some(f),
                    Err(e @ (FrameError::Empty | FrameError::TooLarge { .. })) => {
                        protocol_error = Some(e.to_string());
                        None
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                match frames.buffered_frame() {
                    Ok(f) => f,
                    Err(e) => {
                        protocol_error = Some(e.to_string());
                        None
                    }
                }
            };
            let Some(frame) = frame else { break };
            match codec::decode_client(frame) {
                Ok(ClientMessage::Request(r)) => requests.push(r),
                Ok(ClientMessage::Hello(_)) => protocol_error = Some("a second Hello".to_string()),
                Err(e) => protocol_error = Some(e.to_string()),
            }
            if protocol_error.is_some() {
                break;
            }
        }
        if requests.is_empty() {
            let e = protocol_error.expect("either a request or an error");
            return refuse(&mut w, ErrorCode::Protocol, e).await;
        }
        let clock = &*tenants.resources.clock;
        let started = clock.now();
        // Resolve and wait for every LSN first (async), then read (blocking).
        let mut lsns: HashMap<Lsn, Result<Lsn, (ErrorCode, String)>> = HashMap::new();
        for r in &requests {
            if let std::collections::hash_map::Entry::Vacant(slot) = lsns.entry(r.lsn()) {
                let resolved =
                    tl.wait_lsn(r.lsn(), wait_timeout).await.map_err(|e| (read_error_code(&tl, &e), e.to_string()));
                slot.insert(resolved);
            }
        }
        // Reads are short (a few small preads, mostly from the page cache):
        // answering on this worker halves the latency of a hand-off to the
        // blocking pool (measured with `strata pagebench`), at the cost of
        // holding the worker for the length of one batch.
        let responses = answer(&tl, requests, &lsns);
        // Frame headers and other messages go into `out`; each page is sent
        // from where it lies (the timeline's decompressed value group), by
        // one vectored write, instead of being copied next to its header.
        out.clear();
        let mut pages: Vec<(usize, &[u8])> = Vec::new();
        for resp in &responses {
            match resp {
                Answer::Page { id, page } => {
                    assert_eq!(page.len(), BLCKSZ, "pages are checked to be BLCKSZ when answered");
                    codec::encode_page_header(*id, &mut out);
                    pages.push((out.len(), page));
                }
                Answer::Other(msg) => {
                    if matches!(msg, ServerMessage::Error { .. }) {
                        tl.metrics.request_errors.inc();
                    }
                    codec::encode_server(msg, &mut out);
                }
            }
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * pages.len() + 1);
        let mut from = 0;
        for (to, page) in pages {
            parts.extend([&out[from..to], page]);
            from = to;
        }
        parts.push(&out[from..]);
        framed::write_all_vectored(&mut w, &parts, WRITE_TIMEOUT).await?;
        let per_request = clock.since(started).as_secs_f64();
        for _ in &responses {
            tl.metrics.request_seconds.observe(per_request);
        }
        if let Some(e) = protocol_error {
            return refuse(&mut w, ErrorCode::Protocol, e).await;
        }
    }
}

/// The page of a block that has no version (never written, or truncated).
static ZERO_PAGE: [u8; BLCKSZ] = [0; BLCKSZ];

/// The resolved LSN of a request, or why it has none (the error to answer with).
type Resolved = Result<Lsn, (ErrorCode, String)>;

/// One response: a page as the timeline gave it (encoded straight from
/// there, without a copy of its own), or any other message.
enum Answer {
    /// `page` is exactly `BLCKSZ` bytes.
    Page {
        id: u64,
        page: Bytes,
    },
    Other(ServerMessage),
}

impl From<ServerMessage> for Answer {
    fn from(msg: ServerMessage) -> Answer {
        Answer::Other(msg)
    }
}

/// Answers a batch of requests in order.
fn answer(tl: &Timeline, requests: Vec<PageRequest>, lsns: &HashMap<Lsn, Resolved>) -> Vec<Answer> {
    let mut out: Vec<Option<Answer>> = requests.iter().map(|_| None).collect();
    let lsn_of =
        |r: &PageRequest| lsns.get(&r.lsn()).cloned().unwrap_or(Err((ErrorCode::Internal, "LSN not resolved".into())));
    // Runs of GetPage at one LSN: check sizes, then one batched lookup.
    let mut i = 0;
    while i < requests.len() {
        let PageRequest::GetPage { lsn: first_lsn, .. } = requests[i] else {
            out[i] = Some(answer_one(tl, &requests[i], lsn_of(&requests[i])).into());
            i += 1;
            continue;
        };
        let mut j = i;
        while j < requests.len() && matches!(requests[j], PageRequest::GetPage { lsn, .. } if lsn == first_lsn) {
            j += 1;
        }
        match lsn_of(&requests[i]) {
            Err((code, message)) => {
                for k in i..j {
                    out[k] = Some(ServerMessage::Error { id: requests[k].id(), code, message: message.clone() }.into());
                }
            }
            Ok(lsn) => {
                let mut sizes: HashMap<RelTag, Result<Option<u32>, (ErrorCode, String)>> = HashMap::new();
                let mut keys = Vec::new();
                let mut slots = Vec::new();
                for k in i..j {
                    let PageRequest::GetPage { id, rel, fork, block, .. } = requests[k] else { unreachable!() };
                    let tag = RelTag { rel, fork };
                    if !tl.shard.owns_block(rel.rel, fork, block) {
                        out[k] = Some(wrong_shard(tl, id, format!("block {block} of {tag}")).into());
                        continue;
                    }
                    let size = sizes
                        .entry(tag)
                        .or_insert_with(|| tl.rel_size(tag, lsn).map_err(|e| (read_error_code(tl, &e), e.to_string())));
                    match size {
                        Ok(Some(n)) if block < *n => {
                            keys.push(Key::rel_block(tag, block));
                            slots.push((k, id));
                        }
                        Ok(Some(n)) => {
                            let message = format!("block {block} of {tag} is beyond its {n} blocks at {lsn}");
                            out[k] = Some(ServerMessage::Error { id, code: ErrorCode::NotFound, message }.into());
                        }
                        Ok(None) => {
                            let message = format!("relation {tag} does not exist at {lsn}");
                            out[k] = Some(ServerMessage::Error { id, code: ErrorCode::NotFound, message }.into());
                        }
                        Err((code, message)) => {
                            out[k] = Some(ServerMessage::Error { id, code: *code, message: message.clone() }.into())
                        }
                    }
                }
                tl.metrics.getpage_requests.inc_by((j - i) as u64);
                tl.metrics.getpage_batches.inc();
                tl.metrics.getpage_batch_size.observe(keys.len() as f64);
                for ((k, id), r) in slots.into_iter().zip(tl.get_many(&keys, lsn)) {
                    out[k] = Some(match r {
                        Ok(Some(page)) if page.len() == BLCKSZ => Answer::Page { id, page },
                        Ok(Some(page)) => Answer::Other(ServerMessage::Error {
                            id,
                            code: ErrorCode::Corrupt,
                            message: format!("a page of {} bytes", page.len()),
                        }),
                        Ok(None) => Answer::Page { id, page: Bytes::from_static(&ZERO_PAGE) },
                        Err(e) => Answer::Other(ServerMessage::Error {
                            id,
                            code: read_error_code(tl, &e),
                            message: e.to_string(),
                        }),
                    });
                }
            }
        }
        i = j;
    }
    out.into_iter().map(|m| m.expect("every request answered")).collect()
}

/// The answer to a request for what another shard of the tenant holds.
fn wrong_shard(tl: &Timeline, id: u64, what: String) -> ServerMessage {
    let message = format!("{what} is not stored on shard {} (docs/sharding.md)", tl.tenant_id);
    ServerMessage::Error { id, code: ErrorCode::WrongShard, message }
}

fn answer_one(tl: &Timeline, req: &PageRequest, lsn: Resolved) -> ServerMessage {
    let id = req.id();
    let lsn = match lsn {
        Ok(l) => l,
        Err((code, message)) => return ServerMessage::Error { id, code, message },
    };
    let result: Result<ServerMessage, ReadError> = (|| {
        Ok(match *req {
            PageRequest::GetPage { .. } => unreachable!("batched"),
            PageRequest::RelExists { rel, fork, .. } => {
                ServerMessage::Exists { id, exists: tl.rel_size(RelTag { rel, fork }, lsn)?.is_some() }
            }
            PageRequest::RelSize { rel, fork, .. } => match tl.rel_size(RelTag { rel, fork }, lsn)? {
                Some(blocks) => ServerMessage::Size { id, blocks },
                None => {
                    return Err(ReadError::NotFound(format!(
                        "relation {} does not exist at {lsn}",
                        RelTag { rel, fork }
                    )))
                }
            },
            PageRequest::DbSize { spc, db, .. } => {
                if !tl.db_dir(lsn)?.contains(&(spc, db)) {
                    return Err(ReadError::NotFound(format!("database {spc}/{db} does not exist at {lsn}")));
                }
                ServerMessage::DbSize { id, bytes: tl.db_size(spc, db, lsn)? }
            }
            PageRequest::SlruSegment { kind, segno, .. } => {
                if !tl.shard.is_home() {
                    return Ok(wrong_shard(tl, id, format!("{kind} segment {segno:04X}")));
                }
                if !tl.slru_segments(kind, lsn)?.contains(&segno) {
                    return Err(ReadError::NotFound(format!("{kind} segment {segno:04X} does not exist at {lsn}")));
                }
                ServerMessage::Segment { id, data: crate::basebackup::slru_segment(tl, kind, segno, lsn)? }
            }
        })
    })();
    result.unwrap_or_else(|e| ServerMessage::Error { id, code: read_error_code(tl, &e), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limit: usize) -> (Arc<TenantConnections>, Gauge, Gauge) {
        let (connected, at_limit) = (Gauge::default(), Gauge::default());
        (Arc::new(TenantConnections::new(limit, connected.clone(), at_limit.clone())), connected, at_limit)
    }

    #[test]
    fn each_tenant_holds_at_most_its_limit_until_a_connection_closes() {
        let (places, connected, at_limit) = limiter(2);
        let (a, b) = (
            TenantShardId::unsharded(strata_protocol::TenantId([1; 16])),
            TenantShardId::unsharded(strata_protocol::TenantId([2; 16])),
        );
        let a1 = places.open(a).unwrap();
        let a2 = places.open(a).unwrap();
        assert_eq!((places.open_of(a), connected.get(), at_limit.get()), (2, 1, 1));
        let refused = places.open(a).err().expect("a third connection of a is refused");
        assert_eq!(refused, TenantAtLimit { tenant: a, limit: 2 });
        let text = refused.to_string();
        assert!(text.contains("too many connections for tenant") && text.contains(&a.to_string()), "{text}");
        // A refusal takes no place.
        assert_eq!(places.open_of(a), 2);
        // Another tenant is not held back by a's.
        let b1 = places.open(b).unwrap();
        assert_eq!((places.tenants(), connected.get(), at_limit.get()), (2, 2, 1));
        drop(a1);
        assert_eq!((places.open_of(a), at_limit.get()), (1, 0));
        let a3 = places.open(a).unwrap();
        assert_eq!((places.open_of(a), at_limit.get()), (2, 1));
        drop((a2, a3, b1));
        assert_eq!((places.tenants(), connected.get(), at_limit.get()), (0, 0, 0));
    }

    #[test]
    fn tenants_that_left_leave_no_entry() {
        let (places, connected, _) = limiter(3);
        for i in 0..1000u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            let tenant = TenantShardId::unsharded(strata_protocol::TenantId(id));
            let held: Vec<_> = (0..3).map(|_| places.open(tenant).unwrap()).collect();
            assert!(places.open(tenant).is_err());
            assert_eq!(places.tenants(), 1);
            drop(held);
            assert_eq!((places.tenants(), places.open_of(tenant)), (0, 0));
        }
        assert_eq!(connected.get(), 0);
    }

    #[test]
    fn places_are_given_back_from_any_thread() {
        let (places, connected, at_limit) = limiter(4);
        let tenant = TenantShardId::unsharded(strata_protocol::TenantId([7; 16]));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if let Ok(place) = places.open(tenant) {
                            assert!(places.open_of(tenant) <= 4);
                            drop(place);
                        }
                    }
                });
            }
        });
        assert_eq!((places.tenants(), connected.get(), at_limit.get()), (0, 0, 0));
    }

    #[test]
    fn a_limit_of_zero_still_admits_one() {
        let (places, _, at_limit) = limiter(0);
        let tenant = TenantShardId::unsharded(strata_protocol::TenantId([3; 16]));
        let only = places.open(tenant).unwrap();
        assert_eq!(at_limit.get(), 1);
        assert!(places.open(tenant).is_err());
        drop(only);
        assert!(places.open(tenant).is_ok());
    }
}
