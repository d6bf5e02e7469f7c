//! Clearing setuid and setgid ("killing privileges") on write, truncate and chown.
//!
//! fsd negotiates `FUSE_HANDLE_KILLPRIV_V2`, which hands this job to the filesystem.
//! In exchange the kernel marks inodes without setuid, setgid or security xattrs
//! `S_NOSEC` and stops asking for `security.capability` before every write: one
//! FUSE round trip less per `write(2)`. The rules are those of a local Linux
//! filesystem (`should_remove_suid`, `chown_common`):
//! - setuid is always cleared; setgid only with group-execute (without it, setgid
//!   marks mandatory locking and stays);
//! - on write and truncate only when the caller lacks `CAP_FSETID`; on chown always;
//! - never on directories.
//!
//! `security.capability` (file capabilities) goes with any write, whoever writes. The
//! kernel still removes it itself before most changes, since an inode that has it
//! never becomes `S_NOSEC`, but not before a direct-I/O write: fsd's write path does.

use std::path::Path;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

/// The xattr holding a file's capabilities, which a write removes.
pub const FILE_CAPABILITIES: &str = "security.capability";

/// `CAP_FSETID` (linux/capability.h): keep setuid/setgid when modifying a file.
const CAP_FSETID: u32 = 4;

/// `perm` with setuid cleared, and setgid too if group-execute is set.
pub fn without_privs(perm: u16) -> u16 {
    let mut p = perm & !S_ISUID;
    if p & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP {
        p &= !S_ISGID;
    }
    p
}

/// Whether clearing would change `perm`.
pub fn has_privs(perm: u16) -> bool {
    without_privs(perm) != perm
}

/// When a change must clear setuid/setgid (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KillPrivs {
    /// Leave them.
    #[default]
    No,
    /// Clear them (chown).
    Yes,
    /// Clear them unless the process `pid` has `CAP_FSETID` (truncate).
    UnlessCallerHasFsetid(u32),
}

impl KillPrivs {
    /// Resolves this for a file whose permission bits are `perm`; looks at the
    /// caller only when there is something to clear.
    pub fn applies_to(self, perm: u16) -> bool {
        has_privs(perm)
            && match self {
                KillPrivs::No => false,
                KillPrivs::Yes => true,
                KillPrivs::UnlessCallerHasFsetid(pid) => !caller_has_fsetid(pid),
            }
    }
}

/// Whether process (or thread) `pid` holds `CAP_FSETID` in fsd's user namespace.
/// Anything unknown (the process gone, pid 0 for a caller outside fsd's pid
/// namespace, another user namespace, where its capabilities mean nothing here)
/// counts as "no": then the bits are cleared, the safe side.
pub fn caller_has_fsetid(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let same_userns = match (
        std::fs::read_link(proc_dir.join("ns/user")),
        std::fs::read_link("/proc/self/ns/user"),
    ) {
        (Ok(theirs), Ok(ours)) => theirs == ours,
        _ => false,
    };
    same_userns
        && std::fs::read_to_string(proc_dir.join("status"))
            .ok()
            .and_then(|s| fsetid_in_status(&s))
            .unwrap_or(false)
}

/// Reads `CAP_FSETID` from the `CapEff:` line of a `/proc/PID/status` text.
fn fsetid_in_status(status: &str) -> Option<bool> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << CAP_FSETID) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_goes_setgid_only_with_group_execute() {
        assert_eq!(without_privs(0o4755), 0o0755);
        assert_eq!(without_privs(0o2755), 0o0755);
        assert_eq!(without_privs(0o6777), 0o0777);
        // setgid without group-execute marks mandatory locking: it stays.
        assert_eq!(without_privs(0o2745), 0o2745);
        assert_eq!(without_privs(0o6745), 0o2745);
        assert_eq!(without_privs(0o1777), 0o1777, "sticky is not a privilege");
        assert!(has_privs(0o4000) && has_privs(0o2010));
        assert!(!has_privs(0o2000) && !has_privs(0o0777));
    }

    #[test]
    fn kill_privs_resolves_without_asking_when_nothing_is_set() {
        assert!(KillPrivs::Yes.applies_to(0o4644));
        assert!(!KillPrivs::Yes.applies_to(0o0755));
        assert!(!KillPrivs::No.applies_to(0o6777));
        // pid 0 is a caller fsd cannot see: treated as unprivileged.
        assert!(KillPrivs::UnlessCallerHasFsetid(0).applies_to(0o4755));
        assert!(!KillPrivs::UnlessCallerHasFsetid(0).applies_to(0o0755));
    }

    #[test]
    fn cap_fsetid_is_bit_four_of_the_effective_set() {
        let status = |eff: &str| {
            format!("Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t{eff}\nCapBnd:\t000001ffffffffff\n")
        };
        assert_eq!(fsetid_in_status(&status("000001ffffffffff")), Some(true));
        assert_eq!(fsetid_in_status(&status("0000000000000010")), Some(true));
        assert_eq!(fsetid_in_status(&status("00000000000000ef")), Some(false));
        assert_eq!(fsetid_in_status(&status("0000000000000000")), Some(false));
        assert_eq!(fsetid_in_status("Name:\tx\n"), None);
        assert_eq!(fsetid_in_status(&status("zz")), None);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let ours = fsetid_in_status(&std::fs::read_to_string("/proc/self/status").unwrap());
        assert_eq!(Some(caller_has_fsetid(std::process::id())), ours);
        assert!(!caller_has_fsetid(u32::MAX), "no such process");
    }
}
