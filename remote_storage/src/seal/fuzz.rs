//! Fuzz entry point of the decoders of untrusted bytes that encryption at
//! rest adds: a sealed object (header and chunks, whole and streamed), a
//! tenant's data key object, and a storage key file.

use strata_protocol::TenantId;

use super::format::{self, Header, ObjectOpener, HEADER_LEN};
use super::keys::{ClusterKeys, DataKey, DataKeysObject};
use super::SealError;

/// `data` must be refused or read without a panic; bytes nobody sealed with
/// the fuzzer's key never open, whole or streamed; content sealed opens
/// back to itself.
pub fn fuzz_one(data: &[u8]) {
    let key = DataKey::from_bytes([0x42; 32]);
    let name = "tenants/00000000000000000000000000000000/timelines/x/layer";
    let whole = format::open(name, data, |_| Ok(key.clone()));
    assert!(whole.is_err(), "bytes nobody sealed opened");
    if let Ok(header) = Header::decode(data) {
        assert_eq!(header.encode()[..], data[..HEADER_LEN], "a header decodes from its own bytes only");
        let mut opener = ObjectOpener::new(&key, &header, name);
        let mut out = Vec::new();
        let streamed = data[HEADER_LEN..]
            .chunks(7919)
            .try_for_each(|piece| opener.push(piece, &mut out))
            .and_then(|()| opener.finish(&mut out));
        assert!(matches!(streamed, Err(SealError::Authentication { .. } | SealError::Truncated)), "{streamed:?}");
    }
    // What the fuzzer gives as content round-trips through a real seal.
    let sealed = format::seal(&key, 1, name, data);
    assert_eq!(format::open(name, &sealed, |_| Ok(key.clone())).as_deref(), Ok(data));

    let cluster = ClusterKeys::parse(format!("1 {}", "42".repeat(32)).as_bytes(), "fuzz").expect("a valid key file");
    if let Ok(object) = DataKeysObject::decode(data, TenantId([0; 16])) {
        assert!(object.unwrap_all(&cluster).is_err(), "a data key nobody wrapped unwrapped");
    }
    if let Ok(keys) = ClusterKeys::parse(data, "fuzz") {
        assert!(!keys.ids().is_empty() && keys.ids().len() <= super::keys::MAX_CLUSTER_KEYS);
    }
}
