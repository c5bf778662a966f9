//! The eager-mode compute agent end to end: three safekeepers (in this
//! process), a stand-in pageserver that serves a basebackup tarred from a
//! stock `initdb`, and a real PostgreSQL 15 that is restored, started, used,
//! stopped, and started again from its stopped state. The PostgreSQL tests
//! fail if its binaries are not installed (set PG_BIN to use others).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_compute::agent::{self, AgentConfig};
use strata_formats::v15::control::{ControlFile, DbState};
use strata_formats::Lsn;
use strata_protocol::api::pageserver::{TimelineState, TimelineStatus};
use strata_protocol::{TenantId, TimelineId};
use strata_service::clock::{Clock, SystemClock};
use strata_test_support::{as_root, blocking, free_port, pg_bin, pg_command, run, scratch_dir};
use tokio::sync::{oneshot, watch};

const SEG: u64 = 16 << 20;
/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);

/// What the stand-in pageserver answers.
struct FakeState {
    system_id: u64,
    last_record_lsn: Lsn,
    /// Answer `last_record_lsn` 0/0 this many times first (a lagging pageserver).
    lagging_answers: u32,
    /// Answer the timeline request with this status and error instead.
    failure: Option<(u16, String)>,
    state: TimelineState,
    tar: Vec<u8>,
    /// Query strings of the basebackup requests.
    basebackup_requests: Vec<HashMap<String, String>>,
}

/// A pageserver's HTTP API, as far as the agent uses it.
async fn fake_pageserver(state: Arc<Mutex<FakeState>>) -> SocketAddr {
    use axum::extract::{Query, State};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::get;
    type Shared = Arc<Mutex<FakeState>>;
    async fn timeline(
        State(s): State<Shared>,
        axum::extract::Path((tenant, timeline)): axum::extract::Path<(TenantId, TimelineId)>,
    ) -> axum::response::Response {
        let mut s = s.lock().unwrap();
        if let Some((code, message)) = &s.failure {
            let code = StatusCode::from_u16(*code).unwrap();
            return (code, axum::Json(serde_json::json!({ "error": message }))).into_response();
        }
        let lsn = if s.lagging_answers > 0 {
            s.lagging_answers -= 1;
            Lsn::INVALID
        } else {
            s.last_record_lsn
        };
        let mut status = TimelineStatus::new(tenant.into(), timeline, s.system_id, SEG as u32, Lsn(SEG));
        status.last_record_lsn = lsn;
        status.state = s.state;
        if s.state == TimelineState::Broken {
            status.error = Some("a layer file is missing".into());
        }
        axum::Json(status).into_response()
    }
    async fn basebackup(State(s): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Vec<u8> {
        let mut s = s.lock().unwrap();
        s.basebackup_requests.push(q);
        s.tar.clone()
    }
    let router = axum::Router::new()
        .route("/v1/tenant/{tenant}/timeline/{timeline}", get(timeline))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/basebackup", get(basebackup))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Three safekeepers serving in this process.
struct Safekeepers {
    addresses: Vec<String>,
    http: Vec<SocketAddr>,
    stop: Vec<oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Safekeepers {
    async fn start(base: &Path) -> Safekeepers {
        let mut s = Safekeepers { addresses: Vec::new(), http: Vec::new(), stop: Vec::new(), tasks: Vec::new() };
        for id in 1..=3 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let (addr, http_addr) = (listener.local_addr().unwrap(), http.local_addr().unwrap());
            let dir = base.join(format!("sk{id}"));
            std::fs::create_dir_all(&dir).unwrap();
            let config_path = dir.join("safekeeper.toml");
            std::fs::write(
                &config_path,
                format!(
                    "id = {id}\nlisten = \"{addr}\"\nlisten_http = \"{http_addr}\"\ndata_dir = \"{}\"\nfsync = false\n",
                    dir.join("data").display()
                ),
            )
            .unwrap();
            let config = strata_safekeeper::config::SafekeeperConfig::load(&config_path).unwrap();
            let (tx, rx) = oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                let shutdown = async move {
                    let _ = rx.await;
                };
                if let Err(e) = strata_safekeeper::serve(config, listener, http, None, shutdown).await {
                    panic!("safekeeper {id}: {e}");
                }
            });
            s.addresses.push(addr.to_string());
            s.http.push(http_addr);
            s.stop.push(tx);
            s.tasks.push(task);
        }
        s
    }

    async fn create_timeline(&self, tenant: TenantId, timeline: TimelineId, system_id: u64, start: Lsn) {
        for http in &self.http {
            let url = format!("http://{http}/v1/tenant/{tenant}/timeline/{timeline}");
            let body = serde_json::json!({
                "system_id": system_id, "pg_version": 15, "wal_segment_size": SEG, "start_lsn": start.to_string(),
            })
            .to_string();
            blocking(move || ureq::post(&url).header("Content-Type", "application/json").send(body).unwrap()).await;
        }
    }

    /// Each safekeeper's (flush LSN, commit LSN) of the timeline.
    async fn positions(&self, tenant: TenantId, timeline: TimelineId) -> Vec<(Lsn, Lsn)> {
        let mut out = Vec::new();
        for http in &self.http {
            let v = get_json(format!("http://{http}/v1/tenant/{tenant}/timeline/{timeline}")).await;
            let lsn = |k: &str| v[k].as_str().unwrap().parse::<Lsn>().unwrap();
            out.push((lsn("flush_lsn"), lsn("commit_lsn")));
        }
        out
    }

    /// Stops them and waits until they have written their control files.
    async fn stop(self) {
        for tx in self.stop {
            let _ = tx.send(());
        }
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

async fn get_json(url: String) -> serde_json::Value {
    let text = blocking(move || ureq::get(&url).call().unwrap().into_body().read_to_string().unwrap()).await;
    serde_json::from_str(&text).unwrap()
}

async fn get_text(url: String) -> String {
    blocking(move || ureq::get(&url).call().unwrap().into_body().read_to_string().unwrap()).await
}

/// The password the tests' computes are given (file mode 0600).
const PASSWORD: &str = "agent-test-password";

/// A password file for an agent config under `dir`.
fn password_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("password");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path).unwrap();
    std::io::Write::write_all(&mut f, PASSWORD.as_bytes()).unwrap();
    path
}

