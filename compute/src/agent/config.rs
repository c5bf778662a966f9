//! What the compute agent is told: `strata compute start`'s options.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_protocol::shard::ShardLayout;
use strata_protocol::{TenantId, TenantShardId, TimelineId};

use crate::pageserver_target::{PageserverTarget, TenantShards};

use super::restart::RestartPolicy;

/// Everything `strata compute start` needs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The data directory; emptied and restored at every start.
    pub pgdata: PathBuf,
    /// PostgreSQL's TCP port on 127.0.0.1.
    pub pg_port: u16,
    /// Safekeeper addresses (host:port).
    pub safekeepers: Vec<String>,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The pageserver's HTTP API (host:port) at start.
    pub pageserver_http: String,
    /// Where the pageserver (shard 0's) is now: the one given at start
    /// until a storage controller says otherwise. After a split, `shards`
    /// has the new shard 0's, which clients of shard 0 follow instead.
    pub pageserver: PageserverTarget,
    /// The storage controllers' HTTP APIs (`host:port`): asked where the
    /// tenant is attached, and followed when it moves.
    pub controllers: Vec<String>,
    /// A replica's site: the controllers answer that site's reader when it
    /// has one (`docs/sites.md`, "A pageserver per site").
    pub pageserver_site: Option<String>,
    /// Addresses the safekeepers' membership configuration or a storage
    /// controller gives, and where this compute reaches them instead
    /// (routes to another site, `docs/sites.md`).
    pub address_map: Vec<(String, String)>,
    /// Where to serve `/v1/status` and `/metrics`.
    pub http: Option<SocketAddr>,
    /// Most connections to the status server at once.
    pub http_max_connections: usize,
    /// Directory of the `postgres` binary.
    pub pg_bin_dir: PathBuf,
    /// Operating-system user PostgreSQL runs as when the agent runs as root.
    pub pg_user: String,
    /// Database role of the agent's connections through the Unix socket
    /// (the proposer's, the readiness check's): the cluster's bootstrap
    /// superuser, which never logs in over TCP.
    pub pg_role: String,
    /// The role applications log in as over TCP with the endpoint's
    /// password: it owns the database `postgres` and is no superuser.
    pub app_role: String,
    /// `shared_buffers` (`128MB`).
    pub shared_buffers: String,
    /// `io_method` (PostgreSQL 18 on); none: the major's default.
    pub io_method: Option<super::pgconf::IoMethod>,
    /// Images of every change for every resource manager (`wal_consistency_checking = 'all'`).
    pub verify_redo: bool,
    /// The proposer's application name, listed in `synchronous_standby_names`.
    pub application_name: String,
    /// The proposer's physical replication slot.
    pub slot: String,
    /// Backpressure: commits wait while the pageservers lag more than this.
    pub max_consumer_lag_bytes: Option<u64>,
    /// How long the pageserver may need to ingest the WAL up to the start LSN.
    pub wait_timeout: Duration,
    /// How long an unreachable pageserver is retried at first (it may be starting).
    pub pageserver_patience: Duration,
    /// The same during a restart, whose failure is retried with backoff anyway.
    pub restart_pageserver_patience: Duration,
    /// Bound on sync-safekeepers (election and catch-up of a quorum).
    pub sync_timeout: Duration,
    /// Bound on PostgreSQL starting up, and on the proposer then streaming.
    pub start_timeout: Duration,
    /// Bound on a graceful stop (PostgreSQL's shutdown plus the last WAL
    /// reaching the safekeepers).
    pub stop_timeout: Duration,
    /// After a failure, how long `failed` stays visible on the status endpoint.
    pub failed_linger: Duration,
    /// Pacing of PostgreSQL's restarts, and what counts as a crash loop.
    pub restart: RestartPolicy,
    /// A read-only compute at this LSN (a hot standby without a WAL
    /// source, `docs/branches.md`): no safekeepers, no proposer; the agent
    /// holds a lease on the LSN.
    pub read_only_at: Option<strata_formats::Lsn>,
    /// A replica: a hot standby of the branch that streams its WAL from
    /// the safekeepers (`docs/replicas.md`); no proposer, no election.
    pub replica: Option<ReplicaConfig>,
    /// A lazy compute (`docs/lazy-compute.md`): relation files served
    /// through FUSE from the page service at this address (`host:port`)
    /// instead of restored.
    pub lazy_page_service: Option<String>,
    /// The tenant's layout (`docs/sharding.md`; unsharded unless
    /// [`Self::set_shards`] says otherwise) and where each shard is served
    /// now, the first `pageserver` until a split replaces them all.
    pub shards: TenantShards,
    /// A lazy compute's local file cache: the most bytes of relation
    /// blocks it keeps that it may fetch again (`docs/lazy-compute.md`).
    pub lazy_cache_bytes: u64,
    /// How long a lazy compute's read keeps trying while the pageserver
    /// cannot be reached before it fails with an I/O error.
    pub lazy_fetch_retry: Duration,
    /// The key callers of the status server must present tokens of
    /// (`docs/security.md`); none: every caller is accepted.
    pub auth_public_key: Option<PathBuf>,
    /// The tenant token sent to the pageserver and the safekeepers.
    pub token: Option<strata_service::auth::Token>,
    /// The file it was read from, followed when it changes, where the agent
    /// writes the token's renewals (`docs/security.md`, "Renewal").
    pub token_file: Option<PathBuf>,
    /// TLS to the pageserver and the safekeepers, with the cluster's CA; none: plaintext.
    pub tls_client: Option<strata_service::tls::ClientTls>,
    /// TLS on the status server; none: plaintext (loopback only).
    pub tls_server: Option<strata_service::tls::ServerTls>,
    /// This host's certificate and key files: PostgreSQL serves TLS with
    /// copies of them in its data directory; none: PostgreSQL has no TLS.
    pub pg_tls_files: Option<(PathBuf, PathBuf)>,
    /// The host's address PostgreSQL listens on besides loopback (TLS only).
    pub pg_host_address: Option<std::net::IpAddr>,
    /// The file (mode 0600) with the password clients log in with as
    /// `pg_role` over TCP (SCRAM-SHA-256); read at every start, so a new
    /// password takes effect with the next one (`docs/security.md`).
    pub password_file: PathBuf,
    /// The file (mode 0600) with the role's SCRAM verifier of that password,
    /// read with it; none: the agent makes one when the password does not log in.
    pub password_verifier_file: Option<PathBuf>,
    /// Scale to zero: with no client connected for this long, the compute
    /// is stopped and the agent exits with `exit::SUSPENDED` (`suspend`);
    /// none: never.
    pub suspend_after: Option<Duration>,
    /// Where the agent reads the time: its phases' durations, deadlines,
    /// restart backoff and crash loops, and the proposer's decisions.
    pub clock: crate::clock::SharedClock,
}

