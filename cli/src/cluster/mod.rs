//! The cluster commands (`strata init`, `start`, `stop`, `status`,
//! `endpoint`, `branch`, `site`, `safekeeper replace`, `pageserver
//! drain`, `node`): each parses its command line, calls the control
//! plane's operation (`strata-control-plane`), prints what it reports as
//! it happens and what it returns, and turns the outcome into an exit
//! code, printing an error as `strata <command>: <message>`.

mod args;

pub use args::{
    AuthCommand, BranchCommand, EndpointCommand, InitArgs, NodeArgs, SiteCommand, StatusArgs, TenantCommand,
    TimelineCommand, WorkdirArgs,
};
use strata_control_plane::report::{Notice, Progress};
use strata_control_plane::{
    branch, controller, endpoint, hosts, init, keys, layout, membership, placement, services, site, status, tenant,
    timeline, Error, Result,
};

use crate::out::{errln, outln, Printer};

/// Runs a command body and turns its outcome into an exit code, printing
/// the error as `strata <command>: <message>`.
fn exit_code(command: &str, result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            errln!("strata {command}: {e}");
            match e {
                Error::Usage(_) => 2,
                Error::Failed(_) => 1,
            }
        }
    }
}

/// Opens the workdir with the newest state of any host (saying so if it took one).
fn open(dir: &std::path::Path) -> Result<layout::Workdir> {
    strata_control_plane::open(dir, &mut Printer)
}

/// Takes the workdir's lock, saying so when it has to wait for another command.
fn lock(wd: &layout::Workdir) -> Result<layout::Lock> {
    wd.lock(|| Printer.report(Notice::WaitingForLock { root: wd.root.clone() }.into()))
}

/// Hands the changed state to the other hosts (what failed is a warning).
fn publish(wd: &layout::Workdir) -> Result<()> {
    hosts::publish(&layout::Workdir::open(&wd.root)?, &mut Printer);
    Ok(())
}

/// `strata init`: writes the workdir of a new cluster (nothing is started).
pub fn init(args: InitArgs) -> i32 {
    let result = args.workdir.plain("init").and_then(|()| init::init(&args.options()));
    exit_code("init", result.map(|done| print_initialised(&done)))
}

/// What `strata init` made: the tenant, every service with its ports, and
/// how to start it.
fn print_initialised(done: &init::Initialised) {
    let cluster = &done.cluster;
    outln!("initialised a cluster in {}", done.root.display());
    for t in &cluster.tenants {
        let main = t.branch(layout::MAIN_BRANCH).map(|b| b.timeline_id).unwrap_or_default();
        outln!("tenant {} = {}, branch {} = timeline {main}", t.name, t.tenant_id, layout::MAIN_BRANCH);
    }
    for s in &cluster.services {
        let ports: Vec<String> = s.ports.iter().map(|(r, p)| format!("{r}={p}")).collect();
        outln!("{:<12} {:<11} {:<15} {}", s.name, s.kind.as_str(), s.address, ports.join(" "));
    }
    if done.is_local() {
        outln!("start it with `strata start --workdir {}`", done.workdir.display());
    } else {
        outln!(
            "copy {} to the same path on every host and run `strata node --workdir {} --host NAME` on each (docs/deployment.md)",
            done.root.display(),
            done.root.display()
        );
    }
}

/// `strata start`: starts every service that is not running, then makes
/// sure the tenant and its timelines exist everywhere.
pub fn start(args: WorkdirArgs) -> i32 {
    let result = (|| {
        if args.immediate {
            return Err(Error::Usage("--immediate applies to stopping, not `start`".into()));
        }
        let wd = open(&args.workdir)?;
        let _lock = lock(&wd)?;
        services::start(&wd, &args.only, &mut Printer)
    })();
    exit_code("start", result)
}

/// `strata stop`: stops the endpoints, then the pageserver, then the safekeepers.
pub fn stop(args: WorkdirArgs) -> i32 {
    let result = (|| {
        let wd = open(&args.workdir)?;
        let _lock = lock(&wd)?;
        // The endpoints first (unless `--only`): their agents' last WAL must
        // reach the safekeepers. Keeps going past a failure and reports all.
        let endpoints = match args.only.is_empty() {
            true => endpoint::stop_everywhere(&wd, args.immediate, &mut Printer),
            false => Ok(()),
        };
        let services = services::stop(&wd, &args.only, args.immediate, &mut Printer);
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
        crate::out::print(format_args!("{}", status::report(&wd, args.json)?));
        Ok(())
    })();
    exit_code("status", result)
}

