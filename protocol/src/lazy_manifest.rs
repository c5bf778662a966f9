//! The manifest of a lazy basebackup (`docs/lazy-compute.md`, "The
//! manifest", version 2): every relation fork a lazy compute reads from the
//! pageserver, with its size in blocks at the basebackup's LSN.
//!
//! ```text
//! strata lazy manifest 2
//! lsn 0/1500780
//! base/5/1249 61
//! base/5/16384_fsm 3
//! base/5/16384_vm 1
//! global/1262 1
//! end 4
//! ```
//!
//! Paths are sorted and unique; the last line counts the entries, so a
//! manifest cut short is an error, not a smaller database.

use std::fmt::Write as _;

use strata_formats::Lsn;

use crate::limits::MAX_MANIFEST_BYTES;

/// The member name of the manifest in a lazy basebackup's tar stream.
pub const MANIFEST_NAME: &str = "strata.lazy.manifest";
/// The version this code writes and reads.
pub const MANIFEST_VERSION: u32 = 2;

const HEADER: &str = "strata lazy manifest ";

/// Which fork of a relation an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ManifestFork {
    Main,
    VisibilityMap,
    /// Since version 2 (`docs/free-space-maps.md`).
    FreeSpaceMap,
}

/// One relation fork: where it lives in the data directory and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    /// `None` for `global/`, else the database's directory under `base/`.
    pub db: Option<u32>,
    pub relfilenode: u32,
    pub fork: ManifestFork,
    /// Size in blocks at the manifest's LSN.
    pub blocks: u32,
}

impl ManifestEntry {
    /// The fork's first segment file, relative to the data directory.
    pub fn path(&self) -> String {
        let dir = match self.db {
            None => "global".to_string(),
            Some(db) => format!("base/{db}"),
        };
        let suffix = match self.fork {
            ManifestFork::Main => "",
            ManifestFork::VisibilityMap => "_vm",
            ManifestFork::FreeSpaceMap => "_fsm",
        };
        format!("{dir}/{}{suffix}", self.relfilenode)
    }
}

/// A decoded manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub lsn: Lsn,
    /// Sorted by path, unique.
    pub entries: Vec<ManifestEntry>,
}

/// Why a manifest was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("lazy manifest: {0} bytes is more than the {MAX_MANIFEST_BYTES} accepted")]
    TooLarge(usize),
    #[error("lazy manifest line {line}: {what}")]
    Bad { line: usize, what: String },
}

fn bad(line: usize, what: impl Into<String>) -> ManifestError {
    ManifestError::Bad { line, what: what.into() }
}

/// A decimal number as PostgreSQL writes file names: digits only, no sign,
/// no leading zero (so that a name maps to exactly one number).
pub fn file_number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

/// Parses `global/<rel>[_vm|_fsm]` or `base/<db>/<rel>[_vm|_fsm]`.
fn parse_path(path: &str) -> Option<(Option<u32>, u32, ManifestFork)> {
    let (db, file) = if let Some(file) = path.strip_prefix("global/") {
        (None, file)
    } else {
        let (db, file) = path.strip_prefix("base/")?.split_once('/')?;
        (Some(file_number(db)?), file)
    };
    let (rel, fork) = if let Some(rel) = file.strip_suffix("_vm") {
        (rel, ManifestFork::VisibilityMap)
    } else if let Some(rel) = file.strip_suffix("_fsm") {
        (rel, ManifestFork::FreeSpaceMap)
    } else {
        (file, ManifestFork::Main)
    };
    Some((db, file_number(rel)?, fork))
}

impl Manifest {
    /// The manifest's text (entries sorted by path first).
    pub fn encode(&self) -> String {
        let mut entries: Vec<(String, u32)> = self.entries.iter().map(|e| (e.path(), e.blocks)).collect();
        entries.sort();
        let mut out = format!("{HEADER}{MANIFEST_VERSION}\nlsn {}\n", self.lsn);
        for (path, blocks) in &entries {
            let _ = writeln!(out, "{path} {blocks}");
        }
        let _ = writeln!(out, "end {}", entries.len());
        out
    }

