//! [`PerProcess`]: state that belongs to one process and starts afresh in a forked child (a
//! DataLoader worker): the child must neither use the parent's sockets nor report the parent's
//! reads a second time.

use std::sync::{Mutex, MutexGuard};

/// A `T` behind a mutex, reset to `T::default()` the first time a forked child locks it.
pub(crate) struct PerProcess<T> {
    inner: Mutex<(u32, T)>,
}

impl<T: Default> PerProcess<T> {
    pub(crate) fn new() -> PerProcess<T> {
        PerProcess { inner: Mutex::new((std::process::id(), T::default())) }
    }

    /// This process's `T` (dropping, in a forked child, what the parent held: for sockets, only
    /// the child's copies of the descriptors close, the parent's connections stay intact).
    pub(crate) fn lock(&self) -> PerProcessGuard<'_, T> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if guard.0 != pid {
            *guard = (pid, T::default());
        }
        PerProcessGuard(guard)
    }
}

/// The locked `T` of [`PerProcess::lock`].
pub(crate) struct PerProcessGuard<'a, T>(MutexGuard<'a, (u32, T)>);

impl<T> std::ops::Deref for PerProcessGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0 .1
    }
}

impl<T> std::ops::DerefMut for PerProcessGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0 .1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_kept_in_the_process_and_reset_in_a_forked_child() {
        let state: PerProcess<Vec<u32>> = PerProcess::new();
        state.lock().push(7);
        assert_eq!(*state.lock(), vec![7]);
        // What a forked child sees: the parent's pid recorded with the parent's state.
        state.inner.lock().unwrap().0 = std::process::id().wrapping_add(1);
        assert!(state.lock().is_empty(), "a child starts afresh");
        state.lock().push(8);
        assert_eq!(*state.lock(), vec![8]);
    }
}
