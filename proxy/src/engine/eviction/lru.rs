//! `lru`: every fetched chunk is kept and the least recently used ones make room (the policy of
//! earlier versions, and the reference of the benchmark). Reads count for nothing but the recency
//! order the index keeps, so there is no read clock, no frequency and nothing awaited.

use super::{Cached, Chunks, EvictionPolicy, Promise};

pub struct Lru;

impl EvictionPolicy for Lru {
    fn record_read(&mut self, _id: u128) -> bool {
        false
    }

    fn record_prefetch(&mut self, _id: u128) -> bool {
        false
    }

    fn found_cached(&mut self, _id: u128) {}

    fn forget_prefetch(&mut self, _id: u128) {}

    fn frequency(&self, _id: u128) -> u8 {
        0
    }

    fn clocks_reads(&self) -> bool {
        false
    }

    fn now(&self) -> u32 {
        0
    }

    fn capacity_known(&mut self, _capacity: u64, _chunks: &Chunks, _used: u64) {}

    fn indexed(&mut self, _capacity: Option<u64>, _chunks: &Chunks, _bytes: u64) {}

    /// The least recently used chunks (other than `id`) until it fits; all of them for a chunk
    /// larger than the whole budget, which is still kept (and served once). Never `None`.
    fn victims(
        &self,
        cached: &Cached<'_>,
        id: u128,
        bytes: u64,
        _returning: bool,
        _promised: u64,
    ) -> Option<Vec<(u128, u64)>> {
        let mut over = cached.over_with(Some(id), bytes);
        let mut victims = Vec::new();
        for (victim, entry) in cached.chunks.iter().rev() {
            if over == 0 {
                break;
            }
            if victim != id {
                victims.push((victim, entry.bytes));
                over = over.saturating_sub(entry.bytes);
            }
        }
        Some(victims)
    }

    fn promise(&self, _cached: &Cached<'_>, _id: Option<u128>, _bytes: u64, _promised: u64) -> Promise {
        Promise::Unneeded
    }
}
