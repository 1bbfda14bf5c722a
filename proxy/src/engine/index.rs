//! The chunk index of one slot: which chunks it owns, how many bytes they take on disk, in which
//! order they were last read, and the room promised to prefetches, within the slot's share of the
//! fleet capacity. What to keep when it is full is its eviction policy's call (`eviction/`: what a
//! read counts for, the victims that make room for a fetched chunk, whether it is kept at all).
//!
//! Before it fetches, a prefetch (`prefetch.rs`) asks whether the chunk would be kept
//! ([`ChunkIndex::promise`]); if not, it leaves the chunk to the client's read, which fetches it
//! once, rather than fetch it for nothing and have the read fetch it again. A chunk a prefetch read
//! or found cached ([`ChunkIndex::hint`]) is awaited by the policy until its read comes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::chunk_map::ChunkMap;
pub use super::eviction::Eviction;
use super::eviction::{self, Cached, EvictionPolicy, Promise};

/// LRU index over chunk ids with byte accounting. Not thread-safe; the cache wraps it in a mutex and
/// holds the lock only for these short operations.
pub struct ChunkIndex {
    /// The chunks, in recency order, and their placements (`chunk_map.rs`).
    chunks: ChunkMap,
    /// Bytes of the chunks, as they hold them.
    used: u64,
    capacity: Option<u64>,
    policy: Box<dyn EvictionPolicy>,
    /// Room promised to prefetches being fetched ([`ChunkIndex::promise`]), not indexed yet, by
    /// what it is for (a chunk's id, or the first read of a cold object), and its sum.
    promises: HashMap<u128, u64>,
    promised: u64,
    /// Bytes of the capacity kept free of chunks: the room packed segments keep for dead records
    /// and compactions (`chunk_store/segments.rs`), as it changes with what they hold.
    reserved: Option<Arc<AtomicU64>>,
}

impl Default for ChunkIndex {
    fn default() -> Self {
        ChunkIndex::new(Eviction::default())
    }
}

impl ChunkIndex {
    pub fn new(policy: Eviction) -> ChunkIndex {
        ChunkIndex {
            chunks: ChunkMap::default(),
            used: 0,
            capacity: None,
            policy: eviction::policy(policy),
            promises: HashMap::new(),
            promised: 0,
            reserved: None,
        }
    }

