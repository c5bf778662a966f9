//! The invariants, checked as the simulated world changes: on every
//! object written, every attachment a pageserver accepts, and after every
//! step of the executor. The rules are restated here rather than taken
//! from the controller, so that a broken rule there is seen here.

use std::collections::BTreeMap;
use std::time::Instant;

use parking_lot::Mutex;
use strata_controller::store::LeaderLease;
use strata_protocol::api::controller::{ControllerState, TenantPlacement, LEADER_KEY, STATE_KEY};
use strata_protocol::TenantShardId;

/// What the world has done so far, and what it must not do.
#[derive(Default)]
pub struct Checker {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    violations: Vec<String>,
    /// The state last written.
    state: Option<ControllerState>,
    /// The pageserver each (tenant, generation) was given to by a state.
    issued: BTreeMap<(TenantShardId, u32), String>,
    /// The pageserver that accepted each (tenant, generation).
    accepted: BTreeMap<(TenantShardId, u32), String>,
    /// The highest generation in object storage before any controller.
    preexisting: BTreeMap<TenantShardId, u32>,
    lease: Option<LeaderLease>,
    /// Counts, for the summary.
    state_writes: u64,
    lease_writes: u64,
    deletions: u64,
    registrations_again: u64,
}

/// What a run did, in numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub state_writes: u64,
    pub lease_writes: u64,
    pub generations_accepted: u64,
    pub highest_term: u64,
    /// Tenants deleted, and deleted ones registered again.
    pub deletions: u64,
    pub registrations_again: u64,
}

/// The pageserver a placement's generation is for: a move's target, else the attached one.
fn holder(p: &TenantPlacement) -> Option<&String> {
    p.migration.as_ref().map(|m| &m.to).or(p.attached.as_ref())
}

impl Checker {
    fn violation(&self, message: String) {
        self.inner.lock().violations.push(message);
    }

