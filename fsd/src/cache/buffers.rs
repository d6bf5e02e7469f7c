//! Page buffers from one slab.
//!
//! The cache's `capacity` page buffers are slots of a single anonymous mapping made
//! up front (untouched pages cost nothing until used). One slab means one memory
//! registration: [`Slab::register_with_fabric`] hands it to the fabric once, and the
//! verbs backend then READs into and WRITEs from cache pages in place. When the cache
//! overshoots its capacity (see the cache's module comment) the extra buffers come
//! from the heap; the fabric still handles them, registering them per operation.

use std::ops::{Deref, DerefMut};
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
    free: Mutex<Vec<usize>>,
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
                free: Mutex::new((0..slots).rev().collect()),
            }),
        }
    }

    /// A zeroed-or-reused buffer: a free slot of the slab, else a heap buffer.
    pub fn take(&self) -> PageBuf {
        let slot = self
            .shared
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
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
        // SAFETY: the mapping is never unmapped (Mapping has no Drop).
        unsafe { rmemfs_common::fabric::register_local(m.base, m.len) }
    }
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
            shared
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(*slot);
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
}
