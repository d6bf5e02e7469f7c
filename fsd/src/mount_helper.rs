//! `mount.fuse.rmemfs`, the helper mount(8) runs for `mount -t fuse.rmemfs` and for
//! fstab lines of that type: `mount.fuse.rmemfs SOURCE DIR [-o OPTIONS] [-n] [-v]
//! [-s] [-f]` (libmount's calling convention; it looks for `mount.TYPE` in `/sbin`).
//!
//! A mount becomes one fsd process: the SOURCE ([`source`]) names its memnodes and
//! volume, the options ([`options`]) its settings and the kernel's mount options,
//! and [`launch`] starts it detached and returns once the filesystem is live, or
//! with fsd's own error. A remount (`-o remount,...`) never starts fsd: [`remount`]
//! changes the live mount's flags with mount(2). Everything here up to starting a
//! process is plain parsing, tested without a mount; the binary
//! (`src/bin/mount_rmemfs.rs`, installed as `mount.fuse.rmemfs`) only runs [`run`].
//!
//! Exit status follows mount(8)'s: 1 for a bad invocation, option or SOURCE
//! (nothing was started), 32 for a mount that failed.

pub mod launch;
pub mod options;
pub mod remount;
pub mod source;

use crate::daemon;
use clap::Parser;
use options::HelperOptions;
use source::Source;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The name mount(8) runs the helper by.
pub const HELPER_NAME: &str = "mount.fuse.rmemfs";

/// The filesystem type the helper mounts.
pub const FSTYPE: &str = "fuse.rmemfs";

/// Why the helper failed, and so its exit status.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HelperError {
    /// A bad invocation, option or SOURCE: nothing was started (exit 1).
    #[error("{0}")]
    Usage(String),
    /// The mount or remount failed (exit 32).
    #[error("{0}")]
    Failed(String),
}

impl HelperError {
    /// mount(8)'s exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            HelperError::Usage(_) => 1,
            HelperError::Failed(_) => 32,
        }
    }
}

impl From<options::OptionError> for HelperError {
    fn from(e: options::OptionError) -> Self {
        HelperError::Usage(e.to_string())
    }
}

/// One call of the helper, as mount(8) makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub source: String,
    pub dir: PathBuf,
    /// Every `-o` joined with commas.
    pub options: String,
    /// `-f`: do everything but mount.
    pub fake: bool,
    /// `-v`: say what is done.
    pub verbose: bool,
    /// `-s`: tolerate unknown options.
    pub sloppy: bool,
}

const USAGE: &str = "usage: mount.fuse.rmemfs SOURCE DIR [-o OPTIONS] [-n] [-v] [-s] [-f]";

impl Invocation {
    /// Reads the arguments after the program name. `-n` (no mtab) is accepted and
    /// means nothing (there is no mtab to write); `-t` must name rmemfs; `-N`
    /// (another mount namespace) is refused.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Invocation, HelperError> {
        let usage = |why: String| HelperError::Usage(format!("{why}\n{USAGE}"));
        let mut args = args.into_iter().map(|a| {
            a.into_string()
                .map_err(|a| usage(format!("argument {a:?} is not UTF-8")))
        });
        let mut positional = Vec::new();
        let mut options = Vec::new();
        let (mut fake, mut verbose, mut sloppy) = (false, false, false);
        while let Some(arg) = args.next() {
            let arg = arg?;
            let mut value_of = |flag: &str| {
                args.next()
                    .unwrap_or_else(|| Err(usage(format!("{flag} needs a value"))))
            };
            match arg.as_str() {
                "-o" => options.push(value_of("-o")?),
                "-t" => {
                    let t = value_of("-t")?;
                    if t != FSTYPE && t != "rmemfs" {
                        return Err(usage(format!("this helper mounts {FSTYPE}, not {t}")));
                    }
                }
                "-N" => {
                    return Err(usage(
                        "mounting in another mount namespace (-N) is not supported".into(),
                    ))
                }
                "-h" | "--help" => return Err(usage("mounts rmemfs for mount(8)".into())),
                a if a.starts_with("-o") => options.push(a[2..].to_string()),
                a if a.len() > 1 && a.starts_with('-') => {
                    for c in a[1..].chars() {
                        match c {
                            'n' => {}
                            'f' => fake = true,
                            'v' => verbose = true,
                            's' => sloppy = true,
                            _ => return Err(usage(format!("unknown flag -{c}"))),
                        }
                    }
                }
                _ => positional.push(arg),
            }
        }
        let [source, dir]: [String; 2] = positional.try_into().map_err(|p: Vec<String>| {
            usage(format!(
                "expected SOURCE and DIR, got {} arguments",
                p.len()
            ))
        })?;
        Ok(Invocation {
            source,
            dir: PathBuf::from(dir),
            options: options.join(","),
            fake,
            verbose,
            sloppy,
        })
    }
}

