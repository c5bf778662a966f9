//! Where the pageserver that serves this compute's tenant is now
//! (`docs/storage-controller.md`, "Computes"): every client of the
//! pageserver reads it before it connects, and the attachment watcher
//! changes it when the storage controller moves the tenant, so a failover
//! re-points the compute without restarting PostgreSQL. A sharded tenant's
//! shards are followed the same way, each its own target ([`TenantShards`]),
//! and so is a change of their count (a split): the compute takes the new
//! layout while it runs.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use strata_protocol::api::controller::{AttachmentInfo, ShardAttachment};
use strata_protocol::shard::{ShardIndex, ShardLayout};
use strata_protocol::{TenantId, TenantShardId};
use strata_service::auth::Token;
use strata_service::tls::ClientTls;
use tracing::{info, warn};

/// The pageserver's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its name, once a controller named it.
    pub name: Option<String>,
    /// Its page service (`host:port`).
    pub pg: Option<String>,
    /// Its HTTP API (`host:port`).
    pub http: String,
    pub generation: Option<u32>,
    /// The controller's state version it comes from (0: from the command line).
    pub version: u64,
    /// Times it changed.
    pub switches: u64,
    /// A site's reader (a replica asked for its site's pageserver).
    pub reader: bool,
}

/// The shared, changing target.
#[derive(Clone, Debug)]
pub struct PageserverTarget(Arc<RwLock<Target>>, Arc<RwLock<Vec<(String, String)>>>);

impl PageserverTarget {
    /// The pageserver given at start.
    pub fn new(http: String, pg: Option<String>) -> PageserverTarget {
        PageserverTarget(
            Arc::new(RwLock::new(Target {
                name: None,
                pg,
                http,
                generation: None,
                version: 0,
                switches: 0,
                reader: false,
            })),
            Arc::default(),
        )
    }

    /// Addresses a controller may give and how this compute reaches them
    /// instead (a route to another site, `docs/sites.md`).
    pub fn set_address_map(&self, map: Vec<(String, String)>) {
        *self.1.write() = map;
    }

    fn mapped(&self, address: &str) -> String {
        self.1.read().iter().find(|(from, _)| from == address).map_or_else(|| address.to_string(), |(_, to)| to.clone())
    }

    pub fn get(&self) -> Target {
        self.0.read().clone()
    }

    pub fn http(&self) -> String {
        self.0.read().http.clone()
    }

    pub fn pg(&self) -> Option<String> {
        self.0.read().pg.clone()
    }

    /// Sets the page service address (a lazy compute's, given at start).
    pub fn set_pg(&self, pg: Option<String>) {
        self.0.write().pg = pg;
    }

    /// Takes a controller's answer; true if the pageserver changed.
    pub fn update(&self, info: &AttachmentInfo) -> bool {
        let (http, pg) = (self.mapped(&info.http), self.mapped(&info.pg));
        let mut t = self.0.write();
        if info.version < t.version {
            return false;
        }
        let moved = t.http != http || t.pg.as_deref().is_some_and(|p| *p != pg);
        t.version = info.version;
        t.generation = Some(info.generation);
        t.name = Some(info.pageserver.clone());
        t.reader = info.reader;
        if moved {
            t.http = http;
            if t.pg.is_some() {
                t.pg = Some(pg);
            }
            t.switches += 1;
        }
        moved
    }

    /// A target of another layout's shard at `info`, reached the way this
    /// one is: its address map, and a page service only if this one has one
    /// (a lazy compute's). `switches` starts where the caller says.
    fn successor(&self, info: &AttachmentInfo, switches: u64) -> PageserverTarget {
        let pg = self.0.read().pg.is_some().then(|| self.mapped(&info.pg));
        let target = Target {
            name: Some(info.pageserver.clone()),
            pg,
            http: self.mapped(&info.http),
            generation: Some(info.generation),
            version: info.version,
            switches,
            reader: info.reader,
        };
        PageserverTarget(Arc::new(RwLock::new(target)), Arc::new(RwLock::new(self.1.read().clone())))
    }
}

/// One shard's part of a controller's answer, as an answer of its own.
fn shard_answer(info: &AttachmentInfo, s: &ShardAttachment) -> AttachmentInfo {
    AttachmentInfo {
        tenant_id: s.shard,
        version: info.version,
        generation: s.generation,
        pageserver: s.pageserver.clone(),
        pg: s.pg.clone(),
        http: s.http.clone(),
        reader: s.reader,
        shards: Vec::new(),
        stripe_blocks: None,
    }
}

