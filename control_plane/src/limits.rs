//! Every bound of the control plane: what grows with load or time and where
//! it stops.
//!
//! Every wait of a command (for a service or an endpoint to start or stop,
//! for a tenant to be attached, for a checkpoint, for a safekeeper to catch
//! up, for another command's lock) has a deadline and a polling interval,
//! every call to a service or to another host's node a timeout, and what a
//! command prints of a log or an error a length.

use std::time::Duration;

// ---- processes and supervisors

/// How long a killed process gets to disappear.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// Polling interval of every wait for a process or a service, after its
/// first [`FAST_POLL_SPAN`].
pub const POLL: Duration = Duration::from_millis(100);
/// Polling interval of the first moments of such a wait: a service answers
/// and stops within tens of milliseconds, and every command waits on it.
pub const FAST_POLL: Duration = Duration::from_millis(10);
/// How long a wait polls every [`FAST_POLL`] before it polls every [`POLL`].
pub const FAST_POLL_SPAN: Duration = Duration::from_secs(2);
/// How much longer than the service's grace period the supervisor gets to
/// stop it (it SIGKILLs the service after the grace period and waits for it).
pub const SUPERVISOR_MARGIN: Duration = Duration::from_secs(15);
/// Grace period of a service still running after its supervisor stopped.
pub const LEFTOVER_GRACE: Duration = Duration::from_secs(10);

// ---- services

/// Longest a service may take to answer `GET /v1/status` after being spawned.
pub const SERVICE_START_WAIT: Duration = Duration::from_secs(30);
/// Timeout of one status probe of a starting service: it answers at once
/// once it listens.
pub const SERVICE_START_PROBE: Duration = Duration::from_secs(1);
/// Longest a service may take to exit after SIGTERM before it is killed.
pub const SERVICE_STOP_GRACE: Duration = Duration::from_secs(30);
/// Tenant creation runs initdb and imports it into the pageserver.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(180);
/// Bound on `tenant import`'s replay of a copy's WAL, and on its shutdown.
pub const IMPORT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(3600);
/// Bound on `tenant import`'s upload of a data directory and its import
/// (the whole request).
pub const IMPORT_UPLOAD_TIMEOUT: Duration = Duration::from_secs(12 * 3600);
/// Bound on the full basebackup `branch upgrade` reads.
pub const BASEBACKUP_FETCH_TIMEOUT: Duration = Duration::from_secs(12 * 3600);
/// Bound on each server start and stop of `branch upgrade`.
pub const UPGRADE_STEP_TIMEOUT: Duration = Duration::from_secs(600);
/// Log lines shown when a service fails to start.
pub const SERVICE_TAIL_LINES: usize = 20;
/// The most safekeepers, and the most pageservers, a cluster has.
pub const MAX_SERVICES_OF_A_KIND: usize = 9;
/// The longest round trip `--site-latency-ms` accepts.
pub const MAX_SITE_LATENCY_MS: f64 = 10_000.0;

// ---- endpoints

/// Longest an agent may take from spawn to a running PostgreSQL (it may
/// sync the safekeepers, wait for the pageserver and restore a basebackup).
pub const ENDPOINT_START_WAIT: Duration = Duration::from_secs(120);
/// Longest an agent may take to stop: PostgreSQL shuts down and its last
/// WAL reaches the safekeepers.
pub const ENDPOINT_STOP_GRACE: Duration = Duration::from_secs(60);
/// Longest a start waits for a suspension under way to end (it usually
/// takes well under a second: a fast shutdown with nothing to write).
pub const SUSPENSION_WAIT: Duration = Duration::from_secs(30);
/// Longest a PostgreSQL left behind by a dead agent gets to shut down.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// How often a starting agent is asked whether PostgreSQL runs yet.
pub const START_POLL: Duration = Duration::from_millis(50);
/// Longest a writer may take to make the checkpoint a new replica starts from.
pub const CHECKPOINT_WAIT: Duration = Duration::from_secs(150);
/// Log lines shown when an endpoint fails to start.
pub const ENDPOINT_TAIL_LINES: usize = 30;
/// Endpoints `strata stop` stops at once, each on a thread of its own (a
/// stop mostly waits for PostgreSQL's shutdown).
pub const ENDPOINT_STOPS_AT_ONCE: usize = 16;

// ---- service calls

