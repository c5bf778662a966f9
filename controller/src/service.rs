//! The controller at run time: the leader's lease, the heartbeats, and the
//! rounds in which the leader decides (`schedule`), writes the state by
//! compare-and-swap, and makes the pageservers match it
//! (`docs/storage-controller.md`).
//!
//! Each of the three loops is a round and a wait: [`Controller::lease_round`],
//! [`Controller::heartbeat_round`] and [`Controller::decision_round`] can be
//! called one at a time (a simulation does). Time, storage, pageservers and
//! tasks come from the [`Env`] it is made with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_protocol::api::controller::{
    AttachmentInfo, ControllerState, ControllerStatus, PageserverHealth, PageserverPolicy, ShardAttachment,
    TenantDeleted, TenantPlacement, TenantRegistered, STATE_FORMAT_VERSION,
};
use strata_protocol::api::pageserver::{LocationMode, LocationRequest, LocationStatus, PageserverStatus};
use strata_protocol::TenantShardId;
use strata_remote_storage::cas::ObjectVersion;
use strata_service::clock::{self, Clock};
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::client::Pageservers;
use crate::config::{ControllerConfig, PageserverRef};
use crate::env::Env;
use crate::limits::{FOLLOWER_REFRESH, LEASE_RENEWALS_PER_TTL, RETRY_MAX, RETRY_MIN, WRITE_ATTEMPTS};
use crate::metrics::Metrics;
use crate::retry::Retries;
use crate::schedule::{self, Planner, View};
use crate::store::{LeaderLease, Store, StoreError};
use crate::tasks::{each_as_ready, BoxFuture, Spawn};

mod splits;

/// While this controller leads.
struct Lead {
    term: u64,
    /// It acts as the leader until then (a quarter of the lease before the
    /// others may take over, by their own clocks).
    until: Instant,
    renewals: u64,
}

/// What the heartbeats say of one pageserver.
#[derive(Default)]
struct Health {
    last_ok: Option<Instant>,
    status: Option<PageserverStatus>,
}

#[derive(Default)]
struct Inner {
    /// The highest leader term seen.
    term: u64,
    lead: Option<Lead>,
    /// The lease's version as first seen, and when: it is taken over once
    /// it has not changed for a whole lease.
    lease_seen: Option<(ObjectVersion, Instant)>,
    leader_http: Option<String>,
    /// When a follower last read the state (`None`: never).
    refreshed: Option<Instant>,
    state: Option<(ControllerState, Option<ObjectVersion>)>,
    /// When `state` was last read from storage or written there: it is
    /// read again after `lease_ttl` (see [`Controller::current_state`]).
    state_confirmed: Option<Instant>,
    health: BTreeMap<String, Health>,
    /// LSNs a migration's target must reach, per tenant and timeline.
    catch_up: BTreeMap<TenantShardId, BTreeMap<String, strata_formats::Lsn>>,
    /// The calls of prepared splits to their parents' pageservers.
    split_calls: BTreeMap<TenantShardId, crate::split::SplitCall>,
    /// LSNs each child of a copied split must reach, per timeline.
    split_goals: BTreeMap<TenantShardId, BTreeMap<String, strata_formats::Lsn>>,
    /// Since when each done split's shards have named no other shard's layers.
    split_clean_since: BTreeMap<strata_protocol::TenantId, Instant>,
    last_error: Option<String>,
}

/// One controller process.
pub struct Controller {
    pub conf: ControllerConfig,
    clock: Arc<dyn Clock>,
    store: Store,
    pageservers: Arc<dyn Pageservers>,
    spawn: Arc<dyn Spawn>,
    planner: Planner,
    pub metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    /// The version of the state this controller knows (computes wait on it).
    version: watch::Sender<u64>,
    /// Location calls under way, so a slow attach is not sent twice.
    in_flight: Mutex<BTreeSet<(String, TenantShardId)>>,
    /// Parents whose split call is under way.
    split_in_flight: Mutex<BTreeSet<TenantShardId>>,
    /// Location calls that failed, and when to try again (growing pauses).
    retries: Mutex<Retries<(String, TenantShardId)>>,
    wake: Notify,
    /// When the heartbeats started: before a whole offline period has
    /// passed, nothing is known to be offline.
    started: Instant,
    /// Itself, for the tasks it spawns (which end with the process).
    me: std::sync::Weak<Controller>,
}

/// Why a management call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("not the leader (the leader is at {0:?})")]
    NotLeader(Option<String>),
    #[error("no pageserver named {0:?}")]
    Unknown(String),
    #[error("{0}")]
    Store(String),
    #[error("{0}")]
    Split(String),
    /// Refused for now: asked again later it may be taken.
    #[error("{0}")]
    Later(String),
}

/// Why a tenant's attachment is not answered.
#[derive(Debug, thiserror::Error)]
pub enum NoAttachment {
    #[error("tenant {0} was deleted")]
    Deleted(TenantShardId),
    #[error("tenant {0} is not attached anywhere (yet)")]
    NotAttached(TenantShardId),
}

