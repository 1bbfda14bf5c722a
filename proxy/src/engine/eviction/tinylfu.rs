//! `tinylfu` (the default): LRU order, plus TinyLFU admission: when the cache is full, a fetched
//! chunk is kept only if it was read more often lately than every chunk it would push out
//! (frequencies from `admission.rs`, counted on every read, hit or miss; by two reads while they
//! are in the working set), or if it was read before and they are out of the working set (idle
//! for more than twice the slot's mean reuse distance, `recency.rs`); otherwise it is served and
//! not kept (`rejected_chunks`, in `AdmissionStatus`). A repeated scan of a dataset larger than
//! the cache thus keeps a stable part resident instead of pushing out each chunk just before it is
//! read again, a one-off scan pushes out nothing that is still read, and a new dataset read
//! repeatedly replaces one no longer read within about two of its passes, however long the old one
//! was read.
//!
//! A prefetch (`prefetch.rs`) is the read its client is about to make, made early: it is counted
//! then ([`EvictionPolicy::record_prefetch`]), and the client's read of the chunk, when it comes,
//! is not counted again. A chunk a prefetch read or found cached is awaited (`awaited.rs`): until
//! its read comes (or for `AWAITED_FOR`, a hint never followed by its read), it is nobody's
//! victim, so that a prefetch never pushes out a chunk it was told is about to be read.

use super::{Cached, Chunks, EvictionPolicy, Promise};
use crate::engine::admission::FrequencySketch;
use crate::engine::awaited::AwaitedChunks;
use crate::engine::recency::ReadClock;

/// Bytes of a typical chunk on disk (a 1 MiB chunk and its header), to size the frequency sketch
/// before the index knows better.
const TYPICAL_CHUNK_BYTES: u64 = (1 << 20) + 4096;

/// The read clock's rows are this many times narrower than the sketch's (before the sketch's
/// slack): two places a row for each chunk held, 32 to 64 bytes a chunk, at most 16 MiB a slot.
/// Four places took twice that for the same admissions: a cache of 20,000 chunks, epochs over
/// twice it and a dataset replacing it hit the same to within 3 chunks a pass
/// (`admission_tests::the_bars_hold_for_a_cache_of_small_chunks...`), and the 100-chunk tests the
/// same to the chunk. A time shared with another chunk only makes a chunk look read more recently,
/// or a new chunk look read before (in a first pass over twice the cache, 1 first read in 100,
/// against 1 in 750 with four places and 1 in 14 with one), which admits it only if the sketch
/// (its own table) counts a read of it too.
const CLOCK_NARROWER: usize = 2;

pub struct TinyLfu {
    sketch: FrequencySketch,
    /// Last read times and the slot's reuse distance, sized with the sketch.
    clock: ReadClock,
    /// Whether the sketch is sized from the chunks' real size (else from a guess, until the first
    /// chunk is indexed under a known capacity).
    sized: bool,
    /// Chunks a prefetch read (and counted) or found cached whose client read has not come yet.
    awaited: AwaitedChunks,
}

impl Default for TinyLfu {
    fn default() -> Self {
        let sketch = FrequencySketch::new(0, 0);
        let clock = ReadClock::new(clock_width(&sketch, 0), sketch.entries());
        TinyLfu { sketch, clock, sized: false, awaited: AwaitedChunks::default() }
    }
}

/// The read clock's width for `len` chunks held, beside `sketch` ([`CLOCK_NARROWER`]).
fn clock_width(sketch: &FrequencySketch, len: usize) -> usize {
    sketch.width_for(len) / CLOCK_NARROWER
}

impl TinyLfu {
    /// A sketch for the chunks of `typical` bytes `capacity` holds; a new one starts empty.
    fn size_sketch(&mut self, capacity: u64, typical: u64, len: usize) {
        let entries = usize::try_from(capacity / typical.max(1)).unwrap_or(usize::MAX);
        if FrequencySketch::new(entries, 0).entries() != self.sketch.entries() {
            self.reset_history(entries, len);
        }
    }

    /// A new, empty frequency sketch and read clock for about `entries` cached chunks, as wide as
    /// `len` indexed chunks need (they widen as more are: [`TinyLfu::widen_for`]).
    fn reset_history(&mut self, entries: usize, len: usize) {
        self.awaited.clear();
        self.sketch = FrequencySketch::new(entries, len);
        self.clock = ReadClock::new(clock_width(&self.sketch, len), self.sketch.entries());
    }

