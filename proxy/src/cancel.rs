//! Query cancellation. A compute's `BackendKeyData` is replaced by a key
//! of the proxy's own before the client sees it: a cancel request comes on
//! a new connection that names no endpoint, so the proxy keeps which
//! session each of its keys is, and passes the request on with the
//! compute's key. Keys are random (a guessed key cancels someone else's
//! query) and live as long as their session.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Where a cancel request goes: the compute and its own key.
#[derive(Clone, Debug, PartialEq)]
pub struct CancelTarget {
    pub address: SocketAddr,
    pub socket: Option<std::path::PathBuf>,
    pub pid: u32,
    pub key: Vec<u8>,
}

/// The proxy's keys of the sessions open now.
#[derive(Default)]
pub struct Cancels {
    keys: Mutex<HashMap<(u32, [u8; 4]), CancelTarget>>,
}

/// A session's key; dropping it forgets the key.
pub struct CancelKey {
    cancels: Arc<Cancels>,
    pub pid: u32,
    pub key: [u8; 4],
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0; N];
    aws_lc_rs::rand::fill(&mut bytes).expect("the system's random source works");
    bytes
}

impl Cancels {
    /// A new key of the proxy for the session of `target`.
    pub fn register(self: &Arc<Self>, target: CancelTarget) -> CancelKey {
        let mut keys = self.keys.lock();
        loop {
            // A positive pid, as PostgreSQL's are.
            let pid = u32::from_be_bytes(random()) & 0x7fff_ffff;
            let key = random::<4>();
            if let std::collections::hash_map::Entry::Vacant(v) = keys.entry((pid, key)) {
                v.insert(target);
                return CancelKey { cancels: self.clone(), pid, key };
            }
        }
    }

    /// The session the proxy's key `(pid, key)` stands for, if open.
    pub fn find(&self, pid: u32, key: &[u8]) -> Option<CancelTarget> {
        let key: [u8; 4] = key.try_into().ok()?;
        self.keys.lock().get(&(pid, key)).cloned()
    }

    /// Keys held now (one per open session).
    pub fn len(&self) -> usize {
        self.keys.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        self.cancels.keys.lock().remove(&(self.pid, self.key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_find_their_session_while_it_lasts() {
        let c = Arc::new(Cancels::default());
        let target =
            CancelTarget { address: "127.0.0.1:5432".parse().unwrap(), socket: None, pid: 42, key: vec![1, 2, 3, 4] };
        let k = c.register(target.clone());
        let other = c.register(target.clone());
        assert_ne!((k.pid, k.key), (other.pid, other.key));
        assert_eq!(c.find(k.pid, &k.key), Some(target));
        assert_eq!(c.find(k.pid, &[0, 0, 0, 0]), None);
        assert_eq!(c.find(k.pid, &[1, 2]), None);
        let (pid, key) = (k.pid, k.key);
        drop(k);
        assert_eq!(c.find(pid, &key), None);
        assert_eq!(c.len(), 1);
    }
}
