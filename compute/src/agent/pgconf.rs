//! The configuration the agent gives PostgreSQL: `postgresql.conf`, an empty
//! `postgresql.auto.conf` and `pg_hba.conf`, written over whatever the
//! basebackup carried.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// PostgreSQL 18's `io_method`: how its reads are issued
/// (`docs/lazy-compute.md`, "PostgreSQL 18's asynchronous I/O").
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoMethod {
    /// Each backend reads for itself, synchronously.
    Sync,
    /// I/O worker processes read for the backends (18's default).
    Worker,
    /// Linux's io_uring.
    IoUring,
}

impl IoMethod {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            IoMethod::Sync => "sync",
            IoMethod::Worker => "worker",
            IoMethod::IoUring => "io_uring",
        }
    }

    /// From the setting's value.
    pub fn parse(text: &str) -> Option<IoMethod> {
        [IoMethod::Sync, IoMethod::Worker, IoMethod::IoUring].into_iter().find(|m| m.as_str() == text)
    }
}

/// Longest Unix socket path PostgreSQL accepts (`sizeof(sun_path) - 1`).
const MAX_SOCKET_PATH: usize = 107;

/// Inputs of the generated configuration.
#[derive(Clone, Debug)]
pub struct PgSettings {
    /// TCP port on 127.0.0.1 (and `host_address`), also the socket's name suffix.
    pub port: u16,
    /// The host's address clients of other hosts connect to, besides
    /// loopback: TLS only (`hostssl`), so it needs `tls_files`.
    pub host_address: Option<std::net::IpAddr>,
    /// Directory of the Unix socket (absolute): see [`socket_dir`].
    pub socket_dir: PathBuf,
    /// `shared_buffers`, in PostgreSQL's size syntax (`128MB`).
    pub shared_buffers: String,
    /// `io_method` (18 on); none: the major's default.
    pub io_method: Option<IoMethod>,
    /// Images for every resource manager, natively redone ones included.
    pub verify_redo: bool,
    /// The WAL proposer's application name, the only synchronous standby.
    pub application_name: String,
    /// A read-only compute: a hot standby with no WAL source.
    pub read_only: bool,
    /// A replica: a hot standby streaming from the safekeepers.
    pub standby: Option<StandbySettings>,
    /// This host's certificate and key files: copied into the data
    /// directory, and PostgreSQL serves TLS with them.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    /// The bootstrap superuser: refused over TCP, the socket only.
    pub superuser: String,
}

/// How a replica's walreceiver reaches the safekeepers (`docs/replicas.md`).
#[derive(Clone, Debug)]
pub struct StandbySettings {
    /// The safekeepers' replication services, `host:port`, tried in turn.
    pub replication: Vec<String>,
    /// The role it logs in as.
    pub user: String,
    /// The tenant token it logs in with (the password of the safekeepers'
    /// replication service); kept in a password file, not in the settings.
    pub token: Option<String>,
    /// The cluster CA: TLS with the safekeepers' certificates verified.
    pub ca_file: Option<PathBuf>,
    /// `tenant_id/timeline_id`: which timeline the safekeepers stream.
    pub timeline: String,
    /// `hot_standby_feedback`.
    pub feedback: bool,
}

/// The replica's password file and CA copy in the data directory.
const REPLICATION_PASSFILE: &str = "strata_replication.pgpass";
/// How long a replica's walreceiver tries one safekeeper before the next.
const REPLICATION_CONNECT_TIMEOUT_SECS: u32 = 5;
const REPLICATION_CA: &str = "strata_ca.pem";
/// A file that is never there: the walreceiver presents no client certificate.
const NO_CLIENT_CERT: &str = "strata_no_client_certificate";

