use super::*;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

const PAGE: usize = 4096;

/// A memfd of `pages` pages.
fn memfd(pages: usize) -> std::fs::File {
    // SAFETY: a NUL-terminated name and no flags.
    let fd = unsafe { libc::memfd_create(c"guard-test".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a descriptor memfd_create just returned, owned by nothing else.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.set_len((pages * PAGE) as u64).expect("sizing the memfd");
    f
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn bytes_move_both_ways_through_the_file() {
    let f = memfd(4);
    let want = pattern(4 * PAGE, 7);
    f.write_all_at(&want, 0).unwrap();
    let m = GuardedMap::map(f.as_fd(), 0, 4 * PAGE).expect("maps");
    let mut got = vec![0u8; 3 * PAGE];
    m.read(PAGE, &mut got).expect("reads");
    assert_eq!(got, want[PAGE..]);

    let new = pattern(100, 99);
    m.write(2 * PAGE + 5, &new).expect("writes");
    let mut back = vec![0u8; 100];
    f.read_exact_at(&mut back, (2 * PAGE + 5) as u64).unwrap();
    assert_eq!(back, new, "a write lands in the file itself");
}

#[test]
fn ranges_outside_the_mapping_are_refused_untouched() {
    let f = memfd(2);
    let m = GuardedMap::map(f.as_fd(), 0, 2 * PAGE).unwrap();
    let mut buf = [0xAAu8; 16];
    for (at, len) in [(2 * PAGE - 8, 16), (2 * PAGE, 1), (usize::MAX, 2)] {
        assert_eq!(
            m.read(at, &mut buf[..len]),
            Err(MapError::OutOfRange {
                at,
                len,
                size: 2 * PAGE
            })
        );
        assert!(matches!(
            m.write(at, &buf[..len]),
            Err(MapError::OutOfRange { .. })
        ));
    }
    assert!(buf.iter().all(|&b| b == 0xAA), "nothing was copied");
    assert!(!m.is_broken());
}

#[test]
fn a_file_cut_short_under_a_reader_is_an_error_not_a_crash() {
    let f = memfd(4);
    f.write_all_at(&pattern(4 * PAGE, 1), 0).unwrap();
    let m = GuardedMap::map(f.as_fd(), 0, 4 * PAGE).unwrap();
    let mut buf = vec![0u8; PAGE];
    m.read(3 * PAGE, &mut buf).expect("whole at first");

    f.set_len(PAGE as u64).expect("truncating the memfd");
    assert_eq!(m.read(3 * PAGE, &mut buf), Err(MapError::Broken));
    assert!(m.is_broken());
    // Broken for good, also where the file still has pages.
    assert_eq!(m.read(0, &mut buf), Err(MapError::Broken));
    assert_eq!(m.write(2 * PAGE, &buf), Err(MapError::Broken));
}

#[test]
fn a_write_into_lost_pages_is_an_error_too() {
    let f = memfd(2);
    let m = GuardedMap::map(f.as_fd(), 0, 2 * PAGE).unwrap();
    f.set_len(0).unwrap();
    assert_eq!(m.write(PAGE + 1, &[1, 2, 3]), Err(MapError::Broken));
}

#[test]
fn readers_on_many_threads_survive_a_truncation() {
    let f = memfd(64);
    f.write_all_at(&pattern(64 * PAGE, 3), 0).unwrap();
    let m = Arc::new(GuardedMap::map(f.as_fd(), 0, 64 * PAGE).unwrap());
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 8 * PAGE];
                let mut oks = 0;
                for i in 0.. {
                    let at = ((i * 8 + t) % 56) * PAGE;
                    let r = m.read(at, &mut buf);
                    // A buffer never looked at would let the optimizer drop the copy.
                    std::hint::black_box(&mut buf);
                    match r {
                        Ok(()) => oks += 1,
                        Err(MapError::Broken) => return oks,
                        Err(e) => panic!("{e}"),
                    }
                }
                unreachable!()
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    f.set_len(0).unwrap();
    // Readers that never touch a lost page again would spin on: one read of every
    // page after the truncation breaks the mapping for all of them.
    let mut buf = vec![0u8; 64 * PAGE];
    assert_eq!(m.read(0, &mut buf), Err(MapError::Broken));
    std::hint::black_box(&buf);
    for r in readers {
        r.join().expect("a reader survives");
    }
}

#[test]
fn mappings_are_guarded_apart() {
    let a = memfd(1);
    let b = memfd(1);
    b.write_all_at(b"still here", 0).unwrap();
    let ma = GuardedMap::map(a.as_fd(), 0, PAGE).unwrap();
    let mb = GuardedMap::map(b.as_fd(), 0, PAGE).unwrap();
    a.set_len(0).unwrap();
    let mut buf = [0u8; 10];
    assert_eq!(ma.read(0, &mut buf), Err(MapError::Broken));
    mb.read(0, &mut buf).expect("the other mapping is whole");
    assert_eq!(&buf, b"still here");
    drop(ma);
    // The slot is free again and a new mapping is whole.
    let a2 = memfd(1);
    let ma2 = GuardedMap::map(a2.as_fd(), 0, PAGE).unwrap();
    ma2.read(0, &mut buf)
        .expect("a new mapping starts unbroken");
}

/// Run only as the child of `a_fault_outside_every_mapping_still_ends_the_process`:
/// an unguarded mapping of a truncated file must still kill with SIGBUS.
#[test]
#[ignore = "run by a_fault_outside_every_mapping_still_ends_the_process in a child"]
fn unguarded_fault_child() {
    if std::env::var_os("GUARD_TEST_CHILD").is_none() {
        return;
    }
    let f = memfd(1);
    let _guarded = GuardedMap::map(f.as_fd(), 0, PAGE).unwrap(); // the handler is in
    let g = memfd(1);
    // SAFETY: a fresh shared mapping of g.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            g.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    g.set_len(0).unwrap();
    // SAFETY: the mapping is valid; the read faults on purpose, and must end the
    // process.
    let v = unsafe { std::ptr::read_volatile(p.cast::<u8>()) };
    println!("read {v} from a lost page: the fault was swallowed");
    std::process::exit(0);
}

#[test]
fn a_fault_outside_every_mapping_still_ends_the_process() {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fabric::mapped::guard::tests::unguarded_fault_child",
            "--ignored",
            "--nocapture",
        ])
        .env("GUARD_TEST_CHILD", "1")
        .output()
        .expect("running the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("running 1 test"),
        "the child ran the test: {stdout}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the child died of SIGBUS ({:?}); stdout: {stdout}",
        out.status
    );
}

