//! Log sequence numbers: byte positions in the WAL stream.

use std::fmt;
use std::str::FromStr;

/// A position in the WAL, printed like PostgreSQL does (`16/B374D848`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid LSN (`0/0`), used by PostgreSQL for "none".
    pub const INVALID: Lsn = Lsn(0);

    /// Offset of this position within a block of `block_size` bytes.
    pub fn block_offset(self, block_size: u64) -> u64 {
        self.0 % block_size
    }

    /// Offset of this position within a segment of `segment_size` bytes.
    pub fn segment_offset(self, segment_size: u64) -> u64 {
        self.0 % segment_size
    }

    /// Number of the segment containing this position.
    pub fn segment_number(self, segment_size: u64) -> u64 {
        self.0 / segment_size
    }

    /// Rounds up to a multiple of `align` (a power of two).
    pub fn align_up(self, align: u64) -> Lsn {
        debug_assert!(align.is_power_of_two());
        Lsn((self.0 + align - 1) & !(align - 1))
    }

    /// Adds a byte count, failing on overflow (only reachable with corrupt input).
    pub fn checked_add(self, bytes: u64) -> Option<Lsn> {
        self.0.checked_add(bytes).map(Lsn)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error for an LSN string that is not `HEX/HEX`.
#[derive(Debug, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hexadecimal numbers separated by '/'")]
pub struct ParseLsnError(String);

impl FromStr for Lsn {
    type Err = ParseLsnError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_string());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn(((hi as u64) << 32) | lo as u64))
    }
}

impl From<Lsn> for String {
    fn from(lsn: Lsn) -> String {
        lsn.to_string()
    }
}

impl TryFrom<String> for Lsn {
    type Error = ParseLsnError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_postgres() {
        assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn(0x0100_0028).to_string(), "0/1000028");
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), Lsn(0x16_B374_D848));
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
        assert!("1/100000000".parse::<Lsn>().is_err());
    }

    #[test]
    fn alignment() {
        assert_eq!(Lsn(9).align_up(8), Lsn(16));
        assert_eq!(Lsn(16).align_up(8), Lsn(16));
    }
}
