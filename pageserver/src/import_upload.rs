//! A data directory sent to the pageserver to become a tenant (`strata
//! tenant import`, `docs/import.md`): a tar stream unpacked into a
//! directory of its own, keeping only what the import reads. The stream
//! comes from the network, so every entry is checked before a byte of it
//! is written: relative paths of plain components under the directories
//! the import reads, regular files and directories only, and a bound on
//! the bytes written.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use crate::import::ImportError;

/// The top-level names of a data directory the import reads; everything
/// else (configuration, logs, `pg_stat`, a backup label already replayed)
/// is skipped unread.
const KEPT: [&str; 8] =
    ["PG_VERSION", "global", "base", "pg_xact", "pg_multixact", "pg_twophase", "pg_wal", "pg_tblspc"];

/// What one unpacking wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub files: u64,
    pub bytes: u64,
}

fn refused(path: &Path, reason: impl Into<String>) -> ImportError {
    ImportError::Invalid { path: path.to_path_buf(), reason: reason.into() }
}

/// Unpacks the tar stream `from` into `dest` (which must not exist),
/// writing at most `max_bytes` of file data. A tablespace (an entry under
/// `pg_tblspc/`) is refused: its files live outside the data directory.
pub fn unpack(from: impl Read, dest: &Path, max_bytes: u64) -> Result<Unpacked, ImportError> {
    let io = |path: &Path, e: std::io::Error| refused(path, e.to_string());
    std::fs::create_dir(dest).map_err(|e| io(dest, e))?;
    let mut archive = tar::Archive::new(from);
    let mut done = Unpacked::default();
    let entries = archive.entries().map_err(|e| io(dest, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| refused(dest, format!("reading the tar stream: {e}")))?;
        let raw = entry.path().map_err(|e| refused(dest, format!("an entry's name: {e}")))?.into_owned();
        let Some(relative) = checked_path(&raw) else {
            return Err(refused(&raw, "not a relative path of plain names"));
        };
        let Some(top) = relative.components().next().and_then(|c| c.as_os_str().to_str()) else { continue };
        if !KEPT.contains(&top) {
            continue;
        }
        let kind = entry.header().entry_type();
        if top == "pg_tblspc" && relative.components().count() > 1 {
            return Err(refused(
                &relative,
                "a tablespace: its files live outside the data directory, which an import does not read",
            ));
        }
        let target = dest.join(&relative);
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| io(&target, e))?;
            continue;
        }
        if !kind.is_file() {
            return Err(refused(&relative, format!("a {kind:?} entry; only files and directories are read")));
        }
        let size = entry.size();
        if done.bytes.saturating_add(size) > max_bytes {
            return Err(refused(
                dest,
                format!("more than the {max_bytes} bytes an import may hold (import_max_bytes)"),
            ));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        // A name seen twice in one stream is refused, not overwritten.
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).open(&target).map_err(|e| io(&target, e))?;
        let copied = std::io::copy(&mut (&mut entry).take(size), &mut file)
            .map_err(|e| refused(&relative, format!("reading the tar stream: {e}")))?;
        if copied != size {
            return Err(refused(&relative, format!("the stream ended after {copied} of {size} bytes")));
        }
        done.files += 1;
        done.bytes += size;
    }
    Ok(done)
}

/// `path` without `./` parts, if it is relative and every part is a plain
/// name (no `..`, no root).
fn checked_path(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// A `Read` over chunks handed over by another thread (an HTTP body read
/// on the runtime, unpacked on a blocking thread). A chunk that is an
/// error, or a wait longer than `idle`, ends the stream with an error.
pub struct ChunkReader {
    chunks: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, String>>,
    current: bytes::Bytes,
}

impl ChunkReader {
    /// Reads what `chunks` delivers until its senders are gone.
    pub fn new(chunks: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, String>>) -> ChunkReader {
        ChunkReader { chunks, current: bytes::Bytes::new() }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("strata-unpack-{}-{:x}", std::process::id(), rand_u64()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn rand_u64() -> u64 {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).unwrap();
        u64::from_le_bytes(b)
    }

    /// A tar of `(name, data)` files; `None` data is a directory.
    fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            match data {
                Some(d) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(d.len() as u64);
                    h.set_mode(0o600);
                    b.append_data(&mut h, name, *d).unwrap();
                }
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    h.set_mode(0o700);
                    b.append_data(&mut h, name, std::io::empty()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    /// A tar whose one entry's name is written raw into the header (the
    /// builder refuses `..`, a sender need not).
    fn tar_named_raw(name: &[u8], kind: tar::EntryType) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o600);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn keeps_what_the_import_reads_and_skips_the_rest() {
        let root = tempdir();
        let dest = root.join("d");
        let tar = tar_of(&[
            ("./PG_VERSION", Some(b"15\n")),
            ("global", None),
            ("global/pg_control", Some(&[1u8; 8192])),
            ("base/1/1259", Some(&[2u8; 8192])),
            ("postgresql.conf", Some(b"x = 1\n")),
            ("pg_stat_tmp/global.stat", Some(b"junk")),
            ("pg_tblspc", None),
        ]);
        let done = unpack(&tar[..], &dest, 1 << 20).unwrap();
        assert_eq!(done, Unpacked { files: 3, bytes: 3 + 8192 * 2 });
        assert_eq!(std::fs::read(dest.join("base/1/1259")).unwrap(), vec![2u8; 8192]);
        assert!(!dest.join("postgresql.conf").exists() && !dest.join("pg_stat_tmp").exists());
        assert!(dest.join("pg_tblspc").is_dir());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn refuses_escapes_links_tablespaces_repeats_and_too_much() {
        let root = tempdir();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (tar_named_raw(b"../evil", tar::EntryType::Regular), "plain names"),
            (tar_named_raw(b"/etc/evil", tar::EntryType::Regular), "plain names"),
            (tar_named_raw(b"base/1/x", tar::EntryType::Symlink), "only files and directories"),
            (tar_of(&[("pg_tblspc/16384/PG_15/5/1", Some(b"x"))]), "tablespace"),
            (tar_of(&[("base/1/1", Some(b"a")), ("base/1/1", Some(b"b"))]), "exists"),
            (tar_of(&[("base/1/1", Some(&[0u8; 600]))]), "import_max_bytes"),
        ];
        for (i, (tar, want)) in cases.into_iter().enumerate() {
            let dest = root.join(format!("d{i}"));
            let err = unpack(&tar[..], &dest, 512).unwrap_err().to_string();
            assert!(err.contains(want), "case {i}: {err}");
        }
        assert!(!root.join("evil").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_cut_or_failed_stream_is_an_error() {
        let root = tempdir();
        let tar = tar_of(&[("base/1/1259", Some(&[2u8; 8192]))]);
        let err = unpack(&tar[..4096], &root.join("cut"), 1 << 20).unwrap_err().to_string();
        assert!(err.contains("reading the tar stream") || err.contains("ended after"), "{err}");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.blocking_send(Ok(bytes::Bytes::copy_from_slice(&tar[..512]))).unwrap();
        tx.blocking_send(Err("the client went away".into())).unwrap();
        drop(tx);
        let err = unpack(ChunkReader::new(rx), &root.join("failed"), 1 << 20).unwrap_err().to_string();
        assert!(err.contains("the client went away"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
