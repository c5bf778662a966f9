//! `strata console`: serves the console (`docs/console.md`), and keeps its
//! users (`strata console user add|remove|list`).

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use strata_console::users::{self, Role};

use crate::out::{errln, outln};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ConsoleArgs {
    #[command(subcommand)]
    command: Option<ConsoleCommand>,
    /// Where to listen (default: where it listened last, else a free port on 127.0.0.1).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The cluster's directory.
    #[arg(long, default_value = ".strata")]
    workdir: PathBuf,
}

#[derive(Subcommand, Debug)]
enum ConsoleCommand {
    /// The console's users.
    #[command(subcommand)]
    User(UserCommand),
}

#[derive(Subcommand, Debug)]
enum UserCommand {
    /// Add a user, or give an existing one a new password, role and tenants.
    /// Prints a new random password unless --password-stdin gives one.
    Add {
        name: String,
        /// viewer (sees its tenants) or operator (acts on them and runs SQL).
        #[arg(long, default_value = "viewer")]
        role: String,
        /// A tenant the user may see (repeat for several; default: every tenant).
        #[arg(long = "tenant", value_name = "NAME")]
        tenants: Vec<String>,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        #[arg(long, default_value = ".strata")]
        workdir: PathBuf,
    },
    /// Remove a user: its next login is refused (sessions end within their idle period).
    Remove {
        name: String,
        #[arg(long, default_value = ".strata")]
        workdir: PathBuf,
    },
    /// Every user: name, role, tenants.
    List {
        #[arg(long, default_value = ".strata")]
        workdir: PathBuf,
    },
}

pub fn run(args: ConsoleArgs) -> i32 {
    let result = match args.command {
        None => {
            crate::logging::init();
            strata_console::serve(strata_console::ConsoleOptions { workdir: args.workdir, listen: args.listen })
        }
        Some(ConsoleCommand::User(cmd)) => user(cmd),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            errln!("strata console: {e}");
            1
        }
    }
}

/// The workdir's real path, after checking it holds a cluster.
fn root(workdir: &std::path::Path) -> Result<PathBuf, String> {
    strata_control_plane::layout::Workdir::open(workdir).map(|wd| wd.root).map_err(|e| e.to_string())
}

fn user(cmd: UserCommand) -> Result<(), String> {
    match cmd {
        UserCommand::Add { name, role, tenants, password_stdin, workdir } => {
            let root = root(&workdir)?;
            let role = Role::parse_stored(&role)?;
            let wd = strata_control_plane::layout::Workdir::open(&root).map_err(|e| e.to_string())?;
            for t in &tenants {
                if wd.cluster.tenant(t).is_none() {
                    return Err(format!("--tenant {t}: no tenant of that name"));
                }
            }
            let (password, generated) = match password_stdin {
                true => {
                    let mut line = String::new();
                    std::io::stdin().lock().read_line(&mut line).map_err(|e| format!("standard input: {e}"))?;
                    (line.trim_end_matches(['\n', '\r']).to_string(), false)
                }
                false => (strata_service::auth::generate_password(), true),
            };
            let tenants = (!tenants.is_empty()).then_some(tenants);
            let existed = users::set(&root, &name, role, tenants, &password)?;
            outln!("user {name}: {} ({})", if existed { "updated" } else { "added" }, role.as_str());
            if generated {
                outln!("password: {password}");
            }
            Ok(())
        }
        UserCommand::Remove { name, workdir } => {
            let root = root(&workdir)?;
            match users::remove(&root, &name)? {
                true => outln!("user {name}: removed"),
                false => return Err(format!("no user named {name:?}")),
            }
            Ok(())
        }
        UserCommand::List { workdir } => {
            let root = root(&workdir)?;
            for u in users::load(&root)? {
                let tenants = u.tenants.map_or("(all tenants)".to_string(), |t| t.join(","));
                outln!("{:<24} {:<9} {tenants}", u.name, u.role.as_str());
            }
            Ok(())
        }
    }
}
