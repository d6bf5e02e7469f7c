//! The thread that ends sessions whose grace period ran out
//! ([`ControlService::reap_expired`]), so memory of a client that never came back is
//! given back about a second after its grace ends, whether or not anyone else talks
//! to the memnode meanwhile.

use crate::control::ControlService;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often expired sessions are looked for.
const EVERY: Duration = Duration::from_millis(200);

/// The running reaper; dropping it stops the thread and waits for it.
pub(crate) struct Reaper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    pub fn start(control: Arc<ControlService>) -> std::io::Result<Reaper> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("session-reaper".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    // Parked rather than asleep, so a stop wakes it at once.
                    std::thread::park_timeout(EVERY);
                    control.reap_expired();
                }
            })?;
        Ok(Reaper {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
