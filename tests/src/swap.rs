//! Swap on an rmemfs mount, a memory cgroup to push a process into it, and a hog to
//! make the whole machine short of memory: what the swap test needs, each a guard
//! that undoes itself on drop so a failing test leaves no swap device, loop device,
//! cgroup or hog behind.
//!
//! - [`SwapDevice`] runs `scripts/swap on` (file on the mount, loop device with direct
//!   I/O, mkswap, swapon) and `scripts/swap off`.
//! - [`MemCgroup`] is a memory cgroup (v1 `memory` hierarchy or v2 unified) with a
//!   limit; [`MemCgroup::command`] starts a program inside it.
//! - [`Hog`] locks all but a headroom of the machine's available memory.
//! - [`pswpout_bytes`] reads the kernel's count of pages swapped out.

use crate::command::{run_ok, run_within};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SCRIPT_LIMIT: Duration = Duration::from_secs(120);

fn swap_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/swap")
}

/// A swap device on a file of an rmemfs mount, on until dropped.
pub struct SwapDevice {
    mountpoint: PathBuf,
    /// The loop device, e.g. `/dev/loop0`.
    pub device: String,
}

impl SwapDevice {
    /// `scripts/swap on MOUNTPOINT SIZE --priority 32767`: the highest priority, so
    /// the kernel swaps to it before any other swap device of the machine.
    pub fn on(mountpoint: &Path, size: &str) -> SwapDevice {
        let out = run_ok(
            Command::new(swap_script())
                .arg("on")
                .arg(mountpoint)
                .arg(size)
                .args(["--priority", "32767"]),
            SCRIPT_LIMIT,
            "scripts/swap on",
        );
        let device = out.trim().to_string();
        assert!(
            device.starts_with("/dev/loop"),
            "scripts/swap on should print the loop device, printed {out:?}"
        );
        SwapDevice {
            mountpoint: mountpoint.to_path_buf(),
            device,
        }
    }

    /// Whether the loop device reads and writes its file with direct I/O (no second
    /// copy of swapped pages in the kernel's page cache).
    pub fn direct_io(&self) -> bool {
        let name = self.device.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"))
            .map(|s| s.trim() == "1")
            .unwrap_or(false)
    }

    /// Whether `/proc/swaps` lists the device.
    pub fn is_active(&self) -> bool {
        std::fs::read_to_string("/proc/swaps")
            .map(|s| {
                s.lines()
                    .any(|l| l.split_whitespace().next() == Some(&self.device))
            })
            .unwrap_or(false)
    }
}

impl Drop for SwapDevice {
    fn drop(&mut self) {
        let out = run_within(
            Command::new(swap_script()).arg("off").arg(&self.mountpoint),
            SCRIPT_LIMIT,
            "scripts/swap off",
        );
        if !out.status.success() {
            eprintln!(
                "scripts/swap off {}: {}{}",
                self.mountpoint.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Bytes the kernel has swapped out since boot (`pswpout` of `/proc/vmstat`, in pages).
pub fn pswpout_bytes() -> u64 {
    let vmstat = std::fs::read_to_string("/proc/vmstat").expect("/proc/vmstat");
    let pages: u64 = vmstat
        .lines()
        .find_map(|l| l.strip_prefix("pswpout "))
        .and_then(|v| v.trim().parse().ok())
        .expect("pswpout in /proc/vmstat");
    pages * crate::kernel::page_size() as u64
}

/// A field of `/proc/meminfo`, in bytes.
pub fn meminfo_bytes(field: &str) -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/meminfo"));
    kib * 1024
}

/// A memory cgroup with a limit, removed when dropped (after its processes exit).
pub struct MemCgroup {
    dir: PathBuf,
}

impl MemCgroup {
    /// A new cgroup named after `name` and this process, limited to `limit` bytes of
    /// memory and free to swap: under the v1 `memory` hierarchy where it is mounted,
    /// else under the v2 unified hierarchy (memory controller enabled for the root's
    /// children). Panics naming what is missing when the machine has neither.
    pub fn new(name: &str, limit: u64) -> MemCgroup {
        let name = format!("rmemfs-{name}-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup");
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else if v2.join("cgroup.controllers").exists() {
            let controllers =
                std::fs::read_to_string(v2.join("cgroup.controllers")).expect("cgroup.controllers");
            assert!(
                controllers.split_whitespace().any(|c| c == "memory"),
                "the cgroup v2 hierarchy has no memory controller ({controllers:?}): \
                 the swap test needs one"
            );
            std::fs::write(v2.join("cgroup.subtree_control"), "+memory")
                .expect("enabling the memory controller in /sys/fs/cgroup/cgroup.subtree_control");
            (v2.join(&name), "memory.max")
        } else {
            panic!(
                "no memory cgroup: neither /sys/fs/cgroup/memory (v1) nor \
                 /sys/fs/cgroup/cgroup.controllers (v2): the swap test needs one"
            );
        };
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        let cgroup = MemCgroup { dir };
        std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .unwrap_or_else(|e| panic!("{limit_file} of {}: {e}", cgroup.dir.display()));
        cgroup
    }

    /// `program ARGS` to be started inside this cgroup: the child moves itself in
    /// before it runs the program, so all of the program's memory is charged here.
    pub fn command(&self, program: &Path) -> Command {
        let procs = std::ffi::CString::new(
            self.dir
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("a path without NUL");
        let mut cmd = Command::new(program);
        // SAFETY: the closure only calls async-signal-safe functions (open, write,
        // close) on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0" moves the writing process itself (v1 and v2 alike).
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(e);
                }
                Ok(())
            });
        }
        cmd
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The kernel refuses while the last process's exit is still being accounted.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}

/// A process holding locked memory, killed when dropped.
pub struct Hog {
    child: Child,
    pub bytes: u64,
}

impl Hog {
    /// Locks all of the machine's available memory but `headroom` bytes (through
    /// `memtouch hog`), waiting until it is all in place.
    pub fn leaving(memtouch: &Path, headroom: u64) -> Hog {
        let available = meminfo_bytes("MemAvailable");
        assert!(
            available > headroom + (256 << 20),
            "the machine has {} MiB available, too little to leave {} MiB free with a hog",
            available >> 20,
            headroom >> 20
        );
        let bytes = available - headroom;
        let mut child = Command::new(memtouch)
            .args(["hog", &(bytes >> 20).to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting memtouch hog");
        let stdout = child.stdout.take().expect("hog stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut hog = Hog { child, bytes };
        // Faulting in gigabytes: up to a few seconds per GiB on a slow VM.
        let limit = Duration::from_secs(60 + 5 * (bytes >> 30));
        match rx.recv_timeout(limit) {
            Ok(line) if line.contains("hogging") => hog,
            Ok(line) => panic!(
                "memtouch hog of {} MiB failed: {line:?}, exit {:?}",
                bytes >> 20,
                hog.child.wait()
            ),
            Err(_) => panic!(
                "memtouch hog of {} MiB not ready within {limit:?}",
                bytes >> 20
            ),
        }
    }

    /// Whether the hog still runs (the OOM killer did not take it).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
