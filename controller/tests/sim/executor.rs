//! A single-threaded executor on a manual clock: among the tasks ready at
//! an instant, the seeded generator picks which runs next; when none is
//! ready, time jumps to the next sleep's deadline. Tasks belong to an
//! owner (a controller's incarnation, the storage, the operator), so a
//! process can be killed (its tasks dropped) or paused (not polled) whole.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;
use strata_controller::tasks::{BoxFuture, Spawn};

use super::SharedRng;

/// Who a task belongs to.
pub type Owner = u64;

struct Task {
    owner: Owner,
    future: BoxFuture<'static, ()>,
}

/// Tasks spawned since the executor last looked, by their owner.
type Spawned = Arc<Mutex<Vec<(Owner, BoxFuture<'static, ()>)>>>;

/// Marks a task ready when woken.
struct TaskWaker {
    id: u64,
    woken: Arc<Mutex<BTreeSet<u64>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.woken.lock().insert(self.id);
    }
}

/// The executor.
pub struct Executor {
    rng: SharedRng,
    tasks: BTreeMap<u64, Task>,
    woken: Arc<Mutex<BTreeSet<u64>>>,
    spawned: Spawned,
    paused: BTreeSet<Owner>,
    next_id: u64,
    /// Tasks polled so far.
    pub polls: u64,
}

/// What the executor gives an owner to start tasks with.
struct OwnerSpawn {
    owner: Owner,
    spawned: Spawned,
}

impl Spawn for OwnerSpawn {
    fn spawn(&self, task: BoxFuture<'static, ()>) {
        self.spawned.lock().push((self.owner, task));
    }
}

impl Executor {
    pub fn new(rng: SharedRng) -> Executor {
        Executor {
            rng,
            tasks: BTreeMap::new(),
            woken: Default::default(),
            spawned: Default::default(),
            paused: BTreeSet::new(),
            next_id: 0,
            polls: 0,
        }
    }

    /// Starts tasks for `owner`.
    pub fn spawner(&self, owner: Owner) -> Arc<dyn Spawn> {
        Arc::new(OwnerSpawn { owner, spawned: self.spawned.clone() })
    }

    /// Starts `future` as a task of `owner`.
    pub fn spawn(&mut self, owner: Owner, future: BoxFuture<'static, ()>) {
        self.spawned.lock().push((owner, future));
    }

    fn adopt_spawned(&mut self) {
        let spawned = std::mem::take(&mut *self.spawned.lock());
        for (owner, future) in spawned {
            let id = self.next_id;
            self.next_id += 1;
            self.tasks.insert(id, Task { owner, future });
            self.woken.lock().insert(id);
        }
    }

    /// Drops every task of `owner` (a process that dies mid-call).
    pub fn kill(&mut self, owner: Owner) {
        self.adopt_spawned();
        let ids: Vec<u64> = self.tasks.iter().filter(|(_, t)| t.owner == owner).map(|(id, _)| *id).collect();
        // Dropped one at a time, outside the map: a drop may wake others.
        for id in ids {
            drop(self.tasks.remove(&id));
        }
        self.paused.remove(&owner);
    }

    /// Stops polling the tasks of `owner` until [`Executor::resume`]: a
    /// process that stalls (its timers still run out meanwhile).
    pub fn pause(&mut self, owner: Owner) {
        self.paused.insert(owner);
    }

    pub fn resume(&mut self, owner: Owner) {
        if self.paused.remove(&owner) {
            // Whatever woke them meanwhile is looked at again.
            let ids: Vec<u64> = self.tasks.iter().filter(|(_, t)| t.owner == owner).map(|(id, _)| *id).collect();
            self.woken.lock().extend(ids);
        }
    }

    pub fn is_paused(&self, owner: Owner) -> bool {
        self.paused.contains(&owner)
    }

    /// Polls one ready task, picked by the generator; false when none is ready.
    pub fn step(&mut self) -> bool {
        self.adopt_spawned();
        let ready: Vec<u64> = {
            let mut woken = self.woken.lock();
            woken.retain(|id| self.tasks.contains_key(id));
            woken.iter().copied().filter(|id| !self.paused.contains(&self.tasks[id].owner)).collect()
        };
        if ready.is_empty() {
            return false;
        }
        let id = ready[self.rng.lock().usize(..ready.len())];
        self.woken.lock().remove(&id);
        let mut task = self.tasks.remove(&id).expect("ready tasks exist");
        let waker = Waker::from(Arc::new(TaskWaker { id, woken: self.woken.clone() }));
        self.polls += 1;
        if task.future.as_mut().poll(&mut Context::from_waker(&waker)) == Poll::Pending {
            self.tasks.insert(id, task);
        }
        self.adopt_spawned();
        true
    }
}
