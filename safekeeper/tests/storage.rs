//! The on-disk WAL store and control file: durability across reopen, torn
//! writes cut at the last complete record, truncation, reads across segments.

use strata_formats::wal::encode::{encode_record, WalBuilder};
use strata_formats::wal::segment::SegmentName;
use strata_formats::{Lsn, PgVersion};
use strata_protocol::safekeeper::TimelineIdentity;
use strata_protocol::{TenantId, TimelineId};
use strata_safekeeper::acceptor::{ControlStore, PersistentState, WalStore};
use strata_safekeeper::control_file::{self, ControlFile};
use strata_safekeeper::wal_store::SegmentStore;

const SEG: u64 = 1 << 20;

/// WAL bytes from `start` with `n` records of varying size, and each record's end.
fn wal(start: Lsn, n: usize) -> (Vec<u8>, Vec<Lsn>) {
    let mut b = WalBuilder::new(PgVersion::V15, 7, 1, SEG, start, Lsn(0));
    let mut ends = Vec::new();
    for i in 0..n {
        let data = vec![i as u8; (i * 997) % 20_000 + 1];
        b.append_with(|_, prev| encode_record(0, 0x20, 0, prev, &data));
        ends.push(b.end_lsn());
    }
    let end = b.end_lsn();
    let mut bytes = Vec::new();
    for (_, seg) in b.into_segments() {
        bytes.extend(seg);
    }
    let first = start.0 - start.0 % SEG;
    (bytes[(start.0 - first) as usize..(end.0 - first) as usize].to_vec(), ends)
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-sk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn reopen_finds_the_end_and_cuts_torn_writes() {
    let dir = tempdir("reopen");
    let start = Lsn(3 * SEG);
    let (bytes, ends) = wal(start, 400);
    assert!(ends.last().unwrap().0 > 5 * SEG, "the WAL spans several segments");
    let mut store = SegmentStore::open(&dir, SEG, start, start, false).unwrap();
    store.write(start, &bytes).unwrap();
    store.flush().unwrap();
    let end = store.flush_lsn();
    assert_eq!(end, *ends.last().unwrap());
    drop(store);

    // Reopening from an older hint finds the same end.
    let mut store = SegmentStore::open(&dir, SEG, start, ends[10], false).unwrap();
    assert_eq!(store.flush_lsn(), end);
    let mut back = vec![0u8; bytes.len()];
    assert_eq!(store.read(start, &mut back).unwrap(), bytes.len());
    assert_eq!(back, bytes);

    // A torn write: half of a record after the end.
    let (more, more_ends) = wal(start, 410);
    let tail = &more[bytes.len()..];
    store.write(end, &tail[..tail.len() / 2]).unwrap();
    store.flush().unwrap();
    drop(store);
    let mut store = SegmentStore::open(&dir, SEG, start, ends[100], false).unwrap();
    assert!(store.flush_lsn() >= end && store.flush_lsn() < *more_ends.last().unwrap());
    let cut = store.flush_lsn();
    assert!(more_ends.contains(&cut), "cut exactly at a record end");

    // Truncation removes later segments and zeroes the tail.
    store.truncate(ends[20]).unwrap();
    assert_eq!(store.write_lsn(), ends[20]);
    drop(store);
    let store = SegmentStore::open(&dir, SEG, start, start, false).unwrap();
    assert_eq!(store.flush_lsn(), ends[20]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn removed_segments_stay_removed_and_reads_below_them_fail() {
    let dir = tempdir("remove");
    let start = Lsn(3 * SEG + 0x780);
    let (bytes, ends) = wal(start, 400);
    let mut store = SegmentStore::open(&dir, SEG, start, start, false).unwrap();
    store.write(start, &bytes).unwrap();
    store.flush().unwrap();
    let end = store.flush_lsn();
    assert!(end.0 > 6 * SEG, "the WAL spans several segments");
    assert_eq!(store.removed_before(), start);
    // Only whole segments below the LSN go: 3 and 4, not 5 (which 5.5 is in).
    assert_eq!(store.remove_before(Lsn(5 * SEG + SEG / 2)).unwrap(), 2);
    assert_eq!(store.removed_before(), Lsn(5 * SEG));
    assert_eq!(store.remove_before(Lsn(5 * SEG)).unwrap(), 0, "nothing more below 5");
    let mut buf = vec![0u8; 100];
    let err = store.read(Lsn(4 * SEG), &mut buf).unwrap_err().to_string();
    assert!(err.contains("removed") && err.contains("0/500000"), "{err}");
    assert_eq!(store.read(Lsn(5 * SEG), &mut buf).unwrap(), 100);
    drop(store);
    // A restart finds where the WAL now begins and the same end (also
    // from a hint below it: the first record of segment 5 is searched for).
    for hint in [ends[399], start] {
        let store = SegmentStore::open(&dir, SEG, start, hint, false).unwrap();
        assert_eq!((store.removed_before(), store.flush_lsn()), (Lsn(5 * SEG), end), "hint {hint}");
    }
    let mut store = SegmentStore::open(&dir, SEG, start, ends[0], false).unwrap();
    assert!(store.read(Lsn(3 * SEG + 0x780), &mut buf).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn removed_segments_are_recycled_and_their_old_wal_is_never_read_as_new() {
    let dir = tempdir("recycle");
    let start = Lsn(3 * SEG);
    let (bytes, ends) = wal(start, 800);
    assert!(ends.last().unwrap().0 > 9 * SEG, "the WAL spans several segments");
    // The first half (segments 3 to 5 whole), then everything below 6 removed:
    // 3 and 4 are kept as spares (the most), 5 is deleted.
    let half = ends.iter().position(|e| e.0 > 6 * SEG + SEG / 3).unwrap();
    let cut = (ends[half].0 - start.0) as usize;
    let mut store = SegmentStore::open(&dir, SEG, start, start, false).unwrap();
    store.write(start, &bytes[..cut]).unwrap();
    store.flush().unwrap();
    assert_eq!(store.remove_before(Lsn(6 * SEG)).unwrap(), 3);
    assert_eq!(store.spare_segments(), 2);
    let spares = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "spare"))
            .count()
    };
    assert_eq!(spares(&dir), 2);
    // A restart keeps them.
    drop(store);
    let mut store = SegmentStore::open(&dir, SEG, start, ends[half], false).unwrap();
    assert_eq!((store.flush_lsn(), store.spare_segments()), (ends[half], 2));
    // The next two new segments (7 and 8) are the spares, full of segments
    // 3 and 4's old WAL; the WAL written into them reads back exactly.
    let end_in_8 = ends.iter().position(|e| e.0 > 8 * SEG + SEG / 4).unwrap();
    store.write(ends[half], &bytes[cut..(ends[end_in_8].0 - start.0) as usize]).unwrap();
    store.flush().unwrap();
    assert_eq!(store.spare_segments(), 0);
    assert_eq!(spares(&dir), 0);
    let mut back = vec![0u8; (ends[end_in_8].0 - 6 * SEG) as usize];
    assert_eq!(store.read(Lsn(6 * SEG), &mut back).unwrap(), back.len());
    assert_eq!(back, bytes[(6 * SEG - start.0) as usize..(ends[end_in_8].0 - start.0) as usize]);
    drop(store);
    // Reopened from any hint, the end is the last record written, not the
    // old records that follow it in the recycled file.
    for hint in [ends[half], ends[end_in_8 - 1], ends[end_in_8]] {
        let store = SegmentStore::open(&dir, SEG, start, hint, false).unwrap();
        assert_eq!(store.flush_lsn(), ends[end_in_8], "hint {hint}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recycled segment holds an older segment's WAL after the new WAL's end,
/// at the same offsets; where one of its records starts right at that end,
/// whole and with a valid CRC, only its prev-link shows it is not new WAL,
/// also when the reopen's hint is that very end (the durable position).
#[test]
fn an_old_record_right_after_the_end_is_not_taken_for_new_wal() {
    let dir = tempdir("old-record");
    let start = Lsn(3 * SEG);
    let (bytes, ends) = wal(start, 300);
    // A record end in a later segment with room after it on its page.
    let i = (1..ends.len())
        .find(|&i| ends[i].0 > 4 * SEG && ends[i].0 % 8192 > 64 && ends[i].0 % 8192 < 4096)
        .expect("a record end with room on its page");
    let end = ends[i];
    let mut store = SegmentStore::open(&dir, SEG, start, start, false).unwrap();
    store.write(start, &bytes[..(end.0 - start.0) as usize]).unwrap();
    store.flush().unwrap();
    drop(store);
    // What an older segment left there: a whole record whose prev-link
    // points into that segment.
    let old = encode_record(0, 0x20, 0, Lsn(end.0 - 3 * SEG - 0x108), &[7u8; 120]);
    let segment = SegmentName { timeline: 1, segment_number: end.0 / SEG }.file_name(SEG);
    let file = std::fs::OpenOptions::new().write(true).open(dir.join(segment)).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &old, end.0 % SEG).unwrap();
    drop(file);
    // A hint after a record spanning pages: decoding starts pages back.
    let long = (1..i).find(|&j| ends[j].0 - ends[j - 1].0 > 2 * 8192 && ends[j].0 % 8192 < 8192 / 2).unwrap();
    for hint in [end, ends[i - 1], ends[long], ends[i / 2], start] {
        let store = SegmentStore::open(&dir, SEG, start, hint, false).unwrap();
        assert_eq!(store.flush_lsn(), end, "hint {hint}");
    }
    // The reopen cut the old record off: the bytes after the end are zero.
    let segment_bytes =
        std::fs::read(dir.join(SegmentName { timeline: 1, segment_number: end.0 / SEG }.file_name(SEG))).unwrap();
    let at = (end.0 % SEG) as usize;
    assert!(segment_bytes[at..at + old.len()].iter().all(|b| *b == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn control_file_roundtrip_and_damage() {
    let dir = tempdir("control");
    std::fs::create_dir_all(&dir).unwrap();
    let identity = TimelineIdentity {
        tenant_id: TenantId([3; 16]),
        timeline_id: TimelineId([4; 16]),
        system_id: 99,
        pg_version: 15,
        wal_segment_size: SEG as u32,
    };
    let mut state = PersistentState::new(&identity, Lsn(SEG));
    state.term = 7;
    let mut cf = ControlFile::new(&dir, false);
    assert_eq!(cf.load().unwrap(), None);
    cf.persist(&state).unwrap();
    assert_eq!(cf.load().unwrap(), Some(state.clone()));
    let mut bytes = control_file::encode(&state);
    let pos = bytes.windows(8).position(|w| w == b"\"term\": ").expect("term field") + 8;
    bytes[pos] = b'8';
    assert!(matches!(control_file::decode(&bytes), Err(control_file::DecodeError::Crc { .. })));
    assert!(control_file::decode(b"{}").is_err());
    assert!(control_file::decode(b"garbage").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
