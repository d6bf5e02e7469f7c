//! The one way rmemfs takes a lock: [`lock`], [`read`] and [`write`] (and [`wait`] and
//! [`wait_timeout`] on a condition variable) carry on when a thread that panicked while
//! holding the lock poisoned it.
//!
//! Every mutex of the daemons guards data that is consistent at each unlock point
//! (single inserts, removes and field updates; nothing is left half-changed across a
//! call that can panic), so a poisoned lock holds nothing worse than an unpoisoned
//! one. Refusing it would turn one thread's panic into every other thread's, and take
//! down a daemon that serves many clients or a mount that holds a user's files.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::{PoisonError, WaitTimeoutResult};
use std::time::Duration;

/// Locks `m`, ignoring poisoning (see the module's comment for why that is sound).
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `l` to read, ignoring poisoning.
#[inline]
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `l` to write, ignoring poisoning.
#[inline]
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `g`, ignoring poisoning.
#[inline]
pub fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `g` while `condition` holds, for at most `d`, ignoring poisoning.
#[inline]
pub fn wait_timeout_while<'a, T, F: FnMut(&mut T) -> bool>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    d: Duration,
    condition: F,
) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
    cv.wait_timeout_while(g, d, condition)
        .unwrap_or_else(PoisonError::into_inner)
}

/// The data of a mutex held exclusively (`&mut`), ignoring poisoning.
#[inline]
pub fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `g` for at most `d`, ignoring poisoning.
#[inline]
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    d: Duration,
) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
    cv.wait_timeout(g, d)
        .unwrap_or_else(PoisonError::into_inner)
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
        let cv = Condvar::new();
        let (g, timed_out) = wait_timeout(&cv, lock(&m), Duration::from_millis(1));
        assert!(timed_out.timed_out());
        assert_eq!(*g, 2);
    }

    #[test]
    fn a_poisoned_rwlock_is_still_taken() {
        let l = std::sync::Arc::new(RwLock::new(1));
        let held = l.clone();
        let _ = std::thread::spawn(move || {
            let _g = held.write().unwrap();
            panic!("poisons the lock (this panic is the test's)");
        })
        .join();
        assert!(l.is_poisoned());
        *write(&l) += 1;
        assert_eq!(*read(&l), 2);
    }
}
