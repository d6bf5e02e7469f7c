//! Real programs on the mount, each through an fsd cache smaller than what it works on,
//! each checked by the program's own verdict or against the same work done on a local
//! filesystem:
//!
//! - tar: a generated source tree (thousands of files, links, modes, long names) is
//!   extracted onto the mount and archived again; the new archive equals the original
//!   byte for byte and `diff -r` finds no difference.
//! - git: a repository cloned onto the mount (pack protocol), commits, `git gc`; `git
//!   fsck --full --strict` is clean and the commits' ids equal those of the same
//!   commits made on a local filesystem (ids hash every byte).
//! - SQLite: thousands of rows in several transactions and a rollback, in rollback-
//!   journal and WAL mode (WAL shares its index through a writable shared mmap);
//!   `PRAGMA integrity_check` is `ok`, the dump equals a local run's, and a writer
//!   killed mid-transaction leaves the committed rows only.
//! - cargo: a new crate with a library, a unit test and a binary builds offline on the
//!   mount, its test passes and the binary prints what it computes.
//!
//! Each prints how long each step took. The seeds of generated data are printed
//! (`RMEMFS_TEST_SEED` repeats a run).

use rmemfs_tests::binaries::{cargo, program};
use rmemfs_tests::command::{run_ok, run_timed, run_within};
use rmemfs_tests::config::cache_of;
use rmemfs_tests::data::assert_bytes_eq;
use rmemfs_tests::kernel::drop_page_cache;
use rmemfs_tests::tree::{self, TreeSpec};
use rmemfs_tests::{fresh_dir, heavy_test, within, FsdMount, MemnodeProc, Pattern, MIB};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A limit for one program run: generous for a loaded 2-core machine, still a bound.
const STEP: Duration = Duration::from_secs(300);

/// A local scratch directory, removed when the test passes (kept on failure).
struct Scratch(PathBuf);

impl Scratch {
    fn new(prefix: &str) -> Scratch {
        Scratch(fresh_dir(prefix))
    }
    fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
    fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Panics naming the first differing offset unless files `a` and `b` are equal.
fn assert_files_equal(a: &Path, b: &Path) {
    let (la, lb) = (len_of(a), len_of(b));
    let mut fa = std::fs::File::open(a).unwrap_or_else(|e| panic!("open {}: {e}", a.display()));
    let mut fb = std::fs::File::open(b).unwrap_or_else(|e| panic!("open {}: {e}", b.display()));
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut pos = 0u64;
    loop {
        let na = read_full(&mut fa, &mut ba, a);
        let nb = read_full(&mut fb, &mut bb, b);
        let what = format!(
            "{} (size {la}) against {} (size {lb})",
            b.display(),
            a.display()
        );
        assert_bytes_eq(&ba[..na], &bb[..nb], pos, &what);
        if na == 0 {
            return;
        }
        pos += na as u64;
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8], p: &Path) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => panic!("reading {}: {e}", p.display()),
        }
    }
    n
}

fn len_of(p: &Path) -> u64 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .len()
}

// ---------------------------------------------------------------------------- tar

/// `tar` creating a reproducible archive of `dir`'s contents: sorted names, numeric
/// ids, GNU format (which keeps no atime or ctime).
fn tar_create(tar: &Path, dir: &Path, archive: &Path) -> Command {
    let mut c = Command::new(tar);
    c.args(["--sort=name", "--format=gnu", "--numeric-owner", "-C"])
        .arg(dir)
        .arg("-cf")
        .arg(archive)
        .arg(".");
    c
}

