//! The safekeeper over TCP: timeline creation over HTTP, a proposer's
//! greeting/vote/election/appends, a consumer stream, restart recovery, and
//! bad input that gets an error and a closed connection while the server
//! keeps serving.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use strata_formats::wal::encode::{encode_record, WalBuilder};
use strata_formats::{Lsn, PgVersion};
use strata_protocol::safekeeper::codec;
use strata_protocol::safekeeper::*;
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_safekeeper::config::SafekeeperConfig;

const SEG: u64 = 1 << 20;
const START: Lsn = Lsn(SEG * 2);

struct Running {
    addr: SocketAddr,
    http: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

async fn start(dir: &std::path::Path) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, http_addr) = (listener.local_addr().unwrap(), http.local_addr().unwrap());
    let config = SafekeeperConfig {
        id: NodeId(1),
        listen: addr,
        listen_http: http_addr,
        listen_pg: None,
        strip_consistency_for_replication: false,
        data_dir: dir.to_path_buf(),
        peers: vec![],
        fsync: true,
        idle_timeout: Duration::from_secs(10),
        max_send_bytes: 64 * 1024,
    };
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(strata_safekeeper::serve(config, listener, http, async move {
        let _ = rx.await;
    }));
    Running { addr, http: http_addr, stop, task }
}

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client { s: TcpStream::connect(addr).await.unwrap(), buf: Vec::new() }
    }
    async fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }
    async fn send(&mut self, msg: &ProposerMessage) {
        let mut out = Vec::new();
        codec::encode_proposer(msg, &mut out);
        self.send_raw(&out).await;
    }
    /// The next frame, or None if the server closed the connection.
    async fn frame(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some((n, f)) = codec::split_frame(&self.buf).unwrap() {
                let f = f.to_vec();
                self.buf.drain(..n);
                return Some(f);
            }
            let mut chunk = vec![0u8; 1 << 16];
            let n = tokio::time::timeout(Duration::from_secs(10), self.s.read(&mut chunk)).await.unwrap().unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
    async fn reply(&mut self) -> AcceptorMessage {
        codec::decode_acceptor(&self.frame().await.expect("a reply")).unwrap()
    }
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
    })
}

fn wal_bytes(n: usize) -> (Vec<u8>, Lsn) {
    let mut b = WalBuilder::new(PgVersion::V15, 77, 1, SEG, START, Lsn(0));
    for i in 0..n {
        let data = vec![i as u8; 100 + (i * 37) % 3000];
        b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &data));
    }
    let end = b.end_lsn();
    let mut bytes = Vec::new();
    for (_, seg) in b.into_segments() {
        bytes.extend(seg);
    }
    (bytes[(START.0 - START.0 / SEG * SEG) as usize..(end.0 - START.0 / SEG * SEG) as usize].to_vec(), end)
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
        .send(&ProposerMessage::Greeting(ProposerGreeting { protocol_version: 1, proposer_id: [1; 16], timeline: g }))
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
    let history = TermHistory(vec![TermLsn { term: 1, lsn: START }]);
    p.send(&ProposerMessage::Elected(ProposerElected {
        term: 1,
        start_streaming_at: START,
        term_history: history,
        timeline_start_lsn: START,
    }))
    .await;
    assert!(matches!(p.reply().await, AcceptorMessage::AppendResponse(AppendResponse { term: 1, .. })));
    // Many appends sent back to back: acknowledged after (batched) flushes.
    let mut at = START;
    for chunk in wal.chunks(10_000) {
        let req = AppendRequest { term: 1, begin_lsn: at, commit_lsn: at, truncate_lsn: START, wal: chunk.to_vec() };
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
    let mut c = Client::connect(sk.addr).await;
    let mut out = Vec::new();
    codec::encode_consumer(
        &ConsumerMessage::Start(StartStreaming {
            protocol_version: 1,
            tenant_id: TenantId([5; 16]),
            timeline_id: TimelineId([6; 16]),
            start_lsn: START,
            stop_lsn: end,
            include_uncommitted: false,
            consumer_id: "test".into(),
        }),
        &mut out,
    );
    c.send_raw(&out).await;
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
            StreamMessage::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(streamed, wal, "the consumer got exactly the WAL");

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
