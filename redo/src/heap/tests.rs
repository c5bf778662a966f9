use strata_formats::lsn::Lsn;
use strata_formats::page::{item_id, pd_lower, pd_upper, LP_NORMAL, PD_HAS_FREE_LINES};
use strata_formats::types::{ForkNumber, RelFileNode};
use strata_formats::v15::rmgr::{RM_HEAP2_ID, RM_HEAP_ID};
use strata_formats::wal::record::{BKPBLOCK_HAS_DATA, BKPBLOCK_WILL_INIT, RECORD_HEADER_SIZE};

use super::*;
use crate::htup::{HEAP_COMBOCID, HEAP_KEYS_UPDATED, HEAP_XMAX_INVALID, HEAP_XMAX_LOCK_ONLY, XLHL_XMAX_LOCK_ONLY};

const XID: u32 = 1000;
const END_LSN: u64 = 0x0000_0001_0000_2000;
const REL: RelFileNode = RelFileNode { spc: 1663, db: 5, rel: 16384 };

/// A block reference of a test record.
struct Blk {
    id: u8,
    fork: ForkNumber,
    block: u32,
    data: Vec<u8>,
    init: bool,
}

fn blk(id: u8, block: u32, data: Vec<u8>) -> Blk {
    Blk { id, fork: ForkNumber::Main, block, data, init: false }
}

/// Assembles and decodes a record the way PostgreSQL lays it out.
fn record(rmgr: u8, info: u8, blocks: &[Blk], main: &[u8]) -> DecodedRecord {
    let mut body = Vec::new();
    for b in blocks {
        let mut flags = b.fork as u8;
        if !b.data.is_empty() {
            flags |= BKPBLOCK_HAS_DATA;
        }
        if b.init {
            flags |= BKPBLOCK_WILL_INIT;
        }
        body.push(b.id);
        body.push(flags);
        body.extend_from_slice(&(b.data.len() as u16).to_le_bytes());
        body.extend_from_slice(&REL.encode());
        body.extend_from_slice(&b.block.to_le_bytes());
    }
    if !main.is_empty() {
        body.push(255);
        body.push(main.len() as u8);
    }
    for b in blocks {
        body.extend_from_slice(&b.data);
    }
    body.extend_from_slice(main);
    let total = RECORD_HEADER_SIZE + body.len();
    let mut raw = Vec::with_capacity(total);
    raw.extend_from_slice(&(total as u32).to_le_bytes());
    raw.extend_from_slice(&XID.to_le_bytes());
    raw.extend_from_slice(&0u64.to_le_bytes());
    raw.push(info);
    raw.push(rmgr);
    raw.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    raw.extend_from_slice(&body);
    DecodedRecord::decode(strata_formats::PgVersion::V15, Lsn(END_LSN - 0x100), Lsn(END_LSN), raw)
        .expect("test record decodes")
}

/// Logged tuple body: an 1-byte null-bitmap-free header pad to t_hoff 24, then data.
fn heap_header(infomask2: u16, infomask: u16, hoff: u8) -> Vec<u8> {
    let mut v = infomask2.to_le_bytes().to_vec();
    v.extend_from_slice(&infomask.to_le_bytes());
    v.push(hoff);
    v
}

fn insert_record(offnum: u16, init: bool, data: &[u8], flags: u8) -> DecodedRecord {
    let mut bd = heap_header(2, 0x0802 | HEAP_COMBOCID, 24);
    bd.push(0); // padding byte between the 23-byte header and t_hoff
    bd.extend_from_slice(data);
    let info = if init { XLOG_HEAP_INSERT | XLOG_HEAP_INIT_PAGE } else { XLOG_HEAP_INSERT };
    let mut main = offnum.to_le_bytes().to_vec();
    main.push(flags);
    record(RM_HEAP_ID, info, &[Blk { init, ..blk(0, 7, bd) }], &main)
}

fn zero_page() -> Box<Page> {
    Box::new([0u8; BLCKSZ])
}

/// A page holding tuples with the given data, inserted at offsets 1, 2, ...
fn page_with(tuples: &[&[u8]]) -> Box<Page> {
    let mut page = zero_page();
    for (i, data) in tuples.iter().enumerate() {
        let rec = insert_record(i as u16 + 1, i == 0, data, 0);
        redo_heap(&rec, 0, &mut page).unwrap();
    }
    page
}