impl Controller {
    /// A controller of `conf` on `env`; nothing runs until [`Controller::run`]
    /// (or a round) is called.
    pub fn new(conf: ControllerConfig, env: Env, metrics: Arc<Metrics>) -> Arc<Controller> {
        let started = env.clock.now();
        Arc::new_cyclic(|me| Controller {
            me: me.clone(),
            conf,
            clock: env.clock,
            store: env.store,
            pageservers: env.pageservers,
            spawn: env.spawn,
            planner: env.planner,
            metrics,
            inner: Mutex::new(Inner::default()),
            version: watch::Sender::new(0),
            in_flight: Mutex::new(BTreeSet::new()),
            split_in_flight: Mutex::new(BTreeSet::new()),
            retries: Mutex::new(Retries::new(RETRY_MIN, RETRY_MAX, env.seed)),
            wake: Notify::new(),
            started,
        })
    }

    fn note_error(&self, e: impl std::fmt::Display) {
        let e = e.to_string();
        warn!("{e}");
        self.inner.lock().last_error = Some(e);
    }

    /// The term this controller leads under, while it does.
    pub fn leading(&self) -> Option<u64> {
        let inner = self.inner.lock();
        let now = self.clock.now();
        inner.lead.as_ref().filter(|l| now < l.until).map(|l| l.term)
    }

    /// Runs the lease, heartbeat and decision loops until the process ends
    /// (or the future is dropped, which stops all three).
    pub async fn run(self: Arc<Self>) {
        let loops: Vec<BoxFuture<'_, ()>> =
            vec![Box::pin(self.lease_loop()), Box::pin(self.heartbeat_loop()), Box::pin(self.decision_loop())];
        each_as_ready(loops, |()| {}).await;
    }

    // ---- the leader's lease

    async fn lease_loop(&self) {
        let period = self.conf.lease_ttl / LEASE_RENEWALS_PER_TTL;
        loop {
            self.lease_round().await;
            self.clock.sleep(period).await;
        }
    }

    /// One round of the lease: renew it while leading, take it once it was
    /// not renewed for a whole `lease_ttl` (by this controller's clock), or
    /// note who leads.
    pub async fn lease_round(&self) {
        let started = self.clock.now();
        let me = self.conf.id;
        let http = self.conf.listen_http.to_string();
        let read = match self.store.read_lease().await {
            Ok(r) => r,
            Err(e) => {
                self.metrics.storage_errors.inc();
                self.note_error(format!("reading the leader's lease: {e}"));
                self.check_lead_expiry();
                return;
            }
        };
        let (current, version) = match read {
            Some((l, v)) => (Some(l), Some(v)),
            None => (None, None),
        };
        let mine = current.as_ref().is_some_and(|l| l.holder == me);
        let (leading_term, renewals) = {
            let inner = self.inner.lock();
            (inner.lead.as_ref().map(|l| l.term), inner.lead.as_ref().map_or(0, |l| l.renewals))
        };
        let next = match (&current, leading_term) {
            // Renew ours.
            (Some(l), Some(term)) if mine && l.term == term => {
                LeaderLease { holder: me, http, term, renewals: renewals + 1 }
            }
            // Nobody ever led, or our own lease from before a restart: take it.
            (None, _) => LeaderLease { holder: me, http, term: self.inner.lock().term + 1, renewals: 0 },
            (Some(l), _) if mine => LeaderLease { holder: me, http, term: l.term + 1, renewals: 0 },
            (Some(l), _) => {
                let expired = {
                    let mut inner = self.inner.lock();
                    if inner.lead.take().is_some() {
                        warn!(term = l.term, holder = l.holder, "lost the leader's lease");
                        self.metrics.leader.set(0);
                    }
                    inner.term = inner.term.max(l.term);
                    inner.leader_http = Some(l.http.clone());
                    let v = version.clone().expect("present with a lease");
                    match &inner.lease_seen {
                        Some((seen, at)) if *seen == v => self.clock.since(*at) >= self.conf.lease_ttl,
                        _ => {
                            inner.lease_seen = Some((v, self.clock.now()));
                            false
                        }
                    }
                };
                self.metrics.leader_term.set(l.term as i64);
                if !expired {
                    return;
                }
                info!(
                    holder = l.holder,
                    term = l.term,
                    "the leader's lease was not renewed for a whole lease; taking over"
                );
                LeaderLease { holder: me, http, term: l.term + 1, renewals: 0 }
            }
        };
        // A takeover's term is above every term seen; a renewal keeps ours.
        debug_assert!(next.term > current.as_ref().map_or(0, |l| l.term) || (next.renewals > 0 && mine));
        match self.store.write_lease(&next, version.as_ref()).await {
            Ok(v) => {
                let mut inner = self.inner.lock();
                // Counted from before the write was sent: the others' clocks
                // start no earlier than when it landed.
                let until = started + self.conf.lease_ttl * 3 / 4;
                let took = inner.lead.as_ref().is_none_or(|l| l.term != next.term);
                debug_assert!(next.term >= inner.term, "a lease under term {} below {}", next.term, inner.term);
                inner.lead = Some(Lead { term: next.term, until, renewals: next.renewals });
                inner.term = next.term;
                inner.lease_seen = Some((v, self.clock.now()));
                inner.leader_http = Some(next.http.clone());
                drop(inner);
                if took {
                    info!(term = next.term, "leading");
                    self.metrics.takeovers.inc();
                    self.metrics.leader.set(1);
                    self.metrics.leader_term.set(next.term as i64);
                    self.wake.notify_one();
                }
            }
            Err(StoreError::Conflict(_)) => {
                // Another controller wrote first: it leads (read next round).
                let mut inner = self.inner.lock();
                if inner.lead.take().is_some() {
                    self.metrics.leader.set(0);
                }
            }
            Err(e) => {
                self.metrics.storage_errors.inc();
                self.note_error(format!("writing the leader's lease: {e}"));
                self.check_lead_expiry();
            }
        }
    }

