//! Entry point for the fuzz target (`fuzz/`): every decoder of untrusted
//! bytes in the pageserver — layer files, value groups, stored values, native records,
//! directory values, checkpoint records, layer file names, timeline metadata and
//! remote indexes; and an import's tar stream (`fuzz_import_tar`).

use std::path::Path;

use strata_formats::Lsn;

use crate::dirs;
use crate::key::Key;
use crate::layer::layer_file::{LayerFile, LayerName};
use crate::layer::Versions;
use crate::value::Value;

/// Decodes `data` in every way the pageserver decodes stored bytes; never panics.
pub fn fuzz_one(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    match selector % 2 {
        0 => {
            // A layer file of either kind (delta or image).
            if let Ok(layer) = LayerFile::from_bytes(Path::new("fuzz.layer"), rest.to_vec()) {
                let mut probes: Vec<Key> =
                    layer.summary().unwrap_or_default().iter().map(|(k, _)| *k).take(8).collect();
                probes.push(Key::MIN);
                probes.push(layer.name.key_start);
                for v in layer.scan().take(64).flatten() {
                    let _ = layer.decode_raw(&v);
                }
                for key in probes {
                    for lsn in [Lsn(0), layer.name.lsn_start, Lsn(u64::MAX)] {
                        let _ = layer.collect(&key, lsn, &mut Versions::default());
                    }
                }
            }
        }
        _ => {
            match Value::decode(rest) {
                Ok(Value::Native(r)) => {
                    let _ = r.apply(&mut [0u8; strata_formats::version::BLCKSZ]);
                }
                Ok(Value::RelDirChange(c)) => c.apply(&mut std::collections::BTreeSet::new()),
                _ => {}
            }
            let _ = dirs::decode_pairs(rest);
            let _ = dirs::decode_rels(rest);
            let _ = dirs::decode_u32s(rest);
            let _ = crate::checkpoint_record::CheckpointRecord::decode(rest);
            if let Ok(g) = crate::layer::group::Group::decode(rest.to_vec()) {
                for slot in 0..=255 {
                    let _ = g.get(slot);
                }
            }
            let _ = crate::remote::index::RemoteIndex::decode(rest);
            let _ = crate::remote::attachments::Attachments::decode(rest);
            let _ = crate::secondary::Heatmap::decode(rest);
            let _ = strata_protocol::api::controller::ControllerState::decode(rest);
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = text.parse::<LayerName>();
                let _ = text.parse::<Key>();
                let _ = serde_json::from_str::<crate::timeline::TimelineMetadata>(text);
            }
        }
    }
}

/// Unpacks `data` as an import's tar stream into a scratch directory
/// (removed after); never panics, never writes outside it.
pub fn fuzz_import_tar(data: &[u8]) {
    let scratch = std::env::temp_dir().join(format!("strata-fuzz-import-{}", std::process::id()));
    let dest = scratch.join("d");
    let _ = std::fs::remove_dir_all(&scratch);
    if std::fs::create_dir_all(&scratch).is_err() {
        return;
    }
    let _ = crate::import_upload::unpack(data, &dest, 1 << 20);
    let _ = std::fs::remove_dir_all(&scratch);
}
