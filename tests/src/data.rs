//! File contents for tests: reproducible pseudorandom data, reads that bypass the kernel
//! page cache, and comparisons that name the first differing offset.
//!
//! A [`Pattern`] is a seed; byte `i` of its stream depends only on the seed and `i`
//! (the stream is cut into 1 MiB chunks, each generated from `seed` and its index), so
//! any range can be regenerated for comparison without keeping the data in memory.
//!
//! The kernel keeps its own page cache in front of a FUSE filesystem, so a plain read
//! after a write may never reach fsd. [`UncachedReader`] opens with `O_DIRECT`, which
//! sends every read to fsd (and, when fsd's cache misses, to the memnode).

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, IntoRawFd};
use std::path::Path;

pub const MIB: u64 = 1 << 20;
/// Pattern chunks, and the unit tests write and compare in.
const CHUNK: u64 = MIB;
/// Alignment for O_DIRECT buffers, offsets and lengths.
const ALIGN: usize = 4096;

/// A reproducible stream of pseudorandom bytes.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    seed: u64,
}

impl Pattern {
    pub fn new(seed: u64) -> Pattern {
        Pattern { seed }
    }

    /// The pattern for `test`: seeded from `RMEMFS_TEST_SEED` when set, else at random.
    /// Prints the seed so a failure can be repeated.
    pub fn for_test(test: &str) -> Pattern {
        let seed = std::env::var("RMEMFS_TEST_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(rand::random);
        println!("{test}: data seed {seed} (RMEMFS_TEST_SEED={seed} repeats it)");
        Pattern { seed }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Another independent pattern derived from this one (for a second file, ...).
    pub fn derive(&self, n: u64) -> Pattern {
        Pattern {
            seed: mix(self.seed ^ mix(n.wrapping_add(0x5bd1_e995))),
        }
    }

    fn chunk(&self, index: u64, out: &mut [u8]) {
        debug_assert_eq!(out.len() as u64, CHUNK);
        StdRng::seed_from_u64(mix(self.seed ^ mix(index))).fill_bytes(out);
    }

    /// Fills `buf` with the stream's bytes at `offset..offset + buf.len()`.
    pub fn fill(&self, offset: u64, buf: &mut [u8]) {
        let mut scratch = vec![0u8; CHUNK as usize];
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let index = pos / CHUNK;
            let within = (pos % CHUNK) as usize;
            let n = (CHUNK as usize - within).min(buf.len() - done);
            if within == 0 && n == CHUNK as usize {
                self.chunk(index, &mut buf[done..done + n]);
            } else {
                self.chunk(index, &mut scratch);
                buf[done..done + n].copy_from_slice(&scratch[within..within + n]);
            }
            done += n;
        }
    }

    /// The stream's bytes at `offset..offset + len`.
    pub fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill(offset, &mut v);
        v
    }

    /// Writes the stream's bytes `offset..offset + len` to `file` at the same offsets,
    /// in 1 MiB pieces; `progress` is called after each piece with the bytes written.
    pub fn write_range(
        &self,
        file: &File,
        offset: u64,
        len: u64,
        mut progress: impl FnMut(u64),
    ) -> io::Result<()> {
        let mut buf = vec![0u8; CHUNK as usize];
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = (CHUNK - pos % CHUNK).min(end - pos) as usize;
            self.fill(pos, &mut buf[..n]);
            file.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
            progress(pos - offset);
        }
        Ok(())
    }

    /// Creates (or truncates) `path`, writes `len` bytes of the stream, fsyncs and
    /// closes it. Panics on any error.
    pub fn write_file(&self, path: &Path, len: u64) {
        let file = create(path);
        self.write_range(&file, 0, len, |_| {})
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        file.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {}: {e}", path.display()));
        drop(file);
    }

    /// Creates `path` (which must not exist), writes `len` bytes of the stream, fsyncs
    /// and closes it, saying which step failed: on a full filesystem the error may
    /// come at write, fsync or close (write-back defers it).
    pub fn try_write_file(&self, path: &Path, len: u64) -> Result<(), (&'static str, io::Error)> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| ("open", e))?;
        self.write_range(&file, 0, len, |_| {})
            .map_err(|e| ("write", e))?;
        file.sync_all().map_err(|e| ("fsync", e))?;
        let fd = file.into_raw_fd();
        // SAFETY: `fd` came from into_raw_fd, so it is open and owned by nobody else.
        if unsafe { libc::close(fd) } != 0 {
            return Err(("close", io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Checks that `path` is exactly `len` bytes of the stream, reading around the
    /// kernel page cache; panics naming the first differing offset.
    pub fn verify_file(&self, path: &Path, len: u64) {
        let size = std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("stat of {}: {e}", path.display()))
            .len();
        assert_eq!(size, len, "size of {}", path.display());
        let mut r = UncachedReader::open(path)
            .unwrap_or_else(|e| panic!("opening {} for reading: {e}", path.display()));
        let mut expected = vec![0u8; CHUNK as usize];
        let mut pos = 0;
        while pos < len {
            let n = CHUNK.min(len - pos) as usize;
            let got = r
                .read_at(pos, n)
                .unwrap_or_else(|e| panic!("reading {} at {pos}: {e}", path.display()));
            self.fill(pos, &mut expected[..n]);
            assert_bytes_eq(&expected[..n], &got, pos, &path.display().to_string());
            pos += n as u64;
        }
    }
}

/// splitmix64's finaliser: spreads seeds and indices over all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Creates or truncates `path` for writing; panics on error.
pub fn create(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()))
}