    /// The violations seen so far.
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().violations.clone()
    }

    pub fn counts(&self) -> Counts {
        let inner = self.inner.lock();
        Counts {
            state_writes: inner.state_writes,
            lease_writes: inner.lease_writes,
            generations_accepted: inner.accepted.len() as u64,
            highest_term: inner.lease.as_ref().map_or(0, |l| l.term),
            deletions: inner.deletions,
            registrations_again: inner.registrations_again,
        }
    }

    /// The generations object storage held of `tenant` before the controllers.
    pub fn preexisting(&self, tenant: TenantShardId, generation: u32) {
        self.inner.lock().preexisting.insert(tenant, generation);
    }

    /// The state as last written.
    pub fn state(&self) -> Option<ControllerState> {
        self.inner.lock().state.clone()
    }

    /// An object landed in storage.
    pub fn object_written(&self, key: &str, bytes: &[u8], _at: Instant) {
        if key == STATE_KEY {
            match ControllerState::decode(bytes) {
                Ok(s) => self.state_written(s),
                Err(e) => self.violation(format!("the state written does not decode: {e}")),
            }
        } else if key == LEADER_KEY {
            match serde_json::from_slice::<LeaderLease>(bytes) {
                Ok(l) => self.lease_written(l),
                Err(e) => self.violation(format!("the lease written does not decode: {e}")),
            }
        }
    }

    fn state_written(&self, next: ControllerState) {
        let mut inner = self.inner.lock();
        inner.state_writes += 1;
        let mut bad = Vec::new();
        let (prev_version, prev_term) = inner.state.as_ref().map_or((0, 0), |s| (s.version, s.leader_term));
        if next.version != prev_version + 1 {
            bad.push(format!("state version {} follows {prev_version}", next.version));
        }
        if next.leader_term < prev_term {
            bad.push(format!("state of term {} written after term {prev_term}", next.leader_term));
        }
        let (mut deleted, mut again) = (0, 0);
        if let Some(prev) = &inner.state {
            for (t, p) in &prev.tenants {
                let Some(n) = next.tenants.get(t) else {
                    // Only a deletion removes a tenant, and its tombstone keeps the generation.
                    match next.deleted_tenants.get(t) {
                        Some(d) if d.generation >= p.generation => {}
                        Some(d) => bad.push(format!(
                            "tenant {t}: deleted with generation {}, placed under {}",
                            d.generation, p.generation
                        )),
                        None => bad.push(format!("tenant {t} dropped from the state without a tombstone")),
                    }
                    continue;
                };
                if n.generation < p.generation {
                    bad.push(format!("tenant {t}: generation {} after {}", n.generation, p.generation));
                }
                if p.attached.is_some() && n.attached.is_none() {
                    bad.push(format!("tenant {t}: attachment lost (was {:?})", p.attached));
                }
            }
            // A tenant registered again starts above its tombstone.
            for (t, d) in &prev.deleted_tenants {
                let Some(n) = next.tenants.get(t) else { continue };
                again += 1;
                if n.generation < d.generation {
                    bad.push(format!(
                        "tenant {t}: placed again under {}, deleted under {}",
                        n.generation, d.generation
                    ));
                }
            }
            deleted = next.deleted_tenants.keys().filter(|t| !prev.deleted_tenants.contains_key(t)).count() as u64;
        }
        inner.deletions += deleted;
        inner.registrations_again += again;
        for (t, p) in &next.tenants {
            if p.attached.is_some() && p.generation <= inner.preexisting.get(t).copied().unwrap_or(0) {
                bad.push(format!(
                    "tenant {t}: attached under generation {}, not above the {} storage held",
                    p.generation,
                    inner.preexisting.get(t).copied().unwrap_or(0)
                ));
            }
            if let Some(h) = holder(p) {
                match inner.issued.get(&(*t, p.generation)) {
                    Some(before) if before != h => bad.push(format!(
                        "tenant {t}: generation {} given to {h}, already given to {before}",
                        p.generation
                    )),
                    _ => {
                        inner.issued.insert((*t, p.generation), h.clone());
                    }
                }
            }
        }
        inner.state = Some(next);
        inner.violations.extend(bad);
    }

    fn lease_written(&self, next: LeaderLease) {
        let mut inner = self.inner.lock();
        inner.lease_writes += 1;
        if let Some(prev) = &inner.lease {
            if next.term < prev.term || (next.term == prev.term && next.holder != prev.holder) {
                let message = format!(
                    "lease of term {} for {} after term {} of {}",
                    next.term, next.holder, prev.term, prev.holder
                );
                inner.violations.push(message);
            }
        }
        inner.lease = Some(next);
    }

    /// `pageserver` accepted an attachment of `tenant` under `generation`.
    pub fn attached(&self, pageserver: &str, tenant: TenantShardId, generation: u32) {
        let mut inner = self.inner.lock();
        match inner.issued.get(&(tenant, generation)) {
            Some(to) if to == pageserver => {}
            other => {
                let message = format!(
                    "{pageserver} attached tenant {tenant} under generation {generation}, which the state gave to {other:?}"
                );
                inner.violations.push(message);
            }
        }
        match inner.accepted.get(&(tenant, generation)) {
            Some(before) if before != pageserver => {
                let message =
                    format!("tenant {tenant}: generation {generation} accepted by both {before} and {pageserver}");
                inner.violations.push(message);
            }
            _ => {
                inner.accepted.insert((tenant, generation), pageserver.to_string());
            }
        }
    }

    /// The controllers that believe they lead now, with their terms.
    pub fn leaders(&self, leading: &[(u64, u64)]) {
        if leading.len() > 1 {
            self.violation(format!("several controllers lead at once (id, term): {leading:?}"));
        }
    }

    /// A failure the world itself found (liveness, a stuck executor).
    pub fn report(&self, message: String) {
        self.violation(message);
    }
}
