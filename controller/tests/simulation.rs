//! The storage controller in a deterministic simulation (`sim/`): each
//! seed is a run of faults on a simulated clock, checked after every step.
//! A failing seed is printed; `STRATA_TEST_SEED=<seed>` replays it alone.
//! `STRATA_SIM_SEEDS=<n>` runs more seeds (the default keeps the test short).

mod sim;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use sim::world::{self, Outcome};
use strata_controller::schedule::{self, View};
use strata_protocol::api::controller::ControllerState;
use strata_service::clock::{Clock, SystemClock};

/// Seeds a plain `cargo test` runs.
const DEFAULT_SEEDS: u64 = 1000;
/// How many seeds to run instead.
const SEEDS_VAR: &str = "STRATA_SIM_SEEDS";

fn parse_number(var: &str, text: &str) -> u64 {
    let text = text.trim();
    let n = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    n.unwrap_or_else(|_| panic!("{var}={text:?} is not a number"))
}

/// The seeds to run: the one `STRATA_TEST_SEED` names, else `0..STRATA_SIM_SEEDS`.
fn seeds() -> Vec<u64> {
    let var = strata_test_support::rng::SEED_VAR;
    if let Ok(text) = std::env::var(var) {
        return vec![parse_number(var, &text)];
    }
    let n = std::env::var(SEEDS_VAR).map_or(DEFAULT_SEEDS, |t| parse_number(SEEDS_VAR, &t));
    (0..n).collect()
}

/// Runs one seed; a panic (a controller's own assertion) counts as a violation.
fn run_one(seed: u64, planner: schedule::Planner) -> Outcome {
    match std::panic::catch_unwind(|| world::run(seed, planner)) {
        Ok(o) => o,
        Err(p) => Outcome {
            seed,
            violations: vec![format!("panicked: {}", strata_service::panic_message(&*p))],
            simulated: Duration::ZERO,
            longest_heal: Duration::ZERO,
            counts: Default::default(),
            polls: 0,
            digest: 0,
        },
    }
}

/// Runs `seeds` on every core; with `report`, each failure is printed with its seed.
fn run_all(seeds: &[u64], planner: schedule::Planner, report: bool) -> Vec<Outcome> {
    let next = AtomicU64::new(0);
    let out = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(seeds.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(seed) = seeds.get(i) else { break };
                let o = run_one(*seed, planner);
                if report && !o.violations.is_empty() {
                    eprintln!(
                        "seed {seed} failed at {:?} of simulated time (replay: {}={seed}):\n  {}",
                        o.simulated,
                        strata_test_support::rng::SEED_VAR,
                        o.violations.join("\n  ")
                    );
                }
                out.lock().push(o);
            });
        }
    });
    let mut out = out.into_inner();
    out.sort_by_key(|o| o.seed);
    out
}

#[test]
fn every_seed_keeps_the_invariants() {
    let seeds = seeds();
    let started = SystemClock.now();
    let outcomes = run_all(&seeds, schedule::plan, true);
    let took = SystemClock.since(started);
    let failed: Vec<u64> = outcomes.iter().filter(|o| !o.violations.is_empty()).map(|o| o.seed).collect();
    let simulated: Duration = outcomes.iter().map(|o| o.simulated).sum();
    let longest = outcomes.iter().map(|o| o.longest_heal).max().unwrap_or_default();
    let sum = |f: fn(&Outcome) -> u64| outcomes.iter().map(f).sum::<u64>();
    eprintln!(
        "simulation: {} seeds in {took:.1?} ({simulated:.0?} simulated): {} state writes, {} lease writes, \
         {} generations accepted, {} tenants deleted, {} registered again, {} steps; longest healing \
         {longest:.1?} (bound {:?})",
        seeds.len(),
        sum(|o| o.counts.state_writes),
        sum(|o| o.counts.lease_writes),
        sum(|o| o.counts.generations_accepted),
        sum(|o| o.counts.deletions),
        sum(|o| o.counts.registrations_again),
        sum(|o| o.polls),
        world::HEAL_BOUND,
    );
    assert!(failed.is_empty(), "seeds that failed: {failed:?}");
    // The runs did something: leaders were replaced, generations moved,
    // tenants were deleted and registered again.
    if seeds.len() >= 50 {
        assert!(outcomes.iter().any(|o| o.counts.highest_term >= 3), "no run replaced its leader twice");
        assert!(sum(|o| o.counts.generations_accepted) > seeds.len() as u64 * 2);
        assert!(sum(|o| o.counts.deletions) >= seeds.len() as u64 / 4);
        assert!(sum(|o| o.counts.registrations_again) >= seeds.len() as u64 / 50);
    }
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 2, 3] {
        let (a, b) = (run_one(seed, schedule::plan), run_one(seed, schedule::plan));
        assert_eq!((a.digest, a.polls, a.simulated), (b.digest, b.polls, b.simulated), "seed {seed}");
    }
    assert_ne!(run_one(1, schedule::plan).digest, run_one(2, schedule::plan).digest);
}

