//! The local cluster: `strata init`, `start`, `stop`, `status`, `endpoint`.
//!
//! A cluster lives in one directory (the *workdir*): `cluster.toml` names
//! every service with its ports and config, each service has a directory
//! with its config, data, log and pidfiles, and each endpoint (a compute:
//! stock PostgreSQL plus its agent) has one under `endpoints/`. Services are
//! detached processes of this same binary, each run by its own supervisor
//! (`strata supervise`) that restarts it when it exits; liveness is decided
//! from the pidfiles, so any command can be run at any time. See
//! `docs/local-cluster.md`.

mod branch;
mod endpoint;
mod http;
mod layout;
mod membership;
mod process;
mod services;
mod status;
mod supervisor;
mod timeline;

use std::fmt;
use std::path::PathBuf;

use clap::{Args, Subcommand};

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
    fn plain(&self, command: &str) -> Result<()> {
        if !self.only.is_empty() {
            return Err(Error::Usage(format!("--only applies to `strata start` and `strata stop`, not `{command}`")));
        }
        if self.immediate {
            return Err(Error::Usage(format!("--immediate applies to stopping, not `{command}`")));
        }
        Ok(())
    }
}

/// `strata init`: what the new cluster looks like.
#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub workdir: WorkdirArgs,
    /// Number of safekeepers (a commit needs a majority of them).
    #[arg(long, default_value_t = 3)]
    pub safekeepers: usize,
    /// Where the installed PostgreSQL 15 server binaries are.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin_dir: PathBuf,
    /// Unprivileged user that runs initdb and PostgreSQL when Strata runs as root.
    #[arg(long, default_value = "postgres")]
    pub pg_user: String,
    /// Verification mode: computes log an image of every page they change and
    /// the pageserver checks its native redo against them (slower; for tests).
    #[arg(long)]
    pub verify_redo: bool,
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
        #[command(flatten)]
        agent: AgentArgs,
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
    #[arg(long, help_heading = "compute agent options", value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub cache_mb: Option<u64>,
    /// How long a lazy compute's read waits for an unreachable pageserver
    /// before that query fails, in seconds (default 20; kept for later
    /// starts).
    #[arg(long, help_heading = "compute agent options", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub fetch_retry_secs: Option<u64>,
    /// PostgreSQL's shared_buffers for this run (default 128MB).
    #[arg(long, help_heading = "compute agent options", value_name = "SIZE")]
    pub shared_buffers: Option<String>,
}

/// Why a cluster command failed; decides the exit code.
#[derive(Debug)]
pub(crate) enum Error {
    /// The command line asks for something impossible (exit code 2).
    Usage(String),
    /// The command was fine but did not succeed (exit code 1).
    Failed(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) | Error::Failed(m) => f.write_str(m),
        }
    }
}

/// Result of the cluster commands' internals.
pub(crate) type Result<T> = std::result::Result<T, Error>;

/// Shorthand for a failure message.
pub(crate) fn failed<T>(message: impl Into<String>) -> Result<T> {
    Err(Error::Failed(message.into()))
}

/// Runs a command body and turns its outcome into an exit code, printing
/// the error as `strata <command>: <message>`.
fn exit_code(command: &str, result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("strata {command}: {e}");
            match e {
                Error::Usage(_) => 2,
                Error::Failed(_) => 1,
            }
        }
    }
}

/// `strata init`: writes the workdir of a new cluster (nothing is started).
pub fn init(args: InitArgs) -> i32 {
    exit_code("init", args.workdir.plain("init").and_then(|()| layout::init(&args)))
}

/// `strata start`: starts every service that is not running, then makes
/// sure the tenant and its timelines exist everywhere.
pub fn start(args: WorkdirArgs) -> i32 {
    let result = (|| {
        if args.immediate {
            return Err(Error::Usage("--immediate applies to stopping, not `start`".into()));
        }
        let wd = layout::Workdir::open(&args.workdir)?;
        let _lock = wd.lock()?;
        services::start(&wd, &args.only)
    })();
    exit_code("start", result)
}

