//! Ingest and reads of natively redone records: a heap page built from
//! stored records only, chains cut by ingest, and records that cannot be
//! applied stopping ingest with their LSN instead of storing a wrong page.

mod common;

use std::sync::Arc;

use strata_formats::page::{max_offset_number, pd_lsn};
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::wal::record::DecodedRecord;
use strata_formats::Lsn;
use strata_pageserver::ingest::{WalIngest, MAX_CHAIN_BYTES, MAX_PENDING_VERSIONS, MAX_REDO_CHAIN};
use strata_pageserver::key::{Key, RelTag};
use strata_pageserver::layer::files::FileCache;
use strata_pageserver::metrics::Metrics;
use strata_pageserver::timeline::Timeline;

const START: Lsn = Lsn(0x0100_0028);
const REL: RelFileNode = RelFileNode { spc: 1663, db: 5, rel: 16384 };
const RM_XLOG: u8 = 0;
const XLOG_FPI_FOR_HINT: u8 = 0xA0;
const XLOG_FPI: u8 = 0xB0;
const RM_HEAP: u8 = 10;
const RM_HEAP2: u8 = 9;
const RM_BTREE: u8 = 11;
const HEAP_INSERT: u8 = 0x00;
const HEAP_INIT_PAGE: u8 = 0x80;
const HEAP_INPLACE: u8 = 0x70;
const BKPBLOCK_HAS_DATA: u8 = 0x20;
const BKPBLOCK_WILL_INIT: u8 = 0x40;

fn timeline(name: &str) -> (Arc<Timeline>, Arc<Metrics>) {
    let (tl, metrics, _) = common::imported_timeline(&format!("native-redo-{name}"), START);
    (tl, metrics)
}

/// A WAL record on block `block` of [`REL`] ([`common::record`]).
fn record(rmgr: u8, info: u8, block: u32, fork_flags: u8, data: &[u8], main: &[u8], lsn: Lsn) -> DecodedRecord {
    common::record(REL, rmgr, info, block, fork_flags, data, main, lsn)
}

/// A heap insert of a one-column tuple at `offnum` (`xl_heap_insert` as
/// main data; `xl_heap_header` and the tuple after its header as block data).
fn heap_insert(block: u32, offnum: u16, init: bool, lsn: Lsn) -> DecodedRecord {
    heap_insert_padded(block, offnum, init, 0, lsn)
}

/// The same with `pad` zero bytes after the column (a wider row).
fn heap_insert_padded(block: u32, offnum: u16, init: bool, pad: usize, lsn: Lsn) -> DecodedRecord {
    let mut main = offnum.to_le_bytes().to_vec();
    main.push(0); // flags
    let mut data = Vec::new();
    data.extend_from_slice(&1u16.to_le_bytes()); // t_infomask2: one attribute
    data.extend_from_slice(&0x0800u16.to_le_bytes()); // t_infomask: xmax invalid
    data.push(24); // t_hoff
    data.push(0); // the header's alignment byte
    data.extend_from_slice(&(offnum as u32 * 7).to_le_bytes());
    data.resize(data.len() + pad, 0);
    let (info, flags) = if init {
        (HEAP_INSERT | HEAP_INIT_PAGE, BKPBLOCK_HAS_DATA | BKPBLOCK_WILL_INIT)
    } else {
        (HEAP_INSERT, BKPBLOCK_HAS_DATA)
    };
    record(RM_HEAP, info, block, flags, &data, &main, lsn)
}

