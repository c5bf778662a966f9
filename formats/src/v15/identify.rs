//! Record type names of WAL records, as each version's pg_waldump prints
//! them (each resource manager's `rm_identify`). From 15 to 18 only two
//! resource managers name records differently: 17 merged heap2's prune,
//! vacuum and freeze records and added XLOG's `CHECKPOINT_REDO`.

use crate::version::PgVersion;

/// Low bits of `xl_info` reserved for the WAL machinery itself.
const XLR_INFO_MASK: u8 = 0x0F;

/// The record type name `version`'s pg_waldump prints for this record
/// (`rm_identify`), or None where PostgreSQL returns NULL.
///
/// Each resource manager masks `xl_info` its own way: most drop only the
/// low four bits, so a record whose operation carries a flag in the high bit
/// (such as heap's "init page") names a separate `+INIT` variant, while the
/// transaction manager keeps only its three operation bits, and CommitTs and
/// ReplicationOrigin compare the whole byte. Custom resource managers (ids
/// 128 and up) and unassigned ids give None.
pub fn identify(version: PgVersion, rmgr: u8, xl_info: u8) -> Option<&'static str> {
    let info = xl_info & !XLR_INFO_MASK;
    match rmgr {
        0 => xlog(version, info),
        1 => xact(xl_info),
        2 => smgr(info),
        3 => clog(info),
        4 => dbase(info),
        5 => tblspc(info),
        6 => multixact(info),
        7 => relmap(info),
        8 => standby(info),
        9 => heap2(version, info),
        10 => heap(info),
        11 => btree(info),
        12 => hash(info),
        13 => gin(info),
        14 => gist(info),
        15 => seq(info),
        16 => spgist(info),
        17 => brin(info),
        18 => commit_ts(xl_info),
        19 => replorigin(xl_info),
        20 => Some("Generic"),
        21 => logicalmsg(info),
        _ => None,
    }
}

fn xlog(version: PgVersion, info: u8) -> Option<&'static str> {
    Some(match info {
        0xE0 if version >= PgVersion::V17 => "CHECKPOINT_REDO",
        0x00 => "CHECKPOINT_SHUTDOWN",
        0x10 => "CHECKPOINT_ONLINE",
        0x20 => "NOOP",
        0x30 => "NEXTOID",
        0x40 => "SWITCH",
        0x50 => "BACKUP_END",
        0x60 => "PARAMETER_CHANGE",
        0x70 => "RESTORE_POINT",
        0x80 => "FPW_CHANGE",
        0x90 => "END_OF_RECOVERY",
        0xA0 => "FPI_FOR_HINT",
        0xB0 => "FPI",
        0xD0 => "OVERWRITE_CONTRECORD",
        _ => return None,
    })
}

/// Takes the full `xl_info`: only the operation bits (0x70) are compared,
/// so the "has info" flag (0x80) and the low bits are ignored.
fn xact(xl_info: u8) -> Option<&'static str> {
    Some(match xl_info & 0x70 {
        0x00 => "COMMIT",
        0x10 => "PREPARE",
        0x20 => "ABORT",
        0x30 => "COMMIT_PREPARED",
        0x40 => "ABORT_PREPARED",
        0x50 => "ASSIGNMENT",
        0x60 => "INVALIDATION",
        _ => return None,
    })
}

fn smgr(info: u8) -> Option<&'static str> {
    Some(match info {
        0x10 => "CREATE",
        0x20 => "TRUNCATE",
        _ => return None,
    })
}

fn clog(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "ZEROPAGE",
        0x10 => "TRUNCATE",
        _ => return None,
    })
}

fn dbase(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "CREATE_FILE_COPY",
        0x10 => "CREATE_WAL_LOG",
        0x20 => "DROP",
        _ => return None,
    })
}

fn tblspc(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "CREATE",
        0x10 => "DROP",
        _ => return None,
    })
}

fn multixact(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "ZERO_OFF_PAGE",
        0x10 => "ZERO_MEM_PAGE",
        0x20 => "CREATE_ID",
        0x30 => "TRUNCATE_ID",
        _ => return None,
    })
}

fn relmap(info: u8) -> Option<&'static str> {
    match info {
        0x00 => Some("UPDATE"),
        _ => None,
    }
}

