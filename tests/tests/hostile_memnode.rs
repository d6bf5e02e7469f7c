//! A memnode that lies gets a clean mount error from fsd (issue 54): fsd exits with a
//! non-zero status (not a signal), its stderr names the memnode and what it said that
//! cannot be, and nothing panicked.
//!
//! The liar is a memnode in this process (`memnode::liar`) whose control service is
//! wrapped: while a lie is set, each reply frame is decoded and rewritten by it
//! (never the Welcome: the handshake is not what this test is about). The lies: a VolumeChunks list with a chunk that wraps past the end of the address
//! space, one with a chunk repeated, one with a chunk larger than the memnode; a
//! VolumeOpened root of absurd length; an empty Allocated chunk. Last, with the
//! memnode honest again, a superblock forged through a normal client (valid
//! checksum, a newer generation, a checkpoint area of a terabyte) is refused too.
//!
//! tcp only, whatever RMEMFS_TRANSPORT says: the liar is served by the tcp backend
//! (what it says does not depend on the transport).

use fsd::volume::format::{Superblock, SUPERBLOCK_SLOT};
use memnode::liar::{Liar, Lie};
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, RdmaOp, RemoteAddr, Transport};
use rmemfs_common::protocol::{Allocation, Response};
use rmemfs_tests::{FsdMount, Refusal};
use std::time::Duration;

struct Rig {
    node: memnode::Memnode,
    liar: Liar,
}

impl Rig {
    fn start() -> Rig {
        let (node, liar) = Liar::start(memnode::MemnodeConfig {
            listen: "127.0.0.1:0".into(),
            size: 256 << 20,
            token: None,
            tenants: None,
            connections: rmemfs_common::fabric::ConnectionLimits::default(),
            huge_pages: false,
            transport: Transport::Tcp,
            poll: Duration::ZERO,
            // A refused fsd's hold on the volume ends with its connections, so the
            // next case opens it at once.
            lease: Duration::from_secs(1),
            session_grace: Duration::ZERO,
            memory_file: None,
        })
        .expect("the memnode starts");
        Rig { node, liar }
    }

    fn addr(&self) -> String {
        self.node.local_addr().to_string()
    }

    fn args(&self, volume: &str) -> Vec<String> {
        ["--memnode", &self.addr(), "--volume", volume]
            .map(String::from)
            .to_vec()
    }

    /// fsd mounting `volume` while the memnode tells `lie`: it must refuse.
    fn refused(&self, volume: &str, lie: Lie) -> Refusal {
        self.liar.tell(Some(lie));
        let args = self.args(volume);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let refusal = FsdMount::refused_on(Transport::Tcp, &args);
        self.liar.tell(None);
        refusal
    }
}

/// A clean refusal: an exit status, not a signal; no panic; stderr names the memnode
/// and says each of `says`.
fn assert_clean(case: &str, r: &Refusal, memnode: &str, says: &[&str]) {
    let said = r.stderr.lines().rfind(|l| l.starts_with("fsd: "));
    println!("{case}: {}", said.unwrap_or("(no error line)"));
    let code = r.status.code();
    assert!(
        code.is_some_and(|c| c != 0),
        "{case}: fsd should exit with an error status, not {}; stderr:\n{}",
        r.status,
        r.stderr
    );
    assert!(
        !r.stderr.contains("panicked"),
        "{case}: fsd panicked; stderr:\n{}",
        r.stderr
    );
    for want in std::iter::once(&memnode).chain(says) {
        assert!(
            r.stderr.contains(want),
            "{case}: fsd's stderr should say {want:?}; it is:\n{}",
            r.stderr
        );
    }
}

/// The chunk list with `extra` added.
fn listing_with(r: Response, extra: impl FnOnce(&[Allocation]) -> Allocation) -> Response {
    match r {
        Response::ChunkList { mut chunks, more } => {
            let c = extra(&chunks);
            chunks.push(c);
            Response::ChunkList { chunks, more }
        }
        r => r,
    }
}

