//! Which fabric backend the daemons under test use, chosen by the environment so the
//! same tests run over tcp on any host and over verbs where there is an RDMA device
//! (scripts/softroce/e2e.sh runs them inside a qemu guest with Soft-RoCE).
//!
//! - `RMEMFS_TRANSPORT`: `tcp` (the default when unset or empty), `verbs`, `mapped`
//!   or `auto`. With `mapped` every memnode shares its region and every fsd maps it
//!   (the third fabric); the tests of tenants cannot run so (a memnode with a tenants
//!   file shares nothing, by design: it refuses `--transport mapped`).
//!   Every memnode and fsd the harness starts gets `--transport <it>` (fsd also for its
//!   embedded memnode), and the harness's own control connections use the same one.
//!   Tests that are tcp-only by nature (raw TCP bytes to a memnode) ask for
//!   [`Transport::Tcp`] explicitly with [`crate::MemnodeProc::start_on`].
//! - `RMEMFS_TEST_HOST`: the address memnodes listen on (each on a free port), as in
//!   common/tests/fabric.rs. Default: `127.0.0.1` for tcp; for verbs (and for auto
//!   when this host has an RDMA device) the RDMA interface's own IPv4 address
//!   ([`fabric::local_host`]), because RoCE cannot reach loopback.
//! - `RMEMFS_TEST_OP_TIMEOUT`: seconds, passed to fsd as `--op-timeout` unless the test
//!   gives its own (emulated RDMA is slow and jittery; fsd's default is 5 s).
//! - `RMEMFS_FUSE_TRANSPORT`: `io-uring`, `classic` or `auto`, passed to fsd as
//!   `--fuse-transport` unless the test gives its own: scripts/test runs the suite once
//!   on each (with `io-uring` fsd refuses to mount where the kernel cannot serve it,
//!   so the run fails loudly instead of quietly testing /dev/fuse).
//!
//! The first daemon a test starts prints one line saying which transport it runs on.

use rmemfs_common::fabric;
use rmemfs_common::sync::lock;
use std::collections::HashSet;
use std::sync::Mutex;

pub use rmemfs_common::fabric::Transport;

/// The transport `RMEMFS_TRANSPORT` asks for; panics on a value that is not one.
pub fn transport() -> Transport {
    match std::env::var("RMEMFS_TRANSPORT") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().unwrap_or_else(|e| {
            panic!("RMEMFS_TRANSPORT={v:?}: {e}");
        }),
        Ok(_) | Err(std::env::VarError::NotPresent) => Transport::Tcp,
        Err(e) => panic!("RMEMFS_TRANSPORT: {e}"),
    }
}

/// The host memnodes started with `transport` listen on (see the module docs).
pub fn listen_host(transport: Transport) -> String {
    if let Some(host) = non_empty_env("RMEMFS_TEST_HOST") {
        return host;
    }
    match transport.resolve() {
        Ok(Transport::Verbs) => fabric::local_host(Transport::Verbs).unwrap_or_else(|| {
            panic!(
                "--transport {transport}: the RDMA device has no IPv4 address to listen \
                 on; set RMEMFS_TEST_HOST"
            )
        }),
        _ => "127.0.0.1".to_string(),
    }
}

/// The `--listen` argument for a memnode on `transport`: a free port on
/// [`listen_host`].
pub fn listen_arg(transport: Transport) -> String {
    let host = listen_host(transport);
    if host.contains(':') {
        format!("[{host}]:0")
    } else {
        format!("{host}:0")
    }
}

/// `RMEMFS_TEST_OP_TIMEOUT`, when set: fsd's `--op-timeout` for tests that set none.
pub fn op_timeout() -> Option<String> {
    let v = non_empty_env("RMEMFS_TEST_OP_TIMEOUT")?;
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 => Some(v),
        _ => panic!("RMEMFS_TEST_OP_TIMEOUT={v:?} is not a positive number of seconds"),
    }
}

/// `RMEMFS_FUSE_TRANSPORT`, when set: fsd's `--fuse-transport` for tests that set
/// none.
pub fn fuse_transport() -> Option<String> {
    let v = non_empty_env("RMEMFS_FUSE_TRANSPORT")?;
    match v.as_str() {
        "io-uring" | "classic" | "auto" => Some(v),
        _ => panic!("RMEMFS_FUSE_TRANSPORT={v:?}: expected io-uring, classic or auto"),
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Prints, once per test (libtest runs each test on a thread named after it), which
/// transport its daemons use.
/// `fixed` says the test chose the transport itself instead of taking the env's.
pub(crate) fn announce(transport: Transport, fixed: bool, who: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let thread = std::thread::current();
    let key = match thread.name() {
        Some(name) => name.to_string(),
        None => format!("{:?}", thread.id()),
    };
    let mut seen = lock(&SEEN);
    if seen.get_or_insert_with(HashSet::new).insert(key.clone()) {
        let why = if fixed {
            "fixed by the test".to_string()
        } else {
            match non_empty_env("RMEMFS_TRANSPORT") {
                Some(v) => format!("RMEMFS_TRANSPORT={v}"),
                None => "RMEMFS_TRANSPORT unset".to_string(),
            }
        };
        println!("{key}: transport {transport} ({why}), first daemon: {who}");
    }
}

#[cfg(test)]
mod tests {
    use super::Transport;

    #[test]
    fn transports_parse() {
        assert_eq!("tcp".parse::<Transport>(), Ok(Transport::Tcp));
        assert_eq!("verbs".parse::<Transport>(), Ok(Transport::Verbs));
        assert_eq!("auto".parse::<Transport>(), Ok(Transport::Auto));
        assert!("rdma".parse::<Transport>().is_err());
    }
}
