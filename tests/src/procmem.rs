//! Reading and writing another process's memory through `/proc/PID/mem`, to damage
//! what a memnode holds the way a bad DIMM or a stray write would: a memnode's remote
//! addresses are virtual addresses inside its process (its region is one anonymous
//! mapping), so the bytes of a volume's superblock, checkpoint or log can be changed
//! under it. Needs root (the tests run as root) or ptrace rights over the process.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

/// `len` bytes of process `pid`'s memory at virtual address `addr`.
pub fn read(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let path = format!("/proc/{pid}/mem");
    let f = OpenOptions::new()
        .read(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {path} for reading (the tests run as root): {e}"));
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, addr)
        .unwrap_or_else(|e| panic!("reading {len} bytes at {addr:#x} of {path}: {e}"));
    buf
}

/// Writes `data` into process `pid`'s memory at virtual address `addr`.
pub fn write(pid: u32, addr: u64, data: &[u8]) {
    let path = format!("/proc/{pid}/mem");
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {path} for writing (the tests run as root): {e}"));
    f.write_all_at(data, addr)
        .unwrap_or_else(|e| panic!("writing {} bytes at {addr:#x} of {path}: {e}", data.len()));
    let back = read(pid, addr, data.len());
    assert_eq!(
        back,
        data,
        "the {} bytes written at {addr:#x} of {path} did not read back",
        data.len()
    );
}

/// Inverts `len` bytes of process `pid`'s memory at `addr` (every bit flipped, so each
/// byte certainly changes) and returns the bytes that were there.
pub fn flip(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let old = read(pid, addr, len);
    let new: Vec<u8> = old.iter().map(|b| !b).collect();
    write(pid, addr, &new);
    old
}
