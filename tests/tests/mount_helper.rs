//! rmemfs mounted the way production filesystems are: installed by scripts/install,
//! mounted by mount(8) from an fstab line or `mount -t fuse.rmemfs SOURCE DIR -o
//! OPTIONS`, which runs the helper `mount.fuse.rmemfs`, which starts fsd and returns
//! once the filesystem is live.
//!
//! Checked: `/proc/mounts` and `findmnt` show the SOURCE and the type `fuse.rmemfs`;
//! `umount SOURCE` unmounts and fsd exits; `mount -o remount,ro|rw DIR` changes the
//! live mount (EROFS while read-only) without a second fsd; the generic options
//! reach the kernel (`nosuid` and `nodev` by default, `suid`, `dev`, `noexec`,
//! atime) and fsd's settings reach fsd as its flags; a bad option or SOURCE fails
//! with a message naming it (an option by its name only, never its value) and leaves
//! nothing mounted; a token from `token_file=`
//! shows in neither `ps` nor `/proc/mounts`; the installed unit files pass
//! `systemd-analyze verify`; fsd run directly mounts `nosuid,nodev` too.
//!
//! Runs as root (mount(8), setuid programs, device nodes); the harness installs the
//! helper link `/sbin/mount.fuse.rmemfs` (see `rmemfs_tests::helper`).

use rmemfs_tests::binaries::find_on_path;
use rmemfs_tests::command::{run_ok, run_within};
use rmemfs_tests::config::NOBODY;
use rmemfs_tests::helper::{self, fsd_serving, HelperMount, Via};
use rmemfs_tests::{assert_errno, fresh_dir, FsdMount, MemnodeProc, TmpfsMount};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "these tests run mount(8), setuid programs and device nodes: they must run as \
         root (scripts/test does)"
    );
}

fn mount(memnode: &MemnodeProc, source: &str, options: &str) -> HelperMount {
    require_root();
    HelperMount::mount(Via::CommandLine, memnode.transport(), source, options)
}

fn write_read(m: &HelperMount, name: &str) {
    let data = format!("{name} through {}", m.source());
    fs::write(m.join(name), &data).unwrap_or_else(|e| panic!("writing {name}: {e}"));
    assert_eq!(
        fs::read_to_string(m.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}")),
        data
    );
}

/// The value after `flag` in fsd's arguments.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The /proc/mounts line of `dir`: device, mount point, type, options.
fn proc_mounts_line(dir: &Path) -> Option<Vec<String>> {
    let text = fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let want = dir.to_string_lossy();
    text.lines()
        .rev()
        .map(|l| l.split(' ').map(str::to_string).collect::<Vec<_>>())
        .find(|f| f.get(1).map(String::as_str) == Some(&*want))
}

/// systemd's escaping of a mount point into a name (`/tmp/a-b` -> `tmp-a\x2db`),
/// for the paths these tests make (letters, digits, `-`, `/`).
fn systemd_escape(dir: &Path) -> String {
    dir.to_string_lossy()
        .trim_matches('/')
        .replace('-', "\\x2d")
        .replace('/', "-")
}

