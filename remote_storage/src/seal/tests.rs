use std::path::{Path, PathBuf};

use bytes::Bytes;
use strata_protocol::TenantId;

use super::format::{self, Header, ObjectOpener, ObjectSealer, HEADER_LEN, TAG_LEN};
use super::keys::{ClusterKeys, DataKey, DataKeysObject};
use super::names::data_keys_key;
use super::SealError;
use crate::{RemoteError, RemoteStorage, RemoteStorageConfig};

const T1: TenantId = TenantId([0x11; 16]);
const T2: TenantId = TenantId([0x22; 16]);

fn key(b: u8) -> DataKey {
    DataKey::from_bytes([b; 32])
}

fn small_sealer(name: &str, chunk_size: usize) -> ObjectSealer {
    ObjectSealer::with_salt(&key(7), Header { chunk_size, key_id: 3, salt: [9; 32] }, name)
}

fn open_with(name: &str, sealed: &[u8], k: &DataKey) -> Result<Vec<u8>, SealError> {
    format::open(name, sealed, |id| if id == 3 { Ok(k.clone()) } else { Err(SealError::Key(format!("no key {id}"))) })
}

#[test]
fn sealed_objects_round_trip_at_every_length_around_the_chunk_size() {
    for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 100] {
        let content: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let sealed = format::seal_with(small_sealer("o", 16), &content);
        // A header, one tag per chunk, and a final chunk shorter than a chunk.
        assert_eq!(sealed.len(), HEADER_LEN + len + (len / 16 + 1) * TAG_LEN, "{len}");
        assert_eq!(open_with("o", &sealed, &key(7)).unwrap(), content, "{len}");
        // Fed in pieces of any size, the opener gives the same bytes.
        for piece in [1usize, 5, 16, 17, 1000] {
            let mut opener = ObjectOpener::new(&key(7), &Header::decode(&sealed).unwrap(), "o");
            let mut out = Vec::new();
            for p in sealed[HEADER_LEN..].chunks(piece) {
                opener.push(p, &mut out).unwrap();
            }
            opener.finish(&mut out).unwrap();
            assert_eq!(out, content, "{len} in pieces of {piece}");
        }
    }
    // A real-size chunk and a random salt: two seals of one content differ.
    let content = vec![5u8; format::CHUNK_SIZE + 3];
    let (a, b) = (format::seal(&key(7), 3, "o", &content), format::seal(&key(7), 3, "o", &content));
    assert_ne!(a, b);
    assert_eq!(open_with("o", &a, &key(7)).unwrap(), content);
}

#[test]
fn every_flipped_byte_truncation_rename_or_wrong_key_is_refused() {
    let content: Vec<u8> = (0..40u8).collect();
    let sealed = format::seal_with(small_sealer("tenants/a/x", 16), &content);
    for i in 0..sealed.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = sealed.clone();
            bad[i] ^= bit;
            assert!(open_with("tenants/a/x", &bad, &key(7)).is_err(), "byte {i} bit {bit:#x}");
        }
    }
    for cut in 0..sealed.len() {
        assert!(open_with("tenants/a/x", &sealed[..cut], &key(7)).is_err(), "cut at {cut}");
    }
    // A whole chunk dropped, chunks swapped, bytes appended.
    let body = &sealed[HEADER_LEN..];
    let c = 16 + TAG_LEN;
    let dropped = [&sealed[..HEADER_LEN], &body[c..]].concat();
    let swapped = [&sealed[..HEADER_LEN], &body[c..2 * c], &body[..c], &body[2 * c..]].concat();
    let appended = [&sealed[..], b"x"].concat();
    for bad in [dropped, swapped, appended] {
        assert!(matches!(open_with("tenants/a/x", &bad, &key(7)), Err(SealError::Authentication { .. })));
    }
    // Another name, another key, plaintext.
    assert_eq!(open_with("tenants/a/y", &sealed, &key(7)), Err(SealError::Authentication { chunk: 0 }));
    assert_eq!(open_with("tenants/a/x", &sealed, &key(8)), Err(SealError::Authentication { chunk: 0 }));
    assert_eq!(open_with("tenants/a/x", &content, &key(7)), Err(SealError::NotSealed));
    assert_eq!(open_with("tenants/a/x", b"STRATA", &key(7)), Err(SealError::Truncated));
    let mut v2 = sealed.clone();
    v2[8] = 2;
    assert!(matches!(open_with("tenants/a/x", &v2, &key(7)), Err(SealError::Header(m)) if m.contains("version 2")));
    let mut huge = sealed.clone();
    huge[12..16].copy_from_slice(&(1u32 << 30).to_le_bytes());
    assert!(matches!(open_with("tenants/a/x", &huge, &key(7)), Err(SealError::Header(m)) if m.contains("chunk size")));
}

