//! Tenants of one memnode (`memnode --tenants FILE`): a tenant at its quota gets
//! ENOSPC from its mount while another tenant still writes on the same memnode; a
//! tenant cannot list, open, take over or destroy another's volume, whose name it
//! may use for a volume of its own; and a memnode restarted on its memory file keeps
//! every volume its tenant's (one no longer in the tenants file waits, unreachable,
//! until it is listed again). `rmemfs tenants` shows each tenant's use.

use rmemfs_common::control;
use rmemfs_tests::binaries::binary;
use rmemfs_tests::command::run_within;
use rmemfs_tests::volume::{self, list_with};
use rmemfs_tests::{
    errno_name, fresh_dir, heavy_test, within, FsdMount, MemnodeProc, Pattern, MIB,
};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-9876543210";
const FILE_LEN: u64 = 4 * MIB;

/// `printf %s TOKEN | sha256sum`.
fn sha(token: &str) -> String {
    rmemfs_common::auth::token_key(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tenants file in `dir`: alice by the hash of her token with `alice_quota`
/// (e.g. `quota_bytes = "16M"`), bob by a token file with no quota; `with_alice`
/// false leaves alice out.
fn tenants_file(dir: &Path, alice_quota: &str, with_alice: bool) -> String {
    let bob_token = dir.join("bob.token");
    std::fs::write(&bob_token, format!("{BOB}\n")).expect("writing bob's token file");
    let mut text = String::new();
    if with_alice {
        text += &format!(
            "[[tenant]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n{alice_quota}\n\n",
            sha(ALICE)
        );
    }
    text += &format!(
        "[[tenant]]\nname = \"bob\"\ntoken_file = {:?}\n",
        bob_token.display().to_string()
    );
    let path = dir.join(if with_alice {
        "tenants.toml"
    } else {
        "bob-only.toml"
    });
    std::fs::write(&path, text).expect("writing the tenants file");
    path.display().to_string()
}

fn write_bounded(
    fsd: &FsdMount,
    name: &str,
    pattern: Pattern,
) -> Result<(), (&'static str, io::Error)> {
    let path = fsd.join(name);
    within(
        Duration::from_secs(60),
        &format!("writing {name}"),
        move || pattern.try_write_file(&path, FILE_LEN),
    )
}

/// `rmemfs tenants --metrics ADDR --json`, parsed.
fn rmemfs_tenants(metrics: &str) -> Vec<serde_json::Value> {
    let mut cmd = std::process::Command::new(binary("rmemfs"));
    cmd.args(["tenants", "--metrics", metrics, "--json"]);
    let out = run_within(&mut cmd, Duration::from_secs(30), "rmemfs tenants");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rmemfs tenants: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("rmemfs tenants --json printed no JSON array ({e}): {stdout}"));
    rows.as_array().cloned().unwrap_or_default()
}

fn row<'a>(rows: &'a [serde_json::Value], tenant: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["tenant"] == tenant)
        .unwrap_or_else(|| panic!("rmemfs tenants shows no {tenant}: {rows:?}"))
}

