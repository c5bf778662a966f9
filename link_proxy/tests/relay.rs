//! The link proxy over real sockets: bytes arrive whole and in order, no
//! earlier than the delay (with jitter too), a receiver that does not read
//! stops the sender, a cut route moves nothing until healed (one way cut,
//! the other way still moves), a lossy route delivers everything late, a
//! reset drops the connections, and the HTTP API refuses what it cannot do.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use strata_link_proxy::config::{LinkProxyConfig, RouteConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A server that echoes every byte back.
async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A server that accepts and never reads.
async fn deaf_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = l.accept().await.unwrap();
            held.push(s);
        }
    });
    addr
}

fn config(routes: &[(&str, SocketAddr, f64, f64)]) -> LinkProxyConfig {
    LinkProxyConfig {
        listen_http: "127.0.0.1:0".parse().unwrap(),
        routes: routes
            .iter()
            .map(|(name, target, delay_ms, jitter_ms)| RouteConfig {
                name: name.to_string(),
                listen: "127.0.0.1:0".parse().unwrap(),
                target: target.to_string(),
                delay_ms: *delay_ms,
                jitter_ms: *jitter_ms,
                loss_pct: 0.0,
            })
            .collect(),
        max_in_flight_bytes: 256 << 10,
        max_connections: 4,
        connect_timeout: Duration::from_secs(2),
        auth: None,
        tls: None,
    }
}