/// The decision rule with a bug: a tenant attached elsewhere (a failover,
/// a move) keeps its generation.
fn skips_the_generation_bump(state: &ControllerState, view: &View) -> Option<ControllerState> {
    let mut next = schedule::plan(state, view)?;
    for (t, p) in next.tenants.iter_mut() {
        if let Some(before) = state.tenants.get(t).filter(|b| b.attached.is_some()) {
            p.generation = before.generation;
        }
    }
    (next != *state).then_some(next)
}

#[test]
fn the_checks_catch_a_rule_that_skips_the_generation_bump() {
    let seeds: Vec<u64> = (0..40).collect();
    let outcomes = run_all(&seeds, skips_the_generation_bump, false);
    let caught: Vec<&Outcome> = outcomes.iter().filter(|o| !o.violations.is_empty()).collect();
    assert!(caught.len() >= seeds.len() / 2, "only {} of {} runs caught it", caught.len(), seeds.len());
    for o in caught {
        assert!(o.violations[0].contains("generation"), "seed {}: {:?}", o.seed, o.violations);
    }
}

/// Polls `f` to completion, moving `clock` to the next deadline whenever it waits.
fn drive<F: Future>(clock: &strata_service::clock::ManualClock, exec: &mut sim::executor::Executor, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return v;
        }
        while exec.step() {}
        clock.advance_to(clock.next_deadline().expect("something waits on the clock"));
    }
}

#[test]
fn the_rounds_can_be_called_one_at_a_time() {
    use sim::{checker::Checker, executor::Executor, objects::FakeObjects, pageservers::FakePageservers};
    use strata_controller::{config, env::Env, service::Controller, store::Store};

    let rng: sim::SharedRng = Arc::new(Mutex::new(fastrand::Rng::with_seed(5)));
    let clock = strata_service::clock::ManualClock::new();
    let checker = Arc::new(Checker::default());
    let mut exec = Executor::new(rng.clone());
    let objects = FakeObjects::new(clock.clone(), rng.clone(), checker.clone(), exec.spawner(0));
    let pageservers = FakePageservers::new(clock.clone(), rng.clone(), checker.clone());
    pageservers.add("ps1", "ps1:1");
    pageservers.add("ps2", "ps2:1");
    let tenant = strata_protocol::TenantShardId::unsharded(strata_protocol::TenantId([9; 16]));
    let conf: config::ControllerConfig = toml::from_str(&format!(
        "id = 1\nlisten_http = \"127.0.0.1:7000\"\ntenants = [\"{tenant}\"]\n\
         [remote_storage]\ntype = \"local\"\npath = \"/nonexistent\"\n\
         [[pageservers]]\nname = \"ps1\"\npg = \"ps1:0\"\nhttp = \"ps1:1\"\n\
         [[pageservers]]\nname = \"ps2\"\npg = \"ps2:0\"\nhttp = \"ps2:1\"\n"
    ))
    .unwrap();
    let env = Env {
        clock: Arc::new(clock.clone()),
        store: Store::new(Arc::new(objects)),
        pageservers: Arc::new(pageservers.clone()),
        spawn: exec.spawner(1),
        seed: 5,
        planner: schedule::plan,
    };
    let c = Controller::new(conf, env, Default::default());
    drive(&clock, &mut exec, c.lease_round());
    assert_eq!(c.leading(), Some(1));
    drive(&clock, &mut exec, c.heartbeat_round());
    // Before a whole offline period nothing is placed; then the tenant is.
    clock.advance(Duration::from_secs(2));
    drive(&clock, &mut exec, c.lease_round());
    drive(&clock, &mut exec, c.heartbeat_round());
    drive(&clock, &mut exec, c.decision_round());
    let state = checker.state().expect("the state was written");
    assert_eq!(state.tenants[&tenant].attached.as_deref(), Some("ps1"));
    assert_eq!(state.tenants[&tenant].secondaries, ["ps2"]);
    // The location calls were spawned; run them and the pageservers hold it.
    while exec.step() {}
    for _ in 0..100 {
        if pageservers.location("ps1:1", tenant).is_some() {
            break;
        }
        clock.advance_to(clock.next_deadline().unwrap_or(clock.now() + Duration::from_millis(10)));
        while exec.step() {}
    }
    let attached = strata_protocol::api::pageserver::LocationMode::Attached;
    assert_eq!(pageservers.location("ps1:1", tenant), Some((attached, Some(1))));
    // ps1 stops answering: a whole offline period later, ps2 is attached under generation 2.
    pageservers.set_mode("ps1:1", sim::pageservers::Mode::Down);
    for _ in 0..6 {
        clock.advance(Duration::from_millis(500));
        drive(&clock, &mut exec, c.lease_round());
        drive(&clock, &mut exec, c.heartbeat_round());
        drive(&clock, &mut exec, c.decision_round());
    }
    let state = checker.state().unwrap();
    assert_eq!((state.tenants[&tenant].attached.as_deref(), state.tenants[&tenant].generation), (Some("ps2"), 2));
    assert!(checker.violations().is_empty(), "{:?}", checker.violations());
}
