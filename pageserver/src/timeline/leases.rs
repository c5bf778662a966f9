//! Leases: LSNs that GC keeps readable for a while. A read-only compute
//! leases its pinned LSN anonymously; a replica leases its read floor under
//! its own name, and each new lease of a name replaces the last, so a
//! replica that moves on releases what it no longer reads
//! (`docs/replicas.md`, "Storage keeps what replicas read").

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use strata_formats::Lsn;

pub use crate::limits::{LEASE_TTL, MAX_HOLDERS, MAX_HOLDER_LEN};

/// The leases of one timeline.
#[derive(Debug, Default)]
pub struct Leases {
    anonymous: BTreeMap<Lsn, Instant>,
    held: HashMap<String, (Lsn, Instant)>,
}

/// A lease refused by the table itself (the timeline checks the LSN).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseRefused {
    #[error("lease holder name: 1 to {MAX_HOLDER_LEN} of [A-Za-z0-9_.:/-]")]
    BadName,
    #[error("{MAX_HOLDERS} named leases are held on this timeline already")]
    Full,
}

impl Leases {
    /// Leases `lsn` until `until` (or renews it), for `holder` if named:
    /// its earlier lease, at whatever LSN, is replaced. `now` decides which
    /// named leases have ended and make room for a new holder.
    pub fn grant(&mut self, lsn: Lsn, holder: Option<&str>, now: Instant, until: Instant) -> Result<(), LeaseRefused> {
        match holder {
            None => {
                let e = self.anonymous.entry(lsn).or_insert(until);
                *e = (*e).max(until);
            }
            Some(name) => {
                let ok = !name.is_empty()
                    && name.len() <= MAX_HOLDER_LEN
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
                if !ok {
                    return Err(LeaseRefused::BadName);
                }
                if !self.held.contains_key(name) {
                    self.prune(now);
                    if self.held.len() >= MAX_HOLDERS {
                        return Err(LeaseRefused::Full);
                    }
                }
                self.held.insert(name.to_string(), (lsn, until));
            }
        }
        Ok(())
    }

    /// Drops the leases that ended by `now`.
    pub fn prune(&mut self, now: Instant) {
        self.anonymous.retain(|_, until| *until > now);
        self.held.retain(|_, (_, until)| *until > now);
    }

    /// The lowest LSN a live lease names.
    pub fn oldest(&self, now: Instant) -> Option<Lsn> {
        let anonymous = self.anonymous.iter().filter(|(_, u)| **u > now).map(|(l, _)| *l);
        let held = self.held.values().filter(|(_, u)| *u > now).map(|(l, _)| *l);
        anonymous.chain(held).min()
    }

    /// The live leases, lowest LSN first: each with the seconds it has
    /// left and its holder, if named.
    pub fn live(&mut self, now: Instant) -> Vec<(Lsn, u64, Option<String>)> {
        self.prune(now);
        let mut out: Vec<(Lsn, u64, Option<String>)> = self
            .anonymous
            .iter()
            .map(|(l, u)| (*l, u.duration_since(now).as_secs(), None))
            .chain(self.held.iter().map(|(n, (l, u))| (*l, u.duration_since(now).as_secs(), Some(n.clone()))))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use strata_service::clock::{Clock, ManualClock};

    #[test]
    fn a_named_lease_moves_and_an_anonymous_one_stays() {
        let clock = ManualClock::new();
        let now = clock.now();
        let mut l = Leases::default();
        l.grant(Lsn(100), None, now, now + LEASE_TTL).unwrap();
        l.grant(Lsn(50), Some("ep-replica"), now, now + LEASE_TTL).unwrap();
        assert_eq!(l.oldest(now), Some(Lsn(50)));
        // The replica moves on: its old LSN is released at once.
        l.grant(Lsn(200), Some("ep-replica"), now, now + LEASE_TTL).unwrap();
        assert_eq!(l.oldest(now), Some(Lsn(100)));
        let live = l.live(now);
        assert_eq!(live.len(), 2);
        assert_eq!(live[1].2.as_deref(), Some("ep-replica"));
        // Ended leases hold nothing.
        assert_eq!(l.oldest(now + LEASE_TTL), None);
        assert!(l.live(now + LEASE_TTL).is_empty());
    }

    #[test]
    fn a_lease_holds_until_the_clock_passes_its_end() {
        let clock = ManualClock::new();
        let mut l = Leases::default();
        l.grant(Lsn(64), None, clock.now(), clock.now() + LEASE_TTL).unwrap();
        clock.advance(LEASE_TTL / 2);
        // Renewed halfway: the lease now ends one TTL from here.
        l.grant(Lsn(64), None, clock.now(), clock.now() + LEASE_TTL).unwrap();
        clock.advance(LEASE_TTL - Duration::from_millis(1));
        assert_eq!(l.oldest(clock.now()), Some(Lsn(64)), "a millisecond before its end");
        assert_eq!(l.live(clock.now()), vec![(Lsn(64), 0, None)]);
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.oldest(clock.now()), None, "at its end");
        assert!(l.live(clock.now()).is_empty());
    }

    #[test]
    fn holders_are_bounded_and_named_plainly() {
        let clock = ManualClock::new();
        let now = clock.now();
        let mut l = Leases::default();
        for bad in ["", "a b", "x\n", &"n".repeat(MAX_HOLDER_LEN + 1)] {
            assert_eq!(l.grant(Lsn(8), Some(bad), now, now + LEASE_TTL), Err(LeaseRefused::BadName), "{bad:?}");
        }
        for i in 0..MAX_HOLDERS {
            l.grant(Lsn(8), Some(&format!("r{i}")), now, now + LEASE_TTL).unwrap();
        }
        assert_eq!(l.grant(Lsn(8), Some("one-more"), now, now + LEASE_TTL), Err(LeaseRefused::Full));
        // A known holder renews; an ended one makes room.
        l.grant(Lsn(16), Some("r0"), now, now + LEASE_TTL).unwrap();
        l.grant(Lsn(16), Some("r1"), now, now).unwrap();
        l.grant(Lsn(8), Some("one-more"), now, now + LEASE_TTL).unwrap();
        // Full again until the clock ends the others' leases.
        assert_eq!(l.grant(Lsn(8), Some("late"), now, now + LEASE_TTL), Err(LeaseRefused::Full));
        clock.advance(LEASE_TTL);
        l.grant(Lsn(8), Some("late"), clock.now(), clock.now() + LEASE_TTL).unwrap();
    }
}
