//! What a slot keeps when its cache is full, behind one trait: the chunk index (`index.rs`) holds
//! the chunks, their bytes and their recency order within the capacity, and asks its policy what
//! a read counts for, which chunks make room for a fetched one, and whether it is kept at all.
//!
//! Policies (`eviction` in the config, `MEMARTS_EVICTION`), one file each:
//! - `tinylfu.rs` (default): LRU order plus TinyLFU admission, read frequencies and idleness;
//! - `lru.rs`: every fetched chunk kept, the least recently used ones making room.

mod lru;
mod tinylfu;

pub use memarts_settings::Eviction;

use super::chunk_map::ChunkMap;

/// The chunks of an index, most recently used first.
pub type Chunks = ChunkMap;

/// The index as a policy sees it to choose victims: its chunks in recency order, their bytes, and
/// a known capacity.
pub struct Cached<'a> {
    pub chunks: &'a Chunks,
    pub used: u64,
    pub capacity: u64,
}

impl Cached<'_> {
    /// Bytes over the capacity once `bytes` of `id` are indexed (replacing its own, if cached).
    pub fn over_with(&self, id: Option<u128>, bytes: u64) -> u64 {
        let already = id.and_then(|id| self.chunks.peek(id)).map_or(0, |e| e.bytes);
        (self.used - already + bytes).saturating_sub(self.capacity)
    }
}

/// What a policy says of room asked for a prefetch ([`super::ChunkIndex::promise`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promise {
    /// Every fetched chunk is kept: no room needs promising.
    Unneeded,
    /// It would be kept: the room is to be promised to it.
    Room,
    /// It would not be kept.
    Refused,
}

/// A chunk index's eviction policy: what reads count for, and the admission and victims of a
/// fetched chunk under a known capacity.
pub trait EvictionPolicy: Send {
    /// Counts a read of `id` (a hit or a miss); whether a previous read of it is on record
    /// (`returning`, for [`EvictionPolicy::victims`]). A client's read that a prefetch counted for
    /// it is not counted again.
    fn record_read(&mut self, id: u128) -> bool;

    /// [`EvictionPolicy::record_read`] of a read a prefetch makes for a client, whose own read is
    /// then not counted; `id` is awaited (nobody's victim) until it comes.
    fn record_prefetch(&mut self, id: u128) -> bool;

    /// A prefetch found `id` cached: awaited until its read comes, counted then.
    fn found_cached(&mut self, id: u128);

    /// A client's read of `id` that a prefetch counted came.
    fn forget_prefetch(&mut self, id: u128);

    /// How often `id` was read lately, as far as the policy counts reads.
    fn frequency(&self, id: u128) -> u8;

    /// Whether the policy keeps a read clock (then `returning` says whether a read is a re-read).
    fn clocks_reads(&self) -> bool;

    /// The read clock's time, to stamp a chunk indexed or read now.
    fn now(&self) -> u32;

    /// The capacity became known, with `chunks` of `used` bytes indexed.
    fn capacity_known(&mut self, capacity: u64, chunks: &Chunks, used: u64);

    /// A chunk of `bytes` was indexed, among `chunks` now, under `capacity`.
    fn indexed(&mut self, capacity: Option<u64>, chunks: &Chunks, bytes: u64);

    /// The chunks that make room for `bytes` of the fetched chunk `id` (least recently used first),
    /// or `None` if it is not to be kept. `returning`: what [`EvictionPolicy::record_read`] said of
    /// the read that fetched it; `promised`: room promised to prefetches still being fetched.
    fn victims(
        &self,
        cached: &Cached<'_>,
        id: u128,
        bytes: u64,
        returning: bool,
        promised: u64,
    ) -> Option<Vec<(u128, u64)>>;

    /// Whether a chunk of `bytes` (`id`: `None` for a version never read), whose read is not counted
    /// yet, would be kept if it were fetched now, beside `promised` bytes promised to others.
    fn promise(&self, cached: &Cached<'_>, id: Option<u128>, bytes: u64, promised: u64) -> Promise;

    /// How long an awaited chunk is kept from eviction (tests shorten it).
    #[cfg(test)]
    fn set_awaited_for(&mut self, _d: std::time::Duration) {}
}

/// The policy `kind` names, with nothing counted yet.
pub fn policy(kind: Eviction) -> Box<dyn EvictionPolicy> {
    match kind {
        Eviction::TinyLfu => Box::new(tinylfu::TinyLfu::default()),
        Eviction::Lru => Box::new(lru::Lru),
    }
}
