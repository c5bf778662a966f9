//! Writes into a local-directory object store: files by a streaming copy,
//! small objects from memory, both staged the same way.
//!
//! Reading a layer file whole into memory to hand it to the store cost more
//! CPU than the copy itself (a fresh allocation faulted in page by page for
//! every file); a copy through one reused 1 MiB buffer costs about what the
//! kernel's own `copy_file_range` does and still lets the CRC be computed
//! on the way. The object appears the way `object_store` writes one: a
//! staging file `NAME#N` (which its listings skip), fsynced, renamed over
//! `NAME`, and the directory fsynced. A tenant's file is sealed on the way
//! (`seal`), a chunk at a time; the size and CRC returned are the file's.
//!
//! A process killed mid-upload leaves its staging file behind. The next
//! upload of the same name (a layer or segment is uploaded again under its
//! name after a restart) removes the staging files of that name that nobody
//! has written to for [`STALE_STAGING`], so they do not pile up; a younger
//! one may belong to a live upload and stays.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use strata_service::durable::parent_of;

use crate::limits::{COPY_CHUNK, STALE_STAGING};
use crate::seal::format::ObjectSealer;
use crate::transfer::Uploaded;

/// What failed, on which file.
pub(crate) type CopyError = (&'static str, PathBuf, std::io::Error);

/// Copies `src` to the object file `dest`, sealed by `sealer` if given;
/// the object is whole or absent.
pub(crate) fn upload(src: &Path, dest: &Path, sealer: Option<ObjectSealer>) -> Result<Uploaded, CopyError> {
    let input = File::open(src).map_err(|e| ("reading", src.to_path_buf(), e))?;
    write_object(input, src, dest, sealer)
}

/// Writes `bytes` as the object file `dest`, the same way as [`upload`]
/// (so small objects leave no staging files behind either). `bytes` are
/// stored as they are (sealed already if need be).
pub(crate) fn put(bytes: &[u8], dest: &Path) -> Result<Uploaded, CopyError> {
    write_object(bytes, dest, dest, None)
}

/// Streams `input` (read from `src`, named in errors) into `dest`, through
/// `sealer` if given.
fn write_object(
    mut input: impl Read,
    src: &Path,
    dest: &Path,
    mut sealer: Option<ObjectSealer>,
) -> Result<Uploaded, CopyError> {
    let (mut output, staging, others) = reserve_staging(dest)?;
    let copied = (|| {
        let mut buf = vec![0u8; COPY_CHUNK];
        // Sealed bytes waiting to be written: written in whole multiples of
        // the copy buffer, so that the writes stay aligned to pages as a
        // plain copy's are (a header and tags would shift every one; the
        // unaligned writes cost a plain copy's time again). A chunk and
        // its tag at most.
        let mut sealed = Vec::new();
        if let Some(s) = &sealer {
            sealed.extend_from_slice(s.header());
        }
        let (mut size, mut crc) = (0u64, 0u32);
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(("reading", src.to_path_buf(), e)),
            };
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            match &mut sealer {
                Some(s) => {
                    s.push(&buf[..n], &mut sealed);
                    let whole = sealed.len() / COPY_CHUNK * COPY_CHUNK;
                    output.write_all(&sealed[..whole]).map_err(|e| ("writing", staging.clone(), e))?;
                    sealed.drain(..whole);
                }
                None => output.write_all(&buf[..n]).map_err(|e| ("writing", staging.clone(), e))?,
            }
            size += n as u64;
        }
        if let Some(s) = sealer.take() {
            s.finish(&mut sealed);
            output.write_all(&sealed).map_err(|e| ("writing", staging.clone(), e))?;
        }
        output.sync_all().map_err(|e| ("syncing", staging.clone(), e))?;
        drop(output);
        std::fs::rename(&staging, dest).map_err(|e| ("renaming", staging.clone(), e))?;
        Ok(Uploaded { size, crc32c: crc })
    })();
    match copied {
        Ok(uploaded) => {
            sync_dir(parent_of(dest))?;
            remove_stale(&others);
            Ok(uploaded)
        }
        Err(e) => {
            // Best effort: a failed upload leaves no staging file behind.
            let _ = std::fs::remove_file(&staging);
            Err(e)
        }
    }
}

fn staging_name(dest: &Path, n: u32) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(format!("#{n}"));
    PathBuf::from(name)
}

/// Creates `NAME#N` for the first free N (two uploads of one name never
/// share a staging file), creating missing directories durably; also
/// returns the other staging names of `dest` in use: those before N, and
/// those after it up to the first free one.
fn reserve_staging(dest: &Path) -> Result<(File, PathBuf, Vec<PathBuf>), CopyError> {
    let mut others = Vec::new();
    for n in 1u32.. {
        let staging = staging_name(dest, n);
        match OpenOptions::new().write(true).create_new(true).open(&staging) {
            Ok(f) => {
                others.extend((n + 1..).map(|k| staging_name(dest, k)).take_while(|p| p.exists()));
                return Ok((f, staging, others));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => others.push(staging),
            Err(e) if e.kind() == ErrorKind::NotFound => create_dirs(parent_of(dest))?,
            Err(e) => return Err(("creating", staging, e)),
        }
    }
    unreachable!("u32 staging names exhausted")
}

/// Removes the files among `others` not modified for [`STALE_STAGING`].
/// Best effort: the object is already in place, and a file that cannot be
/// removed now is tried again by the next upload of its name.
fn remove_stale(others: &[PathBuf]) {
    for path in others {
        let stale = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= STALE_STAGING));
        if stale {
            match std::fs::remove_file(path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed a staging file left by an earlier upload"),
                Err(e) => tracing::warn!(path = %path.display(), "cannot remove a stale staging file: {e}"),
            }
        }
    }
}

/// Creates `dir` and its missing ancestors, fsyncing the parent of each one
/// created so that the new entries survive a crash.
fn create_dirs(dir: &Path) -> Result<(), CopyError> {
    if dir.is_dir() {
        return Ok(());
    }
    create_dirs(parent_of(dir))?;
    match std::fs::create_dir(dir) {
        Ok(()) => sync_dir(parent_of(dir)),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(("creating directory", dir.to_path_buf(), e)),
    }
}

fn sync_dir(dir: &Path) -> Result<(), CopyError> {
    strata_service::durable::sync_dir(dir).map_err(|e| (e.op, e.path, e.source))
}
