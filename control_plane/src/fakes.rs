//! Fake services for the operations' unit tests: safekeepers, pageservers
//! and storage controllers that answer the control plane's calls
//! (`http::Transport`) from state kept in memory, with the faults the
//! tests set (down, refusing, failing a call). The operations under test
//! are the real ones; only the network is replaced.

use std::cell::RefCell;
use std::collections::BTreeMap;

use strata_formats::Lsn;
use strata_protocol::api::safekeeper::{OffloadStatus, RemovalStatus, TimelineState, TimelineStatus};
use strata_protocol::safekeeper::{Membership, TermHistory, TermLsn};
use strata_protocol::{TenantId, TimelineId};

use super::http::{Reply, Transport};

/// One timeline on a fake safekeeper.
#[derive(Clone, Debug)]
pub struct FakeTimeline {
    pub membership: Membership,
    pub flush_lsn: Lsn,
    pub commit_lsn: Lsn,
    pub term_history: TermHistory,
    pub elected_generation: u32,
    pub sealed: bool,
    pub commit_before_seal: Option<Lsn>,
}

impl FakeTimeline {
    /// A timeline a writer has written to up to `lsn` under generation 0.
    pub fn written(lsn: Lsn) -> FakeTimeline {
        FakeTimeline {
            membership: Membership::of(0, Vec::new(), Default::default()),
            flush_lsn: lsn,
            commit_lsn: lsn,
            term_history: TermHistory(vec![TermLsn { term: 1, lsn: Lsn(0x0100_0000) }]),
            elected_generation: 0,
            sealed: false,
            commit_before_seal: None,
        }
    }

    /// A timeline just created: no proposer was ever elected on it.
    pub fn created(lsn: Lsn) -> FakeTimeline {
        FakeTimeline { term_history: TermHistory(Vec::new()), ..FakeTimeline::written(lsn) }
    }

    fn status(&self, tenant: TenantId, timeline: TimelineId) -> TimelineStatus {
        let elected_term = self.term_history.0.last().map_or(0, |t| t.term);
        TimelineStatus {
            tenant_id: tenant,
            timeline_id: timeline,
            system_id: 7,
            pg_version: 15,
            wal_segment_size: 16 << 20,
            timeline_start_lsn: Lsn(0x0100_0000),
            state: TimelineState::Active,
            term: elected_term,
            term_history: self.term_history.clone(),
            membership: self.membership.clone(),
            elected_term,
            elected_generation: self.elected_generation,
            write_lsn: self.flush_lsn,
            flush_lsn: self.flush_lsn,
            commit_lsn: self.commit_lsn,
            truncate_lsn: Lsn(0),
            consumers: Vec::new(),
            offload: OffloadStatus::default(),
            removal: RemovalStatus::default(),
            remote_consistent_lsn: Lsn(0),
            pageserver_generation: 0,
            sealed: self.sealed,
            commit_before_seal: self.commit_before_seal,
            last_error: None,
            failure: None,
            peers: None,
        }
    }
}

/// A fake safekeeper: its timelines and its faults.
#[derive(Clone, Debug, Default)]
pub struct FakeSafekeeper {
    pub timelines: BTreeMap<TimelineId, FakeTimeline>,
    /// Answers nothing (as if killed or cut off).
    pub down: bool,
    /// Refuses membership changes to this generation or later, with this status.
    pub refuse_membership: Option<(u32, u16)>,
    /// Refuses to seal with this status.
    pub refuse_seal: Option<u16>,
    /// Answers a seal with the timeline as it was, unsealed (a broken peer).
    pub ignore_seal: bool,
}

/// A fake pageserver: the timelines it has, and its faults.
#[derive(Clone, Debug, Default)]
pub struct FakePageserver {
    pub timelines: BTreeMap<TimelineId, Lsn>,
    pub down: bool,
    /// Refuses to create timelines with this status.
    pub refuse_branch: Option<u16>,
}

/// The fake storage controllers' shared state: where the tenant is
/// attached, and which pageservers were declared lost.
#[derive(Clone, Debug, Default)]
pub struct FakeControllers {
    /// (name, HTTP API base) of every pageserver, with its site.
    pub pageservers: Vec<(String, String, String)>,
    pub attached: String,
    pub generation: u32,
    pub lost: Vec<String>,
    /// The controllers' own API bases; none of them answers while `down`.
    pub bases: Vec<String>,
    pub down: bool,
}

