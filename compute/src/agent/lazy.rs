//! A lazy compute's mounts (`docs/lazy-compute.md`): after the lazy
//! basebackup is unpacked and configured, `base/` and `global/` move to a
//! backing directory beside the data directory and come back as FUSE mounts
//! of it; at the next start and when the agent ends they are unmounted.
//! Their page source follows the tenant's layout: a split while the
//! compute runs switches it to the new shards ([`LazyMounts::follow_layout`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use strata_formats::Lsn;
use strata_protocol::lazy_manifest::{Manifest, MANIFEST_NAME};
use tracing::{error, info, warn};

use super::config::AgentConfig;
use super::error::{fail, AgentError};
use super::pageserver_api::PageserverClient;
use crate::lazy::cache::Cache;
use crate::lazy::fs::PageSource;
use crate::lazy::fs::{mount, LazyHooks, LazyStats, Mount, ReadFloor};
use crate::lazy::source::{PageServiceSource, ShardedSource, SwitchableSource};
use crate::page_client::PageClientConfig;
use crate::pageserver_target::{PageserverTarget, Shards, TenantShards};

/// The directories a lazy compute serves, and their names under the data directory.
const MOUNTS: [(Mount, &str); 2] = [(Mount::Base, "base"), (Mount::Global, "global")];

/// The mounts of the current run, if any.
#[derive(Default)]
pub struct LazyMounts {
    /// Each with the directory it serves.
    sessions: Mutex<Vec<(fuser::BackgroundSession, PathBuf)>>,
    /// Stops the current run's ingest poller.
    poller_stop: Mutex<Option<Arc<AtomicBool>>>,
    /// The current run's cache, for a replica's agent to move its floor.
    cache: Mutex<Weak<Cache>>,
    /// The current run's page source, to switch when the layout changes.
    follower: Mutex<Option<Follower>>,
    stats: Arc<LazyStats>,
}

/// A mounted page source that follows the tenant's layout.
struct Follower {
    source: Weak<SwitchableSource>,
    factory: SourceFactory,
    /// The layout switches ([`Shards::switches`]) of the layout it reads.
    serving: u64,
}

/// How the page sources of a run are made: kept from its mount, to make
/// the sources of a layout it switches to the same way.
#[derive(Clone)]
struct SourceFactory {
    /// The page service given at start, where shard 0's target has none.
    page_service: String,
    tenant: strata_protocol::TenantId,
    timeline: strata_protocol::TimelineId,
    client: PageClientConfig,
    retry: std::time::Duration,
}

impl SourceFactory {
    fn new(cfg: &AgentConfig, page_service: &str) -> SourceFactory {
        SourceFactory {
            page_service: page_service.to_string(),
            tenant: cfg.tenant_id,
            timeline: cfg.timeline_id,
            client: PageClientConfig {
                token: cfg.token.clone(),
                tls: cfg.tls_client.clone(),
                ..PageClientConfig::default()
            },
            retry: cfg.lazy_fetch_retry,
        }
    }

    /// The source of `shards`: one page service source (unsharded) or one
    /// per shard, each following its shard's target.
    fn build(&self, shards: &Shards) -> Result<Arc<dyn PageSource>, String> {
        let one = |id: strata_protocol::TenantShardId, target: &PageserverTarget| {
            let addr = target.pg().unwrap_or_else(|| self.page_service.clone());
            PageServiceSource::new(addr, id, self.timeline, self.client.clone())
                .map(|s| s.retry_for(self.retry).following(target.clone()))
                .map_err(|e| format!("page service runtime: {e}"))
        };
        let ids = shards.ids(self.tenant);
        if !shards.layout.is_sharded() {
            return Ok(Arc::new(one(ids[0], shards.home())?));
        }
        let mut sources = Vec::with_capacity(ids.len());
        for (id, target) in ids.into_iter().zip(&shards.targets) {
            sources.push(one(id, target)?);
        }
        Ok(Arc::new(ShardedSource::new(shards.layout, sources)?))
    }
}

