//! The controller at run time: the leader's lease, the heartbeats, and the
//! rounds in which the leader decides (`schedule`), writes the state by
//! compare-and-swap, and makes the pageservers match it
//! (`docs/storage-controller.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_protocol::api::controller::{
    AttachmentInfo, ControllerState, ControllerStatus, PageserverHealth, PageserverPolicy, STATE_FORMAT_VERSION,
};
use strata_protocol::api::pageserver::{LocationMode, LocationRequest, PageserverStatus};
use strata_protocol::TenantId;
use strata_remote_storage::cas::ObjectVersion;
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::client::Client;
use crate::config::ControllerConfig;
use crate::metrics::Metrics;
use crate::schedule::{self, View};
use crate::store::{LeaderLease, Store, StoreError};

/// How often a follower reads the state (computes may ask any controller).
const FOLLOWER_REFRESH: Duration = Duration::from_secs(1);
/// Bound on writing the state when a write conflicts again and again.
const WRITE_ATTEMPTS: usize = 5;
/// Pauses before a failed location call is sent again.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

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
    state: Option<(ControllerState, Option<ObjectVersion>)>,
    health: BTreeMap<String, Health>,
    /// LSNs a migration's target must reach, per tenant and timeline.
    catch_up: BTreeMap<TenantId, BTreeMap<String, strata_formats::Lsn>>,
    last_error: Option<String>,
}

/// One controller process.
pub struct Controller {
    pub conf: ControllerConfig,
    store: Store,
    client: Client,
    pub metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    /// The version of the state this controller knows (computes wait on it).
    version: watch::Sender<u64>,
    /// Location calls under way, so a slow attach is not sent twice.
    in_flight: Mutex<BTreeSet<(String, TenantId)>>,
    /// Location calls that failed, and when to try again (growing pauses).
    retry_at: Mutex<BTreeMap<(String, TenantId), (Instant, strata_service::backoff::Backoff)>>,
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
}