impl StandbySettings {
    /// `primary_conninfo`: every safekeeper in libpq's list of hosts. The
    /// stream's records lose their consistency-check flags on the way
    /// (`strata.strip_consistency`): the writer logs them for the
    /// pageserver, and a stock standby would otherwise redo every such
    /// record twice to compare.
    pub fn conninfo(&self, pgdata: &Path) -> Result<String, ConfigError> {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for addr in &self.replication {
            let sa: std::net::SocketAddr = addr
                .parse()
                .map_err(|_| ConfigError::Invalid(format!("replication service {addr:?}: expected ip:port")))?;
            hosts.push(sa.ip().to_string());
            ports.push(sa.port().to_string());
        }
        if hosts.is_empty() {
            return Err(ConfigError::Invalid("a replica needs the safekeepers' replication services".into()));
        }
        let plain = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-/.".contains(&b));
        if !plain(&self.user) || !plain(&self.timeline) {
            return Err(ConfigError::Invalid(format!("role {:?} or timeline {:?}", self.user, self.timeline)));
        }
        let path = |name: &str| {
            let p = pgdata.join(name);
            let text = p.to_string_lossy().into_owned();
            if text.contains(['\'', '\\', ' ', '\n']) {
                Err(ConfigError::Invalid(format!(
                    "data directory path {} has a quote, space or newline",
                    pgdata.display()
                )))
            } else {
                Ok(text)
            }
        };
        // Each safekeeper in turn, a few seconds each: one across a cut link
        // (or a dead host) would otherwise hold the stream up for minutes,
        // the connect's own timeout.
        let mut out = format!(
            "host={} port={} user={} connect_timeout={REPLICATION_CONNECT_TIMEOUT_SECS}",
            hosts.join(","),
            ports.join(","),
            self.user
        );
        if self.token.is_some() {
            out.push_str(&format!(" passfile={}", path(REPLICATION_PASSFILE)?));
        }
        match &self.ca_file {
            // No client certificate: named explicitly, libpq would look in
            // the home directory of the agent's user, which PostgreSQL's
            // user may not enter (and that is an error, not "none").
            Some(_) => out.push_str(&format!(
                " sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
                path(REPLICATION_CA)?,
                path(NO_CLIENT_CERT)?,
                path(NO_CLIENT_CERT)?
            )),
            None => out.push_str(" sslmode=disable"),
        }
        out.push_str(&format!(
            " application_name=strata_replica options='-c strata.timeline={} -c strata.strip_consistency=on'",
            self.timeline
        ));
        Ok(out)
    }

    /// Writes the password file (mode 0600, as libpq demands) and the CA copy.
    fn write_files(&self, pgdata: &Path) -> Result<(), ConfigError> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(token) = &self.token {
            // pgpass fields escape `:` and `\`.
            let escaped = token.replace('\\', "\\\\").replace(':', "\\:");
            let path = pgdata.join(REPLICATION_PASSFILE);
            write(path.clone(), &format!("*:*:*:*:{escaped}\n"))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|source| ConfigError::Io { path, source })?;
        }
        if let Some(ca) = &self.ca_file {
            let to = pgdata.join(REPLICATION_CA);
            std::fs::copy(ca, &to).map_err(|source| ConfigError::Io { path: ca.clone(), source })?;
        }
        Ok(())
    }
}

/// Puts `token` into a replica's password file, if it has one, keeping the
/// file's owner (PostgreSQL's user) and mode: libpq reads it at the
/// walreceiver's next connection. Replaced whole, so a connection never
/// reads half a file.
pub fn rewrite_replication_password(pgdata: &Path, token: &str) -> Result<(), ConfigError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let path = pgdata.join(REPLICATION_PASSFILE);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConfigError::Io { path, source }
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(&path)(e)),
    };
    let escaped = token.replace('\\', "\\\\").replace(':', "\\:");
    let tmp = pgdata.join(format!("{REPLICATION_PASSFILE}.new"));
    std::fs::write(&tmp, format!("*:*:*:*:{escaped}\n")).map_err(io(&tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io(&tmp))?;
    std::os::unix::fs::lchown(&tmp, Some(meta.uid()), Some(meta.gid())).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))
}

/// The names of the certificate and key in the data directory.
const SERVER_CERT: &str = "server.crt";
const SERVER_KEY: &str = "server.key";

