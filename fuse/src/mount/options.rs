//! The generic mount options: what fsd's `-o` takes (and the mount helper passes on
//! from `mount -o` and fstab), and what the kernel is asked for at mount(2).
//!
//! Defaults are libfuse's: `nosuid,nodev` (a FUSE daemon decides what its files say,
//! so a setuid bit or a device node on the mount is honoured only when the
//! administrator asks with `suid` / `dev`), `exec`, `rw`, `relatime`. A later option
//! overrides an earlier one (`ro,rw` is `rw`), as with mount(8). `default_permissions`
//! is always on (fsd leaves permission checks to the kernel) and `allow_other` is
//! implied when root mounts (see [`MountOptions::allow_other`]); both are accepted so
//! that fstab lines written for other FUSE filesystems read naturally.

use thiserror::Error;

/// How access times are kept (fsd applies them itself, see `fsd::atime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atime {
    /// `relatime`: the first access after a change, or once a day (the default).
    Relatime,
    /// `strictatime`: every access.
    Strict,
    /// `noatime`: never.
    Never,
}

/// The generic options of one mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub read_only: bool,
    /// `suid`: setuid and setgid bits take effect on exec (off by default).
    pub suid: bool,
    /// `dev`: device nodes on the mount can be opened (off by default).
    pub dev: bool,
    /// `exec` (the default) or `noexec`.
    pub exec: bool,
    pub atime: Atime,
    pub nodiratime: bool,
    /// `allow_other`: users other than the one who mounted may use the mount. fsd
    /// mounted by root always allows them (and has done so since it first ran as
    /// root); for another user it asks fusermount3 only when this is set.
    pub allow_other: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            suid: false,
            dev: false,
            exec: true,
            atime: Atime::Relatime,
            nodiratime: false,
            allow_other: false,
        }
    }
}

/// An option the generic set does not know.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "unknown mount option {0:?} (known: ro, rw, nosuid, suid, nodev, dev, noexec, exec, \
     relatime, strictatime, noatime, atime, nodiratime, diratime, allow_other, \
     default_permissions)"
)]
pub struct UnknownMountOption(pub String);

impl MountOptions {
    /// The defaults with `list` (comma-separated) applied in order; empty items are
    /// skipped.
    pub fn parse(list: &str) -> Result<MountOptions, UnknownMountOption> {
        let mut options = MountOptions::default();
        options.apply_list(list)?;
        Ok(options)
    }

