//! Old files off the start path: what a start replaces (the previous run's
//! data directory entries, a lazy compute's backing directory) is renamed
//! into a trash directory beside the data directory, on the same file
//! system, and deleted by a background thread, so that a start does not
//! wait for gigabytes to be unlinked (1.1 s at 5 GB).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::{debug, warn};

/// Whether a sweep runs (one at a time).
static SWEEPING: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The trash directory of a data directory: a sibling.
pub fn trash_dir(pgdata: &Path) -> PathBuf {
    let name = pgdata.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "pgdata".into());
    pgdata.with_file_name(format!("{name}.trash"))
}

/// Moves `path` (a file or directory beside or inside `pgdata`) into the
/// trash; if that cannot be done, removes it here and now.
pub fn discard(pgdata: &Path, path: &Path) -> std::io::Result<()> {
    let trash = trash_dir(pgdata);
    let moved = std::fs::create_dir_all(&trash).and_then(|()| {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        std::fs::rename(path, trash.join(format!("{}-{n}", std::process::id())))
    });
    match moved {
        Ok(()) => Ok(()),
        Err(e) => {
            debug!(path = %path.display(), "removing in place, not through the trash: {e}");
            if std::fs::symlink_metadata(path)?.is_dir() {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            }
        }
    }
}

/// Deletes the trash of `pgdata` on a background thread, unless a sweep
/// runs already (what it misses, the next sweep takes).
pub fn sweep(pgdata: &Path) {
    let trash = trash_dir(pgdata);
    if !trash.exists() || SWEEPING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new().name("trash".into()).spawn(move || {
        if let Err(e) = std::fs::remove_dir_all(&trash) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(path = %trash.display(), "emptying the trash: {e}");
            }
        }
        SWEEPING.store(false, Ordering::Release);
    });
    if spawned.is_err() {
        SWEEPING.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_service::clock::Clock;

    #[test]
    fn discarded_files_leave_at_once_and_the_trash_is_emptied() {
        let dir = std::env::temp_dir().join(format!("strata-trash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pgdata = dir.join("pgdata");
        std::fs::create_dir_all(pgdata.join("base/5")).unwrap();
        std::fs::write(pgdata.join("base/5/1249"), vec![1u8; 8192]).unwrap();
        std::fs::write(pgdata.join("PG_VERSION"), "15\n").unwrap();
        discard(&pgdata, &pgdata.join("base")).unwrap();
        discard(&pgdata, &pgdata.join("PG_VERSION")).unwrap();
        assert_eq!(std::fs::read_dir(&pgdata).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(trash_dir(&pgdata)).unwrap().count(), 2);
        sweep(&pgdata);
        // The sweep runs on a thread of its own: real time passes for it.
        let clock = strata_service::clock::SystemClock;
        let started = clock.now();
        while trash_dir(&pgdata).exists() {
            assert!(clock.since(started) < std::time::Duration::from_secs(10), "the trash was not emptied");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Nothing to move: removed in place.
        assert!(discard(&pgdata, &pgdata.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