/// Fake services by the base URL of their HTTP API.
#[derive(Default)]
pub struct FakeServices {
    pub tenant: Option<TenantId>,
    pub safekeepers: RefCell<BTreeMap<String, FakeSafekeeper>>,
    pub pageservers: RefCell<BTreeMap<String, FakePageserver>>,
    pub controllers: RefCell<FakeControllers>,
    /// Re-elects a writer under each new generation a member holds, as a
    /// running compute does within a second.
    pub compute_running: bool,
    /// Every call made, as `METHOD url`.
    pub calls: RefCell<Vec<String>>,
}

fn answer(status: u16, body: serde_json::Value) -> Result<Reply, String> {
    Ok(Reply { status, body })
}

fn refused(status: u16, why: &str) -> Result<Reply, String> {
    answer(status, serde_json::json!({ "error": why }))
}

impl FakeServices {
    /// The safekeeper whose API is at `base`, changed by `f`.
    pub fn safekeeper<R>(&self, base: &str, f: impl FnOnce(&mut FakeSafekeeper) -> R) -> R {
        f(self.safekeepers.borrow_mut().entry(base.to_string()).or_default())
    }

    /// The membership a safekeeper holds for `timeline`.
    pub fn membership(&self, base: &str, timeline: TimelineId) -> Option<Membership> {
        self.safekeepers.borrow().get(base)?.timelines.get(&timeline).map(|t| t.membership.clone())
    }

    /// The pageserver whose API is at `base`, changed by `f`.
    pub fn pageserver<R>(&self, base: &str, f: impl FnOnce(&mut FakePageserver) -> R) -> R {
        f(self.pageservers.borrow_mut().entry(base.to_string()).or_default())
    }

    fn pageserver_call(
        &self,
        ps: &mut FakePageserver,
        method: &str,
        rest: &[&str],
        body: Option<serde_json::Value>,
    ) -> Result<Reply, String> {
        let tenant = self.tenant.unwrap_or(TenantId([0; 16]));
        let status = |timeline: TimelineId, lsn: Lsn| {
            let s = strata_protocol::api::pageserver::TimelineStatus::new(tenant.into(), timeline, 7, 16 << 20, lsn);
            serde_json::to_value(s).unwrap()
        };
        match (method, rest) {
            // No locations listed: callers take the pageserver as attached.
            ("GET", ["v1", "status"]) => refused(404, "no status in the fake"),
            ("POST", ["v1", "tenant", _, "timeline"]) => {
                if let Some(code) = ps.refuse_branch {
                    return refused(code, "refused by the test");
                }
                let req: strata_protocol::api::pageserver::CreateBranchRequest =
                    serde_json::from_value(body.ok_or("a body")?).map_err(|e| e.to_string())?;
                let timeline = req.timeline_id.ok_or("a timeline id")?;
                let start = req.ancestor_lsn.unwrap_or(Lsn(0x0100_0000));
                ps.timelines.insert(timeline, start);
                answer(201, status(timeline, start))
            }
            ("GET", ["v1", "tenant", _, "timeline", t]) => {
                let timeline: TimelineId = t.parse().map_err(|_| "a timeline id")?;
                match ps.timelines.get(&timeline) {
                    Some(lsn) => answer(200, status(timeline, *lsn)),
                    None => refused(404, "no such timeline"),
                }
            }
            _ => refused(404, "no such route"),
        }
    }

    fn controller_call(&self, method: &str, rest: &[&str]) -> Result<Reply, String> {
        let mut c = self.controllers.borrow_mut();
        match (method, rest) {
            ("GET", ["v1", "tenant", t, "attachment"]) => {
                let (name, http, _) =
                    c.pageservers.iter().find(|p| p.0 == c.attached).cloned().ok_or("attached somewhere")?;
                answer(
                    200,
                    serde_json::json!({
                        "tenant_id": t, "version": c.generation, "generation": c.generation,
                        "pageserver": name, "pg": "127.0.0.1:1", "http": http.trim_start_matches("http://"),
                    }),
                )
            }
            // One tenant: registering it again changes nothing.
            ("PUT", ["v1", "tenant", _]) => answer(200, serde_json::json!({})),
            ("POST", ["v1", "pageserver", name, "lost"]) => {
                let name = name.to_string();
                if !c.lost.contains(&name) {
                    c.lost.push(name.clone());
                }
                // Failover: to a pageserver not lost, if the attached one is.
                if c.lost.contains(&c.attached) {
                    if let Some(next) = c.pageservers.iter().find(|p| !c.lost.contains(&p.0)).map(|p| p.0.clone()) {
                        c.attached = next;
                        c.generation += 1;
                    }
                }
                answer(200, serde_json::json!({}))
            }
            _ => refused(404, "no such route"),
        }
    }