    /// Whether the policy keeps a read clock: then what [`ChunkIndex::record_read`] says tells a
    /// re-read from a first read.
    pub fn clocks_reads(&self) -> bool {
        self.policy.clocks_reads()
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Makes room for `more` chunks at once (`ChunkMap::reserve`).
    pub fn reserve(&mut self, more: usize) {
        self.chunks.reserve(more);
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// Keeps what `gauge` says free of chunks, as it changes (see `reserved`).
    pub fn set_reserve(&mut self, gauge: Option<Arc<AtomicU64>>) {
        self.reserved = gauge;
    }

    fn reserved(&self) -> u64 {
        self.reserved.as_ref().map_or(0, |g| g.load(Ordering::Relaxed))
    }

    /// Sets the byte budget; `None` disables eviction (until the capacity is known). The policy
    /// learns it, and how many chunks of how many bytes are indexed, to size what it counts.
    pub fn set_capacity(&mut self, capacity: Option<u64>) {
        self.capacity = capacity;
        if let Some(capacity) = capacity {
            self.policy.capacity_known(capacity, &self.chunks, self.used);
        }
    }

    /// Counts a read of `id` (a hit or a miss) for the policy. Returns whether a previous read of it
    /// is on record (`returning`, for [`ChunkIndex::admit`]: this read is the one on record from now
    /// on). A client's read of a chunk a prefetch read for it is not counted again: the prefetch's
    /// was this read, made early.
    pub fn record_read(&mut self, id: u128) -> bool {
        self.policy.record_read(id)
    }

    /// [`ChunkIndex::record_read`] of a read a prefetch makes for a client: counted now, and the
    /// client's own read of `id` is not counted when it comes. Awaited until then.
    pub fn record_prefetch(&mut self, id: u128) -> bool {
        self.policy.record_prefetch(id)
    }

    /// A prefetch found `id` cached: it is marked recently used and awaited (nobody's victim) until
    /// its read comes, which is counted then. False if it is not cached.
    pub fn hint(&mut self, id: u128) -> bool {
        if !self.touch(id) {
            return false;
        }
        self.policy.found_cached(id);
        true
    }

    /// How long an awaited chunk is kept from eviction (tests shorten `AWAITED_FOR`).
    #[cfg(test)]
    pub fn set_awaited_for(&mut self, d: std::time::Duration) {
        self.policy.set_awaited_for(d);
    }

    /// A client's read of `id` that a prefetch counted came (it joined the prefetch's fetch).
    pub fn forget_prefetch(&mut self, id: u128) {
        self.policy.forget_prefetch(id);
    }

    /// How often `id` was read lately, as the policy estimates it.
    pub fn frequency(&self, id: u128) -> u8 {
        self.policy.frequency(id)
    }

    pub fn contains(&self, id: u128) -> bool {
        self.chunks.contains(id)
    }

    /// Whether some version of the chunk with this placement (the id's upper half: object and
    /// chunk number, any version) is indexed.
    pub fn has_placement(&self, placement: u64) -> bool {
        self.chunks.contains_placement(placement)
    }

    /// Marks `id` most recently used; false if absent. (Reorders only: reads are counted by
    /// [`ChunkIndex::record_read`].)
    pub fn touch(&mut self, id: u128) -> bool {
        let now = self.policy.now();
        self.chunks.promote(id, now)
    }

    /// Every id, most recently used first.
    pub fn ids_most_recent_first(&self) -> Vec<u128> {
        self.chunks.iter().map(|(id, _)| id).collect()
    }

    /// Inserts or replaces `id` as most recently used. A chunk's bytes on disk fit in 32 bits (it
    /// is at most 64 MiB and its header); were a larger one found on disk, it would be counted as
    /// 4 GiB, here and in `used` alike.
    pub fn insert(&mut self, id: u128, bytes: u64) {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        if let Some(old) = self.chunks.put(id, bytes, self.policy.now()) {
            self.used -= old.bytes;
        }
        self.used += u64::from(bytes);
        self.policy.indexed(self.capacity, &self.chunks, u64::from(bytes));
    }

    /// Inserts `id` only if absent (entries found by the start-up scan never override live ones).
    pub fn insert_if_absent(&mut self, id: u128, bytes: u64) -> bool {
        if self.chunks.contains(id) {
            return false;
        }
        self.insert(id, bytes);
        true
    }

    /// The index as the policy sees it under a known `capacity`.
    fn cached(&self, capacity: u64) -> Cached<'_> {
        Cached { chunks: &self.chunks, used: self.used + self.reserved(), capacity }
    }

    /// Makes room for a fetched chunk of `bytes` and inserts it, or refuses it. `Some(victims)`:
    /// the chunk is indexed (most recent) and the victims, removed from the index, are for the
    /// caller to delete. `None`: the chunk is not to be kept, and nothing changed.
    ///
    /// While the capacity is unknown it is always kept; otherwise the policy names the victims
    /// (least recently used first), or refuses it (`EvictionPolicy::victims`).
    ///
    /// Room promised to prefetches still being fetched is not free: a fill takes it only if it is
    /// the chunk it was promised to (by `id`, or by `promised_as`, the cold first read it was
    /// promised under), and that promise is then used up. Otherwise a fill that no prefetch
    /// promised (a staged chunk's read, a client's own miss) could take the last free room while
    /// a promised chunk is on its way, and that chunk, refused when it lands, would be fetched
    /// again by its read.
    ///
    /// `returning`: what [`ChunkIndex::record_read`] said of the read that fetched it.
    pub fn admit(
        &mut self,
        id: u128,
        bytes: u64,
        returning: bool,
        promised_as: Option<u128>,
    ) -> Option<Vec<(u128, u64)>> {
        self.release(id);
        if let Some(key) = promised_as {
            self.release(key);
        }
        let Some(capacity) = self.capacity else {
            self.insert(id, bytes);
            return Some(Vec::new());
        };
        let victims = self.policy.victims(&self.cached(capacity), id, bytes, returning, self.promised)?;
        for &(victim, _) in &victims {
            self.remove(victim);
        }
        self.insert(id, bytes);
        Some(victims)
    }

    /// Whether a chunk of about `bytes`, whose read is not counted yet, would be kept if it were
    /// fetched now, beside what is promised to prefetches being fetched: [`ChunkIndex::admit`] as
    /// a dry run. If so, the room is promised to it (under `key`: its id, or for a chunk 0 of
    /// an object whose version is not known yet, the object's first read) until it is admitted
    /// or [`ChunkIndex::release`]d, so that prefetches running at once do not all count on the
    /// same free room and then all but one see their chunk refused (and fetched again by its
    /// read). `id`: `None` for a chunk of an object whose version is not known yet (cold: never
    /// read at this version). False: it would not be kept.
    pub fn promise(&mut self, key: u128, id: Option<u128>, bytes: u64) -> bool {
        let Some(capacity) = self.capacity else { return true };
        match self.policy.promise(&self.cached(capacity), id, bytes, self.promised) {
            Promise::Unneeded => true,
            Promise::Refused => false,
            Promise::Room => {
                *self.promises.entry(key).or_insert(0) += bytes;
                self.promised += bytes;
                true
            }
        }
    }

    /// The prefetch promised room under `key` ended; what its chunk's admission did not use up
    /// is free again.
    pub fn release(&mut self, key: u128) {
        if let Some(bytes) = self.promises.remove(&key) {
            self.promised -= bytes;
        }
    }

    pub fn remove(&mut self, id: u128) -> Option<u64> {
        let bytes = self.chunks.pop(id)?.bytes;
        self.used -= bytes;
        Some(bytes)
    }

    /// Removes least recently used entries until the index fits its capacity (keeping `keep`, the
    /// entry just inserted, so a chunk larger than the budget still gets served once), and returns
    /// them for deletion.
    pub fn evict_over_capacity(&mut self, keep: Option<u128>) -> Vec<(u128, u64)> {
        let mut victims = Vec::new();
        let Some(cap) = self.capacity else { return victims };
        let mut kept: Option<(u128, u64)> = None;
        while self.used + self.reserved() + kept.map_or(0, |k| k.1) > cap {
            let Some((id, entry)) = self.chunks.pop_lru() else { break };
            let bytes = entry.bytes;
            self.used -= bytes;
            if Some(id) == keep {
                kept = Some((id, bytes));
                continue;
            }
            victims.push((id, bytes));
        }
        if let Some((id, bytes)) = kept {
            self.insert(id, bytes);
        }
        victims
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