    /// Widens the sketch and the clock as the `chunks` indexed need, keeping their counts and
    /// times: a slot's memory for them follows the chunks it holds, up to what its capacity holds.
    /// The clock widens without the sketch's slack (`FrequencySketch::wider_for`), and narrower
    /// ([`CLOCK_NARROWER`]): what it keeps is each chunk's latest time, and a time shared with another chunk only makes a chunk look
    /// read more recently, a difference no single chunk can turn into refusals of all others; it
    /// is the bulk of the memory (4 bytes a place, against half a byte).
    fn widen_for(&mut self, chunks: &Chunks) {
        if let Some(width) = self.sketch.wider_for(chunks.len()) {
            self.sketch = self.sketch.widened(width, chunks.iter().map(|(id, _)| id));
        }
        let width = clock_width(&self.sketch, chunks.len());
        if width > self.clock.width() {
            self.clock = self.clock.widened(width, chunks.iter().map(|(id, e)| (id, e.read_at)));
        }
    }

    /// The least recently used chunks that make room for `bytes` of `id`, if it outweighs each of
    /// them (`None`: it is not to be kept). Awaited chunks are passed over: their reads are about
    /// to come.
    fn victims_for(
        &self,
        cached: &Cached<'_>,
        id: Option<u128>,
        bytes: u64,
        candidate: u8,
        returning: bool,
    ) -> Option<Vec<(u128, u64)>> {
        if bytes > cached.capacity {
            return None;
        }
        let mut over = cached.over_with(id, bytes);
        let idle_limit = self.clock.idle_limit();
        let mut victims = Vec::new();
        for (victim, entry) in cached.chunks.iter().rev() {
            if over == 0 {
                break;
            }
            if Some(victim) == id || self.awaited.is_awaited(victim) {
                continue;
            }
            let idle = self.clock.since(entry.read_at);
            if !self.outweighs(candidate, returning, victim, idle, idle_limit) {
                return None;
            }
            victims.push((victim, entry.bytes));
            over = over.saturating_sub(entry.bytes);
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
}

impl EvictionPolicy for TinyLfu {
    fn record_read(&mut self, id: u128) -> bool {
        if self.awaited.read_came(id) {
            return self.clock.knows(id);
        }
        self.sketch.record(id);
        self.clock.record(id)
    }

    fn record_prefetch(&mut self, id: u128) -> bool {
        let returning = self.record_read(id);
        self.awaited.prefetched(id);
        returning
    }

    fn found_cached(&mut self, id: u128) {
        self.awaited.found_cached(id);
    }

    fn forget_prefetch(&mut self, id: u128) {
        self.awaited.forget(id);
    }

    fn frequency(&self, id: u128) -> u8 {
        self.sketch.estimate(id)
    }

    fn clocks_reads(&self) -> bool {
        true
    }

    fn now(&self) -> u32 {
        self.clock.now()
    }

    /// The frequency sketch is sized for as many chunks as the capacity holds: of the mean size
    /// indexed, or, with an empty index, of 1 MiB until the first chunk is indexed.
    fn capacity_known(&mut self, capacity: u64, chunks: &Chunks, used: u64) {
        let len = chunks.len();
        let typical = if len == 0 { TYPICAL_CHUNK_BYTES } else { used / len as u64 };
        self.size_sketch(capacity, typical, len);
        self.widen_for(chunks);
        self.sized = len != 0;
    }

    /// The first chunk under a known capacity tells the real chunk size (the sketch has counted a
    /// read or two so far: little is lost). Later, far more chunks than the sketch was sized for
    /// (smaller chunks than the first): a wider one, empty, rather than shared counters.
    fn indexed(&mut self, capacity: Option<u64>, chunks: &Chunks, bytes: u64) {
        let len = chunks.len();
        match capacity {
            Some(capacity) if !self.sized => {
                self.size_sketch(capacity, bytes, len);
                self.sized = true;
            }
            _ if len > 2 * self.sketch.entries() => self.reset_history(2 * len, len),
            _ => {}
        }
        self.widen_for(chunks);
    }

    /// The least recently used chunks that make room, if the chunk outweighs each of them
    /// ([`TinyLfu::outweighs`], with the read that fetched it not counted). Room promised to
    /// prefetches is not free. A chunk larger than the whole budget is not kept.
    fn victims(
        &self,
        cached: &Cached<'_>,
        id: u128,
        bytes: u64,
        returning: bool,
        promised: u64,
    ) -> Option<Vec<(u128, u64)>> {
        let candidate = self.frequency(id).saturating_sub(1);
        self.victims_for(cached, Some(id), promised + bytes, candidate, returning)
    }

    /// Cold (`id` `None`: never read at this version) is kept only if it fits.
    fn promise(&self, cached: &Cached<'_>, id: Option<u128>, bytes: u64, promised: u64) -> Promise {
        let candidate = id.map_or(0, |id| self.frequency(id));
        let returning = id.is_some_and(|id| self.clock.knows(id));
        match self.victims_for(cached, id, promised + bytes, candidate, returning) {
            Some(_) => Promise::Room,
            None => Promise::Refused,
        }
    }

    #[cfg(test)]
    fn set_awaited_for(&mut self, d: std::time::Duration) {
        self.awaited.set_for(d);
    }
}