/// A page source of the tenant's layout now, each shard read where its
/// target says (an eager compute of a sharded tenant writes its relation
/// files from it, `super::materialize`).
pub fn page_source(cfg: &AgentConfig) -> Result<Arc<dyn PageSource>, String> {
    let now = cfg.shards.now();
    let home = now.home().pg().ok_or("shard 0's page service is not known")?;
    SourceFactory::new(cfg, &home).build(&now)
}

/// Tells `cache` the pageserver's ingested LSN every [`crate::limits::INGEST_POLL`] until
/// `stop` is set or the cache is gone, and for a writer
/// ([`ReadFloor::Ingested`]) moves the read floor there too, so that its
/// reads stay above the GC cutoff however long it runs. Failures only
/// delay evictions of written blocks and the floor.
fn poll_ingested(
    cache: Weak<Cache>,
    pageserver: PageserverClient,
    cfg: (strata_protocol::TenantId, strata_protocol::TimelineId),
    floor: ReadFloor,
    stop: Arc<AtomicBool>,
) {
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        let Some(cache) = cache.upgrade() else { return };
        match pageserver.timeline(cfg.0, cfg.1) {
            Ok(info) => {
                cache.set_ingested(info.last_record_lsn);
                if floor == ReadFloor::Ingested {
                    cache.set_floor(info.last_record_lsn);
                }
                warned = false;
            }
            Err(e) if !warned => {
                warn!("lazy cache: asking the pageserver how far it ingested: {e}");
                warned = true;
            }
            Err(_) => {}
        }
        drop(cache);
        std::thread::sleep(crate::limits::INGEST_POLL);
    }
}

/// Unmounts one mount and waits, at most [`crate::limits::UNMOUNT_JOIN_WAIT`],
/// for its daemon thread to end. The thread ends when the kernel ends the
/// FUSE connection, which a copy of the mount in another mount namespace
/// (made while it was mounted, with private propagation) keeps open after
/// the unmount here: then the connection is aborted through `fusectl`
/// where that is mounted, and otherwise left to end with this process
/// (closing `/dev/fuse` ends it), so that stopping never hangs on it.
fn unmount_and_join(session: fuser::BackgroundSession, path: &Path) {
    let connection = fuse_connection_id(path);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new().name("lazy-unmount".into()).spawn(move || {
        let _ = tx.send(session.umount_and_join());
    });
    if let Err(e) = spawned {
        warn!(path = %path.display(), "unmounting a lazy mount: no thread to wait on: {e}; detaching it");
        return;
    }
    let wait = crate::limits::UNMOUNT_JOIN_WAIT;
    match rx.recv_timeout(wait) {
        Ok(Ok(())) => return,
        Ok(Err(e)) => {
            warn!(path = %path.display(), "unmounting a lazy mount: {e}; detaching it");
            return;
        }
        Err(_) => {}
    }
    let aborted = connection.is_some_and(abort_fuse_connection);
    warn!(
        path = %path.display(),
        aborted,
        "a lazy mount's daemon still serves {wait:?} after the unmount (a copy of the mount lives in another \
         mount namespace); {}",
        if aborted { "its FUSE connection was aborted" } else { "it ends with this process" }
    );
    if aborted && rx.recv_timeout(wait).is_err() {
        warn!(path = %path.display(), "the aborted lazy mount's daemon did not end either; left to this process's exit");
    }
}

/// The kernel's number of the FUSE connection mounted at `path` (its
/// device number, as `fusectl` names it), if `path` is such a mount.
fn fuse_connection_id(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    // FUSE mounts have anonymous devices (major 0); the kernel's dev_t
    // puts the major above 20 bits of minor.
    (major == 0).then_some((major << 20) | minor)
}

/// Aborts FUSE connection `id` through `fusectl`; whether it could.
fn abort_fuse_connection(id: u64) -> bool {
    std::fs::write(format!("/sys/fs/fuse/connections/{id}/abort"), "1").is_ok()
}

