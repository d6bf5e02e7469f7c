//! File handles: `name_to_handle_at` and `open_by_handle_at`, as handle-based tools
//! and NFS re-export use them. A handle opens its file or directory even after the
//! kernel dropped its inode from cache, gives ESTALE once the file is unlinked, and
//! on a volume stays valid across an unmount and a mount. Compared with tmpfs.

use rmemfs_tests::kernel::drop_page_cache;
use rmemfs_tests::{FsdMount, MemnodeProc, TmpfsMount};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A handle: `struct file_handle` with room for MAX_HANDLE_SZ (128) bytes.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

fn handle_of(path: &Path) -> Handle {
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let p = CString::new(path.as_os_str().as_bytes()).expect("path");
    let mut mount_id = 0;
    // SAFETY: `h` is a file_handle with `bytes` of room after its header, `p` a
    // NUL-terminated path, `mount_id` a valid int to fill.
    let rc = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            p.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        io::Error::last_os_error()
    );
    h
}

fn open_by_handle(mount: &Path, h: &mut Handle, flags: i32) -> io::Result<File> {
    let m = File::open(mount).expect("open the mount's root");
    // SAFETY: `h` is a handle name_to_handle_at filled; the fd is ours to own.
    let fd = unsafe { libc::open_by_handle_at(m.as_raw_fd(), (h as *mut Handle).cast(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn read_all(f: &mut File) -> Vec<u8> {
    let mut v = Vec::new();
    f.read_to_end(&mut v).expect("read");
    v
}

/// The kernel forgets dentries and inodes nobody holds (FUSE then sends FORGETs),
/// so the next open by handle must ask the filesystem.
fn forget_cached_inodes() {
    drop_page_cache();
    std::thread::sleep(std::time::Duration::from_millis(200));
}

fn handles(mount: &Path, fs: &str) -> Handle {
    let dir = mount.join("dir");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("kept"), b"kept contents").expect("write");
    std::fs::write(dir.join("gone"), b"soon unlinked").expect("write");
    let mut kept = handle_of(&dir.join("kept"));
    let mut gone = handle_of(&dir.join("gone"));
    let mut d = handle_of(&dir);
    forget_cached_inodes();
    let mut f = open_by_handle(mount, &mut kept, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("{fs}: open_by_handle_at of an uncached file: {e}"));
    assert_eq!(read_all(&mut f), b"kept contents", "{fs}");
    drop(f);
    let f = open_by_handle(mount, &mut d, libc::O_RDONLY | libc::O_DIRECTORY)
        .unwrap_or_else(|e| panic!("{fs}: open_by_handle_at of a directory: {e}"));
    assert!(f.metadata().expect("fstat").is_dir(), "{fs}");
    drop(f);
    std::fs::remove_file(dir.join("gone")).expect("unlink");
    forget_cached_inodes();
    let err = open_by_handle(mount, &mut gone, libc::O_RDONLY)
        .err()
        .unwrap_or_else(|| panic!("{fs}: a handle to an unlinked file opened"));
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE), "{fs}: {err}");
    kept
}

#[test]
fn file_handles_open_uncached_files_and_go_stale_with_unlink_as_on_tmpfs() {
    let tmpfs = TmpfsMount::start("16M");
    handles(tmpfs.path(), "tmpfs");
    drop(tmpfs);
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &[]);
    handles(fsd.path(), "rmemfs");
    fsd.unmount();
}

#[test]
fn a_handle_stays_valid_across_an_unmount_and_a_mount_of_a_volume() {
    let memnode = MemnodeProc::start("64M");
    let args = ["--volume", "handles"];
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let mut kept = handles(fsd.path(), "rmemfs volume");
    fsd.unmount();
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let mut f = open_by_handle(fsd.path(), &mut kept, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("open_by_handle_at after the remount: {e}"));
    assert_eq!(read_all(&mut f), b"kept contents");
    drop(f);
    fsd.unmount();
}