#[test]
fn pages_are_built_from_records_and_chains_stay_short() {
    let (tl, metrics) = timeline("build");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    let key = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, 0);
    let mut lsn = START;
    let mut ends = Vec::new();
    // Small records: the count bounds the chain (a page holds 226 of these
    // rows, so one chain's worth and the next). The last leaves the chain
    // one record short of the bound.
    let n = MAX_REDO_CHAIN as u16 - 1;
    for i in 0..n {
        let rec = heap_insert(0, i + 1, i == 0, lsn);
        ingest.ingest(&rec).unwrap();
        ends.push(rec.end_lsn);
        lsn = rec.end_lsn;
    }
    // Every version reads back with its tuples and stamped with its LSN.
    for (i, end) in ends.iter().enumerate() {
        let page = tl.get(&key, *end).unwrap().expect("the page exists");
        assert_eq!(max_offset_number(&page).unwrap(), i as u16 + 1, "tuples at version {i}");
        assert_eq!(pd_lsn(&page).unwrap(), end.0);
        let item = u32::from_le_bytes(page[24 + 4 * i..28 + 4 * i].try_into().unwrap());
        let (off, len) = ((item & 0x7fff) as usize, (item >> 17) as usize);
        assert_eq!(len, 28);
        assert_eq!(&page[off + 24..off + 28], &((i as u32 + 1) * 7).to_le_bytes());
    }
    // No record was redone at ingest yet: the chain is one short.
    assert_eq!(MAX_REDO_CHAIN, 128);
    let text = metrics.render();
    assert!(text.contains("strata_pageserver_redo_pages_materialized_total 0"), "{text}");
    assert!(text.contains(&format!("strata_pageserver_redo_records_stored_total {n}")), "{text}");

    // Read again, newest first: each read rebuilds its version from the
    // stored records (the page kept from the newest read is of a later
    // version, so no read may start from it), and agrees with the first.
    let first: Vec<_> = ends.iter().map(|end| tl.get(&key, *end).unwrap().unwrap()).collect();
    for (i, end) in ends.iter().enumerate().rev() {
        assert_eq!(tl.get(&key, *end).unwrap().unwrap(), first[i], "version {i}");
    }
    // A hot page read again applies nothing.
    let counter = |name: &str| common::metric(&metrics, &format!("strata_pageserver_{name}_total")) as u64;
    let last = *ends.last().unwrap();
    tl.get(&key, last).unwrap().unwrap();
    let (applied, hits) = (counter("redo_records_applied"), counter("rebuilt_page_hits"));
    assert_eq!(tl.get(&key, last).unwrap().unwrap(), first[n as usize - 1]);
    assert_eq!((counter("redo_records_applied"), counter("rebuilt_page_hits")), (applied, hits + 1));
    // The next record is the 128th since the page began: ingest redoes it,
    // starting from the kept page, and stores the result as an image.
    let rec = heap_insert(0, n + 1, false, lsn);
    ingest.ingest(&rec).unwrap();
    assert_eq!((counter("redo_records_applied"), counter("rebuilt_page_hits")), (applied, hits + 2));
    let page = tl.get(&key, rec.end_lsn).unwrap().unwrap();
    assert_eq!(max_offset_number(&page).unwrap(), n + 1);
    // One more: its read applies it to that image, and a second read nothing.
    let rec = heap_insert(0, n + 2, false, rec.end_lsn);
    ingest.ingest(&rec).unwrap();
    let page = tl.get(&key, rec.end_lsn).unwrap().unwrap();
    assert_eq!(max_offset_number(&page).unwrap(), n + 2);
    assert_eq!((counter("redo_records_applied"), counter("rebuilt_page_hits")), (applied + 1, hits + 2));
    assert_eq!(tl.get(&key, rec.end_lsn).unwrap().unwrap(), page);
    assert_eq!((counter("redo_records_applied"), counter("rebuilt_page_hits")), (applied + 1, hits + 3));
    ends.push(rec.end_lsn);
    // The same after the versions went to a layer file.
    tl.checkpoint().unwrap();
    let page = tl.get(&key, *ends.last().unwrap()).unwrap().unwrap();
    assert_eq!(max_offset_number(&page).unwrap(), n + 2);
}

