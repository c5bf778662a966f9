//! PostgreSQL's activity for the agent's metrics: its transactions and
//! client connections, read over the agent's own session every
//! [`ACTIVITY_POLL`] while the compute runs. The console turns the
//! transaction counter into TPS; the agent's session is not a client and
//! never keeps a compute from suspending.

use strata_protocol::api::compute::{Activity, AgentState};
use strata_service::clock::timeout;
use tracing::debug;

use super::status::StatusHandle;
use crate::clock::SharedClock;
use crate::limits::{ACTIVITY_POLL, IDLE_QUERY_TIMEOUT};
use crate::pg_replication::{ReplicationConfig, ReplicationConnection};

/// The agent's sessions are `strata_agent` over the socket as the
/// superuser: not clients (as in the idle count).
const QUERY: &str = "SELECT (SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database)::bigint, \
     (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND NOT \
     (application_name = 'strata_agent' AND client_addr IS NULL AND usename = current_user))::bigint";

/// Polls the counts into the agent's status.
pub(super) struct ActivityWatch {
    pub status: StatusHandle,
    pub conn: ReplicationConfig,
    pub clock: SharedClock,
}

impl ActivityWatch {
    pub async fn run(self) {
        let mut conn: Option<ReplicationConnection> = None;
        loop {
            self.clock.sleep(ACTIVITY_POLL).await;
            if self.status.agent().state != AgentState::Running {
                // A new server comes with new sessions and counters.
                conn = None;
                continue;
            }
            match self.poll(&mut conn).await {
                Ok(activity) => self.status.update(|s| s.activity = Some(activity)),
                Err(e) => {
                    conn = None;
                    debug!("reading PostgreSQL's activity: {e}");
                }
            }
        }
    }

    async fn poll(&self, conn: &mut Option<ReplicationConnection>) -> Result<Activity, String> {
        let ask = async {
            if conn.is_none() {
                *conn = Some(ReplicationConnection::connect(&self.conn).await.map_err(|e| e.to_string())?);
            }
            let c = conn.as_mut().expect("connected above");
            let rows = c.simple_query(QUERY).await.map_err(|e| e.to_string())?;
            let row = rows.first().ok_or("no row")?;
            let number = |i: usize| -> Result<u64, String> {
                let text = row.get(i).cloned().flatten().ok_or("a null count")?;
                text.parse::<u64>().map_err(|_| format!("not a count: {text:?}"))
            };
            Ok(Activity { transactions: number(0)?, client_connections: number(1)? })
        };
        timeout(&*self.clock, IDLE_QUERY_TIMEOUT, ask)
            .await
            .map_err(|_| format!("no answer within {IDLE_QUERY_TIMEOUT:?}"))?
    }
}