#[test]
fn an_fstab_line_mounts_with_source_and_type_and_umount_of_the_source_ends_it() {
    require_root();
    let a = MemnodeProc::start("64M");
    let b = MemnodeProc::start("64M");
    let source = format!("{},{}/fstabvol", a.addr(), b.addr());
    // Every comment option an fstab line for a network filesystem carries, and no
    // log=: the helper's default log file.
    let m = HelperMount::mount(
        Via::Fstab,
        a.transport(),
        &source,
        "defaults,_netdev,nofail,noauto,x-systemd.requires=memnode.service,\
         x-systemd.mount-timeout=30,comment=rmemfs-test,replicas=2,cache=16M,log=default",
    );
    let entry = m.entry().expect("mounted");
    assert_eq!(
        (entry.source.as_str(), entry.fstype.as_str()),
        (source.as_str(), "fuse.rmemfs"),
        "mountinfo: the SOURCE is the device, the type fuse.rmemfs"
    );
    let line = proc_mounts_line(m.path()).expect("the mount is in /proc/mounts");
    assert_eq!(
        (line[0].as_str(), line[2].as_str()),
        (source.as_str(), "fuse.rmemfs"),
        "/proc/mounts: {line:?}"
    );
    let found = run_ok(
        Command::new("findmnt")
            .args(["-n", "-o", "SOURCE,FSTYPE", "--mountpoint"])
            .arg(m.path()),
        LIMIT,
        "findmnt",
    );
    assert_eq!(
        found.split_whitespace().collect::<Vec<_>>(),
        [&source, "fuse.rmemfs"]
    );
    let by_type = run_ok(
        Command::new("findmnt").args(["-n", "-l", "-t", "fuse.rmemfs", "-o", "TARGET"]),
        LIMIT,
        "findmnt -t",
    );
    assert!(
        by_type.lines().any(|l| Path::new(l.trim()) == m.path()),
        "findmnt -t fuse.rmemfs lists {}: {by_type}",
        m.path().display()
    );
    assert!(
        entry.has_option("nosuid") && entry.has_option("nodev"),
        "nosuid,nodev by default: {}",
        entry.options
    );

    let args = m.fsd_args();
    assert_eq!(flag_value(&args, "--volume"), Some("fstabvol"), "{args:?}");
    assert_eq!(flag_value(&args, "--replicas"), Some("2"), "{args:?}");
    assert_eq!(flag_value(&args, "--cache"), Some("16M"), "{args:?}");
    for comment in [
        "_netdev",
        "nofail",
        "noauto",
        "x-systemd",
        "comment",
        "defaults",
    ] {
        assert!(
            !args.iter().any(|a| a.contains(comment)),
            "fsd gets no {comment}: {args:?}"
        );
    }
    write_read(&m, "f");

    // Without log= (and outside the journal) fsd logs to /var/log/rmemfs/<mount>.log.
    let log = Path::new("/var/log/rmemfs").join(format!("{}.log", systemd_escape(m.path())));
    let text = fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("fsd's default log {}: {e}", log.display()));
    assert!(
        text.contains(&format!("mounted {source} on {}", m.path().display())),
        "{} says fsd mounted:\n{text}",
        log.display()
    );

    // A remount of a mount in fstab: mount(8) hands the helper the fstab line's
    // options, which describe the mount as at first (nosuid,nodev: rmemfs's
    // defaults), with ro over them.
    let fstab = m.fstab_file().expect("mounted from an fstab file");
    let mut remount = Command::new("mount");
    remount
        .arg("--fstab")
        .arg(&fstab)
        .args(["-o", "remount,ro"])
        .arg(m.path());
    run_ok(&mut remount, LIMIT, "mount --fstab FILE -o remount,ro DIR");
    let e = m.entry().expect("still mounted");
    assert_eq!(
        e.options, "ro,nosuid,nodev,relatime",
        "remounted read-only from fstab"
    );
    assert_errno(
        fs::write(m.join("g"), b"x"),
        libc::EROFS,
        "writing after remount,ro",
    );
    let mut remount = Command::new("mount");
    remount
        .arg("--fstab")
        .arg(&fstab)
        .args(["-o", "remount,rw"])
        .arg(m.path());
    run_ok(&mut remount, LIMIT, "mount --fstab FILE -o remount,rw DIR");
    assert_eq!(
        m.entry().expect("still mounted").options,
        "rw,nosuid,nodev,relatime"
    );
    write_read(&m, "g");

    let fsd = m.fsd_pid();
    assert_eq!(fsd_serving(m.path()), [fsd], "the remounts started no fsd");
    m.umount(&source);
    assert!(!helper::alive(fsd), "fsd exited after umount SOURCE");
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("volume fstabvol: everything is durable"),
        "fsd made the volume durable on its way out:\n{text}"
    );
    let _ = fs::remove_file(&log);
}

