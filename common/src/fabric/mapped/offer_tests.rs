use super::*;
use crate::fabric::mapped::shared::memfd;
use std::io::Write;

fn offer() -> Arc<MapOffer> {
    let fd = memfd("offer-test", 1 << 20).expect("memfd");
    MapOffer::start(SharedRegion {
        fd,
        offset: 0,
        base: 0x10_0000,
        len: 1 << 20,
    })
    .expect("offer")
}

/// Redeems the ticket of `reply` (an `OP_MAP` reply) as this process: the headers of
/// the descriptors received and the socket (the mapped connection lasts while it is
/// open), or the error that ended it.
fn redeem(reply: &[u8]) -> Result<(Vec<Vec<u8>>, UnixStream), String> {
    let o = Offer::decode(reply)?;
    let addr = UnixAddr::from_abstract_name(&o.socket).map_err(|e| e.to_string())?;
    let mut s = UnixStream::connect_addr(&addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(&o.ticket).map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    for _ in 0..3 {
        let (header, _fd) = pass::recv_fd(&s).map_err(|e| e.to_string())?;
        got.push(header);
    }
    Ok((got, s))
}

#[test]
fn an_offer_round_trips_and_garbage_is_refused() {
    let o = Offer {
        socket: b"name".to_vec(),
        ticket: [7; TICKET_LEN],
        offset: 4096,
        base: 1 << 40,
        len: 1 << 30,
    };
    assert_eq!(Offer::decode(&o.encode()), Ok(o.clone()));
    let mut long = o.encode();
    long.push(0);
    assert!(Offer::decode(&long).is_err(), "a byte too many");
    assert!(Offer::decode(&o.encode()[..10]).is_err(), "cut short");
    assert!(Offer::decode(&[]).is_err(), "empty");
    let mut v2 = o.encode();
    v2[0] = 2;
    assert!(Offer::decode(&v2).unwrap_err().contains("version 2"));
}

#[test]
fn a_ticket_buys_the_descriptors_once() {
    let offer = offer();
    let reply = offer.issue(5, 1).expect("ticket");
    let (got, sock) = redeem(&reply).expect("the descriptors");
    assert_eq!(
        got,
        vec![b"region".to_vec(), b"grants".to_vec(), b"section".to_vec()]
    );
    assert_eq!(offer.connections(), 1);
    drop(sock);
    assert_eq!(offer.connections(), 0, "the client closed it");
    assert!(redeem(&reply).is_err(), "a ticket used twice");
    let mut forged = Offer::decode(&reply).unwrap();
    forged.ticket[0] ^= 1;
    assert!(redeem(&forged.encode()).is_err(), "a ticket never issued");
}

#[test]
fn the_tcp_connection_ending_takes_its_tickets_and_mappings_with_it() {
    let offer = offer();
    let mapped = offer.issue(5, 1).expect("ticket");
    let (_, sock) = redeem(&mapped).expect("the descriptors");
    assert_eq!(offer.connections(), 1);
    let unused = offer.issue(5, 1).expect("ticket");
    let other = offer.issue(6, 2).expect("ticket");
    offer.connection_closed(1);
    assert_eq!(
        offer.connections(),
        0,
        "the mapped connection of tcp connection 1"
    );
    assert!(redeem(&unused).is_err(), "its unused ticket is void");
    redeem(&other).expect("another connection's ticket still works");
    // The memnode closed its end of the mapped connection.
    let mut byte = [0u8; 1];
    assert_eq!(std::io::Read::read(&mut &sock, &mut byte).expect("EOF"), 0);
}

#[test]
fn a_revocation_does_not_wait_for_other_clients_and_the_table_forgets_the_grant() {
    let offer = offer();
    offer.granted(9, 5, 0x10_0000, 4096);
    offer.granted(10, 5, 0x90_0000, 4096); // outside the region: not filed
    let table = lock(&offer.table);
    assert!(table.lookup(9).is_some());
    assert!(
        table.lookup(10).is_none(),
        "only the region's registrations"
    );
    drop(table);
    offer.revoked(9);
    assert!(lock(&offer.table).lookup(9).is_none());
}

/// The child half of `a_process_of_another_user_gets_nothing`, in a forked child (so
/// raw system calls only): become `nobody`, redeem the ticket, and exit 0 if a
/// descriptor came, 1 if refused, 2 if the test itself could not be set up.
fn redeem_as_nobody(socket: &[u8], ticket: &[u8; TICKET_LEN]) -> ! {
    // SAFETY: plain system calls on stack memory; nothing allocates after fork.
    unsafe {
        if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
            libc::_exit(2);
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        if fd < 0 {
            libc::_exit(2);
        }
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // Abstract: a NUL, then the name.
        for (i, b) in socket.iter().enumerate() {
            addr.sun_path[i + 1] = *b as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + socket.len();
        if libc::connect(fd, (&raw const addr).cast(), len as libc::socklen_t) != 0 {
            libc::_exit(2);
        }
        libc::write(fd, ticket.as_ptr().cast(), TICKET_LEN);
        let mut data = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        let mut control = [0u64; 16];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(fd, &mut msg, 0);
        libc::_exit(if n > 0 && msg.msg_controllen > 0 {
            0
        } else {
            1
        });
    }
}

#[test]
fn a_process_of_another_user_gets_nothing() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!(
            "SKIPPED a_process_of_another_user_gets_nothing: needs root to become another user"
        );
        return;
    }
    let offer = offer();
    let o = Offer::decode(&offer.issue(5, 1).expect("ticket")).expect("offer");
    // SAFETY: the child only makes raw system calls and exits (redeem_as_nobody).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        redeem_as_nobody(&o.socket, &o.ticket);
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "the child exited: {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        1,
        "0: another user got the region's descriptor; 2: the test could not run"
    );
    assert_eq!(offer.connections(), 0);
}
