//! PostgreSQL's timestamps (`TimestampTz`): microseconds since its epoch,
//! 2000-01-01 00:00:00 UTC, as commit records, replication messages and
//! `now()` carry them.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds from the Unix epoch to PostgreSQL's (30 years, 7 of them leap years).
pub const PG_EPOCH_OFFSET_US: i64 = ((30 * 365 + 7) * 86_400) * 1_000_000;
const _: () = assert!(PG_EPOCH_OFFSET_US == 946_684_800_000_000);

/// A Unix time in microseconds as a PostgreSQL timestamp.
pub fn from_unix_micros(unix_us: i64) -> i64 {
    unix_us.saturating_sub(PG_EPOCH_OFFSET_US)
}

/// A system time as a PostgreSQL timestamp (times before 1970 as 1970;
/// beyond the range of `i64` microseconds as its end).
pub fn from_system_time(t: SystemTime) -> i64 {
    let since_unix = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    from_unix_micros(i64::try_from(since_unix.as_micros()).unwrap_or(i64::MAX))
}

/// Now, as PostgreSQL stamps commits.
pub fn pg_now() -> i64 {
    from_system_time(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_epochs() {
        assert_eq!(from_system_time(UNIX_EPOCH), -PG_EPOCH_OFFSET_US);
        // 2000-01-01 00:00:00 UTC is PostgreSQL's zero.
        assert_eq!(from_system_time(UNIX_EPOCH + Duration::from_secs(946_684_800)), 0);
        // 2026-11-24 14:03:05.5 UTC, as `SELECT extract(epoch from ts) - 946684800` gives it.
        let t = UNIX_EPOCH + Duration::from_micros(1_795_528_985_500_000);
        assert_eq!(from_system_time(t), 848_844_185_500_000);
        assert_eq!(from_unix_micros(i64::MIN), i64::MIN, "saturates");
        assert!(pg_now() > 848_844_185_500_000);
    }
}
