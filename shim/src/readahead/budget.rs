//! The memory every read-ahead window of a process may hold at once ([`ShimConfig::readahead_memory`]
//! (crate::ShimConfig::readahead_memory)): a chunk buffer a window keeps (fetched ahead, in flight,
//! held for the reader, or kept for reuse) holds a lease on it. With no room left, a reader's chunk
//! is fetched for that read alone and nothing is read ahead, so memory stays bounded whatever the
//! number of open streams and files.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

/// Bytes taken from a [`Budget`], given back when dropped.
pub struct Lease {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget { limit, used: AtomicU64::new(0) })
    }

    /// `bytes` if they fit under the limit.
    pub fn take(self: &Arc<Budget>, bytes: u64) -> Option<Lease> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(bytes).filter(|&n| n <= self.limit)?;
            match self.used.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(Lease { budget: self.clone(), bytes }),
                Err(now) => used = now,
            }
        }
    }

    /// Bytes leased now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_stay_under_the_limit_and_come_back() {
        let b = Budget::new(10);
        let a = b.take(6).unwrap();
        assert!(b.take(5).is_none());
        let c = b.take(4).unwrap();
        assert_eq!(b.used(), 10);
        drop(a);
        drop(c);
        assert_eq!(b.used(), 0);
        assert!(b.take(11).is_none());
    }
}
