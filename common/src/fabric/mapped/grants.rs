//! What a mapped client may touch, and how the memnode knows it no longer does.
//!
//! **The grant table** is a memory file the memnode writes and its mapped clients
//! read: a copy of the tcp registry's registrations (rkey, owner, range) that lie in
//! the shared region, so a client checks rkey, owner and bounds itself, as a NIC
//! would, before it copies. It is a cache, direct-mapped by rkey: a registration
//! whose slot is taken is simply not in it, and a client that finds no entry sends
//! the operation over tcp, where the memnode's registry gives the authoritative
//! answer (the bytes, or a remote access error). So the table never has to be
//! complete, only never wrong. Each slot is a seqlock: the writer makes its sequence
//! odd, changes the fields, and makes it even; a reader that sees it change retries.
//!
//! **The read section** is a page per mapped connection, shared the same way: an
//! epoch and two counters, sleepable-RCU style. A client's copy enters (counts
//! itself in the counter of the epoch's parity), looks its grant up, copies and
//! leaves. To revoke, the memnode removes the grant, advances the epoch, and waits
//! for the old parity's counter to drain: a copy that could have seen the grant has
//! finished, and every later one finds it gone. This is what lets deregistration
//! keep its promise ("no access in flight when it returns") for mapped clients, so
//! the pool may zero and reuse memory at once, as over tcp and verbs.
//!
//! Both rest on the client following them. A process given the region's descriptor
//! could ignore both; the trust boundary this implies is in `mod.rs`.

use super::shared::SharedWords;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// Slots in the grant table (a power of two).
pub const TABLE_SLOTS: usize = 1 << 16;
const SLOT_BYTES: usize = 32;
/// The table file's size.
pub const TABLE_BYTES: usize = TABLE_SLOTS * SLOT_BYTES;
/// The read section file's size: one page, the counters on cache lines of their own.
pub const SECTION_BYTES: usize = 4096;

// Slot fields: {seq u32, rkey u32, owner u64, addr u64, end u64}.
const SEQ: usize = 0;
const RKEY: usize = 4;
const OWNER: usize = 8;
const ADDR: usize = 16;
const END: usize = 24;

// Read section fields, each on its own cache line.
const EPOCH: usize = 0;
/// Non-zero once the memnode has closed the connection: copies refuse to start.
const CLOSED: usize = 4;
const COUNT: [usize; 2] = [64, 128];

/// One grant: `[addr, end)` of the memnode's address space, reachable by `owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub owner: u64,
    pub addr: u64,
    pub end: u64,
}

fn slot_of(rkey: u32) -> usize {
    // Fibonacci hashing: rkeys are random, but tests choose sequential ones.
    (rkey.wrapping_mul(0x9E37_79B1) >> (32 - TABLE_SLOTS.trailing_zeros())) as usize * SLOT_BYTES
}

/// The grant table, writer's or reader's view.
#[derive(Debug)]
pub struct GrantTable {
    words: SharedWords,
}

impl GrantTable {
    /// A fresh, empty table (the memnode's): its file, to pass to clients, and the
    /// writable view.
    pub fn create() -> io::Result<(OwnedFd, GrantTable)> {
        let (fd, words) = SharedWords::create("rmemfs-grants", TABLE_BYTES)?;
        Ok((fd, GrantTable { words }))
    }

    /// A client's read-only view of the table in `fd`.
    pub fn open(fd: BorrowedFd<'_>) -> io::Result<GrantTable> {
        Ok(GrantTable {
            words: SharedWords::map(fd, TABLE_BYTES, false)?,
        })
    }

    /// Files `grant` under `rkey` (non-zero); false when its slot holds another
    /// grant (it is then not cached, and its accesses go over tcp). Writers must be
    /// serialized by the caller.
    pub fn insert(&self, rkey: u32, grant: Grant) -> bool {
        let at = slot_of(rkey);
        if rkey == 0 || self.words.u32_at(at + RKEY).load(Ordering::Relaxed) != 0 {
            return false;
        }
        self.update(at, rkey, grant);
        true
    }

    /// Takes `rkey`'s grant out, returning it if it was there. Writers must be
    /// serialized by the caller.
    pub fn remove(&self, rkey: u32) -> Option<Grant> {
        let at = slot_of(rkey);
        let w = &self.words;
        if rkey == 0 || w.u32_at(at + RKEY).load(Ordering::Relaxed) != rkey {
            return None;
        }
        let grant = Grant {
            owner: w.u64_at(at + OWNER).load(Ordering::Relaxed),
            addr: w.u64_at(at + ADDR).load(Ordering::Relaxed),
            end: w.u64_at(at + END).load(Ordering::Relaxed),
        };
        self.update(
            at,
            0,
            Grant {
                owner: 0,
                addr: 0,
                end: 0,
            },
        );
        Some(grant)
    }

