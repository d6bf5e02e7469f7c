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

/// The page-aligned addresses in process `pid`'s writable private mappings (a
/// memnode's region among them) whose next `needle.len()` bytes are `needle`. Parts
/// of mappings that cannot be read are skipped.
pub fn find_pages(pid: u32, needle: &[u8]) -> Vec<u64> {
    const PAGE: u64 = 4096;
    const SPAN: u64 = 1 << 20;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/maps (the tests run as root): {e}"));
    let mem = OpenOptions::new()
        .read(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap_or_else(|e| panic!("opening /proc/{pid}/mem (the tests run as root): {e}"));
    let mut found = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with("rw") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        let mut at = start;
        let mut buf = vec![0u8; SPAN as usize];
        while at < end {
            let len = SPAN.min(end - at) as usize;
            if mem.read_exact_at(&mut buf[..len], at).is_ok() {
                for page in (0..len as u64).step_by(PAGE as usize) {
                    let p = page as usize;
                    if buf[p..].starts_with(needle) {
                        found.push(at + page);
                    }
                }
            }
            at += SPAN;
        }
    }
    found
}