/// Huge pages for a test, given back on drop (needs root, as CI runs it; the quick
/// tier of scripts/test skips the tests named `..._on_hugetlbfs_...`).
struct HugePages {
    before: u64,
}

impl HugePages {
    const NR: &'static str = "/proc/sys/vm/nr_hugepages";

    fn reserve(pages: u64) -> HugePages {
        let before: u64 = std::fs::read_to_string(Self::NR)
            .unwrap_or_default()
            .trim()
            .parse()
            .expect("nr_hugepages is a number");
        std::fs::write(Self::NR, (before + pages).to_string()).unwrap_or_else(|e| {
            panic!(
                "reserving {pages} huge pages in {} (this test needs root): {e}",
                Self::NR
            )
        });
        HugePages { before }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::NR, self.before.to_string());
    }
}

#[test]
fn a_file_cut_short_on_hugetlbfs_loses_whole_huge_pages_cleanly() {
    const HUGE: usize = 2 << 20;
    let _pages = HugePages::reserve(4);
    // SAFETY: a NUL-terminated name; MFD_HUGETLB puts the file on the kernel's own
    // hugetlbfs mount, with the default huge page size.
    let fd = unsafe { libc::memfd_create(c"guard-huge".as_ptr(), libc::MFD_HUGETLB) };
    assert!(
        fd >= 0,
        "memfd_create(MFD_HUGETLB): {}",
        io::Error::last_os_error()
    );
    // SAFETY: a descriptor memfd_create just returned.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.set_len(2 * HUGE as u64)
        .expect("sizing the hugetlbfs memfd");
    let m = GuardedMap::map(f.as_fd(), 0, 2 * HUGE).expect("maps");
    assert_eq!(page_size_of(f.as_fd()).unwrap(), HUGE);
    let want = pattern(8192, 5);
    m.write(HUGE + 4096, &want).expect("writes");
    let mut got = vec![0u8; 8192];
    m.read(HUGE + 4096, &mut got).expect("reads");
    assert_eq!(got, want);

    f.set_len(HUGE as u64).expect("truncating to one huge page");
    assert_eq!(m.read(HUGE + 4096, &mut got), Err(MapError::Broken));
    assert_eq!(m.read(0, &mut got), Err(MapError::Broken));
}