    fn update(&self, at: usize, rkey: u32, g: Grant) {
        let w = &self.words;
        let seq = w.u32_at(at + SEQ);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // Readers that see any new field see the odd sequence first.
        fence(Ordering::Release);
        w.u32_at(at + RKEY).store(rkey, Ordering::SeqCst);
        w.u64_at(at + OWNER).store(g.owner, Ordering::Relaxed);
        w.u64_at(at + ADDR).store(g.addr, Ordering::Relaxed);
        w.u64_at(at + END).store(g.end, Ordering::Relaxed);
        seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// `rkey`'s grant, if the table holds it. A slot being written as it is read is
    /// retried a few times, then taken as absent (the caller goes over tcp).
    pub fn lookup(&self, rkey: u32) -> Option<Grant> {
        if rkey == 0 {
            return None;
        }
        let at = slot_of(rkey);
        let w = &self.words;
        let seq = w.u32_at(at + SEQ);
        for _ in 0..8 {
            let s1 = seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            // SeqCst: ordered after the caller's entry into its read section, so a
            // grant removed before the epoch moved is not seen by a reader counted in
            // the new epoch.
            let key = w.u32_at(at + RKEY).load(Ordering::SeqCst);
            let grant = Grant {
                owner: w.u64_at(at + OWNER).load(Ordering::Relaxed),
                addr: w.u64_at(at + ADDR).load(Ordering::Relaxed),
                end: w.u64_at(at + END).load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == s1 {
                return (key == rkey).then_some(grant);
            }
        }
        None
    }
}

/// A connection's read section (see the module docs).
#[derive(Debug)]
pub struct ReadSection {
    words: SharedWords,
}

/// Proof of being inside a read section, to leave it with.
#[must_use]
#[derive(Debug)]
pub struct Entered(usize);

/// How a wait for a read section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every copy that could have seen the removed grant has finished.
    Yes,
    /// The client is gone (`gone` said so): nothing of it runs any more.
    ClientGone,
    /// The deadline passed with a copy still counted: the client is stuck or does
    /// not follow the protocol.
    TimedOut,
}

impl ReadSection {
    /// A fresh section (the memnode's, one per mapped connection) and its file.
    pub fn create() -> io::Result<(OwnedFd, ReadSection)> {
        let (fd, words) = SharedWords::create("rmemfs-section", SECTION_BYTES)?;
        Ok((fd, ReadSection { words }))
    }

    /// The client's view of the section in `fd`.
    pub fn open(fd: BorrowedFd<'_>) -> io::Result<ReadSection> {
        Ok(ReadSection {
            words: SharedWords::map(fd, SECTION_BYTES, true)?,
        })
    }

    /// Enters: from now until [`ReadSection::leave`], a revocation waits for us.
    pub fn enter(&self) -> Entered {
        let epoch = self.words.u32_at(EPOCH);
        loop {
            let e = epoch.load(Ordering::SeqCst);
            let count = self.words.u32_at(COUNT[(e & 1) as usize]);
            count.fetch_add(1, Ordering::SeqCst);
            if epoch.load(Ordering::SeqCst) == e {
                return Entered((e & 1) as usize);
            }
            // The epoch moved between: a waiter may already have found this counter
            // drained. Count ourselves in the new one instead.
            count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// True once the memnode closed this connection: a copy that finds it so inside
    /// its section must leave without copying.
    pub fn is_closed(&self) -> bool {
        self.words.u32_at(CLOSED).load(Ordering::SeqCst) != 0
    }

    /// The memnode's side: no copy starts after this; [`ReadSection::synchronize`]
    /// then waits out those that had.
    pub fn close(&self) {
        self.words.u32_at(CLOSED).store(1, Ordering::SeqCst);
    }

    pub fn leave(&self, entered: Entered) {
        self.words
            .u32_at(COUNT[entered.0])
            .fetch_sub(1, Ordering::Release);
    }

    /// The memnode's side: advances the epoch and waits, until `deadline`, for every
    /// copy counted before to leave. `gone` is asked now and then whether the client
    /// has gone away (its counts then never drain, and need not).
    pub fn synchronize(&self, deadline: Instant, mut gone: impl FnMut() -> bool) -> Drained {
        let old = self.words.u32_at(EPOCH).fetch_add(1, Ordering::SeqCst);
        let count = self.words.u32_at(COUNT[(old & 1) as usize]);
        let mut spins = 0u32;
        while count.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            if spins.is_multiple_of(256) && gone() {
                return Drained::ClientGone;
            }
            if Instant::now() >= deadline {
                return Drained::TimedOut;
            }
            if spins < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        Drained::Yes
    }
}

#[cfg(test)]
#[path = "grants_tests.rs"]
mod tests;
