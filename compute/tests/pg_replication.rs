//! The physical replication client against a real PostgreSQL 15 (started
//! in a temporary directory; the tests fail if its binaries are not
//! installed) and against scripted fake servers for the error paths.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pgwire::messages::copy::{CopyBothResponse, CopyData, CopyDone};
use pgwire::messages::data::{DataRow, FieldDescription, RowDescription};
use pgwire::messages::response::{CommandComplete, ErrorResponse, NoticeResponse, ReadyForQuery, TransactionStatus};
use pgwire::messages::startup::{Authentication, BackendKeyData, ParameterStatus, SecretKey};
use strata_compute::pg_replication::{
    PgError, ReplicationConfig, ReplicationConnection, ReplicationEvent, ReplicationStream,
};
use strata_formats::v15::rmgr::{RM_HEAP_ID, RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN};
use strata_formats::wal::{StartPosition, WalDecoder};
use strata_formats::{Lsn, PgVersion};
use strata_service::clock::{Clock, SystemClock};
use strata_test_support::{as_root, blocking, free_port, pg_bin, pg_command, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout};

const SEG: u64 = 16 << 20;
const XLOG_HEAP_OPMASK: u8 = 0x70;
const XLOG_HEAP_INSERT: u8 = 0x00;
/// Bound on every test.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);

/// A PostgreSQL 15 cluster in a temporary directory, stopped and removed on drop.
struct PgServer {
    dir: PathBuf,
    port: u16,
}

