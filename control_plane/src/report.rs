//! What the operations tell while they work: each step as a typed
//! [`Event`], handed to the caller's [`Progress`] as it happens. The
//! library prints nothing: the CLI prints each event at once (its
//! `Display` is the line), `strata node` collects them into the lines its
//! API answers with. A [`Notice`] is a warning (the CLI's stderr).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use strata_formats::Lsn;
use strata_protocol::safekeeper::Placement;
use strata_protocol::{NodeId, TimelineId};

use super::process::Stopped;
use super::supervisor::StopOutcome;

/// Where an operation tells its steps as they happen.
pub trait Progress {
    fn report(&mut self, event: Event);
}

/// Collects the events, to report or answer with later (an operation on
/// another thread, the node's handlers).
impl Progress for Vec<Event> {
    fn report(&mut self, event: Event) {
        self.push(event);
    }
}

impl dyn Progress + '_ {
    /// Reports one event of any of the kinds [`Event`] wraps.
    pub fn tell(&mut self, event: impl Into<Event>) {
        self.report(event.into());
    }
}

/// One step of an operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Service(ServiceEvent),
    Endpoint(EndpointEvent),
    /// A service or an endpoint was asked to stop.
    Stopped(StopReport),
    Branch(BranchEvent),
    Tenant(TenantEvent),
    Change(ChangeEvent),
    Replace(ReplaceEvent),
    Site(SiteEvent),
    Policy(PolicyChanged),
    /// A line another host's node answered with; a service's names its host.
    Relayed {
        line: String,
        host: Option<String>,
    },
    Notice(Notice),
}

impl Event {
    /// A warning rather than a step: the CLI prints it on stderr.
    pub fn is_notice(&self) -> bool {
        matches!(self, Event::Notice(_))
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Service(e) => e.fmt(f),
            Event::Endpoint(e) => e.fmt(f),
            Event::Stopped(e) => e.fmt(f),
            Event::Branch(e) => e.fmt(f),
            Event::Tenant(e) => e.fmt(f),
            Event::Change(e) => e.fmt(f),
            Event::Replace(e) => e.fmt(f),
            Event::Site(e) => e.fmt(f),
            Event::Policy(e) => e.fmt(f),
            Event::Relayed { line, host: Some(host) } => write!(f, "{line} (host {host})"),
            Event::Relayed { line, host: None } => f.write_str(line),
            Event::Notice(e) => e.fmt(f),
        }
    }
}

macro_rules! wraps {
    ($($kind:ident => $variant:ident),* $(,)?) => {
        $(impl From<$kind> for Event {
            fn from(e: $kind) -> Event {
                Event::$variant(e)
            }
        })*
    };
}

wraps!(
    ServiceEvent => Service,
    EndpointEvent => Endpoint,
    StopReport => Stopped,
    BranchEvent => Branch,
    TenantEvent => Tenant,
    ChangeEvent => Change,
    ReplaceEvent => Replace,
    SiteEvent => Site,
    PolicyChanged => Policy,
    Notice => Notice,
);

/// How a stop went: `sk1: stopped (pid 7)`, `endpoint e: not running`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopReport {
    /// `sk1`, `endpoint e`.
    pub label: String,
    pub outcome: StopOutcome,
    pub immediate: bool,
    /// The grace period it had, named when it was exceeded.
    pub grace: Duration,
}

impl StopReport {
    /// `stopped (pid N)`, `killed (pid N)`, `not running`, ….
    pub fn message(&self) -> String {
        let (pid, how) = match self.outcome {
            StopOutcome::Stopped { pid, how } => (pid, how),
            StopOutcome::NotRunning => return "not running".into(),
            StopOutcome::Suspended => return "suspended; nothing to stop".into(),
        };
        let pid = match pid {
            Some(pid) => format!("pid {pid}"),
            None => "it was waiting to be restarted".into(),
        };
        match how {
            Stopped::Clean => format!("stopped ({pid})"),
            Stopped::Killed if self.immediate => format!("killed ({pid})"),
            Stopped::Killed => format!("killed ({pid}) after not stopping within {}s", self.grace.as_secs()),
        }
    }
}

