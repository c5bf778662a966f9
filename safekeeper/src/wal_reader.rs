//! Reading a timeline's WAL for consumers, from the segment files and
//! without the acceptor's lock (only WAL below the published flush LSN is
//! read, which the acceptor no longer changes until a truncation).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use strata_formats::Lsn;

use crate::wal_store::segment_path;

/// Reads `buf.len()` bytes of WAL at `from` (the caller bounds it by the flush LSN).
pub fn read_wal(dir: &Path, segment_size: u64, from: Lsn, buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let pos = from.0 + done as u64;
        let segno = pos / segment_size;
        let offset = pos % segment_size;
        let n = (buf.len() - done).min((segment_size - offset) as usize);
        let path = segment_path(dir, segno, segment_size);
        let file = File::open(&path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        file.read_exact_at(&mut buf[done..done + n], offset)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        done += n;
    }
    Ok(())
}
