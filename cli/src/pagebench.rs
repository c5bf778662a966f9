//! `strata pagebench`: GetPage@LSN load against a pageserver.
//!
//! It asks the size of each relation once, then reads random blocks of them
//! from several connections, each keeping a fixed number of requests in
//! flight, and reports throughput and latency percentiles. With
//! `--loopback-baseline` the pageserver is replaced by an in-process server
//! that answers every GetPage frame with a prebuilt page frame, without
//! looking anything up: the best a GetPage round trip through this client
//! and the loopback network can do on this machine, to judge the
//! pageserver's numbers against.

use crate::out::{errln, outln};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use strata_service::auth::{read_token, Token};
use strata_service::tls::ClientTls;

use clap::Args;
use fastrand::Rng;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::time::Instant;

use strata_compute::page_client::{PageClient, PageClientConfig, PageClientError};
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::Lsn;
use strata_protocol::framed::FrameReader;
use strata_protocol::pageserver::codec::{self, GET_PAGE_LEN};
use strata_protocol::pageserver::{PageRequest, ServerMessage, MAX_PIPELINE_DEPTH, PAGE_SIZE};
use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantId, TenantShardId, TimelineId};

/// Options of `strata pagebench`.
#[derive(Args, Debug)]
pub struct PagebenchArgs {
    /// Page service address of the pageserver (host:port); of a sharded
    /// tenant, one per shard in shard order.
    #[arg(long, value_name = "HOST:PORT", required_unless_present = "loopback_baseline")]
    pageserver: Vec<String>,
    /// The tenant's shard count (`docs/sharding.md`): each page is read
    /// from the shard that holds it, every shard loaded at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    shards: u32,
    /// The sharded tenant's stripe, in blocks.
    #[arg(long, value_name = "BLOCKS", default_value_t = strata_protocol::shard::DEFAULT_STRIPE_BLOCKS)]
    stripe_blocks: u32,
    /// The tenant (32 hex digits).
    #[arg(long, required_unless_present = "loopback_baseline")]
    tenant_id: Option<TenantId>,
    /// The timeline whose pages are read (32 hex digits).
    #[arg(long, required_unless_present = "loopback_baseline")]
    timeline_id: Option<TimelineId>,
    /// A relation to read, as tablespace/database/relfilenode (e.g.
    /// 1663/5/16384); repeat for several. Blocks are drawn uniformly over all.
    #[arg(long = "rel", value_name = "SPC/DB/REL", value_parser = parse_rel, required_unless_present = "loopback_baseline")]
    rels: Vec<RelFileNode>,
    /// Connections (to each shard), each served by its own task.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    connections: u32,
    /// Requests kept in flight on each connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_PIPELINE_DEPTH as i64))]
    depth: u32,
    /// Seconds of load (fractions allowed).
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = parse_duration)]
    duration: f64,
    /// Read pages as of this LSN; 0/0 means the latest ingested one.
    #[arg(long, value_name = "X/Y", default_value = "0/0")]
    lsn: Lsn,
    /// A file holding a token for the tenant (`strata auth token --scope
    /// tenant`), for a pageserver that checks them (`docs/security.md`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// The cluster CA's certificate, for a page service that speaks TLS
    /// (`docs/security.md`).
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<std::path::PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Measure against an in-process loopback server instead of a
    /// pageserver: the ideal limit of a GetPage round trip here.
    #[arg(long)]
    loopback_baseline: bool,
    /// The loopback baseline over TLS (a throwaway CA and certificate, the
    /// page service's TLS settings): what TLS alone costs a round trip here.
    #[arg(long, requires = "loopback_baseline")]
    loopback_tls: bool,
}

/// `SPC/DB/REL`, three unsigned 32-bit numbers.
fn parse_rel(s: &str) -> Result<RelFileNode, String> {
    let bad = || format!("invalid relation {s:?}: expected SPC/DB/REL, three numbers such as 1663/5/16384");
    let mut parts = s.split('/').map(|p| p.parse::<u32>().map_err(|_| bad()));
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(spc), Some(db), Some(rel), None) => Ok(RelFileNode { spc: spc?, db: db?, rel: rel? }),
        _ => Err(bad()),
    }
}