impl fmt::Display for StopReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.label, self.message())
    }
}

/// Whether a safekeeper holds a branch's timeline after `ensure_timelines`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Existing,
    Created,
    /// It gets the timeline when `strata start` starts it again.
    NotRunning,
}

/// Starting services and making sure the tenant and its timelines exist.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceEvent {
    /// Started by the node of its host (another machine).
    RunningOnHost {
        service: String,
        host: String,
    },
    AlreadyRunning {
        service: String,
        pid: i32,
    },
    /// Its supervisor runs and starts it again.
    Restarting {
        service: String,
        supervisor: i32,
        restarts: u64,
        last_exit: Option<String>,
    },
    /// Its supervisor was killed: stopped, to start under a new one.
    Unsupervised {
        service: String,
        pid: i32,
    },
    Started {
        service: String,
        pid: i32,
        supervisor: u32,
        log: PathBuf,
    },
    TenantNotChecked,
    CreatingTenant {
        pageserver: String,
        tenant: strata_protocol::TenantShardId,
    },
    TimelineOn {
        branch: String,
        timeline: TimelineId,
        pageserver: String,
        safekeepers: Vec<(String, Held)>,
    },
    /// Not every safekeeper runs, so the branch's placement waits.
    PlacementLater {
        branch: String,
    },
}

impl fmt::Display for ServiceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceEvent::RunningOnHost { service, host } => write!(f, "{service}: running on host {host}"),
            ServiceEvent::AlreadyRunning { service, pid } => write!(f, "{service}: already running (pid {pid})"),
            ServiceEvent::Restarting { service, supervisor, restarts, last_exit } => write!(
                f,
                "{service}: restarting (its supervisor, pid {supervisor}, starts it again; restarts {restarts}, last \
                 exit: {})",
                last_exit.as_deref().unwrap_or("-")
            ),
            ServiceEvent::Unsupervised { service, pid } => {
                write!(f, "{service}: runs without its supervisor (pid {pid}); restarting it under a new one")
            }
            ServiceEvent::Started { service, pid, supervisor, log } => {
                write!(f, "{service}: started (pid {pid}, supervisor pid {supervisor}, log {})", log.display())
            }
            ServiceEvent::TenantNotChecked => {
                f.write_str("no pageserver or no storage controller runs, so the tenant was not checked")
            }
            ServiceEvent::CreatingTenant { pageserver, tenant } => {
                write!(f, "{pageserver}: creating tenant {tenant} (initdb and import; this takes a while)")
            }
            ServiceEvent::TimelineOn { branch, timeline, pageserver, safekeepers } => {
                let on: Vec<String> = safekeepers
                    .iter()
                    .map(|(name, held)| match held {
                        Held::Existing => name.clone(),
                        Held::Created => format!("{name} (created)"),
                        Held::NotRunning => format!("{name} (not running)"),
                    })
                    .collect();
                write!(f, "branch {branch}: timeline {timeline} on {pageserver}, {}", on.join(", "))
            }
            ServiceEvent::PlacementLater { branch } => {
                write!(f, "branch {branch}: its placement is applied once every safekeeper runs")
            }
        }
    }
}

/// Starting, moving, promoting and stopping endpoints.
#[derive(Clone, Debug, PartialEq)]
pub enum EndpointEvent {
    /// A replica starts from the writer's last checkpoint instead.
    NoFreshCheckpoint {
        endpoint: String,
        writer: String,
        error: String,
    },
    Moves {
        endpoint: String,
        from: String,
        to: String,
    },
    Promoted {
        endpoint: String,
        branch: String,
        seconds: f64,
    },
    FencedNotStopped {
        endpoint: String,
        error: String,
    },
    /// A PostgreSQL whose agent was killed was stopped.
    OrphanStopped {
        endpoint: String,
        pid: i32,
    },
    /// Its agent's supervisor was killed: the agent is stopped, to start anew.
    Unsupervised {
        endpoint: String,
        pid: i32,
    },
    Running {
        endpoint: String,
        branch: String,
        timeline: TimelineId,
        host: String,
        pid: i32,
        supervisor: u32,
        log: PathBuf,
    },
    /// The connection string of a client on another host.
    OverTls(String),
    /// The connection string of a client on its host: the last line of a start.
    Connstr(String),
    /// Removed with its branch.
    Removed {
        endpoint: String,
    },
}

