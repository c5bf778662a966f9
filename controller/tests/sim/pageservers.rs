//! Fake pageservers: each holds a location per tenant with the real
//! pageserver's rules (an attachment under an older generation than the
//! one held is refused; a secondary, reader or detach drops it), and is up,
//! hung (calls time out; location changes wait and take effect when it
//! comes back, after their caller gave up) or down (connection refused;
//! what it holds survives, as in its attachment file).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_controller::client::Pageservers;
use strata_controller::tasks::BoxFuture;
use strata_protocol::api::pageserver::{LocationMode, LocationRequest, LocationStatus, PageserverStatus};
use strata_protocol::{NodeId, TenantShardId};
use strata_service::clock::{self, Clock, ManualClock};
use tokio::sync::oneshot;

use super::checker::Checker;
use super::SharedRng;

/// How a pageserver behaves for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Up,
    Hung,
    Down,
}

/// The controller's bounds on its calls (`lib.rs`, `client.rs`).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
const LOCATION_TIMEOUT: Duration = Duration::from_secs(120);

type Answer = oneshot::Sender<Result<LocationStatus, String>>;

struct Server {
    name: String,
    mode: Mode,
    /// Mode and generation per tenant.
    locations: BTreeMap<TenantShardId, (LocationMode, Option<u32>)>,
    /// Location changes that arrived while hung.
    queued: Vec<(TenantShardId, LocationRequest, Answer)>,
    /// Counts restarts, so that an answer from before one is lost.
    incarnation: u64,
}

impl Server {
    /// The real pageserver's rules (`pageserver/src/tenants/locations.rs`).
    fn set(
        &mut self,
        tenant: TenantShardId,
        req: LocationRequest,
        checker: &Checker,
    ) -> Result<LocationStatus, String> {
        let current =
            self.locations.get(&tenant).and_then(|(m, g)| (*m == LocationMode::Attached).then_some(*g)).flatten();
        match req.mode {
            LocationMode::Attached => {
                let g = req.generation.ok_or("an attached location needs a generation")?;
                match current {
                    Some(c) if c > g => return Err(format!("already attached under {c}, newer than {g}")),
                    Some(c) if c == g => {}
                    _ => {
                        checker.attached(&self.name, tenant, g);
                        self.locations.insert(tenant, (LocationMode::Attached, Some(g)));
                    }
                }
            }
            LocationMode::Detached => {
                self.locations.remove(&tenant);
            }
            mode => {
                self.locations.insert(tenant, (mode, None));
            }
        }
        Ok(self.status_of(tenant))
    }

    fn status_of(&self, tenant: TenantShardId) -> LocationStatus {
        let (mode, generation) = self.locations.get(&tenant).copied().unwrap_or((LocationMode::Detached, None));
        LocationStatus {
            tenant_id: tenant,
            mode,
            generation,
            local_layers: 0,
            local_layer_bytes: 0,
            heatmap_age_seconds: None,
            error: None,
        }
    }

    fn status(&self, id: u64) -> PageserverStatus {
        PageserverStatus {
            id: NodeId(id),
            listen_pg: "127.0.0.1:1".parse().expect("an address"),
            listen_http: "127.0.0.1:1".parse().expect("an address"),
            safekeepers: Vec::new(),
            data_dir: "/nonexistent".into(),
            remote_storage: None,
            timelines: Vec::new(),
            locations: self.locations.keys().map(|t| self.status_of(*t)).collect(),
        }
    }
}

/// Every pageserver of a run, by HTTP address.
#[derive(Clone)]
pub struct FakePageservers {
    clock: ManualClock,
    rng: SharedRng,
    checker: Arc<Checker>,
    servers: Arc<Mutex<BTreeMap<String, Server>>>,
}

impl FakePageservers {
    pub fn new(clock: ManualClock, rng: SharedRng, checker: Arc<Checker>) -> FakePageservers {
        FakePageservers { clock, rng, checker, servers: Default::default() }
    }

