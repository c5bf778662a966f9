//! Decoding real PostgreSQL 15 WAL (test vectors in `tests/data/wal`, one per
//! `wal_compression` method, written with `wal_consistency_checking=all`) and
//! WAL written by Strata's own `WalBuilder`.

use std::path::PathBuf;

use strata_formats::fuzz::decode_wal;
use strata_formats::v15::control::{ControlFile, ControlFileError, DbState};
use strata_formats::v15::records::xlog::{CheckPoint, XlogRecord};
use strata_formats::v15::records::{self, ParsedRecord};
use strata_formats::v15::startup::{shutdown_checkpoint_at, standby_start};
use strata_formats::wal::encode::{encode_record, headers_before, WalBuilder};
use strata_formats::wal::page::{PageHeader, LONG_HEADER_SIZE, SHORT_HEADER_SIZE, XLP_FIRST_IS_CONTRECORD};
use strata_formats::wal::record::ImageCompression;
use strata_formats::wal::{DecodedRecord, StartPosition, WalDecodeError, WalDecoder};
use strata_formats::{Lsn, PgVersion};

const SEG: u64 = 16 << 20;

fn data_dir() -> PathBuf {
    strata_test_support::paths::in_crate("tests/data")
}

/// (compression name, start LSN, bytes) of each WAL vector.
fn vectors() -> Vec<(String, Lsn, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(data_dir().join("wal")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if path.extension().and_then(|e| e.to_str()) != Some("wal") {
            continue;
        }
        let (method, lsn) = name.split_once('_').unwrap();
        out.push((method.to_string(), Lsn(u64::from_str_radix(lsn, 16).unwrap()), std::fs::read(&path).unwrap()));
    }
    out.sort();
    assert_eq!(out.len(), 3);
    out
}

fn decode_all(bytes: &[u8], start: Lsn, chunk: usize) -> (Vec<DecodedRecord>, Option<WalDecodeError>) {
    let mut decoder = WalDecoder::new(PgVersion::V15, start, SEG, StartPosition::FindFirstRecord);
    let mut records = Vec::new();
    for piece in bytes.chunks(chunk) {
        decoder.feed(piece);
        loop {
            match decoder.next_record() {
                Ok(Some(r)) => records.push(r),
                Ok(None) => break,
                Err(e) => return (records, Some(e)),
            }
        }
    }
    (records, None)
}

#[test]
fn real_wal_decodes_with_every_compression_method() {
    for (method, start, bytes) in vectors() {
        let (records, err) = decode_all(&bytes, start, bytes.len());
        assert!(err.is_none(), "{method}: {err:?}");
        assert!(records.len() > 20, "{method}: only {} records", records.len());
        let expected = match method.as_str() {
            "pglz" => ImageCompression::Pglz,
            "lz4" => ImageCompression::Lz4,
            "zstd" => ImageCompression::Zstd,
            other => panic!("unexpected vector {other}"),
        };
        let mut compressed = 0;
        let mut prev: Option<&DecodedRecord> = None;
        for r in &records {
            if let Some(p) = prev {
                assert_eq!(r.header.prev, p.lsn, "{method}: prev-link at {}", r.lsn);
                assert!(r.lsn >= p.end_lsn, "{method}: records overlap at {}", r.lsn);
            }
            prev = Some(r);
            records::parse(r).unwrap_or_else(|e| panic!("{method}: record at {}: {e}", r.lsn));
            for b in &r.blocks {
                if let Some(image) = &b.image {
                    let page = r.block_image(b).unwrap().unwrap();
                    assert_eq!(page.len(), 8192);
                    if image.compression() == expected {
                        compressed += 1;
                    }
                    // The hole is zero-filled.
                    let (off, len) = (image.hole_offset as usize, image.hole_length as usize);
                    assert!(page[off..off + len].iter().all(|b| *b == 0));
                }
            }
        }
        assert!(compressed > 5, "{method}: only {compressed} images compressed with it");
    }
}

