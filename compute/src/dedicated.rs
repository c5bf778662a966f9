//! A future run on a thread of its own, with a single-threaded runtime.
//!
//! The proposer relays every commit: one message from PostgreSQL, one to
//! and from each safekeeper, one back to PostgreSQL. On a multi-threaded
//! runtime those few microseconds of work are spread over worker threads
//! that wake each other for every message; on one thread, with its own
//! reactor, the same work is a loop over ready sockets.

use std::future::Future;

use tokio::sync::oneshot;

/// The thread was not started or ended without a result (it panicked).
#[derive(Debug, thiserror::Error)]
#[error("the {name} thread {what}")]
pub struct ThreadGone {
    pub name: String,
    pub what: String,
}

/// Runs the future that `make` returns on a new thread named `name` and
/// resolves to its output. Dropping the returned future ends the thread's
/// future (and every task it spawned) at its next await point.
pub fn run_on_own_thread<M, F>(name: &str, make: M) -> impl Future<Output = Result<F::Output, ThreadGone>>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future + 'static,
    F::Output: Send + 'static,
{
    let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
    let (done_tx, done_rx) = oneshot::channel();
    let spawned = std::thread::Builder::new().name(name.to_string()).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => return Err(e),
        };
        runtime.block_on(async move {
            tokio::select! {
                out = make() => { let _ = done_tx.send(out); }
                // The caller dropped its future (the sender is gone).
                _ = cancel_rx => {}
            }
        });
        // Dropping the runtime here cancels the tasks the future spawned.
        Ok(())
    });
    let name = name.to_string();
    async move {
        // Held until this future resolves or is dropped.
        let _cancel = cancel_tx;
        let thread = spawned.map_err(|e| ThreadGone { name: name.clone(), what: format!("could not start: {e}") })?;
        match done_rx.await {
            Ok(out) => Ok(out),
            Err(_) => {
                // Gone without a result: say why if the thread says.
                let what = match tokio::task::spawn_blocking(move || thread.join()).await {
                    Ok(Ok(Err(e))) => format!("could not build its runtime: {e}"),
                    Ok(Err(_)) => "panicked".to_string(),
                    _ => "ended without a result".to_string(),
                };
                Err(ThreadGone { name, what })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use strata_service::clock::Clock;

    #[tokio::test]
    async fn returns_the_output_of_a_future_run_elsewhere() {
        let caller = std::thread::current().id();
        let out = run_on_own_thread("test", move || async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            (std::thread::current().id() != caller, std::thread::current().name().map(String::from))
        })
        .await
        .unwrap();
        assert_eq!(out, (true, Some("test".to_string())));
    }

    #[tokio::test]
    async fn a_panic_is_an_error() {
        let err = run_on_own_thread("panicky", || async { panic!("on purpose") }).await.unwrap_err();
        assert_eq!(err.what, "panicked");
        assert!(err.to_string().contains("panicky thread panicked"), "{err}");
    }

    #[tokio::test]
    async fn dropping_the_future_stops_the_work_and_its_tasks() {
        let (started_tx, started_rx) = oneshot::channel();
        let stopped = Arc::new(AtomicBool::new(false));
        struct SetOnDrop(Arc<AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = SetOnDrop(stopped.clone());
        let fut = run_on_own_thread("cancelled", move || async move {
            // A spawned task that would run forever.
            tokio::spawn(async move {
                let _flag = flag;
                std::future::pending::<()>().await
            });
            let _ = started_tx.send(());
            std::future::pending::<()>().await
        });
        let handle = tokio::spawn(fut);
        started_rx.await.unwrap();
        handle.abort();
        // The work runs on another thread: real time passes for it.
        let clock = strata_service::clock::SystemClock;
        let started = clock.now();
        while !stopped.load(Ordering::SeqCst) {
            assert!(clock.since(started) < Duration::from_secs(10), "the spawned task was not dropped");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
