//! Filling the memnode gives ENOSPC (at write, fsync or close: write-back may defer the
//! error), and the files written before stay intact; with fsd --writeback-cache too,
//! where only fsync or close can report it (the write returns before fsd sees it).

use rmemfs_tests::{errno_name, heavy_test, within, FsdMount, MemnodeProc, Pattern, MIB};
use std::io;
use std::path::PathBuf;
use std::time::Duration;

const FILE_LEN: u64 = 4 * MIB;

/// Writes one whole file, reporting which step failed: the error of write-back may
/// surface at write(), fsync() or close().
fn write_file_by_steps(path: PathBuf, pattern: Pattern) -> Result<(), (&'static str, io::Error)> {
    pattern.try_write_file(&path, FILE_LEN)
}

#[test]
fn full_remote_memory_gives_enospc_and_files_written_before_stay_intact() {
    fill_then_free(&[], &["write", "fsync", "close"]);
}

#[test]
fn with_writeback_cache_fsync_or_close_gives_enospc_and_files_written_before_stay_intact() {
    fill_then_free(&["--writeback-cache"], &["fsync", "close"]);
}

/// Writes 4 MiB files into a 64 MiB memnode until a step fails, which must be ENOSPC
/// at one of `steps`; then checks every file written before, frees space and writes
/// again.
fn fill_then_free(fsd_flags: &[&str], steps: &[&str]) {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("full remote memory");
    let memnode = MemnodeProc::start("64M");
    let mut args = vec!["--cache", "8M"];
    args.extend_from_slice(fsd_flags);
    let fsd = FsdMount::with_memnode(&memnode, &args);

    let mut written = Vec::new();
    let mut failure = None;
    // 64 files of 4 MiB is four times the memnode's 64 MiB.
    for i in 0..64u64 {
        let path = fsd.join(format!("f{i:02}"));
        let p = pattern.derive(i);
        let r = within(
            Duration::from_secs(60),
            &format!("writing file {i}"),
            move || write_file_by_steps(path, p),
        );
        match r {
            Ok(()) => written.push(i),
            Err((step, e)) => {
                failure = Some((i, step, e));
                break;
            }
        }
    }
    let Some((failed, step, err)) = failure else {
        panic!("wrote 256 MiB of files into a 64 MiB memnode without an error");
    };
    println!(
        "file {failed}: {step} failed with {} ({err}) after {} whole files",
        errno_name(err.raw_os_error().unwrap_or(0)),
        written.len()
    );
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "file {failed}: {step} failed with {err} ({:?}); a full memnode must give ENOSPC",
        err.raw_os_error()
    );
    assert!(
        steps.contains(&step),
        "file {failed}: ENOSPC came from {step}; with fsd {fsd_flags:?} it can only come \
         from {steps:?}"
    );
    let stored = written.len() as u64 * FILE_LEN;
    assert!(
        stored >= 32 * MIB,
        "only {} MiB of files fit in a 64 MiB memnode before ENOSPC: expected at least \
         half of it to be usable",
        stored / MIB
    );

    // Everything written and closed before the failure reads back exactly, from the
    // memnode (the 8 MiB cache holds at most the last two files).
    for &i in &written {
        pattern
            .derive(i)
            .verify_file(&fsd.join(format!("f{i:02}")), FILE_LEN);
    }

    // Freeing space makes writing possible again.
    std::fs::remove_file(fsd.join(format!("f{failed:02}"))).expect("unlink of the failed file");
    std::fs::remove_file(fsd.join("f00")).expect("unlink of f00");
    let again = pattern.derive(1000);
    let path = fsd.join("after");
    within(
        Duration::from_secs(60),
        "writing after freeing space",
        move || write_file_by_steps(path, again),
    )
    .unwrap_or_else(|(step, e)| panic!("after unlinking 8 MiB of files, {step} failed: {e}"));
    again.verify_file(&fsd.join("after"), FILE_LEN);
    for &i in written.iter().skip(1) {
        pattern
            .derive(i)
            .verify_file(&fsd.join(format!("f{i:02}")), FILE_LEN);
    }
    fsd.unmount();
}