impl fmt::Display for EndpointEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointEvent::NoFreshCheckpoint { endpoint, writer, error } => write!(
                f,
                "endpoint {endpoint}: no fresh checkpoint from writer {writer} ({error}); starting from the last one"
            ),
            EndpointEvent::Moves { endpoint, from, to } => {
                write!(f, "endpoint {endpoint}: moves from host {from} to host {to}")
            }
            EndpointEvent::Promoted { endpoint, branch, seconds } => {
                write!(f, "endpoint {endpoint}: promoted to the writer of branch {branch} in {seconds:.2} s")
            }
            EndpointEvent::FencedNotStopped { endpoint, error } => {
                write!(f, "endpoint {endpoint}: fenced, but not stopped: {error}")
            }
            EndpointEvent::OrphanStopped { endpoint, pid } => {
                write!(f, "endpoint {endpoint}: stopped PostgreSQL (pid {pid}) left running by its agent")
            }
            EndpointEvent::Unsupervised { endpoint, pid } => write!(
                f,
                "endpoint {endpoint}: its agent (pid {pid}) runs without its supervisor; restarting it under a new one"
            ),
            EndpointEvent::Running { endpoint, branch, timeline, host, pid, supervisor, log } => write!(
                f,
                "endpoint {endpoint}: running on branch {branch} (timeline {timeline}) on host {host}, agent pid \
                 {pid}, supervisor pid {supervisor}, log {}",
                log.display()
            ),
            EndpointEvent::OverTls(connstr) => write!(f, "over TLS: {connstr}"),
            EndpointEvent::Connstr(connstr) => f.write_str(connstr),
            EndpointEvent::Removed { endpoint } => write!(f, "endpoint {endpoint}: removed"),
        }
    }
}

/// Branches: a placement recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum BranchEvent {
    PlacementSet { branch: String, timeline: TimelineId, placement: Placement },
}

impl fmt::Display for BranchEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BranchEvent::PlacementSet { branch, timeline, placement } => {
                write!(f, "branch {branch} (timeline {timeline}): placement {}", describe_placement(placement))
            }
        }
    }
}

/// Tenants: the steps of their creation and deletion.
#[derive(Clone, Debug, PartialEq)]
pub enum TenantEvent {
    /// An interrupted run of the same command left the tenant in this state.
    Resuming { tenant: String, what: &'static str },
    /// Pageservers that still hold the tenant, told to detach it.
    Detaching { tenant: String, pageservers: Vec<String> },
    /// The tenant's timelines are gone from a safekeeper.
    TimelinesDeleted { tenant: String, safekeeper: String },
    /// A step of `tenant import` begins.
    Importing { step: String },
    /// A split reached a phase (`strata tenant split`).
    Split { tenant: String, phase: String },
}

impl fmt::Display for TenantEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantEvent::Resuming { tenant, what } => write!(f, "tenant {tenant}: resuming its {what}"),
            TenantEvent::Detaching { tenant, pageservers } => {
                write!(f, "tenant {tenant}: waiting for {} to detach it", pageservers.join(", "))
            }
            TenantEvent::TimelinesDeleted { tenant, safekeeper } => {
                write!(f, "tenant {tenant}: its timelines are deleted on {safekeeper}")
            }
            TenantEvent::Importing { step } => write!(f, "import: {step}"),
            TenantEvent::Split { tenant, phase } => write!(f, "tenant {tenant}: split {phase}"),
        }
    }
}

