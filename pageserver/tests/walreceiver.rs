//! The WAL receiver against two fake safekeepers: the one it streams from
//! goes silent (no WAL, no keepalive) while the other commits more. The
//! receiver keeps sending feedback on its own clock, asks the other one
//! (every 2 s without progress) and switches to it, instead of waiting for
//! a message from the silent one that would have let its loop run again.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_formats::wal::encode::{encode_record, WalBuilder};
use strata_formats::{Lsn, PgVersion};
use strata_pageserver::walreceiver::{WalReceiver, WalSources};
use strata_protocol::framed::FrameReader;
use strata_protocol::safekeeper::history::{TermHistory, TermLsn};
use strata_protocol::safekeeper::{codec, ConsumerMessage, StreamMessage, StreamStart, TimelineIdentity, WalData};

const SEG: u64 = 16 << 20;
/// Where the timeline's WAL begins (mid-page, at a record boundary).
const START: Lsn = Lsn(0x0200_0100);

/// The WAL both safekeepers hold: `n` no-op records from START; returns the
/// bytes from START and the end LSN of each record.
fn wal(system_id: u64, n: usize) -> (Vec<u8>, Vec<Lsn>) {
    let mut b = WalBuilder::new(PgVersion::V15, system_id, 1, SEG, START, Lsn(0));
    let mut ends = Vec::new();
    for i in 0..n {
        let data = vec![i as u8; 200];
        // XLOG_NOOP: nothing to ingest but the record itself.
        b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &data));
        ends.push(b.end_lsn());
    }
    let end = b.end_lsn();
    let seg = b.into_segments().remove(0).1;
    (seg[(START.0 % SEG) as usize..(end.0 % SEG) as usize].to_vec(), ends)
}

/// A fake safekeeper: answers every StartStreaming with its current commit
/// LSN, sends the WAL up to it, then stays silent (no keepalives), counting
/// the feedback it receives.
struct FakeSafekeeper {
    addr: String,
    commit: Arc<AtomicU64>,
    feedback: Arc<AtomicUsize>,
    starts: Arc<AtomicUsize>,
}

fn fake_safekeeper(
    identity: TimelineIdentity,
    wal: Arc<Vec<u8>>,
    commit: Lsn,
    stop: Arc<AtomicBool>,
) -> FakeSafekeeper {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let commit = Arc::new(AtomicU64::new(commit.0));
    let feedback = Arc::new(AtomicUsize::new(0));
    let starts = Arc::new(AtomicUsize::new(0));
    let fake = FakeSafekeeper { addr, commit: commit.clone(), feedback: feedback.clone(), starts: starts.clone() };
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (identity, wal, commit, feedback, starts, stop) =
                (identity.clone(), wal.clone(), commit.clone(), feedback.clone(), starts.clone(), stop.clone());
            std::thread::spawn(move || serve(conn, identity, &wal, &commit, &feedback, &starts, &stop));
        }
    });
    fake
}

