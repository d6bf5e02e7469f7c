use super::*;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn grant(owner: u64, addr: u64) -> Grant {
    Grant {
        owner,
        addr,
        end: addr + 4096,
    }
}

#[test]
fn a_reader_of_the_file_sees_what_the_writer_files_and_removes() {
    let (fd, table) = GrantTable::create().expect("table");
    let reader = GrantTable::open(fd.as_fd()).expect("reader");
    assert!(table.insert(7, grant(1, 0x1000)));
    assert_eq!(reader.lookup(7), Some(grant(1, 0x1000)));
    assert_eq!(reader.lookup(8), None, "an rkey never filed");
    assert_eq!(reader.lookup(0), None, "rkey 0 is never a grant");
    assert_eq!(table.remove(7), Some(grant(1, 0x1000)));
    assert_eq!(reader.lookup(7), None, "removed");
    assert_eq!(table.remove(7), None, "removed twice");
}

#[test]
fn a_taken_slot_leaves_the_newcomer_out_and_never_answers_for_it() {
    let (_fd, table) = GrantTable::create().expect("table");
    let first = 1u32;
    let clash = (2..u32::MAX)
        .find(|&k| slot_of(k) == slot_of(first))
        .expect("some rkey shares the slot");
    assert!(table.insert(first, grant(1, 0x1000)));
    assert!(!table.insert(clash, grant(2, 0x9000)), "slot taken");
    assert_eq!(table.lookup(clash), None, "not cached: goes over tcp");
    assert_eq!(
        table.remove(clash),
        None,
        "removing it leaves the holder alone"
    );
    assert_eq!(table.lookup(first), Some(grant(1, 0x1000)));
}

#[test]
fn the_read_only_view_cannot_be_written() {
    let (fd, _table) = GrantTable::create().expect("table");
    let reader = GrantTable::open(fd.as_fd()).expect("reader");
    // A write through the view would fault: its mapping is PROT_READ.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let start = reader.words.u32_at(0) as *const _ as usize;
    let line = maps
        .lines()
        .find(|l| {
            l.split('-')
                .next()
                .and_then(|a| usize::from_str_radix(a, 16).ok())
                == Some(start)
        })
        .expect("the mapping is listed");
    assert!(line.contains(" r--s "), "{line}");
}

#[test]
fn synchronize_waits_for_a_copy_in_flight_and_not_for_later_ones() {
    let (fd, memnode) = ReadSection::create().expect("section");
    let client = Arc::new(ReadSection::open(fd.as_fd()).expect("client"));
    let inside = client.enter();
    let done = Arc::new(AtomicBool::new(false));
    let waiter = {
        let done = done.clone();
        std::thread::spawn(move || {
            let r = memnode.synchronize(Instant::now() + Duration::from_secs(20), || false);
            done.store(true, Ordering::SeqCst);
            (r, memnode)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !done.load(Ordering::SeqCst),
        "returned with a copy in flight"
    );
    // A copy that enters after the epoch moved does not hold the waiter.
    let later = client.enter();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!done.load(Ordering::SeqCst));
    client.leave(inside);
    let (r, memnode) = waiter.join().expect("waiter");
    assert_eq!(r, Drained::Yes);
    // The later copy is still inside: the next revocation waits for it.
    let r = memnode.synchronize(Instant::now() + Duration::from_millis(100), || false);
    assert_eq!(r, Drained::TimedOut);
    client.leave(later);
    let r = memnode.synchronize(Instant::now() + Duration::from_secs(1), || false);
    assert_eq!(r, Drained::Yes);
}

#[test]
fn synchronize_stops_waiting_for_a_client_that_is_gone() {
    let (fd, memnode) = ReadSection::create().expect("section");
    let client = ReadSection::open(fd.as_fd()).expect("client");
    let _stuck = client.enter();
    let r = memnode.synchronize(Instant::now() + Duration::from_secs(20), || true);
    assert_eq!(r, Drained::ClientGone);
}

#[test]
fn readers_never_see_a_torn_grant() {
    let (fd, table) = GrantTable::create().expect("table");
    let reader = GrantTable::open(fd.as_fd()).expect("reader");
    let stop = Arc::new(AtomicBool::new(false));
    let r = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Some(g) = reader.lookup(5) {
                    // Every grant filed has owner == addr / 4096 and end = addr + 4096.
                    assert_eq!(g.owner * 4096, g.addr, "torn: {g:?}");
                    assert_eq!(g.end, g.addr + 4096, "torn: {g:?}");
                    seen += 1;
                }
            }
            seen
        })
    };
    for i in 1..200_000u64 {
        table.insert(5, grant(i, i * 4096));
        table.remove(5);
    }
    stop.store(true, Ordering::Relaxed);
    r.join().expect("reader");
}
