use super::*;
use crate::fabric::mapped::guard::GuardedMap;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

fn memfd() -> std::fs::File {
    // SAFETY: a NUL-terminated name and no flags.
    let fd = unsafe { libc::memfd_create(c"pass-test".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a descriptor memfd_create just returned.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.set_len(8192).unwrap();
    f
}

#[test]
fn a_descriptor_crosses_with_its_header_and_maps_the_same_memory() {
    let (a, b) = UnixStream::pair().unwrap();
    let f = memfd();
    f.write_all_at(b"lent memory", 100).unwrap();
    send_fd(&a, b"region v1", f.as_fd()).unwrap();
    let (header, got) = recv_fd(&b).unwrap();
    assert_eq!(header, b"region v1");
    let m = GuardedMap::map(got.as_fd(), 0, 8192).unwrap();
    let mut buf = [0u8; 11];
    m.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"lent memory");
    m.write(4096, b"from the client").unwrap();
    let mut back = [0u8; 15];
    f.read_exact_at(&mut back, 4096).unwrap();
    assert_eq!(&back, b"from the client");
}

#[test]
fn a_message_without_a_descriptor_or_a_closed_peer_is_an_error() {
    let (a, b) = UnixStream::pair().unwrap();
    use std::io::Write;
    (&a).write_all(b"no fd here").unwrap();
    let e = recv_fd(&b).unwrap_err();
    assert!(e.to_string().contains("0 descriptors"), "{e}");
    drop(a);
    let e = recv_fd(&b).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
}

#[test]
fn headers_must_be_small_and_not_empty() {
    let (a, _b) = UnixStream::pair().unwrap();
    let f = memfd();
    for h in [&[][..], &[0u8; MAX_HEADER + 1][..]] {
        let e = send_fd(&a, h, f.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

#[test]
fn the_peer_is_named_by_the_kernel() {
    let (a, _b) = UnixStream::pair().unwrap();
    let cred = peer_credentials(&a).unwrap();
    assert_eq!(cred.pid as u32, std::process::id());
    // SAFETY: getuid has no memory effects.
    assert_eq!(cred.uid, unsafe { libc::getuid() });
}
