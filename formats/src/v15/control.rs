//! `global/pg_control` (`ControlFileData`) of PostgreSQL 15 to 18.
//!
//! The struct is 296 bytes in every major, CRC-32C over everything before
//! the CRC field, and the file is zero-padded to 8 KiB. Fields Strata does
//! not interpret are kept byte for byte, so a decoded file re-encodes to the
//! same bytes. The layout differs in one place: 18 (version 1800) adds
//! `default_char_signedness` after `data_checksum_version`, which moves the
//! mock authentication nonce by one byte and the CRC by four. 17 (1700)
//! differs from 15 and 16 (1300) only inside the checkpoint's copy.

use crate::lsn::Lsn;
use crate::types::{Cursor, Truncated};
use crate::v15::records::xlog::CheckPoint;
use crate::version::PgVersion;

/// `PG_CONTROL_VERSION` of PostgreSQL 15.
pub const PG_CONTROL_VERSION: u32 = 1300;
/// `CATALOG_VERSION_NO` of PostgreSQL 15.
pub const CATALOG_VERSION_NO: u32 = 202209061;
/// Size of the file on disk.
pub const PG_CONTROL_FILE_SIZE: usize = 8192;
/// Size of the struct (the same from 15 to 18).
pub const CONTROL_DATA_SIZE: usize = 296;
/// Length of `mock_authentication_nonce`, the last field before the CRC.
pub const MOCK_AUTH_NONCE_LEN: usize = 32;
/// Where `default_char_signedness` is, from 18 on.
const CHAR_SIGNEDNESS_OFFSET: usize = 256;

/// Where the fields after `data_checksum_version` are, by `PG_CONTROL_VERSION`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    nonce: usize,
    crc: usize,
    char_signedness: bool,
}

impl Layout {
    fn of(pg_control_version: u32) -> Option<Layout> {
        match pg_control_version {
            1300 | 1700 => Some(Layout { nonce: 256, crc: 288, char_signedness: false }),
            1800 => Some(Layout { nonce: 257, crc: 292, char_signedness: true }),
            _ => None,
        }
    }
}

/// `DBState`: how the cluster was last left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum DbState {
    Startup = 0,
    Shutdowned = 1,
    ShutdownedInRecovery = 2,
    Shutdowning = 3,
    InCrashRecovery = 4,
    InArchiveRecovery = 5,
    InProduction = 6,
}

impl DbState {
    fn from_u32(v: u32) -> Option<DbState> {
        Some(match v {
            0 => DbState::Startup,
            1 => DbState::Shutdowned,
            2 => DbState::ShutdownedInRecovery,
            3 => DbState::Shutdowning,
            4 => DbState::InCrashRecovery,
            5 => DbState::InArchiveRecovery,
            6 => DbState::InProduction,
            _ => return None,
        })
    }
}

/// The fields of `pg_control` Strata reads or writes; the rest of the
/// struct is carried in `raw`.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlFile {
    pub system_identifier: u64,
    pub pg_control_version: u32,
    pub catalog_version_no: u32,
    pub state: DbState,
    /// Time of the last update, seconds since the Unix epoch.
    pub time: i64,
    /// LSN of the last checkpoint record.
    pub checkpoint: Lsn,
    pub checkpoint_copy: CheckPoint,
    pub unlogged_lsn: Lsn,
    pub min_recovery_point: Lsn,
    pub min_recovery_point_tli: u32,
    pub backup_start_point: Lsn,
    pub backup_end_point: Lsn,
    pub backup_end_required: bool,
    pub wal_level: i32,
    pub wal_log_hints: bool,
    pub block_size: u32,
    pub wal_block_size: u32,
    pub wal_segment_size: u32,
    pub data_checksum_version: u32,
    /// `default_char_signedness` (18 on): whether `char` was signed where
    /// the cluster was initialised; None before 18.
    pub default_char_signedness: Option<bool>,
    /// The struct as read (fields above override it when encoding).
    raw: [u8; CONTROL_DATA_SIZE],
}

