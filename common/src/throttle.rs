//! Log lines about events that a peer can repeat at will (connections refused,
//! closed before their Hello, evicted to make room), at most one per interval.
//!
//! A flood of a thousand idle sockets would otherwise write a thousand lines, which
//! costs the daemon more than the sockets do and buries what an operator needs to
//! see. The first event logs at once; the ones that follow within the interval are
//! only counted, and the next line says how many there were. (A flood that stops
//! leaves its last count unsaid until the next event: no timer thread is worth that.)

use crate::sync::lock;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often each kind of repeated event may log: often enough to see a flood
/// start and go on, rarely enough that it cannot fill a log.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// One kind of repeated event's log lines.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Option<Instant>,
    unlogged: u64,
}

impl Throttle {
    /// At most one line per `every`.
    pub const fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            state: Mutex::new(State {
                last: None,
                unlogged: 0,
            }),
        }
    }

    /// Counts an event. `Some(n)` when it is to be logged now, `n` being how many
    /// events like it went unlogged since the last line (see [`and_more`]); `None`
    /// when it stays quiet.
    pub fn check(&self) -> Option<u64> {
        let now = Instant::now();
        let mut s = lock(&self.state);
        match s.last {
            Some(last) if now.duration_since(last) < self.every => {
                s.unlogged += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.unlogged))
            }
        }
    }
}

/// The tail of a throttled line: `""`, or ` (and N more like it since the last such
/// line)`.
pub fn and_more(unlogged: u64) -> String {
    match unlogged {
        0 => String::new(),
        n => format!(" (and {n} more like it since the last such line)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_event_logs_and_the_next_ones_are_counted_until_the_interval_passes() {
        let t = Throttle::new(Duration::from_millis(50));
        assert_eq!(t.check(), Some(0));
        assert_eq!(t.check(), None);
        assert_eq!(t.check(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.check(), Some(2));
        assert_eq!(t.check(), None);
        assert_eq!(and_more(0), "");
        assert!(and_more(2).contains("2 more"));
    }
}
