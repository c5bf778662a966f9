use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::version::PgVersion;
use strata_formats::wal::record::{record_crc, DecodedRecord, RecordHeader, RECORD_HEADER_SIZE};
use strata_formats::Lsn;

use super::*;
use crate::limits::DECODED_MAX_BATCH;
use crate::shard::ShardLayout;

const RM_XACT: u8 = 1;
const RM_HEAP: u8 = 10;
const RM_BTREE: u8 = 11;
const RM_STANDBY: u8 = 8;

/// A record of `rmgr` with block references `(rel, block)` (each with two
/// bytes of data, no image), main data `main`, at `lsn`.
fn record(rmgr: u8, info: u8, xid: u32, blocks: &[(u32, u32)], main: &[u8], lsn: u64) -> DecodedRecord {
    let mut body = Vec::new();
    for (id, (rel, block)) in blocks.iter().enumerate() {
        body.extend_from_slice(&[id as u8, 0x20]);
        body.extend_from_slice(&2u16.to_le_bytes());
        for n in [1663u32, 5, *rel, *block] {
            body.extend_from_slice(&n.to_le_bytes());
        }
    }
    if !main.is_empty() {
        body.extend_from_slice(&[255, main.len() as u8]);
    }
    for _ in blocks {
        body.extend_from_slice(&[7, 7]);
    }
    body.extend_from_slice(main);
    let total = RECORD_HEADER_SIZE + body.len();
    let header = RecordHeader { total_length: total as u32, xid, prev: Lsn(lsn - 80), info, rmgr, crc: 0 };
    let mut raw = header.encode().to_vec();
    raw.extend_from_slice(&body);
    let crc = record_crc(&raw);
    raw[20..24].copy_from_slice(&crc.to_le_bytes());
    let end = lsn + total as u64;
    DecodedRecord::decode(PgVersion::V15, Lsn(lsn), Lsn(end), raw).expect("a valid record")
}

fn layout(count: u32) -> ShardLayout {
    ShardLayout::new(count, 8).unwrap()
}

/// The shard of block `block` of relation `rel`'s main fork.
fn owner(l: ShardLayout, rel: u32, block: u32) -> u8 {
    l.shard_of_block(rel, ForkNumber::Main, block)
}