/// The bootstrap superuser of every branch (`initdb`'s, named after
/// PostgreSQL's operating-system user).
pub const SUPERUSER: &str = "postgres";

/// The role applications log in as unless the endpoint names another.
pub const DEFAULT_APP_ROLE: &str = "app";

/// Refuses a role name that would need quoting: lower-case letters, digits
/// and `_`, starting with a letter or `_`, at most 63 bytes (PostgreSQL's
/// `NAMEDATALEN - 1`). The agent writes it into SQL and `pg_hba.conf`.
pub fn check_role_name(name: &str) -> Result<(), String> {
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !first_ok || !rest_ok || name.len() > 63 {
        return Err(format!(
            "{name:?} is not a role name the agent accepts (lower-case letters, digits and _, at most 63)"
        ));
    }
    if name.starts_with("pg_") {
        return Err(format!("{name:?}: names starting with pg_ are PostgreSQL's own roles"));
    }
    Ok(())
}

/// What a replica needs besides a compute's settings.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// Its name (the endpoint's): the pageserver's lease of its read floor
    /// is held under it.
    pub name: String,
    /// The safekeepers' replication services (`host:port`), tried in turn
    /// by PostgreSQL's walreceiver.
    pub replication: Vec<String>,
    /// Start from a checkpoint record at or after this LSN (the one the
    /// writer was just asked to make): the pageserver is waited for until
    /// it has ingested it. None: the last checkpoint record ingested.
    pub after: Option<strata_formats::Lsn>,
    /// The cluster CA's certificate: the walreceiver checks the
    /// safekeepers' certificates against it (a copy in the data directory).
    pub ca_file: Option<PathBuf>,
    /// `hot_standby_feedback`: the replica's oldest snapshot holds back
    /// the writer's cleanup (`docs/replicas.md`, "Lag").
    pub hot_standby_feedback: bool,
    /// A replica whose replay falls further behind the branch's WAL than
    /// this is restarted at the newest WAL (its lease would hold GC back).
    pub max_lag_bytes: u64,
    /// The same in time: the oldest WAL it has not replayed is older than this.
    pub max_lag: Duration,
}

