//! File locks on the mount between two processes. fsd implements no lock operations,
//! so the kernel keeps flock, POSIX record (F_SETLK/F_GETLK) and open-file-description
//! (F_OFD_*) locks itself, as for a local filesystem: they hold between processes on
//! this host, on one mount (nothing would tell another fsd mount of the same memory, if
//! there were one). Every scenario runs on a tmpfs and on rmemfs with the same
//! expectations: a conflicting lock is refused with EAGAIN (EWOULDBLOCK), F_GETLK and
//! F_OFD_GETLK describe the holder, a blocking request waits until the holder lets go,
//! and a holder's death releases its locks.
//!
//! The other process is a fork of the test that only makes raw system calls (open,
//! flock, fcntl, read and write on pipes, _exit): safe after fork in a threaded
//! program. It takes orders over a pipe and answers each with 0 or the errno.

use rmemfs_tests::{assert_errno, describe, within};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// An order to the lock holder.
#[derive(Clone, Copy)]
#[repr(C)]
struct Order {
    /// 0: exit; 1: flock(op); 2: fcntl(cmd) with a lock of (typ, start, len).
    kind: i32,
    op: i32,
    typ: i32,
    start: i64,
    len: i64,
}

/// A forked process with its own open file description of one file.
struct Holder {
    pid: libc::pid_t,
    orders: i32,
    answers: i32,
}

fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills the two-element array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", io::Error::last_os_error());
    (fds[0], fds[1])
}

fn flock_struct(typ: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

/// The child's life: open the file, answer the result, then run orders until kind 0.
/// Only async-signal-safe calls; nothing allocates.
fn holder_main(path: &CString, orders: i32, answers: i32) -> ! {
    // SAFETY: raw system calls on descriptors this process owns and on stack memory;
    // async-signal-safe, as a child of a threaded process requires.
    unsafe {
        let errno = || *libc::__errno_location();
        let answer = |v: i32| {
            libc::write(answers, (&v as *const i32).cast(), 4);
        };
        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
        answer(if fd < 0 { errno() } else { 0 });
        loop {
            let mut o = Order {
                kind: 0,
                op: 0,
                typ: 0,
                start: 0,
                len: 0,
            };
            let n = libc::read(
                orders,
                (&mut o as *mut Order).cast(),
                std::mem::size_of::<Order>(),
            );
            if n != std::mem::size_of::<Order>() as isize || o.kind == 0 {
                libc::_exit(0);
            }
            let rc = if o.kind == 1 {
                libc::flock(fd, o.op)
            } else {
                let mut fl = flock_struct(o.typ, o.start, o.len);
                libc::fcntl(fd, o.op, &mut fl as *mut libc::flock)
            };
            answer(if rc < 0 { errno() } else { 0 });
        }
    }
}

impl Holder {
    fn start(path: &Path) -> Holder {
        let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
        let (orders_r, orders_w) = pipe();
        let (answers_r, answers_w) = pipe();
        // SAFETY: the child runs holder_main only, which makes raw system calls and
        // never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            holder_main(&c, orders_r, answers_w);
        }
        // SAFETY: closing the child's ends of the pipes in the parent.
        unsafe {
            libc::close(orders_r);
            libc::close(answers_w);
        }
        let h = Holder {
            pid,
            orders: orders_w,
            answers: answers_r,
        };
        h.answer()
            .unwrap_or_else(|e| panic!("the holder cannot open {}: {e}", path.display()));
        h
    }

    fn answer(&self) -> io::Result<()> {
        let mut v = -1i32;
        // SAFETY: reading 4 bytes into a local i32 from our pipe.
        let n = unsafe { libc::read(self.answers, (&mut v as *mut i32).cast(), 4) };
        assert_eq!(n, 4, "the lock holder died without answering");
        if v == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(v))
        }
    }

    fn order(&self, o: Order) -> io::Result<()> {
        // SAFETY: writing the bytes of a repr(C) value to our pipe.
        let n = unsafe {
            libc::write(
                self.orders,
                (&o as *const Order).cast(),
                std::mem::size_of::<Order>(),
            )
        };
        assert_eq!(
            n as usize,
            std::mem::size_of::<Order>(),
            "writing an order to the holder"
        );
        self.answer()
    }

    fn flock(&self, op: i32) -> io::Result<()> {
        self.order(Order {
            kind: 1,
            op,
            typ: 0,
            start: 0,
            len: 0,
        })
    }

    fn fcntl(&self, cmd: i32, typ: i32, start: i64, len: i64) -> io::Result<()> {
        self.order(Order {
            kind: 2,
            op: cmd,
            typ,
            start,
            len,
        })
    }

    /// The process dies (SIGKILL) and is reaped: the kernel drops its locks.
    fn kill(self) {}
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: signalling and reaping our own child, and closing our pipe ends.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            libc::close(self.orders);
            libc::close(self.answers);
        }
    }
}

