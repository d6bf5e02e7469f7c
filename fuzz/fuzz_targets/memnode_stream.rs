//! Arbitrary bytes on a connection to a memnode's tcp backend (its data path's wire
//! format and its control frames alike): the memnode answers with errors or closes
//! that connection, never panics, and keeps serving a well-behaved client whose data
//! stays as it wrote it. The memnode runs in this process, so a panic in any of its
//! threads aborts the fuzzer as a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, RdmaOp, RemoteAddr, Transport};
use rmemfs_common::protocol::Allocation;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

const CHUNK: u64 = 64 << 10;

struct Rig {
    addr: String,
    client: TcpEndpoint,
    chunk: Allocation,
    data: Vec<u8>,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let node = memnode::Memnode::start(memnode::MemnodeConfig {
            listen: "127.0.0.1:0".into(),
            size: 16 << 20,
            token: None,
            tenants: None,
            huge_pages: false,
            transport: Transport::Tcp,
            poll: Duration::ZERO,
            lease: memnode::DEFAULT_LEASE,
            // Fuzzed connections' sessions end with them, so their memory comes back.
            session_grace: Duration::ZERO,
            memory_file: None,
            connections: rmemfs_common::fabric::ConnectionLimits::default(),
        })
        .expect("memnode starts");
        let addr = node.local_addr().to_string();
        let client = TcpEndpoint::connect(&addr, Duration::from_secs(2)).expect("connects");
        control::hello(&client, 7, b"").expect("hello");
        let chunk = control::alloc(&client, CHUNK).expect("alloc");
        let data: Vec<u8> = (0..CHUNK).map(|i| (i * 31 % 253) as u8).collect();
        let remote = RemoteAddr {
            addr: chunk.addr,
            rkey: chunk.rkey,
        };
        let wrote = client.execute(&mut [RdmaOp::Write {
            local: &data,
            remote,
        }]);
        assert!(wrote.iter().all(|r| r.is_ok()), "the client's write");
        // The memnode serves for the life of the process.
        std::mem::forget(node);
        Rig {
            addr,
            client,
            chunk,
            data,
        }
    })
}

fuzz_target!(|bytes: &[u8]| {
    let rig = rig();
    if let Ok(mut hostile) = TcpStream::connect(&rig.addr) {
        let _ = hostile.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = hostile.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = hostile.write_all(bytes);
        let _ = hostile.shutdown(Shutdown::Write);
        // Whatever the answers are, until the memnode closes the connection.
        let mut sink = [0u8; 4096];
        while matches!(hostile.read(&mut sink), Ok(n) if n > 0) {}
    }
    let mut back = vec![0u8; CHUNK as usize];
    let remote = RemoteAddr {
        addr: rig.chunk.addr,
        rkey: rig.chunk.rkey,
    };
    let read = rig.client.execute(&mut [RdmaOp::Read {
        local: &mut back,
        remote,
    }]);
    assert!(
        read.iter().all(|r| r.is_ok()),
        "the well-behaved client is still served: {read:?}"
    );
    assert!(back == rig.data, "the well-behaved client's data is intact");
});