fn tuple(page: &Page, offnum: u16) -> &[u8] {
    page_get_item(page, offnum).unwrap()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn insert_builds_the_tuple_header() {
    let page = page_with(&[b"hello"]);
    assert_eq!(pd_lsn(&page[..]).unwrap(), END_LSN);
    assert_eq!((pd_lower(&page[..]).unwrap(), pd_upper(&page[..]).unwrap()), (28, 8192 - 32));
    let t = tuple(&page, 1);
    assert_eq!(t.len(), 29);
    assert_eq!(u32_at(t, 0), XID, "xmin");
    assert_eq!(u32_at(t, 4), 0, "xmax");
    assert_eq!(u32_at(t, 8), 0, "cmin");
    assert_eq!((u16_at(t, 12), u16_at(t, 14), u16_at(t, 16)), (0, 7, 1), "ctid");
    assert_eq!(u16_at(t, 18), 2);
    assert_eq!(u16_at(t, 20), 0x0802, "combo cid flag cleared");
    assert_eq!(t[22], 24);
    assert_eq!(&t[24..], b"hello");
}

#[test]
fn insert_checks_offsets_and_clears_all_visible() {
    let mut page = page_with(&[b"a"]);
    set_all_visible(&mut page, true).unwrap();
    assert!(redo_heap(&insert_record(3, false, b"b", 0), 0, &mut page).is_err(), "offset past the end");
    redo_heap(&insert_record(2, false, b"b", XLH_INSERT_ALL_VISIBLE_CLEARED), 0, &mut page).unwrap();
    assert_eq!(pd_flags(&page[..]).unwrap() & PD_ALL_VISIBLE, 0);
    assert!(redo_heap(&insert_record(1, false, b"c", 0), 0, &mut page).is_err(), "slot in use");
    assert!(redo_heap(&insert_record(1, false, b"c", 0), 1, &mut page).is_err(), "no block 1");
}

#[test]
fn delete_marks_xmax() {
    let mut page = page_with(&[b"a", b"b"]);
    set_all_visible(&mut page, true).unwrap();
    let mut main = 2000u32.to_le_bytes().to_vec();
    main.extend_from_slice(&2u16.to_le_bytes());
    main.push(crate::htup::XLHL_KEYS_UPDATED);
    main.push(XLH_DELETE_ALL_VISIBLE_CLEARED);
    let rec = record(RM_HEAP_ID, XLOG_HEAP_DELETE, &[blk(0, 7, vec![])], &main);
    redo_heap(&rec, 0, &mut page).unwrap();
    let t = tuple(&page, 2);
    assert_eq!(u32_at(t, 4), 2000);
    assert_eq!(u16_at(t, 18), 2 | HEAP_KEYS_UPDATED);
    assert_eq!(u16_at(t, 20) & HEAP_XMAX_INVALID, 0);
    assert_eq!(pd_prune_xid(&page[..]).unwrap(), XID);
    assert_eq!(pd_flags(&page[..]).unwrap() & PD_ALL_VISIBLE, 0);

    // A partition move leaves the special ctid.
    main[7] = XLH_DELETE_IS_PARTITION_MOVE;
    main[4] = 1;
    redo_heap(&record(RM_HEAP_ID, XLOG_HEAP_DELETE, &[blk(0, 7, vec![])], &main), 0, &mut page).unwrap();
    let t = tuple(&page, 1);
    assert_eq!((u16_at(t, 12), u16_at(t, 14), u16_at(t, 16)), (0xFFFF, 0xFFFF, 0xFFFD));
    // Killing a speculative insertion invalidates xmin instead of setting xmax.
    let mut page = page_with(&[b"a"]);
    main[7] = XLH_DELETE_IS_SUPER;
    main[4] = 1;
    redo_heap(&record(RM_HEAP_ID, XLOG_HEAP_DELETE, &[blk(0, 7, vec![])], &main), 0, &mut page).unwrap();
    let t = tuple(&page, 1);
    assert_eq!((u32_at(t, 0), u32_at(t, 4)), (0, 0));
    assert_eq!((u16_at(t, 14), u16_at(t, 16)), (7, 1));
    main[4] = 3;
    assert!(redo_heap(&record(RM_HEAP_ID, XLOG_HEAP_DELETE, &[blk(0, 7, vec![])], &main), 0, &mut page).is_err());
}

fn update_main(old_off: u16, flags: u8, new_off: u16) -> Vec<u8> {
    let mut m = 3000u32.to_le_bytes().to_vec();
    m.extend_from_slice(&old_off.to_le_bytes());
    m.push(0);
    m.push(flags);
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&new_off.to_le_bytes());
    m
}