/// Detaches any mount left on `base/` or `global/` of `pgdata` (an agent
/// killed while serving leaves mounts that answer nothing but ENOTCONN).
pub fn detach_left_behind(pgdata: &Path) {
    for (_, dir) in MOUNTS {
        let path = pgdata.join(dir);
        match strata_fusefs::sys::detach(&path) {
            Ok(()) => info!(path = %path.display(), "detached a mount left behind"),
            // Not a mount point, or not there: nothing to do.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {}
            Err(e) => warn!(path = %path.display(), "detaching: {e}"),
        }
    }
}

/// The backing directory of a data directory: a sibling, so that renames
/// into it stay on one file system.
pub(super) fn backing_dir(pgdata: &Path) -> PathBuf {
    let name = pgdata.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "pgdata".into());
    pgdata.with_file_name(format!("{name}.lazy"))
}

impl LazyMounts {
    /// Counters of the file system, over every run.
    pub fn stats(&self) -> &Arc<LazyStats> {
        &self.stats
    }

    /// A replica's read floor follows its replay: max(start, min(`replay`,
    /// ingested)), never above `replay` (`docs/replicas.md`, rule 1).
    /// Returns the floor, or `None` without a mounted cache.
    pub fn follow_replay(&self, replay: Lsn) -> Option<Lsn> {
        let cache = self.cache.lock().upgrade()?;
        cache.set_floor(replay.min(cache.ingested()));
        Some(cache.floor())
    }

    /// The pageserver's ingested LSN as the cache last learnt it, if mounted.
    pub fn ingested(&self) -> Option<Lsn> {
        self.cache.lock().upgrade().map(|c| c.ingested())
    }

    /// Unmounts this run's mounts, and detaches any other mount left on
    /// `base/` or `global/` (an agent killed while serving leaves mounts
    /// that answer nothing but ENOTCONN).
    pub fn unmount(&self, pgdata: &Path) {
        if let Some(stop) = self.poller_stop.lock().take() {
            stop.store(true, Ordering::Relaxed);
        }
        let sessions: Vec<_> = self.sessions.lock().drain(..).collect();
        for (session, path) in sessions {
            unmount_and_join(session, &path);
        }
        detach_left_behind(pgdata);
    }

    /// A mount of this run whose daemon no longer serves it (its session
    /// thread ended: the FUSE connection was aborted or the thread died),
    /// if any: PostgreSQL's reads and writes there fail from then on.
    pub fn dead_mount(&self) -> Option<PathBuf> {
        self.sessions.lock().iter().find(|(s, _)| s.guard.is_finished()).map(|(_, path)| path.clone())
    }

    /// Resolves once a mount of this run is dead (never, without mounts).
    pub async fn died(&self) -> PathBuf {
        loop {
            tokio::time::sleep(crate::limits::MOUNT_WATCH).await;
            if let Some(path) = self.dead_mount() {
                return path;
            }
        }
    }

    /// A new run's page source, of the layout now, registered so that
    /// [`Self::follow_layout`] switches it to the next. Made under the
    /// registration's lock, so that a switch is either in the layout read
    /// here or followed after.
    fn switchable(&self, factory: SourceFactory, shards: &TenantShards) -> Result<Arc<SwitchableSource>, String> {
        let mut follower = self.follower.lock();
        let now = shards.now();
        let source = Arc::new(SwitchableSource::new(factory.build(&now)?));
        *follower = Some(Follower { source: Arc::downgrade(&source), factory, serving: now.switches });
        Ok(source)
    }