#[test]
fn chunked_input_gives_the_same_records() {
    for (method, start, bytes) in vectors() {
        let (whole, _) = decode_all(&bytes, start, bytes.len());
        for chunk in [1, 7, 8, 24, 4096, 8191, 8193] {
            let (pieces, err) = decode_all(&bytes, start, chunk);
            assert!(err.is_none(), "{method} chunk {chunk}: {err:?}");
            assert_eq!(pieces, whole, "{method} chunk {chunk}");
        }
    }
}

#[test]
fn starting_on_a_page_that_continues_a_record_skips_its_tail() {
    for (method, start, bytes) in vectors() {
        let (whole, _) = decode_all(&bytes, start, bytes.len());
        // Find a page whose header says it continues a record.
        let page = (1..bytes.len() / 8192).find(|p| {
            let h = PageHeader::decode(&bytes[p * 8192..]).unwrap();
            h.info & XLP_FIRST_IS_CONTRECORD != 0
        });
        let Some(page) = page else { continue };
        let page_lsn = Lsn(start.0 + (page * 8192) as u64);
        let (later, err) = decode_all(&bytes[page * 8192..], page_lsn, 8192);
        assert!(err.is_none(), "{method}: {err:?}");
        let first = &later[0];
        assert!(first.lsn > page_lsn);
        let idx = whole.iter().position(|r| r.lsn == first.lsn).expect("same record boundary");
        assert_eq!(&whole[idx..], &later[..], "{method}");
    }
}

