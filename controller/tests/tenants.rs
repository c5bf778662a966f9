//! Tenants registered and deleted through the controller's API
//! (`PUT` and `DELETE /v1/tenant/{tenant}`), on the simulation's fake
//! object storage and pageservers (`sim/`), with its checks of every state
//! written: the controllers run their own loops on a manual clock.

#[allow(dead_code)] // the fakes only: the simulated world and its faults go unused here
mod sim;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sim::checker::Checker;
use sim::executor::Executor;
use sim::objects::FakeObjects;
use sim::pageservers::{FakePageservers, Mode};
use strata_controller::config::ControllerConfig;
use strata_controller::env::Env;
use strata_controller::schedule;
use strata_controller::service::{CallError, Controller, NoAttachment};
use strata_controller::store::Store;
use strata_protocol::api::controller::{ControllerState, DeletedTenant, TenantDeleted, TenantRegistered};
use strata_protocol::api::pageserver::LocationMode;
use strata_protocol::TenantShardId;
use strata_service::clock::{Clock, ManualClock};

/// Heartbeats this far apart: a tenant placed sooner was placed because
/// the API woke the decisions, not because a round came.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Longer than any call to the fakes, shorter than a heartbeat interval.
const AT_ONCE: Duration = Duration::from_millis(400);
const STORAGE: u64 = 0;

/// Controllers, pageservers `ps1`.. and object storage on one manual clock.
struct Rig {
    clock: ManualClock,
    exec: Executor,
    checker: Arc<Checker>,
    objects: FakeObjects,
    pageservers: FakePageservers,
    controllers: Vec<Arc<Controller>>,
}

fn config(id: u64, pageservers: usize, tenants: &[TenantShardId]) -> ControllerConfig {
    let tenants: Vec<String> = tenants.iter().map(|t| format!("\"{t}\"")).collect();
    let mut text = format!(
        "id = {id}\nlisten_http = \"127.0.0.1:{}\"\ntenants = [{}]\nheartbeat_interval = {}\noffline_after = {}\n\
         [remote_storage]\ntype = \"local\"\npath = \"/nonexistent\"\n",
        7000 + id,
        tenants.join(", "),
        HEARTBEAT.as_secs(),
        2 * HEARTBEAT.as_secs(),
    );
    for i in 1..=pageservers {
        text += &format!("[[pageservers]]\nname = \"ps{i}\"\npg = \"ps{i}:0\"\nhttp = \"ps{i}:1\"\n");
    }
    let conf: ControllerConfig = toml::from_str(&text).expect("a config");
    conf.validate().expect("a valid config");
    conf
}

impl Rig {
    /// `controllers` controllers placing `tenants` (their config's list) on
    /// `pageservers` pageservers, their loops running.
    fn new(controllers: u64, pageservers: usize, tenants: &[TenantShardId]) -> Rig {
        let rng: sim::SharedRng = Arc::new(Mutex::new(fastrand::Rng::with_seed(7)));
        let clock = ManualClock::new();
        let checker = Arc::new(Checker::default());
        let mut exec = Executor::new(rng.clone());
        let objects = FakeObjects::new(clock.clone(), rng.clone(), checker.clone(), exec.spawner(STORAGE));
        let fakes = FakePageservers::new(clock.clone(), rng.clone(), checker.clone());
        for i in 1..=pageservers {
            fakes.add(&format!("ps{i}"), &format!("ps{i}:1"));
        }
        let mut started = Vec::new();
        for id in 1..=controllers {
            let env = Env {
                clock: Arc::new(clock.clone()),
                store: Store::new(Arc::new(objects.clone())),
                pageservers: Arc::new(fakes.clone()),
                spawn: exec.spawner(id),
                seed: id,
                planner: schedule::plan,
            };
            let c = Controller::new(config(id, pageservers, tenants), env, Default::default());
            exec.spawn(id, Box::pin(c.clone().run()));
            started.push(c);
        }
        Rig { clock, exec, checker, objects, pageservers: fakes, controllers: started }
    }

    /// Lets `d` of simulated time pass, every task running as it comes due.
    fn run_for(&mut self, d: Duration) {
        let end = self.clock.now() + d;
        loop {
            while self.exec.step() {}
            match self.clock.next_deadline() {
                Some(t) if t <= end => self.clock.advance_to(t),
                _ => break,
            }
        }
        self.clock.advance_to(end);
        while self.exec.step() {}
        assert!(self.checker.violations().is_empty(), "{:?}", self.checker.violations());
    }