#[test]
fn hot_update_borrows_prefix_and_suffix() {
    let mut page = page_with(&[b"AAAAmiddleZZZ"]);
    let mut bd = Vec::new();
    bd.extend_from_slice(&4u16.to_le_bytes());
    bd.extend_from_slice(&3u16.to_le_bytes());
    bd.extend_from_slice(&heap_header(0x8002, 0x0802, 24));
    bd.push(0); // the new tuple's bytes between header and t_hoff
    bd.extend_from_slice(b"NEW");
    let flags = XLH_UPDATE_PREFIX_FROM_OLD | XLH_UPDATE_SUFFIX_FROM_OLD;
    let rec = record(RM_HEAP_ID, XLOG_HEAP_HOT_UPDATE, &[blk(0, 7, bd)], &update_main(1, flags, 2));
    redo_heap(&rec, 0, &mut page).unwrap();
    let new = tuple(&page, 2);
    assert_eq!(&new[24..], b"AAAANEWZZZ");
    assert_eq!((u16_at(new, 14), u16_at(new, 16)), (7, 2));
    let old = tuple(&page, 1);
    assert_eq!(u32_at(old, 4), 3000);
    assert_ne!(u16_at(old, 18) & HEAP_HOT_UPDATED, 0);
    assert_eq!((u16_at(old, 14), u16_at(old, 16)), (7, 2), "old version points at the new one");
    assert_eq!(pd_lsn(&page[..]).unwrap(), END_LSN);
}

#[test]
fn update_across_pages() {
    let mut old_page = page_with(&[b"old"]);
    let mut bd = heap_header(2, 0x0802, 24);
    bd.push(0);
    bd.extend_from_slice(b"newer");
    let info = XLOG_HEAP_UPDATE | XLOG_HEAP_INIT_PAGE;
    let blocks = [Blk { init: true, ..blk(0, 9, bd) }, blk(1, 7, vec![])];
    let flags = XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED | XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED;
    let rec = record(RM_HEAP_ID, info, &blocks, &update_main(1, flags, 1));
    let mut new_page = Box::new([0x55u8; BLCKSZ]);
    redo_heap(&rec, 0, &mut new_page).unwrap();
    redo_heap(&rec, 1, &mut old_page).unwrap();
    assert_eq!(&tuple(&new_page, 1)[24..], b"newer");
    assert_eq!(u16_at(tuple(&new_page, 1), 14), 9);
    let old = tuple(&old_page, 1);
    assert_eq!((u16_at(old, 14), u16_at(old, 16)), (9, 1));
    assert_eq!(u16_at(old, 18) & HEAP_HOT_UPDATED, 0);

    // Borrowing from an old tuple on another page is impossible.
    let rec = record(RM_HEAP_ID, XLOG_HEAP_UPDATE, &blocks, &update_main(1, XLH_UPDATE_PREFIX_FROM_OLD, 2));
    assert!(redo_heap(&rec, 0, &mut new_page).is_err());
}

#[test]
fn lock_only_resets_the_update_chain() {
    let mut page = page_with(&[b"x"]);
    // Pretend an aborted update left a HOT flag and a forward link.
    {
        let mut t = TupleMut::new(page_get_item_mut(&mut page, 1).unwrap()).unwrap();
        t.set_infomask2(2 | HEAP_HOT_UPDATED);
        t.set_ctid(7, 5);
    }
    let mut main = 4000u32.to_le_bytes().to_vec();
    main.extend_from_slice(&1u16.to_le_bytes());
    main.push(XLHL_XMAX_LOCK_ONLY);
    main.push(0);
    redo_heap(&record(RM_HEAP_ID, XLOG_HEAP_LOCK, &[blk(0, 7, vec![])], &main), 0, &mut page).unwrap();
    let t = tuple(&page, 1);
    assert_eq!(u32_at(t, 4), 4000);
    assert_eq!(u16_at(t, 18), 2);
    assert_eq!(u16_at(t, 16), 1);
    assert_ne!(u16_at(t, 20) & HEAP_XMAX_LOCK_ONLY, 0);

    main[0..4].copy_from_slice(&4001u32.to_le_bytes());
    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_LOCK_UPDATED, &[blk(0, 7, vec![])], &main);
    redo_heap2(&rec, 0, &mut page).unwrap();
    assert_eq!(u32_at(tuple(&page, 1), 4), 4001);
}

