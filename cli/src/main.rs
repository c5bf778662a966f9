//! `strata`: one binary, a subcommand per role.

mod cluster;
mod compute;
mod console;
mod limits;
mod logging;
mod out;
mod pagebench;
mod pgdata;
mod storage;
mod storage_bench;
mod supervise;
mod verify_images;
mod verify_redo;
mod wal;
mod wal_restore;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "strata", version, about = "PostgreSQL with storage separated from compute")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect PostgreSQL WAL: decode segment files, measure decoding speed.
    #[command(subcommand)]
    Wal(wal::WalCommand),
    /// Object storage with the cluster's storage key: read an object, rotate
    /// and wrap again the tenants' data keys.
    #[command(subcommand)]
    Storage(storage::StorageCommand),
    /// The compute agent next to a stock PostgreSQL: WAL proposer, safekeeper sync.
    #[command(subcommand)]
    Compute(compute::ComputeCommand),
    /// Run a safekeeper: durable, replicated WAL for PostgreSQL timelines
    /// (`--config`); or change the local cluster's safekeepers.
    Safekeeper(SafekeeperArgs),
    /// Run a pageserver: page versions from the WAL, GetPage@LSN,
    /// basebackups (`--config`); or drain or fill one of the local cluster's.
    Pageserver(PageserverArgs),
    /// Run a storage controller: places tenants on the pageservers, keeps a
    /// warm secondary, fails over (`docs/storage-controller.md`).
    Controller {
        /// The controller's TOML configuration.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Run a link proxy: a TCP relay that puts a latency (and partitions)
    /// between sites, for tests and benchmarks (`docs/sites.md`).
    LinkProxy {
        /// The link proxy's TOML configuration.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Run the proxy: one PostgreSQL address for every endpoint of every
    /// tenant; authenticates clients, wakes sleeping computes (`docs/proxy.md`).
    Proxy {
        /// The proxy's TOML configuration.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// GetPage@LSN load against a pageserver: throughput and latency percentiles.
    Pagebench(pagebench::PagebenchArgs),
    /// Create a local cluster: configs with free ports, 3 safekeepers, a pageserver, a tenant with a `main` branch.
    Init(cluster::InitArgs),
    /// Start every service of the cluster that is not running.
    Start(cluster::WorkdirArgs),
    /// Run this host's part of a cluster of several hosts: its services,
    /// and the API through which the CLI of any host manages them.
    Node(cluster::NodeArgs),
    /// Stop the local cluster's endpoints and services.
    Stop(cluster::WorkdirArgs),
    /// Every service and timeline of the local cluster.
    Status(cluster::StatusArgs),
    /// Computes (PostgreSQL + agent) of the local cluster.
    #[command(subcommand)]
    Endpoint(cluster::EndpointCommand),
    /// Tenants of the cluster: each a PostgreSQL cluster of its own, with its branches and endpoints.
    #[command(subcommand)]
    Tenant(cluster::TenantCommand),
    /// Branches of the local cluster: a new database at any point of another, in milliseconds.
    #[command(subcommand)]
    Branch(cluster::BranchCommand),
    /// Site failover: promote a site when the other is gone, and rejoin it (docs/sites.md).
    #[command(subcommand)]
    Site(cluster::SiteCommand),
    /// Timelines of the local cluster's branches: checkpoint.
    #[command(subcommand)]
    Timeline(cluster::TimelineCommand),
    /// The cluster as a web page over HTTPS (`docs/console.md`), and its users.
    Console(console::ConsoleArgs),
    /// Tokens of the local cluster (`docs/security.md`).
    #[command(subcommand)]
    Auth(cluster::AuthCommand),
    /// Internal: run one service of the local cluster and restart it when it exits.
    #[command(hide = true)]
    Supervise(supervise::SuperviseArgs),
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct SafekeeperArgs {
    /// The safekeeper's TOML configuration.
    #[arg(long, required = true)]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<SafekeeperCommand>,
}

#[derive(Subcommand)]
enum SafekeeperCommand {
    /// Replace safekeeper OLD of the local cluster (e.g. one whose disk is
    /// gone) by a new, empty safekeeper NEW while writes go on: NEW catches
    /// up, then every timeline's membership moves from the old set to the
    /// new one through a joint configuration (docs/safekeeper-membership.md).
    Replace {
        /// The service to replace (e.g. `sk3`).
        old: String,
        /// The new service's name (e.g. `sk4`).
        new: String,
        #[command(flatten)]
        workdir: cluster::WorkdirArgs,
    },
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct PageserverArgs {
    /// The pageserver's TOML configuration.
    #[arg(long, required = true)]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<PageserverCommand>,
}

#[derive(Subcommand)]
enum PageserverCommand {
    /// Move every tenant off pageserver NAME (live, while computes read)
    /// and place nothing new there, for maintenance (docs/storage-controller.md).
    Drain {
        name: String,
        #[command(flatten)]
        workdir: cluster::WorkdirArgs,
    },
    /// Let pageserver NAME take tenants again after a drain.
    Fill {
        name: String,
        #[command(flatten)]
        workdir: cluster::WorkdirArgs,
    },
}

/// Runs a service process until it stops: its files private to its user
/// and its allocator's thresholds fixed from the start (a long-running
/// service must not keep what a burst once used), its config loaded by
/// `load` (exit code 2 if refused), then `run` on a multi-thread runtime
/// (1 if it fails).
fn run_service<C, E1: std::fmt::Display, E2: std::fmt::Display, F: std::future::Future<Output = Result<(), E2>>>(
    what: &str,
    config: &std::path::Path,
    load: impl FnOnce(&std::path::Path) -> Result<C, E1>,
    run: impl FnOnce(C) -> F,
) -> i32 {
    strata_service::start::private_umask();
    let fixed = strata_service::allocator::fix_thresholds();
    logging::init();
    tracing::debug!(fixed, "the allocator's trim and mmap thresholds");
    let config = match load(config) {
        Ok(c) => c,
        Err(e) => {
            out::errln!("strata {what}: {e}");
            return 2;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime starts");
    match runtime.block_on(run(config)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            1
        }
    }
}

fn safekeeper(config: &std::path::Path) -> i32 {
    run_service("safekeeper", config, strata_safekeeper::config::SafekeeperConfig::load, strata_safekeeper::run)
}

fn pageserver(config: &std::path::Path) -> i32 {
    run_service("pageserver", config, strata_pageserver::config::PageserverConfig::load, strata_pageserver::run)
}

fn controller(config: &std::path::Path) -> i32 {
    run_service("controller", config, strata_controller::config::ControllerConfig::load, strata_controller::run)
}

fn proxy(config: &std::path::Path) -> i32 {
    run_service("proxy", config, strata_proxy::config::ProxyConfig::load, |c| async move {
        let catalog = strata_control_plane::proxy::Catalog::new(c.workdir.clone());
        catalog.check().map_err(|e| strata_proxy::StartError::service("proxy", e))?;
        strata_proxy::run(c, std::sync::Arc::new(catalog)).await
    })
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Wal(cmd) => wal::run(cmd),
        Command::Storage(cmd) => storage::run(cmd),
        Command::Safekeeper(SafekeeperArgs {
            command: Some(SafekeeperCommand::Replace { old, new, workdir }), ..
        }) => cluster::replace_safekeeper(&old, &new, workdir),
        Command::Safekeeper(SafekeeperArgs { config: Some(config), .. }) => safekeeper(&config),
        Command::Safekeeper(_) => unreachable!("clap requires --config without a subcommand"),
        Command::Compute(cmd) => compute::run(cmd),
        Command::Pageserver(PageserverArgs { command: Some(PageserverCommand::Drain { name, workdir }), .. }) => {
            cluster::pageserver_policy(&workdir, &name, "drain")
        }
        Command::Pageserver(PageserverArgs { command: Some(PageserverCommand::Fill { name, workdir }), .. }) => {
            cluster::pageserver_policy(&workdir, &name, "fill")
        }
        Command::Pageserver(PageserverArgs { config: Some(config), .. }) => pageserver(&config),
        Command::Pageserver(PageserverArgs { config: None, command: None }) => unreachable!("clap requires one"),
        Command::Controller { config } => controller(&config),
        Command::LinkProxy { config } => {
            run_service("link-proxy", &config, strata_link_proxy::config::LinkProxyConfig::load, strata_link_proxy::run)
        }
        Command::Proxy { config } => proxy(&config),
        Command::Pagebench(args) => pagebench::run(args),
        Command::Init(args) => cluster::init(args),
        Command::Start(args) => cluster::start(args),
        Command::Stop(args) => cluster::stop(args),
        Command::Status(args) => cluster::status(args),
        Command::Endpoint(cmd) => cluster::endpoint(cmd),
        Command::Timeline(cmd) => cluster::timeline(cmd),
        Command::Site(cmd) => cluster::site(cmd),
        Command::Branch(cmd) => cluster::branch(cmd),
        Command::Tenant(cmd) => cluster::tenant(cmd),
        Command::Auth(cmd) => cluster::auth(cmd),
        Command::Console(args) => console::run(args),
        Command::Supervise(args) => supervise::run(args),
        Command::Node(args) => cluster::node(args),
    };
    // 141 if the output's reader went away meanwhile (see `out`).
    std::process::exit(out::exit_status(code));
}