/// A placement in words, as the commands print it.
pub fn describe_placement(p: &Placement) -> String {
    match p {
        Placement::LocalQuorum { home, max_async_lag, on_async_lag } => {
            format!(
                "local-quorum (home {home}, max_async_lag {max_async_lag} bytes, on_async_lag {})",
                on_async_lag.as_str()
            )
        }
        other => other.policy().to_string(),
    }
}

/// The steps of one timeline's membership change (indented under its branch).
#[derive(Clone, Debug, PartialEq)]
pub enum ChangeEvent {
    /// A safekeeper the configuration did not reach (a quorum did).
    NotReached(String),
    GenerationOn {
        timeline: TimelineId,
        generation: u32,
        policy: String,
        on: Vec<String>,
    },
    /// No WAL was written: the target is the first configuration.
    FirstWithoutWal {
        policy: String,
    },
    /// The configured set became generation 1.
    FirstIsCurrent,
    AlreadyDone {
        generation: u32,
        policy: String,
    },
    Joint {
        generation: u32,
    },
    Last {
        generation: u32,
        policy: String,
    },
    CatchingUp {
        safekeeper: String,
        target: Lsn,
    },
    CaughtUp {
        safekeeper: String,
        lsn: Lsn,
        seconds: f64,
    },
    CatchUpAt {
        safekeeper: String,
        lsn: Lsn,
        target: Lsn,
    },
    JointHeld {
        seconds: f64,
    },
    /// No compute was elected under the joint generation: this command elects.
    Electing {
        generation: u32,
    },
    Elected {
        end: Lsn,
    },
}

impl fmt::Display for ChangeEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeEvent::NotReached(problem) => write!(f, "  (not reached: {problem})"),
            ChangeEvent::GenerationOn { timeline, generation, policy, on } => {
                write!(f, "  timeline {timeline}: generation {generation} ({policy}) on {}", on.join(", "))
            }
            ChangeEvent::FirstWithoutWal { policy } => write!(f, "  generation 1: {policy} (no WAL was written yet)"),
            ChangeEvent::FirstIsCurrent => f.write_str("  generation 1: the current safekeepers"),
            ChangeEvent::AlreadyDone { generation, policy } => {
                write!(f, "  already done (generation {generation}, {policy})")
            }
            ChangeEvent::Joint { generation } => write!(
                f,
                "  generation {generation}: joint (a quorum of the old and of the new rule for every election and \
                 commit)"
            ),
            ChangeEvent::Last { generation, policy } => write!(f, "  generation {generation}: {policy} of the new set"),
            ChangeEvent::CatchingUp { safekeeper, target } => write!(f, "  {safekeeper} catching up to {target}"),
            ChangeEvent::CaughtUp { safekeeper, lsn, seconds } => {
                write!(f, "  {safekeeper} caught up ({lsn} in {seconds:.1}s)")
            }
            ChangeEvent::CatchUpAt { safekeeper, lsn, target } => write!(f, "  {safekeeper} at {lsn} of {target}"),
            ChangeEvent::JointHeld { seconds } => {
                write!(f, "  a quorum of the new rule holds the joint epoch ({seconds:.1}s)")
            }
            ChangeEvent::Electing { generation } => {
                write!(f, "  no compute was elected under generation {generation}; electing a proposer to commit it")
            }
            ChangeEvent::Elected { end } => write!(f, "  elected and committed up to {end}"),
        }
    }
}

/// `strata safekeeper replace`.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplaceEvent {
    Resuming {
        old: String,
        new: String,
    },
    Added {
        name: String,
        id: NodeId,
        listen: std::net::SocketAddr,
    },
    /// The membership change of one branch's timeline begins.
    Timeline {
        branch: String,
        timeline: TimelineId,
    },
    Replaced {
        old: String,
        new: String,
    },
}