#[test]
fn inplace_and_confirm() {
    let mut page = page_with(&[b"abcd"]);
    let main = 1u16.to_le_bytes();
    let rec = record(RM_HEAP_ID, XLOG_HEAP_INPLACE, &[blk(0, 7, b"wxyz".to_vec())], &main);
    redo_heap(&rec, 0, &mut page).unwrap();
    assert_eq!(&tuple(&page, 1)[24..], b"wxyz");
    let rec = record(RM_HEAP_ID, XLOG_HEAP_INPLACE, &[blk(0, 7, b"wxy".to_vec())], &main);
    assert!(redo_heap(&rec, 0, &mut page).is_err());

    TupleMut::new(page_get_item_mut(&mut page, 1).unwrap()).unwrap().set_ctid(0, 0xFFFE);
    redo_heap(&record(RM_HEAP_ID, XLOG_HEAP_CONFIRM, &[blk(0, 7, vec![])], &main), 0, &mut page).unwrap();
    assert_eq!((u16_at(tuple(&page, 1), 14), u16_at(tuple(&page, 1), 16)), (7, 1));
}

fn offsets(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|o| o.to_le_bytes()).collect()
}

#[test]
fn prune_then_vacuum() {
    let mut page = page_with(&[b"one", b"two", b"three", b"four"]);
    let mut main = 0u32.to_le_bytes().to_vec();
    main.extend_from_slice(&1u16.to_le_bytes());
    main.extend_from_slice(&1u16.to_le_bytes());
    // 1 -> 3, 4 dead, 2 unused.
    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_PRUNE, &[blk(0, 7, offsets(&[1, 3, 4, 2]))], &main);
    redo_heap2(&rec, 0, &mut page).unwrap();
    assert_eq!(item_id(&page[..], 1).unwrap(), ItemId { off: 3, flags: LP_REDIRECT, len: 0 });
    assert_eq!(item_id(&page[..], 2).unwrap(), ItemId::default());
    assert_eq!(item_id(&page[..], 4).unwrap(), ItemId { off: 0, flags: LP_DEAD, len: 0 });
    let three = item_id(&page[..], 3).unwrap();
    assert_eq!((three.off, three.flags), (8192 - 32, LP_NORMAL), "the only tuple left moves to the end");
    assert_eq!(&tuple(&page, 3)[24..], b"three");
    assert_ne!(pd_flags(&page[..]).unwrap() & PD_HAS_FREE_LINES, 0);

    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_VACUUM, &[blk(0, 7, offsets(&[4]))], &1u16.to_le_bytes());
    redo_heap2(&rec, 0, &mut page).unwrap();
    assert_eq!(pd_lower(&page[..]).unwrap(), 24 + 3 * 4);

    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_VACUUM, &[blk(0, 7, offsets(&[9]))], &1u16.to_le_bytes());
    assert!(redo_heap2(&rec, 0, &mut page).is_err());
    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_VACUUM, &[blk(0, 7, offsets(&[2]))], &2u16.to_le_bytes());
    assert!(redo_heap2(&rec, 0, &mut page).is_err(), "fewer offsets than announced");
}

#[test]
fn freeze_sets_header_fields() {
    let mut page = page_with(&[b"x"]);
    let mut plan = 0u32.to_le_bytes().to_vec();
    plan.extend_from_slice(&1u16.to_le_bytes());
    plan.extend_from_slice(&2u16.to_le_bytes());
    plan.extend_from_slice(&0x0B02u16.to_le_bytes());
    plan.extend_from_slice(&[XLH_FREEZE_XVAC, 0]);
    let mut main = 500u32.to_le_bytes().to_vec();
    main.extend_from_slice(&1u16.to_le_bytes());
    redo_heap2(&record(RM_HEAP2_ID, XLOG_HEAP2_FREEZE_PAGE, &[blk(0, 7, plan)], &main), 0, &mut page).unwrap();
    let t = tuple(&page, 1);
    assert_eq!(u16_at(t, 20), 0x0B02);
    assert_eq!(u32_at(t, 8), FROZEN_TRANSACTION_ID);
}

