//! A running replica (`docs/replicas.md`): PostgreSQL in hot standby,
//! streaming the branch's WAL from the safekeepers by itself. The agent
//! polls its replay position to move the lazy file system's read floor and
//! the pageserver lease behind it, reports the lag, and restarts a replica
//! that lags beyond the bound at the newest WAL.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use strata_service::clock::timeout;

use strata_formats::Lsn;
use tokio::sync::watch;
use tracing::{info, warn};

use super::pageserver_api::ApiError;
use super::postgres::Postgres;
use super::{fail, stop_requested, Agent, Attempt, RunEnd};
use crate::limits::REPLICA_QUERY_TIMEOUT;
use crate::pg_replication::ReplicationConnection;
use strata_protocol::api::compute::ReplicaStatus;

/// The replay position and what the walreceiver knows of the WAL's end.
const REPLAY_QUERY: &str = "SELECT pg_last_wal_replay_lsn()::text, pg_last_wal_receive_lsn()::text, \
     (SELECT latest_end_lsn::text FROM pg_stat_wal_receiver)";

/// When each end of the branch's WAL first became known to the agent, so
/// that the lag in seconds is the age of the oldest WAL not yet replayed.
#[derive(Debug, Default)]
pub(super) struct EndTimes {
    samples: VecDeque<(Instant, Lsn)>,
}

impl EndTimes {
    /// The WAL's end was `end` at `now`.
    pub fn note(&mut self, now: Instant, end: Lsn) {
        if self.samples.back().is_none_or(|(_, last)| end > *last) {
            if self.samples.len() == crate::limits::MAX_END_SAMPLES {
                self.samples.pop_front();
            }
            self.samples.push_back((now, end));
        }
    }

    /// Seconds since the first WAL beyond `replay` became known (0 if none).
    pub fn lag_seconds(&mut self, now: Instant, replay: Lsn) -> f64 {
        // Ends that replay has reached are behind it for good.
        while self.samples.front().is_some_and(|(_, end)| *end <= replay) {
            self.samples.pop_front();
        }
        self.samples.front().map_or(0.0, |(t, _)| now.saturating_duration_since(*t).as_secs_f64())
    }
}

/// One answer to [`REPLAY_QUERY`].
struct Positions {
    replay: Lsn,
    /// The furthest of what was received and what the sender said its end was.
    end: Option<Lsn>,
}

fn parse_positions(row: &[Option<String>]) -> Result<Positions, String> {
    let lsn = |i: usize| -> Result<Option<Lsn>, String> {
        match row.get(i).cloned().flatten() {
            None => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|_| format!("not an LSN: {text:?}")),
        }
    };
    let replay = lsn(0)?.ok_or("no replay position yet")?;
    let end = lsn(1)?.into_iter().chain(lsn(2)?).max();
    Ok(Positions { replay, end })
}

/// Why a replica is restarted at the newest WAL.
fn lag_bound_crossed(lag_bytes: u64, lag_seconds: f64, max_bytes: u64, max: Duration) -> Option<String> {
    if max_bytes > 0 && lag_bytes > max_bytes {
        return Some(format!("replay lags {lag_bytes} bytes behind the branch's WAL, more than the bound {max_bytes}"));
    }
    if !max.is_zero() && lag_seconds > max.as_secs_f64() {
        return Some(format!("replay lags {lag_seconds:.0} s behind the branch's WAL, more than the bound {max:?}"));
    }
    None
}

