//! How often each chunk has been read lately: a count-min sketch (TinyLFU's frequency filter) that
//! the chunk index consults before it lets a new chunk push cached ones out.
//!
//! Four rows of saturating 4-bit counters (two to a byte), each row indexed by a different multiplicative hash of the chunk id (itself a 128-bit
//! hash of the chunk's identity, so it is already well mixed). A read adds one to the smallest of
//! the id's four counters ("conservative update": the others already overestimate), and the
//! estimate is the smallest of the four: never below the true count (until saturation at 15),
//! above it only by collisions. Every `sample` reads all counters are halved (aging), so what was
//! read often long ago weighs less than what is read now. The rows are as wide as the chunks
//! indexed so far need, not as the capacity will (a slot filling with millions of small chunks
//! pays for the ones it holds): a wider sketch takes over the estimates of the chunks indexed
//! ([`FrequencySketch::widened`]), and the counts of chunks read but not indexed are lost (few: a
//! slot widens while it fills, when every chunk read is indexed). Copying every counter to both
//! of its places instead would keep those too, but each widening would double the places earlier
//! chunks hold, and after a few a new chunk would share all its counters with old ones: over-
//! estimated, as in a sketch far too small. (Halving alone is slow to let a new
//! working set in: an old one read for many epochs keeps high counts for several samples. The
//! index also asks `recency.rs` whether a cached chunk is still read at all.)
//!
//! The crates that offer this (`wtinylfu`, `cache-mod` and the like) are whole caches that hold the
//! values and count entries; the index needs only the frequency estimate, next to its own byte
//! accounting and an explicit victims list, so the sketch is here, on its own.

/// Counters saturate here (4 bits, as in TinyLFU: beyond that, more reads say nothing new).
const MAX_COUNT: u8 = 15;

/// Rows of the sketch; each id has one counter per row.
const ROWS: usize = 4;

/// Counters per row for each cached chunk: the chunks competing for a place are more than those
/// cached (a dataset twice the cache is the case to serve), and a chunk that shares all its
/// counters with others is overestimated.
const WIDTH_PER_ENTRY: usize = 4;

/// The narrowest and widest rows: a small cache gets its whole sketch at once, a huge one at most
/// 4 MiB of counters per slot (more chunks than that share counters, which only overestimates).
const MIN_WIDTH: usize = 1 << 12;
const MAX_WIDTH: usize = 1 << 21;

/// A sketch is sized for at least this many chunks.
const MIN_ENTRIES: usize = 64;

/// Reads between two halvings, per counted chunk (TinyLFU's sample size W = 10 × cache entries).
const SAMPLE_PER_ENTRY: u64 = 10;

/// Odd multipliers, one per row (from the golden ratio and other well-spread constants).
const SEEDS: [u64; ROWS] =
    [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0xFF51_AFD7_ED55_8CCD];

pub struct FrequencySketch {
    /// `ROWS` rows of `width` 4-bit counters, two to a byte (the even slot in the low half).
    rows: Vec<u8>,
    width: usize,
    /// The widest the rows get: the width for `entries`.
    full_width: usize,
    entries: usize,
    reads: u64,
    sample: u64,
}

impl FrequencySketch {
    /// A sketch sized for a cache of about `entries` chunks.
    /// Its rows are as wide as `len` indexed chunks need ([`FrequencySketch::wider_for`]).
    pub fn new(entries: usize, len: usize) -> FrequencySketch {
        let entries = entries.max(MIN_ENTRIES);
        let full_width = width_for(entries, MAX_WIDTH);
        let width = width_for(len.saturating_mul(2), full_width);
        FrequencySketch {
            rows: vec![0; ROWS * width / 2],
            width,
            full_width,
            entries,
            reads: 0,
            sample: SAMPLE_PER_ENTRY * entries as u64,
        }
    }

    /// Counters per row.
    #[cfg(test)]
    pub fn width(&self) -> usize {
        self.width
    }

    /// The width `len` indexed chunks need (at most the width for the sketch's entries), if wider
    /// than these rows: as wide as twice as many would be sized for. The slack is what keeps a
    /// sketch that widened as its slot filled as accurate as one sized in full from the start:
    /// at the density of a full sketch just before each widening, the chunks counted then would
    /// carry ~8 times as many overestimates into the wide one, and a single overestimated chunk
    /// at the end of the LRU order refuses every candidate read once less (its test:
    /// `admission_tests::the_bars_hold_for_a_cache_of_small_chunks...`).
    pub fn wider_for(&self, len: usize) -> Option<usize> {
        Some(self.width_for(len.saturating_mul(2))).filter(|&w| w > self.width)
    }

    /// The width for `len` chunks, within this sketch's widest.
    pub fn width_for(&self, len: usize) -> usize {
        width_for(len, self.full_width)
    }

    /// This sketch `width` wide, with the estimates of `indexed` (the chunks indexed) and no other
    /// count; its halving schedule goes on as it was.
    pub fn widened(&self, width: usize, indexed: impl Iterator<Item = u128>) -> FrequencySketch {
        let mut wide = FrequencySketch { rows: vec![0; ROWS * width / 2], width, ..*self };
        for id in indexed {
            let count = self.estimate(id);
            for s in wide.slots(id) {
                if wide.count(s) < count {
                    let shift = 4 * (s % 2);
                    wide.rows[s / 2] = (wide.rows[s / 2] & !(0xF << shift)) | (count << shift);
                }
            }
        }
        wide
    }

