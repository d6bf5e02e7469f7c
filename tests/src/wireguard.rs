//! Two "hosts" on one machine joined by a wire, with a WireGuard tunnel over it: for
//! the test of docs/security.md's recipe (tests/tests/wireguard.rs), which runs a
//! memnode on one and fsd on the other and looks at what crosses the wire.
//!
//! The test's own network namespace is one host; a namespace of its own ([`PEER_NS`],
//! made with `ip netns add`; [`TwoHosts::set_up`]) is the other. A veth pair joins them ([`LINK_HERE`] and
//! [`LINK_PEER`], the plain network), and a WireGuard interface on each side
//! ([`TUNNEL_HERE`], [`TUNNEL_PEER`]) sends its packets as UDP over that veth, with
//! keys made by `wg genkey` and `wg pubkey`, as an administrator would. Traffic to a
//! `LINK_` address crosses the veth in clear; traffic to a `TUNNEL_` address crosses it
//! encrypted. Capture on [`VETH_HERE`] to see either (crate::capture).
//!
//! It needs root, iproute2's `ip`, `wg` (Debian's wireguard-tools) and a kernel that
//! makes WireGuard interfaces; [`missing`] says what of that this machine lacks (the
//! Soft-RoCE guest has it all: scripts/softroce/build-guest.sh). The fixed names and
//! addresses (10.213.0.0/24 for the wire, 10.214.0.0/24 for the tunnel) mean one such
//! pair at a time on a machine; leftovers of a killed run are removed first.

use crate::command::run_within;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The peer host's network namespace.
pub const PEER_NS: &str = "rmemfs-wg-peer";
/// The veth end in the test's namespace: where a capture sees the wire.
pub const VETH_HERE: &str = "rmwg-veth0";
const VETH_PEER: &str = "rmwg-veth1";
const WG_HERE: &str = "rmwg-wg0";
const WG_PEER: &str = "rmwg-wg1";
/// The plain network's addresses (on the veth ends).
pub const LINK_HERE: &str = "10.213.0.1";
pub const LINK_PEER: &str = "10.213.0.2";
/// The tunnel's addresses (on the WireGuard interfaces).
pub const TUNNEL_HERE: &str = "10.214.0.1";
pub const TUNNEL_PEER: &str = "10.214.0.2";
const WG_PORT_HERE: u16 = 51820;
const WG_PORT_PEER: u16 = 51821;
/// Each `ip`/`wg` command's time limit.
const LIMIT: Duration = Duration::from_secs(30);

