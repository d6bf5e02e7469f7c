//! Page buffers from slabs.
//!
//! The cache's `capacity` block buffers are slots of a single anonymous mapping made
//! up front (untouched pages cost nothing until used), and its sector buffers slots
//! of a second one. One slab means one memory registration:
//! [`Slab::register_with_fabric`] hands it to the fabric once, and the verbs backend
//! then READs into and WRITEs from cache pages in place.
//!
//! A slot's memory stays resident once used: a slot given back is taken again
//! before any other (in the CPU's caches, no page fault), and [`Slab::trim`] gives
//! the memory of free slots beyond a few back to the kernel, the coldest first, so
//! that what the two slabs hold together stays what the cache holds (the cache
//! calls it from its cleaner, and from a request whose buffer grew the slabs'
//! resident memory, [`Slab::resident_bytes`], past a bound). Not once registered:
//! the device may hold the slots' pages. When the cache
//! overshoots its capacity (see the cache's module comment) the extra buffers come
//! from the heap; the fabric still handles them, registering them per operation.

use rmemfs_common::sync::lock;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The mapping; never unmapped, because a registration may refer to it for the
/// rest of the process's life.
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; which slot is used by whom is tracked by the
// free list, and a slot is only accessed through the PageBuf that owns it.
unsafe impl Send for Mapping {}
// SAFETY: see Send.
unsafe impl Sync for Mapping {}

pub struct Shared {
    mapping: Mapping,
    slot_len: usize,
    free: Mutex<Free>,
    /// Registered with the fabric: the device may hold the slots' pages, so their
    /// memory is never given back (see [`Slab::trim`]).
    registered: AtomicBool,
    /// Slots are whole pages of memory, which can be given back one by one (tests
    /// use tiny slots, many to a page).
    whole_pages: bool,
    /// Slots whose memory is resident: taken from `cold` since they were last
    /// trimmed, in use or free.
    resident: AtomicUsize,
}

/// The free slots.
struct Free {
    /// Slots whose memory is resident (used since they were last trimmed), the most
    /// recently given back last.
    hot: Vec<usize>,
    /// Slots whose memory is not (never used, or trimmed).
    cold: Vec<usize>,
}

/// A pool of `slots` buffers of `slot_len` bytes in one mapping.
#[derive(Clone)]
pub struct Slab {
    shared: Arc<Shared>,
}

impl Slab {
    /// Maps `slots * slot_len` bytes; with no memory for the mapping, an empty slab
    /// (every buffer then comes from the heap).
    pub fn new(slots: usize, slot_len: usize) -> Slab {
        let len = slots.saturating_mul(slot_len);
        // SAFETY: an anonymous private mapping with no address hint; the result is
        // checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let (base, slots) = if base == libc::MAP_FAILED {
            log::warn!("cannot map a {len}-byte page cache slab; using heap buffers");
            (std::ptr::null_mut(), 0)
        } else {
            (base as *mut u8, slots)
        };
        Slab {
            shared: Arc::new(Shared {
                mapping: Mapping {
                    base,
                    len: slots * slot_len,
                },
                slot_len,
                free: Mutex::new(Free {
                    hot: Vec::new(),
                    cold: (0..slots).rev().collect(),
                }),
                registered: AtomicBool::new(false),
                whole_pages: slot_len > 0 && slot_len.is_multiple_of(page_size()),
                resident: AtomicUsize::new(0),
            }),
        }
    }

    /// A zeroed-or-reused buffer: a free slot of the slab (one used before first),
    /// else a heap buffer.
    pub fn take(&self) -> PageBuf {
        let slot = {
            let mut free = self.shared.free();
            free.hot.pop().or_else(|| {
                let slot = free.cold.pop()?;
                self.shared.resident.fetch_add(1, Ordering::Relaxed);
                Some(slot)
            })
        };
        match slot {
            Some(slot) => PageBuf::Slot {
                shared: self.shared.clone(),
                slot,
            },
            None => PageBuf::Heap(vec![0u8; self.shared.slot_len].into_boxed_slice()),
        }
    }

    /// Registers the slab with the fabric (verbs: once per device), so operations on
    /// page buffers need no registration of their own.
    pub fn register_with_fabric(&self) -> Result<(), rmemfs_common::fabric::FabricError> {
        let m = &self.shared.mapping;
        if m.len == 0 {
            return Ok(());
        }
        self.shared.registered.store(true, Ordering::SeqCst);
        // SAFETY: the mapping is never unmapped (Mapping has no Drop).
        unsafe { rmemfs_common::fabric::register_local(m.base, m.len) }
    }

    /// Gives the memory of the free slots beyond the `keep` most recently given back
    /// to the kernel (they read as zeros when next used). Returns how many slots it
    /// gave back: none for a registered slab, or one whose slots share pages.
    pub fn trim(&self, keep: usize) -> usize {
        let shared = &self.shared;
        if !shared.whole_pages || shared.registered.load(Ordering::SeqCst) {
            return 0;
        }
        // Out of the free list while the kernel takes their memory, so nobody takes
        // them meanwhile; the coldest (given back first) go.
        let mut victims: Vec<usize> = {
            let mut free = shared.free();
            let excess = free.hot.len().saturating_sub(keep);
            free.hot.drain(..excess).collect()
        };
        victims.sort_unstable();
        // One call per run of adjacent slots.
        let mut i = 0;
        while i < victims.len() {
            let mut j = i + 1;
            while j < victims.len() && victims[j] == victims[j - 1] + 1 {
                j += 1;
            }
            // SAFETY: slots victims[i]..=victims[j - 1] lie inside the mapping and are
            // in no PageBuf (they were free, and are out of the free list); on private
            // anonymous memory MADV_DONTNEED only makes them read as zeros.
            unsafe {
                libc::madvise(
                    shared.mapping.base.add(victims[i] * shared.slot_len) as *mut libc::c_void,
                    (j - i) * shared.slot_len,
                    libc::MADV_DONTNEED,
                );
            }
            i = j;
        }
        let n = victims.len();
        shared.resident.fetch_sub(n, Ordering::Relaxed);
        shared.free().cold.extend(victims);
        n
    }

    /// Bytes of the slab's memory that are resident: of the slots in use, and of the
    /// free ones not given back since they were used.
    pub fn resident_bytes(&self) -> usize {
        self.shared.resident.load(Ordering::Relaxed) * self.shared.slot_len
    }
}

