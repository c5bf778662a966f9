//! Fake object storage with conditional writes: healthy (milliseconds),
//! slow (up to seconds, past the controller's attempt timeouts, with
//! writes that land after their caller gave up) or failing (and a failed
//! write sometimes lands anyway: its answer was lost). Every write that
//! lands is shown to the checker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_controller::store::{Objects, StoreError};
use strata_controller::tasks::{BoxFuture, Spawn};
use strata_remote_storage::cas::ObjectVersion;
use strata_service::clock::{Clock, ManualClock};

use super::checker::Checker;
use super::SharedRng;

/// How the storage behaves for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Slow,
    Failing,
}

/// The longest a call of the real store takes before it fails: two
/// attempts of 2 s and a pause between them (`store.rs`).
const CALL_BOUND: Duration = Duration::from_millis(4200);

struct Inner {
    objects: BTreeMap<String, (Bytes, u64)>,
    next_version: u64,
    health: Health,
}

/// The storage every controller of a run shares.
#[derive(Clone)]
pub struct FakeObjects {
    clock: ManualClock,
    rng: SharedRng,
    checker: Arc<Checker>,
    /// Writes that land after their caller gave up run as its tasks.
    spawn: Arc<dyn Spawn>,
    inner: Arc<Mutex<Inner>>,
}

impl FakeObjects {
    pub fn new(clock: ManualClock, rng: SharedRng, checker: Arc<Checker>, spawn: Arc<dyn Spawn>) -> FakeObjects {
        let inner = Inner { objects: BTreeMap::new(), next_version: 1, health: Health::Healthy };
        FakeObjects { clock, rng, checker, spawn, inner: Arc::new(Mutex::new(inner)) }
    }

    pub fn set_health(&self, health: Health) {
        self.inner.lock().health = health;
    }

    /// Puts an object there directly (what existed before the controllers).
    pub fn preload(&self, key: &str, bytes: &[u8]) {
        let mut inner = self.inner.lock();
        let v = inner.next_version;
        inner.next_version += 1;
        inner.objects.insert(key.to_string(), (Bytes::copy_from_slice(bytes), v));
    }

    /// How long the next call takes, and whether it fails.
    fn draw(&self) -> (Duration, Health) {
        let health = self.inner.lock().health;
        let mut rng = self.rng.lock();
        let latency = match health {
            Health::Healthy | Health::Failing => Duration::from_millis(rng.u64(1..40)),
            // Mostly below the bound, sometimes past it.
            Health::Slow => Duration::from_millis(rng.u64(100..6000)),
        };
        (latency, health)
    }

    /// A point within `latency` (where the call takes effect).
    fn split(&self, latency: Duration) -> (Duration, Duration) {
        let before = latency.mul_f64(self.rng.lock().f64());
        (before, latency - before)
    }

    /// The conditional write itself, at the instant it lands.
    fn land(&self, key: &str, bytes: Bytes, expected: Option<&ObjectVersion>) -> Result<ObjectVersion, StoreError> {
        let mut inner = self.inner.lock();
        let current = inner.objects.get(key).map(|(_, v)| v.to_string());
        if current.as_deref() != expected.map(|v| v.0.as_str()) {
            return Err(StoreError::Conflict(format!("{key}: expected {expected:?}, is {current:?}")));
        }
        let v = inner.next_version;
        inner.next_version += 1;
        inner.objects.insert(key.to_string(), (bytes.clone(), v));
        drop(inner);
        self.checker.object_written(key, &bytes, self.clock.now());
        Ok(ObjectVersion(v.to_string()))
    }

    fn chance(&self, percent: u64) -> bool {
        self.rng.lock().u64(..100) < percent
    }
}

impl Objects for FakeObjects {
    fn describe(&self) -> String {
        "simulated object storage".into()
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<(Bytes, ObjectVersion)>, StoreError>> {
        Box::pin(async move {
            let (latency, health) = self.draw();
            if health == Health::Failing || latency > CALL_BOUND {
                self.clock.sleep(latency.min(CALL_BOUND)).await;
                return Err(StoreError::Failed(format!("{key}: simulated failure")));
            }
            let (before, after) = self.split(latency);
            self.clock.sleep(before).await;
            let got = self.inner.lock().objects.get(key).map(|(b, v)| (b.clone(), ObjectVersion(v.to_string())));
            self.clock.sleep(after).await;
            Ok(got)
        })
    }

    fn put_if<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        expected: Option<&'a ObjectVersion>,
    ) -> BoxFuture<'a, Result<ObjectVersion, StoreError>> {
        Box::pin(async move {
            let (latency, health) = self.draw();
            let (before, after) = self.split(latency);
            if health == Health::Failing {
                self.clock.sleep(before).await;
                // Sometimes it landed, and only the answer was lost.
                if self.chance(20) {
                    let _ = self.land(key, bytes, expected);
                }
                self.clock.sleep(after).await;
                return Err(StoreError::Failed(format!("{key}: simulated failure")));
            }
            if latency > CALL_BOUND {
                // The caller gives up; the write may still land later.
                if before <= CALL_BOUND {
                    self.clock.sleep(before).await;
                    let _ = self.land(key, bytes, expected);
                } else if self.chance(50) {
                    let (me, key, expected) = (self.clone(), key.to_string(), expected.cloned());
                    let clock = self.clock.clone();
                    let late = before - CALL_BOUND;
                    self.spawn.spawn(Box::pin(async move {
                        clock.sleep(CALL_BOUND + late).await;
                        let _ = me.land(&key, bytes, expected.as_ref());
                    }));
                }
                let spent = if before <= CALL_BOUND { before } else { Duration::ZERO };
                self.clock.sleep(CALL_BOUND - spent).await;
                return Err(StoreError::Failed(format!("{key}: simulated timeout")));
            }
            self.clock.sleep(before).await;
            let r = self.land(key, bytes, expected);
            self.clock.sleep(after).await;
            r
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let (latency, health) = self.draw();
            self.clock.sleep(latency.min(CALL_BOUND)).await;
            if health == Health::Failing || latency > CALL_BOUND {
                return Err(StoreError::Failed(format!("{prefix}: simulated failure")));
            }
            let dir = format!("{prefix}/");
            Ok(self.inner.lock().objects.keys().filter(|k| k.starts_with(&dir)).cloned().collect())
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.inner.lock().objects.remove(key);
            Ok(())
        })
    }
}
