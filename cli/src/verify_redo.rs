//! `strata wal verify-redo`: checks native redo against PostgreSQL itself.
//!
//! Reads WAL written with `wal_consistency_checking` (every block reference
//! then carries PostgreSQL's image of the page after the change), follows
//! every page from image to image, redoes each natively redone record on the
//! page as it was before and compares the result with the record's image
//! under PostgreSQL's masking rules. A block whose previous version is not
//! known (its first reference in the WAL read) cannot be checked and is
//! counted as such. Full-page writes are restored, as PostgreSQL's redo
//! does (their records usually carry no data to redo from).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use strata_formats::v15::identify::identify;
use strata_formats::v15::records::{self, ParsedRecord};
use strata_formats::v15::rmgr;
use strata_formats::wal::segment::SegmentReader;
use strata_formats::{ForkNumber, Lsn};
use strata_redo::verify::check_block;

use crate::verify_images::{forget_blocks, BlockKey};
use strata_redo::{NativeRecord, HEAPBLOCKS_PER_VM_PAGE};

const BLCKSZ: usize = 8192;
type Page = Box<[u8; BLCKSZ]>;

/// Counts of one kind of record (resource manager and record name).
#[derive(Default, Serialize)]
struct KindCounts {
    /// Blocks redone natively and found equal to PostgreSQL's image.
    verified: u64,
    mismatched: u64,
    /// Blocks native redo refused (an error naming the problem).
    errors: u64,
    /// Blocks redone without an image to compare with (no checking for them).
    redone_unchecked: u64,
    /// Blocks whose previous version was not known, so not checked.
    no_base: u64,
    /// Blocks with a full-page write, which redo restores instead.
    restored: u64,
}

#[derive(Serialize)]
struct Problem {
    lsn: Lsn,
    end_lsn: Lsn,
    record: String,
    block_id: u8,
    rel: String,
    fork: &'static str,
    blk: u32,
    problem: String,
}

