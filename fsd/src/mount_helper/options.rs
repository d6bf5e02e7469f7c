//! The `-o` options of `mount -t fuse.rmemfs`, sorted into what goes where.
//!
//! - generic mount options (`ro`, `nosuid`, `noatime`, ... see
//!   [`crate::mount::MountOptions`]) go to the kernel: through fsd's `-o` at mount,
//!   through mount(2) `MS_REMOUNT` at a remount. mount(8) never passes a helper the
//!   words for flags that are off (`suid`, `dev`, `exec`, `atime`, `diratime`: it
//!   turns options into flags and back), so `allow_suid` and `allow_dev` stand for
//!   `suid` and `dev`, which rmemfs does not have by default (as MooseFS's `mfssuid`
//!   does for the same reason);
//! - fsd's settings (`cache=1G`, `replicas=2`, `writeback_cache`, ... the
//!   [`SETTINGS`] table) become fsd's command-line flags; `-` and `_` are the same in
//!   their names (`block-size=` is `block_size=`). A setting given twice takes the
//!   last value, as mount(8) does with its own options;
//! - the helper's own: `log=PATH` (fsd's log file), `mount_timeout=SECS`;
//! - `remount` makes the call a remount of a live mount;
//! - mount(8) and systemd comment options (`_netdev`, `nofail`, `noauto`, `auto`,
//!   `defaults`, `x-*`, `X-*`, `comment=`) are ignored: they are for mount(8) and
//!   systemd, which act on them before the helper runs (`defaults` does not turn
//!   `suid` or `dev` on here: rmemfs's defaults are `nosuid,nodev`);
//! - anything else is an error naming the option (with `-s`, sloppy, a warning).
//!
//! `token=` (in any case) is refused: a mount option shows in `ps`, in `/etc/fstab`
//! (readable by all) and in mount(8)'s messages. `token_file=PATH` names a file (mode
//! 600) whose one line fsd reads, so the secret appears nowhere else.
//!
//! No message or log line of the helper's shows what follows an option's `=`, only
//! its name ([`name_of`]): a secret given to the wrong option, or under a name it
//! does not know (`Token=...`, `password=...`), must not land in the error, the
//! journal or mount(8)'s output. [`redact`] takes values out of messages written by
//! others (fsd's command-line parser).

use crate::mount::MountOptions;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// How long the helper waits for fsd to mount unless `mount_timeout=` says otherwise:
/// long enough to open a large volume (replaying its log), short enough that a
/// stuck start does not hang boot.
pub const DEFAULT_MOUNT_TIMEOUT: Duration = Duration::from_secs(120);

/// One fsd setting: its option name and fsd's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    pub flag: &'static str,
    /// `name=VALUE` (true) or a bare `name` (false).
    pub takes_value: bool,
}

const fn valued(name: &'static str, flag: &'static str) -> Setting {
    Setting {
        name,
        flag,
        takes_value: true,
    }
}

const fn switch(name: &'static str, flag: &'static str) -> Setting {
    Setting {
        name,
        flag,
        takes_value: false,
    }
}

/// fsd's settings that mount options reach (fsd's `--help` says what each does).
/// The memnodes come from the SOURCE, never from an option.
pub const SETTINGS: &[Setting] = &[
    valued("cache", "--cache"),
    valued("block_size", "--block-size"),
    valued("chunk_size", "--chunk-size"),
    valued("embedded_size", "--embedded-size"),
    valued("replicas", "--replicas"),
    valued("rereplication_rate", "--rereplication-rate"),
    valued("scrub_rate", "--scrub-rate"),
    valued("token_file", "--token-file"),
    valued("op_timeout", "--op-timeout"),
    valued("dead_time", "--dead-time"),
    valued("unreachable_timeout", "--unreachable-timeout"),
    valued("threads", "--threads"),
    valued("ring_threads", "--ring-threads"),
    valued("connections", "--connections"),
    valued("flush_interval", "--flush-interval"),
    valued("transport", "--transport"),
    valued("fuse_transport", "--fuse-transport"),
    valued("poll_us", "--poll-us"),
    valued("stats_file", "--stats-file"),
    valued("volume", "--volume"),
    switch("takeover", "--takeover"),
    switch("degraded", "--degraded"),
    valued("mount_wait", "--mount-wait"),
    switch("no_xattrs", "--no-xattrs"),
    switch("direct_io", "--direct-io"),
    switch("page_cache", "--page-cache"),
    switch("writeback_cache", "--writeback-cache"),
    switch("for_swap", "--for-swap"),
    valued("metrics", "--metrics"),
];

