//! Futures the controller's I/O seams return, the tasks it starts, and
//! several calls run at once: what lets one executor (tokio in the process,
//! a deterministic one in the simulation) run all of it.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// A boxed future (the traits of the I/O seams return these, so that they
/// can be used as `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Starts a task that runs on its own (a location call outlives the round
/// that sent it).
pub trait Spawn: Send + Sync {
    fn spawn(&self, task: BoxFuture<'static, ()>);
}

/// Tasks on the tokio runtime the process runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSpawn;

impl Spawn for TokioSpawn {
    fn spawn(&self, task: BoxFuture<'static, ()>) {
        tokio::spawn(task);
    }
}

/// Runs `futures` concurrently in the calling task and hands each output
/// to `each` as soon as it is ready (in their order when several are ready
/// at once, so a replayed run sees the same order).
pub async fn each_as_ready<F: Future>(futures: Vec<F>, mut each: impl FnMut(F::Output)) {
    let mut pending: Vec<Option<Pin<Box<F>>>> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        for slot in pending.iter_mut() {
            if let Some(f) = slot {
                if let Poll::Ready(out) = f.as_mut().poll(cx) {
                    *slot = None;
                    each(out);
                }
            }
        }
        if pending.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Waker};

    #[test]
    fn outputs_come_as_they_are_ready() {
        let (tx1, rx1) = tokio::sync::oneshot::channel::<u32>();
        let (tx2, rx2) = tokio::sync::oneshot::channel::<u32>();
        let mut seen = Vec::new();
        {
            let mut all = Box::pin(each_as_ready(vec![rx1, rx2], |r| seen.push(r.unwrap())));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(all.as_mut().poll(&mut cx).is_pending());
            tx2.send(2).unwrap();
            assert!(all.as_mut().poll(&mut cx).is_pending());
            tx1.send(1).unwrap();
            assert!(all.as_mut().poll(&mut cx).is_ready());
        }
        assert_eq!(seen, [2, 1]);
    }
}
