//! Copies in and out of a shared mapping of another process's memory file that
//! survive the file being cut short under them.
//!
//! The mapped fabric reads and writes a memnode's region as a mapping of its file (a
//! memfd, a file on tmpfs or hugetlbfs, a DAX device). Where the file has no page
//! behind an address any more (truncated by an administrator, or a hugetlbfs pool
//! that ran dry), a load or store there raises SIGBUS, which would kill fsd: a
//! memnode's mistake must become an error on the operation instead, as a NIC's
//! remote access error does.
//!
//! How: every [`GuardedMap`] is listed in a fixed table of slots that a SIGBUS
//! handler (installed once per process) reads with atomics only. A fault inside a
//! listed mapping has its page replaced by an anonymous one (`mmap` with
//! `MAP_FIXED`, which a signal handler may call), the mapping is marked broken, and
//! the handler returns: the interrupted copy finishes on the anonymous page, and
//! [`GuardedMap::read`] or [`GuardedMap::write`] then sees the mark and fails with
//! [`MapError::Broken`]. Whatever the copy moved is discarded. A broken mapping stays
//! broken; the caller drops it and treats the memnode as lost or reconnects.
//!
//! A fault anywhere else goes to the handler that was there before (Rust's own, which
//! reports stack overflows, or the default, which ends the process), as if this one
//! had never been installed.
//!
//! No Rust reference to mapped memory is ever formed: bytes move with raw-pointer
//! copies, as the tcp backend moves them in and out of registered memory, because
//! other processes write the same pages at any time.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;
use thiserror::Error;

/// How many mappings may be guarded at once in a process (one per memnode file a
/// client maps; the table is fixed so that the signal handler never allocates).
pub const MAX_GUARDED: usize = 64;

const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    /// `[at, at + len)` is not inside the mapping: nothing was copied.
    #[error("range of {len} bytes at offset {at:#x} is outside the {size}-byte mapping")]
    OutOfRange { at: usize, len: usize, size: usize },
    /// The file behind the mapping lost pages (SIGBUS): nothing read from it since
    /// can be trusted, and writes may not have reached it.
    #[error(
        "the mapped file lost pages under the mapping (SIGBUS); the mapping is no longer used"
    )]
    Broken,
}

/// A slot's states: free, being filled in by [`GuardedMap::map`], or listed (the
/// handler looks at listed slots only).
const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const LISTED: u8 = 2;

struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    /// The mapping's page size: what one fault's replacement covers.
    page: AtomicUsize,
    broken: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(FREE),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            page: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }
}

static SLOTS: [Slot; MAX_GUARDED] = [const { Slot::new() }; MAX_GUARDED];

/// The SIGBUS disposition found when the handler was installed, to pass other
/// faults on to.
static PREVIOUS: OnceLock<Result<libc::sigaction, i32>> = OnceLock::new();

