//! The WAL receiver of a timeline: streams committed WAL from the safekeeper
//! that has the most, decodes it and feeds the records to ingest. On any
//! connection failure it reconnects (to whichever safekeeper is then best)
//! and resumes from the last record ingested; after a restart that is
//! `disk_consistent_lsn`, so WAL is re-ingested from what is durable.
//!
//! When no safekeeper holds the WAL it needs any more (they removed it once
//! it was offloaded: the pageserver came back from an older state), it reads
//! the offloaded segments from object storage, one at a time, and goes back
//! to the safekeepers from the end of each: the decoder carries a record
//! that runs on into the next segment across the switch.
//!
//! One thread per timeline while it is active: ingest is CPU-bound, and
//! blocking sockets with timeouts keep the loop simple. A timeline that
//! receives no WAL for `idle_after` makes what it ingested durable, reports
//! it, and ends its stream and both threads (`idle.rs`); the watcher
//! (`watcher.rs`) starts them again.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_formats::wal::reader::{StartPosition, WalDecodeError, WalDecoder};
use strata_formats::Lsn;
use strata_protocol::decoded_wal::StreamFormat;
use strata_protocol::framed::{FrameError, FrameReader};
use strata_protocol::safekeeper::codec::{self, CodecError};
use strata_protocol::safekeeper::{
    ConsumerFeedback, ConsumerMessage, ErrorCode, StartStreaming, StreamMessage, PROTOCOL_VERSION,
};
use strata_protocol::Token;
use strata_service::panic_message;
use strata_service::tls::{BlockingStream, ClientTls};
use tracing::{info, warn};

use crate::config::WalStreamChoice;
use crate::decoded_ingest::{DecodedInput, DecodedInputError};
use crate::idle::{next_step, Quiet, Step};
use crate::ingest::{IngestError, WalIngest};
use crate::timeline::{BrokenKind, Timeline};

use crate::limits::{
    BROKEN_RECEIVER_POLL, FLUSH_POLL, MAX_LAYER_AGE, SITE_RETURN_PROBE, SITE_SLACK, WAL_BEHIND_GRACE as BEHIND_GRACE,
    WAL_CONNECT_TIMEOUT as CONNECT_TIMEOUT, WAL_FEEDBACK_INTERVAL as FEEDBACK_INTERVAL, WAL_MAX_BACKOFF as MAX_BACKOFF,
    WAL_MIN_BACKOFF as MIN_BACKOFF, WAL_POLL as POLL, WAL_PROBE_AFTER as PROBE_AFTER, WAL_READ_TIMEOUT as READ_TIMEOUT,
};

/// What the status API shows about a timeline's WAL source.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReceiverStatus {
    pub safekeeper: Option<String>,
    pub safekeeper_commit_lsn: Lsn,
    pub last_error: Option<String>,
}

/// The threads of a receiver could not be started (the process is out
/// of threads or memory): an error for this timeline, not a panic.
#[derive(Debug, thiserror::Error)]
#[error("starting thread {name}: {source}")]
pub struct SpawnError {
    pub name: String,
    #[source]
    pub source: std::io::Error,
}

/// Where a timeline's WAL comes from: the safekeepers' addresses, the
/// token that lets this pageserver read from them (never logged), and TLS
/// with the cluster's CA (none: plaintext).
#[derive(Clone, Debug, Default)]
pub struct WalSources {
    pub safekeepers: Vec<String>,
    /// How many of `safekeepers`, from the first, are in this pageserver's
    /// site (0: no preference).
    pub site: usize,
    pub token: Option<Token>,
    pub tls: Option<ClientTls>,
    /// A timeline that receives no WAL for this long goes idle (`idle.rs`);
    /// none: it streams as long as it is attached (no watcher would wake it).
    pub idle_after: Option<Duration>,
    /// Raw or decoded WAL (`pageserver.toml`'s `wal_stream`).
    pub wal_stream: WalStreamChoice,
}