    /// Runs until `done` holds, for at most `bound` of simulated time.
    fn run_until(&mut self, what: &str, bound: Duration, mut done: impl FnMut(&Rig) -> bool) {
        let end = self.clock.now() + bound;
        while !done(self) {
            assert!(self.clock.now() < end, "{what} did not happen within {bound:?}: {:?}", self.state());
            self.run_for(Duration::from_millis(50));
        }
    }

    /// Runs `call` to completion as the operator's task, the loops running meanwhile.
    fn call<T: Send + 'static>(&mut self, call: impl std::future::Future<Output = T> + Send + 'static) -> T {
        let out = Arc::new(Mutex::new(None));
        let slot = out.clone();
        self.exec.spawn(
            100,
            Box::pin(async move {
                let r = call.await;
                *slot.lock() = Some(r);
            }),
        );
        self.run_until("the call", Duration::from_secs(30), |_| out.lock().is_some());
        let answer = out.lock().take();
        answer.expect("answered")
    }

    fn register(&mut self, c: usize, t: TenantShardId) -> Result<(bool, TenantRegistered), CallError> {
        let c = self.controllers[c].clone();
        self.call(async move { c.register_tenant(t).await })
    }

    fn delete(&mut self, c: usize, t: TenantShardId) -> Result<TenantDeleted, CallError> {
        let c = self.controllers[c].clone();
        self.call(async move { c.delete_tenant(t).await })
    }

    /// Runs until the decisions change nothing more (moves completed).
    fn settle(&mut self) {
        for _ in 0..20 {
            let version = self.state().version;
            self.run_for(2 * HEARTBEAT);
            if self.state().version == version {
                return;
            }
        }
        panic!("the state keeps changing: {:?}", self.state());
    }

    /// Repeats `DELETE` as its callers do, until no pageserver holds `t`,
    /// for at most `bound`; the last answer.
    fn delete_until_gone(&mut self, c: usize, t: TenantShardId, bound: Duration) -> TenantDeleted {
        let end = self.clock.now() + bound;
        loop {
            let answer = self.delete(c, t).expect("deleted");
            if answer.still_located_on.is_empty() {
                return answer;
            }
            assert!(self.clock.now() < end, "still located after {bound:?}: {answer:?}");
            self.run_for(Duration::from_millis(50));
        }
    }

    /// The state last written.
    fn state(&self) -> ControllerState {
        self.checker.state().unwrap_or_default()
    }

    /// What pageserver `name` holds of `t`.
    fn held(&self, name: &str, t: TenantShardId) -> Option<LocationMode> {
        self.pageservers.location(&http(name), t).map(|(mode, _)| mode)
    }

    /// The controller that leads, once one does.
    fn leader(&mut self) -> usize {
        self.run_until("a leader", Duration::from_secs(20), |r| r.controllers.iter().any(|c| c.leading().is_some()));
        self.controllers.iter().position(|c| c.leading().is_some()).expect("one leads")
    }

    /// Runs until `t` is attached on a pageserver under the state's
    /// generation and has a secondary there too; its (attached, secondary).
    fn served(&mut self, t: TenantShardId) -> (String, String) {
        self.run_until("the tenant served", Duration::from_secs(20), |r| {
            let Some(p) = r.state().tenants.get(&t).cloned() else { return false };
            let (Some(a), Some(s)) = (p.attached, p.secondaries.first().cloned()) else { return false };
            let generation = r.pageservers.location(&http(&a), t).and_then(|l| l.1);
            r.held(&a, t) == Some(LocationMode::Attached)
                && generation == Some(p.generation)
                && r.held(&s, t) == Some(LocationMode::Secondary)
        });
        let p = self.state().tenants[&t].clone();
        (p.attached.expect("attached"), p.secondaries[0].clone())
    }
}

fn tenant(n: u8) -> TenantShardId {
    TenantShardId::unsharded(strata_protocol::TenantId([n; 16]))
}

/// A fake pageserver's HTTP address, by its name.
fn http(name: &str) -> String {
    format!("{name}:1")
}

