//! Shards (`docs/sharding.md`): the same WAL ingested by an unsharded
//! timeline and by every shard of a four-shard tenant gives, at every LSN,
//! each page from the shard that owns it equal to the unsharded one, no
//! page on a shard that does not own it, and the same sizes everywhere.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::wal::record::DecodedRecord;
use strata_formats::Lsn;
use strata_pageserver::decoded_ingest::{DecodedInput, DecodedInputError};
use strata_pageserver::ingest::WalIngest;
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::timeline::Timeline;
use strata_protocol::decoded_wal::{route, BatchBuilder, BatchEncoder, Route, ShardFilter};
use strata_protocol::safekeeper::DecodedWal;
use strata_protocol::{ShardIndex, ShardLayout, TenantId, TenantShardId};

const START: Lsn = Lsn(0x0100_0028);
const RM_HEAP: u8 = 10;
const HEAP_INSERT: u8 = 0x00;
const HEAP_INIT_PAGE: u8 = 0x80;
const BKPBLOCK_HAS_DATA: u8 = 0x20;
const BKPBLOCK_WILL_INIT: u8 = 0x40;
const STRIPE: u32 = 8;

/// A heap insert of a one-column row at `offnum` of `block` of `rel`.
fn heap_insert(rel: RelFileNode, block: u32, offnum: u16, lsn: Lsn) -> DecodedRecord {
    let mut main = offnum.to_le_bytes().to_vec();
    main.push(0);
    let mut data = Vec::new();
    data.extend_from_slice(&1u16.to_le_bytes()); // t_infomask2: one attribute
    data.extend_from_slice(&0x0800u16.to_le_bytes()); // t_infomask: xmax invalid
    data.push(24); // t_hoff
    data.push(0);
    data.extend_from_slice(&(u32::from(offnum) * 7 + block).to_le_bytes());
    let (info, flags) = if offnum == 1 {
        (HEAP_INSERT | HEAP_INIT_PAGE, BKPBLOCK_HAS_DATA | BKPBLOCK_WILL_INIT)
    } else {
        (HEAP_INSERT, BKPBLOCK_HAS_DATA)
    };
    common::record(rel, RM_HEAP, info, block, flags, &data, &main, lsn)
}

struct Tenant {
    unsharded: Arc<Timeline>,
    shards: Vec<Arc<Timeline>>,
    layout: ShardLayout,
}

impl Tenant {
    fn new(name: &str) -> Tenant {
        let layout = ShardLayout::new(4, STRIPE).unwrap();
        let tenant = TenantId::generate();
        let (unsharded, _, _) = common::imported_timeline(&format!("sharding-{name}-all"), START);
        let shards = layout
            .shards()
            .map(|index: ShardIndex| {
                let id = TenantShardId { tenant, shard: index };
                common::imported_shard(&format!("sharding-{name}-{}", index.number), START, id, Some(STRIPE)).0
            })
            .collect();
        Tenant { unsharded, shards, layout }
    }
}

/// A catalog relation (one home) and three user relations, in two databases.
const RELS: [RelFileNode; 4] = [
    RelFileNode { spc: 1663, db: 5, rel: 1259 },
    RelFileNode { spc: 1663, db: 5, rel: 16384 },
    RelFileNode { spc: 1663, db: 5, rel: 16390 },
    RelFileNode { spc: 1663, db: 16400, rel: 24576 },
];

/// Random heap inserts into [`RELS`], from `START`: up to 64 blocks (8
/// stripes) each, new ones right after the last; half the records start
/// a new block.
fn workload() -> Vec<DecodedRecord> {
    let mut rows: BTreeMap<(usize, u32), u16> = BTreeMap::new();
    let mut lsn = START;
    let mut records = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..600u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let r = (x % RELS.len() as u64) as usize;
        let known = rows.range((r, 0)..(r + 1, 0)).count() as u32;
        let block = if (x >> 8).is_multiple_of(2) { known } else { (x >> 16) as u32 % (known + 1) }.min(63);
        let row = rows.entry((r, block)).or_insert(0);
        if *row == 100 {
            continue;
        }
        *row += 1;
        let rec = heap_insert(RELS[r], block, *row, lsn);
        lsn = rec.end_lsn;
        records.push(rec);
    }
    records
}

/// Every page of [`RELS`] at every 25th record's end: the owner shard's
/// equal to the unsharded timeline's, none on the others, sizes alike.
fn check_pages(t: &Tenant, ends: &[Lsn]) {
    let mut on_each = [0usize; 4];
    for (n, at) in ends.iter().enumerate().filter(|(n, _)| n.is_multiple_of(25) || *n == ends.len() - 1) {
        for (r, rel) in RELS.iter().enumerate() {
            let tag = RelTag { rel: *rel, fork: ForkNumber::Main };
            let size = t.unsharded.rel_size(tag, *at).unwrap();
            for s in &t.shards {
                assert_eq!(s.rel_size(tag, *at).unwrap(), size, "size of {tag} at {at} on {}", s.tenant_id);
            }
            for block in 0..size.unwrap_or(0) {
                let key = Key::rel_block(tag, block);
                let want = t.unsharded.get(&key, *at).unwrap();
                let owner = t.layout.shard_of_block(rel.rel, ForkNumber::Main, block) as usize;
                if rel.rel < 16384 {
                    assert_eq!(owner, 0, "the catalog stays home");
                }
                for (k, s) in t.shards.iter().enumerate() {
                    let got = s.get(&key, *at).unwrap();
                    if k == owner {
                        assert_eq!(got, want, "block {block} of {tag} at {at} (record {n}) on its shard {k}");
                        if n == ends.len() - 1 && r > 0 {
                            on_each[k] += 1;
                        }
                    } else {
                        assert_eq!(got, None, "block {block} of {tag} at {at} is stored on shard {k}, not {owner}");
                    }
                }
            }
        }
    }
    // The user relations' blocks are spread over every shard.
    assert!(on_each.iter().all(|n| *n > 0), "{on_each:?}");
}

