//! POSIX ACLs through a real mount, as on tmpfs: `setfacl`/`getfacl`, the mode they
//! set and chmod rewrites, the kernel's checks against them (a user granted or denied
//! by a named entry, narrowed by the mask), default ACLs inherited by new files,
//! directories and fifos in place of the umask, setgid cleared when a user outside
//! the file's group sets an ACL, `cp -a` keeping them, and on a volume their survival
//! across an unmount and a mount.
//!
//! Each scenario is a shell script run with the same umask on a tmpfs and on rmemfs;
//! their outputs must be the same, line for line. Runs as root (scripts/test does):
//! the unprivileged side is nobody (65534) by `setpriv`.

use rmemfs_tests::{FsdMount, MemnodeProc, TmpfsMount};
use std::path::Path;
use std::process::Command;

/// Access ACLs: the mode they set, chmod, and who they let in.
const ACCESS: &str = r#"
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
echo secret > f; chmod 640 f
setfacl -m u:65534:r f; echo "setfacl: $?"; stat -c 'mode %a' f; getfacl -n f
as_nobody cat f >/dev/null 2>&1; echo "nobody reads by its entry: $?"
setfacl -m m::- f; stat -c 'mode %a' f
as_nobody cat f >/dev/null 2>&1; echo "nobody reads past a --- mask: $?"
chmod 664 f; getfacl -n f
as_nobody sh -c 'echo more >> f' 2>/dev/null; echo "nobody appends by the mask's w: $?"
setfacl -m u:65534:- f
as_nobody cat f >/dev/null 2>&1; echo "nobody reads when its entry denies: $?"
setfacl -x u:65534 f; setfacl -m g:65534:rw f; getfacl -n f
setfacl -b f; stat -c 'mode %a' f; getfacl -n f
setfacl -b f; echo "setfacl -b without an ACL: $?"
mkdir bare; setfacl -k bare; echo "setfacl -k without a default ACL: $?"
setfacl -m u::rwx,g::-,o::r f; stat -c 'mode %a' f; getfacl -n f
mkdir private; chmod 700 private; echo x > private/inside
as_nobody ls private >/dev/null 2>&1; echo "nobody lists 700: $?"
setfacl -m u:65534:rx private
as_nobody ls private >/dev/null 2>&1; echo "nobody lists with r-x: $?"
as_nobody touch private/new 2>/dev/null; echo "nobody creates without w: $?"
"#;

/// Default ACLs: inherited by what is created in the directory, in place of the umask.
const DEFAULT: &str = r#"
mkdir d; setfacl -d -m u:65534:rwx,g::rx,o::- d; getfacl -n d
touch d/file; mkdir d/sub; mkfifo d/fifo; ln -s file d/link
mkdir -m 750 d/narrow; echo data > d/written
for p in d/file d/sub d/fifo d/narrow d/written; do stat -c "%n mode %a" "$p"; getfacl -n "$p"; done
stat -c '%n mode %a' d/link
umask 077; touch d/under-077 plain-077; mkdir d/dir-077
stat -c '%n mode %a' d/under-077 plain-077 d/dir-077
setfacl -d -m u::rw f 2>&1; echo "default on a file: $?"
setfacl -k d; getfacl -n d; touch d/after-k; stat -c '%n mode %a' d/after-k; getfacl -n d/after-k
"#;

/// Who may keep setgid when an ACL changes the mode, and copies keeping ACLs.
const SETGID_AND_COPIES: &str = r#"
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
touch g; chown 65534:0 g; chmod 2770 g
as_nobody setfacl -m u::rwx,g::rx g; echo "nobody sets its file's ACL: $?"; stat -c 'mode %a' g
touch k; chmod 2770 k; setfacl -m g::rx k; stat -c 'mode %a' k
mkdir src; echo a > src/a; setfacl -m u:65534:rw src/a; setfacl -d -m g:65534:r src
cp -a src copy; getfacl -n -R copy
"#;

fn require_tools() {
    for tool in ["setfacl", "getfacl", "setpriv"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} is missing: install the acl and util-linux packages (scripts/test does)"
        );
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "this test runs programs as another user: run it as root"
    );
}

/// Runs `script` in `dir` with umask 022; its output, stdout and stderr together.
fn run(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("umask 022\n{script}"))
        .current_dir(dir)
        .output()
        .expect("run sh");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs each scenario on a tmpfs and on `rmemfs`, asserting the same output, and
/// that tmpfs's shows `expect` (each scenario ran to where it matters).
fn same_as_tmpfs(rmemfs: &Path, scenarios: &[(&str, &str, &str)]) {
    require_tools();
    let tmpfs = TmpfsMount::start("16M");
    for (name, script, expect) in scenarios {
        let want = run(tmpfs.path(), script);
        assert!(
            want.contains(expect),
            "{name} on tmpfs lacks {expect:?}; it printed:\n{want}"
        );
        let got = run(rmemfs, script);
        if got != want {
            panic!("{name}: rmemfs differs from tmpfs\n--- tmpfs\n{want}\n--- rmemfs\n{got}");
        }
    }
}

#[test]
fn acls_behave_as_on_tmpfs() {
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &[]);
    same_as_tmpfs(
        fsd.path(),
        &[
            ("access", ACCESS, "setfacl -k without a default ACL: 0"),
            ("default", DEFAULT, "default:user:65534:rwx"),
            ("setgid", SETGID_AND_COPIES, "# file: copy/a"),
        ],
    );
    fsd.unmount();
}

#[test]
fn acls_survive_an_unmount_and_a_mount_of_a_volume() {
    require_tools();
    let memnode = MemnodeProc::start("64M");
    let args = ["--volume", "acls"];
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let made = run(
        fsd.path(),
        "mkdir d && setfacl -d -m u:65534:rwx d && touch d/f && chmod 600 d/f && \
         setfacl -m u:65534:r d/f && getfacl -n -R d",
    );
    assert!(made.contains("user:65534:r--"), "ACLs set:\n{made}");
    fsd.unmount();
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let kept = run(fsd.path(), "getfacl -n -R d");
    assert_eq!(kept, made, "ACLs after the mount differ");
    let read = run(
        fsd.path(),
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- cat d/f; echo \"rc $?\"",
    );
    assert_eq!(
        read, "rc 0\n",
        "nobody reads through its ACL entry after the mount"
    );
    fsd.unmount();
}
