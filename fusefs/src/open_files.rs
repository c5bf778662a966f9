//! A bound on the backing files the passthrough holds open.
//!
//! Each FUSE open has a backing file of its own. A client that opens many
//! files at once (PostgreSQL keeps up to `max_files_per_process` open in
//! every backend) would otherwise hold this daemon to one descriptor per
//! open across all its processes, past any limit. With a bound, the
//! descriptors of handles not used lately are closed (CLOCK: a handle used
//! since the hand last passed gets a second chance) and opened again by
//! path when next used. A file unlinked or replaced while open can no
//! longer be opened by path: its handles are *pinned* first, and a pinned
//! handle's descriptor is never closed.
//!
//! A write-back error of a closed descriptor is not lost: the kernel
//! reports an error nobody has seen to the next fsync of the file through
//! any descriptor, including one opened after it.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The backing file of one open file handle.
pub(crate) struct Slot {
    /// `None` while closed by the bound.
    file: Mutex<Option<Arc<File>>>,
    /// Used since the hand last passed.
    referenced: AtomicBool,
    /// Unlinked or replaced while open: never closed.
    pinned: AtomicBool,
    /// open(2) flags to open it again with (no O_CREAT, O_EXCL or O_TRUNC).
    pub(crate) reopen_flags: i32,
}

impl Slot {
    pub(crate) fn new(file: File, flags: i32) -> Slot {
        Slot {
            file: Mutex::new(Some(Arc::new(file))),
            referenced: AtomicBool::new(false),
            pinned: AtomicBool::new(false),
            reopen_flags: flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC),
        }
    }

    /// The open file, if it is open (marked used).
    pub(crate) fn get(&self) -> Option<Arc<File>> {
        let file = self.file.lock().clone()?;
        self.referenced.store(true, Ordering::Relaxed);
        Some(file)
    }

    /// Puts `file`, opened again, in the slot, unless a concurrent user
    /// did first; returns the file to use and whether it was this one.
    pub(crate) fn reopened(&self, file: File) -> (Arc<File>, bool) {
        let mut slot = self.file.lock();
        if let Some(existing) = slot.clone() {
            return (existing, false);
        }
        let file = Arc::new(file);
        *slot = Some(file.clone());
        self.referenced.store(true, Ordering::Relaxed);
        (file, true)
    }

    /// Never to be closed again; false if the file is closed (it cannot be
    /// pinned then: the caller opens it first).
    pub(crate) fn pin(&self) -> bool {
        let slot = self.file.lock();
        if slot.is_some() {
            self.pinned.store(true, Ordering::Relaxed);
        }
        slot.is_some()
    }

    /// Whether the slot holds a descriptor now.
    #[cfg(test)]
    pub(crate) fn is_open(&self) -> bool {
        self.file.lock().is_some()
    }

    /// The hand at this slot: closes it unless pinned or used since the
    /// last pass (which clears the mark). Returns whether it stays in the ring.
    fn visit(&self) -> bool {
        // Under the slot's lock, as `pin` sets the mark: a slot pinned now
        // is never closed.
        let mut file = self.file.lock();
        if self.pinned.load(Ordering::Relaxed) {
            return false;
        }
        if self.referenced.swap(false, Ordering::Relaxed) {
            return true;
        }
        // Operations under way hold their own reference: the descriptor
        // closes when the last of them is done.
        file.take();
        false
    }
}

/// The ring of handles whose backing file is open.
pub(crate) struct OpenFiles {
    max: Option<usize>,
    ring: Mutex<VecDeque<u64>>,
}

impl OpenFiles {
    /// At most `max` open (`None`: no bound, nothing is ever closed).
    pub(crate) fn new(max: Option<usize>) -> OpenFiles {
        OpenFiles { max: max.map(|m| m.max(crate::limits::MIN_OPEN_FILES)), ring: Mutex::new(VecDeque::new()) }
    }

    pub(crate) fn bounded(&self) -> bool {
        self.max.is_some()
    }

    /// Handle `fh` opened its backing file: runs the hand while the ring
    /// is over the bound. `slot` finds a handle's slot (`None`: released).
    pub(crate) fn opened(&self, fh: u64, slot: impl Fn(u64) -> Option<Arc<Slot>>) {
        let Some(max) = self.max else { return };
        let mut ring = self.ring.lock();
        ring.push_back(fh);
        // The first round may only clear marks.
        let mut steps = crate::limits::HAND_ROUNDS * ring.len();
        while ring.len() > max && steps > 0 {
            steps -= 1;
            let Some(next) = ring.pop_front() else { break };
            if slot(next).is_some_and(|s| s.visit()) {
                ring.push_back(next);
            }
        }
    }

    /// How many handles the ring holds (open, or released and not yet passed).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ring.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn file() -> File {
        File::open("/dev/null").unwrap()
    }

    #[test]
    fn the_hand_closes_the_least_used_and_spares_the_pinned() {
        let open = OpenFiles::new(Some(3));
        let slots: HashMap<u64, Arc<Slot>> =
            (1..=6).map(|fh| (fh, Arc::new(Slot::new(file(), libc::O_RDWR | libc::O_CREAT)))).collect();
        let find = |fh: u64| slots.get(&fh).cloned();
        assert_eq!(slots[&1].reopen_flags, libc::O_RDWR);
        assert!(slots[&2].pin());
        for fh in 1..=3 {
            open.opened(fh, find);
        }
        assert!((1..=3).all(|fh| slots[&fh].is_open()));
        // Over the bound: 1 is closed (never used), 2 stays (pinned, out of the ring).
        open.opened(4, find);
        assert!(!slots[&1].is_open() && slots[&2].is_open());
        // 3 was used: it gets a second chance, 4 goes instead.
        assert!(slots[&3].get().is_some());
        open.opened(5, find);
        open.opened(6, find);
        assert!(slots[&3].is_open());
        assert!(!slots[&4].is_open());
        assert!(open.len() <= 3);
        // A closed slot is opened again; a racing reopen keeps the first.
        let (_, mine) = slots[&1].reopened(file());
        let (_, second) = slots[&1].reopened(file());
        assert!(mine && !second && slots[&1].is_open());
        // Released handles leave the ring when the hand reaches them.
        let none = |_: u64| None;
        for fh in 10..20 {
            open.opened(fh, none);
        }
        assert!(open.len() <= 3);
    }

    #[test]
    fn without_a_bound_nothing_is_closed() {
        let open = OpenFiles::new(None);
        let slot = Arc::new(Slot::new(file(), libc::O_RDONLY));
        for fh in 0..100 {
            open.opened(fh, |_| Some(slot.clone()));
        }
        assert!(slot.is_open());
        assert!(!open.bounded());
    }
}
