//! Who gets into a memnode (the Hello handshake of `rmemfs_common::auth`, issue 54):
//! knowing a client's id (volume listings show holders) does not let another token
//! holder act as that client, nor read its memory with its rkeys; the token and a
//! session's secret never cross the network; a memnode that does not know fsd's token
//! is not trusted; and a memnode refuses to start with no token beyond loopback, or
//! with an empty or short one.

use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::{self, FabricError, RdmaOp, RemoteAddr};
use rmemfs_common::protocol::{ErrorCode, SessionSecret};
use rmemfs_tests::binaries::binary;
use rmemfs_tests::fault_proxy::FaultProxy;
use rmemfs_tests::{FsdMount, MemnodeProc, Transport};
use std::process::Command;
use std::time::Duration;

const TOKEN: &str = "a-token-of-the-authentication-test";

fn connect(memnode: &MemnodeProc, id: u64) -> Box<dyn fabric::Endpoint> {
    fabric::connect(
        memnode.transport(),
        memnode.addr(),
        id,
        Duration::from_secs(5),
        Duration::ZERO,
    )
    .unwrap_or_else(|e| panic!("connecting to memnode {}: {e}", memnode.addr()))
}

fn is_refused(r: &Result<control::Welcome, ControlError>, code: ErrorCode) -> bool {
    matches!(r, Err(ControlError::Refused { code: c, .. }) if *c == code)
}

/// Item 1 of the issue: a second token holder reads the holder's client id off the
/// volume listing and says Hello with it. Runs on the transport of the environment
/// (over verbs in the Soft-RoCE VM).
#[test]
fn a_second_token_holder_cannot_act_as_the_volume_holder_nor_use_its_rkeys() {
    let memnode = MemnodeProc::start_with("64M", &["--token", TOKEN]);
    let holder_id = rand::random::<u64>() | 1;
    let holder = connect(&memnode, holder_id);
    control::hello(&*holder, holder_id, TOKEN.as_bytes()).expect("the holder's hello");
    let info = control::volume_open(&*holder, "home", true, false).expect("creates the volume");
    let secret = b"the holder's own bytes".repeat(16);
    let root = RemoteAddr {
        addr: info.root.addr,
        rkey: info.root.rkey,
    };
    let wrote = holder.execute(&mut [RdmaOp::Write {
        local: &secret,
        remote: root,
    }]);
    assert!(
        wrote.iter().all(Result::is_ok),
        "the holder writes: {wrote:?}"
    );

    // The intruder has the token, so it gets in as itself and sees the listing.
    let (intruder, _) = memnode.client();
    let listed = control::volume_list(&*intruder).expect("the intruder lists");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder, holder_id, "the listing names the holder");

    // As the holder: a new session under its id, or one it claims to resume with a
    // secret it guesses, is refused and the connection closed.
    for guess in [SessionSecret::NONE, SessionSecret([0x5a; 16])] {
        let ep = connect(&memnode, holder_id);
        let r = control::hello_in_session(&*ep, holder_id, TOKEN.as_bytes(), guess);
        assert!(
            is_refused(&r, ErrorCode::AuthFailed),
            "the impersonating Hello ({guess:?}) must be refused, got {r:?}"
        );
        assert!(
            control::stat(&*ep).is_err(),
            "the refused connection serves nothing"
        );
    }
    // The root's rkey, however learnt, is the holder's only. Each access on a fresh
    // connection: over verbs a remote access error puts the queue pair in its error
    // state, as on any RDMA NIC.
    let mut stolen = vec![0u8; secret.len()];
    let read = memnode.client().0.execute(&mut [RdmaOp::Read {
        local: &mut stolen,
        remote: root,
    }]);
    assert!(
        matches!(read[0], Err(FabricError::RemoteAccess { .. })),
        "a READ with the holder's rkey must fail with a remote access error, got {read:?}"
    );
    let write = memnode.client().0.execute(&mut [RdmaOp::Write {
        local: &[0xee; 64],
        remote: root,
    }]);
    assert!(
        matches!(write[0], Err(FabricError::RemoteAccess { .. })),
        "a WRITE with the holder's rkey must fail with a remote access error, got {write:?}"
    );
    // Opening the held volume without a takeover is Busy, as for any other client.
    let busy = control::volume_open(&*memnode.client().0, "home", false, false);
    assert!(
        matches!(&busy, Err(e) if e.is_busy()),
        "the held volume is busy for the intruder: {busy:?}"
    );
    // The holder is still served, and its bytes are its own.
    let mut back = vec![0u8; secret.len()];
    let read = holder.execute(&mut [RdmaOp::Read {
        local: &mut back,
        remote: root,
    }]);
    assert!(read.iter().all(Result::is_ok), "the holder reads: {read:?}");
    assert_eq!(back, secret, "the holder reads back what it wrote");
}

