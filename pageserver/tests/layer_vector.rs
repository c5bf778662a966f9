//! The layer file format, delta and image, against committed vectors: the
//! bytes written (version 2) for a fixed set of versions must not change,
//! and each vector — version 1 ones too, which this build still reads —
//! must read back as those versions. Regenerate the version 2 vectors (only
//! on a format change, with a version bump) with `STRATA_WRITE_VECTORS=1`.

use std::path::Path;

use bytes::Bytes;
use strata_formats::Lsn;
use strata_pageserver::key::Key;
use strata_pageserver::layer::layer_file::{LayerFile, LayerFileWriter, LayerName};
use strata_pageserver::layer::Versions;
use strata_pageserver::value::Value;
use strata_redo::NativeRecord;

fn key(block: u32) -> Key {
    Key { kind: 0, field1: 1663, field2: 5, field3: 16384, field4: 0, field5: block }
}

fn versions() -> Vec<(Key, Lsn, Value)> {
    vec![
        (key(0), Lsn(0x0100_0028), Value::Image(Bytes::from_static(b"small image"))),
        (key(0), Lsn(0x0100_0060), Value::Native(NativeRecord::ClearVmBits(vec![(7, 3)]))),
        (key(1), Lsn(0x0100_0028), Value::ZeroPage),
        (key(2), Lsn(0x0100_0060), Value::Native(NativeRecord::ClogSetStatus { xids: vec![900, 901], status: 1 })),
    ]
}