/// Handle to a running receiver.
pub struct WalReceiver {
    pub status: Arc<Mutex<ReceiverStatus>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl WalReceiver {
    /// Starts the receiver and the flusher of `tl`, which report in
    /// `status` (kept across the idle periods of the timeline). A panic in
    /// either breaks this timeline only (its memory is re-read from disk
    /// later).
    pub fn spawn(
        tl: Arc<Timeline>,
        sources: WalSources,
        status: Arc<Mutex<ReceiverStatus>>,
    ) -> Result<WalReceiver, SpawnError> {
        let stop = Arc::new(AtomicBool::new(false));
        let receiver = {
            let (tl2, status, stop) = (tl.clone(), status.clone(), stop.clone());
            spawn_guarded(format!("wal-{}", tl.timeline_id), tl.clone(), move || {
                receive_loop(tl2, sources, status, stop)
            })?
        };
        let flusher = {
            let (tl2, stop2) = (tl.clone(), stop.clone());
            match spawn_guarded(format!("flush-{}", tl.timeline_id), tl.clone(), move || flush_loop(tl2, stop2)) {
                Ok(f) => f,
                Err(e) => {
                    stop.store(true, Ordering::SeqCst);
                    let _ = receiver.join();
                    return Err(e);
                }
            }
        };
        Ok(WalReceiver { status, stop, threads: vec![receiver, flusher] })
    }

    /// Stops both threads and waits for them (the flusher writes what is frozen first).
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts a thread of `tl`'s own: failing to start it is an error (no
/// threads left), and a panic in it breaks `tl` only.
pub fn spawn_guarded(
    name: String,
    tl: Arc<Timeline>,
    body: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, SpawnError> {
    let thread_name = name.clone();
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                let message = panic_message(payload.as_ref());
                tl.set_broken(BrokenKind::Panic, format!("thread {thread_name} panicked: {message}"));
            }
        })
        .map_err(|source| SpawnError { name, source })
}

fn flush_loop(tl: Arc<Timeline>, stop: Arc<AtomicBool>) {
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if tl.broken_reason().is_none() {
            // A failure breaks the timeline (see `Timeline::flush_frozen`).
            if let Err(e) = tl.flush_frozen() {
                tracing::error!(timeline = %tl.timeline_id, "{e}");
            }
        }
        if stopping {
            return;
        }
        tl.clock().sleep_blocking(FLUSH_POLL);
    }
}

fn receive_loop(tl: Arc<Timeline>, sources: WalSources, status: Arc<Mutex<ReceiverStatus>>, stop: Arc<AtomicBool>) {
    let clock = tl.clock().clone();
    let mut backoff = MIN_BACKOFF;
    let mut ingest = None;
    // A decoder fed up to a segment's end from object storage: the next
    // stream starts there, and a record cut by the segment end goes on.
    let mut carried: Option<WalDecoder> = None;
    // A safekeeper found lagging behind another: not chosen again while
    // another answers (an own-site preference would otherwise return to it).
    let mut lagging: Option<String> = None;
    // When WAL last arrived (or the receiver started): what idling counts from.
    let mut last_wal = clock.now();
    let mut leaving = false;
    // After a decoded stream met a record too large for it: raw WAL until
    // ingest has passed that record.
    let mut raw_until: Option<Lsn> = None;
    while !stop.load(Ordering::SeqCst) {
        if tl.broken_reason().is_some() {
            clock.sleep_blocking(BROKEN_RECEIVER_POLL);
            continue;
        }
        if ingest.is_none() {
            match WalIngest::new(tl.clone()) {
                Ok(i) => ingest = Some(i),
                Err(e) => {
                    tl.set_broken(BrokenKind::Ingest, format!("cannot start ingest: {e}"));
                    continue;
                }
            }
        }
        let ingest = ingest.as_mut().expect("set above");
        let start = carried.as_ref().map_or_else(|| tl.record_lsns().last, WalDecoder::input_lsn);
        if raw_until.is_some_and(|until| start > until) {
            raw_until = None;
        }
        let format = stream_format(&tl, &sources, carried.is_some() || raw_until.is_some());
        let result = match connect_best(&tl, &sources, &status, start, lagging.as_deref(), format) {
            Ok((addr, stream, commit)) => {
                info!(timeline = %tl.timeline_id, safekeeper = %addr, %start, %commit, ?format, "streaming WAL");
                backoff = MIN_BACKOFF;
                status.lock().last_error = None;
                let link = Link { addr: &addr, sources: &sources, status: &status, stop: &stop };
                let input = match format {
                    StreamFormat::Decoded => Input::Decoded(DecodedInput::new(start)),
                    StreamFormat::Raw => Input::Raw(carried.take().unwrap_or_else(|| new_decoder(&tl))),
                };
                stream_wal(&tl, ingest, input, stream, &link, &mut last_wal, raw_until)
            }
            Err(StreamError::Connection(LinkError::NoSource { start, failures }))
                if failures.iter().any(|(_, e)| matches!(e, LinkError::WalRemoved(_))) =>
            {
                read_offloaded(&tl, ingest, &mut carried, &status, start).map(|()| {
                    backoff = MIN_BACKOFF;
                    last_wal = clock.now();
                    Ended::Stopped
                })
            }
            Err(e) => Err(e),
        };
        if result.is_err() {
            // Resume from the last record ingested.
            carried = None;
        }
        match result {
            Ok(Ended::Stopped) => {}
            Ok(Ended::Idle(received)) => {
                if tl.activity.try_leave(received) {
                    info!(timeline = %tl.timeline_id, %received, "idle: WAL stream and threads end until there is WAL or a read");
                    status.lock().safekeeper = None;
                    tl.metrics.timelines_gone_idle.inc();
                    // The flusher ends too (nothing is left to flush).
                    stop.store(true, Ordering::SeqCst);
                    leaving = true;
                }
            }
            Err(StreamError::Connection(LinkError::RecordTooLarge { lsn, message })) => {
                info!(timeline = %tl.timeline_id, "{message}; streaming raw WAL past it");
                raw_until = Some(lsn.unwrap_or_else(|| tl.record_lsns().last));
            }
            Err(e) => {
                let wait = stream_failed(&tl, e, &status, &mut lagging);
                if wait {
                    clock.sleep_blocking(backoff);
                    backoff = next_backoff(backoff);
                }
            }
        }
    }
    // Freeze what was ingested so the flusher makes it durable before exit.
    tl.freeze();
    if leaving {
        tl.activity.left();
    }
}

