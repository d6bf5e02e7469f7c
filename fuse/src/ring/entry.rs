//! One ring entry, the buffers the kernel writes a request into and the daemon its
//! answer (registered once, reused for every request of the entry), and the io_uring
//! commands that carry it: REGISTER and COMMIT_AND_FETCH, built as the kernel reads
//! them where the io-uring crate has no word for a field.

use super::abi;
use anyhow::bail;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::alloc::Layout;

/// Ring entries each serving thread registers, at most. Requests that come while the
/// thread is busy wait in its other entries, and are answered together once it is
/// free: their reads that miss the cache then cost one round trip to remote memory
/// between them, and a round trip costs its system calls and wakeups far more than
/// its bytes (docs/benchmarks-history.md, "Four ring entries per thread").
pub(super) const ENTRIES_PER_THREAD: usize = 4;
/// Submission queue slots of a thread's ring: a command per entry at once.
const RING_SIZE: u32 = ENTRIES_PER_THREAD.next_power_of_two() as u32;

/// A buffer the kernel writes into while it is registered: page-aligned, never
/// moved or resized.
struct PinnedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is owned by one thread at a time; the raw pointer is only a
// heap allocation's address.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    fn new(len: usize) -> anyhow::Result<PinnedBuf> {
        let layout = Layout::from_size_align(len.max(1), 4096)?;
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("out of memory for a {len}-byte ring buffer");
        }
        Ok(PinnedBuf { ptr, layout })
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The io_uring SQE128 of a FUSE ring command. io-uring's UringCmd80 has no `len`,
/// which REGISTER needs (the number of iovecs, 2), so it is set in the SQE's bytes.
pub(super) fn ring_cmd(
    fd: i32,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iovecs: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut e = opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd);
    if let Some(iov) = iovecs {
        e = e.addr(Some(iov.as_ptr() as u64));
    }
    let e = e.build();
    match iovecs {
        Some(iov) => set_sqe_len(e, iov.len() as u32),
        None => e,
    }
}

/// Offset of `len` in `struct io_uring_sqe` (after opcode, flags, ioprio, fd, off,
/// addr).
const SQE_LEN_AT: usize = 24;

fn set_sqe_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is a repr(C) 128-byte plain-data SQE (io-uring asserts its
    // size); every byte pattern is a valid value of it.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[SQE_LEN_AT..SQE_LEN_AT + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

pub(super) type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// A ring for one thread: single issuer with task work deferred to its own waits
/// (the kernel's recommended mode for a thread that only submits and waits), or a
/// plain one where the kernel lacks those flags.
pub(super) fn new_ring() -> std::io::Result<Ring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_SIZE)
        .or_else(|_| IoUring::builder().build(RING_SIZE))
}

/// One ring entry: the buffers the kernel writes a request into and the daemon its
/// answer, registered once and reused for every request of the entry.
pub(super) struct Entry {
    header: PinnedBuf,
    payload: PinnedBuf,
    iovecs: [libc::iovec; 2],
    /// Still registered: the kernel will complete it again.
    pub(super) live: bool,
}

// SAFETY: the iovecs point into the entry's own buffers, owned with it by one thread.
unsafe impl Send for Entry {}

impl Entry {
    pub(super) fn new(payload_len: usize) -> anyhow::Result<Entry> {
        let header = PinnedBuf::new(abi::HEADER_LEN)?;
        let payload = PinnedBuf::new(payload_len)?;
        let iovecs = [
            libc::iovec {
                iov_base: header.ptr.cast(),
                iov_len: abi::HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.ptr.cast(),
                iov_len: payload_len,
            },
        ];
        Ok(Entry {
            header,
            payload,
            iovecs,
            live: true,
        })
    }

    /// The request's header and payload, where its answer goes too.
    pub(super) fn buffers(&mut self) -> (&mut [u8; abi::HEADER_LEN], &mut [u8]) {
        let header = self
            .header
            .slice()
            .try_into()
            .expect("a header buffer is HEADER_LEN bytes");
        (header, self.payload.slice())
    }
}

/// Pushes `e`, tagged with entry `n`, onto the ring's submission queue.
pub(super) fn push(ring: &mut Ring, e: squeue::Entry128, n: usize) -> std::io::Result<()> {
    let e = e.user_data(n as u64);
    // SAFETY: the SQE's buffers (iovecs, header, payload) belong to the entry, which
    // the serving thread keeps until the thread ends, after the ring.
    unsafe { ring.submission().push(&e) }.map_err(|_| std::io::Error::other("ring SQ full"))
}

pub(super) fn register(fd: i32, qid: u16, e: &Entry) -> squeue::Entry128 {
    ring_cmd(fd, abi::CMD_REGISTER, qid, 0, Some(&e.iovecs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_register_command_carries_its_iovecs_and_their_count() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let e = ring_cmd(7, abi::CMD_REGISTER, 3, 99, Some(&iov));
        // SAFETY: as in set_sqe_len.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            abi::CMD_REGISTER
        );
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        // The command area starts at byte 48: flags, commit_id, qid.
        assert_eq!(u64::from_ne_bytes(raw[56..64].try_into().unwrap()), 99);
        assert_eq!(u16::from_ne_bytes(raw[64..66].try_into().unwrap()), 3);
    }
}
