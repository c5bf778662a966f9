//! An eager compute of a sharded tenant (`docs/sharding.md`, "Eager
//! computes"): no pageserver holds every page, so its data directory is
//! shard 0's lazy basebackup (every file but the relations', and a
//! manifest of their sizes) with each relation file then written in place
//! from the pages of the shards that hold them, at the manifest's LSN,
//! before PostgreSQL starts. The same page source a lazy compute mounts
//! reads them, split by the key mapping and fetched from all shards at once.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use strata_formats::version::BLCKSZ;
use strata_protocol::lazy_manifest::{Manifest, ManifestEntry, MANIFEST_NAME};

use crate::lazy::fs::{entry_rel, PageSource};
use crate::limits::{MATERIALIZE_BATCH_BLOCKS, MATERIALIZE_WORKERS};

/// Blocks of one relation segment file (PostgreSQL's 1 GiB `RELSEG_SIZE`).
const SEGMENT_BLOCKS: u32 = (1 << 30) / BLCKSZ as u32;
const _: () = assert!(SEGMENT_BLOCKS.is_multiple_of(MATERIALIZE_BATCH_BLOCKS));

/// What was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Materialized {
    pub files: u64,
    pub blocks: u64,
}

/// Segment file `segment` of a manifest entry, under `pgdata`.
fn segment_file(pgdata: &Path, e: &ManifestEntry, segment: u32) -> PathBuf {
    match segment {
        0 => pgdata.join(e.path()),
        n => pgdata.join(format!("{}.{n}", e.path())),
    }
}

/// Writes every relation fork the manifest in `pgdata` lists from
/// `source`, and removes the manifest. Each segment file is made at its
/// full size first; workers then read batches of blocks and write them in
/// place. Stops early, with an error, once `cancel` is set.
pub fn materialize(pgdata: &Path, source: &dyn PageSource, cancel: &AtomicBool) -> Result<Materialized, String> {
    let manifest_path = pgdata.join(MANIFEST_NAME);
    let bytes = std::fs::read(&manifest_path).map_err(|e| format!("reading {}: {e}", manifest_path.display()))?;
    let manifest = Manifest::decode(&bytes).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let mut done = Materialized::default();
    // (entry, first block) of each batch; a batch never crosses a segment.
    let mut batches: Vec<(usize, u32)> = Vec::new();
    for (i, e) in manifest.entries.iter().enumerate() {
        // An empty fork still has its first segment file.
        for segment in 0..e.blocks.div_ceil(SEGMENT_BLOCKS).max(1) {
            let path = segment_file(pgdata, e, segment);
            let blocks = e.blocks.saturating_sub(segment * SEGMENT_BLOCKS).min(SEGMENT_BLOCKS);
            let file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&path)
                .map_err(|err| format!("creating {}: {err}", path.display()))?;
            file.set_len(u64::from(blocks) * BLCKSZ as u64)
                .map_err(|err| format!("sizing {}: {err}", path.display()))?;
            done.files += 1;
        }
        batches.extend((0..e.blocks).step_by(MATERIALIZE_BATCH_BLOCKS as usize).map(|b| (i, b)));
    }
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let written = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..MATERIALIZE_WORKERS {
            scope.spawn(|| {
                while failure.lock().is_none() {
                    if cancel.load(Ordering::Relaxed) {
                        failure.lock().get_or_insert_with(|| "stopped".into());
                        return;
                    }
                    let Some(&(i, first)) = batches.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                    let e = &manifest.entries[i];
                    match write_batch(pgdata, e, first, source, &manifest) {
                        Ok(n) => {
                            written.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(err) => {
                            failure.lock().get_or_insert(err);
                        }
                    }
                }
            });
        }
    });
    if let Some(err) = failure.into_inner() {
        return Err(err);
    }
    done.blocks = written.into_inner() as u64;
    debug_assert_eq!(done.blocks, manifest.entries.iter().map(|e| u64::from(e.blocks)).sum::<u64>());
    std::fs::remove_file(&manifest_path).map_err(|e| format!("removing {}: {e}", manifest_path.display()))?;
    Ok(done)
}