/// Takes a controller's answer for every shard: `targets` in shard order
/// (one for an unsharded tenant); true if any pageserver changed.
pub fn update_all(targets: &[PageserverTarget], info: &AttachmentInfo) -> bool {
    if info.shards.is_empty() {
        return targets.first().is_some_and(|t| t.update(info));
    }
    let mut moved = false;
    for s in &info.shards {
        let Some(target) = targets.get(usize::from(s.shard.shard.number)) else {
            // Not a shard of `targets`' layout: an answer of another
            // layout goes to [`TenantShards::follow`], which switches.
            continue;
        };
        moved |= target.update(&shard_answer(info, s));
    }
    moved
}

/// One layout of the tenant and where each of its shards is served.
#[derive(Clone, Debug)]
pub struct Shards {
    /// A count of 1: unsharded.
    pub layout: ShardLayout,
    /// One per shard, in shard order; the first is shard 0's (the home).
    pub targets: Vec<PageserverTarget>,
    /// Layout changes followed since the agent started.
    pub switches: u64,
}

impl Shards {
    /// Shard 0's target (the only one, unsharded).
    pub fn home(&self) -> &PageserverTarget {
        &self.targets[0]
    }

    /// The ids of the layout's shards, in order.
    pub fn ids(&self, tenant: TenantId) -> Vec<TenantShardId> {
        self.layout.shards().map(|shard| TenantShardId { tenant, shard }).collect()
    }
}

/// What an answer did to the tenant's shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Followed {
    /// Nothing moved.
    Unchanged,
    /// A shard (or the unsharded tenant) is served elsewhere now.
    Moved,
    /// The shard count changed (a split): new targets of a new layout.
    Switched { from: ShardLayout, to: ShardLayout },
    /// An answer that cannot be followed, and why.
    Ignored(String),
}

/// The layout an answer names when its shard count is not `current`'s
/// (`None`: the same count, whose targets are updated in place). An answer
/// older than what is known, or whose shards are not each of its count
/// once in order, is refused: a lagging controller must not switch back.
pub fn next_layout(current: &Shards, info: &AttachmentInfo) -> Result<Option<ShardLayout>, String> {
    let count = info.shards.first().map_or(1, |s| s.shard.shard.shards());
    if count == current.layout.count {
        return Ok(None);
    }
    let known = current.home().get().version;
    if info.version < known {
        return Err(format!("{count} shards at version {}, older than the known {known}", info.version));
    }
    // A stripe the controllers do not name is the one the compute has.
    let stripe = info.stripe_blocks.unwrap_or(current.layout.stripe_blocks);
    let layout = ShardLayout::new(count.into(), stripe).map_err(|e| format!("{count} shards: {e}"))?;
    let listed = info.shards.len() == usize::from(count) || (count == 1 && info.shards.is_empty());
    let in_order = info.shards.iter().zip(layout.shards()).all(|(s, index)| s.shard.shard == index);
    if !listed || !in_order {
        let ids: Vec<String> = info.shards.iter().map(|s| s.shard.to_string()).collect();
        return Err(format!("not each of {count} shards once, in order: {}", ids.join(" ")));
    }
    Ok(Some(layout))
}

/// The tenant's shards as this compute follows them now: its layout and
/// the targets of its shards. Shared: the attachment watcher changes it,
/// and the pageserver's clients read it (shard 0's for timeline questions,
/// every shard's for leases), so after a split they use the new shards.
#[derive(Clone, Debug)]
pub struct TenantShards(Arc<SharedShards>);

#[derive(Debug)]
struct SharedShards {
    now: RwLock<Shards>,
    /// The layout changes so far, for whoever must act on one at once.
    switched: tokio::sync::watch::Sender<u64>,
}

impl TenantShards {
    /// `targets` in shard order, one per shard of `layout`.
    pub fn new(layout: ShardLayout, targets: Vec<PageserverTarget>) -> TenantShards {
        assert_eq!(targets.len(), usize::from(layout.count), "one target per shard");
        let now = RwLock::new(Shards { layout, targets, switches: 0 });
        TenantShards(Arc::new(SharedShards { now, switched: tokio::sync::watch::Sender::new(0) }))
    }