/// Why this machine cannot run the WireGuard test, or None when it can: not root, no
/// `ip` or `wg`, or a kernel that cannot make a WireGuard interface (no wireguard
/// module, as on the project's CI host; the Soft-RoCE guest's Debian kernel has it).
pub fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces and interfaces need it)".to_string());
    }
    for (program, package) in [("ip", "iproute2"), ("wg", "wireguard-tools")] {
        if crate::binaries::find_on_path(program).is_none() {
            return Some(format!(
                "`{program}` is not on PATH (Debian package {package})"
            ));
        }
    }
    let probe = "rmwg-probe";
    let out = run_within(
        Command::new("ip").args(["link", "add", probe, "type", "wireguard"]),
        LIMIT,
        "making a WireGuard interface",
    );
    if !out.status.success() {
        return Some(format!(
            "this kernel cannot make a WireGuard interface (`ip link add {probe} type \
             wireguard`: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    ip_quiet(&format!("link del {probe}"));
    None
}

/// The two hosts, the wire and the tunnel; dropping it takes them all down.
pub struct TwoHosts {
    dir: PathBuf,
}

impl TwoHosts {
    /// Sets everything up (panics with the failing command's output). The tunnel's
    /// handshake happens with its first packet.
    pub fn set_up() -> TwoHosts {
        teardown();
        let hosts = TwoHosts {
            dir: crate::fresh_dir("rmemfs-wg-keys"),
        };
        ip(&format!("netns add {PEER_NS}"));
        ip(&format!(
            "link add {VETH_HERE} type veth peer name {VETH_PEER}"
        ));
        ip(&format!("link set {VETH_PEER} netns {PEER_NS}"));
        ip(&format!("addr add {LINK_HERE}/24 dev {VETH_HERE}"));
        ip(&format!("link set {VETH_HERE} up"));
        ip(&format!("-n {PEER_NS} link set lo up"));
        ip(&format!(
            "-n {PEER_NS} addr add {LINK_PEER}/24 dev {VETH_PEER}"
        ));
        ip(&format!("-n {PEER_NS} link set {VETH_PEER} up"));

        let (key_here, pub_here) = hosts.keypair("here");
        let (key_peer, pub_peer) = hosts.keypair("peer");
        // The peer's is made inside its namespace, so its UDP socket is there too.
        ip(&format!("link add {WG_HERE} type wireguard"));
        ip(&format!("-n {PEER_NS} link add {WG_PEER} type wireguard"));
        wg(
            None,
            &format!(
                "set {WG_HERE} listen-port {WG_PORT_HERE} private-key {key_here} \
                 peer {pub_peer} allowed-ips {TUNNEL_PEER}/32 endpoint {LINK_PEER}:{WG_PORT_PEER}"
            ),
        );
        wg(
            Some(PEER_NS),
            &format!(
                "set {WG_PEER} listen-port {WG_PORT_PEER} private-key {key_peer} \
                 peer {pub_here} allowed-ips {TUNNEL_HERE}/32 endpoint {LINK_HERE}:{WG_PORT_HERE}"
            ),
        );
        ip(&format!("addr add {TUNNEL_HERE}/24 dev {WG_HERE}"));
        ip(&format!("link set {WG_HERE} up"));
        ip(&format!(
            "-n {PEER_NS} addr add {TUNNEL_PEER}/24 dev {WG_PEER}"
        ));
        ip(&format!("-n {PEER_NS} link set {WG_PEER} up"));
        hosts
    }

    /// `wg genkey` into a file of mode 600 (what `wg set ... private-key` reads) and
    /// `wg pubkey` of it: the private key's path and the public key.
    fn keypair(&self, name: &str) -> (String, String) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let private = wg(None, "genkey");
        let path = self.dir.join(format!("{name}.key"));
        assert!(
            !path.to_string_lossy().contains(char::is_whitespace),
            "{}: the commands here split on whitespace; set TMPDIR to a path without",
            path.display()
        );
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        f.write_all(private.as_bytes())
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let mut child = Command::new("wg")
            .arg("pubkey")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running wg pubkey: {e}"));
        child
            .stdin
            .take()
            .expect("wg pubkey's stdin")
            .write_all(private.as_bytes())
            .unwrap_or_else(|e| panic!("writing to wg pubkey: {e}"));
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for wg pubkey: {e}"));
        assert!(
            out.status.success(),
            "wg pubkey failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let public = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (path.to_string_lossy().into_owned(), public)
    }

    /// `wg show <tunnel here> transfer`: bytes received and sent through the tunnel
    /// from this side, so far.
    pub fn tunnel_transfer(&self) -> (u64, u64) {
        let out = wg(None, &format!("show {WG_HERE} transfer"));
        // One line per peer: `<public key>\t<received>\t<sent>`.
        let mut fields = out.split_whitespace().skip(1);
        let mut next = || fields.next().and_then(|f| f.parse::<u64>().ok());
        match (next(), next()) {
            (Some(rx), Some(tx)) => (rx, tx),
            _ => panic!("`wg show {WG_HERE} transfer` printed {out:?}"),
        }
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        teardown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes whatever of the two hosts exists (a killed run's leftovers too). Deleting
/// the namespace destroys its interfaces, and a veth end takes its peer with it.
fn teardown() {
    ip_quiet(&format!("netns del {PEER_NS}"));
    ip_quiet(&format!("link del {WG_HERE}"));
    ip_quiet(&format!("link del {VETH_HERE}"));
}

/// `ip ARGS` (ARGS split on whitespace: no argument here has a space), which must
/// succeed; panics with its output.
fn ip(args: &str) {
    let out = run_within(
        Command::new("ip").args(args.split_whitespace()),
        LIMIT,
        "ip",
    );
    assert!(
        out.status.success(),
        "`ip {args}` failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `ip ARGS` whose failure does not matter (taking down what may not exist).
fn ip_quiet(args: &str) {
    let _ = run_within(
        Command::new("ip").args(args.split_whitespace()),
        LIMIT,
        "ip",
    );
}

/// `wg ARGS` (split on whitespace; in namespace `netns` when given), which must
/// succeed; its stdout.
fn wg(netns: Option<&str>, args: &str) -> String {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "wg"]);
            c
        }
        None => Command::new("wg"),
    };
    cmd.args(args.split_whitespace());
    let line = crate::command::command_line(&cmd);
    let out = run_within(&mut cmd, LIMIT, "wg");
    assert!(
        out.status.success(),
        "`{line}` failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