/// A `pg_control` file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlFileError {
    #[error("pg_control is truncated: {0}")]
    Truncated(#[from] Truncated),
    #[error("pg_control CRC mismatch (stored {stored:08X}, computed {computed:08X})")]
    Crc { stored: u32, computed: u32 },
    #[error("pg_control version {0} is not supported (15 and 16: 1300, 17: 1700, 18: 1800)")]
    Version(u32),
    #[error("pg_control version {control} with catalog version {catalog} is no supported PostgreSQL major")]
    Catalog { control: u32, catalog: u32 },
    #[error("pg_control has invalid state {0}")]
    State(u32),
}

/// The major whose `PG_CONTROL_VERSION` and `CATALOG_VERSION_NO` these are
/// (15 and 16 share the first; the catalog version tells them apart).
fn version_of(control: u32, catalog: u32) -> Option<PgVersion> {
    PgVersion::ALL.into_iter().find(|v| v.table().control_version == control && v.table().catalog_version == catalog)
}

impl ControlFile {
    /// Decodes and verifies `pg_control` (the file, or at least its first 296 bytes).
    pub fn decode(bytes: &[u8]) -> Result<ControlFile, ControlFileError> {
        if bytes.len() < CONTROL_DATA_SIZE {
            return Err(Truncated { offset: 0, needed: CONTROL_DATA_SIZE, available: bytes.len() }.into());
        }
        let pg_control_version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        let layout = Layout::of(pg_control_version).ok_or(ControlFileError::Version(pg_control_version))?;
        let stored = u32::from_le_bytes(bytes[layout.crc..layout.crc + 4].try_into().unwrap());
        let computed = crc32c::crc32c(&bytes[..layout.crc]);
        if stored != computed {
            return Err(ControlFileError::Crc { stored, computed });
        }
        let mut c = Cursor::new(bytes);
        let system_identifier = c.u64()?;
        c.skip(4)?;
        let catalog_version_no = c.u32()?;
        if version_of(pg_control_version, catalog_version_no).is_none() {
            return Err(ControlFileError::Catalog { control: pg_control_version, catalog: catalog_version_no });
        }
        let state_raw = c.u32()?;
        let state = DbState::from_u32(state_raw).ok_or(ControlFileError::State(state_raw))?;
        c.skip(4)?;
        let time = c.i64()?;
        let checkpoint = Lsn(c.u64()?);
        let checkpoint_copy = CheckPoint::decode(c.take(CheckPoint::SIZE)?)?;
        let unlogged_lsn = Lsn(c.u64()?);
        let min_recovery_point = Lsn(c.u64()?);
        let min_recovery_point_tli = c.u32()?;
        c.skip(4)?;
        let backup_start_point = Lsn(c.u64()?);
        let backup_end_point = Lsn(c.u64()?);
        let backup_end_required = c.u8()? != 0;
        c.skip(3)?;
        let wal_level = c.i32()?;
        let wal_log_hints = c.u8()? != 0;
        let mut c = Cursor::new(&bytes[216..]);
        let block_size = c.u32()?;
        c.skip(4)?; // relseg_size
        let wal_block_size = c.u32()?;
        let wal_segment_size = c.u32()?;
        let mut c = Cursor::new(&bytes[252..]);
        let data_checksum_version = c.u32()?;
        let default_char_signedness = layout.char_signedness.then(|| bytes[CHAR_SIGNEDNESS_OFFSET] != 0);
        Ok(ControlFile {
            system_identifier,
            pg_control_version,
            catalog_version_no,
            state,
            time,
            checkpoint,
            checkpoint_copy,
            unlogged_lsn,
            min_recovery_point,
            min_recovery_point_tli,
            backup_start_point,
            backup_end_point,
            backup_end_required,
            wal_level,
            wal_log_hints,
            block_size,
            wal_block_size,
            wal_segment_size,
            data_checksum_version,
            default_char_signedness,
            raw: bytes[..CONTROL_DATA_SIZE].try_into().unwrap(),
        })
    }