/// Records why a stream ended in an error; true if the receiver waits
/// (backs off) before it connects again.
fn stream_failed(tl: &Timeline, e: StreamError, status: &Mutex<ReceiverStatus>, lagging: &mut Option<String>) -> bool {
    match e {
        // The tenant left this pageserver while a record was ingested: nothing is wrong with it.
        StreamError::Ingest(_) if tl.is_detached() => {
            info!(timeline = %tl.timeline_id, "the tenant left this pageserver; ingest stopped");
            false
        }
        e @ (StreamError::Ingest(_) | StreamError::Decode(_) | StreamError::Record(_)) => {
            tl.set_broken(BrokenKind::Ingest, e.to_string());
            false
        }
        StreamError::Broken(reason) => {
            info!(timeline = %tl.timeline_id, %reason, "the timeline is broken; stopped streaming WAL");
            let mut s = status.lock();
            s.safekeeper = None;
            s.last_error = Some(format!("not streaming: the timeline is broken: {reason}"));
            false
        }
        StreamError::Connection(e) => {
            warn!(timeline = %tl.timeline_id, "WAL stream: {e}");
            match &e {
                // Passed over until an own-site one is found caught up.
                LinkError::Behind { current, .. } => *lagging = Some(current.clone()),
                LinkError::SiteCaughtUp(_) => *lagging = None,
                _ => {}
            }
            let mut s = status.lock();
            s.last_error = Some(e.to_string());
            s.safekeeper = None;
            true
        }
    }
}

/// A decoded batch that failed: a record that does not decode or ingest
/// stops the timeline as raw WAL's would; a damaged or misplaced batch
/// ends the stream.
fn decoded_failure(e: DecodedInputError) -> StreamError {
    match e {
        DecodedInputError::Ingest(e) => StreamError::Ingest(e),
        e @ DecodedInputError::Record { .. } => StreamError::Record(e.to_string()),
        e => StreamError::Connection(LinkError::Decoded(e)),
    }
}

/// The wait before the next reconnection, after one of `backoff` failed.
fn next_backoff(backoff: Duration) -> Duration {
    (backoff * 2).min(MAX_BACKOFF)
}

/// How a stream ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// The receiver was told to stop, or the stream ended (connect again).
    Stopped,
    /// The timeline may go idle: it received WAL up to this LSN, all of it
    /// durable and reported.
    Idle(Lsn),
}

/// The stream a receiver reads: the safekeeper's address, every
/// safekeeper, the status it reports in and its stop flag.
struct Link<'a> {
    addr: &'a str,
    sources: &'a WalSources,
    status: &'a Mutex<ReceiverStatus>,
    stop: &'a AtomicBool,
}

