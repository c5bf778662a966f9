//! Every bound and period of the console, in one place.

use std::time::Duration;

/// A session ends after this long without a request…
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// …and this long after its login in any case.
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once; a login past it ends the oldest.
pub const MAX_SESSIONS: usize = 1024;

/// Failed logins of one name (or one token attempt) within
/// [`LOGIN_WINDOW`] after which that name is refused until the window ends.
pub const MAX_LOGIN_FAILURES: u32 = 5;
pub const LOGIN_WINDOW: Duration = Duration::from_secs(300);
/// Names whose failures are counted at once (a flood of made-up names
/// forgets the oldest).
pub const MAX_LOGIN_NAMES: usize = 4096;

/// PBKDF2-HMAC-SHA256 rounds of a stored password (OWASP's 2023 advice).
pub const PASSWORD_ROUNDS: u32 = 600_000;
/// The shortest password `strata console user add` takes.
pub const MIN_PASSWORD_LEN: usize = 12;
/// Users in `console/users.json`.
pub const MAX_USERS: usize = 1000;

/// How often the cluster's state is read again for the views (an action
/// reads it at once after it is done).
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(5);
/// How often the services' metrics are sampled for the graphs.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// One service's answer to a sample.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest metrics text read from one service.
pub const MAX_METRICS_BYTES: usize = 4 << 20;

/// The graphs' two ranges: the last hour at the sample interval, the last
/// day in 5-minute averages.
pub const HOUR_SLOTS: u64 = 360;
pub const DAY_SLOT_SECS: u64 = 300;
pub const DAY_SLOTS: u64 = 288;
/// Series kept at once (per tenant and for the whole cluster); a new
/// series past it is not kept.
pub const MAX_SERIES: usize = 8192;
/// How often the history is written to disk, so a restarted console keeps it.
pub const HISTORY_SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// The SQL editor: the default and the largest statement timeout, the
/// rows kept of one result (the rest are counted, not sent), the text of
/// one statement, and the bytes of one value shown.
pub const SQL_DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
pub const SQL_MAX_TIMEOUT: Duration = Duration::from_secs(300);
pub const SQL_MAX_ROWS: usize = 1000;
pub const SQL_MAX_TEXT: usize = 256 * 1024;
pub const SQL_MAX_VALUE: usize = 4096;
/// Connecting (and waking a suspended endpoint through the proxy).
pub const SQL_CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// The HTTP listener: connections at once, and the TLS handshake's deadline.
pub const MAX_CONNECTIONS: usize = 256;
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of the audit log the audit view shows.
pub const AUDIT_VIEW_LINES: usize = 200;

// The sampler's interval divides the 5-minute slots, and an hour of it is
// the hour's slots; a session's idle expiry is within its whole life.
const _: () = assert!(DAY_SLOT_SECS.is_multiple_of(SAMPLE_INTERVAL.as_secs()));
const _: () = assert!(HOUR_SLOTS * SAMPLE_INTERVAL.as_secs() == 3600 && DAY_SLOTS * DAY_SLOT_SECS == 86_400);
const _: () = assert!(SESSION_IDLE.as_secs() < SESSION_MAX_AGE.as_secs());
const _: () = assert!(SQL_DEFAULT_TIMEOUT.as_secs() <= SQL_MAX_TIMEOUT.as_secs() && SQL_MAX_ROWS > 0);
const _: () = assert!(SCRAPE_TIMEOUT.as_secs() < SAMPLE_INTERVAL.as_secs());
const _: () = assert!(MAX_LOGIN_FAILURES >= 3 && MIN_PASSWORD_LEN >= 12);