fn parse_duration(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 1e6 => Ok(secs),
        _ => Err(format!("invalid duration {s:?}: expected a positive number of seconds")),
    }
}

/// Runs the benchmark; the exit code is 0 when every request succeeded.
pub fn run(args: PagebenchArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            errln!("strata pagebench: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(bench(&args)) {
        Ok(report) => {
            if args.json {
                outln!("{}", report.json());
            } else {
                crate::out::print(format_args!("{}", report.text()));
            }
            if report.errors == 0 && report.requests > 0 {
                0
            } else {
                1
            }
        }
        Err(e) => {
            errln!("strata pagebench: {e}");
            1
        }
    }
}

// ---------------------------------------------------------------------------
// The load
// ---------------------------------------------------------------------------

/// Blocks of the loopback baseline's pretend relation (1 GiB).
const LOOPBACK_BLOCKS: u32 = 1 << 17;

/// Where the load goes and what it reads.
struct Target {
    timeline_id: TimelineId,
    lsn: Lsn,
    /// Relations with blocks, each with the global index of its first block.
    rels: Vec<(u64, RelFileNode)>,
    total_blocks: u64,
    /// Each shard (one when unsharded) with the blocks it holds.
    shards: Vec<ShardTarget>,
    token: Option<Token>,
    tls: Option<ClientTls>,
}

/// One shard's page service and the blocks of the relations it holds, as
/// runs of global block indexes.
struct ShardTarget {
    id: TenantShardId,
    addr: String,
    /// (offset among this shard's blocks, first global index, length).
    runs: Vec<(u64, u64, u64)>,
    blocks: u64,
}

impl ShardTarget {
    /// The global index of this shard's `k`-th block (`k` below `blocks`).
    fn global(&self, k: u64) -> u64 {
        let pos = self.runs.partition_point(|&(offset, _, _)| offset <= k).saturating_sub(1);
        let (offset, start, _) = self.runs[pos];
        start + (k - offset)
    }
}

impl Target {
    /// The block with global index `i` (below `total_blocks`).
    fn block(&self, i: u64) -> (RelFileNode, u32) {
        let pos = self.rels.partition_point(|&(start, _)| start <= i).saturating_sub(1);
        let (start, rel) = self.rels[pos];
        // Each relation has fewer than 2^32 blocks.
        (rel, (i - start) as u32)
    }
}

/// Runs of blocks, `(offset among the shard's blocks, first global index,
/// length)`, with the shard's total.
type Runs = (Vec<(u64, u64, u64)>, u64);

/// The blocks of `rels` (each `(first global index, relation, blocks)`)
/// each shard of `layout` holds, stripe by stripe.
fn shard_runs(layout: ShardLayout, rels: &[(u64, RelFileNode, u32)]) -> Vec<Runs> {
    let mut out = vec![(Vec::new(), 0u64); usize::from(layout.count)];
    for &(start, rel, blocks) in rels {
        let mut b = 0u32;
        while b < blocks {
            // A stripe (the whole relation when unsharded) goes to one shard.
            let len = if layout.is_sharded() {
                (layout.stripe_blocks - b % layout.stripe_blocks).min(blocks - b)
            } else {
                blocks
            };
            let (runs, total) = &mut out[usize::from(layout.shard_of_block(rel.rel, ForkNumber::Main, b))];
            runs.push((*total, start + u64::from(b), u64::from(len)));
            *total += u64::from(len);
            b += len;
        }
    }
    out
}

/// What one connection's task measured.
#[derive(Default)]
struct WorkerStats {
    histogram: Histogram,
    errors: u64,
    first_error: Option<String>,
}

impl WorkerStats {
    fn error(&mut self, count: u64, what: impl FnOnce() -> String) {
        self.errors += count;
        if self.first_error.is_none() {
            self.first_error = Some(what());
        }
    }
}

fn client_config(depth: u32, token: &Option<Token>, tls: &Option<ClientTls>) -> PageClientConfig {
    PageClientConfig {
        max_in_flight: depth as usize,
        token: token.clone(),
        tls: tls.clone(),
        ..PageClientConfig::default()
    }
}