    /// Stops leading once the lease may have been taken over.
    fn check_lead_expiry(&self) {
        let mut inner = self.inner.lock();
        let now = self.clock.now();
        if inner.lead.as_ref().is_some_and(|l| now >= l.until) {
            inner.lead = None;
            self.metrics.leader.set(0);
            warn!("could not renew the leader's lease in time; no longer leading");
        }
    }

    // ---- heartbeats

    async fn heartbeat_loop(&self) {
        loop {
            let started = self.clock.now();
            self.heartbeat_round().await;
            if let Some(wait) = self.conf.heartbeat_interval.checked_sub(self.clock.since(started)) {
                self.clock.sleep(wait).await;
            }
            // A pageserver that just passed its offline period is decided on now.
            self.wake.notify_one();
        }
    }

    /// One round of heartbeats: every pageserver is asked for its status at
    /// once, and each answer (or failure) is recorded as it comes.
    pub async fn heartbeat_round(&self) {
        let calls: Vec<_> = self
            .conf
            .pageservers
            .iter()
            .map(|p| async move { (p.name.as_str(), self.pageservers.status(&p.http).await) })
            .collect();
        each_as_ready(calls, |(name, r)| self.heard(name, r)).await;
        let online = self.online().len();
        self.metrics.pageservers_online.set(online as i64);
    }

