//! The local cluster: `strata init`, `start`, `stop`, `status`, `endpoint`.

use clap::{Args, Subcommand};

/// Options every cluster command takes.
#[derive(Args, Clone, Debug)]
pub struct WorkdirArgs {
    /// The cluster's directory (configs, data, logs).
    #[arg(long, default_value = ".strata")]
    pub workdir: std::path::PathBuf,
}

#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub workdir: WorkdirArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub workdir: WorkdirArgs,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum EndpointCommand {
    /// Start a compute (PostgreSQL + agent) on a branch; prints its connection string last.
    Start {
        name: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    Stop {
        name: String,
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
    List {
        #[command(flatten)]
        workdir: WorkdirArgs,
    },
}

pub fn init(args: InitArgs) -> i32 {
    let _ = args;
    eprintln!("strata init: not built yet");
    1
}
pub fn start(args: WorkdirArgs) -> i32 {
    let _ = args;
    eprintln!("strata start: not built yet");
    1
}
pub fn stop(args: WorkdirArgs) -> i32 {
    let _ = args;
    eprintln!("strata stop: not built yet");
    1
}
pub fn status(args: StatusArgs) -> i32 {
    let _ = args;
    eprintln!("strata status: not built yet");
    1
}
pub fn endpoint(cmd: EndpointCommand) -> i32 {
    let _ = cmd;
    eprintln!("strata endpoint: not built yet");
    1
}