#[test]
fn end_of_wal_and_corruption_are_told_apart() {
    let (_, start, bytes) = vectors().remove(0);
    let (records, _) = decode_all(&bytes, start, bytes.len());
    let last = records.last().unwrap();
    // Zeros after the last complete record: a clean end.
    let cut = (last.end_lsn.0 - start.0) as usize;
    let mut zeroed = bytes.clone();
    zeroed[cut..].iter_mut().for_each(|b| *b = 0);
    let (again, err) = decode_all(&zeroed, start, zeroed.len());
    assert_eq!(again.len(), records.len());
    assert!(matches!(err, Some(WalDecodeError::EndOfWal { .. })), "{err:?}");
    // A flipped bit inside a record: a CRC error at that record.
    let victim = &records[records.len() / 2];
    let mut flipped = bytes.clone();
    flipped[(victim.lsn.0 - start.0) as usize + 30] ^= 0x10;
    let (before, err) = decode_all(&flipped, start, flipped.len());
    match err {
        Some(WalDecodeError::Corrupt { lsn, reason }) => {
            assert_eq!(lsn, victim.lsn);
            assert!(reason.contains("checksum") || reason.contains("length") || reason.contains("block"), "{reason}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    assert_eq!(before.len(), records.len() / 2, "records before the damage are still returned");
}

#[test]
fn pg_control_vector_roundtrips() {
    let bytes = std::fs::read(data_dir().join("pg_control_v15")).unwrap();
    let control = ControlFile::decode(&bytes).unwrap();
    assert_eq!(control.system_identifier, 7710850696478238318);
    assert_eq!(control.state, DbState::Shutdowned);
    assert_eq!(control.checkpoint, "0/2B00948".parse().unwrap());
    assert_eq!(control.checkpoint_copy.redo, control.checkpoint);
    assert_eq!(control.checkpoint_copy.next_full_xid, 740);
    assert_eq!(control.checkpoint_copy.next_oid, 16392);
    assert_eq!(control.checkpoint_copy.this_timeline, 1);
    assert_eq!(control.wal_segment_size as u64, SEG);
    assert_eq!(control.block_size, 8192);
    assert_eq!(control.encode(), bytes, "re-encoding reproduces the file byte for byte");
    assert_eq!(control.pg_version(), PgVersion::V15);
    assert_eq!(control.default_char_signedness, None);
    let mut damaged = bytes.clone();
    damaged[50] ^= 1;
    assert!(ControlFile::decode(&damaged).is_err());
    assert!(ControlFile::decode(&bytes[..100]).is_err());
}

/// PostgreSQL 18's pg_control (initdb with its default data checksums, a
/// table, a checkpoint and a clean shutdown); the values are pg_controldata's.
#[test]
fn pg_control_vector_of_18_roundtrips() {
    let bytes = std::fs::read(data_dir().join("pg_control_v18")).unwrap();
    let control = ControlFile::decode(&bytes).unwrap();
    assert_eq!(control.pg_version(), PgVersion::V18);
    assert_eq!((control.pg_control_version, control.catalog_version_no), (1800, 202506291));
    assert_eq!(control.system_identifier, 7714995171193432060);
    assert_eq!(control.state, DbState::Shutdowned);
    assert_eq!(control.checkpoint, "0/1789300".parse().unwrap());
    let cp = &control.checkpoint_copy;
    assert_eq!(cp.redo, control.checkpoint);
    assert_eq!((cp.next_full_xid, cp.next_oid, cp.oldest_xid, cp.oldest_xid_db), (753, 16387, 744, 1));
    assert_eq!(cp.wal_level, 1, "the checkpoint's wal_level (17 on): replica");
    assert_eq!(control.unlogged_lsn, Lsn(0x3E8));
    assert_eq!(control.wal_level, 1);
    assert_eq!(control.data_checksum_version, 1, "18's initdb turns checksums on");
    assert_eq!(control.default_char_signedness, Some(true));
    let nonce: Vec<u8> = (0..32)
        .map(|i| {
            u8::from_str_radix(
                &"ee79c537bcd8187dfca5c0be5d3ff733f8d9d20915edeb3e595937b7b54bc783"[2 * i..2 * i + 2],
                16,
            )
            .unwrap()
        })
        .collect();
    assert_eq!(control.mock_authentication_nonce().to_vec(), nonce);
    assert_eq!(control.encode(), bytes, "re-encoding reproduces the file byte for byte");

    // A new nonce lands where 18 keeps it, and the CRC covers it.
    let mut renonced = control.clone();
    renonced.set_mock_authentication_nonce([7; 32]);
    let again = ControlFile::decode(&renonced.encode()).unwrap();
    assert_eq!(again.mock_authentication_nonce(), [7; 32]);
    assert_eq!(again.default_char_signedness, Some(true));

    // An unknown control version, and 18's control version with 15's catalog, are refused by name.
    let mut other = bytes.clone();
    other[8..12].copy_from_slice(&1600u32.to_le_bytes());
    assert!(matches!(ControlFile::decode(&other), Err(ControlFileError::Version(1600))));
    let mut mixed = bytes.clone();
    mixed[12..16].copy_from_slice(&202209061u32.to_le_bytes());
    let crc = crc32c::crc32c(&mixed[..292]);
    mixed[292..296].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(ControlFile::decode(&mixed), Err(ControlFileError::Catalog { control: 1800, .. })));
}

/// Builds `n` records of varying sizes with a small segment size so records
/// cross pages and segments, and decodes them back.
#[test]
fn builder_output_decodes_across_pages_and_segments() {
    let seg = 1 << 20;
    let start = Lsn(seg * 3 + 8192 * 5 + 104);
    let mut builder = WalBuilder::new(PgVersion::V15, 42, 1, seg, start, Lsn(seg * 3));
    let mut expected = Vec::new();
    let mut size = 1usize;
    while builder.end_lsn().0 < seg * 5 + 20_000 {
        size = (size * 7 + 13) % 30_000;
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + size) as u8).collect();
        let lsn = builder.append_with(|_, prev| encode_record(0, 0x20, 7, prev, &data));
        expected.push((lsn, data));
    }
    let segments = builder.into_segments();
    assert_eq!(segments.len(), 3);
    assert_eq!(segments[0].0, "000000010000000000000003");
    // Bytes before the first record on its page are zeros, so decoding
    // starts at the record, as a server does at a checkpoint.
    let first = expected[0].0 .0;
    assert_eq!(first, start.0, "an aligned start mid-page is used as is");
    let mut decoder = WalDecoder::new(PgVersion::V15, Lsn(first), seg, StartPosition::RecordBoundary);
    decoder.set_system_id(42);
    let mut stream = Vec::new();
    for (i, (_, bytes)) in segments.iter().enumerate() {
        let from = if i == 0 { (first % seg) as usize } else { 0 };
        stream.extend_from_slice(&bytes[from..]);
    }
    decoder.feed(&stream);
    for (lsn, data) in &expected {
        let r = decoder.next_record().unwrap().expect("record");
        assert_eq!(r.lsn, *lsn);
        assert_eq!(r.main_data(), &data[..]);
    }
    assert!(matches!(decoder.next_record(), Err(WalDecodeError::EndOfWal { .. })));
}

