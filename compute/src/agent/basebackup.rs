//! Turning a basebackup tar stream into a data directory: the directory is
//! emptied, the stream unpacked entry by entry as it arrives (never held in
//! memory), and the result checked and handed to PostgreSQL's user.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use strata_formats::v15::control::{ControlFile, DbState};
use strata_formats::Lsn;

/// Left in the data directory while it is being restored; a directory with
/// it (or with `PG_VERSION`) may be emptied by the next start.
pub const RESTORE_MARKER: &str = ".strata-restore-incomplete";

/// Directories PostgreSQL 15 expects in a data directory (created if the
/// basebackup left them out, since empty directories carry no data).
const STANDARD_DIRS: &[&str] = &[
    "base",
    "global",
    "pg_commit_ts",
    "pg_dynshmem",
    "pg_logical",
    "pg_logical/mappings",
    "pg_logical/snapshots",
    "pg_multixact",
    "pg_multixact/members",
    "pg_multixact/offsets",
    "pg_notify",
    "pg_replslot",
    "pg_serial",
    "pg_snapshots",
    "pg_stat",
    "pg_stat_tmp",
    "pg_subtrans",
    "pg_tblspc",
    "pg_twophase",
    "pg_wal",
    "pg_wal/archive_status",
    "pg_xact",
];

/// Files of a running server that must not come from a backup.
const STALE_FILES: &[&str] = &["postmaster.pid", "postmaster.opts"];

/// What unpacking did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnpackStats {
    /// Bytes of the tar stream read.
    pub bytes: u64,
    pub files: u64,
    pub dirs: u64,
}

/// Why a data directory could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    /// The archive holds something a data directory must not (absolute
    /// paths, `..`, links, devices), or lacks what it must hold.
    #[error("{0}")]
    Invalid(String),
    /// The directory is not one this agent may empty.
    #[error("{0}")]
    Refused(String),
    #[error("cancelled")]
    Cancelled,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> RestoreError {
    let context = context.into();
    move |source| RestoreError::Io { context, source }
}

/// The relative path an archive entry may be written to: `None` for the
/// archive root (`./`), an error for absolute paths and `..`.
pub fn sanitize(path: &Path) -> Result<Option<PathBuf>, RestoreError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(RestoreError::Invalid(format!("archive entry {} has an absolute path", path.display())))
            }
            Component::ParentDir => {
                return Err(RestoreError::Invalid(format!("archive entry {} contains '..'", path.display())))
            }
        }
    }
    Ok(if out.as_os_str().is_empty() { None } else { Some(out) })
}

/// Empties `pgdata` (creating it if needed) and leaves [`RESTORE_MARKER`] in
/// it. Refuses a non-empty directory that is neither a data directory nor an
/// unfinished restore, so that a wrong path cannot wipe unrelated files.
pub fn prepare_dir(pgdata: &Path) -> Result<(), RestoreError> {
    let what = || format!("data directory {}", pgdata.display());
    fs::create_dir_all(pgdata).map_err(io_err(format!("creating {}", what())))?;
    let mut entries = fs::read_dir(pgdata).map_err(io_err(format!("reading {}", what())))?.peekable();
    let non_empty = entries.peek().is_some();
    if non_empty && !pgdata.join("PG_VERSION").exists() && !pgdata.join(RESTORE_MARKER).exists() {
        return Err(RestoreError::Refused(format!(
            "{} is not empty and holds no PostgreSQL data directory (no PG_VERSION): not emptying it",
            what()
        )));
    }
    for entry in entries {
        let entry = entry.map_err(io_err(format!("reading {}", what())))?;
        let path = entry.path();
        // Into the trash, deleted in the background: a start does not wait
        // for the old files to be unlinked.
        super::trash::discard(pgdata, &path).map_err(io_err(format!("removing {}", path.display())))?;
    }
    super::trash::sweep(pgdata);
    fs::write(pgdata.join(RESTORE_MARKER), b"").map_err(io_err(format!("writing the marker in {}", what())))?;
    Ok(())
}