impl fmt::Display for ReplaceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplaceEvent::Resuming { old, new } => write!(f, "{new}: exists; resuming the replacement of {old}"),
            ReplaceEvent::Added { name, id, listen } => write!(f, "{name}: added as safekeeper {id} (listen {listen})"),
            ReplaceEvent::Timeline { branch, timeline } => write!(f, "branch {branch} (timeline {timeline}):"),
            ReplaceEvent::Replaced { old, new } => write!(
                f,
                "{old} replaced by {new}; the pageserver and the other safekeepers use the new list from their next \
                 start ({old}'s directory is kept)"
            ),
        }
    }
}

/// What one branch lost in a site promotion (`docs/sites.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct Loss {
    pub branch: String,
    pub divergent: String,
    pub fork_lsn: Lsn,
    /// What the lost site had acknowledged: the highest commit LSN its
    /// safekeepers had before the seal; `None`: none of them answered.
    pub acknowledged: Option<Lsn>,
    /// The end of the WAL they held (past `acknowledged` it may or may not
    /// have been acknowledged: its acknowledgement was in flight).
    pub held: Option<Lsn>,
    /// The commit LSN the promoted site's safekeepers were last sent: what
    /// the lost site had acknowledged at least.
    pub told: Lsn,
    /// Commit records in [F, acknowledged) and in [acknowledged, held),
    /// if that WAL was read.
    pub transactions: Option<(u64, u64)>,
    /// The timeline was `stretched`: every commit acknowledged was on a
    /// safekeeper of the promoted site too, so nothing can be lost.
    pub stretched: bool,
}

impl Loss {
    /// The report of the loss, as the lost site's operator reads it.
    fn describe(&self, lost_site: &str) -> String {
        let (f, b, d) = (self.fork_lsn, &self.branch, &self.divergent);
        let in_doubt = |from: Lsn| match (self.held, self.transactions) {
            (Some(h), Some((_, n))) if h > from => {
                format!("; {lost_site} also held [{from}, {h}) whose acknowledgement was in flight ({n} transactions)")
            }
            (Some(h), None) if h > from => {
                format!("; {lost_site} also held [{from}, {h}) whose acknowledgement was in flight")
            }
            _ => String::new(),
        };
        match self.acknowledged {
            Some(c) if c <= f => format!(
                "branch {b}: nothing lost: {lost_site} had acknowledged up to {c}, held here up to {f}{}; \
                 {lost_site}'s history is branch {d}",
                in_doubt(f)
            ),
            Some(c) => format!(
                "branch {b}: lost [{f}, {c}): {} bytes, {} acknowledged by {lost_site} and never received here{}; \
                 kept in branch {d}",
                c.0 - f.0,
                match self.transactions {
                    Some((n, _)) => format!("{n} transactions"),
                    None => "transactions unknown (its WAL could not be read)".into(),
                },
                in_doubt(c)
            ),
            None if self.stretched => format!(
                "branch {b}: nothing lost: under stretched every commit {lost_site} acknowledged is on this site \
                 (held here up to {f}); {lost_site}'s history is branch {d}"
            ),
            None if self.told <= f => format!(
                "branch {b}: {lost_site}'s safekeepers did not answer; it had acknowledged at least {} (held here up \
                 to {f}): the rest is known when it returns (`strata site rejoin {lost_site}`); its history is \
                 branch {d}",
                self.told
            ),
            None => format!(
                "branch {b}: lost at least [{f}, {}): {} bytes; {lost_site}'s safekeepers did not answer, the rest \
                 is known when it returns (`strata site rejoin {lost_site}`); kept in branch {d}",
                self.told,
                self.told.0 - f.0
            ),
        }
    }
}