/// Settings whose value is a path: made absolute from the caller's directory,
/// since fsd runs from `/`.
const PATH_SETTINGS: &[&str] = &["token_file", "stats_file"];

/// Options read by the kernel's FUSE module that mount(8) may hand back at a
/// remount (from `/proc/self/mountinfo`); they cannot change and are ignored then.
const KERNEL_FUSE_OPTIONS: &[&str] = &["user_id", "group_id", "rootmode", "max_read", "blksize"];

/// The options sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelperOptions {
    /// Generic mount options, in the order given.
    pub mount: Vec<String>,
    /// fsd settings with their values (None for a switch), in the order first given.
    pub settings: Vec<(Setting, Option<String>)>,
    /// `remount` was given.
    pub remount: bool,
    /// `log=PATH`.
    pub log: Option<PathBuf>,
    /// `mount_timeout=SECS`.
    pub mount_timeout: Option<Duration>,
    /// The names of the options ignored: comment options, and at a remount the
    /// kernel's own.
    pub ignored: Vec<String>,
    /// At a remount, the FUSE module's own options came along: mount(8) merged the
    /// list from `/proc/self/mountinfo` (see `super::remount`).
    pub merged_from_mountinfo: bool,
    /// The names of the unknown options let through by `-s` (sloppy).
    pub sloppy_unknown: Vec<String>,
}

/// Why the options were refused; the message names the option, never its value.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OptionError {
    #[error("unknown option {0:?} (see docs/mounting.md for the options rmemfs takes)")]
    Unknown(String),
    #[error(
        "option {0:?}: a token in the mount options would show in ps, /etc/fstab and \
         mount's messages; put it in a file (one line, mode 600) and use token_file=PATH"
    )]
    TokenInOptions(String),
    #[error("option {0:?} needs a value: {0}=VALUE")]
    NeedsValue(String),
    #[error("option {0:?} takes no value")]
    TakesNoValue(String),
    #[error("option {option:?}: {why}")]
    BadValue { option: String, why: String },
}