#[test]
fn a_tenant_at_its_quota_gets_enospc_while_another_still_writes_on_the_same_memnode() {
    let _serial = heavy_test();
    let dir = fresh_dir("rmemfs-tenants-quota");
    let file = tenants_file(&dir, "quota_bytes = \"16M\"", true);
    let memnode = MemnodeProc::start_with("96M", &["--tenants", &file, "--metrics", "127.0.0.1:0"]);
    let pattern = Pattern::for_test("tenant quota");
    let alice = FsdMount::with_memnode(&memnode, &["--token", ALICE, "--cache", "4M"]);

    // 4 MiB files until the 16 MiB quota refuses one.
    let mut written = Vec::new();
    let failure =
        (0..12u64).find_map(
            |i| match write_bounded(&alice, &format!("a{i}"), pattern.derive(i)) {
                Ok(()) => {
                    written.push(i);
                    None
                }
                Err(e) => Some((i, e)),
            },
        );
    let Some((failed, (step, err))) = failure else {
        panic!("alice wrote 48 MiB with a quota of 16 MiB");
    };
    println!(
        "alice's file {failed}: {step} failed with {} ({err}) after {} files",
        errno_name(err.raw_os_error().unwrap_or(0)),
        written.len()
    );
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "a tenant at its quota gets ENOSPC, got {err} at {step}"
    );
    assert!(
        written.len() >= 2,
        "only {} files of 4 MiB fit in a 16 MiB quota",
        written.len()
    );

    // Bob, on the same memnode, writes as much again and more.
    let bob = FsdMount::with_memnode(&memnode, &["--token", BOB, "--cache", "4M"]);
    for i in 0..6u64 {
        if let Err((step, e)) = write_bounded(&bob, &format!("b{i}"), pattern.derive(100 + i)) {
            panic!("bob's file {i}: {step} failed with {e} while alice is at her quota");
        }
    }
    for i in 0..6u64 {
        pattern
            .derive(100 + i)
            .verify_file(&bob.join(format!("b{i}")), FILE_LEN);
    }

    // What alice wrote is intact, and freeing room lets her write again: a quota
    // never leaves a mount stuck.
    for &i in &written {
        pattern
            .derive(i)
            .verify_file(&alice.join(format!("a{i}")), FILE_LEN);
    }
    let _ = std::fs::remove_file(alice.join(format!("a{failed}")));
    std::fs::remove_file(alice.join("a0")).expect("unlink");
    std::fs::remove_file(alice.join("a1")).expect("unlink");
    write_bounded(&alice, "again", pattern.derive(1000))
        .unwrap_or_else(|(step, e)| panic!("after freeing 8 MiB, alice's {step} failed: {e}"));

    let rows = rmemfs_tenants(memnode.metrics_addr());
    let a = row(&rows, "alice");
    assert_eq!(a["quota_bytes"], 16 * MIB, "{a}");
    assert!(
        a["used_bytes"].as_u64().is_some_and(|u| u <= 16 * MIB),
        "{a}"
    );
    assert!(a["over_quota"].as_u64().is_some_and(|n| n >= 1), "{a}");
    let b = row(&rows, "bob");
    assert!(
        b["used_bytes"].as_u64().is_some_and(|u| u >= 6 * FILE_LEN),
        "{b}"
    );
    assert!(b["quota_bytes"].is_null(), "{b}");
    alice.unmount();
    bob.unmount();
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `tenant`'s client sees opening `name` without creating it.
fn open_as(
    memnode: &MemnodeProc,
    token: &str,
    name: &str,
    takeover: bool,
) -> control::ControlError {
    let (ep, _) = memnode.client_with_token(token.as_bytes());
    control::volume_open(&*ep, name, false, takeover)
        .expect_err("another tenant's volume does not open")
}

fn names(memnode: &MemnodeProc, token: &str) -> Vec<String> {
    list_with(memnode, &["--token", token])
        .into_iter()
        .map(|v| v.name)
        .collect()
}

