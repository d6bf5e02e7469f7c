//! Mounting FUSE with mount(2), as root, the way libfuse does.
//!
//! fuser's own mount as root calls mount(2) with the type `fuse` and treats its
//! `Subtype` option as one for fusermount3 alone, so the subtype never reaches the
//! kernel: `/proc/mounts` showed fsd's mounts as `fuse`, and `mount`, `umount`,
//! `findmnt -t fuse.rmemfs` and fstab could not tell them from any other FUSE mount.
//! Its flags also cannot say `strictatime` or `nodiratime`. So fsd, as root, makes
//! the mount itself: it opens `/dev/fuse`, calls mount(2) with the type
//! `fuse.SUBTYPE`, the source `FSNAME` (what `/proc/mounts` shows as the device) and
//! every flag the [`MountOptions`] ask for, and hands the descriptor to fuser
//! (`Session::from_fd`), which answers FUSE_INIT and serves as before. Another user
//! cannot call mount(2); fsd then lets fuser go through fusermount3, which builds the
//! same type from the `Subtype` option (see `super::Mounted::new`).
//!
//! Such a mount is not fuser's to unmount: [`unmount`] does it, and only while the
//! mount's FUSE connection is alive, so that it never takes down a filesystem
//! mounted later on the same directory.

use super::options::MountOptions;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Mounts a FUSE filesystem of type `fuse.SUBTYPE` with source `fsname` on
/// `mountpoint`; returns the `/dev/fuse` descriptor the kernel will send its
/// requests to (FUSE_INIT first). `allow_other` lets every user in (the kernel's
/// `allow_other`); permissions are always checked by the kernel
/// (`default_permissions`).
pub fn mount(
    mountpoint: &Path,
    fsname: &str,
    subtype: &str,
    options: &MountOptions,
    allow_other: bool,
) -> io::Result<OwnedFd> {
    let cstring = |what: &str, bytes: &[u8]| {
        CString::new(bytes).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the {what} contains a NUL byte"),
            )
        })
    };
    let target = cstring("mountpoint", mountpoint.as_os_str().as_bytes())?;
    let source = cstring("fsname", fsname.as_bytes())?;
    let fstype = cstring("subtype", format!("fuse.{subtype}").as_bytes())?;
    // The root's file type; its permissions come from fsd's getattr.
    let rootmode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let device: OwnedFd = File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("opening /dev/fuse: {e}")))?
        .into();
    // SAFETY: getuid/getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={rootmode:o},user_id={uid},group_id={gid},default_permissions",
        device.as_raw_fd()
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    let data = cstring("mount data", data.as_bytes())?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call; the
    // data string is what the fuse module parses (its own options).
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            options.flags(),
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(device)
}

/// True while the FUSE connection of `device` is alive: the kernel reports an error
/// condition on the descriptor once the mount is gone (unmounted or aborted).
pub fn is_connected(device: BorrowedFd<'_>) -> bool {
    loop {
        let mut pfd = libc::pollfd {
            fd: device.as_raw_fd(),
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return n == 0 || (n > 0 && pfd.revents & libc::POLLERR == 0);
    }
}

/// Unmounts the mount at `mountpoint` whose connection is `device`, unless it is
/// already gone. A busy mount is an error (EBUSY) left to the caller.
pub fn unmount(mountpoint: &Path, device: impl AsFd) -> io::Result<()> {
    if !is_connected(device.as_fd()) {
        return Ok(());
    }
    let target = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches the mount at `mountpoint` (MNT_DETACH) whose connection is `device`,
/// unless it is already gone: for a mount whose FUSE_INIT failed, before anything
/// could use it.
pub fn detach(mountpoint: &Path, device: impl AsFd) {
    if !is_connected(device.as_fd()) {
        return;
    }
    if let Ok(target) = CString::new(mountpoint.as_os_str().as_bytes()) {
        // SAFETY: a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}