/// A setting that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid setting: {0}")]
    Invalid(String),
    #[error("writing {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The value of `wal_consistency_checking`: the resource managers whose
/// records must carry an image of every block they change, because the
/// pageserver has no native redo for them (all of them to verify redo).
pub fn wal_consistency_checking(verify_redo: bool) -> String {
    let native = strata_redo::NATIVE_RMGRS;
    if verify_redo || native.is_empty() {
        return "all".into();
    }
    let names: Vec<&str> =
        strata_formats::v15::rmgr::CONSISTENCY_CHECKABLE.iter().copied().filter(|n| !native.contains(n)).collect();
    names.join(",")
}

/// A single-quoted configuration value (quotes doubled, backslashes escaped).
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Checks what would otherwise only fail inside PostgreSQL, or could break
/// out of its quoted value.
fn validate(s: &PgSettings) -> Result<(), ConfigError> {
    if s.port == 0 {
        return Err(ConfigError::Invalid("port 0".into()));
    }
    if let Some(addr) = s.host_address {
        if s.tls_files.is_none() {
            return Err(ConfigError::Invalid(format!("listening on {addr} needs TLS: no certificate given")));
        }
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(ConfigError::Invalid(format!("{addr} is not a host's address")));
        }
    }
    if !s.socket_dir.is_absolute() {
        return Err(ConfigError::Invalid(format!("socket directory {} is not absolute", s.socket_dir.display())));
    }
    let dir = s.socket_dir.to_str().ok_or_else(|| {
        ConfigError::Invalid(format!("socket directory {} is not valid UTF-8", s.socket_dir.display()))
    })?;
    if dir.contains(['\n', '\r', '\0', ',']) {
        return Err(ConfigError::Invalid(format!("socket directory {dir:?} contains a newline, NUL or comma")));
    }
    let socket = socket_path(dir, s.port);
    if socket.len() > MAX_SOCKET_PATH {
        return Err(ConfigError::Invalid(format!(
            "socket path {socket} is longer than {MAX_SOCKET_PATH} bytes: use a shorter data or temporary directory path"
        )));
    }
    let size_ok = !s.shared_buffers.is_empty()
        && s.shared_buffers.starts_with(|c: char| c.is_ascii_digit())
        && s.shared_buffers.chars().all(|c| c.is_ascii_alphanumeric());
    if !size_ok {
        return Err(ConfigError::Invalid(format!(
            "shared_buffers {:?}: expected a size such as 128MB or 1GB",
            s.shared_buffers
        )));
    }
    let name_ok = !s.application_name.is_empty()
        && s.application_name.len() < 64
        && s.application_name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
    if !name_ok {
        return Err(ConfigError::Invalid(format!(
            "application name {:?}: expected 1 to 63 of [a-z0-9_]",
            s.application_name
        )));
    }
    Ok(())
}

