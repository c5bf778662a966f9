//! Sessions per tenant: each tenant has at most `max_connections_per_tenant`
//! sessions through the proxy at once, so one tenant cannot take every
//! place of the listener from the others.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// The count of sessions of each tenant that has any.
pub struct Admission {
    limit: usize,
    open: Mutex<HashMap<String, usize>>,
}

/// A session's place; dropping it frees the place.
pub struct Admitted {
    admission: Arc<Admission>,
    tenant: String,
}

impl Admission {
    pub fn new(limit: usize) -> Arc<Admission> {
        Arc::new(Admission { limit, open: Mutex::new(HashMap::new()) })
    }

    /// A place for a session of `tenant`, unless it has the limit already.
    pub fn admit(self: &Arc<Self>, tenant: &str) -> Option<Admitted> {
        let mut open = self.open.lock();
        let n = open.entry(tenant.to_string()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Admitted { admission: self.clone(), tenant: tenant.to_string() })
    }

    /// Sessions open per tenant (tenants with none left out).
    pub fn open(&self) -> std::collections::BTreeMap<String, usize> {
        self.open.lock().iter().filter(|(_, n)| **n > 0).map(|(t, n)| (t.clone(), *n)).collect()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock();
        if let Some(n) = open.get_mut(&self.tenant) {
            *n -= 1;
            // The table holds only tenants with sessions: it is bounded by them.
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_own_limit() {
        let a = Admission::new(2);
        let first = a.admit("t1").unwrap();
        let _second = a.admit("t1").unwrap();
        assert!(a.admit("t1").is_none());
        let _other = a.admit("t2").unwrap();
        drop(first);
        let _third = a.admit("t1").unwrap();
        assert_eq!(a.open().get("t1"), Some(&2));
        drop((_second, _third, _other));
        assert!(a.open().is_empty());
        assert!(a.open.lock().is_empty());
    }
}
