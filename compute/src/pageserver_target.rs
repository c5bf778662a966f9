//! Where the pageserver that serves this compute's tenant is now
//! (`docs/storage-controller.md`, "Computes"): every client of the
//! pageserver reads it before it connects, and the attachment watcher
//! changes it when the storage controller moves the tenant, so a failover
//! re-points the compute without restarting PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use strata_protocol::api::controller::AttachmentInfo;
use strata_protocol::TenantId;
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
            // A layout this compute was not started with (a split): its
            // restart takes the new one.
            continue;
        };
        let one = AttachmentInfo {
            tenant_id: s.shard,
            version: info.version,
            generation: s.generation,
            pageserver: s.pageserver.clone(),
            pg: s.pg.clone(),
            http: s.http.clone(),
            reader: s.reader,
            shards: Vec::new(),
            stripe_blocks: None,
        };
        moved |= target.update(&one);
    }
    moved
}

/// Follows the tenant's attachment: long-polls the controllers (any of
/// them answers) and updates `target`; runs until the task is dropped.
/// A sharded tenant's `shards` (in shard order, the first `target`) are
/// updated from the same answers.
/// With `site`, the controllers answer that site's reader when it has
/// one (a replica, `docs/sites.md`).
#[allow(clippy::too_many_arguments)]
pub async fn watch_attachment(
    target: PageserverTarget,
    shards: Vec<PageserverTarget>,
    controllers: Vec<String>,
    site: Option<String>,
    tenant: TenantId,
    tls: Option<ClientTls>,
    token: Option<Token>,
    on_change: impl Fn(&Target) + Send + 'static,
) {
    if controllers.is_empty() {
        return;
    }
    let agent: ureq::Agent = {
        let mut b = ureq::Agent::config_builder();
        if let Some(tls) = &tls {
            b = b.tls_config(tls.http());
        }
        b.timeout_global(Some(crate::limits::CONTROLLER_LONG_POLL + Duration::from_secs(5)))
            .http_status_as_error(false)
            .proxy(None)
            .build()
            .into()
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut i = 0usize;
    let site_query = site.as_ref().map(|s| format!("&site={s}")).unwrap_or_default();
    loop {
        let now = target.get();
        let known = now.version;
        let controller = &controllers[i % controllers.len()];
        // The first ask answers at once; later ones wait for a newer state,
        // except while the site's reader is awaited.
        let awaiting_reader = site.is_some() && known != 0 && !now.reader;
        if awaiting_reader {
            tokio::time::sleep(crate::limits::READER_RETRY).await;
        }
        let wait = if known == 0 || awaiting_reader { 0 } else { crate::limits::CONTROLLER_LONG_POLL.as_secs() };
        let after = if awaiting_reader { known.saturating_sub(1) } else { known };
        let url = format!(
            "{scheme}://{controller}/v1/tenant/{tenant}/attachment?after={after}&wait_seconds={wait}{site_query}"
        );
        let (a, u, auth) = (agent.clone(), url.clone(), token.as_ref().map(Token::bearer));
        let answer = tokio::task::spawn_blocking(move || -> Result<AttachmentInfo, String> {
            let mut r = a.get(&u);
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
        .and_then(|r| r);
        match answer {
            Ok(info) => {
                let before = target.get();
                let moved = if shards.is_empty() { target.update(&info) } else { update_all(&shards, &info) };
                if moved && shards.is_empty() {
                    info!(from = %before.http, to = %info.http, pageserver = %info.pageserver, generation = info.generation, "the tenant moved: pageserver connections switch");
                } else if moved {
                    let now: Vec<String> =
                        info.shards.iter().map(|s| format!("{}@{}#{}", s.shard, s.pageserver, s.generation)).collect();
                    info!(shards = %now.join(" "), "a shard moved: its pageserver connections switch");
                }
                let now = target.get();
                if now != before {
                    on_change(&now);
                }
            }
            Err(e) => {
                warn!(%url, "asking a storage controller where the tenant is: {e}");
                i += 1;
                tokio::time::sleep(crate::limits::CONTROLLER_RETRY_PAUSE).await;
            }
        }
    }
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
        let shard = |n: u8, http: &str, generation| strata_protocol::api::controller::ShardAttachment {
            shard: strata_protocol::TenantShardId {
                tenant,
                shard: strata_protocol::shard::ShardIndex::new(n, 3).unwrap(),
            },
            generation,
            pageserver: format!("ps-{http}"),
            pg: format!("{http}-pg"),
            http: http.into(),
            reader: false,
        };
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
}
