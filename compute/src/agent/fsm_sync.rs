//! Free space maps sent to the pageserver (`docs/free-space-maps.md`).
//!
//! PostgreSQL never WAL-logs a free space map, so without this a compute
//! started on the branch would find none and extend every table instead of
//! reusing the space VACUUM freed. The agent looks for map pages PostgreSQL
//! wrote (after checkpoints and evictions) and sends each changed page in
//! the WAL, as a logical message the pageserver stores at its LSN.
//!
//! The map files are read where PostgreSQL's writes land: the data
//! directory of an eager compute, the backing directory of a lazy one. A
//! file is read again only when its modification time or length changed,
//! and a page is sent only when its bytes differ from the last version
//! sent or read, so a pass over an unchanged database reads no map.

use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use strata_service::clock::timeout;
use tracing::{debug, warn};

use strata_formats::types::RelFileNode;
use strata_formats::version::BLCKSZ;
use strata_protocol::fsm_pages::{self, FsmPage};

use crate::clock::SharedClock;
use crate::lazy::rules::{ForkKind, RelFileName, SEGMENT_BLOCKS};
use crate::limits::{FSM_PASS_MAX_PAGES, FSM_SEND_TIMEOUT};
use crate::pg_replication::{ReplicationConfig, ReplicationConnection};

/// `pg_default` and `pg_global`, the tablespaces Strata serves.
const DEFAULT_SPC: u32 = 1663;
const GLOBAL_SPC: u32 = 1664;

/// What a map file was like when last read.
#[derive(Clone, Debug, Default)]
struct FileMemo {
    stamp: Option<(SystemTime, u64)>,
    /// A hash of each block as last sent or read (0: all zeros).
    sums: Vec<u64>,
}

/// The map pages of one directory tree and what was sent of them.
pub struct FsmScanner {
    root: PathBuf,
    files: HashMap<PathBuf, FileMemo>,
}

/// One pass's changed pages and what to remember once they are sent.
pub struct Pass {
    pub pages: Vec<FsmPage>,
    memos: Vec<(PathBuf, FileMemo)>,
    seen: Vec<PathBuf>,
    complete: bool,
}

impl FsmScanner {
    /// The maps under `root` (a data directory's layout: `global/`, `base/<db>/`).
    pub fn new(root: PathBuf) -> FsmScanner {
        FsmScanner { root, files: HashMap::new() }
    }

    /// The pages that changed since the last pass committed, up to about
    /// `max_pages` (whole files: the rest waits for the next pass), as of
    /// the wall clock's `now`.
    pub fn pass(&self, max_pages: usize, now: SystemTime) -> std::io::Result<Pass> {
        let mut pass = Pass { pages: Vec::new(), memos: Vec::new(), seen: Vec::new(), complete: true };
        for (dir, db) in self.directories()? {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                // A database dropped while we looked.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(with_path(&dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| with_path(&dir, e))?;
                let name = entry.file_name();
                let Some(parsed) = name.to_str().and_then(RelFileName::parse) else { continue };
                if parsed.kind != ForkKind::FreeSpaceMap {
                    continue;
                }
                let path = entry.path();
                pass.seen.push(path.clone());
                if pass.pages.len() >= max_pages {
                    pass.complete = false;
                    continue;
                }
                let rel = match db {
                    None => RelFileNode { spc: GLOBAL_SPC, db: 0, rel: parsed.relfilenode },
                    Some(db) => RelFileNode { spc: DEFAULT_SPC, db, rel: parsed.relfilenode },
                };
                let first_block = parsed.segment.saturating_mul(SEGMENT_BLOCKS);
                let memo = self.files.get(&path);
                match read_changed(&path, memo, (rel, first_block), now, &mut pass.pages) {
                    Ok(Some(new)) => pass.memos.push((path, new)),
                    Ok(None) => {}
                    // Unlinked (DROP, TRUNCATE) between the listing and the read.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(with_path(&path, e)),
                }
            }
        }
        Ok(pass)
    }

    /// Remembers what `pass` read, once its pages reached PostgreSQL's WAL
    /// (a pass whose pages were not sent is simply not committed).
    pub fn commit(&mut self, pass: Pass) {
        if pass.complete {
            let seen: std::collections::HashSet<&PathBuf> = pass.seen.iter().collect();
            self.files.retain(|p, _| seen.contains(p));
        }
        self.files.extend(pass.memos);
    }

    /// Reads every map without sending: what a compute starts from is
    /// what the pageserver holds already.
    pub fn baseline(&mut self, now: SystemTime) -> std::io::Result<()> {
        loop {
            let pass = self.pass(FSM_PASS_MAX_PAGES, now)?;
            let complete = pass.complete;
            self.commit(pass);
            if complete {
                return Ok(());
            }
        }
    }

    /// `global/` and every `base/<db>/`.
    fn directories(&self) -> std::io::Result<Vec<(PathBuf, Option<u32>)>> {
        let mut dirs = vec![(self.root.join("global"), None)];
        let base = self.root.join("base");
        let entries = match std::fs::read_dir(&base) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dirs),
            Err(e) => return Err(with_path(&base, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| with_path(&base, e))?;
            if let Some(db) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                dirs.push((entry.path(), Some(db)));
            }
        }
        Ok(dirs)
    }
}