/// Counts the bytes read through it.
struct Counting<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Unpacks the tar stream `reader` into `pgdata` (prepared by
/// [`prepare_dir`]): regular files and directories only, at sanitized paths.
/// Checks `cancel` between entries.
pub fn unpack(reader: impl Read, pgdata: &Path, cancel: &AtomicBool) -> Result<UnpackStats, RestoreError> {
    let mut archive = tar::Archive::new(Counting { inner: reader, bytes: 0 });
    let mut stats = UnpackStats::default();
    let mut buffer = vec![0u8; crate::limits::COPY_BUFFER];
    let entries = archive.entries().map_err(io_err("reading the basebackup archive"))?;
    for entry in entries {
        if cancel.load(Ordering::Relaxed) {
            return Err(RestoreError::Cancelled);
        }
        let mut entry = entry.map_err(io_err("reading the basebackup archive"))?;
        let raw = entry.path().map_err(io_err("reading an archive entry's path"))?.into_owned();
        let Some(relative) = sanitize(&raw)? else { continue };
        let target = pgdata.join(&relative);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            fs::create_dir_all(&target).map_err(io_err(format!("creating {}", target.display())))?;
            stats.dirs += 1;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
            }
            let mut file = fs::File::create(&target).map_err(io_err(format!("creating {}", target.display())))?;
            loop {
                let n =
                    entry.read(&mut buffer).map_err(io_err(format!("reading {} from the archive", raw.display())))?;
                if n == 0 {
                    break;
                }
                file.write_all(&buffer[..n]).map_err(io_err(format!("writing {}", target.display())))?;
            }
            stats.files += 1;
        } else {
            return Err(RestoreError::Invalid(format!(
                "archive entry {} is a {:?}: only files and directories belong in a basebackup",
                raw.display(),
                kind
            )));
        }
    }
    // Read the end-of-archive padding too, so that the byte count covers
    // the whole stream (bounded: padding is a few blocks).
    let mut rest = archive.into_inner();
    io::copy(&mut (&mut rest).take(crate::limits::TRAILER_LIMIT), &mut io::sink())
        .map_err(io_err("reading the end of the basebackup archive"))?;
    stats.bytes = rest.bytes;
    Ok(stats)
}

/// Makes a standby's data directory open for queries only once replay has
/// reached `lsn`: its `pg_control`'s minimum recovery point, which a
/// backup taken from a standby also takes as the backup's end, is raised
/// to `lsn` (`docs/replicas.md`, "Never older than before"). Returns the
/// point the basebackup had.
pub fn hold_queries_until(pgdata: &Path, lsn: Lsn) -> Result<Lsn, RestoreError> {
    let path = pgdata.join("global/pg_control");
    let bytes = fs::read(&path).map_err(io_err(format!("reading {}", path.display())))?;
    let mut control = ControlFile::decode(&bytes)
        .map_err(|e| RestoreError::Invalid(format!("the basebackup's {}: {e}", path.display())))?;
    let had = control.min_recovery_point;
    if control.state != DbState::InArchiveRecovery || had == Lsn::INVALID {
        return Err(RestoreError::Invalid(format!(
            "{} is not a standby's (state {:?}, minimum recovery point {had})",
            path.display(),
            control.state
        )));
    }
    if lsn <= had {
        return Ok(had);
    }
    control.min_recovery_point = lsn;
    let mut out = control.encode();
    // The file keeps its size (PostgreSQL reads and writes 8 KiB).
    out.resize(bytes.len().max(out.len()), 0);
    let write = || -> io::Result<()> {
        let mut f = fs::OpenOptions::new().write(true).truncate(true).open(&path)?;
        f.write_all(&out)?;
        f.sync_all()
    };
    write().map_err(io_err(format!("writing {}", path.display())))?;
    Ok(had)
}

