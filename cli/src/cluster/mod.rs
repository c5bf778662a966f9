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

mod args;
mod branch;
mod certs;
mod controller;
mod endpoint;
mod error;
mod hosts;
mod http;
mod keys;
mod layout;
mod membership;
mod node;
mod placement;
mod process;
mod reconfigure;
mod services;
mod site;
mod status;
mod supervisor;
mod timeline;

pub use args::{
    AuthCommand, BranchCommand, EndpointCommand, InitArgs, SiteCommand, StatusArgs, TimelineCommand, WorkdirArgs,
};
use error::{Error, Result};
pub use node::{run as node, NodeArgs};

/// Opens the workdir of a command, with the newest state any host has
/// (`hosts::refresh`; nothing to compare on a cluster of this machine only).
fn open(dir: &std::path::Path) -> Result<layout::Workdir> {
    hosts::refresh(layout::Workdir::open(dir)?)
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
        let wd = open(&args.workdir)?;
        let _lock = wd.lock()?;
        services::start(&wd, &args.only)
    })();
    exit_code("start", result)
}

/// `strata stop`: stops the endpoints, then the pageserver, then the safekeepers.
pub fn stop(args: WorkdirArgs) -> i32 {
    let result = (|| {
        let wd = open(&args.workdir)?;
        let _lock = wd.lock()?;
        // The endpoints first (unless `--only`): their agents' last WAL must
        // reach the safekeepers. Keeps going past a failure and reports all.
        let endpoints = if args.only.is_empty() { endpoint::stop_everywhere(&wd, args.immediate) } else { Ok(()) };
        let services = services::stop(&wd, &args.only, args.immediate);
        match (endpoints, services) {
            (Ok(()), result) | (result, Ok(())) => result,
            (Err(a), Err(b)) => Err(Error::Failed(format!("{a}; {b}"))),
        }
    })();
    exit_code("stop", result)
}

/// `strata status`: services, endpoints and timelines, running or not.
pub fn status(args: StatusArgs) -> i32 {
    let result = (|| {
        args.workdir.plain("status")?;
        let wd = open(&args.workdir.workdir)?;
        status::print(&wd, args.json)
    })();
    exit_code("status", result)
}

/// `strata timeline checkpoint`.
pub fn timeline(cmd: TimelineCommand) -> i32 {
    match cmd {
        TimelineCommand::Checkpoint { branch, workdir } => {
            let result = (|| {
                workdir.plain("timeline checkpoint")?;
                let wd = open(&workdir.workdir)?;
                timeline::checkpoint(&wd, branch.as_deref())
            })();
            exit_code("timeline checkpoint", result)
        }
    }
}

/// `strata site promote|rejoin`.
pub fn site(cmd: SiteCommand) -> i32 {
    let (what, site_name, workdir) = match &cmd {
        SiteCommand::Promote { site, workdir } => ("site promote", site.clone(), workdir.clone()),
        SiteCommand::Rejoin { site, workdir } => ("site rejoin", site.clone(), workdir.clone()),
    };
    let result = (|| {
        workdir.plain(what)?;
        let wd = open(&workdir.workdir)?;
        let _lock = wd.lock()?;
        match cmd {
            SiteCommand::Promote { .. } => site::promote(&wd, &site_name)?,
            SiteCommand::Rejoin { .. } => site::rejoin(&wd, &site_name)?,
        }
        hosts::publish(&layout::Workdir::open(&wd.root)?);
        Ok(())
    })();
    exit_code(what, result)
}