/// Reads blocks `first..` (a batch, within one segment) of entry `e` at
/// the manifest's LSN and writes them in place; how many.
fn write_batch(
    pgdata: &Path,
    e: &ManifestEntry,
    first: u32,
    source: &dyn PageSource,
    manifest: &Manifest,
) -> Result<usize, String> {
    let (rel, fork) = entry_rel(e);
    let end = e.blocks.min(first + MATERIALIZE_BATCH_BLOCKS);
    let blocks: Vec<u32> = (first..end).collect();
    let pages = source
        .get_pages(rel, fork, &blocks, manifest.lsn)
        .map_err(|err| format!("{} blocks {first}..{end} at {}: {err}", e.path(), manifest.lsn))?;
    if pages.len() != blocks.len() * BLCKSZ {
        return Err(format!("{} blocks {first}..{end}: {} bytes read", e.path(), pages.len()));
    }
    let path = segment_file(pgdata, e, first / SEGMENT_BLOCKS);
    let file =
        OpenOptions::new().write(true).open(&path).map_err(|err| format!("opening {}: {err}", path.display()))?;
    let offset = u64::from(first % SEGMENT_BLOCKS) * BLCKSZ as u64;
    file.write_all_at(&pages, offset).map_err(|err| format!("writing {}: {err}", path.display()))?;
    Ok(blocks.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lazy::fs::FetchError;
    use strata_formats::types::{ForkNumber, RelFileNode};
    use strata_formats::Lsn;
    use strata_protocol::lazy_manifest::ManifestFork;

    /// Pages that name themselves: relation, fork and block in the first bytes.
    struct Named {
        fail_at: Option<u32>,
    }

    impl PageSource for Named {
        fn get_pages(
            &self,
            rel: RelFileNode,
            fork: ForkNumber,
            blocks: &[u32],
            lsn: Lsn,
        ) -> Result<Vec<u8>, FetchError> {
            assert_eq!(lsn, Lsn(0x1500780));
            let mut out = vec![0u8; blocks.len() * BLCKSZ];
            for (k, b) in blocks.iter().enumerate() {
                if Some(*b) == self.fail_at {
                    return Err(FetchError::Other("the shard is down".into()));
                }
                let page = &mut out[k * BLCKSZ..];
                page[..4].copy_from_slice(&rel.rel.to_le_bytes());
                page[4] = fork as u8;
                page[8..12].copy_from_slice(&b.to_le_bytes());
            }
            Ok(out)
        }
    }

    fn pgdata(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-materialize-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("base/5")).unwrap();
        std::fs::create_dir_all(dir.join("global")).unwrap();
        let entry = |db, relfilenode, fork, blocks| ManifestEntry { db, relfilenode, fork, blocks };
        let manifest = Manifest {
            lsn: Lsn(0x1500780),
            entries: vec![
                entry(Some(5), 16384, ManifestFork::Main, 100),
                entry(Some(5), 16384, ManifestFork::VisibilityMap, 1),
                entry(Some(5), 16390, ManifestFork::Main, 0),
                entry(None, 1262, ManifestFork::Main, 1),
            ],
        };
        std::fs::write(dir.join(MANIFEST_NAME), manifest.encode()).unwrap();
        dir
    }

    #[test]
    fn every_listed_block_is_written_in_place_and_the_manifest_goes() {
        let dir = pgdata("ok");
        let done = materialize(&dir, &Named { fail_at: None }, &AtomicBool::new(false)).unwrap();
        assert_eq!(done, Materialized { files: 4, blocks: 102 });
        let heap = std::fs::read(dir.join("base/5/16384")).unwrap();
        assert_eq!(heap.len(), 100 * BLCKSZ);
        for b in 0..100u32 {
            let page = &heap[b as usize * BLCKSZ..];
            assert_eq!((&page[..4], page[4], &page[8..12]), (&16384u32.to_le_bytes()[..], 0, &b.to_le_bytes()[..]));
        }
        assert_eq!(std::fs::read(dir.join("base/5/16384_vm")).unwrap()[4], ForkNumber::VisibilityMap as u8);
        assert_eq!(std::fs::metadata(dir.join("base/5/16390")).unwrap().len(), 0);
        assert_eq!(std::fs::read(dir.join("global/1262")).unwrap()[..4], 1262u32.to_le_bytes());
        assert!(!dir.join(MANIFEST_NAME).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_read_or_a_stop_is_an_error_and_keeps_the_manifest() {
        let dir = pgdata("fail");
        let err = materialize(&dir, &Named { fail_at: Some(70) }, &AtomicBool::new(false)).unwrap_err();
        assert!(err.contains("base/5/16384 blocks 64..96") && err.contains("the shard is down"), "{err}");
        assert!(dir.join(MANIFEST_NAME).exists());
        let err = materialize(&dir, &Named { fail_at: None }, &AtomicBool::new(true)).unwrap_err();
        assert_eq!(err, "stopped");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
