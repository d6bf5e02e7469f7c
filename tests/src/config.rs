//! The fsd and memnode settings many tests share, named once: fsd's block size, the
//! small cache that sends a test's data through the memnode, how soon fsd gives up on
//! an unanswering memnode and declares a killed one lost, the bound on "fails instead
//! of hanging" that goes with them, and the unprivileged user. A test that means the
//! same thing uses these, so the figure lives in one place; a test that needs another
//! value writes its own beside its reason.

use std::time::Duration;

/// fsd's block size in the tests: its default, and what the tests that pass
/// `--block-size` pass ([`BLOCK_SIZE`]).
pub const BLOCK: u64 = 64 << 10;

/// [`BLOCK`] as fsd's `--block-size` takes it.
pub const BLOCK_SIZE: &str = "64K";

/// fsd with a 2 MiB cache of [`BLOCK`]s: a file of a few MiB does not fit, so its
/// data comes back from the memnode.
pub const SMALL_CACHE: [&str; 4] = cache_of("2M");

/// fsd's `--cache SIZE --block-size 64K`: a cache of `size` counted in [`BLOCK`]s.
pub const fn cache_of(size: &str) -> [&str; 4] {
    ["--cache", size, "--block-size", BLOCK_SIZE]
}

/// fsd's `--op-timeout` in the tests of a memnode that stops answering (seconds): an
/// operation on it fails, and a stall this long makes it unreachable, well within
/// [`FAIL_LIMIT`].
pub const OP_TIMEOUT: &str = "2";

/// fsd's `--dead-time` in the tests where a killed memnode is lost, not away for a
/// moment (seconds): 3 s, not 10 minutes.
pub const DEAD_TIME: &str = "3";

/// The bound on "fails instead of hanging" for one operation with [`OP_TIMEOUT`].
pub const FAIL_LIMIT: Duration = Duration::from_secs(30);

/// The unprivileged user (and group) the tests act as: nobody.
pub const NOBODY: u32 = 65534;