/// The text of `postgresql.conf`.
pub fn postgresql_conf(s: &PgSettings, pgdata: &Path) -> Result<String, ConfigError> {
    validate(s)?;
    let mut out = String::from("# Written by the Strata compute agent at every start; edits are lost.\n\n");
    let mut set = |comment: &str, name: &str, value: String| {
        for line in comment.lines() {
            let _ = writeln!(out, "# {line}");
        }
        let _ = writeln!(out, "{name} = {value}");
    };
    let listen = match s.host_address {
        Some(addr) if !addr.is_loopback() => format!("127.0.0.1,{addr}"),
        _ => "127.0.0.1".to_string(),
    };
    set(
        "Clients connect over TCP on loopback and, with TLS only, on the host's address.",
        "listen_addresses",
        quote(&listen),
    );
    set("", "port", s.port.to_string());
    set(
        "The socket lives in the data directory (PostgreSQL's user can write there,\n\
         and each compute gets its own), or in a private temporary directory when\n\
         the data directory's path is too long for a socket.",
        "unix_socket_directories",
        quote(s.socket_dir.to_str().expect("validated")),
    );
    set("", "shared_buffers", quote(&s.shared_buffers));
    if let Some(method) = s.io_method {
        set("Chosen for this endpoint (PostgreSQL 18 on).", "io_method", quote(method.as_str()));
    }
    set(
        "Passwords are stored as SCRAM verifiers; TCP clients log in with SCRAM-SHA-256.",
        "password_encryption",
        quote("scram-sha-256"),
    );
    if s.tls_files.is_some() {
        set(
            "TLS with this host's certificate from the cluster's CA (libpq's default\n\
             sslmode=prefer uses it; sslmode=verify-full checks it).",
            "ssl",
            "on".into(),
        );
        set("", "ssl_cert_file", quote(SERVER_CERT));
        set("", "ssl_key_file", quote(SERVER_KEY));
        set("As every other Strata link.", "ssl_min_protocol_version", quote("TLSv1.3"));
    }
    set(
        "The agent's WAL proposer is the one synchronous standby: a commit returns\n\
         only once a quorum of safekeepers has the WAL.",
        "synchronous_standby_names",
        quote(&s.application_name),
    );
    set("", "synchronous_commit", "on".into());
    set("", "max_connections", "100".into());
    set(
        "Two-phase commit is available as on a self-managed server; prepared\n\
         transactions survive a compute restart (their state is in the WAL).",
        "max_prepared_transactions",
        "100".into(),
    );
    set("", "wal_level", "replica".into());
    set("", "max_wal_senders", "10".into());
    set("The proposer's physical slot keeps WAL until the safekeepers have it.", "max_replication_slots", "10".into());
    set(
        "A little WAL beyond the slot, so a reconnecting proposer finds what it needs.",
        "wal_keep_size",
        // In verification mode the WAL is also checked offline afterwards.
        quote(if s.verify_redo { "1GB" } else { "128MB" }),
    );
    set(
        "Every record of these resource managers carries an image of each block after\n\
         the change. The pageserver stores those images and needs no PostgreSQL redo.",
        "wal_consistency_checking",
        quote(&wal_consistency_checking(s.verify_redo)),
    );
    set(
        "A page's first hint-bit change after a checkpoint is WAL-logged (without an\n\
         image: full_page_writes is off) and stamps the page's LSN, as an all-visible\n\
         mark does; the pageserver stamps its page alike (docs/decisions.md,\n\
         \"Full-page writes off\"), so pages served equal the compute's to pd_lsn.",
        "wal_log_hints",
        "on".into(),
    );
    set(
        "The block images above dominate the WAL volume; lz4 keeps it small and cheap\n\
         to decode.",
        "wal_compression",
        "lz4".into(),
    );
    set(
        "No torn page can reach a read: the compute's files are thrown away at\n\
         every start, and the pageserver builds each page from the one before.",
        "full_page_writes",
        "off".into(),
    );
    set(
        "The compute is disposable: its data directory is rebuilt from the pageserver\n\
         at every start, and WAL durability comes from the safekeepers.",
        "fsync",
        "off".into(),
    );
    set(
        "After a crash the agent starts PostgreSQL afresh from the storage instead\n\
         of recovering local files the safekeepers may not agree with.",
        "restart_after_crash",
        "off".into(),
    );
    set(
        "Session defaults as initdb would write them for the C locale, so that\n\
         sessions behave the same whatever the agent's environment.",
        "timezone",
        quote("UTC"),
    );
    set("", "log_timezone", quote("UTC"));
    set("", "datestyle", quote("iso, mdy"));
    set("", "lc_messages", quote("C"));
    set("", "default_text_search_config", quote("pg_catalog.english"));
    set("", "log_min_messages", "warning".into());
    set(
        "Standard error goes to the log file the agent opened next to the data directory.",
        "logging_collector",
        "off".into(),
    );
    if let Some(standby) = &s.standby {
        set(
            "A replica: a hot standby of the branch, streaming its committed WAL from\n\
             the safekeepers (docs/replicas.md).",
            "primary_conninfo",
            quote(&standby.conninfo(pgdata)?),
        );
        set("", "hot_standby", "on".into());
        set("", "hot_standby_feedback", if standby.feedback { "on" } else { "off" }.into());
        set(
            "Replay position reported often: the agent's read floor and lag follow it.",
            "wal_receiver_status_interval",
            quote("1s"),
        );
    }
    Ok(out)
}