/// Writes `data` to a new file at `path`, fsyncs and closes it; panics on error.
pub fn write_small(path: &Path, data: &[u8]) {
    let mut f = create(path);
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Index of the first byte where `a` and `b` differ (a length difference counts at the
/// shorter length).
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then_some(a.len().min(b.len())))
}

/// Panics unless `actual == expected`, naming the first differing file offset (`base`
/// is the file offset of the first byte).
#[track_caller]
pub fn assert_bytes_eq(expected: &[u8], actual: &[u8], base: u64, what: &str) {
    if let Some(i) = first_difference(expected, actual) {
        let show = |v: &[u8]| format!("{:02x?}", &v[i.min(v.len())..(i + 16).min(v.len())]);
        panic!(
            "{what}: first difference at offset {} (read {} bytes, expected {}): \
             expected {} got {}",
            base + i as u64,
            actual.len(),
            expected.len(),
            show(expected),
            show(actual)
        );
    }
}

/// Reads a file around the kernel page cache: with `O_DIRECT` where the filesystem
/// takes it, else after `POSIX_FADV_DONTNEED` on the range each time.
pub struct UncachedReader {
    file: File,
    direct: bool,
    buf: Vec<u8>,
}

impl UncachedReader {
    pub fn open(path: &Path) -> io::Result<UncachedReader> {
        let (file, direct) = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                println!(
                    "{}: O_DIRECT refused, reading after POSIX_FADV_DONTNEED instead",
                    path.display()
                );
                (File::open(path)?, false)
            }
            Err(e) => return Err(e),
        };
        Ok(UncachedReader {
            file,
            direct,
            buf: Vec::new(),
        })
    }

    /// True when reads use O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Up to `len` bytes at `offset` (fewer only at end of file).
    pub fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let start = offset - offset % ALIGN as u64;
        let skip = (offset - start) as usize;
        let span = (skip + len).div_ceil(ALIGN) * ALIGN;
        if self.buf.len() < span + ALIGN {
            self.buf.resize(span + ALIGN, 0);
        }
        let shift = self.buf.as_ptr().align_offset(ALIGN);
        let window = &mut self.buf[shift..shift + span];
        if !self.direct {
            // SAFETY: posix_fadvise takes an open descriptor and plain integers.
            let rc = unsafe {
                libc::posix_fadvise(
                    self.file.as_raw_fd(),
                    start as libc::off_t,
                    span as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        let mut filled = 0;
        while filled < span {
            match self
                .file
                .read_at(&mut window[filled..], start + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let end = filled.min(skip + len);
        Ok(window[skip.min(end)..end].to_vec())
    }
}

/// Reads `len` bytes at `offset` of `path` around the kernel page cache
/// ([`UncachedReader`]) under the time limit `limit` (a hang fails the test), and
/// returns the result and how long it took.
pub fn timed_uncached_read(
    path: std::path::PathBuf,
    offset: u64,
    len: usize,
    limit: std::time::Duration,
) -> (std::io::Result<Vec<u8>>, std::time::Duration) {
    crate::within(
        limit,
        &format!("reading {} at {offset}", path.display()),
        move || {
            let t = std::time::Instant::now();
            let r = UncachedReader::open(&path).and_then(|mut r| r.read_at(offset, len));
            (r, t.elapsed())
        },
    )
}
