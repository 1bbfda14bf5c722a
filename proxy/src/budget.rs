//! A slot-wide cap on the bytes that clients can make the proxy hold in memory at once (R2): the
//! payloads of `PutData` frames while they are read and written, and chunk fills from the origin
//! while they are fetched and written to disk. Each connection is already bounded (one frame at a
//! time, at most one chunk size per payload); this bounds them together, so thousands of
//! connections each sending 64 MiB, or missing a different 64 MiB chunk, wait their turn instead of
//! taking the node's memory at once. A share is never held while waiting for another one, so
//! holders cannot wait on each other. (A filled chunk's reply to a client that reads slowly is
//! bounded per connection and in time by the I/O timeout, not by this budget.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What one slot may hold at once by default.
pub const DEFAULT_BYTES: u64 = 512 << 20;

/// Budget unit: a byte count is rounded up to whole KiB.
const UNIT: u64 = 1024;

#[derive(Debug, Clone)]
pub struct MemoryBudget {
    sem: Arc<Semaphore>,
    /// The budget's size, in units (less what [`MemoryBudget::split_off`] took).
    units: Arc<AtomicU32>,
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] OwnedSemaphorePermit);

impl MemoryBudget {
    pub fn new(bytes: u64) -> MemoryBudget {
        let units = bytes.div_ceil(UNIT).clamp(1, u64::from(u32::MAX >> 4)) as u32;
        MemoryBudget { sem: Arc::new(Semaphore::new(units as usize)), units: Arc::new(AtomicU32::new(units)) }
    }

    /// Takes `bytes` of this budget (at most all of it but one unit) for good, as a budget of their
    /// own: one kind of holder (a slot's replies to peers) can then never take what another (its
    /// fills) needs to finish, so holders of one that wait on the other cannot wait forever. For
    /// start-up, while nothing is held: what is held now is not taken.
    pub fn split_off(&self, bytes: u64) -> MemoryBudget {
        let units = self.units.load(Ordering::Relaxed);
        let want = bytes.div_ceil(UNIT).min(u64::from(units.saturating_sub(1))) as usize;
        let taken = self.sem.forget_permits(want) as u32;
        self.units.fetch_sub(taken, Ordering::Relaxed);
        MemoryBudget::new(u64::from(taken) * UNIT)
    }

    /// Waits until `bytes` fit, and holds them. A request larger than the whole budget holds all of
    /// it, so it still runs, alone.
    pub async fn hold(&self, bytes: u64) -> Held {
        let units = self.units.load(Ordering::Relaxed);
        let want = bytes.div_ceil(UNIT).clamp(1, u64::from(units)) as u32;
        // The semaphore is never closed, so acquiring cannot fail.
        Held(self.sem.clone().acquire_many_owned(want).await.expect("the budget is never closed"))
    }

    /// Bytes of the budget free now.
    pub fn free(&self) -> u64 {
        self.sem.available_permits() as u64 * UNIT
    }
}

impl Default for MemoryBudget {
    fn default() -> MemoryBudget {
        MemoryBudget::new(DEFAULT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn holds_wait_for_room_and_give_it_back_when_dropped() {
        let budget = MemoryBudget::new(100 * UNIT);
        let a = budget.hold(60 * UNIT).await;
        assert_eq!(budget.free(), 40 * UNIT);
        let blocked = tokio::time::timeout(Duration::from_millis(50), budget.hold(50 * UNIT)).await;
        assert!(blocked.is_err(), "a hold past the budget waits");
        drop(a);
        assert_eq!(budget.free(), 100 * UNIT);
        let _b = budget.hold(50 * UNIT).await;
        // Larger than the whole budget: runs alone rather than never.
        let budget = MemoryBudget::new(10 * UNIT);
        let _all = budget.hold(1 << 30).await;
        assert_eq!(budget.free(), 0);
    }

    #[tokio::test]
    async fn a_budget_split_off_is_taken_from_the_whole_and_each_part_clamps_to_its_own_size() {
        let budget = MemoryBudget::new(100 * UNIT);
        let peers = budget.split_off(40 * UNIT);
        assert_eq!((budget.free(), peers.free()), (60 * UNIT, 40 * UNIT));
        // A hold larger than what is left runs alone within its part, and never waits for the other.
        let _fills = budget.hold(1 << 30).await;
        let _replies = peers.hold(1 << 30).await;
        assert_eq!((budget.free(), peers.free()), (0, 0));
    }
}