/// Verifies the WAL in `files`; the report and whether every check passed.
pub fn verify_redo(
    files: &[PathBuf],
    start: Option<Lsn>,
    max_reported: usize,
    dump_dir: Option<&Path>,
) -> anyhow::Result<(bool, serde_json::Value)> {
    let mut reader = SegmentReader::open(files, start)?;
    let mut pages: HashMap<BlockKey, Page> = HashMap::new();
    let mut counts: BTreeMap<String, KindCounts> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut problem_count = 0u64;
    let mut unsupported: BTreeMap<String, u64> = BTreeMap::new();
    let mut records = 0u64;
    let mut first_lsn = None;
    let mut last_lsn = Lsn(0);
    while let Some(rec) = reader.next_record()? {
        records += 1;
        first_lsn.get_or_insert(rec.lsn);
        last_lsn = rec.end_lsn;
        let native = strata_redo::supports(rec.rmgr(), rec.header.info);
        let kind = format!(
            "{}/{}",
            rmgr::name(rec.rmgr()),
            identify(rec.version, rec.rmgr(), rec.header.info).unwrap_or("UNKNOWN")
        );
        let native_rmgr = matches!(rec.rmgr(), rmgr::RM_HEAP_ID | rmgr::RM_HEAP2_ID | rmgr::RM_BTREE_ID);
        for b in &rec.blocks {
            let key = (b.rel, b.fork, b.block);
            let image = rec.block_image(b).with_context(|| format!("image in the record at {}", rec.lsn))?;
            if !native {
                if native_rmgr {
                    *unsupported.entry(kind.clone()).or_default() += 1;
                }
                match image {
                    Some(page) => pages.insert(key, page),
                    None => pages.remove(&key),
                };
                continue;
            }
            let c = counts.entry(kind.clone()).or_default();
            if let (Some(page), Some(img)) = (&image, &b.image) {
                if img.apply() {
                    // A full-page write: PostgreSQL's redo restores it (the
                    // record usually carries no data to redo from).
                    c.restored += 1;
                    pages.insert(key, page.clone());
                    continue;
                }
            }
            let before = if b.will_init() { Some(Box::new([0u8; BLCKSZ])) } else { pages.get(&key).cloned() };
            let Some(before) = before else {
                c.no_base += 1;
                match image {
                    Some(page) => pages.insert(key, page),
                    None => pages.remove(&key),
                };
                continue;
            };
            let mut report = |problem: String, pages: &[(&str, &[u8; BLCKSZ])]| -> anyhow::Result<()> {
                problem_count += 1;
                if problems.len() < max_reported {
                    if let Some(dir) = dump_dir {
                        std::fs::create_dir_all(dir)?;
                        for (name, page) in pages {
                            let path = dir.join(format!("{:X}-{}-{name}.page", rec.lsn.0, b.id));
                            std::fs::write(&path, &page[..]).with_context(|| path.display().to_string())?;
                        }
                    }
                    problems.push(Problem {
                        lsn: rec.lsn,
                        end_lsn: rec.end_lsn,
                        record: kind.clone(),
                        block_id: b.id,
                        rel: b.rel.to_string(),
                        fork: b.fork.name(),
                        blk: b.block,
                        problem,
                    });
                }
                Ok(())
            };
            match &image {
                Some(image) => match check_block(&rec, b.id, &before, image) {
                    Ok((_, None)) => c.verified += 1,
                    Ok((_, Some(m))) => {
                        c.mismatched += 1;
                        report(
                            m.to_string(),
                            &[("before", &before), ("expected", &m.expected_page), ("got", &m.got_page)],
                        )?;
                    }
                    Err(e) => {
                        c.errors += 1;
                        report(e.to_string(), &[("before", &before), ("expected", image)])?;
                    }
                },
                None => {
                    let mut page = before.clone();
                    match strata_redo::redo_block(&rec, b.id, &mut page) {
                        Ok(()) => {
                            c.redone_unchecked += 1;
                            pages.insert(key, page);
                        }
                        Err(e) => {
                            c.errors += 1;
                            report(e.to_string(), &[("before", &before)])?;
                            pages.remove(&key);
                        }
                    }
                    continue;
                }
            }
            // Go on from PostgreSQL's page, so one mistake is reported once.
            if let Some(page) = image {
                pages.insert(key, page);
            }
        }
        apply_side_effects(&rec, &mut pages)?;
    }
    // No record at all is never a pass: the first file holds nothing where
    // reading began (a compute's first segment starts at its start LSN).
    if records == 0 {
        anyhow::bail!(
            "no WAL record found from {} on; give --start LSN where the WAL begins",
            match (start, files.first()) {
                (Some(lsn), _) => lsn.to_string(),
                (None, Some(first)) => format!("the start of {}", first.display()),
                (None, None) => "no file".to_string(),
            }
        );
    }
    let failed = problem_count > 0;
    let report = serde_json::json!({
        "records": records,
        "first_lsn": first_lsn,
        "end_lsn": last_lsn,
        "by_record": counts,
        "blocks_without_native_redo": unsupported,
        "problems": problem_count,
        "reported": problems,
    });
    Ok((!failed, report))
}

/// Page changes that records make without a block reference (the same the
/// pageserver derives), and pages that stop being known.
fn apply_side_effects(
    rec: &strata_formats::wal::DecodedRecord,
    pages: &mut HashMap<BlockKey, Page>,
) -> anyhow::Result<()> {
    match records::parse(rec).with_context(|| format!("record at {}", rec.lsn))? {
        Some(ParsedRecord::VmClear(clears)) => {
            for c in clears {
                let key = (c.rel, ForkNumber::VisibilityMap, c.heap_block / HEAPBLOCKS_PER_VM_PAGE);
                if let Some(page) = pages.get_mut(&key) {
                    NativeRecord::ClearVmBits(vec![(c.heap_block, c.bits)]).apply(page)?;
                }
            }
        }
        Some(parsed) => forget_blocks(&parsed, pages),
        None => {}
    }
    Ok(())
}