#[test]
fn under_the_journal_fsd_logs_to_the_helpers_stderr() {
    require_root();
    let memnode = MemnodeProc::start("64M");
    let m = HelperMount::mount(
        Via::UnderJournal,
        memnode.transport(),
        memnode.addr(),
        "cache=8M,log=default",
    );
    let said = format!(
        "mounted {} on {} as fuse.rmemfs",
        memnode.addr(),
        m.path().display()
    );
    let journal = rmemfs_tests::poll_until(LIMIT, || {
        let text = m.journal_text();
        text.contains(&said).then_some(text)
    });
    assert!(
        journal.is_some(),
        "fsd's log lines go to the journal (the helper's stderr); it has:\n{}",
        m.journal_text()
    );
    let log = Path::new("/var/log/rmemfs").join(format!("{}.log", systemd_escape(m.path())));
    assert!(
        !log.exists(),
        "no log file under the journal: {}",
        log.display()
    );
    let dir = m.path().to_string_lossy().into_owned();
    m.umount(&dir);
}

#[test]
fn remount_read_only_and_back_changes_the_live_mount_without_a_second_fsd() {
    let memnode = MemnodeProc::start("64M");
    let m = mount(&memnode, memnode.addr(), "cache=16M");
    write_read(&m, "before");
    let fsd = m.fsd_pid();

    let (status, err) = m.mount_again(&["-o", "remount,ro"]);
    assert!(status.success(), "mount -o remount,ro: {err}");
    let entry = m.entry().expect("still mounted");
    assert!(
        entry.has_option("ro") && entry.has_option("nosuid") && entry.has_option("nodev"),
        "read-only, nosuid and nodev kept: {}",
        entry.options
    );
    assert_errno(
        fs::write(m.join("new"), b"x"),
        libc::EROFS,
        "creating a file read-only",
    );
    assert_errno(
        fs::OpenOptions::new().write(true).open(m.join("before")),
        libc::EROFS,
        "opening a file for writing read-only",
    );
    assert_eq!(
        fs::read_to_string(m.join("before")).expect("reading while read-only"),
        format!("before through {}", m.source())
    );
    assert_eq!(fsd_serving(m.path()), [fsd], "the remount started no fsd");

    let (status, err) = m.mount_again(&["-o", "remount,rw"]);
    assert!(status.success(), "mount -o remount,rw: {err}");
    let entry = m.entry().expect("still mounted");
    assert!(
        entry.has_option("rw") && entry.has_option("nosuid"),
        "{}",
        entry.options
    );
    write_read(&m, "after");
    assert_eq!(fsd_serving(m.path()), [fsd], "the remount started no fsd");

    // A remount of something that is not rmemfs is refused by the helper.
    let tmpfs = TmpfsMount::start("1M");
    let out = run_within(
        Command::new(helper::SBIN_HELPER)
            .arg("x")
            .arg(tmpfs.path())
            .args(["-o", "remount,ro"]),
        LIMIT,
        "the helper on a tmpfs",
    );
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not fuse.rmemfs"),
        "the helper remounts only rmemfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = m.path().to_string_lossy().into_owned();
    m.umount(&dir);
}

/// Runs a program this test just wrote: another test thread that forks while the
/// file is still open for writing holds a copy of that descriptor until its child
/// execs, and exec fails with ETXTBSY meanwhile, so that is tried again (bounded).
fn run_fresh_program(mut make: impl FnMut() -> Command) -> std::io::Result<std::process::Output> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match make().output() {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other,
        }
    }
}

/// `id -u` run as nobody from `program`: the effective uid it reports.
fn euid_as_nobody(program: &Path) -> String {
    let out = run_fresh_program(|| {
        let mut cmd = Command::new(program);
        cmd.arg("-u").uid(NOBODY).gid(NOBODY);
        cmd
    })
    .unwrap_or_else(|e| panic!("running {} as nobody: {e}", program.display()));
    assert!(
        out.status.success(),
        "{}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A setuid-root copy of `id` on `dir`, run as nobody: the effective uid it reports.
fn setuid_id_euid(dir: &Path) -> String {
    let id = find_on_path("id").expect("id on PATH");
    let copy = dir.join("id-setuid");
    fs::copy(&id, &copy).unwrap_or_else(|e| panic!("copying {}: {e}", id.display()));
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o4755)).expect("chmod 4755");
    euid_as_nobody(&copy)
}