#[test]
fn chains_of_large_records_stay_within_their_bytes() {
    let (tl, metrics) = timeline("bytes");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    let key = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, 0);
    // One row of 1000 bytes, then changed in place again and again (a page
    // cannot hold more than MAX_CHAIN_BYTES of inserts, so only records that
    // rewrite what is there can pass the bound): each record is a row long.
    let pad = 966;
    let first = heap_insert_padded(0, 1, true, pad, START);
    ingest.ingest(&first).unwrap();
    let (mut lsn, mut ends, mut sizes) = (first.end_lsn, Vec::new(), Vec::new());
    let changes = 40u8;
    for i in 0..changes {
        let mut row = 7u32.to_le_bytes().to_vec();
        row.resize(4 + pad, i + 1);
        let rec = record(RM_HEAP, HEAP_INPLACE, 0, BKPBLOCK_HAS_DATA, &row, &1u16.to_le_bytes(), lsn);
        sizes.push(rec.raw.len());
        ingest.ingest(&rec).unwrap();
        ends.push(rec.end_lsn);
        lsn = rec.end_lsn;
    }
    // The record that would take the chain's bytes past the bound is redone
    // at ingest: every chain holds at most MAX_CHAIN_BYTES of records.
    let chain = MAX_CHAIN_BYTES / sizes[0];
    let first_chain = (MAX_CHAIN_BYTES - first.raw.len()) / sizes[0];
    assert!(first_chain + chain < changes as usize && (chain as u32) < MAX_REDO_CHAIN, "{chain}");
    let materialized = common::metric(&metrics, "strata_pageserver_redo_pages_materialized_total") as usize;
    assert_eq!(materialized, 1 + (changes as usize - first_chain - 1) / (chain + 1), "sizes {sizes:?}");
    for (i, end) in ends.iter().enumerate() {
        let page = tl.get(&key, *end).unwrap().expect("the page exists");
        assert_eq!(max_offset_number(&page).unwrap(), 1);
        assert_eq!(pd_lsn(&page).unwrap(), end.0);
        let item = u32::from_le_bytes(page[24..28].try_into().unwrap());
        let off = (item & 0x7fff) as usize;
        assert_eq!(&page[off + 24..off + 28], &7u32.to_le_bytes());
        assert!(page[off + 28..off + 28 + pad].iter().all(|b| *b == i as u8 + 1), "version {i}");
    }
}

#[test]
fn added_records_wait_for_a_commit_and_their_number_is_bounded() {
    let (tl, _) = timeline("pending");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    // Each record starts a new page: its version and the relation's size.
    let (mut lsn, mut added, mut first_visible) = (START, 0usize, None);
    for block in 0..MAX_PENDING_VERSIONS as u32 {
        let rec = heap_insert(block, 1, true, lsn);
        ingest.add(&rec).unwrap();
        added += 1;
        lsn = rec.end_lsn;
        if first_visible.is_none() && tl.record_lsns().last > START {
            first_visible = Some(added);
        }
    }
    // Nothing was visible until the held versions reached the bound, two per
    // record (after the first, which also lists the relation).
    let first_visible = first_visible.expect("the bound makes records visible without a commit");
    assert!(
        first_visible <= MAX_PENDING_VERSIONS / 2 && first_visible > MAX_PENDING_VERSIONS / 2 - 2,
        "{first_visible}"
    );
    assert!(tl.record_lsns().last < lsn);
    ingest.commit();
    assert_eq!(tl.record_lsns().last, lsn);
    let key = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, MAX_PENDING_VERSIONS as u32 - 1);
    assert_eq!(max_offset_number(&tl.get(&key, lsn).unwrap().unwrap()).unwrap(), 1);
    // A record that fails adds nothing; the one before it stays pending and
    // the next commit makes it visible.
    let good = heap_insert(0, 2, false, lsn);
    ingest.add(&good).unwrap();
    let bad = heap_insert(MAX_PENDING_VERSIONS as u32 + 5, 1, false, good.end_lsn);
    ingest.add(&bad).expect_err("a block beyond the relation's end");
    assert_eq!(tl.record_lsns().last, lsn);
    ingest.commit();
    assert_eq!(tl.record_lsns().last, good.end_lsn);
    assert_eq!(
        max_offset_number(
            &tl.get(&Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, 0), good.end_lsn).unwrap().unwrap()
        )
        .unwrap(),
        2
    );
}

