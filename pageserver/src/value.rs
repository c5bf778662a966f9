//! Values stored under keys: full images, zero pages, or native records to
//! apply on top of an older image.

use bytes::Bytes;
use strata_redo::NativeRecord;

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// The whole value: a page with pd_lsn stamped, or a serialized directory/file.
    Image(Bytes),
    /// A page that reads as zeros (a truncated or never WAL-logged block).
    ZeroPage,
    /// A change to apply to the previous version.
    Native(NativeRecord),
}

const TAG_IMAGE: u8 = 1;
const TAG_ZERO: u8 = 2;
const TAG_NATIVE: u8 = 3;

impl Value {
    /// Whether this version does not depend on older ones.
    pub fn is_base(&self) -> bool {
        !matches!(self, Value::Native(_))
    }

    /// Approximate memory use, for bounding in-memory layers.
    pub fn size(&self) -> usize {
        match self {
            Value::Image(b) => b.len() + 16,
            Value::ZeroPage => 8,
            Value::Native(NativeRecord::ClearVmBits(v)) => 16 + v.len() * 8,
            Value::Native(NativeRecord::ClogSetStatus { xids, .. }) => 16 + xids.len() * 4,
            Value::Native(NativeRecord::MultiXactOffset { .. }) => 16,
            Value::Native(NativeRecord::MultiXactMembers(v)) => 16 + v.len() * 12,
        }
    }

    /// Serializes: a tag byte, then the image bytes or the native record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Image(b) => {
                out.push(TAG_IMAGE);
                out.extend_from_slice(b);
            }
            Value::ZeroPage => out.push(TAG_ZERO),
            Value::Native(r) => {
                out.push(TAG_NATIVE);
                r.encode(out);
            }
        }
    }

    /// Parses what [`Value::encode`] wrote (bytes from a layer file: untrusted).
    pub fn decode(bytes: &[u8]) -> Result<Value, ValueError> {
        match bytes.split_first() {
            Some((&TAG_IMAGE, rest)) => Ok(Value::Image(Bytes::copy_from_slice(rest))),
            Some((&TAG_ZERO, [])) => Ok(Value::ZeroPage),
            Some((&TAG_ZERO, rest)) => Err(ValueError::TrailingBytes(rest.len())),
            Some((&TAG_NATIVE, rest)) => Ok(Value::Native(NativeRecord::decode(rest)?)),
            Some((tag, _)) => Err(ValueError::UnknownTag(*tag)),
            None => Err(ValueError::Empty),
        }
    }
}

/// A stored value that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("empty value")]
    Empty,
    #[error("unknown value tag {0}")]
    UnknownTag(u8),
    #[error("{0} bytes after a zero-page value")]
    TrailingBytes(usize),
    #[error("native record: {0}")]
    Native(#[from] strata_redo::RedoError),
}
