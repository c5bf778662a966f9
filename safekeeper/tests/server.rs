//! The safekeeper over TCP: timeline creation over HTTP, a proposer's
//! greeting/vote/election/appends, a consumer stream, restart recovery, and
//! bad input that gets an error and a closed connection while the server
//! keeps serving.

use std::net::SocketAddr;
use std::time::Duration;

use strata_protocol::framed::{FrameError, FrameReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use strata_formats::wal::encode::{encode_record, WalBuilder};
use strata_formats::{Lsn, PgVersion};
use strata_protocol::decoded_wal::{BatchDecoder, Entry, StreamFormat};
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::*;
use strata_protocol::shard::ShardIndex;
use strata_protocol::{TenantId, TimelineId};
use strata_safekeeper::config::SafekeeperConfig;
// The server runs on the real clock, so these tests time it on the real clock too.
use strata_service::clock::{Clock, SystemClock};

const SEG: u64 = 1 << 20;
const START: Lsn = Lsn(SEG * 2);

struct Running {
    addr: SocketAddr,
    http: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), strata_safekeeper::StartError>>,
}

async fn start(dir: &std::path::Path) -> Running {
    start_with(dir, "").await
}

/// Starts a safekeeper on free ports; `extra` is more of its TOML config.
async fn start_with(dir: &std::path::Path, extra: &str) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, http_addr) = (listener.local_addr().unwrap(), http.local_addr().unwrap());
    let config: SafekeeperConfig = toml::from_str(&format!(
        "id = 1\nlisten = \"{addr}\"\nlisten_http = \"{http_addr}\"\ndata_dir = {:?}\nidle_timeout = 10\n\
         max_send_bytes = 65536\n{extra}\n",
        dir.display().to_string()
    ))
    .unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(strata_safekeeper::serve(config, listener, http, None, async move {
        let _ = rx.await;
    }));
    Running { addr, http: http_addr, stop, task }
}

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    http_as(addr, method, path, body, None).await
}

/// An HTTP call carrying `token`, if any.
async fn http_as(addr: SocketAddr, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

struct Client {
    s: FrameReader<TcpStream>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client { s: FrameReader::new(TcpStream::connect(addr).await.unwrap(), codec::MAX_FRAME_SIZE) }
    }
    async fn send_raw(&mut self, bytes: &[u8]) {
        self.s.get_mut().write_all(bytes).await.unwrap();
    }
    async fn send(&mut self, msg: &ProposerMessage) {
        let mut out = Vec::new();
        codec::encode_proposer(msg, &mut out);
        self.send_raw(&out).await;
    }
    /// The next frame, or None if the server closed the connection.
    async fn frame(&mut self) -> Option<Vec<u8>> {
        match self.s.read_frame(Duration::from_secs(10)).await {
            Ok(f) => Some(f.to_vec()),
            Err(FrameError::Closed | FrameError::Io(_)) => None,
            Err(e) => panic!("{e}"),
        }
    }
    async fn reply(&mut self) -> AcceptorMessage {
        codec::decode_acceptor(&self.frame().await.expect("a reply")).unwrap()
    }
}

/// A consumer that has asked to stream the test timeline from `START` to
/// `stop_lsn` (`Lsn::INVALID`: on and on).
async fn consumer(addr: SocketAddr, stop_lsn: Lsn, name: &str) -> Client {
    stream_request(addr, stop_lsn, name, 0).await
}

/// A consumer of attachment generation `generation` (0: not a pageserver)
/// that has asked to stream the test timeline from `START` to `stop_lsn`.
async fn stream_request(addr: SocketAddr, stop_lsn: Lsn, name: &str, generation: u32) -> Client {
    shard_stream_request(addr, stop_lsn, name, generation, strata_protocol::shard::ShardIndex::UNSHARDED).await
}

/// A decoded stream of one shard (a tenant of 8-block stripes) from `START`.
async fn decoded_consumer(addr: SocketAddr, stop_lsn: Lsn, shard: ShardIndex) -> Client {
    let mut c = Client::connect(addr).await;
    let mut out = Vec::new();
    codec::encode_consumer(&ConsumerMessage::Start(decoded_request(stop_lsn, shard)), &mut out);
    c.send_raw(&out).await;
    c
}

fn decoded_request(stop_lsn: Lsn, shard: ShardIndex) -> StartStreaming {
    StartStreaming {
        protocol_version: PROTOCOL_VERSION,
        tenant_id: TenantId([5; 16]),
        timeline_id: TimelineId([6; 16]),
        start_lsn: START,
        stop_lsn,
        include_uncommitted: false,
        consumer_id: format!("decoded/{shard:?}"),
        token: None,
        generation: 0,
        shard,
        format: StreamFormat::Decoded,
        stripe_blocks: 8,
    }
}

/// A counter of the safekeeper's `/metrics`.
async fn metric(sk: &Running, name: &str) -> u64 {
    let (status, text) = http(sk.http, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}")) as u64
}

