//! Btree index tuples (`IndexTupleData` with nbtree's use of its TID and
//! flag bits): posting lists, downlinks, and the tuple rewrites redo repeats
//! (`_bt_form_posting`, `_bt_update_posting`, `_bt_swap_posting`).
//!
//! An index tuple starts with an 8-byte header: a 6-byte item pointer
//! (block number as two u16 halves, high first, then an offset number) and a
//! u16 `t_info` whose low 13 bits are the tuple size. When the "alternative
//! TID" bit of `t_info` is set, nbtree reuses the item pointer: the offset
//! holds flags plus a count (key attributes of a pivot tuple, or TIDs of a
//! posting list) and the block number holds a downlink or the byte offset of
//! the posting list inside the tuple.

use crate::RedoError;

/// Size of the index tuple header (`IndexTupleData`).
pub const INDEX_TUPLE_HEADER: usize = 8;
/// Size of a heap TID (`ItemPointerData`).
pub const TID_SIZE: usize = 6;
/// `t_info` bits holding the tuple size.
pub const INDEX_SIZE_MASK: u16 = 0x1FFF;
/// `t_info` bit nbtree uses to flag pivot and posting list tuples.
pub const INDEX_ALT_TID_MASK: u16 = 0x2000;
/// Item pointer offset bits that count TIDs or key attributes.
const BT_OFFSET_MASK: u16 = 0x0FFF;
/// Item pointer offset bit: the tuple is a posting list.
const BT_IS_POSTING: u16 = 0x2000;
/// Tuples are padded to 8 bytes (`MAXALIGN`).
const MAXIMUM_ALIGNOF: usize = 8;

/// One heap TID as stored on disk.
pub type Tid = [u8; TID_SIZE];

/// Rounds up to the tuple alignment (`MAXALIGN`).
pub fn maxalign(n: usize) -> usize {
    (n + MAXIMUM_ALIGNOF - 1) & !(MAXIMUM_ALIGNOF - 1)
}

fn bad(msg: String) -> RedoError {
    RedoError::BadPage(msg)
}

fn get_u16(t: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([t[at], t[at + 1]])
}