/// `tests/data/sealed-v1.txt`: fixed keys and salts, the exact bytes of
/// the format (for any other implementation to check itself against).
#[test]
fn the_format_matches_its_test_vectors() {
    let path = strata_test_support::paths::in_crate("tests/data/sealed-v1.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    };
    let mut checked = 0;
    for block in text.split("\n\n").filter(|b| b.contains("sealed =")) {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.split_once('=').filter(|(k, _)| k.trim() == name).map(|(_, v)| v))
                .unwrap_or_else(|| panic!("{name} missing in {block}"))
                .trim()
                .to_string()
        };
        let data_key = DataKey::from_bytes(hex(&field("data_key")).try_into().unwrap());
        let header = Header {
            chunk_size: field("chunk_size").parse().unwrap(),
            key_id: field("key_id").parse().unwrap(),
            salt: hex(&field("salt")).try_into().unwrap(),
        };
        let name = field("name");
        let content = hex(&field("content"));
        let sealed = format::seal_with(ObjectSealer::with_salt(&data_key, header.clone(), &name), &content);
        assert_eq!(sealed, hex(&field("sealed")), "{name}");
        let opened = format::open(&name, &sealed, |id| {
            assert_eq!(id, header.key_id);
            Ok(data_key.clone())
        });
        assert_eq!(opened.unwrap(), content);
        checked += 1;
    }
    assert_eq!(checked, 3, "every vector of {} checked", path.display());
}

#[test]
fn key_files_and_key_objects_are_checked() {
    let text = ClusterKeys::new_file_text();
    let keys = ClusterKeys::parse(text.as_bytes(), "f").unwrap();
    assert_eq!(keys.ids(), vec![1]);
    let two = format!("# newest first\n2 {}\n\n1 {}\n", "ab".repeat(32), "cd".repeat(32));
    assert_eq!(ClusterKeys::parse(two.as_bytes(), "f").unwrap().ids(), vec![2, 1]);
    for bad in [
        String::new(),
        "# nothing\n".to_string(),
        format!("1 {}", "ab".repeat(31)),
        format!("0 {}", "ab".repeat(32)),
        format!("x {}", "ab".repeat(32)),
        format!("1 {} extra", "ab".repeat(32)),
        format!("1 {}\n1 {}", "ab".repeat(32), "cd".repeat(32)),
        format!("1 {}", "zz".repeat(32)),
        (1..=9).map(|i| format!("{i} {}\n", "ab".repeat(32))).collect(),
    ] {
        let err = ClusterKeys::parse(bad.as_bytes(), "f").unwrap_err();
        assert!(err.starts_with("f") && !err.contains(&"ab".repeat(32)), "{bad}: {err}");
    }

    let cluster = ClusterKeys::parse(two.as_bytes(), "f").unwrap();
    let object = DataKeysObject::first(&cluster, T1);
    let decoded = DataKeysObject::decode(&object.encode(), T1).unwrap();
    assert_eq!(decoded, object);
    assert_eq!(decoded.unwrap_all(&cluster).unwrap().len(), 1);
    // Another tenant's object, a key moved to another tenant, another cluster.
    assert!(DataKeysObject::decode(&object.encode(), T2).unwrap_err().contains("tenant"));
    let moved = DataKeysObject { tenant: T2, ..object.clone() };
    assert!(moved.unwrap_all(&cluster).unwrap_err().contains("fails authentication"));
    let other = ClusterKeys::parse(format!("2 {}", "ef".repeat(32)).as_bytes(), "g").unwrap();
    assert!(object.unwrap_all(&other).unwrap_err().contains("fails authentication"));
    let only_one = ClusterKeys::parse(format!("1 {}", "cd".repeat(32)).as_bytes(), "g").unwrap();
    assert!(object.unwrap_all(&only_one).unwrap_err().contains("does not hold"));
    let mut flipped = object.clone();
    let w = &mut flipped.keys[0].wrapped;
    let last = if w.ends_with('0') { '1' } else { '0' };
    w.pop();
    w.push(last);
    assert!(flipped.unwrap_all(&cluster).is_err());
    for bad in ["{}", "[]", "", "{\"format_version\":1}"] {
        assert!(DataKeysObject::decode(bad.as_bytes(), T1).is_err(), "{bad}");
    }
}