impl HelperOptions {
    /// Sorts the comma-separated `list` (every `-o` joined). `sloppy` (mount's `-s`)
    /// lets unknown options through with a warning instead of failing.
    pub fn parse(list: &str, sloppy: bool) -> Result<HelperOptions, OptionError> {
        // Known first: mount(8) may put the kernel's options before `remount`.
        let mut out = HelperOptions {
            remount: list.split(',').any(|o| o == "remount"),
            ..HelperOptions::default()
        };
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            out.take(opt, sloppy)?;
        }
        Ok(out)
    }

    fn take(&mut self, opt: &str, sloppy: bool) -> Result<(), OptionError> {
        if MountOptions::is_generic(opt) {
            self.mount.push(opt.to_string());
            return Ok(());
        }
        if let Some(word) = opt
            .strip_prefix("allow_")
            .filter(|w| matches!(*w, "suid" | "dev"))
        {
            self.mount.push(word.to_string());
            return Ok(());
        }
        if is_comment(opt) {
            self.ignored.push(name_of(opt).to_string());
            return Ok(());
        }
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let name = key.replace('-', "_");
        match (name.as_str(), value) {
            ("remount", None) => self.remount = true,
            (token, _) if token.eq_ignore_ascii_case("token") => {
                return Err(OptionError::TokenInOptions(key.into()))
            }
            ("log", Some(path)) if !path.is_empty() => self.log = Some(absolute(path)),
            ("mount_timeout", Some(secs)) => {
                self.mount_timeout =
                    Some(parse_timeout(secs).ok_or_else(|| OptionError::BadValue {
                        option: name.clone(),
                        why: "a number of seconds from 1 to 3600".into(),
                    })?)
            }
            ("log" | "mount_timeout", _) => return Err(OptionError::NeedsValue(name)),
            ("remount", Some(_)) => return Err(OptionError::TakesNoValue(name)),
            (kernel, Some(_)) if self.remount && KERNEL_FUSE_OPTIONS.contains(&kernel) => {
                self.merged_from_mountinfo = true;
                self.ignored.push(key.to_string())
            }
            _ => {
                let Some(setting) = SETTINGS.iter().find(|s| s.name == name) else {
                    if sloppy {
                        self.sloppy_unknown.push(key.to_string());
                        return Ok(());
                    }
                    return Err(OptionError::Unknown(key.into()));
                };
                let value = match (setting.takes_value, value) {
                    (true, Some(v)) if !v.is_empty() => {
                        Some(if PATH_SETTINGS.contains(&setting.name) {
                            absolute(v).to_string_lossy().into_owned()
                        } else {
                            v.to_string()
                        })
                    }
                    (true, _) => return Err(OptionError::NeedsValue(name)),
                    (false, None) => None,
                    (false, Some(_)) => return Err(OptionError::TakesNoValue(name)),
                };
                match self
                    .settings
                    .iter_mut()
                    .find(|(s, _)| s.name == setting.name)
                {
                    Some(slot) => slot.1 = value,
                    None => self.settings.push((*setting, value)),
                }
            }
        }
        Ok(())
    }

    /// The value of setting `name` (`Some(None)` for a switch that was given).
    pub fn setting(&self, name: &str) -> Option<Option<&str>> {
        self.settings
            .iter()
            .find(|(s, _)| s.name == name)
            .map(|(_, v)| v.as_deref())
    }

    /// fsd's flags for the settings, in order (`--cache 1G --writeback-cache`).
    pub fn fsd_flags(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (setting, value) in &self.settings {
            args.push(setting.flag.to_string());
            if let Some(v) = value {
                args.push(v.clone());
            }
        }
        args
    }

    /// The name of the option whose fsd flag is `flag` (`--cache` -> `cache`), for
    /// messages.
    pub fn option_of_flag(&self, flag: &str) -> Option<&'static str> {
        self.settings
            .iter()
            .find(|(s, _)| s.flag == flag)
            .map(|(s, _)| s.name)
    }

    /// The values of the settings, as given to fsd: what [`redact`] takes out of
    /// messages about them.
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.settings.iter().filter_map(|(_, v)| v.as_deref())
    }
}

/// An option's name: what comes before its `=`, the only part a message shows.
pub fn name_of(opt: &str) -> &str {
    opt.split_once('=').map_or(opt, |(name, _)| name)
}

/// `text` with every occurrence of each of `values` (as it is and as Rust's `{:?}`
/// escapes it) that stands apart from letters and digits replaced by `…`: the
/// values of options taken out of a message someone else wrote.
pub fn redact<'a>(text: &str, values: impl IntoIterator<Item = &'a str>) -> String {
    let mut values: Vec<String> = values
        .into_iter()
        .filter(|v| !v.is_empty())
        .flat_map(|v| [v.to_string(), v.escape_debug().to_string()])
        .collect();
    // Longest first, so that a value inside another goes with it.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut out = text.to_string();
    for v in &values {
        out = replace_standalone(&out, v);
    }
    out
}

/// `text` with the occurrences of `word` not inside a run of letters and digits
/// replaced by `…`.
fn replace_standalone(text: &str, word: &str) -> String {
    let joins = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = if at > 0 {
            rest[..at].chars().next_back()
        } else {
            out.chars().next_back()
        };
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if joins(before) && word.starts_with(char::is_alphanumeric)
            || joins(after) && word.ends_with(char::is_alphanumeric)
        {
            // Part of a longer word: not this value.
            let first = word.chars().next().map_or(1, char::len_utf8);
            out.push_str(&word[..first]);
            rest = &rest[at + first..];
        } else {
            out.push('…');
            rest = &rest[at + word.len()..];
        }
    }
    out.push_str(rest);
    out
}

/// mount(8)'s and systemd's own options, which mean nothing to rmemfs.
fn is_comment(opt: &str) -> bool {
    matches!(opt, "_netdev" | "nofail" | "noauto" | "auto" | "defaults")
        || opt.starts_with("x-")
        || opt.starts_with("X-")
        || opt.starts_with("comment=")
}

