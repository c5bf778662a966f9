use std::io::{Read, Write};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A server on a free loopback port that answers each connection's 4
/// bytes with the same bytes reversed, over TLS with `cert`/`key`.
async fn echo_server(cert: &str, key: &str) -> std::net::SocketAddr {
    let tls = ServerTls::from_pem(cert.as_bytes(), key.as_bytes(), Path::new("test")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(s) = tls.accept(tcp).await else { return };
                let mut s = Stream::from(s);
                let mut buf = [0u8; 4];
                if s.read_exact(&mut buf).await.is_ok() {
                    buf.reverse();
                    let _ = s.write_all(&buf).await;
                    let _ = s.flush().await;
                }
            });
        }
    });
    addr
}

// Two threads: the blocking client below must not stall the server's task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_the_cluster_ca_is_trusted_and_others_are_not() {
    let (ca, ca_key) = generate_ca().unwrap();
    let (cert, key) = issue(&ca_key, &names(&["127.0.0.1", "localhost"])).unwrap();
    let addr = echo_server(&cert, &key).await;
    let client = ClientTls::from_pem(ca.as_bytes(), Path::new("ca.pem")).unwrap();

    let mut s = Stream::connect(&addr.to_string(), Some(&client)).await.unwrap();
    assert!(s.is_tls());
    s.write_all(b"abcd").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"dcba");

    // By name as well as by address.
    let mut s = Stream::connect(&format!("localhost:{}", addr.port()), Some(&client)).await.unwrap();
    s.write_all(b"wxyz").await.unwrap();
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"zyxw");

    // A blocking client (the pageserver's WAL receiver) too.
    let blocking = client.clone();
    let buf = tokio::task::spawn_blocking(move || {
        let tcp = std::net::TcpStream::connect(addr).unwrap();
        let mut b = blocking.connect_blocking("127.0.0.1", tcp).unwrap();
        b.write_all(b"1234").unwrap();
        b.flush().unwrap();
        let mut buf = [0u8; 4];
        b.read_exact(&mut buf).unwrap();
        buf
    })
    .await
    .unwrap();
    assert_eq!(&buf, b"4321");

    // Another cluster's CA does not vouch for this server.
    let (other_ca, _) = generate_ca().unwrap();
    let stranger = ClientTls::from_pem(other_ca.as_bytes(), Path::new("other.pem")).unwrap();
    let err = Stream::connect(&addr.to_string(), Some(&stranger)).await.expect_err("refused");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let (ca, ca_key) = generate_ca().unwrap();
    let (cert, key) = issue(&ca_key, &names(&["10.11.12.13"])).unwrap();
    let addr = echo_server(&cert, &key).await;
    let client = ClientTls::from_pem(ca.as_bytes(), Path::new("ca.pem")).unwrap();
    let err = Stream::connect(&addr.to_string(), Some(&client)).await.expect_err("refused");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[tokio::test]
async fn a_plaintext_client_gets_nothing_from_a_tls_server() {
    let (_, ca_key) = generate_ca().unwrap();
    let (cert, key) = issue(&ca_key, &names(&["127.0.0.1"])).unwrap();
    let addr = echo_server(&cert, &key).await;
    let mut s = Stream::connect(&addr.to_string(), None).await.unwrap();
    s.write_all(b"abcd").await.unwrap();
    let mut buf = Vec::new();
    // The server fails the handshake and closes; nothing is echoed.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut buf)).await.unwrap();
    assert!(!buf.windows(4).any(|w| w == b"dcba"), "{buf:?}");
}

#[test]
fn bad_files_are_errors_naming_them() {
    let path = Path::new("/etc/strata/tls/host.pem");
    for (cert, key) in
        [("", ""), ("not pem", "not pem"), ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "")]
    {
        let err = ServerTls::from_pem(cert.as_bytes(), key.as_bytes(), path).expect_err("refused");
        assert!(err.to_string().starts_with("/etc/strata/tls/host.pem: "), "{err}");
    }
    let err = ClientTls::from_pem(b"", Path::new("ca.pem")).expect_err("refused");
    assert!(err.to_string().contains("no certificate"), "{err}");
    let err = ClientTls::load(Path::new("/nonexistent/ca.pem")).expect_err("refused");
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert!(issue("not a key", &names(&["127.0.0.1"])).is_err());
}

#[test]
fn hosts_of_addresses() {
    assert_eq!(host_of("127.0.0.1:5432"), "127.0.0.1");
    assert_eq!(host_of("[::1]:5432"), "[::1]");
    assert_eq!(host_of("db.example:80"), "db.example");
    assert_eq!(host_of("db.example"), "db.example");
    assert_eq!(server_name("[::1]").unwrap(), ServerName::try_from("::1").unwrap());
}

#[test]
fn a_key_file_others_can_read_is_refused_and_a_private_one_loads() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("strata-tls-modes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (_, ca_key) = generate_ca().unwrap();
    let (cert, key) = issue(&ca_key, &names(&["127.0.0.1"])).unwrap();
    let (cert_path, key_path) = (dir.join("host.pem"), dir.join("host.key"));
    std::fs::write(&cert_path, &cert).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    // The certificate is public: readable by all is fine.
    std::fs::set_permissions(&cert_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = ServerTls::load(&cert_path, &key_path).expect_err("refused");
    let text = err.to_string();
    let name = key_path.display().to_string();
    assert!(text.starts_with(&format!("{name}: mode 0644 ")) && text.ends_with(&format!("chmod 600 {name}")), "{text}");
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    ServerTls::load(&cert_path, &key_path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
