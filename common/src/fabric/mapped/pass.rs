//! Handing a memory file's descriptor from the memnode to a client on the same host:
//! one `SCM_RIGHTS` message on a Unix stream socket, with a small header that says
//! what the descriptor is, and the peer's credentials (`SO_PEERCRED`) for the
//! memnode to decide whether to hand it over at all.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most bytes of the header that travels with a descriptor.
pub const MAX_HEADER: usize = 256;

/// Sends `header` and `fd` as one message.
pub fn send_fd(sock: &UnixStream, header: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    if header.is_empty() || header.len() > MAX_HEADER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a header of 1 to {MAX_HEADER} bytes"),
        ));
    }
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let iov = [IoSlice::new(header)];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` has room for exactly one cmsg with one descriptor.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), raw);
    }
    loop {
        // SAFETY: a valid socket and message.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return if n as usize == header.len() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the descriptor's header went out in part",
                ))
            };
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message of [`send_fd`]: its header and its descriptor. A message
/// with no descriptor, more than one, or a cut header is an error (and any
/// descriptors it carried are closed).
pub fn recv_fd(sock: &UnixStream) -> io::Result<(Vec<u8>, OwnedFd)> {
    let mut header = vec![0u8; MAX_HEADER];
    // Room for a few descriptors, so a peer that sends more is seen doing it (and its
    // descriptors closed) rather than having them cut off silently.
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(4 * std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = [IoSliceMut::new(&mut header)];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: a valid socket and message; MSG_CMSG_CLOEXEC keeps the descriptor
        // out of programs fsd starts.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages recvmsg filled in, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a descriptor message longer than this side takes",
        ));
    }
    if n == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed before sending a descriptor",
        ));
    }
    if fds.len() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message with {} descriptors, not one", fds.len()),
        ));
    }
    header.truncate(n);
    Ok((header, fds.remove(0)))
}

/// The process, user and group on the other end of a Unix socket, as the kernel saw
/// them when it connected.
pub fn peer_credentials(sock: &UnixStream) -> io::Result<libc::ucred> {
    // SAFETY: a zeroed ucred is valid for getsockopt to fill.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, and a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

#[cfg(test)]
#[path = "pass_tests.rs"]
mod tests;