#[test]
fn setuid_programs_gain_nothing_unless_mounted_allow_suid_as_on_tmpfs() {
    let memnode = MemnodeProc::start("64M");
    let plain = mount(&memnode, memnode.addr(), "cache=8M");
    assert_eq!(
        setuid_id_euid(plain.path()),
        NOBODY.to_string(),
        "nosuid (the default): a setuid-root program runs as its caller"
    );
    drop(plain);
    // mount(8) hands helpers no `suid` (the word for a flag that is off), so the
    // helper's spelling is allow_suid.
    let suid = mount(&memnode, memnode.addr(), "cache=8M,allow_suid");
    assert!(!suid.entry().expect("mounted").has_option("nosuid"));
    assert_eq!(
        setuid_id_euid(suid.path()),
        "0",
        "allow_suid: a setuid-root program runs as root"
    );
    // A remount keeps it: mount(8) hands over the mount's options from
    // mountinfo, where nothing says nosuid.
    let (status, err) = suid.mount_again(&["-o", "remount,ro"]);
    assert!(status.success(), "mount -o remount,ro: {err}");
    let e = suid.entry().expect("mounted");
    assert!(
        e.has_option("ro") && !e.has_option("nosuid"),
        "{}",
        e.options
    );
    let id = suid.join("id-setuid");
    assert_eq!(euid_as_nobody(&id), "0", "still suid after remount,ro");
    let tmpfs = TmpfsMount::start("8M");
    assert_eq!(
        setuid_id_euid(tmpfs.path()),
        "0",
        "as on tmpfs (mounted suid)"
    );
}

#[test]
fn noexec_refuses_to_run_programs_until_remounted_exec() {
    let memnode = MemnodeProc::start("64M");
    let m = mount(&memnode, memnode.addr(), "cache=8M,noexec");
    assert!(m.entry().expect("mounted").has_option("noexec"));
    let tru = find_on_path("true").expect("true on PATH");
    let copy = m.join("true");
    fs::copy(&tru, &copy).expect("copying true");
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_errno(
        run_fresh_program(|| Command::new(&copy)),
        libc::EACCES,
        "running a program on a noexec mount",
    );
    let (status, err) = m.mount_again(&["-o", "remount,exec"]);
    assert!(status.success(), "mount -o remount,exec: {err}");
    let ran = run_fresh_program(|| Command::new(&copy)).expect("running true after remount,exec");
    assert!(ran.status.success());
}

