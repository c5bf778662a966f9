//! Conditional writes into a local directory (`src/cas.rs`): the shared
//! checks, and what a crash between the counter and the object leaves.

mod cas_checks;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use strata_remote_storage::cas::CasError;
use strata_remote_storage::{RemoteStorage, RemoteStorageConfig};

fn version_file(object: &Path) -> PathBuf {
    PathBuf::from(format!("{}#version", object.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_directory_swaps_objects_conditionally() {
    let dir = strata_test_support::scratch_dir("remote-cas");
    let storage = RemoteStorage::new(&RemoteStorageConfig::Local { path: dir.join("store") }).unwrap();
    cas_checks::check_compare_and_swap(&storage).await;
    // The bookkeeping files are not objects.
    let listed = storage.list("controller").await.unwrap();
    assert_eq!(
        listed.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(),
        vec!["controller/counter", "controller/leader.json", "controller/state.json"]
    );
    // A crash after the counter was replaced and before the object was:
    // a writer that read the old counter is refused, and readers see the
    // old bytes with the new counter.
    let (_, v) = storage.get_versioned("controller/state.json").await.unwrap().unwrap();
    let file = dir.join("store/controller/state.json");
    std::fs::write(version_file(&file), b"99").unwrap();
    let err = storage.put_if("controller/state.json", Bytes::from_static(b"three"), Some(&v)).await.unwrap_err();
    assert!(matches!(err, CasError::Conflict { .. }), "{err}");
    let (bytes, v99) = storage.get_versioned("controller/state.json").await.unwrap().unwrap();
    assert_eq!((bytes.as_ref(), v99.0.as_str()), (&b"two"[..], "99"));
    storage.put_if("controller/state.json", Bytes::from_static(b"three"), Some(&v99)).await.unwrap();
    // A damaged counter is an error that names it, never a silent overwrite.
    std::fs::write(version_file(&file), b"garbage").unwrap();
    let err = storage.get_versioned("controller/state.json").await.unwrap_err().to_string();
    assert!(err.contains("state.json#version") && err.contains("not a version counter"), "{err}");
    // A deleted object leaves nothing behind, its bookkeeping files included;
    // written again, it starts afresh.
    std::fs::write(version_file(&file), b"100").unwrap();
    storage.delete("controller/state.json").await.unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.join("store/controller"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("state.json"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    storage.put_if("controller/state.json", Bytes::from_static(b"new"), None).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
