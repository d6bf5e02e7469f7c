//! A memnode on a memory file, stopped and started again over the real tcp fabric:
//! the same instance comes back with every session, chunk, byte and volume, under
//! new rkeys, and only the session's own secret resumes it.

mod support;

use memnode::{Memnode, MemnodeConfig, MemoryFileConfig};
use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::{RemoteAddr, Transport};
use rmemfs_common::protocol::{ErrorCode, SessionSecret};
use std::path::Path;
use std::time::Duration;
use support::*;

const MIB: u64 = 1 << 20;

fn start_on(file: &Path, listen: &str) -> Memnode {
    start_with_grace(file, listen, Duration::from_secs(60))
}

fn start_with_grace(file: &Path, listen: &str, grace: Duration) -> Memnode {
    Memnode::start(MemnodeConfig {
        listen: listen.into(),
        size: 32 * MIB,
        token: None,
        tenants: None,
        huge_pages: false,
        transport: Transport::Tcp,
        poll: Duration::ZERO,
        lease: memnode::DEFAULT_LEASE,
        session_grace: grace,
        memory_file: Some(MemoryFileConfig {
            path: file.to_path_buf(),
            reset: false,
        }),
        connections: rmemfs_common::fabric::ConnectionLimits::default(),
    })
    .expect("a memnode on its memory file starts")
}

/// A free port on 127.0.0.1, for a memnode that must come back on the same address.
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    l.local_addr().expect("has an address").to_string()
}

/// An empty directory of its own for a test's memory file.
fn scratch_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memnode-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