/// After unpacking: checks that `pgdata` is a PostgreSQL `pg_version` data
/// directory, removes a running server's leftovers, creates missing standard
/// directories and removes [`RESTORE_MARKER`].
pub fn finish(pgdata: &Path, pg_version: u32) -> Result<(), RestoreError> {
    let version_file = pgdata.join("PG_VERSION");
    let version = fs::read_to_string(&version_file).map_err(|e| {
        RestoreError::Invalid(format!("the basebackup has no readable PG_VERSION ({}: {e})", version_file.display()))
    })?;
    if version.trim() != pg_version.to_string() {
        return Err(RestoreError::Invalid(format!(
            "the basebackup is of PostgreSQL {}, expected {pg_version}",
            version.trim()
        )));
    }
    if !pgdata.join("global/pg_control").is_file() {
        return Err(RestoreError::Invalid("the basebackup has no global/pg_control".into()));
    }
    for name in STALE_FILES {
        let path = pgdata.join(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("removing {}", path.display()))(e)),
        }
    }
    for dir in STANDARD_DIRS {
        let path = pgdata.join(dir);
        fs::create_dir_all(&path).map_err(io_err(format!("creating {}", path.display())))?;
    }
    let marker = pgdata.join(RESTORE_MARKER);
    fs::remove_file(&marker).map_err(io_err(format!("removing {}", marker.display())))?;
    Ok(())
}

