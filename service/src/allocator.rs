//! The C allocator's thresholds, fixed for the life of a service.
//!
//! glibc's allocator adapts two thresholds as it runs: each time a block
//! it had mapped on its own is freed, it raises the size from which it
//! maps blocks (up to 32 MiB on 64-bit) and the free space it keeps at
//! the top of a heap before giving it back (twice that). A service that
//! once handled a few large blocks (an import, a layer's index, a burst of
//! WAL) then keeps up to 64 MiB free in each of its arenas — up to eight
//! per core — for good, and that free memory was most of what an idle
//! tenant cost a pageserver (`docs/tenants.md`). Fixing both thresholds
//! keeps what is kept free small, and `malloc_trim` (the pageserver's
//! `heap_trim`) can return the rest.
//!
//! Blocks of [`MMAP_THRESHOLD`] and more are then mapped and unmapped each
//! time; `bench/getpage.py` and `bench/pageserver_ingest.py` measure that
//! cost (`bench/results/tenants.md`).

/// Free space a heap keeps at its top before returning it to the system.
pub const TRIM_THRESHOLD: usize = 128 << 10;

/// Blocks this large or larger get a mapping of their own, returned to the
/// system when they are freed.
pub const MMAP_THRESHOLD: usize = 1 << 20;

/// Fixes the allocator's thresholds (see the module); call it first, before
/// threads start. Returns whether the allocator took them (always false
/// with an allocator other than glibc's, which has no such settings).
pub fn fix_thresholds() -> bool {
    set(TRIM_THRESHOLD, MMAP_THRESHOLD)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set(trim: usize, mmap: usize) -> bool {
    let (Ok(trim), Ok(mmap)) = (i32::try_from(trim), i32::try_from(mmap)) else {
        return false;
    };
    // SAFETY: mallopt takes two integers and only changes the allocator's
    // parameters; glibc serialises it against allocations.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1 && libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set(_trim: usize, _mmap: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_allocator_takes_the_thresholds_and_still_serves_large_and_small_blocks() {
        assert!(fix_thresholds());
        // Blocks on either side of the mmap threshold, written and read back.
        let blocks: Vec<Vec<u8>> = [1 << 10, MMAP_THRESHOLD - 1, MMAP_THRESHOLD, 4 * MMAP_THRESHOLD]
            .iter()
            .enumerate()
            .map(|(i, &len)| vec![i as u8 + 1; len])
            .collect();
        for (i, b) in blocks.iter().enumerate() {
            assert!(b.iter().all(|x| *x == i as u8 + 1));
        }
    }

    #[test]
    fn thresholds_beyond_what_mallopt_takes_are_refused() {
        assert!(!set(usize::MAX, MMAP_THRESHOLD));
    }
}
