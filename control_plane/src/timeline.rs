//! `strata timeline …`: operations on a branch's timeline in the pageserver.

use strata_formats::Lsn;
use strata_protocol::api::pageserver::CheckpointResponse;

use super::error::{failed, Error, Result};
use super::http;
use super::layout::{Workdir, MAIN_BRANCH};
use crate::limits::CHECKPOINT_TIMEOUT;

/// Flushes what the pageserver ingested of `branch`, compacts every L0,
/// writes images, waits until object storage has all of it (when the
/// pageserver has object storage); the LSN that is now durable.
pub fn checkpoint(wd: &Workdir, tenant: &str, branch: Option<&str>) -> Result<Lsn> {
    let tenant = wd.cluster.tenant_named(tenant)?;
    let name = branch.unwrap_or(MAIN_BRANCH);
    let Some(b) = tenant.branch(name) else {
        return failed(format!("no branch named {name:?} (branches: {})", tenant.branch_names()));
    };
    // Every shard: what is durable is what all of them uploaded.
    let mut durable: Option<Lsn> = None;
    for shard in tenant.shard_ids() {
        let ps = super::controller::attached(wd, shard)?;
        let url = format!(
            "{}/v1/tenant/{shard}/timeline/{}/checkpoint?compact=true&upload_timeout={}",
            ps.http_url(),
            b.timeline_id,
            CHECKPOINT_TIMEOUT.as_secs() / 2
        );
        let reply = match http::post(&url, &(), CHECKPOINT_TIMEOUT) {
            Ok(r) => r,
            Err(e) => {
                return failed(format!("the pageserver did not answer (is the cluster started?): {}: {e}", ps.name))
            }
        };
        if reply.status != 200 {
            return failed(format!("checkpoint of branch {name} ({shard}): {} {}", reply.status, reply.error_text()));
        }
        let done: CheckpointResponse =
            reply.json().map_err(|e| Error::Failed(format!("checkpoint of branch {name}: {e}")))?;
        let Some(lsn) = done.uploaded_lsn else {
            return failed(format!("checkpoint of branch {name}: no uploaded_lsn in {}", reply.body));
        };
        durable = Some(durable.map_or(lsn, |d| d.min(lsn)));
    }
    Ok(durable.expect("a tenant has at least one shard"))
}
