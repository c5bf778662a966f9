//! Where the last checkpoint record of the WAL lies, as ingest found it.
//!
//! A stock hot standby starts recovery from a checkpoint *record* that is in
//! the WAL and replays from that record's redo point (`docs/replicas.md`,
//! "Where a replica starts"); the counters alone (key `0x40`) do not say
//! where the record is. Ingest stores every checkpoint record's position
//! and contents under key `0x43`, so a read at LSN *L* names the last
//! checkpoint record that ends at or before *L*.

use strata_formats::v15::records::xlog::CheckPoint;
use strata_formats::Lsn;

/// Format of the stored value; the first byte.
const FORMAT: u8 = 1;
/// Stored size: format, flags, the record's start and end, the `CheckPoint`.
pub const SIZE: usize = 2 + 8 + 8 + CheckPoint::SIZE;

/// One checkpoint record of the WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointRecord {
    /// Its first byte: what `pg_control`'s `checkPoint` names.
    pub lsn: Lsn,
    /// Where the next record may start.
    pub end_lsn: Lsn,
    /// A shutdown checkpoint (nothing ran between its redo point and it).
    pub shutdown: bool,
    /// The record's contents, as logged (redo point, counters, time).
    pub checkpoint: CheckPoint,
}

/// A stored value that is not a checkpoint record of this format.
#[derive(Debug, thiserror::Error)]
#[error("checkpoint record value: {0}")]
pub struct DecodeError(String);

impl CheckpointRecord {
    pub fn encode(&self) -> [u8; SIZE] {
        let mut out = [0u8; SIZE];
        out[0] = FORMAT;
        out[1] = u8::from(self.shutdown);
        out[2..10].copy_from_slice(&self.lsn.0.to_le_bytes());
        out[10..18].copy_from_slice(&self.end_lsn.0.to_le_bytes());
        out[18..].copy_from_slice(&self.checkpoint.encode());
        out
    }

    pub fn decode(b: &[u8]) -> Result<CheckpointRecord, DecodeError> {
        if b.len() != SIZE {
            return Err(DecodeError(format!("{} bytes, expected {SIZE}", b.len())));
        }
        if b[0] != FORMAT {
            return Err(DecodeError(format!("format {}, expected {FORMAT}", b[0])));
        }
        let shutdown = match b[1] {
            0 => false,
            1 => true,
            f => return Err(DecodeError(format!("flags {f:#x}"))),
        };
        let lsn = Lsn(u64::from_le_bytes(b[2..10].try_into().expect("8 bytes")));
        let end_lsn = Lsn(u64::from_le_bytes(b[10..18].try_into().expect("8 bytes")));
        if end_lsn <= lsn {
            return Err(DecodeError(format!("ends at {end_lsn}, not after its start {lsn}")));
        }
        let checkpoint = CheckPoint::decode(&b[18..]).map_err(|e| DecodeError(e.to_string()))?;
        if checkpoint.redo > lsn {
            return Err(DecodeError(format!("redo point {} after the record at {lsn}", checkpoint.redo)));
        }
        Ok(CheckpointRecord { lsn, end_lsn, shutdown, checkpoint })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointRecord {
        let mut bytes = [0u8; CheckPoint::SIZE];
        bytes[..8].copy_from_slice(&0x0100_0028u64.to_le_bytes());
        let checkpoint = CheckPoint::decode(&bytes).unwrap();
        CheckpointRecord { lsn: Lsn(0x0100_0100), end_lsn: Lsn(0x0100_0178), shutdown: false, checkpoint }
    }

    #[test]
    fn round_trips() {
        for shutdown in [false, true] {
            let r = CheckpointRecord { shutdown, ..sample() };
            assert_eq!(CheckpointRecord::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn malformed_values_are_refused() {
        let good = sample().encode();
        assert!(CheckpointRecord::decode(&good[..SIZE - 1]).is_err());
        let mut bad = good;
        bad[0] = 2;
        assert!(CheckpointRecord::decode(&bad).unwrap_err().to_string().contains("format 2"));
        let mut bad = good;
        bad[1] = 7;
        assert!(CheckpointRecord::decode(&bad).is_err());
        // The end before the start.
        let mut bad = good;
        bad[10..18].copy_from_slice(&0x0100_0000u64.to_le_bytes());
        assert!(CheckpointRecord::decode(&bad).unwrap_err().to_string().contains("not after"));
        // A redo point after the record.
        let r = CheckpointRecord { lsn: Lsn(0x0100_0000), end_lsn: Lsn(0x0100_0078), ..sample() };
        assert!(CheckpointRecord::decode(&r.encode()).unwrap_err().to_string().contains("redo point"));
    }
}