    /// Encodes the whole 8 KiB file with a fresh CRC.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; PG_CONTROL_FILE_SIZE];
        out[..CONTROL_DATA_SIZE].copy_from_slice(&self.raw);
        out[0..8].copy_from_slice(&self.system_identifier.to_le_bytes());
        out[8..12].copy_from_slice(&self.pg_control_version.to_le_bytes());
        out[12..16].copy_from_slice(&self.catalog_version_no.to_le_bytes());
        out[16..20].copy_from_slice(&(self.state as u32).to_le_bytes());
        out[24..32].copy_from_slice(&self.time.to_le_bytes());
        out[32..40].copy_from_slice(&self.checkpoint.0.to_le_bytes());
        out[40..128].copy_from_slice(&self.checkpoint_copy.encode());
        out[128..136].copy_from_slice(&self.unlogged_lsn.0.to_le_bytes());
        out[136..144].copy_from_slice(&self.min_recovery_point.0.to_le_bytes());
        out[144..148].copy_from_slice(&self.min_recovery_point_tli.to_le_bytes());
        out[152..160].copy_from_slice(&self.backup_start_point.0.to_le_bytes());
        out[160..168].copy_from_slice(&self.backup_end_point.0.to_le_bytes());
        out[168] = self.backup_end_required as u8;
        out[172..176].copy_from_slice(&self.wal_level.to_le_bytes());
        out[176] = self.wal_log_hints as u8;
        out[216..220].copy_from_slice(&self.block_size.to_le_bytes());
        out[224..228].copy_from_slice(&self.wal_block_size.to_le_bytes());
        out[228..232].copy_from_slice(&self.wal_segment_size.to_le_bytes());
        out[252..256].copy_from_slice(&self.data_checksum_version.to_le_bytes());
        let layout = self.layout();
        if let Some(signed) = self.default_char_signedness {
            debug_assert!(layout.char_signedness, "default_char_signedness in a pg_control before 18");
            out[CHAR_SIGNEDNESS_OFFSET] = signed as u8;
        }
        let crc = crc32c::crc32c(&out[..layout.crc]);
        out[layout.crc..layout.crc + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The PostgreSQL major that wrote the file (checked when decoded).
    pub fn pg_version(&self) -> PgVersion {
        version_of(self.pg_control_version, self.catalog_version_no).expect("checked when decoded")
    }

    fn layout(&self) -> Layout {
        Layout::of(self.pg_control_version).expect("checked when decoded")
    }

    /// The random value PostgreSQL derives fake SCRAM salts from for roles
    /// that do not exist (so that a client cannot tell them apart).
    pub fn mock_authentication_nonce(&self) -> [u8; MOCK_AUTH_NONCE_LEN] {
        let at = self.layout().nonce;
        self.raw[at..at + MOCK_AUTH_NONCE_LEN].try_into().unwrap()
    }

    /// Replaces the mock authentication nonce (each cluster has its own).
    pub fn set_mock_authentication_nonce(&mut self, nonce: [u8; MOCK_AUTH_NONCE_LEN]) {
        let at = self.layout().nonce;
        self.raw[at..at + MOCK_AUTH_NONCE_LEN].copy_from_slice(&nonce);
    }

    /// Points the file at a shutdown checkpoint record at `lsn`: a server
    /// reading it starts there without recovery.
    pub fn set_shutdown_checkpoint(&mut self, lsn: Lsn, checkpoint: CheckPoint) {
        self.state = DbState::Shutdowned;
        self.time = checkpoint.time;
        self.checkpoint = lsn;
        self.checkpoint_copy = checkpoint;
        self.min_recovery_point = Lsn::INVALID;
        self.min_recovery_point_tli = 0;
        self.backup_start_point = Lsn::INVALID;
        self.backup_end_point = Lsn::INVALID;
        self.backup_end_required = false;
    }
}
