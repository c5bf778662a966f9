//! A mount for tests of file systems built on this crate.

use std::path::PathBuf;

/// A mount of a test's file system that is unmounted, and its directory
/// removed, when dropped — also when the test panics, so that a failed
/// test leaves no mount behind.
pub struct Mounted {
    /// The test's directory (the backing directory and the mount point lie in it).
    pub dir: PathBuf,
    /// Where the file system is mounted.
    pub mnt: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl Mounted {
    /// Takes over `session`, mounted at `mnt` inside `dir`.
    pub fn new(dir: PathBuf, mnt: PathBuf, session: fuser::BackgroundSession) -> Mounted {
        Mounted { dir, mnt, session: Some(session) }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
        // A mount the session could not undo (busy, or its thread gone).
        let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mnt).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