/// Gives the tree at `root` to `owner` (uid, gid) if set, with the modes
/// PostgreSQL wants: 0700 directories, 0600 files. Symbolic links are not
/// followed.
pub fn set_ownership(root: &Path, owner: Option<(u32, u32)>) -> Result<(), RestoreError> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path).map_err(io_err(format!("inspecting {}", path.display())))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                .map_err(io_err(format!("changing the owner of {}", path.display())))?;
        }
        let mode = if meta.is_dir() { 0o700 } else { 0o600 };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("changing the mode of {}", path.display())))?;
        if meta.is_dir() {
            for entry in fs::read_dir(&path).map_err(io_err(format!("reading {}", path.display())))? {
                stack.push(entry.map_err(io_err(format!("reading {}", path.display())))?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_answers_queries_only_once_replayed_to_where_it_is_held() {
        let template = ControlFile::decode(include_bytes!("../../../formats/tests/data/pg_control_v15")).unwrap();
        let cp = template.checkpoint_copy;
        let end = Lsn(cp.redo.0 + 0x80);
        let start = strata_formats::v15::startup::standby_start(&template, cp.redo, end, &cp, "now");
        let dir = temp_dir("hold");
        fs::create_dir_all(dir.join("global")).unwrap();
        let path = dir.join("global/pg_control");
        fs::write(&path, &start.control_file).unwrap();
        let held = Lsn(end.0 + 0x10_0000);
        assert_eq!(hold_queries_until(&dir, held).unwrap(), end);
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), start.control_file.len(), "pg_control keeps its size");
        let c = ControlFile::decode(&bytes).unwrap();
        assert_eq!(c.min_recovery_point, held);
        assert_eq!((c.checkpoint, c.state), (cp.redo, DbState::InArchiveRecovery), "nothing else changes");
        // Never lowered.
        assert_eq!(hold_queries_until(&dir, end).unwrap(), held);
        assert_eq!(ControlFile::decode(&fs::read(&path).unwrap()).unwrap().min_recovery_point, held);
        // A writer's pg_control is refused, and a damaged one.
        fs::write(&path, include_bytes!("../../../formats/tests/data/pg_control_v15")).unwrap();
        assert!(matches!(hold_queries_until(&dir, held), Err(RestoreError::Invalid(_))));
        let mut damaged = start.control_file.clone();
        damaged[40] ^= 1;
        fs::write(&path, &damaged).unwrap();
        let err = hold_queries_until(&dir, held).unwrap_err().to_string();
        assert!(err.contains("CRC"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-basebackup-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A tar with a raw (unchecked) path, as a hostile server could send.
    fn tar_with_raw_path(path: &str, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_gnu();
        {
            let gnu = header.as_gnu_mut().unwrap();
            gnu.name[..path.len()].copy_from_slice(path.as_bytes());
        }
        header.set_size(data.len() as u64);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&header, data).unwrap();
        b.into_inner().unwrap()
    }

    fn data_dir_tar(version: &str) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, data).unwrap();
        };
        add("PG_VERSION", format!("{version}\n").as_bytes());
        add("global/pg_control", &[0u8; 8192]);
        add("base/1/1259", &[7u8; 3 * 8192 + 5]);
        add("postmaster.pid", b"12345\n");
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o755);
        h.set_entry_type(tar::EntryType::Directory);
        b.append_data(&mut h, "pg_wal/", io::empty()).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn sanitizes_paths() {
        assert_eq!(sanitize(Path::new("base/1/1259")).unwrap(), Some(PathBuf::from("base/1/1259")));
        assert_eq!(sanitize(Path::new("./global/pg_control")).unwrap(), Some(PathBuf::from("global/pg_control")));
        assert_eq!(sanitize(Path::new("./")).unwrap(), None);
        assert_eq!(sanitize(Path::new("")).unwrap(), None);
        for bad in ["/etc/passwd", "../x", "base/../../x", "a/./../b", "/"] {
            assert!(matches!(sanitize(Path::new(bad)), Err(RestoreError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn unpacks_a_data_directory() {
        let dir = temp_dir("ok");
        prepare_dir(&dir).unwrap();
        let tar = data_dir_tar("15");
        let stats = unpack(&tar[..], &dir, &AtomicBool::new(false)).unwrap();
        assert_eq!(stats.files, 4);
        assert_eq!(stats.dirs, 1);
        assert_eq!(stats.bytes, tar.len() as u64);
        assert_eq!(fs::read(dir.join("base/1/1259")).unwrap(), vec![7u8; 3 * 8192 + 5]);
        finish(&dir, 15).unwrap();
        assert!(!dir.join("postmaster.pid").exists());
        assert!(!dir.join(RESTORE_MARKER).exists());
        assert!(dir.join("pg_wal/archive_status").is_dir());
        assert!(dir.join("pg_logical/snapshots").is_dir());
        set_ownership(&dir, None).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(fs::metadata(dir.join("PG_VERSION")).unwrap().permissions().mode() & 0o777, 0o600);

        // A second restore empties the directory first.
        fs::write(dir.join("leftover"), b"x").unwrap();
        prepare_dir(&dir).unwrap();
        assert!(!dir.join("leftover").exists() && !dir.join("base").exists());
        assert!(dir.join(RESTORE_MARKER).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_escaping_entries() {
        for path in ["../escaped", "/tmp/strata-absolute-escape", "base/../../escaped"] {
            let dir = temp_dir("escape");
            prepare_dir(&dir).unwrap();
            let tar = tar_with_raw_path(path, b"data");
            let err = unpack(&tar[..], &dir, &AtomicBool::new(false)).unwrap_err();
            assert!(matches!(err, RestoreError::Invalid(_)), "{path}: {err}");
            assert!(!dir.parent().unwrap().join("escaped").exists());
            fs::remove_dir_all(&dir).unwrap();
        }
        assert!(!Path::new("/tmp/strata-absolute-escape").exists());
    }

    #[test]
    fn rejects_links() {
        let dir = temp_dir("link");
        prepare_dir(&dir).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, "pg_tblspc/16384", "/etc").unwrap();
        let tar = b.into_inner().unwrap();
        assert!(matches!(unpack(&tar[..], &dir, &AtomicBool::new(false)), Err(RestoreError::Invalid(_))));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn checks_the_result_and_honours_cancel() {
        let dir = temp_dir("version");
        prepare_dir(&dir).unwrap();
        unpack(&data_dir_tar("16")[..], &dir, &AtomicBool::new(false)).unwrap();
        assert!(matches!(finish(&dir, 15), Err(RestoreError::Invalid(_))));
        prepare_dir(&dir).unwrap();
        assert!(matches!(unpack(&data_dir_tar("15")[..], &dir, &AtomicBool::new(true)), Err(RestoreError::Cancelled)));
        prepare_dir(&dir).unwrap();
        assert!(matches!(finish(&dir, 15), Err(RestoreError::Invalid(_))), "an empty archive is no data directory");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_to_empty_unrelated_directories() {
        let dir = temp_dir("unrelated");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("precious"), b"x").unwrap();
        assert!(matches!(prepare_dir(&dir), Err(RestoreError::Refused(_))));
        assert!(dir.join("precious").exists());
        fs::write(dir.join("PG_VERSION"), b"15\n").unwrap();
        prepare_dir(&dir).unwrap();
        assert!(!dir.join("precious").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