#[test]
fn a_lying_memnode_gets_a_clean_mount_error_saying_what_is_wrong() {
    let rig = Rig::start();
    let memnode = rig.addr();
    {
        let args = rig.args("v");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let fsd = FsdMount::start_on(Transport::Tcp, &args);
        std::fs::write(fsd.join("f"), b"kept").expect("writing a file");
        fsd.unmount();
    }
    let r = rig.refused("v", |r| {
        listing_with(r, |_| Allocation {
            addr: u64::MAX - 4095,
            len: 8192,
            rkey: 1,
        })
    });
    assert_clean(
        "a chunk that wraps",
        &r,
        &memnode,
        &["VolumeChunks", "0xfffffffffffff000", "wraps"],
    );
    let r = rig.refused("v", |r| listing_with(r, |chunks| chunks[0]));
    // (The control client already refuses a page that goes back: `chunk_pages`.)
    assert_clean(
        "a chunk repeated",
        &r,
        &memnode,
        &["VolumeChunks", "out of order"],
    );
    let r = rig.refused("v", |r| {
        listing_with(r, |chunks| Allocation {
            addr: chunks[chunks.len() - 1].addr + (1 << 30),
            len: 1 << 40,
            rkey: 1,
        })
    });
    assert_clean(
        "a chunk larger than the memnode",
        &r,
        &memnode,
        &["VolumeChunks", "1099511627776", "capacity"],
    );
    let r = rig.refused("v", |r| match r {
        Response::VolumeOpened(mut info) => {
            info.root.len = u64::MAX;
            Response::VolumeOpened(info)
        }
        r => r,
    });
    assert_clean(
        "a root of absurd length",
        &r,
        &memnode,
        &["VolumeOpened root", "18446744073709551615"],
    );
    // A new volume's first checkpoint allocates its chunks.
    let r = rig.refused("new", |r| match r {
        Response::Allocated(mut a) => {
            a.len = 0;
            Response::Allocated(a)
        }
        r => r,
    });
    assert_clean(
        "an empty allocation",
        &r,
        &memnode,
        &["Allocated", "length 0"],
    );
    // Told the truth, fsd mounts the volume it made and reads it back.
    {
        let args = rig.args("v");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let fsd = FsdMount::start_on(Transport::Tcp, &args);
        assert_eq!(std::fs::read(fsd.join("f")).expect("reading"), b"kept");
        fsd.unmount();
    }
    let forged = forge_superblock(&memnode, "v");
    let r = rig.refused("v", |r| r);
    assert_clean(
        "a forged superblock",
        &r,
        &memnode,
        &[
            &format!("generation {forged}"),
            "checkpoint at",
            "1099511627776",
            "in no chunk",
        ],
    );
}

/// Writes a superblock of `volume` one generation newer than its newest, valid
/// checksum and all, whose checkpoint area is a terabyte long, through a client of
/// the memnode at `addr` (as any holder of the token could). Returns its generation.
fn forge_superblock(addr: &str, volume: &str) -> u64 {
    let ep = TcpEndpoint::connect(addr, Duration::from_secs(5)).expect("connecting");
    control::hello(&ep, control::random_id(), b"").expect("hello");
    let info = control::volume_open(&ep, volume, false, false).expect("opening the volume");
    let root = info.root;
    let mut slots = vec![0u8; 2 * SUPERBLOCK_SLOT];
    let at = |slot: u64| RemoteAddr {
        addr: root.addr + slot * SUPERBLOCK_SLOT as u64,
        rkey: root.rkey,
    };
    let read = ep.execute(&mut [RdmaOp::Read {
        local: &mut slots,
        remote: at(0),
    }]);
    assert!(read.iter().all(|r| r.is_ok()), "reading the root: {read:?}");
    let newest = slots
        .chunks(SUPERBLOCK_SLOT)
        .filter_map(|s| Superblock::decode(s).ok().flatten())
        .max_by_key(|s| s.generation)
        .expect("the volume has a superblock");
    let mut sb = newest.clone();
    sb.generation += 1;
    let (area, crc) = sb.checkpoint.expect("a checkpoint area");
    sb.checkpoint = Some((
        fsd::volume::format::Area {
            addr: area.addr,
            len: 1 << 40,
        },
        crc,
    ));
    let mut slot = sb.encode();
    slot.resize(SUPERBLOCK_SLOT, 0);
    let wrote = ep.execute(&mut [RdmaOp::Write {
        local: &slot,
        remote: at(sb.generation % 2),
    }]);
    assert!(
        wrote.iter().all(|r| r.is_ok()),
        "writing the root: {wrote:?}"
    );
    control::volume_close(&ep).expect("closing the volume");
    control::session_end(&ep).expect("ending the session");
    sb.generation
}
