//! Tokens from a file (`--token-file`): memnode and fsd take the secret from a file of
//! one line, so it appears in neither process's command line nor environment; a wrong
//! token is refused, and a missing file, or a token given twice, is a clear error.

use rmemfs_tests::{fresh_dir, FsdMount, MemnodeProc};
use std::path::Path;

fn token_file(dir: &Path, name: &str, token: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{token}\n")).expect("writing a token file");
    path.to_string_lossy().into_owned()
}

/// Whether process `pid`'s command line or environment holds `secret`.
fn shows(pid: u32, secret: &str) -> Vec<String> {
    ["cmdline", "environ"]
        .into_iter()
        .filter(|f| {
            let bytes = std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            String::from_utf8_lossy(&bytes).contains(secret)
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn a_token_file_admits_fsd_and_keeps_the_secret_out_of_sight() {
    let dir = fresh_dir("rmemfs-token-file");
    let secret = format!("tok-{:016x}", rand_u64());
    let file = token_file(&dir, "token", &secret);
    let memnode = MemnodeProc::start_with("64M", &["--token-file", &file]);
    let fsd = FsdMount::with_memnode(&memnode, &["--token-file", &file]);
    std::fs::write(fsd.join("f"), b"through a token from a file").expect("write");
    assert_eq!(
        std::fs::read(fsd.join("f")).expect("read"),
        b"through a token from a file"
    );
    assert_eq!(
        shows(memnode.pid(), &secret),
        Vec::<String>::new(),
        "memnode"
    );
    assert_eq!(shows(fsd.pid(), &secret), Vec::<String>::new(), "fsd");
    fsd.unmount();

    let wrong = token_file(&dir, "wrong", "not-the-token-of-this-memnode");
    let refused = FsdMount::refused(&[&memnode], &["--token-file", &wrong]);
    assert!(!refused.status.success());
    assert!(
        refused.stderr.to_lowercase().contains("token"),
        "a wrong token is refused, saying so: {}",
        refused.stderr
    );

    let missing = dir.join("missing").to_string_lossy().into_owned();
    let refused = FsdMount::refused(&[&memnode], &["--token-file", &missing]);
    assert!(
        refused.stderr.contains(&missing),
        "a missing token file is named: {}",
        refused.stderr
    );
    let both = FsdMount::refused(&[&memnode], &["--token-file", &file, "--token", &secret]);
    assert!(
        both.stderr.contains("cannot be used with"),
        "one token source at a time: {}",
        both.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}
