//! Reading a timeline's WAL for consumers, from the segment files and
//! without the acceptor's lock (only WAL below the published flush LSN is
//! read, which the acceptor no longer changes until a truncation).

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use strata_formats::Lsn;

use crate::wal_store::segment_path;

/// Reads one timeline's WAL. A reader of committed WAL keeps the segment it
/// read last open: a consumer that keeps up reads the same segment a few
/// kilobytes at a time. Committed WAL is never truncated, so a segment
/// holding some of it is never removed and recreated under the open file;
/// uncommitted WAL may be, and its readers open the file for every read.
pub struct WalReader {
    dir: PathBuf,
    segment_size: u64,
    keep_open: bool,
    /// The segment open, with its file's inode.
    open: Option<(u64, File, u64)>,
}

impl WalReader {
    pub fn new(dir: &Path, segment_size: u64, committed_only: bool) -> WalReader {
        WalReader { dir: dir.to_path_buf(), segment_size, keep_open: committed_only, open: None }
    }

    /// Reads `buf.len()` bytes of WAL at `from` (the caller bounds it by the
    /// flush LSN). A segment file replaced by a truncation is opened again:
    /// the file is reopened after every error.
    pub fn read(&mut self, from: Lsn, buf: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let pos = from.0 + done as u64;
            let segno = pos / self.segment_size;
            let offset = pos % self.segment_size;
            let n = (buf.len() - done).min((self.segment_size - offset) as usize);
            let result = self
                .segment(segno)
                .and_then(|f| f.read_exact_at(&mut buf[done..done + n], offset))
                .and_then(|()| self.still_named(segno));
            if let Err(e) = result {
                self.open = None;
                let path = segment_path(&self.dir, segno, self.segment_size);
                return Err(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())));
            }
            done += n;
        }
        if !self.keep_open {
            self.open = None;
        }
        Ok(())
    }

    /// Closes the segment kept open: an idle stream holds no file.
    pub fn close(&mut self) {
        self.open = None;
    }

    fn segment(&mut self, segno: u64) -> std::io::Result<&File> {
        if self.open.as_ref().is_none_or(|(open, _, _)| *open != segno) {
            let file = File::open(segment_path(&self.dir, segno, self.segment_size))?;
            let inode = file.metadata()?.ino();
            self.open = Some((segno, file, inode));
        }
        Ok(&self.open.as_ref().expect("opened above").1)
    }

    /// Whether the file just read is still segment `segno`. A removed
    /// segment is recycled (`wal_store.rs`): renamed to a spare name, then
    /// to a later segment's and written again. Its name never comes back,
    /// so if the name still leads to the same file after the read, nothing
    /// of a later segment was written into it before the read ended;
    /// otherwise the bytes read may be newer WAL, and the read counts as
    /// one of a removed segment (the caller turns to object storage).
    fn still_named(&self, segno: u64) -> std::io::Result<()> {
        let Some((_, _, inode)) = &self.open else { return Ok(()) };
        let path = segment_path(&self.dir, segno, self.segment_size);
        match std::fs::metadata(&path) {
            Ok(m) if m.ino() == *inode => Ok(()),
            Ok(_) => Err(std::io::Error::new(std::io::ErrorKind::NotFound, "removed (recycled while read)")),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_segments_and_reopens_after_errors() {
        let dir = std::env::temp_dir().join(format!("strata-sk-wal-reader-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let size = 1024u64;
        for segno in 0..3u64 {
            let bytes: Vec<u8> = (0..size).map(|i| (segno * 7 + i) as u8).collect();
            std::fs::write(segment_path(&dir, segno, size), bytes).unwrap();
        }
        let mut r = WalReader::new(&dir, size, true);
        let mut buf = vec![0u8; 1500];
        r.read(Lsn(1000), &mut buf).unwrap();
        let expect: Vec<u8> = (1000..2500u64).map(|p| ((p / size) * 7 + p % size) as u8).collect();
        assert_eq!(buf, expect);
        // Closed while idle, it opens the segment again at the next read.
        r.close();
        assert!(r.open.is_none());
        r.read(Lsn(1000), &mut buf).unwrap();
        assert_eq!(buf, expect);
        // A missing segment is an error naming it; the next read works again.
        let missing = segment_path(&dir, 5, size);
        let err = r.read(Lsn(5 * size), &mut buf[..10]).unwrap_err();
        assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
        r.read(Lsn(10), &mut buf[..10]).unwrap();
        assert_eq!(&buf[..10], &expect_at(10, size)[..]);
        // A segment rewritten under the reader (truncation) is read anew after an error.
        std::fs::remove_file(segment_path(&dir, 0, size)).unwrap();
        std::fs::write(segment_path(&dir, 0, size), vec![9u8; size as usize]).unwrap();
        assert!(r.read(Lsn(5 * size), &mut buf[..1]).is_err());
        r.read(Lsn(10), &mut buf[..10]).unwrap();
        assert_eq!(&buf[..10], &[9u8; 10]);
        // A segment recycled under the reader (renamed to a later segment
        // and written again) is never read as the segment it was.
        r.read(Lsn(size + 10), &mut buf[..10]).unwrap();
        std::fs::rename(segment_path(&dir, 1, size), segment_path(&dir, 7, size)).unwrap();
        std::fs::write(segment_path(&dir, 7, size), vec![7u8; size as usize]).unwrap();
        let err = r.read(Lsn(size + 10), &mut buf[..10]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        r.read(Lsn(7 * size), &mut buf[..10]).unwrap();
        assert_eq!(&buf[..10], &[7u8; 10]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn expect_at(from: u64, size: u64) -> Vec<u8> {
        (from..from + 10).map(|p| ((p / size) * 7 + p % size) as u8).collect()
    }
}