/// Timeout of a status query: services answer these at once or are unwell.
pub const QUICK: Duration = Duration::from_secs(3);
/// Longest a checkpoint may take: it writes every layer due, which for a
/// large database is minutes of I/O.
pub const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(1800);
/// A branch at an LSN waits up to 30 s on the pageserver for it to be ingested.
pub const BRANCH_CREATE_TIMEOUT: Duration = Duration::from_secs(60);

// ---- the storage controller

/// How long a command waits for the tenant to be attached (a starting
/// cluster, a failover under way).
pub const ATTACH_WAIT: Duration = Duration::from_secs(60);

/// How long `strata tenant split` follows a split before it leaves the
/// controllers to finish it (run again, it follows it on).
pub const SPLIT_WAIT: Duration = Duration::from_secs(600);
/// How long `strata tenant delete` waits for every pageserver to detach
/// the tenant (the controllers tell them within a decision round or two).
pub const DETACH_WAIT: Duration = Duration::from_secs(60);
/// How often it asks meanwhile.
pub const DETACH_POLL: Duration = Duration::from_millis(200);
/// A pageserver's deletion of a tenant's objects: one request per object.
pub const TENANT_DELETE_TIMEOUT: Duration = Duration::from_secs(600);
/// Pause before the controllers are asked again where a tenant is attached.
pub const LOCATE_POLL: Duration = Duration::from_millis(100);
/// Pause before a pageserver is asked again whether the tenant is attached.
pub const ATTACH_POLL: Duration = Duration::from_millis(50);
/// Pause before an action is offered to the controllers again.
pub const CONTROLLER_ACTION_POLL: Duration = Duration::from_millis(200);

// ---- sites

/// How long the CLI waits for the tenant to be attached in the promoted site.
pub const SITE_ATTACH_WAIT: Duration = Duration::from_secs(120);
/// Pause before the promoted site's attachment is looked at again.
pub const SITE_ATTACH_POLL: Duration = Duration::from_millis(200);
/// Bound on reading the lost site's tail from one safekeeper.
pub const READ_TAIL_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one read from that safekeeper's stream.
pub const READ_TAIL_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on branching the lost site's writes off on the pageserver.
pub const LOSS_BRANCH_TIMEOUT: Duration = Duration::from_secs(120);

// ---- safekeeper replacement

/// How long the new safekeeper may take to catch up with the members.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(900);
/// How often progress of the catch-up is printed.
pub const CATCH_UP_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// How long a running compute has to be elected under the joint
/// configuration before this command elects a proposer itself.
pub const PROPOSER_WAIT: Duration = Duration::from_secs(15);
/// Bound on the wait for the joint configuration to be committed.
pub const JOINT_TIMEOUT: Duration = Duration::from_secs(120);
/// Polling interval of the replacement's waits.
pub const RECONFIGURE_POLL: Duration = Duration::from_millis(200);
/// How long a membership configuration is offered to members that do not
/// answer (a restart, a timeline healing, a partition) before the change
/// fails; running it again resumes it.
pub const INSTALL_PATIENCE: Duration = Duration::from_secs(30);

// ---- hosts and their nodes

/// How long a node gets for one call: an endpoint's start waits for its
/// PostgreSQL (two minutes at most) and a service's stop for its exit.
pub const NODE_CALL: Duration = Duration::from_secs(180);
/// How long a host's node gets to answer while the state is compared: a
/// host cut off must not hold every command up for long.
pub const SYNC_CALL: Duration = Duration::from_secs(2);
/// How long a node gets to take the state before a start there.
pub const SEND_CALL: Duration = Duration::from_secs(45);
/// How often the node looks for a service whose supervisor is gone.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(5);
/// Most connections to the node API at once.
pub const NODE_MAX_CONNECTIONS: usize = 16;
/// Longest a new node API connection may take to complete its TLS greeting.
pub const NODE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// ---- the command itself

/// How long a mutating command waits for another one to finish.
pub const LOCK_WAIT: Duration = Duration::from_secs(300);
/// Pause before the lock is tried again.
pub const LOCK_POLL: Duration = Duration::from_millis(200);
/// How long the CLI's own management token lives: longer than any command.
pub const CLI_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// How long an endpoint's agent token lasts before its agent renews it at a
/// controller (when every controller can: `docs/security.md`, "Renewal").
pub const COMPUTE_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// Longest cause shown in a table cell.
pub const SHORT_CHARS: usize = 80;