    /// Switches the mounted file system to `shards`, a new layout of the
    /// tenant (a split): reads under way finish on the old shards, or are
    /// tried again on the new ones if they fail there. Blocks: it makes the
    /// new page sources and may drop the old ones.
    pub fn follow_layout(&self, shards: &Shards) {
        let mut follower = self.follower.lock();
        let Some(f) = follower.as_mut() else { return };
        let Some(source) = f.source.upgrade() else { return };
        if shards.switches <= f.serving {
            return;
        }
        match f.factory.build(shards) {
            Ok(next) => {
                let old = source.switch(next);
                f.serving = shards.switches;
                drop(follower);
                drop(old);
                info!(shards = shards.layout.count, "the lazy file system reads from the tenant's new shards");
            }
            Err(e) => error!("the lazy file system stays on the old shards, whose pageservers may refuse it: {e}"),
        }
    }

    /// Reads and removes the manifest, moves `base/` and `global/` to the
    /// backing directory and mounts them back; returns how many relation
    /// files are served from the pageserver.
    pub async fn mount(
        &self,
        pgdata: &Path,
        page_service: &str,
        cfg: &AgentConfig,
        lsn: Lsn,
        owner: Option<(u32, u32)>,
    ) -> Result<usize, AgentError> {
        let source: Arc<dyn PageSource> =
            self.switchable(SourceFactory::new(cfg, page_service), &cfg.shards).map_err(|e| fail("lazy mount", e))?;
        let pgdata = pgdata.to_path_buf();
        let stats = self.stats.clone();
        let budget =
            usize::try_from(cfg.lazy_cache_bytes / strata_formats::version::BLCKSZ as u64).unwrap_or(usize::MAX);
        let cache = Arc::new(Cache::new(budget, self.stats.cache.clone()));
        // The basebackup's LSN is ingested.
        cache.set_ingested(lsn);
        cache.spawn_evictor().map_err(|e| fail("lazy mount", format!("starting the cache's thread: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(old) = self.poller_stop.lock().replace(stop.clone()) {
            old.store(true, Ordering::Relaxed);
        }
        let floor = match (cfg.read_only_at, &cfg.replica) {
            (Some(_), _) => ReadFloor::Fixed,
            (None, Some(_)) => ReadFloor::Replay,
            (None, None) => ReadFloor::Ingested,
        };
        if floor != ReadFloor::Fixed {
            cache.set_floor(lsn);
        }
        *self.cache.lock() = Arc::downgrade(&cache);
        let (weak, ps, ids) = (Arc::downgrade(&cache), cfg.pageserver_client(), (cfg.tenant_id, cfg.timeline_id));
        std::thread::Builder::new()
            .name("lazy-ingest-poll".into())
            .spawn(move || poll_ingested(weak, ps, ids, floor, stop))
            .map_err(|e| fail("lazy mount", format!("starting the ingest poller: {e}")))?;
        let prepared = tokio::task::spawn_blocking(move || prepare(&pgdata, lsn, owner, source, stats, cache, floor))
            .await
            .map_err(|e| fail("lazy mount", format!("task: {e}")))?
            .map_err(|e| fail("lazy mount", e))?;
        let mut sessions = self.sessions.lock();
        let mut files = 0;
        for (hooks, mountpoint) in prepared {
            files += hooks.remote_files();
            let session = mount(&mountpoint, hooks)
                .map_err(|e| fail("lazy mount", format!("mounting {}: {e}", mountpoint.display())))?;
            sessions.push((session, mountpoint));
        }
        Ok(files)
    }
}

/// The blocking part of [`LazyMounts::mount`]: the hooks of each mount and
/// its mount point, the directories moved and made.
fn prepare(
    pgdata: &Path,
    lsn: Lsn,
    owner: Option<(u32, u32)>,
    source: Arc<dyn PageSource>,
    stats: Arc<LazyStats>,
    cache: Arc<Cache>,
    floor: ReadFloor,
) -> Result<Vec<(LazyHooks, PathBuf)>, String> {
    let manifest_path = pgdata.join(MANIFEST_NAME);
    let bytes = std::fs::read(&manifest_path).map_err(|e| format!("reading {}: {e}", manifest_path.display()))?;
    let manifest = Manifest::decode(&bytes).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    if manifest.lsn != lsn {
        return Err(format!("the manifest is at {}, the basebackup at {lsn}", manifest.lsn));
    }
    std::fs::remove_file(&manifest_path).map_err(|e| format!("removing {}: {e}", manifest_path.display()))?;

    let backing = backing_dir(pgdata);
    if backing.exists() {
        super::trash::discard(pgdata, &backing).map_err(|e| format!("emptying {}: {e}", backing.display()))?;
        super::trash::sweep(pgdata);
    }
    std::fs::create_dir(&backing).map_err(|e| format!("creating {}: {e}", backing.display()))?;
    let mut out = Vec::new();
    for (which, dir) in MOUNTS {
        let (from, to) = (pgdata.join(dir), backing.join(dir));
        std::fs::rename(&from, &to).map_err(|e| format!("moving {} to {}: {e}", from.display(), to.display()))?;
        // The mount point, as PostgreSQL's own directory would be.
        std::fs::create_dir(&from).map_err(|e| format!("creating {}: {e}", from.display()))?;
        super::basebackup::set_ownership(&from, owner).map_err(|e| e.to_string())?;
        let source = source.clone();
        let hooks =
            LazyHooks::new(which, to.clone(), &manifest.entries, lsn, owner, source, stats.clone(), cache.clone())
                .map_err(|e| format!("backing files in {}: {e}", to.display()))?;
        out.push((hooks.with_floor(floor), from));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backing_directory_is_a_sibling() {
        assert_eq!(backing_dir(Path::new("/srv/ep/pgdata")), PathBuf::from("/srv/ep/pgdata.lazy"));
    }

    #[test]
    fn a_new_layout_switches_the_mounted_source_once() {
        use strata_protocol::api::controller::{AttachmentInfo, ShardAttachment};
        use strata_protocol::shard::ShardIndex;
        let (tenant, timeline) = (strata_protocol::TenantId([1; 16]), strata_protocol::TimelineId([2; 16]));
        let cfg = AgentConfig::new("pgdata".into(), 5432, Vec::new(), tenant, timeline, "ps:1".into(), "pw".into());
        cfg.shards.home().set_pg(Some("ps:2".into()));
        let lazy = LazyMounts::default();
        // Nothing mounted: nothing to switch.
        lazy.follow_layout(&cfg.shards.now());
        let source = lazy.switchable(SourceFactory::new(&cfg, "ps:2"), &cfg.shards).unwrap();
        lazy.follow_layout(&cfg.shards.now());
        assert_eq!(source.switches(), 0, "the layout it reads already");
        let shard = |n: u8| ShardAttachment {
            shard: strata_protocol::TenantShardId { tenant, shard: ShardIndex::new(n, 2).unwrap() },
            generation: 2,
            pageserver: format!("ps{n}"),
            pg: format!("ps{n}:2"),
            http: format!("ps{n}:1"),
            reader: false,
        };
        let answer = AttachmentInfo {
            tenant_id: tenant.into(),
            version: 9,
            generation: 2,
            pageserver: "ps0".into(),
            pg: "ps0:2".into(),
            http: "ps0:1".into(),
            reader: false,
            shards: vec![shard(0), shard(1)],
            stripe_blocks: Some(16),
        };
        cfg.shards.follow(&answer);
        lazy.follow_layout(&cfg.shards.now());
        lazy.follow_layout(&cfg.shards.now());
        assert_eq!(source.switches(), 1, "switched once to the two shards");
        // A later mount reads the new layout from the start.
        let next = lazy.switchable(SourceFactory::new(&cfg, "ps:2"), &cfg.shards).unwrap();
        lazy.follow_layout(&cfg.shards.now());
        assert_eq!((next.switches(), source.switches()), (0, 1));
        assert_eq!(cfg.shard_ids().len(), 2);
        assert_eq!(cfg.shard_clients().len(), 2);
        assert_eq!(cfg.home_shard().shard, ShardIndex::new(0, 2).unwrap());
    }
}
