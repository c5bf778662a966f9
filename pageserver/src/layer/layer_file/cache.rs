//! Per-thread caches of the index blocks and value groups a thread decoded
//! last. Reads of neighbouring keys share an index block, and sequential
//! reads take a group's values one after the other; without these, each
//! would decode the whole block or group again. (Open descriptors are
//! cached elsewhere, in `layer/files.rs`.)

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use super::format::Entry;
use crate::layer::group::Group;

/// A decoded part of a loaded layer file: (loaded id, position, the part).
type Recent<T> = (u64, usize, Arc<T>);

use crate::limits::{RECENT_GROUPS, RECENT_INDEX_BLOCKS};

thread_local! {
    /// The value groups this thread decompressed last, newest first:
    /// (loaded layer id, offset) and the group. Sequential reads (scans
    /// served batch by batch, several at once over several connections)
    /// read a group's values one after the other, and without this pay a
    /// whole group's decompression for each.
    static RECENT: RefCell<VecDeque<Recent<Group>>> = const { RefCell::new(VecDeque::new()) };
    /// The index blocks this thread decoded last, newest first: (loaded
    /// layer id, block) and the entries. Lookups of neighbouring keys
    /// (a batch of consecutive pages) share an index block.
    static RECENT_INDEX: RefCell<VecDeque<Recent<Vec<Entry>>>> = const { RefCell::new(VecDeque::new()) };
}

/// Index block `block` of the loading `id`, from this thread's recent
/// blocks, else `load`ed and kept. A loaded file never changes, and a new
/// loading has a new id, so a kept block is never stale.
pub(super) fn index_block<E>(
    (id, block): (u64, usize),
    load: impl FnOnce() -> Result<Vec<Entry>, E>,
) -> Result<Arc<Vec<Entry>>, E> {
    recent_or_load(&RECENT_INDEX, RECENT_INDEX_BLOCKS, (id, block), load)
}

/// The value group at offset `at` of the loading `id`, from this thread's
/// recent groups, else `load`ed (and checked by `load`) and kept.
pub(super) fn group<E>((id, at): (u64, usize), load: impl FnOnce() -> Result<Group, E>) -> Result<Arc<Group>, E> {
    recent_or_load(&RECENT, RECENT_GROUPS, (id, at), load)
}

/// The part at `(id, at)` from a thread's recent list (`keep` long), a hit
/// moved to the front; else `load`s it and puts it in front.
fn recent_or_load<T, E>(
    list: &'static std::thread::LocalKey<RefCell<VecDeque<Recent<T>>>>,
    keep: usize,
    (id, at): (u64, usize),
    load: impl FnOnce() -> Result<T, E>,
) -> Result<Arc<T>, E> {
    let hit = list.with(|c| {
        let mut recent = c.borrow_mut();
        let i = recent.iter().position(|(i, a, _)| *i == id && *a == at)?;
        let found = recent.remove(i).expect("found above");
        let value = found.2.clone();
        recent.push_front(found);
        Some(value)
    });
    if let Some(value) = hit {
        return Ok(value);
    }
    let value = Arc::new(load()?);
    list.with(|c| {
        let mut recent = c.borrow_mut();
        recent.truncate(keep - 1);
        recent.push_front((id, at, value.clone()));
    });
    Ok(value)
}
