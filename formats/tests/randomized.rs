//! Bounded randomized robustness run: real WAL, pg_control and pages with
//! random damage (bit flips, overwritten bytes, truncation, spliced garbage)
//! must decode to an error or to valid records — never a panic or a hang.
//! The coverage-guided fuzz targets in `fuzz/` drive the same entry point.

use std::time::{Duration, Instant};

use strata_formats::fuzz::{decode_wal, fuzz_one};
use strata_formats::Lsn;
use strata_test_support::rng::{seeded, Rng, RngExt};

fn inputs() -> Vec<(Lsn, Vec<u8>)> {
    let dir = strata_test_support::paths::in_crate("tests/data/wal");
    let mut out: Vec<(Lsn, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("wal"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_str().unwrap().to_string();
            let lsn = u64::from_str_radix(stem.split_once('_').unwrap().1, 16).unwrap();
            (Lsn(lsn), std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.index(4) {
        match rng.index(5) {
            0 => {
                let i = rng.index(bytes.len());
                bytes[i] ^= 1 << rng.index(8);
            }
            1 => {
                let i = rng.index(bytes.len());
                bytes[i] = rng.u64(..) as u8;
            }
            2 => {
                let n = rng.index(bytes.len());
                bytes.truncate(n.max(1));
            }
            3 => {
                let i = rng.index(bytes.len());
                let n = rng.index(64).min(bytes.len() - i);
                for b in &mut bytes[i..i + n] {
                    *b = rng.u64(..) as u8;
                }
            }
            _ => {
                // Overwrite a length-like field at an 8-byte boundary with an extreme value.
                let i = rng.index(bytes.len() / 8) * 8;
                let v = [0u32, 1, 23, 24, 0xffff, 0x3fff_ffff, u32::MAX][rng.index(7)];
                let n = 4.min(bytes.len() - i);
                bytes[i..i + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
        }
        if bytes.is_empty() {
            bytes.push(0);
        }
    }
}

#[test]
fn damaged_wal_never_panics() {
    let budget = Duration::from_secs(20);
    let started = Instant::now();
    let mut rng = seeded("damaged_wal_never_panics", 0x5EED_1234_ABCD_0001);
    let mut iterations = 0;
    let mut errors = 0;
    let inputs = inputs();
    let clean: Vec<usize> = inputs.iter().map(|(lsn, b)| decode_wal(b, *lsn, 16 << 20, b.len()).records).collect();
    while iterations < 3000 && started.elapsed() < budget {
        let which = rng.index(inputs.len());
        let (lsn, original) = &inputs[which];
        let mut bytes = original.clone();
        mutate(&mut rng, &mut bytes);
        let chunk = [bytes.len(), 1 + rng.index(9000)][rng.index(2)];
        let summary = decode_wal(&bytes, *lsn, 16 << 20, chunk);
        // Damage never makes up records: at most as many as the clean input.
        assert!(
            summary.records <= clean[which] + 1,
            "iteration {iterations}: {} records from damaged input",
            summary.records
        );
        if summary.error.is_some() {
            errors += 1;
        }
        iterations += 1;
    }
    assert!(iterations >= 200, "only {iterations} iterations ran");
    assert!(errors > iterations / 4, "damage was detected in only {errors} of {iterations} runs");
}

#[test]
fn garbage_through_every_entry_point() {
    let mut rng = seeded("garbage_through_every_entry_point", 0xFEED_0000_0000_0042);
    let inputs = inputs();
    let started = Instant::now();
    for i in 0..4000 {
        if started.elapsed() > Duration::from_secs(20) {
            break;
        }
        let mut data = vec![(i % 4) as u8];
        if rng.index(2) == 0 {
            let n = rng.index(20_000);
            data.extend((0..n).map(|_| rng.u64(..) as u8));
        } else {
            let (_, original) = &inputs[rng.index(inputs.len())];
            let from = rng.index(original.len());
            let mut slice = original[from..(from + rng.index(20_000)).min(original.len())].to_vec();
            if slice.is_empty() {
                slice.push(0);
            }
            mutate(&mut rng, &mut slice);
            data.extend(slice);
        }
        fuzz_one(&data);
    }
}

#[test]
fn lsns_near_the_end_of_the_address_space_are_errors() {
    use strata_formats::wal::{StartPosition, WalDecodeError, WalDecoder};
    use strata_formats::PgVersion;
    for start in [u64::MAX - 8191, u64::MAX - (1 << 40) - 8192, !8191u64] {
        let mut d = WalDecoder::new(PgVersion::V15, Lsn(start), 16 << 20, StartPosition::FindFirstRecord);
        d.feed(&[0xAB; 40_000]);
        assert!(matches!(d.next_record(), Err(WalDecodeError::Corrupt { .. })), "start {start:#x}");
    }
}