    /// Decodes and checks a manifest: version, syntax of every line,
    /// order and uniqueness of paths, and the closing count.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| bad(0, format!("not UTF-8: {e}")))?;
        let body = text.strip_suffix('\n').ok_or_else(|| bad(0, "does not end with a newline"))?;
        let mut lines = body.split('\n').enumerate().map(|(i, l)| (i + 1, l));
        let (n, header) = lines.next().ok_or_else(|| bad(1, "empty"))?;
        let version = header.strip_prefix(HEADER).and_then(file_number).ok_or_else(|| bad(n, "not a lazy manifest"))?;
        if version != MANIFEST_VERSION {
            return Err(bad(n, format!("version {version}, this build reads {MANIFEST_VERSION}")));
        }
        let (n, lsn_line) = lines.next().ok_or_else(|| bad(2, "no lsn line"))?;
        // Written as PostgreSQL writes LSNs (upper-case hex, no leading
        // zeros): one text per manifest.
        let lsn: Lsn = lsn_line
            .strip_prefix("lsn ")
            .and_then(|l| l.parse().ok().filter(|lsn: &Lsn| lsn.to_string() == l))
            .ok_or_else(|| bad(n, format!("expected \"lsn X/Y\", found {lsn_line:?}")))?;
        let mut entries = Vec::new();
        let mut last_path: Option<&str> = None;
        while let Some((n, line)) = lines.next() {
            let (key, value) = line.split_once(' ').ok_or_else(|| bad(n, format!("no size in {line:?}")))?;
            if key == "end" {
                let count = file_number(value).ok_or_else(|| bad(n, format!("bad count {value:?}")))?;
                if count as usize != entries.len() {
                    return Err(bad(n, format!("says {count} entries, {} were read", entries.len())));
                }
                if let Some((n, _)) = lines.next() {
                    return Err(bad(n, "text after the end line"));
                }
                return Ok(Manifest { lsn, entries });
            }
            let (db, relfilenode, fork) = parse_path(key).ok_or_else(|| bad(n, format!("bad path {key:?}")))?;
            let blocks = file_number(value).ok_or_else(|| bad(n, format!("bad size {value:?}")))?;
            if last_path.is_some_and(|p| p >= key) {
                return Err(bad(n, format!("{key} is out of order or repeated")));
            }
            last_path = Some(key);
            entries.push(ManifestEntry { db, relfilenode, fork, blocks });
        }
        Err(bad(0, "no end line: the manifest was cut short"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of `docs/lazy-compute.md`, byte for byte.
    const VECTOR: &str =
        "strata lazy manifest 2\nlsn 0/1500780\nbase/5/1249 61\nbase/5/16384_fsm 3\nbase/5/16384_vm 1\nglobal/1262 1\nend 4\n";

    fn example() -> Manifest {
        Manifest {
            lsn: Lsn(0x150_0780),
            entries: vec![
                ManifestEntry { db: Some(5), relfilenode: 1249, fork: ManifestFork::Main, blocks: 61 },
                ManifestEntry { db: Some(5), relfilenode: 16384, fork: ManifestFork::FreeSpaceMap, blocks: 3 },
                ManifestEntry { db: Some(5), relfilenode: 16384, fork: ManifestFork::VisibilityMap, blocks: 1 },
                ManifestEntry { db: None, relfilenode: 1262, fork: ManifestFork::Main, blocks: 1 },
            ],
        }
    }

    #[test]
    fn vector() {
        assert_eq!(example().encode(), VECTOR);
        assert_eq!(Manifest::decode(VECTOR.as_bytes()).unwrap(), example());
        let empty = Manifest { lsn: Lsn(0x28), entries: vec![] };
        assert_eq!(Manifest::decode(empty.encode().as_bytes()).unwrap(), empty);
    }

    #[test]
    fn encode_sorts_by_path() {
        let mut m = example();
        m.entries.reverse();
        assert_eq!(m.encode(), VECTOR);
    }

    #[test]
    fn refuses_what_is_not_a_whole_valid_manifest() {
        let cases: &[(&str, &str)] = &[
            ("", "does not end with a newline"),
            ("\n", "not a lazy manifest"),
            ("strata lazy manifest 1\nlsn 0/1\nend 0\n", "version 1"),
            ("strata lazy manifest 2\nend 0\n", "expected \"lsn X/Y\""),
            ("strata lazy manifest 2\nlsn 0/1a\nend 0\n", "expected \"lsn X/Y\""),
            ("strata lazy manifest 2\nlsn 00/1\nend 0\n", "expected \"lsn X/Y\""),
            ("strata lazy manifest 2\nlsn 0/1\n", "cut short"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249 61\n", "cut short"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249 61\nend 2\n", "says 2 entries, 1 were read"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249 61\nend 0", "does not end with a newline"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249_init 1\nend 1\n", "bad path"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249.1 1\nend 1\n", "bad path"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/../1249 1\nend 1\n", "bad path"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/01249 1\nend 1\n", "bad path"),
            ("strata lazy manifest 2\nlsn 0/1\npg_wal/1 1\nend 1\n", "bad path"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249 -1\nend 1\n", "bad size"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249 4294967296\nend 1\n", "bad size"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249\nend 1\n", "no size"),
            ("strata lazy manifest 2\nlsn 0/1\nbase/5/1249 1\nbase/5/1249 1\nend 2\n", "out of order or repeated"),
            ("strata lazy manifest 2\nlsn 0/1\nglobal/1 1\nbase/5/1 1\nend 2\n", "out of order or repeated"),
            ("strata lazy manifest 2\nlsn 0/1\nend 0\nbase/5/1 1\n", "text after the end line"),
        ];
        for (input, expected) in cases {
            let err = Manifest::decode(input.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(expected), "{input:?}: {err}");
        }
        assert!(matches!(Manifest::decode(&vec![b'a'; MAX_MANIFEST_BYTES + 1]), Err(ManifestError::TooLarge(_))));
        assert!(Manifest::decode(b"\xff\n").unwrap_err().to_string().contains("UTF-8"));
    }
}