#[test]
fn visible_sets_vm_bits_and_page_flag() {
    let heap_block = HEAPBLOCKS_PER_VM_PAGE + 6;
    let mut main = 0u32.to_le_bytes().to_vec();
    main.push(VISIBILITYMAP_VALID_BITS);
    let blocks = [Blk { fork: ForkNumber::VisibilityMap, ..blk(0, 1, vec![]) }, blk(1, heap_block, vec![])];
    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_VISIBLE, &blocks, &main);
    let mut vm = zero_page();
    redo_heap2(&rec, 0, &mut vm).unwrap();
    assert_eq!(pd_upper(&vm[..]).unwrap(), 8192, "a new map page is initialized");
    assert_eq!(vm[24 + 1], 0b0011_0000);
    assert_eq!(pd_lsn(&vm[..]).unwrap(), END_LSN);

    // Bits already set: the page, LSN included, stays as it is.
    set_pd_lsn(&mut vm[..], 5).unwrap();
    redo_heap2(&rec, 0, &mut vm).unwrap();
    assert_eq!(pd_lsn(&vm[..]).unwrap(), 5);
    // A page already past the record is left alone.
    vm[25] = 0;
    set_pd_lsn(&mut vm[..], END_LSN).unwrap();
    redo_heap2(&rec, 0, &mut vm).unwrap();
    assert_eq!(vm[25], 0);

    let mut heap = page_with(&[b"x"]);
    redo_heap2(&rec, 1, &mut heap).unwrap();
    assert_ne!(pd_flags(&heap[..]).unwrap() & PD_ALL_VISIBLE, 0);

    let wrong = [Blk { fork: ForkNumber::VisibilityMap, ..blk(0, 0, vec![]) }, blk(1, heap_block, vec![])];
    assert!(redo_heap2(&record(RM_HEAP2_ID, XLOG_HEAP2_VISIBLE, &wrong, &main), 0, &mut vm).is_err());
}

fn multi_tuple(data: &[u8]) -> Vec<u8> {
    let mut v = ((data.len() + 1) as u16).to_le_bytes().to_vec();
    v.extend_from_slice(&heap_header(2, 0x0802, 24));
    v.push(0);
    v.extend_from_slice(data);
    v
}

#[test]
fn multi_insert_with_and_without_init() {
    let mut bd = multi_tuple(b"abc");
    bd.push(0xEE); // pad to the next tuple's even offset
    bd.extend_from_slice(&multi_tuple(b"cde"));
    let mut main = vec![XLH_INSERT_ALL_FROZEN_SET, 0];
    main.extend_from_slice(&2u16.to_le_bytes());
    let info = XLOG_HEAP2_MULTI_INSERT | XLOG_HEAP_INIT_PAGE;
    let rec = record(RM_HEAP2_ID, info, &[Blk { init: true, ..blk(0, 7, bd.clone()) }], &main);
    let mut page = zero_page();
    redo_heap2(&rec, 0, &mut page).unwrap();
    assert_eq!(&tuple(&page, 1)[24..], b"abc");
    assert_eq!(&tuple(&page, 2)[24..], b"cde");
    assert_eq!(u16_at(tuple(&page, 2), 16), 2);
    assert_ne!(pd_flags(&page[..]).unwrap() & PD_ALL_VISIBLE, 0);

    let mut main = vec![0, 0];
    main.extend_from_slice(&2u16.to_le_bytes());
    main.extend_from_slice(&offsets(&[3, 4]));
    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_MULTI_INSERT, &[blk(0, 7, bd.clone())], &main);
    redo_heap2(&rec, 0, &mut page).unwrap();
    assert_eq!(&tuple(&page, 4)[24..], b"cde");

    bd.push(0);
    let rec = record(RM_HEAP2_ID, XLOG_HEAP2_MULTI_INSERT, &[blk(0, 7, bd)], &main);
    assert!(redo_heap2(&rec, 0, &mut page_with(&[b"a", b"b"])).is_err(), "trailing bytes");
}

