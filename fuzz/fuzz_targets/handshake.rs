//! The Hello handshake (`rmemfs_common::auth`) from both ends, on arbitrary input.
//!
//! Against a memnode with a token the fuzzer does not know: any sequence of Hello,
//! Prove and raw frames on one connection is answered with a Challenge or a refusal,
//! never a Welcome, and the connection can then allocate nothing. Against a client
//! (`control::hello_in_session`) fed arbitrary replies: the handshake fails with an
//! error, never a panic, and never succeeds, since no reply can carry a proof made
//! with the client's token.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmemfs_common::auth::{NONCE_LEN, PROOF_LEN};
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, FabricError, RdmaOp, Transport};
use rmemfs_common::protocol::{Request, Response, SessionSecret};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

const TOKEN: &[u8] = b"a token the fuzzer cannot guess, 40 bytes";

fn memnode_addr() -> &'static str {
    // The memnode serves for the life of the process, kept here so that what it
    // allocated stays reachable (the leak checker counts a forgotten one as leaked).
    static NODE: OnceLock<(String, Mutex<memnode::Memnode>)> = OnceLock::new();
    &NODE.get_or_init(|| {
        let node = memnode::Memnode::start(memnode::MemnodeConfig {
            listen: "127.0.0.1:0".into(),
            size: 4 << 20,
            token: Some(TOKEN.to_vec()),
            tenants: None,
            connections: rmemfs_common::fabric::ConnectionLimits::default(),
            huge_pages: false,
            transport: Transport::Tcp,
            poll: Duration::ZERO,
            lease: memnode::DEFAULT_LEASE,
            session_grace: Duration::ZERO,
            memory_file: None,
        })
        .expect("memnode starts");
        (node.local_addr().to_string(), Mutex::new(node))
    })
    .0
}

/// Takes `n` bytes (zero-padded when the input runs out).
fn take<const N: usize>(input: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = input.len().min(N);
    out[..n].copy_from_slice(&input[..n]);
    *input = &input[n..];
    out
}

/// The frames a hostile client sends, read off the input.
fn frames(mut input: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        let frame = match op % 4 {
            0 => Request::Hello {
                client_id: u64::from_le_bytes(take(&mut input)),
                nonce: take::<NONCE_LEN>(&mut input),
                resume: op & 0x10 != 0,
            }
            .encode(),
            1 => Request::Prove {
                proof: take::<PROOF_LEN>(&mut input),
                session: (op & 0x10 != 0).then(|| take::<PROOF_LEN>(&mut input)),
            }
            .encode(),
            2 => Request::Alloc { bytes: 4096 }.encode(),
            _ => {
                let n = (take::<1>(&mut input)[0] as usize).min(input.len());
                let (raw, rest) = input.split_at(n);
                input = rest;
                raw.to_vec()
            }
        };
        out.push(frame);
        if out.len() == 16 {
            break;
        }
    }
    out
}

/// Replies read off the input, one per call, for a client's handshake.
struct Replies(Mutex<Vec<Vec<u8>>>);

impl Endpoint for Replies {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        ops.iter()
            .map(|_| Err(FabricError::Local("no data path here".into())))
            .collect()
    }

    fn call(&self, _frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        let mut replies = self.0.lock().unwrap();
        if replies.is_empty() {
            return Err(FabricError::Local("no more replies".into()));
        }
        Ok(replies.remove(0))
    }

    fn peer(&self) -> &str {
        "fuzzed memnode"
    }

    fn is_connected(&self) -> bool {
        true
    }
}

fn client_side(input: &[u8]) {
    let half = input.len() / 2;
    let (first, second) = input.split_at(half);
    // A well-formed Challenge sometimes, so the fuzzer reaches the Welcome's check.
    let challenge = if first.first().is_some_and(|b| b & 1 == 0) {
        Response::Challenge {
            nonce: take::<NONCE_LEN>(&mut &first[..]),
        }
        .encode()
    } else {
        first.to_vec()
    };
    let ep = Replies(Mutex::new(vec![challenge, second.to_vec()]));
    for session in [SessionSecret::NONE, SessionSecret([9; 16])] {
        let got = control::hello_in_session(&ep, 1, TOKEN, session);
        assert!(got.is_err(), "a fuzzed memnode got through: {got:?}");
    }
}

fn memnode_side(input: &[u8]) {
    let Ok(ep) = TcpEndpoint::connect(memnode_addr(), Duration::from_secs(2)) else {
        return;
    };
    for frame in frames(input) {
        let Ok(reply) = ep.call(&frame) else { return };
        match Response::decode(&reply) {
            Ok(Response::Welcome { .. }) => panic!("a Welcome without the token"),
            Ok(Response::Allocated(_)) => panic!("an allocation without the token"),
            _ => {}
        }
    }
}

fuzz_target!(|input: &[u8]| {
    client_side(input);
    memnode_side(input);
});