#[test]
fn tar_extracts_and_recreates_a_source_tree_byte_for_byte_through_a_small_cache() {
    let _serial = heavy_test();
    let tar = program("tar", "tar");
    let diff = program("diff", "diffutils");
    let seed = Pattern::for_test("tar source tree").seed();
    let local = Scratch::new("rmemfs-tar");
    let src = local.join("tree");
    let t = Instant::now();
    let spec = TreeSpec {
        small_files: 5000,
        bytes: 64 * MIB,
    };
    let sum = tree::generate(&src, seed, spec);
    println!(
        "tar: generated {} files ({} MiB), {} directories, {} symlinks, {} hard links in {:.2} s",
        sum.files,
        sum.bytes / MIB,
        sum.dirs,
        sum.symlinks,
        sum.hardlinks,
        t.elapsed().as_secs_f64()
    );
    let original = local.join("original.tar");
    run_timed(
        &mut tar_create(&tar, &src, &original),
        STEP,
        "tar: archive the local tree",
    );

    let memnode = MemnodeProc::start("512M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "8M"]);
    let dest = fsd.join("tree");
    std::fs::create_dir(&dest).expect("mkdir tree on the mount");
    run_timed(
        Command::new(&tar)
            .arg("-C")
            .arg(&dest)
            .arg("-xf")
            .arg(&original),
        STEP,
        "tar: extract onto the mount",
    );
    drop_page_cache();
    let again = fsd.join("again.tar");
    run_timed(
        &mut tar_create(&tar, &dest, &again),
        STEP,
        "tar: archive it again from the mount, onto the mount",
    );
    drop_page_cache();
    let t = Instant::now();
    assert_files_equal(&original, &again);
    println!(
        "tar: the archives are equal ({} MiB) in {:.2} s",
        len_of(&original) / MIB,
        t.elapsed().as_secs_f64()
    );
    run_timed(
        Command::new(&diff)
            .args(["-r", "--no-dereference"])
            .arg(&src)
            .arg(&dest),
        STEP,
        "tar: diff -r local tree, extracted tree",
    );
    fsd.unmount();
    local.remove();
}

// ---------------------------------------------------------------------------- git

/// The date of git commands that make no commit.
const NO_DATE: &str = "1600000000 +0000";

/// git with no system or user configuration, a fixed identity and fixed dates, so the
/// same commits get the same ids anywhere.
fn git(git: &Path, dir: &Path, date: &str) -> Command {
    let mut c = Command::new(git);
    c.arg("-C")
        .arg(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "rmemfs")
        .env("GIT_AUTHOR_EMAIL", "dev@rmemfs")
        .env("GIT_COMMITTER_NAME", "rmemfs")
        .env("GIT_COMMITTER_EMAIL", "dev@rmemfs")
        .env("GIT_AUTHOR_DATE", date)
        .env("GIT_COMMITTER_DATE", date)
        .args(["-c", "init.defaultBranch=main", "-c", "gc.auto=0"]);
    c
}

/// Commit `n` of the history the test makes: changes, adds, removes and renames files.
fn change_tree(dir: &Path, pattern: Pattern, n: u64) {
    for i in 0..20u64 {
        let p = dir.join(format!("changes/c{n}_{i}.txt"));
        std::fs::create_dir_all(p.parent().expect("has a parent")).expect("mkdir changes");
        std::fs::write(
            &p,
            pattern
                .derive(n * 100 + i)
                .bytes(0, 3000 + (i as usize) * 97),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
    }
    if n > 0 {
        let old = dir.join(format!("changes/c{}_0.txt", n - 1));
        std::fs::rename(&old, dir.join(format!("changes/renamed_{n}.txt"))).expect("rename");
        std::fs::remove_file(dir.join(format!("changes/c{}_1.txt", n - 1))).expect("unlink");
    }
    let big = dir.join("big.bin");
    std::fs::write(&big, pattern.derive(9999 + n).bytes(0, 2 * MIB as usize)).expect("big.bin");
}

/// Makes commits `from..to` in `repo` (each with its own fixed date).
fn commit_series(gitp: &Path, repo: &Path, pattern: Pattern, from: u64, to: u64) {
    for n in from..to {
        change_tree(repo, pattern, n);
        let date = format!("{} +0000", 1_700_000_000 + n * 3600);
        run_ok(git(gitp, repo, &date).args(["add", "-A"]), STEP, "git add");
        run_ok(
            git(gitp, repo, &date).args(["commit", "-q", "-m", &format!("commit {n}")]),
            STEP,
            "git commit",
        );
    }
}

fn head(gitp: &Path, repo: &Path) -> String {
    run_ok(
        git(gitp, repo, NO_DATE).args(["rev-parse", "HEAD"]),
        STEP,
        "git rev-parse",
    )
    .trim()
    .to_string()
}

#[track_caller]
fn assert_fsck_clean(gitp: &Path, repo: &Path, what: &str) {
    let out = run_within(
        git(gitp, repo, NO_DATE).args(["fsck", "--full", "--strict", "--no-dangling"]),
        STEP,
        what,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "{what}: git fsck --full --strict should exit 0 and report nothing, got {}\n\
         stdout:\n{}\nstderr:\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn git_clone_commit_gc_and_fsck_on_the_mount_give_the_same_commits_as_a_local_disk() {
    let _serial = heavy_test();
    let gitp = program("git", "git");
    let pattern = Pattern::for_test("git repository");
    let local = Scratch::new("rmemfs-git");
    let upstream = local.join("upstream");
    tree::generate(
        &upstream,
        pattern.seed(),
        TreeSpec {
            small_files: 800,
            bytes: 12 * MIB,
        },
    );
    run_ok(
        git(&gitp, &upstream, NO_DATE).args(["init", "-q"]),
        STEP,
        "git init",
    );
    commit_series(&gitp, &upstream, pattern, 0, 3);

    let memnode = MemnodeProc::start("512M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "4M"]);
    let on_mount = fsd.join("clone");
    run_timed(
        git(&gitp, fsd.path(), NO_DATE)
            .args(["clone", "-q", "--no-local"])
            .arg(&upstream)
            .arg(&on_mount),
        STEP,
        "git: clone onto the mount",
    );
    let t = Instant::now();
    commit_series(&gitp, &on_mount, pattern, 3, 8);
    println!(
        "git: 5 commits on the mount: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    drop_page_cache();
    assert_fsck_clean(&gitp, &on_mount, "git fsck on the mount after the commits");
    run_timed(
        git(&gitp, &on_mount, NO_DATE).args(["gc", "-q"]),
        STEP,
        "git: gc on the mount",
    );
    drop_page_cache();
    let t = Instant::now();
    assert_fsck_clean(&gitp, &on_mount, "git fsck on the mount after gc");
    println!(
        "git: fsck --full after gc: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let status = run_ok(
        git(&gitp, &on_mount, NO_DATE).args(["status", "--porcelain"]),
        STEP,
        "git status",
    );
    assert_eq!(
        status, "",
        "the work tree on the mount is clean after the commits"
    );

    // The same commits on a local disk give the same ids: every byte of every object
    // written through the mount is what git wrote.
    let reference = local.join("reference");
    run_ok(
        git(&gitp, &local.0, NO_DATE)
            .args(["clone", "-q", "--no-local"])
            .arg(&upstream)
            .arg(&reference),
        STEP,
        "git clone on local disk",
    );
    commit_series(&gitp, &reference, pattern, 3, 8);
    assert_eq!(
        head(&gitp, &on_mount),
        head(&gitp, &reference),
        "HEAD on the mount should be the commit made from the same changes on local disk"
    );
    // And the mount's repository clones back out intact.
    let back = local.join("back");
    run_timed(
        git(&gitp, &local.0, NO_DATE)
            .args(["clone", "-q", "--no-local"])
            .arg(&on_mount)
            .arg(&back),
        STEP,
        "git: clone from the mount",
    );
    assert_fsck_clean(
        &gitp,
        &back,
        "git fsck of a clone of the mount's repository",
    );
    assert_eq!(
        head(&gitp, &back),
        head(&gitp, &reference),
        "HEAD of the clone back"
    );
    fsd.unmount();
    local.remove();
}

// ------------------------------------------------------------------------- sqlite

/// Five committed transactions of 4,000 rows (with an index), one rolled back, one of
/// updates and deletes; then the verdicts. `cache_size` is small so pages go to the
/// file, not just to SQLite's own cache.
fn sqlite_script(journal: &str) -> String {
    let mut s = format!(
        "PRAGMA journal_mode={journal};\nPRAGMA cache_size=64;\n\
         CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, v TEXT NOT NULL);\n\
         CREATE INDEX t_k ON t(k);\n"
    );
    for tx in 0..5 {
        s += &format!(
            "BEGIN;\nWITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<4000)\n\
             INSERT INTO t(k, v) SELECT (i * 7919 + {tx}) % 10007, \
             printf('%.*c-%d-%d', 40 + i % 200, 'x', {tx}, i) FROM c;\nCOMMIT;\n"
        );
    }
    s += "BEGIN;\nDELETE FROM t WHERE k % 3 = 0;\nUPDATE t SET v = 'gone';\n\
          INSERT INTO t(k, v) SELECT k + 1, v FROM t;\nROLLBACK;\n\
          BEGIN;\nUPDATE t SET v = v || '+' WHERE id % 10 = 0;\n\
          DELETE FROM t WHERE id % 97 = 0;\nCOMMIT;\n";
    s
}

/// The checks run after the script, and again after the page cache is dropped.
const SQLITE_VERDICT: &str = "PRAGMA integrity_check;\n\
    SELECT count(*), sum(k), total(length(v)) FROM t;\n\
    SELECT count(*) FROM t WHERE v = 'gone';\n";

fn sqlite(sqlite3: &Path, db: &Path, sql: &str, what: &str) -> String {
    let script = db.with_extension("sql");
    std::fs::write(&script, sql).expect("writing the SQL script");
    run_ok(
        Command::new(sqlite3)
            .args(["-batch", "-bail"])
            .arg(db)
            .stdin(std::fs::File::open(&script).expect("opening the SQL script")),
        STEP,
        what,
    )
}

/// Starts a transaction of many inserts in a sqlite3 process, waits until it has run
/// (its journal or WAL is on the file), kills the process with SIGKILL mid-transaction.
fn kill_mid_transaction(sqlite3: &Path, db: &Path) {
    let mut child = Command::new(sqlite3)
        .args(["-batch"])
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting sqlite3");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    stdin
        .write_all(
            b"PRAGMA cache_size=16;\nBEGIN;\n\
              WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<20000)\n\
              INSERT INTO t(k, v) SELECT i, printf('%.200c', 'u') FROM c;\n\
              SELECT 'inserted';\n",
        )
        .expect("writing to sqlite3");
    let line = within(
        Duration::from_secs(120),
        "sqlite3 uncommitted inserts",
        move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            line
        },
    );
    assert_eq!(
        line.trim(),
        "inserted",
        "sqlite3 should have run the inserts"
    );
    child.kill().expect("SIGKILL to sqlite3");
    let _ = child.wait();
    drop(stdin);
}

fn sqlite_run(sqlite3: &Path, dir: &Path, journal: &str) -> (String, String) {
    let db = dir.join(format!("{journal}.db"));
    let out = sqlite(
        sqlite3,
        &db,
        &sqlite_script(journal),
        "sqlite3: transactions",
    );
    let verdict = sqlite(sqlite3, &db, SQLITE_VERDICT, "sqlite3: verdict");
    let dump = sqlite(sqlite3, &db, ".dump\n", "sqlite3: dump");
    (out + &verdict, dump)
}

#[test]
fn sqlite_transactions_and_a_rollback_leave_an_intact_database_on_the_mount() {
    let _serial = heavy_test();
    let sqlite3 = program("sqlite3", "sqlite3");
    let local = Scratch::new("rmemfs-sqlite");
    let memnode = MemnodeProc::start("256M");
    let fsd = FsdMount::with_memnode(&memnode, &cache_of("1M"));
    for journal in ["delete", "wal"] {
        let t = Instant::now();
        let (out, dump) = sqlite_run(&sqlite3, fsd.path(), journal);
        println!(
            "sqlite ({journal}): 20,000 rows in 5 transactions, a rollback, updates and verdicts \
             on the mount: {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let (local_out, local_dump) = sqlite_run(&sqlite3, &local.0, journal);
        assert!(
            out.lines().any(|l| l == "ok"),
            "PRAGMA integrity_check on the mount ({journal}) should print ok, got:\n{out}"
        );
        assert_eq!(
            out, local_out,
            "sqlite3's answers on the mount and on local disk ({journal})"
        );
        assert!(
            dump == local_dump,
            "the mount's database dump ({journal}) differs from the local one"
        );
        let db = fsd.join(format!("{journal}.db"));
        drop_page_cache();
        let again = sqlite(
            &sqlite3,
            &db,
            SQLITE_VERDICT,
            "sqlite3: verdict after drop_caches",
        );
        assert!(
            out.ends_with(&again),
            "verdict after dropping the page cache ({journal}):\n{again}\nexpected the end of:\n{out}"
        );
        kill_mid_transaction(&sqlite3, &db);
        drop_page_cache();
        let after = sqlite(
            &sqlite3,
            &db,
            SQLITE_VERDICT,
            "sqlite3: verdict after a killed writer",
        );
        assert_eq!(
            after, again,
            "after a writer was killed mid-transaction ({journal}) the database should hold \
             exactly the committed rows and pass integrity_check"
        );
        println!(
            "sqlite ({journal}): integrity ok, same dump as local disk, killed writer rolled back"
        );
    }
    fsd.unmount();
    local.remove();
}

// -------------------------------------------------------------------------- cargo

const CRATE_LIB: &str = r#"//! Primes below a bound, by sieve.

pub fn primes_below(n: usize) -> Vec<usize> {
    let mut composite = vec![false; n];
    let mut out = Vec::new();
    for i in 2..n {
        if !composite[i] {
            out.push(i);
            let mut j = i * i;
            while j < n {
                composite[j] = true;
                j += i;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_primes() {
        assert_eq!(super::primes_below(20), [2, 3, 5, 7, 11, 13, 17, 19]);
    }
}
"#;

const CRATE_MAIN: &str = r#"const BOUND: usize = 1_000_000;

fn main() {
    let p = hello_rmemfs::primes_below(BOUND);
    println!("{} primes below {BOUND}, the last {}", p.len(), p[p.len() - 1]);
}
"#;

/// cargo for a crate of its own: none of the variables of the cargo running this test
/// (its target directory above all) leak in; offline.
fn cargo_cmd(dir: &Path) -> Command {
    let mut c = Command::new(cargo());
    c.current_dir(dir)
        .env("CARGO_NET_OFFLINE", "true")
        .env("CARGO_TERM_COLOR", "never");
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_MANIFEST_DIR",
        "CARGO_PKG_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "RUSTC_WRAPPER",
    ] {
        c.env_remove(var);
    }
    c
}

#[test]
fn cargo_builds_tests_and_runs_a_new_crate_on_the_mount() {
    let _serial = heavy_test();
    let memnode = MemnodeProc::start("512M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "16M"]);
    run_timed(
        cargo_cmd(fsd.path()).args(["new", "--vcs", "none", "--lib", "hello-rmemfs"]),
        STEP,
        "cargo: new",
    );
    let krate = fsd.join("hello-rmemfs");
    std::fs::write(krate.join("src/lib.rs"), CRATE_LIB).expect("writing src/lib.rs");
    std::fs::write(krate.join("src/main.rs"), CRATE_MAIN).expect("writing src/main.rs");
    run_timed(
        cargo_cmd(&krate).args(["build", "--offline"]),
        STEP,
        "cargo: build",
    );
    let tests = run_timed(
        cargo_cmd(&krate).args(["test", "--offline"]),
        STEP,
        "cargo: test",
    )
    .0;
    assert!(
        tests.contains("test tests::the_first_primes ... ok"),
        "the crate's unit test should pass on the mount, cargo test printed:\n{tests}"
    );
    drop_page_cache();
    let bin = krate.join("target/debug/hello-rmemfs");
    let (out, _) = run_timed(
        &mut Command::new(&bin),
        STEP,
        "cargo: run the binary from the mount",
    );
    assert_eq!(
        out.trim(),
        "78498 primes below 1000000, the last 999983",
        "the binary built on the mount computes the number of primes"
    );
    // A rebuild after a change sees it (mtimes on the mount drive cargo's freshness).
    let main = krate.join("src/main.rs");
    std::fs::write(&main, CRATE_MAIN.replace("1_000_000", "100")).expect("editing main.rs");
    run_timed(
        cargo_cmd(&krate).args(["build", "--offline"]),
        STEP,
        "cargo: rebuild after an edit",
    );
    let (out, _) = run_timed(
        &mut Command::new(&bin),
        STEP,
        "cargo: run the rebuilt binary",
    );
    assert_eq!(
        out.trim(),
        "25 primes below 100, the last 97",
        "the binary rebuilt after an edit on the mount computes the new bound"
    );
    fsd.unmount();
}
