//! The lent memory: one mapping reserved at start and unmapped on drop: anonymous,
//! or a shared mapping of a memory file ([`Region::map_file`], `memnode
//! --memory-file`) whose pages outlive the process.
//!
//! The mapping is `MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`, so reserving a large
//! region costs address space only; pages become resident as clients write them. With
//! huge pages requested, the region is first tried as `MAP_HUGETLB` 2 MiB pages
//! (without `MAP_NORESERVE`: a hugetlb mapping that is not reserved up front can
//! SIGBUS on first touch when the pool runs dry, so we would rather fail `mmap` and
//! fall back to normal pages with a warning). [`Region::granularity`] is the page
//! size really in use; the allocator hands out whole multiples of it.
//!
//! Invariant: **free memory reads as zero.** The mapping starts zeroed, and every
//! range given back is zeroed by [`Region::zero`] before it can be handed out again:
//! whole pages with `madvise(MADV_DONTNEED)` (which also returns them to the OS, so
//! RSS falls after frees), anything else, or everything if `madvise` fails, by
//! writing zeros. A file mapping is always zeroed by writing: `MADV_DONTNEED` would
//! only drop this process's view of a shared page, whose bytes stay in the file, and
//! punching the pages out (`MADV_REMOVE`) would give back the room the memory file
//! reserved up front, so a later write could find the filesystem full and SIGBUS.
//!
//! Access: clients' bytes move in and out through the fabric, which reads and writes
//! the chunks the pool registered with it (the NIC with verbs, raw pointer copies in
//! the tcp backend); no Rust reference to mapped memory is ever formed, so concurrent
//! copies never alias a `&mut`. (`Region::read` and `Region::write` copy the memory
//! file's books, a mapping of their own that no client reaches, and serve tests.) The pool deregisters a chunk (which waits out
//! in-flight accesses) before zeroing it. Two in-flight copies of one owner that
//! overlap leave unspecified bytes behind, exactly as two RDMA operations racing on a
//! NIC do; the bytes are plain `u8`, valid in any state.

use std::ptr::{self, NonNull};
use thiserror::Error;

/// The huge page size tried with `--huge-pages` (`MAP_HUGE_2MB`).
pub const HUGE_PAGE: u64 = 2 << 20;

#[derive(Debug, Error)]
pub enum RegionError {
    #[error("region of {size} bytes is smaller than one {page}-byte page")]
    TooSmall { size: u64, page: u64 },
    #[error("region of {0} bytes does not fit in this machine's address space")]
    TooLarge(u64),
    #[error("cannot map {size} bytes of the memory file at {base:#x}: {source}")]
    MapFile {
        size: u64,
        base: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reserve {size} bytes of memory: {source}")]
    Map {
        size: u64,
        #[source]
        source: std::io::Error,
    },
}

/// A range outside the mapping was named.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("range of {len} bytes at offset {offset:#x} is outside the region")]
pub struct OutOfRegion {
    pub offset: u64,
    pub len: u64,
}

/// One anonymous mapping of `len` bytes starting at `ptr`.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    granularity: u64,
    huge: bool,
    /// A shared mapping of a memory file (zeroed by writing zeros).
    shared: bool,
    /// The file behind a shared mapping and the offset of the region in it, to
    /// offer to clients on this host (the mapped fabric).
    file: Option<(std::os::fd::OwnedFd, u64)>,
    /// A memfd of our own: whole pages are zeroed by punching them out of the file,
    /// which returns them to the OS for every mapping of it.
    punch: bool,
}

// SAFETY: `Region` owns its mapping outright (nothing else unmaps it) and only ever
// touches it through bounds-checked raw pointer copies; no thread-affine state exists.
unsafe impl Send for Region {}
// SAFETY: shared use only performs raw copies into/out of the mapping and madvise
// calls; none of them create references into it (see the module docs for the
// ownership rules callers keep).
unsafe impl Sync for Region {}

/// The operating system's page size (at least 4 KiB).
pub fn system_page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).unwrap_or(4096).max(4096)
}