fn flock(f: &File, op: i32) -> io::Result<()> {
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn fcntl_lock(f: &File, cmd: i32, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: fcntl with a lock command and a valid flock struct.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, fl as *mut libc::flock) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn setlk(f: &File, cmd: i32, typ: i32, start: i64, len: i64) -> io::Result<()> {
    fcntl_lock(f, cmd, &mut flock_struct(typ, start, len))
}

/// F_GETLK (or F_OFD_GETLK): what would block a `typ` lock of the range.
fn getlk(f: &File, cmd: i32, typ: i32, start: i64, len: i64) -> libc::flock {
    let mut fl = flock_struct(typ, start, len);
    fcntl_lock(f, cmd, &mut fl).unwrap_or_else(|e| panic!("F_GETLK: {e}"));
    fl
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Runs `scenario` on a tmpfs and on rmemfs, naming each.
fn on_tmpfs_and_rmemfs(scenario: impl Fn(&Path, &str)) {
    rmemfs_tests::tmpfs::on_tmpfs_and_rmemfs("16M", "64M", &["--cache", "2M"], scenario);
}

#[track_caller]
fn assert_ok(r: io::Result<()>, what: &str) {
    assert!(r.is_ok(), "{what}: expected success, got {}", describe(&r));
}

#[test]
fn flock_conflicts_between_processes_are_refused_with_ewouldblock() {
    on_tmpfs_and_rmemfs(|dir, fs| {
        let path = dir.join("flock");
        let mine = open_rw(&path);
        let other = Holder::start(&path);
        assert_ok(
            other.flock(libc::LOCK_EX),
            &format!("{fs}: the other process takes LOCK_EX"),
        );
        let nb = |op| flock(&mine, op | libc::LOCK_NB);
        assert_errno(
            nb(libc::LOCK_EX),
            libc::EWOULDBLOCK,
            &format!("{fs}: LOCK_EX against LOCK_EX"),
        );
        assert_errno(
            nb(libc::LOCK_SH),
            libc::EWOULDBLOCK,
            &format!("{fs}: LOCK_SH against LOCK_EX"),
        );
        assert_ok(other.flock(libc::LOCK_UN), &format!("{fs}: LOCK_UN"));
        assert_ok(nb(libc::LOCK_EX), &format!("{fs}: LOCK_EX once free"));
        assert_errno(
            other.flock(libc::LOCK_SH | libc::LOCK_NB),
            libc::EWOULDBLOCK,
            &format!("{fs}: the other's LOCK_SH against mine"),
        );
        assert_ok(nb(libc::LOCK_SH), &format!("{fs}: my downgrade to LOCK_SH"));
        assert_ok(
            other.flock(libc::LOCK_SH | libc::LOCK_NB),
            &format!("{fs}: two LOCK_SH at once"),
        );
        assert_errno(
            nb(libc::LOCK_EX),
            libc::EWOULDBLOCK,
            &format!("{fs}: upgrade to LOCK_EX while another holds LOCK_SH"),
        );
        other.kill();
        assert_ok(
            nb(libc::LOCK_EX),
            &format!("{fs}: LOCK_EX after the other process died"),
        );
        // Another open of the same file in this process is another lock owner.
        let again = open_rw(&path);
        assert_errno(
            flock(&again, libc::LOCK_SH | libc::LOCK_NB),
            libc::EWOULDBLOCK,
            &format!("{fs}: a second open file description conflicts"),
        );
    });
}

#[test]
fn record_locks_conflict_between_processes_and_getlk_names_the_holder() {
    on_tmpfs_and_rmemfs(|dir, fs| {
        let path = dir.join("posix");
        let mine = open_rw(&path);
        let other = Holder::start(&path);
        assert_ok(
            other.fcntl(libc::F_SETLK, libc::F_WRLCK, 0, 100),
            &format!("{fs}: the other process write-locks 0..100"),
        );
        assert_errno(
            setlk(&mine, libc::F_SETLK, libc::F_WRLCK, 50, 10),
            libc::EAGAIN,
            &format!("{fs}: F_WRLCK inside the other's range"),
        );
        assert_errno(
            setlk(&mine, libc::F_SETLK, libc::F_RDLCK, 99, 1),
            libc::EAGAIN,
            &format!("{fs}: F_RDLCK on its last byte"),
        );
        assert_ok(
            setlk(&mine, libc::F_SETLK, libc::F_WRLCK, 100, 100),
            &format!("{fs}: F_WRLCK of 100..200, right after it"),
        );
        let fl = getlk(&mine, libc::F_GETLK, libc::F_WRLCK, 0, 0);
        assert_eq!(
            (i32::from(fl.l_type), fl.l_start, fl.l_len, fl.l_pid),
            (libc::F_WRLCK, 0, 100, other.pid),
            "{fs}: F_GETLK of the whole file reports the other's write lock of 0..100 and its pid"
        );
        assert_errno(
            other.fcntl(libc::F_SETLK, libc::F_WRLCK, 150, 1),
            libc::EAGAIN,
            &format!("{fs}: the other against my lock"),
        );
        // The other downgrades to a read lock: readers share, writers wait.
        assert_ok(
            other.fcntl(libc::F_SETLK, libc::F_RDLCK, 0, 100),
            &format!("{fs}: downgrade to F_RDLCK"),
        );
        assert_ok(
            setlk(&mine, libc::F_SETLK, libc::F_RDLCK, 0, 50),
            &format!("{fs}: F_RDLCK beside a read lock"),
        );
        assert_errno(
            setlk(&mine, libc::F_SETLK, libc::F_WRLCK, 60, 1),
            libc::EAGAIN,
            &format!("{fs}: F_WRLCK on a read-locked byte"),
        );
        let fl = getlk(&mine, libc::F_GETLK, libc::F_WRLCK, 60, 1);
        assert_eq!(
            (i32::from(fl.l_type), fl.l_pid),
            (libc::F_RDLCK, other.pid),
            "{fs}: F_GETLK reports the read lock"
        );
        let fl = getlk(&mine, libc::F_GETLK, libc::F_WRLCK, 500, 10);
        assert_eq!(
            i32::from(fl.l_type),
            libc::F_UNLCK,
            "{fs}: F_GETLK of a free range answers F_UNLCK"
        );
        other.kill();
        assert_ok(
            setlk(&mine, libc::F_SETLK, libc::F_WRLCK, 0, 0),
            &format!("{fs}: the whole file once the other died"),
        );
    });
}

#[test]
fn ofd_locks_conflict_between_open_file_descriptions() {
    on_tmpfs_and_rmemfs(|dir, fs| {
        let path = dir.join("ofd");
        let mine = open_rw(&path);
        let other = Holder::start(&path);
        assert_ok(
            other.fcntl(libc::F_OFD_SETLK, libc::F_WRLCK, 0, 4096),
            &format!("{fs}: the other takes an OFD write lock"),
        );
        assert_errno(
            setlk(&mine, libc::F_OFD_SETLK, libc::F_RDLCK, 10, 1),
            libc::EAGAIN,
            &format!("{fs}: F_OFD_SETLK against it"),
        );
        assert_errno(
            setlk(&mine, libc::F_SETLK, libc::F_WRLCK, 0, 1),
            libc::EAGAIN,
            &format!("{fs}: a classic F_SETLK against it"),
        );
        let fl = getlk(&mine, libc::F_OFD_GETLK, libc::F_WRLCK, 0, 0);
        assert_eq!(
            (i32::from(fl.l_type), fl.l_start, fl.l_len, fl.l_pid),
            (libc::F_WRLCK, 0, 4096, -1),
            "{fs}: F_OFD_GETLK reports the OFD lock with l_pid -1"
        );
        assert_ok(
            other.fcntl(libc::F_OFD_SETLK, libc::F_UNLCK, 0, 0),
            &format!("{fs}: the other unlocks"),
        );
        // Within one process, two open file descriptions are two OFD lock owners.
        let second = open_rw(&path);
        assert_ok(
            setlk(&mine, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 10),
            &format!("{fs}: OFD lock on the first description"),
        );
        assert_errno(
            setlk(&second, libc::F_OFD_SETLK, libc::F_WRLCK, 5, 1),
            libc::EAGAIN,
            &format!("{fs}: the second description of the same process conflicts"),
        );
    });
}

#[test]
fn blocking_locks_wait_until_the_holder_lets_go() {
    on_tmpfs_and_rmemfs(|dir, fs| {
        let path = dir.join("wait");
        drop(open_rw(&path));
        let other = Holder::start(&path);
        assert_ok(
            other.fcntl(libc::F_SETLK, libc::F_WRLCK, 0, 0),
            &format!("{fs}: the other write-locks the file"),
        );
        assert_ok(
            other.flock(libc::LOCK_EX),
            &format!("{fs}: and takes LOCK_EX"),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        let waiter = std::thread::spawn(move || {
            let f = open_rw(&p);
            let r1 = setlk(&f, libc::F_SETLKW, libc::F_WRLCK, 0, 0);
            let _ = tx.send("fcntl");
            let r2 = flock(&f, libc::LOCK_EX);
            let _ = tx.send("flock");
            (r1, r2, f)
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "{fs}: F_SETLKW returned while the other holds the lock"
        );
        assert_ok(
            other.fcntl(libc::F_SETLK, libc::F_UNLCK, 0, 0),
            &format!("{fs}: the other unlocks"),
        );
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).ok(),
            Some("fcntl"),
            "{fs}: F_SETLKW gets the lock once it is free"
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "{fs}: flock(LOCK_EX) returned while the other holds LOCK_EX"
        );
        other.kill();
        let (r1, r2, _f) = within(Duration::from_secs(10), "the blocked flock", move || {
            waiter.join().expect("waiter")
        });
        assert_ok(r1, &format!("{fs}: F_SETLKW"));
        assert_ok(r2, &format!("{fs}: flock(LOCK_EX) after the holder died"));
    });
}
