//! Each timeline's background work is owned by one manager task of its own:
//! the offload of its WAL (`offload`, with object storage) and the removal
//! of what its disk no longer needs (`removal`), each on its own one-second
//! tick, so a slow upload does not hold back the removal. What they
//! remember between rounds is theirs; what the status, the peers and the
//! consumers see of it they publish in the timeline's `progress`.
//!
//! The tasks are given what they need (object storage, the peers' views,
//! metrics, configuration) rather than the safekeeper's shared state, and
//! the registry of timelines does not know of them: a supervisor starts a
//! manager for each timeline it finds in the registry and stops the
//! manager of one that has left it (a deleted timeline). The proposers'
//! data path (`proposer_session`, `acceptor`, `wal_store`) has no part in it.

use std::collections::HashMap;
use std::sync::Arc;

use strata_protocol::{TenantId, TimelineId};
use strata_service::clock::Clock;
use tokio::task::{AbortHandle, JoinSet};
use tracing::error;

use crate::limits::SUPERVISE_EVERY;
use crate::offload::Offloader;
use crate::removal::Remover;
use crate::timeline::Timeline;
use crate::timelines::Timelines;

/// The background work every timeline's manager does.
pub struct Work {
    /// Offloads WAL; none without object storage.
    pub offloader: Option<Offloader>,
    /// Removes WAL nobody needs from this disk.
    pub remover: Remover,
    /// Times the supervisor's rounds.
    pub clock: Arc<dyn Clock>,
}

/// A running manager: the timeline it manages and how to stop it.
struct Running {
    timeline: Arc<Timeline>,
    task: AbortHandle,
}

/// Keeps one manager running for every timeline in `timelines`, forever;
/// the managers stop when this task does (their set is dropped with it).
pub async fn run(timelines: Arc<Timelines>, work: Work) {
    let work = Arc::new(work);
    let mut tasks = JoinSet::new();
    let mut running: HashMap<(TenantId, TimelineId), Running> = HashMap::new();
    loop {
        // A manager ends only when stopped below, or by a panic: then it is
        // started again, its timeline's background memory reset.
        while let Some(ended) = tasks.try_join_next_with_id() {
            let (id, panicked) = match &ended {
                Ok((id, ())) => (*id, false),
                Err(e) => (e.id(), e.is_panic()),
            };
            let Some(key) = running.iter().find(|(_, r)| r.task.id() == id).map(|(key, _)| *key) else { continue };
            running.remove(&key);
            if panicked {
                error!(tenant = %key.0, timeline = %key.1, "the timeline's background work panicked; it starts again");
            }
        }
        let now: HashMap<_, _> =
            timelines.all().into_iter().map(|tl| ((tl.identity.tenant_id, tl.identity.timeline_id), tl)).collect();
        // Gone from the registry, or deleted and created again (a new timeline with the same ids).
        running.retain(|key, r| {
            let kept = now.get(key).is_some_and(|tl| Arc::ptr_eq(tl, &r.timeline));
            if !kept {
                r.task.abort();
            }
            kept
        });
        for (key, tl) in now {
            running.entry(key).or_insert_with(|| {
                let task = tasks.spawn(manage(work.clone(), tl.clone()));
                Running { timeline: tl, task }
            });
        }
        work.clock.sleep(SUPERVISE_EVERY).await;
    }
}

/// One timeline's manager: its offload and its removal, side by side, until
/// it is stopped.
async fn manage(work: Arc<Work>, tl: Arc<Timeline>) {
    let offload = async {
        match &work.offloader {
            Some(offloader) => offloader.run(&tl).await,
            None => std::future::pending().await,
        }
    };
    tokio::join!(offload, work.remover.run(&tl));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SafekeeperConfig;
    use crate::metrics::Metrics;
    use crate::peers::PeerViews;
    use std::time::Duration;
    use strata_formats::Lsn;
    use strata_protocol::safekeeper::TimelineIdentity;
    use strata_service::clock::SystemClock;

    /// Waits up to 10 s of real time for `done` (the tasks run on the real clock).
    async fn wait_for(what: &str, done: impl Fn() -> bool) {
        let clock = SystemClock;
        let start = clock.now();
        while !done() {
            assert!(clock.since(start) < Duration::from_secs(10), "waited 10 s for {what}");
            clock.sleep(Duration::from_millis(50)).await;
        }
    }

    /// A timeline gets a manager once it is in the registry, and loses it
    /// once deleted: its removal publishes its status, and its share of the
    /// local WAL gauge is taken back when the manager stops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_manager_runs_while_its_timeline_is_registered() {
        let dir = strata_test_support::scratch_dir("sk-manager");
        let config: SafekeeperConfig = toml::from_str(&format!(
            "id = 1\nlisten = \"127.0.0.1:5454\"\nlisten_http = \"127.0.0.1:7676\"\ndata_dir = {:?}\n",
            dir.display().to_string()
        ))
        .unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let timelines = Arc::new(Timelines::load(config.id, dir.clone(), true, clock.clone()).unwrap());
        let metrics = Arc::new(Metrics::new());
        let views = Arc::new(PeerViews::new(clock.clone()));
        let remover = Remover::new(&config, false, views, metrics.clone(), clock.clone());
        let supervisor = tokio::spawn(run(timelines.clone(), Work { offloader: None, remover, clock }));

        let segment_size = 1 << 20;
        let identity = TimelineIdentity {
            tenant_id: TenantId([1; 16]),
            timeline_id: TimelineId([2; 16]),
            system_id: 7,
            pg_version: 15,
            wal_segment_size: segment_size,
        };
        let (tl, _) = timelines.create(&identity, Lsn(2 << 20)).unwrap();
        wait_for("the removal's first round", || !tl.progress.removal().held_back_by.is_empty()).await;
        assert_eq!(metrics.local_wal_bytes.get(), i64::from(segment_size));

        assert!(timelines.delete(identity.tenant_id, identity.timeline_id).unwrap());
        wait_for("the manager to stop", || metrics.local_wal_bytes.get() == 0).await;
        supervisor.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