/// Reads `path` if its stamp changed, adding the blocks whose bytes
/// changed to `out`; the file's new memo, or `None` when it is unchanged.
fn read_changed(
    path: &Path,
    memo: Option<&FileMemo>,
    (rel, first_block): (RelFileNode, u32),
    now: SystemTime,
    out: &mut Vec<FsmPage>,
) -> std::io::Result<Option<FileMemo>> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    let modified = meta.modified()?;
    // A write in the same tick of the clock as this read would leave the
    // stamp as it is: a file changed this recently is read again next pass.
    let settled = modified + crate::limits::FSM_STAMP_SETTLE < now;
    let stamp = settled.then_some((modified, meta.len()));
    if stamp.is_some() && memo.is_some_and(|m| m.stamp == stamp) {
        return Ok(None);
    }
    let blocks = usize::try_from(meta.len() / BLCKSZ as u64).unwrap_or(usize::MAX).min(SEGMENT_BLOCKS as usize);
    let mut sums = Vec::with_capacity(blocks);
    let mut page = Box::new([0u8; BLCKSZ]);
    for i in 0..blocks {
        // A block cut off since the listing reads short: the file is read again later.
        if file.read_exact_at(&mut page[..], (i * BLCKSZ) as u64).is_err() {
            break;
        }
        let sum = page_sum(&page);
        let before = memo.and_then(|m| m.sums.get(i)).copied();
        sums.push(sum);
        // All zeros: an extension PostgreSQL has not filled, or a block a
        // lazy compute never fetched. Nothing to say about it.
        if sum == 0 || before == Some(sum) {
            continue;
        }
        out.push(FsmPage { rel, block: first_block + i as u32, page: page.clone() });
    }
    Ok(Some(FileMemo { stamp, sums }))
}