// Polls are shorter than the waits they poll for.
const _: () = assert!(POLL.as_millis() < KILL_WAIT.as_millis());
const _: () = assert!(FAST_POLL.as_millis() < POLL.as_millis() && FAST_POLL_SPAN.as_millis() < KILL_WAIT.as_millis());
const _: () = assert!(POLL.as_millis() < SERVICE_START_WAIT.as_millis());
const _: () = assert!(START_POLL.as_millis() < ENDPOINT_START_WAIT.as_millis());
const _: () =
    assert!(LOCATE_POLL.as_millis() < ATTACH_WAIT.as_millis() && ATTACH_POLL.as_millis() < ATTACH_WAIT.as_millis());
const _: () = assert!(CONTROLLER_ACTION_POLL.as_millis() < ATTACH_WAIT.as_millis());
const _: () = assert!(SITE_ATTACH_POLL.as_millis() < SITE_ATTACH_WAIT.as_millis());
const _: () = assert!(DETACH_POLL.as_millis() < DETACH_WAIT.as_millis());
const _: () = assert!(RECONFIGURE_POLL.as_millis() < PROPOSER_WAIT.as_millis());
const _: () = assert!(LOCK_POLL.as_millis() < LOCK_WAIT.as_millis());
const _: () = assert!(CATCH_UP_REPORT_INTERVAL.as_millis() < CATCH_UP_TIMEOUT.as_millis());
// A status probe of a starting service ends before the service's deadline.
const _: () = assert!(SERVICE_START_PROBE.as_millis() < SERVICE_START_WAIT.as_millis());
// The supervisor's margin covers its wait for the service after SIGKILL.
const _: () = assert!(KILL_WAIT.as_millis() < SUPERVISOR_MARGIN.as_millis());
// A running compute gets its chance to be elected before the joint
// configuration's deadline.
const _: () = assert!(PROPOSER_WAIT.as_millis() < JOINT_TIMEOUT.as_millis());
const _: () = assert!(5 * RECONFIGURE_POLL.as_millis() < INSTALL_PATIENCE.as_millis());
// The promoted site gets at least as long to attach as a tenant anywhere.
const _: () = assert!(ATTACH_WAIT.as_millis() <= SITE_ATTACH_WAIT.as_millis());
// A node call outlasts what the node waits for: an endpoint's start, and a
// service's or an endpoint's stop by its supervisor.
const _: () = assert!(ENDPOINT_START_WAIT.as_millis() + SUSPENSION_WAIT.as_millis() < NODE_CALL.as_millis());
const _: () = assert!(START_POLL.as_millis() < SUSPENSION_WAIT.as_millis());
const _: () = assert!(SERVICE_STOP_GRACE.as_millis() + SUPERVISOR_MARGIN.as_millis() < NODE_CALL.as_millis());
const _: () = assert!(ENDPOINT_STOP_GRACE.as_millis() + SUPERVISOR_MARGIN.as_millis() < NODE_CALL.as_millis());
// Calls that must not hold a command up are shorter than the long ones.
const _: () = assert!(SYNC_CALL.as_millis() < SEND_CALL.as_millis() && SEND_CALL.as_millis() < NODE_CALL.as_millis());
const _: () = assert!(2 * QUICK.as_millis() < NODE_CALL.as_millis());
// The CLI's token outlives the longest commands, including a wait for the lock.
const _: () = assert!(LOCK_WAIT.as_millis() + CHECKPOINT_TIMEOUT.as_millis() < CLI_TOKEN_TTL.as_millis());
// A membership change installs at most four configurations.
const _: () = assert!(
    LOCK_WAIT.as_millis() + CATCH_UP_TIMEOUT.as_millis() + JOINT_TIMEOUT.as_millis() + 4 * INSTALL_PATIENCE.as_millis()
        < CLI_TOKEN_TTL.as_millis()
);
const _: () = assert!(LOCK_WAIT.as_millis() + BOOTSTRAP_TIMEOUT.as_millis() < CLI_TOKEN_TTL.as_millis());
// Endpoints are stopped at least one at a time.
const _: () = assert!(ENDPOINT_STOPS_AT_ONCE >= 1);
// A shortened cause keeps at least its ellipsis and one character.
const _: () = assert!(SHORT_CHARS >= 2);

/// How long a streaming import's follower must keep running after its
/// start before the import counts it as started.
pub const FOLLOWER_START_CHECK: Duration = Duration::from_secs(3);

/// How long `strata tenant cutover` waits, by default, for the follower to
/// end once the relay stopped (a quorum holding all the relay sent).
pub const FOLLOW_CUTOVER_WAIT: Duration = Duration::from_secs(60);
