//! Btree redo on hand-built pages and records: each record kind against a
//! page built the way PostgreSQL builds the result, and hostile input.

use strata_formats::page::{pd_lower, pd_lsn, pd_upper, PageHeader};
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::v15::rmgr::RM_BTREE_ID;
use strata_formats::wal::record::{BlockRef, DecodedRecord, RecordHeader, BKPBLOCK_HAS_DATA, RECORD_HEADER_SIZE};
use strata_formats::Lsn;
use strata_test_support::rng::RngExt;

use super::page::{self, Opaque, BTP_DELETED, BTP_HAS_FULLXID, BTP_META};
use super::tuple;
use super::tuple::tests::{plain, tid};
use super::*;

const END_LSN: u64 = 0x0000_0002_0000_1238;

fn record(info: u8, main: &[u8], blocks: &[(u8, u32, &[u8])]) -> DecodedRecord {
    let mut raw = vec![0u8; RECORD_HEADER_SIZE];
    let mut refs = Vec::new();
    for &(id, block, data) in blocks {
        let start = raw.len();
        raw.extend_from_slice(data);
        let flags = if data.is_empty() { 0 } else { BKPBLOCK_HAS_DATA };
        refs.push(BlockRef {
            id,
            rel: RelFileNode { spc: 1663, db: 5, rel: 16384 },
            fork: ForkNumber::Main,
            block,
            flags,
            image: None,
            data: start..raw.len(),
        });
    }
    let main_start = raw.len();
    raw.extend_from_slice(main);
    DecodedRecord {
        version: strata_formats::PgVersion::V15,
        lsn: Lsn(END_LSN - 0x40),
        end_lsn: Lsn(END_LSN),
        header: RecordHeader { total_length: raw.len() as u32, xid: 0, prev: Lsn(0), info, rmgr: RM_BTREE_ID, crc: 0 },
        origin: None,
        toplevel_xid: None,
        blocks: refs,
        main_data: main_start..raw.len(),
        raw,
    }
}