impl Region {
    /// Reserves `size` bytes rounded down to whole pages (huge pages when asked for
    /// and available).
    pub fn reserve(size: u64, huge_pages: bool) -> Result<Region, RegionError> {
        if huge_pages {
            let len = size - size % HUGE_PAGE;
            if len == 0 {
                log::warn!(
                    "region of {size} bytes is smaller than one huge page; using normal pages"
                );
            } else {
                let flags = libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
                match map(len, flags) {
                    Ok((ptr, len)) => return Ok(Region::new(ptr, len, HUGE_PAGE, true)),
                    Err(e) => log::warn!(
                        "{} of 2 MiB huge pages unavailable ({}); falling back to normal \
                         pages (reserve hugetlb pages with vm.nr_hugepages)",
                        rmemfs_common::size::format_size(len),
                        match &e {
                            RegionError::Map { source, .. } => source.to_string(),
                            other => other.to_string(),
                        }
                    ),
                }
            }
        }
        let page = system_page_size();
        let len = size - size % page;
        if len == 0 {
            return Err(RegionError::TooSmall { size, page });
        }
        let (ptr, len) = map(len, libc::MAP_NORESERVE)?;
        Ok(Region::new(ptr, len, page, false))
    }

    fn new(ptr: NonNull<u8>, len: usize, granularity: u64, huge: bool) -> Region {
        Region {
            ptr,
            len,
            granularity,
            huge,
            shared: false,
            file: None,
            punch: false,
        }
    }