/// `strata site promote|rejoin`.
#[derive(Clone, Debug, PartialEq)]
pub enum SiteEvent {
    /// The events that follow are of this tenant's branches (said for
    /// every tenant but the default one).
    Tenant {
        tenant: String,
    },
    Loss {
        loss: Loss,
        lost_site: String,
    },
    /// The lost site's tail could not be read: its transactions are unknown.
    TailUnread {
        branch: String,
        from: Lsn,
        to: Lsn,
        safekeeper: String,
        error: String,
    },
    AlreadySealed {
        branch: String,
        timeline: TimelineId,
    },
    NotSealed {
        branch: String,
        safekeeper: String,
        error: String,
    },
    SealedElsewhere {
        branch: String,
        safekeeper: String,
        site: String,
        at: Lsn,
    },
    AttachedIn {
        pageserver: String,
        site: String,
    },
    GoesOn {
        branch: String,
        timeline: TimelineId,
        start: Lsn,
        site: String,
        old: TimelineId,
        divergent: String,
    },
    Rebranched {
        endpoint: String,
        branch: String,
        state: String,
    },
    NotRebranched {
        endpoint: String,
        branch: String,
        error: String,
    },
    NoComputeHost {
        site: String,
    },
    Writer {
        endpoint: String,
        branch: String,
        site: String,
    },
    /// A divergent branch to read the returning site's history on.
    History {
        branch: String,
        site: String,
        at: Lsn,
    },
}

impl fmt::Display for SiteEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SiteEvent::Loss { loss, lost_site } => f.write_str(&loss.describe(lost_site)),
            SiteEvent::TailUnread { branch, from, to, safekeeper, error } => {
                write!(f, "branch {branch}: reading [{from}, {to}) from {safekeeper}: {error}")
            }
            SiteEvent::AlreadySealed { branch, timeline } => {
                write!(
                    f,
                    "branch {branch}: timeline {timeline} was sealed already (a promotion interrupted?); going on"
                )
            }
            SiteEvent::NotSealed { branch, safekeeper, error } => {
                write!(f, "branch {branch}: {safekeeper} not sealed ({error}); it is sealed when it returns")
            }
            SiteEvent::SealedElsewhere { branch, safekeeper, site, at } => {
                write!(f, "branch {branch}: {safekeeper} (of {site}) sealed at {at}: its writer is fenced")
            }
            SiteEvent::Tenant { tenant } => write!(f, "tenant {tenant}:"),
            SiteEvent::AttachedIn { pageserver, site } => write!(f, "{pageserver}: the tenant is attached in {site}"),
            SiteEvent::GoesOn { branch, timeline, start, site, old, divergent } => write!(
                f,
                "branch {branch}: goes on in timeline {timeline} from {start} (at home in {site}); its old timeline \
                 {old} is branch {divergent}"
            ),
            SiteEvent::Rebranched { endpoint, branch, state } => {
                write!(f, "endpoint {endpoint}: now on branch {branch} ({state})")
            }
            SiteEvent::NotRebranched { endpoint, branch, error } => {
                write!(f, "endpoint {endpoint}: still recorded on {branch} ({error})")
            }
            SiteEvent::NoComputeHost { site } => {
                write!(f, "site {site} has no host that runs computes: start the writer elsewhere")
            }
            SiteEvent::Writer { endpoint, branch, site } => {
                write!(f, "endpoint {endpoint}: the writer of branch {branch} in {site}")
            }
            SiteEvent::History { branch, site, at } => write!(
                f,
                "branch {branch}: {site}'s history, read-only (e.g. `strata endpoint start NAME --branch {branch} \
                 --at {at}`)"
            ),
        }
    }
}

/// A pageserver's policy as a storage controller took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyChanged {
    pub pageserver: String,
    /// `drain`, `fill` or `lost`.
    pub action: String,
}

impl fmt::Display for PolicyChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.action.as_str() {
            "drain" => "draining: its tenants move to other pageservers",
            "lost" => "lost with its site: its tenants fail over to other pageservers",
            _ => "active: it takes tenants again",
        };
        write!(f, "{}: {what}", self.pageserver)
    }
}