    pub fn add(&self, name: &str, http: &str) {
        let server = Server {
            name: name.into(),
            mode: Mode::Up,
            locations: BTreeMap::new(),
            queued: Vec::new(),
            incarnation: 0,
        };
        self.servers.lock().insert(http.into(), server);
    }

    pub fn mode(&self, http: &str) -> Mode {
        self.servers.lock()[http].mode
    }

    /// Changes how `http` behaves: coming back from a hang, it applies
    /// what waited; dying drops it (the callers see the connection reset).
    pub fn set_mode(&self, http: &str, mode: Mode) {
        let mut servers = self.servers.lock();
        let s = servers.get_mut(http).expect("a simulated pageserver");
        let was = std::mem::replace(&mut s.mode, mode);
        if mode == Mode::Down && was != Mode::Down {
            s.incarnation += 1;
            s.queued.clear();
        }
        if mode == Mode::Up && was == Mode::Hung {
            for (tenant, req, answer) in std::mem::take(&mut s.queued) {
                // The caller may have given up: the change happens anyway.
                let _ = answer.send(s.set(tenant, req, &self.checker));
            }
        }
    }

    /// What `http` holds of `tenant` now.
    pub fn location(&self, http: &str, tenant: TenantShardId) -> Option<(LocationMode, Option<u32>)> {
        self.servers.lock()[http].locations.get(&tenant).copied()
    }

    /// Every attached location now: (pageserver, tenant, generation).
    pub fn attached(&self) -> Vec<(String, TenantShardId, u32)> {
        let servers = self.servers.lock();
        let mut out = Vec::new();
        for s in servers.values() {
            for (t, (m, g)) in &s.locations {
                if let (LocationMode::Attached, Some(g)) = (m, g) {
                    out.push((s.name.clone(), *t, *g));
                }
            }
        }
        out
    }

    fn latency(&self) -> Duration {
        Duration::from_millis(self.rng.lock().u64(1..30))
    }
}

impl Pageservers for FakePageservers {
    fn status<'a>(&'a self, http: &'a str) -> BoxFuture<'a, Result<PageserverStatus, String>> {
        Box::pin(async move {
            let there = self.latency();
            self.clock.sleep(there).await;
            let (mode, status) = {
                let servers = self.servers.lock();
                let s = &servers[http];
                (s.mode, (s.mode == Mode::Up).then(|| s.status(s.incarnation)))
            };
            match mode {
                Mode::Up => {
                    self.clock.sleep(self.latency()).await;
                    Ok(status.expect("up"))
                }
                Mode::Down => Err(format!("{http}: connection refused")),
                Mode::Hung => {
                    self.clock.sleep(HEARTBEAT_TIMEOUT.saturating_sub(there)).await;
                    Err(format!("{http}: timed out"))
                }
            }
        })
    }

    fn set_location<'a>(
        &'a self,
        http: &'a str,
        tenant: TenantShardId,
        req: LocationRequest,
    ) -> BoxFuture<'a, Result<LocationStatus, String>> {
        Box::pin(async move {
            let there = self.latency();
            self.clock.sleep(there).await;
            let waiting = {
                let mut servers = self.servers.lock();
                let s = servers.get_mut(http).expect("a simulated pageserver");
                match s.mode {
                    Mode::Down => return Err(format!("{http}: connection refused")),
                    Mode::Up => Ok((s.set(tenant, req, &self.checker), s.incarnation)),
                    Mode::Hung => {
                        let (tx, rx) = oneshot::channel();
                        s.queued.push((tenant, req, tx));
                        Err(rx)
                    }
                }
            };
            match waiting {
                Ok((answer, incarnation)) => {
                    // An attach takes a while (it reads every index).
                    let work = Duration::from_millis(self.rng.lock().u64(1..300));
                    self.clock.sleep(work).await;
                    if self.servers.lock()[http].incarnation != incarnation {
                        return Err(format!("{http}: connection reset"));
                    }
                    answer
                }
                Err(rx) => match clock::timeout(&self.clock, LOCATION_TIMEOUT - there, rx).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(_)) => Err(format!("{http}: connection reset")),
                    Err(_) => Err(format!("{http}: timed out")),
                },
            }
        })
    }
}
