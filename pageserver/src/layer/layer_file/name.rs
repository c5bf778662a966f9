//! Layer file names: a file's name states its kind, key range and LSN
//! range, so the layer map, remote storage and the remote index can know a
//! layer without opening it.

use strata_formats::Lsn;

use crate::key::Key;

/// The two kinds of layer file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LayerKind {
    /// Versions of the keys of a key range over an LSN range.
    Delta,
    /// The value of every key of a key range that has one, at one LSN.
    Image,
}

/// The name of a layer file: its kind, key range and LSN range (an image
/// layer at LSN `L` has the range `[L, L+1)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LayerName {
    pub lsn_start: Lsn,
    pub lsn_end: Lsn,
    pub key_start: Key,
    pub key_end: Key,
    pub kind: LayerKind,
}

impl LayerName {
    /// A delta layer of keys `[key_start, key_end)` at LSNs `[lsn_start, lsn_end)`.
    pub fn delta(key_start: Key, key_end: Key, lsn_start: Lsn, lsn_end: Lsn) -> LayerName {
        LayerName { lsn_start, lsn_end, key_start, key_end, kind: LayerKind::Delta }
    }

    /// An image layer of keys `[key_start, key_end)` at `lsn`.
    pub fn image(key_start: Key, key_end: Key, lsn: Lsn) -> LayerName {
        LayerName { lsn_start: lsn, lsn_end: Lsn(lsn.0 + 1), key_start, key_end, kind: LayerKind::Image }
    }
}

impl std::fmt::Display for LayerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            LayerKind::Delta => {
                write!(
                    f,
                    "{}-{}__{:016X}-{:016X}.delta",
                    self.key_start, self.key_end, self.lsn_start.0, self.lsn_end.0
                )
            }
            LayerKind::Image => write!(f, "{}-{}__{:016X}.image", self.key_start, self.key_end, self.lsn_start.0),
        }
    }
}

/// Text that is not a layer file name.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a layer file name")]
pub struct LayerNameError(pub String);

impl std::str::FromStr for LayerName {
    type Err = LayerNameError;
    fn from_str(s: &str) -> Result<LayerName, LayerNameError> {
        let bad = || LayerNameError(s.to_string());
        let lsn = |x: &str| u64::from_str_radix(x, 16).map(Lsn).map_err(|_| bad());
        let key = |x: &str| x.parse::<Key>().map_err(|_| bad());
        let keys = |keys: &str| -> Result<(Key, Key), LayerNameError> {
            let (k1, k2) = keys.split_once('-').ok_or_else(bad)?;
            Ok((key(k1)?, key(k2)?))
        };
        let name = if let Some(body) = s.strip_suffix(".delta") {
            let (k, lsns) = body.split_once("__").ok_or_else(bad)?;
            let (l1, l2) = lsns.split_once('-').ok_or_else(bad)?;
            let (key_start, key_end) = keys(k)?;
            LayerName::delta(key_start, key_end, lsn(l1)?, lsn(l2)?)
        } else if let Some(body) = s.strip_suffix(".image") {
            let (k, at) = body.split_once("__").ok_or_else(bad)?;
            let (key_start, key_end) = keys(k)?;
            let at = lsn(at)?;
            if at.0 == u64::MAX {
                return Err(bad());
            }
            LayerName::image(key_start, key_end, at)
        } else {
            return Err(bad());
        };
        if name.key_start > name.key_end || name.lsn_start >= name.lsn_end || name.to_string() != s {
            return Err(bad());
        }
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::layer_file::test_util::key;

    #[test]
    fn names_round_trip_and_anything_else_is_refused() {
        let delta = LayerName::delta(key(0), key(9), Lsn(1), Lsn(5));
        assert_eq!(delta.to_string().parse::<LayerName>().unwrap(), delta);
        let image = LayerName::image(key(0), key(1000), Lsn(0x500));
        assert_eq!(image.to_string().parse::<LayerName>().unwrap(), image);
        for bad in [
            format!("{}-{}__{:016X}.delta", key(0), key(9), 5),
            format!("{}-{}__{:016X}-{:016X}.image", key(0), key(9), 1, 5),
            format!("{}-{}__{:016X}.image", key(0), key(9), u64::MAX),
            format!("{}-{}__{:016x}.image", key(0), key(9), 0xab),
        ] {
            assert!(bad.parse::<LayerName>().is_err(), "{bad}");
        }
    }
}
