//! Logged-in sessions, held in the console's memory only (a restart logs
//! everyone out): a random id in an `HttpOnly`, `Secure`, `SameSite=Strict`
//! cookie, a CSRF token every request that changes something must echo in
//! a header, an idle and an absolute expiry; and the count of failed
//! logins that refuses a name after too many.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;
use strata_service::auth::Token;

use crate::limits::{LOGIN_WINDOW, MAX_LOGIN_FAILURES, MAX_LOGIN_NAMES, MAX_SESSIONS, SESSION_IDLE, SESSION_MAX_AGE};
use crate::users::Role;

/// The session cookie's name.
pub const COOKIE: &str = "strata_console";

/// Who a session is and what it may do.
#[derive(Clone, Debug)]
pub struct Session {
    pub user: String,
    pub role: Role,
    /// The tenants it may see; none: all.
    pub tenants: Option<Vec<String>>,
    /// What a request that changes something must carry (`x-csrf-token`).
    pub csrf: String,
    /// A management token's session: the token, verified again at each
    /// request (its revocation, expiry or key's retirement ends the session).
    pub token: Option<Token>,
    /// The token's id, for the audit log.
    pub jti: Option<String>,
    /// Unix seconds at which the session ends at the latest.
    pub expires_at: u64,
    created: Instant,
    last_seen: Instant,
}

impl Session {
    pub fn new(
        user: String,
        role: Role,
        tenants: Option<Vec<String>>,
        token: Option<(Token, Option<String>)>,
    ) -> Session {
        let now = Instant::now();
        let (token, jti) = match token {
            Some((t, jti)) => (Some(t), jti),
            None => (None, None),
        };
        Session {
            user,
            role,
            tenants,
            csrf: random_id(),
            token,
            jti,
            expires_at: strata_service::auth::now() + SESSION_MAX_AGE.as_secs(),
            created: now,
            last_seen: now,
        }
    }

    /// Whether it may see (and, by its role, act on) tenant `name`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.iter().any(|x| x == tenant))
    }

    pub fn may_act(&self) -> bool {
        matches!(self.role, Role::Operator | Role::Admin)
    }

    fn expired(&self, now: Instant) -> bool {
        now.duration_since(self.last_seen) >= SESSION_IDLE
            || now.duration_since(self.created) >= SESSION_MAX_AGE
            || strata_service::auth::now() >= self.expires_at
    }
}

/// 32 random bytes, hex.
pub fn random_id() -> String {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).expect("the system's random numbers");
    crate::users::hex(&bytes)
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && aws_lc_rs::constant_time::verify_slices_are_equal(a.as_bytes(), b.as_bytes()).is_ok()
}

/// Every session, and the failed logins.
#[derive(Default)]
pub struct Sessions {
    sessions: Mutex<HashMap<String, Session>>,
    failures: Mutex<HashMap<String, (Instant, u32)>>,
}

impl Sessions {
    /// A new session; its id (the cookie's value). Past the bound the
    /// session used longest ago ends.
    pub fn create(&self, session: Session) -> String {
        let id = random_id();
        let mut all = self.sessions.lock();
        let now = Instant::now();
        all.retain(|_, s| !s.expired(now));
        if all.len() >= MAX_SESSIONS {
            if let Some(oldest) = all.iter().min_by_key(|(_, s)| s.last_seen).map(|(k, _)| k.clone()) {
                all.remove(&oldest);
            }
        }
        all.insert(id.clone(), session);
        id
    }

    /// The session of cookie value `id`, if it lives; the request counts
    /// as its use.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut all = self.sessions.lock();
        let now = Instant::now();
        let s = all.get_mut(id)?;
        if s.expired(now) {
            all.remove(id);
            return None;
        }
        s.last_seen = now;
        Some(s.clone())
    }

    pub fn remove(&self, id: &str) {
        self.sessions.lock().remove(id);
    }

    /// Sessions alive now.
    pub fn count(&self) -> usize {
        let now = Instant::now();
        self.sessions.lock().values().filter(|s| !s.expired(now)).count()
    }

    /// Whether logins as `name` are refused for now (too many failed).
    pub fn locked_out(&self, name: &str) -> bool {
        let failures = self.failures.lock();
        failures.get(name).is_some_and(|(since, n)| *n >= MAX_LOGIN_FAILURES && since.elapsed() < LOGIN_WINDOW)
    }

    /// Counts a failed login as `name`.
    pub fn failed_login(&self, name: &str) {
        let mut failures = self.failures.lock();
        let now = Instant::now();
        if failures.len() >= MAX_LOGIN_NAMES && !failures.contains_key(name) {
            failures.retain(|_, (since, _)| now.duration_since(*since) < LOGIN_WINDOW);
            if failures.len() >= MAX_LOGIN_NAMES {
                if let Some(oldest) = failures.iter().min_by_key(|(_, (since, _))| *since).map(|(k, _)| k.clone()) {
                    failures.remove(&oldest);
                }
            }
        }
        let entry = failures.entry(name.to_string()).or_insert((now, 0));
        if now.duration_since(entry.0) >= LOGIN_WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }

    /// A successful login forgets the name's failures.
    pub fn succeeded(&self, name: &str) {
        self.failures.lock().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_found_by_id_and_ended() {
        let all = Sessions::default();
        let id = all.create(Session::new("alice".into(), Role::Viewer, Some(vec!["t1".into()]), None));
        let s = all.get(&id).unwrap();
        assert!(s.sees("t1") && !s.sees("t2") && !s.may_act());
        assert_eq!(s.csrf.len(), 64);
        assert!(all.get("nope").is_none());
        all.remove(&id);
        assert!(all.get(&id).is_none());
    }

    #[test]
    fn the_bound_ends_the_longest_unused_session() {
        let all = Sessions::default();
        let first = all.create(Session::new("u0".into(), Role::Viewer, None, None));
        for i in 1..MAX_SESSIONS {
            all.create(Session::new(format!("u{i}"), Role::Viewer, None, None));
        }
        assert_eq!(all.count(), MAX_SESSIONS);
        all.create(Session::new("last".into(), Role::Viewer, None, None));
        assert_eq!(all.count(), MAX_SESSIONS);
        assert!(all.get(&first).is_none());
    }

    #[test]
    fn too_many_failed_logins_lock_a_name_out() {
        let all = Sessions::default();
        for _ in 0..MAX_LOGIN_FAILURES - 1 {
            all.failed_login("alice");
        }
        assert!(!all.locked_out("alice"));
        all.failed_login("alice");
        assert!(all.locked_out("alice"));
        assert!(!all.locked_out("bob"));
        all.succeeded("alice");
        assert!(!all.locked_out("alice"));
        // A flood of names stays bounded.
        for i in 0..MAX_LOGIN_NAMES + 10 {
            all.failed_login(&format!("n{i}"));
        }
        assert!(all.failures.lock().len() <= MAX_LOGIN_NAMES);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd") && !same_secret("abc", "ab") && !same_secret("", "a"));
    }
}
