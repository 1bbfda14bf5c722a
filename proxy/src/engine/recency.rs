//! When each chunk was last read (approximately), and how long the slot's chunks take to be read
//! again: what the chunk index needs to tell a chunk that is no longer read from one that is.
//!
//! The frequency sketch (`admission.rs`) alone cannot: a dataset read for many epochs leaves its
//! chunks with high counts, and a new dataset that replaces it must be read as many times before
//! its chunks count more, however soon the old one stopped being read. What tells them apart is
//! idleness measured against the workload's own cycle (Denning's working set, with a window
//! taken from the reads themselves): every re-read gives a reuse distance (reads since the
//! chunk's previous read), their running mean is the slot's cycle, and a cached chunk idle for
//! more than twice that mean is out of the working set. Twice, because an epoch in a fresh
//! random order brings a chunk back after anything from 0 to two cycles (the mean is one); in
//! order, after exactly one. Nothing here is tuned to a dataset or cache size.
//!
//! Layout: four rows of 32-bit read times (the read clock, wrapping: a chunk idle for more than
//! 2^32 reads of its slot looks recently read, which only keeps it), each row indexed by its own
//! multiplicative hash of the chunk id, as in the sketch. A read writes the current time in all
//! four; the time read back is the smallest of the four. A slot shared with other ids holds the
//! latest of their reads, so the time read back is never earlier than the chunk's own last read:
//! collisions only make a chunk look more recently read (kept longer) and a reuse distance
//! shorter, and with four rows of two slots per cached chunk both are rare. The rows widen with
//! the sketch's, and keep the times of the chunks indexed, as the sketch keeps their counts.

/// Rows of the table; each id has one slot per row.
const ROWS: usize = 4;

/// Odd multipliers, one per row (other constants than the sketch's, so that ids that share their
/// counters there do not share their times here).
const SEEDS: [u64; ROWS] =
    [0xD6E8_FEB8_6659_FD93, 0xA076_1D64_78BD_642F, 0xE703_7ED1_A0B4_28DB, 0x8EBC_6AF0_9C88_C6E3];

/// Re-reads counted before the mean is trusted: as many as the cache holds chunks. And they must
/// span at least a mean reuse distance: early on only reuses shorter than the time the clock has
/// run can have been seen (a longer one has not completed yet), so the mean starts low (in the 2nd
/// epoch of a shuffled loop, at about half the loop), and taken at face value it would call idle
/// chunks that the epoch is still to read. Until then no chunk is taken as idle.
const WARM_SAMPLES_PER_ENTRY: u64 = 1;

/// The span is counted from the re-read that makes this fraction of a cache's worth, not from the
/// first: a new chunk whose four slots all hold other chunks' times passes for a re-read (a few
/// percent of them in a first pass over twice the cache), and one of those would start the span
/// a whole epoch early.
const SPAN_FROM_FRACTION: u64 = 4;

/// A re-read within this fraction of the cache's chunks (many workers reading one chunk's
/// samples at once) says nothing about the workload's cycle: any policy serves it, and counted
/// it would drag the mean towards 0 and make every chunk look idle.
const BURST_FRACTION: u64 = 16;

pub struct ReadClock {
    times: Vec<u32>,
    width: usize,
    now: u32,
    /// Running mean of reuse distances, in reads: a cumulative mean for the first `entries`
    /// samples, then exponential with that weight, so that it follows a workload that changes.
    mean_reuse: f64,
    samples: u64,
    /// When the reuse distance that starts the span was counted (see [`SPAN_FROM_FRACTION`]).
    span_start: Option<u32>,
    entries: u64,
}

impl ReadClock {
    /// A table of `width` slots per row (a power of two) for a cache of about `entries` chunks.
    pub fn new(width: usize, entries: usize) -> ReadClock {
        let width = width.max(1).next_power_of_two();
        ReadClock {
            times: vec![0; ROWS * width],
            width,
            now: 0,
            mean_reuse: 0.0,
            samples: 0,
            span_start: None,
            entries: entries as u64,
        }
    }

    /// Places per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// This clock with rows `width` wide, holding the last read times of `indexed` (the chunks
    /// indexed, with their times) and no other; its time and reuse mean go on as they were.
    pub fn widened(&self, width: usize, indexed: impl Iterator<Item = (u128, u32)>) -> ReadClock {
        let mut wide = ReadClock { times: vec![0; ROWS * width], width, ..*self };
        for (id, t) in indexed.filter(|&(_, t)| t != 0) {
            for s in wide.slots(id) {
                let held = wide.times[s];
                if held == 0 || wide.since(t) < wide.since(held) {
                    wide.times[s] = t;
                }
            }
        }
        wide
    }

    fn slots(&self, id: u128) -> [usize; ROWS] {
        let h = (id as u64) ^ ((id >> 64) as u64);
        let mask = self.width - 1;
        std::array::from_fn(|row| row * self.width + ((h.wrapping_mul(SEEDS[row]) >> 32) as usize & mask))
    }

