//! Waiting for company: a serving thread with one read to answer may wait a few
//! microseconds for the next reads of its CPU's tasks, so that their misses are
//! fetched from remote memory together, and stops waiting for a while where waits
//! gather nothing.

use std::time::Duration;

/// Whether a thread with one read to answer waits a little for company: it sleeps
/// on its ring for up to [`COMPANY_WAIT`], so that the tasks of its CPU its last
/// answers woke can send their next reads, then answers all that came, their
/// misses fetched together. On 2 cores with 4 random 4 KiB readers missing the
/// cache, a thread otherwise answers one read at a time: the others come while it
/// waits on remote memory. It sleeps rather than yields the CPU: a yield to a task
/// that computes gives it a whole time slice, while a sleeper that wakes is soon run
/// (docs/benchmarks-history.md, "A short wait for company").
/// Where waits gather nothing to fetch (one reader, or reads the cache answers),
/// after [`COMPANY_PATIENCE`] such waits in a row it answers the next reads alone
/// at once, [`COMPANY_BACKOFF`] of them and twice as many each time that repeats,
/// so those pay for waiting rarely (a wait that times out costs far more than its
/// length when the CPU went idle meanwhile).
pub(super) struct Company {
    enabled: bool,
    /// Waits in a row that gathered nothing to fetch.
    idle_waits: u32,
    /// Reads alone still to answer at once before waiting again.
    skip: u32,
    /// How many to answer at once after the next idle waits.
    backoff: u32,
}

/// How long a thread with one read to answer waits for others.
pub(super) const COMPANY_WAIT: Duration = Duration::from_micros(5);
/// Waits in a row that gather nothing to fetch before the thread stops waiting for a
/// while: one alone is no sign (the reads it gathered happened to be in the cache).
const COMPANY_PATIENCE: u32 = 3;
/// Reads alone answered at once after [`COMPANY_PATIENCE`] idle waits, the first
/// time; doubled each time up to [`COMPANY_MAX_BACKOFF`], until a wait pays.
const COMPANY_BACKOFF: u32 = 64;
const COMPANY_MAX_BACKOFF: u32 = 4096;

impl Company {
    pub(super) fn new(enabled: bool) -> Company {
        Company {
            enabled,
            idle_waits: 0,
            skip: 0,
            backoff: COMPANY_BACKOFF,
        }
    }

    pub(super) fn worth_waiting(&mut self) -> bool {
        if !self.enabled {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// After a wait: whether it gathered reads that fetched from remote memory
    /// together (company that was worth it).
    pub(super) fn waited(&mut self, fetched_together: bool) {
        if fetched_together {
            self.idle_waits = 0;
            self.backoff = COMPANY_BACKOFF;
            return;
        }
        self.idle_waits += 1;
        if self.idle_waits >= COMPANY_PATIENCE {
            self.idle_waits = 0;
            self.skip = self.backoff;
            self.backoff = (self.backoff * 2).min(COMPANY_MAX_BACKOFF);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_stops_waiting_for_company_after_idle_waits_and_tries_again_later() {
        let mut c = Company::new(true);
        // Waits that gather reads to fetch together go on.
        for _ in 0..100 {
            assert!(c.worth_waiting());
            c.waited(true);
        }
        // Idle waits short of the patience, then a useful one: still waiting.
        for _ in 1..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        assert!(c.worth_waiting());
        c.waited(true);
        // Idle waits in a row: the next reads go at once, then it waits again.
        for _ in 0..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        for _ in 0..COMPANY_BACKOFF {
            assert!(!c.worth_waiting());
        }
        // Idle again: twice as long before the next wait.
        for _ in 0..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        for _ in 0..2 * COMPANY_BACKOFF {
            assert!(!c.worth_waiting());
        }
        // A wait that pays brings the first backoff back.
        assert!(c.worth_waiting());
        c.waited(true);
        for _ in 0..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        assert_eq!(
            (0..).take_while(|_| !c.worth_waiting()).count(),
            COMPANY_BACKOFF as usize
        );
        // A filesystem that gains nothing from reads together never waits.
        let mut off = Company::new(false);
        assert!((0..1000).all(|_| !off.worth_waiting()));
    }
}