async fn bench(args: &PagebenchArgs) -> Result<Report, String> {
    let target = if args.loopback_baseline {
        let (server_tls, client_tls) = if args.loopback_tls {
            let (ca, ca_key) = strata_service::tls::generate_ca().map_err(|e| e.to_string())?;
            let (cert, key) =
                strata_service::tls::issue(&ca_key, &["127.0.0.1".to_string()]).map_err(|e| e.to_string())?;
            let what = std::path::Path::new("(loopback baseline)");
            let server = strata_service::tls::ServerTls::from_pem(cert.as_bytes(), key.as_bytes(), what)
                .map_err(|e| e.to_string())?;
            (Some(server), Some(ClientTls::from_pem(ca.as_bytes(), what).map_err(|e| e.to_string())?))
        } else {
            (None, None)
        };
        let addr = start_loopback_server(server_tls).await.map_err(|e| format!("starting the loopback server: {e}"))?;
        let rel = RelFileNode { spc: 1663, db: 1, rel: 1 };
        let blocks = u64::from(LOOPBACK_BLOCKS);
        Target {
            timeline_id: TimelineId::default(),
            lsn: args.lsn,
            rels: vec![(0, rel)],
            total_blocks: blocks,
            shards: vec![ShardTarget {
                id: TenantShardId::default(),
                addr: addr.to_string(),
                runs: vec![(0, 0, blocks)],
                blocks,
            }],
            token: None,
            tls: client_tls,
        }
    } else {
        prepare(args).await?
    };
    let target = Arc::new(target);

    // Connect everything first so that the timed part is only load: each
    // connection to each shard that holds blocks of the relations.
    let mut connecting = Vec::new();
    for _ in 0..args.connections {
        for (s, shard) in target.shards.iter().enumerate().filter(|(_, sh)| sh.blocks > 0) {
            let t = Arc::clone(&target);
            let (depth, addr, id) = (args.depth, shard.addr.clone(), shard.id);
            connecting.push((
                s,
                tokio::spawn(async move {
                    PageClient::connect(&addr, id, t.timeline_id, client_config(depth, &t.token, &t.tls)).await
                }),
            ));
        }
    }
    let mut clients = Vec::new();
    for (s, c) in connecting {
        let client = c.await.map_err(|e| format!("connecting: {e}"))?;
        clients.push((s, client.map_err(|e| format!("{}: {e}", target.shards[s].addr))?));
    }

    let duration = Duration::from_secs_f64(args.duration);
    let start = Instant::now();
    let deadline = start + duration;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut workers = Vec::new();
    for (i, (shard, client)) in clients.into_iter().enumerate() {
        let t = Arc::clone(&target);
        let rng = Rng::with_seed(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        workers.push(tokio::spawn(worker(t, shard, client, args.depth as usize, deadline, rng)));
    }
    let mut total = WorkerStats::default();
    for w in workers {
        match w.await {
            Ok(stats) => {
                total.histogram.merge(&stats.histogram);
                if let Some(e) = stats.first_error {
                    total.error(stats.errors, || e);
                }
            }
            Err(e) => total.error(1, || format!("a connection task failed: {e}")),
        }
    }
    let elapsed = start.elapsed();
    if let Some(e) = &total.first_error {
        errln!("strata pagebench: {} errors; the first: {e}", total.errors);
    }
    Ok(Report {
        loopback: args.loopback_baseline,
        addr: target.shards.iter().map(|s| s.addr.as_str()).collect::<Vec<_>>().join(","),
        connections: args.connections,
        depth: args.depth,
        lsn: target.lsn,
        relations: target.rels.len(),
        blocks: target.total_blocks,
        elapsed,
        requests: total.histogram.count(),
        errors: total.errors,
        histogram: total.histogram,
    })
}

/// Checks the pageserver's address and asks the size of every relation.
async fn prepare(args: &PagebenchArgs) -> Result<Target, String> {
    let (Some(addr), Some(tenant_id), Some(timeline_id)) = (args.pageserver.first(), args.tenant_id, args.timeline_id)
    else {
        return Err("--pageserver, --tenant-id and --timeline-id are required".into());
    };
    if args.rels.is_empty() {
        return Err("at least one --rel is required".into());
    }
    let layout = ShardLayout::new(args.shards, args.stripe_blocks)
        .map_err(|e| format!("--shards {} --stripe-blocks {}: {e}", args.shards, args.stripe_blocks))?;
    if args.pageserver.len() != usize::from(layout.count) {
        return Err(format!(
            "{} shards need {} --pageserver addresses (one per shard, in shard order), not {}",
            layout.count,
            layout.count,
            args.pageserver.len()
        ));
    }
    let ids: Vec<TenantShardId> = layout.shards().map(|shard| TenantShardId { tenant: tenant_id, shard }).collect();
    let token = args.token_file.as_deref().map(read_token).transpose().map_err(|e| e.to_string())?;
    let tls = args.tls_ca.as_deref().map(ClientTls::load).transpose().map_err(|e| e.to_string())?;
    // Sizes are answered by every shard; shard 0 is asked.
    let mut client = PageClient::connect(addr, ids[0], timeline_id, client_config(1, &token, &tls))
        .await
        .map_err(|e| e.to_string())?;
    let mut rels = Vec::new();
    let mut sized = Vec::new();
    let mut total_blocks = 0u64;
    for &rel in &args.rels {
        let blocks = client
            .rel_size(args.lsn, rel, ForkNumber::Main)
            .await
            .map_err(|e| format!("size of relation {rel}: {e}"))?;
        if blocks == 0 {
            errln!("strata pagebench: relation {rel} is empty at {}; skipping it", lsn_text(args.lsn));
            continue;
        }
        rels.push((total_blocks, rel));
        sized.push((total_blocks, rel, blocks));
        total_blocks += u64::from(blocks);
    }
    if total_blocks == 0 {
        return Err("no block to read: every relation is empty".into());
    }
    let shards = shard_runs(layout, &sized)
        .into_iter()
        .zip(ids.into_iter().zip(&args.pageserver))
        .map(|((runs, blocks), (id, addr))| ShardTarget { id, addr: addr.clone(), runs, blocks })
        .collect();
    Ok(Target { timeline_id, lsn: args.lsn, rels, total_blocks, shards, token, tls })
}

/// One connection's load: keeps `depth` random GetPage requests in flight
/// until `deadline`, then collects the answers still due. Reconnects after
/// a failure.
async fn worker(
    target: Arc<Target>,
    shard: usize,
    client: PageClient,
    depth: usize,
    deadline: Instant,
    mut rng: Rng,
) -> WorkerStats {
    let mut stats = WorkerStats::default();
    let mut client = Some(client);
    while Instant::now() < deadline {
        let mut c = match client.take() {
            Some(c) => c,
            None => match PageClient::connect(
                &target.shards[shard].addr,
                target.shards[shard].id,
                target.timeline_id,
                client_config(depth as u32, &target.token, &target.tls),
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    stats.error(1, || format!("reconnecting: {e}"));
                    tokio::time::sleep(crate::limits::PAGEBENCH_RECONNECT_PAUSE).await;
                    continue;
                }
            },
        };
        let mut sent_at = VecDeque::with_capacity(depth);
        match load(&target, shard, &mut c, depth, deadline, &mut rng, &mut sent_at, &mut stats).await {
            Ok(()) => break,
            // Requests in flight on a failed connection are lost.
            Err(e) => stats.error(sent_at.len().max(1) as u64, || e.to_string()),
        }
    }
    stats
}

