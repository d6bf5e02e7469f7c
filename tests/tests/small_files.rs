//! Small files cost what they hold: remote memory in 4 KiB pages, as tmpfs.
//!
//! A source-shaped tree (thousands of files under 8 KiB, a few of several MiB,
//! symlinks, hard links, empty files) is made on a tmpfs and copied onto rmemfs with
//! `cp -a`:
//!
//! - the memnode's used bytes (its own statistics, not fsd's view) stay within 1.05x
//!   of what the tmpfs reports used for the same tree;
//! - every regular file's `st_blocks` is what tmpfs gives it, and `du` finds no more;
//! - on a volume, the tree comes back exact after an unmount and a mount (a fresh fsd
//!   with an empty cache reads everything from the memnode).

use rmemfs_tests::command::run_ok;
use rmemfs_tests::kernel::statvfs;
use rmemfs_tests::snapshot::{Kind, TreeSnapshot};
use rmemfs_tests::tree::{self, TreeSpec};
use rmemfs_tests::{heavy_test, FsdMount, MemnodeProc, TmpfsMount, MIB};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SEED: u64 = 27;
/// fsd takes remote memory from its memnode a chunk at a time and keeps up to about
/// one and a half chunks free in hand. With 1 MiB chunks that slack is small next
/// to the tree; with the default 64 MiB it would dwarf a tree this size (and vanish
/// next to a large one).
const CHUNK: &str = "1M";

fn spec() -> TreeSpec {
    TreeSpec {
        small_files: 4_000,
        bytes: 48 * MIB,
    }
}

fn used_bytes(mount: &Path) -> u64 {
    let st = statvfs(mount);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

fn copy_tree(from: &Path, to: &Path) {
    run_ok(
        Command::new("cp").arg("-a").arg(from).arg(to),
        Duration::from_secs(600),
        "cp -a of the tree onto rmemfs",
    );
}

fn du_kib(path: &Path) -> u64 {
    let out = run_ok(
        Command::new("du").arg("-sk").arg(path),
        Duration::from_secs(120),
        "du -sk",
    );
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("du printed {out:?}"))
}

/// What a copy must keep of each path: kind, mode, size, contents, link target, and
/// for regular files the blocks they take.
fn assert_same_content(expected: &TreeSnapshot, found: &TreeSnapshot, what: &str) {
    let mut diffs = Vec::new();
    for (path, a) in &expected.entries {
        let Some(b) = found.entries.get(path) else {
            diffs.push(format!("{}: missing", path.display()));
            continue;
        };
        // (A directory's size is each filesystem's own business.)
        let same = a.kind == b.kind
            && a.mode == b.mode
            && (a.size == b.size || a.kind == Kind::Dir)
            && a.digest == b.digest
            && a.target == b.target;
        if !same {
            diffs.push(format!("{}: {a:?} became {b:?}", path.display()));
        } else if a.kind == Kind::File && a.blocks != b.blocks {
            diffs.push(format!(
                "{}: {} bytes take {} blocks on tmpfs but {} on rmemfs",
                path.display(),
                a.size,
                a.blocks,
                b.blocks
            ));
        }
    }
    assert!(
        diffs.is_empty() && expected.entries.len() == found.entries.len(),
        "{what}: {} of {} paths differ ({} found), first ones:\n{}",
        diffs.len(),
        expected.entries.len(),
        found.entries.len(),
        diffs
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_source_tree_takes_no_more_remote_memory_than_on_tmpfs_and_comes_back_exact() {
    let _serial = heavy_test();
    let tmpfs = TmpfsMount::start("256M");
    let src = tmpfs.join("tree");
    let summary = tree::generate(&src, SEED, spec());
    let on_tmpfs = used_bytes(tmpfs.path());
    let expected = TreeSnapshot::take(&src);
    println!("tree: {summary:?}; tmpfs uses {} KiB", on_tmpfs / 1024);

    // Scratch mount: what the memnode hands out for the tree.
    let memnode = MemnodeProc::start("256M");
    let idle = memnode.stats().used;
    let fsd = FsdMount::with_memnode(&memnode, &["--chunk-size", CHUNK]);
    copy_tree(&src, fsd.path());
    let used = memnode.stats().used - idle;
    let ratio = used as f64 / on_tmpfs as f64;
    println!(
        "memnode used {} KiB for the tree: {ratio:.3}x tmpfs",
        used / 1024
    );
    assert!(
        ratio <= 1.05,
        "the tree takes {} KiB of remote memory, {ratio:.3}x the {} KiB tmpfs uses for it \
         (at most 1.05x)",
        used / 1024,
        on_tmpfs / 1024
    );
    // (tmpfs keeps a long symlink's target in a page of its own; rmemfs keeps every
    // target with the inode, so du may find less on rmemfs, never more.)
    let (du_tmpfs, du_rmemfs) = (du_kib(&src), du_kib(&fsd.join("tree")));
    assert!(
        du_rmemfs <= du_tmpfs,
        "du finds {du_rmemfs} KiB in the tree on rmemfs, more than the {du_tmpfs} KiB on tmpfs"
    );
    assert_same_content(
        &expected,
        &TreeSnapshot::take(&fsd.join("tree")),
        "the copy on a scratch mount",
    );
    fsd.unmount();

    // A volume: after an unmount and a mount nothing is cached, every byte comes
    // from the memnode, in the pages the volume recorded.
    let args = ["--volume", "small", "--chunk-size", CHUNK];
    let fsd = FsdMount::with_memnode(&memnode, &args);
    copy_tree(&src, fsd.path());
    let before = TreeSnapshot::take(&fsd.join("tree"));
    fsd.unmount();
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let after = TreeSnapshot::take(&fsd.join("tree"));
    before.assert_same(
        &after,
        "the tree after an unmount and a mount of the volume",
    );
    assert_same_content(&expected, &after, "the tree on the volume, mounted again");
    fsd.unmount();
}
