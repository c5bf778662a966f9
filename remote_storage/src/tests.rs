use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

fn temp_dir(name: &str) -> PathBuf {
    strata_test_support::scratch_dir(&format!("remote-{name}"))
}

fn local(dir: &Path) -> RemoteStorage {
    RemoteStorage::new(&RemoteStorageConfig::Local { path: dir.to_path_buf() }).unwrap()
}

#[tokio::test]
async fn a_local_directory_stores_lists_downloads_and_deletes_objects() {
    let dir = temp_dir("local");
    let storage = local(&dir.join("store"));
    assert_eq!(storage.describe(), dir.join("store").display().to_string());
    let key = "tenants/t1/timelines/l1/layer-00000001";
    storage.put(key, Bytes::from_static(b"layer bytes")).await.unwrap();
    storage.put("tenants/t1/timelines/l1/index-00000001.json", Bytes::from_static(b"{}")).await.unwrap();
    storage.put("tenants/t2/other", Bytes::from_static(b"x")).await.unwrap();
    // The objects are files under the same relative names.
    assert_eq!(std::fs::read(dir.join("store").join(key)).unwrap(), b"layer bytes");
    assert_eq!(storage.get(key).await.unwrap(), Bytes::from_static(b"layer bytes"));

    let listed = storage.list("tenants/t1").await.unwrap();
    assert_eq!(
        listed.iter().map(|o| (o.key.as_str(), o.size)).collect::<Vec<_>>(),
        vec![("tenants/t1/timelines/l1/index-00000001.json", 2), (key, 11)]
    );
    let age = listed[1].last_modified.elapsed().unwrap_or_default();
    assert!(age < std::time::Duration::from_secs(600), "written just now: {age:?}");
    // A prefix is a directory: "tenants/t" lists nothing of t1 or t2.
    assert!(storage.list("tenants/t").await.unwrap().is_empty());

    let file = dir.join("downloaded");
    assert_eq!(
        storage.download_file(key, &file).await.unwrap(),
        Downloaded { size: 11, crc32c: crc32c::crc32c(b"layer bytes") }
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"layer bytes");
    assert!(!PathBuf::from(format!("{}.download", file.display())).exists());
    // And back up from a file.
    let uploaded = storage.upload_file("copy", &file).await.unwrap();
    assert_eq!(uploaded, Uploaded { size: 11, crc32c: crc32c::crc32c(b"layer bytes") });
    assert_eq!(storage.get("copy").await.unwrap(), Bytes::from_static(b"layer bytes"));

    storage.delete(key).await.unwrap();
    storage.delete(key).await.unwrap(); // already gone: fine
    let err = storage.get(key).await.unwrap_err();
    assert!(matches!(err, RemoteError::NotFound { .. }) && err.to_string().contains(key), "{err}");
    let err = storage.download_file(key, &dir.join("nothing")).await.unwrap_err();
    assert!(matches!(err, RemoteError::NotFound { .. }), "{err}");
    assert!(!dir.join("nothing").exists());
    let err = storage.upload_file("x", &dir.join("missing-file")).await.unwrap_err().to_string();
    assert!(err.contains("reading") && err.contains("missing-file"), "{err}");
    let err = storage.put("a//b", Bytes::new()).await.unwrap_err().to_string();
    assert!(err.contains("a//b") && err.contains("not a valid object name"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_file_uploaded_into_a_local_directory_is_copied_whole_with_its_crc_and_no_staging_file_left() {
    let dir = temp_dir("upload");
    let storage = local(&dir.join("store"));
    // Larger than one copy chunk and not a multiple of it, so the CRC is
    // carried across chunks.
    let mut rng = strata_test_support::rng::seeded("local upload", 7);
    let bytes: Vec<u8> = (0..(1 << 20) * 2 + 4097).map(|_| rng.u8(..)).collect();
    let file = dir.join("layer");
    std::fs::write(&file, &bytes).unwrap();
    let key = "tenants/t1/timelines/l1/layer-a";
    let uploaded = storage.upload_file(key, &file).await.unwrap();
    assert_eq!(uploaded, Uploaded { size: bytes.len() as u64, crc32c: crc32c::crc32c(&bytes) });
    assert_eq!(storage.get(key).await.unwrap(), Bytes::from(bytes.clone()));
    // Uploading again replaces the object; a staging name left by a crashed
    // upload is neither reused nor listed, and is kept while it may still
    // belong to a live upload.
    let staging = |n: u32| dir.join("store").join(format!("{key}#{n}"));
    std::fs::write(staging(1), b"torn").unwrap();
    std::fs::write(&file, b"second").unwrap();
    assert_eq!(storage.upload_file(key, &file).await.unwrap().size, 6);
    assert_eq!(storage.get(key).await.unwrap(), Bytes::from_static(b"second"));
    let staged = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("store/tenants/t1/timelines/l1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("layer-a#"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(staged(), vec!["layer-a#1"]);
    let listed = storage.list("tenants/t1").await.unwrap();
    assert_eq!(listed.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), vec![key]);
    // Once nothing has written to them for long enough, the next upload of
    // the name removes them; a fresh one stays.
    let old = std::time::SystemTime::now() - crate::limits::STALE_STAGING - Duration::from_secs(1);
    std::fs::File::options().write(true).open(staging(1)).unwrap().set_modified(old).unwrap();
    std::fs::write(staging(2), b"live").unwrap();
    std::fs::write(&file, b"third").unwrap();
    assert_eq!(storage.upload_file(key, &file).await.unwrap().size, 5);
    assert_eq!(storage.get(key).await.unwrap(), Bytes::from_static(b"third"));
    assert_eq!(staged(), vec!["layer-a#2"]);
    // A put from memory stages the same way and cleans up the same way.
    std::fs::File::options().write(true).open(staging(2)).unwrap().set_modified(old).unwrap();
    storage.put(key, Bytes::from_static(b"fourth")).await.unwrap();
    assert_eq!(storage.get(key).await.unwrap(), Bytes::from_static(b"fourth"));
    assert!(staged().is_empty(), "{:?}", staged());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn transient_failures_are_retried_a_bounded_number_of_times() {
    let dir = temp_dir("retries");
    let storage =
        local(&dir).with_retries(Duration::from_millis(200), 3, Duration::from_millis(1), Duration::from_millis(5));
    let calls = AtomicU32::new(0);
    let generic = || object_store::Error::Generic { store: "test", source: "connection reset".into() };
    // Two failures, then success.
    let got = storage
        .retrying("uploading", "k", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(generic())
            } else {
                Ok(7)
            }
        })
        .await
        .unwrap();
    assert_eq!((got, calls.load(Ordering::SeqCst)), (7, 3));
    // Always failing: three attempts, then the error with the count.
    calls.store(0, Ordering::SeqCst);
    let err = storage
        .retrying("uploading", "k", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(generic())
        })
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(err.contains("uploading k") && err.contains("connection reset") && err.contains("3 attempts"), "{err}");
    // A hung store is a timeout, retried too.
    calls.store(0, Ordering::SeqCst);
    let err = storage
        .retrying("downloading", "k", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<object_store::Result<()>>().await
        })
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(err.contains("no answer within 200ms"), "{err}");
    // A permanent failure is not retried.
    calls.store(0, Ordering::SeqCst);
    let err = storage
        .retrying("uploading", "k", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(object_store::Error::PermissionDenied { path: "k".into(), source: "denied".into() })
        })
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(matches!(err, RemoteError::Failed { attempts: 1, .. }), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_s3_config_builds_a_client_without_connecting() {
    let cfg = RemoteStorageConfig::S3 {
        bucket: "strata".into(),
        prefix: "/pageserver/".into(),
        endpoint: Some("http://127.0.0.1:1".into()),
        region: None,
        access_key_id: Some("key".into()),
        secret_access_key: Some("secret".into()),
    };
    let storage = RemoteStorage::new(&cfg).unwrap();
    assert_eq!(storage.describe(), "s3://strata/pageserver at http://127.0.0.1:1");
    assert_eq!(storage.prefix, "pageserver");
}

#[test]
fn a_new_local_directory_is_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("private");
    let store = dir.join("a/store");
    local(&store);
    for d in [&store, &dir.join("a")] {
        assert_eq!(std::fs::metadata(d).unwrap().permissions().mode() & 0o777, 0o700, "{}", d.display());
    }
}