fn put_u16(t: &mut [u8], at: usize, v: u16) {
    t[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn check_header(t: &[u8]) -> Result<(), RedoError> {
    if t.len() < INDEX_TUPLE_HEADER {
        return Err(bad(format!("index tuple of {} bytes is shorter than its header", t.len())));
    }
    Ok(())
}

/// `t_info` of a tuple whose header is known to be present.
fn t_info(t: &[u8]) -> u16 {
    get_u16(t, 6)
}

fn set_t_info(t: &mut [u8], v: u16) {
    put_u16(t, 6, v)
}

/// Block number of the tuple's item pointer.
fn tid_block(t: &[u8]) -> u32 {
    ((get_u16(t, 0) as u32) << 16) | get_u16(t, 2) as u32
}

fn set_tid_block(t: &mut [u8], block: u32) {
    put_u16(t, 0, (block >> 16) as u16);
    put_u16(t, 2, block as u16);
}

/// Offset number of the tuple's item pointer.
fn tid_offset(t: &[u8]) -> u16 {
    get_u16(t, 4)
}

fn set_tid_offset(t: &mut [u8], off: u16) {
    put_u16(t, 4, off)
}

/// `IndexTupleSize`: the size recorded in the tuple header.
pub fn tuple_size(t: &[u8]) -> Result<usize, RedoError> {
    check_header(t)?;
    Ok((t_info(t) & INDEX_SIZE_MASK) as usize)
}

/// The tuple's bytes as its header sizes it (`CopyIndexTuple`'s extent).
pub fn sized(t: &[u8]) -> Result<&[u8], RedoError> {
    let size = tuple_size(t)?;
    if size < INDEX_TUPLE_HEADER || size > t.len() {
        return Err(bad(format!("index tuple claims {size} bytes, {} available", t.len())));
    }
    Ok(&t[..size])
}

/// Whether the tuple carries a posting list (`BTreeTupleIsPosting`).
pub fn is_posting(t: &[u8]) -> bool {
    t.len() >= INDEX_TUPLE_HEADER && t_info(t) & INDEX_ALT_TID_MASK != 0 && tid_offset(t) & BT_IS_POSTING != 0
}

/// A posting list tuple's key part size and TID count, checked against its bytes.
fn posting_layout(t: &[u8]) -> Result<(usize, usize), RedoError> {
    if !is_posting(t) {
        return Err(bad("index tuple is not a posting list".into()));
    }
    let keysize = tid_block(t) as usize;
    let n = (tid_offset(t) & BT_OFFSET_MASK) as usize;
    if keysize < INDEX_TUPLE_HEADER || keysize + n * TID_SIZE > t.len() {
        return Err(bad(format!("posting list of {n} TIDs at byte {keysize} does not fit its {}-byte tuple", t.len())));
    }
    Ok((keysize, n))
}

/// The heap TIDs of a posting list tuple.
pub fn posting_tids(t: &[u8]) -> Result<Vec<Tid>, RedoError> {
    let (keysize, n) = posting_layout(t)?;
    Ok(t[keysize..keysize + n * TID_SIZE].chunks_exact(TID_SIZE).map(|c| c.try_into().unwrap()).collect())
}

/// The heap TIDs a leaf tuple stands for with the size of its key part
/// (the whole tuple unless it is a posting list).
pub fn heap_tids(t: &[u8]) -> Result<(Vec<Tid>, usize), RedoError> {
    if is_posting(t) {
        let keysize = posting_layout(t)?.0;
        Ok((posting_tids(t)?, keysize))
    } else {
        check_header(t)?;
        Ok((vec![t[..TID_SIZE].try_into().unwrap()], tuple_size(t)?))
    }
}

/// The child block a pivot tuple points to (`BTreeTupleGetDownLink`).
pub fn downlink(t: &[u8]) -> Result<u32, RedoError> {
    check_header(t)?;
    Ok(tid_block(t))
}

/// Points a pivot tuple at another child block (`BTreeTupleSetDownLink`).
pub fn set_downlink(t: &mut [u8], block: u32) -> Result<(), RedoError> {
    check_header(t)?;
    set_tid_block(t, block);
    Ok(())
}

/// The high key of a half-dead leaf page: a bare header whose item pointer
/// names the top parent of the subtree being deleted, with no key attributes.
pub fn top_parent_high_key(top_parent: u32) -> [u8; INDEX_TUPLE_HEADER] {
    let mut t = [0u8; INDEX_TUPLE_HEADER];
    set_tid_block(&mut t, top_parent);
    set_tid_offset(&mut t, 0);
    set_t_info(&mut t, INDEX_TUPLE_HEADER as u16 | INDEX_ALT_TID_MASK);
    t
}

/// Builds a tuple of `keysize` key bytes from `base` followed by `tids`: a
/// posting list when there are several, a plain tuple for a single one.
fn build(base: &[u8], keysize: usize, tids: &[Tid]) -> Result<Vec<u8>, RedoError> {
    if tids.is_empty() {
        return Err(bad("a tuple needs at least one heap TID".into()));
    }
    if keysize < INDEX_TUPLE_HEADER || keysize > base.len() || keysize != maxalign(keysize) {
        return Err(bad(format!("key part of {keysize} bytes is not a valid index tuple prefix")));
    }
    let newsize = if tids.len() > 1 { maxalign(keysize + tids.len() * TID_SIZE) } else { keysize };
    if newsize > INDEX_SIZE_MASK as usize || tids.len() > BT_OFFSET_MASK as usize {
        return Err(bad(format!("a tuple with {} heap TIDs would be too large", tids.len())));
    }
    let mut t = vec![0u8; newsize];
    t[..keysize].copy_from_slice(&base[..keysize]);
    let info = (t_info(&t) & !INDEX_SIZE_MASK) | newsize as u16;
    if tids.len() > 1 {
        set_t_info(&mut t, info | INDEX_ALT_TID_MASK);
        set_tid_offset(&mut t, tids.len() as u16 | BT_IS_POSTING);
        set_tid_block(&mut t, keysize as u32);
        for (i, tid) in tids.iter().enumerate() {
            let at = keysize + i * TID_SIZE;
            t[at..at + TID_SIZE].copy_from_slice(tid);
        }
    } else {
        set_t_info(&mut t, info & !INDEX_ALT_TID_MASK);
        t[..TID_SIZE].copy_from_slice(&tids[0]);
    }
    Ok(t)
}

/// `_bt_form_posting`: `base`'s key with `tids` as its heap TIDs (any TIDs
/// `base` already had are replaced, not kept).
pub fn form_posting(base: &[u8], tids: &[Tid]) -> Result<Vec<u8>, RedoError> {
    let keysize = if is_posting(base) { posting_layout(base)?.0 } else { sized(base)?.len() };
    build(base, keysize, tids)
}

/// `_bt_update_posting`: the posting list tuple `orig` without the TIDs at
/// the 0-based positions `deleted` (ascending), which must leave at least one.
pub fn update_posting(orig: &[u8], deleted: &[u16]) -> Result<Vec<u8>, RedoError> {
    let (keysize, _) = posting_layout(orig)?;
    let tids = posting_tids(orig)?;
    let mut kept = Vec::with_capacity(tids.len());
    let mut d = 0;
    for (i, tid) in tids.iter().enumerate() {
        if d < deleted.len() && deleted[d] as usize == i {
            d += 1;
        } else {
            kept.push(*tid);
        }
    }
    if d != deleted.len() {
        return Err(bad(format!(
            "posting list of {} TIDs has no TIDs at the positions to delete {deleted:?}",
            tids.len()
        )));
    }
    if kept.is_empty() {
        return Err(bad("an updated posting list would keep no TIDs".into()));
    }
    build(orig, keysize, &kept)
}

/// `_bt_swap_posting`: a posting list split at `postingoff`. `newitem`'s TID
/// goes into a copy of `oposting` there (the copy's last TID falls off), and
/// `newitem` takes over that last TID. Returns the new posting list, the
/// same size as `oposting`.
pub fn swap_posting(newitem: &mut [u8], oposting: &[u8], postingoff: usize) -> Result<Vec<u8>, RedoError> {
    check_header(newitem)?;
    let (keysize, n) = posting_layout(oposting)?;
    if postingoff == 0 || postingoff >= n {
        return Err(bad(format!("posting list with {n} TIDs cannot be split at {postingoff}")));
    }
    let mut nposting = sized(oposting)?.to_vec();
    if keysize + n * TID_SIZE > nposting.len() {
        return Err(bad("posting list extends past its tuple size".into()));
    }
    let at = keysize + postingoff * TID_SIZE;
    let last = keysize + (n - 1) * TID_SIZE;
    nposting.copy_within(at..last, at + TID_SIZE);
    nposting[at..at + TID_SIZE].copy_from_slice(&newitem[..TID_SIZE]);
    newitem[..TID_SIZE].copy_from_slice(&oposting[last..last + TID_SIZE]);
    Ok(nposting)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A plain leaf tuple: `tid` then a MAXALIGNed key of `key` bytes.
    pub fn plain(tid: (u32, u16), key: &[u8]) -> Vec<u8> {
        let size = maxalign(INDEX_TUPLE_HEADER + key.len());
        let mut t = vec![0u8; size];
        set_tid_block(&mut t, tid.0);
        set_tid_offset(&mut t, tid.1);
        set_t_info(&mut t, size as u16);
        t[INDEX_TUPLE_HEADER..INDEX_TUPLE_HEADER + key.len()].copy_from_slice(key);
        t
    }

    pub fn tid(block: u32, off: u16) -> Tid {
        let mut t = [0u8; TID_SIZE];
        t[0..2].copy_from_slice(&((block >> 16) as u16).to_le_bytes());
        t[2..4].copy_from_slice(&(block as u16).to_le_bytes());
        t[4..6].copy_from_slice(&off.to_le_bytes());
        t
    }

    #[test]
    fn posting_round_trip() {
        let base = plain((7, 3), b"abcd");
        assert_eq!(base.len(), 16);
        let tids = [tid(1, 1), tid(1, 2), tid(70000, 5)];
        let p = form_posting(&base, &tids).unwrap();
        // 16 key bytes + 3 TIDs = 34, padded to 40.
        assert_eq!(p.len(), 40);
        assert_eq!(tuple_size(&p).unwrap(), 40);
        assert!(is_posting(&p));
        assert_eq!(posting_tids(&p).unwrap(), tids.to_vec());
        assert_eq!(&p[INDEX_TUPLE_HEADER..16], &base[INDEX_TUPLE_HEADER..]);
        assert_eq!(&p[34..40], &[0u8; 6]);
        // Re-forming from a posting base keeps only the key part.
        let q = form_posting(&p, &tids[..2]).unwrap();
        assert_eq!(q.len(), 32);
        assert_eq!(posting_tids(&q).unwrap(), tids[..2].to_vec());
        // A single TID gives a plain tuple again.
        let single = form_posting(&p, &tids[2..]).unwrap();
        assert!(!is_posting(&single));
        assert_eq!(single.len(), 16);
        assert_eq!(&single[..6], &tids[2]);
        assert_eq!(t_info(&single), 16);
    }

    #[test]
    fn update_drops_positions() {
        let base = plain((0, 1), b"k");
        let tids = [tid(1, 1), tid(1, 2), tid(2, 1), tid(3, 9)];
        let p = form_posting(&base, &tids).unwrap();
        let u = update_posting(&p, &[0, 2]).unwrap();
        assert_eq!(posting_tids(&u).unwrap(), vec![tids[1], tids[3]]);
        assert_eq!(u.len(), maxalign(16 + 12));
        let one = update_posting(&p, &[0, 1, 3]).unwrap();
        assert!(!is_posting(&one));
        assert_eq!(&one[..6], &tids[2]);
        assert!(update_posting(&p, &[0, 1, 2, 3]).is_err());
        assert!(update_posting(&p, &[5]).is_err());
        assert!(update_posting(&base, &[0]).is_err());
    }

    #[test]
    fn swap_moves_tids() {
        let base = plain((0, 1), b"k");
        let tids = [tid(1, 1), tid(1, 3), tid(1, 5)];
        let p = form_posting(&base, &tids).unwrap();
        let mut newitem = plain((1, 2), b"k");
        let np = swap_posting(&mut newitem, &p, 1).unwrap();
        assert_eq!(np.len(), p.len());
        assert_eq!(posting_tids(&np).unwrap(), vec![tids[0], tid(1, 2), tids[1]]);
        assert_eq!(&newitem[..6], &tids[2]);
        assert!(swap_posting(&mut newitem, &p, 0).is_err());
        assert!(swap_posting(&mut newitem, &p, 3).is_err());
    }

    #[test]
    fn top_parent_key_layout() {
        let t = top_parent_high_key(0x0001_0002);
        assert_eq!(t, [1, 0, 2, 0, 0, 0, 0x08, 0x20]);
        assert_eq!(downlink(&t).unwrap(), 0x0001_0002);
    }

    #[test]
    fn hostile_tuples_are_errors() {
        assert!(tuple_size(&[0u8; 4]).is_err());
        let mut p = form_posting(&plain((0, 1), b"k"), &[tid(1, 1), tid(1, 2)]).unwrap();
        // Claim more TIDs than the tuple holds.
        set_tid_offset(&mut p, 100 | BT_IS_POSTING);
        assert!(posting_tids(&p).is_err());
        assert!(form_posting(&p, &[tid(1, 1), tid(1, 2)]).is_err());
        let mut short = plain((0, 1), b"k");
        set_t_info(&mut short, 64);
        assert!(sized(&short).is_err());
    }
}
