//! Waking: one start of a sleeping compute however many clients arrive
//! at once. The first client's wake runs in a task of its own, so a client
//! that gives up does not end it; every client waits (bounded) for its
//! outcome.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::catalog::Backend;
use crate::metrics::Metrics;

type Outcome = Option<Result<(), String>>;

/// The wakes in flight, by endpoint.
#[derive(Default)]
pub struct Wakes {
    in_flight: Mutex<HashMap<String, watch::Receiver<Outcome>>>,
}

impl Wakes {
    /// The endpoints being woken now.
    pub fn in_flight(&self) -> Vec<String> {
        let mut names: Vec<String> = self.in_flight.lock().keys().cloned().collect();
        names.sort();
        names
    }

    /// Wakes `endpoint` (or joins the wake under way) and waits at most
    /// `timeout` for it.
    pub async fn wake(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
        metrics: &Arc<Metrics>,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let mut rx = self.join(backend, metrics, endpoint);
        let done = tokio::time::timeout(timeout, rx.wait_for(Option::is_some)).await;
        match done {
            Err(_) => Err(format!("endpoint {endpoint} did not wake within {}s", timeout.as_secs())),
            Ok(Err(_)) => Err(format!("endpoint {endpoint}: its wake ended without an outcome")),
            Ok(Ok(outcome)) => outcome.clone().expect("waited for an outcome"),
        }
    }

    /// The wake of `endpoint` under way, or a new one.
    fn join(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
        metrics: &Arc<Metrics>,
        endpoint: &str,
    ) -> watch::Receiver<Outcome> {
        let mut in_flight = self.in_flight.lock();
        if let Some(rx) = in_flight.get(endpoint) {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(None);
        in_flight.insert(endpoint.to_string(), rx.clone());
        let (wakes, backend, metrics, name) = (self.clone(), backend.clone(), metrics.clone(), endpoint.to_string());
        tokio::spawn(async move {
            let started = Instant::now();
            tracing::info!(endpoint = %name, "waking");
            let task_name = name.clone();
            let outcome = tokio::task::spawn_blocking(move || backend.wake(&task_name))
                .await
                .unwrap_or_else(|e| Err(format!("the wake failed: {e}")));
            let secs = started.elapsed().as_secs_f64();
            match &outcome {
                Ok(()) => {
                    metrics.wakes.inc();
                    metrics.wake_seconds.observe(secs);
                    tracing::info!(endpoint = %name, secs, "woken");
                }
                Err(e) => {
                    metrics.wake_failures.inc();
                    tracing::warn!(endpoint = %name, secs, "wake failed: {e}");
                }
            }
            // Gone from the table before the outcome is told: a client that
            // comes later looks the endpoint up again.
            wakes.in_flight.lock().remove(&name);
            let _ = tx.send(Some(outcome));
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Target;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Slow(AtomicUsize);

    impl Backend for Slow {
        fn lookup(&self, _: &str) -> Result<Option<Target>, String> {
            Ok(None)
        }
        fn wake(&self, name: &str) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            if name == "bad" {
                Err("no such compute".into())
            } else {
                Ok(())
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_clients_wake_an_endpoint_once() {
        let slow = Arc::new(Slow(AtomicUsize::new(0)));
        let backend: Arc<dyn Backend> = slow.clone();
        let (wakes, metrics) = (Arc::new(Wakes::default()), Arc::new(Metrics::new()));
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let (w, b, m) = (wakes.clone(), backend.clone(), metrics.clone());
            clients.spawn(async move { w.wake(&b, &m, "ep1", Duration::from_secs(5)).await });
        }
        // One gives up at once: the wake goes on for the others.
        let early = wakes.wake(&backend, &metrics, "ep1", Duration::from_millis(1)).await;
        assert!(early.unwrap_err().contains("did not wake"));
        while let Some(r) = clients.join_next().await {
            r.unwrap().unwrap();
        }
        assert_eq!(slow.0.load(Ordering::SeqCst), 1);
        assert!(wakes.in_flight().is_empty());
        // A failure reaches every waiter, and the next client tries again.
        assert!(wakes.wake(&backend, &metrics, "bad", Duration::from_secs(5)).await.is_err());
        assert!(wakes.wake(&backend, &metrics, "bad", Duration::from_secs(5)).await.is_err());
        assert_eq!(slow.0.load(Ordering::SeqCst), 3);
        assert_eq!(metrics.wakes.get(), 1);
        assert_eq!(metrics.wake_failures.get(), 2);
    }
}