    /// As [`Region::reserve`], but the memory is a memfd mapped shared, so that it
    /// can be offered to clients on this host by descriptor (the mapped fabric).
    /// Huge pages are a hugetlb memfd, with the same fallback as `reserve`.
    pub fn reserve_shareable(size: u64, huge_pages: bool) -> Result<Region, RegionError> {
        let mut tries: Vec<(u64, libc::c_uint)> = Vec::new();
        if huge_pages && size >= HUGE_PAGE {
            tries.push((HUGE_PAGE, libc::MFD_HUGETLB | libc::MFD_HUGE_2MB));
        }
        tries.push((system_page_size(), 0));
        let mut last = None;
        for (page, flags) in tries {
            let len = size - size % page;
            if len == 0 {
                return Err(RegionError::TooSmall { size, page });
            }
            match memfd_region(len, page, flags) {
                Ok(r) => return Ok(r),
                Err(e) => {
                    if page == HUGE_PAGE {
                        log::warn!("a hugetlb memory file is unavailable ({e}); falling back to normal pages");
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one try"))
    }

    /// The file behind the region and the region's offset in it, for clients to
    /// map; `None` for anonymous memory.
    pub fn shared_file(&self) -> Option<std::io::Result<(std::os::fd::OwnedFd, u64)>> {
        let (fd, offset) = self.file.as_ref()?;
        Some(fd.try_clone().map(|fd| (fd, *offset)))
    }

    /// Maps `len` bytes of `file` from `offset` shared, read/write, at exactly `base`
    /// (the addresses clients hold are virtual addresses of the region, so a memnode
    /// restarting on its memory file must put it where it was), or, with `base`
    /// `None`, at a random address of its own choosing. `granularity` is the page of
    /// the file's filesystem (2 MiB on hugetlbfs).
    pub fn map_file(
        file: &std::fs::File,
        offset: u64,
        len: u64,
        base: Option<u64>,
        granularity: u64,
    ) -> Result<Region, RegionError> {
        use std::os::fd::AsRawFd;
        let len_usize = usize::try_from(len).map_err(|_| RegionError::TooLarge(len))?;
        let off = libc::off_t::try_from(offset).map_err(|_| RegionError::TooLarge(offset))?;
        let candidates: Vec<u64> = match base {
            Some(b) => vec![b],
            None => (0..16).filter_map(|_| random_base(len)).collect(),
        };
        let mut last = std::io::Error::other("no address to map at");
        for want in &candidates {
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping (it fails
            // with EEXIST instead), so no Rust object can be overwritten or aliased;
            // the fd is open for the call.
            let p = unsafe {
                libc::mmap(
                    *want as *mut libc::c_void,
                    len_usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                    file.as_raw_fd(),
                    off,
                )
            };
            if p == libc::MAP_FAILED {
                last = std::io::Error::last_os_error();
                continue;
            }
            if p as u64 != *want {
                // A kernel older than 4.17 takes the flag as a hint only.
                // SAFETY: p/len are what mmap just returned; nothing refers to it.
                unsafe { libc::munmap(p, len_usize) };
                last = std::io::Error::other("the kernel placed the mapping elsewhere");
                continue;
            }
            let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| RegionError::Map {
                size: len,
                source: std::io::Error::other("mmap returned a null mapping"),
            })?;
            let mut r = Region::new(
                ptr,
                len_usize,
                granularity,
                granularity > system_page_size(),
            );
            r.shared = true;
            r.file = Some((
                file.try_clone()
                    .map_err(|source| RegionError::MapFile {
                        size: len,
                        base: *want,
                        source,
                    })?
                    .into(),
                offset,
            ));
            return Ok(r);
        }
        Err(RegionError::MapFile {
            size: len,
            base: base.unwrap_or(0),
            source: last,
        })
    }

    /// The address of the first byte; remote addresses are these virtual addresses.
    pub fn base(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Bytes in the region (a whole number of [`Region::granularity`] pages).
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// The page size really in use: 2 MiB with huge pages, the OS page otherwise.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// True when the region is backed by hugetlb pages.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// Checks `[offset, offset + len)` lies inside the mapping; returns the offset as
    /// usize.
    fn check(&self, offset: u64, len: usize) -> Result<usize, OutOfRegion> {
        let err = OutOfRegion {
            offset,
            len: len as u64,
        };
        let start = usize::try_from(offset).map_err(|_| err)?;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(start),
            _ => Err(err),
        }
    }

    /// Copies `dst.len()` bytes at `offset` into `dst` (the memory file's books;
    /// tests).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), OutOfRegion> {
        let start = self.check(offset, dst.len())?;
        // SAFETY: `check` proved [start, start + dst.len()) lies inside the live
        // mapping (readable for its whole life); `dst` is a distinct local buffer, so
        // the ranges cannot overlap; no reference into the mapping is created.
        unsafe {
            ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// Copies `src` into the region at `offset` (the memory file's books; tests).
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), OutOfRegion> {
        let start = self.check(offset, src.len())?;
        // SAFETY: `check` proved [start, start + src.len()) lies inside the live,
        // writable mapping; `src` is a distinct local buffer, so the ranges cannot
        // overlap; no reference into the mapping is created.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(start), src.len());
        }
        Ok(())
    }

    /// Copies `len` bytes at `src` to `dst` (offsets; the ranges may overlap). The
    /// caller keeps both ranges from being freed meanwhile (the pool holds its chunk
    /// table, see `ChunkPool::copy`).
    pub fn copy_within(&self, src: u64, dst: u64, len: u64) -> Result<(), OutOfRegion> {
        let n = usize::try_from(len).map_err(|_| OutOfRegion { offset: src, len })?;
        let from = self.check(src, n)?;
        let to = self.check(dst, n)?;
        // SAFETY: `check` proved both ranges lie inside the live, writable mapping;
        // `ptr::copy` allows them to overlap; no reference into the mapping is made
        // (one-sided accesses of the same bytes race as they do with each other).
        unsafe {
            ptr::copy(self.ptr.as_ptr().add(from), self.ptr.as_ptr().add(to), n);
        }
        Ok(())
    }

    /// Makes `[offset, offset + len)` read as zero. Whole pages inside the range are
    /// dropped with `madvise(MADV_DONTNEED)` (returning them to the OS); the
    /// unaligned head and tail, or the whole range if madvise fails, are overwritten.
    /// The caller must own the range exclusively (no registration covers it).
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), OutOfRegion> {
        let len_usize = usize::try_from(len).map_err(|_| OutOfRegion { offset, len })?;
        let start = self.check(offset, len_usize)?;
        let end = start + len_usize;
        let page = self.granularity as usize;
        if self.punch {
            let inner_start = start.div_ceil(page) * page;
            let inner_end = end / page * page;
            if inner_start < inner_end && self.punch_out(inner_start, inner_end) {
                self.fill_zero(start, inner_start);
                self.fill_zero(inner_end, end);
                return Ok(());
            }
        }
        if self.shared {
            self.fill_zero(start, end);
            return Ok(());
        }
        let inner_start = start.div_ceil(page) * page;
        let inner_end = end / page * page;
        if inner_start < inner_end {
            // SAFETY: [inner_start, inner_end) is inside the mapping and page-aligned
            // (the base is page-aligned by mmap); MADV_DONTNEED on our own private
            // anonymous mapping only discards contents, which the caller owns.
            let rc = unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(inner_start).cast(),
                    inner_end - inner_start,
                    libc::MADV_DONTNEED,
                )
            };
            if rc == 0 {
                self.fill_zero(start, inner_start);
                self.fill_zero(inner_end, end);
                return Ok(());
            }
            log::debug!(
                "madvise(MADV_DONTNEED) failed ({}); zeroing by hand",
                std::io::Error::last_os_error()
            );
        }
        self.fill_zero(start, end);
        Ok(())
    }

