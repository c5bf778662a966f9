//! The command lines of the cluster commands (`strata init`, `start`,
//! `stop`, `status`, `endpoint`, `branch`, `timeline`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use strata_control_plane::options::{AgentOptions, InitOptions};
use strata_control_plane::{Error, Result};

/// Options every cluster command takes.
#[derive(Args, Clone, Debug)]
pub struct WorkdirArgs {
    /// The cluster's directory (configs, data, logs).
    #[arg(long, default_value = ".strata")]
    pub workdir: PathBuf,
    /// Only these services (comma-separated names, e.g. `sk2`); the default is all of them.
    #[arg(long, value_delimiter = ',', value_name = "NAMES", help_heading = "start/stop options")]
    pub only: Vec<String>,
    /// Kill at once (SIGKILL) instead of asking for a clean shutdown.
    #[arg(long, help_heading = "stop options")]
    pub immediate: bool,
}

impl WorkdirArgs {
    /// Refuses the start/stop-only options on a command they mean nothing to.
    pub(super) fn plain(&self, command: &str) -> Result<()> {
        if !self.only.is_empty() {
            return Err(Error::Usage(format!("--only applies to `strata start` and `strata stop`, not `{command}`")));
        }
        if self.immediate {
            return Err(Error::Usage(format!("--immediate applies to stopping, not `{command}`")));
        }
        Ok(())
    }
}

/// `--tenant`: which tenant a branch, endpoint or timeline command is about.
#[derive(Args, Clone, Debug, Default)]
pub struct TenantArg {
    /// The tenant (default: `default`, the tenant every cluster is made with).
    #[arg(long, value_name = "NAME")]
    pub tenant: Option<String>,
}

impl TenantArg {
    /// The tenant named, or the default one.
    pub fn name(&self) -> &str {
        self.tenant.as_deref().unwrap_or(strata_control_plane::layout::DEFAULT_TENANT)
    }
}

