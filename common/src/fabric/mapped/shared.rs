//! Small shared-memory pieces of the mapped backend: a memfd and a mapping of one
//! whole file, seen as a slice of atomics (never as plain bytes, since another
//! process writes it at any time).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A fresh memory file of `len` bytes (zeros), closed on exec.
pub fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a memfd name"))?;
    // SAFETY: a valid C string and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length beyond off_t"))?;
    // SAFETY: a valid descriptor; the result is checked.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The size of the file behind `fd`.
pub fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let f = std::fs::File::from(fd.try_clone_to_owned()?);
    Ok(f.metadata()?.len())
}

/// A shared mapping of a whole small file (a table or a page of counters), read-write
/// or read-only, unmapped on drop.
#[derive(Debug)]
pub struct SharedWords {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is only reached through atomics.
unsafe impl Send for SharedWords {}
// SAFETY: as above.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps all of `fd`, which must be `len` bytes long (a multiple of 8).
    pub fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<SharedWords> {
        if len == 0 || !len.is_multiple_of(8) || file_len(fd)? != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the shared file is not {len} bytes long"),
            ));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping at an address of the kernel's choosing, of a file
        // checked to be `len` bytes long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedWords { ptr: p.cast(), len })
    }

    /// A fresh memfd of `len` bytes and its read-write mapping.
    pub fn create(name: &str, len: usize) -> io::Result<(OwnedFd, SharedWords)> {
        let fd = memfd(name, len as u64)?;
        let words = SharedWords::map(fd.as_fd(), len, true)?;
        Ok((fd, words))
    }

    /// The 32-bit word at byte `at` (a multiple of 4 inside the mapping).
    pub fn u32_at(&self, at: usize) -> &AtomicU32 {
        assert!(
            at.is_multiple_of(4) && at + 4 <= self.len,
            "word {at} outside the mapping"
        );
        // SAFETY: in bounds and aligned (the mapping is page aligned); the memory is
        // mapped for `self`'s life and only ever reached through atomics.
        unsafe { AtomicU32::from_ptr(self.ptr.add(at).cast()) }
    }

    /// The 64-bit word at byte `at` (a multiple of 8 inside the mapping).
    pub fn u64_at(&self, at: usize) -> &AtomicU64 {
        assert!(
            at.is_multiple_of(8) && at + 8 <= self.len,
            "word {at} outside the mapping"
        );
        // SAFETY: as in `u32_at`.
        unsafe { AtomicU64::from_ptr(self.ptr.add(at).cast()) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; every reference handed out borrows
        // `self`, so none outlives it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