impl PgServer {
    /// Starts a cluster with trust authentication; `hba_first` goes before
    /// initdb's pg_hba.conf lines. Fails the test if PostgreSQL is not
    /// installed (`scripts/setup.sh` installs it; PG_BIN points elsewhere).
    fn start(hba_first: &str) -> PgServer {
        assert!(
            pg_bin().join("postgres").exists(),
            "no PostgreSQL binaries in {}: install postgresql-15 (scripts/setup.sh) or set PG_BIN",
            pg_bin().display()
        );
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "strata-pgrepl-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // From here on, dropping the guard cleans up.
        let server = PgServer { dir, port: free_port() };
        if as_root() {
            run(Command::new("chown").arg("-R").arg("postgres:postgres").arg(&server.dir));
        }
        let data = server.data_dir();
        run(pg_command("initdb").arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]));
        let conf = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             wal_level = replica\nmax_wal_senders = 4\nmax_replication_slots = 4\n\
             fsync = off\nshared_buffers = 16MB\n",
            server.port,
            server.dir.display()
        );
        append(&data.join("postgresql.conf"), &conf);
        let hba_path = data.join("pg_hba.conf");
        let hba = std::fs::read_to_string(&hba_path).unwrap();
        std::fs::write(&hba_path, format!("{hba_first}\n{hba}")).unwrap();
        run(pg_command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(server.dir.join("log"))
            .args(["-w", "-t", "60", "start"]));
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn socket_dir(&self) -> String {
        self.dir.to_str().unwrap().to_string()
    }

    fn config(&self, user: &str, application_name: &str) -> ReplicationConfig {
        ReplicationConfig {
            host: self.socket_dir(),
            port: self.port,
            user: user.into(),
            password: None,
            application_name: application_name.into(),
            ..ReplicationConfig::new("", 0, "")
        }
    }

    /// Runs SQL as superuser in a normal session; returns the unaligned output.
    fn psql(&self, sql: &str) -> String {
        let out = run(Command::new(pg_bin().join("psql"))
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGOPTIONS", "-c statement_timeout=30s"));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn system_id(&self) -> u64 {
        let out = run(Command::new(pg_bin().join("pg_controldata")).arg("-D").arg(self.data_dir()));
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text.lines().find(|l| l.starts_with("Database system identifier:")).unwrap();
        line.split(':').nth(1).unwrap().trim().parse().unwrap()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = pg_command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .output();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.join("log")) {
                eprintln!("--- PostgreSQL log ---\n{log}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
}

const APP: &str = "strata_repl_test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_wal_from_postgres() {
    let pg = PgServer::start("");
    let pg = std::sync::Arc::new(pg);
    timeout(TEST_TIMEOUT, streams_wal(pg.clone())).await.expect("test timed out");
}

async fn streams_wal(pg: std::sync::Arc<PgServer>) {
    let cfg = pg.config("postgres", APP);
    let mut conn = ReplicationConnection::connect(&cfg).await.unwrap();
    assert!(conn.parameter("server_version").unwrap().starts_with("15"), "{conn:?}");
    assert!(conn.backend_pid().is_some());

    let id = conn.identify_system().await.unwrap();
    assert_eq!(id.system_id, pg.system_id());
    assert_eq!(id.timeline, 1);
    assert!(id.xlogpos > Lsn(0));
    let flush: Lsn = pg.psql("select pg_current_wal_flush_lsn()").parse().unwrap();
    assert!(id.xlogpos <= flush, "xlogpos {} flush {flush}", id.xlogpos);

    assert_eq!(conn.simple_query("SHOW wal_level").await.unwrap(), vec![vec![Some("replica".to_string())]]);
    // A plain SQL query is refused on a physical replication connection,
    // and the connection stays usable.
    let err = conn.simple_query("SELECT 1").await.unwrap_err();
    assert!(matches!(err, PgError::Server { .. }), "{err:?}");
    assert!(conn.create_physical_slot("strata_test").await.unwrap());
    assert!(!conn.create_physical_slot("strata_test").await.unwrap());
    assert!(matches!(conn.create_physical_slot("Bad-Name").await, Err(PgError::InvalidArgument(_))));
    let slot =
        pg.psql("select slot_type, restart_lsn is not null from pg_replication_slots where slot_name = 'strata_test'");
    assert_eq!(slot, "physical|t");

    // The same over TCP.
    let tcp_cfg = ReplicationConfig { host: "127.0.0.1".into(), ..pg.config("postgres", "strata_tcp") };
    let mut tcp = ReplicationConnection::connect(&tcp_cfg).await.unwrap();
    assert_eq!(tcp.identify_system().await.unwrap().system_id, id.system_id);
    drop(tcp);

    let seg_start = Lsn(id.xlogpos.0 - id.xlogpos.0 % SEG);
    let mut stream = conn.start_physical(Some("strata_test"), seg_start, id.timeline).await.unwrap();

    let pg2 = pg.clone();
    blocking(move || {
        pg2.psql("create table t (id int primary key, v text); insert into t select g, 'row ' || g from generate_series(1, 1000) g")
    })
    .await;
    let pg2 = pg.clone();
    let target: Lsn = blocking(move || pg2.psql("select pg_current_wal_flush_lsn()")).await.parse().unwrap();
    assert!(target > id.xlogpos);

    let mut rx = Receiver::new(seg_start, id.system_id);
    let mut cancelled = 0;
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    while rx.end < target {
        // Racing a timer exercises cancelling `next` with a real server.
        let event = tokio::select! {
            event = stream.next() => event.unwrap(),
            _ = ticker.tick() => { cancelled += 1; continue; }
        };
        assert!(rx.handle(&mut stream, event).await, "stream ended at {}", rx.end);
    }
    let end = rx.end;
    eprintln!("streamed {seg_start}..{end} (target {target}); {cancelled} cancelled next() calls; {rx:?}");
    assert!(rx.records > 0);
    assert!(rx.heap_inserts >= 1000, "{rx:?}");

    stream.send_status(end, end, end, false).await.unwrap();
    let deadline = SystemClock.now() + Duration::from_secs(10);
    loop {
        let pg2 = pg.clone();
        let row = blocking(move || {
            pg2.psql(&format!("select flush_lsn from pg_stat_replication where application_name = '{APP}'"))
        })
        .await;
        if !row.is_empty() && row.parse::<Lsn>().unwrap() > Lsn(0) {
            assert_eq!(row.parse::<Lsn>().unwrap(), end);
            break;
        }
        assert!(SystemClock.now() < deadline, "pg_stat_replication shows flush_lsn {row:?}");
        sleep(Duration::from_millis(50)).await;
    }
    // The physical slot follows the reported flush position.
    let pg2 = pg.clone();
    let restart = blocking(move || {
        pg2.psql("select restart_lsn, active from pg_replication_slots where slot_name = 'strata_test'")
    })
    .await;
    assert_eq!(restart, format!("{end}|t"));

    // Terminating the walsender: a FATAL ErrorResponse, then the connection closes.
    let pg2 = pg.clone();
    blocking(move || {
        pg2.psql(&format!("select pg_terminate_backend(pid) from pg_stat_replication where application_name = '{APP}'"))
    })
    .await;
    let ending = drain(&mut stream, &mut rx).await;
    match &ending {
        Err(e) => assert_eq!(e.code(), Some("57P01"), "{e:?}"),
        Ok(event) => assert_eq!(event, &ReplicationEvent::End),
    }
    assert_eq!(stream.next().await.unwrap(), ReplicationEvent::End);
    assert_eq!(stream.next().await.unwrap(), ReplicationEvent::End);

    // Resume through the slot where the last stream stopped (once the old
    // walsender has released the slot).
    let deadline = SystemClock.now() + Duration::from_secs(10);
    let mut stream = loop {
        let conn = ReplicationConnection::connect(&cfg).await.unwrap();
        match conn.start_physical(Some("strata_test"), rx.end, id.timeline).await {
            Ok(stream) => break stream,
            // "replication slot ... is active for PID ..."
            Err(e) if e.code() == Some("55006") && SystemClock.now() < deadline => {
                sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };

    // A fast shutdown: the walsender sends the shutdown checkpoint, asks for
    // a reply, waits until the standby reports it flushed everything and
    // ends the stream with CommandComplete.
    let pg2 = pg.clone();
    let stopper = tokio::task::spawn_blocking(move || {
        pg_command("pg_ctl").arg("-D").arg(pg2.data_dir()).args(["-m", "fast", "-w", "-t", "60", "stop"]).output()
    });
    let keepalives_before = rx.keepalives;
    rx.shutdown_checkpoint = None; // initdb's was in the first segment
    let ending = drain(&mut stream, &mut rx).await;
    assert_eq!(ending.unwrap(), ReplicationEvent::End, "{rx:?}");
    let stopped = stopper.await.unwrap().unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    eprintln!("after fast shutdown: {rx:?}");
    assert!(rx.keepalives > keepalives_before);
    assert!(rx.shutdown_checkpoint.is_some_and(|lsn| lsn >= end), "{rx:?}");
}

/// Checks and decodes what a stream delivers.
struct Receiver {
    decoder: WalDecoder,
    end: Lsn,
    last_record: Lsn,
    messages: usize,
    keepalives: usize,
    records: usize,
    heap_inserts: usize,
    shutdown_checkpoint: Option<Lsn>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "end {}, {} XLogData messages, {} keepalives, {} records, {} heap inserts, shutdown checkpoint at {:?}",
            self.end, self.messages, self.keepalives, self.records, self.heap_inserts, self.shutdown_checkpoint
        )
    }
}

impl Receiver {
    fn new(start: Lsn, system_id: u64) -> Receiver {
        let mut decoder = WalDecoder::new(PgVersion::V15, start, SEG, StartPosition::FindFirstRecord);
        decoder.set_system_id(system_id);
        Receiver {
            decoder,
            end: start,
            last_record: Lsn(0),
            messages: 0,
            keepalives: 0,
            records: 0,
            heap_inserts: 0,
            shutdown_checkpoint: None,
        }
    }

    /// Handles one event, answering keepalives that ask for a reply; false at the end.
    async fn handle(&mut self, stream: &mut ReplicationStream, event: ReplicationEvent) -> bool {
        match event {
            ReplicationEvent::XLogData { start, server_end, data } => {
                assert_eq!(start, self.end, "WAL is not contiguous");
                self.end = Lsn(start.0 + data.len() as u64);
                assert!(server_end >= self.end, "server_end {server_end} < {}", self.end);
                self.messages += 1;
                self.decoder.feed(&data);
                while let Some(record) = self.decoder.next_record().unwrap() {
                    assert!(record.lsn > self.last_record);
                    self.last_record = record.lsn;
                    self.records += 1;
                    let (rmgr, info) = (record.header.rmgr, record.header.info);
                    if rmgr == RM_HEAP_ID && info & XLOG_HEAP_OPMASK == XLOG_HEAP_INSERT {
                        self.heap_inserts += 1;
                    }
                    if rmgr == RM_XLOG_ID && info & 0xf0 == XLOG_CHECKPOINT_SHUTDOWN {
                        self.shutdown_checkpoint = Some(record.lsn);
                    }
                }
            }
            ReplicationEvent::Keepalive { server_end, reply_requested } => {
                self.keepalives += 1;
                assert!(server_end >= self.end);
                if reply_requested {
                    stream.send_status(self.end, self.end, self.end, false).await.unwrap();
                }
            }
            ReplicationEvent::End => return false,
        }
        true
    }
}

/// Reads a stream until it ends or fails; returns how.
async fn drain(stream: &mut ReplicationStream, rx: &mut Receiver) -> Result<ReplicationEvent, PgError> {
    loop {
        match stream.next().await? {
            ReplicationEvent::End => return Ok(ReplicationEvent::End),
            event => {
                rx.handle(stream, event).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_server_errors() {
    let hba = "local replication md5user md5\n\
               local replication pwuser password\n\
               local replication scramuser scram-sha-256\n";
    let pg = PgServer::start(hba);
    timeout(TEST_TIMEOUT, auth_and_errors(&pg)).await.expect("test timed out");
}

async fn auth_and_errors(pg: &PgServer) {
    pg.psql(
        "set password_encryption = 'md5'; \
         create role md5user login replication password 'md5secret'; \
         create role pwuser login replication password 'pw secret'; \
         set password_encryption = 'scram-sha-256'; \
         create role scramuser login replication password 'scramsecret'; \
         create role norepl login",
    );
    assert!(pg.psql("select rolpassword from pg_authid where rolname = 'md5user'").starts_with("md5"));
    let with_password = |user: &str, password: Option<&str>| ReplicationConfig {
        password: password.map(String::from),
        ..pg.config(user, "strata_auth_test")
    };
    let server_error = |result: Result<ReplicationConnection, PgError>| match result.unwrap_err() {
        PgError::Server { severity, code, message } => (severity, code, message),
        other => panic!("expected a server error, got {other:?}"),
    };

    // With trust authentication, an unknown role is refused.
    let (severity, code, message) = server_error(ReplicationConnection::connect(&pg.config("no_such_role", "x")).await);
    assert_eq!((severity.as_str(), code.as_str()), ("FATAL", "28000"));
    assert!(message.contains("does not exist"), "{message}");

    // MD5.
    let mut conn = ReplicationConnection::connect(&with_password("md5user", Some("md5secret"))).await.unwrap();
    assert_eq!(conn.identify_system().await.unwrap().system_id, pg.system_id());
    drop(conn);
    let (_, code, _) = server_error(ReplicationConnection::connect(&with_password("md5user", Some("wrong"))).await);
    assert_eq!(code, "28P01");
    let err = ReplicationConnection::connect(&with_password("md5user", None)).await.unwrap_err();
    assert!(matches!(err, PgError::Auth(_)), "{err:?}");

    // Cleartext password.
    let mut conn = ReplicationConnection::connect(&with_password("pwuser", Some("pw secret"))).await.unwrap();
    conn.identify_system().await.unwrap();
    drop(conn);
    let (_, code, _) = server_error(ReplicationConnection::connect(&with_password("pwuser", Some("pw"))).await);
    assert_eq!(code, "28P01");

    // SCRAM-SHA-256: the right password, a wrong one, none.
    let mut conn = ReplicationConnection::connect(&with_password("scramuser", Some("scramsecret"))).await.unwrap();
    assert_eq!(conn.identify_system().await.unwrap().system_id, pg.system_id());
    drop(conn);
    let (_, code, _) = server_error(ReplicationConnection::connect(&with_password("scramuser", Some("wrong"))).await);
    assert_eq!(code, "28P01");
    let err = ReplicationConnection::connect(&with_password("scramuser", None)).await.unwrap_err();
    assert!(matches!(err, PgError::Auth(_)), "{err:?}");

    // A normal session (not a walsender) runs SQL.
    let normal = ReplicationConfig { replication: false, ..pg.config("postgres", "x") };
    let mut conn = ReplicationConnection::connect(&normal).await.unwrap();
    assert_eq!(conn.simple_query("SELECT 6 * 7").await.unwrap(), vec![vec![Some("42".to_string())]]);

    // A role without REPLICATION may not start a walsender.
    let (_, code, message) = server_error(ReplicationConnection::connect(&pg.config("norepl", "x")).await);
    assert_eq!(code, "42501", "{message}");

    // START_REPLICATION errors come back as server errors.
    let conn = ReplicationConnection::connect(&pg.config("postgres", "x")).await.unwrap();
    let err = conn.start_physical(Some("no_such_slot"), Lsn(0x100_0000), 1).await.unwrap_err();
    assert_eq!(err.code(), Some("42704"), "{err:?}");
    let mut conn = ReplicationConnection::connect(&pg.config("postgres", "x")).await.unwrap();
    let id = conn.identify_system().await.unwrap();
    // PostgreSQL checks the start point against its flush position only
    // after sending CopyBothResponse.
    let mut stream = conn.start_physical(None, Lsn(id.xlogpos.0 + SEG * 4), 1).await.unwrap();
    match stream.next().await.unwrap_err() {
        PgError::Server { message, .. } => assert!(message.contains("ahead of the WAL flush position"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(stream.next().await.unwrap(), ReplicationEvent::End);
}

// ---------------------------------------------------------------------------
// Fake servers for what a real one does not do.

/// Accepts one connection and runs `script` on it.
async fn fake_server<F, Fut>(script: F) -> ReplicationConfig
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        script(sock).await;
    });
    ReplicationConfig {
        connect_timeout: Duration::from_secs(5),
        ..ReplicationConfig::new("127.0.0.1", port, "someone")
    }
}

async fn read_startup(sock: &mut TcpStream) -> Vec<u8> {
    let len = sock.read_i32().await.unwrap();
    let mut body = vec![0; len as usize - 4];
    sock.read_exact(&mut body).await.unwrap();
    body
}

async fn read_message(sock: &mut TcpStream) -> (u8, Vec<u8>) {
    let tag = sock.read_u8().await.unwrap();
    let len = sock.read_i32().await.unwrap();
    let mut body = vec![0; len as usize - 4];
    sock.read_exact(&mut body).await.unwrap();
    (tag, body)
}

/// The bytes of backend messages, encoded by `pgwire`.
fn encode(messages: &[&dyn Encode]) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    for m in messages {
        m.put(&mut out);
    }
    out.to_vec()
}

/// A backend message that `encode` can write.
trait Encode: Sync {
    fn put(&self, out: &mut bytes::BytesMut);
}

impl<M: pgwire::messages::Message + Sync> Encode for M {
    fn put(&self, out: &mut bytes::BytesMut) {
        self.encode(out).expect("a well-formed message encodes");
    }
}

fn ready() -> ReadyForQuery {
    ReadyForQuery::new(TransactionStatus::Idle)
}

/// AuthenticationOk, a ParameterStatus, a notice, BackendKeyData and ReadyForQuery.
fn handshake_ok() -> Vec<u8> {
    encode(&[
        &Authentication::Ok,
        &ParameterStatus::new("server_version".into(), "15.0".into()),
        &NoticeResponse::new(vec![(b'S', "NOTICE".into()), (b'C', "00000".into()), (b'M', "hello".into())]),
        &BackendKeyData::new(42, SecretKey::I32(7)),
        &ready(),
    ])
}

fn copy_data(payload: Vec<u8>) -> Vec<u8> {
    encode(&[&CopyData::new(payload.into())])
}

fn copy_both() -> Vec<u8> {
    encode(&[&CopyBothResponse::new(0, 0, Vec::new())])
}

fn xlog_data(start: u64, data: &[u8]) -> Vec<u8> {
    let mut body = vec![b'w'];
    body.extend_from_slice(&start.to_be_bytes());
    body.extend_from_slice(&(start + data.len() as u64).to_be_bytes());
    body.extend_from_slice(&0i64.to_be_bytes());
    body.extend_from_slice(data);
    copy_data(body)
}

#[tokio::test]
async fn startup_packet() {
    let cfg = fake_server(|mut sock| async move {
        let startup = read_startup(&mut sock).await;
        assert_eq!(&startup[..4], &196608i32.to_be_bytes());
        let params: Vec<&[u8]> = startup[4..].split(|&b| b == 0).collect();
        assert_eq!(
            params,
            vec![
                &b"user"[..],
                b"someone",
                b"database",
                b"replication",
                b"replication",
                b"true",
                b"application_name",
                b"strata_compute",
                b"",
                b""
            ]
        );
        sock.write_all(&handshake_ok()).await.unwrap();
        let _ = read_message(&mut sock).await;
    })
    .await;
    let conn = timeout(TEST_TIMEOUT, ReplicationConnection::connect(&cfg)).await.unwrap().unwrap();
    assert_eq!(conn.parameter("server_version"), Some("15.0"));
    assert_eq!(conn.backend_pid(), Some(42));
}

/// A server that asks for SCRAM and then claims success without proving
/// that it knows the password is refused.
#[tokio::test]
async fn scram_without_the_server_proof_is_refused() {
    let cfg = fake_server(|mut sock| async move {
        read_startup(&mut sock).await;
        sock.write_all(&encode(&[&Authentication::SASL(vec!["SCRAM-SHA-256".into()])])).await.unwrap();
        let (tag, body) = read_message(&mut sock).await;
        assert_eq!(tag, b'p');
        assert!(body.starts_with(b"SCRAM-SHA-256\0"), "{body:?}");
        sock.write_all(&handshake_ok()).await.unwrap();
        let _ = read_message(&mut sock).await;
    })
    .await;
    let cfg = ReplicationConfig { password: Some("pw".into()), ..cfg };
    let err = timeout(TEST_TIMEOUT, ReplicationConnection::connect(&cfg)).await.unwrap().unwrap_err();
    assert!(matches!(&err, PgError::Auth(m) if m.contains("without proving")), "{err:?}");
}

#[tokio::test]
async fn rejects_bad_lengths() {
    for len in [0i32, 3, -1, i32::MAX, (64 << 20) + 1] {
        let cfg = fake_server(move |mut sock| async move {
            read_startup(&mut sock).await;
            let mut bytes = vec![b'R'];
            bytes.extend_from_slice(&len.to_be_bytes());
            let _ = sock.write_all(&bytes).await;
            sleep(Duration::from_secs(5)).await;
        })
        .await;
        let err = timeout(TEST_TIMEOUT, ReplicationConnection::connect(&cfg)).await.unwrap().unwrap_err();
        assert!(matches!(&err, PgError::Protocol(m) if m.contains("length")), "{len}: {err:?}");
    }
}

#[tokio::test]
async fn garbage_never_panics() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..200 {
        let mut bytes = Vec::new();
        let n = 1 + round % 40;
        for _ in 0..n {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            bytes.push(seed as u8);
        }
        // Sometimes a plausible prefix, so that parsing gets further.
        if round % 2 == 0 {
            let mut prefixed = encode(&[&Authentication::Ok]);
            let tag = [b'E', b'S', b'K', b'N', b'R', b'Z'][round % 6];
            prefixed.push(tag);
            prefixed.extend_from_slice(&((bytes.len() as i32) + 4).to_be_bytes());
            prefixed.extend_from_slice(&bytes);
            bytes = prefixed;
        }
        let cfg = fake_server(move |mut sock| async move {
            read_startup(&mut sock).await;
            let _ = sock.write_all(&bytes).await;
        })
        .await;
        let result = timeout(TEST_TIMEOUT, ReplicationConnection::connect(&cfg)).await.unwrap();
        assert!(result.is_err(), "round {round}: {result:?}");
    }
}

#[tokio::test]
async fn connect_timeout_and_refused() {
    // Accepts and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = ReplicationConfig {
        connect_timeout: Duration::from_millis(200),
        ..ReplicationConfig::new("127.0.0.1", port, "someone")
    };
    let started = SystemClock.now();
    let err = ReplicationConnection::connect(&cfg).await.unwrap_err();
    assert!(matches!(err, PgError::Timeout(_)), "{err:?}");
    assert!(SystemClock.since(started) < Duration::from_secs(5));
    drop(listener);

    let cfg = ReplicationConfig::new("127.0.0.1", free_port(), "someone");
    let err = ReplicationConnection::connect(&cfg).await.unwrap_err();
    assert!(matches!(err, PgError::Io(_)), "{err:?}");
}

#[tokio::test]
async fn abandoned_query_is_skipped() {
    let cfg = fake_server(|mut sock| async move {
        read_startup(&mut sock).await;
        sock.write_all(&handshake_ok()).await.unwrap();
        for answer in ["slow", "fast"] {
            let (tag, body) = read_message(&mut sock).await;
            assert_eq!((tag, body.as_slice()), (b'Q', &b"SHOW x\0"[..]));
            if answer == "slow" {
                sleep(Duration::from_millis(600)).await;
            }
            let mut row = bytes::BytesMut::new();
            row.extend_from_slice(&(answer.len() as i32).to_be_bytes());
            row.extend_from_slice(answer.as_bytes());
            let out = encode(&[
                &RowDescription::new(vec![FieldDescription::new("x".into(), 0, 0, 25, -1, -1, 0)]),
                &DataRow::new(row, 1),
                &CommandComplete::new("SHOW".into()),
                &ready(),
            ]);
            sock.write_all(&out).await.unwrap();
        }
        let _ = read_message(&mut sock).await;
    })
    .await;
    let cfg = ReplicationConfig { connect_timeout: Duration::from_millis(300), ..cfg };
    let mut conn = ReplicationConnection::connect(&cfg).await.unwrap();
    let err = conn.simple_query("SHOW x").await.unwrap_err();
    assert!(matches!(err, PgError::Timeout(_)), "{err:?}");
    // The slow answer arrives within the next query's timeout and is skipped.
    sleep(Duration::from_millis(400)).await;
    assert_eq!(conn.simple_query("SHOW x").await.unwrap(), vec![vec![Some("fast".to_string())]]);
}

#[tokio::test]
async fn stream_next_is_cancel_safe() {
    let chunks: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 100 + 37 * i as usize]).collect();
    let expected = chunks.clone();
    let cfg = fake_server(move |mut sock| async move {
        read_startup(&mut sock).await;
        sock.write_all(&handshake_ok()).await.unwrap();
        let (tag, body) = read_message(&mut sock).await;
        assert_eq!(tag, b'Q');
        assert_eq!(body, b"START_REPLICATION SLOT \"s1\" PHYSICAL 1/2000000 TIMELINE 3\0");
        sock.write_all(&copy_both()).await.unwrap();
        let mut all = Vec::new();
        let mut pos = 0x1_0200_0000u64;
        for (i, chunk) in chunks.iter().enumerate() {
            all.extend(xlog_data(pos, chunk));
            pos += chunk.len() as u64;
            if i % 5 == 4 {
                let mut k = vec![b'k'];
                k.extend_from_slice(&pos.to_be_bytes());
                k.extend_from_slice(&0i64.to_be_bytes());
                k.push(1);
                all.extend(copy_data(k));
                all.extend(encode(&[&ParameterStatus::new("in_hot_standby".into(), "off".into())]));
            }
        }
        all.extend(encode(&[&CopyDone::new()]));
        // Dribble the stream in small pieces.
        for piece in all.chunks(7) {
            sock.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
            sleep(Duration::from_micros(50)).await;
        }
        // The status update arrives intact.
        let (tag, body) = read_message(&mut sock).await;
        assert_eq!(tag, b'd');
        assert_eq!(body.len(), 34);
        assert_eq!(body[0], b'r');
        assert_eq!(&body[1..9], &pos.to_be_bytes());
        assert_eq!(&body[9..17], &pos.to_be_bytes());
        assert_eq!(&body[17..25], &0u64.to_be_bytes());
        assert_eq!(body[33], 0);
    })
    .await;
    let conn = ReplicationConnection::connect(&cfg).await.unwrap();
    let mut stream = conn.start_physical(Some("s1"), Lsn(0x1_0200_0000), 3).await.unwrap();
    let (mut got, mut keepalives, mut cancelled) = (Vec::new(), 0, 0);
    let mut end = Lsn(0x1_0200_0000);
    let result = timeout(TEST_TIMEOUT, async {
        loop {
            let event = tokio::select! {
                event = stream.next() => event.unwrap(),
                _ = sleep(Duration::from_micros(20)) => { cancelled += 1; continue; }
            };
            match event {
                ReplicationEvent::XLogData { start, server_end, data } => {
                    assert_eq!(start, end);
                    end = Lsn(start.0 + data.len() as u64);
                    assert_eq!(server_end, end);
                    got.push(data);
                }
                ReplicationEvent::Keepalive { server_end, reply_requested } => {
                    assert_eq!(server_end, end);
                    assert!(reply_requested);
                    keepalives += 1;
                }
                ReplicationEvent::End => break,
            }
        }
    })
    .await;
    result.unwrap();
    assert!(cancelled > 0);
    assert_eq!(keepalives, 4);
    assert_eq!(got, expected);
    assert_eq!(stream.next().await.unwrap(), ReplicationEvent::End);
    stream.send_status(end, end, Lsn(0), false).await.unwrap();
    // Give the fake server time to check it.
    sleep(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn stream_error_and_eof() {
    let error = encode(&[&ErrorResponse::new(vec![
        (b'S', "FATAL".into()),
        (b'V', "FATAL".into()),
        (b'C', "58P01".into()),
        (b'M', "requested WAL segment has already been removed".into()),
    ])]);
    let half = xlog_data(0x100_0003, b"defgh")[..10].to_vec();
    // What follows one XLogData message before the server closes the connection.
    for (tail, what) in [(error, "error"), (Vec::new(), "clean close"), (half, "close mid-message")] {
        let cfg = fake_server(move |mut sock| async move {
            read_startup(&mut sock).await;
            sock.write_all(&handshake_ok()).await.unwrap();
            read_message(&mut sock).await;
            let mut out = copy_both();
            out.extend(xlog_data(0x100_0000, b"abc"));
            out.extend(tail);
            sock.write_all(&out).await.unwrap();
        })
        .await;
        let conn = ReplicationConnection::connect(&cfg).await.unwrap();
        let mut stream = conn.start_physical(None, Lsn(0x100_0000), 0).await.unwrap();
        let first = stream.next().await.unwrap();
        assert_eq!(
            first,
            ReplicationEvent::XLogData { start: Lsn(0x100_0000), server_end: Lsn(0x100_0003), data: b"abc".to_vec() }
        );
        match (what, stream.next().await) {
            ("error", Err(e)) => assert_eq!(e.code(), Some("58P01")),
            ("clean close", Ok(ReplicationEvent::End)) => {}
            ("close mid-message", Err(PgError::Io(e))) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            (what, other) => panic!("{what}: {other:?}"),
        }
        if what != "close mid-message" {
            assert_eq!(stream.next().await.unwrap(), ReplicationEvent::End);
        }
    }
}