    fn safekeeper_call(
        &self,
        sk: &mut FakeSafekeeper,
        method: &str,
        rest: &[&str],
        body: Option<serde_json::Value>,
        peers_flush: Lsn,
    ) -> Result<Reply, String> {
        let tenant = self.tenant.unwrap_or(TenantId([0; 16]));
        let timeline: Option<TimelineId> = rest.get(4).and_then(|t| t.parse().ok());
        match (method, rest) {
            ("GET", ["v1", "status"]) => answer(200, serde_json::json!({})),
            ("POST", ["v1", "tenant", _, "timeline", _]) => {
                let timeline = timeline.ok_or("a timeline id")?;
                let created = !sk.timelines.contains_key(&timeline);
                // Recovery from the peers is instant here.
                sk.timelines
                    .entry(timeline)
                    .or_insert_with(|| FakeTimeline::created(peers_flush.max(Lsn(0x0100_0000))));
                let t = &sk.timelines[&timeline];
                answer(if created { 201 } else { 200 }, serde_json::to_value(t.status(tenant, timeline)).unwrap())
            }
            (_, ["v1", "tenant", _, "timeline", _, ..]) => {
                let timeline = timeline.ok_or("a timeline id")?;
                let Some(t) = sk.timelines.get_mut(&timeline) else { return refused(404, "no such timeline") };
                match (method, &rest[5..]) {
                    ("GET", []) => answer(200, serde_json::to_value(t.status(tenant, timeline)).unwrap()),
                    ("GET", ["membership"]) => answer(200, serde_json::to_value(&t.membership).unwrap()),
                    ("PUT", ["membership"]) => {
                        let m: Membership = serde_json::from_value(body.ok_or("a body")?).map_err(|e| e.to_string())?;
                        if let Some((from, status)) = sk.refuse_membership.filter(|(from, _)| m.generation >= *from) {
                            return refused(
                                status,
                                &format!("generation {} refused by the test (from {from})", m.generation),
                            );
                        }
                        if m.generation < t.membership.generation {
                            return refused(409, "a newer generation is held");
                        }
                        t.membership = m;
                        answer(200, serde_json::json!({}))
                    }
                    ("POST", ["seal"]) => {
                        if let Some(status) = sk.refuse_seal {
                            return refused(status, "refused by the test");
                        }
                        if sk.ignore_seal {
                            return answer(200, serde_json::to_value(t.status(tenant, timeline)).unwrap());
                        }
                        if !t.sealed {
                            t.sealed = true;
                            t.commit_before_seal = Some(t.commit_lsn);
                            t.commit_lsn = t.flush_lsn;
                        }
                        answer(200, serde_json::to_value(t.status(tenant, timeline)).unwrap())
                    }
                    _ => refused(404, "no such route"),
                }
            }
            _ => refused(404, "no such route"),
        }
    }

    /// What a running compute does between two calls: it learns the
    /// newest generation any member holds and its greetings carry it to
    /// the others (an acceptor adopts a higher generation,
    /// `docs/safekeeper-membership.md`); once a quorum of its rule holds
    /// it, the compute is elected again under it: the term grows, and its
    /// epoch start (the flush LSN) is on every member that holds it.
    fn elect(&self) {
        if !self.compute_running {
            return;
        }
        let mut sks = self.safekeepers.borrow_mut();
        let mut timelines: Vec<TimelineId> = sks.values().flat_map(|s| s.timelines.keys().copied()).collect();
        timelines.sort();
        timelines.dedup();
        for timeline in timelines {
            let mut held: Vec<(String, Membership)> = sks
                .iter()
                .filter(|(_, s)| !s.down)
                .filter_map(|(b, s)| s.timelines.get(&timeline).map(|t| (b.clone(), t.membership.clone())))
                .collect();
            let Some(newest) = held.iter().map(|(_, m)| m.clone()).max_by_key(|m| m.generation) else { continue };
            for (b, h) in held.iter_mut() {
                let sk = sks.get_mut(b.as_str()).unwrap();
                let refuses = sk.refuse_membership.is_some_and(|(from, _)| newest.generation >= from);
                let member = newest.all().iter().any(|m| same_port(b, &m.address));
                if h.generation < newest.generation && member && !refuses {
                    sk.timelines.get_mut(&timeline).unwrap().membership = newest.clone();
                    *h = newest.clone();
                }
            }
            let holding: Vec<_> = newest
                .all()
                .into_iter()
                .filter(|m| held.iter().any(|(b, h)| h.generation == newest.generation && same_port(b, &m.address)))
                .map(|m| m.id)
                .collect();
            if newest.generation == 0 || !newest.has_quorum(&holding) {
                continue;
            }
            for (b, h) in &held {
                let t = sks.get_mut(b).unwrap().timelines.get_mut(&timeline).unwrap();
                if h.generation == newest.generation && t.elected_generation < newest.generation {
                    let term = t.term_history.0.last().map_or(0, |l| l.term) + 1;
                    t.term_history.0.push(TermLsn { term, lsn: t.flush_lsn });
                    t.elected_generation = newest.generation;
                }
            }
        }
    }
}

