//! The S3 backend against a real S3 server: a MinIO process started here
//! (installed by `scripts/setup.sh`; `STRATA_MINIO` names its binary).
//! Also what the storage does while the server is down and after it is back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_remote_storage::{RemoteError, RemoteStorage, RemoteStorageConfig};

const BUCKET: &str = "strata-test";
const USER: &str = "strata";
const PASSWORD: &str = "strata-test-secret";

fn minio_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("STRATA_MINIO") {
        return PathBuf::from(p);
    }
    // Where scripts/minio.sh puts it by default.
    let home = std::env::var_os("HOME").expect("HOME is set");
    let cache = Path::new(&home).join(".cache/strata");
    // The newest installed version (scripts/setup.sh installs one).
    let mut found: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/setup.sh (it installs MinIO)", cache.display()))
        .filter_map(|e| e.ok().map(|e| e.path().join("minio")))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("no MinIO under {}; run scripts/setup.sh", cache.display()))
}

/// A MinIO server on a free port with an empty bucket, stopped when dropped.
struct Minio {
    child: Option<Child>,
    port: u16,
}

impl Minio {
    fn start(dir: PathBuf, port: u16) -> Minio {
        // A top-level directory of the data directory is a bucket.
        std::fs::create_dir_all(dir.join(BUCKET)).unwrap();
        let child = Command::new(minio_binary())
            .args(["server", dir.to_str().unwrap(), "--address", &format!("127.0.0.1:{port}"), "--quiet"])
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", PASSWORD)
            .env("MINIO_BROWSER", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("MinIO starts");
        let m = Minio { child: Some(child), port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let live = ureq_like_get(port, "/minio/health/live");
            if live == Some(200) {
                break;
            }
            assert!(Instant::now() < deadline, "MinIO did not answer within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn config(&self) -> RemoteStorageConfig {
        RemoteStorageConfig::S3 {
            bucket: BUCKET.into(),
            prefix: "pageserver".into(),
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: Some("us-east-1".into()),
            access_key_id: Some(USER.into()),
            secret_access_key: Some(PASSWORD.into()),
        }
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The HTTP status of a GET on loopback (no client library needed for a health check).
fn ureq_like_get(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_objects_round_trip_and_survive_a_server_restart() {
    let dir = std::env::temp_dir().join(format!("strata-minio-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = strata_test_support::free_port();
    let mut minio = Minio::start(dir.clone(), port);
    let storage = RemoteStorage::new(&minio.config()).unwrap().with_retries(
        Duration::from_secs(5),
        4,
        Duration::from_millis(50),
        Duration::from_millis(500),
    );
    assert_eq!(storage.describe(), format!("s3://{BUCKET}/pageserver at http://127.0.0.1:{port}"));

    let layer: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    storage.put("tenants/t/timelines/l/layer-00000001", Bytes::from(layer.clone())).await.unwrap();
    storage.put("tenants/t/timelines/l/index-00000001.json", Bytes::from_static(b"{\"v\":1}")).await.unwrap();
    assert_eq!(storage.get("tenants/t/timelines/l/layer-00000001").await.unwrap(), Bytes::from(layer.clone()));
    assert_eq!(
        storage.list("tenants/t/timelines/l").await.unwrap().into_iter().map(|o| (o.key, o.size)).collect::<Vec<_>>(),
        vec![
            ("tenants/t/timelines/l/index-00000001.json".to_string(), 7),
            ("tenants/t/timelines/l/layer-00000001".to_string(), 3_000_000),
        ]
    );
    let file = dir.join("downloaded");
    let got = storage.download_file("tenants/t/timelines/l/layer-00000001", &file).await.unwrap();
    assert_eq!(got.size, 3_000_000);
    assert_eq!(got.crc32c, crc32c::crc32c(&std::fs::read(&file).unwrap()));
    assert_eq!(std::fs::read(&file).unwrap(), layer);
    let err = storage.get("tenants/t/timelines/l/nothing").await.unwrap_err();
    assert!(matches!(err, RemoteError::NotFound { .. }), "{err}");
    storage.delete("tenants/t/timelines/l/index-00000001.json").await.unwrap();
    storage.delete("tenants/t/timelines/l/index-00000001.json").await.unwrap();
    assert_eq!(storage.list("tenants/t").await.unwrap().len(), 1);

    // The server goes away: operations fail after their attempts, naming the object.
    minio.stop();
    let err = storage.put("tenants/t/timelines/l/layer-00000002", Bytes::from_static(b"x")).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RemoteError::Failed { attempts: 4, .. }), "{text}");
    assert!(text.contains("layer-00000002"), "{text}");

    // Back on the same data: what was stored is there, and writes work again,
    // including one that was retrying while the server came back.
    let dir2 = dir.clone();
    let restart = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(300));
        Minio::start(dir2, port)
    });
    let slow = storage.clone().with_retries(
        Duration::from_secs(5),
        100,
        Duration::from_millis(100),
        Duration::from_millis(300),
    );
    slow.put("tenants/t/timelines/l/layer-00000002", Bytes::from_static(b"second")).await.unwrap();
    let _minio = restart.await.unwrap();
    assert_eq!(storage.get("tenants/t/timelines/l/layer-00000001").await.unwrap(), Bytes::from(layer));
    assert_eq!(storage.get("tenants/t/timelines/l/layer-00000002").await.unwrap(), Bytes::from_static(b"second"));
    drop(_minio);
    std::fs::remove_dir_all(&dir).unwrap();
}

mod cas_checks;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_conditional_writes_swap_objects() {
    let dir = std::env::temp_dir().join(format!("strata-minio-cas-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let minio = Minio::start(dir.clone(), strata_test_support::free_port());
    let storage = RemoteStorage::new(&minio.config()).unwrap();
    cas_checks::check_compare_and_swap(&storage).await;
    drop(minio);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Encryption at rest against S3: objects are sealed in the bucket, come
/// back whole, and a flipped byte is refused by both kinds of download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_sealed_objects_round_trip_and_a_flipped_byte_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("strata-minio-sealed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let minio = Minio::start(dir.join("data"), strata_test_support::free_port());
    let key_file = dir.join("storage.key");
    std::fs::write(&key_file, strata_remote_storage::seal::keys::ClusterKeys::new_file_text()).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let sealed = RemoteStorage::new(&minio.config()).unwrap().with_storage_key(&key_file).unwrap();
    let raw = RemoteStorage::new(&minio.config()).unwrap();
    let tenant = "0123456789abcdef0123456789abcdef";
    let key = format!("tenants/{tenant}/timelines/{tenant}/layer-00000001");

    let layer: Vec<u8> = (0..2_500_000u32).map(|i| (i % 253) as u8).collect();
    let file = dir.join("layer");
    std::fs::write(&file, &layer).unwrap();
    let up = sealed.upload_file(&key, &file).await.unwrap();
    assert_eq!((up.size, up.crc32c), (layer.len() as u64, crc32c::crc32c(&layer)));
    let stored = raw.get(&key).await.unwrap();
    assert!(stored.starts_with(b"STRATA-E") && stored.len() > layer.len());
    assert_eq!(sealed.get(&key).await.unwrap(), Bytes::from(layer.clone()));
    let down = sealed.download_file(&key, &dir.join("back")).await.unwrap();
    assert_eq!((down.size, down.crc32c), (up.size, up.crc32c));
    assert_eq!(std::fs::read(dir.join("back")).unwrap(), layer);
    // The tenant's data key object is wrapped, not the key in the clear.
    assert!(!raw.list("keys").await.unwrap().is_empty());

    let mut flipped = stored.to_vec();
    flipped[1_500_000] ^= 1;
    raw.put(&key, Bytes::from(flipped)).await.unwrap();
    let err = sealed.get(&key).await.unwrap_err();
    assert!(matches!(err, RemoteError::Refused { .. }) && err.to_string().contains(&key), "{err}");
    let err = sealed.download_file(&key, &dir.join("bad")).await.unwrap_err();
    assert!(matches!(err, RemoteError::Refused { .. }) && err.to_string().contains("fails authentication"), "{err}");
    assert!(!dir.join("bad").exists());
    drop(minio);
    let _ = std::fs::remove_dir_all(&dir);
}
