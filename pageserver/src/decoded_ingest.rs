//! Ingest of a decoded WAL stream (`strata_protocol::decoded_wal`): each
//! batch decompressed in the stream's context, its whole records decoded
//! and ingested as raw WAL's would be, its skeletons kept for sizes and
//! transaction counters, and the records not sent skipped.

use strata_formats::wal::record::{DecodedRecord, RecordError};
use strata_formats::Lsn;
use strata_protocol::decoded_wal::{BatchDecoder, DecodedWalError, Entry};
use strata_protocol::safekeeper::DecodedWal;

use crate::ingest::{IngestError, WalIngest};
use crate::timeline::Timeline;

/// Why a batch could not be ingested.
#[derive(Debug, thiserror::Error)]
pub enum DecodedInputError {
    /// The batch does not continue the stream: reconnect.
    #[error("a batch at {got} does not continue {expected}")]
    Gap { got: Lsn, expected: Lsn },
    /// The batch does not decode: reconnect (the stream's history is lost).
    #[error("decoded WAL at {begin}: {source}")]
    Batch {
        begin: Lsn,
        #[source]
        source: DecodedWalError,
    },
    /// A whole record does not decode: ingest of the timeline stops, as for raw WAL.
    #[error("the record at {lsn}: {source}")]
    Record {
        lsn: Lsn,
        #[source]
        source: RecordError,
    },
    #[error(transparent)]
    Ingest(#[from] IngestError),
}

/// The consuming side of one decoded stream.
pub struct DecodedInput {
    decoder: BatchDecoder,
    /// The end of the last record the stream covered: the next batch's begin.
    position: Lsn,
    /// How far the safekeeper has read.
    read: Lsn,
}

impl DecodedInput {
    /// A stream that starts at `start`, the end of the last record ingested.
    pub fn new(start: Lsn) -> DecodedInput {
        DecodedInput { decoder: BatchDecoder::new(), position: start, read: start }
    }

    /// How far the safekeeper has read the WAL for this stream.
    pub fn read_lsn(&self) -> Lsn {
        self.read
    }

    /// Ingests one batch; its versions are visible when it returns (also
    /// those of the records before one that fails). Returns the records
    /// ingested (whole and skeletons).
    pub fn ingest(&mut self, tl: &Timeline, ingest: &mut WalIngest, d: &DecodedWal) -> Result<u64, DecodedInputError> {
        if d.begin_lsn != self.position {
            return Err(DecodedInputError::Gap { got: d.begin_lsn, expected: self.position });
        }
        let entries = self
            .decoder
            .decode(&d.payload, d.batch_len as usize, d.crc32c, d.begin_lsn)
            .map_err(|source| DecodedInputError::Batch { begin: d.begin_lsn, source })?;
        if entries.last().is_some_and(|e| e.end_lsn() > d.end_lsn) {
            let source =
                DecodedWalError::Entry { index: entries.len() - 1, reason: format!("it ends after {}", d.end_lsn) };
            return Err(DecodedInputError::Batch { begin: d.begin_lsn, source });
        }
        let result = add_entries(tl, ingest, entries);
        if let Ok((_, true)) = result {
            ingest.skip_to(d.end_lsn, d.last_record_lsn);
            self.position = d.end_lsn;
            self.read = d.read_lsn;
        }
        ingest.commit();
        result.map(|(records, _)| records)
    }
}

/// Ingests `entries`: how many, and whether all of them.
fn add_entries(tl: &Timeline, ingest: &mut WalIngest, entries: Vec<Entry>) -> Result<(u64, bool), DecodedInputError> {
    let mut records = 0;
    for e in entries {
        if tl.is_broken() {
            // Not even the rest of this batch (a flush failed meanwhile);
            // the stream ends there.
            return Ok((records, false));
        }
        match e {
            Entry::Whole { lsn, end_lsn, raw } => {
                let rec = DecodedRecord::decode(tl.pg_version, lsn, end_lsn, raw)
                    .map_err(|source| DecodedInputError::Record { lsn, source })?;
                ingest.add(&rec)?;
            }
            Entry::Skeleton(s) => ingest.add_skeleton(&s)?,
        }
        records += 1;
    }
    Ok((records, true))
}
