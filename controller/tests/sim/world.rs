//! One simulated run: controllers, pageservers and object storage on one
//! manual clock (each controller's running up to 5% fast or slow), faults
//! drawn from the run's seed, and the checks. A run
//! is a few cycles of chaos (pageservers die, hang and return; controllers
//! die, stall and restart; storage fails and slows; operators drain, fill
//! and give up pageservers, and delete tenants and register them again)
//! followed by healing (storage healthy, a
//! controller running, at least one pageserver up), after which every
//! tenant must be served again (and a deleted one held by no pageserver
//! that is up) within a bound.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_controller::config::{ControllerConfig, PageserverRef};
use strata_controller::env::Env;
use strata_controller::schedule::Planner;
use strata_controller::service::Controller;
use strata_controller::store::Store;
use strata_protocol::api::controller::PageserverPolicy;
use strata_protocol::api::pageserver::LocationMode;
use strata_protocol::TenantShardId;
use strata_service::clock::{Clock, ManualClock};

use super::checker::{Checker, Counts};
use super::drift::DriftClock;
use super::executor::{Executor, Owner};
use super::objects::{FakeObjects, Health};
use super::pageservers::{FakePageservers, Mode};
use super::SharedRng;

/// Once healed, every tenant is served again within this much simulated
/// time: a takeover (a lease and a renewal period), an offline period, and
/// the longest pause before a failed location call is sent again (10 s),
/// with room to spare.
pub const HEAL_BOUND: Duration = Duration::from_secs(40);
/// Steps at one instant beyond which the controllers are taken to spin.
const MAX_STEPS_AT_ONCE: u32 = 100_000;
const STORAGE: Owner = 0;
const OPERATOR: Owner = 1;

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    /// Empty when every check held.
    pub violations: Vec<String>,
    /// Simulated time when the run ended.
    pub simulated: Duration,
    /// The longest a healing took until every tenant was served.
    pub longest_heal: Duration,
    pub counts: Counts,
    pub polls: u64,
    /// Changes with anything the run did: the same seed gives the same digest.
    pub digest: u64,
}

/// A controller's place: its id, and the incarnation running there.
struct Slot {
    conf: ControllerConfig,
    running: Option<(Owner, Arc<Controller>)>,
}

/// Where a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Chaos { until: Duration },
    Healing { since: Duration },
}

struct World {
    rng: SharedRng,
    clock: ManualClock,
    exec: Executor,
    checker: Arc<Checker>,
    objects: FakeObjects,
    pageservers: FakePageservers,
    /// (name, HTTP address) of each pageserver.
    names: Vec<(String, String)>,
    tenants: Vec<TenantShardId>,
    slots: Vec<Slot>,
    /// Stalled controllers and when they go on.
    paused: Vec<(Owner, Duration)>,
    /// Dead controllers (by slot) and when they start again.
    restarts: Vec<(usize, Duration)>,
    planner: Planner,
    next_owner: Owner,
    next_fault: Duration,
    next_probe: Duration,
    longest_heal: Duration,
}

