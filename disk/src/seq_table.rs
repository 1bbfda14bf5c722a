//! [`SeqTable`]: the one implementation of the tables a slot publishes in mapped files
//! (`meta_table`, `resident_table`), which are thin typed layers over it. Each is an open-addressing
//! table of fixed-size entries of words, seqlocked (`crate::seqlock`), after a header; a [`Shape`]
//! says where things are in one kind of table, and nothing here depends on what an entry means.
//!
//! What every such table has in common (the layouts at the top of `meta_table/mod.rs` and
//! `resident_table.rs` say the rest, word for word):
//!
//! ```text
//! header word 0              magic
//! header word 1              layout version
//! header word 2              capacity: entries, a power of two
//! header word `superseded`   1 once the slot put a newer table in this one's place, else 0
//! entry word 0               seq: 0 never written; odd while being written; even once written
//! entry words 1, 2           key (low, high); both 0 for an entry withdrawn (or never written)
//! ```
//!
//! An entry lives in one of two windows of `probes` consecutive places (wrapping at the end), each
//! from a home place of its own, taken from one half of the key (`homes`): a writer puts a new key
//! in the window with more free places, at its first free place, so that a window holds its keys
//! before its first never-written place and a reader's scan of a window stops there. With two
//! choices, and a key moved to its other window to make room when both are full (where the table
//! allows it: `Shape::moves`), a table fills to about 90% before a key first finds no place (one
//! window of 32 places: about half), so it grows later and by less. The capacity is any number of
//! entries (homes are spread over it by a multiply, not a mask). Key 0 is never stored: it marks a
//! free place.
//!
//! The homes of key `lo | hi << 64` in a table of `capacity` entries, frozen by `tests/golden.rs`
//! (arithmetic on 64-bit words, `mix(x, m)` the two halves of the 128-bit product `x * m` xored):
//!
//! ```text
//! home 0 = (mix(lo ^ rotl(hi, 32), 0x9E37_79B9_7F4A_7C15) * capacity) >> 64
//! home 1 = (mix(hi ^ rotl(lo, 32), 0xC2B2_AE3D_27D4_EB4F) * capacity) >> 64
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::seqlock;

/// Where the common parts of one kind of table are.
pub(crate) struct Shape {
    pub magic: u64,
    pub version: u64,
    /// Words before the first entry.
    pub header_words: usize,
    /// Words per entry.
    pub entry_words: usize,
    /// The header word of the superseded flag.
    pub superseded: usize,
    /// Places of each of an entry's two windows.
    pub probes: usize,
    /// Whether a writer may move an entry to its other window to make room (readers of a moving
    /// entry may miss it once: a miss). Not in a table readers write to.
    pub moves: bool,
}

/// Why words do not hold a table of a [`Shape`].
#[derive(Debug)]
pub(crate) enum BadHeader {
    NotATable,
    BadCapacity(u64),
}

/// Entry word of the key's low half.
const KEY_LO: usize = 1;
/// Entry word of the key's high half.
const KEY_HI: usize = 2;

/// An entry a reader found, consistent: what `read` made of it, where it is and at what sequence
/// number (the entry is unchanged while its sequence number is: [`SeqTable::unchanged`]).
pub(crate) struct Found<T> {
    pub fields: T,
    pub place: usize,
    pub seq: u64,
}

/// How [`SeqTable::claim`] found a place for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The key's own entry.
    Own,
    /// A free place.
    Free,
    /// Every place the key may take was another's: the one least by the word asked for.
    Displaced,
}

/// A table of a [`Shape`] over mapped words. Reading is safe from any number of threads and
/// processes; [`SeqTable::write`] and [`SeqTable::withdraw`] need a single writer at a time.
pub(crate) struct SeqTable<'a> {
    words: &'a [AtomicU64],
    capacity: usize,
    shape: &'static Shape,
}

impl<'a> SeqTable<'a> {
    /// Writes the header into `words` (all zero: a new file) for as many entries as fit, with `own`
    /// writing the table's own header words before the magic goes in last (a reader that sees it
    /// sees the rest).
    pub fn init(
        words: &'a [AtomicU64],
        shape: &'static Shape,
        own: impl FnOnce(&[AtomicU64]),
    ) -> Result<Self, BadHeader> {
        let fit = words.len().saturating_sub(shape.header_words) / shape.entry_words;
        if fit == 0 {
            return Err(BadHeader::BadCapacity(0));
        }
        let capacity = fit;
        words[1].store(shape.version, Ordering::Relaxed);
        words[2].store(capacity as u64, Ordering::Relaxed);
        own(words);
        words[0].store(shape.magic, Ordering::Release);
        Ok(SeqTable { words, capacity, shape })
    }