/// The text of `pg_hba.conf`: SCRAM-SHA-256 for every TCP connection,
/// normal and replication, except the superuser's, which are refused: it
/// logs in through the Unix socket only (trusted: its directory only
/// PostgreSQL's user and root can enter, mode 0700, see
/// [`prepare_socket_dir`]), so the endpoint's password never opens a
/// superuser session. With `beyond_loopback`, clients of other hosts too,
/// over TLS only (`hostssl`), never replication.
pub fn pg_hba_conf(beyond_loopback: bool, superuser: &str) -> String {
    // The first matching line decides: the refusals come before the rest.
    let mut hba = format!(
        "# Written by the Strata compute agent at every start; edits are lost.\n\
         # The socket's directory is private to PostgreSQL's user.\n\
         # TYPE  DATABASE     USER  ADDRESS       METHOD\n\
         local   all          all                 trust\n\
         local   replication  all                 trust\n\
         host    all          {superuser}  all    reject\n\
         host    replication  {superuser}  all    reject\n\
         host    all          all   127.0.0.1/32  scram-sha-256\n\
         host    replication  all   127.0.0.1/32  scram-sha-256\n"
    );
    if beyond_loopback {
        hba.push_str("hostssl all          all   all           scram-sha-256\n");
    }
    hba
}

fn write(path: PathBuf, text: &str) -> Result<(), ConfigError> {
    std::fs::write(&path, text).map_err(|source| ConfigError::Io { path, source })
}

/// The directory of the compute's Unix socket: the data directory when the
/// socket path fits in `sun_path`, else a short directory in the system's
/// temporary directory named after the data directory, so that a deep data
/// directory does not stop the compute from starting.
pub fn socket_dir(pgdata: &Path, port: u16) -> PathBuf {
    let fits = |dir: &Path| dir.to_str().is_some_and(|d| socket_path(d, port).len() <= MAX_SOCKET_PATH);
    if fits(pgdata) {
        return pgdata.to_path_buf();
    }
    // The same data directory always gets the same directory, so restarts
    // do not leave a new one behind each time.
    let digest = crc32c::crc32c(pgdata.as_os_str().as_encoded_bytes());
    std::env::temp_dir().join(format!("strata-socket-{digest:08x}"))
}

fn socket_path(dir: &str, port: u16) -> String {
    format!("{}/.s.PGSQL.{port}", dir.trim_end_matches('/'))
}

/// Creates the socket directory when it is not the data directory, owned by
/// `owner` (else the current user) and private to it. An existing entry
/// that is not a directory of that owner is refused: the temporary directory
/// is shared, and somebody else's directory could intercept connections.
pub fn prepare_socket_dir(dir: &Path, pgdata: &Path, owner: Option<(u32, u32)>) -> Result<(), ConfigError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if dir == pgdata {
        return Ok(());
    }
    let io = |source| ConfigError::Io { path: dir.to_path_buf(), source };
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let meta = std::fs::symlink_metadata(dir).map_err(io)?;
    if !meta.is_dir() || (meta.uid() != me && Some(meta.uid()) != owner.map(|o| o.0)) {
        return Err(ConfigError::Invalid(format!(
            "socket directory {} exists and is not a directory of this compute's user",
            dir.display()
        )));
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid)).map_err(io)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