fn le16(vals: &[u16]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn le32(vals: &[u32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A btree page holding `items` in order.
fn btree_page(o: &Opaque, items: &[Vec<u8>]) -> Box<Page> {
    let mut p = Box::new([0u8; BLCKSZ]);
    page::init(&mut p, o).unwrap();
    for (i, item) in items.iter().enumerate() {
        bufpage::page_add_item(&mut p, item, Some(i as u16 + 1), false, false).unwrap();
    }
    p
}

fn items(p: &Page) -> Vec<Vec<u8>> {
    (1..=page::max_offset(p).unwrap()).map(|o| bufpage::page_get_item(p, o).unwrap().to_vec()).collect()
}

fn leaf(next: u32) -> Opaque {
    Opaque { prev: 0, next, level: 0, flags: BTP_LEAF, cycle_id: 0 }
}

/// The page with its LSN set as redo leaves it.
fn stamped(mut p: Box<Page>) -> Box<Page> {
    set_pd_lsn(&mut p[..], END_LSN).unwrap();
    p
}

fn key(k: u32) -> Vec<u8> {
    k.to_be_bytes().to_vec()
}

#[test]
fn supported_kinds() {
    for info in (0..=0xE0).step_by(0x10) {
        assert!(supports(info as u8));
        assert!(supports(info as u8 | 0x02), "low bits belong to the WAL machinery");
    }
    assert!(!supports(0xF0));
}

#[test]
fn insert_leaf_and_upper() {
    let mut p = btree_page(&leaf(0), &[plain((1, 1), &key(1)), plain((1, 2), &key(2)), plain((1, 4), &key(4))]);
    let newitem = plain((1, 3), &key(3));
    let rec = record(XLOG_BTREE_INSERT_LEAF, &le16(&[3]), &[(0, 7, &newitem)]);
    redo(&rec, 0, &mut p).unwrap();
    let expected = btree_page(
        &leaf(0),
        &[plain((1, 1), &key(1)), plain((1, 2), &key(2)), plain((1, 3), &key(3)), plain((1, 4), &key(4))],
    );
    let mut expected_after_insert = btree_page(&leaf(0), &[plain((1, 1), &key(1)), plain((1, 2), &key(2))]);
    bufpage::page_add_item(&mut expected_after_insert, &plain((1, 4), &key(4)), Some(3), false, false).unwrap();
    bufpage::page_add_item(&mut expected_after_insert, &newitem, Some(3), false, false).unwrap();
    assert_eq!(items(&p), items(&expected));
    assert_eq!(&p[..], &stamped(expected_after_insert)[..]);
    assert!(redo(&rec, 1, &mut p).is_err(), "a leaf insert has no child block");

    // An upper insert clears the child's incomplete-split flag.
    let child = Opaque { flags: BTP_LEAF | BTP_INCOMPLETE_SPLIT | BTP_HAS_GARBAGE, next: 9, ..Opaque::default() };
    let mut c = btree_page(&child, &[plain((0, 0), &key(9))]);
    let rec = record(XLOG_BTREE_INSERT_UPPER, &le16(&[2]), &[(0, 3, &plain((8, 0), &key(5))), (1, 8, &[])]);
    redo(&rec, 1, &mut c).unwrap();
    assert_eq!(page::opaque(&c).unwrap().flags, BTP_LEAF | BTP_HAS_GARBAGE);
    assert_eq!(pd_lsn(&c[..]).unwrap(), END_LSN);
}

#[test]
fn insert_meta_rebuilds_metapage() {
    let md = le32(&[4, 3, 1, 3, 1, 0]).into_iter().chain([1u8, 0, 0, 0]).collect::<Vec<u8>>();
    let rec = record(XLOG_BTREE_INSERT_META, &le16(&[2]), &[(0, 3, &plain((8, 0), &key(5))), (1, 8, &[]), (2, 0, &md)]);
    let mut m = Box::new([0xAAu8; BLCKSZ]);
    redo(&rec, 2, &mut m).unwrap();
    let h = PageHeader::decode(&m[..]).unwrap();
    assert_eq!((h.lower, h.upper, h.special, h.pagesize_version), (72, 8176, 8176, 0x2004));
    assert_eq!(h.lsn, END_LSN);
    assert_eq!(&m[24..52], &le32(&[0x053162, 4, 3, 1, 3, 1, 0])[..]);
    assert_eq!(&m[52..56], &[0; 4]);
    assert_eq!(f64::from_le_bytes(m[56..64].try_into().unwrap()), -1.0);
    assert_eq!(&m[64..72], &[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(page::opaque(&m).unwrap(), Opaque { flags: BTP_META, ..Opaque::default() });
    assert!(m[72..8176].iter().all(|&b| b == 0));
}

#[test]
fn posting_split_insert() {
    let tids = [tid(1, 1), tid(1, 3), tid(1, 5)];
    let posting = tuple::form_posting(&plain((0, 0), &key(7)), &tids).unwrap();
    let mut p = btree_page(&leaf(0), &[plain((0, 9), &key(6)), posting.clone(), plain((2, 1), &key(8))]);
    let orignewitem = plain((1, 4), &key(7));
    let mut data = le16(&[2]);
    data.extend_from_slice(&orignewitem);
    let rec = record(XLOG_BTREE_INSERT_POST, &le16(&[3]), &[(0, 1, &data)]);
    redo(&rec, 0, &mut p).unwrap();
    let got = items(&p);
    assert_eq!(got.len(), 4);
    assert_eq!(tuple::posting_tids(&got[1]).unwrap(), vec![tids[0], tids[1], tid(1, 4)]);
    assert_eq!(&got[2][..6], &tids[2], "the new item takes the posting list's last TID");
    assert_eq!(&got[2][6..], &orignewitem[6..]);
}

/// Builds the two halves of a split leaf page and checks both against pages
/// assembled directly.
#[test]
fn split_rebuilds_both_halves() {
    let hikey = plain((0, 0), &key(100));
    let mut orig_items = vec![hikey.clone()];
    orig_items.extend((1..=10).map(|k| plain((1, k as u16), &key(k * 10))));
    let orig_opaque = Opaque { prev: 4, next: 9, level: 0, flags: BTP_LEAF, cycle_id: 77 };
    let orig = btree_page(&orig_opaque, &orig_items);

    // New item (key 35) goes between items of keys 30 and 40 (offsets 4 and 5)
    // on the left; items from offset 7 (key 60) move right.
    let newitem = plain((1, 99), &key(35));
    let left_hikey = plain((0, 0), &key(55));
    let split = [0u32.to_le_bytes().to_vec(), le16(&[7, 5, 0])].concat();
    let mut left_data = newitem.clone();
    left_data.extend_from_slice(&left_hikey);

    let mut right_items = vec![hikey.clone()];
    right_items.extend(orig_items[6..].iter().cloned());
    let right_opaque = Opaque { prev: 3, next: 9, level: 0, flags: BTP_LEAF, cycle_id: 0 };
    let right_expected = btree_page(&right_opaque, &right_items);
    let upper = pd_upper(&right_expected[..]).unwrap() as usize;
    let right_data = right_expected[upper..BLCKSZ - 16].to_vec();

    let rec = record(XLOG_BTREE_SPLIT_L, &split, &[(0, 3, &left_data), (1, 12, &right_data), (2, 9, &[])]);
    let mut left = orig.clone();
    redo(&rec, 0, &mut left).unwrap();
    let left_items =
        [vec![left_hikey.clone()], orig_items[1..4].to_vec(), vec![newitem.clone()], orig_items[4..6].to_vec()]
            .concat();
    let left_opaque = Opaque { prev: 4, next: 12, level: 0, flags: BTP_LEAF | BTP_INCOMPLETE_SPLIT, cycle_id: 0 };
    assert_eq!(&left[..], &stamped(btree_page(&left_opaque, &left_items))[..]);

    let mut right = Box::new([0x5Au8; BLCKSZ]);
    redo(&rec, 1, &mut right).unwrap();
    let right_opaque = Opaque { prev: 3, ..right_opaque };
    let mut want = btree_page(&right_opaque, &right_items);
    want = stamped(want);
    // The right sibling number comes from block 2's reference.
    page::update_opaque(&mut want, |o| o.next = 9).unwrap();
    assert_eq!(&right[..], &want[..]);

    let mut sib = btree_page(&Opaque { prev: 3, next: 0, level: 0, flags: BTP_LEAF, cycle_id: 0 }, &[]);
    redo(&rec, 2, &mut sib).unwrap();
    assert_eq!(page::opaque(&sib).unwrap().prev, 12);
    assert!(redo(&rec, 3, &mut sib).is_err(), "no child block on a leaf split");

    // The same split with the new item at the very end of the left half.
    let split = [0u32.to_le_bytes().to_vec(), le16(&[7, 7, 0])].concat();
    let rec = record(XLOG_BTREE_SPLIT_L, &split, &[(0, 3, &left_data), (1, 12, &right_data)]);
    let mut left = orig.clone();
    redo(&rec, 0, &mut left).unwrap();
    let left_items = [vec![left_hikey.clone()], orig_items[1..6].to_vec(), vec![newitem.clone()]].concat();
    assert_eq!(items(&left), left_items);

    // SPLIT_R: no new item in block 0's data, only the high key.
    let split = [0u32.to_le_bytes().to_vec(), le16(&[7, 8, 0])].concat();
    let rec = record(XLOG_BTREE_SPLIT_R, &split, &[(0, 3, &left_hikey), (1, 12, &right_data)]);
    let mut left = orig.clone();
    redo(&rec, 0, &mut left).unwrap();
    assert_eq!(items(&left), [vec![left_hikey.clone()], orig_items[1..6].to_vec()].concat());
    assert_eq!(page::opaque(&right).unwrap().level, 0);
}

#[test]
fn split_with_posting_list_split() {
    let tids = [tid(1, 1), tid(1, 3), tid(1, 5), tid(1, 7)];
    let posting = tuple::form_posting(&plain((0, 0), &key(20)), &tids).unwrap();
    let orig_items = vec![plain((0, 5), &key(10)), posting.clone(), plain((2, 2), &key(30)), plain((2, 3), &key(40))];
    let orig = btree_page(&leaf(0), &orig_items);
    // New item with TID (1,4) lands inside the posting list at offset 2 and goes
    // left at offset 3; items from offset 4 move right.
    let orignewitem = plain((1, 4), &key(20));
    let left_hikey = plain((0, 0), &key(25));
    let split = [0u32.to_le_bytes().to_vec(), le16(&[3, 3, 2])].concat();
    let data = [orignewitem.clone(), left_hikey.clone()].concat();
    let rec = record(XLOG_BTREE_SPLIT_L, &split, &[(0, 3, &data), (1, 12, &orig_items[2])]);
    let mut left = orig.clone();
    redo(&rec, 0, &mut left).unwrap();
    let got = items(&left);
    assert_eq!(got.len(), 4);
    assert_eq!(got[0], left_hikey);
    assert_eq!(got[1], orig_items[0]);
    assert_eq!(tuple::posting_tids(&got[2]).unwrap(), vec![tids[0], tids[1], tid(1, 4), tids[2]]);
    assert_eq!(&got[3][..6], &tids[3]);

    // SPLIT_R variant: the posting list is the left page's last item and the
    // new item is the right page's first; the original new item still comes.
    let split = [0u32.to_le_bytes().to_vec(), le16(&[3, 3, 2])].concat();
    let rec = record(XLOG_BTREE_SPLIT_R, &split, &[(0, 3, &data), (1, 12, &orig_items[2])]);
    let mut left = orig.clone();
    redo(&rec, 0, &mut left).unwrap();
    let got = items(&left);
    assert_eq!(got.len(), 3);
    assert_eq!(tuple::posting_tids(&got[2]).unwrap(), vec![tids[0], tids[1], tid(1, 4), tids[2]]);
}

#[test]
fn dedup_merges_listed_runs() {
    let a = [tid(1, 1), tid(1, 2), tid(1, 3)];
    let page_items = vec![
        plain((9, 9), &key(0)), // high key
        plain((1, 1), &key(1)),
        plain((1, 2), &key(1)),
        plain((1, 3), &key(1)),
        plain((2, 1), &key(2)),
        plain((3, 1), &key(3)),
        tuple::form_posting(&plain((0, 0), &key(3)), &[tid(3, 2), tid(3, 3)]).unwrap(),
        plain((4, 1), &key(4)),
        plain((4, 2), &key(4)),
    ];
    let o = Opaque { flags: BTP_LEAF | BTP_HAS_GARBAGE, next: 5, ..Opaque::default() };
    let mut p = btree_page(&o, &page_items);
    // Key 4's run is left alone: only the first two runs are listed.
    let rec = record(XLOG_BTREE_DEDUP, &le16(&[2]), &[(0, 2, &le16(&[2, 3, 6, 2]))]);
    redo(&rec, 0, &mut p).unwrap();
    let expected_items = vec![
        page_items[0].clone(),
        tuple::form_posting(&page_items[1], &a).unwrap(),
        page_items[4].clone(),
        tuple::form_posting(&page_items[5], &[tid(3, 1), tid(3, 2), tid(3, 3)]).unwrap(),
        page_items[7].clone(),
        page_items[8].clone(),
    ];
    let expected = btree_page(&Opaque { flags: BTP_LEAF, ..o }, &expected_items);
    assert_eq!(&p[..], &stamped(expected)[..]);

    // Intervals that do not match the page are refused.
    let mut p = btree_page(&o, &page_items);
    let rec = record(XLOG_BTREE_DEDUP, &le16(&[1]), &[(0, 2, &le16(&[50, 2]))]);
    assert!(redo(&rec, 0, &mut p).is_err());
}

#[test]
fn vacuum_and_delete_update_posting_lists() {
    let tids = [tid(1, 1), tid(1, 2), tid(2, 1), tid(2, 2)];
    let page_items = vec![
        tuple::form_posting(&plain((0, 0), &key(1)), &tids).unwrap(),
        plain((3, 1), &key(2)),
        tuple::form_posting(&plain((0, 0), &key(3)), &tids[..2]).unwrap(),
        plain((3, 3), &key(4)),
    ];
    let o = Opaque { flags: BTP_LEAF | BTP_HAS_GARBAGE, cycle_id: 12, ..Opaque::default() };
    let payload = le16(&[2, 4, 1, 3, 2, 0, 3, 1, 1]);
    let rec = record(XLOG_BTREE_VACUUM, &le16(&[2, 2]), &[(0, 1, &payload)]);
    let mut p = btree_page(&o, &page_items);
    redo(&rec, 0, &mut p).unwrap();
    let got = items(&p);
    assert_eq!(got.len(), 2);
    assert_eq!(tuple::posting_tids(&got[0]).unwrap(), vec![tids[1], tids[2]]);
    assert!(!tuple::is_posting(&got[1]));
    assert_eq!(&got[1][..6], &tids[0]);
    assert_eq!(page::opaque(&p).unwrap(), Opaque { flags: BTP_LEAF, cycle_id: 0, ..o });

    // DELETE keeps the vacuum cycle id.
    let main = [le32(&[1234]), le16(&[2, 2])].concat();
    let rec = record(XLOG_BTREE_DELETE, &main, &[(0, 1, &payload)]);
    let mut q = btree_page(&o, &page_items);
    redo(&rec, 0, &mut q).unwrap();
    assert_eq!(items(&q), got);
    assert_eq!(page::opaque(&q).unwrap(), Opaque { flags: BTP_LEAF, cycle_id: 12, ..o });
}

#[test]
fn page_deletion() {
    // The parent loses the downlink at offset 2 and the key after it.
    let internal = Opaque { level: 1, ..Opaque::default() };
    let parent_items = vec![plain((10, 0), &[]), plain((11, 0), &key(5)), plain((12, 0), &key(9))];
    let mut parent = btree_page(&internal, &parent_items);
    let main = [le16(&[2, 0]), le32(&[11, 10, 12, 11])].concat();
    let rec = record(XLOG_BTREE_MARK_PAGE_HALFDEAD, &main, &[(0, 11, &[]), (1, 20, &[])]);
    redo(&rec, 1, &mut parent).unwrap();
    let got = items(&parent);
    assert_eq!(got.len(), 2);
    assert_eq!(tuple::downlink(&got[1]).unwrap(), 12);
    assert_eq!(&got[1][6..], &parent_items[1][6..]);

    let mut leafpage = Box::new([0x11u8; BLCKSZ]);
    redo(&rec, 0, &mut leafpage).unwrap();
    let h = PageHeader::decode(&leafpage[..]).unwrap();
    assert_eq!((h.lower, h.upper), (28, 8168));
    assert_eq!(items(&leafpage), vec![tuple::top_parent_high_key(11).to_vec()]);
    assert_eq!(
        page::opaque(&leafpage).unwrap(),
        Opaque { prev: 10, next: 12, level: 0, flags: BTP_HALF_DEAD | BTP_LEAF, cycle_id: 0 }
    );

    // Unlinking an internal page, with the leaf still half-dead below it.
    let main = [le32(&[30, 32, 1, 0]), 0x0000_0001_0000_0777u64.to_le_bytes().to_vec(), le32(&[40, 42, 55])].concat();
    let md = [le32(&[4, 32, 1, 32, 1, 0]), vec![1, 0, 0, 0]].concat();
    let rec = record(
        XLOG_BTREE_UNLINK_PAGE_META,
        &main,
        &[(0, 31, &[]), (1, 30, &[]), (2, 32, &[]), (3, 41, &[]), (4, 0, &md)],
    );
    let mut target = btree_page(&internal, &parent_items);
    redo(&rec, 0, &mut target).unwrap();
    let h = PageHeader::decode(&target[..]).unwrap();
    assert_eq!((h.lower, h.upper, h.special), (32, 8176, 8176));
    assert_eq!(&target[24..32], &0x0000_0001_0000_0777u64.to_le_bytes());
    assert_eq!(
        page::opaque(&target).unwrap(),
        Opaque { prev: 30, next: 32, level: 1, flags: BTP_DELETED | BTP_HAS_FULLXID, cycle_id: 0 }
    );
    let mut l = btree_page(&internal, &[]);
    redo(&rec, 1, &mut l).unwrap();
    assert_eq!(page::opaque(&l).unwrap().next, 32);
    let mut r = btree_page(&internal, &[]);
    redo(&rec, 2, &mut r).unwrap();
    assert_eq!(page::opaque(&r).unwrap().prev, 30);
    let mut lf = Box::new([0u8; BLCKSZ]);
    redo(&rec, 3, &mut lf).unwrap();
    assert_eq!(items(&lf), vec![tuple::top_parent_high_key(55).to_vec()]);
    assert_eq!(page::opaque(&lf).unwrap().prev, 40);
    let mut m = Box::new([0u8; BLCKSZ]);
    redo(&rec, 4, &mut m).unwrap();
    assert_eq!(page::opaque(&m).unwrap().flags, BTP_META);
    assert_eq!(&m[32..36], &32u32.to_le_bytes());

    // A leaf target is flagged as a leaf too.
    let main = [le32(&[0, 32, 0, 0]), 5u64.to_le_bytes().to_vec(), le32(&[0, 32, u32::MAX])].concat();
    let rec = record(XLOG_BTREE_UNLINK_PAGE, &main, &[(0, 31, &[]), (2, 32, &[])]);
    let mut t = Box::new([0u8; BLCKSZ]);
    redo(&rec, 0, &mut t).unwrap();
    assert_eq!(page::opaque(&t).unwrap().flags, BTP_DELETED | BTP_HAS_FULLXID | BTP_LEAF);
    assert!(redo(&rec, 4, &mut t).is_err());
}

#[test]
fn new_root() {
    let downlinks = vec![plain((3, 0), &[]), plain((12, 0), &key(55))];
    let expected = btree_page(&Opaque { flags: BTP_ROOT, level: 1, ..Opaque::default() }, &downlinks);
    let upper = pd_upper(&expected[..]).unwrap() as usize;
    let data = expected[upper..BLCKSZ - 16].to_vec();
    let md = [le32(&[4, 20, 1, 20, 1, 0]), vec![1, 0, 0, 0]].concat();
    let rec = record(XLOG_BTREE_NEWROOT, &le32(&[20, 1]), &[(0, 20, &data), (1, 3, &[]), (2, 0, &md)]);
    let mut root = Box::new([0u8; BLCKSZ]);
    redo(&rec, 0, &mut root).unwrap();
    assert_eq!(&root[..], &stamped(expected)[..]);
    let mut child = btree_page(&Opaque { flags: BTP_LEAF | BTP_INCOMPLETE_SPLIT, next: 12, ..Opaque::default() }, &[]);
    redo(&rec, 1, &mut child).unwrap();
    assert_eq!(page::opaque(&child).unwrap().flags, BTP_LEAF);

    // The first root of an empty index is an empty leaf.
    let rec = record(XLOG_BTREE_NEWROOT, &le32(&[1, 0]), &[(0, 1, &[]), (2, 0, &md)]);
    let mut root = Box::new([0u8; BLCKSZ]);
    redo(&rec, 0, &mut root).unwrap();
    assert_eq!(page::opaque(&root).unwrap().flags, BTP_ROOT | BTP_LEAF);
    assert_eq!(pd_lower(&root[..]).unwrap(), 24);

    let rec = record(XLOG_BTREE_META_CLEANUP, &[], &[(0, 0, &md)]);
    let mut m = Box::new([0u8; BLCKSZ]);
    redo(&rec, 0, &mut m).unwrap();
    let mut want = Box::new([0u8; BLCKSZ]);
    page::restore_meta(&mut want, &super::records::metadata(&md).unwrap()).unwrap();
    assert_eq!(&m[..], &stamped(want)[..]);
}

/// Truncated and random records on valid, garbage and empty pages: errors
/// are fine, panics are not.
#[test]
fn hostile_input_never_panics() {
    let posting = tuple::form_posting(&plain((0, 0), &key(3)), &[tid(1, 1), tid(1, 2), tid(1, 3)]).unwrap();
    let good = btree_page(&leaf(4), &[plain((0, 0), &key(9)), plain((1, 1), &key(1)), posting, plain((1, 9), &key(5))]);
    let mut rng = strata_test_support::rng::seeded("nbtree redo of damaged records", 0x9E37_79B9_7F4A_7C15);
    let mut garbage = Box::new([0u8; BLCKSZ]);
    let mut pages: Vec<Box<Page>> = vec![good.clone(), Box::new([0u8; BLCKSZ])];
    for _ in 0..4 {
        garbage.copy_from_slice(&rng.bytes(BLCKSZ));
        pages.push(garbage.clone());
        // A valid header over garbage contents.
        let mut g = garbage.clone();
        g[..24].copy_from_slice(&good[..24]);
        pages.push(g);
    }
    let tuple_data = [plain((1, 2), &key(2)), plain((0, 0), &key(7))].concat();
    for info in (0..=0xF0u16).step_by(0x10) {
        for round in 0..40 {
            let main_len = (rng.u64(..) % 48) as usize;
            let mut main = rng.bytes(main_len);
            if round % 2 == 0 {
                // Plausible small numbers get further into the redo routines.
                for b in main.iter_mut().skip(1).step_by(2) {
                    *b = 0;
                }
            }
            let data: Vec<u8> = match round % 4 {
                0 => tuple_data.clone(),
                1 => tuple_data[..(rng.u64(..) as usize % tuple_data.len())].to_vec(),
                2 => le16(&[2, 1, 1, 2, 3, 0, 1]),
                _ => {
                    let n = (rng.u64(..) % 64) as usize;
                    rng.bytes(n)
                }
            };
            let blocks: Vec<(u8, u32, &[u8])> = (0..5).map(|id| (id, id as u32 + 1, &data[..])).collect();
            let rec = record(info as u8, &main, &blocks);
            for p in &pages {
                for id in 0..5 {
                    let mut page = p.clone();
                    let _ = redo(&rec, id, &mut page);
                }
            }
        }
    }
}