/// One round trip of `n` bytes through an echo route; returns how long it took.
async fn round_trip(s: &mut TcpStream, n: usize) -> Duration {
    let sent: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let t = Instant::now();
    s.write_all(&sent).await.unwrap();
    let mut got = vec![0u8; n];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(got, sent);
    t.elapsed()
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
    (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_arrive_whole_in_order_and_no_earlier_than_the_delay() {
    let echo = echo_server().await;
    let (proxy, _tasks) =
        strata_link_proxy::start(config(&[("slow", echo, 20.0, 0.0), ("jittery", echo, 5.0, 4.0)])).await.unwrap();
    // 20 ms each way, twice through the proxy's route (there and back).
    let mut s = TcpStream::connect(proxy.routes["slow"].listen).await.unwrap();
    for _ in 0..3 {
        let rtt = round_trip(&mut s, 100).await;
        assert!(rtt >= Duration::from_millis(40), "a round trip of {rtt:?} under the 40 ms configured");
    }
    // Megabytes with jitter: every byte, in order (round_trip compares).
    let mut j = TcpStream::connect(proxy.routes["jittery"].listen).await.unwrap();
    for n in [1, 70_000, 3 << 20] {
        round_trip(&mut j, n).await;
    }
    // The delay changes while connections are open.
    let (code, body) = http(proxy.http, "PUT", "/v1/route/slow", r#"{"delay_ms": 60}"#).await;
    assert_eq!(code, 200, "{body}");
    let rtt = round_trip(&mut s, 100).await;
    assert!(rtt >= Duration::from_millis(120), "{rtt:?} after the delay went to 60 ms");
    let status: serde_json::Value = serde_json::from_str(&http(proxy.http, "GET", "/v1/status", "").await.1).unwrap();
    let slow = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == "slow").unwrap();
    assert_eq!((slow["delay_ms"].as_f64(), slow["connections"].as_u64()), (Some(60.0), Some(1)), "{status}");
    assert!(slow["delivered_bytes"].as_u64().unwrap() >= 800, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_does_not_read_stops_the_sender() {
    let deaf = deaf_server().await;
    let (proxy, _tasks) = strata_link_proxy::start(config(&[("deaf", deaf, 1.0, 0.0)])).await.unwrap();
    let mut s = TcpStream::connect(proxy.routes["deaf"].listen).await.unwrap();
    // The kernel's buffers on both sides plus the proxy's 256 KiB hold a few
    // MiB at most: 256 MiB cannot all be taken.
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0usize;
    let blocked = tokio::time::timeout(Duration::from_secs(3), async {
        for _ in 0..256 {
            s.write_all(&chunk).await.unwrap();
            written += chunk.len();
        }
    })
    .await;
    assert!(blocked.is_err(), "256 MiB went into a receiver that reads nothing");
    assert!(written < 64 << 20, "{written} bytes taken before the sender was stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_route_moves_nothing_until_healed_and_a_reset_drops_connections() {
    let echo = echo_server().await;
    let (proxy, _tasks) = strata_link_proxy::start(config(&[("link", echo, 0.0, 0.0)])).await.unwrap();
    let route = proxy.routes["link"].listen;
    let mut open = TcpStream::connect(route).await.unwrap();
    round_trip(&mut open, 10).await;

    let (code, body) = http(proxy.http, "POST", "/v1/route/link/cut", "").await;
    assert_eq!(code, 200, "{body}");
    // Silence both on the open connection and on a new one.
    open.write_all(b"ping").await.unwrap();
    let mut fresh = TcpStream::connect(route).await.unwrap();
    fresh.write_all(b"pong").await.unwrap();
    let mut buf = [0u8; 4];
    assert!(tokio::time::timeout(Duration::from_millis(300), open.read_exact(&mut buf)).await.is_err());
    assert!(tokio::time::timeout(Duration::from_millis(300), fresh.read_exact(&mut buf)).await.is_err());
    // Healed: what was held arrives.
    let (code, _) = http(proxy.http, "POST", "/v1/route/*/heal", "").await;
    assert_eq!(code, 200);
    tokio::time::timeout(Duration::from_secs(5), open.read_exact(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf, b"ping");
    tokio::time::timeout(Duration::from_secs(5), fresh.read_exact(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf, b"pong");

    // A reset closes every open connection.
    let (code, _) = http(proxy.http, "POST", "/v1/route/link/reset", "").await;
    assert_eq!(code, 200);
    for s in [&mut open, &mut fresh] {
        let got = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap();
        assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
    }
    // New connections work again.
    let mut again = TcpStream::connect(route).await.unwrap();
    round_trip(&mut again, 10).await;
}

/// A server that sends `b"tick"` every 20 ms and counts what it reads.
async fn ticking_server() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = read.clone();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (mut r, mut w) = s.into_split();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = r.read(&mut buf).await {
                counter.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            }
        });
        while w.write_all(b"tick").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (addr, read)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_cut_one_way_still_moves_the_other() {
    use std::sync::atomic::Ordering::SeqCst;
    let (ticker, read) = ticking_server().await;
    let (proxy, _tasks) = strata_link_proxy::start(config(&[("link", ticker, 0.0, 0.0)])).await.unwrap();
    let mut s = TcpStream::connect(proxy.routes["link"].listen).await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    s.write_all(b"abc").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while read.load(SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();

    // Forward cut: what the client sends is held, the server's ticks arrive.
    let (code, body) = http(proxy.http, "POST", "/v1/route/link/cut?direction=forward", "").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""cut":true"#) && body.contains(r#""cut_forward":true"#), "{body}");
    assert!(body.contains(r#""cut_back":false"#), "{body}");
    s.write_all(b"held").await.unwrap();
    for _ in 0..5 {
        tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf, b"tick");
    }
    assert_eq!(read.load(SeqCst), 3, "bytes crossed a route cut forward");

    // Back cut instead: the held bytes arrive, the ticks stop.
    let (code, body) = http(proxy.http, "POST", "/v1/route/link/cut?direction=back", "").await;
    assert_eq!(code, 200, "{body}");
    tokio::time::timeout(Duration::from_secs(5), async {
        while read.load(SeqCst) < 7 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("what was held forward arrives once only the way back is cut");
    // Drain the ticks already relayed; then nothing comes.
    let mut sink = [0u8; 4096];
    while tokio::time::timeout(Duration::from_millis(100), s.read(&mut sink)).await.is_ok() {}
    assert!(tokio::time::timeout(Duration::from_millis(300), s.read(&mut sink)).await.is_err());
    // A new connection waits while either way is cut.
    let mut fresh = TcpStream::connect(proxy.routes["link"].listen).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), fresh.read(&mut sink)).await.is_err());
    // Healed: the ticks come again.
    assert_eq!(http(proxy.http, "POST", "/v1/route/link/heal", "").await.0, 200);
    tokio::time::timeout(Duration::from_secs(5), s.read(&mut sink)).await.unwrap().unwrap();
    for bad in ["sideways", ""] {
        let (code, body) = http(proxy.http, "POST", &format!("/v1/route/link/cut?direction={bad}"), "").await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_route_delivers_everything_in_order_and_late() {
    let echo = echo_server().await;
    let (proxy, _tasks) = strata_link_proxy::start(config(&[("lossy", echo, 0.0, 0.0)])).await.unwrap();
    let (code, body) = http(proxy.http, "PUT", "/v1/route/lossy", r#"{"loss_pct": 25}"#).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""loss_pct":25"#), "{body}");
    let mut s = TcpStream::connect(proxy.routes["lossy"].listen).await.unwrap();
    // Round trips of two chunks, each lost a quarter of the time: about
    // seven in sixteen wait a retransmission timeout (200 ms), and every
    // byte arrives.
    let mut late = 0;
    for _ in 0..16 {
        if round_trip(&mut s, 100).await >= Duration::from_millis(200) {
            late += 1;
        }
    }
    assert!((2..=16).contains(&late), "{late} of 16 round trips waited for a retransmission");
    assert_eq!(http(proxy.http, "PUT", "/v1/route/lossy", r#"{"loss_pct": 101}"#).await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded_and_bad_requests_refused() {
    let echo = echo_server().await;
    let (proxy, _tasks) = strata_link_proxy::start(config(&[("link", echo, 0.0, 0.0)])).await.unwrap();
    let route = proxy.routes["link"].listen;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(route).await.unwrap();
        round_trip(&mut s, 10).await;
        held.push(s);
    }
    // The fifth is closed at once.
    let mut over = TcpStream::connect(route).await.unwrap();
    let mut buf = [0u8; 1];
    let got = tokio::time::timeout(Duration::from_secs(5), over.read(&mut buf)).await.unwrap();
    assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
    drop(held);

    for (method, path, body, want) in [
        ("PUT", "/v1/route/nope", r#"{"delay_ms": 1}"#, 404),
        ("POST", "/v1/route/nope/cut", "", 404),
        ("PUT", "/v1/route/link", r#"{"delay_ms": -5}"#, 400),
        ("PUT", "/v1/route/link", r#"{"delay_ms": 1, "bogus": 2}"#, 400),
        ("PUT", "/v1/route/link", "{", 400),
    ] {
        let (code, answer) = http(proxy.http, method, path, body).await;
        assert_eq!(code, want, "{method} {path} {body}: {answer}");
        assert!(answer.contains("\"error\""), "{answer}");
    }
    let (code, text) = http(proxy.http, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    assert!(text.contains("strata_link_proxy_connections_refused_total 1"), "{text}");
}
