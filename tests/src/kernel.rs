//! The kernel's page cache, seen from a test: dropping it (so the next read must come
//! from the filesystem) and counting a file's pages that are in it (mincore).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Writes back every dirty page (sync) and drops the whole clean page cache, dentries
/// and inodes (`echo 3 > /proc/sys/vm/drop_caches`, root only). After this a read of a
/// FUSE file goes to the daemon. It affects the whole machine, briefly.
pub fn drop_page_cache() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").unwrap_or_else(|e| {
        panic!("writing 3 to /proc/sys/vm/drop_caches (these tests run as root): {e}")
    });
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf with a valid name has no side effects.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096)
}

/// How many of the pages of `file`'s first `len` bytes are in the kernel's page cache
/// (mincore(2) on a read-only shared mapping, which maps without faulting anything in).
pub fn resident_pages(file: &File, len: usize) -> io::Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    let pages = len.div_ceil(page_size());
    // SAFETY: a fresh mapping of an open descriptor; the kernel picks the address.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; pages];
    // SAFETY: `addr..addr+len` is the mapping made above; `vec` has one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly the mapping made above, which nothing else refers to.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    Ok(vec.iter().filter(|b| **b & 1 != 0).count())
}