/// Why streaming stopped.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// Retry, possibly with another safekeeper.
    #[error(transparent)]
    Connection(#[from] LinkError),
    /// The WAL cannot be ingested: the timeline stops.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The WAL does not decode: the timeline stops.
    #[error("WAL decoding failed: {0}")]
    Decode(#[from] WalDecodeError),
    /// A record of a decoded stream does not decode: the timeline stops.
    #[error("decoded WAL: {0}")]
    Record(String),
    /// The timeline broke meanwhile (a flush failed): ingest stops.
    #[error("the timeline is broken: {0}")]
    Broken(String),
}

/// Why a stream from a safekeeper failed; the receiver retries.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("address does not resolve")]
    NoAddress,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("undecodable message: {0}")]
    Codec(#[from] CodecError),
    #[error("no answer from the safekeeper within {0:?}")]
    NoAnswer(Duration),
    #[error("nothing from the safekeeper for {0:?}")]
    Silent(Duration),
    #[error("system id {got} is not the timeline's {want}")]
    SystemId { got: u64, want: u64 },
    #[error("safekeeper error: {0}")]
    Refused(String),
    #[error("the safekeeper no longer holds that WAL: {0}")]
    WalRemoved(String),
    #[error("offloaded WAL: {0}")]
    Offloaded(String),
    #[error("unexpected message: {0}")]
    Unexpected(String),
    #[error("a decoded stream cannot send a record: {message}")]
    RecordTooLarge { lsn: Option<Lsn>, message: String },
    #[error(transparent)]
    Decoded(DecodedInputError),
    #[error("WAL at {got} does not continue {expected}")]
    Gap { got: Lsn, expected: Lsn },
    #[error("{other} has committed up to {commit}, beyond {current}; switching")]
    Behind { other: String, commit: Lsn, current: String },
    #[error("{0}, of this pageserver's site, has caught up; switching back to it")]
    SiteCaughtUp(String),
    #[error("no safekeeper streams from {start}: {}", list_failures(.failures))]
    NoSource { start: Lsn, failures: Vec<(String, LinkError)> },
}

fn list_failures(failures: &[(String, LinkError)]) -> String {
    failures.iter().map(|(addr, e)| format!("{addr}: {e}")).collect::<Vec<_>>().join("; ")
}

impl WalSources {
    /// Whether `addr` is in this pageserver's site (every source is
    /// without a site preference).
    fn is_local(&self, addr: &str) -> bool {
        self.site == 0 || self.safekeepers.iter().take(self.site).any(|a| a == addr)
    }
}

/// Opens a stream on every safekeeper and keeps the one with the highest
/// commit LSN; an own-site one within [`SITE_SLACK`] of it is kept instead.
/// `lagging` is taken only if no other answers.
fn connect_best(
    tl: &Timeline,
    sources: &WalSources,
    status: &Mutex<ReceiverStatus>,
    start: Lsn,
    lagging: Option<&str>,
    format: StreamFormat,
) -> Result<(String, OpenStream, Lsn), StreamError> {
    // (address, stream, commit LSN) of the best of each kind.
    let mut best: Option<(String, OpenStream, Lsn)> = None;
    let mut best_local: Option<(String, OpenStream, Lsn)> = None;
    let mut failures = Vec::new();
    let mut passed_over = None;
    for addr in &sources.safekeepers {
        match open_stream(tl, addr, sources, start, format) {
            Ok(s) if Some(addr.as_str()) == lagging => passed_over = Some((addr.clone(), s.commit, s)),
            Ok(s) => {
                let commit = s.commit;
                let slot = if sources.is_local(addr) { &mut best_local } else { &mut best };
                if slot.as_ref().is_none_or(|b| commit > b.2) {
                    *slot = Some((addr.clone(), s, commit));
                }
            }
            Err(e) => failures.push((addr.clone(), e)),
        }
    }
    let best = match (best_local, best) {
        (Some(l), Some(r)) if l.2 .0.saturating_add(SITE_SLACK) >= r.2 .0 => Some(l),
        (Some(l), None) => Some(l),
        (_, r) => r,
    };
    let best = best.or_else(|| passed_over.map(|(a, c, s)| (a, s, c)));
    let best = best.ok_or(LinkError::NoSource { start, failures })?;
    tl.metrics.walreceiver_connects.inc();
    let mut s = status.lock();
    s.safekeeper = Some(best.0.clone());
    s.safekeeper_commit_lsn = best.2;
    Ok(best)
}

