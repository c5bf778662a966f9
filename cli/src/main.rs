//! `strata`: one binary, a subcommand per role.

mod compute;
mod pgdata;
mod verify_images;
mod wal;

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
    /// The compute agent next to a stock PostgreSQL: WAL proposer, safekeeper sync.
    #[command(subcommand)]
    Compute(compute::ComputeCommand),
    /// Run a safekeeper: durable, replicated WAL for PostgreSQL timelines.
    Safekeeper {
        /// The safekeeper's TOML configuration.
        #[arg(long)]
        config: std::path::PathBuf,
    },
}

/// Logs to stderr; `RUST_LOG` selects levels (default: info).
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
}

fn safekeeper(config: &std::path::Path) -> i32 {
    init_logging();
    let config = match strata_safekeeper::config::SafekeeperConfig::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("strata safekeeper: {e}");
            return 2;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime starts");
    match runtime.block_on(strata_safekeeper::run(config)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            1
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Wal(cmd) => wal::run(cmd),
        Command::Safekeeper { config } => safekeeper(&config),
        Command::Compute(cmd) => compute::run(cmd),
    };
    std::process::exit(code);
}