    /// Punches `[start, end)` (whole pages, checked) out of the memfd: they read as
    /// zero in every mapping and their memory goes back to the OS. False if the
    /// filesystem refused.
    fn punch_out(&self, start: usize, end: usize) -> bool {
        use std::os::fd::AsRawFd;
        let Some((fd, offset)) = &self.file else {
            return false;
        };
        let (Ok(at), Ok(n)) = (
            libc::off_t::try_from(*offset + start as u64),
            libc::off_t::try_from(end - start),
        ) else {
            return false;
        };
        // SAFETY: a valid descriptor; punching only changes the file's contents, which
        // the caller owns in this range.
        let rc = unsafe {
            libc::fallocate(
                fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at,
                n,
            )
        };
        if rc != 0 {
            log::debug!(
                "fallocate(PUNCH_HOLE) failed ({}); zeroing by hand",
                std::io::Error::last_os_error()
            );
        }
        rc == 0
    }

    /// Writes zeros over `[start, end)`, already checked to be inside the mapping.
    fn fill_zero(&self, start: usize, end: usize) {
        if start < end && end <= self.len {
            // SAFETY: start < end <= len, so the range is inside the live writable
            // mapping; no reference into it is created.
            unsafe { ptr::write_bytes(self.ptr.as_ptr().add(start), 0, end - start) };
        }
    }

