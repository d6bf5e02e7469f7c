//! The caps of [`Admission`], with closers that only record that they ran.

use super::*;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

fn caps(authenticated: usize, pending: usize, per_source: usize) -> Caps {
    Caps {
        authenticated,
        pending,
        pending_per_source: per_source,
    }
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

/// A connection as a test sees it: its ticket and whether it was closed.
struct Conn {
    ticket: Ticket,
    closed: Arc<AtomicBool>,
}

impl Conn {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

fn admit(a: &Arc<Admission>, from: IpAddr) -> Result<Conn, Refused> {
    let closed = Arc::new(AtomicBool::new(false));
    let c = closed.clone();
    let ticket = a.admit(from, Box::new(move || c.store(true, Ordering::SeqCst)))?;
    Ok(Conn { ticket, closed })
}

#[test]
fn a_full_pending_cap_closes_the_oldest_pending_connection() {
    let a = Admission::new(caps(10, 3, 3), "test", "unproven");
    let conns: Vec<Conn> = (1..=3).map(|i| admit(&a, ip(i)).unwrap()).collect();
    assert!(conns.iter().all(|c| !c.closed()));
    let newer = admit(&a, ip(4)).unwrap();
    assert!(conns[0].closed(), "the oldest makes room");
    assert!(conns[0].ticket.was_evicted());
    assert!(!conns[1].closed() && !conns[2].closed() && !newer.closed());
    assert_eq!(a.counts().pending, 3);
    // The evicted connection's thread still runs until it notices.
    assert_eq!(a.counts().live, 4);
}

#[test]
fn an_address_at_its_share_makes_room_from_its_own_connections() {
    let a = Admission::new(caps(10, 100, 2), "test", "unproven");
    let other = admit(&a, ip(9)).unwrap();
    let first = admit(&a, ip(1)).unwrap();
    let second = admit(&a, ip(1)).unwrap();
    let third = admit(&a, ip(1)).unwrap();
    assert!(first.closed(), "the address's oldest makes room");
    assert!(!second.closed() && !third.closed());
    assert!(
        !other.closed(),
        "another address's connection is left alone"
    );
}

#[test]
fn an_ipv6_host_counts_by_its_64() {
    let a = Admission::new(caps(10, 100, 1), "test", "unproven");
    let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
    let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
    let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
    let first = admit(&a, one).unwrap();
    let elsewhere = admit(&a, other_64).unwrap();
    let _second = admit(&a, same_64).unwrap();
    assert!(first.closed(), "the same /64 is one address");
    assert!(!elsewhere.closed());
    let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
    assert_eq!(Source::of(mapped), Source::of(ip(1)));
}

#[test]
fn authenticated_connections_leave_the_pending_caps_and_have_their_own() {
    let a = Admission::new(caps(2, 2, 2), "test", "unproven");
    let mut x = admit(&a, ip(1)).unwrap();
    let mut y = admit(&a, ip(1)).unwrap();
    x.ticket.authenticate().unwrap();
    y.ticket.authenticate().unwrap();
    assert_eq!(a.counts().pending, 0);
    // Pending ones come and go without touching the authenticated ones.
    let p1 = admit(&a, ip(1)).unwrap();
    let _p2 = admit(&a, ip(1)).unwrap();
    let mut p3 = admit(&a, ip(1)).unwrap();
    assert!(p1.closed() && !x.closed() && !y.closed());
    assert_eq!(
        p3.ticket.authenticate(),
        Err(Refused::Authenticated { max: 2 })
    );
    drop(x);
    p3.ticket.authenticate().unwrap();
    assert!(p3.ticket.is_authenticated() && !p3.ticket.was_evicted());
    assert!(p1.ticket.was_evicted());
}

#[test]
fn an_evicted_connection_cannot_authenticate() {
    let a = Admission::new(caps(10, 1, 1), "test", "unproven");
    let mut old = admit(&a, ip(1)).unwrap();
    let _new = admit(&a, ip(2)).unwrap();
    assert_eq!(old.ticket.authenticate(), Err(Refused::Evicted));
}

#[test]
fn beyond_the_ceiling_a_connection_is_refused_until_one_ends() {
    let a = Admission::new(caps(1, 1, 1), "test", "unproven");
    assert_eq!(a.caps().ceiling(), 3);
    let mut kept = vec![admit(&a, ip(1)).unwrap()];
    kept[0].ticket.authenticate().unwrap();
    // Each newcomer evicts the last, whose thread has not ended yet.
    kept.push(admit(&a, ip(2)).unwrap());
    kept.push(admit(&a, ip(3)).unwrap());
    assert!(matches!(
        admit(&a, ip(4)),
        Err(Refused::Ceiling { live: 3 })
    ));
    kept.remove(1); // the evicted one's thread ends
    assert!(admit(&a, ip(4)).is_ok());
}

#[test]
fn closing_the_pending_connections_leaves_the_authenticated_ones() {
    let a = Admission::new(caps(4, 4, 4), "test", "unproven");
    let mut auth = admit(&a, ip(1)).unwrap();
    auth.ticket.authenticate().unwrap();
    let p = admit(&a, ip(1)).unwrap();
    a.close_pending();
    assert!(p.closed() && !auth.closed());
    drop((p, auth));
    assert_eq!(
        a.counts(),
        Counts {
            pending: 0,
            authenticated: 0,
            live: 0
        }
    );
}

#[test]
fn at_the_ceiling_a_newcomer_waits_for_a_closed_connection_to_end() {
    // Ceiling: 1 authenticated + 2 * 1 pending = 3 live.
    let a = Admission::new(caps(1, 1, 1), "test", "unproven");
    let mut held: Vec<Conn> = (1..=3).map(|i| admit(&a, ip(i)).unwrap()).collect();
    assert_eq!(a.counts().live, 3);
    assert!(matches!(admit(&a, ip(4)), Err(Refused::Ceiling { .. })));
    // A closed connection's thread ends a moment later: the waiting newcomer gets in.
    let ending = held.remove(0);
    let ends = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(ending);
    });
    let waited = a.admit_within(ip(5), Box::new(|| {}), Duration::from_secs(10));
    assert!(waited.is_ok(), "{:?}", waited.err());
    ends.join().unwrap();
    // Nothing ends: the wait runs out and it is refused.
    let refused = a.admit_within(ip(6), Box::new(|| {}), Duration::from_millis(20));
    assert!(matches!(refused, Err(Refused::Ceiling { .. })));
}
