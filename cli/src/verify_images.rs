//! `strata wal verify-images`: proves image decoding exact by comparing the
//! last full-page image of every block in the WAL with the block in the data
//! files of the stopped server that wrote that WAL.
//!
//! Differences PostgreSQL itself tolerates (hint bits, pd_lsn, unused space…)
//! are masked with the rules of `wal_consistency_checking`. Pages that change
//! without an image are kept out or fixed up: FSM and VM forks are skipped,
//! truncations and relation drops forget blocks, and the GiST follow-right
//! fix-up is applied. Two kinds of page legitimately differ from their last
//! image and are skipped: sequence pages (nextval() advances the page without
//! WAL within the range already logged ahead) and SP-GiST metapages (the
//! cache of last-used pages is a hint written without WAL).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use strata_formats::page::mask::{mask_page_at, PageKind};
use strata_formats::v15::records::storage::{DbaseRecord, SmgrRecord, SMGR_TRUNCATE_HEAP};
use strata_formats::v15::records::xact::XactRecord;
use strata_formats::v15::records::{self, gist, ParsedRecord};
use strata_formats::wal::segment::{list_segments, SegmentReader};
use strata_formats::{ForkNumber, Lsn, RelFileNode};

const BLCKSZ: usize = 8192;
/// Blocks per 1 GiB relation segment file.
const RELSEG_SIZE: u32 = 131072;
const GLOBALTABLESPACE_OID: u32 = 1664;
const DEFAULTTABLESPACE_OID: u32 = 1663;

/// The last image of a block; `None` in the map when the block's last
/// reference carried no image (its page cannot be checked).
struct LastImage {
    page: Box<[u8; BLCKSZ]>,
    lsn: Lsn,
    rmgr: u8,
}

pub type BlockKey = (RelFileNode, ForkNumber, u32);

/// Forgets the blocks a record removes without a block reference: the
/// heap's tail cut by a truncation (the visibility map and free space map
/// lose theirs too: all of theirs are forgotten rather than modelled),
/// dropped relations and databases.
pub fn forget_blocks<V>(parsed: &ParsedRecord, blocks: &mut HashMap<BlockKey, V>) {
    match parsed {
        ParsedRecord::Smgr(SmgrRecord::Truncate { rel, blocks: size, flags }) => {
            blocks.retain(|(r, f, blk), _| {
                r != rel || (*f == ForkNumber::Main && (flags & SMGR_TRUNCATE_HEAP == 0 || *blk < *size))
            });
        }
        ParsedRecord::Xact(XactRecord::Finish(finish)) => {
            for rel in &finish.dropped_rels {
                blocks.retain(|(r, _, _), _| r != rel);
            }
        }
        ParsedRecord::Dbase(DbaseRecord::Drop { db, .. }) => blocks.retain(|(r, _, _), _| r.db != *db),
        _ => {}
    }
}

fn relation_path(pgdata: &Path, rel: RelFileNode, fork: ForkNumber, block: u32) -> PathBuf {
    let base = match rel.spc {
        GLOBALTABLESPACE_OID => pgdata.join("global").join(rel.rel.to_string()),
        DEFAULTTABLESPACE_OID => pgdata.join("base").join(rel.db.to_string()).join(rel.rel.to_string()),
        spc => pgdata
            .join("pg_tblspc")
            .join(spc.to_string())
            .join("PG_15_202209061")
            .join(rel.db.to_string())
            .join(rel.rel.to_string()),
    };
    let mut name = base.into_os_string();
    name.push(fork.file_suffix());
    let segment = block / RELSEG_SIZE;
    if segment > 0 {
        name.push(format!(".{segment}"));
    }
    PathBuf::from(name)
}

fn read_block(pgdata: &Path, key: &BlockKey) -> anyhow::Result<Option<Box<[u8; BLCKSZ]>>> {
    let path = relation_path(pgdata, key.0, key.1, key.2);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| path.display().to_string()),
    };
    let offset = u64::from(key.2 % RELSEG_SIZE) * BLCKSZ as u64;
    let mut page = Box::new([0u8; BLCKSZ]);
    match file.read_exact_at(&mut page[..], offset) {
        Ok(()) => Ok(Some(page)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e).with_context(|| path.display().to_string()),
    }
}