    /// How many pages of `[offset, offset + len)` are resident in RAM (mincore).
    #[cfg(test)]
    pub fn resident_pages(&self, offset: u64, len: u64) -> std::io::Result<usize> {
        let os_page = system_page_size() as usize;
        let len_usize = usize::try_from(len).map_err(std::io::Error::other)?;
        let start = self
            .check(offset, len_usize)
            .map_err(std::io::Error::other)?;
        if start % os_page != 0 {
            return Err(std::io::Error::other("offset is not page-aligned"));
        }
        let mut vec = vec![0u8; len_usize.div_ceil(os_page)];
        // SAFETY: the range starts page-aligned inside our mapping and `vec` holds one
        // byte per page of it, as mincore requires.
        let rc = unsafe {
            libc::mincore(
                self.ptr.as_ptr().add(start).cast(),
                len_usize,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 == 1).count())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; the region is being dropped,
        // so no copy can be in flight (they all borrow `self`).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            log::warn!("munmap failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// A random 1 GiB-aligned address between 16 and 64 TiB for a memory file's region
/// of `len` bytes: far from where the kernel puts the heap (just past the program)
/// and other mappings (below the stack, near 128 TiB), so the same address is
/// still free when the memnode restarts and maps its file there again.
fn random_base(len: u64) -> Option<u64> {
    const LOW: u64 = 16 << 40;
    const HIGH: u64 = 64 << 40;
    const ALIGN: u64 = 1 << 30;
    let span = HIGH.checked_sub(LOW + len.next_multiple_of(ALIGN))? / ALIGN;
    let r = getrandom::u64().ok()?;
    Some(LOW + (r % span.max(1)) * ALIGN)
}

/// A fresh memfd of `len` bytes (`flags` adds hugetlb) mapped shared.
fn memfd_region(len: u64, page: u64, flags: libc::c_uint) -> Result<Region, RegionError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let err = |source: std::io::Error| RegionError::Map { size: len, source };
    let len_usize = usize::try_from(len).map_err(|_| RegionError::TooLarge(len))?;
    let size = libc::off_t::try_from(len).map_err(|_| RegionError::TooLarge(len))?;
    // SAFETY: a valid C string and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"rmemfs-region".as_ptr(), libc::MFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: just returned by memfd_create, owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a valid descriptor; the result is checked.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // A hugetlb mapping is reserved up front (no MAP_NORESERVE), so a pool that runs
    // dry fails here rather than with a SIGBUS on first touch (see the module docs).
    let noreserve = if flags & libc::MFD_HUGETLB != 0 {
        0
    } else {
        libc::MAP_NORESERVE
    };
    // SAFETY: a fresh shared mapping of our own file at an address of the kernel's
    // choosing cannot overlap any Rust object.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len_usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | noreserve,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(err(std::io::Error::last_os_error()));
    }
    let ptr = NonNull::new(p.cast::<u8>())
        .ok_or_else(|| err(std::io::Error::other("mmap returned a null mapping")))?;
    let mut r = Region::new(ptr, len_usize, page, page > system_page_size());
    r.file = Some((fd, 0));
    r.punch = true;
    Ok(r)
}