    /// The time of `id`'s last read, `None` if none is on record (0 is "never": the clock skips it).
    fn last_read(&self, id: u128) -> Option<u32> {
        let t = self.slots(id).iter().map(|&s| self.times[s]).min().unwrap_or(0);
        (t != 0).then_some(t)
    }

    /// Counts a read of `id`: the clock ticks, and the reuse distance since its previous read, if
    /// any and not a burst, goes into the mean. Returns whether a previous read was on record.
    pub fn record(&mut self, id: u128) -> bool {
        self.now = self.now.wrapping_add(1).max(1);
        let prev = self.last_read(id);
        if let Some(prev) = prev {
            let reuse = u64::from(self.now.wrapping_sub(prev));
            if reuse * BURST_FRACTION >= self.entries {
                self.samples += 1;
                if self.samples >= (self.entries / SPAN_FROM_FRACTION).max(1) {
                    self.span_start.get_or_insert(self.now);
                }
                let weight = self.samples.min(self.entries.max(1)) as f64;
                self.mean_reuse += (reuse as f64 - self.mean_reuse) / weight;
            }
        }
        for s in self.slots(id) {
            self.times[s] = self.now;
        }
        prev.is_some()
    }

    /// Whether a read of `id` is on record (what [`ReadClock::record`] would return), counting none.
    pub fn knows(&self, id: u128) -> bool {
        self.last_read(id).is_some()
    }

    /// The time of the latest read.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// Reads since time `t`.
    pub fn since(&self, t: u32) -> u64 {
        u64::from(self.now.wrapping_sub(t))
    }

    /// Reads since `id` was last read (since the clock started, for a chunk never read since).
    #[cfg(test)]
    pub fn idle(&self, id: u128) -> u64 {
        self.since(self.last_read(id).unwrap_or(0))
    }

    /// The idleness beyond which a cached chunk is out of the working set: twice the mean reuse
    /// distance, once it rests on enough re-reads over a long enough time; `None` before.
    pub fn idle_limit(&self) -> Option<u64> {
        let enough = self.samples >= WARM_SAMPLES_PER_ENTRY * self.entries.max(1);
        let long_enough = self.span_start.is_some_and(|t| self.since(t) as f64 >= self.mean_reuse);
        (enough && long_enough).then_some((2.0 * self.mean_reuse) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u64) -> u128 {
        u128::from(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes())) << 64 | u128::from(i)
    }

    #[test]
    fn idleness_counts_reads_since_the_last_read_of_the_chunk() {
        let mut c = ReadClock::new(1024, 100);
        c.record(id(1));
        for i in 0..10 {
            c.record(id(100 + i));
        }
        assert_eq!(c.idle(id(1)), 10);
        assert_eq!(c.idle(id(109)), 0);
        assert_eq!(c.idle(id(5)), 11, "never read: idle since the clock started");
    }

    #[test]
    fn the_limit_is_twice_the_mean_reuse_once_a_cache_of_rereads_spanning_a_mean_reuse_was_seen() {
        // A loop over 200 chunks, for a cache of 100: every re-read comes 200 reads later.
        let mut c = ReadClock::new(1024, 100);
        for i in 0..200 {
            c.record(id(i));
        }
        for i in 0..99 {
            c.record(id(i));
        }
        assert_eq!(c.idle_limit(), None, "99 re-reads: not enough");
        for i in 99..200 {
            c.record(id(i));
        }
        // The span starts at the 25th re-read (a quarter of the cache's worth): 200 reads later.
        for i in 0..24 {
            c.record(id(i));
        }
        assert_eq!(c.idle_limit(), None, "the re-reads span 199 reads, less than the mean");
        c.record(id(24));
        assert_eq!(c.idle_limit(), Some(400));
    }

    #[test]
    fn a_widened_clock_keeps_the_times_it_is_given_only() {
        let mut c = ReadClock::new(1024, 100);
        for i in 0..500 {
            c.record(id(i % 300));
        }
        let kept: Vec<(u128, u32)> = (0..150).map(|i| (id(i), c.last_read(id(i)).unwrap())).collect();
        let wide = c.widened(1 << 16, kept.iter().copied());
        assert!(kept.iter().all(|&(i, t)| wide.last_read(i) == Some(t)));
        assert!((150..300).filter(|&i| wide.knows(id(i))).count() < 3, "others forgotten");
        assert_eq!((wide.now(), wide.times.len()), (c.now(), ROWS << 16));
    }

    #[test]
    fn bursts_of_reads_of_one_chunk_do_not_count_as_reuse() {
        let mut c = ReadClock::new(1024, 160);
        for _ in 0..1000 {
            c.record(id(1));
        }
        assert_eq!((c.samples, c.idle_limit()), (0, None));
    }
}