/// `strata tenant …`: the cluster's tenants, each a PostgreSQL cluster of its own.
#[derive(Subcommand, Debug)]
pub enum TenantCommand {
    /// Create a tenant with its `main` branch (a new PostgreSQL cluster);
    /// prints its id. Run again after an interruption, it finishes.
    Create {
        name: String,
        /// Its PostgreSQL major: 15 (the default), 17 or 18
        /// (`docs/postgres-versions.md`).
        #[arg(long, value_name = "MAJOR", default_value_t = 15)]
        pg_version: u32,
        /// Spread it over N shards, each served by its own pageserver
        /// where there are enough (`docs/sharding.md`); 1: unsharded.
        #[arg(long, value_name = "N", default_value_t = 1)]
        shards: u32,
        /// A shard's stripe: this many consecutive blocks of a relation
        /// stay on one shard (a power of two, at least 8; 2048 = 16 MiB).
        #[arg(long, value_name = "BLOCKS", default_value_t = strata_protocol::shard::DEFAULT_STRIPE_BLOCKS)]
        stripe_blocks: u32,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Make a tenant of an existing database (`docs/import.md`): its
    /// `main` branch equals the source, of the source's major (15, 17 or
    /// 18). The source is a running server (`--from`, copied with
    /// `pg_basebackup`; its user needs the REPLICATION attribute) or a data
    /// directory (`--pgdata`: cleanly shut down, or a base backup with its
    /// WAL in `pg_wal/` or in `--wal`). Prints the new tenant's id.
    Import {
        name: String,
        /// A connection string of the source server.
        #[arg(long, value_name = "CONNINFO", required_unless_present = "pgdata", conflicts_with = "pgdata")]
        from: Option<String>,
        /// The source's data directory (only read).
        #[arg(long, value_name = "DIR")]
        pgdata: Option<std::path::PathBuf>,
        /// A directory of WAL segment files that the base backup in
        /// `--pgdata` needs.
        #[arg(long, value_name = "DIR", requires = "pgdata")]
        wal: Option<std::path::PathBuf>,
        /// Keep following the source (`--from`) as its standby: `main`
        /// takes its WAL until `strata tenant cutover`, so the switch takes
        /// seconds. The role also needs CHECKPOINT (a superuser, or a
        /// member of pg_checkpoint).
        #[arg(long, requires = "from")]
        follow: bool,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// End a streaming import (`tenant import --follow`) once its source
    /// is stopped (`pg_ctl stop`): the last of its WAL reaches the
    /// safekeepers, and `main` takes a writer from then on. Fails, and the
    /// import goes on following, if the source's WAL did not end with its
    /// shutdown checkpoint.
    Cutover {
        name: String,
        /// How long to wait for the last of the WAL (seconds).
        #[arg(long, value_name = "SECS", default_value_t = 60)]
        wait: u64,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Split a tenant into more shards while it serves reads and writes
    /// (`docs/sharding.md`, "Split, step by step"): no data is copied,
    /// and the split either completes or rolls back. N is a multiple of
    /// the tenant's shards. Running computes switch to the new shards by
    /// themselves. Run again after an interruption, it follows the split on.
    Split {
        name: String,
        /// The shard count after the split.
        #[arg(long, value_name = "N")]
        shards: u32,
        /// The stripe of an unsharded tenant's new shards (a sharded
        /// tenant keeps its own); 2048 blocks by default.
        #[arg(long, value_name = "BLOCKS")]
        stripe_blocks: Option<u32>,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Every tenant: id, state, branches, endpoints.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Delete a tenant and everything of it: its endpoints, its timelines
    /// on every safekeeper, its layers on every pageserver and every object
    /// of it in object storage. Every service must run. Run again after an
    /// interruption, it finishes.
    Delete {
        name: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `strata init`: what the new cluster looks like.
#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub workdir: WorkdirArgs,
    /// Number of safekeepers (a commit needs a majority of them; default 3),
    /// for a cluster on this machine.
    #[arg(long, conflicts_with = "hosts")]
    pub safekeepers: Option<usize>,
    /// Number of pageservers (default 1): with two or more, each tenant has
    /// a warm secondary and fails over (`docs/storage-controller.md`).
    #[arg(long, conflicts_with = "hosts")]
    pub pageservers: Option<usize>,
    /// A cluster across machines: the hosts, what each runs and the object
    /// storage, in a TOML file (`docs/deployment.md`).
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
    /// Where the installed PostgreSQL 15 server binaries are.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs initdb and PostgreSQL when Strata runs as root.
    #[arg(long, default_value = "postgres")]
    pub pg_user: String,
    /// The default tenant's PostgreSQL major: 15 (the default), 17 or 18
    /// (`docs/postgres-versions.md`); its programs are found beside
    /// `--pg-bin-dir`'s in Debian's layout.
    #[arg(long, value_name = "MAJOR")]
    pub pg_version: Option<u32>,
    /// Verification mode: computes log an image of every page they change and
    /// the pageserver checks its native redo against them (slower; for tests).
    #[arg(long)]
    pub verify_redo: bool,
    /// How pageservers ask the safekeepers for WAL: `decoded` records
    /// routed per shard, `raw` bytes, or `auto` (decoded for sharded tenants).
    #[arg(long, value_enum, default_value = "auto")]
    pub wal_stream: WalStream,
    /// A cluster on this machine in this many sites (data centres), `dc1`
    /// to `dcN`, joined through a link proxy that adds `--site-latency-ms`
    /// (`docs/sites.md`): the safekeepers spread with the most in `dc1`,
    /// `--pageservers` pageservers in each site.
    #[arg(long, conflicts_with = "hosts", value_name = "N")]
    pub sites: Option<usize>,
    /// The round trip between two sites, in milliseconds (with `--sites`).
    #[arg(long, requires = "sites", value_name = "MS")]
    pub site_latency_ms: Option<f64>,
    /// The WAL placement of `main` (with `--sites`; default local-quorum,
    /// home `dc1`).
    #[arg(long, requires = "sites", value_parser = ["majority", "local-quorum", "stretched"])]
    pub placement: Option<String>,
    /// No TLS and no tokens anywhere: only to measure what they cost
    /// (`bench/security_cost.py`). Such a cluster stays on loopback: its
    /// services refuse any other address without TLS and tokens.
    #[arg(long)]
    pub insecure_loopback: bool,
    /// Store tenants' objects unencrypted: no cluster storage key is made
    /// (`docs/security.md`, "Encryption at rest"); to measure its cost.
    #[arg(long)]
    pub no_encryption_at_rest: bool,
    /// The endpoints' default idle period: an endpoint without a client for
    /// this many seconds suspends itself (`docs/compute.md`, "Suspend"),
    /// unless its own `--suspend-after` says otherwise (default: never).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=strata_compute::limits::MAX_SUSPEND_AFTER_SECS))]
    pub suspend_after: Option<u64>,
    /// The proxy's domain (`docs/proxy.md`): a client reaches endpoint
    /// NAME through the proxy as host `NAME.<domain>`; the proxy's
    /// certificate names `*.<domain>`.
    #[arg(long, value_name = "DOMAIN", default_value = "localhost")]
    pub proxy_domain: String,
}

impl InitArgs {
    /// What the control plane's `init` is asked to build.
    pub fn options(&self) -> InitOptions {
        InitOptions {
            workdir: self.workdir.workdir.clone(),
            safekeepers: self.safekeepers,
            pageservers: self.pageservers,
            hosts: self.hosts.clone(),
            pg_bin_dir: self.pg_bin_dir.clone(),
            pg_user: self.pg_user.clone(),
            pg_version: self.pg_version,
            verify_redo: self.verify_redo,
            wal_stream: self.wal_stream.into(),
            sites: self.sites,
            site_latency_ms: self.site_latency_ms,
            placement: self.placement.clone(),
            insecure_loopback: self.insecure_loopback,
            no_encryption_at_rest: self.no_encryption_at_rest,
            suspend_after_secs: self.suspend_after,
            proxy_domain: Some(self.proxy_domain.clone()),
        }
    }
}

/// `strata node`: what it runs.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The cluster's directory on this host (a copy of the one `strata
    /// init` wrote, at the same path on every host).
    #[arg(long, default_value = ".strata")]
    pub workdir: PathBuf,
    /// The host this is (default: the host whose address is this machine's).
    #[arg(long)]
    pub host: Option<String>,
}

/// `strata status`: human or JSON output.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub workdir: WorkdirArgs,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// `strata endpoint …`: computes (PostgreSQL + agent) of the local cluster.
// Parsed once per run: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum EndpointCommand {
    /// Start a compute (PostgreSQL + agent) on a branch; prints its connection string last.
    Start {
        name: String,
        /// The branch to run on (default: the endpoint's branch, `main` for a new one).
        #[arg(long)]
        branch: Option<String>,
        /// PostgreSQL's port (default: the endpoint's previous port, else a free one).
        #[arg(long)]
        port: Option<u16>,
        /// A read-only compute at this point of the branch: an LSN, or a
        /// time (every transaction committed by then); writes are refused.
        #[arg(long, value_name = "LSN|TIMESTAMP")]
        at: Option<String>,
        /// A replica of this endpoint's branch: a hot standby streaming the
        /// branch's WAL from the safekeepers, its relation files served
        /// lazily (`docs/replicas.md`). Kept for later starts.
        #[arg(long, value_name = "ENDPOINT", conflicts_with = "at")]
        replica_of: Option<String>,
        /// A replica's queries hold back the writer's cleanup of the rows
        /// they may still see (PostgreSQL's hot_standby_feedback); kept for
        /// later starts.
        #[arg(long)]
        hot_standby_feedback: bool,
        /// The host to run on (default: where it ran before, else this
        /// machine's host if it runs computes, else the first that does). A
        /// stopped endpoint given another host moves there.
        #[arg(long)]
        host: Option<String>,
        /// The site (`docs/sites.md`): without `--host`, it runs on a host
        /// of that site; a replica reads that site's pageserver (default: its
        /// host's site). Kept for later starts.
        #[arg(long)]
        site: Option<String>,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        agent: AgentArgs,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Make a replica its branch's writer: it starts again as the writer
    /// on its host and port; the old writer, if still running, is fenced.
    Promote {
        name: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Suspend a running compute now, as its idle period would: it stops
    /// cleanly and the next `endpoint start` or proxied connection wakes it.
    Suspend {
        name: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Stop a compute: PostgreSQL shuts down and its WAL reaches the safekeepers.
    Stop {
        name: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Every endpoint: branch, port, state, connection string.
    List {
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `strata endpoint start`: options handed to the compute agent for this run.
#[derive(Args, Clone, Debug, Default)]
pub struct AgentArgs {
    /// This many restarts of PostgreSQL within --crash-loop-window-secs are
    /// reported as a crash loop (default 5).
    #[arg(long, help_heading = "compute agent options")]
    pub crash_loop_restarts: Option<u32>,
    /// The window of --crash-loop-restarts, in seconds (default 300).
    #[arg(long, help_heading = "compute agent options")]
    pub crash_loop_window_secs: Option<u64>,
    /// A lazy compute: relation files served through FUSE from the
    /// pageserver as PostgreSQL reads them (`docs/lazy-compute.md`). The
    /// default for a new endpoint; kept for the endpoint's later starts.
    #[arg(long, conflicts_with = "eager", help_heading = "compute agent options")]
    pub lazy: bool,
    /// An eager compute: the whole database restored before PostgreSQL
    /// starts (kept for later starts).
    #[arg(long, help_heading = "compute agent options")]
    pub eager: bool,
    /// A lazy compute's local file cache in MiB (default 1024; kept for
    /// later starts).
    #[arg(long, help_heading = "compute agent options", value_parser = clap::value_parser!(u64).range(1..=crate::limits::MAX_CACHE_MB))]
    pub cache_mb: Option<u64>,
    /// How long a lazy compute's read waits for an unreachable pageserver
    /// before that query fails, in seconds (default 20; kept for later
    /// starts).
    #[arg(long, help_heading = "compute agent options", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub fetch_retry_secs: Option<u64>,
    /// A replica lagging more than this many MiB of WAL behind its branch is
    /// restarted at the newest WAL (default 1024; 0: no bound).
    #[arg(long, help_heading = "compute agent options", value_name = "MIB")]
    pub max_replica_lag_mb: Option<u64>,
    /// PostgreSQL's shared_buffers for this run (default 128MB).
    #[arg(long, help_heading = "compute agent options", value_name = "SIZE")]
    pub shared_buffers: Option<String>,
    /// PostgreSQL 18's io_method for this run (default: 18's, worker;
    /// `docs/lazy-compute.md`).
    #[arg(long, help_heading = "compute agent options", value_name = "METHOD", value_parser = ["sync", "worker", "io_uring"])]
    pub io_method: Option<String>,
    /// Suspend after this many seconds without a client connection: the
    /// compute stops cleanly and the next `endpoint start` wakes it (0:
    /// never; default: the cluster's `default_suspend_after_secs`, else
    /// never). Kept for later starts.
    #[arg(long, help_heading = "compute agent options", value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=strata_compute::limits::MAX_SUSPEND_AFTER_SECS))]
    pub suspend_after: Option<u64>,
}

impl AgentArgs {
    /// The agent's options as the control plane takes them. Every field is
    /// named, so that an option added to one side and not the other fails
    /// to compile.
    pub fn options(&self) -> AgentOptions {
        let AgentArgs {
            crash_loop_restarts,
            crash_loop_window_secs,
            lazy,
            eager,
            cache_mb,
            fetch_retry_secs,
            max_replica_lag_mb,
            shared_buffers,
            io_method,
            suspend_after,
        } = self.clone();
        AgentOptions {
            crash_loop_restarts,
            crash_loop_window_secs,
            lazy,
            eager,
            cache_mb,
            fetch_retry_secs,
            max_replica_lag_mb,
            shared_buffers,
            io_method,
            suspend_after_secs: suspend_after,
        }
    }
}

/// `strata timeline …`.
#[derive(Subcommand, Debug)]
pub enum TimelineCommand {
    /// Flush what the pageserver ingested, compact it and write images now;
    /// prints the LSN now durable in layer files.
    Checkpoint {
        /// The branch (default: main).
        #[arg(long)]
        branch: Option<String>,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `strata site …`: site failover (`docs/sites.md`, "Site failover").
#[derive(Subcommand, Debug)]
pub enum SiteCommand {
    /// The operator's word that every other site is gone: each branch's
    /// timeline is sealed, the branch goes on from where this site's WAL
    /// ends (at home here), the old timeline is kept as the branch
    /// `<branch>-divergent-<LSN>`, and the writer starts here; prints what
    /// was lost (LSN range, bytes, transactions) and the writer's
    /// connection string last.
    Promote {
        site: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// A site given up by `promote` is back (its services started): its
    /// safekeepers are sealed and rejoin as asynchronous members, its
    /// pageservers take tenants again, and the loss report is completed
    /// from its WAL.
    Rejoin {
        site: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `strata auth …`: the cluster's tokens (`docs/security.md`).
#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Print a new token signed by the cluster's key: for an operator's
    /// tools (management), a monitoring system (service) or one tenant's
    /// clients (tenant).
    Token {
        /// management, controller, service or tenant.
        #[arg(long)]
        scope: strata_service::auth::Scope,
        /// The tenant of a tenant token, by name or id (default: the default tenant).
        #[arg(long, value_name = "NAME|ID")]
        tenant: Option<String>,
        /// A tenant token for this timeline of its tenant only.
        #[arg(long)]
        timeline: Option<strata_protocol::TimelineId>,
        /// A tenant token that may read but not propose WAL.
        #[arg(long)]
        read_only: bool,
        /// Seconds until it expires (0: never).
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Rotate the signing key with overlap: a new key is trusted on every
    /// host, then signs every new token (the services' and controllers' own
    /// are signed again and taken up without a restart); the old one stays
    /// trusted until `--retire`.
    Rotate {
        /// Finish the rotation: trust only the key that signs now, refusing
        /// every token another key signed.
        #[arg(long)]
        retire: bool,
        /// Retire even if some host has not taken the newest state.
        #[arg(long, requires = "retire")]
        force: bool,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Revoke one token before it expires: its id goes on the deny list that
    /// every service reads (`docs/security.md`).
    Revoke {
        /// The token's id (its `jti` claim).
        #[arg(long, required_unless_present = "token_file", conflicts_with = "token_file")]
        id: Option<String>,
        /// When the token expires (seconds since the epoch), after which its
        /// entry is dropped; without it, the entry stays until the key is retired.
        #[arg(long, requires = "id")]
        until: Option<u64>,
        /// A file holding the token itself (its id and expiry are read from it).
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// List the keys the cluster trusts, and which one signs.
    Keys {
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `strata branch …`: branches of the tenant (`docs/branches.md`).
#[derive(Subcommand, Debug)]
pub enum BranchCommand {
    /// Create a branch of PARENT (default `main`) at its newest commit, at
    /// an LSN, or at a time (every transaction committed by then, none
    /// after); prints the new timeline and its start LSN.
    Create {
        name: String,
        /// The branch to branch from.
        #[arg(long, value_name = "PARENT")]
        from: Option<String>,
        /// The branch point: an LSN of the parent (e.g. 0/16B3748).
        #[arg(long, value_name = "LSN", conflicts_with = "at_time")]
        at: Option<String>,
        /// The branch point: a time, RFC 3339 or as PostgreSQL prints it (e.g. 2026-11-24 14:03:05.123+00).
        #[arg(long, value_name = "TIMESTAMP")]
        at_time: Option<String>,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Upgrade a branch to a newer PostgreSQL major as a new branch: its
    /// database at its newest commit, upgraded by the new major's own
    /// `pg_upgrade` (`docs/postgres-versions.md`, "Major upgrade"). The
    /// branch itself is left as it is.
    Upgrade {
        /// The branch to upgrade.
        branch: String,
        /// The major to upgrade to (17 or 18, newer than the branch's).
        #[arg(long, value_name = "MAJOR")]
        to: u32,
        /// The new branch's name (default: BRANCH-pgMAJOR).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Reset a branch to its parent's newest commit: it keeps its name,
    /// settings and endpoints (which start again on it); its own changes
    /// are deleted. Refused while a branch or a read-only endpoint depends
    /// on its history.
    Reset {
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Delete a branch: refused while a branch depends on it, or while an
    /// endpoint runs on it unless --force (which stops it).
    Delete {
        name: String,
        /// Stop the endpoints running on it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// Set a branch's WAL placement (`docs/sites.md`): `majority`,
    /// `local-quorum` (a quorum in the home site, the other sites
    /// asynchronous) or `stretched` (every commit on safekeepers of two
    /// sites). Runs a membership change on every safekeeper.
    Placement {
        name: String,
        #[arg(value_parser = ["majority", "local-quorum", "stretched"])]
        policy: String,
        /// local-quorum: the site whose safekeepers make the quorum
        /// (default: the site with the most safekeepers).
        #[arg(long, value_name = "SITE")]
        home: Option<String>,
        /// local-quorum: bytes an asynchronous safekeeper may fall behind
        /// (default 128 MiB).
        #[arg(long, value_name = "BYTES")]
        max_async_lag: Option<u64>,
        /// local-quorum: past the bound, `fall-behind` (default: the
        /// member catches up later) or `throttle` (commits wait).
        #[arg(long, value_parser = ["fall-behind", "throttle"])]
        on_async_lag: Option<String>,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    /// The tree of branches: timeline, parent, branch point, logical size, endpoints.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `--wal-stream`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum WalStream {
    Auto,
    Decoded,
    Raw,
}

impl From<WalStream> for strata_pageserver::config::WalStreamChoice {
    fn from(w: WalStream) -> Self {
        match w {
            WalStream::Auto => Self::Auto,
            WalStream::Decoded => Self::Decoded,
            WalStream::Raw => Self::Raw,
        }
    }
}