/// Half of it from layer files, half from memory.
fn checkpoint_all(t: &Tenant) {
    t.unsharded.checkpoint().unwrap();
    for s in &t.shards {
        s.checkpoint().unwrap();
    }
}

#[test]
fn every_page_reads_the_same_from_its_shard_at_every_lsn() {
    let t = Tenant::new("pages");
    let mut all = WalIngest::new(t.unsharded.clone()).unwrap();
    let mut shards: Vec<WalIngest> = t.shards.iter().map(|s| WalIngest::new(s.clone()).unwrap()).collect();
    let records = workload();
    for (i, rec) in records.iter().enumerate() {
        all.ingest(rec).unwrap();
        for s in &mut shards {
            s.ingest(rec).unwrap();
        }
        if i == records.len() / 2 {
            checkpoint_all(&t);
        }
    }
    check_pages(&t, &records.iter().map(|r| r.end_lsn).collect::<Vec<_>>());
}

/// The same, each shard fed a decoded stream (`strata_protocol::decoded_wal`):
/// the records routed for it, whole or as skeletons (a repeated one
/// dropped), in compressed batches of 1 to 40 records, some of which end
/// in records it is not sent.
#[test]
fn every_page_reads_the_same_from_its_shard_through_decoded_streams() {
    let t = Tenant::new("decoded");
    let mut all = WalIngest::new(t.unsharded.clone()).unwrap();
    let mut shards: Vec<(WalIngest, DecodedInput, BatchEncoder, ShardFilter)> = t
        .shards
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let input = (WalIngest::new(s.clone()).unwrap(), DecodedInput::new(START));
            (input.0, input.1, BatchEncoder::new().unwrap(), ShardFilter::new(k as u8))
        })
        .collect();
    let records = workload();
    for rec in &records {
        all.ingest(rec).unwrap();
    }
    let (mut begin, mut at, mut n, mut sizes) = (START, 0, 1usize, 0);
    let mut sent = [[0usize; 3]; 4];
    while at < records.len() {
        let batch = &records[at..(at + n).min(records.len())];
        let last = batch.last().unwrap();
        for (k, (ingest, input, encoder, filter)) in shards.iter_mut().enumerate() {
            let mut b = BatchBuilder::new(begin);
            for rec in batch {
                match filter.add(&mut b, rec, &route(rec, t.layout)) {
                    Route::Whole => sent[k][0] += 1,
                    Route::Skeleton => sent[k][1] += 1,
                    Route::Omit => sent[k][2] += 1,
                }
            }
            let e = encoder.encode(&b.finish()).unwrap();
            let d = DecodedWal {
                begin_lsn: begin,
                end_lsn: last.end_lsn,
                last_record_lsn: last.lsn,
                read_lsn: last.end_lsn,
                commit_lsn: last.end_lsn,
                flush_lsn: last.end_lsn,
                batch_len: e.batch_len,
                crc32c: e.crc,
                payload: e.payload,
            };
            let got = input.ingest(&t.shards[k], ingest, &d).unwrap();
            assert!(got as usize <= batch.len());
            assert_eq!(t.shards[k].record_lsns().last, last.end_lsn, "shard {k} moved past the batch");
        }
        begin = last.end_lsn;
        at += batch.len();
        n = n % 40 + 1 + (n * 7) % 3;
        sizes += 1;
        if sizes == 10 {
            checkpoint_all(&t);
        }
    }
    // Each shard got its own records whole, the others' as skeletons, and
    // a skeleton that repeats the one before not at all.
    for (k, [whole, skeletons, dropped]) in sent.iter().enumerate() {
        assert!(*whole > 0 && *skeletons > 0 && *dropped > 0, "shard {k}: {sent:?}");
        assert_eq!(whole + skeletons + dropped, records.len(), "shard {k}");
    }
    // A batch that does not follow is refused, and changes nothing.
    let (ingest, input, encoder, _) = &mut shards[1];
    let e = encoder.encode(&BatchBuilder::new(START).finish()).unwrap();
    let stray = DecodedWal {
        begin_lsn: START,
        end_lsn: START,
        last_record_lsn: Lsn::INVALID,
        read_lsn: START,
        commit_lsn: START,
        flush_lsn: START,
        batch_len: e.batch_len,
        crc32c: e.crc,
        payload: e.payload,
    };
    assert!(matches!(input.ingest(&t.shards[1], ingest, &stray), Err(DecodedInputError::Gap { .. })));
    check_pages(&t, &records.iter().map(|r| r.end_lsn).collect::<Vec<_>>());
}

#[test]
fn a_shard_stores_only_its_own_keys_whoever_writes_them() {
    let t = Tenant::new("filter");
    let rel = RelFileNode { spc: 1663, db: 5, rel: 20000 };
    let tag = RelTag { rel, fork: ForkNumber::Main };
    let at = Lsn(START.0 + 8);
    let page = common::noise_page(1);
    let batch: Vec<_> =
        (0..64).map(|b| (Key::rel_block(tag, b), at, strata_pageserver::value::Value::Image(page.clone()))).collect();
    for s in &t.shards {
        s.commit_record(batch.clone(), strata_pageserver::layer::map::RecordLsns { last: at, prev: START });
        for b in 0..64 {
            let owned = s.shard.owns_block(rel.rel, ForkNumber::Main, b);
            assert_eq!(s.get(&Key::rel_block(tag, b), at).unwrap().is_some(), owned, "block {b} on {}", s.tenant_id);
        }
    }
}