/// The token and the session's secret never cross the network: what a proxy on the
/// path saw of a whole mount, write, read and unmount holds neither, while it does
/// hold the file's bytes (so the capture is shown to see the traffic).
#[test]
fn neither_the_token_nor_a_session_secret_crosses_the_network() {
    let memnode = MemnodeProc::start_on(Transport::Tcp, "64M", &["--token", TOKEN]);
    let proxy = FaultProxy::start(memnode.addr());
    let addr = proxy.addr();
    let fsd = FsdMount::start_on(
        Transport::Tcp,
        &["--memnode", &addr, "--token", TOKEN, "--connections", "2"],
    );
    let marker = b"plain file bytes that do cross the wire (no encryption here) ".repeat(100);
    std::fs::write(fsd.join("f"), &marker).expect("write");
    assert_eq!(std::fs::read(fsd.join("f")).expect("read"), marker);
    // A session's secret, as a client derives it: on a connection of its own through
    // the proxy, so the capture holds its handshake too.
    let ep = fabric::connect(
        Transport::Tcp,
        &addr,
        7,
        Duration::from_secs(5),
        Duration::ZERO,
    )
    .expect("connects through the proxy");
    let welcome = control::hello(&*ep, 7, TOKEN.as_bytes()).expect("hello through the proxy");
    let second = fabric::connect(
        Transport::Tcp,
        &addr,
        7,
        Duration::from_secs(5),
        Duration::ZERO,
    )
    .expect("connects through the proxy");
    let joined = control::hello_in_session(&*second, 7, TOKEN.as_bytes(), welcome.session)
        .expect("a second connection joins the session");
    assert!(joined.resumed, "the second connection joined the session");
    fsd.unmount();

    let seen = proxy.recorded();
    let holds = |needle: &[u8]| seen.windows(needle.len()).any(|w| w == needle);
    assert!(
        holds(&marker[..64]),
        "the capture sees the traffic ({} bytes)",
        seen.len()
    );
    assert!(!holds(TOKEN.as_bytes()), "the token crossed the network");
    assert!(
        !holds(&welcome.session.0),
        "the session's secret crossed the network"
    );
}

/// fsd trusts no memnode that cannot prove it knows fsd's token: one with no token
/// lets anybody in, and fsd with a token refuses to mount on it.
#[test]
fn fsd_with_a_token_refuses_a_memnode_that_does_not_know_it() {
    let open = MemnodeProc::start("16M");
    let refused = FsdMount::refused(&[&open], &["--token", TOKEN]);
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("did not prove it knows the token"),
        "fsd says why: {}",
        refused.stderr
    );
}

/// Runs the memnode binary with `args` and `env`, expecting it to exit at once;
/// returns its status and stderr.
fn memnode_refuses(args: &[&str], env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(binary("memnode"));
    cmd.args(["--size", "4M"])
        .args(args)
        .env_remove("RMEMFS_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning memnode");
    let out = rmemfs_tests::within(Duration::from_secs(20), "memnode to exit", move || {
        child.wait_with_output().expect("memnode's output")
    });
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_memnode_refuses_open_doors_and_weak_tokens() {
    let (status, stderr) = memnode_refuses(&["--listen", "0.0.0.0:0"], &[]);
    assert!(!status.success(), "no token beyond loopback must not start");
    assert!(
        stderr.contains("--insecure") && stderr.contains("no token"),
        "it says why and what to do: {stderr}"
    );
    let (status, stderr) = memnode_refuses(&["--listen", "127.0.0.1:0", "--token", "t0k3n"], &[]);
    assert!(!status.success(), "a 5-byte token must not start");
    assert!(stderr.contains("too easily guessed"), "{stderr}");
    assert!(
        !stderr.contains("t0k3n"),
        "the token is never echoed: {stderr}"
    );
    let (status, stderr) = memnode_refuses(&["--listen", "127.0.0.1:0"], &[("RMEMFS_TOKEN", "")]);
    assert!(!status.success(), "an empty RMEMFS_TOKEN must not start");
    assert!(stderr.contains("empty"), "{stderr}");

    // With --insecure it serves, and says so.
    let mut child = Command::new(binary("memnode"))
        .args(["--size", "4M", "--listen", "0.0.0.0:0", "--insecure"])
        .env_remove("RMEMFS_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning memnode --insecure");
    let stdout = child.stdout.take().expect("stdout");
    let listening = rmemfs_tests::within(Duration::from_secs(20), "memnode to listen", move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("memnode listening on "))
    });
    assert!(listening.is_some(), "memnode --insecure serves");
    let _ = child.kill();
    let out = child.wait_with_output().expect("memnode's stderr");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--insecure") && said.contains("NO TOKEN"),
        "an insecure memnode says so: {said}"
    );
}
