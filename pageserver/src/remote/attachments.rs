//! The attachment file: what this pageserver holds of each tenant, and
//! under which generation (`docs/pageserver-storage.md`, "Attachments").
//!
//! With a storage controller (`controller = true`) the pageserver writes
//! it itself when the controller sets a location, and reads it at start to
//! come back as it was; the controller's state object is then the
//! authority on generations. Without one, the control plane writes it and
//! it is the authority too: the pageserver reads it again before every
//! batch of remote deletions, to learn whether its generation is still the
//! current one.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_protocol::TenantShardId;

pub use strata_protocol::api::pageserver::LocationMode;

/// The version this build writes (version 1, without modes, is read as
/// every tenant attached).
pub const ATTACHMENTS_FORMAT_VERSION: u32 = 2;
use crate::limits::MAX_ATTACHMENTS_BYTES as MAX_BYTES;

/// One tenant's attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    /// Issued by the control plane, higher for every new attachment (0
    /// for a location that is not attached).
    pub generation: u32,
    #[serde(default = "attached")]
    pub mode: LocationMode,
}

fn attached() -> LocationMode {
    LocationMode::Attached
}

impl Attachment {
    /// An attachment under `generation`.
    pub fn attached(generation: u32) -> Attachment {
        Attachment { generation, mode: LocationMode::Attached }
    }
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachments {
    pub format_version: u32,
    pub tenants: BTreeMap<TenantShardId, Attachment>,
}

impl Attachments {
    /// Reads and checks the file; a missing file means no tenant is attached.
    pub fn load(path: &Path) -> Result<Attachments, String> {
        let bytes = match std::fs::File::open(path) {
            Ok(f) => {
                use std::io::Read;
                let mut out = Vec::new();
                f.take(MAX_BYTES + 1).read_to_end(&mut out).map_err(|e| format!("reading {}: {e}", path.display()))?;
                out
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Attachments { format_version: ATTACHMENTS_FORMAT_VERSION, tenants: BTreeMap::new() })
            }
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        Attachments::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the bytes of an attachment file.
    pub fn decode(bytes: &[u8]) -> Result<Attachments, String> {
        if bytes.len() as u64 > MAX_BYTES {
            return Err(format!("larger than {MAX_BYTES} bytes"));
        }
        let a: Attachments = serde_json::from_slice(bytes).map_err(|e| format!("not an attachment file: {e}"))?;
        if !(1..=ATTACHMENTS_FORMAT_VERSION).contains(&a.format_version) {
            return Err(format!("format version {}, this build reads {ATTACHMENTS_FORMAT_VERSION}", a.format_version));
        }
        if let Some((t, _)) = a.tenants.iter().find(|(_, at)| at.generation == 0 && at.mode == LocationMode::Attached) {
            return Err(format!("tenant {t}: generation 0 is not issued"));
        }
        Ok(a)
    }

    /// The bytes of the file.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("attachments always encode");
        out.push(b'\n');
        out
    }

    /// The current generation of `tenant`, if it is attached.
    pub fn generation(&self, tenant: TenantShardId) -> Option<u32> {
        self.tenants.get(&tenant).filter(|a| a.mode == LocationMode::Attached).map(|a| a.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_bad_files() {
        let t = "11111111111111111111111111111111".parse::<TenantShardId>().unwrap();
        let a = Attachments { format_version: 2, tenants: BTreeMap::from([(t, Attachment::attached(7))]) };
        let bytes = a.encode();
        assert_eq!(Attachments::decode(&bytes).unwrap(), a);
        assert_eq!(a.generation(t), Some(7));
        assert_eq!(a.generation("22222222222222222222222222222222".parse().unwrap()), None);
        let text = String::from_utf8(bytes).unwrap();
        assert!(Attachments::decode(text.replace("\"format_version\": 2", "\"format_version\": 3").as_bytes())
            .unwrap_err()
            .contains("version 3"));
        // Version 1 had no modes: every tenant it names is attached.
        let v1 = format!("{{\"format_version\": 1, \"tenants\": {{\"{t}\": {{\"generation\": 3}}}}}}");
        assert_eq!(Attachments::decode(v1.as_bytes()).unwrap().generation(t), Some(3));
        // A secondary has no generation, and is not attached.
        let sec = text.replace("\"attached\"", "\"secondary\"").replace(": 7", ": 0");
        assert_eq!(Attachments::decode(sec.as_bytes()).unwrap().generation(t), None);
        // Nor has a reader (a site's, docs/sites.md).
        let reader = text.replace("\"attached\"", "\"reader\"").replace(": 7", ": 0");
        let back = Attachments::decode(reader.as_bytes()).unwrap();
        assert_eq!((back.generation(t), back.tenants[&t].mode), (None, LocationMode::Reader));
        assert!(Attachments::decode(text.replace("\"attached\"", "\"elsewhere\"").as_bytes()).is_err());
        assert!(Attachments::decode(text.replace(": 7", ": 0").as_bytes()).unwrap_err().contains("generation 0"));
        assert!(Attachments::decode(text.replace("generation", "gen").as_bytes()).is_err());
        assert!(Attachments::decode(b"{").is_err());
        let missing = std::env::temp_dir().join("strata-no-such-attachments.json");
        assert!(Attachments::load(&missing).unwrap().tenants.is_empty());
    }
}
