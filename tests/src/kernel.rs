//! The kernel's page cache, seen from a test: dropping it (so the next read must come
//! from the filesystem), counting a file's pages that are in it (mincore), mappings of
//! files (mmap) and aligned buffers for O_DIRECT.

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

/// A memory mapping of a file (mmap(2)), unmapped on drop.
pub struct Mapping {
    addr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through & and
// &mut like any buffer.
unsafe impl Send for Mapping {}

impl Mapping {
    /// mmap(NULL, len, prot, flags, fd, 0).
    pub fn new(file: &File, len: usize, prot: i32, flags: i32) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping of an open descriptor; the kernel picks the address.
        let addr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, file.as_raw_fd(), 0) };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr: addr.cast(),
            len,
        })
    }

    /// A shared read-write mapping (stores go to the file).
    pub fn shared(file: &File, len: usize) -> io::Result<Mapping> {
        Mapping::new(
            file,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
    }

    /// A private read-write mapping (stores are copy-on-write, never in the file).
    pub fn private(file: &File, len: usize) -> io::Result<Mapping> {
        Mapping::new(
            file,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
        )
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `addr..addr+len` is mapped readable for the life of self. Touching a
        // page wholly past the end of the file raises SIGBUS; callers map within it.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice, mapped writable by the constructors that callers
        // write through, and borrowed mutably from self.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }

    /// msync(MS_SYNC) of the whole mapping: its dirty pages written to the file.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the range is this mapping.
        if unsafe { libc::msync(self.addr.cast(), self.len, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping this value owns; no slice outlives it.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// A heap buffer whose start is aligned to `align` bytes (O_DIRECT wants the buffer,
/// offset and length aligned to the logical block size).
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let storage = vec![0u8; len + align];
        let start = storage.as_ptr().align_offset(align);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8], align: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new(data.len(), align);
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// statvfs(2) of `path`; panics with the OS error when it fails.
pub fn statvfs(path: &std::path::Path) -> libc::statvfs {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: statvfs is plain data, so all-zero is a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statvfs to fill.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(
        rc,
        0,
        "statvfs of {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    st
}
