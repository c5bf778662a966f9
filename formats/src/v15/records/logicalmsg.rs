//! Logical decoding messages (`pg_logical_emit_message`): the record the
//! agent carries free space map pages in (`docs/free-space-maps.md`).

use crate::types::{Cursor, Oid, Truncated};

/// `XLOG_LOGICAL_MESSAGE`, the resource manager's only record.
pub const XLOG_LOGICAL_MESSAGE: u8 = 0x00;

/// A message as PostgreSQL 15 to 18 log it (`xl_logical_message`: the
/// database, the flag, two 64-bit sizes after padding, then the prefix
/// with its terminating zero and the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalMessage {
    pub db: Oid,
    pub transactional: bool,
    /// Without its terminating zero.
    pub prefix: Vec<u8>,
    pub message: Vec<u8>,
}

/// Decodes the main data of a logical message record; `None` for another
/// record type of the resource manager.
pub fn parse(info: u8, data: &[u8]) -> Result<Option<LogicalMessage>, MessageError> {
    if info & 0xF0 != XLOG_LOGICAL_MESSAGE {
        return Ok(None);
    }
    let mut c = Cursor::new(data);
    let db = c.u32()?;
    let transactional = c.u8()? != 0;
    c.align(8)?;
    let prefix_size = c.u64()?;
    let message_size = c.u64()?;
    if prefix_size == 0 || prefix_size > c.remaining() as u64 || message_size != (c.remaining() as u64 - prefix_size) {
        return Err(MessageError::Sizes { prefix_size, message_size, left: c.remaining() });
    }
    let with_nul = c.take(prefix_size as usize)?;
    let Some((0, prefix)) = with_nul.split_last() else {
        return Err(MessageError::Prefix);
    };
    let message = c.take(message_size as usize)?;
    Ok(Some(LogicalMessage { db, transactional, prefix: prefix.to_vec(), message: message.to_vec() }))
}

/// A logical message record whose main data does not hold together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error(transparent)]
    Truncated(#[from] Truncated),
    #[error("prefix of {prefix_size} bytes and message of {message_size} in {left} bytes")]
    Sizes { prefix_size: u64, message_size: u64, left: usize },
    #[error("the prefix does not end with a zero byte")]
    Prefix,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pg_logical_emit_message(false, 'strata.fsm', '\x0102')` in database 5.
    pub fn vector() -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&5u32.to_le_bytes());
        d.extend_from_slice(&[0, 0, 0, 0]);
        d.extend_from_slice(&11u64.to_le_bytes());
        d.extend_from_slice(&2u64.to_le_bytes());
        d.extend_from_slice(b"strata.fsm\0\x01\x02");
        d
    }

    #[test]
    fn a_message_decodes() {
        let m = parse(0, &vector()).unwrap().unwrap();
        assert_eq!(
            m,
            LogicalMessage { db: 5, transactional: false, prefix: b"strata.fsm".to_vec(), message: vec![1, 2] }
        );
        assert_eq!(parse(0x10, &vector()), Ok(None));
    }

    #[test]
    fn inconsistent_sizes_are_errors() {
        let v = vector();
        for cut in 0..v.len() {
            assert!(parse(0, &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = v.clone();
        long.push(9);
        assert!(matches!(parse(0, &long), Err(MessageError::Sizes { .. })));
        let mut no_nul = v.clone();
        no_nul[34] = b'x';
        assert_eq!(parse(0, &no_nul), Err(MessageError::Prefix));
        let mut huge = v;
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(parse(0, &huge), Err(MessageError::Sizes { .. })));
    }
}
