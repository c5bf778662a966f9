//! The pageserver refuses to start on a config that would break it, and
//! says which key is wrong.

use strata_pageserver::config::PageserverConfig;

fn config(extra: &str, pg: std::net::SocketAddr, http: std::net::SocketAddr) -> PageserverConfig {
    let dir = std::env::temp_dir().join(format!("strata-ps-config-{}", std::process::id()));
    toml::from_str(&format!(
        "id = 1\nlisten_pg = \"{pg}\"\nlisten_http = \"{http}\"\ndata_dir = {:?}\n{extra}\n",
        dir.display().to_string()
    ))
    .unwrap()
}

fn free_port() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], strata_test_support::free_port()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_in_use_and_broken_values_are_refused_naming_the_key() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap();
    let err = strata_pageserver::run(config("", free_port(), addr)).await.unwrap_err().to_string();
    assert!(err.starts_with(&format!("listen_http = {addr}: ")) && err.contains("in use"), "{err}");
    let err = strata_pageserver::run(config("", addr, free_port())).await.unwrap_err().to_string();
    assert!(err.starts_with(&format!("listen_pg = {addr}: ")), "{err}");
    for (extra, key) in [("wait_lsn_timeout = 0", "wait_lsn_timeout"), ("max_connections = 0", "max_connections")] {
        let err = strata_pageserver::run(config(extra, free_port(), free_port())).await.unwrap_err().to_string();
        assert!(err.contains(key), "{extra}: {err}");
    }
}