/// Runs the simulation of `seed` with the decision rule `planner`.
pub fn run(seed: u64, planner: Planner) -> Outcome {
    let rng: SharedRng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
    let mut w = World::new(rng.clone(), planner);
    let cycles = rng.lock().u32(1..=3);
    'cycles: for _ in 0..cycles {
        let chaos = Duration::from_secs(rng.lock().u64(10..50));
        let mut phase = Phase::Chaos { until: w.elapsed() + chaos };
        loop {
            w.resume_and_restart();
            match phase {
                Phase::Chaos { until } if w.elapsed() >= until => {
                    w.heal();
                    phase = Phase::Healing { since: w.elapsed() };
                }
                Phase::Chaos { .. } => w.chaos(),
                Phase::Healing { since } => {
                    if w.elapsed() >= w.next_probe {
                        w.next_probe = w.elapsed() + Duration::from_millis(250);
                        match w.unserved() {
                            None => {
                                w.longest_heal = w.longest_heal.max(w.elapsed() - since);
                                // The operator stops making pageservers active.
                                w.exec.kill(OPERATOR);
                                continue 'cycles;
                            }
                            Some(why) if w.elapsed() - since > HEAL_BOUND => {
                                let world = w.describe();
                                w.checker.report(format!("not served {HEAL_BOUND:?} after healing: {why}\n{world}"));
                                break 'cycles;
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
            if !w.run_instant() {
                break 'cycles;
            }
            w.advance();
        }
    }
    w.outcome(seed)
}

fn config(id: u64, names: &[(String, String)], sites: bool, tenants: &[TenantShardId]) -> ControllerConfig {
    ControllerConfig {
        id,
        listen_http: format!("127.0.0.1:{}", 7000 + id).parse().expect("an address"),
        remote_storage: strata_remote_storage::RemoteStorageConfig::Local { path: "/nonexistent".into() },
        pageservers: names
            .iter()
            .enumerate()
            .map(|(i, (name, http))| PageserverRef {
                name: name.clone(),
                pg: http.clone(),
                http: http.clone(),
                site: sites.then(|| format!("site{}", i % 2)),
            })
            .collect(),
        tenants: tenants.to_vec(),
        auth: None,
        issuer_key: None,
        tls: None,
        // The defaults of `controller.toml`: the timings the process runs with.
        heartbeat_interval: Duration::from_millis(500),
        offline_after: Duration::from_secs(2),
        lease_ttl: Duration::from_secs(6),
        max_http_connections: 16,
        split_policy: Default::default(),
    }
}

impl World {
    fn new(rng: SharedRng, planner: Planner) -> World {
        let clock = ManualClock::new();
        let checker = Arc::new(Checker::default());
        let exec = Executor::new(rng.clone());
        let objects = FakeObjects::new(clock.clone(), rng.clone(), checker.clone(), exec.spawner(STORAGE));
        let pageservers = FakePageservers::new(clock.clone(), rng.clone(), checker.clone());
        let (n_controllers, n_pageservers, n_tenants, sites) = {
            let mut r = rng.lock();
            (r.u64(1..=3), r.usize(2..=4), r.u8(1..=4), r.u32(..10) < 3)
        };
        let names: Vec<(String, String)> =
            (1..=n_pageservers).map(|i| (format!("ps{i}"), format!("10.0.0.{i}:9898"))).collect();
        for (name, http) in &names {
            pageservers.add(name, http);
        }
        let tenants: Vec<TenantShardId> =
            (1..=n_tenants).map(|n| TenantShardId::unsharded(strata_protocol::TenantId([n; 16]))).collect();
        for t in &tenants {
            // Generations issued before there was a controller.
            let g = rng.lock().u32(..4);
            if g > 0 {
                objects.preload(&format!("tenants/{t}/timelines/00/index-{g:08x}.json"), b"{}");
                checker.preexisting(*t, g);
            }
        }
        let slots =
            (1..=n_controllers).map(|id| Slot { conf: config(id, &names, sites, &tenants), running: None }).collect();
        let mut w = World {
            rng,
            clock,
            exec,
            checker,
            objects,
            pageservers,
            names,
            tenants,
            slots,
            paused: Vec::new(),
            restarts: Vec::new(),
            planner,
            next_owner: 10,
            next_fault: Duration::ZERO,
            next_probe: Duration::ZERO,
            longest_heal: Duration::ZERO,
        };
        for i in 0..w.slots.len() {
            w.start(i);
        }
        w
    }

    fn elapsed(&self) -> Duration {
        self.clock.elapsed()
    }

    fn draw(&self, range: std::ops::Range<u64>) -> u64 {
        self.rng.lock().u64(range)
    }

    fn millis(&self, range: std::ops::Range<u64>) -> Duration {
        Duration::from_millis(self.draw(range))
    }

    /// Starts a new incarnation of the controller in slot `i`.
    fn start(&mut self, i: usize) {
        let owner = self.next_owner;
        self.next_owner += 1;
        // Each incarnation's clock runs up to 5% fast or slow.
        let rate = 0.95 + self.rng.lock().f64() / 10.0;
        let env = Env {
            clock: Arc::new(DriftClock::new(self.clock.clone(), rate)),
            store: Store::new(Arc::new(self.objects.clone())),
            pageservers: Arc::new(self.pageservers.clone()),
            spawn: self.exec.spawner(owner),
            seed: self.rng.lock().u64(..),
            planner: self.planner,
        };
        let c = Controller::new(self.slots[i].conf.clone(), env, Default::default());
        self.exec.spawn(owner, Box::pin(c.clone().run()));
        self.slots[i].running = Some((owner, c));
    }

    fn kill(&mut self, i: usize) {
        if let Some((owner, _)) = self.slots[i].running.take() {
            self.exec.kill(owner);
            self.paused.retain(|(o, _)| *o != owner);
        }
    }

    /// Runs every task ready at this instant, checking after each step.
    /// False once a check failed.
    fn run_instant(&mut self) -> bool {
        let mut steps = 0;
        while self.exec.step() {
            steps += 1;
            let leading: Vec<(u64, u64)> = self
                .slots
                .iter()
                .filter_map(|s| s.running.as_ref())
                .filter_map(|(_, c)| c.leading().map(|term| (c.conf.id, term)))
                .collect();
            self.checker.leaders(&leading);
            if steps > MAX_STEPS_AT_ONCE {
                self.checker.report(format!("{steps} steps without time passing: something spins"));
            }
            if !self.checker.violations().is_empty() {
                return false;
            }
        }
        true
    }

    /// Moves time to the next sleep's deadline or the world's next event.
    fn advance(&mut self) {
        let now = self.elapsed();
        let origin = self.clock.now() - now;
        let events = [self.next_fault, self.next_probe].into_iter();
        let events = events.chain(self.paused.iter().map(|(_, at)| *at)).chain(self.restarts.iter().map(|(_, at)| *at));
        let timer = self.clock.next_deadline().map(|d| d - origin);
        // Something always sleeps while a controller runs; a second is a backstop.
        let next = events.chain(timer).filter(|at| *at > now).min().unwrap_or(now + Duration::from_secs(1));
        self.clock.advance_to(origin + next);
    }

    /// Stalled controllers whose pause is over go on; dead ones due start again.
    fn resume_and_restart(&mut self) {
        let now = self.elapsed();
        let (due, later): (Vec<_>, Vec<_>) = self.paused.drain(..).partition(|(_, at)| *at <= now);
        self.paused = later;
        for (owner, _) in due {
            self.exec.resume(owner);
        }
        let (due, later): (Vec<_>, Vec<_>) = self.restarts.drain(..).partition(|(_, at)| *at <= now);
        self.restarts = later;
        for (i, _) in due {
            if self.slots[i].running.is_none() {
                self.start(i);
            }
        }
    }

    /// One fault, when one is due.
    fn chaos(&mut self) {
        if self.elapsed() < self.next_fault {
            return;
        }
        self.next_fault = self.elapsed() + self.millis(200..3000);
        match self.draw(0..100) {
            0..30 => {
                let http = self.names[self.draw(0..self.names.len() as u64) as usize].1.clone();
                let mode = match (self.pageservers.mode(&http), self.draw(0..2)) {
                    (Mode::Up, 0) => Mode::Down,
                    (Mode::Up, _) => Mode::Hung,
                    (Mode::Hung, 0) => Mode::Down,
                    _ => Mode::Up,
                };
                self.pageservers.set_mode(&http, mode);
            }
            30..50 => {
                let i = self.draw(0..self.slots.len() as u64) as usize;
                let owner = self.slots[i].running.as_ref().map(|(o, _)| *o);
                match owner {
                    Some(o) if self.exec.is_paused(o) => {}
                    Some(o) if self.draw(0..10) < 6 => {
                        // Stalls: past a lease sometimes, so that another takes over.
                        self.exec.pause(o);
                        let until = self.elapsed() + self.millis(100..20_000);
                        self.paused.push((o, until));
                    }
                    Some(_) => {
                        self.kill(i);
                        let at = self.elapsed() + self.millis(0..15_000);
                        self.restarts.push((i, at));
                    }
                    None => {}
                }
            }
            50..70 => {
                let health = match self.draw(0..10) {
                    0..5 => Health::Healthy,
                    5..8 => Health::Slow,
                    _ => Health::Failing,
                };
                self.objects.set_health(health);
            }
            70..80 => {
                let name = self.names[self.draw(0..self.names.len() as u64) as usize].0.clone();
                let policy = match self.draw(0..20) {
                    0..10 => PageserverPolicy::Draining,
                    10..17 => PageserverPolicy::Active,
                    _ => PageserverPolicy::Lost,
                };
                self.operator(name, policy);
            }
            80..86 => {
                let t = self.tenants[self.draw(0..self.tenants.len() as u64) as usize];
                self.tenant_call(t);
            }
            _ => {}
        }
    }

    /// An operator deletes `t`, or registers it again once the last state
    /// written has it deleted, through one controller (which refuses it
    /// unless it leads).
    fn tenant_call(&mut self, t: TenantShardId) {
        let i = self.draw(0..self.slots.len() as u64) as usize;
        let Some((_, c)) = self.slots[i].running.clone() else { return };
        let deleted = self.checker.state().is_some_and(|s| s.deleted_tenants.contains_key(&t));
        self.exec.spawn(
            OPERATOR,
            Box::pin(async move {
                if deleted {
                    let _ = c.register_tenant(t).await;
                } else {
                    let _ = c.delete_tenant(t).await;
                }
            }),
        );
    }

    /// An operator's call: sets a policy through one controller (which
    /// refuses it unless it leads).
    fn operator(&mut self, name: String, policy: PageserverPolicy) {
        let i = self.draw(0..self.slots.len() as u64) as usize;
        let Some((_, c)) = self.slots[i].running.clone() else { return };
        self.exec.spawn(
            OPERATOR,
            Box::pin(async move {
                let _ = c.set_policy(&name, policy).await;
            }),
        );
    }

    /// An operator who makes every pageserver active again, and keeps
    /// them so while the world heals (a change from before may land late):
    /// it looks at the state every 250 ms and asks the controllers in turn.
    fn keep_active(&mut self) {
        let controllers: Vec<Arc<Controller>> =
            self.slots.iter().filter_map(|s| s.running.as_ref().map(|(_, c)| c.clone())).collect();
        let (clock, checker) = (self.clock.clone(), self.checker.clone());
        self.exec.spawn(
            OPERATOR,
            Box::pin(async move {
                // Bounded: healing ends long before (`HEAL_BOUND`).
                for i in 0..1000 {
                    let state = checker.state().unwrap_or_default();
                    let not_active = state.pageservers.iter().find(|(_, p)| **p != PageserverPolicy::Active);
                    if let Some((name, _)) = not_active {
                        let c = &controllers[i % controllers.len()];
                        let _ = c.set_policy(name, PageserverPolicy::Active).await;
                    }
                    clock.sleep(Duration::from_millis(250)).await;
                }
            }),
        );
    }

    /// The end of a chaos phase: storage healthy, every stalled controller
    /// going on, some dead ones started again (at least one controller
    /// running), hung pageservers back or dead (at least one up), and every
    /// pageserver made active again.
    fn heal(&mut self) {
        // Changes asked during the chaos stop (one may still land late).
        self.exec.kill(OPERATOR);
        self.objects.set_health(Health::Healthy);
        for (owner, _) in std::mem::take(&mut self.paused) {
            self.exec.resume(owner);
        }
        for (i, _) in std::mem::take(&mut self.restarts) {
            if self.draw(0..2) == 0 && self.slots[i].running.is_none() {
                self.start(i);
            }
        }
        if self.slots.iter().all(|s| s.running.is_none()) {
            let i = self.draw(0..self.slots.len() as u64) as usize;
            self.start(i);
        }
        for (_, http) in self.names.clone() {
            if self.pageservers.mode(&http) == Mode::Hung {
                let mode = if self.draw(0..2) == 0 { Mode::Up } else { Mode::Down };
                self.pageservers.set_mode(&http, mode);
            }
        }
        if self.names.iter().all(|(_, http)| self.pageservers.mode(http) != Mode::Up) {
            let i = self.draw(0..self.names.len() as u64) as usize;
            self.pageservers.set_mode(&self.names[i].1.clone(), Mode::Up);
        }
        self.keep_active();
        self.next_probe = self.elapsed();
    }

    /// Why some tenant is not served now: the state names no attached
    /// pageserver that is up and holds it under its generation (the
    /// current one, or an older one while a move's target catches up), a
    /// deleted one is still held by a pageserver that is up, or a
    /// controller (which computes ask) knows another state.
    fn unserved(&self) -> Option<String> {
        let Some(state) = self.checker.state() else { return Some("no state written".into()) };
        for (_, c) in self.slots.iter().filter_map(|s| s.running.as_ref()) {
            let known = c.status().state.map(|s| s.version);
            if known != Some(state.version) {
                return Some(format!("controller {} knows version {known:?}, storage {}", c.conf.id, state.version));
            }
        }
        for t in &self.tenants {
            if state.deleted_tenants.contains_key(t) {
                // Deleted: no pageserver that is up holds it any more.
                let holder = self.names.iter().find(|(_, http)| {
                    self.pageservers.mode(http) == Mode::Up && self.pageservers.location(http, *t).is_some()
                });
                if let Some((name, http)) = holder {
                    return Some(format!("tenant {t} deleted, {name} holds {:?}", self.pageservers.location(http, *t)));
                }
                continue;
            }
            let Some(p) = state.tenants.get(t) else { return Some(format!("tenant {t} not in the state")) };
            let Some(a) = &p.attached else { return Some(format!("tenant {t} attached nowhere")) };
            let http = &self.names.iter().find(|(n, _)| n == a).expect("a configured pageserver").1;
            if self.pageservers.mode(http) != Mode::Up {
                return Some(format!("tenant {t} attached to {a}, which is {:?}", self.pageservers.mode(http)));
            }
            let serving = match self.pageservers.location(http, *t) {
                Some((LocationMode::Attached, Some(g))) => {
                    g == p.generation || (p.migration.is_some() && g < p.generation)
                }
                _ => false,
            };
            if !serving {
                return Some(format!(
                    "tenant {t}: {a} holds {:?}, the state says generation {} (move: {:?})",
                    self.pageservers.location(http, *t),
                    p.generation,
                    p.migration
                ));
            }
        }
        None
    }

    /// Every controller, pageserver and the state, for a failure's report.
    fn describe(&self) -> String {
        let mut out = String::new();
        for s in &self.slots {
            match &s.running {
                Some((owner, c)) => {
                    let st = c.status();
                    out += &format!(
                        "  controller {}: leading {:?}, term {}, paused {}, last error {:?}\n",
                        s.conf.id,
                        c.leading(),
                        st.leader_term,
                        self.exec.is_paused(*owner),
                        st.last_error
                    );
                    for p in st.pageservers {
                        out += &format!(
                            "    sees {}: {} {:?} {:?}\n",
                            p.name, p.availability, p.policy, p.last_answer_seconds
                        );
                    }
                }
                None => out += &format!("  controller {}: dead\n", s.conf.id),
            }
        }
        for (name, http) in &self.names {
            let held: Vec<_> = self.tenants.iter().map(|t| self.pageservers.location(http, *t)).collect();
            out += &format!("  {name}: {:?}, holds {held:?}\n", self.pageservers.mode(http));
        }
        out += &format!("  state: {:?}", self.checker.state());
        out
    }

    fn outcome(self, seed: u64) -> Outcome {
        let counts = self.checker.counts();
        let mut h = std::hash::DefaultHasher::new();
        (self.exec.polls, self.elapsed(), self.checker.state().map(|s| s.encode()), self.pageservers.attached())
            .hash(&mut h);
        (counts.state_writes, counts.lease_writes, counts.highest_term).hash(&mut h);
        Outcome {
            seed,
            violations: self.checker.violations(),
            simulated: self.elapsed(),
            longest_heal: self.longest_heal,
            counts,
            polls: self.exec.polls,
            digest: h.finish(),
        }
    }
}