/// Warnings: what went wrong beside the operation, which goes on.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// Another command holds the workdir's lock.
    WaitingForLock {
        root: PathBuf,
    },
    SocketDirLeft {
        endpoint: String,
        dir: PathBuf,
        error: String,
    },
    RevisionTaken {
        revision: u64,
    },
    StateNotSent {
        error: String,
    },
    RevisionNotSent {
        revision: u64,
        host: String,
        error: String,
    },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::WaitingForLock { root } => {
                write!(f, "waiting for another strata command on {} to finish", root.display())
            }
            Notice::SocketDirLeft { endpoint, dir, error } => {
                write!(f, "endpoint {endpoint}: removing socket directory {}: {error}", dir.display())
            }
            Notice::RevisionTaken { revision } => {
                write!(f, "took revision {revision} of the cluster's state from another host")
            }
            Notice::StateNotSent { error } => write!(f, "the cluster's state was not sent to the other hosts: {error}"),
            Notice::RevisionNotSent { revision, host, error } => {
                write!(f, "revision {revision} of the cluster's state not sent to host {host}: {error}")
            }
        }
    }
}

/// Lines of events, as the node answers with them; its warnings go to `warn`.
pub fn lines(events: Vec<Event>, mut warn: impl FnMut(&Event)) -> Vec<String> {
    let mut out = Vec::new();
    for e in events {
        if e.is_notice() {
            warn(&e);
        } else {
            out.push(e.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(outcome: StopOutcome, immediate: bool) -> String {
        StopReport { label: "sk1".into(), outcome, immediate, grace: Duration::from_secs(30) }.to_string()
    }

    #[test]
    fn a_stop_says_how_it_ended() {
        let killed = StopOutcome::Stopped { pid: Some(7), how: Stopped::Killed };
        assert_eq!(stop(StopOutcome::NotRunning, false), "sk1: not running");
        assert_eq!(stop(StopOutcome::Suspended, false), "sk1: suspended; nothing to stop");
        assert_eq!(stop(StopOutcome::Stopped { pid: Some(7), how: Stopped::Clean }, false), "sk1: stopped (pid 7)");
        assert_eq!(stop(killed, true), "sk1: killed (pid 7)");
        assert_eq!(stop(killed, false), "sk1: killed (pid 7) after not stopping within 30s");
        assert_eq!(
            stop(StopOutcome::Stopped { pid: None, how: Stopped::Clean }, false),
            "sk1: stopped (it was waiting to be restarted)"
        );
    }

    #[test]
    fn the_lines_the_tests_and_scripts_read() {
        let timeline = TimelineId::generate();
        let on = ServiceEvent::TimelineOn {
            branch: "main".into(),
            timeline,
            pageserver: "pageserver".into(),
            safekeepers: vec![
                ("sk1".into(), Held::Created),
                ("sk2".into(), Held::Existing),
                ("sk3".into(), Held::NotRunning),
            ],
        };
        assert_eq!(
            Event::from(on).to_string(),
            format!("branch main: timeline {timeline} on pageserver, sk1 (created), sk2, sk3 (not running)")
        );
        let restarting =
            ServiceEvent::Restarting { service: "sk2".into(), supervisor: 9, restarts: 3, last_exit: None };
        assert_eq!(
            restarting.to_string(),
            "sk2: restarting (its supervisor, pid 9, starts it again; restarts 3, last exit: -)"
        );
        let relayed = Event::Relayed { line: "sk1: stopped (pid 4)".into(), host: Some("h2".into()) };
        assert_eq!(relayed.to_string(), "sk1: stopped (pid 4) (host h2)");
        assert_eq!(Event::from(EndpointEvent::Connstr("postgresql://x".into())).to_string(), "postgresql://x");
    }

    #[test]
    fn the_node_answers_with_the_steps_and_logs_the_warnings() {
        let events = vec![
            Event::from(EndpointEvent::OrphanStopped { endpoint: "e".into(), pid: 5 }),
            Event::from(Notice::SocketDirLeft { endpoint: "e".into(), dir: "/s".into(), error: "busy".into() }),
            Event::from(EndpointEvent::Connstr("postgresql://e".into())),
        ];
        let mut warned = Vec::new();
        let answer = lines(events, |e| warned.push(e.to_string()));
        assert_eq!(answer, ["endpoint e: stopped PostgreSQL (pid 5) left running by its agent", "postgresql://e"]);
        assert_eq!(warned, ["endpoint e: removing socket directory /s: busy"]);
    }
}
