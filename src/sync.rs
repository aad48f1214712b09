//! The one way this crate takes a lock.
//!
//! Every update the crate makes under a lock completes before anything in it can panic (the
//! policy's transitions, the books of tracking, the registry's assignments), so a lock poisoned
//! by a panic elsewhere on the thread (a notebook cell's, say) guards a consistent value: it is
//! recovered, never passed on as a second panic in the next cell.

use std::sync::{Mutex, MutexGuard};

/// `m`'s guard, recovered from poisoning (see the module docs).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