    /// An unsharded tenant served where `target` says.
    pub fn unsharded(target: PageserverTarget) -> TenantShards {
        TenantShards::new(ShardLayout::UNSHARDED, vec![target])
    }

    /// A copy of the layout and targets now (the targets themselves shared).
    pub fn now(&self) -> Shards {
        self.0.now.read().clone()
    }

    pub fn layout(&self) -> ShardLayout {
        self.0.now.read().layout
    }

    /// Shard 0's target now.
    pub fn home(&self) -> PageserverTarget {
        self.0.now.read().home().clone()
    }

    /// Shard 0's index in the layout now.
    pub fn home_index(&self) -> ShardIndex {
        self.layout().shards().next().unwrap_or(ShardIndex::UNSHARDED)
    }

    /// Layout changes followed so far.
    pub fn switches(&self) -> u64 {
        self.0.now.read().switches
    }

    /// Changes with every layout switch (its count of them).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.switched.subscribe()
    }

    /// Takes a controller's answer: moves the targets of the same layout
    /// as [`update_all`] does, or switches to new targets of the answer's
    /// layout if its shard count differs. The old targets are left as they
    /// are, for what still reads from the old shards.
    pub fn follow(&self, info: &AttachmentInfo) -> Followed {
        let mut now = self.0.now.write();
        let layout = match next_layout(&now, info) {
            Err(why) => return Followed::Ignored(why),
            Ok(None) if update_all(&now.targets, info) => return Followed::Moved,
            Ok(None) => return Followed::Unchanged,
            Ok(Some(layout)) => layout,
        };
        // Shard 0's count of switches goes on: a split moves it too.
        let home_switches = now.home().get().switches + 1;
        let targets: Vec<PageserverTarget> = if info.shards.is_empty() {
            vec![now.home().successor(info, home_switches)]
        } else {
            let switches = |i: usize| if i == 0 { home_switches } else { 0 };
            info.shards
                .iter()
                .enumerate()
                .map(|(i, s)| now.home().successor(&shard_answer(info, s), switches(i)))
                .collect()
        };
        let from = now.layout;
        *now = Shards { layout, targets, switches: now.switches + 1 };
        let switches = now.switches;
        drop(now);
        self.0.switched.send_replace(switches);
        Followed::Switched { from, to: layout }
    }
}

/// Follows the tenant's attachment: long-polls the controllers (any of
/// them answers) and updates `shards`, until the task is dropped.
/// With `site`, the controllers answer that site's reader when it has
/// one (a replica, `docs/sites.md`).
pub struct AttachmentWatch {
    pub shards: TenantShards,
    /// The controllers' HTTP APIs (`host:port`), asked in turn.
    pub controllers: Vec<String>,
    pub site: Option<String>,
    pub tenant: TenantId,
    pub tls: Option<ClientTls>,
    pub token: Option<Token>,
}

/// What is told of a layout switch: the tenant's shards after it. It runs
/// where blocking is allowed (it may make and drop page sources).
pub type OnLayout = Arc<dyn Fn(&Shards) + Send + Sync>;

impl AttachmentWatch {
    /// Runs the watch: `on_change` hears of every change of shard 0's
    /// target, `on_layout` of every new layout (after `shards` has it).
    pub async fn run(self, on_change: impl Fn(&Target) + Send + 'static, on_layout: OnLayout) {
        if self.controllers.is_empty() {
            return;
        }
        let agent: ureq::Agent = {
            let mut b = ureq::Agent::config_builder();
            if let Some(tls) = &self.tls {
                b = b.tls_config(tls.http());
            }
            b.timeout_global(Some(crate::limits::CONTROLLER_LONG_POLL + Duration::from_secs(5)))
                .http_status_as_error(false)
                .proxy(None)
                .build()
                .into()
        };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut i = 0usize;
        let site_query = self.site.as_ref().map(|s| format!("&site={s}")).unwrap_or_default();
        loop {
            let now = self.shards.home().get();
            let known = now.version;
            let controller = &self.controllers[i % self.controllers.len()];
            // The first ask answers at once; later ones wait for a newer state,
            // except while the site's reader is awaited.
            let awaiting_reader = self.site.is_some() && known != 0 && !now.reader;
            if awaiting_reader {
                tokio::time::sleep(crate::limits::READER_RETRY).await;
            }
            let wait = if known == 0 || awaiting_reader { 0 } else { crate::limits::CONTROLLER_LONG_POLL.as_secs() };
            let after = if awaiting_reader { known.saturating_sub(1) } else { known };
            let tenant = self.tenant;
            let url = format!(
                "{scheme}://{controller}/v1/tenant/{tenant}/attachment?after={after}&wait_seconds={wait}{site_query}"
            );
            let answer = ask(agent.clone(), url.clone(), self.token.as_ref().map(Token::bearer)).await;
            let failed = match answer {
                Ok(info) => {
                    let before = self.shards.home().get();
                    let taken = self.take(&info, &before, &on_layout).await;
                    let now = self.shards.home().get();
                    if now != before {
                        on_change(&now);
                    }
                    taken.err()
                }
                Err(e) => Some(format!("asking a storage controller where the tenant is: {e}")),
            };
            if let Some(e) = failed {
                // Another controller next, after a pause: an answer that
                // cannot be followed would come back at once.
                warn!(%url, "{e}");
                i += 1;
                tokio::time::sleep(crate::limits::CONTROLLER_RETRY_PAUSE).await;
            }
        }
    }

