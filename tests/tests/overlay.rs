//! overlayfs with its upper layer on rmemfs (containers' writable layer in remote
//! memory): overlayfs mounts only on an upper filesystem that has RENAME_WHITEOUT.
//! A file of the lower layer deleted or renamed through the overlay leaves a
//! whiteout (a character device 0:0) in the upper layer, and the merged view shows
//! exactly what was done. Needs root (mount -t overlay).

use rmemfs_tests::{fresh_dir, FsdMount, MemnodeProc};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn is_whiteout(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

#[test]
fn overlayfs_mounts_with_its_upper_layer_on_rmemfs_and_deletes_leave_whiteouts() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "mounting overlayfs needs root (scripts/test runs the tests as root)"
    );
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "8M"]);
    let lower = fresh_dir("rmemfs-overlay-lower");
    let merged = fresh_dir("rmemfs-overlay-merged");
    fs::write(lower.join("gone"), b"lower").unwrap();
    fs::write(lower.join("moved"), b"moved").unwrap();
    fs::write(lower.join("kept"), b"kept").unwrap();
    let (upper, work) = (fsd.join("upper"), fsd.join("work"));
    fs::create_dir(&upper).unwrap();
    fs::create_dir(&work).unwrap();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let out = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged)
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "mount -t overlay with the upper layer on rmemfs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::remove_file(merged.join("gone")).expect("rm through the overlay");
    fs::rename(merged.join("moved"), merged.join("renamed")).expect("mv through the overlay");
    fs::write(merged.join("new"), b"new").unwrap();
    let merged_names = names(&merged);
    let upper_gone = is_whiteout(&upper.join("gone"));
    let upper_moved = is_whiteout(&upper.join("moved"));
    let renamed = fs::read(merged.join("renamed"));
    let _ = Command::new("umount").arg(&merged).status();
    let _ = fs::remove_dir(&merged);
    assert_eq!(merged_names, vec!["kept", "new", "renamed"]);
    assert!(
        upper_gone,
        "a whiteout in the upper layer for the deleted file"
    );
    assert!(
        upper_moved,
        "a whiteout in the upper layer for the renamed one"
    );
    assert_eq!(renamed.expect("read renamed"), b"moved");
    fsd.unmount();
    let _ = fs::remove_dir_all(&lower);
}
