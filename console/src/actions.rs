//! The console's actions: the CLI's operations, called the same way (the
//! newest state of any host, the workdir's lock, the same checks), each
//! recorded in the console's audit log with the user who asked and what it
//! came to.

use std::path::Path;

use strata_control_plane::report::{self, Event};
use strata_control_plane::{branch, endpoint, hosts, layout, Error};

/// What an action asks for.
#[derive(Clone, Debug)]
pub enum Action {
    CreateBranch {
        tenant: String,
        name: String,
        parent: String,
        at: Option<String>,
        at_time: Option<String>,
    },
    ResetBranch {
        tenant: String,
        name: String,
    },
    /// A new endpoint (or a stopped one started again) on a branch, or a
    /// replica of another endpoint.
    StartNew {
        tenant: String,
        name: String,
        branch: String,
        replica_of: Option<String>,
        suspend_after_secs: Option<u64>,
    },
    Start {
        name: String,
    },
    Stop {
        name: String,
    },
    Suspend {
        name: String,
    },
    Promote {
        name: String,
    },
}

impl Action {
    /// How the audit log names it.
    pub fn describe(&self) -> String {
        match self {
            Action::CreateBranch { tenant, name, parent, at, at_time } => {
                let point = match (at, at_time) {
                    (Some(lsn), _) => format!(" at {lsn}"),
                    (None, Some(t)) => format!(" at time {t}"),
                    _ => String::new(),
                };
                format!("branch create {tenant}/{name} from {parent}{point}")
            }
            Action::ResetBranch { tenant, name } => format!("branch reset {tenant}/{name}"),
            Action::StartNew { tenant, name, branch, replica_of, .. } => match replica_of {
                Some(of) => format!("endpoint start {name} --replica-of {of} ({tenant})"),
                None => format!("endpoint start {name} --tenant {tenant} --branch {branch}"),
            },
            Action::Start { name } => format!("endpoint start {name}"),
            Action::Stop { name } => format!("endpoint stop {name}"),
            Action::Suspend { name } => format!("endpoint suspend {name}"),
            Action::Promote { name } => format!("endpoint promote {name}"),
        }
    }
}

/// Runs `action` on the workdir at `root` as the CLI would; the lines it
/// reported. Blocking.
pub fn run(root: &Path, action: &Action) -> Result<Vec<String>, Error> {
    let mut events: Vec<Event> = Vec::new();
    let wd = strata_control_plane::open(root, &mut events)?;
    let _lock = wd.lock(|| tracing::info!("waiting for another command's lock"))?;
    let wd = layout::Workdir::open(&wd.root)?;
    let mut lines = Vec::new();
    let outcome: Result<(), Error> = (|| {
        match action {
            Action::CreateBranch { tenant, name, parent, at, at_time } => {
                let point = branch::BranchPoint { at: at.as_deref(), at_time: at_time.as_deref() };
                let made = branch::create(&wd, tenant, name, Some(parent), point, &mut events);
                publish(&wd, &mut events);
                lines.push(made?.to_string());
            }
            Action::ResetBranch { tenant, name } => {
                let reset = branch::reset(&wd, tenant, name, &mut events);
                publish(&wd, &mut events);
                lines.push(reset?.to_string());
            }
            Action::StartNew { tenant, name, branch, replica_of, suspend_after_secs } => {
                endpoint::check_name(name)?;
                let how = endpoint::StartOptions {
                    tenant: Some(tenant),
                    branch: replica_of.is_none().then_some(branch.as_str()),
                    replica_of: replica_of.as_deref(),
                    ..Default::default()
                };
                let agent = strata_control_plane::options::AgentOptions {
                    suspend_after_secs: *suspend_after_secs,
                    ..Default::default()
                };
                endpoint::start(&wd, name, &how, &agent, &mut events)?;
            }
            Action::Start { name } => {
                endpoint::start(&wd, name, &Default::default(), &Default::default(), &mut events)?;
            }
            Action::Stop { name } => endpoint::stop(&wd, name, false, &mut events)?,
            Action::Suspend { name } => {
                endpoint::suspend(&wd, name, &mut events)?;
                lines.push(format!("endpoint {name}: suspended; a connection through the proxy wakes it"));
            }
            Action::Promote { name } => endpoint::promote(&wd, name, &mut events)?,
        }
        Ok(())
    })();
    let mut reported = report::lines(events, |e| tracing::warn!("{e}"));
    reported.extend(lines);
    outcome.map(|()| reported)
}

/// Hands a changed state to the other hosts, as the CLI does (a host that
/// misses it takes it at its next command).
fn publish(wd: &layout::Workdir, events: &mut Vec<Event>) {
    if let Ok(fresh) = layout::Workdir::open(&wd.root) {
        hosts::publish(&fresh, events);
    }
}
