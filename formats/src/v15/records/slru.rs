//! CLOG and MultiXact resource managers: SLRU page zeroing, truncation and
//! multixact creation.

use crate::types::{Cursor, Oid, TransactionId, Truncated};

pub const CLOG_ZEROPAGE: u8 = 0x00;
pub const CLOG_TRUNCATE: u8 = 0x10;

pub const XLOG_MULTIXACT_ZERO_OFF_PAGE: u8 = 0x00;
pub const XLOG_MULTIXACT_ZERO_MEM_PAGE: u8 = 0x10;
pub const XLOG_MULTIXACT_CREATE_ID: u8 = 0x20;
pub const XLOG_MULTIXACT_TRUNCATE_ID: u8 = 0x30;

/// A CLOG record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ClogRecord {
    ZeroPage { page: i32 },
    Truncate { page: i32, oldest_xid: TransactionId, oldest_xid_db: Oid },
}

/// Decodes a CLOG record's main data.
pub fn parse_clog(info: u8, data: &[u8]) -> Result<Option<ClogRecord>, Truncated> {
    let mut c = Cursor::new(data);
    Ok(match info & 0xF0 {
        CLOG_ZEROPAGE => Some(ClogRecord::ZeroPage { page: c.i32()? }),
        CLOG_TRUNCATE => Some(ClogRecord::Truncate { page: c.i32()?, oldest_xid: c.u32()?, oldest_xid_db: c.u32()? }),
        _ => None,
    })
}

/// One member of a multixact: a transaction and its lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MultiXactMember {
    pub xid: TransactionId,
    pub status: u32,
}

/// A MultiXact record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum MultiXactRecord {
    ZeroOffsetsPage { page: i32 },
    ZeroMembersPage { page: i32 },
    Create { multi: u32, offset: u32, members: Vec<MultiXactMember> },
    Truncate { oldest_multi_db: Oid, start_offsets: u32, end_offsets: u32, start_members: u32, end_members: u32 },
}

/// Decodes a MultiXact record's main data.
pub fn parse_multixact(info: u8, data: &[u8]) -> Result<Option<MultiXactRecord>, Truncated> {
    let mut c = Cursor::new(data);
    Ok(match info & 0xF0 {
        XLOG_MULTIXACT_ZERO_OFF_PAGE => Some(MultiXactRecord::ZeroOffsetsPage { page: c.i32()? }),
        XLOG_MULTIXACT_ZERO_MEM_PAGE => Some(MultiXactRecord::ZeroMembersPage { page: c.i32()? }),
        XLOG_MULTIXACT_CREATE_ID => {
            let multi = c.u32()?;
            let offset = c.u32()?;
            let n = c.count(8)?;
            let members = (0..n)
                .map(|_| Ok(MultiXactMember { xid: c.u32()?, status: c.u32()? }))
                .collect::<Result<_, Truncated>>()?;
            Some(MultiXactRecord::Create { multi, offset, members })
        }
        XLOG_MULTIXACT_TRUNCATE_ID => Some(MultiXactRecord::Truncate {
            oldest_multi_db: c.u32()?,
            start_offsets: c.u32()?,
            end_offsets: c.u32()?,
            start_members: c.u32()?,
            end_members: c.u32()?,
        }),
        _ => None,
    })
}