#[test]
fn a_tenant_cannot_list_open_take_over_or_destroy_anothers_volume() {
    let dir = fresh_dir("rmemfs-tenants-volumes");
    let file = tenants_file(&dir, "", true);
    let memnode = MemnodeProc::start_with("256M", &["--tenants", &file]);
    let alice = FsdMount::with_memnode(&memnode, &["--token", ALICE, "--volume", "data"]);
    std::fs::write(alice.join("alices"), b"alice's bytes").expect("alice writes");

    assert_eq!(names(&memnode, ALICE), vec!["data"]);
    assert!(
        names(&memnode, BOB).is_empty(),
        "bob lists none of alice's volumes"
    );
    for takeover in [false, true] {
        let e = open_as(&memnode, BOB, "data", takeover);
        assert!(
            e.is_not_found(),
            "bob opening alice's volume (takeover {takeover}): {e}"
        );
    }
    let r = volume::run(
        &["volume", "destroy"],
        &["data", "--token", BOB],
        &[&memnode],
    )
    .no_panic("destroy");
    assert_ne!(r.code, 0, "bob destroying alice's volume: {}", r.context());
    assert!(r.stdout.contains("no volume data"), "{}", r.context());

    // Bob's "data", taken over or not, is a volume of his own: alice's mount goes on.
    let bob = FsdMount::with_memnode(
        &memnode,
        &["--token", BOB, "--volume", "data", "--takeover"],
    );
    assert!(
        !bob.join("alices").exists(),
        "bob's \"data\" is not alice's"
    );
    std::fs::write(bob.join("bobs"), b"bob's bytes").expect("bob writes");
    std::fs::write(alice.join("after"), b"still hers").expect("alice still writes");
    assert_eq!(
        std::fs::read(alice.join("alices")).expect("reads"),
        b"alice's bytes"
    );
    bob.unmount();
    volume::run(
        &["volume", "destroy"],
        &["data", "--token", BOB],
        &[&memnode],
    )
    .ok("bob destroys his");
    assert_eq!(
        names(&memnode, ALICE),
        vec!["data"],
        "alice's volume is left"
    );
    assert_eq!(
        std::fs::read(alice.join("after")).expect("reads"),
        b"still hers"
    );
    alice.unmount();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory for memory files: tmpfs (`/dev/shm`) where there is one.
fn memory_file(test: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("rmemfs-tenants-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the memory file");
    dir.join("memory")
}

#[test]
fn a_memnode_restarted_on_its_memory_file_keeps_each_volume_its_tenants() {
    let dir = fresh_dir("rmemfs-tenants-restart");
    let both = tenants_file(&dir, "quota_volumes = 2", true);
    let bob_only = tenants_file(&dir, "", false);
    let mem = memory_file("restart");
    let mem_arg = mem.display().to_string();
    let args = |tenants: &str| -> Vec<String> {
        [
            "--tenants",
            tenants,
            "--memory-file",
            &mem_arg,
            "--session-grace",
            "2",
        ]
        .map(String::from)
        .to_vec()
    };
    let start = |addr: Option<&str>, tenants: &str| {
        let a = args(tenants);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        match addr {
            None => MemnodeProc::start_with("64M", &a),
            Some(addr) => MemnodeProc::start_at_with(addr, "64M", &a),
        }
    };
    let mut memnode = start(None, &both);
    let addr = memnode.addr().to_string();
    let alice = FsdMount::with_memnode(&memnode, &["--token", ALICE, "--volume", "data"]);
    std::fs::write(alice.join("kept"), b"across restarts").expect("alice writes");
    alice.unmount();

    // Restarted without alice in the tenants file: her volume waits, unreachable.
    memnode.kill();
    memnode = start(Some(&addr), &bob_only);
    let said = memnode.stderr();
    assert!(
        said.contains("tenant \"alice\" is in this memory file's books but not among the tenants"),
        "the memnode says what it keeps for a tenant it no longer lists:\n{said}"
    );
    assert!(names(&memnode, BOB).is_empty());
    let e = open_as(&memnode, BOB, "data", true);
    assert!(e.is_not_found(), "bob taking over alice's kept volume: {e}");

    // Listed again, alice has it back, and bob still cannot reach it.
    memnode.kill();
    memnode = start(Some(&addr), &both);
    assert_eq!(names(&memnode, ALICE), vec!["data"]);
    assert!(names(&memnode, BOB).is_empty(), "still alice's only");
    let e = open_as(&memnode, BOB, "data", true);
    assert!(e.is_not_found(), "bob taking over alice's volume: {e}");
    let alice = FsdMount::with_memnode(&memnode, &["--token", ALICE, "--volume", "data"]);
    assert_eq!(
        std::fs::read(alice.join("kept")).expect("reads"),
        b"across restarts"
    );
    alice.unmount();
    drop(memnode);
    let _ = std::fs::remove_dir_all(mem.parent().expect("its directory"));
    let _ = std::fs::remove_dir_all(&dir);
}
