//! `strata wal …`: decode WAL segment files like pg_waldump, and measure
//! decoding speed.

use std::path::PathBuf;
use std::time::Instant;

use clap::Subcommand;
use serde::Serialize;
use strata_formats::v15::identify::identify;
use strata_formats::v15::rmgr;
use strata_formats::wal::segment::{list_segments, SegmentReader};
use strata_formats::wal::DecodedRecord;
use strata_formats::Lsn;

#[derive(Subcommand)]
pub enum WalCommand {
    /// Decode WAL segment files (or directories of them), one line per record.
    Dump {
        /// One JSON object per record, per line.
        #[arg(long)]
        json: bool,
        /// Start at this record LSN instead of the first record in the first file.
        #[arg(long)]
        start: Option<Lsn>,
        /// Segment files in order, or a directory such as pg_wal.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Measure decoding throughput of segment files against a plain copy of the same bytes.
    Bench {
        /// Timed passes over the files (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

pub fn run(cmd: WalCommand) -> i32 {
    let result = match cmd {
        WalCommand::Dump { json, start, files } => dump(json, start, &files),
        WalCommand::Bench { runs, files } => bench(runs, &files),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata wal: error: {e:#}");
            2
        }
    }
}

fn expand(files: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for f in files {
        if f.is_dir() {
            let found = list_segments(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
            anyhow::ensure!(!found.is_empty(), "{}: no WAL segment files", f.display());
            out.extend(found);
        } else {
            out.push(f.clone());
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct BlockJson {
    id: u8,
    rel: String,
    fork: &'static str,
    blk: u32,
    image: bool,
    apply: bool,
    will_init: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    hole_offset: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hole_length: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compression: Option<&'static str>,
    /// Length of the restored page (always the page size; present for images).
    #[serde(skip_serializing_if = "Option::is_none")]
    image_len: Option<usize>,
    data_len: usize,
}

#[derive(Serialize)]
struct RecordJson {
    lsn: Lsn,
    end_lsn: Lsn,
    prev: Lsn,
    xid: u32,
    rmgr: String,
    info: String,
    xl_info: u8,
    total_len: u32,
    rec_len: u32,
    fpi_len: u32,
    main_data_len: usize,
    blocks: Vec<BlockJson>,
}

fn info_name(record: &DecodedRecord) -> String {
    match identify(record.rmgr(), record.header.info) {
        Some(name) => name.to_string(),
        None => format!("UNKNOWN ({:x})", record.header.info & 0xF0),
    }
}

fn record_json(record: &DecodedRecord) -> anyhow::Result<RecordJson> {
    let mut blocks = Vec::with_capacity(record.blocks.len());
    let mut fpi_len = 0u32;
    for b in &record.blocks {
        let page = record.block_image(b).map_err(|e| anyhow::anyhow!("block {} ({} blk {}): {e}", b.id, b.rel, b.block))?;
        if let Some(image) = &b.image {
            fpi_len += image.data.len() as u32;
        }
        blocks.push(BlockJson {
            id: b.id,
            rel: b.rel.to_string(),
            fork: b.fork.name(),
            blk: b.block,
            image: b.image.is_some(),
            apply: b.image.as_ref().is_some_and(|i| i.apply()),
            will_init: b.will_init(),
            hole_offset: b.image.as_ref().map(|i| i.hole_offset),
            hole_length: b.image.as_ref().map(|i| i.hole_length),
            compression: b.image.as_ref().map(|i| i.compression().name()),
            image_len: page.map(|p| p.len()),
            data_len: b.data.len(),
        });
    }
    Ok(RecordJson {
        lsn: record.lsn,
        end_lsn: record.end_lsn,
        prev: record.header.prev,
        xid: record.header.xid,
        rmgr: rmgr::name(record.rmgr()).into_owned(),
        info: info_name(record),
        xl_info: record.header.info,
        total_len: record.header.total_length,
        rec_len: record.header.total_length - fpi_len,
        fpi_len,
        main_data_len: record.main_data.len(),
        blocks,
    })
}

/// pg_waldump pads the low half of record LSNs to eight digits.
fn waldump_lsn(lsn: Lsn) -> String {
    format!("{:X}/{:08X}", lsn.0 >> 32, lsn.0 & 0xffff_ffff)
}

fn text_line(r: &RecordJson) -> String {
    let mut line = format!(
        "rmgr: {:<11} len (rec/tot): {:>6}/{:>6}, tx: {:>10}, lsn: {}, prev {}, desc: {}",
        r.rmgr,
        r.rec_len,
        r.total_len,
        r.xid,
        waldump_lsn(r.lsn),
        waldump_lsn(r.prev),
        r.info
    );
    for b in &r.blocks {
        line.push_str(&format!(", blkref #{}: rel {}", b.id, b.rel));
        if b.fork != "main" {
            line.push_str(&format!(" fork {}", b.fork));
        }
        line.push_str(&format!(" blk {}", b.blk));
        if b.image {
            line.push_str(if b.apply { " FPW" } else { " FPW for WAL verification" });
        }
    }
    line
}

/// Prints every record; exit code 0 at a clean end of WAL, 1 on invalid WAL.
fn dump(json: bool, start: Option<Lsn>, files: &[PathBuf]) -> anyhow::Result<i32> {
    use std::io::Write;
    let files = expand(files)?;
    let mut reader = SegmentReader::open(&files, start)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut count = 0u64;
    let failure = loop {
        match reader.next_record() {
            Ok(Some(record)) => {
                count += 1;
                match record_json(&record) {
                    Ok(r) => {
                        if json {
                            serde_json::to_writer(&mut out, &r)?;
                            writeln!(out)?;
                        } else {
                            writeln!(out, "{}", text_line(&r))?;
                        }
                    }
                    Err(e) => {
                        let (path, offset) = reader.locate(record.lsn);
                        break Some((record.lsn, format!("{}: record at {} (offset {offset:#x}): {e:#}", path.display(), record.lsn)));
                    }
                }
            }
            Ok(None) => break None,
            Err(e) => {
                let lsn = match &e {
                    strata_formats::wal::segment::SegmentError::Decode { error, .. } => error.lsn(),
                    strata_formats::wal::segment::SegmentError::IncompleteRecord { lsn } => *lsn,
                    _ => reader.end_lsn(),
                };
                break Some((lsn, e.to_string()));
            }
        }
    };
    match failure {
        None => {
            if json {
                writeln!(out, "{}", serde_json::json!({"end_of_wal": reader.end_lsn(), "records": count}))?;
            }
            out.flush()?;
            eprintln!("strata wal dump: {count} records, end of WAL at {}", reader.end_lsn());
            Ok(0)
        }
        Some((lsn, message)) => {
            if json {
                writeln!(out, "{}", serde_json::json!({"error": message, "lsn": lsn, "records": count}))?;
            }
            out.flush()?;
            eprintln!("strata wal dump: error: {message}");
            Ok(1)
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    xs[xs.len() / 2]
}

/// Decoding throughput versus copying the same bytes (read into memory first,
/// so neither side measures the disk).
fn bench(runs: usize, files: &[PathBuf]) -> anyhow::Result<i32> {
    use strata_formats::wal::{StartPosition, WalDecoder};
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let files = expand(files)?;
    let (segment_size, version) = strata_formats::wal::segment::probe_segment(&files[0])?;
    let first = files[0].file_name().and_then(|n| n.to_str()).and_then(|n| strata_formats::wal::segment::SegmentName::parse(n, segment_size));
    let first = first.ok_or_else(|| anyhow::anyhow!("{}: not a segment file name", files[0].display()))?;
    let mut bytes = Vec::new();
    for f in &files {
        bytes.extend(std::fs::read(f)?);
    }
    let mut decode_s = Vec::new();
    let mut restore_s = Vec::new();
    let mut copy_s = Vec::new();
    let mut records = 0u64;
    let mut wal_bytes = 0u64;
    for _ in 0..runs {
        // Copy: the memory bandwidth reference for the same bytes.
        let t = Instant::now();
        let mut copy = vec![0u8; bytes.len()];
        copy.copy_from_slice(std::hint::black_box(&bytes));
        std::hint::black_box(&copy);
        copy_s.push(t.elapsed().as_secs_f64());

        for restore_images in [false, true] {
            let t = Instant::now();
            let mut decoder = WalDecoder::new(version, first.start_lsn(segment_size), segment_size, StartPosition::FindFirstRecord);
            decoder.feed(&bytes);
            let mut n = 0u64;
            while let Ok(Some(record)) = decoder.next_record() {
                if restore_images {
                    for b in &record.blocks {
                        std::hint::black_box(record.block_image(b)?);
                    }
                }
                n += 1;
            }
            let elapsed = t.elapsed().as_secs_f64();
            records = n;
            wal_bytes = decoder.position().0 - first.start_lsn(segment_size).0;
            if restore_images {
                restore_s.push(elapsed);
            } else {
                decode_s.push(elapsed);
            }
        }
    }
    let mb = wal_bytes as f64 / 1e6;
    let (decode, restore, copy) = (median(decode_s), median(restore_s), median(copy_s));
    let copy_mb = bytes.len() as f64 / 1e6;
    let report = serde_json::json!({
        "files": files.len(),
        "wal_bytes": wal_bytes,
        "records": records,
        "runs": runs,
        "decode_mb_per_s": mb / decode,
        "decode_records_per_s": records as f64 / decode,
        "decode_and_restore_images_mb_per_s": mb / restore,
        "copy_mb_per_s": copy_mb / copy,
        "decode_vs_copy": (mb / decode) / (copy_mb / copy),
        "decode_and_restore_vs_copy": (mb / restore) / (copy_mb / copy),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}
