//! Safekeeper append throughput: the acceptor and its segment store, in
//! process, appending `--append-size` bytes at a time with an fsync per
//! append (no batching), for `--total-mb`. Prints one JSON line.
//! Driven by `bench/safekeeper_append.py`, which measures the disk alongside.

use strata_service::clock::{Clock, SystemClock};

use strata_formats::Lsn;
use strata_protocol::safekeeper::{
    AppendRequest, ProposerElected, ProposerMessage, TermHistory, TermLsn, TimelineIdentity, VoteRequest,
};
use strata_protocol::{NodeId, TenantId, TimelineId};
use strata_safekeeper::acceptor::{Acceptor, ControlStore, PersistentState};
use strata_safekeeper::control_file::ControlFile;
use strata_safekeeper::wal_store::SegmentStore;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.iter().position(|a| a == "--dir").and_then(|i| args.get(i + 1)).expect("--dir DIR");
    let dir = std::path::PathBuf::from(dir);
    let append = arg("--append-size", 128 << 10) as usize;
    let total = arg("--total-mb", 512) << 20;
    let segment = arg("--segment-mb", 16) << 20;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create --dir");
    let identity = TimelineIdentity {
        tenant_id: TenantId([1; 16]),
        timeline_id: TimelineId([2; 16]),
        system_id: 1,
        pg_version: 15,
        wal_segment_size: segment as u32,
    };
    let start = Lsn(segment);
    let state = PersistentState::new(&identity, start);
    let mut control = ControlFile::new(&dir, false);
    control.persist(&state).expect("control file");
    let store = SegmentStore::open(&dir, segment, start, start, false).expect("segment store");
    let mut acceptor = Acceptor::new(NodeId(1), state, store, control);
    acceptor.handle(&ProposerMessage::VoteRequest(VoteRequest { term: 1 })).expect("vote");
    acceptor
        .handle(&ProposerMessage::Elected(ProposerElected {
            term: 1,
            start_streaming_at: start,
            term_history: TermHistory(vec![TermLsn { term: 1, lsn: start }]),
            timeline_start_lsn: start,
        }))
        .expect("elected");
    let payload: Vec<u8> = (0..append).map(|i| (i * 7 + 3) as u8).collect();
    let mut at = start;
    let began = SystemClock.now();
    let mut written = 0u64;
    while written < total {
        let req = AppendRequest { term: 1, begin_lsn: at, commit_lsn: at, truncate_lsn: start, wal: payload.clone() };
        at = req.end_lsn();
        acceptor.handle(&ProposerMessage::Append(req)).expect("append");
        acceptor.flush().expect("flush");
        written += append as u64;
    }
    let secs = SystemClock.since(began).as_secs_f64();
    println!(
        "{{\"append_size\": {append}, \"segment_size\": {segment}, \"bytes\": {written}, \"seconds\": {secs:.4}, \"mb_per_s\": {:.1}, \"appends_per_s\": {:.0}}}",
        written as f64 / 1e6 / secs,
        (written / append as u64) as f64 / secs
    );
    let _ = std::fs::remove_dir_all(&dir);
}