impl Agent {
    /// Runs a replica's PostgreSQL until a stop, its exit, or a lag beyond
    /// the bound (then stopped, for a fresh start at the newest WAL).
    pub(super) async fn run_replica(
        &self,
        stop: &mut watch::Receiver<bool>,
        mut pg: Postgres,
        attempt: Attempt,
    ) -> RunEnd {
        let replica = self.cfg.replica.clone().expect("run_replica runs replicas");
        let clock = &self.cfg.clock;
        let running_since = clock.now();
        self.now_running(running_since, attempt);
        let lazy = self.cfg.lazy_page_service.is_some();
        let start = self.status.agent().replica.map(|r| r.redo_lsn).unwrap_or_default();
        // The start's lease was just taken at the redo point; the shards of
        // a later layout (a split) are leased on at the next poll.
        let mut leased = (start, clock.now(), self.cfg.shards.switches());
        self.update_replica(|r| r.leased_lsn = lazy.then_some(start));
        let mut conn: Option<ReplicationConnection> = None;
        let mut ends = EndTimes::default();
        let mut warned = false;
        // A poll that overran delays the next rather than bunching them.
        let mut poll = clock.sleep(Duration::ZERO);
        loop {
            tokio::select! {
                exit = pg.wait() => return self.standby_exited(&mut pg, exit, running_since).await,
                dead = self.lazy.died() => return self.standby_mount_died(&mut pg, &dead, running_since).await,
                _ = stop_requested(stop) => return self.stop_standby(&mut pg).await,
                _ = &mut poll => poll = clock.sleep(crate::limits::REPLICA_POLL),
            }
            let positions = match self.ask_positions(&mut conn).await {
                Ok(p) => {
                    warned = false;
                    p
                }
                Err(e) => {
                    conn = None;
                    if !warned {
                        warn!("asking the replica where its replay is: {e}");
                        warned = true;
                    }
                    continue;
                }
            };
            let now = clock.now();
            let floor = if lazy { self.lazy.follow_replay(positions.replay) } else { None };
            let end = positions.end.into_iter().chain(self.lazy.ingested()).max().unwrap_or(positions.replay);
            ends.note(now, end);
            let lag_bytes = end.0.saturating_sub(positions.replay.0);
            let lag_seconds = ends.lag_seconds(now, positions.replay);
            self.update_replica(|r| {
                r.replay_lsn = Some(positions.replay);
                r.wal_end_lsn = Some(end);
                r.read_floor = floor;
                r.lag_bytes = lag_bytes;
                r.lag_seconds = lag_seconds;
            });
            let mut lagging = lag_bound_crossed(lag_bytes, lag_seconds, replica.max_lag_bytes, replica.max_lag);
            // The floor's lease moves with it (an eager replica reads nothing
            // from the pageserver once started).
            if let (Some(floor), None) = (floor, &lagging) {
                let target = Lsn(floor.0 & !7);
                let age = clock.since(leased.1);
                let layout = self.cfg.shards.switches();
                let due = age >= crate::limits::REPLICA_LEASE_RENEW
                    || (target > leased.0 && age >= crate::limits::REPLICA_LEASE_MOVE)
                    || layout != leased.2;
                if due {
                    match self.lease_floor(target, &replica.name).await {
                        Ok(()) => {
                            leased = (target, clock.now(), layout);
                            self.update_replica(|r| r.leased_lsn = Some(target));
                        }
                        // The pageserver's own bound: this replica holds GC back too long.
                        Err(ApiError::Status { status: 422, message, .. }) if message.contains("max_replica_lag") => {
                            lagging = Some(message);
                        }
                        Err(e) => warn!(%target, "leasing the replica's read floor: {e}"),
                    }
                }
            }
            if let Some(why) = lagging {
                warn!("{why}: restarting the replica at the newest WAL");
                self.update_replica(|r| r.lag_restarts += 1);
                drop(conn);
                let _ = pg.stop_everything().await;
                return RunEnd::Failed {
                    error: fail("lagging", &why),
                    cause: format!("lagging: {why}"),
                    running_since: Some(running_since),
                };
            }
        }
    }

    /// Changes the replica's part of the status (set by the start).
    fn update_replica(&self, f: impl FnOnce(&mut ReplicaStatus)) {
        self.status.update(|s| {
            if let Some(r) = s.replica.as_mut() {
                f(r);
            }
        });
    }