#[test]
fn a_registered_tenant_is_placed_at_once_and_registering_it_again_changes_nothing() {
    let t = tenant(1);
    let mut rig = Rig::new(1, 2, &[]);
    // Its objects in storage carry generation 5 (made before the controller knew it).
    rig.objects.preload(&format!("tenants/{t}/timelines/00/index-00000005.json"), b"{}");
    rig.checker.preexisting(t, 5);
    let leader = rig.leader();
    rig.run_until("a first state", Duration::from_secs(20), |r| r.checker.state().is_some());
    rig.run_for(2 * HEARTBEAT);

    let (created, answer) = rig.register(leader, t).unwrap();
    assert!(created);
    assert_eq!(answer, TenantRegistered { tenant_id: t, generation: 5 });
    // Placed at once: the decisions were woken, no heartbeat interval passed.
    rig.run_until("the tenant placed", AT_ONCE, |r| r.state().tenants.get(&t).is_some_and(|p| p.attached.is_some()));
    let p = rig.state().tenants[&t].clone();
    assert_eq!(
        (p.generation, p.attached.as_deref(), p.secondaries.as_slice()),
        (6, Some("ps1"), &["ps2".to_string()][..])
    );
    assert_eq!(rig.served(t), ("ps1".into(), "ps2".into()));
    assert_eq!(rig.pageservers.location(&http("ps1"), t), Some((LocationMode::Attached, Some(6))));

    // Again: known, nothing written, the generation as it was.
    rig.settle();
    let version = rig.state().version;
    let (created, answer) = rig.register(leader, t).unwrap();
    assert!(!created);
    assert_eq!(answer, TenantRegistered { tenant_id: t, generation: 6 });
    rig.run_for(2 * HEARTBEAT);
    assert_eq!(rig.state().version, version);
    assert_eq!(rig.state().tenants[&t].generation, 6);
}

#[test]
fn a_deleted_tenant_is_detached_everywhere_and_the_config_does_not_place_it_again() {
    let (t, other) = (tenant(1), tenant(2));
    let mut rig = Rig::new(1, 3, &[t, other]);
    let leader = rig.leader();
    let (attached, down) = rig.served(t);
    rig.served(other);
    // Its secondary goes down, holding it: another pageserver becomes its secondary.
    rig.pageservers.set_mode(&http(&down), Mode::Down);
    let third = ["ps1", "ps2", "ps3"].into_iter().find(|n| *n != attached && *n != down).unwrap().to_string();
    rig.run_until("a new secondary", Duration::from_secs(20), |r| r.held(&third, t) == Some(LocationMode::Secondary));
    let generation = rig.state().tenants[&t].generation;

    let deleted = rig.delete(leader, t).unwrap();
    let mut holders = vec![attached.clone(), third.clone()];
    holders.sort();
    assert_eq!(deleted, TenantDeleted { tenant_id: t, still_located_on: holders, offline: vec![down.clone()] });
    let state = rig.state();
    assert!(!state.tenants.contains_key(&t));
    assert_eq!(state.deleted_tenants[&t].generation, generation);
    // The pageservers that hold it are told to detach it at once; the
    // caller repeats the call until none does, which writes nothing more.
    let again = rig.delete_until_gone(leader, t, AT_ONCE);
    assert_eq!(again, TenantDeleted { tenant_id: t, still_located_on: vec![], offline: vec![down.clone()] });
    assert!(rig.held(&attached, t).is_none() && rig.held(&third, t).is_none());
    rig.settle();
    let version = rig.state().version;
    assert_eq!(rig.delete(leader, t).unwrap(), again);
    assert_eq!(rig.state().version, version, "deleting again writes nothing");
    // The other tenant is served as before.
    assert!(rig.state().tenants[&other].attached.is_some());
    let other_attached = rig.state().tenants[&other].attached.clone().unwrap();
    assert_eq!(rig.held(&other_attached, other), Some(LocationMode::Attached));

    // Computes asking for it are told it was deleted.
    let c = rig.controllers[leader].clone();
    let e = rig.call(async move { c.attachment(t, None, Duration::ZERO, None).await }).unwrap_err();
    assert!(matches!(e, NoAttachment::Deleted(d) if d == t), "{e:?}");
    assert_eq!(e.to_string(), format!("tenant {t} was deleted"));

    // The config lists it, and it stays deleted round after round.
    rig.run_for(5 * HEARTBEAT);
    assert!(!rig.state().tenants.contains_key(&t));
    assert!(rig.state().deleted_tenants.contains_key(&t));

    // The pageserver that was down comes back holding it: it is detached too.
    assert_eq!(rig.held(&down, t), Some(LocationMode::Secondary));
    rig.pageservers.set_mode(&http(&down), Mode::Up);
    rig.run_until("the returning pageserver heard", 2 * HEARTBEAT, |r| {
        r.controllers[leader].status().pageservers.iter().all(|p| p.availability == "online")
    });
    let done = rig.delete_until_gone(leader, t, AT_ONCE);
    assert_eq!(done, TenantDeleted { tenant_id: t, still_located_on: vec![], offline: vec![] });
    assert!(rig.held(&down, t).is_none());
}

