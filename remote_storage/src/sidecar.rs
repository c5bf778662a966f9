//! The bookkeeping files beside a local object written by compare-and-swap
//! (`NAME#version`, `NAME#lock`, see [`crate::cas`]): named here, where both
//! the conditional writes and a deletion reach them.

use std::path::{Path, PathBuf};

/// The sidecar `what` (`version`, `lock`) of the object file `file`.
pub(crate) fn path(file: &Path, what: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(format!("#{what}"));
    PathBuf::from(name)
}

/// Removes the sidecar files of a local object that was deleted (those
/// of an object never written by compare-and-swap do not exist).
pub(crate) fn remove_all(file: &Path) -> std::io::Result<()> {
    for what in ["version", "lock"] {
        match std::fs::remove_file(path(file, what)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