/// Writes `versions` as the layer `name`; returns the file's bytes.
fn written(tag: &str, name: LayerName, versions: &[(Key, Lsn, Value)]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("strata-layer-vector-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = LayerFileWriter::new(&dir, name).unwrap();
    for (k, l, v) in versions {
        w.put(k, *l, v).unwrap();
    }
    let bytes = std::fs::read(w.finish(false).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    bytes
}

/// The committed vector `file`, (re)written from `bytes` when asked to,
/// and compared byte for byte.
fn vector(file: &str, bytes: &[u8]) -> Vec<u8> {
    let path = strata_test_support::paths::in_crate("tests/data").join(file);
    if std::env::var_os("STRATA_WRITE_VECTORS").is_some() {
        std::fs::write(&path, bytes).unwrap();
    }
    let expected = std::fs::read(&path).unwrap();
    assert_eq!(bytes, expected, "the writer no longer produces {file} byte for byte");
    expected
}

/// A committed layer vector written by an earlier build, checked to be of
/// format `version`.
fn committed_layer(file: &str, version: u32) -> Vec<u8> {
    let bytes = std::fs::read(strata_test_support::paths::in_crate("tests/data").join(file)).unwrap();
    assert_eq!(&bytes[8..12], &version.to_le_bytes(), "{file}: format version");
    bytes
}

fn delta_name() -> LayerName {
    LayerName::delta(key(0), key(3), Lsn(0x0100_0028), Lsn(0x0100_0061))
}

/// What the delta vectors must read back as.
fn check_delta(file: &str, bytes: Vec<u8>) {
    let layer = LayerFile::from_bytes(Path::new(file), bytes).unwrap();
    assert_eq!(layer.name, delta_name());
    assert_eq!(layer.name.to_string(), "000000067F00000005000040000000000000-000000067F00000005000040000000000003__0000000001000028-0000000001000061.delta");
    let mut out = Versions::default();
    assert!(layer.collect(&key(0), Lsn(0x0100_0060), &mut out).unwrap());
    assert_eq!(out.list.len(), 2);
    assert_eq!(out.list[1].1, Value::Image(Bytes::from_static(b"small image")));
    let mut out = Versions::default();
    assert!(!layer.collect(&key(2), Lsn(0x0100_0060), &mut out).unwrap(), "a native record alone is not complete");
    assert_eq!(out.list[0].1, versions()[3].2);
    let scanned: Vec<(Key, Lsn, Value)> =
        layer.scan().map(|v| v.unwrap()).map(|v| (v.key, v.lsn, layer.decode_raw(&v).unwrap())).collect();
    assert_eq!(scanned, versions());
}

#[test]
fn delta_layer_v2_vector() {
    // Small values grouped (a delta layer's writer groups values under
    // 2 KiB; readers of version 2 always read groups).
    let bytes = vector("layer-v2-grouped.delta", &written("delta", delta_name(), &versions()));
    assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
    check_delta("layer-v2-grouped.delta", bytes);
}

#[test]
fn delta_layer_v2_vector_of_values_alone_still_reads() {
    // Written before delta layers grouped their small values.
    check_delta("layer-v2.delta", committed_layer("layer-v2.delta", 2));
}

#[test]
fn delta_layer_v1_vector_still_reads() {
    check_delta("layer-v1.delta", committed_layer("layer-v1.delta", 1));
}

const IMAGE_AT: Lsn = Lsn(0x0100_0060);

fn image_page() -> Value {
    Value::Image(Bytes::from(vec![0x5A; 8192]))
}

/// The image vectors' versions: key 2 has no value at this LSN, so the
/// image layer does not hold it.
fn image_versions() -> Vec<(Key, Lsn, Value)> {
    vec![
        (key(0), IMAGE_AT, Value::Image(Bytes::from_static(b"small image"))),
        (key(1), IMAGE_AT, Value::ZeroPage),
        (key(3), IMAGE_AT, image_page()),
    ]
}

/// What the image vectors must read back as.
fn check_image(file: &str, bytes: Vec<u8>) {
    assert_eq!(&bytes[..8], b"STRIMAGE");
    assert_eq!(&bytes[bytes.len() - 8..], b"STRIMEND");
    let name = LayerName::image(key(0), key(4), IMAGE_AT);
    let layer = LayerFile::from_bytes(Path::new(file), bytes).unwrap();
    assert_eq!(layer.name, name);
    assert_eq!(
        name.to_string(),
        "000000067F00000005000040000000000000-000000067F00000005000040000000000004__0000000001000060.image"
    );
    assert_eq!(name.to_string().parse::<LayerName>().unwrap(), name);
    for (k, _, value) in image_versions() {
        let mut out = Versions::default();
        assert!(layer.collect(&k, Lsn(0x0200_0000), &mut out).unwrap());
        assert_eq!(out.list, vec![(IMAGE_AT, value)]);
    }
    // A key of the range that it lacks had no value: the search ends empty.
    let mut out = Versions::default();
    assert!(layer.collect(&key(2), IMAGE_AT, &mut out).unwrap());
    assert!(out.list.is_empty() && out.complete());
    // Outside its key range, or before its LSN, it says nothing.
    for (k, l) in [(key(4), IMAGE_AT), (key(0), Lsn(IMAGE_AT.0 - 1))] {
        let mut out = Versions::default();
        assert!(!layer.collect(&k, l, &mut out).unwrap());
        assert!(out.list.is_empty() && !out.complete());
    }
    let scanned: Vec<(Key, Lsn, Value)> =
        layer.scan().map(|v| v.unwrap()).map(|v| (v.key, v.lsn, layer.decode_raw(&v).unwrap())).collect();
    assert_eq!(scanned, image_versions());
}

#[test]
fn image_layer_v2_vector() {
    let name = LayerName::image(key(0), key(4), IMAGE_AT);
    let bytes = vector("layer-v2.image", &written("image", name, &image_versions()));
    assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
    // The three values are one compressed group: one stored blob, slots 0 to 2.
    let footer = bytes.len() - 32;
    let table = u64::from_le_bytes(bytes[footer..footer + 8].try_into().unwrap()) as usize;
    assert_eq!(table + 16, footer, "one index block");
    check_image("layer-v2.image", bytes);
}

#[test]
fn image_layer_v1_vector_still_reads() {
    check_image("layer-v1.image", committed_layer("layer-v1.image", 1));
}

#[test]
fn remote_index_v1_vector() {
    use strata_pageserver::remote::index::{IndexLayer, RemoteIndex};
    let index = RemoteIndex {
        generation: 2,
        pg_version: 15,
        system_id: 7_300_000_000_000_000_001,
        wal_segment_size: 16 << 20,
        start_lsn: Lsn(0x0100_0028),
        disk_consistent_lsn: Lsn(0x0100_0061),
        prev_record_lsn: Lsn(0x0100_0028),
        ancestor_timeline_id: None,
        ancestor_lsn: None,
        gc_cutoff_lsn: Lsn(0),
        retain_lsns: vec![],
        layers: vec![
            IndexLayer {
                name: LayerName::delta(key(0), key(3), Lsn(0x0100_0028), Lsn(0x0100_0061)).to_string(),
                size: 421,
                crc32c: 0x1234_5678,
                generation: 1,
                owner: None,
            },
            IndexLayer {
                name: LayerName::image(key(0), key(4), Lsn(0x0100_0060)).to_string(),
                size: 8499,
                crc32c: 0x9ABC_DEF0,
                generation: 2,
                owner: None,
            },
        ],
        stripe_blocks: None,
    };
    let vector = strata_test_support::paths::in_crate("tests/data/index-v1.json");
    if std::env::var_os("STRATA_WRITE_VECTORS").is_some() {
        std::fs::write(&vector, index.encode()).unwrap();
    }
    let expected = std::fs::read(&vector).unwrap();
    assert_eq!(index.encode(), expected, "the index is no longer written as format version 1 byte for byte");
    assert_eq!(RemoteIndex::decode(&expected).unwrap(), index);
}

#[test]
fn attachments_v1_vector_is_still_read() {
    use strata_pageserver::remote::attachments::Attachments;
    let tenant = "0f3c9e5a27d14b6c8e1f2a3b4c5d6e7f".parse().unwrap();
    let vector = strata_test_support::paths::in_crate("tests/data/attachments-v1.json");
    let expected = std::fs::read(&vector).unwrap();
    assert_eq!(Attachments::decode(&expected).unwrap().generation(tenant), Some(3));
}

#[test]
fn attachments_v2_vector() {
    use strata_pageserver::remote::attachments::{Attachment, Attachments, LocationMode};
    let tenant = "0f3c9e5a27d14b6c8e1f2a3b4c5d6e7f".parse().unwrap();
    let secondary = "1e2d3c4b5a6978877665544332211000".parse().unwrap();
    let a = Attachments {
        format_version: 2,
        tenants: std::collections::BTreeMap::from([
            (tenant, Attachment::attached(3)),
            (secondary, Attachment { generation: 0, mode: LocationMode::Secondary }),
        ]),
    };
    let vector = strata_test_support::paths::in_crate("tests/data/attachments-v2.json");
    if std::env::var_os("STRATA_WRITE_VECTORS").is_some() {
        std::fs::write(&vector, a.encode()).unwrap();
    }
    let expected = std::fs::read(&vector).unwrap();
    assert_eq!(a.encode(), expected, "the attachment file is no longer written as format version 2 byte for byte");
    let back = Attachments::decode(&expected).unwrap();
    assert_eq!((back.generation(tenant), back.generation(secondary)), (Some(3), None));
}

#[test]
fn timeline_metadata_v1_vector() {
    let path = strata_test_support::paths::in_crate("tests/data/metadata-v1.json");
    let meta: strata_pageserver::timeline::TimelineMetadata =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(meta.format_version, 1);
    assert_eq!(meta.disk_consistent_lsn, Lsn(0x63F_FF68));
    assert_eq!(meta.layers[0].parse::<LayerName>().unwrap().lsn_end, Lsn(0x0100_0061));
}