#[test]
fn hint_records_without_an_image_stamp_the_page_lsn_only() {
    // With full_page_writes off, PostgreSQL logs a hint-bit change as an
    // FPI_FOR_HINT record whose block has no image; its replay skips it,
    // but the compute's page carries the record's LSN from then on.
    let (tl, _) = timeline("hints");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    let first = heap_insert(0, 1, true, START);
    ingest.ingest(&first).unwrap();
    let key = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, 0);
    let before = tl.get(&key, first.end_lsn).unwrap().unwrap();
    let hint = record(RM_XLOG, XLOG_FPI_FOR_HINT, 0, 0, &[], &[], first.end_lsn);
    ingest.ingest(&hint).unwrap();
    assert_eq!(tl.record_lsns().last, hint.end_lsn);
    let after = tl.get(&key, hint.end_lsn).unwrap().unwrap();
    assert_eq!(strata_formats::page::pd_lsn(&after[..]).unwrap(), hint.end_lsn.0);
    assert_eq!(&after[8..], &before[8..], "only pd_lsn changes");
    // The version before the hint is still there, unstamped.
    assert_eq!(tl.get(&key, first.end_lsn).unwrap().unwrap(), before);
    // A hint naming a block the relation does not have changes nothing.
    let beyond = record(RM_XLOG, XLOG_FPI_FOR_HINT, 3, 0, &[], &[], hint.end_lsn);
    ingest.ingest(&beyond).unwrap();
    let key3 = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, 3);
    assert_eq!(tl.get(&key3, beyond.end_lsn).unwrap(), None);
    // A plain FPI record must have its image: without one it is refused.
    let fpi = record(RM_XLOG, XLOG_FPI, 0, 0, &[], &[], beyond.end_lsn);
    let err = ingest.ingest(&fpi).expect_err("an FPI record without an image").to_string();
    assert!(err.contains(&beyond.end_lsn.to_string()), "{err}");
}