fn standby(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "LOCK",
        0x10 => "RUNNING_XACTS",
        0x20 => "INVALIDATIONS",
        _ => return None,
    })
}

/// Only `MULTI_INSERT` has an `+INIT` variant; any other operation with the
/// init-page bit set is unnamed.
fn heap2(version: PgVersion, info: u8) -> Option<&'static str> {
    if version.merged_prune_records() {
        match info {
            0x10 => return Some("PRUNE_ON_ACCESS"),
            0x20 => return Some("PRUNE_VACUUM_SCAN"),
            0x30 => return Some("PRUNE_VACUUM_CLEANUP"),
            _ => {}
        }
    }
    Some(match info {
        0x00 => "REWRITE",
        0x10 => "PRUNE",
        0x20 => "VACUUM",
        0x30 => "FREEZE_PAGE",
        0x40 => "VISIBLE",
        0x50 => "MULTI_INSERT",
        0xD0 => "MULTI_INSERT+INIT",
        0x60 => "LOCK_UPDATED",
        0x70 => "NEW_CID",
        _ => return None,
    })
}

/// `INSERT`, `UPDATE` and `HOT_UPDATE` have `+INIT` variants; any other operation
/// with the init-page bit set is unnamed.
fn heap(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "INSERT",
        0x80 => "INSERT+INIT",
        0x10 => "DELETE",
        0x20 => "UPDATE",
        0xA0 => "UPDATE+INIT",
        0x30 => "TRUNCATE",
        0x40 => "HOT_UPDATE",
        0xC0 => "HOT_UPDATE+INIT",
        0x50 => "HEAP_CONFIRM",
        0x60 => "LOCK",
        0x70 => "INPLACE",
        _ => return None,
    })
}

fn btree(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "INSERT_LEAF",
        0x10 => "INSERT_UPPER",
        0x20 => "INSERT_META",
        0x30 => "SPLIT_L",
        0x40 => "SPLIT_R",
        0x50 => "INSERT_POST",
        0x60 => "DEDUP",
        0x70 => "DELETE",
        0x80 => "UNLINK_PAGE",
        0x90 => "UNLINK_PAGE_META",
        0xA0 => "NEWROOT",
        0xB0 => "MARK_PAGE_HALFDEAD",
        0xC0 => "VACUUM",
        0xD0 => "REUSE_PAGE",
        0xE0 => "META_CLEANUP",
        _ => return None,
    })
}

fn hash(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "INIT_META_PAGE",
        0x10 => "INIT_BITMAP_PAGE",
        0x20 => "INSERT",
        0x30 => "ADD_OVFL_PAGE",
        0x40 => "SPLIT_ALLOCATE_PAGE",
        0x50 => "SPLIT_PAGE",
        0x60 => "SPLIT_COMPLETE",
        0x70 => "MOVE_PAGE_CONTENTS",
        0x80 => "SQUEEZE_PAGE",
        0x90 => "DELETE",
        0xA0 => "SPLIT_CLEANUP",
        0xB0 => "UPDATE_META_PAGE",
        0xC0 => "VACUUM_ONE_PAGE",
        _ => return None,
    })
}

fn gin(info: u8) -> Option<&'static str> {
    Some(match info {
        0x10 => "CREATE_PTREE",
        0x20 => "INSERT",
        0x30 => "SPLIT",
        0x40 => "VACUUM_PAGE",
        0x50 => "DELETE_PAGE",
        0x60 => "UPDATE_META_PAGE",
        0x70 => "INSERT_LISTPAGE",
        0x80 => "DELETE_LISTPAGE",
        0x90 => "VACUUM_DATA_LEAF_PAGE",
        _ => return None,
    })
}

fn gist(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "PAGE_UPDATE",
        0x10 => "DELETE",
        0x20 => "PAGE_REUSE",
        0x30 => "PAGE_SPLIT",
        0x60 => "PAGE_DELETE",
        0x70 => "ASSIGN_LSN",
        _ => return None,
    })
}

fn seq(info: u8) -> Option<&'static str> {
    match info {
        0x00 => Some("LOG"),
        _ => None,
    }
}