/// mmaps `len` bytes of private anonymous read/write memory with `extra` flags;
/// returns the mapping and its length.
fn map(len: u64, extra: libc::c_int) -> Result<(NonNull<u8>, usize), RegionError> {
    let len_usize = usize::try_from(len).map_err(|_| RegionError::TooLarge(len))?;
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing cannot
    // overlap or alias any existing Rust object.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len_usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(RegionError::Map {
            size: len,
            source: std::io::Error::last_os_error(),
        });
    }
    let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| RegionError::Map {
        size: len,
        source: std::io::Error::other("mmap returned a null mapping"),
    })?;
    Ok((ptr, len_usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(size: u64) -> Region {
        Region::reserve(size, false).expect("a small region can be reserved")
    }

    #[test]
    fn size_is_rounded_down_to_whole_pages() {
        let page = system_page_size();
        let r = region(3 * page + 100);
        assert_eq!(r.len(), 3 * page, "expected 3 whole pages");
        assert_eq!(r.granularity(), page);
        assert_eq!(r.base() % page, 0, "expected a page-aligned base");
    }

    #[test]
    fn a_region_smaller_than_a_page_is_refused() {
        assert!(matches!(
            Region::reserve(100, false),
            Err(RegionError::TooSmall { size: 100, .. })
        ));
    }

    #[test]
    fn huge_pages_fall_back_to_normal_pages_when_unavailable() {
        let r = Region::reserve(4 * HUGE_PAGE, true).expect("reserve succeeds either way");
        assert_eq!(r.len(), 4 * HUGE_PAGE);
        let want = if r.huge_pages() {
            HUGE_PAGE
        } else {
            system_page_size()
        };
        assert_eq!(
            r.granularity(),
            want,
            "granularity must match the pages in use"
        );
        r.write(HUGE_PAGE, b"huge").expect("in bounds");
        let mut back = [0u8; 4];
        r.read(HUGE_PAGE, &mut back).expect("in bounds");
        assert_eq!(&back, b"huge");
    }

    #[test]
    fn fresh_memory_reads_as_zero_and_writes_read_back() {
        let r = region(1 << 20);
        let mut buf = vec![0xffu8; 8192];
        r.read(4000, &mut buf).expect("in bounds");
        assert!(
            buf.iter().all(|&b| b == 0),
            "fresh memory must read as zero"
        );
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        r.write(4000, &data).expect("in bounds");
        r.read(4000, &mut buf).expect("in bounds");
        assert_eq!(buf, data, "bytes written must read back unchanged");
    }

    #[test]
    fn copies_outside_the_region_are_refused() {
        let r = region(1 << 16);
        let mut buf = [0u8; 16];
        let len = r.len();
        assert!(r.read(len - 8, &mut buf).is_err(), "read past the end");
        assert!(r.write(len, &buf).is_err(), "write at the end");
        assert!(r.read(u64::MAX - 4, &mut buf).is_err(), "offset overflow");
        assert!(r.zero(len - 8, 16).is_err(), "zero past the end");
        assert!(r.zero(8, u64::MAX).is_err(), "zero length overflow");
        assert!(
            r.read(len - 16, &mut buf).is_ok(),
            "last 16 bytes are in bounds"
        );
    }

    #[test]
    fn zero_clears_unaligned_ranges_and_leaves_neighbours() {
        let page = system_page_size();
        let r = region(8 * page);
        r.write(0, &vec![0xaa; (8 * page) as usize])
            .expect("in bounds");
        // From the middle of page 1 to the middle of page 5.
        let (start, end) = (page + 100, 5 * page + 200);
        r.zero(start, end - start).expect("in bounds");
        let mut all = vec![0u8; (8 * page) as usize];
        r.read(0, &mut all).expect("in bounds");
        for (i, &b) in all.iter().enumerate() {
            let i = i as u64;
            let want = if (start..end).contains(&i) { 0 } else { 0xaa };
            assert_eq!(b, want, "byte {i}: expected {want:#x}");
        }
    }

    #[test]
    fn a_shareable_region_is_a_file_another_mapping_sees_and_zeroing_punches_it() {
        use std::os::fd::AsRawFd;
        let page = system_page_size();
        let r = Region::reserve_shareable(16 * page, false).expect("memfd region");
        let (fd, offset) = r.shared_file().expect("a file").expect("dup");
        assert_eq!(offset, 0);
        r.write(page, &[7; 100]).expect("in bounds");
        let mut seen = [0u8; 100];
        // SAFETY: reads the region's file through its descriptor.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                seen.as_mut_ptr().cast(),
                100,
                page as libc::off_t,
            )
        };
        assert_eq!(n, 100);
        assert_eq!(seen, [7; 100], "the file holds the region's bytes");
        r.write(0, &vec![1; (16 * page) as usize])
            .expect("in bounds");
        r.zero(4 * page + 10, 8 * page).expect("in bounds");
        assert_eq!(
            r.resident_pages(5 * page, 7 * page).expect("mincore"),
            0,
            "whole pages punched out go back to the OS"
        );
        let mut back = vec![9u8; (16 * page) as usize];
        r.read(0, &mut back).expect("in bounds");
        let zeroed = (4 * page + 10) as usize..(12 * page + 10) as usize;
        assert!(back[zeroed.clone()].iter().all(|&b| b == 0), "zeroed");
        assert!(back[..zeroed.start].iter().all(|&b| b == 1), "before kept");
        assert!(back[zeroed.end..].iter().all(|&b| b == 1), "after kept");
        assert!(r.shared_file().is_some());
        assert!(
            region(16 * page).shared_file().is_none(),
            "anonymous memory is no file"
        );
    }

    #[test]
    fn zero_returns_whole_pages_to_the_os() {
        let page = system_page_size();
        let r = region(16 * page);
        r.write(0, &vec![1; (16 * page) as usize])
            .expect("in bounds");
        let before = r.resident_pages(0, 16 * page).expect("mincore");
        assert_eq!(before, 16, "written pages must be resident");
        r.zero(4 * page, 8 * page).expect("in bounds");
        let after = r.resident_pages(4 * page, 8 * page).expect("mincore");
        assert_eq!(after, 0, "zeroed whole pages must no longer be resident");
        assert_eq!(r.resident_pages(0, 4 * page).expect("mincore"), 4);
    }
}