#[test]
fn a_block_record_goes_whole_to_its_blocks_owners_and_as_a_skeleton_to_the_rest() {
    let l = layout(4);
    // Two blocks of one relation in stripes on different shards.
    let (a, b) = (0..64).map(|s| s * 8).fold((None, None), |(a, b), blk| match (a, b) {
        (None, _) => (Some(blk), None),
        (Some(x), None) if owner(l, 16400, x) != owner(l, 16400, blk) => (Some(x), Some(blk)),
        other => other,
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    let rec = record(RM_BTREE, 0, 0, &[(16400, a), (16400, b)], &[], 0x0100_0028);
    let routing = route(&rec, l);
    for shard in 0..4 {
        let want =
            if shard == owner(l, 16400, a) || shard == owner(l, 16400, b) { Route::Whole } else { Route::Skeleton };
        assert_eq!(routing.for_shard(shard), want, "shard {shard}");
    }
    let s = skeleton(&rec);
    assert_eq!(s.blocks.len(), 2);
    assert_eq!(
        s.blocks[1],
        BlockExtent { rel: RelFileNode { spc: 1663, db: 5, rel: 16400 }, fork: ForkNumber::Main, block: b }
    );
    // The catalog's blocks are home.
    let cat = record(RM_BTREE, 0, 0, &[(1259, 999)], &[], 0x0100_0028);
    let r = route(&cat, l);
    assert_eq!((r.for_shard(0), r.for_shard(1)), (Route::Whole, Route::Skeleton));
}

#[test]
fn a_commit_goes_whole_everywhere_and_a_record_with_no_effect_nowhere() {
    let l = layout(4);
    let commit = record(RM_XACT, 0x00, 900, &[], &777i64.to_le_bytes(), 0x0100_0028);
    let r = route(&commit, l);
    assert!((0..4).all(|s| r.for_shard(s) == Route::Whole));
    // A lock record of no transaction, with no block: nothing to anyone.
    let standby = record(RM_STANDBY, 0x10, 0, &[], &[0, 0, 0, 0], 0x0100_0028);
    let r = route(&standby, l);
    assert!((0..4).all(|s| r.for_shard(s) == Route::Omit), "{r:?}");
    // With a transaction id, a skeleton (its id counts towards nextXid).
    let btree = record(RM_BTREE, 0, 901, &[(16400, 0)], &[], 0x0100_0028);
    let r = route(&btree, l);
    assert!((0..4).all(|s| r.for_shard(s) != Route::Omit));
    // Unsharded, everything with a block is whole.
    assert_eq!(route(&btree, ShardLayout::UNSHARDED).for_shard(0), Route::Whole);
}

#[test]
fn a_heap_record_that_clears_the_visibility_map_goes_to_the_maps_owner() {
    let l = layout(4);
    // A heap insert (offset 1, flags: all-visible cleared) into block 0.
    let insert = record(RM_HEAP, 0x00, 902, &[(16500, 0)], &[1, 0, 1], 0x0100_0028);
    let vm_owner = l.shard_of_block(16500, ForkNumber::VisibilityMap, 0);
    let heap_owner = owner(l, 16500, 0);
    let r = route(&insert, l);
    for s in 0..4 {
        let want = if s == vm_owner || s == heap_owner { Route::Whole } else { Route::Skeleton };
        assert_eq!(r.for_shard(s), want, "shard {s}");
    }
}

fn entries_of(records: &[(DecodedRecord, Route)]) -> (Lsn, Vec<u8>) {
    let begin = records[0].0.lsn;
    let mut b = BatchBuilder::new(begin);
    for (rec, how) in records {
        match how {
            Route::Whole => b.add_whole(rec),
            Route::Skeleton => b.add_skeleton(&skeleton(rec)),
            Route::Omit => {}
        }
    }
    (begin, b.finish())
}

#[test]
fn batches_round_trip_through_one_compressed_stream() {
    let mut enc = BatchEncoder::new().unwrap();
    let mut dec = BatchDecoder::new();
    let mut lsn = 0x0100_0028u64;
    for round in 0..50u32 {
        let mut records = Vec::new();
        for i in 0..20u32 {
            let rec = record(RM_BTREE, 0, 1000 + i, &[(16400 + i % 3, round * 20 + i)], &[], lsn);
            lsn = rec.end_lsn.0.next_multiple_of(8) + 8 * u64::from(i % 2);
            let how = if i % 3 == 0 { Route::Skeleton } else { Route::Whole };
            records.push((rec, how));
        }
        let (begin, bytes) = entries_of(&records);
        let sent = enc.encode(&bytes).unwrap();
        let got = dec.decode(&sent.payload, sent.batch_len as usize, sent.crc, begin).unwrap();
        assert_eq!(got.len(), records.len());
        for (e, (rec, how)) in got.iter().zip(&records) {
            assert_eq!((e.lsn(), e.end_lsn()), (rec.lsn, rec.end_lsn));
            match (e, how) {
                (Entry::Whole { raw, .. }, Route::Whole) => {
                    // The same record, but for its prev pointer and CRC.
                    let mut want = rec.raw.clone();
                    without_prev_and_crc(&mut want);
                    assert_eq!(raw, &want);
                    let again = DecodedRecord::decode(PgVersion::V15, e.lsn(), e.end_lsn(), raw.clone()).unwrap();
                    assert_eq!((again.blocks.len(), again.header.xid), (1, rec.header.xid));
                }
                (Entry::Skeleton(s), Route::Skeleton) => assert_eq!(s, &skeleton(rec)),
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn a_damaged_batch_is_an_error_never_a_panic() {
    let rec = record(RM_BTREE, 0, 5, &[(16400, 1)], &[], 0x0100_0028);
    let (begin, bytes) = entries_of(&[
        (rec.clone(), Route::Whole),
        (record(RM_BTREE, 0, 6, &[(16400, 2)], &[], 0x0100_0100), Route::Skeleton),
    ]);
    let sent = BatchEncoder::new().unwrap().encode(&bytes).unwrap();
    let fresh = || BatchDecoder::new();
    let len = sent.batch_len as usize;
    assert!(matches!(fresh().decode(&sent.payload, len, sent.crc ^ 1, begin), Err(DecodedWalError::Checksum { .. })));
    assert!(matches!(fresh().decode(&sent.payload, len + 1, sent.crc, begin), Err(DecodedWalError::Length { .. })));
    assert!(matches!(fresh().decode(&sent.payload, len - 1, sent.crc, begin), Err(DecodedWalError::Length { .. })));
    let cut = &sent.payload[..sent.payload.len() - 3];
    assert!(fresh().decode(cut, len, sent.crc, begin).is_err());
    assert!(matches!(
        fresh().decode(&sent.payload, DECODED_MAX_BATCH + 1, sent.crc, begin),
        Err(DecodedWalError::TooLarge { .. })
    ));
    for i in 0..sent.payload.len() {
        let mut bad = sent.payload.clone();
        bad[i] ^= 0x5a;
        let _ = fresh().decode(&bad, len, sent.crc, begin);
    }
    // Entries that are not records: a length that disagrees, an LSN that overflows.
    let mut b = BatchBuilder::new(begin);
    b.add_whole(&rec);
    let mut wrong = b.finish();
    let at = wrong.len() - rec.raw.len();
    wrong[at] ^= 1; // xl_tot_len
    let sent = BatchEncoder::new().unwrap().encode(&wrong).unwrap();
    let err = fresh().decode(&sent.payload, sent.batch_len as usize, sent.crc, begin).unwrap_err();
    assert!(matches!(err, DecodedWalError::Entry { index: 0, .. }), "{err}");
    let sent = BatchEncoder::new().unwrap().encode(&bytes).unwrap();
    let err = fresh().decode(&sent.payload, sent.batch_len as usize, sent.crc, Lsn(u64::MAX - 4)).unwrap_err();
    assert!(matches!(err, DecodedWalError::Entry { index: 0, .. }), "{err}");
}

#[test]
fn the_fuzz_entry_survives_random_bytes_and_real_batches() {
    use strata_test_support::rng::{seeded, RngExt};
    let mut rng = seeded("decoded_wal_fuzz", 48);
    let rec = record(RM_BTREE, 0, 5, &[(16400, 1)], &[], 0x0100_0028);
    let (_, bytes) = entries_of(&[(rec, Route::Whole)]);
    let sent = BatchEncoder::new().unwrap().encode(&bytes).unwrap();
    let mut real = vec![1];
    real.extend_from_slice(&(sent.payload.len() as u32).to_le_bytes());
    real.extend_from_slice(&sent.batch_len.to_le_bytes());
    real.extend_from_slice(&sent.crc.to_le_bytes());
    real.extend_from_slice(&sent.payload);
    fuzz_one(&real);
    let mut proto = vec![0];
    proto.extend_from_slice(&bytes);
    fuzz_one(&proto);
    for _ in 0..300 {
        let mut data = real.clone();
        let n = rng.index(data.len());
        data[n] = rng.u8(..);
        fuzz_one(&data);
        let len = rng.below(200) as usize;
        fuzz_one(&rng.bytes(len));
    }
}

#[test]
fn a_batch_of_incompressible_records_round_trips_again_and_again() {
    use strata_test_support::rng::{seeded, RngExt};
    let mut rng = seeded("decoded_wal_large", 7);
    let mut lsn = 0x0100_0028u64;
    let mut records = Vec::new();
    for i in 0..1500u32 {
        // Incompressible main data, of random lengths.
        let main = rng.bytes(200);
        let rec = record(RM_BTREE, 0, i, &[(16400, i)], &main[..(main[0] as usize % 200).max(8)], lsn);
        lsn = rec.end_lsn.0.next_multiple_of(8);
        records.push((rec, Route::Whole));
    }
    let (begin, bytes) = entries_of(&records);
    let mut enc = BatchEncoder::new().unwrap();
    let mut dec = BatchDecoder::new();
    for _ in 0..3 {
        let sent = enc.encode(&bytes).unwrap();
        let got = dec.decode(&sent.payload, sent.batch_len as usize, sent.crc, begin).unwrap();
        assert_eq!(got.len(), records.len());
        assert_eq!(got.last().unwrap().end_lsn(), records.last().unwrap().0.end_lsn);
    }
}

#[test]
fn a_repeated_skeleton_is_dropped_until_a_whole_record_comes_between() {
    let l = layout(4);
    // Three inserts into one page of shard `theirs`, a commit, one more.
    let block = (0..64).map(|s| s * 8).find(|b| owner(l, 16400, *b) != 0).unwrap();
    let theirs = owner(l, 16400, block);
    let mine = (0..4u8).find(|s| *s != theirs).unwrap();
    let mut lsn = 0x0100_0028u64;
    let mut next = |rmgr, xid, blocks: &[(u32, u32)], main: &[u8]| {
        let rec = record(rmgr, 0, xid, blocks, main, lsn);
        lsn = rec.end_lsn.0.next_multiple_of(8);
        rec
    };
    let recs = [
        next(RM_BTREE, 700, &[(16400, block)], &[]),
        next(RM_BTREE, 700, &[(16400, block)], &[]),
        next(RM_BTREE, 701, &[(16400, block)], &[]),
        next(RM_BTREE, 701, &[(16400, block)], &[]),
        next(RM_XACT, 0, &[], &1i64.to_le_bytes()),
        next(RM_BTREE, 701, &[(16400, block)], &[]),
    ];
    let mut filter = ShardFilter::new(mine);
    let mut b = BatchBuilder::new(recs[0].lsn);
    let sent: Vec<Route> = recs.iter().map(|r| filter.add(&mut b, r, &route(r, l))).collect();
    use Route::*;
    assert_eq!(sent, [Skeleton, Omit, Skeleton, Omit, Whole, Skeleton]);
    // The owner gets every one whole.
    let mut owners = ShardFilter::new(theirs);
    let mut b = BatchBuilder::new(recs[0].lsn);
    assert!(recs.iter().all(|r| owners.add(&mut b, r, &route(r, l)) == Whole));
}

/// `pg_logical_emit_message(false, prefix, '\x0102')`'s main data.
fn logical_message(prefix: &str) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&5u32.to_le_bytes());
    d.extend_from_slice(&[0; 4]);
    d.extend_from_slice(&(prefix.len() as u64 + 1).to_le_bytes());
    d.extend_from_slice(&2u64.to_le_bytes());
    d.extend_from_slice(prefix.as_bytes());
    d.extend_from_slice(&[0, 1, 2]);
    d
}

#[test]
fn free_space_map_messages_reach_every_shard_and_other_messages_none() {
    const RM_LOGICALMSG: u8 = 21;
    let l = layout(4);
    let fsm = record(RM_LOGICALMSG, 0, 0, &[], &logical_message(crate::fsm_pages::PREFIX), 0x0100_0028);
    let r = route(&fsm, l);
    assert!((0..4).all(|s| r.for_shard(s) == Route::Whole), "every shard keeps the maps' sizes");
    let other = record(RM_LOGICALMSG, 0, 0, &[], &logical_message("app.audit"), 0x0100_0028);
    let r = route(&other, l);
    assert!((0..4).all(|s| r.for_shard(s) == Route::Omit), "logical decoding is no shard's");
}