#[test]
fn support_matrix() {
    assert!(supports_heap(XLOG_HEAP_INSERT | XLOG_HEAP_INIT_PAGE));
    assert!(supports_heap(XLOG_HEAP_INPLACE));
    assert!(!supports_heap(0x30), "truncate");
    assert!(supports_heap2(XLOG_HEAP2_MULTI_INSERT | XLOG_HEAP_INIT_PAGE));
    assert!(supports_heap2(XLOG_HEAP2_NEW_CID));
    assert!(!supports_heap2(0x00), "rewrite");
}

/// Garbage records and pages give errors, never panics.
#[test]
fn garbage_never_panics() {
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let base = page_with(&[b"first tuple", b"second", b"3"]);
    for round in 0..4000 {
        let info = (next() as u8) & 0xF0;
        let rmgr = if round % 2 == 0 { RM_HEAP_ID } else { RM_HEAP2_ID };
        let main: Vec<u8> = (0..next() % 24).map(|_| next() as u8 % 8).collect();
        let data: Vec<u8> = (0..next() % 40).map(|_| next() as u8 % 8).collect();
        let blocks = [
            Blk { fork: ForkNumber::VisibilityMap, ..blk(0, 0, data.clone()) },
            blk(1, next() as u32 % 4, data.clone()),
        ];
        let rec = record(rmgr, info, &blocks[..1 + (round % 3 == 0) as usize], &main);
        let mut page = if round % 5 == 0 {
            let mut p = Box::new(*base);
            for _ in 0..8 {
                let at = next() as usize % BLCKSZ;
                p[at] = next() as u8;
            }
            p
        } else {
            Box::new(*base)
        };
        let _ = crate::redo_block(&rec, 0, &mut page);
        let _ = crate::redo_block(&rec, 1, &mut page);
    }
}

/// From 18.6 a record that clears visibility-map bits registers the VM page
/// (block 1 of a delete): redo clears the bits of the heap block it covers,
/// leaves the others, and stamps the page only when a bit changed.
#[test]
fn a_registered_visibility_map_page_loses_the_deleted_blocks_bits() {
    let mut main = XID.to_le_bytes().to_vec();
    main.extend_from_slice(&1u16.to_le_bytes()); // offnum
    main.push(0); // infobits
    main.push(XLH_DELETE_ALL_VISIBLE_CLEARED);
    let vm = Blk { fork: ForkNumber::VisibilityMap, ..blk(1, 0, vec![]) };
    let rec = record(RM_HEAP_ID, XLOG_HEAP_DELETE, &[blk(0, 7, vec![]), vm], &main);
    assert!(clears_vm_block(&rec, ForkNumber::VisibilityMap));
    // Heap blocks 4-7 share one byte after the 24-byte header: 7 is the high pair.
    let mut page = [0u8; BLCKSZ];
    set_pd_lsn(&mut page, 0x10).unwrap();
    page[VM_MAP_START + 1] = 0xFF;
    page[VM_MAP_START + 2] = 0x03;
    crate::redo_block(&rec, 1, &mut page).unwrap();
    assert_eq!(page[VM_MAP_START + 1], 0x3F, "heap block 7's two bits cleared, 4-6 kept");
    assert_eq!(page[VM_MAP_START + 2], 0x03, "heap block 8 kept");
    assert_eq!(pd_lsn(&page).unwrap(), END_LSN);

    // Nothing left to clear: the page keeps its LSN.
    set_pd_lsn(&mut page, 0x10).unwrap();
    crate::redo_block(&rec, 1, &mut page).unwrap();
    assert_eq!((page[VM_MAP_START + 1], pd_lsn(&page).unwrap()), (0x3F, 0x10));

    // A VM page the record clears nothing on is a malformed record.
    let far = Blk { fork: ForkNumber::VisibilityMap, ..blk(1, 3, vec![]) };
    let rec = record(RM_HEAP_ID, XLOG_HEAP_DELETE, &[blk(0, 7, vec![]), far], &main);
    assert!(matches!(crate::redo_block(&rec, 1, &mut page), Err(RedoError::BadRecord(_))));
}