fn make_null_device(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; mknod has no memory effects.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

#[test]
fn nodev_refuses_device_nodes_unless_mounted_allow_dev() {
    let memnode = MemnodeProc::start("64M");
    let plain = mount(&memnode, memnode.addr(), "cache=8M");
    make_null_device(&plain.join("null"));
    assert_errno(
        fs::OpenOptions::new().write(true).open(plain.join("null")),
        libc::EACCES,
        "opening a device node on a nodev mount (the default)",
    );
    drop(plain);
    let dev = mount(&memnode, memnode.addr(), "cache=8M,allow_dev");
    assert!(!dev.entry().expect("mounted").has_option("nodev"));
    make_null_device(&dev.join("null"));
    let mut null = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(dev.join("null"))
        .expect("with allow_dev, the device node opens");
    use std::io::{Read, Write};
    assert_eq!(null.write(b"gone").expect("write to the null device"), 4);
    let mut buf = [0u8; 4];
    assert_eq!(null.read(&mut buf).expect("read the null device"), 0);
}

#[test]
fn the_options_asked_for_are_what_fsd_and_the_kernel_get() {
    let memnode = MemnodeProc::start("64M");
    let dir = fresh_dir("rmemfs-helper-stats");
    let stats = dir.join("stats.json");
    let m = mount(
        &memnode,
        memnode.addr(),
        &format!(
            "ro,noexec,noatime,nodiratime,cache=16M,block-size=16K,threads=2,ring_threads=2,\
             scrub_rate=0,flush_interval=2,connections=2,page_cache,stats_file={}",
            stats.display()
        ),
    );
    let args = m.fsd_args();
    assert_eq!(args[0], m.path().to_string_lossy(), "{args:?}");
    for (flag, value) in [
        ("--fsname", memnode.addr()),
        ("--memnode", memnode.addr()),
        ("-o", "ro,noexec,noatime,nodiratime"),
        ("--cache", "16M"),
        ("--block-size", "16K"),
        ("--threads", "2"),
        ("--ring-threads", "2"),
        ("--scrub-rate", "0"),
        ("--flush-interval", "2"),
        ("--connections", "2"),
        ("--stats-file", &stats.to_string_lossy()),
        ("--transport", &memnode.transport().to_string()),
    ] {
        assert_eq!(
            flag_value(&args, flag),
            Some(value),
            "fsd's {flag}: {args:?}"
        );
    }
    assert!(args.iter().any(|a| a == "--page-cache"), "{args:?}");
    assert!(
        !args.iter().any(|a| a == "--volume"),
        "no volume asked: {args:?}"
    );
    let entry = m.entry().expect("mounted");
    assert_eq!(entry.options, "ro,nosuid,nodev,noexec,noatime,nodiratime");
    for word in ["default_permissions", "allow_other"] {
        assert!(
            entry.super_options.split(',').any(|o| o == word),
            "{word}: {}",
            entry.super_options
        );
    }
    let written = rmemfs_tests::poll_until(LIMIT, || stats.exists().then_some(()));
    assert!(written.is_some(), "fsd writes the stats_file= it was given");
    drop(m);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_option_or_source_fails_the_mount_naming_it_and_mounts_nothing() {
    require_root();
    let memnode = MemnodeProc::start("64M");
    let addr = memnode.addr();
    let dir = fresh_dir("rmemfs-helper-bad");
    let missing_token = dir.join("no-such-token");
    let missing_token = format!("token_file={}", missing_token.display());
    // (via, SOURCE, options, exit status, what the message must say)
    let cases: Vec<(Via, String, String, i32, String)> = vec![
        (
            Via::CommandLine,
            addr.into(),
            "cache=8M,bogus=1".into(),
            1,
            "unknown option \"bogus\"".into(),
        ),
        (
            Via::Fstab,
            addr.into(),
            "_netdev,frobnicate".into(),
            1,
            "unknown option \"frobnicate\"".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "cache=lots".into(),
            1,
            "option cache: invalid value '…'".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "token=hunter2".into(),
            1,
            "use token_file=PATH".into(),
        ),
        (
            Via::Fstab,
            addr.into(),
            "cache=8M,Token=hunter2".into(),
            1,
            "option \"Token\": a token in the mount options".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "password=hunter2".into(),
            1,
            "unknown option \"password\"".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            missing_token.clone(),
            1,
            "option token_file: invalid value '…' for '--token-file <PATH>': reading the token file …"
                .into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "direct_io,writeback_cache".into(),
            1,
            "cannot be used with".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "takeover".into(),
            1,
            "takeover takes a volume over".into(),
        ),
        (
            Via::CommandLine,
            format!("{addr}/v"),
            "volume=w".into(),
            1,
            "named twice".into(),
        ),
        (
            Via::CommandLine,
            "10.0.0.2".into(),
            String::new(),
            1,
            "memnode \"10.0.0.2\" is not HOST:PORT".into(),
        ),
        (
            Via::CommandLine,
            format!("{addr},,{addr}"),
            String::new(),
            1,
            "an empty memnode".into(),
        ),
        (
            Via::Fstab,
            "embedded/bad!name".into(),
            String::new(),
            1,
            "volume \"bad!name\"".into(),
        ),
        // Refused by fsd itself once started: the helper prints fsd's error.
        (
            Via::CommandLine,
            "127.0.0.1:1".into(),
            "op_timeout=2".into(),
            32,
            "fsd failed to mount: connecting to memnodes".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "threads=0".into(),
            32,
            "--threads and --connections must be between 1 and 64".into(),
        ),
        (
            Via::CommandLine,
            addr.into(),
            "ring_threads=65".into(),
            32,
            "--ring-threads must be between 1 and 64".into(),
        ),
    ];
    for (via, source, options, code, says) in cases {
        let what = format!("{via:?} {source} -o {options}");
        let failure = match HelperMount::try_mount(via, memnode.transport(), &source, &options) {
            Ok(m) => panic!(
                "{what}: mounted on {}, should have failed",
                m.path().display()
            ),
            Err(f) => f,
        };
        let m = &failure.mount;
        assert_eq!(
            failure.status.code(),
            Some(code),
            "{what}: {}",
            failure.stderr
        );
        assert!(
            failure.stderr.contains("mount.fuse.rmemfs: ") && failure.stderr.contains(&says),
            "{what}: the message should say {says:?}, got:\n{}",
            failure.stderr
        );
        // The helper names options, never shows their values (a secret given to
        // the wrong option, or under a name it does not know, stays out of sight).
        for value in options
            .split(',')
            .filter_map(|o| o.split_once('='))
            .map(|(_, v)| v)
        {
            let helper_lines = failure
                .stderr
                .lines()
                .filter(|l| l.starts_with("mount.fuse.rmemfs: "));
            for line in helper_lines.filter(|l| !l.contains("fsd failed to mount")) {
                assert!(
                    value.len() < 3 || !line.contains(value),
                    "{what}: the helper showed the value {value:?}: {line}"
                );
            }
        }
        assert_eq!(m.entry(), None, "{what}: nothing mounted");
        assert_eq!(
            fsd_serving(m.path()),
            Vec::<u32>::new(),
            "{what}: no fsd left"
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_mount_that_outlasts_mount_timeout_is_stopped_and_fails() {
    require_root();
    // A frozen memnode accepts connections but never answers fsd's hello.
    let memnode = MemnodeProc::start("64M");
    memnode.freeze();
    let started = std::time::Instant::now();
    let result = HelperMount::try_mount(
        Via::CommandLine,
        memnode.transport(),
        memnode.addr(),
        "mount_timeout=2,op_timeout=60",
    );
    memnode.thaw();
    let failure = match result {
        Ok(m) => panic!("mounted on {} from a frozen memnode", m.path().display()),
        Err(f) => f,
    };
    let took = started.elapsed();
    assert_eq!(failure.status.code(), Some(32), "{}", failure.stderr);
    assert!(
        failure.stderr.contains("did not mount") && failure.stderr.contains("within 2s"),
        "{}",
        failure.stderr
    );
    assert!(
        took < Duration::from_secs(20),
        "the helper gave up after {took:?}"
    );
    assert_eq!(failure.mount.entry(), None, "nothing mounted");
    assert_eq!(
        fsd_serving(failure.mount.path()),
        Vec::<u32>::new(),
        "the helper stopped the fsd it started"
    );
}

/// Where `secret` shows: in `ps` output, /proc/mounts, findmnt, fsd's command line
/// or environment.
fn places_showing(secret: &str, fsd: u32) -> Vec<String> {
    let mut places = Vec::new();
    let ps = run_ok(Command::new("ps").args(["-eo", "pid,args"]), LIMIT, "ps");
    if ps.contains(secret) {
        places.push("ps -eo args".to_string());
    }
    for file in [
        "/proc/mounts".to_string(),
        "/proc/self/mountinfo".into(),
        format!("/proc/{fsd}/cmdline"),
        format!("/proc/{fsd}/environ"),
    ] {
        let bytes = fs::read(&file).unwrap_or_else(|e| panic!("reading {file}: {e}"));
        if String::from_utf8_lossy(&bytes).contains(secret) {
            places.push(file);
        }
    }
    let findmnt = run_ok(&mut Command::new("findmnt"), LIMIT, "findmnt");
    if findmnt.contains(secret) {
        places.push("findmnt".into());
    }
    places
}

#[test]
fn the_token_from_token_file_shows_in_neither_ps_nor_proc_mounts() {
    require_root();
    let dir = fresh_dir("rmemfs-helper-token");
    let secret = format!(
        "helper-secret-{:x}",
        std::process::id() as u64 * 0x9e37_79b9
    );
    let token = dir.join("token");
    fs::write(&token, format!("{secret}\n")).expect("writing the token file");
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).expect("chmod 600");
    let token_arg = token.to_string_lossy().into_owned();
    let memnode = MemnodeProc::start_with("64M", &["--token-file", &token_arg]);
    let m = mount(
        &memnode,
        memnode.addr(),
        &format!("cache=8M,token_file={token_arg}"),
    );
    write_read(&m, "f"); // the memnode took the token
    assert_eq!(
        flag_value(&m.fsd_args(), "--token-file"),
        Some(token_arg.as_str())
    );
    assert_eq!(places_showing(&secret, m.fsd_pid()), Vec::<String>::new());
    assert_eq!(places_showing(&secret, memnode.pid()), Vec::<String>::new());
    drop(m);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_mount_waits_for_an_fsd_that_is_letting_go_of_the_volume() {
    // umount(8) returns before the unmounted fsd has let go of its volume (FUSE does
    // not wait for the daemon), so `umount && mount` (and xfstests' cycle_mount)
    // finds it held for a moment: the mount must wait for it rather than fail.
    // Here the holder lets go a second after the mount starts.
    let memnode = MemnodeProc::start("64M");
    let holder = FsdMount::with_memnode(&memnode, &["--volume", "cycled", "--cache", "8M"]);
    fs::write(holder.join("kept"), b"kept").expect("writing kept");
    let letting_go = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        holder.unmount();
    });
    let m = mount(&memnode, &format!("{}/cycled", memnode.addr()), "cache=8M");
    letting_go.join().expect("the holder unmounts");
    assert_eq!(
        fs::read(m.join("kept")).expect("reading kept"),
        b"kept",
        "the file the holder wrote"
    );
    assert!(
        m.log_text().contains("waiting up to"),
        "fsd should say it waits for the holder; its log:\n{}",
        m.log_text()
    );
    let dir = m.path().to_string_lossy().into_owned();
    m.umount(&dir);
}

#[test]
fn the_embedded_source_mounts_a_volume_on_fsds_own_memnode() {
    let memnode = MemnodeProc::start("16M"); // only for its transport
    let m = mount(&memnode, "embedded/myvol", "embedded_size=64M,cache=8M");
    let args = m.fsd_args();
    assert!(!args.iter().any(|a| a == "--memnode"), "embedded: {args:?}");
    assert_eq!(flag_value(&args, "--volume"), Some("myvol"));
    assert_eq!(flag_value(&args, "--embedded-size"), Some("64M"));
    assert_eq!(m.entry().expect("mounted").source, "embedded/myvol");
    write_read(&m, "f");
    let dir = m.path().to_string_lossy().into_owned();
    m.umount(&dir);
}

#[test]
fn fsd_run_directly_mounts_fuse_rmemfs_nosuid_nodev_unless_asked() {
    require_root();
    let memnode = MemnodeProc::start("64M");
    let plain = FsdMount::with_memnode(&memnode, &["--cache", "8M"]);
    let e = plain.entry();
    assert_eq!(
        (e.fstype.as_str(), e.source.as_str()),
        ("fuse.rmemfs", "rmemfs")
    );
    assert!(
        e.has_option("nosuid") && e.has_option("nodev"),
        "{}",
        e.options
    );
    plain.unmount();

    let asked = FsdMount::with_memnode(
        &memnode,
        &[
            "--cache",
            "8M",
            "-o",
            "suid,dev",
            "-o",
            "strictatime,nodiratime",
            "--fsname",
            "direct",
        ],
    );
    let e = asked.entry();
    assert_eq!(e.source, "direct");
    assert_eq!(
        e.options, "rw,nodiratime",
        "suid, dev, strictatime (no atime word)"
    );
    asked.unmount();

    let refused = FsdMount::refused(&[&memnode], &["-o", "nosuid,bogus"]);
    assert!(
        refused.stderr.contains("unknown mount option \"bogus\""),
        "{}",
        refused.stderr
    );
}

#[test]
fn installed_unit_files_pass_systemd_analyze_verify() {
    let installed = helper::install();
    let analyze = find_on_path("systemd-analyze").unwrap_or_else(|| {
        panic!(
            "systemd-analyze is not on PATH: install systemd (`apt-get install systemd`; \
             scripts/common.sh install_system_packages does)"
        )
    });
    let service = installed.sysconfdir.join("systemd/system/memnode.service");
    let example = installed
        .prefix
        .join("share/rmemfs/systemd/mnt-rmemfs.mount");
    let text = fs::read_to_string(&service).expect("memnode.service installed");
    for line in [
        "LimitMEMLOCK=infinity".to_string(),
        "Restart=on-failure".into(),
        format!(
            "EnvironmentFile={}",
            installed.sysconfdir.join("rmemfs/memnode.conf").display()
        ),
        format!(
            "ExecStart={}/bin/memnode $MEMNODE_OPTS",
            installed.prefix.display()
        ),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "memnode.service has {line}:\n{text}"
        );
    }
    assert!(installed.sysconfdir.join("rmemfs/memnode.conf").is_file());

    // verify exits 0 even when it warns about a setting: the warnings count too.
    let verify = |units: &[&Path]| {
        let out = run_within(
            Command::new(&analyze).arg("verify").args(units),
            LIMIT,
            "systemd-analyze verify",
        );
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status, said)
    };
    let (status, said) = verify(&[&service, &example]);
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("memnode.service") || l.contains("mnt-rmemfs.mount"))
        .collect();
    assert!(
        status.success() && ours.is_empty(),
        "systemd-analyze verify ({status}):\n{said}"
    );

    // The check can fail: a broken copy is reported.
    let dir = fresh_dir("rmemfs-units");
    let broken = dir.join("memnode.service");
    fs::write(
        &broken,
        text.replace("LimitMEMLOCK=infinity", "LimitMEMLOCK=lots"),
    )
    .unwrap();
    let (_, said) = verify(&[&broken]);
    assert!(
        said.contains(&*broken.to_string_lossy()),
        "a bad setting is reported:\n{said}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn install_into_a_destdir_is_complete_and_idempotent() {
    let bins = rmemfs_tests::binaries::bin_dir();
    let dest = fresh_dir("rmemfs-destdir");
    let run = || {
        run_ok(
            Command::new("bash")
                .arg(helper::install_script())
                .args(["--no-build", "--bin-dir"])
                .arg(&bins)
                .arg("--destdir")
                .arg(&dest),
            Duration::from_secs(120),
            "scripts/install --destdir",
        )
    };
    run();
    let conf = dest.join("etc/rmemfs/memnode.conf");
    let kept = "MEMNODE_OPTS=\"--listen 127.0.0.1:7171 --size 2G\"\n";
    fs::write(&conf, kept).expect("editing memnode.conf");
    run();
    assert_eq!(
        fs::read_to_string(&conf).unwrap(),
        kept,
        "an edited memnode.conf stays"
    );
    for (path, from) in [
        ("usr/local/bin/memnode", Some("memnode")),
        ("usr/local/bin/fsd", Some("fsd")),
        ("usr/local/bin/rmemfs", Some("rmemfs")),
        ("usr/local/sbin/mount.fuse.rmemfs", Some("mount_rmemfs")),
        ("etc/systemd/system/memnode.service", None),
        ("usr/local/share/rmemfs/systemd/mnt-rmemfs.mount", None),
        ("usr/local/share/doc/rmemfs/mounting.md", None),
        ("usr/local/share/doc/rmemfs/metrics.md", None),
        ("usr/local/share/doc/rmemfs/swap.md", None),
        ("usr/local/share/doc/rmemfs/reference.md", None),
    ] {
        let meta = fs::metadata(dest.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        if let Some(bin) = from {
            assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{path}");
            let built = fs::metadata(bins.join(bin)).expect("built binary");
            assert_eq!(meta.len(), built.len(), "{path} is the built {bin}");
        } else {
            assert_eq!(meta.permissions().mode() & 0o777, 0o644, "{path}");
        }
    }
    let swap = dest.join("usr/local/sbin/rmemfs-swap");
    assert_eq!(
        fs::metadata(&swap)
            .expect("rmemfs-swap")
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        fs::read(&swap).unwrap(),
        fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/swap")).unwrap(),
        "rmemfs-swap is scripts/swap"
    );
    let link = fs::read_link(dest.join("sbin/mount.fuse.rmemfs")).expect("the /sbin link");
    assert_eq!(link, Path::new("/usr/local/sbin/mount.fuse.rmemfs"));
    let service = fs::read_to_string(dest.join("etc/systemd/system/memnode.service")).unwrap();
    assert!(
        service.contains("ExecStart=/usr/local/bin/memnode") && !service.contains('@'),
        "placeholders filled in:\n{service}"
    );
    let _ = fs::remove_dir_all(&dest);
}