    /// The table in `words`, its header checked.
    pub fn open(words: &'a [AtomicU64], shape: &'static Shape) -> Result<Self, BadHeader> {
        if words.len() < shape.header_words
            || words[0].load(Ordering::Acquire) != shape.magic
            || words[1].load(Ordering::Relaxed) != shape.version
        {
            return Err(BadHeader::NotATable);
        }
        let capacity = words[2].load(Ordering::Relaxed);
        let fits = usize::try_from(capacity)
            .ok()
            .and_then(|c| c.checked_mul(shape.entry_words))
            .and_then(|w| w.checked_add(shape.header_words))
            .is_some_and(|w| w <= words.len());
        if capacity == 0 || !fits {
            return Err(BadHeader::BadCapacity(capacity));
        }
        Ok(SeqTable { words, capacity: capacity as usize, shape })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The header's words (the table's own ones among them).
    pub fn header(&self) -> &'a [AtomicU64] {
        &self.words[..self.shape.header_words]
    }

    /// Tells the readers that a newer table is in this one's place.
    pub fn mark_superseded(&self) {
        self.words[self.shape.superseded].store(1, Ordering::Release);
    }

    /// Whether the writer put a newer table in this one's place.
    pub fn superseded(&self) -> bool {
        self.words[self.shape.superseded].load(Ordering::Acquire) != 0
    }

    /// The words of the entry at `place` (modulo the capacity).
    pub fn entry(&self, place: usize) -> &'a [AtomicU64] {
        let start = self.shape.header_words + (place % self.capacity) * self.shape.entry_words;
        &self.words[start..start + self.shape.entry_words]
    }

    /// The home places of `key`'s two windows: each from a hash of one half of the key mixed with
    /// the other (keys are hashes, but tests' and hand-made ones are small numbers), spread over
    /// the capacity by a multiply.
    fn homes(&self, key: u128) -> [usize; 2] {
        let (lo, hi) = (key as u64, (key >> 64) as u64);
        [mix(lo ^ hi.rotate_left(32), HOME_SEEDS[0]), mix(hi ^ lo.rotate_left(32), HOME_SEEDS[1])]
            .map(|h| ((u128::from(h) * self.capacity as u128) >> 64) as usize)
    }

    /// The places of the window from `home` on.
    fn window(&self, home: usize) -> impl Iterator<Item = usize> + '_ {
        let capacity = self.capacity;
        (0..self.shape.probes.min(capacity)).map(move |i| {
            if home + i < capacity {
                home + i
            } else {
                home + i - capacity
            }
        })
    }

    /// Whether `place` is in the window from `home` on.
    fn in_window(&self, home: usize, place: usize) -> bool {
        (place + self.capacity - home) % self.capacity < self.shape.probes.min(self.capacity)
    }

    /// Every place `key` may occupy: its first window's, then its second's.
    fn places(&self, key: u128) -> impl Iterator<Item = usize> + '_ {
        self.homes(key).into_iter().flat_map(move |home| self.window(home))
    }

    /// The writer's view of the key at `place` (it is the only writer, so no sequence check is
    /// needed); 0 for a free place.
    pub fn key_at(&self, place: usize) -> u128 {
        key_of(self.entry(place))
    }

    /// The entry of `key`, read consistently by `read` (which must only load, `Relaxed`) and made
    /// sense of by `decode` (`None`: words that are not an entry, taken as another key's). `None`
    /// when the key is not there, or when a writer kept changing an entry (the caller asks the
    /// slot).
    pub fn find<R, T>(
        &self,
        key: u128,
        read: impl Fn(&[AtomicU64]) -> R,
        decode: impl Fn(R) -> Option<T>,
    ) -> Option<Found<T>> {
        if key == 0 {
            return None;
        }
        for home in self.homes(key) {
            for place in self.window(home) {
                match seqlock::read(self.entry(place), |e| (key_of(e), read(e)))? {
                    // A window's keys lie before its first place never written.
                    seqlock::Read::Never => break,
                    seqlock::Read::Holds((found, raw), seq) if found == key => {
                        if let Some(fields) = decode(raw) {
                            return Some(Found { fields, place, seq });
                        }
                    }
                    seqlock::Read::Holds(..) => {}
                }
            }
        }
        None
    }

    /// Every entry held now, each read once, consistently, by `read` (which must only load,
    /// `Relaxed`) and made sense of by `decode` (as [`SeqTable::find`]'s): one pass over the
    /// table, not a probe per key. An entry a writer kept changing is left out.
    pub fn entries<R, T>(
        &self,
        read: impl Fn(&[AtomicU64]) -> R,
        decode: impl Fn(R) -> Option<T>,
    ) -> Vec<(u128, T)> {
        (0..self.capacity)
            .filter_map(|place| match seqlock::read(self.entry(place), |e| (key_of(e), read(e)))? {
                seqlock::Read::Holds((key, raw), _) if key != 0 => Some((key, decode(raw)?)),
                _ => None,
            })
            .collect()
    }

    /// Whether the entry at `place` is as it was read at sequence number `seq` (no write since).
    pub fn unchanged(&self, place: usize, seq: u64) -> bool {
        seqlock::unchanged(self.entry(place), seq)
    }

    /// The place `key` is to be written at: its own entry, else the first free place of the window
    /// with more free places, else one made free by moving another key to its other window (if the
    /// table allows it), else (with `evict_by`, an entry word) the one whose word is least, else
    /// none. Single writer.
    pub fn claim(&self, key: u128, evict_by: Option<usize>) -> Option<(usize, Claim)> {
        if key == 0 {
            return None;
        }
        let homes = self.homes(key);
        let (mut first_free, mut free) = ([None; 2], [0; 2]);
        let mut least: Option<(u64, usize)> = None;
        for (w, &home) in homes.iter().enumerate() {
            for place in self.window(home) {
                match self.key_at(place) {
                    found if found == key => return Some((place, Claim::Own)),
                    0 => {
                        first_free[w].get_or_insert(place);
                        free[w] += 1;
                    }
                    _ => {
                        if let Some(word) = evict_by {
                            let value = self.entry(place)[word].load(Ordering::Relaxed);
                            if least.is_none_or(|(at, _)| value < at) {
                                least = Some((value, place));
                            }
                        }
                    }
                }
            }
        }
        if let Some(place) = first_free[usize::from(free[1] > free[0])] {
            return Some((place, Claim::Free));
        }
        if let Some(place) = self.make_room(homes) {
            return Some((place, Claim::Free));
        }
        least.map(|(_, place)| (place, Claim::Displaced))
    }

    /// [`SeqTable::claim`] for a key the table does not hold (a new table being filled from
    /// distinct keys, at every start and every growth): the window whose first free place comes
    /// first, read up to that place only, not for the key's own entry nor for every free place,
    /// which a claim reads both windows through for (in a table filled this way, with nothing
    /// withdrawn, a window's keys lie before its first free place: that place says how full it
    /// is). Reading all 16 took 19% of a 2-slot fleet's CPU samples in its restart over 1,000,000
    /// objects. Single writer.
    pub fn claim_vacant(&self, key: u128, evict_by: Option<usize>) -> Option<(usize, Claim)> {
        if key == 0 {
            return None;
        }
        let [a, b] =
            self.homes(key).map(|home| self.window(home).enumerate().find(|&(_, p)| self.key_at(p) == 0));
        match (a, b) {
            (Some((i, first)), Some((j, second))) => Some((if i <= j { first } else { second }, Claim::Free)),
            (Some((_, place)), None) | (None, Some((_, place))) => Some((place, Claim::Free)),
            (None, None) => self.claim(key, evict_by),
        }
    }

    /// Frees a place of the windows from `homes` by moving the key there to the first free place of
    /// its other window (written there before it goes from here, so that a reader that scans its
    /// windows in order and is not overtaken finds it in one of them); `None` if no key there can
    /// move, or the table allows no move. Single writer.
    fn make_room(&self, homes: [usize; 2]) -> Option<usize> {
        if !self.shape.moves {
            return None;
        }
        homes.into_iter().flat_map(|home| self.window(home)).find(|&place| {
            let key = self.key_at(place);
            let [a, b] = self.homes(key);
            let other = match (self.in_window(a, place), self.in_window(b, place)) {
                (true, false) => b,
                (false, true) => a,
                _ => return false,
            };
            let Some(to) = self.window(other).find(|&p| self.key_at(p) == 0) else { return false };
            let from = self.entry(place);
            self.write(to, key, |e| {
                for word in KEY_HI + 1..self.shape.entry_words {
                    e[word].store(from[word].load(Ordering::Relaxed), Ordering::Relaxed);
                }
            });
            self.write(place, 0, |_| {});
            true
        })
    }

    /// Writes `key` and what `fields` stores (`Relaxed`) into the entry at `place`, under its
    /// sequence number. Single writer.
    pub fn write(&self, place: usize, key: u128, fields: impl FnOnce(&[AtomicU64])) {
        seqlock::write(self.entry(place), |e| {
            e[KEY_LO].store(key as u64, Ordering::Relaxed);
            e[KEY_HI].store((key >> 64) as u64, Ordering::Relaxed);
            fields(e);
        });
    }

    /// Withdraws the entry of `key` (its key set to 0, under its sequence number); whether there
    /// was one. Single writer.
    pub fn withdraw(&self, key: u128) -> bool {
        let mut found = false;
        for place in self.places(key) {
            if key != 0 && self.key_at(place) == key {
                self.write(place, 0, |_| {});
                found = true;
            }
        }
        found
    }
}

/// Odd multipliers of the two homes' hashes.
const HOME_SEEDS: [u64; 2] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F];

/// `x` spread by a multiply, folded.
fn mix(x: u64, seed: u64) -> u64 {
    let m = u128::from(x) * u128::from(seed);
    (m as u64) ^ ((m >> 64) as u64)
}

fn key_of(entry: &[AtomicU64]) -> u128 {
    u128::from(entry[KEY_LO].load(Ordering::Relaxed))
        | u128::from(entry[KEY_HI].load(Ordering::Relaxed)) << 64
}

#[cfg(test)]
#[path = "seq_table_tests.rs"]
mod tests;
