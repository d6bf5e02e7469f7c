//! Clearing setuid and setgid ("killing privileges") on write, truncate and chown.
//!
//! fsd negotiates `FUSE_HANDLE_KILLPRIV_V2`, which hands this job to the filesystem.
//! In exchange the kernel marks inodes without setuid, setgid or security xattrs
//! `S_NOSEC` and stops asking for `security.capability` before every write: one
//! FUSE round trip less per `write(2)`. The rules are those of a local Linux
//! filesystem (`setattr_should_drop_suidgid`, `chown_common`), as tmpfs applies them:
//! - on write, truncate and fallocate, only when the caller lacks `CAP_FSETID`:
//!   setuid always, setgid with group-execute, and setgid without group-execute too
//!   when the caller is not in the file's group;
//! - on chown: setuid always, setgid with group-execute;
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
    /// Clear them as chown does.
    Yes,
    /// A write, truncate or fallocate by process `pid`: clear them unless it has
    /// `CAP_FSETID`, setgid without group-execute too if it is not in the file's group.
    UnlessCallerHasFsetid(u32),
    /// The same, for a caller the kernel found lacking `CAP_FSETID` (a write that
    /// carries FUSE_WRITE_KILL_SUIDGID).
    CallerLacksFsetid(u32),
    /// The kernel asked for it (a SETATTR that sets nothing: its file_remove_privs,
    /// or chown(f, -1, -1)): setuid, setgid with group-execute, and setgid without
    /// it if process `pid` is neither in the file's group nor has `CAP_FSETID`.
    KernelAsked(u32),
}

impl KillPrivs {
    /// The permission bits of a file with `perm`, owned by group `gid`, after this;
    /// looks at the caller only when there is something to clear.
    pub fn perm_after(self, perm: u16, gid: u32) -> u16 {
        if perm & (S_ISUID | S_ISGID) == 0 {
            return perm;
        }
        let clear = |pid: u32, capable: &dyn Fn() -> bool| {
            let mut p = without_privs(perm);
            if p & S_ISGID != 0 && !caller_in_group(pid, gid) && !capable() {
                p &= !S_ISGID;
            }
            p
        };
        match self {
            KillPrivs::No => perm,
            KillPrivs::Yes => without_privs(perm),
            KillPrivs::UnlessCallerHasFsetid(pid) if caller_has_fsetid(pid) => perm,
            KillPrivs::UnlessCallerHasFsetid(pid) | KillPrivs::CallerLacksFsetid(pid) => {
                clear(pid, &|| false)
            }
            KillPrivs::KernelAsked(pid) => clear(pid, &|| caller_has_fsetid(pid)),
        }
    }
}

/// Whether process `pid` may keep the setgid bit of a file of group `gid` whose
/// mode it changes (by setting its ACL): in the group or holding `CAP_FSETID`.
pub fn may_keep_setgid(pid: u32, gid: u32) -> bool {
    caller_in_group(pid, gid) || caller_has_fsetid(pid)
}

/// Whether process `pid` is in group `gid` (its filesystem gid or a supplementary
/// group), as `in_group_p` asks. Unknown counts as "no" (then setgid is cleared).
fn caller_in_group(pid: u32, gid: u32) -> bool {
    pid != 0
        && std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"))
            .ok()
            .is_some_and(|s| groups_in_status(&s).contains(&gid))
}

/// The filesystem gid and the supplementary groups of a `/proc/PID/status` text.
fn groups_in_status(status: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for line in status.lines() {
        if let Some(ids) = line.strip_prefix("Gid:") {
            // real, effective, saved, filesystem
            out.extend(
                ids.split_whitespace()
                    .nth(3)
                    .and_then(|g| g.parse::<u32>().ok()),
            );
        } else if let Some(ids) = line.strip_prefix("Groups:") {
            out.extend(ids.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    out
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
    fn kill_privs_resolves_per_change_and_caller() {
        assert_eq!(KillPrivs::Yes.perm_after(0o4644, 0), 0o0644);
        assert_eq!(
            KillPrivs::Yes.perm_after(0o2745, 0),
            0o2745,
            "chown keeps it"
        );
        assert_eq!(KillPrivs::No.perm_after(0o6777, 0), 0o6777);
        // pid 0 is a caller fsd cannot see: unprivileged and in no group, so even
        // setgid without group-execute goes.
        let unseen = KillPrivs::UnlessCallerHasFsetid(0);
        assert_eq!(unseen.perm_after(0o4755, 0), 0o0755);
        assert_eq!(unseen.perm_after(0o2745, 0), 0o0745);
        assert_eq!(unseen.perm_after(0o0755, 0), 0o0755);
        // This test process is in its own filesystem group: setgid without
        // group-execute stays for it, as for a group member on tmpfs.
        let me = std::process::id();
        let my_gid = groups_in_status(&std::fs::read_to_string("/proc/self/status").unwrap())[0];
        let member = KillPrivs::CallerLacksFsetid(me);
        assert_eq!(member.perm_after(0o6745, my_gid), 0o2745);
        assert_eq!(member.perm_after(0o6755, my_gid), 0o0755);
    }

    #[test]
    fn groups_are_the_filesystem_gid_and_the_supplementary_ones() {
        let status = "Uid:\t1\t1\t1\t1\nGid:\t10\t11\t12\t13\nGroups:\t20 21 \n";
        assert_eq!(groups_in_status(status), vec![13, 20, 21]);
        assert_eq!(groups_in_status("Gid:\t5\t5\t5\t5\nGroups:\t\n"), vec![5]);
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