    /// Applies each option of a comma-separated `list`, in order.
    pub fn apply_list(&mut self, list: &str) -> Result<(), UnknownMountOption> {
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            if !self.apply(opt) {
                return Err(UnknownMountOption(opt.to_string()));
            }
        }
        Ok(())
    }

    /// True for a name [`MountOptions::apply`] takes.
    pub fn is_generic(opt: &str) -> bool {
        MountOptions::default().apply(opt)
    }

    /// Applies one option; false (and no change) if it is not a generic option.
    pub fn apply(&mut self, opt: &str) -> bool {
        match opt {
            "ro" => self.read_only = true,
            "rw" => self.read_only = false,
            "suid" => self.suid = true,
            "nosuid" => self.suid = false,
            "dev" => self.dev = true,
            "nodev" => self.dev = false,
            "exec" => self.exec = true,
            "noexec" => self.exec = false,
            "relatime" => self.atime = Atime::Relatime,
            "strictatime" => self.atime = Atime::Strict,
            "noatime" => self.atime = Atime::Never,
            // mount(8): "do not use the noatime feature"; the kernel then applies
            // its default, relatime.
            "atime" => {
                if self.atime == Atime::Never {
                    self.atime = Atime::Relatime;
                }
            }
            "nodiratime" => self.nodiratime = true,
            "diratime" => self.nodiratime = false,
            "allow_other" => self.allow_other = true,
            // Always on: fsd relies on the kernel's permission checks.
            "default_permissions" => {}
            _ => return false,
        }
        true
    }

    /// The mount(2) flags these options ask for (without `MS_REMOUNT`).
    pub fn flags(&self) -> libc::c_ulong {
        let mut flags = 0;
        for (on, flag) in [
            (self.read_only, libc::MS_RDONLY),
            (!self.suid, libc::MS_NOSUID),
            (!self.dev, libc::MS_NODEV),
            (!self.exec, libc::MS_NOEXEC),
            (self.nodiratime, libc::MS_NODIRATIME),
        ] {
            if on {
                flags |= flag;
            }
        }
        flags
            | match self.atime {
                Atime::Relatime => libc::MS_RELATIME,
                Atime::Strict => libc::MS_STRICTATIME,
                Atime::Never => libc::MS_NOATIME,
            }
    }

    /// The options spelled out in full, in one fixed order (`rw,nosuid,nodev,exec,
    /// relatime`, plus `nodiratime` and `allow_other` when set): what fsd logs and the
    /// helper hands to fsd.
    pub fn to_list(&self) -> String {
        let pick = |on: bool, yes: &'static str, no: &'static str| if on { yes } else { no };
        let mut words = vec![
            pick(self.read_only, "ro", "rw"),
            pick(self.suid, "suid", "nosuid"),
            pick(self.dev, "dev", "nodev"),
            pick(self.exec, "exec", "noexec"),
            match self.atime {
                Atime::Relatime => "relatime",
                Atime::Strict => "strictatime",
                Atime::Never => "noatime",
            },
        ];
        if self.nodiratime {
            words.push("nodiratime");
        }
        if self.allow_other {
            words.push("allow_other");
        }
        words.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_nosuid_nodev_exec_rw_relatime() {
        let d = MountOptions::parse("").unwrap();
        assert_eq!(d, MountOptions::default());
        assert_eq!(d.to_list(), "rw,nosuid,nodev,exec,relatime");
        assert_eq!(
            d.flags(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RELATIME
        );
    }

    #[test]
    fn each_option_sets_its_flag_and_the_last_word_wins() {
        let table: &[(&str, &str, libc::c_ulong)] = &[
            ("ro", "ro,nosuid,nodev,exec,relatime", libc::MS_RDONLY),
            ("ro,rw", "rw,nosuid,nodev,exec,relatime", 0),
            ("suid,dev", "rw,suid,dev,exec,relatime", 0),
            ("suid,nosuid", "rw,nosuid,nodev,exec,relatime", 0),
            ("noexec", "rw,nosuid,nodev,noexec,relatime", libc::MS_NOEXEC),
            (
                "noatime,nodiratime",
                "rw,nosuid,nodev,exec,noatime,nodiratime",
                libc::MS_NOATIME | libc::MS_NODIRATIME,
            ),
            ("noatime,atime", "rw,nosuid,nodev,exec,relatime", 0),
            ("strictatime,atime", "rw,nosuid,nodev,exec,strictatime", 0),
            (
                "strictatime",
                "rw,nosuid,nodev,exec,strictatime",
                libc::MS_STRICTATIME,
            ),
            ("nodiratime,diratime", "rw,nosuid,nodev,exec,relatime", 0),
            (
                "allow_other,default_permissions",
                "rw,nosuid,nodev,exec,relatime,allow_other",
                0,
            ),
            (",,ro,,", "ro,nosuid,nodev,exec,relatime", libc::MS_RDONLY),
        ];
        for &(list, canonical, flag) in table {
            let o = MountOptions::parse(list).unwrap_or_else(|e| panic!("{list}: {e}"));
            assert_eq!(o.to_list(), canonical, "-o {list}");
            assert_eq!(o.flags() & flag, flag, "-o {list} sets {flag:#x}");
            assert_eq!(
                MountOptions::parse(&o.to_list()).unwrap(),
                o,
                "-o {list}: its canonical list reads back the same"
            );
        }
    }

    #[test]
    fn unknown_options_are_named() {
        for bad in ["bogus", "ro,cache=1G", "nosuid,suid=1", "RO"] {
            let err = MountOptions::parse(bad).unwrap_err();
            let word = bad.rsplit(',').next().unwrap();
            assert_eq!(err, UnknownMountOption(word.to_string()), "-o {bad}");
            assert!(err.to_string().contains(word), "{err}");
        }
        assert!(MountOptions::is_generic("nodev"));
        assert!(!MountOptions::is_generic("cache=1G"));
    }
}
