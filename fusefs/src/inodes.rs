//! The inode table: FUSE inode numbers ↔ paths relative to the backing directory.
//!
//! Inode numbers are our own counter, never the backing file system's: a
//! backing file system reuses the number of a deleted file, and the kernel
//! would then take a new file for an old one it still holds (an unlinked but
//! open file, say). Our numbers are never reused, so that cannot happen.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The root directory's inode number (fixed by FUSE).
pub const ROOT: u64 = 1;

/// One inode the kernel knows.
#[derive(Debug)]
struct Node {
    /// Path relative to the backing directory; `None` once unlinked (or
    /// replaced by a rename) while the kernel still holds the inode.
    path: Option<PathBuf>,
    /// How many lookups the kernel has not forgotten yet. The entry is
    /// dropped when this reaches zero (the root is never dropped).
    lookups: u64,
}

/// Inode numbers ↔ relative paths, with the kernel's lookup counts.
#[derive(Debug)]
pub struct Inodes {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Inodes {
    /// A table that knows only the root (the empty relative path).
    pub fn new() -> Inodes {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node { path: Some(PathBuf::new()), lookups: 1 });
        let mut by_path = HashMap::new();
        by_path.insert(PathBuf::new(), ROOT);
        Inodes { nodes, by_path, next: ROOT + 1 }
    }

    /// The relative path of `ino`, or `None` if the inode is unknown or unlinked.
    pub fn path(&self, ino: u64) -> Option<&Path> {
        self.nodes.get(&ino)?.path.as_deref()
    }

    /// The inode of `path` if the kernel holds one (no lookup is counted).
    pub fn get(&self, path: &Path) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// Counts one kernel lookup of `path` (which exists in the backing
    /// directory) and returns its inode, allocating a new one if needed.
    pub fn lookup(&mut self, path: &Path) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.lookups += 1;
                return ino;
            }
        }
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, Node { path: Some(path.to_path_buf()), lookups: 1 });
        self.by_path.insert(path.to_path_buf(), ino);
        ino
    }

    /// The kernel forgot `n` lookups of `ino`; drops the entry at zero.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            if let Some(path) = node.path.take() {
                self.by_path.remove(&path);
            }
            self.nodes.remove(&ino);
        }
    }

    /// `path` was removed from the backing directory: its inode (if any)
    /// keeps living, without a path, until the kernel forgets it.
    pub fn unlinked(&mut self, path: &Path) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = None;
            }
        }
    }

    /// `from` was renamed to `to` in the backing directory: a replaced
    /// target is unlinked, and `from` and everything below it (a directory's
    /// children) move under `to`.
    pub fn renamed(&mut self, from: &Path, to: &Path) {
        if from == to {
            // rename(2) of a name onto itself changes nothing.
            return;
        }
        self.unlinked(to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(from))
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        for (old, ino) in moved {
            self.by_path.remove(&old);
            // `starts_with` matched, so the prefix strips; the fallback keeps
            // the table consistent should that ever not hold.
            let new = match old.strip_prefix(from) {
                Ok(rest) if rest.as_os_str().is_empty() => to.to_path_buf(),
                Ok(rest) => to.join(rest),
                Err(_) => old.clone(),
            };
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = Some(new.clone());
            }
            self.by_path.insert(new, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    #[test]
    fn lookups_share_an_inode_until_forgotten() {
        let mut t = Inodes::new();
        let a = t.lookup(p("a"));
        assert_eq!(t.lookup(p("a")), a);
        assert_eq!(t.path(a), Some(p("a")));
        t.forget(a, 1);
        assert_eq!(t.get(p("a")), Some(a));
        t.forget(a, 1);
        assert_eq!(t.get(p("a")), None);
        assert_eq!(t.path(a), None);
        // A new lookup gets a new number: numbers are never reused.
        assert_ne!(t.lookup(p("a")), a);
        t.forget(ROOT, 100);
        assert_eq!(t.path(ROOT), Some(p("")));
    }

    #[test]
    fn unlink_keeps_the_inode_without_a_path() {
        let mut t = Inodes::new();
        let a = t.lookup(p("a"));
        t.unlinked(p("a"));
        assert_eq!(t.path(a), None);
        assert_eq!(t.get(p("a")), None);
        let b = t.lookup(p("a"));
        assert_ne!(a, b);
        t.forget(a, 1);
        assert_eq!(t.get(p("a")), Some(b));
    }

    #[test]
    fn rename_replaces_the_target_and_moves_children() {
        let mut t = Inodes::new();
        let d = t.lookup(p("d"));
        let f = t.lookup(p("d/sub/f"));
        let sibling = t.lookup(p("dd/x"));
        let target = t.lookup(p("e"));
        t.renamed(p("d"), p("e"));
        assert_eq!(t.path(d), Some(p("e")));
        assert_eq!(t.path(f), Some(p("e/sub/f")));
        assert_eq!(t.path(sibling), Some(p("dd/x")), "a name sharing a prefix is not a child");
        assert_eq!(t.path(target), None);
        assert_eq!(t.get(p("e/sub/f")), Some(f));
        assert_eq!(t.get(p("d/sub/f")), None);
        t.renamed(p("e"), p("e"));
        assert_eq!(t.path(d), Some(p("e")));
    }
}