/// Runs SQL over TCP as the application role (with SCRAM), as clients do;
/// the unaligned output.
async fn psql(port: u16, sql: &str) -> String {
    let sql = sql.to_string();
    blocking(move || {
        let out = run(Command::new(pg_bin().join("psql"))
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args(["-p", &port.to_string(), "-U", "app", "-d", "postgres", "-c", &sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGPASSWORD", PASSWORD)
            .env("PGOPTIONS", "-c statement_timeout=30s"));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
    .await
}

/// A tar of the directory `dir`, entries named `./…` as `tar -C dir .` would.
fn tar_of(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

fn control_file(pgdata: &Path) -> ControlFile {
    ControlFile::decode(&std::fs::read(pgdata.join("global/pg_control")).unwrap()).unwrap()
}

/// Polls the agent's status until `running`; panics on `failed` or if the task ended.
async fn wait_running(
    http: SocketAddr,
    task: &tokio::task::JoinHandle<Result<agent::Ended, agent::AgentError>>,
) -> serde_json::Value {
    let deadline = SystemClock.now() + Duration::from_secs(120);
    loop {
        assert!(!task.is_finished(), "the agent stopped before running");
        let url = format!("http://{http}/v1/status");
        let status =
            blocking(move || ureq::get(&url).call().ok().and_then(|r| r.into_body().read_to_string().ok())).await;
        if let Some(text) = status {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            match v["state"].as_str().unwrap() {
                "running" => return v,
                "failed" => panic!("the agent failed: {}", v["error"]),
                _ => {}
            }
        }
        assert!(SystemClock.now() < deadline, "the agent did not reach running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn starts_uses_stops_and_restarts_a_compute() {
    assert!(
        pg_bin().join("postgres").exists(),
        "no PostgreSQL binaries in {}: install postgresql-15 (scripts/setup.sh) or set PG_BIN",
        pg_bin().display()
    );
    tokio::time::timeout(TEST_TIMEOUT, compute_life_cycle()).await.expect("test timed out");
}

async fn compute_life_cycle() {
    let base = scratch_dir("agent-cycle");
    let root = as_root();

    // A stock cluster, as a pageserver's basebackup would look like.
    let initdb_dir = base.join("initdb");
    std::fs::create_dir_all(&initdb_dir).unwrap();
    if root {
        run(Command::new("chown").arg("postgres:postgres").arg(&initdb_dir));
    }
    run(pg_command("initdb").arg("-D").arg(&initdb_dir).args([
        "-A",
        "trust",
        "-U",
        "postgres",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ]));
    let control = control_file(&initdb_dir);
    let system_id = control.system_identifier;
    let timeline_start = Lsn(control.checkpoint.0 - control.checkpoint.0 % SEG);

    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    let safekeepers = Safekeepers::start(&base).await;
    safekeepers.create_timeline(tenant, timeline, system_id, timeline_start).await;

    let tar = tar_of(&initdb_dir);
    let fake = Arc::new(Mutex::new(FakeState {
        system_id,
        last_record_lsn: timeline_start,
        lagging_answers: 0,
        failure: None,
        state: TimelineState::Active,
        tar: tar.clone(),
        basebackup_requests: Vec::new(),
    }));
    let pageserver = fake_pageserver(fake.clone()).await;

    let pgdata = base.join("compute").join("pgdata");
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = free_port();
    let mut cfg = AgentConfig::new(
        pgdata.clone(),
        port,
        safekeepers.addresses.clone(),
        tenant,
        timeline,
        pageserver.to_string(),
        password_file(&base),
    );
    cfg.http = Some(http);
    cfg.pg_bin_dir = pg_bin();
    cfg.shared_buffers = "32MB".into();
    cfg.wait_timeout = Duration::from_secs(30);
    cfg.stop_timeout = Duration::from_secs(30);

    // First start: from the initdb tar.
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(agent::run(cfg.clone(), stop_rx));
    let status = wait_running(http, &task).await;
    eprintln!("first start: {status:#}");
    assert_eq!(status["pg_port"], port);
    assert_eq!(status["pgdata"], pgdata.to_str().unwrap());
    assert_eq!(status["start_lsn"], timeline_start.to_string());
    assert_eq!(status["proposer"]["streaming"], true);
    assert_eq!(status["timings"]["basebackup_bytes"], tar.len() as u64);
    {
        let s = fake.lock().unwrap();
        assert_eq!(s.basebackup_requests.len(), 1);
        assert_eq!(s.basebackup_requests[0]["lsn"], timeline_start.to_string());
        assert_eq!(s.basebackup_requests[0]["full"], "true");
    }
    let meta = std::fs::metadata(&pgdata).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700);
    if root {
        assert_eq!(meta.uid(), strata_compute::agent::postgres::lookup_user("postgres").unwrap().uid);
    }
    assert!(pgdata.parent().unwrap().join("postgres.log").exists());

    assert_eq!(
        psql(port, "SHOW wal_consistency_checking").await,
        strata_compute::agent::pgconf::wal_consistency_checking(false)
    );
    assert_eq!(psql(port, "SHOW fsync").await, "off");
    assert_eq!(psql(port, "SHOW timezone").await, "UTC");
    assert_eq!(
        psql(port, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'strata_proposer'").await,
        "sync"
    );
    // Commits return only once a quorum of safekeepers holds them.
    psql(port, "CREATE TABLE t (id int PRIMARY KEY, v text)").await;
    psql(port, "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 5000) g").await;
    assert_eq!(psql(port, "SELECT count(*) FROM t").await, "5000");

    let metrics = get_text(format!("http://{http}/metrics")).await;
    assert!(metrics.contains("strata_compute_state{state=\"running\"} 1"), "{metrics}");
    assert!(metrics.contains(&format!("strata_compute_basebackup_bytes {}", tar.len())), "{metrics}");
    assert!(metrics.contains("strata_compute_start_total_seconds"), "{metrics}");
    assert!(metrics.contains("strata_proposer_commit_lsn"), "{metrics}");

    // Graceful stop: the shutdown checkpoint reaches a quorum.
    stop_tx.send(true).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), task).await.expect("stop timed out").unwrap();
    assert_eq!(ended.expect("clean stop"), agent::Ended::Stopped);
    let stopped = control_file(&pgdata);
    assert_eq!(stopped.state, DbState::Shutdowned);
    let positions = safekeepers.positions(tenant, timeline).await;
    let holding = positions.iter().filter(|(flush, _)| *flush > stopped.checkpoint).count();
    assert!(holding >= 2, "the shutdown checkpoint at {} is not on a quorum: {positions:?}", stopped.checkpoint);
    assert!(positions.iter().any(|(_, commit)| *commit > stopped.checkpoint), "{positions:?}");
    let end = positions.iter().map(|(flush, _)| *flush).max().unwrap();

    // Second start, from the stopped data directory (as the pageserver would
    // rebuild it), behind a pageserver that lags for a few answers.
    {
        let mut s = fake.lock().unwrap();
        s.tar = tar_of(&pgdata);
        s.last_record_lsn = end;
        s.lagging_answers = 3;
    }
    std::fs::write(pgdata.join("stale-file"), b"from the last run").unwrap();
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(agent::run(cfg.clone(), stop_rx));
    let status = wait_running(http, &task).await;
    eprintln!("second start: {status:#}");
    assert_eq!(status["start_lsn"], end.to_string());
    assert!(status["timings"]["wait_seconds"].as_f64().unwrap() > 0.0, "{status}");
    assert!(!pgdata.join("stale-file").exists());
    assert_eq!(psql(port, "SELECT count(*) FROM t").await, "5000");
    psql(port, "INSERT INTO t VALUES (5001, 'after restart')").await;
    assert_eq!(psql(port, "SELECT v FROM t WHERE id = 5001").await, "after restart");
    stop_tx.send(true).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), task).await.expect("stop timed out").unwrap();
    assert_eq!(ended.expect("clean stop"), agent::Ended::Stopped);
    let second = control_file(&pgdata);
    let positions = safekeepers.positions(tenant, timeline).await;
    assert!(positions.iter().filter(|(flush, _)| *flush > second.checkpoint).count() >= 2, "{positions:?}");

    // Third start, with an idle period: without a client the agent stops
    // PostgreSQL as a stop does and ends suspended, its marker beside the
    // data directory; the next start removes the marker once running.
    {
        let mut s = fake.lock().unwrap();
        s.tar = tar_of(&pgdata);
        s.last_record_lsn = positions.iter().map(|(flush, _)| *flush).max().unwrap();
    }
    let marker = agent::suspend::marker_path(&pgdata);
    let idle = AgentConfig { suspend_after: Some(Duration::from_secs(1)), ..cfg.clone() };
    let (_stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(agent::run(idle.clone(), stop_rx));
    wait_running(http, &task).await;
    let ended = tokio::time::timeout(Duration::from_secs(60), task).await.expect("no suspension").unwrap();
    let agent::Ended::Suspended(m) = ended.expect("a clean suspension") else { panic!("not suspended") };
    assert_eq!(m.phase, agent::suspend::Phase::Suspended);
    assert!(m.idle_secs >= 1, "{m:?}");
    assert_eq!(agent::suspend::read_marker(&marker), Some(m));
    let suspended = control_file(&pgdata);
    assert_eq!(suspended.state, DbState::Shutdowned);
    let positions = safekeepers.positions(tenant, timeline).await;
    assert!(positions.iter().filter(|(flush, _)| *flush > suspended.checkpoint).count() >= 2, "{positions:?}");
    {
        let mut s = fake.lock().unwrap();
        s.tar = tar_of(&pgdata);
        s.last_record_lsn = positions.iter().map(|(flush, _)| *flush).max().unwrap();
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(agent::run(cfg.clone(), stop_rx));
    wait_running(http, &task).await;
    assert!(!marker.exists(), "woken: the marker is gone");
    assert_eq!(psql(port, "SELECT v FROM t WHERE id = 5001").await, "after restart");
    stop_tx.send(true).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), task).await.expect("stop timed out").unwrap();
    assert_eq!(ended.expect("clean stop"), agent::Ended::Stopped);

    safekeepers.stop().await;
    let _ = std::fs::remove_dir_all(&base);
}

/// An agent config against `pageserver`, with safekeepers that are never reached.
fn config_without_safekeepers(base: &Path, pageserver: String) -> AgentConfig {
    let mut cfg = AgentConfig::new(
        base.join("pgdata"),
        free_port(),
        vec![format!("127.0.0.1:{}", free_port()); 3],
        TenantId::generate(),
        TimelineId::generate(),
        pageserver,
        password_file(base),
    );
    cfg.failed_linger = Duration::ZERO;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_pageserver_errors_with_context() {
    let base = scratch_dir("agent-errors");
    let fake = Arc::new(Mutex::new(FakeState {
        system_id: 1,
        last_record_lsn: Lsn(SEG),
        lagging_answers: 0,
        failure: None,
        state: TimelineState::Broken,
        tar: Vec::new(),
        basebackup_requests: Vec::new(),
    }));
    let pageserver = fake_pageserver(fake.clone()).await;
    let cfg = config_without_safekeepers(&base, pageserver.to_string());
    let (_stop_tx, stop_rx) = watch::channel(false);
    let err = agent::run(cfg.clone(), stop_rx.clone()).await.unwrap_err();
    assert_eq!(err.phase, "pageserver");
    assert!(err.message.contains("a layer file is missing"), "{err}");
    assert!(err.message.contains(&cfg.tenant_id.to_string()), "{err}");

    fake.lock().unwrap().failure = Some((404, "timeline not found".into()));
    let err = agent::run(cfg, stop_rx).await.unwrap_err();
    assert!(err.message.contains("HTTP 404") && err.message.contains("timeline not found"), "{err}");
    assert!(!base.join("pgdata").exists(), "nothing is touched before the start LSN is known");
    let _ = std::fs::remove_dir_all(&base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_waiting_for_the_pageserver_ends_cleanly() {
    let base = scratch_dir("agent-early-stop");
    // Nothing listens there: the agent keeps retrying.
    let cfg = config_without_safekeepers(&base, format!("127.0.0.1:{}", free_port()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(agent::run(cfg, stop_rx));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished());
    let t = SystemClock.now();
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops promptly").unwrap().unwrap();
    assert!(SystemClock.since(t) < Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&base);
}

/// A restart drops the old proposer: its safekeeper connections must close
/// at once, not when their own timeouts expire (10 s for a greeting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_proposer_keeps_no_safekeeper_connection() {
    use strata_compute::proposer::{self, ProposerConfig};
    use strata_protocol::safekeeper::TimelineIdentity;
    use tokio::io::AsyncReadExt;

    // Accepts connections and never answers: the links wait for a greeting.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let identity = TimelineIdentity {
        tenant_id: TenantId::generate(),
        timeline_id: TimelineId::generate(),
        system_id: 1,
        pg_version: 15,
        wal_segment_size: SEG as u32,
    };
    let cfg = ProposerConfig::new(vec![address; 3], identity);
    let sync = tokio::spawn(proposer::sync_safekeepers(cfg));
    let mut accepted = Vec::new();
    for _ in 0..3 {
        let (socket, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await.unwrap().unwrap();
        accepted.push(socket);
    }
    sync.abort();
    assert!(sync.await.unwrap_err().is_cancelled());
    let t = SystemClock.now();
    for mut socket in accepted {
        let mut buf = vec![0u8; 4096];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(3), socket.read(&mut buf))
                .await
                .expect("the dropped proposer's connection stays open")
                .unwrap_or(0);
            if n == 0 {
                break;
            }
        }
    }
    assert!(SystemClock.since(t) < Duration::from_secs(3), "{:?}", SystemClock.since(t));
    // And it does not come back.
    assert!(tokio::time::timeout(Duration::from_millis(500), listener.accept()).await.is_err());
}