impl AgentConfig {
    /// A configuration with the defaults of the command line.
    pub fn new(
        pgdata: PathBuf,
        pg_port: u16,
        safekeepers: Vec<String>,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        pageserver_http: String,
        password_file: PathBuf,
    ) -> AgentConfig {
        let pageserver = PageserverTarget::new(pageserver_http.clone(), None);
        AgentConfig {
            pgdata,
            pg_port,
            safekeepers,
            tenant_id,
            timeline_id,
            pageserver: pageserver.clone(),
            controllers: Vec::new(),
            pageserver_site: None,
            address_map: Vec::new(),
            pageserver_http,
            http: None,
            http_max_connections: 32,
            pg_bin_dir: PathBuf::from("/usr/lib/postgresql/15/bin"),
            pg_user: "postgres".into(),
            pg_role: SUPERUSER.into(),
            app_role: DEFAULT_APP_ROLE.into(),
            shared_buffers: "128MB".into(),
            io_method: None,
            verify_redo: false,
            application_name: "strata_proposer".into(),
            slot: "strata_proposer".into(),
            max_consumer_lag_bytes: None,
            wait_timeout: Duration::from_secs(60),
            pageserver_patience: Duration::from_secs(30),
            restart_pageserver_patience: Duration::from_secs(5),
            sync_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(60),
            stop_timeout: Duration::from_secs(60),
            failed_linger: Duration::from_secs(1),
            restart: RestartPolicy::default(),
            read_only_at: None,
            replica: None,
            lazy_page_service: None,
            shards: TenantShards::unsharded(pageserver),
            lazy_cache_bytes: 1 << 30,
            lazy_fetch_retry: crate::limits::LAZY_FETCH_RETRY_FOR,
            auth_public_key: None,
            token: None,
            token_file: None,
            tls_client: None,
            tls_server: None,
            pg_tls_files: None,
            pg_host_address: None,
            password_file,
            password_verifier_file: None,
            suspend_after: None,
            clock: crate::clock::SharedClock::default(),
        }
    }

    /// A client of the pageserver's HTTP API with this compute's token and
    /// TLS: of shard 0's for a sharded tenant (which holds every
    /// non-relation key, the catalog and every size), of the layout it has
    /// at each request (a split changes it while the compute runs).
    pub fn pageserver_client(&self) -> super::pageserver_api::PageserverClient {
        super::pageserver_api::PageserverClient::new(&self.pageserver_http, self.tls_client.as_ref())
            .with_token(self.token.clone())
            .following_home(self.shards.clone())
    }

    /// The clients of every shard's pageserver of the layout now, in shard
    /// order (the one [`Self::pageserver_client`] for an unsharded tenant):
    /// what must hold on every shard (a lease) is asked of each. Asked
    /// again for each use, so that a split's new shards are asked.
    pub fn shard_clients(&self) -> Vec<super::pageserver_api::PageserverClient> {
        let now = self.shards.now();
        if !now.layout.is_sharded() {
            return vec![self.pageserver_client()];
        }
        now.ids(self.tenant_id)
            .into_iter()
            .zip(&now.targets)
            .map(|(id, target)| {
                super::pageserver_api::PageserverClient::new(&target.http(), self.tls_client.as_ref())
                    .with_token(self.token.clone())
                    .following(target.clone())
                    .of_shard(id)
            })
            .collect()
    }

    /// The tenant's shard 0 (or its only one) now: basebackups and
    /// timeline questions go there.
    pub fn home_shard(&self) -> TenantShardId {
        TenantShardId { tenant: self.tenant_id, shard: self.shards.home_index() }
    }

    /// Every shard of the tenant now, in order.
    pub fn shard_ids(&self) -> Vec<TenantShardId> {
        self.shards.now().ids(self.tenant_id)
    }

    /// Makes this a compute of a sharded tenant whose shards are at
    /// `(http, page service)` at start, in shard order (shard 0's http is
    /// the one given already).
    pub fn set_shards(&mut self, layout: ShardLayout, at: Vec<(String, String)>) {
        let targets = at
            .into_iter()
            .enumerate()
            .map(|(i, (http, pg))| {
                if i == 0 {
                    self.pageserver.set_pg(Some(pg));
                    self.pageserver.clone()
                } else {
                    let t = PageserverTarget::new(http, Some(pg));
                    t.set_address_map(self.address_map.clone());
                    t
                }
            })
            .collect();
        self.shards = TenantShards::new(layout, targets);
    }
}
