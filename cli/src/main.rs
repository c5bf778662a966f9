//! `strata`: one binary, a subcommand per role.

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
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Wal(cmd) => wal::run(cmd),
    };
    std::process::exit(code);
}