#[test]
fn a_restarted_memnode_is_the_same_instance_with_every_session_chunk_and_volume() {
    let dir = scratch_dir("restart");
    let file = dir.join("memory");
    let listen = free_port();

    let node = start_on(&file, &listen);
    let scratch = client(&node, 0x5);
    let a = alloc(&scratch, MIB);
    let b = alloc(&scratch, 2 * MIB);
    let data_a = pattern(3, 300 << 10);
    let data_b = pattern(9, 70 << 10);
    write_at(&scratch, remote(&a, 4096), &data_a).expect("writes a");
    write_at(&scratch, remote(&b, 0), &data_b).expect("writes b");
    let secret = session_of(&node, 0x5);

    let holder = client(&node, 0x9);
    let vol = control::volume_open(&holder, "home", true, false).expect("creates the volume");
    let vchunk = alloc(&holder, MIB);
    write_at(&holder, remote(&vchunk, 10), b"volume bytes").expect("writes the volume");
    write_at(&holder, remote(&vol.root, 0), b"superblock").expect("writes the root");
    let holder_secret = session_of(&node, 0x9);
    let used = node.stats().used;
    let id = format!("{node:?}");
    drop((scratch, holder));
    drop(node);

    let node = start_on(&file, &listen);
    assert_eq!(format!("{node:?}"), id, "the same memnode id and address");
    assert_eq!(node.stats().used, used, "every booking is back");
    assert_eq!(
        node.idle_sessions(),
        2,
        "both sessions wait for their clients"
    );

    // A stranger (no secret) cannot claim the scratch session.
    let ep = connect(&node);
    let e = control::hello_in_session(&ep, 0x5, b"", SessionSecret::NONE)
        .expect_err("a Hello without the secret is refused");
    assert!(
        matches!(
            e,
            ControlError::Refused {
                code: ErrorCode::AuthFailed,
                ..
            }
        ),
        "{e:?}"
    );

    // The client resumes with its secret: same chunks, new rkeys, bytes intact.
    let ep = connect(&node);
    let w = control::hello_in_session(&ep, 0x5, b"", secret).expect("resumes");
    assert!(w.resumed, "the session came back");
    assert_eq!(w.boot, 1, "the memnode's second start");
    let chunks = control::session_chunks(&ep).expect("lists its chunks");
    let addrs: Vec<(u64, u64)> = chunks.iter().map(|c| (c.addr, c.len)).collect();
    assert_eq!(addrs, vec![(a.addr, a.len), (b.addr, b.len)]);
    let old = RemoteAddr {
        addr: a.addr + 4096,
        rkey: a.rkey,
    };
    let now_a = remote(&chunks[0], 4096);
    if now_a.rkey != old.rkey {
        assert!(
            is_remote_access(&read_at(&ep, old, 16)),
            "an rkey of before the restart is refused"
        );
    }
    assert_eq!(read_at(&ep, now_a, data_a.len()).expect("reads a"), data_a);
    assert_eq!(
        read_at(&ep, remote(&chunks[1], 0), data_b.len()).expect("reads b"),
        data_b
    );

    // The volume is still held by its holder, who finds it whole.
    let v = connect(&node);
    control::hello_in_session(&v, 0x9, b"", holder_secret).expect("the holder resumes");
    let again = control::volume_open(&v, "home", false, false).expect("opens its volume");
    assert_eq!(
        (again.volume_id, again.root.addr),
        (vol.volume_id, vol.root.addr)
    );
    let listed = control::volume_chunks(&v).expect("lists the volume");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        read_at(&v, remote(&listed[0], 10), 12).expect("reads the volume"),
        b"volume bytes"
    );
    assert_eq!(
        read_at(&v, remote(&again.root, 0), 10).expect("reads the root"),
        b"superblock"
    );

    // Freed memory still reads as zero for the next owner, after a restart too.
    control::free(&ep, chunks[0].addr, chunks[0].rkey).expect("frees a");
    let other = client(&node, 0x77);
    let fresh = alloc(&other, MIB);
    assert_eq!(fresh.addr, a.addr, "the lowest free range is a's");
    assert!(read_at(&other, remote(&fresh, 0), MIB as usize)
        .expect("reads")
        .iter()
        .all(|&x| x == 0));
    drop((ep, v, other));
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_session_not_resumed_after_a_restart_is_reclaimed_after_its_grace() {
    let dir = scratch_dir("reap");
    let file = dir.join("memory");
    let listen = free_port();
    let grace = Duration::from_secs(2);
    let node = start_with_grace(&file, &listen, grace);
    let c = client(&node, 0x31);
    let chunk = alloc(&c, MIB);
    write_at(&c, remote(&chunk, 0), &pattern(1, 4096)).expect("writes");
    drop(c);
    drop(node);

    let node = start_with_grace(&file, &listen, grace);
    assert_eq!(node.stats().used, MIB, "the session's chunk is back");
    wait_until("the session's grace runs out after the restart", || {
        node.stats().used == 0 && node.idle_sessions() == 0
    });
    let other = client(&node, 0x32);
    let fresh = alloc(&other, MIB);
    assert_eq!(fresh.addr, chunk.addr, "the reclaimed range is lent again");
    assert!(
        read_at(&other, remote(&fresh, 0), 4096)
            .expect("reads")
            .iter()
            .all(|&x| x == 0),
        "reclaimed memory reads as zero"
    );
    drop(other);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reserves `pages` more 2 MiB huge pages and mounts hugetlbfs on a directory of
/// its own, for the test; both are undone on drop. Needs root (as CI runs).
struct Hugetlbfs {
    dir: std::path::PathBuf,
    before: u64,
}

impl Hugetlbfs {
    fn mount(pages: u64) -> Hugetlbfs {
        const NR: &str = "/proc/sys/vm/nr_hugepages";
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let before: u64 = read(NR).trim().parse().expect("nr_hugepages is a number");
        std::fs::write(NR, (before + pages).to_string()).unwrap_or_else(|e| {
            panic!("reserving {pages} huge pages in {NR} (this test needs root): {e}")
        });
        let free: u64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("HugePages_Free:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(
            free >= pages,
            "the kernel gave {free} free huge pages of the {pages} asked for"
        );
        let dir = std::env::temp_dir().join(format!("memnode-hugetlbfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a mount point");
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let (src, target, fstype) = (c("none"), c(dir.to_str().expect("UTF-8")), c("hugetlbfs"));
        // SAFETY: valid NUL-terminated strings; no data argument.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mounting hugetlbfs on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        Hugetlbfs { dir, before }
    }
}

impl Drop for Hugetlbfs {
    fn drop(&mut self) {
        if let Ok(target) = std::ffi::CString::new(self.dir.to_str().unwrap_or_default()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::write("/proc/sys/vm/nr_hugepages", self.before.to_string());
    }
}

#[test]
fn a_memory_file_on_hugetlbfs_lends_huge_pages_and_keeps_them_across_a_restart() {
    let huge = Hugetlbfs::mount(24);
    let file = huge.dir.join("memory");
    let listen = free_port();
    let node = start_on(&file, &listen);
    let c = client(&node, 0x41);
    let chunk = alloc(&c, 4096);
    assert_eq!(chunk.len, 2 * MIB, "chunks are whole huge pages");
    let data = pattern(4, 1 << 20);
    write_at(&c, remote(&chunk, 4096), &data).expect("writes");
    let secret = session_of(&node, 0x41);
    drop(c);
    drop(node);

    let node = start_on(&file, &listen);
    let ep = connect(&node);
    let w = control::hello_in_session(&ep, 0x41, b"", secret).expect("resumes");
    assert!(w.resumed && w.boot == 1);
    let chunks = control::session_chunks(&ep).expect("lists");
    assert_eq!(chunks.len(), 1);
    assert_eq!(
        read_at(&ep, remote(&chunks[0], 4096), data.len()).expect("reads"),
        data
    );
    drop(ep);
    drop(node);
}