/// A shared, read-write mapping of part of a file, whose copies fail cleanly
/// instead of killing the process where the file lost its pages.
#[derive(Debug)]
pub struct GuardedMap {
    ptr: *mut u8,
    len: usize,
    slot: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through raw-pointer
// copies of the caller's own buffers, and the slot is only touched with atomics.
unsafe impl Send for GuardedMap {}
// SAFETY: as above; concurrent copies of one mapping race as RDMA operations on one
// region do, on plain bytes valid in any state.
unsafe impl Sync for GuardedMap {}

impl GuardedMap {
    /// Maps `len` bytes of `fd` from byte `offset` (a multiple of the file's page
    /// size), shared and read-write, and guards it.
    pub fn map(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<GuardedMap> {
        install()?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty mapping",
            ));
        }
        let page = page_size_of(fd)?;
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off_t"))?;
        let slot = claim_slot().ok_or_else(|| {
            io::Error::other(format!(
                "{MAX_GUARDED} mappings are guarded already in this process"
            ))
        })?;
        // SAFETY: a fresh mapping at an address of the kernel's choosing; `fd` is a
        // valid descriptor for the call.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            SLOTS[slot].state.store(FREE, Ordering::Release);
            return Err(e);
        }
        let s = &SLOTS[slot];
        s.start.store(p as usize, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.page.store(page, Ordering::Relaxed);
        s.broken.store(false, Ordering::Relaxed);
        s.state.store(LISTED, Ordering::Release);
        Ok(GuardedMap {
            ptr: p.cast(),
            len,
            slot,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True once a fault replaced a page: every later copy fails.
    pub fn is_broken(&self) -> bool {
        SLOTS[self.slot].broken.load(Ordering::Acquire)
    }

    /// Copies `dst.len()` bytes at offset `at` of the mapping into `dst`.
    pub fn read(&self, at: usize, dst: &mut [u8]) -> Result<(), MapError> {
        let src = self.range(at, dst.len())?;
        // SAFETY: `range` checked that `[at, at + len)` lies inside the mapping, which
        // lives as long as `self`; `dst` is the caller's own buffer, never part of it.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        self.unbroken_after_copy()
    }

    /// Copies `src` to offset `at` of the mapping.
    pub fn write(&self, at: usize, src: &[u8]) -> Result<(), MapError> {
        let dst = self.range(at, src.len())?;
        // SAFETY: as in `read`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        self.unbroken_after_copy()
    }

    /// The start of `[at, at + len)` in the mapping, checked.
    fn range(&self, at: usize, len: usize) -> Result<*mut u8, MapError> {
        let out = MapError::OutOfRange {
            at,
            len,
            size: self.len,
        };
        match at.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(out),
        }
        self.unbroken()?;
        // SAFETY: `at <= self.len`, so the pointer stays inside (or one past) the
        // mapping.
        Ok(unsafe { self.ptr.add(at) })
    }

    /// [`GuardedMap::unbroken`] after a copy, which the signal handler may have
    /// interrupted to mark the mapping broken. The compiler knows the copy touches
    /// only its two buffers and may otherwise treat the flag as unchanged since the
    /// load before the copy; a signal fence makes it load the flag again after the
    /// copy, as the handler left it.
    fn unbroken_after_copy(&self) -> Result<(), MapError> {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        self.unbroken()
    }

    fn unbroken(&self) -> Result<(), MapError> {
        if self.is_broken() {
            Err(MapError::Broken)
        } else {
            Ok(())
        }
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Off the list first: once unmapped, the addresses may be anyone's.
        let s = &SLOTS[self.slot];
        s.state.store(CLAIMED, Ordering::Release);
        // SAFETY: exactly the mapping `map` made (pages the handler replaced are
        // part of the range too); no copy of `self` can be running (we own it).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        s.state.store(FREE, Ordering::Release);
    }
}

fn claim_slot() -> Option<usize> {
    SLOTS.iter().position(|s| {
        s.state
            .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// The page size of mappings of `fd`: the huge page size on hugetlbfs.
fn page_size_of(fd: BorrowedFd<'_>) -> io::Result<usize> {
    // SAFETY: an all-zero statfs is a valid value for fstatfs to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statfs to fill.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    if st.f_type as i64 == HUGETLBFS_MAGIC {
        return usize::try_from(st.f_bsize).map_err(io::Error::other);
    }
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).map_err(|_| io::Error::other("sysconf(_SC_PAGESIZE) failed"))
}

/// Installs the SIGBUS handler once per process; later calls return what the first
/// one found.
fn install() -> io::Result<()> {
    let found = PREVIOUS.get_or_init(|| {
        // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn of
        // the three-argument form SA_SIGINFO asks for.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &new, &mut old) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            Ok(old)
        }
    });
    match found {
        Ok(_) => Ok(()),
        Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
    }
}

/// The SIGBUS handler. Async-signal-safe: atomics, `mmap` and `sigaction` only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &SLOTS {
        if s.state.load(Ordering::Acquire) != LISTED {
            continue;
        }
        let start = s.start.load(Ordering::Relaxed);
        let len = s.len.load(Ordering::Relaxed);
        if addr < start || addr - start >= len {
            continue;
        }
        let page = s.page.load(Ordering::Relaxed);
        let at = addr & !(page - 1);
        // SAFETY: `at..at + page` lies inside a mapping of ours (mappings start and
        // end on their page size); it becomes private zero-filled memory, which the
        // interrupted copy can finish on.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            s.broken.store(true, Ordering::Release);
            return;
        }
        break;
    }
    pass_on(sig, info, ctx);
}

/// A fault that is not ours: to the disposition found at install.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = match PREVIOUS.get() {
        Some(Ok(p)) => *p,
        _ => return default_and_return(sig),
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return default_and_return(sig);
    }
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it is of
        // this form; it gets exactly what the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: as above, the one-argument form.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

/// Puts the default disposition back and returns: the faulting access runs again,
/// faults again and ends the process as if no handler had been there.
fn default_and_return(sig: libc::c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is valid; sigaction is
    // async-signal-safe.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