/// Reads a decoded stream to its end: its records' (start, end) LSNs,
/// checked to follow one another from `START`.
async fn read_decoded(c: &mut Client) -> Vec<(Lsn, Lsn)> {
    let mut decoder = BatchDecoder::new();
    let (mut at, mut records) = (START, Vec::new());
    while let Some(frame) = c.frame().await {
        match codec::decode_stream(&frame).unwrap() {
            StreamMessage::Decoded(d) => {
                assert_eq!(d.begin_lsn, at, "batches follow one another");
                for e in decoder.decode(&d.payload, d.batch_len as usize, d.crc32c, d.begin_lsn).unwrap() {
                    let Entry::Whole { lsn, end_lsn, raw } = e else { panic!("XLOG records go whole to every shard") };
                    assert!(lsn >= at && raw.len() >= 100, "{lsn} after {at}");
                    records.push((lsn, end_lsn));
                    at = end_lsn;
                }
                assert!(at <= d.end_lsn && d.end_lsn <= d.read_lsn);
                at = d.end_lsn;
            }
            StreamMessage::Start(_) | StreamMessage::Keepalive { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    records
}

/// [`stream_request`] for one shard of a sharded tenant.
async fn shard_stream_request(
    addr: SocketAddr,
    stop_lsn: Lsn,
    name: &str,
    generation: u32,
    shard: strata_protocol::shard::ShardIndex,
) -> Client {
    let mut c = Client::connect(addr).await;
    let mut out = Vec::new();
    codec::encode_consumer(
        &ConsumerMessage::Start(StartStreaming {
            protocol_version: PROTOCOL_VERSION,
            tenant_id: TenantId([5; 16]),
            timeline_id: TimelineId([6; 16]),
            start_lsn: START,
            stop_lsn,
            include_uncommitted: false,
            consumer_id: name.into(),
            token: None,
            generation,
            shard,
            format: strata_protocol::decoded_wal::StreamFormat::Raw,
            stripe_blocks: strata_protocol::shard::DEFAULT_STRIPE_BLOCKS,
        }),
        &mut out,
    );
    c.send_raw(&out).await;
    c
}

fn identity(system_id: u64) -> TimelineIdentity {
    TimelineIdentity {
        tenant_id: TenantId([5; 16]),
        timeline_id: TimelineId([6; 16]),
        system_id,
        pg_version: 15,
        wal_segment_size: SEG as u32,
    }
}

fn greeting(system_id: u64) -> ProposerMessage {
    ProposerMessage::Greeting(ProposerGreeting {
        protocol_version: PROTOCOL_VERSION,
        proposer_id: [9; 16],
        timeline: identity(system_id),
        membership: Default::default(),
        token: None,
    })
}

fn wal_bytes(n: usize) -> (Vec<u8>, Lsn) {
    let mut b = WalBuilder::new(PgVersion::V15, 77, 1, SEG, START, Lsn(0));
    for i in 0..n {
        let data = vec![i as u8; 100 + (i * 37) % 3000];
        b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &data));
    }
    wal_of(b)
}

/// The WAL a builder that started at `START` made, from `START` to its end.
fn wal_of(b: WalBuilder) -> (Vec<u8>, Lsn) {
    let end = b.end_lsn();
    let mut bytes = Vec::new();
    for (_, seg) in b.into_segments() {
        bytes.extend(seg);
    }
    (bytes[(START.0 - START.0 / SEG * SEG) as usize..(end.0 - START.0 / SEG * SEG) as usize].to_vec(), end)
}

/// Elects the proposer `p` in term 1 from `START`; the acceptor's answer.
async fn elect(p: &mut Client) -> AcceptorMessage {
    let history = TermHistory(vec![TermLsn { term: 1, lsn: START }]);
    p.send(&ProposerMessage::Elected(ProposerElected {
        term: 1,
        start_streaming_at: START,
        term_history: history,
        timeline_start_lsn: START,
    }))
    .await;
    p.reply().await
}

/// Sends `wal` (from `START` to `end`) in appends of `chunk` bytes back to
/// back, then an empty one that commits it all; the answers are left to
/// read. Answers where the appends' WAL ended.
async fn append_all(p: &mut Client, wal: &[u8], end: Lsn, chunk: usize) -> Lsn {
    let mut at = START;
    for piece in wal.chunks(chunk) {
        let req = AppendRequest { term: 1, begin_lsn: at, commit_lsn: at, truncate_lsn: START, wal: piece.to_vec() };
        at = req.end_lsn();
        p.send(&ProposerMessage::Append(req)).await;
    }
    p.send(&ProposerMessage::Append(AppendRequest {
        term: 1,
        begin_lsn: at,
        commit_lsn: end,
        truncate_lsn: START,
        wal: vec![],
    }))
    .await;
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposer_consumer_restart_and_bad_input() {
    let dir = std::env::temp_dir().join(format!("strata-sk-server-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start(&dir).await;
    let tl = format!("/v1/tenant/{}/timeline/{}", TenantId([5; 16]), TimelineId([6; 16]));
    let body = format!(r#"{{"system_id": 77, "pg_version": 15, "wal_segment_size": {SEG}, "start_lsn": "{START}"}}"#);
    assert_eq!(http(sk.http, "POST", &tl, &body).await.0, 201);
    assert_eq!(http(sk.http, "POST", &tl, &body).await.0, 200, "creating the same timeline again is a no-op");
    let other = body.replace("77", "78");
    assert_eq!(http(sk.http, "POST", &tl, &other).await.0, 409);
    assert_eq!(http(sk.http, "POST", &tl, "{").await.0, 400);

    // Garbage: an error and a closed connection.
    let mut bad = Client::connect(sk.addr).await;
    bad.send_raw(&[4, 0, 0, 0, 0x7f, 1, 2, 3]).await;
    assert!(matches!(bad.reply().await, AcceptorMessage::Error(_)));
    assert!(bad.frame().await.is_none());
    // Wrong system id.
    let mut wrong = Client::connect(sk.addr).await;
    wrong.send(&greeting(1234)).await;
    match wrong.reply().await {
        AcceptorMessage::Error(e) => assert_eq!(e.code, ErrorCode::Mismatch),
        other => panic!("{other:?}"),
    }
    // Unknown timeline.
    let mut unknown = Client::connect(sk.addr).await;
    let mut g = identity(77);
    g.tenant_id = TenantId([0xEE; 16]);
    unknown
        .send(&ProposerMessage::Greeting(ProposerGreeting {
            protocol_version: PROTOCOL_VERSION,
            proposer_id: [1; 16],
            timeline: g,
            membership: Default::default(),
            token: None,
        }))
        .await;
    match unknown.reply().await {
        AcceptorMessage::Error(e) => assert_eq!(e.code, ErrorCode::NotFound),
        other => panic!("{other:?}"),
    }

    // A proposer: greeting, vote, election, appends.
    let mut p = Client::connect(sk.addr).await;
    p.send(&greeting(77)).await;
    assert!(matches!(p.reply().await, AcceptorMessage::Greeting(AcceptorGreeting { term: 0, .. })));
    p.send(&ProposerMessage::VoteRequest(VoteRequest { term: 1 })).await;
    match p.reply().await {
        AcceptorMessage::VoteResponse(v) => {
            assert!(v.vote_given);
            assert_eq!(v.flush_lsn, START);
        }
        other => panic!("{other:?}"),
    }
    // Appends before the election are refused.
    let (wal, end) = wal_bytes(600);
    assert!(matches!(elect(&mut p).await, AcceptorMessage::AppendResponse(AppendResponse { term: 1, .. })));
    // Many appends sent back to back: acknowledged after (batched) flushes.
    let at = append_all(&mut p, &wal, end, 10_000).await;
    let mut flushed = START;
    let mut commit = Lsn(0);
    while flushed < end || commit < end {
        match p.reply().await {
            AcceptorMessage::AppendResponse(r) => {
                assert!(r.flush_lsn >= flushed);
                flushed = r.flush_lsn;
                commit = r.commit_lsn;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(at, end);

    // A consumer streams the committed WAL.
    let mut c = consumer(sk.addr, end, "test").await;
    let mut streamed = Vec::new();
    loop {
        let Some(frame) = c.frame().await else { break };
        match codec::decode_stream(&frame).unwrap() {
            StreamMessage::Start(s) => assert_eq!(s.term_history.last_term(), 1),
            StreamMessage::Wal(w) => {
                assert_eq!(w.begin_lsn.0, START.0 + streamed.len() as u64);
                streamed.extend(w.wal);
            }
            StreamMessage::Keepalive { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(streamed, wal, "the consumer got exactly the WAL");

    // Decoded streams of two shards: every record, once, to the end; the
    // second shard's stream takes the chunks the first one decoded.
    let mut first = decoded_consumer(sk.addr, end, ShardIndex::new(0, 2).unwrap()).await;
    let records = read_decoded(&mut first).await;
    assert_eq!((records.len(), records.last().unwrap().1), (600, end));
    let decoded_before = metric(&sk, "strata_safekeeper_decoded_wal_bytes_total").await;
    let mut second = decoded_consumer(sk.addr, end, ShardIndex::new(1, 2).unwrap()).await;
    assert_eq!(read_decoded(&mut second).await, records);
    assert!(metric(&sk, "strata_safekeeper_decoded_wal_bytes_total").await > decoded_before);
    // Only committed WAL is decoded (it is never truncated under a chunk).
    let mut c = Client::connect(sk.addr).await;
    let mut out = Vec::new();
    let mut req = decoded_request(end, ShardIndex::UNSHARDED);
    req.include_uncommitted = true;
    codec::encode_consumer(&ConsumerMessage::Start(req), &mut out);
    c.send_raw(&out).await;
    match codec::decode_stream(&c.frame().await.unwrap()).unwrap() {
        StreamMessage::Error(e) => assert_eq!(e.code, ErrorCode::Protocol, "{}", e.message),
        other => panic!("{other:?}"),
    }

    // A newer term supersedes this proposer.
    let mut p2 = Client::connect(sk.addr).await;
    p2.send(&greeting(77)).await;
    p2.reply().await;
    p2.send(&ProposerMessage::VoteRequest(VoteRequest { term: 2 })).await;
    match p2.reply().await {
        AcceptorMessage::VoteResponse(v) => {
            assert!(v.vote_given);
            assert_eq!(v.flush_lsn, end);
            assert_eq!(v.term_history.last_term(), 1);
        }
        other => panic!("{other:?}"),
    }
    p.send(&ProposerMessage::Append(AppendRequest {
        term: 1,
        begin_lsn: end,
        commit_lsn: end,
        truncate_lsn: START,
        wal: vec![0; 8],
    }))
    .await;
    match p.reply().await {
        AcceptorMessage::Error(e) => assert_eq!(e.code, ErrorCode::TermSuperseded),
        other => panic!("{other:?}"),
    }
    drop((p, p2, c, bad, wrong, unknown));

    let (code, status) = http(sk.http, "GET", &tl, "").await;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["flush_lsn"], end.to_string());
    assert_eq!(status["term"], 2);
    assert!(status["peers"].is_array());
    let (code, metrics) = http(sk.http, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("strata_safekeeper_append_requests_total"), "{metrics}");

    // Restart: the WAL end is found again.
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sk = start(&dir).await;
    let (_, status) = http(sk.http, "GET", &tl, "").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["flush_lsn"], end.to_string());
    assert_eq!(status["term"], 2);
    sk.stop.send(()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

async fn create_timeline(sk: &Running) -> String {
    let tl = format!("/v1/tenant/{}/timeline/{}", TenantId([5; 16]), TimelineId([6; 16]));
    let body = format!(r#"{{"system_id": 77, "pg_version": 15, "wal_segment_size": {SEG}, "start_lsn": "{START}"}}"#);
    assert_eq!(http(sk.http, "POST", &tl, &body).await.0, 201);
    tl
}

/// A record too large to send whole: a decoded stream sends what comes
/// before it, then `RecordTooLarge` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_for_a_decoded_stream_is_named_in_an_error() {
    let dir = std::env::temp_dir().join(format!("strata-sk-decoded-large-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start(&dir).await;
    create_timeline(&sk).await;
    let mut b = WalBuilder::new(PgVersion::V15, 77, 1, SEG, START, Lsn(0));
    let small = b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &[1; 200]));
    let large = b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &vec![2; 9 << 20]));
    b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &[3; 200]));
    let (wal, end) = wal_of(b);
    let mut p = greeted(sk.addr).await;
    p.send(&ProposerMessage::VoteRequest(VoteRequest { term: 1 })).await;
    assert!(matches!(p.reply().await, AcceptorMessage::VoteResponse(VoteResponse { vote_given: true, .. })));
    elect(&mut p).await;
    append_all(&mut p, &wal, end, 1 << 20).await;
    loop {
        match p.reply().await {
            AcceptorMessage::AppendResponse(r) if r.commit_lsn >= end => break,
            AcceptorMessage::AppendResponse(_) => {}
            other => panic!("{other:?}"),
        }
    }
    let mut c = decoded_consumer(sk.addr, end, ShardIndex::UNSHARDED).await;
    let mut decoder = BatchDecoder::new();
    let mut got = Vec::new();
    let error = loop {
        let frame = c.frame().await.expect("an error before the stream ends");
        match codec::decode_stream(&frame).unwrap() {
            StreamMessage::Decoded(d) => {
                got.extend(decoder.decode(&d.payload, d.batch_len as usize, d.crc32c, d.begin_lsn).unwrap());
            }
            StreamMessage::Error(e) => break e,
            StreamMessage::Start(_) | StreamMessage::Keepalive { .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(error.code, ErrorCode::RecordTooLarge, "{}", error.message);
    assert!(error.message.contains(&large.to_string()), "{} names {large}", error.message);
    assert!(got.iter().all(|e| e.lsn() < large) && got.iter().any(|e| e.lsn() == small), "{got:?}");
    sk.stop.send(()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Greets and expects the acceptor's greeting: an established connection.
async fn greeted(addr: SocketAddr) -> Client {
    let mut p = Client::connect(addr).await;
    p.send(&greeting(77)).await;
    assert!(matches!(p.reply().await, AcceptorMessage::Greeting(_)));
    p
}

/// An idle stream carries keepalives however often its consumer sends
/// feedback (the pageserver sends it every second, and takes silence as a
/// dead link).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_keeps_alive_while_its_consumer_sends_feedback() {
    let dir = std::env::temp_dir().join(format!("strata-sk-keepalive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start(&dir).await;
    create_timeline(&sk).await;
    let mut c = consumer(sk.addr, Lsn::INVALID, "keepalive").await;
    let started = SystemClock.now();
    let mut keepalives = 0;
    while SystemClock.since(started) < Duration::from_secs(12) {
        let mut feedback = Vec::new();
        let f = ConsumerFeedback { applied_lsn: START, remote_consistent_lsn: START };
        codec::encode_consumer(&ConsumerMessage::Feedback(f), &mut feedback);
        c.send_raw(&feedback).await;
        match c.s.read_frame(Duration::from_millis(500)).await {
            Ok(frame) => match codec::decode_stream(frame).unwrap() {
                StreamMessage::Start(_) => {}
                StreamMessage::Keepalive { .. } => keepalives += 1,
                other => panic!("{other:?} on an idle stream"),
            },
            Err(FrameError::Timeout(_)) => {}
            Err(e) => panic!("the stream ended: {e}"),
        }
    }
    // One every 5 s: two in 12 s.
    assert!(keepalives >= 2, "{keepalives} keepalives in 12 s of feedback every 0.5 s");
    drop(c);
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_floods_displace_each_other_and_established_connections_stay() {
    let dir = std::env::temp_dir().join(format!("strata-sk-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start_with(&dir, "max_connections = 4\nmax_http_connections = 3\nhandshake_timeout = 1").await;
    let tl = create_timeline(&sk).await;

    // Far more idle connections than places, on both ports.
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(TcpStream::connect(sk.addr).await.unwrap());
        idle.push(TcpStream::connect(sk.http).await.unwrap());
    }
    // A proposer that greets still gets in, and so does a status request.
    let mut established = vec![greeted(sk.addr).await];
    let (code, _) = http(sk.http, "GET", &tl, "").await;
    assert_eq!(code, 200, "status answers under a flood of idle connections");
    // Up to the limit, established connections all stay.
    for _ in 0..3 {
        established.push(greeted(sk.addr).await);
    }
    // With every place established, a new connection is refused with a clear error.
    let mut refused = Client::connect(sk.addr).await;
    refused.send(&greeting(77)).await;
    match refused.reply().await {
        AcceptorMessage::Error(e) => {
            assert_eq!(e.code, ErrorCode::Overloaded);
            assert!(e.message.contains("too many connections"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert!(refused.frame().await.is_none(), "closed after the error");
    // A consumer that is refused gets the error in its own message type.
    let mut c = consumer(sk.addr, Lsn::INVALID, "refused").await;
    let frame = c.frame().await.expect("an answer");
    assert!(
        matches!(codec::decode_stream(&frame).unwrap(), StreamMessage::Error(e) if e.code == ErrorCode::Overloaded)
    );
    // The established connections still work.
    for p in &mut established {
        p.send(&ProposerMessage::VoteRequest(VoteRequest { term: 0 })).await;
        assert!(matches!(p.reply().await, AcceptorMessage::VoteResponse(_)));
    }
    // Idle connections are closed after the handshake timeout (1 s).
    drop(established);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = SystemClock.now();
    let mut lone = TcpStream::connect(sk.addr).await.unwrap();
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), lone.read(&mut byte)).await.expect("closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "closed: {n:?}");
    assert!(SystemClock.since(started) < Duration::from_secs(3));
    let (code, metrics) = http(sk.http, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    for name in ["connections_displaced_total", "connections_refused_total", "connections_open"] {
        assert!(metrics.contains(&format!("strata_safekeeper_{name}{{listener=\"protocol\"}}")), "{name}: {metrics}");
    }
    drop(idle);
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_refused_naming_the_key() {
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap();
    let free = std::net::SocketAddr::from(([127, 0, 0, 1], strata_test_support::free_port()));
    let dir = std::env::temp_dir().join(format!("strata-sk-port-{}", std::process::id()));
    let config: SafekeeperConfig = toml::from_str(&format!(
        "id = 1\nlisten = \"{free}\"\nlisten_http = \"{addr}\"\ndata_dir = {:?}\n",
        dir.display().to_string()
    ))
    .unwrap();
    let err = strata_safekeeper::run(config).await.unwrap_err().to_string();
    assert!(err.starts_with(&format!("listen_http = {addr}: ")) && err.contains("in use"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A membership configuration is installed over HTTP (only ever a higher
/// generation), survives a restart, and fences proposers: a connection of
/// an older generation learns the new one from the greeting and is closed,
/// and an established connection is refused once the generation changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_generations_fence_stale_proposers() {
    let dir = std::env::temp_dir().join(format!("strata-sk-membership-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start(&dir).await;
    let tl = create_timeline(&sk).await;
    let path = format!("{tl}/membership");
    let (code, body) = http(sk.http, "GET", &path, "").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"generation\":0"), "{body}");

    // An established connection of generation 0.
    let mut old = greeted(sk.addr).await;
    let g1 = r#"{"generation": 1, "members": [{"id": 1, "address": "a:1"}, {"id": 2, "address": "b:2"}],
                "new_members": [{"id": 1, "address": "a:1"}, {"id": 3, "address": "c:3"}]}"#;
    let (code, body) = http(sk.http, "PUT", &path, g1).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(http(sk.http, "PUT", &path, g1).await.0, 200, "the same configuration again is a no-op");
    let older = r#"{"generation": 0, "members": []}"#;
    assert_eq!(http(sk.http, "PUT", &path, older).await.0, 409);
    let other = r#"{"generation": 1, "members": [{"id": 9, "address": "z:9"}]}"#;
    assert_eq!(http(sk.http, "PUT", &path, other).await.0, 409);
    let bad = r#"{"generation": 2, "members": [{"id": 1, "address": "a:1"}, {"id": 1, "address": "a:1"}]}"#;
    assert_eq!(http(sk.http, "PUT", &path, bad).await.0, 400);

    // The established connection was closed by the change (its proposer
    // reconnects and learns the configuration).
    assert!(old.frame().await.is_none(), "closed by the membership change");
    // A new connection of generation 0 gets the configuration, then is closed.
    let mut stale = Client::connect(sk.addr).await;
    stale.send(&greeting(77)).await;
    match stale.reply().await {
        AcceptorMessage::Greeting(g) => assert_eq!(g.membership.generation, 1, "{g:?}"),
        other => panic!("{other:?}"),
    }
    assert!(stale.frame().await.is_none(), "closed after the greeting");

    // Restarted, the safekeeper still holds generation 1.
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let sk = start(&dir).await;
    let (code, body) = http(sk.http, "GET", &path, "").await;
    assert!(code == 200 && body.contains("\"generation\":1") && body.contains("c:3"), "{code} {body}");

    // Generation 2 leaves this safekeeper (id 1) out: a proposer of that
    // generation is greeted, but the vote of a non-member is refused.
    let g2 = r#"{"generation": 2, "members": [{"id": 2, "address": "b:2"}, {"id": 3, "address": "c:3"}]}"#;
    assert_eq!(http(sk.http, "PUT", &path, g2).await.0, 200);
    let mut outsider = Client::connect(sk.addr).await;
    let ProposerMessage::Greeting(mut g) = greeting(77) else { unreachable!() };
    g.membership = serde_json::from_str(g2).unwrap();
    outsider.send(&ProposerMessage::Greeting(g)).await;
    assert!(matches!(outsider.reply().await, AcceptorMessage::Greeting(_)));
    outsider.send(&ProposerMessage::VoteRequest(VoteRequest { term: 1 })).await;
    match outsider.reply().await {
        AcceptorMessage::Error(e) => {
            assert_eq!(e.code, ErrorCode::MembershipChanged, "{e:?}");
            assert!(e.message.contains("no member"), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With `[auth]`, a greeting or stream request must carry a token that
/// allows the timeline's tenant. It is checked before the timeline is
/// looked up; a refusal says why (Unauthorized or Forbidden), closes the
/// connection, changes nothing and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greetings_and_stream_requests_need_a_token_for_their_tenant() {
    use strata_service::auth::{Claims, Scope, Signer};
    let keys = strata_test_support::paths::in_crate("../service/tests/data/auth");
    let signer = Signer::load(&keys.join("private.pem")).unwrap();
    let mint = |scope, tenant| signer.sign(&Claims::new(scope, tenant, None));
    let (ours, theirs) = (TenantId([5; 16]), TenantId([7; 16]));
    let management = mint(Scope::Management, None);
    let service = mint(Scope::Service, None);
    let tenant = mint(Scope::Tenant, Some(ours));
    let other_tenant = mint(Scope::Tenant, Some(theirs));
    let expired = signer.sign(&Claims { iat: 1, exp: Some(2), ..Claims::new(Scope::Tenant, Some(ours), None) });
    let foreign_key = {
        let (private, _) = strata_service::auth::generate_key_pair();
        Signer::from_pem(private.as_bytes(), "a key of another cluster").unwrap().sign(&Claims::new(
            Scope::Service,
            None,
            None,
        ))
    };

    let dir = std::env::temp_dir().join(format!("strata-sk-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk =
        start_with(&dir, &format!("[auth]\npublic_key = {:?}\n", keys.join("public.pem").display().to_string())).await;
    let tl = format!("/v1/tenant/{ours}/timeline/{}", TimelineId([6; 16]));
    let body = format!(r#"{{"system_id": 77, "pg_version": 15, "wal_segment_size": {SEG}, "start_lsn": "{START}"}}"#);
    assert_eq!(http_as(sk.http, "POST", &tl, &body, Some(&management)).await.0, 201);

    // A greeting that would raise the membership generation if it were heard.
    let proposer_greeting = |token: Option<&str>| {
        let mut g = greeting(77);
        if let ProposerMessage::Greeting(g) = &mut g {
            g.membership = Membership {
                generation: 1,
                members: vec![Member::new(strata_protocol::NodeId(1), "a:1")],
                ..Default::default()
            };
            g.token = token.map(|t| strata_protocol::Token::new(t.into()));
        }
        g
    };
    let refused = [
        (None, ErrorCode::Unauthorized, "no token"),
        (Some("not.a.token"), ErrorCode::Unauthorized, "malformed"),
        (Some(foreign_key.as_str()), ErrorCode::Unauthorized, "signature"),
        (Some(expired.as_str()), ErrorCode::Unauthorized, "expired"),
        (Some(other_tenant.as_str()), ErrorCode::Forbidden, "another tenant"),
    ];
    for (token, code, what) in refused {
        let mut p = Client::connect(sk.addr).await;
        p.send(&proposer_greeting(token)).await;
        match p.reply().await {
            AcceptorMessage::Error(e) => assert_eq!(e.code, code, "greeting with {what}: {}", e.message),
            other => panic!("greeting with {what}: {other:?}"),
        }
        assert!(p.frame().await.is_none(), "the connection closes after a refusal");

        let mut c = Client::connect(sk.addr).await;
        let mut out = Vec::new();
        codec::encode_consumer(
            &ConsumerMessage::Start(StartStreaming {
                protocol_version: PROTOCOL_VERSION,
                tenant_id: ours,
                timeline_id: TimelineId([6; 16]),
                start_lsn: START,
                stop_lsn: Lsn::INVALID,
                include_uncommitted: false,
                consumer_id: "auth-test".into(),
                token: token.map(|t| strata_protocol::Token::new(t.into())),
                generation: 0,
                shard: strata_protocol::shard::ShardIndex::UNSHARDED,
                format: strata_protocol::decoded_wal::StreamFormat::Raw,
                stripe_blocks: strata_protocol::shard::DEFAULT_STRIPE_BLOCKS,
            }),
            &mut out,
        );
        c.send_raw(&out).await;
        match codec::decode_stream(&c.frame().await.expect("an answer")).unwrap() {
            StreamMessage::Error(e) => assert_eq!(e.code, code, "stream request with {what}: {}", e.message),
            other => panic!("stream request with {what}: {other:?}"),
        }
    }
    // Checked before the lookup: an unknown timeline without a token is
    // refused as unauthenticated, not reported as missing.
    let mut unknown = Client::connect(sk.addr).await;
    let mut g = proposer_greeting(None);
    if let ProposerMessage::Greeting(g) = &mut g {
        g.timeline.tenant_id = TenantId([0xEE; 16]);
    }
    unknown.send(&g).await;
    assert!(matches!(
        unknown.reply().await,
        AcceptorMessage::Error(ErrorMessage { code: ErrorCode::Unauthorized, .. })
    ));

    // Nothing changed: the refused greetings did not raise the generation.
    let (code, status) = http_as(sk.http, "GET", &tl, "", Some(&tenant)).await;
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["membership"]["generation"], 0, "{status}");
    assert_eq!(status["term"], 0, "{status}");

    // The services read WAL but never propose it.
    let mut p = Client::connect(sk.addr).await;
    p.send(&proposer_greeting(Some(&service))).await;
    match p.reply().await {
        AcceptorMessage::Error(e) => assert_eq!(e.code, ErrorCode::Forbidden, "{}", e.message),
        other => panic!("a service token's greeting: {other:?}"),
    }
    // The tenant's own token and management are heard.
    for token in [&tenant, &management] {
        let mut p = Client::connect(sk.addr).await;
        p.send(&proposer_greeting(Some(token))).await;
        assert!(matches!(p.reply().await, AcceptorMessage::Greeting(_)));
    }
    let (_, metrics) = http_as(sk.http, "GET", "/metrics", "", Some(&service)).await;
    for (interface, reason, n) in [
        ("proposer", "no_token", 2),
        ("proposer", "other_tenant", 1),
        ("proposer", "scope", 1),
        ("stream", "expired", 1),
        ("stream", "unknown_key", 1),
    ] {
        let line = format!(r#"auth_refusals_total{{interface="{interface}",reason="{reason}"}} {n}"#);
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    sk.stop.send(()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A consumer of attachment generation `generation` (a pageserver's), on and on.
async fn pageserver_consumer(addr: SocketAddr, generation: u32) -> Client {
    stream_request(addr, Lsn::INVALID, &format!("pageserver-gen{generation}"), generation).await
}

async fn feedback(c: &mut Client, remote_consistent_lsn: Lsn) {
    let mut out = Vec::new();
    let f = ConsumerFeedback { applied_lsn: START, remote_consistent_lsn };
    codec::encode_consumer(&ConsumerMessage::Feedback(f), &mut out);
    c.send_raw(&out).await;
}

async fn timeline_status(sk: &Running, tl: &str) -> serde_json::Value {
    let (code, body) = http(sk.http, "GET", tl, "").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls the timeline's status until `pred` holds (10 s at most).
async fn status_until(sk: &Running, tl: &str, what: &str, pred: impl Fn(&serde_json::Value) -> bool) {
    let deadline = SystemClock.now() + Duration::from_secs(10);
    loop {
        let s = timeline_status(sk, tl).await;
        if pred(&s) {
            return;
        }
        assert!(SystemClock.now() < deadline, "{what}: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first answer to a stream request: its error code, or None for StreamStart.
async fn stream_answer(c: &mut Client) -> Option<ErrorCode> {
    match codec::decode_stream(&c.frame().await.expect("an answer")).unwrap() {
        StreamMessage::Start(_) => None,
        StreamMessage::Error(e) => Some(e.code),
        other => panic!("{other:?} as the first answer"),
    }
}

/// A pageserver of a superseded attachment generation is refused, its
/// running stream ends after the grace, its feedback stops counting at once,
/// and a restart of the safekeeper remembers the newest generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_pageserver_generations_are_fenced() {
    let dir = std::env::temp_dir().join(format!("strata-sk-fence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start_with(&dir, "stale_stream_grace = 1").await;
    let tl = create_timeline(&sk).await;

    let mut old = pageserver_consumer(sk.addr, 3).await;
    assert_eq!(stream_answer(&mut old).await, None);
    feedback(&mut old, Lsn(START.0 + 100)).await;
    status_until(&sk, &tl, "generation 3's feedback counts", |s| {
        s["remote_consistent_lsn"] == Lsn(START.0 + 100).to_string()
    })
    .await;
    assert_eq!(timeline_status(&sk, &tl).await["pageserver_generation"], 3);

    // The new generation is admitted; the old stream is fenced at once.
    let mut new = pageserver_consumer(sk.addr, 4).await;
    assert_eq!(stream_answer(&mut new).await, None);
    status_until(&sk, &tl, "generation 3 is marked fenced", |s| {
        s["consumers"].as_array().unwrap().iter().any(|c| c["generation"] == 3 && c["fenced"] == true)
    })
    .await;
    assert_eq!(timeline_status(&sk, &tl).await["pageserver_generation"], 4);
    // Its feedback no longer moves what WAL removal trusts.
    feedback(&mut old, Lsn(START.0 + 5000)).await;
    status_until(&sk, &tl, "generation 3's feedback arrived", |s| {
        s["consumers"].as_array().unwrap().iter().any(|c| c["remote_consistent_lsn"] == Lsn(START.0 + 5000).to_string())
    })
    .await;
    assert_eq!(timeline_status(&sk, &tl).await["remote_consistent_lsn"], Lsn(START.0 + 100).to_string());

    // A new request of the old generation is refused; generation 0 (not a
    // pageserver) and the new generation are served.
    let mut again = pageserver_consumer(sk.addr, 3).await;
    assert_eq!(stream_answer(&mut again).await, Some(ErrorCode::StaleGeneration));
    assert!(again.frame().await.is_none(), "the connection closes after the refusal");
    let mut tool = pageserver_consumer(sk.addr, 0).await;
    assert_eq!(stream_answer(&mut tool).await, None);

    // The running old stream ends after the grace (1 s), with the reason.
    let started = SystemClock.now();
    let ended = loop {
        let Some(frame) = old.frame().await else { panic!("closed without saying why") };
        match codec::decode_stream(&frame).unwrap() {
            StreamMessage::Error(e) => break e,
            StreamMessage::Keepalive { .. } | StreamMessage::Wal(_) => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(ended.code, ErrorCode::StaleGeneration, "{}", ended.message);
    assert!(ended.message.contains("generation 4"), "{}", ended.message);
    assert!(SystemClock.since(started) < Duration::from_secs(5), "ended after {:?}", SystemClock.since(started));
    // The newer generation still streams: its feedback counts.
    feedback(&mut new, Lsn(START.0 + 200)).await;
    status_until(&sk, &tl, "generation 4's feedback counts", |s| {
        s["remote_consistent_lsn"] == Lsn(START.0 + 200).to_string()
    })
    .await;
    drop((new, tool));

    // A restart remembers generation 4.
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let sk = start_with(&dir, "stale_stream_grace = 1").await;
    assert_eq!(timeline_status(&sk, &tl).await["pageserver_generation"], 4);
    let mut after = pageserver_consumer(sk.addr, 3).await;
    assert_eq!(stream_answer(&mut after).await, Some(ErrorCode::StaleGeneration));
    let mut newer = pageserver_consumer(sk.addr, 5).await;
    assert_eq!(stream_answer(&mut newer).await, None);
    drop(newer);
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Shards of one tenant fail over one by one: a new generation of one
/// shard fences that shard's older pageserver and no other shard's, and
/// the WAL-removal horizon is the slowest shard's upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generations_are_fenced_per_shard() {
    use strata_protocol::shard::ShardIndex;
    let dir = std::env::temp_dir().join(format!("strata-sk-shard-fence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start_with(&dir, "stale_stream_grace = 1").await;
    let tl = create_timeline(&sk).await;
    let (s0, s1) = (ShardIndex::new(0, 2).unwrap(), ShardIndex::new(1, 2).unwrap());
    let request = |g, shard| shard_stream_request(sk.addr, Lsn::INVALID, "ps", g, shard);

    let mut zero = request(1, s0).await;
    assert_eq!(stream_answer(&mut zero).await, None);
    let mut one = request(1, s1).await;
    assert_eq!(stream_answer(&mut one).await, None);
    feedback(&mut zero, Lsn(START.0 + 700)).await;
    feedback(&mut one, Lsn(START.0 + 300)).await;
    status_until(&sk, &tl, "the slower shard's upload counts", |s| {
        s["remote_consistent_lsn"] == Lsn(START.0 + 300).to_string()
    })
    .await;
    // Shard 1 fails over (generation 2): shard 0's generation 1 still streams.
    let mut moved = request(2, s1).await;
    assert_eq!(stream_answer(&mut moved).await, None);
    let mut zero_again = request(1, s0).await;
    assert_eq!(stream_answer(&mut zero_again).await, None, "another shard's generation fences no one");
    let mut one_again = request(1, s1).await;
    assert_eq!(stream_answer(&mut one_again).await, Some(ErrorCode::StaleGeneration));
    // The unsharded generation is its own too.
    let mut unsharded = pageserver_consumer(sk.addr, 1).await;
    assert_eq!(stream_answer(&mut unsharded).await, None);
    drop((zero, one, moved, zero_again, unsharded));

    // A restart remembers each shard's newest.
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let sk = start_with(&dir, "stale_stream_grace = 1").await;
    let mut stale = shard_stream_request(sk.addr, Lsn::INVALID, "ps", 1, s1).await;
    assert_eq!(stream_answer(&mut stale).await, Some(ErrorCode::StaleGeneration));
    let mut fine = shard_stream_request(sk.addr, Lsn::INVALID, "ps", 1, s0).await;
    assert_eq!(stream_answer(&mut fine).await, None);
    drop(fine);
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sealed timeline (site failover, docs/sites.md) refuses its proposer
/// for good, with `Sealed`: the established session at its next message,
/// a new one at its greeting, also after a restart. Its flushed WAL, none
/// of it committed before, is committed by the seal and streamed to
/// consumers whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_timeline_takes_no_writer_and_its_wal_is_final() {
    let dir = std::env::temp_dir().join(format!("strata-sk-seal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start(&dir).await;
    let tl = create_timeline(&sk).await;
    let mut p = greeted(sk.addr).await;
    p.send(&ProposerMessage::VoteRequest(VoteRequest { term: 1 })).await;
    assert!(matches!(p.reply().await, AcceptorMessage::VoteResponse(VoteResponse { vote_given: true, .. })));
    assert!(matches!(elect(&mut p).await, AcceptorMessage::AppendResponse(_)));
    // WAL flushed, none of it committed yet (the commit LSN stays at START).
    let (wal, end) = wal_bytes(50);
    p.send(&ProposerMessage::Append(AppendRequest {
        term: 1,
        begin_lsn: START,
        commit_lsn: START,
        truncate_lsn: START,
        wal: wal.clone(),
    }))
    .await;
    loop {
        if let AcceptorMessage::AppendResponse(r) = p.reply().await {
            if r.flush_lsn == end {
                break;
            }
        }
    }
    let status = timeline_status(&sk, &tl).await;
    assert_eq!(
        (status["commit_lsn"].as_str(), status["sealed"].as_bool()),
        (Some(START.to_string().as_str()), Some(false))
    );

    let (code, body) = http(sk.http, "POST", &format!("{tl}/seal"), "").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["sealed"], true, "{body}");
    assert_eq!(status["commit_lsn"], end.to_string(), "the flushed WAL is committed by the seal");
    assert_eq!(http(sk.http, "POST", &format!("{tl}/seal"), "").await.0, 200, "sealing again is a no-op");
    // The established session is closed; a new one is refused at its greeting.
    assert!(p.frame().await.is_none(), "the writer's connection is closed by the seal");
    let refused = |m: AcceptorMessage| match m {
        AcceptorMessage::Error(e) => assert_eq!(e.code, ErrorCode::Sealed, "{e:?}"),
        other => panic!("{other:?}"),
    };
    let mut again = Client::connect(sk.addr).await;
    again.send(&greeting(77)).await;
    refused(again.reply().await);
    // Consumers still get every byte.
    let mut c = consumer(sk.addr, end, "after-seal").await;
    let mut streamed = Vec::new();
    while let Some(frame) = c.frame().await {
        match codec::decode_stream(&frame).unwrap() {
            StreamMessage::Wal(w) => streamed.extend(w.wal),
            StreamMessage::Error(e) => panic!("{e:?}"),
            _ => {}
        }
    }
    assert_eq!(streamed, wal, "the sealed WAL streams whole");

    // After a restart it is still sealed.
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    let sk = start(&dir).await;
    assert_eq!(timeline_status(&sk, &tl).await["sealed"], true);
    let mut later = Client::connect(sk.addr).await;
    later.send(&greeting(77)).await;
    refused(later.reply().await);
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The value of the tenant's series `name` in `metrics`, if it has one.
fn tenant_series(metrics: &str, name: &str, tenant: TenantId) -> Option<u64> {
    let prefix = format!("{name}{{tenant=\"{tenant}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap())
}

/// What the timeline's status says its removal last counted on local disk.
async fn local_wal_bytes(sk: &Running, tl: &str) -> u64 {
    timeline_status(sk, tl).await["removal"]["local_wal_bytes"].as_u64().unwrap()
}

/// Each tenant's WAL on local disk is one series in the metrics: the sum
/// of its timelines' `removal.local_wal_bytes`. It follows the timelines
/// held, and goes with the tenant's last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_local_wal_is_a_series_until_its_timelines_are_gone() {
    const NAME: &str = "strata_safekeeper_tenant_wal_bytes";
    let dir = std::env::temp_dir().join(format!("strata-sk-tenant-wal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sk = start(&dir).await;
    let tenant = TenantId([5; 16]);
    let tl = create_timeline(&sk).await;
    let branch = format!("/v1/tenant/{tenant}/timeline/{}", TimelineId([7; 16]));
    let body = format!(r#"{{"system_id": 77, "pg_version": 15, "wal_segment_size": {SEG}, "start_lsn": "{START}"}}"#);
    assert_eq!(http(sk.http, "POST", &branch, &body).await.0, 201);

    // More than a segment of WAL on the first timeline.
    let mut p = greeted(sk.addr).await;
    p.send(&ProposerMessage::VoteRequest(VoteRequest { term: 1 })).await;
    assert!(matches!(p.reply().await, AcceptorMessage::VoteResponse(VoteResponse { vote_given: true, .. })));
    assert!(matches!(elect(&mut p).await, AcceptorMessage::AppendResponse(_)));
    let (wal, end) = wal_bytes(800);
    assert!(end.0 - START.0 > SEG, "the WAL spans two segments");
    let mut at = START;
    for chunk in wal.chunks(10_000) {
        let req = AppendRequest { term: 1, begin_lsn: at, commit_lsn: at, truncate_lsn: START, wal: chunk.to_vec() };
        at = req.end_lsn();
        p.send(&ProposerMessage::Append(req)).await;
    }
    loop {
        if let AcceptorMessage::AppendResponse(r) = p.reply().await {
            if r.flush_lsn == end {
                break;
            }
        }
    }
    // Both timelines' removal has counted what they hold (the branch: its first segment).
    status_until(&sk, &tl, "the removal counts two segments", |s| s["removal"]["local_wal_bytes"] == 2 * SEG).await;
    status_until(&sk, &branch, "the removal counts the branch", |s| s["removal"]["local_wal_bytes"] == SEG).await;

    let (code, metrics) = http(sk.http, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    let held = local_wal_bytes(&sk, &tl).await + local_wal_bytes(&sk, &branch).await;
    assert_eq!(tenant_series(&metrics, NAME, tenant), Some(held), "{metrics}");
    assert_eq!(held, 3 * SEG);

    // One timeline deleted: the tenant holds the other's WAL.
    drop(p);
    assert_eq!(http(sk.http, "DELETE", &branch, "").await.0, 200);
    let (_, metrics) = http(sk.http, "GET", "/metrics", "").await;
    assert_eq!(tenant_series(&metrics, NAME, tenant), Some(local_wal_bytes(&sk, &tl).await), "{metrics}");
    // The last one deleted: the tenant's series is gone.
    assert_eq!(http(sk.http, "DELETE", &tl, "").await.0, 200);
    let (_, metrics) = http(sk.http, "GET", "/metrics", "").await;
    assert_eq!(tenant_series(&metrics, NAME, tenant), None, "{metrics}");
    assert!(metrics.contains("# TYPE strata_safekeeper_tenant_wal_bytes gauge"), "{metrics}");
    sk.stop.send(()).unwrap();
    sk.task.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
