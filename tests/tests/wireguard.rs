//! Encryption where the network is not trusted, as docs/security.md recommends it:
//! WireGuard between the hosts, memnode listening on its tunnel address, fsd mounting
//! over it. Two "hosts" on one machine (the test's network namespace and another,
//! joined by a veth pair: rmemfs_tests::wireguard); the frames on the veth are
//! captured while a file of a recognisable text goes to the memnode and comes back.
//!
//! Over the plain veth addresses the text shows in the capture (so the capture sees
//! what crosses); over the tunnel neither the text nor the token does, though the
//! file's bytes crossed the same veth (the capture and the tunnel's own counters hold
//! at least as much). Only the binaries and the token file are used: nothing here
//! depends on what rmemfs's messages look like.
//!
//! It needs a kernel with WireGuard, `wg` and root: the Soft-RoCE guest has them
//! (scripts/softroce/e2e.sh runs this test there, with RMEMFS_TEST_WIREGUARD=required,
//! so that a guest that lost them fails). Elsewhere (the CI host's kernel has no
//! wireguard module) it says why on stderr, around libtest's capture, and passes
//! without running.

use rmemfs_tests::capture::{Capture, Captured};
use rmemfs_tests::config::{BLOCK, SMALL_CACHE};
use rmemfs_tests::transport::Transport;
use rmemfs_tests::wireguard::{self, TwoHosts, LINK_PEER, PEER_NS, TUNNEL_PEER, VETH_HERE};
use rmemfs_tests::{data, fresh_dir, FsdMount, MemnodeProc, UncachedReader, MIB};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// The file: twice fsd's 2 MiB cache, so at least half of it is written to the
/// memnode and read back from it.
const FILE: u64 = 4 * MIB;
/// Every line of the file starts with this: what "in clear" looks for.
const MARKER: &[u8] = b"rmemfs-wireguard-plaintext-marker ";

/// Lines of `MARKER` and a line number, `len` bytes in all.
fn contents(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 64);
    let mut line = 0u64;
    while v.len() < len {
        v.extend_from_slice(MARKER);
        v.extend_from_slice(format!("{line:012}\n").as_bytes());
        line += 1;
    }
    v.truncate(len);
    v
}

/// What one run over `memnode_host` moved and saw.
struct Run {
    captured: Captured,
    took: Duration,
}

/// A memnode in the peer's namespace listening on `memnode_host`, fsd here mounting
/// it with a 2 MiB cache, the file written, fsynced and read back around the page
/// cache, fsd unmounted and the memnode stopped, all while the veth is captured.
fn run(memnode_host: &str, token_file: &str, what: &str) -> Run {
    let memnode = MemnodeProc::start_in_netns(
        PEER_NS,
        Transport::Tcp,
        &format!("{memnode_host}:0"),
        "64M",
        &["--token-file", token_file],
    );
    let capture = Capture::start(VETH_HERE)
        .unwrap_or_else(|e| panic!("capturing the frames of {VETH_HERE}: {e}"));
    let started = Instant::now();
    let mut args = vec!["--memnode", memnode.addr(), "--token-file", token_file];
    args.extend(SMALL_CACHE);
    let fsd = FsdMount::start_on(Transport::Tcp, &args);
    let path = fsd.join("marked");
    let expected = contents(FILE as usize);
    data::write_small(&path, &expected);
    let mut reader = UncachedReader::open(&path)
        .unwrap_or_else(|e| panic!("{what}: opening {}: {e}", path.display()));
    let mut got = Vec::with_capacity(expected.len());
    while (got.len() as u64) < FILE {
        let piece = reader
            .read_at(got.len() as u64, BLOCK as usize)
            .unwrap_or_else(|e| panic!("{what}: reading {} at {}: {e}", path.display(), got.len()));
        if piece.is_empty() {
            break;
        }
        got.extend_from_slice(&piece);
    }
    drop(reader);
    data::assert_bytes_eq(&expected, &got, 0, &format!("{what}: the file read back"));
    fsd.unmount();
    drop(memnode);
    let took = started.elapsed();
    let captured = capture
        .stop()
        .unwrap_or_else(|e| panic!("{what}: the capture on {VETH_HERE}: {e}"));
    println!(
        "{what}: memnode on {memnode_host}, {} MiB written and read back in {:.1} s; \
         {} frames, {} bytes on {VETH_HERE} ({} dropped by the capture)",
        FILE / MIB,
        took.as_secs_f64(),
        captured.frames,
        captured.bytes.len(),
        captured.dropped
    );
    Run { captured, took }
}

/// Says on the process's own stderr (libtest does not capture that), so CI's log shows
/// that the test did not run and why.
fn skip(why: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "wireguard: SKIPPED, not run on this machine: {why}. It runs in the Soft-RoCE \
         guest (scripts/softroce/e2e.sh --tests wireguard)."
    );
}

#[test]
fn a_wireguard_tunnel_shows_neither_the_data_nor_the_token_on_the_wire() {
    if let Some(why) = wireguard::missing() {
        if std::env::var("RMEMFS_TEST_WIREGUARD").as_deref() == Ok("required") {
            panic!("RMEMFS_TEST_WIREGUARD=required, but this machine cannot run the test: {why}");
        }
        skip(&why);
        return;
    }
    let hosts = TwoHosts::set_up();
    let dir = fresh_dir("rmemfs-wireguard");
    // 32 random bytes in hex: a token no check of length refuses.
    let token: String = rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("writing the token file");
    let token_file = token_file.to_string_lossy().into_owned();

    // The control: over the veth's own addresses the text crosses in clear, which
    // shows that the capture sees the file's bytes.
    let plain = run(LINK_PEER, &token_file, "plain veth");
    assert!(
        plain.captured.contains(MARKER),
        "over the plain veth the file's text must show in the capture ({} frames, {} \
         bytes): the capture does not see what crosses, so the tunnel run would prove \
         nothing",
        plain.captured.frames,
        plain.captured.bytes.len()
    );
    // The handshake proves the token without sending it (`rmemfs_common::auth`):
    // even in clear it never crosses.
    assert!(
        !plain.captured.contains(token.as_bytes()),
        "the token crossed the plain veth in clear"
    );

    let (rx0, tx0) = hosts.tunnel_transfer();
    let tunnel = run(TUNNEL_PEER, &token_file, "WireGuard tunnel");
    let (rx1, tx1) = hosts.tunnel_transfer();
    let through_tunnel = (rx1 - rx0) + (tx1 - tx0);
    // At least the half of the file that cannot stay in fsd's cache went to the
    // memnode and came back: through the tunnel, and so across the veth.
    let least = FILE / 2;
    assert!(
        through_tunnel >= least,
        "the tunnel carried {through_tunnel} bytes, less than the {least} of the file \
         that had to cross it"
    );
    assert!(
        tunnel.captured.bytes.len() as u64 >= least,
        "the capture on {VETH_HERE} holds {} bytes, less than the {least} of the file \
         that had to cross it: it missed the tunnel's traffic",
        tunnel.captured.bytes.len()
    );
    assert!(
        !tunnel.captured.contains(MARKER),
        "the file's text shows on the wire under WireGuard"
    );
    assert!(
        !tunnel.captured.contains(token.as_bytes()),
        "the token shows on the wire under WireGuard"
    );
    println!(
        "WireGuard tunnel: {through_tunnel} bytes through the tunnel, none of the text or \
         the token in clear; {:.1} s against {:.1} s in clear (emulation figures in the \
         Soft-RoCE guest, not a measure of WireGuard's cost)",
        tunnel.took.as_secs_f64(),
        plain.took.as_secs_f64()
    );
    drop(hosts);
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