/// fsd's arguments for a mount of `source_text` (parsed as `source`) on `dir`:
/// `DIR --fsname SOURCE [-o MOUNT_OPTIONS] [--memnode ADDR]... [--volume NAME]
/// SETTINGS...`.
pub fn fsd_args(
    dir: &Path,
    source_text: &str,
    source: &Source,
    options: &HelperOptions,
) -> Result<Vec<OsString>, HelperError> {
    if let (Some(v), Some(Some(_))) = (&source.volume, options.setting("volume")) {
        return Err(HelperError::Usage(format!(
            "the volume is named twice, {v:?} in the SOURCE and by volume=: name it once"
        )));
    }
    if options.setting("takeover").is_some()
        && source.volume.is_none()
        && options.setting("volume").is_none()
    {
        return Err(HelperError::Usage(
            "takeover takes a volume over: name one in the SOURCE (ADDR/NAME) or with volume="
                .into(),
        ));
    }
    if !source.is_embedded() && options.setting("embedded_size").is_some() {
        return Err(HelperError::Usage(format!(
            "embedded_size= sizes fsd's embedded memnode, but the SOURCE names memnodes; \
             use {} as the SOURCE for the embedded memnode",
            source::EMBEDDED
        )));
    }
    let mut args: Vec<OsString> = vec![dir.into(), "--fsname".into(), source_text.into()];
    if !options.mount.is_empty() {
        args.push("-o".into());
        args.push(options.mount.join(",").into());
    }
    for m in &source.memnodes {
        args.push("--memnode".into());
        args.push(m.into());
    }
    if let Some(v) = &source.volume {
        args.push("--volume".into());
        args.push(v.into());
    }
    args.extend(options.fsd_flags().into_iter().map(OsString::from));
    Ok(args)
}

/// Runs fsd's own command-line parser on `args`, so that a bad value or a
/// combination fsd refuses is reported before anything starts, naming the mount
/// option it came from, with the options' values taken out of fsd's message. (fsd
/// checks ranges and the memnodes itself once started.)
pub fn check_with_fsd(args: &[OsString], options: &HelperOptions) -> Result<(), HelperError> {
    let argv = std::iter::once(OsString::from("fsd")).chain(args.iter().cloned());
    let Err(e) = daemon::Options::try_parse_from(argv) else {
        return Ok(());
    };
    // clap's message without its usage and help lines, on one line.
    let rendered = e.to_string();
    let why = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let why = why.strip_prefix("error: ").unwrap_or(&why);
    let why = options::redact(why, options.values());
    let option = e.get(clap::error::ContextKind::InvalidArg).and_then(|arg| {
        let arg = arg.to_string();
        let flag = arg.split([' ', '=']).next().unwrap_or_default().to_string();
        options.option_of_flag(&flag)
    });
    Err(HelperError::Usage(match option {
        Some(o) => format!("option {o}: {why}"),
        None => format!("fsd refuses these options: {why}"),
    }))
}

