//! The one way rmemfs takes a mutex: [`lock`] carries on when a thread that panicked
//! while holding it poisoned it.
//!
//! Every mutex of the daemons guards data that is consistent at each unlock point
//! (single inserts, removes and field updates; nothing is left half-changed across a
//! call that can panic), so a poisoned lock holds nothing worse than an unpoisoned
//! one. Refusing it would turn one thread's panic into every other thread's, and take
//! down a daemon that serves many clients or a mount that holds a user's files.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning (see the module's comment for why that is sound).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = held.lock().unwrap();
            panic!("poisons the mutex (this panic is the test's)");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
