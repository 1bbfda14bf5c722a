//! The chunk index of one slot: which chunks it owns, how many bytes they take on disk, their
//! recency, and (with the default policy) how often each chunk was read lately, to decide within
//! the slot's share of the fleet capacity what to keep.
//!
//! Policies (`eviction` in the config, `MEMARTS_EVICTION`):
//! - `tinylfu` (default): LRU order, plus TinyLFU admission: when the cache is full, a fetched
//!   chunk is kept only if it was read more often lately than every chunk it would push out
//!   (frequencies from `admission.rs`, counted on every read, hit or miss; by two reads while
//!   they are in the working set), or if it was read before and they are out of the working set
//!   (idle for more than twice the slot's mean reuse distance, `recency.rs`); otherwise it is
//!   served and not kept (`rejected_chunks`, in `AdmissionStatus`). A repeated
//!   scan of a dataset larger than the cache thus keeps a stable part resident instead of pushing
//!   out each chunk just before it is read again, a one-off scan pushes out nothing that is still
//!   read, and a new dataset read repeatedly replaces one no longer read within about two of its
//!   passes, however long the old one was read.
//!
//! A prefetch (`prefetch.rs`) is the read its client is about to make, made early: it is counted
//! then ([`ChunkIndex::record_prefetch`]), and the client's read of the chunk, when it comes, is
//! not counted again. Before it fetches, a prefetch asks whether the chunk would be kept
//! ([`ChunkIndex::promise`]); if not, it leaves the chunk to the client's read, which fetches
//! it once, rather than fetch it for nothing and have the read fetch it again. A chunk a prefetch
//! read or found cached ([`ChunkIndex::hint`]) is awaited: until its read comes (or for
//! [`AWAITED_FOR`], a hint never followed by its read), it is nobody's victim, so that a prefetch
//! never pushes out a chunk it was told is about to be read.
//! - `lru`: every fetched chunk is kept and the least recently used ones make room (the policy of
//!   earlier versions, and the reference of the benchmark).

use std::collections::HashMap;

use lru::LruCache;
pub use memarts_settings::Eviction;

use super::admission::FrequencySketch;
use super::awaited::AwaitedChunks;
use super::recency::ReadClock;

/// Bytes of a typical chunk on disk (a 1 MiB chunk and its header), to size the frequency sketch
/// before the index knows better.
const TYPICAL_CHUNK_BYTES: u64 = (1 << 20) + 4096;

/// A cached chunk: its bytes on disk, and the read clock's time when it was last read (or
/// indexed), exact, unlike the clock's own table: a victim that looked recently read because it
/// shares the table's slots with chunks being read would hold up every admission behind it.
#[derive(Clone, Copy)]
struct Entry {
    bytes: u64,
    read_at: u32,
}

/// LRU index over chunk ids with byte accounting. Not thread-safe; the cache wraps it in a mutex and
/// holds the lock only for these short operations.
pub struct ChunkIndex {
    lru: LruCache<u128, Entry>,
    used: u64,
    capacity: Option<u64>,
    /// Chunks per placement (the id's upper half: object and chunk number, any version), so a read
    /// can tell "some version of this chunk is cached" without knowing the version.
    placements: HashMap<u64, u32>,
    policy: Eviction,
    sketch: FrequencySketch,
    /// Last read times and the slot's reuse distance, sized with the sketch.
    clock: ReadClock,
    /// Whether the sketch is sized from the chunks' real size (else from a guess, until the first
    /// chunk is indexed under a known capacity).
    sized: bool,
    /// Chunks a prefetch read (and counted) or found cached whose client read has not come yet.
    awaited: AwaitedChunks,
    /// Room promised to prefetches being fetched ([`ChunkIndex::promise`]), not indexed yet, by
    /// what it is for (a chunk's id, or the first read of a cold object), and its sum.
    promises: HashMap<u128, u64>,
    promised: u64,
}

