//! PostgreSQL 15 resource manager ids and names, and the `xl_info` values
//! the rest of Strata matches on.

pub const RM_XLOG_ID: u8 = 0;
pub const RM_XACT_ID: u8 = 1;
pub const RM_SMGR_ID: u8 = 2;
pub const RM_CLOG_ID: u8 = 3;
pub const RM_DBASE_ID: u8 = 4;
pub const RM_TBLSPC_ID: u8 = 5;
pub const RM_MULTIXACT_ID: u8 = 6;
pub const RM_RELMAP_ID: u8 = 7;
pub const RM_STANDBY_ID: u8 = 8;
pub const RM_HEAP2_ID: u8 = 9;
pub const RM_HEAP_ID: u8 = 10;
pub const RM_BTREE_ID: u8 = 11;
pub const RM_HASH_ID: u8 = 12;
pub const RM_GIN_ID: u8 = 13;
pub const RM_GIST_ID: u8 = 14;
pub const RM_SEQ_ID: u8 = 15;
pub const RM_SPGIST_ID: u8 = 16;
pub const RM_BRIN_ID: u8 = 17;
pub const RM_COMMIT_TS_ID: u8 = 18;
pub const RM_REPLORIGIN_ID: u8 = 19;
pub const RM_GENERIC_ID: u8 = 20;
pub const RM_LOGICALMSG_ID: u8 = 21;
/// Highest built-in id.
pub const RM_MAX_BUILTIN_ID: u8 = RM_LOGICALMSG_ID;
/// Ids from here up belong to extensions' custom resource managers.
pub const RM_MIN_CUSTOM_ID: u8 = 128;

/// Names as pg_waldump prints them, indexed by id.
const NAMES: [&str; RM_MAX_BUILTIN_ID as usize + 1] = [
    "XLOG",
    "Transaction",
    "Storage",
    "CLOG",
    "Database",
    "Tablespace",
    "MultiXact",
    "RelMap",
    "Standby",
    "Heap2",
    "Heap",
    "Btree",
    "Hash",
    "Gin",
    "Gist",
    "Sequence",
    "SPGist",
    "BRIN",
    "CommitTs",
    "ReplicationOrigin",
    "Generic",
    "LogicalMessage",
];

/// Whether a record may carry this rmgr id (built-in or custom range).
pub fn is_valid(rmgr: u8) -> bool {
    rmgr <= RM_MAX_BUILTIN_ID || rmgr >= RM_MIN_CUSTOM_ID
}

/// The rmgr's name as pg_waldump prints it (`custom###` for custom ones).
pub fn name(rmgr: u8) -> std::borrow::Cow<'static, str> {
    match NAMES.get(rmgr as usize) {
        Some(name) => (*name).into(),
        None => format!("custom{rmgr:03}").into(),
    }
}

/// The rmgr id with the given name, if built in.
pub fn by_name(name: &str) -> Option<u8> {
    NAMES.iter().position(|n| *n == name).map(|i| i as u8)
}

// XLOG record types (high nibble of xl_info).
pub const XLOG_CHECKPOINT_SHUTDOWN: u8 = 0x00;
pub const XLOG_CHECKPOINT_ONLINE: u8 = 0x10;
pub const XLOG_NOOP: u8 = 0x20;
pub const XLOG_NEXTOID: u8 = 0x30;
pub const XLOG_SWITCH: u8 = 0x40;
pub const XLOG_BACKUP_END: u8 = 0x50;
pub const XLOG_PARAMETER_CHANGE: u8 = 0x60;
pub const XLOG_RESTORE_POINT: u8 = 0x70;
pub const XLOG_FPW_CHANGE: u8 = 0x80;
pub const XLOG_END_OF_RECOVERY: u8 = 0x90;
pub const XLOG_FPI_FOR_HINT: u8 = 0xA0;
pub const XLOG_FPI: u8 = 0xB0;
pub const XLOG_OVERWRITE_CONTRECORD: u8 = 0xD0;

/// Names of the resource managers that `wal_consistency_checking` accepts:
/// the ones with a page-masking function.
pub const CONSISTENCY_CHECKABLE: [&str; 10] =
    ["heap", "heap2", "btree", "hash", "gin", "gist", "sequence", "spgist", "brin", "generic"];