/// `strata branch create|delete|list`.
pub fn branch(cmd: BranchCommand) -> i32 {
    match cmd {
        BranchCommand::Create { name, from, at, at_time, workdir } => {
            let result = (|| {
                workdir.plain("branch create")?;
                let wd = open(&workdir.workdir)?;
                let _lock = wd.lock()?;
                branch::create(&wd, &name, from.as_deref(), at.as_deref(), at_time.as_deref())?;
                hosts::publish(&layout::Workdir::open(&wd.root)?);
                Ok(())
            })();
            exit_code("branch create", result)
        }
        BranchCommand::Delete { name, force, workdir } => {
            let result = (|| {
                workdir.plain("branch delete")?;
                let wd = open(&workdir.workdir)?;
                let _lock = wd.lock()?;
                branch::delete(&wd, &name, force)?;
                hosts::publish(&layout::Workdir::open(&wd.root)?);
                Ok(())
            })();
            exit_code("branch delete", result)
        }
        BranchCommand::Placement { name, policy, home, max_async_lag, on_async_lag, workdir } => {
            let result = (|| {
                workdir.plain("branch placement")?;
                let wd = open(&workdir.workdir)?;
                let _lock = wd.lock()?;
                let wanted =
                    placement::placement_of(&wd, &policy, home.as_deref(), max_async_lag, on_async_lag.as_deref())?;
                placement::set_placement(&wd, &name, wanted)?;
                hosts::publish(&layout::Workdir::open(&wd.root)?);
                Ok(())
            })();
            exit_code("branch placement", result)
        }
        BranchCommand::List { json, workdir } => {
            let result = (|| {
                workdir.plain("branch list")?;
                let wd = open(&workdir.workdir)?;
                branch::list(&wd, json)
            })();
            exit_code("branch list", result)
        }
    }
}

/// `strata auth token`.
pub fn auth(cmd: AuthCommand) -> i32 {
    match cmd {
        AuthCommand::Token { scope, tenant, ttl_secs, workdir } => {
            let result = (|| {
                workdir.plain("auth token")?;
                let wd = open(&workdir.workdir)?;
                let tenant = match scope {
                    strata_service::auth::Scope::Tenant => Some(tenant.unwrap_or(wd.cluster.tenant_id)),
                    _ => tenant,
                };
                let ttl = (ttl_secs > 0).then(|| std::time::Duration::from_secs(ttl_secs));
                println!("{}", keys::mint(&wd.root, scope, tenant, ttl)?);
                Ok(())
            })();
            exit_code("auth token", result)
        }
    }
}

/// `strata safekeeper replace OLD NEW`.
pub fn replace_safekeeper(old: &str, new: &str, workdir: WorkdirArgs) -> i32 {
    let result = (|| {
        workdir.plain("safekeeper replace")?;
        let wd = open(&workdir.workdir)?;
        let _lock = wd.lock()?;
        let result = membership::replace(&wd, old, new);
        // What changed reaches the other hosts even if the replacement stopped midway.
        hosts::publish(&layout::Workdir::open(&wd.root)?);
        result
    })();
    exit_code("safekeeper replace", result)
}

/// `strata pageserver drain|fill NAME`.
pub fn pageserver_policy(workdir: &WorkdirArgs, name: &str, action: &str) -> i32 {
    let result = (|| {
        workdir.plain(&format!("pageserver {action}"))?;
        let wd = open(&workdir.workdir)?;
        controller::set_policy(&wd, name, action)
    })();
    exit_code(&format!("pageserver {action}"), result)
}

/// `strata endpoint start|stop|list`.
pub fn endpoint(cmd: EndpointCommand) -> i32 {
    match cmd {
        EndpointCommand::Start {
            name,
            branch,
            port,
            at,
            replica_of,
            hot_standby_feedback,
            host,
            site,
            agent,
            workdir,
        } => {
            let result = (|| {
                workdir.plain("endpoint start")?;
                let wd = open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = wd.lock()?;
                let how = endpoint::StartOptions {
                    branch: branch.as_deref(),
                    port,
                    at: at.as_deref(),
                    replica_of: replica_of.as_deref(),
                    hot_standby_feedback,
                    host: host.as_deref(),
                    site: site.as_deref(),
                    promote: false,
                };
                endpoint::start(&wd, &name, &how, &agent)
            })();
            exit_code("endpoint start", result)
        }
        EndpointCommand::Promote { name, workdir } => {
            let result = (|| {
                workdir.plain("endpoint promote")?;
                let wd = open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = wd.lock()?;
                endpoint::promote(&wd, &name)
            })();
            exit_code("endpoint promote", result)
        }
        EndpointCommand::Stop { name, workdir } => {
            let result = (|| {
                if !workdir.only.is_empty() {
                    return Err(Error::Usage("--only applies to services, not `endpoint stop`".into()));
                }
                let wd = open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = wd.lock()?;
                endpoint::stop(&wd, &name, workdir.immediate)
            })();
            exit_code("endpoint stop", result)
        }
        EndpointCommand::List { workdir } => {
            let result = (|| {
                workdir.plain("endpoint list")?;
                let wd = open(&workdir.workdir)?;
                status::list_endpoints(&wd)
            })();
            exit_code("endpoint list", result)
        }
    }
}