fn template() -> ControlFile {
    ControlFile::decode(&std::fs::read(data_dir().join("pg_control_v15")).unwrap()).unwrap()
}

#[test]
fn generated_checkpoint_is_where_postgres_expects_it() {
    let control = template();
    let state: CheckPoint = control.checkpoint_copy;
    let page = 0x0300_0000u64 + 8192 * 7;
    // (requested LSN, expected record LSN)
    let cases = [
        (Lsn(page + 200), Lsn(page + 200)),
        (Lsn(page + 203), Lsn(page + 208)),
        (Lsn(page), Lsn(page + SHORT_HEADER_SIZE as u64)),
        (Lsn(0x0300_0000), Lsn(0x0300_0000 + LONG_HEADER_SIZE as u64)),
        // So close to the page end that the record continues on the next page.
        (Lsn(page + 8192 - 48), Lsn(page + 8192 - 48)),
        // … and on the next segment.
        (Lsn(0x0400_0000 - 48), Lsn(0x0400_0000 - 48)),
    ];
    for (at, want) in cases {
        let prev = Lsn(at.0 - 100);
        let g = shutdown_checkpoint_at(&control, &state, at, prev, 1_700_000_000);
        assert_eq!(g.checkpoint_lsn, want, "at {at}");
        assert_eq!(g.checkpoint.redo, want);
        let new_control = ControlFile::decode(&g.control_file).unwrap();
        assert_eq!(new_control.checkpoint, want);
        assert_eq!(new_control.state, DbState::Shutdowned);
        assert_eq!(new_control.checkpoint_copy, g.checkpoint);

        // Decode the generated segment(s) from the record, as the server will.
        let first_seg = want.0 / SEG;
        let mut decoder = WalDecoder::new(PgVersion::V15, want, SEG, StartPosition::RecordBoundary);
        decoder.set_prev_record(prev);
        for (i, (_, bytes)) in g.segments.iter().enumerate() {
            let from = if i == 0 { (want.0 - first_seg * SEG) as usize } else { 0 };
            decoder.feed(&bytes[from..]);
        }
        let r = decoder.next_record().unwrap().expect("checkpoint record");
        assert_eq!(r.lsn, want);
        assert_eq!(r.header.total_length, 114);
        assert_eq!(r.end_lsn, g.end_lsn);
        match records::parse(&r).unwrap() {
            Some(ParsedRecord::Xlog(XlogRecord::Checkpoint { shutdown: true, checkpoint })) => {
                assert_eq!(checkpoint, g.checkpoint);
                assert_eq!(checkpoint.next_full_xid, state.next_full_xid);
                assert_eq!(checkpoint.oldest_active_xid, 0);
            }
            other => panic!("not a shutdown checkpoint: {other:?}"),
        }
        assert!(matches!(decoder.next_record(), Err(WalDecodeError::EndOfWal { .. })));
        // Every segment starts with a valid long header.
        for (_, bytes) in &g.segments {
            let h = PageHeader::decode(bytes).unwrap();
            assert!(h.long.is_some());
            assert_eq!(h.long.unwrap().system_id, control.system_identifier);
        }
    }
}

#[test]
fn decode_wal_summary_counts_images() {
    for (method, start, bytes) in vectors() {
        let s = decode_wal(&bytes, start, SEG, 1000);
        assert!(s.error.is_none(), "{method}");
        assert!(s.images > 10, "{method}: {s:?}");
    }
}