#[test]
fn a_tenant_registered_again_after_its_deletion_is_attached_above_its_old_generation() {
    let t = tenant(1);
    let mut rig = Rig::new(1, 2, &[t]);
    let leader = rig.leader();
    let (first, _) = rig.served(t);
    // A failover first, so that its generation is past the first.
    rig.pageservers.set_mode(&http(&first), Mode::Down);
    rig.run_until("the failover", Duration::from_secs(20), |r| {
        r.state().tenants[&t].attached.as_deref().is_some_and(|a| a != first)
    });
    rig.pageservers.set_mode(&http(&first), Mode::Up);
    rig.served(t);
    let old = rig.state().tenants[&t].generation;
    assert!(old >= 2, "{old}");

    rig.delete_until_gone(leader, t, AT_ONCE);
    assert!(rig.held("ps1", t).is_none() && rig.held("ps2", t).is_none());
    // Storage holds nothing of it: its generation comes from the tombstone.
    let (created, answer) = rig.register(leader, t).unwrap();
    assert!(created);
    assert_eq!(answer.generation, old);
    assert!(rig.state().deleted_tenants.is_empty());
    let (attached, _) = rig.served(t);
    let now = rig.state().tenants[&t].generation;
    assert_eq!(now, old + 1);
    assert_eq!(rig.pageservers.location(&http(&attached), t), Some((LocationMode::Attached, Some(now))));
    // Its attachment is answered again.
    let c = rig.controllers[leader].clone();
    let a = rig.call(async move { c.attachment(t, None, Duration::ZERO, None).await }).unwrap();
    assert_eq!((a.pageserver, a.generation), (attached, now));
}

#[test]
fn a_follower_refuses_both_calls_and_names_the_leader() {
    let t = tenant(1);
    let mut rig = Rig::new(2, 2, &[]);
    let leader = rig.leader();
    let follower = 1 - leader;
    rig.run_for(2 * HEARTBEAT);
    let address = format!("127.0.0.1:{}", 7000 + leader + 1);
    for e in [rig.register(follower, t).map(|_| ()).unwrap_err(), rig.delete(follower, t).map(|_| ()).unwrap_err()] {
        assert!(matches!(&e, CallError::NotLeader(Some(a)) if *a == address), "{e:?}");
        assert!(e.to_string().contains(&address), "{e}");
    }
    assert!(rig.state().tenants.is_empty() && rig.state().deleted_tenants.is_empty());
    // The leader does both.
    assert!(rig.register(leader, t).unwrap().0);
    let generation = rig.state().tenants[&t].generation;
    rig.delete(leader, t).unwrap();
    let state = rig.state();
    assert!(!state.tenants.contains_key(&t));
    assert_eq!(state.deleted_tenants[&t], DeletedTenant { generation, version: state.version });
}

#[test]
fn a_sharded_tenant_is_answered_by_its_bare_id_once_every_shard_is_attached_each_on_its_own_pageserver() {
    let t = strata_protocol::TenantId([4; 16]);
    let shard = move |n| TenantShardId { tenant: t, shard: strata_protocol::shard::ShardIndex::new(n, 3).unwrap() };
    let mut rig = Rig::new(1, 3, &[]);
    let leader = rig.leader();
    rig.run_until("a first state", Duration::from_secs(20), |r| r.checker.state().is_some());
    let c = rig.controllers[leader].clone();
    let bare = TenantShardId::unsharded(t);
    // Two of three shards registered: the tenant is not answered yet.
    for n in 0..2 {
        assert!(rig.register(leader, shard(n)).unwrap().0);
    }
    rig.settle();
    let c2 = c.clone();
    let e = rig.call(async move { c2.attachment(bare, None, Duration::ZERO, None).await }).unwrap_err();
    assert!(matches!(e, NoAttachment::NotAttached(x) if x == bare), "{e:?}");
    assert!(rig.register(leader, shard(2)).unwrap().0);
    let mut on = Vec::new();
    for n in 0..3 {
        on.push(rig.served(shard(n)).0);
    }
    let c2 = c.clone();
    let a = rig.call(async move { c2.attachment(bare, None, Duration::ZERO, None).await }).unwrap();
    assert_eq!(a.tenant_id, bare);
    let named: Vec<(TenantShardId, String)> = a.shards.iter().map(|s| (s.shard, s.pageserver.clone())).collect();
    assert_eq!(named, (0..3).map(|n| (shard(n), on[n as usize].clone())).collect::<Vec<_>>());
    assert_eq!((a.pageserver.as_str(), a.generation), (on[0].as_str(), a.shards[0].generation));
    let mut distinct = on.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "one pageserver per shard: {on:?}");
    // One shard asked by its own id: that shard alone.
    let c2 = c.clone();
    let one = rig.call(async move { c2.attachment(shard(1), None, Duration::ZERO, None).await }).unwrap();
    assert!(one.shards.is_empty());
    assert_eq!((one.tenant_id, one.pageserver), (shard(1), on[1].clone()));
}
