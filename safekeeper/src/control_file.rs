//! The timeline control file: `PersistentState` as JSON with a format
//! version and a CRC-32C, replaced atomically (write a temporary file,
//! fsync, rename, fsync the directory), so a crash leaves the old or the new
//! state, never a mix.

use std::fs;
use std::path::{Path, PathBuf};

use strata_service::durable::replace_file;

use crate::acceptor::{ControlStore, PersistentState, StorageError};

/// File name inside the timeline directory.
pub const CONTROL_FILE_NAME: &str = "safekeeper.control";
/// Version of the control file format.
pub const CONTROL_FORMAT_VERSION: u32 = 1;

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    format_version: u32,
    crc32c: u32,
    state: serde_json::Value,
}

/// The control file of one timeline.
pub struct ControlFile {
    path: PathBuf,
    no_sync: bool,
}

impl ControlFile {
    pub fn new(dir: &Path, no_sync: bool) -> ControlFile {
        ControlFile { path: dir.join(CONTROL_FILE_NAME), no_sync }
    }

    /// Reads and verifies the state; `Ok(None)` if there is no control file.
    pub fn load(&self) -> Result<Option<PersistentState>, StorageError> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageError::io("reading", &self.path, &e)),
        };
        decode(&bytes).map(Some).map_err(|e| StorageError::other("decoding", &self.path, e.to_string()))
    }
}

/// Why a control file's bytes were refused.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a control file: {0}")]
    NotJson(serde_json::Error),
    #[error("control file format {0} is not supported")]
    Version(u32),
    #[error("control file CRC mismatch (stored {stored:08x}, computed {computed:08x})")]
    Crc { stored: u32, computed: u32 },
    #[error("invalid control file state: {0}")]
    State(serde_json::Error),
}

/// Decodes a control file's bytes, checking version and CRC.
pub fn decode(bytes: &[u8]) -> Result<PersistentState, DecodeError> {
    let env: Envelope = serde_json::from_slice(bytes).map_err(DecodeError::NotJson)?;
    if env.format_version != CONTROL_FORMAT_VERSION {
        return Err(DecodeError::Version(env.format_version));
    }
    let canonical = serde_json::to_vec(&env.state).map_err(DecodeError::State)?;
    let computed = crc32c::crc32c(&canonical);
    if computed != env.crc32c {
        return Err(DecodeError::Crc { stored: env.crc32c, computed });
    }
    serde_json::from_value(env.state).map_err(DecodeError::State)
}

/// Encodes a state as a control file.
pub fn encode(state: &PersistentState) -> Vec<u8> {
    let value = serde_json::to_value(state).expect("the state serializes");
    let canonical = serde_json::to_vec(&value).expect("a JSON value serializes");
    let env = Envelope { format_version: CONTROL_FORMAT_VERSION, crc32c: crc32c::crc32c(&canonical), state: value };
    let mut out = serde_json::to_vec_pretty(&env).expect("the envelope serializes");
    out.push(b'\n');
    out
}

impl ControlStore for ControlFile {
    fn persist(&mut self, state: &PersistentState) -> Result<(), StorageError> {
        Ok(replace_file(&self.path, &encode(state), !self.no_sync)?)
    }
}