#[allow(clippy::too_many_arguments)]
async fn load(
    target: &Target,
    shard: usize,
    client: &mut PageClient,
    depth: usize,
    deadline: Instant,
    rng: &mut Rng,
    sent_at: &mut VecDeque<Instant>,
    stats: &mut WorkerStats,
) -> Result<(), PageClientError> {
    loop {
        let now = Instant::now();
        if now < deadline {
            while client.in_flight() < depth {
                // A block of this connection's shard.
                let own = &target.shards[shard];
                let (rel, block) = target.block(own.global(rng.u64(..own.blocks)));
                client.queue(PageRequest::GetPage { id: 0, lsn: target.lsn, rel, fork: ForkNumber::Main, block })?;
                sent_at.push_back(now);
            }
        } else if client.in_flight() == 0 {
            return Ok(());
        }
        let msg = client.recv().await?;
        let sent = sent_at.pop_front().unwrap_or(now);
        match msg {
            ServerMessage::Page { .. } => stats.histogram.record(sent.elapsed().as_nanos() as u64),
            ServerMessage::Error { code, message, .. } => stats.error(1, || format!("{code:?}: {message}")),
            other => stats.error(1, || format!("unexpected {}", other.name())),
        }
    }
}

// ---------------------------------------------------------------------------
// The loopback baseline
// ---------------------------------------------------------------------------