pub fn verify_images(pgdata: &Path, max_reported: usize) -> anyhow::Result<(bool, serde_json::Value)> {
    let waldir = pgdata.join("pg_wal");
    let files = list_segments(&waldir).with_context(|| waldir.display().to_string())?;
    anyhow::ensure!(!files.is_empty(), "{}: no WAL segments", waldir.display());
    let mut reader = SegmentReader::open(&files, None)?;
    let mut last: HashMap<BlockKey, Option<LastImage>> = HashMap::new();
    let mut records = 0u64;
    let mut images = 0u64;
    while let Some(record) = reader.next_record()? {
        records += 1;
        for b in &record.blocks {
            let image = record.block_image(b).with_context(|| format!("record at {}", record.lsn))?;
            images += u64::from(image.is_some());
            let entry = image.map(|page| LastImage { page, lsn: record.end_lsn, rmgr: record.rmgr() });
            last.insert((b.rel, b.fork, b.block), entry);
        }
        match records::parse(&record).with_context(|| format!("record at {}", record.lsn))? {
            Some(ParsedRecord::GistFollowRight { block_id }) => {
                let b = record.block(block_id).expect("parser returned an existing block id");
                if let Some(Some(img)) = last.get_mut(&(b.rel, b.fork, b.block)) {
                    gist::clear_follow_right(&mut img.page, record.end_lsn);
                }
            }
            Some(parsed) => forget_blocks(&parsed, &mut last),
            None => {}
        }
    }

    let mut compared = 0u64;
    let mut equal = 0u64;
    let mut absent = 0u64;
    let mut skipped_forks = 0u64;
    let mut without_image = 0u64;
    let mut skipped_hint_pages = 0u64;
    let mut mismatches = Vec::new();
    let sorted: BTreeMap<_, _> = last.into_iter().collect();
    for (key, img) in sorted {
        if matches!(key.1, ForkNumber::Fsm | ForkNumber::VisibilityMap) {
            skipped_forks += 1;
            continue;
        }
        let Some(img) = img else {
            without_image += 1;
            continue;
        };
        let Some(mut on_disk) = read_block(pgdata, &key)? else {
            absent += 1;
            continue;
        };
        let mut from_wal = img.page;
        let kind = PageKind::from_rmgr(img.rmgr).unwrap_or_else(|| PageKind::detect(&from_wal[..]));
        if kind == PageKind::Sequence || (kind == PageKind::SpGist && key.2 == 0) {
            skipped_hint_pages += 1;
            continue;
        }
        compared += 1;
        mask_page_at(&mut from_wal, kind, key.2);
        mask_page_at(&mut on_disk, kind, key.2);
        if from_wal == on_disk {
            equal += 1;
        } else if mismatches.len() < max_reported {
            let first = from_wal.iter().zip(on_disk.iter()).position(|(a, b)| a != b).unwrap_or(0);
            mismatches.push(serde_json::json!({
                "rel": key.0.to_string(), "fork": key.1.name(), "blk": key.2,
                "image_end_lsn": img.lsn, "rmgr": strata_formats::v15::rmgr::name(img.rmgr),
                "kind": format!("{kind:?}"), "first_difference_at": first,
            }));
        } else {
            mismatches.push(serde_json::Value::Null);
        }
    }
    let mismatched = mismatches.len();
    mismatches.retain(|m| !m.is_null());
    let report = serde_json::json!({
        "records": records,
        "images": images,
        "blocks_compared": compared,
        "blocks_equal": equal,
        "blocks_mismatched": mismatched,
        "blocks_absent_on_disk": absent,
        "blocks_skipped_fsm_vm": skipped_forks,
        "blocks_last_changed_without_image": without_image,
        "blocks_skipped_changed_without_wal": skipped_hint_pages,
        "mismatches": mismatches,
    });
    Ok((mismatched == 0, report))
}
