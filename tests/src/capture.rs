//! Raw packets seen on one network interface, captured the way tcpdump does (an
//! `AF_PACKET` socket, root only), for tests that prove what crosses a wire: whether a
//! file's bytes or a secret appear in clear.
//!
//! [`Capture::start`] opens the socket and a thread that keeps every frame of the
//! interface (both directions, Ethernet header included) until [`Capture::stop`], which
//! returns them with the kernel's count of frames it had to drop. The socket is bound
//! to the interface before it is told which protocol to take (it is opened with
//! protocol 0, which takes nothing), so no frame of another interface slips in between
//! `socket` and `bind`; each frame's interface is checked again as it is read.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The kernel buffer asked for (`SO_RCVBUFFORCE`): a test's few MiB of traffic fit, so
/// nothing is dropped while the reader thread waits for a CPU under emulation.
const RCVBUF: libc::c_int = 32 << 20;
/// The largest frame read at once: veth hands over GSO frames of up to 64 KiB.
const FRAME: usize = 256 << 10;

/// What a capture saw.
pub struct Captured {
    /// Every frame, concatenated (frame boundaries do not matter to a search for a
    /// few dozen bytes among frames of kilobytes).
    pub bytes: Vec<u8>,
    pub frames: u64,
    /// Frames the kernel dropped because the socket's buffer was full.
    pub dropped: u32,
}

impl Captured {
    /// Whether `needle` occurs in any frame.
    pub fn contains(&self, needle: &[u8]) -> bool {
        !needle.is_empty() && self.bytes.windows(needle.len()).any(|w| w == needle)
    }
}

/// The reader thread's result: the frames' bytes, concatenated, and their count.
type Frames = (Vec<u8>, u64);

/// A capture running on one interface.
pub struct Capture {
    fd: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<io::Result<Frames>>>,
}

impl Capture {
    /// Starts capturing every frame of interface `ifname` of this network namespace.
    pub fn start(ifname: &str) -> io::Result<Capture> {
        let name = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in ifname"))?;
        // SAFETY: a NUL-terminated name; the call only reads it.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain socket creation; the descriptor is owned right below.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF)?;
        // A bounded wait per read, so the thread sees the stop flag.
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, timeout)?;
        // SAFETY: a zeroed sockaddr_ll is valid; the fields that matter are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: `addr` is a valid sockaddr_ll of the length given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = Arc::new(fd);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let fd = fd.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("capture {ifname}"))
                .spawn(move || read_frames(&fd, ifindex as i32, &stop))?
        };
        Ok(Capture {
            fd,
            stop,
            reader: Some(reader),
        })
    }

    /// Stops the capture and returns what it saw (the frames already queued in the
    /// kernel are read first).
    pub fn stop(mut self) -> io::Result<Captured> {
        self.stop.store(true, Ordering::Release);
        let reader = self.reader.take().expect("a capture is stopped once");
        let (bytes, frames) = reader
            .join()
            .map_err(|_| io::Error::other("the capture thread panicked"))??;
        // SAFETY: a zeroed tpacket_stats is valid; getsockopt fills it.
        let mut stats: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `stats` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Captured {
            bytes,
            frames,
            dropped: stats.tp_drops,
        })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The reader thread: frames until the stop flag is seen and the socket has nothing
/// more queued.
fn read_frames(fd: &OwnedFd, ifindex: i32, stop: &AtomicBool) -> io::Result<Frames> {
    let mut bytes = Vec::new();
    let mut frames = 0u64;
    let mut buf = vec![0u8; FRAME];
    loop {
        // After the stop flag, drain without waiting.
        let flags = if stop.load(Ordering::Acquire) {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        // SAFETY: zeroed sockaddr_ll is valid; recvfrom fills at most `from_len` bytes.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buf` is writable for its length, `from` for `from_len` bytes.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if stop.load(Ordering::Acquire) && flags != 0 => {
                    return Ok((bytes, frames))
                }
                io::ErrorKind::WouldBlock => continue,
                _ => return Err(e),
            }
        }
        if from.sll_ifindex == ifindex {
            bytes.extend_from_slice(&buf[..n as usize]);
            frames += 1;
        }
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: T) -> io::Result<()> {
    // SAFETY: `value` is a plain value of the size given, read by the call only.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Captured;

    #[test]
    fn finds_a_needle_anywhere_and_never_an_empty_one() {
        let c = Captured {
            bytes: b"..frame one..frame two with SECRET inside".to_vec(),
            frames: 2,
            dropped: 0,
        };
        assert!(c.contains(b"SECRET"));
        assert!(c.contains(b".."));
        assert!(!c.contains(b"secret"));
        assert!(!c.contains(b""));
    }
}