    /// Follows one answer (shard 0's target was `before`); an error for an
    /// answer it cannot follow.
    async fn take(&self, info: &AttachmentInfo, before: &Target, on_layout: &OnLayout) -> Result<(), String> {
        match self.shards.follow(info) {
            Followed::Unchanged => {}
            Followed::Moved if info.shards.is_empty() => {
                info!(from = %before.http, to = %info.http, pageserver = %info.pageserver, generation = info.generation, "the tenant moved: pageserver connections switch");
            }
            Followed::Moved => {
                info!(shards = %describe(info), "a shard moved: its pageserver connections switch");
            }
            Followed::Switched { from, to } => {
                info!(
                    from = from.count, to = to.count, stripe_blocks = to.stripe_blocks, shards = %describe(info),
                    "the tenant's shard count changed (a split): reads, leases and polling switch to the new shards"
                );
                let (now, hook) = (self.shards.now(), on_layout.clone());
                if let Err(e) = tokio::task::spawn_blocking(move || hook(&now)).await {
                    warn!("switching to the new shards: {e}");
                }
            }
            Followed::Ignored(why) => return Err(format!("an answer not followed: {why}")),
        }
        Ok(())
    }
}

/// The shards of an answer, for the log (`shard@pageserver#generation`).
fn describe(info: &AttachmentInfo) -> String {
    let shards: Vec<String> =
        info.shards.iter().map(|s| format!("{}@{}#{}", s.shard, s.pageserver, s.generation)).collect();
    shards.join(" ")
}