fn scratch(name: &str) -> PathBuf {
    strata_test_support::scratch_dir(&format!("seal-{name}"))
}

fn key_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn sealed_store(store: &Path, keys: &Path) -> RemoteStorage {
    RemoteStorage::new(&RemoteStorageConfig::Local { path: store.to_path_buf() })
        .unwrap()
        .with_storage_key(keys)
        .unwrap()
}

fn layer(t: TenantId, n: u32) -> String {
    format!("tenants/{t}/timelines/{}/layer-{n:08x}", TenantId([0x33; 16]))
}

fn refused(e: RemoteError, key: &str) {
    assert!(matches!(&e, RemoteError::Refused { .. }), "{e}");
    assert!(e.to_string().contains(key), "{e}");
}

#[tokio::test]
async fn a_sealed_store_round_trips_and_refuses_what_it_did_not_seal() {
    let dir = scratch("store");
    let keys = key_file(&dir, "storage.key", &ClusterKeys::new_file_text());
    let storage = sealed_store(&dir.join("store"), &keys);
    assert!(storage.encrypted());
    let content: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let (a, b) = (layer(T1, 1), layer(T1, 2));
    storage.put(&a, Bytes::from(content.clone())).await.unwrap();
    // On disk: sealed, no content visible.
    let stored = std::fs::read(dir.join("store").join(&a)).unwrap();
    assert!(stored.starts_with(&format::MAGIC) && stored.len() > content.len());
    assert!(!stored.windows(64).any(|w| w == &content[1000..1064]));
    assert_eq!(storage.get(&a).await.unwrap(), content);
    let listed = storage.list(&format!("tenants/{T1}")).await.unwrap();
    assert_eq!(listed[0].size, stored.len() as u64, "listings give the stored size");

    // upload_file and download_file: streamed, the file's size and CRC.
    let file = dir.join("file");
    std::fs::write(&file, &content).unwrap();
    let up = storage.upload_file(&b, &file).await.unwrap();
    assert_eq!((up.size, up.crc32c), (content.len() as u64, crc32c::crc32c(&content)));
    let down = storage.download_file(&b, &dir.join("back")).await.unwrap();
    assert_eq!((down.size, down.crc32c), (up.size, up.crc32c));
    assert_eq!(std::fs::read(dir.join("back")).unwrap(), content);
    assert!(std::fs::read(dir.join("store").join(&b)).unwrap().starts_with(&format::MAGIC));
    // Objects outside the tenants' prefixes are stored as they are.
    storage.put("controller/x.json", Bytes::from_static(b"{}")).await.unwrap();
    assert_eq!(std::fs::read(dir.join("store/controller/x.json")).unwrap(), b"{}");

    // A flipped byte (header, first, middle or last chunk), a cut, a copy
    // under another name, another tenant's object, a plaintext object:
    // refused by get and download_file, and nothing left behind.
    let stored_b = std::fs::read(dir.join("store").join(&b)).unwrap();
    let wal = format!("wal/{T1}/{}/000000010000000000000001", TenantId([0x33; 16]));
    for (i, bad) in [
        (2usize, None),
        (HEADER_LEN + 5, None),
        (HEADER_LEN + (1 << 20) + 40, None),
        (stored_b.len() - 1, None),
        (0, Some(stored_b[..stored_b.len() - 100].to_vec())),
        (0, Some(stored_b[..HEADER_LEN + (1 << 20) + TAG_LEN].to_vec())),
        (0, Some(content[..1000].to_vec())),
        (0, Some(Vec::new())),
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = bad.1.unwrap_or_else(|| {
            let mut f = stored_b.clone();
            f[bad.0] ^= 0x40;
            f
        });
        let target = layer(T1, 100 + i as u32);
        std::fs::create_dir_all(dir.join("store").join(&target).parent().unwrap()).unwrap();
        std::fs::write(dir.join("store").join(&target), &bytes).unwrap();
        refused(storage.get(&target).await.unwrap_err(), &target);
        let out = dir.join(format!("bad-{i}"));
        refused(storage.download_file(&target, &out).await.unwrap_err(), &target);
        assert!(!out.exists() && !dir.join(format!("bad-{i}.download")).exists(), "case {i}");
    }
    for target in [layer(T1, 200), layer(T2, 2), wal.clone()] {
        std::fs::create_dir_all(dir.join("store").join(&target).parent().unwrap()).unwrap();
        std::fs::write(dir.join("store").join(&target), &stored_b).unwrap();
        refused(storage.get(&target).await.unwrap_err(), &target);
        refused(storage.download_file(&target, &dir.join("moved")).await.unwrap_err(), &target);
    }
    // A name under a tenant prefix that is no tenant is not stored unsealed.
    let err = storage.put("tenants/t1/x", Bytes::new()).await.unwrap_err().to_string();
    assert!(err.contains("not a tenant id"), "{err}");
    let err = storage.put_if(&a, Bytes::new(), None).await.unwrap_err().to_string();
    assert!(err.contains("conditional writes"), "{err}");

    // Without the key, the objects are unreadable; a storage without sealing
    // reads the sealed bytes as they are (no key, no content).
    let plain = RemoteStorage::new(&RemoteStorageConfig::Local { path: dir.join("store") }).unwrap();
    assert!(plain.get(&a).await.unwrap().starts_with(&format::MAGIC));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn cluster_and_data_keys_rotate_and_old_objects_stay_readable() {
    let dir = scratch("rotate");
    let (k1, k2) = ("1".repeat(64), "2".repeat(64));
    let old = key_file(&dir, "old.key", &format!("1 {k1}\n"));
    let both = key_file(&dir, "both.key", &format!("2 {k2}\n1 {k1}\n"));
    let new = key_file(&dir, "new.key", &format!("2 {k2}\n"));
    let store = dir.join("store");
    let s1 = sealed_store(&store, &old);
    s1.put(&layer(T1, 1), Bytes::from_static(b"under cluster key 1")).await.unwrap();
    let wrapped_by = |s: &Path| {
        let bytes = std::fs::read(s.join(data_keys_key(T1))).unwrap();
        DataKeysObject::decode(&bytes, T1).unwrap().keys.iter().map(|k| k.cluster_key).collect::<Vec<_>>()
    };
    assert_eq!(wrapped_by(&store), vec![1]);
    // The new key file alone cannot read what key 1 wrapped.
    let err = sealed_store(&store, &new).get(&layer(T1, 1)).await.unwrap_err();
    refused(err, &data_keys_key(T1));
    // With both keys: read, and the data keys are wrapped again under key 2.
    let s2 = sealed_store(&store, &both);
    assert_eq!(s2.get(&layer(T1, 1)).await.unwrap(), Bytes::from_static(b"under cluster key 1"));
    assert_eq!(wrapped_by(&store), vec![2]);
    assert_eq!(s2.rewrap_data_keys().await.unwrap(), 0, "already rewrapped");
    // Another tenant, created under key 1, is rewrapped by the sweep.
    s1.put(&layer(T2, 1), Bytes::from_static(b"t2")).await.unwrap();
    assert_eq!(s2.rewrap_data_keys().await.unwrap(), 1);
    // Key 1 is retired: everything reads with key 2 alone.
    let s3 = sealed_store(&store, &new);
    assert_eq!(s3.get(&layer(T1, 1)).await.unwrap(), Bytes::from_static(b"under cluster key 1"));
    assert_eq!(s3.get(&layer(T2, 1)).await.unwrap(), Bytes::from_static(b"t2"));

    // A data key rotation: new objects use key 2, old ones still open, and
    // another process's cache reads the new key when it meets it.
    assert_eq!(s3.rotate_data_key(T1).await.unwrap(), 2);
    s3.put(&layer(T1, 2), Bytes::from_static(b"data key 2")).await.unwrap();
    let header = Header::decode(&std::fs::read(store.join(layer(T1, 2))).unwrap()).unwrap();
    assert_eq!(header.key_id, 2);
    assert_eq!(s2.get(&layer(T1, 2)).await.unwrap(), Bytes::from_static(b"data key 2"));
    assert_eq!(s3.get(&layer(T1, 1)).await.unwrap(), Bytes::from_static(b"under cluster key 1"));

    // Crypto-shredding: without its keys, a tenant's objects are refused.
    s3.delete_data_keys(T1).await.unwrap();
    let fresh = sealed_store(&store, &new);
    refused(fresh.get(&layer(T1, 1)).await.unwrap_err(), &data_keys_key(T1));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_creating_a_tenants_data_key_at_once_agree_on_one() {
    let dir = scratch("concurrent");
    let keys = key_file(&dir, "storage.key", &ClusterKeys::new_file_text());
    let store = dir.join("store");
    // Separate storages: separate caches, as separate processes have.
    let writers: Vec<_> = (0..8u32)
        .map(|i| {
            let s = sealed_store(&store, &keys);
            tokio::spawn(async move { s.put(&layer(T1, i), Bytes::from(vec![i as u8; 100])).await })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    let object = DataKeysObject::decode(&std::fs::read(store.join(data_keys_key(T1))).unwrap(), T1).unwrap();
    assert_eq!(object.keys.len(), 1);
    let reader = sealed_store(&store, &keys);
    for i in 0..8u32 {
        assert_eq!(reader.get(&layer(T1, i)).await.unwrap(), vec![i as u8; 100]);
    }
    // A key file others can read is refused, naming the file.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = RemoteStorage::new(&RemoteStorageConfig::Local { path: store.clone() })
        .unwrap()
        .with_storage_key(&keys)
        .unwrap_err()
        .to_string();
    assert!(err.contains("storage.key") && err.contains("chmod 600"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_fuzz_entry_point_takes_vectors_and_garbage_without_a_panic() {
    let text = std::fs::read_to_string(strata_test_support::paths::in_crate("tests/data/sealed-v1.txt")).unwrap();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    };
    let mut inputs: Vec<Vec<u8>> = text.lines().filter_map(|l| l.strip_prefix("sealed = ")).map(hex).collect();
    inputs.push(Vec::new());
    inputs.push(format::MAGIC.to_vec());
    inputs.push(
        DataKeysObject::first(&ClusterKeys::parse(ClusterKeys::new_file_text().as_bytes(), "k").unwrap(), T1).encode(),
    );
    inputs.push(ClusterKeys::new_file_text().into_bytes());
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..200 {
        let mut v = inputs[rng.usize(..inputs.len())].clone();
        for _ in 0..rng.usize(0..4) {
            if !v.is_empty() {
                let i = rng.usize(..v.len());
                v[i] = rng.u8(..);
            }
        }
        v.truncate(rng.usize(0..=v.len()));
        inputs.push(v);
    }
    for input in &inputs {
        super::fuzz::fuzz_one(input);
    }
}