impl Default for ChunkIndex {
    fn default() -> Self {
        ChunkIndex::new(Eviction::default())
    }
}

fn placement_of(id: u128) -> u64 {
    (id >> 64) as u64
}

impl ChunkIndex {
    pub fn new(policy: Eviction) -> ChunkIndex {
        let sketch = FrequencySketch::new(0);
        let clock = ReadClock::new(sketch.width(), sketch.entries());
        ChunkIndex {
            lru: LruCache::unbounded(),
            used: 0,
            capacity: None,
            placements: HashMap::new(),
            policy,
            sketch,
            clock,
            sized: false,
            awaited: AwaitedChunks::default(),
            promises: HashMap::new(),
            promised: 0,
        }
    }

    pub fn policy(&self) -> Eviction {
        self.policy
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// Sets the byte budget; `None` disables eviction (until the capacity is known). The frequency
    /// sketch is sized for as many chunks as the budget holds: of the mean size indexed, or, with an
    /// empty index, of 1 MiB until the first chunk is indexed (see [`ChunkIndex::insert`]).
    pub fn set_capacity(&mut self, capacity: Option<u64>) {
        self.capacity = capacity;
        if capacity.is_some() {
            let typical =
                if self.lru.is_empty() { TYPICAL_CHUNK_BYTES } else { self.used / self.len() as u64 };
            self.size_sketch(typical);
            self.sized = !self.lru.is_empty();
        }
    }

    /// A sketch for the chunks of `typical` bytes the capacity holds; a new one starts empty.
    fn size_sketch(&mut self, typical: u64) {
        let Some(cap) = self.capacity else { return };
        let entries = usize::try_from(cap / typical.max(1)).unwrap_or(usize::MAX);
        if FrequencySketch::new(entries).entries() != self.sketch.entries() {
            self.reset_history(entries);
        }
    }

    /// A new, empty frequency sketch and read clock for about `entries` cached chunks.
    fn reset_history(&mut self, entries: usize) {
        self.awaited.clear();
        self.sketch = FrequencySketch::new(entries);
        self.clock = ReadClock::new(self.sketch.width(), self.sketch.entries());
    }

    /// Counts a read of `id` (a hit or a miss) in the frequency sketch and the read clock. Returns
    /// whether the clock has a previous read of it on record (`returning`, for
    /// [`ChunkIndex::admit`]: the clock's entry is this read's from now on).
    /// A client's read of a chunk a prefetch read for it is not counted again: the prefetch's was
    /// this read, made early.
    pub fn record_read(&mut self, id: u128) -> bool {
        if self.policy != Eviction::TinyLfu {
            return false;
        }
        if self.awaited.read_came(id) {
            return self.clock.knows(id);
        }
        self.sketch.record(id);
        self.clock.record(id)
    }

    /// [`ChunkIndex::record_read`] of a read a prefetch makes for a client: counted now, and the
    /// client's own read of `id` is not counted when it comes. Awaited until then.
    pub fn record_prefetch(&mut self, id: u128) -> bool {
        let returning = self.record_read(id);
        if self.policy == Eviction::TinyLfu {
            self.awaited.prefetched(id);
        }
        returning
    }

    /// A prefetch found `id` cached: it is marked recently used and awaited (nobody's victim) until
    /// its read comes, which is counted then. False if it is not cached.
    pub fn hint(&mut self, id: u128) -> bool {
        if !self.touch(id) {
            return false;
        }
        if self.policy == Eviction::TinyLfu {
            self.awaited.found_cached(id);
        }
        true
    }

    /// How long an awaited chunk is kept from eviction (tests shorten [`AWAITED_FOR`]).
    #[cfg(test)]
    pub fn set_awaited_for(&mut self, d: std::time::Duration) {
        self.awaited.set_for(d);
    }

    /// A client's read of `id` that a prefetch counted came (it joined the prefetch's fetch).
    pub fn forget_prefetch(&mut self, id: u128) {
        self.awaited.forget(id);
    }

    /// How often `id` was read lately, as the sketch estimates it.
    pub fn frequency(&self, id: u128) -> u8 {
        self.sketch.estimate(id)
    }

    pub fn contains(&self, id: u128) -> bool {
        self.lru.contains(&id)
    }

    /// Whether some version of the chunk with this placement is indexed.
    pub fn has_placement(&self, placement: u64) -> bool {
        self.placements.contains_key(&placement)
    }

    fn counted_out(&mut self, id: u128) {
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.placements.entry(placement_of(id)) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// Marks `id` most recently used; false if absent. (Reorders only: reads are counted by
    /// [`ChunkIndex::record_read`].)
    pub fn touch(&mut self, id: u128) -> bool {
        let now = self.clock.now();
        self.lru.get_mut(&id).map(|e| e.read_at = now).is_some()
    }

    /// Every id, most recently used first.
    pub fn ids_most_recent_first(&self) -> Vec<u128> {
        self.lru.iter().map(|(id, _)| *id).collect()
    }

    /// Inserts or replaces `id` as most recently used.
    pub fn insert(&mut self, id: u128, bytes: u64) {
        match self.lru.put(id, Entry { bytes, read_at: self.clock.now() }) {
            Some(old) => self.used -= old.bytes,
            None => *self.placements.entry(placement_of(id)).or_insert(0) += 1,
        }
        self.used += bytes;
        if self.policy != Eviction::TinyLfu {
            return;
        }
        // The first chunk under a known capacity tells the real chunk size (the sketch has counted
        // a read or two so far: little is lost). Later, far more chunks than the sketch was sized
        // for (smaller chunks than the first): a wider one, empty, rather than shared counters.
        if !self.sized && self.capacity.is_some() {
            self.size_sketch(bytes);
            self.sized = true;
        } else if self.lru.len() > 2 * self.sketch.entries() {
            self.reset_history(2 * self.lru.len());
        }
    }

    /// Inserts `id` only if absent (entries found by the start-up scan never override live ones).
    pub fn insert_if_absent(&mut self, id: u128, bytes: u64) -> bool {
        if self.lru.contains(&id) {
            return false;
        }
        self.insert(id, bytes);
        true
    }

    /// Makes room for a fetched chunk of `bytes` and inserts it, or refuses it. `Some(victims)`:
    /// the chunk is indexed (most recent) and the victims, removed from the index, are for the
    /// caller to delete. `None`: the chunk is not to be kept, and nothing changed.
    ///
    /// With `lru`, or while the capacity is unknown, or when the chunk fits, it is always kept.
    /// With `tinylfu` and a full cache, the victims are the least recently used chunks that make
    /// room, and the chunk is kept only if it outweighs each of them (`ChunkIndex::outweighs`).
    /// A chunk larger than the whole budget is not kept.
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
        if self.capacity.is_none() || self.policy != Eviction::TinyLfu {
            self.insert(id, bytes);
            return Some(self.evict_over_capacity(Some(id)));
        }
        let candidate = self.frequency(id).saturating_sub(1);
        let victims = self.victims_for(Some(id), self.promised + bytes, candidate, returning)?;
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
    /// read at this version, so it is kept only if it fits). False: it would not be kept.
    pub fn promise(&mut self, key: u128, id: Option<u128>, bytes: u64) -> bool {
        if self.capacity.is_none() || self.policy != Eviction::TinyLfu {
            return true;
        }
        let candidate = id.map_or(0, |id| self.frequency(id));
        let returning = id.is_some_and(|id| self.clock.knows(id));
        if self.victims_for(id, self.promised + bytes, candidate, returning).is_none() {
            return false;
        }
        *self.promises.entry(key).or_insert(0) += bytes;
        self.promised += bytes;
        true
    }

    /// The prefetch promised room under `key` ended; what its chunk's admission did not use up
    /// is free again.
    pub fn release(&mut self, key: u128) {
        if let Some(bytes) = self.promises.remove(&key) {
            self.promised -= bytes;
        }
    }

    /// The least recently used chunks that make room for `bytes` of `id` under the TinyLFU policy
    /// and a known capacity, if it outweighs each of them (`None`: it is not to be kept). Awaited
    /// chunks are passed over: their reads are about to come.
    fn victims_for(
        &self,
        id: Option<u128>,
        bytes: u64,
        candidate: u8,
        returning: bool,
    ) -> Option<Vec<(u128, u64)>> {
        let cap = self.capacity?;
        if bytes > cap {
            return None;
        }
        let already = id.and_then(|id| self.lru.peek(&id)).map_or(0, |e| e.bytes);
        let mut over = (self.used - already + bytes).saturating_sub(cap);
        let idle_limit = self.clock.idle_limit();
        let mut victims = Vec::new();
        for (&victim, &Entry { bytes: size, read_at }) in self.lru.iter().rev() {
            if over == 0 {
                break;
            }
            if Some(victim) == id || self.awaited.is_awaited(victim) {
                continue;
            }
            let idle = self.clock.since(read_at);
            if !self.outweighs(candidate, returning, victim, idle, idle_limit) {
                return None;
            }
            victims.push((victim, size));
            over = over.saturating_sub(size);
        }
        // Short of room only when awaited chunks fill the rest.
        (over == 0).then_some(victims)
    }

    /// Whether a fetched chunk read `candidate` times lately before this read (`returning`: its
    /// previous read is on the read clock's record) should take the place of the cached `victim`,
    /// idle for `idle` reads. The read that fetched it is not counted, because a victim's next read
    /// is not counted either: counting it would let every chunk of a shuffled epoch push out one
    /// still to be read in the same epoch. Ties keep what is cached: in a loop over a dataset
    /// larger than the cache every chunk is read as often, and the part that stays is the part
    /// that hits.
    /// - Until the slot's reuse distance is known (`idle_limit` `None`): if it was read more often
    ///   than the victim (TinyLFU).
    /// - A victim out of the working set (idle for more than `idle_limit`, twice the slot's mean
    ///   reuse distance) gives its place to any chunk read before: a re-read by both the sketch
    ///   and the read clock (two tables with their own hashes, so that a collision in one does
    ///   not pass a one-off scan for a re-read). This is what lets a new dataset replace an old
    ///   one whose counts are still high, from the new one's second pass, instead of after as
    ///   many passes as the old one had.
    /// - A victim in the working set gives its place only to a chunk read at least two more
    ///   times: one read of difference is what a halving of the sketch makes between two chunks
    ///   of a loop read just before it and just after it, and taken at face value it would swap
    ///   chunks that are read as often.
    fn outweighs(
        &self,
        candidate: u8,
        returning: bool,
        victim: u128,
        idle: u64,
        idle_limit: Option<u64>,
    ) -> bool {
        let count = self.frequency(victim);
        match idle_limit {
            None => candidate > count,
            Some(limit) if idle > limit => candidate > count || (returning && candidate >= 1),
            Some(_) => candidate >= count.saturating_add(2),
        }
    }

    pub fn remove(&mut self, id: u128) -> Option<u64> {
        let bytes = self.lru.pop(&id)?.bytes;
        self.used -= bytes;
        self.counted_out(id);
        Some(bytes)
    }

    /// Removes least recently used entries until the index fits its capacity (keeping `keep`, the
    /// entry just inserted, so a chunk larger than the budget still gets served once), and returns
    /// them for deletion.
    pub fn evict_over_capacity(&mut self, keep: Option<u128>) -> Vec<(u128, u64)> {
        let mut victims = Vec::new();
        let Some(cap) = self.capacity else { return victims };
        let mut kept: Option<(u128, u64)> = None;
        while self.used + kept.map_or(0, |k| k.1) > cap {
            let Some((id, Entry { bytes, .. })) = self.lru.pop_lru() else { break };
            self.used -= bytes;
            self.counted_out(id);
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