#[test]
fn stripping_the_consistency_flag_keeps_valid_wal() {
    use strata_formats::wal::strip::ConsistencyStripper;
    for (method, start, bytes) in vectors() {
        let (before, _) = decode_all(&bytes, start, bytes.len());
        assert!(
            before.iter().filter(|r| r.header.info & 0x02 != 0).count() > 10,
            "{method}: vector has flagged records"
        );
        let mut stripper = ConsistencyStripper::new(PgVersion::V15, start, SEG);
        let mut out = Vec::new();
        for chunk in bytes.chunks(777) {
            out.extend(stripper.push(chunk).unwrap());
        }
        let (after, err) = decode_all(&out, start, out.len());
        assert!(err.is_none(), "{method}: {err:?}");
        assert_eq!(after.len(), before.len(), "{method}: everything up to the last complete record is released");
        for (a, b) in after.iter().zip(&before) {
            assert_eq!((a.lsn, a.end_lsn, a.header.total_length), (b.lsn, b.end_lsn, b.header.total_length));
            assert_eq!(a.header.info, b.header.info & !0x02);
            assert_eq!(a.raw[24..], b.raw[24..], "only the header changes");
        }
    }
}

#[test]
fn a_standby_start_names_the_checkpoint_record_and_its_redo_point() {
    let control = template();
    let mut checkpoint: CheckPoint = control.checkpoint_copy;
    // A redo point in the segment before the record's (an online checkpoint
    // that took a while).
    checkpoint.redo = Lsn(0x1_0000_0000 + 0x00FF_FF28);
    let (at, end) = (Lsn(0x1_0000_0000 + 0x0100_0060), Lsn(0x1_0000_0000 + 0x0100_00D8));
    let s = standby_start(&control, at, end, &checkpoint, "2026-11-28 14:08:35 UTC");
    assert_eq!(
        s.backup_label,
        "START WAL LOCATION: 1/FFFF28 (file 000000010000000100000000)\nCHECKPOINT LOCATION: 1/1000060\n\
         BACKUP METHOD: streamed\nBACKUP FROM: standby\nSTART TIME: 2026-11-28 14:08:35 UTC\n\
         LABEL: strata replica\nSTART TIMELINE: 1\n"
    );
    let c = ControlFile::decode(&s.control_file).unwrap();
    // "BACKUP FROM: standby" needs a control file in recovery; its minimum
    // recovery point is where the backup (and so consistency) ends.
    assert_eq!(c.state, DbState::InArchiveRecovery);
    assert_eq!((c.checkpoint, c.checkpoint_copy), (at, checkpoint));
    assert_eq!((c.min_recovery_point, c.min_recovery_point_tli), (end, 1));
    assert_eq!((c.backup_start_point, c.backup_end_point, c.backup_end_required), (Lsn::INVALID, Lsn::INVALID, false));
    assert_eq!(c.system_identifier, control.system_identifier);
}

#[test]
fn headers_before_a_mid_segment_start_are_what_a_reader_checks() {
    let control = template();
    let start = Lsn(0x0300_0000 + 3 * 8192 + 200);
    let (name, seg) = headers_before(PgVersion::V15, control.system_identifier, 1, SEG, start);
    assert_eq!(name, "000000010000000000000003");
    assert_eq!(seg.len() as u64, SEG);
    let first = PageHeader::decode(&seg).expect("the segment's long header");
    assert_eq!(first.page_address, Lsn(0x0300_0000));
    assert!(first
        .long
        .as_ref()
        .is_some_and(|l| l.system_id == control.system_identifier && u64::from(l.segment_size) == SEG));
    let page = PageHeader::decode(&seg[3 * 8192..]).expect("the header of the start's page");
    assert_eq!(
        (page.page_address, page.timeline, page.info & XLP_FIRST_IS_CONTRECORD),
        (Lsn(0x0300_0000 + 3 * 8192), 1, 0)
    );
    // Nothing else: the pages between, and the start's page after its header.
    assert!(seg[8192..3 * 8192].iter().all(|&b| b == 0));
    assert!(seg[3 * 8192 + SHORT_HEADER_SIZE..].iter().all(|&b| b == 0));
}