fn serve(
    conn: TcpStream,
    identity: TimelineIdentity,
    wal: &[u8],
    commit: &AtomicU64,
    feedback: &AtomicUsize,
    starts: &AtomicUsize,
    stop: &AtomicBool,
) {
    conn.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut frames = FrameReader::new(conn, codec::MAX_FRAME_SIZE);
    let start = loop {
        match frames.read_frame_blocking() {
            Ok(f) => match codec::decode_consumer(f).unwrap() {
                ConsumerMessage::Start(s) => break s,
                other => panic!("expected a start, got {other:?}"),
            },
            Err(e) if e.is_closed() => return,
            Err(_) if !stop.load(Ordering::SeqCst) => continue,
            Err(_) => return,
        }
    };
    starts.fetch_add(1, Ordering::SeqCst);
    let commit = Lsn(commit.load(Ordering::SeqCst));
    let mut out = Vec::new();
    codec::encode_stream(
        &StreamMessage::Start(StreamStart {
            term: 1,
            term_history: TermHistory(vec![TermLsn { term: 1, lsn: START }]),
            flush_lsn: commit,
            commit_lsn: commit,
            timeline: identity,
        }),
        &mut out,
    );
    if start.start_lsn < commit {
        let from = (start.start_lsn.0 - START.0) as usize;
        let to = (commit.0 - START.0) as usize;
        codec::encode_stream(
            &StreamMessage::Wal(WalData {
                begin_lsn: start.start_lsn,
                commit_lsn: commit,
                flush_lsn: commit,
                wal: wal[from..to].to_vec(),
            }),
            &mut out,
        );
    }
    if w.write_all(&out).is_err() {
        return;
    }
    // Silence from now on; count what the consumer sends.
    while !stop.load(Ordering::SeqCst) {
        match frames.read_frame_blocking() {
            Ok(f) => {
                if let Ok(ConsumerMessage::Feedback(_)) = codec::decode_consumer(f) {
                    feedback.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.is_closed() => return,
            Err(strata_protocol::framed::FrameError::Timeout(_)) => continue,
            Err(_) => return,
        }
    }
    let _ = w.shutdown(std::net::Shutdown::Both);
    let _ = frames.get_mut().read(&mut [0u8; 1]);
}

/// A checkpointed timeline and the WAL two fake safekeepers serve over it.
struct Setup {
    tl: Arc<strata_pageserver::timeline::Timeline>,
    identity: TimelineIdentity,
    bytes: Arc<Vec<u8>>,
    /// The ends of the 20th and the 40th (last) record.
    first: Lsn,
    more: Lsn,
}

fn setup(name: &str) -> Setup {
    let (tl, _, control) = common::imported_timeline(name, START);
    let (tenant_id, timeline_id, system_id) = (tl.tenant_id, tl.timeline_id, control.system_identifier);
    tl.checkpoint().unwrap();
    let (bytes, ends) = wal(system_id, 40);
    let identity = TimelineIdentity {
        tenant_id: tenant_id.tenant,
        timeline_id,
        system_id,
        pg_version: 15,
        wal_segment_size: SEG as u32,
    };
    Setup { tl, identity, bytes: Arc::new(bytes), first: ends[19], more: ends[39] }
}

/// Waits up to 60 s for `check`, naming `what` and where ingest is if it does not come.
// Real time: the receiver runs on real sockets and threads here.
#[allow(clippy::disallowed_methods)]
fn wait_for(tl: &strata_pageserver::timeline::Timeline, what: &str, check: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within 60 s; at {}", tl.record_lsns().last);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_silent_safekeeper_gets_feedback_and_is_left_for_one_that_committed_more() {
    let Setup { tl, identity, bytes, first, more } = setup("walreceiver");
    let stop = Arc::new(AtomicBool::new(false));
    // Both have committed `first` when the receiver starts: it takes the first.
    let silent = fake_safekeeper(identity.clone(), bytes.clone(), first, stop.clone());
    let other = fake_safekeeper(identity, bytes, first, stop.clone());
    let receiver = WalReceiver::spawn(
        tl.clone(),
        WalSources {
            safekeepers: vec![silent.addr.clone(), other.addr.clone()],
            site: 0,
            token: None,
            tls: None,
            idle_after: None,
            wal_stream: Default::default(),
        },
        Default::default(),
    )
    .unwrap();

    let wait = |what: &str, check: &dyn Fn() -> bool| wait_for(&tl, what, check);
    wait("the first WAL ingested", &|| tl.record_lsns().last == first);
    assert_eq!(receiver.status.lock().safekeeper.as_deref(), Some(silent.addr.as_str()));
    // The other safekeeper commits more; the one streamed from says nothing.
    other.commit.store(more.0, Ordering::SeqCst);
    wait("the WAL the other committed ingested", &|| tl.record_lsns().last == more);
    assert_eq!(receiver.status.lock().safekeeper.as_deref(), Some(other.addr.as_str()));
    // Feedback went on while the silent one sent nothing (one goes out
    // before the first read; any more came from the receiver's own clock).
    let fed = silent.feedback.load(Ordering::SeqCst);
    assert!(fed >= 2, "the silent safekeeper got {fed} feedback messages");
    // Asked at the start, then by the probe that found the other one ahead.
    assert!(other.starts.load(Ordering::SeqCst) >= 3, "{} starts on the other", other.starts.load(Ordering::SeqCst));

    stop.store(true, Ordering::SeqCst);
    receiver.shutdown();
    let _ = std::fs::remove_dir_all(&tl.dir);
}

#[test]
fn an_own_site_safekeeper_is_preferred_left_when_it_lags_and_returned_to_once_caught_up() {
    let Setup { tl, identity, bytes, first, more } = setup("walreceiver-site");
    let stop = Arc::new(AtomicBool::new(false));
    // The other site's safekeeper has committed more from the start, but
    // within the slack: the own site's one is streamed from.
    let own = fake_safekeeper(identity.clone(), bytes.clone(), first, stop.clone());
    let far = fake_safekeeper(identity, bytes, more, stop.clone());
    let receiver = WalReceiver::spawn(
        tl.clone(),
        WalSources {
            safekeepers: vec![own.addr.clone(), far.addr.clone()],
            site: 1,
            token: None,
            tls: None,
            idle_after: None,
            wal_stream: Default::default(),
        },
        Default::default(),
    )
    .unwrap();
    let wait = |what: &str, check: &dyn Fn() -> bool| wait_for(&tl, what, check);
    wait("the own site's WAL ingested", &|| tl.record_lsns().last == first);
    assert_eq!(receiver.status.lock().safekeeper.as_deref(), Some(own.addr.as_str()));
    // It stays behind: the receiver leaves it for the other site (and does
    // not come straight back to it for being in its own site).
    wait("the other site's WAL ingested", &|| tl.record_lsns().last == more);
    assert_eq!(receiver.status.lock().safekeeper.as_deref(), Some(far.addr.as_str()));
    // Once the own site's safekeeper has caught up, the receiver returns.
    own.commit.store(more.0, Ordering::SeqCst);
    wait("the stream back on the own site", &|| {
        receiver.status.lock().safekeeper.as_deref() == Some(own.addr.as_str())
    });
    assert_eq!(tl.record_lsns().last, more);

    stop.store(true, Ordering::SeqCst);
    receiver.shutdown();
    let _ = std::fs::remove_dir_all(&tl.dir);
}

#[test]
fn a_quiet_timeline_makes_its_wal_durable_reports_it_and_ends_its_stream_and_threads() {
    use strata_pageserver::idle::State;
    let Setup { tl, identity, bytes, first, more } = setup("walreceiver-idle");
    let stop = Arc::new(AtomicBool::new(false));
    let sk = fake_safekeeper(identity, bytes, first, stop.clone());
    tl.activity.watch(Arc::new(tokio::sync::Notify::new()));
    let sources = WalSources {
        safekeepers: vec![sk.addr.clone()],
        site: 0,
        token: None,
        tls: None,
        idle_after: Some(Duration::from_secs(1)),
        wal_stream: Default::default(),
    };
    let receiver = WalReceiver::spawn(tl.clone(), sources.clone(), Default::default()).unwrap();
    let wait = |what: &str, check: &dyn Fn() -> bool| wait_for(&tl, what, check);
    wait("the timeline to go idle", &|| tl.activity.state() == State::Left);
    // Nothing is only in memory, and the safekeeper was told (feedback goes
    // out at the start, and again once the flush moved the applied LSN).
    assert_eq!((tl.record_lsns().last, tl.disk_consistent_lsn()), (first, first));
    assert!(tl.is_all_durable());
    assert_eq!(tl.activity.received(), first);
    assert!(sk.feedback.load(Ordering::SeqCst) >= 2, "{} feedback messages", sk.feedback.load(Ordering::SeqCst));
    assert!(receiver.status.lock().safekeeper.is_none(), "the stream ended");
    receiver.shutdown();
    tl.activity.reaped();

    // WAL committed while it idled: woken, it streams from its last record.
    sk.commit.store(more.0, Ordering::SeqCst);
    assert!(tl.activity.wake());
    let receiver = WalReceiver::spawn(tl.clone(), sources, Default::default()).unwrap();
    wait("the WAL committed while idle ingested", &|| tl.record_lsns().last == more);
    assert_eq!(tl.activity.state(), State::Active, "a woken timeline streams at least idle_after");

    stop.store(true, Ordering::SeqCst);
    receiver.shutdown();
    let _ = std::fs::remove_dir_all(&tl.dir);
}
