//! In-memory storage for simulations and tests: written bytes are lost on a
//! simulated crash unless flushed.

use strata_formats::Lsn;

use crate::acceptor::{ControlStore, PersistentState, StorageError, WalStore};

/// WAL in memory, with a durable prefix.
#[derive(Clone, Debug)]
pub struct MemoryWal {
    start: Lsn,
    bytes: Vec<u8>,
    durable: usize,
    /// When set, writes fail (a full disk).
    pub fail_writes: bool,
}

impl MemoryWal {
    pub fn new(start: Lsn) -> MemoryWal {
        MemoryWal { start, bytes: Vec::new(), durable: 0, fail_writes: false }
    }

    /// Simulates a crash: everything not flushed is gone.
    pub fn crash(&mut self) {
        self.bytes.truncate(self.durable);
    }

    /// The durable bytes in `[from, to)`, if held.
    pub fn read(&self, from: Lsn, to: Lsn) -> Option<&[u8]> {
        let a = from.0.checked_sub(self.start.0)? as usize;
        let b = to.0.checked_sub(self.start.0)? as usize;
        (a <= b && b <= self.durable).then(|| &self.bytes[a..b])
    }

    pub fn start(&self) -> Lsn {
        self.start
    }
}

impl WalStore for MemoryWal {
    fn write(&mut self, at: Lsn, bytes: &[u8]) -> Result<(), StorageError> {
        if self.fail_writes {
            return Err(StorageError::other("writing", std::path::Path::new("memory"), "no space left on device"));
        }
        assert_eq!(at, self.write_lsn(), "writes are contiguous");
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StorageError> {
        self.durable = self.bytes.len();
        Ok(())
    }
    fn truncate(&mut self, at: Lsn) -> Result<(), StorageError> {
        let keep = (at.0 - self.start.0) as usize;
        self.bytes.truncate(keep);
        self.durable = self.durable.min(keep);
        Ok(())
    }
    fn write_lsn(&self) -> Lsn {
        Lsn(self.start.0 + self.bytes.len() as u64)
    }
    fn flush_lsn(&self) -> Lsn {
        Lsn(self.start.0 + self.durable as u64)
    }
}

/// A control store that keeps the last persisted state.
#[derive(Clone, Debug, Default)]
pub struct MemoryControl {
    pub persisted: Option<PersistentState>,
}

impl ControlStore for MemoryControl {
    fn persist(&mut self, state: &PersistentState) -> Result<(), StorageError> {
        self.persisted = Some(state.clone());
        Ok(())
    }
}
