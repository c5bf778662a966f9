//! Files that survive a crash whole. A file's new contents are written
//! under a temporary name, fsynced, renamed over the old file, and the
//! directory is fsynced: after a crash the file holds either its old or its
//! new contents, never a mix, and the rename itself is not lost.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A file operation that failed: what was done, to which path.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct FileError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl FileError {
    fn of<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
        move |source| FileError { op, path: path.to_path_buf(), source }
    }
}

/// The temporary name `replace_file` writes `path` under: the whole name,
/// this process's id and `.tmp`, so that two files never share one and two
/// processes replacing the same file (a supervisor and the CLI writing a
/// pidfile) never write into each other's temporary file. Within a
/// process, one file has one writer at a time.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    PathBuf::from(name)
}

/// Replaces the contents of `path` with `bytes` atomically: a temporary
/// file, fsync, rename, fsync of the directory. Without `fsync` (tests,
/// and files nothing depends on after a crash) the file is still replaced
/// whole by the rename, but a crash may lose the change.
pub fn replace_file(path: &Path, bytes: &[u8], fsync: bool) -> Result<(), FileError> {
    replace_file_with_mode(path, bytes, fsync, 0o666)
}

/// [`replace_file`] for a file created with permission bits `mode` (before
/// the umask): 0o600 for secrets, which are never readable by others, not
/// even for a moment before a `chmod`.
pub fn replace_file_with_mode(path: &Path, bytes: &[u8], fsync: bool, mode: u32) -> Result<(), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = temp_path(path);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(FileError::of("creating", &tmp))?;
        file.write_all(bytes).map_err(FileError::of("writing", &tmp))?;
        if fsync {
            file.sync_all().map_err(FileError::of("syncing", &tmp))?;
        }
        drop(file);
        std::fs::rename(&tmp, path).map_err(FileError::of("renaming", &tmp))
    })();
    if written.is_err() {
        // Best effort: a failed replacement leaves no temporary file behind.
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if fsync {
        sync_dir(parent_of(path))?;
    }
    Ok(())
}

/// fsyncs a directory, so that the entries created, renamed or removed in
/// it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), FileError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(FileError::of("syncing directory", dir))
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_whole_and_leaves_no_temporary() {
        let dir = scratch("replace");
        let path = dir.join("state.json");
        for fsync in [true, false] {
            replace_file(&path, b"first", fsync).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"first");
            replace_file(&path, b"second, longer", fsync).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
            assert!(!temp_path(&path).exists());
        }
        // The temporary name keeps the whole name: two files never share one.
        let pid = std::process::id();
        assert_eq!(temp_path(&dir.join("a.toml")), dir.join(format!("a.toml.{pid}.tmp")));
        assert_ne!(temp_path(&dir.join("a.toml")), temp_path(&dir.join("a.json")));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the file itself");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failures_name_the_operation_and_the_file() {
        let dir = scratch("fail");
        let path = dir.join("control");
        // A directory where the temporary file goes: creating it fails.
        std::fs::create_dir(temp_path(&path)).unwrap();
        let err = replace_file(&path, b"x", true).unwrap_err();
        assert_eq!(err.op, "creating");
        assert!(err.to_string().contains(&format!("control.{}.tmp", std::process::id())), "{err}");
        assert!(!path.exists(), "nothing replaced");
        std::fs::remove_dir(temp_path(&path)).unwrap();
        // A rename that fails (onto a directory) leaves no temporary file.
        std::fs::create_dir(&path).unwrap();
        let err = replace_file(&path, b"x", false).unwrap_err();
        assert_eq!(err.op, "renaming");
        assert!(!temp_path(&path).exists());
        std::fs::remove_dir(&path).unwrap();
        let err = sync_dir(&dir.join("missing")).unwrap_err();
        assert_eq!(err.op, "syncing directory");
        assert!(err.to_string().starts_with("syncing directory "), "{err}");
        sync_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