fn spgist(info: u8) -> Option<&'static str> {
    Some(match info {
        0x10 => "ADD_LEAF",
        0x20 => "MOVE_LEAFS",
        0x30 => "ADD_NODE",
        0x40 => "SPLIT_TUPLE",
        0x50 => "PICKSPLIT",
        0x60 => "VACUUM_LEAF",
        0x70 => "VACUUM_ROOT",
        0x80 => "VACUUM_REDIRECT",
        _ => return None,
    })
}

/// `INSERT` and `UPDATE` have `+INIT` variants (init-page bit 0x80).
fn brin(info: u8) -> Option<&'static str> {
    Some(match info {
        0x00 => "CREATE_INDEX",
        0x10 => "INSERT",
        0x90 => "INSERT+INIT",
        0x20 => "UPDATE",
        0xA0 => "UPDATE+INIT",
        0x30 => "SAMEPAGE_UPDATE",
        0x40 => "REVMAP_EXTEND",
        0x50 => "DESUMMARIZE",
        _ => return None,
    })
}

/// Compares the unmasked `xl_info`, so any low bit set gives None.
fn commit_ts(xl_info: u8) -> Option<&'static str> {
    Some(match xl_info {
        0x00 => "ZEROPAGE",
        0x10 => "TRUNCATE",
        _ => return None,
    })
}

/// Compares the unmasked `xl_info`, so any low bit set gives None.
fn replorigin(xl_info: u8) -> Option<&'static str> {
    Some(match xl_info {
        0x00 => "SET",
        0x10 => "DROP",
        _ => return None,
    })
}