/// A hash of a page's bytes, 0 only for an all-zero page.
fn page_sum(page: &[u8; BLCKSZ]) -> u64 {
    if page.iter().all(|b| *b == 0) {
        return 0;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    page.hash(&mut h);
    h.finish().max(1)
}

fn with_path(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The statements that send `pages`, one logical message per
/// [`fsm_pages::MAX_PAGES`].
pub fn statements(pages: &[FsmPage]) -> Vec<String> {
    pages
        .chunks(fsm_pages::MAX_PAGES)
        .map(|chunk| {
            let payload = fsm_pages::encode(chunk);
            let mut hex = String::with_capacity(payload.len() * 2);
            for b in &payload {
                use std::fmt::Write as _;
                let _ = write!(hex, "{b:02x}");
            }
            format!("SELECT pg_logical_emit_message(false, '{}', '\\x{hex}'::bytea)", fsm_pages::PREFIX)
        })
        .collect()
}

/// The scanner of the run under way, if any: shared with the idle watch,
/// which sends the maps before it decides to suspend.
pub type FsmSlot = Arc<Mutex<Option<Arc<Mutex<FsmScanner>>>>>;

/// A bounded pass (`sync`) whose failures are logged, not returned: the
/// pages are sent at a later pass. With `checkpoint`, PostgreSQL first
/// writes the maps it holds in shared buffers (before a stop).
pub async fn logged_pass(
    scanner: Arc<Mutex<FsmScanner>>,
    session: ReplicationConfig,
    clock: SharedClock,
    checkpoint: bool,
) {
    let pass = async {
        if checkpoint {
            let mut conn = ReplicationConnection::connect(&session)
                .await
                .map_err(|e| format!("connecting for a checkpoint: {e}"))?;
            conn.simple_query("CHECKPOINT").await.map_err(|e| format!("CHECKPOINT: {e}"))?;
        }
        sync(scanner, session, clock.system_now()).await
    };
    match timeout(&*clock, FSM_SEND_TIMEOUT, pass).await {
        Ok(Ok(0)) => {}
        Ok(Ok(pages)) => debug!(pages, "free space map pages sent"),
        Ok(Err(e)) => warn!("free space maps: {e}"),
        Err(_) => warn!("free space maps: not sent within {FSM_SEND_TIMEOUT:?}"),
    }
}

/// One pass: the changed pages read (off the runtime's threads) and sent
/// through the agent's session `session`, remembered once PostgreSQL has
/// logged every message. The number of pages sent.
pub async fn sync(
    scanner: Arc<Mutex<FsmScanner>>,
    session: ReplicationConfig,
    now: SystemTime,
) -> Result<usize, String> {
    let reader = scanner.clone();
    let pass = tokio::task::spawn_blocking(move || reader.lock().pass(FSM_PASS_MAX_PAGES, now))
        .await
        .map_err(|e| format!("reading the free space maps: {e}"))?
        .map_err(|e| format!("reading the free space maps: {e}"))?;
    let sent = pass.pages.len();
    if sent > 0 {
        let mut conn = ReplicationConnection::connect(&session)
            .await
            .map_err(|e| format!("connecting to send free space maps: {e}"))?;
        for sql in statements(&pass.pages) {
            conn.simple_query(&sql).await.map_err(|e| format!("sending free space map pages: {e}"))?;
        }
    }
    scanner.lock().commit(pass);
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_page(fill: u8) -> Vec<u8> {
        let mut p = vec![0u8; BLCKSZ];
        p[100..200].fill(fill);
        p
    }

    fn root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-fsm-sync-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("base/5")).unwrap();
        std::fs::create_dir_all(dir.join("global")).unwrap();
        dir
    }

    /// Long after any file of the test was written.
    fn later() -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 40)
    }

    /// A file written in the same clock tick as a pass's read is read
    /// again by the next one, whatever its stamp.
    #[test]
    fn a_file_modified_just_now_is_read_again() {
        let dir = root("fresh");
        std::fs::write(dir.join("base/5/16384_fsm"), map_page(1)).unwrap();
        let mut s = FsmScanner::new(dir.clone());
        let p = s.pass(10, SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(p.pages.len(), 1);
        s.commit(p);
        assert_eq!(s.files[&dir.join("base/5/16384_fsm")].stamp, None);
        let p = s.pass(10, later()).unwrap();
        assert!(p.pages.is_empty(), "the same bytes are not sent again");
        s.commit(p);
        assert!(s.files[&dir.join("base/5/16384_fsm")].stamp.is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn blocks(pass: &Pass) -> Vec<(u32, u32, u32)> {
        let mut b: Vec<_> = pass.pages.iter().map(|p| (p.rel.db, p.rel.rel, p.block)).collect();
        b.sort();
        b
    }

    #[test]
    fn only_changed_map_pages_are_sent_and_only_once() {
        let dir = root("changed");
        let mut file = map_page(1);
        file.extend(vec![0u8; BLCKSZ]);
        file.extend(map_page(3));
        std::fs::write(dir.join("base/5/16384_fsm"), &file).unwrap();
        std::fs::write(dir.join("base/5/16384"), map_page(9)).unwrap();
        std::fs::write(dir.join("global/1262_fsm"), map_page(4)).unwrap();
        let mut s = FsmScanner::new(dir.clone());
        let first = s.pass(1000, later()).unwrap();
        // The zero block and the main fork are not maps to send.
        assert_eq!(blocks(&first), vec![(0, 1262, 0), (5, 16384, 0), (5, 16384, 2)]);
        assert_eq!(first.pages.iter().find(|p| p.rel.db == 0).unwrap().rel.spc, GLOBAL_SPC);
        // Not committed (the send failed): the same pages again.
        let again = s.pass(1000, later()).unwrap();
        assert_eq!(blocks(&again), blocks(&first));
        s.commit(again);
        assert!(s.pass(1000, later()).unwrap().pages.is_empty());

        // One page rewritten with other bytes, one with the same.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = File::options().write(true).open(dir.join("base/5/16384_fsm")).unwrap();
        f.write_all_at(&map_page(7), 0).unwrap();
        f.write_all_at(&map_page(3), 2 * BLCKSZ as u64).unwrap();
        f.set_len(4 * BLCKSZ as u64).unwrap();
        drop(f);
        let p = s.pass(1000, later()).unwrap();
        assert_eq!(blocks(&p), vec![(5, 16384, 0)]);
        assert_eq!(p.pages[0].page[150], 7);
        s.commit(p);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pass_stops_near_its_bound_and_the_next_one_goes_on() {
        let dir = root("bound");
        for rel in 0..5u32 {
            std::fs::write(dir.join(format!("base/5/{}_fsm", 20000 + rel)), map_page(rel as u8 + 1)).unwrap();
        }
        std::fs::write(dir.join("base/5/20000_fsm.1"), map_page(8)).unwrap();
        let mut s = FsmScanner::new(dir.clone());
        let mut sent = Vec::new();
        for _ in 0..10 {
            let p = s.pass(2, later()).unwrap();
            if p.pages.is_empty() {
                break;
            }
            assert!(p.pages.len() <= 2);
            sent.extend(blocks(&p));
            s.commit(p);
        }
        sent.sort();
        let mut want: Vec<_> = (0..5).map(|r| (5, 20000 + r, 0)).collect();
        want.push((5, 20000, SEGMENT_BLOCKS));
        want.sort();
        assert_eq!(sent, want);
        // A removed file is forgotten once a whole pass has not seen it.
        std::fs::remove_file(dir.join("base/5/20001_fsm")).unwrap();
        let p = s.pass(100, later()).unwrap();
        s.commit(p);
        assert!(!s.files.contains_key(&dir.join("base/5/20001_fsm")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn statements_carry_decodable_messages() {
        let pages: Vec<FsmPage> = (0..70)
            .map(|i| FsmPage {
                rel: RelFileNode { spc: DEFAULT_SPC, db: 5, rel: 16384 },
                block: i,
                page: Box::new(map_page(i as u8).try_into().unwrap()),
            })
            .collect();
        let sql = statements(&pages);
        assert_eq!(sql.len(), 2);
        let hex = sql[1].split("'\\x").nth(1).unwrap().split('\'').next().unwrap();
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        assert_eq!(fsm_pages::decode(&bytes).unwrap(), pages[64..].to_vec());
        assert!(sql[0].starts_with("SELECT pg_logical_emit_message(false, 'strata.fsm', '\\x"));
    }
}
