//! The behaviour every backend's conditional writes must have: shared by
//! the local-directory test and the S3 test against MinIO.

use bytes::Bytes;
use strata_remote_storage::cas::{CasError, ObjectVersion};
use strata_remote_storage::RemoteStorage;

/// Runs the checks on `storage`, which must not hold `controller/` objects yet.
pub async fn check_compare_and_swap(storage: &RemoteStorage) {
    let key = "controller/state.json";
    assert!(storage.get_versioned(key).await.unwrap().is_none());
    let v1 = storage.put_if(key, Bytes::from_static(b"one"), None).await.unwrap();
    // Created once only.
    let err = storage.put_if(key, Bytes::from_static(b"again"), None).await.unwrap_err();
    assert!(matches!(err, CasError::Conflict { .. }) && err.to_string().contains(key), "{err}");
    let (bytes, v) = storage.get_versioned(key).await.unwrap().unwrap();
    assert_eq!((bytes.as_ref(), &v), (&b"one"[..], &v1));
    let v2 = storage.put_if(key, Bytes::from_static(b"two"), Some(&v1)).await.unwrap();
    assert_ne!(v1, v2);
    // A writer that read `one` lost the race.
    let err = storage.put_if(key, Bytes::from_static(b"late"), Some(&v1)).await.unwrap_err();
    assert!(matches!(err, CasError::Conflict { .. }), "{err}");
    assert_eq!(storage.get_versioned(key).await.unwrap().unwrap(), (Bytes::from_static(b"two"), v2.clone()));
    // Another object is independent.
    storage.put_if("controller/leader.json", Bytes::from_static(b"x"), None).await.unwrap();
    // An update of a missing object is a conflict.
    let missing = ObjectVersion(v2.0.clone());
    let err = storage.put_if("controller/none.json", Bytes::from_static(b"x"), Some(&missing)).await.unwrap_err();
    assert!(matches!(err, CasError::Conflict { .. }), "{err}");

    // Many writers each add one to a counter by read-modify-write: no
    // increment is lost, and every conflict is retried.
    let counter = "controller/counter";
    storage.put_if(counter, Bytes::from_static(b"0"), None).await.unwrap();
    let (writers, each) = (4, 10);
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let storage = storage.clone();
            tokio::spawn(async move {
                let mut conflicts = 0;
                for i in 0..each {
                    loop {
                        let (bytes, v) = storage.get_versioned(counter).await.unwrap().unwrap();
                        let n: u64 = std::str::from_utf8(&bytes).unwrap().split(' ').next().unwrap().parse().unwrap();
                        // Unique bytes per write, as the module asks of writers.
                        let next = Bytes::from(format!("{} {w} {i}", n + 1));
                        match storage.put_if(counter, next, Some(&v)).await {
                            Ok(_) => break,
                            Err(CasError::Conflict { .. }) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let (bytes, _) = storage.get_versioned(counter).await.unwrap().unwrap();
    let n: u64 = std::str::from_utf8(&bytes).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert_eq!(n, writers * each, "{conflicts} conflicts");
}