    /// The number of cached chunks this sketch was sized for.
    pub fn entries(&self) -> usize {
        self.entries
    }

    fn slots(&self, id: u128) -> [usize; ROWS] {
        let h = (id as u64) ^ ((id >> 64) as u64);
        let mask = self.width - 1;
        std::array::from_fn(|row| row * self.width + ((h.wrapping_mul(SEEDS[row]) >> 32) as usize & mask))
    }

    fn count(&self, slot: usize) -> u8 {
        (self.rows[slot / 2] >> (4 * (slot % 2))) & 0xF
    }

    /// How often `id` was read lately (an estimate, never low until it saturates).
    pub fn estimate(&self, id: u128) -> u8 {
        self.slots(id).iter().map(|&s| self.count(s)).min().unwrap_or(0)
    }

    /// Counts one read of `id`; halves every counter once `sample` reads were counted.
    pub fn record(&mut self, id: u128) {
        let slots = self.slots(id);
        let min = slots.iter().map(|&s| self.count(s)).min().unwrap_or(0);
        if min < MAX_COUNT {
            for s in slots {
                if self.count(s) == min {
                    self.rows[s / 2] += 1 << (4 * (s % 2));
                }
            }
        }
        self.reads += 1;
        if self.reads >= self.sample {
            self.halve();
        }
    }

    fn halve(&mut self) {
        for pair in &mut self.rows {
            *pair = (*pair >> 1) & 0x77;
        }
        self.reads /= 2;
    }
}

/// Row width (a power of two) for `len` chunks: `WIDTH_PER_ENTRY` counters each, within
/// `MIN_WIDTH..=max`.
fn width_for(len: usize, max: usize) -> usize {
    len.saturating_mul(WIDTH_PER_ENTRY).clamp(MIN_WIDTH, MAX_WIDTH).next_power_of_two().min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u64) -> u128 {
        u128::from(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes())) << 64 | u128::from(i)
    }

    #[test]
    fn estimates_count_reads_and_saturate() {
        let mut s = FrequencySketch::new(1000, 0);
        for _ in 0..3 {
            s.record(id(1));
        }
        s.record(id(2));
        assert_eq!(s.estimate(id(1)), 3);
        assert_eq!(s.estimate(id(2)), 1);
        assert_eq!(s.estimate(id(3)), 0);
        for _ in 0..40 {
            s.record(id(4));
        }
        assert_eq!(s.estimate(id(4)), MAX_COUNT);
    }

    #[test]
    fn estimates_are_never_low_and_rarely_high() {
        // 1000 ids in a sketch sized for 1000, each read (i % 5) + 1 times, before any halving.
        let mut s = FrequencySketch::new(1000, 1000);
        for i in 0..1000u64 {
            for _ in 0..(i % 5) + 1 {
                s.record(id(i));
            }
        }
        let mut high = 0;
        for i in 0..1000u64 {
            let (e, count) = (u64::from(s.estimate(id(i))), (i % 5) + 1);
            assert!(e >= count, "id {i}: estimate {e} below its count {count}");
            high += usize::from(e > count);
        }
        assert!(high < 50, "{high} of 1000 estimates too high");
    }

    #[test]
    fn a_widened_sketch_keeps_the_estimates_of_the_indexed_chunks_only() {
        let mut s = FrequencySketch::new(1 << 20, 0);
        assert_eq!(s.width(), MIN_WIDTH, "nothing indexed yet: the narrowest rows");
        for i in 0..1000u64 {
            for _ in 0..(i % 7) {
                s.record(id(i));
            }
        }
        let before: Vec<u8> = (0..1000).map(|i| s.estimate(id(i))).collect();
        assert_eq!(s.wider_for(500), None, "4096 counters: 8 per chunk for 500");
        assert_eq!(s.wider_for(10_000), Some(1 << 17));
        assert_eq!(s.wider_for(usize::MAX), Some(1 << 21), "at most the width for the entries");
        let mut wide = s.widened(1 << 17, (0..500).map(id));
        assert_eq!(before[..500], (0..500).map(|i| wide.estimate(id(i))).collect::<Vec<u8>>()[..]);
        let others = (500..1000).filter(|&i| wide.estimate(id(i)) != 0).count();
        assert!(others < 5, "{others} counts of chunks not indexed kept");
        assert_eq!(wide.wider_for(10_000), None);
        wide.halve();
        assert!((0..500).all(|i| wide.estimate(id(i)) == before[i as usize] / 2), "nibbles halve apart");
    }

    #[test]
    fn every_sample_of_reads_halves_the_counts() {
        let mut s = FrequencySketch::new(100, 0);
        let sample = SAMPLE_PER_ENTRY * 100;
        for _ in 0..8 {
            s.record(id(7));
        }
        // Reads of other ids up to the sample: the halving comes with the last of them.
        for i in 0..sample - 8 {
            s.record(id(1000 + i % 50));
        }
        assert_eq!(s.estimate(id(7)), 4, "halved once");
        assert_eq!(s.reads, sample / 2);
    }
}
