//! Unit tables for [`TcpRegistry`]: what the owner may do, and every refusal.

use super::*;

const OWNER: u64 = 11;
const PAGE: usize = 4096;

/// Three pages of memory with the middle one registered to OWNER. The registry is
/// dropped (so nothing is registered) before `memory` is read directly.
struct Fixture {
    // Declared before `memory`, so it is dropped first.
    registry: Option<TcpRegistry>,
    memory: Vec<u8>,
    addr: u64,
    rkey: u32,
}

impl Fixture {
    fn new() -> Fixture {
        let mut memory = vec![0u8; 3 * PAGE];
        let addr = memory.as_mut_ptr() as u64 + PAGE as u64;
        let registry = TcpRegistry::new();
        // SAFETY: the middle page of `memory`, which outlives the registry (it is
        // dropped first, in `into_memory` or by field order) and is not touched
        // directly while the registry exists.
        let rkey = unsafe { registry.register(OWNER, addr, PAGE as u64) }.expect("register");
        Fixture {
            registry: Some(registry),
            memory,
            addr,
            rkey,
        }
    }

    fn reg(&self) -> &TcpRegistry {
        self.registry.as_ref().expect("registry still alive")
    }

    /// Drops the registry and returns the memory as it was left.
    fn into_memory(mut self) -> Vec<u8> {
        self.registry = None;
        std::mem::take(&mut self.memory)
    }
}

#[test]
fn the_owner_reads_back_what_it_wrote_anywhere_inside_its_registration() {
    let f = Fixture::new();
    let r = f.reg();
    let data: Vec<u8> = (0..PAGE).map(|i| (i % 251) as u8).collect();
    r.write(OWNER, f.addr, f.rkey, &data)
        .expect("whole page write");
    let mut back = vec![0u8; PAGE];
    r.read(OWNER, f.addr, f.rkey, &mut back)
        .expect("whole page read");
    assert_eq!(
        back, data,
        "the whole registration must read back byte-exact"
    );
    let mut tail = [0u8; 8];
    r.read(OWNER, f.addr + PAGE as u64 - 8, f.rkey, &mut tail)
        .expect("last 8 bytes");
    assert_eq!(&tail[..], &data[PAGE - 8..]);
    r.read(OWNER, f.addr + PAGE as u64, f.rkey, &mut [])
        .expect("an empty access at the end is inside");
}

#[test]
fn refused_accesses_name_the_reason_and_copy_nothing() {
    let f = Fixture::new();
    let (addr, rkey, len) = (f.addr, f.rkey, PAGE as u64);
    f.reg()
        .write(OWNER, addr, rkey, &[7u8; PAGE])
        .expect("fill");
    let cases: [(&str, u64, u64, u32, usize, AccessError); 6] = [
        (
            "unknown rkey",
            OWNER,
            addr,
            rkey ^ 1,
            8,
            AccessError::UnknownKey,
        ),
        (
            "another client",
            OWNER + 1,
            addr,
            rkey,
            8,
            AccessError::NotOwner,
        ),
        (
            "past the end",
            OWNER,
            addr + len - 4,
            rkey,
            8,
            AccessError::OutOfBounds,
        ),
        (
            "before the start",
            OWNER,
            addr - 4,
            rkey,
            8,
            AccessError::OutOfBounds,
        ),
        (
            "addr + len overflows",
            OWNER,
            u64::MAX - 2,
            rkey,
            8,
            AccessError::OutOfBounds,
        ),
        (
            "outside entirely",
            OWNER,
            0,
            rkey,
            8,
            AccessError::OutOfBounds,
        ),
    ];
    for (what, client, at, key, n, want) in cases {
        let mut buf = vec![0u8; n];
        assert_eq!(
            f.reg().read(client, at, key, &mut buf),
            Err(want),
            "READ with {what}"
        );
        assert!(
            buf.iter().all(|&b| b == 0),
            "a refused READ ({what}) must copy nothing"
        );
        assert_eq!(
            f.reg().write(client, at, key, &vec![9u8; n]),
            Err(want),
            "WRITE with {what}"
        );
    }
    let memory = f.into_memory();
    assert!(
        memory[..PAGE].iter().all(|&b| b == 0),
        "page before untouched"
    );
    assert!(
        memory[PAGE..2 * PAGE].iter().all(|&b| b == 7),
        "registration untouched"
    );
    assert!(
        memory[2 * PAGE..].iter().all(|&b| b == 0),
        "page after untouched"
    );
}

#[test]
fn a_deregistered_rkey_refuses_every_later_access_and_others_keep_theirs() {
    let mut f = Fixture::new();
    let other_addr = f.memory.as_mut_ptr() as u64;
    let r = f.reg();
    // SAFETY: the first page of the fixture's memory, as in `Fixture::new`.
    let other = unsafe { r.register(OWNER + 1, other_addr, PAGE as u64) }.expect("register");
    assert_ne!(other, f.rkey, "live registrations never share an rkey");
    r.deregister(f.rkey ^ 1); // unknown: ignored
    assert_eq!(r.len(), 2);
    r.deregister(f.rkey);
    for at in [f.addr, f.addr + 8] {
        assert_eq!(
            r.read(OWNER, at, f.rkey, &mut [0u8; 8]),
            Err(AccessError::UnknownKey),
            "READ after deregister"
        );
        assert_eq!(
            r.write(OWNER, at, f.rkey, &[1u8; 8]),
            Err(AccessError::UnknownKey),
            "WRITE after deregister"
        );
    }
    r.write(OWNER + 1, other_addr, other, b"still mine")
        .expect("another registration is unaffected");
    assert_eq!(r.len(), 1);
}

#[test]
fn rkeys_skip_zero_and_keys_in_use() {
    let mut script = vec![0, 5, 5, 0, 7].into_iter();
    let r = TcpRegistry::with_keys(Box::new(move || script.next()));
    // Registrations are never accessed in this test; any address will do.
    // SAFETY: the contract protects accesses, and none is made through these.
    let first = unsafe { r.register(1, 0x1000, 16) }.expect("a key");
    // SAFETY: as above.
    let second = unsafe { r.register(1, 0x2000, 16) }.expect("a key");
    assert_eq!(first, 5, "zero is never an rkey");
    assert_eq!(second, 7, "a live rkey is never reused");
}

#[test]
fn no_randomness_or_a_wrapping_range_fails_and_registers_nothing() {
    let r = TcpRegistry::with_keys(Box::new(|| None));
    // SAFETY: the registration fails; nothing is ever accessed.
    let got = unsafe { r.register(1, 0x1000, 16) };
    assert!(
        matches!(got, Err(FabricError::Local(_))),
        "no key: got {got:?}"
    );
    let r = TcpRegistry::new();
    // SAFETY: as above.
    let got = unsafe { r.register(1, u64::MAX - 8, 16) };
    assert!(
        matches!(got, Err(FabricError::Invalid(_))),
        "wrapping range: got {got:?}"
    );
    assert!(
        r.is_empty(),
        "failed registrations must leave nothing behind"
    );
}