/// What the helper does for `inv`; `Ok` once the filesystem is mounted (or
/// remounted).
pub fn run(inv: &Invocation) -> Result<(), HelperError> {
    let options = HelperOptions::parse(&inv.options, inv.sloppy)?;
    for o in &options.sloppy_unknown {
        eprintln!("{HELPER_NAME}: ignoring unknown option {o:?} (-s)");
    }
    if inv.verbose && !options.ignored.is_empty() {
        eprintln!("{HELPER_NAME}: ignoring {}", options.ignored.join(","));
    }
    if options.remount {
        if inv.fake {
            return Ok(());
        }
        return remount::remount(
            &inv.dir,
            &options.mount,
            options.merged_from_mountinfo,
            inv.verbose,
        );
    }
    let source = Source::parse(&inv.source)
        .map_err(|e| HelperError::Usage(format!("SOURCE {:?}: {e}", inv.source)))?;
    let dir = std::fs::canonicalize(&inv.dir)
        .map_err(|e| HelperError::Usage(format!("mount point {}: {e}", inv.dir.display())))?;
    if !dir.is_dir() {
        return Err(HelperError::Usage(format!(
            "mount point {} is not a directory",
            dir.display()
        )));
    }
    let args = fsd_args(&dir, &inv.source, &source, &options)?;
    check_with_fsd(&args, &options)?;
    if inv.fake {
        return Ok(());
    }
    let fsd = launch::find_fsd()?;
    let log = launch::LogTarget::choose(options.log.as_deref(), &dir);
    let timeout = options
        .mount_timeout
        .unwrap_or(options::DEFAULT_MOUNT_TIMEOUT);
    launch::start(&fsd, &args, &dir, &log, timeout, inv.verbose).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(args: &[&str]) -> Result<Invocation, HelperError> {
        Invocation::parse(args.iter().map(OsString::from))
    }

    #[test]
    fn invocations_as_mount_makes_them() {
        let i = inv(&["a:1/v", "/mnt/x", "-o", "rw,cache=1G"]).unwrap();
        assert_eq!(
            i,
            Invocation {
                source: "a:1/v".into(),
                dir: "/mnt/x".into(),
                options: "rw,cache=1G".into(),
                fake: false,
                verbose: false,
                sloppy: false,
            }
        );
        let i = inv(&[
            "-n",
            "-sv",
            "-oro",
            "-o",
            "noexec",
            "-t",
            "fuse.rmemfs",
            "s:1",
            "/d",
            "-f",
        ])
        .unwrap();
        assert_eq!(i.options, "ro,noexec");
        assert!(i.fake && i.verbose && i.sloppy);
        assert_eq!(
            (i.source.as_str(), i.dir.as_path()),
            ("s:1", Path::new("/d"))
        );
    }

    #[test]
    fn bad_invocations_are_usage_errors() {
        for (args, says) in [
            (&["a:1"][..], "expected SOURCE and DIR"),
            (&["a:1", "/d", "/e"][..], "expected SOURCE and DIR"),
            (&["a:1", "/d", "-o"][..], "-o needs a value"),
            (&["a:1", "/d", "-t", "ext4"][..], "not ext4"),
            (&["a:1", "/d", "-N", "/proc/1/ns/mnt"][..], "-N"),
            (&["a:1", "/d", "-x"][..], "unknown flag -x"),
        ] {
            let e = inv(args).unwrap_err();
            assert_eq!(e.exit_code(), 1, "{args:?}");
            assert!(e.to_string().contains(says), "{args:?}: {e}");
        }
    }

    fn args_for(source: &str, options: &str) -> Result<Vec<String>, HelperError> {
        let o = HelperOptions::parse(options, false)?;
        let s = Source::parse(source).map_err(|e| HelperError::Usage(e.to_string()))?;
        let args = fsd_args(Path::new("/mnt/r"), source, &s, &o)?;
        check_with_fsd(&args, &o)?;
        Ok(args.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn a_mount_becomes_fsd_flags() {
        assert_eq!(
            args_for(
                "a:1,b:2/vol",
                "rw,cache=1G,replicas=2,nosuid,writeback_cache,_netdev"
            )
            .unwrap(),
            [
                "/mnt/r",
                "--fsname",
                "a:1,b:2/vol",
                "-o",
                "rw,nosuid",
                "--memnode",
                "a:1",
                "--memnode",
                "b:2",
                "--volume",
                "vol",
                "--cache",
                "1G",
                "--replicas",
                "2",
                "--writeback-cache",
            ]
        );
        assert_eq!(
            args_for("embedded", "volume=v,embedded_size=64M,takeover").unwrap(),
            [
                "/mnt/r",
                "--fsname",
                "embedded",
                "--volume",
                "v",
                "--embedded-size",
                "64M",
                "--takeover",
            ]
        );
    }

    #[test]
    fn what_fsd_would_refuse_is_refused_first_naming_the_option() {
        for (source, options, says) in [
            ("a:1", "cache=lots", "option cache: invalid value '…'"),
            (
                "a:1",
                "fuse_transport=carrier-pigeon",
                "option fuse_transport: invalid value '…'",
            ),
            ("a:1", "threads=many", "option threads: invalid value '…'"),
            ("a:1", "direct_io,writeback_cache", "cannot be used with"),
            ("a:1", "takeover", "takeover takes a volume over"),
            (
                "a:1",
                "token_file=/nonexistent/token",
                "option token_file: invalid value '…' for '--token-file <PATH>': reading the token \
                 file …",
            ),
            ("a:1/v", "volume=w", "named twice"),
            ("a:1", "embedded_size=1G", "embedded_size="),
        ] {
            let e = args_for(source, options).unwrap_err();
            assert_eq!(e.exit_code(), 1, "{source} -o {options}");
            assert!(e.to_string().contains(says), "{source} -o {options}: {e}");
        }
    }

    #[test]
    fn no_refusal_shows_an_options_value() {
        let secret = "hunter2-s3cret";
        for (source, options) in [
            ("a:1", format!("Token={secret}")),
            ("a:1", format!("cache={secret}")),
            ("a:1", format!("token_file=/nonexistent/{secret}")),
            ("a:1", format!("token_file={secret}")),
            ("a:1", format!("replicas={secret}")),
            ("a:1", format!("fuse_transport={secret}")),
            ("a:1/v", format!("volume={secret}")),
            ("a:1", format!("direct_io,writeback_cache,volume={secret}")),
        ] {
            let e = args_for(source, &options).unwrap_err().to_string();
            assert!(!e.contains(secret), "{source} -o {options}: {e}");
        }
    }
}