/// An open stream: its frames (the socket, with bytes of the next frames
/// already read with the first message) and the safekeeper's commit LSN.
struct OpenStream {
    frames: FrameReader<BlockingStream>,
    commit: Lsn,
}

fn open_stream(
    tl: &Timeline,
    addr: &str,
    sources: &WalSources,
    start: Lsn,
    format: StreamFormat,
) -> Result<OpenStream, LinkError> {
    let sockaddr = addr.to_socket_addrs()?.next().ok_or(LinkError::NoAddress)?;
    let tcp = TcpStream::connect_timeout(&sockaddr, CONNECT_TIMEOUT)?;
    // The TLS handshake runs under these timeouts too, with the first write.
    tcp.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    tcp.set_write_timeout(Some(READ_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let mut stream = match &sources.tls {
        Some(tls) => tls.connect_blocking(strata_service::tls::host_of(addr), tcp)?,
        None => BlockingStream::Plain(tcp),
    };
    let mut out = Vec::new();
    codec::encode_consumer(
        &ConsumerMessage::Start(StartStreaming {
            protocol_version: PROTOCOL_VERSION,
            tenant_id: tl.tenant_id.tenant,
            timeline_id: tl.timeline_id,
            start_lsn: start,
            stop_lsn: Lsn::INVALID,
            include_uncommitted: false,
            consumer_id: format!("pageserver/{}", tl.timeline_id),
            token: sources.token.clone(),
            // Safekeepers stop feeding a generation once a newer one has
            // streamed: a pageserver fenced by the controller is starved too.
            generation: tl.remote().map_or(0, |r| r.generation),
            // Fenced per shard: each shard fails over on its own.
            shard: tl.tenant_id.shard,
            format,
            stripe_blocks: tl.shard.stripe_blocks,
        }),
        &mut out,
    );
    stream.write_all(&out)?;
    stream.flush()?;
    let mut frames = FrameReader::new(stream, codec::MAX_FRAME_SIZE);
    match read_message(&mut frames)? {
        StreamMessage::Start(s) => {
            let meta = tl.metadata();
            if s.timeline.system_id != meta.system_id {
                return Err(LinkError::SystemId { got: s.timeline.system_id, want: meta.system_id });
            }
            frames.get_ref().tcp().set_read_timeout(Some(POLL))?;
            Ok(OpenStream { frames, commit: s.commit_lsn })
        }
        StreamMessage::Error(e) => Err(refusal(e.code, e.message)),
        other => Err(LinkError::Unexpected(format!("{other:?} as the first message"))),
    }
}

fn refusal(code: ErrorCode, message: String) -> LinkError {
    match code {
        ErrorCode::WalRemoved => LinkError::WalRemoved(message),
        ErrorCode::RecordTooLarge => {
            // The message names the record's LSN ("the record at 0/16B3F28 ...").
            let lsn = message.split_whitespace().find_map(|w| w.parse::<Lsn>().ok());
            LinkError::RecordTooLarge { lsn, message }
        }
        _ => LinkError::Refused(message),
    }
}

/// The format a timeline's next stream asks for: raw when a decoder
/// carries a record cut by an offloaded segment's end, or past a record
/// too large for a decoded stream; else as configured.
fn stream_format(tl: &Timeline, sources: &WalSources, must_be_raw: bool) -> StreamFormat {
    if !must_be_raw && sources.wal_stream.decoded(!tl.shard.index.is_unsharded()) {
        StreamFormat::Decoded
    } else {
        StreamFormat::Raw
    }
}

/// What a stream feeds: a decoder of raw WAL, or decoded batches.
enum Input {
    Raw(WalDecoder),
    Decoded(DecodedInput),
}

impl Input {
    /// How far the safekeeper's WAL has been read into this input.
    fn read_lsn(&self) -> Lsn {
        match self {
            Input::Raw(d) => d.input_lsn(),
            Input::Decoded(d) => d.read_lsn(),
        }
    }
}

/// A decoder of `tl`'s WAL from the end of the last record ingested.
fn new_decoder(tl: &Timeline) -> WalDecoder {
    let meta = tl.metadata();
    let lsns = tl.record_lsns();
    let mut decoder =
        WalDecoder::new(tl.pg_version, lsns.last, u64::from(meta.wal_segment_size), StartPosition::RecordBoundary);
    decoder.set_system_id(meta.system_id);
    if lsns.prev != Lsn::INVALID {
        decoder.set_prev_record(lsns.prev);
    }
    decoder
}

/// Ingests every whole record the decoder holds and makes them visible
/// together (also those before a record that fails).
fn ingest_decoded(tl: &Timeline, ingest: &mut WalIngest, decoder: &mut WalDecoder) -> Result<(), StreamError> {
    let result = add_decoded(tl, ingest, decoder);
    ingest.commit();
    result
}

fn add_decoded(tl: &Timeline, ingest: &mut WalIngest, decoder: &mut WalDecoder) -> Result<(), StreamError> {
    let mut records = 0;
    let result = loop {
        if tl.is_broken() {
            // Not even the rest of this message (a flush failed meanwhile).
            break Ok(());
        }
        match decoder.next_record() {
            Ok(Some(rec)) => match ingest.add(&rec) {
                Ok(()) => records += 1,
                Err(e) => break Err(e.into()),
            },
            Ok(None) => break Ok(()),
            Err(e) => break Err(e.into()),
        }
    };
    tl.metrics.records_ingested.inc_by(records);
    result
}

/// Ingests the offloaded segment that holds `start` (no safekeeper holds
/// it any more), leaving the decoder at the segment's end in `carried`.
fn read_offloaded(
    tl: &Timeline,
    ingest: &mut WalIngest,
    carried: &mut Option<WalDecoder>,
    status: &Mutex<ReceiverStatus>,
    start: Lsn,
) -> Result<(), StreamError> {
    let Some(remote) = tl.remote() else {
        return Err(LinkError::Offloaded(format!(
            "the safekeepers removed the WAL at {start}, and this pageserver has no object storage to read it from"
        ))
        .into());
    };
    let segment_size = u64::from(tl.metadata().wal_segment_size);
    let segno = start.0 / segment_size;
    let fetched = remote
        .fetch_wal_segment(segno, segment_size)
        .map_err(|e| LinkError::Offloaded(format!("segment {segno} (for {start}): {e}")))?;
    let Some((_, bytes)) = fetched else {
        return Err(LinkError::Offloaded(format!(
            "the safekeepers removed the WAL at {start}, and segment {segno} is not in object storage"
        ))
        .into());
    };
    let mut decoder = carried.take().unwrap_or_else(|| new_decoder(tl));
    debug_assert_eq!(decoder.input_lsn(), start, "a carried decoder continues where it stopped");
    info!(timeline = %tl.timeline_id, %start, segno, "reading offloaded WAL from object storage");
    {
        let mut s = status.lock();
        s.safekeeper = Some("object storage".into());
        s.last_error = None;
    }
    let from = (start.0 % segment_size) as usize;
    decoder.feed(&bytes[from..]);
    tl.metrics.wal_bytes_ingested.inc_by((bytes.len() - from) as u64);
    tl.metrics.wal_segments_from_object_storage.inc();
    ingest_decoded(tl, ingest, &mut decoder)?;
    if tl.should_freeze(MAX_LAYER_AGE) {
        tl.freeze();
    }
    *carried = Some(decoder);
    Ok(())
}

/// Reads one stream message (bounded by the socket's read timeout, the
/// connection's first one).
fn read_message(frames: &mut FrameReader<BlockingStream>) -> Result<StreamMessage, LinkError> {
    poll_message(frames)?.ok_or(LinkError::NoAnswer(CONNECT_TIMEOUT))
}

/// The next stream message, or `None` if none came within the socket's read
/// timeout (what was read of a message stays buffered for the next call).
fn poll_message(frames: &mut FrameReader<BlockingStream>) -> Result<Option<StreamMessage>, LinkError> {
    match frames.read_frame_blocking() {
        Ok(frame) => Ok(Some(codec::decode_stream(frame)?)),
        Err(FrameError::Timeout(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a safekeeper other than `current` has committed WAL beyond `lsn`.
fn other_has_more(tl: &Timeline, sources: &WalSources, current: &str, lsn: Lsn) -> Option<(String, Lsn)> {
    let others = sources.safekeepers.iter().filter(|a| a.as_str() != current);
    others.into_iter().find_map(|addr| match open_stream(tl, addr, sources, lsn, StreamFormat::Raw) {
        Ok(s) if s.commit > lsn => Some((addr.clone(), s.commit)),
        _ => None,
    })
}

/// An own-site safekeeper that has committed at least to `lsn`, if any
/// (the stream from another site ends, and the next one starts there).
fn own_site_caught_up(tl: &Timeline, sources: &WalSources, lsn: Lsn) -> Option<String> {
    let own = sources.safekeepers.iter().take(sources.site);
    own.into_iter().find_map(|addr| match open_stream(tl, addr, sources, lsn, StreamFormat::Raw) {
        Ok(s) if s.commit >= lsn => Some(addr.clone()),
        _ => None,
    })
}

/// The feedback `tl` gives now. A reader (`docs/sites.md`) reports
/// nothing: its ingest must not hold back the writer, and its index is not
/// its own.
fn feedback_now(tl: &Timeline) -> ConsumerFeedback {
    if tl.remote().is_some_and(|r| r.is_reader()) {
        return ConsumerFeedback { applied_lsn: Lsn::INVALID, remote_consistent_lsn: Lsn::INVALID };
    }
    ConsumerFeedback {
        applied_lsn: tl.feedback_lsn(),
        remote_consistent_lsn: tl.remote_consistent_lsn().unwrap_or(Lsn::INVALID),
    }
}

fn send_feedback(frames: &mut FrameReader<BlockingStream>, feedback: &ConsumerFeedback) -> Result<(), LinkError> {
    let mut out = Vec::new();
    codec::encode_consumer(&ConsumerMessage::Feedback(feedback.clone()), &mut out);
    frames.get_mut().write_all(&out).and_then(|()| frames.get_mut().flush())?;
    Ok(())
}

/// Whether object storage holds every layer file of `tl` (true without
/// object storage, and for a reader, which never uploads).
fn all_uploaded(tl: &Timeline) -> bool {
    match tl.remote() {
        Some(r) if !r.is_reader() => r.remote_consistent_lsn() >= tl.disk_consistent_lsn(),
        _ => true,
    }
}

/// Where the receiver stands about idling (`idle::next_step`): freezes the
/// in-memory layer when that is the step, and answers the LSN received up
/// to when the timeline may go idle.
fn idle_step(tl: &Timeline, idle_after: Duration, q: Quiet, received: Lsn) -> Option<Lsn> {
    match next_step(&q, idle_after) {
        Step::Stream => None,
        Step::Freeze => {
            tl.freeze();
            None
        }
        Step::Leave => Some(received),
    }
}

fn stream_wal(
    tl: &Timeline,
    ingest: &mut WalIngest,
    mut input: Input,
    open: OpenStream,
    link: &Link,
    last_wal: &mut Instant,
    raw_until: Option<Lsn>,
) -> Result<Ended, StreamError> {
    let OpenStream { mut frames, .. } = open;
    let (current, sources, status) = (link.addr, link.sources, link.status);
    let clock = &**tl.clock();
    let started = clock.now();
    // Feedback goes out at once; what it said last, for idling.
    let mut last_feedback: Option<(Instant, ConsumerFeedback)> = None;
    let mut last_heard = started;
    // When ingest last advanced: a stream that stops advancing may come from
    // a safekeeper the quorum left behind.
    let mut progress = (tl.record_lsns().last, started);
    let mut last_site_probe = started;
    // Another safekeeper that had committed more when the current one had
    // sent nothing for a while, and since when.
    let mut behind: Option<(String, Lsn, Instant)> = None;
    while !link.stop.load(Ordering::SeqCst) {
        if let Some(reason) = tl.broken_reason() {
            // Nothing more goes into a broken timeline: it cannot be read or
            // flushed, and the memory it took would grow without bound.
            return Err(StreamError::Broken(reason));
        }
        let last = tl.record_lsns().last;
        if last != progress.0 {
            progress = (last, clock.now());
            behind = None;
        } else if let Some((addr, commit, since)) = &behind {
            // Still nothing after the grace: the current one lags.
            if clock.since(*since) >= BEHIND_GRACE {
                return Err(
                    LinkError::Behind { other: addr.clone(), commit: *commit, current: current.to_string() }.into()
                );
            }
        } else if clock.since(progress.1) >= PROBE_AFTER {
            behind = other_has_more(tl, sources, current, last).map(|(a, c)| (a, c, clock.now()));
            progress.1 = clock.now();
        }
        if !sources.is_local(current) && clock.since(last_site_probe) >= SITE_RETURN_PROBE {
            last_site_probe = clock.now();
            if let Some(addr) = own_site_caught_up(tl, sources, last) {
                return Err(LinkError::SiteCaughtUp(addr).into());
            }
        }
        let feedback = feedback_now(tl);
        if last_feedback.as_ref().is_none_or(|(at, _)| clock.since(*at) >= FEEDBACK_INTERVAL) {
            send_feedback(&mut frames, &feedback)?;
            last_feedback = Some((clock.now(), feedback.clone()));
        }
        if tl.should_freeze(MAX_LAYER_AGE) {
            tl.freeze();
        }
        if let (Some(idle_after), None) = (sources.idle_after, &behind) {
            let q = Quiet {
                quiet_for: clock.since(*last_wal),
                caught_up: input.read_lsn() >= status.lock().safekeeper_commit_lsn,
                readers_waiting: tl.activity.waiters() > 0,
                durable: tl.is_all_durable(),
                uploaded: all_uploaded(tl),
                reported: last_feedback.as_ref().is_some_and(|(_, f)| *f == feedback),
            };
            if let Some(received) = idle_step(tl, idle_after, q, input.read_lsn()) {
                return Ok(Ended::Idle(received));
            }
        }
        let Some(message) = poll_message(&mut frames)? else {
            if clock.since(last_heard) >= READ_TIMEOUT {
                return Err(LinkError::Silent(READ_TIMEOUT).into());
            }
            continue;
        };
        last_heard = clock.now();
        match (message, &mut input) {
            (StreamMessage::Wal(w), Input::Raw(decoder)) => {
                if w.begin_lsn != decoder.input_lsn() {
                    return Err(LinkError::Gap { got: w.begin_lsn, expected: decoder.input_lsn() }.into());
                }
                status.lock().safekeeper_commit_lsn = w.commit_lsn;
                if !w.wal.is_empty() {
                    *last_wal = clock.now();
                }
                decoder.feed(&w.wal);
                tl.metrics.wal_bytes_ingested.inc_by(w.wal.len() as u64);
                tl.metrics.wal_stream_bytes.inc_by(w.wal.len() as u64);
                ingest_decoded(tl, ingest, decoder)?;
                if raw_until.is_some_and(|until| tl.record_lsns().last > until) {
                    // Past the record a decoded stream could not send: back to one.
                    return Ok(Ended::Stopped);
                }
            }
            (StreamMessage::Decoded(d), Input::Decoded(decoded)) => {
                status.lock().safekeeper_commit_lsn = d.commit_lsn;
                let read_before = decoded.read_lsn();
                let records = decoded.ingest(tl, ingest, &d).map_err(decoded_failure)?;
                if d.read_lsn > read_before {
                    *last_wal = clock.now();
                }
                tl.metrics.records_ingested.inc_by(records);
                tl.metrics.wal_bytes_ingested.inc_by(d.read_lsn.0 - read_before.0);
                tl.metrics.wal_stream_bytes.inc_by(d.payload.len() as u64);
                tl.metrics.decoded_batches.inc();
            }
            (m @ (StreamMessage::Wal(_) | StreamMessage::Decoded(_)), _) => {
                return Err(LinkError::Unexpected(format!("{m:?} in a stream of another format")).into());
            }
            (StreamMessage::Keepalive { commit_lsn, .. }, _) => status.lock().safekeeper_commit_lsn = commit_lsn,
            (StreamMessage::Error(e), _) => return Err(refusal(e.code, e.message).into()),
            (StreamMessage::Start(_), _) => return Err(LinkError::Unexpected("a second stream start".into()).into()),
        }
    }
    Ok(Ended::Stopped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnections_back_off_from_the_shortest_wait_to_the_longest() {
        let mut waits = vec![MIN_BACKOFF];
        while *waits.last().unwrap() < MAX_BACKOFF {
            waits.push(next_backoff(*waits.last().unwrap()));
        }
        assert_eq!(waits.len(), 7, "{waits:?}");
        assert_eq!(next_backoff(MAX_BACKOFF), MAX_BACKOFF, "and stays there");
    }
}
