//! The process's open-file limit, raised to what its connection caps may need.
//!
//! A server that keeps up to N connections needs a descriptor or two per connection
//! beside its own; the usual soft limit (1024) is below what the fabric's caps allow,
//! and a server out of descriptors cannot accept the client it made room for. The
//! soft limit may be raised up to the hard one without privilege, so a server does
//! that once at start, and says so.

/// Raises the soft RLIMIT_NOFILE to at least `need` (as far as the hard limit
/// allows) and logs what it did for `what` (e.g. "1536 fabric connections"). Never
/// lowers it; never fails (a limit it cannot raise is logged as a warning: accepts
/// beyond it fail, are logged and retried).
pub fn ensure(need: usize, what: &str) {
    let need = libc::rlim_t::try_from(need).unwrap_or(libc::rlim_t::MAX);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into a valid, owned struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        log::warn!(
            "cannot read the open-file limit: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let (soft, hard) = (lim.rlim_cur, lim.rlim_max);
    if soft >= need {
        return;
    }
    let want = need.min(hard);
    if want > soft {
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads one valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            log::warn!(
                "cannot raise the open-file limit from {soft} to {want} for {what}: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        log::info!("raised the open-file limit from {soft} to {want} for {what}");
    }
    if want < need {
        log::warn!(
            "the open-file limit is {want} (its hard limit), below the {need} that {what} \
             may need: connections beyond it are refused at accept"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft() -> libc::rlim_t {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `ensure`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        lim.rlim_cur
    }

    #[test]
    fn the_limit_is_raised_never_lowered() {
        let before = soft();
        ensure(1, "nothing");
        assert_eq!(soft(), before, "never lowered");
        ensure(
            usize::try_from(before)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
            "a test",
        );
        assert!(soft() >= before, "raised (or left at the hard limit)");
    }
}
