//! Several controllers on one object storage: one leads, and another takes
//! over when it dies; the state names the term that wrote it.

use std::time::Duration;

use strata_controller::config::{ControllerConfig, PageserverRef};
use strata_controller::env::Env;
use strata_controller::service::Controller;
use strata_protocol::TenantShardId;
use strata_remote_storage::RemoteStorageConfig;
use strata_service::clock::{Clock, SystemClock};

fn config(id: u64, storage: &std::path::Path, tenant: TenantShardId) -> ControllerConfig {
    ControllerConfig {
        id,
        listen_http: format!("127.0.0.1:{}", 7000 + id).parse().unwrap(),
        remote_storage: RemoteStorageConfig::Local { path: storage.to_path_buf() },
        // Nothing answers there: no pageserver is ever online.
        pageservers: vec![PageserverRef {
            name: "ps1".into(),
            pg: "127.0.0.1:1".into(),
            http: "127.0.0.1:1".into(),
            site: None,
        }],
        tenants: vec![tenant],
        auth: None,
        issuer_key: None,
        tls: None,
        heartbeat_interval: Duration::from_millis(100),
        offline_after: Duration::from_millis(300),
        lease_ttl: Duration::from_millis(800),
        max_http_connections: 16,
        split_policy: Default::default(),
    }
}

fn start(conf: ControllerConfig) -> (std::sync::Arc<Controller>, tokio::task::JoinHandle<()>) {
    let store = strata_controller::store::Store::open(&conf.remote_storage).unwrap();
    let client = strata_controller::client::Client::new(None, None, Duration::from_millis(200));
    let c = Controller::new(conf, Env::production(store, client), Default::default());
    let task = tokio::spawn(c.clone().run());
    (c, task)
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = SystemClock.now() + Duration::from_secs(20);
    while !f() {
        assert!(SystemClock.now() < deadline, "{what} did not happen within 20 s");
        SystemClock.sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_controller_leads_and_another_takes_over_when_it_dies() {
    let dir = strata_test_support::scratch_dir("controller-election");
    let tenant = TenantShardId::generate();
    let controllers: Vec<_> = (1..=3).map(|id| start(config(id, &dir, tenant))).collect();
    wait_for("a leader", || controllers.iter().filter(|(c, _)| c.leading().is_some()).count() == 1).await;
    let first = controllers.iter().position(|(c, _)| c.leading().is_some()).unwrap();
    let term = controllers[first].0.leading().unwrap();
    // The leader writes the state with its term; the tenant waits for a pageserver.
    wait_for("the state", || controllers[first].0.status().state.is_some_and(|s| s.leader_term == term)).await;
    let s = controllers[first].0.status().state.unwrap();
    assert_eq!(s.tenants[&tenant].attached, None);
    // Followers read it too.
    let other = (first + 1) % 3;
    wait_for("a follower's copy", || controllers[other].0.status().state.is_some_and(|s| s.leader_term == term)).await;
    assert!(!controllers[other].0.status().leader);

    // The leader dies: exactly one other takes over under a higher term, and writes the state with it.
    let died = SystemClock.now();
    controllers[first].1.abort();
    let alive: Vec<_> = controllers.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, c)| c).collect();
    wait_for("a new leader", || alive.iter().filter(|(c, _)| c.leading().is_some()).count() == 1).await;
    let took = SystemClock.since(died);
    let new = alive.iter().find(|(c, _)| c.leading().is_some()).unwrap();
    let new_term = new.0.leading().unwrap();
    assert!(new_term > term, "{new_term} > {term}");
    // Not before the lease could have run out, nor much after.
    assert!(took < Duration::from_secs(10), "{took:?}");
    wait_for("the state under the new term", || new.0.status().state.is_some_and(|s| s.leader_term == new_term)).await;
    assert!(alive.iter().all(|(c, _)| c.status().leader_term >= new_term || !c.status().leader));
    for (_, t) in &controllers {
        t.abort();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
