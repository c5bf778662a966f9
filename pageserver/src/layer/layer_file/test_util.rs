//! Keys, values and files the layer file tests share.

use bytes::Bytes;
use std::path::{Path, PathBuf};

use strata_formats::Lsn;

use super::name::LayerName;
use super::writer::LayerFileWriter;
use crate::key::Key;
use crate::value::Value;

/// Block `n` of one relation.
pub(super) fn key(n: u32) -> Key {
    Key { kind: 0, field1: 1663, field2: 5, field3: 16384, field4: 0, field5: n }
}

/// Writes `versions` (in order) as a delta layer in `dir`; returns its path.
pub(super) fn write(dir: &Path, versions: &[(Key, Lsn, Value)]) -> PathBuf {
    let name = LayerName::delta(
        versions.iter().map(|v| v.0).min().unwrap(),
        versions.iter().map(|v| v.0).max().unwrap().next(),
        Lsn(0x100),
        Lsn(0x10000),
    );
    let mut w = LayerFileWriter::new(dir, name).unwrap();
    for (k, l, v) in versions {
        w.put(k, *l, v).unwrap();
    }
    w.finish(false).unwrap()
}

/// A page image of one repeated byte.
pub(super) fn page(fill: u8) -> Value {
    Value::Image(Bytes::from(vec![fill; 8192]))
}