/// Whether the fake service at `base` listens on `address`'s port: the
/// tests give each fake safekeeper one port for its API and its protocol.
fn same_port(base: &str, address: &str) -> bool {
    base.rsplit(':').next() == address.rsplit(':').next()
}

impl Transport for FakeServices {
    fn runs(&self, base: &str) -> Option<bool> {
        let sk = self.safekeepers.borrow().get(base).map(|s| !s.down);
        let ps = self.pageservers.borrow().get(base).map(|p| !p.down);
        Some(sk.or(ps).unwrap_or(!self.controllers.borrow().down))
    }

    fn call(&self, method: &str, url: &str, body: Option<serde_json::Value>) -> Result<Reply, String> {
        self.calls.borrow_mut().push(format!("{method} {url}"));
        let (base, path) = split_url(url);
        let rest: Vec<&str> = path.split('?').next().unwrap_or("").split('/').filter(|s| !s.is_empty()).collect();
        let is_controller = self.controllers.borrow().bases.contains(&base);
        if is_controller {
            if self.controllers.borrow().down {
                return Err(format!("{url}: connection refused"));
            }
            return self.controller_call(method, &rest);
        }
        if let Some(ps) = self.pageservers.borrow_mut().get_mut(&base) {
            if ps.down {
                return Err(format!("{url}: connection refused"));
            }
            return self.pageserver_call(ps, method, &rest, body);
        }
        let mut sks = self.safekeepers.borrow_mut();
        let timeline: Option<TimelineId> = rest.get(4).and_then(|t| t.parse().ok());
        let peers_flush = timeline
            .and_then(|tl| {
                sks.values().filter(|s| !s.down).filter_map(|s| s.timelines.get(&tl)).map(|t| t.flush_lsn).max()
            })
            .unwrap_or(Lsn(0));
        let Some(sk) = sks.get_mut(&base) else { return Err(format!("{url}: connection refused")) };
        if sk.down {
            return Err(format!("{url}: connection refused"));
        }
        let result = self.safekeeper_call(sk, method, &rest, body, peers_flush);
        drop(sks);
        self.elect();
        result
    }
}

/// `http://host:port/path` as (`http://host:port`, `/path`).
fn split_url(url: &str) -> (String, String) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => (url[..after_scheme + i].to_string(), url[after_scheme + i..].to_string()),
        None => (url.to_string(), "/".to_string()),
    }
}

/// Fakes of every service of a workdir: each safekeeper and pageserver
/// holds every branch's timeline (written up to `lsn`), the tenant is
/// attached to the first pageserver.
pub fn of_workdir(wd: &crate::layout::Workdir, lsn: Lsn) -> std::rc::Rc<FakeServices> {
    use crate::layout::Kind;
    let c = &wd.cluster;
    let t = &c.tenants[0];
    let fake = FakeServices { tenant: Some(t.tenant_id), ..Default::default() };
    for sk in c.of_kind(Kind::Safekeeper) {
        fake.safekeeper(&sk.http_url(), |s| {
            for b in &t.branches {
                s.timelines.insert(b.timeline_id, FakeTimeline::written(lsn));
            }
        });
    }
    for ps in c.of_kind(Kind::Pageserver) {
        fake.pageserver(&ps.http_url(), |p| {
            for b in &t.branches {
                p.timelines.insert(b.timeline_id, Lsn(0x0100_0000));
            }
        });
    }
    {
        let mut ctl = fake.controllers.borrow_mut();
        ctl.pageservers =
            c.of_kind(Kind::Pageserver).map(|p| (p.name.clone(), p.http_url(), c.site_of(p).to_string())).collect();
        ctl.attached = ctl.pageservers[0].0.clone();
        ctl.generation = 1;
        ctl.bases = c.of_kind(Kind::Controller).map(|s| s.http_url()).collect();
    }
    std::rc::Rc::new(fake)
}