/// One ask of a controller (`url`), on a blocking thread.
async fn ask(agent: ureq::Agent, url: String, auth: Option<String>) -> Result<AttachmentInfo, String> {
    tokio::task::spawn_blocking(move || -> Result<AttachmentInfo, String> {
        let mut r = agent.get(&url);
        if let Some(auth) = &auth {
            r = r.header("Authorization", auth);
        }
        let mut resp = r.call().map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().with_config().limit(1 << 20).read_to_string().map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("malformed answer: {e}"))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: u64, http: &str) -> AttachmentInfo {
        AttachmentInfo {
            tenant_id: TenantId([1; 16]).into(),
            version,
            generation: version as u32,
            pageserver: format!("ps-{http}"),
            pg: format!("{http}-pg"),
            http: http.into(),
            reader: false,
            shards: Vec::new(),
            stripe_blocks: None,
        }
    }

    /// Shard `n` of `count` of `tenant`, served at `http`.
    fn shard_of(tenant: TenantId, (n, count): (u8, u8), http: &str, generation: u32) -> ShardAttachment {
        ShardAttachment {
            shard: TenantShardId { tenant, shard: ShardIndex::new(n, count).unwrap() },
            generation,
            pageserver: format!("ps-{http}"),
            pg: format!("{http}-pg"),
            http: http.into(),
            reader: false,
        }
    }

    /// An answer of version `version` listing `count` shards at `c0`, `c1`…
    fn split_answer(version: u64, count: u8, stripe_blocks: Option<u32>) -> AttachmentInfo {
        let tenant = TenantId([1; 16]);
        let mut answer = info(version, "c0");
        answer.shards = (0..count).map(|n| shard_of(tenant, (n, count), &format!("c{n}"), 7)).collect();
        answer.stripe_blocks = stripe_blocks;
        answer
    }

    #[test]
    fn a_newer_attachment_elsewhere_switches_and_an_older_one_is_ignored() {
        let t = PageserverTarget::new("a".into(), Some("a-pg".into()));
        assert!(!t.update(&info(1, "a")), "the same pageserver");
        assert_eq!(t.get().version, 1);
        assert!(t.update(&info(3, "b")));
        assert_eq!((t.http(), t.pg(), t.get().switches), ("b".to_string(), Some("b-pg".to_string()), 1));
        assert!(!t.update(&info(2, "a")), "older than what is known");
        assert_eq!(t.http(), "b");
        // Without a page service (not lazy) only the HTTP API is followed.
        let t = PageserverTarget::new("a".into(), None);
        assert!(t.update(&info(1, "b")));
        assert_eq!(t.pg(), None);
    }

    #[test]
    fn a_sharded_answer_moves_only_the_shards_that_moved() {
        let tenant = TenantId([1; 16]);
        let targets: Vec<PageserverTarget> =
            ["a", "b", "c"].iter().map(|h| PageserverTarget::new(h.to_string(), Some(format!("{h}-pg")))).collect();
        let shard = |n: u8, http: &str, generation| shard_of(tenant, (n, 3), http, generation);
        let mut answer = info(4, "a");
        answer.shards = vec![shard(0, "a", 1), shard(1, "b", 1), shard(2, "c", 1)];
        assert!(!update_all(&targets, &answer), "where they are already");
        // Shard 1's pageserver failed: it is served from c now.
        answer.version = 5;
        answer.shards[1] = shard(1, "c", 2);
        assert!(update_all(&targets, &answer));
        let now: Vec<(String, Option<String>, Option<u32>)> =
            targets.iter().map(|t| (t.http(), t.pg(), t.get().generation)).collect();
        assert_eq!(
            now,
            [
                ("a".to_string(), Some("a-pg".to_string()), Some(1)),
                ("c".to_string(), Some("c-pg".to_string()), Some(2)),
                ("c".to_string(), Some("c-pg".to_string()), Some(1))
            ]
        );
        assert_eq!(targets.iter().map(|t| t.get().switches).collect::<Vec<_>>(), [0, 1, 0]);
    }

    #[test]
    fn another_shard_count_switches_to_new_targets_and_the_same_count_only_moves_them() {
        let old = PageserverTarget::new("a".into(), Some("a-pg".into()));
        old.set_address_map(vec![("c3".into(), "route-c3".into())]);
        let shards = TenantShards::unsharded(old.clone());
        let mut switched = shards.subscribe();
        assert_eq!(shards.follow(&info(2, "a")), Followed::Unchanged, "unsharded, where it is");
        assert_eq!(shards.follow(&info(3, "b")), Followed::Moved, "unsharded, moved");
        assert_eq!((old.http(), old.get().switches, shards.switches()), ("b".to_string(), 1, 0));
        assert!(!switched.has_changed().unwrap());

        // The split is done: four shards with their stripe.
        let to = ShardLayout::new(4, 16).unwrap();
        let followed = shards.follow(&split_answer(4, 4, Some(16)));
        assert_eq!(followed, Followed::Switched { from: ShardLayout::UNSHARDED, to });
        let now = shards.now();
        assert_eq!((now.layout, now.switches, shards.switches()), (to, 1, 1));
        let at: Vec<(String, Option<String>, Option<u32>, u64)> =
            now.targets.iter().map(|t| (t.http(), t.pg(), t.get().generation, t.get().version)).collect();
        let want = |n: usize| {
            let http = if n == 3 { "route-c3".to_string() } else { format!("c{n}") };
            (http, Some(format!("c{n}-pg")), Some(7), 4)
        };
        assert_eq!(at, (0..4).map(want).collect::<Vec<_>>(), "each shard where the answer says, mapped");
        // Shard 0's switches go on from the old home's; the old target stays
        // where the parent is, for the reads still on it.
        assert_eq!(now.targets.iter().map(|t| t.get().switches).collect::<Vec<_>>(), [2, 0, 0, 0]);
        assert_eq!((old.http(), old.get().switches), ("b".to_string(), 1));
        assert_eq!(shards.home_index(), ShardIndex::new(0, 4).unwrap());
        assert_eq!(shards.now().ids(TenantId([1; 16]))[3].shard, ShardIndex::new(3, 4).unwrap());
        assert!(switched.has_changed().unwrap());
        assert_eq!(*switched.borrow_and_update(), 1);

        // The same count again: only the shard that moved moves.
        let mut moved = split_answer(5, 4, Some(16));
        moved.shards[2] = shard_of(TenantId([1; 16]), (2, 4), "d", 8);
        assert_eq!(shards.follow(&moved), Followed::Moved);
        assert_eq!(shards.now().targets.iter().map(|t| t.get().switches).collect::<Vec<_>>(), [2, 0, 1, 0]);
        assert_eq!((now.targets[2].http(), now.targets[2].get().generation), ("d".to_string(), Some(8)));
        assert_eq!(shards.switches(), 1);
        assert!(!switched.has_changed().unwrap());

        // A lagging controller's older answer does not switch back, nor
        // does an answer that does not list each shard once.
        assert!(matches!(shards.follow(&info(4, "a")), Followed::Ignored(_)));
        let mut short = split_answer(6, 8, Some(16));
        short.shards.pop();
        assert!(matches!(shards.follow(&short), Followed::Ignored(_)));
        let mut swapped = split_answer(6, 2, Some(16));
        swapped.shards.swap(0, 1);
        assert!(matches!(shards.follow(&swapped), Followed::Ignored(_)));
        assert_eq!((shards.layout(), shards.switches()), (to, 1));
    }

    #[test]
    fn a_split_without_a_stripe_keeps_the_computes_own() {
        let targets = ["a", "b"].map(|h| PageserverTarget::new(h.into(), Some(format!("{h}-pg")))).to_vec();
        let two = ShardLayout::new(2, 64).unwrap();
        let shards = TenantShards::new(two, targets);
        assert_eq!(next_layout(&shards.now(), &split_answer(1, 2, None)), Ok(None), "the same count");
        let four = next_layout(&shards.now(), &split_answer(1, 4, None)).unwrap();
        assert_eq!(four, Some(ShardLayout::new(4, 64).unwrap()));
        // Unsharded, the default stripe.
        let one = TenantShards::unsharded(PageserverTarget::new("a".into(), None));
        let layout = next_layout(&one.now(), &split_answer(1, 2, None)).unwrap().unwrap();
        assert_eq!(layout.stripe_blocks, strata_protocol::shard::DEFAULT_STRIPE_BLOCKS);
        // Without a page service (an eager compute) the new targets have none either.
        one.follow(&split_answer(1, 2, None));
        assert!(one.now().targets.iter().all(|t| t.pg().is_none()));
        assert_eq!(one.home().http(), "c0");
    }

    /// A controller that gives `answers` in turn, one per request, then
    /// closes connections unanswered (a blocking ask held open would keep
    /// the test's runtime from ending); its address.
    fn fake_controller(answers: Vec<AttachmentInfo>) -> String {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let mut answers = answers.into_iter();
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap() > 2 {
                    line.clear();
                }
                let Some(answer) = answers.next() else { continue };
                let body = serde_json::to_string(&answer).unwrap();
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body.as_bytes())).unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_watch_switches_to_a_split_tenants_shards_and_tells_of_it() {
        let home = PageserverTarget::new("a".into(), Some("a-pg".into()));
        let shards = TenantShards::unsharded(home.clone());
        let controller = fake_controller(vec![info(1, "a"), split_answer(2, 2, Some(64))]);
        let layouts = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let changes = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let watch = AttachmentWatch {
            shards: shards.clone(),
            controllers: vec![controller],
            site: None,
            tenant: TenantId([1; 16]),
            tls: None,
            token: None,
        };
        let (l, c) = (layouts.clone(), changes.clone());
        let task =
            tokio::spawn(watch.run(
                move |t: &Target| c.lock().push(t.http.clone()),
                Arc::new(move |s: &Shards| l.lock().push(s.layout)),
            ));
        for _ in 0..500 {
            if !layouts.lock().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.abort();
        assert_eq!(*layouts.lock(), [ShardLayout::new(2, 64).unwrap()], "told of the new layout once");
        assert_eq!(shards.now().targets.iter().map(PageserverTarget::http).collect::<Vec<_>>(), ["c0", "c1"]);
        // Shard 0's target changed twice: its version (first answer), then the split.
        assert_eq!(changes.lock().last().map(String::as_str), Some("c0"));
        assert_eq!(home.http(), "a", "the old target stays where the parent is");
    }
}
