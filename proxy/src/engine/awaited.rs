//! Chunks whose read a prefetch announced (`prefetch.rs`): the index keeps them from eviction until
//! the read comes, and does not count that read twice when the prefetch already counted it.

use std::time::{Duration, Instant};

use lru::LruCache;

/// Most chunks remembered as read by a prefetch whose client read is still to come (a prefetch
/// queue's worth of hints, four times over: a hint never read costs one entry, until it is pushed
/// out).
const PREFETCHED_MAX: usize = 16 << 10;

/// How long a chunk a prefetch read or found cached is kept from eviction while its read does not
/// come (as long as a staged chunk waits for its read, `staging.rs`).
pub const AWAITED_FOR: Duration = Duration::from_secs(60);

/// A chunk whose read a prefetch announced: since when, and whether the prefetch counted that read
/// (it fetched the chunk) or not (it found it cached).
#[derive(Clone, Copy)]
struct Awaited {
    since: Instant,
    counted: bool,
}

/// The chunks a prefetch read (and counted) or found cached whose client read has not come yet.
pub struct AwaitedChunks {
    chunks: LruCache<u128, Awaited>,
    /// How long one is kept from eviction ([`AWAITED_FOR`]; shorter in tests).
    keep_for: Duration,
}

impl Default for AwaitedChunks {
    fn default() -> Self {
        let max = std::num::NonZeroUsize::new(PREFETCHED_MAX).expect("non-zero");
        AwaitedChunks { chunks: LruCache::new(max), keep_for: AWAITED_FOR }
    }
}

impl AwaitedChunks {
    /// A prefetch read `id` and counted that read: the client's, when it comes, is not counted.
    pub fn prefetched(&mut self, id: u128) {
        self.chunks.put(id, Awaited { since: Instant::now(), counted: true });
    }

    /// A prefetch found `id` cached: awaited afresh, its read counted when it comes (unless an
    /// earlier prefetch already counted it).
    pub fn found_cached(&mut self, id: u128) {
        let counted = self.chunks.peek(&id).is_some_and(|a| a.counted);
        self.chunks.put(id, Awaited { since: Instant::now(), counted });
    }

    /// The client's read of `id` came: no longer awaited. Whether a prefetch had counted it.
    pub fn read_came(&mut self, id: u128) -> bool {
        self.chunks.pop(&id).is_some_and(|a| a.counted)
    }

    /// Whether `id` is awaited: a prefetch announced its read, which has not come, lately.
    pub fn is_awaited(&self, id: u128) -> bool {
        self.chunks.peek(&id).is_some_and(|a| a.since.elapsed() < self.keep_for)
    }

    pub fn forget(&mut self, id: u128) {
        self.chunks.pop(&id);
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
    }

    #[cfg(test)]
    pub fn set_for(&mut self, d: Duration) {
        self.keep_for = d;
    }
}