    /// Asks PostgreSQL where its replay is, over the agent's own connection
    /// (made again after an error).
    async fn ask_positions(&self, conn: &mut Option<ReplicationConnection>) -> Result<Positions, String> {
        let ask = async {
            if conn.is_none() {
                let c = ReplicationConnection::connect(&self.socket_config(false)).await.map_err(|e| e.to_string())?;
                *conn = Some(c);
            }
            let c = conn.as_mut().expect("connected above");
            let rows = c.simple_query(REPLAY_QUERY).await.map_err(|e| e.to_string())?;
            parse_positions(rows.first().ok_or("no row")?)
        };
        timeout(&*self.cfg.clock, REPLICA_QUERY_TIMEOUT, ask)
            .await
            .map_err(|_| format!("no answer within {REPLICA_QUERY_TIMEOUT:?}"))?
    }

    /// Leases `lsn` under the replica's name (replacing its last lease).
    async fn lease_floor(&self, lsn: Lsn, name: &str) -> Result<(), ApiError> {
        // Every shard of the layout now keeps the floor.
        let clients = self.cfg.shard_clients();
        let (tenant, timeline, name) = (self.cfg.tenant_id, self.cfg.timeline_id, name.to_string());
        let leased = tokio::task::spawn_blocking(move || {
            super::pageserver_api::PageserverClient::lease_all(&clients, tenant, timeline, lsn, Some(&name))
        })
        .await;
        let result = leased
            .unwrap_or_else(|e| Err(ApiError::Invalid { url: "lease".into(), message: format!("request task: {e}") }));
        if result.is_ok() {
            info!(%lsn, "the replica's read floor is leased");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_service::clock::Clock;

    #[test]
    fn lag_in_seconds_is_the_age_of_the_oldest_unreplayed_wal() {
        let t0 = strata_service::clock::ManualClock::new().now();
        let mut e = EndTimes::default();
        assert_eq!(e.lag_seconds(t0, Lsn(0)), 0.0);
        e.note(t0, Lsn(100));
        e.note(t0 + Duration::from_secs(1), Lsn(100)); // no news: not a new sample
        e.note(t0 + Duration::from_secs(2), Lsn(300));
        let at = t0 + Duration::from_secs(3);
        assert_eq!(e.lag_seconds(at, Lsn(50)), 3.0);
        // WAL up to 100 replayed: what is left became known at 2 s.
        assert_eq!(e.lag_seconds(at, Lsn(100)), 1.0);
        assert_eq!(e.lag_seconds(at, Lsn(300)), 0.0);
        // Bounded.
        for i in 0..(crate::limits::MAX_END_SAMPLES as u64 + 10) {
            e.note(at, Lsn(400 + i));
        }
        assert_eq!(e.samples.len(), crate::limits::MAX_END_SAMPLES);
    }

    #[test]
    fn positions_parse_and_missing_ones_are_tolerated() {
        let row = |v: [Option<&str>; 3]| v.map(|x| x.map(str::to_string)).to_vec();
        let p = parse_positions(&row([Some("0/3000028"), Some("0/3000100"), Some("0/3000200")])).unwrap();
        assert_eq!((p.replay, p.end), (Lsn(0x3000028), Some(Lsn(0x3000200))));
        let p = parse_positions(&row([Some("0/3000028"), None, None])).unwrap();
        assert_eq!(p.end, None);
        assert!(parse_positions(&row([None, None, None])).is_err());
        assert!(parse_positions(&row([Some("x"), None, None])).is_err());
    }

    #[test]
    fn the_lag_bound() {
        let max = Duration::from_secs(900);
        assert_eq!(lag_bound_crossed(10, 1.0, 1 << 30, max), None);
        assert!(lag_bound_crossed((1 << 30) + 1, 1.0, 1 << 30, max).unwrap().contains("bytes"));
        assert!(lag_bound_crossed(10, 901.0, 1 << 30, max).unwrap().contains("900s"));
        assert_eq!(lag_bound_crossed(u64::MAX, f64::MAX, 0, Duration::ZERO), None);
    }
}