#[test]
fn records_that_cannot_be_applied_stop_ingest_with_their_lsn() {
    let (tl, _) = timeline("errors");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    let first = heap_insert(0, 1, true, START);
    ingest.ingest(&first).unwrap();
    let at = first.end_lsn;
    let cases = [
        // A block beyond the relation's end that the record does not initialize.
        (heap_insert(5, 1, false, at), "does not exist"),
        // Info bits that are no heap2 record redone natively (REWRITE has no blocks).
        (record(RM_HEAP2, 0x00, 0, BKPBLOCK_HAS_DATA, &[1, 2, 3], &[], at), "no native redo"),
        // Info bits btree does not define.
        (record(RM_BTREE, 0xF0, 0, BKPBLOCK_HAS_DATA, &[1, 2, 3], &[], at), "no native redo"),
        // A resource manager from the future.
        (record(200, 0x00, 0, BKPBLOCK_HAS_DATA, &[1, 2, 3], &[], at), "no native redo"),
    ];
    for (rec, expected) in cases {
        let err = ingest.ingest(&rec).expect_err("must not be ingested").to_string();
        assert!(err.contains(&at.to_string()) && err.contains(expected), "{err}");
        // Nothing of it became visible.
        assert_eq!(tl.record_lsns().last, at);
    }
    let key = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, 0);
    let page = tl.get(&key, at).unwrap().unwrap();
    assert_eq!(max_offset_number(&page).unwrap(), 1);

    // A record whose data is malformed is stored (ingest does not redo every
    // record), but no page is ever made of it: its read is an error naming
    // the record, and so is the redo at ingest that would cut its chain.
    let bad = record(RM_HEAP, HEAP_INSERT, 0, BKPBLOCK_HAS_DATA, &[1, 0], &[2, 0, 0], at);
    ingest.ingest(&bad).unwrap();
    let err = tl.get(&key, bad.end_lsn).expect_err("no page from a malformed record").to_string();
    assert!(err.contains(&at.to_string()), "{err}");
    let mut lsn = bad.end_lsn;
    let mut failed = None;
    for i in 0..MAX_REDO_CHAIN as u16 {
        let rec = heap_insert(0, 2 + i, false, lsn);
        match ingest.ingest(&rec) {
            Ok(()) => lsn = rec.end_lsn,
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let failed = failed.expect("redo at ingest meets the malformed record within a chain's length");
    assert!(failed.contains(&at.to_string()), "{failed}");
}

#[test]
fn the_chain_counts_of_ingest_stay_bounded() {
    use strata_pageserver::ingest::MAX_TRACKED_CHAINS;
    let (tl, _) = timeline("chain-counts");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    let mut lsn = START;
    let mut most = 0;
    // One page more than the counts can hold, each started by its record,
    // then a second record on each of the last pages.
    let pages = MAX_TRACKED_CHAINS as u32 + 10;
    for block in 0..pages {
        let rec = heap_insert(block, 1, true, lsn);
        ingest.ingest(&rec).unwrap();
        lsn = rec.end_lsn;
        most = most.max(ingest.tracked_chains());
    }
    for block in pages - 5..pages {
        let rec = heap_insert(block, 2, false, lsn);
        ingest.ingest(&rec).unwrap();
        lsn = rec.end_lsn;
        most = most.max(ingest.tracked_chains());
    }
    assert_eq!(most, MAX_TRACKED_CHAINS);
    assert!(ingest.tracked_chains() < 100, "the counts started over: {}", ingest.tracked_chains());
    // Pages read back right after the counts started over.
    let key = Key::rel_block(RelTag { rel: REL, fork: ForkNumber::Main }, pages - 1);
    assert_eq!(max_offset_number(&tl.get(&key, lsn).unwrap().unwrap()).unwrap(), 2);
}

/// An `XLOG_SMGR_CREATE` record of the main fork of relation `rel` in
/// database 5 (no block references; `xl_smgr_create` as main data).
fn smgr_create(rel: u32, lsn: Lsn) -> DecodedRecord {
    const RM_SMGR: u8 = 2;
    const XLOG_SMGR_CREATE: u8 = 0x10;
    let mut main = Vec::new();
    for v in [REL.spc, REL.db, rel, ForkNumber::Main as u32] {
        main.extend_from_slice(&v.to_le_bytes());
    }
    let mut raw = vec![0u8; 24];
    raw.push(255);
    raw.push(main.len() as u8);
    raw.extend_from_slice(&main);
    common::seal(raw, RM_SMGR, XLOG_SMGR_CREATE, lsn)
}

#[test]
fn a_relation_directory_costs_its_changes_not_a_copy_per_relation() {
    const RELS: u32 = 10_000;
    let (tl, metrics) = timeline("rel-dir");
    let mut ingest = WalIngest::new(tl.clone()).unwrap();
    let before = tl.rel_dir(REL.spc, REL.db, START).unwrap();
    let mut lsn = START;
    let mut ends = Vec::new();
    for i in 0..RELS {
        let rec = smgr_create(100_000 + i, lsn);
        ingest.ingest(&rec).unwrap();
        ends.push(rec.end_lsn);
        lsn = rec.end_lsn;
    }
    // Each version lists exactly the relations created up to it, from the
    // in-memory layer and, flushed, from a layer file.
    let check = |what: &str| {
        for i in [0, 1, 15, 16, 17, 100, 4_321, RELS as usize - 1] {
            let dir = tl.rel_dir(REL.spc, REL.db, ends[i]).unwrap();
            let created = (0..=i as u32).map(|r| (100_000 + r, ForkNumber::Main as u8));
            let expected: std::collections::BTreeSet<(u32, u8)> = before.iter().copied().chain(created).collect();
            assert_eq!(dir, expected, "{what}: version after relation {i}");
        }
    };
    check("in memory");
    tl.checkpoint().unwrap();
    check("flushed");
    // Whole directories only now and then: the layers hold a few MB, where
    // a whole directory per relation was 5 bytes × N²/2, 250 MB before
    // compression.
    let (_, bytes) = tl.resident_layers();
    assert!(bytes < 8 << 20, "{bytes} bytes of layers for {RELS} relations");
    let applied = common::metric(&metrics, "strata_pageserver_redo_records_applied_total");
    assert!(applied > 0.0, "versions were rebuilt from changes");

    // Reloaded (no sizes cached), walking the directory (as a basebackup
    // and a database's size do) reads it once and each listed size once:
    // one read per relation, not two (each size read used to read the
    // whole directory again).
    let dir = common::test_dir_path("native-redo-rel-dir");
    drop(ingest);
    drop(tl);
    let res =
        common::resources(metrics.clone(), FileCache::new(16, Default::default(), strata_pageserver::clock::system()));
    let tl = Timeline::load(dir.clone(), &res).unwrap();
    let (_, reads_before) = common::layers_visited(&metrics);
    assert_eq!(tl.db_size(REL.spc, REL.db, lsn).unwrap(), 0);
    let (_, reads_after) = common::layers_visited(&metrics);
    let reads = reads_after - reads_before;
    assert!(reads >= f64::from(RELS) && reads < f64::from(RELS) + 1_000.0, "{reads} reads for {RELS} relations");
    std::fs::remove_dir_all(&dir).unwrap();
}