/// Writes the configuration into `pgdata`: `postgresql.conf` and
/// `pg_hba.conf` replaced, `postgresql.auto.conf` emptied, an empty
/// `pg_ident.conf` if there is none.
pub fn write_config(pgdata: &Path, s: &PgSettings) -> Result<(), ConfigError> {
    let conf = postgresql_conf(s, pgdata)?;
    write(pgdata.join("postgresql.conf"), &conf)?;
    write(
        pgdata.join("postgresql.auto.conf"),
        "# Emptied by the Strata compute agent at every start; ALTER SYSTEM settings do not persist.\n",
    )?;
    let beyond_loopback = s.host_address.is_some_and(|a| !a.is_loopback());
    write(pgdata.join("pg_hba.conf"), &pg_hba_conf(beyond_loopback, &s.superuser))?;
    for name in [SERVER_CERT, SERVER_KEY] {
        let path = pgdata.join(name);
        if path.exists() {
            std::fs::remove_file(&path).map_err(|source| ConfigError::Io { path, source })?;
        }
    }
    if let Some((cert, key)) = &s.tls_files {
        // PostgreSQL refuses a key others may read; `set_ownership` later
        // gives both to its user with mode 0600.
        for (from, name) in [(cert, SERVER_CERT), (key, SERVER_KEY)] {
            let to = pgdata.join(name);
            std::fs::copy(from, &to).map_err(|source| ConfigError::Io { path: from.clone(), source })?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                .map_err(|source| ConfigError::Io { path: to.clone(), source })?;
        }
    }
    // A standby with neither primary_conninfo nor restore_command replays
    // nothing after the basebackup's checkpoint: it stays at that LSN, and
    // PostgreSQL itself refuses every write.
    let signal = pgdata.join("standby.signal");
    if let Some(standby) = &s.standby {
        standby.write_files(pgdata)?;
    }
    if s.read_only || s.standby.is_some() {
        write(signal, "")?;
    } else if signal.exists() {
        std::fs::remove_file(&signal).map_err(|e| ConfigError::Io { path: signal.clone(), source: e })?;
    }
    let ident = pgdata.join("pg_ident.conf");
    if !ident.exists() {
        write(ident, "")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PGDATA: &str = "/srv/compute/pgdata";

    #[test]
    fn io_method_is_written_only_when_chosen() {
        let plain = postgresql_conf(&settings(), Path::new(PGDATA)).unwrap();
        assert!(!plain.contains("io_method"));
        let s = PgSettings { io_method: Some(IoMethod::IoUring), ..settings() };
        let conf = postgresql_conf(&s, Path::new(PGDATA)).unwrap();
        assert!(conf.lines().any(|l| l == "io_method = 'io_uring'"), "{conf}");
        for m in [IoMethod::Sync, IoMethod::Worker, IoMethod::IoUring] {
            assert_eq!(IoMethod::parse(m.as_str()), Some(m));
        }
        assert_eq!(IoMethod::parse("posix_aio"), None);
    }

    fn settings() -> PgSettings {
        PgSettings {
            port: 55432,
            host_address: None,
            socket_dir: PathBuf::from("/srv/compute/pgdata"),
            shared_buffers: "128MB".into(),
            io_method: None,
            verify_redo: false,
            application_name: "strata_proposer".into(),
            read_only: false,
            standby: None,
            tls_files: None,
            superuser: "postgres".into(),
        }
    }

    /// `name = value` lines, comments dropped.
    fn settings_of(conf: &str) -> Vec<(String, String)> {
        conf.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let (k, v) = l.split_once(" = ").expect("name = value");
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    #[test]
    fn generates_the_settings() {
        let conf = postgresql_conf(&settings(), Path::new(PGDATA)).unwrap();
        let map = settings_of(&conf);
        let get = |name: &str| map.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("port"), Some("55432"));
        assert_eq!(get("listen_addresses"), Some("'127.0.0.1'"));
        assert_eq!(get("unix_socket_directories"), Some("'/srv/compute/pgdata'"));
        assert_eq!(get("synchronous_standby_names"), Some("'strata_proposer'"));
        assert_eq!(get("synchronous_commit"), Some("on"));
        assert_eq!(get("wal_level"), Some("replica"));
        assert_eq!(get("wal_consistency_checking"), Some(quote(&wal_consistency_checking(false)).as_str()));
        assert_eq!(get("wal_compression"), Some("lz4"));
        assert_eq!(get("wal_log_hints"), Some("on"));
        assert_eq!(get("full_page_writes"), Some("off"));
        assert_eq!(get("fsync"), Some("off"));
        assert_eq!(get("shared_buffers"), Some("'128MB'"));
        assert_eq!(get("restart_after_crash"), Some("off"));
        assert_eq!(get("logging_collector"), Some("off"));
        assert_eq!(get("log_min_messages"), Some("warning"));
        assert_eq!(get("timezone"), Some("'UTC'"));
        // Each setting once.
        let mut names: Vec<_> = map.iter().map(|(k, _)| k.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), map.len());
    }

    #[test]
    fn consistency_checking_names_known_rmgrs() {
        for name in strata_redo::NATIVE_RMGRS {
            assert!(
                strata_formats::v15::rmgr::CONSISTENCY_CHECKABLE.contains(name),
                "{name} is not a resource manager wal_consistency_checking accepts"
            );
        }
        assert_eq!(wal_consistency_checking(true), "all");
        let normal = wal_consistency_checking(false);
        for name in normal.split(',').filter(|n| *n != "all") {
            assert!(strata_formats::v15::rmgr::CONSISTENCY_CHECKABLE.contains(&name), "{name} is not checkable");
            assert!(!strata_redo::NATIVE_RMGRS.contains(&name), "{name} is redone natively");
        }
    }

    #[test]
    fn quotes_values() {
        assert_eq!(quote("a'b"), "'a''b'");
        assert_eq!(quote(r"a\b"), r"'a\\b'");
        let mut s = settings();
        s.socket_dir = PathBuf::from("/srv/o'neil/pgdata");
        let conf = postgresql_conf(&s, Path::new(PGDATA)).unwrap();
        assert!(conf.contains("unix_socket_directories = '/srv/o''neil/pgdata'"), "{conf}");
    }

    #[test]
    fn rejects_bad_settings() {
        let bad = [
            PgSettings { shared_buffers: "128MB'; fsync = on".into(), ..settings() },
            PgSettings { shared_buffers: "".into(), ..settings() },
            PgSettings { shared_buffers: "MB".into(), ..settings() },
            PgSettings { application_name: "Strata proposer".into(), ..settings() },
            PgSettings { socket_dir: PathBuf::from("relative/pgdata"), ..settings() },
            PgSettings { socket_dir: PathBuf::from("/a\nb"), ..settings() },
            PgSettings { socket_dir: PathBuf::from(format!("/{}", "d".repeat(100))), ..settings() },
            PgSettings { port: 0, ..settings() },
        ];
        for s in bad {
            assert!(matches!(postgresql_conf(&s, Path::new(PGDATA)), Err(ConfigError::Invalid(_))), "{s:?}");
        }
    }

    #[test]
    fn hba_trusts_the_socket_only_and_tcp_needs_scram() {
        let hba = pg_hba_conf(false, "postgres");
        let rules: Vec<Vec<&str>> =
            hba.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rules.len(), 6);
        assert!(rules.iter().filter(|r| r[0] == "local").all(|r| r.last() == Some(&"trust")));
        let host: Vec<_> = rules.iter().filter(|r| r[0] == "host").collect();
        assert_eq!(host.len(), 4);
        // The superuser's refusals come first: PostgreSQL takes the first match.
        assert_eq!(host[0], &vec!["host", "all", "postgres", "all", "reject"]);
        assert_eq!(host[1], &vec!["host", "replication", "postgres", "all", "reject"]);
        assert!(host[2..].iter().all(|r| r[2] == "all" && r[3] == "127.0.0.1/32" && r[4] == "scram-sha-256"));
        assert!(host.iter().any(|r| r[1] == "replication"));
    }

    #[test]
    fn other_hosts_reach_postgres_over_tls_only() {
        let addr: std::net::IpAddr = "10.77.0.15".parse().unwrap();
        let without_tls = PgSettings { host_address: Some(addr), ..settings() };
        assert!(
            matches!(postgresql_conf(&without_tls, Path::new(PGDATA)), Err(ConfigError::Invalid(e)) if e.contains("needs TLS"))
        );
        let files = Some((PathBuf::from("/c/h.pem"), PathBuf::from("/c/h.key")));
        let conf = postgresql_conf(
            &PgSettings { host_address: Some(addr), tls_files: files, ..settings() },
            Path::new(PGDATA),
        )
        .unwrap();
        assert!(conf.contains("listen_addresses = '127.0.0.1,10.77.0.15'"), "{conf}");
        let hba = pg_hba_conf(true, "postgres");
        let beyond: Vec<&str> = hba
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains("127.0.0.1/32") && !l.ends_with("reject"))
            .collect();
        // Beyond loopback: TLS and SCRAM, normal sessions only.
        assert_eq!(
            beyond.iter().filter(|l| !l.starts_with("local")).collect::<Vec<_>>(),
            vec![&"hostssl all          all   all           scram-sha-256"]
        );
        assert!(!pg_hba_conf(false, "postgres").contains("hostssl"));
    }

    #[test]
    fn tls_only_with_certificate_files() {
        let plain = postgresql_conf(&settings(), Path::new(PGDATA)).unwrap();
        assert!(!plain.contains("\nssl = on"), "{plain}");
        assert!(plain.contains("password_encryption = 'scram-sha-256'"));
        let files = Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")));
        let tls = postgresql_conf(&PgSettings { tls_files: files, ..settings() }, Path::new(PGDATA)).unwrap();
        for line in ["ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'"] {
            assert!(tls.lines().any(|l| l == line), "{line} in {tls}");
        }
    }

    #[test]
    fn a_deep_data_directory_gets_a_short_private_socket_directory() {
        let short = Path::new("/srv/compute/pgdata");
        assert_eq!(socket_dir(short, 5432), short);
        let deep = PathBuf::from(format!("/{}/pgdata", "d".repeat(100)));
        let dir = socket_dir(&deep, 5432);
        assert_ne!(dir, deep);
        assert_eq!(dir, socket_dir(&deep, 5432), "stable across restarts");
        assert_ne!(dir, socket_dir(&deep.join("other"), 5432));
        assert!(postgresql_conf(&PgSettings { socket_dir: dir.clone(), ..settings() }, Path::new(PGDATA)).is_ok());

        prepare_socket_dir(&dir, &deep, None).unwrap();
        prepare_socket_dir(&dir, &deep, None).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir(&dir).unwrap();

        // Something else in its place is refused, not used.
        std::fs::write(&dir, "").unwrap();
        let err = prepare_socket_dir(&dir, &deep, None).unwrap_err();
        assert!(err.to_string().contains("not a directory of this compute's user"), "{err}");
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn writes_files() {
        let dir = std::env::temp_dir().join(format!("strata-pgconf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("postgresql.auto.conf"), "work_mem = '1GB'\n").unwrap();
        write_config(&dir, &settings()).unwrap();
        assert!(std::fs::read_to_string(dir.join("postgresql.conf")).unwrap().contains("port = 55432"));
        assert!(!std::fs::read_to_string(dir.join("postgresql.auto.conf")).unwrap().contains("work_mem"));
        assert!(std::fs::read_to_string(dir.join("pg_hba.conf")).unwrap().contains("scram-sha-256"));
        assert!(dir.join("pg_ident.conf").exists());
        assert!(!dir.join(SERVER_KEY).exists());
        // With TLS: the files copied, the key private.
        std::fs::write(dir.join("c.pem"), "cert").unwrap();
        std::fs::write(dir.join("k.pem"), "key").unwrap();
        let files = Some((dir.join("c.pem"), dir.join("k.pem")));
        write_config(&dir, &PgSettings { tls_files: files, ..settings() }).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(SERVER_KEY)).unwrap(), "key");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.join(SERVER_KEY)).unwrap().permissions().mode() & 0o777, 0o600);
        // Without again: a copy of before is not left behind.
        write_config(&dir, &settings()).unwrap();
        assert!(!dir.join(SERVER_KEY).exists() && !dir.join(SERVER_CERT).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