    /// Records one heartbeat's answer.
    fn heard(&self, name: &str, r: Result<PageserverStatus, String>) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let h = inner.health.entry(name.to_string()).or_default();
        match r {
            Ok(s) => {
                let was_offline = h.last_ok.is_none_or(|t| now.saturating_duration_since(t) > self.conf.offline_after);
                h.last_ok = Some(now);
                h.status = Some(s);
                if was_offline {
                    info!(pageserver = %name, "online");
                    self.wake.notify_one();
                }
            }
            Err(e) => {
                self.metrics.heartbeat_failures.inc();
                tracing::debug!(pageserver = %name, "heartbeat: {e}");
                if h.last_ok.is_some_and(|t| now.saturating_duration_since(t) > self.conf.offline_after) {
                    h.status = None;
                }
            }
        }
    }

    /// The pageservers that answered within the offline period, but for
    /// those the state calls lost (their site was given up).
    fn online(&self) -> BTreeSet<String> {
        let now = self.clock.now();
        let inner = self.inner.lock();
        let lost = |n: &String| {
            inner.state.as_ref().is_some_and(|(s, _)| s.pageservers.get(n) == Some(&PageserverPolicy::Lost))
        };
        inner
            .health
            .iter()
            .filter(|(n, h)| {
                h.last_ok.is_some_and(|t| now.saturating_duration_since(t) <= self.conf.offline_after) && !lost(n)
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether the view of the pageservers can be planned on: before a
    /// whole offline period of heartbeats, a pageserver not heard from yet
    /// is not known to be down, unless every pageserver has answered (then
    /// nothing is unknown, and waiting would only delay a new cluster's
    /// first placement).
    fn view_complete(&self) -> bool {
        if self.clock.since(self.started) >= self.conf.offline_after {
            return true;
        }
        let inner = self.inner.lock();
        self.conf.pageservers.iter().all(|p| inner.health.get(&p.name).is_some_and(|h| h.last_ok.is_some()))
    }

    // ---- decisions

    async fn decision_loop(&self) {
        loop {
            self.decision_round().await;
            let _ = clock::timeout(&*self.clock, self.conf.heartbeat_interval, self.wake.notified()).await;
        }
    }

    /// One decision round: the leader decides, writes the state and sends
    /// the locations (`decide`); a follower reads the state once a second
    /// (computes may ask any controller).
    pub async fn decision_round(&self) {
        if let Some(term) = self.leading() {
            if let Err(e) = self.decide(term).await {
                self.note_error(e);
            }
            return;
        }
        let now = self.clock.now();
        {
            let mut inner = self.inner.lock();
            if inner.refreshed.is_some_and(|t| now.saturating_duration_since(t) < FOLLOWER_REFRESH) {
                return;
            }
            inner.refreshed = Some(now);
        }
        match self.store.read_state().await {
            Ok(Some((s, v))) => {
                self.remember(s, Some(v));
            }
            Ok(None) => {}
            Err(e) => {
                self.metrics.storage_errors.inc();
                self.note_error(format!("reading the state: {e}"));
            }
        }
    }

    /// Keeps `state` as the one this controller knows, unless it knows a
    /// newer one: a read that was under way while this controller wrote
    /// (a follower's refresh answering after it took over) may answer with
    /// an older state, and a leader that kept it would decide on it, find
    /// nothing to change, and never write (so never learn otherwise).
    /// Returns the state kept.
    fn remember(
        &self,
        state: ControllerState,
        version: Option<ObjectVersion>,
    ) -> (ControllerState, Option<ObjectVersion>) {
        let v = state.version;
        let now = self.clock.now();
        let kept = {
            let mut inner = self.inner.lock();
            match &inner.state {
                Some((known, _)) if known.version > v => return inner.state.clone().expect("matched"),
                _ => {
                    inner.state = Some((state, version));
                    inner.state_confirmed = Some(now);
                    inner.state.clone().expect("just set")
                }
            }
        };
        // Computes wait for a version above the one they know: it only grows.
        self.version.send_if_modified(|known| {
            let newer = v > *known;
            *known = (*known).max(v);
            newer
        });
        kept
    }

    /// The state as last read or written; read if unknown, or if it was
    /// neither read nor written for a whole `lease_ttl`. A write whose
    /// answer was lost may land later than its caller gave up, and a leader
    /// with nothing to change would never write again to find out.
    async fn current_state(&self) -> Result<(ControllerState, Option<ObjectVersion>), String> {
        {
            let inner = self.inner.lock();
            let fresh = inner.state_confirmed.is_some_and(|t| self.clock.since(t) < self.conf.lease_ttl);
            if let (Some(s), true) = (&inner.state, fresh) {
                return Ok(s.clone());
            }
        }
        match self.store.read_state().await {
            Ok(Some((s, v))) => Ok(self.remember(s, Some(v))),
            Ok(None) => Ok((ControllerState { format_version: STATE_FORMAT_VERSION, ..Default::default() }, None)),
            Err(e) => {
                self.metrics.storage_errors.inc();
                Err(format!("reading the state: {e}"))
            }
        }
    }

    /// Writes `next` over the state at `expected` under `term`.
    async fn write(
        &self,
        mut next: ControllerState,
        expected: Option<&ObjectVersion>,
        term: u64,
    ) -> Result<(), String> {
        if self.leading() != Some(term) {
            return Err("no longer leading; the state is not written".into());
        }
        debug_assert!(next.leader_term <= term, "a state of term {} written under {term}", next.leader_term);
        next.leader_term = term;
        next.version += 1;
        match self.store.write_state(&next, expected).await {
            Ok(v) => {
                self.metrics.state_writes.inc();
                info!(version = next.version, "state written");
                self.remember(next, Some(v));
                Ok(())
            }
            Err(StoreError::Conflict(e)) => {
                self.metrics.state_conflicts.inc();
                self.inner.lock().state = None;
                Err(format!("writing the state: {e}; reading it again"))
            }
            Err(e) => {
                // It may have landed (only the answer was lost): read it again.
                self.metrics.storage_errors.inc();
                self.inner.lock().state = None;
                Err(format!("writing the state: {e}"))
            }
        }
    }

    /// One round of the leader: decide, write, apply.
    async fn decide(&self, term: u64) -> Result<(), String> {
        let (state, version) = self.current_state().await?;
        self.check_term(&state, term)?;
        let mut next = state.clone();
        // The config's tenants are placed unless known or deleted since.
        let unknown: Vec<TenantShardId> = self
            .conf
            .tenants
            .iter()
            .filter(|t| !state.tenants.contains_key(t) && !state.deleted_tenants.contains_key(t))
            .filter(|t| !crate::split::is_retired_parent(&state, **t))
            .copied()
            .collect();
        let mut new = Vec::new();
        for t in unknown {
            let g = self.store.max_generation(t).await.map_err(|e| format!("tenant {t}: {e}"))?;
            new.push((t, g));
        }
        schedule::add_tenants(&mut next, &new);
        if self.view_complete() {
            let view = self.view();
            if let Some(planned) = (self.planner)(&next, &view) {
                for (t, p) in &planned.tenants {
                    let before = next.tenants.get(t);
                    if before.and_then(|b| b.attached.as_ref()) != p.attached.as_ref() && p.migration.is_none() {
                        if before.and_then(|b| b.migration.as_ref()).is_none() {
                            self.metrics.failovers.inc();
                        }
                        info!(tenant = %t, from = ?before.and_then(|b| b.attached.clone()), to = ?p.attached, generation = p.generation, "attaching elsewhere");
                    }
                    if p.migration.is_some() && before.and_then(|b| b.migration.as_ref()).is_none() {
                        self.metrics.migrations_started.inc();
                        info!(tenant = %t, to = ?p.migration, generation = p.generation, "moving");
                    }
                }
                next = planned;
            }
        }
        // Only the API deletes tenants: a decision keeps every one.
        debug_assert!(
            keeps_generations(&state, &next) && next.deleted_tenants == state.deleted_tenants,
            "a decision lost a tenant or a generation: {state:?} -> {next:?}"
        );
        if next != state || state.leader_term != term {
            self.write(next.clone(), version.as_ref(), term).await?;
        }
        let (state, version) = self.current_state().await?;
        self.check_term(&state, term)?;
        // Goals of moves that ended otherwise (a failover, a cancellation).
        self.inner.lock().catch_up.retain(|t, _| state.tenants.get(t).is_some_and(|p| p.migration.is_some()));
        self.apply(&state);
        if self.advance_splits(&state, version.as_ref(), term).await? {
            return Ok(());
        }
        // Moves whose target caught up.
        for t in state.tenants.iter().filter(|(_, p)| p.migration.is_some()).map(|(t, _)| *t).collect::<Vec<_>>() {
            if self.caught_up(&state, t) {
                if let Some(done) = schedule::complete_migration(&state, t) {
                    debug_assert!(keeps_generations(&state, &done));
                    self.write(done, version.as_ref(), term).await?;
                    self.inner.lock().catch_up.remove(&t);
                    self.metrics.migrations_completed.inc();
                    info!(tenant = %t, "move completed");
                    return Ok(());
                }
            }
        }
        // Last: it writes the state itself.
        if let Err(e) = self.policy_split(&state).await {
            self.note_error(format!("size policy: {e}"));
        }
        Ok(())
    }

    /// Steps down if a newer leader wrote `state`: this one was replaced.
    fn check_term(&self, state: &ControllerState, term: u64) -> Result<(), String> {
        if state.leader_term <= term {
            return Ok(());
        }
        let mut inner = self.inner.lock();
        inner.lead = None;
        inner.state = None;
        self.metrics.leader.set(0);
        Err(format!("the state was written by term {}, newer than ours ({term})", state.leader_term))
    }

    /// The pageservers, those online, and their sites.
    fn view(&self) -> View {
        View {
            order: self.conf.pageservers.iter().map(|p| p.name.clone()).collect(),
            online: self.online(),
            sites: self.conf.pageservers.iter().filter_map(|p| Some((p.name.clone(), p.site.clone()?))).collect(),
        }
    }

    /// What a pageserver should hold of a tenant; `None`: leave it as it is
    /// (the origin of a move serves on under its old generation). `readers`
    /// are the tenant's site readers (site, pageserver).
    fn desired(
        p: &strata_protocol::api::controller::TenantPlacement,
        ps: &str,
        readers: &BTreeMap<String, String>,
    ) -> Option<LocationRequest> {
        let attached = |g| Some(LocationRequest { mode: LocationMode::Attached, generation: Some(g) });
        if p.migration.as_ref().is_some_and(|m| m.to == ps) {
            return attached(p.generation);
        }
        if p.attached.as_deref() == Some(ps) {
            return if p.migration.is_some() { None } else { attached(p.generation) };
        }
        let mode = if readers.values().any(|r| r == ps) {
            LocationMode::Reader
        } else if p.secondaries.iter().any(|s| s == ps) {
            LocationMode::Secondary
        } else {
            LocationMode::Detached
        };
        Some(LocationRequest { mode, generation: None })
    }

    /// Sends each online pageserver the location changes it needs: those of
    /// the placements, and a detach of every deleted tenant it still holds.
    fn apply(&self, state: &ControllerState) {
        let view = self.view();
        let online = view.online.clone();
        let observed: BTreeMap<String, Vec<LocationStatus>> = {
            let inner = self.inner.lock();
            inner
                .health
                .iter()
                .filter_map(|(n, h)| h.status.as_ref().map(|s| (n.clone(), s.locations.clone())))
                .collect()
        };
        let online_pageservers = || self.conf.pageservers.iter().filter(|ps| online.contains(&ps.name));
        for (t, p) in &state.tenants {
            let readers = schedule::site_readers(p, &view);
            for ps in online_pageservers() {
                let Some(want) = Self::desired(p, &ps.name, &readers) else { continue };
                let have = observed.get(&ps.name).and_then(|ls| ls.iter().find(|l| l.tenant_id == *t));
                let matches = match (want.mode, have) {
                    (LocationMode::Detached, None) => true,
                    (mode, Some(h)) => {
                        h.mode == mode && (mode != LocationMode::Attached || h.generation == want.generation)
                    }
                    (_, None) => false,
                };
                if !matches {
                    self.send_location(ps, *t, want);
                }
            }
        }
        // Deleted tenants: a detach removes the pageserver's local files.
        for ps in online_pageservers() {
            let held = observed.get(&ps.name).into_iter().flatten();
            let gone =
                |t: &TenantShardId| state.deleted_tenants.contains_key(t) || crate::split::is_retired_parent(state, *t);
            let deleted = held.filter(|l| l.mode != LocationMode::Detached && gone(&l.tenant_id));
            for t in deleted.map(|l| l.tenant_id).collect::<BTreeSet<_>>() {
                self.send_location(ps, t, LocationRequest { mode: LocationMode::Detached, generation: None });
            }
        }
    }

    /// Sends `ps` the location `want` of `tenant` in a task of its own,
    /// unless a call for the same is under way or waits to be retried. Its
    /// answer updates what the heartbeats said of `ps` at once.
    fn send_location(&self, ps: &PageserverRef, tenant: TenantShardId, want: LocationRequest) {
        let key = (ps.name.clone(), tenant);
        if self.retries.lock().waiting(&key, self.clock.now()) {
            return;
        }
        if !self.in_flight.lock().insert(key) {
            return;
        }
        self.metrics.location_calls.inc();
        info!(pageserver = %ps.name, tenant = %tenant, mode = ?want.mode, generation = ?want.generation, "setting a location");
        let (pageservers, http, name) = (self.pageservers.clone(), ps.http.clone(), ps.name.clone());
        let me = self.me.clone();
        self.spawn.spawn(Box::pin(async move {
            let r = pageservers.set_location(&http, tenant, want).await;
            if let Some(me) = me.upgrade() {
                let key = (name.clone(), tenant);
                me.in_flight.lock().remove(&key);
                match r {
                    Ok(status) => {
                        me.retries.lock().succeeded(&key);
                        // Seen at once, without waiting for the next heartbeat.
                        let mut inner = me.inner.lock();
                        if let Some(s) = inner.health.get_mut(&name).and_then(|h| h.status.as_mut()) {
                            s.locations.retain(|l| l.tenant_id != tenant);
                            if status.mode != LocationMode::Detached {
                                s.locations.push(status);
                            }
                        }
                        drop(inner);
                        me.wake.notify_one();
                    }
                    Err(e) => {
                        me.retries.lock().failed(key, me.clock.now());
                        me.metrics.location_errors.inc();
                        me.note_error(format!("pageserver {name}: tenant {tenant}: {e}"));
                    }
                }
            }
        }));
    }

    /// Whether a move's target has ingested every timeline as far as the
    /// origin had when the target was first seen attached.
    fn caught_up(&self, state: &ControllerState, tenant: TenantShardId) -> bool {
        let p = &state.tenants[&tenant];
        let (Some(m), Some(origin)) = (&p.migration, &p.attached) else { return false };
        let mut inner = self.inner.lock();
        let lsns = |inner: &Inner, name: &str| -> Option<BTreeMap<String, strata_formats::Lsn>> {
            let s = inner.health.get(name)?.status.as_ref()?;
            Some(
                s.timelines
                    .iter()
                    .filter(|t| t.tenant_id == tenant)
                    .map(|t| (t.timeline_id.to_string(), t.last_record_lsn))
                    .collect(),
            )
        };
        let target_attached = inner.health.get(&m.to).and_then(|h| h.status.as_ref()).is_some_and(|s| {
            s.locations.iter().any(|l| {
                l.tenant_id == tenant && l.mode == LocationMode::Attached && l.generation == Some(p.generation)
            })
        });
        if !target_attached {
            return false;
        }
        let Some(have) = lsns(&inner, &m.to) else { return false };
        if !inner.catch_up.contains_key(&tenant) {
            // The origin's position when the target is ready: the goal.
            let goal = lsns(&inner, origin).unwrap_or_default();
            inner.catch_up.insert(tenant, goal);
        }
        let goal = &inner.catch_up[&tenant];
        goal.iter().all(|(tl, lsn)| have.get(tl).is_some_and(|h| h >= lsn))
    }

    // ---- what the API serves

    /// Where `tenant` is served, once the state is newer than `after` (or
    /// `wait` has passed). With `site`: that site's reader if it has one,
    /// online and loaded (`reader: true`), else the attached pageserver.
    pub async fn attachment(
        &self,
        tenant: TenantShardId,
        after: Option<u64>,
        wait: Duration,
        site: Option<&str>,
    ) -> Result<AttachmentInfo, NoAttachment> {
        let mut rx = self.version.subscribe();
        if let Some(after) = after {
            let _ = clock::timeout(&*self.clock, wait, rx.wait_for(|v| *v > after)).await;
        }
        // Before the lock: the view takes it too.
        let view = site.map(|_| self.view());
        let inner = self.inner.lock();
        let not_attached = || NoAttachment::NotAttached(tenant);
        let (state, _) = inner.state.as_ref().ok_or_else(not_attached)?;
        if state.deleted_tenants.contains_key(&tenant) {
            return Err(NoAttachment::Deleted(tenant));
        }
        // One shard (or an unsharded tenant) by its id; a sharded tenant
        // by its bare id: all of its shards, each attached.
        let shards: Vec<(TenantShardId, &TenantPlacement)> = match state.tenants.get(&tenant) {
            Some(p) => vec![(tenant, p)],
            // While a split is under way its parents answer, once done its children.
            None if tenant.shard.is_unsharded() => crate::split::current_shards(state, tenant.tenant),
            None => Vec::new(),
        };
        let count = shards.first().map(|(t, _)| t.shard.shards() as usize).ok_or_else(not_attached)?;
        let whole = shards.len() == 1 && shards[0].0 == tenant;
        if !whole && (shards.len() != count || shards.iter().any(|(t, _)| t.shard.shards() as usize != count)) {
            // Registered shard by shard: not all of them yet (or a split's
            // children beside their parents, which the split reports).
            return Err(not_attached());
        }
        let mut answers = Vec::with_capacity(count);
        for (shard, p) in &shards {
            let attached = p.attached.as_ref().ok_or_else(not_attached)?;
            let reader = site.zip(view.as_ref()).and_then(|(site, view)| {
                let name = schedule::site_readers(p, view).remove(site)?;
                let loaded = inner.health.get(&name).and_then(|h| h.status.as_ref()).is_some_and(|s| {
                    s.locations.iter().any(|l| l.tenant_id == *shard && l.mode == LocationMode::Reader)
                });
                loaded.then_some(name)
            });
            let name = reader.as_ref().unwrap_or(attached);
            let ps = self.conf.pageserver(name).ok_or_else(not_attached)?;
            answers.push(ShardAttachment {
                shard: *shard,
                generation: p.generation,
                pageserver: name.clone(),
                pg: ps.pg.clone(),
                http: ps.http.clone(),
                reader: reader.is_some(),
            });
        }
        let first = answers[0].clone();
        let sharded = first.shard.shard.count > 0 && first.shard != tenant;
        Ok(AttachmentInfo {
            tenant_id: tenant,
            version: state.version,
            generation: first.generation,
            pageserver: first.pageserver,
            pg: first.pg,
            http: first.http,
            reader: first.reader,
            shards: if sharded { answers } else { Vec::new() },
            stripe_blocks: state.splits.get(&tenant.tenant).filter(|_| sharded).map(|s| s.to.stripe_blocks),
        })
    }

    pub fn status(&self) -> ControllerStatus {
        let leader = self.leading().is_some();
        let now = self.clock.now();
        let inner = self.inner.lock();
        let state = inner.state.as_ref().map(|(s, _)| s.clone());
        let pageservers = self
            .conf
            .pageservers
            .iter()
            .map(|p| {
                let h = inner.health.get(&p.name);
                let last = h.and_then(|h| h.last_ok).map(|t| now.saturating_duration_since(t));
                PageserverHealth {
                    name: p.name.clone(),
                    availability: if last.is_some_and(|ago| ago <= self.conf.offline_after) {
                        "online".into()
                    } else {
                        "offline".into()
                    },
                    policy: state
                        .as_ref()
                        .and_then(|s| s.pageservers.get(&p.name).copied())
                        .unwrap_or(PageserverPolicy::Active),
                    last_answer_seconds: last.map(|ago| ago.as_secs_f64()),
                }
            })
            .collect();
        ControllerStatus {
            id: self.conf.id,
            leader,
            leader_term: inner.term,
            leader_http: inner.leader_http.clone(),
            state,
            pageservers,
            last_error: inner.last_error.clone(),
        }
    }

    /// Drains (or fills again) a pageserver: writes its policy; the
    /// decision rounds move the tenants.
    pub async fn set_policy(&self, name: &str, policy: PageserverPolicy) -> Result<(), CallError> {
        if self.conf.pageserver(name).is_none() {
            return Err(CallError::Unknown(name.to_string()));
        }
        for _ in 0..WRITE_ATTEMPTS {
            let (state, version, term) = self.leader_state().await?;
            let Some(next) = schedule::set_policy(&state, name, policy) else { return Ok(()) };
            match self.write(next, version.as_ref(), term).await {
                Ok(()) => {
                    info!(pageserver = %name, ?policy, "policy set");
                    self.wake.notify_one();
                    return Ok(());
                }
                Err(e) => warn!("{e}"),
            }
        }
        Err(CallError::Store(format!("the state kept changing; {name} was not set to {policy:?}")))
    }

    /// Registers `tenant` (`PUT /v1/tenant/{tenant}`): adds it to the state,
    /// above every generation its objects carry, and wakes the decisions so
    /// it is placed at once. Whether it was new, and its generation.
    pub async fn register_tenant(&self, tenant: TenantShardId) -> Result<(bool, TenantRegistered), CallError> {
        let mut stored = None;
        for _ in 0..WRITE_ATTEMPTS {
            let (state, version, term) = self.leader_state().await?;
            if let Some(p) = state.tenants.get(&tenant) {
                return Ok((false, TenantRegistered { tenant_id: tenant, generation: p.generation }));
            }
            let first = match stored {
                Some(g) => g,
                None => {
                    let g = self.store.max_generation(tenant).await.map_err(|e| {
                        self.metrics.storage_errors.inc();
                        CallError::Store(format!("tenant {tenant}: listing its objects: {e}"))
                    })?;
                    *stored.insert(g)
                }
            };
            let next = schedule::register_tenant(&state, tenant, first).expect("not placed yet");
            let generation = next.tenants[&tenant].generation;
            match self.write(next, version.as_ref(), term).await {
                Ok(()) => {
                    info!(tenant = %tenant, generation, "tenant registered");
                    self.wake.notify_one();
                    return Ok((true, TenantRegistered { tenant_id: tenant, generation }));
                }
                Err(e) => warn!(tenant = %tenant, "registering: {e}"),
            }
        }
        Err(CallError::Store(format!("tenant {tenant}: the state kept changing; it was not registered")))
    }

    /// Deletes `tenant` (`DELETE /v1/tenant/{tenant}`): its placement becomes
    /// a tombstone, and the decisions tell its pageservers to detach it.
    /// Again, it only answers where it is still located.
    pub async fn delete_tenant(&self, tenant: TenantShardId) -> Result<TenantDeleted, CallError> {
        for _ in 0..WRITE_ATTEMPTS {
            let (state, version, term) = self.leader_state().await?;
            let Some(next) = schedule::delete_tenant(&state, tenant, &self.conf.tenants) else {
                return Ok(self.located(tenant));
            };
            debug_assert!(keeps_generations(&state, &next));
            let generation = next.deleted_tenants[&tenant].generation;
            match self.write(next, version.as_ref(), term).await {
                Ok(()) => {
                    info!(tenant = %tenant, generation, "tenant deleted");
                    self.wake.notify_one();
                    return Ok(self.located(tenant));
                }
                Err(e) => warn!(tenant = %tenant, "deleting: {e}"),
            }
        }
        Err(CallError::Store(format!("tenant {tenant}: the state kept changing; it was not deleted")))
    }

    /// The state to change, while this controller leads, with its version
    /// and the term to write it under.
    async fn leader_state(&self) -> Result<(ControllerState, Option<ObjectVersion>, u64), CallError> {
        let Some(term) = self.leading() else {
            return Err(CallError::NotLeader(self.inner.lock().leader_http.clone()));
        };
        let (state, version) = self.current_state().await.map_err(CallError::Store)?;
        self.check_term(&state, term).map_err(CallError::Store)?;
        Ok((state, version, term))
    }

    /// Where a deleted tenant is still located, as the heartbeats and the
    /// location calls under way say.
    fn located(&self, tenant: TenantShardId) -> TenantDeleted {
        let online = self.online();
        let sending: BTreeSet<String> =
            self.in_flight.lock().iter().filter(|(_, t)| *t == tenant).map(|(n, _)| n.clone()).collect();
        let inner = self.inner.lock();
        let holds = |name: &String| {
            let status = inner.health.get(name).and_then(|h| h.status.as_ref());
            status
                .is_some_and(|s| s.locations.iter().any(|l| l.tenant_id == tenant && l.mode != LocationMode::Detached))
        };
        let (on, off): (Vec<&PageserverRef>, Vec<&PageserverRef>) =
            self.conf.pageservers.iter().partition(|p| online.contains(&p.name));
        TenantDeleted {
            tenant_id: tenant,
            still_located_on: on
                .iter()
                .filter(|p| holds(&p.name) || sending.contains(&p.name))
                .map(|p| p.name.clone())
                .collect(),
            offline: off.iter().map(|p| p.name.clone()).collect(),
        }
    }
}

/// Whether `next` keeps what must never be lost from `state`: every tenant
/// (but one deleted, whose tombstone keeps its generation), a generation
/// never lower, and an attachment once there is one.
fn keeps_generations(state: &ControllerState, next: &ControllerState) -> bool {
    state.tenants.iter().all(|(t, p)| match next.tenants.get(t) {
        Some(n) => n.generation >= p.generation && (p.attached.is_none() || n.attached.is_some()),
        None => next.deleted_tenants.get(t).is_some_and(|d| d.generation >= p.generation),
    })
}