impl Controller {
    pub fn new(conf: ControllerConfig, store: Store, client: Client, metrics: Arc<Metrics>) -> Arc<Controller> {
        Arc::new_cyclic(|me| Controller {
            me: me.clone(),
            conf,
            store,
            client,
            metrics,
            inner: Mutex::new(Inner::default()),
            version: watch::Sender::new(0),
            in_flight: Mutex::new(BTreeSet::new()),
            retry_at: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            started: Instant::now(),
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
        inner.lead.as_ref().filter(|l| Instant::now() < l.until).map(|l| l.term)
    }

    /// Runs the lease, heartbeat and decision loops until the process ends.
    pub async fn run(self: Arc<Self>) {
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(self.clone().lease_loop());
        tasks.spawn(self.clone().heartbeat_loop());
        tasks.spawn(self.clone().decision_loop());
        while tasks.join_next().await.is_some() {}
    }

    // ---- the leader's lease

    async fn lease_loop(self: Arc<Self>) {
        let period = self.conf.lease_ttl / 4;
        loop {
            self.lease_round().await;
            tokio::time::sleep(period).await;
        }
    }

    async fn lease_round(&self) {
        let started = Instant::now();
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
                        Some((seen, at)) if *seen == v => at.elapsed() >= self.conf.lease_ttl,
                        _ => {
                            inner.lease_seen = Some((v, Instant::now()));
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
        match self.store.write_lease(&next, version.as_ref()).await {
            Ok(v) => {
                let mut inner = self.inner.lock();
                let until = started + self.conf.lease_ttl * 3 / 4;
                let took = inner.lead.as_ref().is_none_or(|l| l.term != next.term);
                inner.lead = Some(Lead { term: next.term, until, renewals: next.renewals });
                inner.term = next.term;
                inner.lease_seen = Some((v, Instant::now()));
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
        if inner.lead.as_ref().is_some_and(|l| Instant::now() >= l.until) {
            inner.lead = None;
            self.metrics.leader.set(0);
            warn!("could not renew the leader's lease in time; no longer leading");
        }
    }

    // ---- heartbeats

    async fn heartbeat_loop(self: Arc<Self>) {
        loop {
            let started = Instant::now();
            let mut calls = tokio::task::JoinSet::new();
            for p in self.conf.pageservers.clone() {
                let c = self.client.clone();
                calls.spawn(async move {
                    let r = c.status(&p.http).await;
                    (p.name, r)
                });
            }
            while let Some(Ok((name, r))) = calls.join_next().await {
                let mut inner = self.inner.lock();
                let h = inner.health.entry(name.clone()).or_default();
                match r {
                    Ok(s) => {
                        let was_offline = h.last_ok.is_none_or(|t| t.elapsed() > self.conf.offline_after);
                        h.last_ok = Some(Instant::now());
                        h.status = Some(s);
                        if was_offline {
                            info!(pageserver = %name, "online");
                            self.wake.notify_one();
                        }
                    }
                    Err(e) => {
                        self.metrics.heartbeat_failures.inc();
                        tracing::debug!(pageserver = %name, "heartbeat: {e}");
                        if h.last_ok.is_some_and(|t| t.elapsed() > self.conf.offline_after) {
                            h.status = None;
                        }
                    }
                }
            }
            let online = self.online().len();
            self.metrics.pageservers_online.set(online as i64);
            if let Some(wait) = self.conf.heartbeat_interval.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
            // A pageserver that just passed its offline period is decided on now.
            self.wake.notify_one();
        }
    }

    /// The pageservers that answered within the offline period, but for
    /// those the state calls lost (their site was given up).
    fn online(&self) -> BTreeSet<String> {
        let inner = self.inner.lock();
        let lost = |n: &String| {
            inner.state.as_ref().is_some_and(|(s, _)| s.pageservers.get(n) == Some(&PageserverPolicy::Lost))
        };
        inner
            .health
            .iter()
            .filter(|(n, h)| h.last_ok.is_some_and(|t| t.elapsed() <= self.conf.offline_after) && !lost(n))
            .map(|(n, _)| n.clone())
            .collect()
    }

    // ---- decisions

    async fn decision_loop(self: Arc<Self>) {
        let mut last_refresh = Instant::now() - FOLLOWER_REFRESH;
        loop {
            match self.leading() {
                Some(term) => {
                    if let Err(e) = self.decide(term).await {
                        self.note_error(e);
                    }
                }
                None if last_refresh.elapsed() >= FOLLOWER_REFRESH => {
                    last_refresh = Instant::now();
                    match self.store.read_state().await {
                        Ok(Some((s, v))) => self.remember(s, Some(v)),
                        Ok(None) => {}
                        Err(e) => {
                            self.metrics.storage_errors.inc();
                            self.note_error(format!("reading the state: {e}"));
                        }
                    }
                }
                None => {}
            }
            let _ = tokio::time::timeout(self.conf.heartbeat_interval, self.wake.notified()).await;
        }
    }

    fn remember(&self, state: ControllerState, version: Option<ObjectVersion>) {
        let v = state.version;
        self.inner.lock().state = Some((state, version));
        self.version.send_if_modified(|known| {
            let newer = v != *known;
            *known = v;
            newer
        });
    }

    /// The state as last read or written; read if unknown.
    async fn current_state(&self) -> Result<(ControllerState, Option<ObjectVersion>), String> {
        if let Some(s) = self.inner.lock().state.clone() {
            return Ok(s);
        }
        match self.store.read_state().await {
            Ok(Some((s, v))) => {
                self.remember(s.clone(), Some(v.clone()));
                Ok((s, Some(v)))
            }
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
                self.metrics.storage_errors.inc();
                Err(format!("writing the state: {e}"))
            }
        }
    }

    /// One round of the leader: decide, write, apply.
    async fn decide(&self, term: u64) -> Result<(), String> {
        let (state, version) = self.current_state().await?;
        if state.leader_term > term {
            // A newer leader wrote: this one was replaced.
            let mut inner = self.inner.lock();
            inner.lead = None;
            inner.state = None;
            self.metrics.leader.set(0);
            return Err(format!("the state was written by term {}, newer than ours ({term})", state.leader_term));
        }
        let mut next = state.clone();
        let unknown: Vec<TenantId> =
            self.conf.tenants.iter().filter(|t| !state.tenants.contains_key(t)).copied().collect();
        let mut new = Vec::new();
        for t in unknown {
            let g = self.store.max_generation(t).await.map_err(|e| format!("tenant {t}: {e}"))?;
            new.push((t, g));
        }
        schedule::add_tenants(&mut next, &new);
        // Before a whole offline period of heartbeats nothing is known to be down.
        if self.started.elapsed() >= self.conf.offline_after {
            let view = self.view();
            if let Some(planned) = schedule::plan(&next, &view) {
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
        if next != state || state.leader_term != term {
            self.write(next.clone(), version.as_ref(), term).await?;
        }
        let (state, version) = self.current_state().await?;
        // Goals of moves that ended otherwise (a failover, a cancellation).
        self.inner.lock().catch_up.retain(|t, _| state.tenants.get(t).is_some_and(|p| p.migration.is_some()));
        self.apply(&state);
        // Moves whose target caught up.
        for t in state.tenants.iter().filter(|(_, p)| p.migration.is_some()).map(|(t, _)| *t).collect::<Vec<_>>() {
            if self.caught_up(&state, t) {
                if let Some(done) = schedule::complete_migration(&state, t) {
                    self.write(done, version.as_ref(), term).await?;
                    self.inner.lock().catch_up.remove(&t);
                    self.metrics.migrations_completed.inc();
                    info!(tenant = %t, "move completed");
                    return Ok(());
                }
            }
        }
        Ok(())
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

    /// Sends each online pageserver the location changes it needs.
    fn apply(&self, state: &ControllerState) {
        let view = self.view();
        let online = view.online.clone();
        let observed: BTreeMap<String, Vec<strata_protocol::api::pageserver::LocationStatus>> = {
            let inner = self.inner.lock();
            inner
                .health
                .iter()
                .filter_map(|(n, h)| h.status.as_ref().map(|s| (n.clone(), s.locations.clone())))
                .collect()
        };
        for (t, p) in &state.tenants {
            let readers = schedule::site_readers(p, &view);
            for ps in &self.conf.pageservers {
                if !online.contains(&ps.name) {
                    continue;
                }
                let Some(want) = Self::desired(p, &ps.name, &readers) else { continue };
                let have = observed.get(&ps.name).and_then(|ls| ls.iter().find(|l| l.tenant_id == *t));
                let matches = match (want.mode, have) {
                    (LocationMode::Detached, None) => true,
                    (mode, Some(h)) => {
                        h.mode == mode && (mode != LocationMode::Attached || h.generation == want.generation)
                    }
                    (_, None) => false,
                };
                let key = (ps.name.clone(), *t);
                if matches || self.retry_at.lock().get(&key).is_some_and(|(at, _)| Instant::now() < *at) {
                    continue;
                }
                if !self.in_flight.lock().insert(key) {
                    continue;
                }
                self.metrics.location_calls.inc();
                info!(pageserver = %ps.name, tenant = %t, mode = ?want.mode, generation = ?want.generation, "setting a location");
                let (client, http, name, tenant) = (self.client.clone(), ps.http.clone(), ps.name.clone(), *t);
                let me = self.me.clone();
                tokio::spawn(async move {
                    let r = client.set_location(&http, tenant, want).await;
                    if let Some(me) = me.upgrade() {
                        let key = (name.clone(), tenant);
                        me.in_flight.lock().remove(&key);
                        match r {
                            Ok(status) => {
                                me.retry_at.lock().remove(&key);
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
                                let mut retry = me.retry_at.lock();
                                let (at, backoff) = retry.entry(key).or_insert_with(|| {
                                    (Instant::now(), strata_service::backoff::Backoff::new(RETRY_MIN, RETRY_MAX))
                                });
                                *at = Instant::now() + backoff.next_delay();
                                drop(retry);
                                me.metrics.location_errors.inc();
                                me.note_error(format!("pageserver {name}: tenant {tenant}: {e}"));
                            }
                        }
                    }
                });
            }
        }
    }

    /// Whether a move's target has ingested every timeline as far as the
    /// origin had when the target was first seen attached.
    fn caught_up(&self, state: &ControllerState, tenant: TenantId) -> bool {
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
        tenant: TenantId,
        after: Option<u64>,
        wait: Duration,
        site: Option<&str>,
    ) -> Option<AttachmentInfo> {
        let mut rx = self.version.subscribe();
        if let Some(after) = after {
            let _ = tokio::time::timeout(wait, rx.wait_for(|v| *v > after)).await;
        }
        // Before the lock: the view takes it too.
        let view = site.map(|_| self.view());
        let inner = self.inner.lock();
        let (state, _) = inner.state.as_ref()?;
        let p = state.tenants.get(&tenant)?;
        let attached = p.attached.as_ref()?;
        let reader = site.zip(view.as_ref()).and_then(|(site, view)| {
            let name = schedule::site_readers(p, view).remove(site)?;
            let loaded =
                inner.health.get(&name).and_then(|h| h.status.as_ref()).is_some_and(|s| {
                    s.locations.iter().any(|l| l.tenant_id == tenant && l.mode == LocationMode::Reader)
                });
            loaded.then_some(name)
        });
        let name = reader.as_ref().unwrap_or(attached);
        let ps = self.conf.pageserver(name)?;
        Some(AttachmentInfo {
            tenant_id: tenant,
            version: state.version,
            generation: p.generation,
            pageserver: name.clone(),
            pg: ps.pg.clone(),
            http: ps.http.clone(),
            reader: reader.is_some(),
        })
    }

    pub fn status(&self) -> ControllerStatus {
        let leader = self.leading().is_some();
        let inner = self.inner.lock();
        let state = inner.state.as_ref().map(|(s, _)| s.clone());
        let pageservers = self
            .conf
            .pageservers
            .iter()
            .map(|p| {
                let h = inner.health.get(&p.name);
                let last = h.and_then(|h| h.last_ok);
                PageserverHealth {
                    name: p.name.clone(),
                    availability: if last.is_some_and(|t| t.elapsed() <= self.conf.offline_after) {
                        "online".into()
                    } else {
                        "offline".into()
                    },
                    policy: state
                        .as_ref()
                        .and_then(|s| s.pageservers.get(&p.name).copied())
                        .unwrap_or(PageserverPolicy::Active),
                    last_answer_seconds: last.map(|t| t.elapsed().as_secs_f64()),
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
            let Some(term) = self.leading() else {
                return Err(CallError::NotLeader(self.inner.lock().leader_http.clone()));
            };
            let (state, version) = self.current_state().await.map_err(CallError::Store)?;
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
}