impl Shared {
    fn free(&self) -> std::sync::MutexGuard<'_, Free> {
        lock(&self.free)
    }
}

/// The size of a page of memory.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(1)
}

/// One page's bytes.
pub enum PageBuf {
    Slot { shared: Arc<Shared>, slot: usize },
    Heap(Box<[u8]>),
}

impl Default for PageBuf {
    fn default() -> PageBuf {
        PageBuf::Heap(Box::default())
    }
}

impl Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: slot < slots, so the range lies inside the mapping; the slot is
            // owned by this PageBuf alone until it is dropped (free list).
            PageBuf::Slot { shared, slot } => unsafe {
                std::slice::from_raw_parts(
                    shared.mapping.base.add(slot * shared.slot_len),
                    shared.slot_len,
                )
            },
            PageBuf::Heap(b) => b,
        }
    }
}

impl DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: as in deref, and &mut self makes the access exclusive.
            PageBuf::Slot { shared, slot } => unsafe {
                std::slice::from_raw_parts_mut(
                    shared.mapping.base.add(*slot * shared.slot_len),
                    shared.slot_len,
                )
            },
            PageBuf::Heap(b) => b,
        }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if let PageBuf::Slot { shared, slot } = self {
            shared.free().hot.push(*slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_reused_and_the_heap_takes_the_overflow() {
        let slab = Slab::new(2, 4096);
        let mut a = slab.take();
        let mut b = slab.take();
        a.fill(1);
        b.fill(2);
        assert!(matches!(a, PageBuf::Slot { .. }) && matches!(b, PageBuf::Slot { .. }));
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        let c = slab.take();
        assert!(
            matches!(c, PageBuf::Heap(_)),
            "a third buffer comes from the heap"
        );
        assert_eq!(c.len(), 4096);
        drop(a);
        let d = slab.take();
        assert!(
            matches!(d, PageBuf::Slot { .. }),
            "a returned slot is reused"
        );
        assert!(
            d.iter().all(|&x| x == 1),
            "reuse does not clear (the cache does)"
        );
    }

    #[test]
    fn trim_gives_back_the_coldest_free_slots_which_then_read_as_zeros() {
        let slab = Slab::new(3, 4096);
        let mut bufs: Vec<PageBuf> = (0..3).map(|_| slab.take()).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u8 + 1);
        }
        // Given back in order: the one filled with 1 is the coldest.
        for b in bufs.drain(..) {
            drop(b);
        }
        assert_eq!(slab.trim(2), 1, "all but the 2 most recent");
        let taken: Vec<PageBuf> = (0..3).map(|_| slab.take()).collect();
        let firsts: Vec<u8> = taken.iter().map(|b| b[0]).collect();
        assert_eq!(
            firsts,
            vec![3, 2, 0],
            "hot slots first, the trimmed one zeroed"
        );
        assert!(taken[2].iter().all(|&x| x == 0));
        drop(taken);
        assert_eq!(slab.trim(3), 0, "nothing beyond what it keeps");
    }

    #[test]
    fn a_registered_slab_keeps_its_memory() {
        let slab = Slab::new(1, 4096);
        slab.register_with_fabric()
            .expect("no device: only recorded");
        let mut a = slab.take();
        a.fill(7);
        drop(a);
        assert_eq!(slab.trim(0), 0);
        let b = slab.take();
        assert!(
            b.iter().all(|&x| x == 7),
            "the slot's pages stay where the device may have them"
        );
    }
}