fn logicalmsg(info: u8) -> Option<&'static str> {
    match info {
        0x00 => Some("MESSAGE"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::identify;
    use crate::version::PgVersion::{self, V15, V17, V18};

    #[test]
    fn xlog() {
        assert_eq!(identify(V15, 0, 0x00), Some("CHECKPOINT_SHUTDOWN"));
        assert_eq!(identify(V15, 0, 0x10), Some("CHECKPOINT_ONLINE"));
        assert_eq!(identify(V15, 0, 0x40), Some("SWITCH"));
        assert_eq!(identify(V15, 0, 0xA0), Some("FPI_FOR_HINT"));
        assert_eq!(identify(V15, 0, 0xB0), Some("FPI"));
        // Low bits (e.g. XLR_SPECIAL_REL_UPDATE 0x01) are masked off.
        assert_eq!(identify(V15, 0, 0xB1), Some("FPI"));
        assert_eq!(identify(V15, 0, 0xD0), Some("OVERWRITE_CONTRECORD"));
        // 0xC0 is no longer used; 0xE0/0xF0 never were.
        assert_eq!(identify(V15, 0, 0xC0), None);
        assert_eq!(identify(V15, 0, 0xE0), None);
        assert_eq!(identify(V15, 0, 0xF0), None);
    }

    #[test]
    fn xact() {
        assert_eq!(identify(V15, 1, 0x00), Some("COMMIT"));
        assert_eq!(identify(V15, 1, 0x80), Some("COMMIT"));
        assert_eq!(identify(V15, 1, 0x10), Some("PREPARE"));
        assert_eq!(identify(V15, 1, 0xA0), Some("ABORT"));
        assert_eq!(identify(V15, 1, 0x30), Some("COMMIT_PREPARED"));
        assert_eq!(identify(V15, 1, 0xC0), Some("ABORT_PREPARED"));
        assert_eq!(identify(V15, 1, 0x50), Some("ASSIGNMENT"));
        assert_eq!(identify(V15, 1, 0x60), Some("INVALIDATION"));
        assert_eq!(identify(V15, 1, 0x70), None);
        assert_eq!(identify(V15, 1, 0xF0), None);
    }

    #[test]
    fn small_managers() {
        assert_eq!(identify(V15, 2, 0x00), None);
        assert_eq!(identify(V15, 2, 0x10), Some("CREATE"));
        assert_eq!(identify(V15, 2, 0x20), Some("TRUNCATE"));
        assert_eq!(identify(V15, 3, 0x00), Some("ZEROPAGE"));
        assert_eq!(identify(V15, 3, 0x10), Some("TRUNCATE"));
        assert_eq!(identify(V15, 3, 0x20), None);
        assert_eq!(identify(V15, 4, 0x00), Some("CREATE_FILE_COPY"));
        assert_eq!(identify(V15, 4, 0x10), Some("CREATE_WAL_LOG"));
        assert_eq!(identify(V15, 4, 0x20), Some("DROP"));
        assert_eq!(identify(V15, 4, 0x30), None);
        assert_eq!(identify(V15, 5, 0x00), Some("CREATE"));
        assert_eq!(identify(V15, 5, 0x10), Some("DROP"));
        assert_eq!(identify(V15, 6, 0x00), Some("ZERO_OFF_PAGE"));
        assert_eq!(identify(V15, 6, 0x30), Some("TRUNCATE_ID"));
        assert_eq!(identify(V15, 6, 0x40), None);
        assert_eq!(identify(V15, 7, 0x00), Some("UPDATE"));
        assert_eq!(identify(V15, 7, 0x10), None);
        assert_eq!(identify(V15, 8, 0x00), Some("LOCK"));
        assert_eq!(identify(V15, 8, 0x10), Some("RUNNING_XACTS"));
        assert_eq!(identify(V15, 8, 0x20), Some("INVALIDATIONS"));
        assert_eq!(identify(V15, 8, 0x30), None);
        assert_eq!(identify(V15, 15, 0x00), Some("LOG"));
        assert_eq!(identify(V15, 15, 0x10), None);
    }

    #[test]
    fn heap_and_heap2() {
        assert_eq!(identify(V15, 10, 0x00), Some("INSERT"));
        assert_eq!(identify(V15, 10, 0x80), Some("INSERT+INIT"));
        assert_eq!(identify(V15, 10, 0x10), Some("DELETE"));
        assert_eq!(identify(V15, 10, 0x90), None);
        assert_eq!(identify(V15, 10, 0x20), Some("UPDATE"));
        assert_eq!(identify(V15, 10, 0xA0), Some("UPDATE+INIT"));
        assert_eq!(identify(V15, 10, 0x30), Some("TRUNCATE"));
        assert_eq!(identify(V15, 10, 0x40), Some("HOT_UPDATE"));
        assert_eq!(identify(V15, 10, 0xC0), Some("HOT_UPDATE+INIT"));
        assert_eq!(identify(V15, 10, 0x50), Some("HEAP_CONFIRM"));
        assert_eq!(identify(V15, 10, 0x60), Some("LOCK"));
        assert_eq!(identify(V15, 10, 0x70), Some("INPLACE"));
        assert_eq!(identify(V15, 10, 0xF0), None);
        assert_eq!(identify(V15, 10, 0x81), Some("INSERT+INIT"));

        assert_eq!(identify(V15, 9, 0x00), Some("REWRITE"));
        assert_eq!(identify(V15, 9, 0x10), Some("PRUNE"));
        assert_eq!(identify(V15, 9, 0x20), Some("VACUUM"));
        assert_eq!(identify(V15, 9, 0x30), Some("FREEZE_PAGE"));
        assert_eq!(identify(V15, 9, 0x40), Some("VISIBLE"));
        assert_eq!(identify(V15, 9, 0x50), Some("MULTI_INSERT"));
        assert_eq!(identify(V15, 9, 0xD0), Some("MULTI_INSERT+INIT"));
        assert_eq!(identify(V15, 9, 0x60), Some("LOCK_UPDATED"));
        assert_eq!(identify(V15, 9, 0x70), Some("NEW_CID"));
        assert_eq!(identify(V15, 9, 0x80), None);
    }

    #[test]
    fn indexes() {
        assert_eq!(identify(V15, 11, 0x00), Some("INSERT_LEAF"));
        assert_eq!(identify(V15, 11, 0x30), Some("SPLIT_L"));
        assert_eq!(identify(V15, 11, 0x60), Some("DEDUP"));
        assert_eq!(identify(V15, 11, 0xB0), Some("MARK_PAGE_HALFDEAD"));
        assert_eq!(identify(V15, 11, 0xC0), Some("VACUUM"));
        assert_eq!(identify(V15, 11, 0xE0), Some("META_CLEANUP"));
        assert_eq!(identify(V15, 11, 0xF0), None);

        assert_eq!(identify(V15, 12, 0x00), Some("INIT_META_PAGE"));
        assert_eq!(identify(V15, 12, 0x90), Some("DELETE"));
        assert_eq!(identify(V15, 12, 0xC0), Some("VACUUM_ONE_PAGE"));
        assert_eq!(identify(V15, 12, 0xD0), None);

        assert_eq!(identify(V15, 13, 0x00), None);
        assert_eq!(identify(V15, 13, 0x10), Some("CREATE_PTREE"));
        assert_eq!(identify(V15, 13, 0x40), Some("VACUUM_PAGE"));
        assert_eq!(identify(V15, 13, 0x90), Some("VACUUM_DATA_LEAF_PAGE"));
        assert_eq!(identify(V15, 13, 0xA0), None);

        assert_eq!(identify(V15, 14, 0x00), Some("PAGE_UPDATE"));
        assert_eq!(identify(V15, 14, 0x30), Some("PAGE_SPLIT"));
        assert_eq!(identify(V15, 14, 0x40), None);
        assert_eq!(identify(V15, 14, 0x50), None);
        assert_eq!(identify(V15, 14, 0x60), Some("PAGE_DELETE"));
        assert_eq!(identify(V15, 14, 0x70), Some("ASSIGN_LSN"));

        assert_eq!(identify(V15, 16, 0x00), None);
        assert_eq!(identify(V15, 16, 0x10), Some("ADD_LEAF"));
        assert_eq!(identify(V15, 16, 0x50), Some("PICKSPLIT"));
        assert_eq!(identify(V15, 16, 0x80), Some("VACUUM_REDIRECT"));
        assert_eq!(identify(V15, 16, 0x90), None);

        assert_eq!(identify(V15, 17, 0x00), Some("CREATE_INDEX"));
        assert_eq!(identify(V15, 17, 0x10), Some("INSERT"));
        assert_eq!(identify(V15, 17, 0x90), Some("INSERT+INIT"));
        assert_eq!(identify(V15, 17, 0xA0), Some("UPDATE+INIT"));
        assert_eq!(identify(V15, 17, 0x30), Some("SAMEPAGE_UPDATE"));
        assert_eq!(identify(V15, 17, 0x50), Some("DESUMMARIZE"));
        assert_eq!(identify(V15, 17, 0x80), None);
    }

    #[test]
    fn unmasked_managers() {
        assert_eq!(identify(V15, 18, 0x00), Some("ZEROPAGE"));
        assert_eq!(identify(V15, 18, 0x10), Some("TRUNCATE"));
        assert_eq!(identify(V15, 18, 0x01), None);
        assert_eq!(identify(V15, 19, 0x00), Some("SET"));
        assert_eq!(identify(V15, 19, 0x10), Some("DROP"));
        assert_eq!(identify(V15, 19, 0x11), None);
    }

    #[test]
    fn generic_and_logical_message() {
        assert_eq!(identify(V15, 20, 0x00), Some("Generic"));
        assert_eq!(identify(V15, 20, 0xFF), Some("Generic"));
        assert_eq!(identify(V15, 21, 0x00), Some("MESSAGE"));
        assert_eq!(identify(V15, 21, 0x01), Some("MESSAGE"));
        assert_eq!(identify(V15, 21, 0x10), None);
    }

    #[test]
    fn unknown_managers() {
        assert_eq!(identify(V15, 22, 0x00), None);
        assert_eq!(identify(V15, 127, 0x00), None);
        assert_eq!(identify(V15, 128, 0x00), None);
        assert_eq!(identify(V15, 255, 0x00), None);
    }

    #[test]
    fn versions_from_17_name_the_merged_prune_records_and_the_redo_checkpoint() {
        for v in [V17, V18] {
            assert_eq!(identify(v, 9, 0x10), Some("PRUNE_ON_ACCESS"));
            assert_eq!(identify(v, 9, 0x20), Some("PRUNE_VACUUM_SCAN"));
            assert_eq!(identify(v, 9, 0x30), Some("PRUNE_VACUUM_CLEANUP"));
            assert_eq!(identify(v, 9, 0x40), Some("VISIBLE"));
            assert_eq!(identify(v, 0, 0xE0), Some("CHECKPOINT_REDO"));
        }
        for v in [V15, PgVersion::V16] {
            assert_eq!(identify(v, 9, 0x10), Some("PRUNE"));
            assert_eq!(identify(v, 0, 0xE0), None);
        }
    }
}
