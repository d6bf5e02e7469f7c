//! `copy_file_range(2)` inside fsd: one FUSE request copies a range from file to
//! file, read into a buffer of fsd's and written from it, instead of the kernel's
//! fallback moving every chunk from fsd to the caller and back (a read and a write
//! request per chunk, the data crossing the kernel twice each way).

use super::RmemFs;
use crate::error::FsResult;
use crate::inode::Ino;

/// Bytes one copy request moves at most; the caller asks again for the rest (as
/// `cp` does), so no request holds fsd for long.
pub const COPY_MAX: u64 = 16 << 20;
/// The buffer each step goes through.
const STEP: u64 = 1 << 20;

impl RmemFs {
    /// Copies up to `len` bytes (at most [`COPY_MAX`]) of file `from` at `off_in` to
    /// file `to` at `off_out`, stopping at the end of `from`. Returns the bytes
    /// copied; an error after some were copied ends the copy short instead, as a
    /// short write would.
    pub fn copy_range(
        &self,
        from: Ino,
        off_in: u64,
        to: Ino,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let len = len.min(COPY_MAX);
        let mut buf = vec![0u8; len.min(STEP) as usize];
        let mut done = 0;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let step = self
                .read_into(from, off_in + done, &mut buf[..want])
                .and_then(|n| match n {
                    0 => Ok(0),
                    n => self
                        .write(to, off_out + done, &buf[..n])
                        .map(|w| w as usize),
                });
            match step {
                Ok(0) => break,
                Ok(n) => done += n as u64,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        let c = &self.counters;
        super::FileCounters::count(&c.copies, &c.copy_bytes, done as usize);
        Ok(done)
    }
}