/// `strata timeline checkpoint`.
pub fn timeline(cmd: TimelineCommand) -> i32 {
    match cmd {
        TimelineCommand::Checkpoint { branch, tenant, workdir } => {
            let result = (|| {
                workdir.plain("timeline checkpoint")?;
                let wd = open(&workdir.workdir)?;
                outln!("{}", timeline::checkpoint(&wd, tenant.name(), branch.as_deref())?);
                Ok(())
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
        let _lock = lock(&wd)?;
        match cmd {
            SiteCommand::Promote { .. } => site::promote(&wd, &site_name, &mut Printer)?,
            SiteCommand::Rejoin { .. } => site::rejoin(&wd, &site_name, &mut Printer)?,
        }
        publish(&wd)
    })();
    exit_code(what, result)
}

/// `strata branch create|delete|list`.
pub fn branch(cmd: BranchCommand) -> i32 {
    match cmd {
        BranchCommand::Create { name, from, at, at_time, tenant, workdir } => {
            let result = (|| {
                workdir.plain("branch create")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let point = branch::BranchPoint { at: at.as_deref(), at_time: at_time.as_deref() };
                outln!("{}", branch::create(&wd, tenant.name(), &name, from.as_deref(), point, &mut Printer)?);
                publish(&wd)
            })();
            exit_code("branch create", result)
        }
        BranchCommand::Upgrade { branch, to, name, tenant, workdir } => {
            let result = (|| {
                workdir.plain("branch upgrade")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let name = name.unwrap_or_else(|| format!("{branch}-pg{to}"));
                let upgraded =
                    strata_control_plane::upgrade::upgrade(&wd, tenant.name(), &branch, to, &name, &mut Printer);
                publish(&wd)?;
                outln!("{}", upgraded?);
                Ok(())
            })();
            exit_code("branch upgrade", result)
        }
        BranchCommand::Reset { name, tenant, workdir } => {
            let result = (|| {
                workdir.plain("branch reset")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let reset = branch::reset(&wd, tenant.name(), &name, &mut Printer);
                publish(&wd)?;
                outln!("{}", reset?);
                Ok(())
            })();
            exit_code("branch reset", result)
        }
        BranchCommand::Delete { name, force, tenant, workdir } => {
            let result = (|| {
                workdir.plain("branch delete")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                outln!("{}", branch::delete(&wd, tenant.name(), &name, force, &mut Printer)?);
                publish(&wd)
            })();
            exit_code("branch delete", result)
        }
        BranchCommand::Placement { name, policy, home, max_async_lag, on_async_lag, tenant, workdir } => {
            let result = (|| {
                workdir.plain("branch placement")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let wanted =
                    placement::placement_of(&wd, &policy, home.as_deref(), max_async_lag, on_async_lag.as_deref())?;
                placement::set_placement(&wd, tenant.name(), &name, wanted, &mut Printer)?;
                publish(&wd)
            })();
            exit_code("branch placement", result)
        }
        BranchCommand::List { json, tenant, workdir } => {
            let result = (|| {
                workdir.plain("branch list")?;
                let wd = open(&workdir.workdir)?;
                let list = branch::list(&wd, tenant.name())?;
                match json {
                    true => outln!("{}", list.to_json()),
                    false => crate::out::print(format_args!("{list}")),
                }
                Ok(())
            })();
            exit_code("branch list", result)
        }
    }
}

/// `strata auth token`.
pub fn auth(cmd: AuthCommand) -> i32 {
    match cmd {
        AuthCommand::Token { scope, tenant, timeline, read_only, ttl_secs, workdir } => {
            let result = (|| {
                workdir.plain("auth token")?;
                let wd = open(&workdir.workdir)?;
                let tenant = match (scope, tenant) {
                    (_, Some(t)) => Some(tenant_id_of(&wd, &t)?),
                    (strata_service::auth::Scope::Tenant, None) => {
                        Some(wd.cluster.tenant_named(layout::DEFAULT_TENANT)?.tenant_id)
                    }
                    (_, None) => None,
                };
                let ttl = (ttl_secs > 0).then(|| std::time::Duration::from_secs(ttl_secs));
                let bound = keys::Bound { timeline, read_only };
                outln!("{}", keys::mint(&wd.root, scope, tenant, bound, ttl)?);
                Ok(())
            })();
            exit_code("auth token", result)
        }
        AuthCommand::Rotate { retire, force, workdir } => {
            exit_code("auth rotate", workdir.plain("auth rotate").and_then(|()| rotate(&workdir, retire, force)))
        }
        AuthCommand::Revoke { id, until, token_file, workdir } => {
            let result = workdir.plain("auth revoke").and_then(|()| {
                let wd = open(&workdir.workdir)?;
                let (jti, until) = match (id, token_file) {
                    (Some(id), _) => (id, until),
                    (None, Some(path)) => keys::token_id(&wd.root, &path)?,
                    (None, None) => return Err(Error::Usage("--id or --token-file".into())),
                };
                let _lock = lock(&wd)?;
                let listed = keys::revoke(&wd.root, &jti, until)?;
                new_revision(&wd)?;
                outln!("revoked token {jti} ({listed} on the deny list); every service refuses it within seconds");
                Ok(())
            });
            exit_code("auth revoke", result)
        }
        AuthCommand::Keys { workdir } => {
            let result = workdir.plain("auth keys").and_then(|()| {
                let wd = open(&workdir.workdir)?;
                let (cluster, issuers) = keys::trusted_key_ids(&wd.root)?;
                for (kind, kids, private) in
                    [("cluster", cluster, keys::private_key(&wd.root)), ("issuer", issuers, keys::issuer_key(&wd.root))]
                {
                    let signing = keys::key_id_of(&private)?;
                    for kid in kids {
                        let role = if Some(&kid) == signing.as_ref() { "signs" } else { "trusted" };
                        outln!("{kind} {kid} {role}");
                    }
                }
                Ok(())
            });
            exit_code("auth keys", result)
        }
    }
}

/// A tenant's id from its name, or an id as given (a tenant the cluster
/// does not know may still have a token made for it).
fn tenant_id_of(wd: &layout::Workdir, given: &str) -> Result<strata_protocol::TenantId> {
    match wd.cluster.tenant(given) {
        Some(t) => Ok(t.tenant_id),
        None => given.parse().map_err(|_| {
            let known: Vec<&str> = wd.cluster.tenants.iter().map(|t| t.name.as_str()).collect();
            Error::Usage(format!("--tenant {given}: neither a tenant's name ({}) nor an id", known.join(", ")))
        }),
    }
}

/// `strata tenant create|import|list|delete`.
pub fn tenant(cmd: TenantCommand) -> i32 {
    match cmd {
        TenantCommand::Create { name, pg_version, shards, stripe_blocks, workdir } => {
            let result = (|| {
                workdir.plain("tenant create")?;
                let layout = strata_protocol::shard::ShardLayout::new(shards, stripe_blocks)
                    .map_err(|e| Error::Usage(format!("--shards {shards} --stripe-blocks {stripe_blocks}: {e}")))?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let created = tenant::create(&wd, &name, pg_version, Some(layout), &mut Printer);
                // What was recorded reaches the other hosts even if the creation stopped midway.
                publish(&wd)?;
                outln!("{}", created?);
                Ok(())
            })();
            exit_code("tenant create", result)
        }
        TenantCommand::Import { name, from, pgdata, wal, follow, workdir } => {
            let result = (|| {
                workdir.plain("tenant import")?;
                let source = match (from, pgdata) {
                    (Some(conninfo), _) => strata_control_plane::import::Source::Server(conninfo),
                    (None, Some(pgdata)) => strata_control_plane::import::Source::Directory { pgdata, wal },
                    (None, None) => unreachable!("clap requires one"),
                };
                let wd = open(&workdir.workdir)?;
                // The copy and its replay change nothing of the cluster: no lock yet.
                let ready = match (&source, follow) {
                    (strata_control_plane::import::Source::Server(conninfo), true) => {
                        let stage = strata_control_plane::import::check_new(&wd, &name)?;
                        strata_control_plane::follow::prepare(&wd, &name, &stage, conninfo, &mut Printer)?
                    }
                    _ => strata_control_plane::import::prepare(&wd, &name, &source, &mut Printer)?,
                };
                let _lock = lock(&wd)?;
                let wd = open(&workdir.workdir)?;
                let mut created = strata_control_plane::import::import(&wd, &name, &ready, &mut Printer);
                if created.is_ok() && ready.follow {
                    // The copy goes on as the relay of the source.
                    let wd = open(&workdir.workdir)?;
                    if let Err(e) = strata_control_plane::follow::start(&wd, &name, &mut Printer) {
                        created = Err(e);
                    }
                }
                publish(&wd)?;
                outln!("{}", created?);
                Ok(())
            })();
            exit_code("tenant import", result)
        }
        TenantCommand::Cutover { name, wait, workdir } => {
            let result = (|| {
                workdir.plain("tenant cutover")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let wd = open(&workdir.workdir)?;
                let wait = std::time::Duration::from_secs(wait);
                let done = strata_control_plane::follow::cutover(&wd, &name, Some(wait), &mut Printer);
                publish(&wd)?;
                outln!("{}", done?);
                Ok(())
            })();
            exit_code("tenant cutover", result)
        }
        TenantCommand::Split { name, shards, stripe_blocks, workdir } => {
            let result = (|| {
                workdir.plain("tenant split")?;
                let wd = open(&workdir.workdir)?;
                // The controllers carry the split out: the workdir is only locked to record it.
                let done = strata_control_plane::split::split(&wd, &name, shards, stripe_blocks, &mut Printer)?;
                let _lock = lock(&wd)?;
                let wd = open(&workdir.workdir)?;
                strata_control_plane::split::record(&wd, &done)?;
                publish(&wd)?;
                outln!("{done}");
                Ok(())
            })();
            exit_code("tenant split", result)
        }
        TenantCommand::List { json, workdir } => {
            let result = (|| {
                workdir.plain("tenant list")?;
                let wd = open(&workdir.workdir)?;
                let list = tenant::list(&wd)?;
                match json {
                    true => outln!("{}", list.to_json()),
                    false => crate::out::print(format_args!("{list}")),
                }
                Ok(())
            })();
            exit_code("tenant list", result)
        }
        TenantCommand::Delete { name, workdir } => {
            let result = (|| {
                workdir.plain("tenant delete")?;
                let wd = open(&workdir.workdir)?;
                let _lock = lock(&wd)?;
                let deleted = tenant::delete(&wd, &name, &mut Printer);
                publish(&wd)?;
                outln!("{}", deleted?);
                Ok(())
            })();
            exit_code("tenant delete", result)
        }
    }
}

/// Saves the cluster's state as a new revision and hands it to every host
/// (a host that does not take it now takes it at its next command).
fn new_revision(wd: &layout::Workdir) -> Result<()> {
    let mut cluster = layout::Workdir::open(&wd.root)?.cluster;
    layout::save_cluster(&wd.root, &mut cluster)?;
    publish(wd)
}

/// `strata auth rotate [--retire]`: each step reaches every host before
/// the next one depends on it.
fn rotate(workdir: &WorkdirArgs, retire: bool, force: bool) -> Result<()> {
    let wd = open(&workdir.workdir)?;
    let _lock = lock(&wd)?;
    if retire {
        let behind = hosts::behind(&wd);
        if !behind.is_empty() && !force {
            return Err(Error::Failed(format!(
                "hosts {} do not have the newest state (their services may still hold tokens of the old key): \
                 start their nodes, or --force",
                behind.join(", ")
            )));
        }
        let old = endpoint::endpoints_on_old_keys(&wd)?;
        if !old.is_empty() && !force {
            return Err(Error::Failed(format!(
                "the agents of endpoints {} still hold tokens of the old key (they renew them at the controllers \
                 within seconds): try again shortly, or --force",
                old.join(", ")
            )));
        }
        let retired = keys::retire_old_keys(&wd.root)?;
        new_revision(&wd)?;
        match retired.is_empty() {
            true => outln!("one key was trusted already; nothing to retire"),
            false => outln!("retired {}: tokens it signed are refused from now on", retired.join(", ")),
        }
        return Ok(());
    }
    let kid = keys::stage_new_keys(&wd.root)?;
    // Every host trusts the new key before any token it signed exists: the
    // other hosts took the state; this host's services look at their key
    // file at most a reload interval apart.
    new_revision(&wd)?;
    std::thread::sleep(2 * strata_service::limits::AUTH_RELOAD_INTERVAL);
    keys::switch_to_new_keys(&wd.root)?;
    new_revision(&wd)?;
    outln!("key {kid} signs from now on; the old key stays trusted until `strata auth rotate --retire`");
    Ok(())
}

/// `strata safekeeper replace OLD NEW`.
pub fn replace_safekeeper(old: &str, new: &str, workdir: WorkdirArgs) -> i32 {
    let result = (|| {
        workdir.plain("safekeeper replace")?;
        let wd = open(&workdir.workdir)?;
        let _lock = lock(&wd)?;
        let result = membership::replace(&wd, old, new, &mut Printer);
        // What changed reaches the other hosts even if the replacement stopped midway.
        publish(&wd)?;
        result
    })();
    exit_code("safekeeper replace", result)
}

/// `strata pageserver drain|fill NAME`.
pub fn pageserver_policy(workdir: &WorkdirArgs, name: &str, action: &str) -> i32 {
    let result = (|| {
        workdir.plain(&format!("pageserver {action}"))?;
        let wd = open(&workdir.workdir)?;
        outln!("{}", controller::set_policy(&wd, name, action)?);
        Ok(())
    })();
    exit_code(&format!("pageserver {action}"), result)
}

/// `strata endpoint start|stop|list`.
pub fn endpoint(cmd: EndpointCommand) -> i32 {
    match cmd {
        EndpointCommand::Start {
            name,
            tenant,
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
                let _lock = lock(&wd)?;
                let how = endpoint::StartOptions {
                    tenant: tenant.tenant.as_deref(),
                    branch: branch.as_deref(),
                    port,
                    at: at.as_deref(),
                    replica_of: replica_of.as_deref(),
                    hot_standby_feedback,
                    host: host.as_deref(),
                    site: site.as_deref(),
                    promote: false,
                };
                endpoint::start(&wd, &name, &how, &agent.options(), &mut Printer)
            })();
            exit_code("endpoint start", result)
        }
        EndpointCommand::Promote { name, workdir } => {
            let result = (|| {
                workdir.plain("endpoint promote")?;
                let wd = open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = lock(&wd)?;
                endpoint::promote(&wd, &name, &mut Printer)
            })();
            exit_code("endpoint promote", result)
        }
        EndpointCommand::Suspend { name, workdir } => {
            let result = (|| {
                workdir.plain("endpoint suspend")?;
                let wd = open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = lock(&wd)?;
                endpoint::suspend(&wd, &name, &mut Printer)?;
                outln!("endpoint {name}: suspended; `strata endpoint start {name}` or a connection through the proxy wakes it");
                Ok(())
            })();
            exit_code("endpoint suspend", result)
        }
        EndpointCommand::Stop { name, workdir } => {
            let result = (|| {
                if !workdir.only.is_empty() {
                    return Err(Error::Usage("--only applies to services, not `endpoint stop`".into()));
                }
                let wd = open(&workdir.workdir)?;
                endpoint::check_name(&name)?;
                let _lock = lock(&wd)?;
                endpoint::stop(&wd, &name, workdir.immediate, &mut Printer)
            })();
            exit_code("endpoint stop", result)
        }
        EndpointCommand::List { workdir } => {
            let result = (|| {
                workdir.plain("endpoint list")?;
                let wd = open(&workdir.workdir)?;
                crate::out::print(format_args!("{}", status::list_endpoints(&wd)?));
                Ok(())
            })();
            exit_code("endpoint list", result)
        }
    }
}

/// `strata node`: serves until SIGTERM or SIGINT.
pub fn node(args: NodeArgs) -> i32 {
    crate::logging::init();
    let options = strata_control_plane::node::NodeOptions { workdir: args.workdir, host: args.host };
    match strata_control_plane::node::serve(options) {
        Ok(()) => 0,
        Err(e) => {
            errln!("strata node: {e}");
            1
        }
    }
}