/// `strata stop`: stops the endpoints, then the pageserver, then the safekeepers.
pub fn stop(args: WorkdirArgs) -> i32 {
    let result = (|| {
        let wd = layout::Workdir::open(&args.workdir)?;
        let _lock = wd.lock()?;
        services::stop(&wd, &args.only, args.immediate)
    })();
    exit_code("stop", result)
}

/// `strata status`: services, endpoints and timelines, running or not.
pub fn status(args: StatusArgs) -> i32 {
    let result = (|| {
        args.workdir.plain("status")?;
        let wd = layout::Workdir::open(&args.workdir.workdir)?;
        status::print(&wd, args.json)
    })();
    exit_code("status", result)
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
        workdir: WorkdirArgs,
    },
}

/// `strata timeline checkpoint`.
pub fn timeline(cmd: TimelineCommand) -> i32 {
    match cmd {
        TimelineCommand::Checkpoint { branch, workdir } => {
            let result = (|| {
                workdir.plain("timeline checkpoint")?;
                let wd = layout::Workdir::open(&workdir.workdir)?;
                timeline::checkpoint(&wd, branch.as_deref())
            })();
            exit_code("timeline checkpoint", result)
        }
    }
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
        workdir: WorkdirArgs,
    },
    /// The tree of branches: timeline, parent, branch point, logical size, endpoints.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

/// `strata branch create|delete|list`.
pub fn branch(cmd: BranchCommand) -> i32 {
    match cmd {
        BranchCommand::Create { name, from, at, at_time, workdir } => {
            let result = (|| {
                workdir.plain("branch create")?;
                let wd = layout::Workdir::open(&workdir.workdir)?;
                let _lock = wd.lock()?;
                branch::create(&wd, &name, from.as_deref(), at.as_deref(), at_time.as_deref())
            })();
            exit_code("branch create", result)
        }
        BranchCommand::Delete { name, force, workdir } => {
            let result = (|| {
                workdir.plain("branch delete")?;
                let wd = layout::Workdir::open(&workdir.workdir)?;
                let _lock = wd.lock()?;
                branch::delete(&wd, &name, force)
            })();
            exit_code("branch delete", result)
        }
        BranchCommand::List { json, workdir } => {
            let result = (|| {
                workdir.plain("branch list")?;
                let wd = layout::Workdir::open(&workdir.workdir)?;
                branch::list(&wd, json)
            })();
            exit_code("branch list", result)
        }
    }
}

/// `strata safekeeper replace OLD NEW`.
pub fn replace_safekeeper(old: &str, new: &str, workdir: WorkdirArgs) -> i32 {
    let result = (|| {
        workdir.plain("safekeeper replace")?;
        let wd = layout::Workdir::open(&workdir.workdir)?;
        let _lock = wd.lock()?;
        membership::replace(&wd, old, new)
    })();
    exit_code("safekeeper replace", result)
}

/// `strata endpoint start|stop|list`.
pub fn endpoint(cmd: EndpointCommand) -> i32 {
    match cmd {
        EndpointCommand::Start { name, branch, port, at, agent, workdir } => {
            let result = (|| {
                workdir.plain("endpoint start")?;
                let wd = layout::Workdir::open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = wd.lock()?;
                endpoint::start(&wd, &name, branch.as_deref(), port, &agent, at.as_deref())
            })();
            exit_code("endpoint start", result)
        }
        EndpointCommand::Stop { name, workdir } => {
            let result = (|| {
                if !workdir.only.is_empty() {
                    return Err(Error::Usage("--only applies to services, not `endpoint stop`".into()));
                }
                let wd = layout::Workdir::open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = wd.lock()?;
                endpoint::stop(&wd, &name, workdir.immediate)
            })();
            exit_code("endpoint stop", result)
        }
        EndpointCommand::List { workdir } => {
            let result = (|| {
                workdir.plain("endpoint list")?;
                let wd = layout::Workdir::open(&workdir.workdir)?;
                endpoint::list(&wd)
            })();
            exit_code("endpoint list", result)
        }
    }
}