fn parse_timeout(secs: &str) -> Option<Duration> {
    let s: u64 = secs.parse().ok()?;
    (1..=3600).contains(&s).then(|| Duration::from_secs(s))
}

/// `path` made absolute from the current directory (left as it is if that is
/// unknown).
fn absolute(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        return p;
    }
    std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &str) -> HelperOptions {
        HelperOptions::parse(list, false).unwrap_or_else(|e| panic!("-o {list}: {e}"))
    }

    #[test]
    fn options_are_sorted_into_kernel_fsd_helper_and_ignored() {
        let o = parse(
            "rw,nosuid,cache=1G,_netdev,nofail,noauto,defaults,x-systemd.automount,\
             X-mount.mkdir,comment=hi,replicas=2,block-size=16K,writeback_cache,\
             fuse_transport=classic,threads=2,ring_threads=3,scrub_rate=0,noatime,takeover,volume=v,\
             log=/var/log/x.log,mount_timeout=30,transport=tcp,suid,allow_dev,allow_suid",
        );
        assert_eq!(o.mount, ["rw", "nosuid", "noatime", "suid", "dev", "suid"]);
        assert_eq!(
            o.fsd_flags(),
            [
                "--cache",
                "1G",
                "--replicas",
                "2",
                "--block-size",
                "16K",
                "--writeback-cache",
                "--fuse-transport",
                "classic",
                "--threads",
                "2",
                "--ring-threads",
                "3",
                "--scrub-rate",
                "0",
                "--takeover",
                "--volume",
                "v",
                "--transport",
                "tcp",
            ]
        );
        assert_eq!(
            o.ignored,
            [
                "_netdev",
                "nofail",
                "noauto",
                "defaults",
                "x-systemd.automount",
                "X-mount.mkdir",
                "comment",
            ]
        );
        assert_eq!(o.log, Some(PathBuf::from("/var/log/x.log")));
        assert_eq!(o.mount_timeout, Some(Duration::from_secs(30)));
        assert!(!o.remount);
        assert_eq!(o.setting("volume"), Some(Some("v")));
        assert_eq!(o.setting("takeover"), Some(None));
        assert_eq!(o.setting("cache"), Some(Some("1G")));
        assert_eq!(o.setting("stats_file"), None);
        assert_eq!(o.option_of_flag("--block-size"), Some("block_size"));
    }

    #[test]
    fn every_setting_maps_to_its_fsd_flag() {
        for s in SETTINGS {
            let opt = if s.takes_value {
                format!("{}=/x", s.name)
            } else {
                s.name.to_string()
            };
            let o = parse(&opt);
            assert_eq!(o.fsd_flags()[0], s.flag, "-o {opt}");
            assert_eq!(
                o.fsd_flags().len(),
                1 + usize::from(s.takes_value),
                "-o {opt}"
            );
            // fsd's flag is the option's name in fsd's spelling.
            assert_eq!(s.flag, format!("--{}", s.name.replace('_', "-")));
        }
    }

    #[test]
    fn a_setting_given_twice_takes_the_last_value() {
        let o = parse("cache=1G,replicas=2,cache=2G");
        assert_eq!(o.fsd_flags(), ["--cache", "2G", "--replicas", "2"]);
    }

    #[test]
    fn path_values_are_made_absolute() {
        let o = parse("token_file=token,stats_file=/run/s.json,log=l.log");
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            o.setting("token_file"),
            Some(Some(cwd.join("token").to_str().unwrap()))
        );
        assert_eq!(o.setting("stats_file"), Some(Some("/run/s.json")));
        assert_eq!(o.log, Some(cwd.join("l.log")));
    }

    #[test]
    fn remount_takes_the_kernel_options_mount_hands_back() {
        let o = parse("ro,user_id=0,group_id=0,remount,cache=1G,allow_other,default_permissions");
        assert!(o.remount && o.merged_from_mountinfo);
        assert_eq!(o.mount, ["ro", "allow_other", "default_permissions"]);
        assert_eq!(o.ignored, ["user_id", "group_id"]);
        let o = parse("ro,remount,_netdev,cache=1G");
        assert!(o.remount && !o.merged_from_mountinfo, "from fstab");
        assert_eq!(
            HelperOptions::parse("user_id=0", false),
            Err(OptionError::Unknown("user_id".into())),
            "not at a mount"
        );
    }

    #[test]
    fn bad_options_are_named() {
        use OptionError::*;
        let table: &[(&str, OptionError)] = &[
            ("bogus", Unknown("bogus".into())),
            ("rw,cache=1G,bogus=3", Unknown("bogus".into())),
            ("memnode=a:1", Unknown("memnode".into())),
            ("allow_exec", Unknown("allow_exec".into())),
            ("token=s3cret", TokenInOptions("token".into())),
            ("Token=s3cret", TokenInOptions("Token".into())),
            ("TOKEN=s3cret", TokenInOptions("TOKEN".into())),
            ("cache", NeedsValue("cache".into())),
            ("cache=", NeedsValue("cache".into())),
            ("token_file", NeedsValue("token_file".into())),
            ("log", NeedsValue("log".into())),
            ("mount_timeout", NeedsValue("mount_timeout".into())),
            ("takeover=yes", TakesNoValue("takeover".into())),
            ("writeback_cache=1", TakesNoValue("writeback_cache".into())),
            ("remount=1", TakesNoValue("remount".into())),
            (
                "mount_timeout=0",
                BadValue {
                    option: "mount_timeout".into(),
                    why: "a number of seconds from 1 to 3600".into(),
                },
            ),
        ];
        for (list, want) in table {
            let got = HelperOptions::parse(list, false).expect_err(list);
            assert_eq!(&got, want, "-o {list}");
        }
        let token = HelperOptions::parse("token=s3cret", false)
            .unwrap_err()
            .to_string();
        assert!(token.contains("token_file"), "{token}");
    }

    #[test]
    fn sloppy_lets_unknown_options_through() {
        let o = HelperOptions::parse("bogus,cache=1G,frob=2", true).unwrap();
        assert_eq!(o.sloppy_unknown, ["bogus", "frob"]);
        assert_eq!(o.fsd_flags(), ["--cache", "1G"]);
        // Sloppiness does not extend to secrets.
        assert!(HelperOptions::parse("token=x", true).is_err());
        assert!(HelperOptions::parse("Token=x", true).is_err());
    }

    #[test]
    fn no_message_about_an_option_shows_its_value() {
        let secret = "hunter2-s3cret";
        for list in [
            format!("Token={secret}"),
            format!("password={secret}"),
            format!("cache=1G,auth_token={secret}"),
            format!("mount_timeout={secret}"),
            format!("remount={secret}"),
            format!("takeover={secret}"),
            format!("x-systemd.requires={secret},comment={secret}"),
            format!("remount,user_id={secret}"),
        ] {
            let shown = match HelperOptions::parse(&list, false) {
                Err(e) => e.to_string(),
                Ok(o) => format!("{:?} {:?}", o.ignored, o.sloppy_unknown),
            };
            assert!(!shown.contains(secret), "-o {list}: {shown}");
            let sloppy = HelperOptions::parse(&list, true)
                .map(|o| format!("{:?} {:?}", o.ignored, o.sloppy_unknown))
                .unwrap_or_else(|e| e.to_string());
            assert!(!sloppy.contains(secret), "-s -o {list}: {sloppy}");
        }
    }

    #[test]
    fn redact_takes_out_values_that_stand_apart_and_leaves_longer_words() {
        assert_eq!(
            redact("invalid value 'lots' for '--cache <SIZE>'", ["lots"]),
            "invalid value '…' for '--cache <SIZE>'"
        );
        assert_eq!(
            redact("reading the token file /d/s3cret: not found", ["/d/s3cret"]),
            "reading the token file …: not found"
        );
        // Inside a longer word or number, a short value stays.
        assert_eq!(
            redact("0 is not in 1..=1024", ["0"]),
            "… is not in 1..=1024"
        );
        // As `{:?}` escapes it, too.
        assert_eq!(redact(r#"a "q\"x" b"#, [r#"q"x"#]), r#"a "…" b"#);
        assert_eq!(redact("nothing here", ["", "zz"]), "nothing here");
    }
}