/// Starts the loopback server on an ephemeral port of 127.0.0.1, over TLS
/// with `tls`.
async fn start_loopback_server(tls: Option<strata_service::tls::ServerTls>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => loopback_connection(strata_service::tls::Stream::Plain(stream)).await,
                    Some(tls) => {
                        if let Ok(s) = tls.accept(stream).await {
                            loopback_connection(strata_service::tls::Stream::Tls(Box::new(s.into()))).await
                        }
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Serves one loopback connection: a hello gets a `HelloOk`, every
/// GetPage-sized frame a page frame carrying the request's id; anything else
/// closes the connection. All answers to one read go out in one write, as a
/// batching server would send them.
async fn loopback_connection(stream: strata_service::tls::Stream) {
    let mut page_frame = Vec::new();
    codec::encode_page(1, &[0x5A; PAGE_SIZE], &mut page_frame);
    let mut frames = FrameReader::new(stream, codec::MAX_FRAME_SIZE);
    let mut out: Vec<u8> = Vec::new();
    loop {
        let Ok(first) = frames.read_frame(crate::limits::LOOPBACK_IDLE_TIMEOUT).await else { return };
        if !loopback_answer(first, &page_frame, &mut out) {
            return;
        }
        // Everything already received is answered in the same write.
        loop {
            match frames.buffered_frame() {
                Ok(Some(frame)) => {
                    if !loopback_answer(frame, &page_frame, &mut out) {
                        return;
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        if frames.get_mut().write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
}

/// Appends the loopback answer to one frame; false for a frame it does not serve.
fn loopback_answer(frame: &[u8], page_frame: &[u8], out: &mut Vec<u8>) -> bool {
    // The id follows the length and the tag.
    let id_at = codec::LENGTH_SIZE + 1;
    if frame[0] == codec::tag::HELLO {
        codec::encode_server(&ServerMessage::HelloOk { last_record_lsn: Lsn(1) }, out);
    } else if frame.len() == GET_PAGE_LEN {
        let at = out.len();
        out.extend_from_slice(page_frame);
        out[at + id_at..at + id_at + 8].copy_from_slice(&frame[1..9]);
    } else {
        return false;
    }
    true
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// Everything measured in one run.
struct Report {
    loopback: bool,
    addr: String,
    connections: u32,
    depth: u32,
    lsn: Lsn,
    relations: usize,
    blocks: u64,
    elapsed: Duration,
    requests: u64,
    errors: u64,
    histogram: Histogram,
}

impl Report {
    fn requests_per_s(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// Page payload received, in decimal megabytes per second.
    fn mb_per_s(&self) -> f64 {
        self.requests_per_s() * PAGE_SIZE as f64 / 1e6
    }

    /// Latency at quantile `q` in microseconds.
    fn us(&self, q: f64) -> f64 {
        self.histogram.percentile(q) as f64 / 1e3
    }

    fn text(&self) -> String {
        let mut s = String::new();
        let what = if self.loopback {
            format!("loopback baseline (in-process server at {})", self.addr)
        } else {
            format!(
                "pageserver {}, {} relations ({} blocks) at LSN {}",
                self.addr,
                self.relations,
                self.blocks,
                lsn_text(self.lsn)
            )
        };
        let _ = writeln!(s, "pagebench: {what}");
        let _ = writeln!(
            s,
            "  {} connections × depth {}, {:.2} s",
            self.connections,
            self.depth,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "  requests {} ({:.1}/s), {:.1} MB/s, errors {}",
            self.requests,
            self.requests_per_s(),
            self.mb_per_s(),
            self.errors
        );
        let _ = writeln!(
            s,
            "  latency µs: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  mean {:.1}",
            self.us(0.5),
            self.us(0.9),
            self.us(0.99),
            self.us(0.999),
            self.histogram.max() as f64 / 1e3,
            self.histogram.mean() / 1e3
        );
        s
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": if self.loopback { "loopback" } else { "pageserver" },
            "address": self.addr,
            "connections": self.connections,
            "depth": self.depth,
            "lsn": self.lsn.to_string(),
            "relations": self.relations,
            "blocks": self.blocks,
            "duration_s": self.elapsed.as_secs_f64(),
            "requests": self.requests,
            "errors": self.errors,
            "requests_per_s": self.requests_per_s(),
            "mb_per_s": self.mb_per_s(),
            "latency_us": {
                "p50": self.us(0.5),
                "p90": self.us(0.9),
                "p99": self.us(0.99),
                "p99_9": self.us(0.999),
                "max": self.histogram.max() as f64 / 1e3,
                "mean": self.histogram.mean() / 1e3,
            },
        })
    }
}

fn lsn_text(lsn: Lsn) -> String {
    if lsn == Lsn::INVALID {
        "latest".into()
    } else {
        lsn.to_string()
    }
}

/// Bits of sub-bucket precision: each power-of-two range of values is cut
/// into 2^7 buckets, so a reported value is within 1/128 (0.8 %) of a
/// recorded one, and values below 256 are exact.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS + 1) as usize) << SUB_BITS;

/// A histogram of `u64` values in logarithmic buckets with linear
/// sub-buckets: constant memory, constant-time recording, bounded relative
/// error over the whole `u64` range.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { counts: vec![0; BUCKETS], total: 0, min: u64::MAX, max: 0, sum: 0 }
    }
}

impl Histogram {
    /// The bucket of `v`. Below `2 * SUB` every value has its own bucket;
    /// above, the top `SUB_BITS + 1` bits of the value pick it.
    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        ((u64::from(shift) + 1) * SUB + (v >> shift) - SUB) as usize
    }

    /// The smallest and largest value of bucket `i`.
    fn bounds(i: usize) -> (u64, u64) {
        let i = i as u64;
        if i < 2 * SUB {
            return (i, i);
        }
        let shift = i / SUB - 1;
        let low = (i % SUB + SUB) << shift;
        (low, low + ((1u64 << shift) - 1))
    }

    /// Adds one value.
    pub fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The largest value recorded (0 if none).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The mean of the values recorded (0 if none).
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value below or at which a fraction `q` (0 to 1) of the recorded
    /// values lie: the upper end of the bucket holding that rank, never more
    /// than the maximum. 0 if nothing was recorded.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = Self::bounds(i);
                return high.min(self.max).max(low);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PagebenchArgs,
    }

    fn parse(argv: &[&str]) -> Result<PagebenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("pagebench").chain(argv.iter().copied())).map(|c| c.args)
    }

    const TENANT: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn rel_arguments() {
        assert_eq!(parse_rel("1663/5/16384"), Ok(RelFileNode { spc: 1663, db: 5, rel: 16384 }));
        assert_eq!(parse_rel("0/0/4294967295"), Ok(RelFileNode { spc: 0, db: 0, rel: u32::MAX }));
        for bad in ["", "1663/5", "1663/5/16384/1", "a/5/1", "1663//1", "1663/5/4294967296", " 1/2/3", "-1/2/3"] {
            assert!(parse_rel(bad).is_err(), "{bad:?}");
        }
        let args = parse(&[
            "--pageserver",
            "127.0.0.1:6400",
            "--tenant-id",
            TENANT,
            "--timeline-id",
            TENANT,
            "--rel",
            "1663/5/16384",
            "--rel",
            "1663/5/16390",
            "--depth",
            "8",
            "--lsn",
            "0/16B3748",
            "--json",
        ])
        .unwrap();
        assert_eq!(args.rels.len(), 2);
        assert_eq!(args.rels[1], RelFileNode { spc: 1663, db: 5, rel: 16390 });
        assert_eq!((args.connections, args.depth, args.duration, args.json), (1, 8, 10.0, true));
        assert_eq!(args.lsn, Lsn(0x016B_3748));
        assert!(!args.loopback_baseline);
    }

    #[test]
    fn argument_rules() {
        // Without a pageserver everything is required, with the loopback nothing.
        assert!(parse(&["--pageserver", "h:1", "--tenant-id", TENANT, "--timeline-id", TENANT]).is_err());
        let args = parse(&["--loopback-baseline", "--connections", "4", "--duration", "0.5"]).unwrap();
        assert_eq!((args.connections, args.duration, args.lsn), (4, 0.5, Lsn::INVALID));
        assert!(parse(&["--loopback-baseline", "--depth", "0"]).is_err());
        assert!(parse(&["--loopback-baseline", "--depth", "129"]).is_err());
        assert!(parse(&["--loopback-baseline", "--duration", "0"]).is_err());
        assert!(parse(&["--loopback-baseline", "--duration", "nan"]).is_err());
        assert!(parse(&["--loopback-baseline", "--rel", "1/2"]).is_err());
        assert!(parse(&["--loopback-baseline", "--lsn", "16B3748"]).is_err());
    }

    #[test]
    fn each_shard_is_given_exactly_the_blocks_it_holds() {
        let user = RelFileNode { spc: 1663, db: 5, rel: 16390 };
        let catalog = RelFileNode { spc: 1663, db: 5, rel: 1259 };
        let rels = [(0, user, 100), (100, catalog, 30), (130, RelFileNode { rel: 16400, ..user }, 9)];
        let layout = ShardLayout::new(4, 8).unwrap();
        let shards = shard_runs(layout, &rels);
        let mut seen = vec![None; 139];
        for (s, (runs, blocks)) in shards.iter().enumerate() {
            let shard =
                ShardTarget { id: TenantShardId::default(), addr: String::new(), runs: runs.clone(), blocks: *blocks };
            for k in 0..*blocks {
                let g = shard.global(k);
                assert!(seen[g as usize].replace(s).is_none(), "block {g} twice");
            }
        }
        let target = Target {
            timeline_id: TimelineId::default(),
            lsn: Lsn::INVALID,
            rels: rels.iter().map(|&(start, rel, _)| (start, rel)).collect(),
            total_blocks: 139,
            shards: Vec::new(),
            token: None,
            tls: None,
        };
        for (g, owner) in seen.iter().enumerate() {
            let (rel, block) = target.block(g as u64);
            let want = layout.shard_of_block(rel.rel, ForkNumber::Main, block) as usize;
            assert_eq!(*owner, Some(want), "block {block} of {rel}");
        }
        // Unsharded: one run per relation, all on the one shard.
        let one = shard_runs(ShardLayout::UNSHARDED, &rels);
        assert_eq!(one, vec![(vec![(0, 0, 100), (100, 100, 30), (130, 130, 9)], 139)]);
    }

    #[test]
    fn histogram_buckets_cover_every_value() {
        let mut rng = Rng::with_seed(7);
        let mut previous_high = None;
        for i in 0..BUCKETS {
            let (low, high) = Histogram::bounds(i);
            // Buckets are contiguous and in order.
            if let Some(p) = previous_high {
                assert_eq!(low, p + 1, "bucket {i}");
            }
            previous_high = Some(high);
            assert_eq!(Histogram::index(low), i);
            assert_eq!(Histogram::index(high), i);
            // Relative width at most 1/128.
            assert!((high - low) as f64 <= low as f64 / SUB as f64, "bucket {i}: {low}..={high}");
        }
        assert_eq!(previous_high, Some(u64::MAX));
        for _ in 0..100_000 {
            let v = rng.u64(..) >> rng.u32(..64);
            let (low, high) = Histogram::bounds(Histogram::index(v));
            assert!(low <= v && v <= high);
        }
    }

    #[test]
    fn histogram_percentiles() {
        let mut h = Histogram::default();
        assert_eq!((h.percentile(0.5), h.max(), h.mean()), (0, 0, 0.0));
        for v in 1..=100 {
            h.record(v);
        }
        // Small values are exact.
        assert_eq!(h.percentile(0.5), 50);
        assert_eq!(h.percentile(0.9), 90);
        assert_eq!(h.percentile(0.99), 99);
        assert_eq!(h.percentile(0.999), 100);
        assert_eq!(h.percentile(1.0), 100);
        assert_eq!(h.percentile(0.0), 1);
        assert_eq!(h.mean(), 50.5);

        // Microsecond-scale latencies in nanoseconds: 990 fast, 9 slow, 1 very slow.
        let mut h = Histogram::default();
        for i in 0..990 {
            h.record(50_000 + i);
        }
        for _ in 0..9 {
            h.record(2_000_000);
        }
        h.record(40_000_000);
        let close = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 / 128.0;
        assert!(close(h.percentile(0.5), 50_499), "{}", h.percentile(0.5));
        assert!(close(h.percentile(0.99), 50_989), "{}", h.percentile(0.99));
        assert!(close(h.percentile(0.995), 2_000_000), "{}", h.percentile(0.995));
        assert!(close(h.percentile(0.999), 2_000_000), "{}", h.percentile(0.999));
        assert_eq!(h.percentile(1.0), 40_000_000);
        assert_eq!(h.max(), 40_000_000);

        // Merging equals recording everything in one.
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        let mut both = Histogram::default();
        for v in [3u64, 900, 70_000, 1 << 40] {
            a.record(v);
            both.record(v);
        }
        for v in [5u64, 1_000_000, u64::MAX] {
            b.record(v);
            both.record(v);
        }
        a.merge(&b);
        for q in [0.0, 0.3, 0.5, 0.9, 1.0] {
            assert_eq!(a.percentile(q), both.percentile(q));
        }
        assert_eq!((a.count(), a.max()), (7, u64::MAX));
    }

    #[test]
    fn blocks_are_mapped_to_relations() {
        let r = |rel| RelFileNode { spc: 1663, db: 5, rel };
        let target = Target {
            timeline_id: TimelineId::default(),
            lsn: Lsn::INVALID,
            rels: vec![(0, r(1)), (10, r(2)), (11, r(3))],
            total_blocks: 14,
            shards: Vec::new(),
            token: None,
            tls: None,
        };
        assert_eq!(target.block(0), (r(1), 0));
        assert_eq!(target.block(9), (r(1), 9));
        assert_eq!(target.block(10), (r(2), 0));
        assert_eq!(target.block(11), (r(3), 0));
        assert_eq!(target.block(13), (r(3), 2));
        let mut rng = Rng::with_seed(1);
        assert!((0..10_000).all(|_| rng.u64(..14) < 14));
    }

    #[test]
    fn loopback_baseline_runs() {
        let args = parse(&["--loopback-baseline", "--connections", "2", "--depth", "4", "--duration", "0.3"]).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let report = runtime.block_on(bench(&args)).unwrap();
        assert!(report.requests > 100, "{}", report.text());
        assert_eq!(report.errors, 0);
        // Over TLS too: the same answers through a handshake with a throwaway CA.
        let tls = parse(&["--loopback-baseline", "--loopback-tls", "--duration", "0.3"]).unwrap();
        let over_tls = runtime.block_on(bench(&tls)).unwrap();
        assert!(over_tls.requests > 100 && over_tls.errors == 0, "{}", over_tls.text());
        assert!(parse(&["--loopback-tls", "--duration", "1"]).is_err(), "--loopback-tls needs --loopback-baseline");
        assert!(report.histogram.percentile(0.5) > 0);
        let json = report.json();
        assert_eq!(json["mode"], "loopback");
        assert_eq!(json["requests"].as_u64(), Some(report.requests));
        assert!(json["latency_us"]["p99_9"].as_f64().unwrap() >= json["latency_us"]["p50"].as_f64().unwrap());
    }
}
