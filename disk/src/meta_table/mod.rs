//! The metadata table a proxy slot publishes for the shims of its fleet's uid: for each object whose
//! metadata the slot holds, its size and ETag and when they were last verified with the origin. With
//! it, a shim that reads an object can name its chunk files itself (a chunk file's name is a pure
//! function of object, ETag, chunk size and index) and read a warm object with no round trip to a
//! proxy at all (a local hit).
//!
//! One file per slot (`<run dir>/meta-<slot>.table`, 0600), mapped shared: the slot writes it, any
//! number of shim processes read it. The slot is its only writer (one lock in the slot serializes its
//! writes); readers never block it and never see a torn entry: every entry is guarded by a sequence
//! number (a seqlock: odd while being written), and every word is read and written as an atomic.
//! The table is a cache: an entry may be overwritten by another URL at any time, and a reader that
//! finds nothing, or an entry older than the TTL, asks the proxy as before.
//!
//! Layout (words of 8 bytes in the machine's byte order: the table never leaves its machine):
//!
//! ```text
//! word      field
//! 0         magic b"MAMETAT1"
//! 1         layout version = 4
//! 2         capacity: entries
//! 3         ttl_ms: how long an entry is trusted after its verification
//! 4         superseded: 1 once the slot put a newer table in this one's place, else 0
//! 5..8      reserved, 0
//! 8 + 8i    entry i, 8 words (64 bytes):
//!   +0        seq: 0 never written; odd while being written; even once written
//!   +1, +2    key: the URL's 128-bit hash (low, high); both 0 for an entry withdrawn
//!   +3        object size in bytes
//!   +4        verified_ms << 20 | ETag form << 16 | the form's argument (16 bits); verified_ms:
//!             when the ETag was last verified, ms since the Unix epoch (so that entries compare
//!             by it first)
//!   +5        last_modified_ms: the object's Last-Modified, ms since the Unix epoch
//!   +6, +7    the ETag's 16 bytes, read as its form says (`etag.rs`: an MD5, an MD5 and a part
//!             count, a local file's inode and mtime, or up to 16 bytes as they are)
//! ```
//!
//! An ETag of none of those forms is not published (its object's reads take the proxy).
//!
//! An entry lives in one of two windows of [`PROBES`] consecutive places, each from a home place
//! taken from the key; a writer takes the URL's own place, else a free one (moving another entry
//! to its other window to make one if it must), else the least recently verified one of those
//! places.
//! (The header, the seqlocked entries and the probing are every shared table's: `crate::seq_table`.)

use std::sync::atomic::{AtomicU64, Ordering};

use crate::seq_table::{BadHeader, Claim, SeqTable, Shape};

pub mod etag;
mod file;
pub use file::TableFile;

/// Word 0 of every table.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MAMETAT1");
/// The layout this code reads and writes (2: entries probed over 32 places, not 8; 3: entries of
/// 8 words, the ETag in 16 bytes; 4: two windows of 8 places, any capacity).
pub const VERSION: u64 = 4;
/// Words before the first entry.
pub const HEADER_WORDS: usize = 8;
/// Words per entry.
pub const ENTRY_WORDS: usize = 8;
/// Places of each of an entry's two windows (`crate::seq_table`): with entries moved between
/// their windows, a table fills to about 90% before a new entry first finds all its places taken,
/// and a reader looks at 16 places at most (one window of 32 places filled to about half).
pub const PROBES: usize = 8;

/// Header word of the TTL.
const TTL: usize = 3;

static SHAPE: Shape = Shape {
    magic: MAGIC,
    version: VERSION,
    header_words: HEADER_WORDS,
    entry_words: ENTRY_WORDS,
    superseded: 4,
    probes: PROBES,
    moves: true,
};

impl From<BadHeader> for TableError {
    fn from(bad: BadHeader) -> Self {
        match bad {
            BadHeader::NotATable => TableError::NotATable,
            BadHeader::BadCapacity(c) => TableError::BadCapacity(c),
        }
    }
}

// Entry words after the key (words 1 and 2, `crate::seq_table`).
const SIZE: usize = 3;
const VERIFIED: usize = 4;
const LAST_MODIFIED: usize = 5;
const ETAG: usize = 6;
/// Bits of the verified word below `verified_ms`.
const VERIFIED_SHIFT: u32 = 20;

/// Bytes of a table of `capacity` entries.
pub fn table_len(capacity: usize) -> usize {
    (HEADER_WORDS + capacity * ENTRY_WORDS) * 8
}

/// The hash a URL (as the proxies spell it, `ObjectUrl::to_string`) is published under.
pub fn url_key(url: &str) -> u128 {
    // Seeded apart from chunk ids, which hash other bytes with the same function.
    xxhash_rust::xxh3::xxh3_128_with_seed(url.as_bytes(), 0x6d65_7461_7461_626c)
}

/// What a table says of one object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub size: u64,
    pub etag: String,
    /// The object's Last-Modified, ms since the Unix epoch (0 when unknown).
    pub last_modified_ms: i64,
    /// When the ETag was last verified with the origin, ms since the Unix epoch.
    pub verified_ms: u64,
}

/// A [`Published`] as an entry holds it: its ETag packed (`etag::pack`). What a slot publishes from
/// metadata it holds packed already (`PackedMeta` of the proxy's metadata cache), with no ETag text
/// made and parsed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub etag: etag::PackedEtag,
    pub last_modified_ms: i64,
    pub verified_ms: u64,
}

impl Entry {
    /// `published` packed; `None` for an ETag of none of the forms an entry holds.
    pub fn of(published: &Published) -> Option<Entry> {
        Some(Entry {
            size: published.size,
            etag: etag::pack(&published.etag, published.size)?,
            last_modified_ms: published.last_modified_ms,
            verified_ms: published.verified_ms,
        })
    }
}

/// What [`MetaTable::publish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// Nothing written (an ETag that does not fit, or none).
    Skipped,
    /// The URL's entry was rewritten.
    Updated,
    /// A free place was taken.
    Added,
    /// Every place the URL may take was another's: the least recently verified one gave way (a
    /// table that should grow).
    Displaced,
}

/// Why words cannot be used as a table.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("not a metadata table (bad magic or layout version)")]
    NotATable,
    #[error("the table's capacity {0} does not fit its file")]
    BadCapacity(u64),
}

/// A table over mapped words (see the module docs). Reading is safe from any number of threads and
/// processes; [`MetaTable::publish`] and [`MetaTable::withdraw`] need a single writer at a time.
pub struct MetaTable<'a> {
    table: SeqTable<'a>,
    ttl_ms: u64,
}

impl<'a> MetaTable<'a> {
    /// Writes a header into `words`, all zero (a new file), for as many entries as fit.
    pub fn init(words: &'a [AtomicU64], ttl_ms: u64) -> Result<MetaTable<'a>, TableError> {
        let table = SeqTable::init(words, &SHAPE, |w| w[TTL].store(ttl_ms, Ordering::Relaxed))?;
        Ok(MetaTable { table, ttl_ms })
    }

    /// Opens the table in `words`, checking its header.
    pub fn open(words: &'a [AtomicU64]) -> Result<MetaTable<'a>, TableError> {
        let table = SeqTable::open(words, &SHAPE)?;
        let ttl_ms = table.header()[TTL].load(Ordering::Relaxed);
        Ok(MetaTable { table, ttl_ms })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// How long an entry is trusted after its verification (the fleet's metadata TTL).
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// Tells the readers that a newer table is in this one's place (its writer publishes there
    /// from now on), so that they map it at once rather than at their next periodic look.
    pub fn mark_superseded(&self) {
        self.table.mark_superseded();
    }

    /// Whether the writer put a newer table in this one's place ([`MetaTable::mark_superseded`]).
    /// A table of an older writer never says so; its readers find a new one by looking again.
    pub fn superseded(&self) -> bool {
        self.table.superseded()
    }

    /// What the table says of the URL hashed to `key` (see [`url_key`]), whatever its age: the caller
    /// checks `verified_ms` against [`MetaTable::ttl_ms`]. `None` also when a writer kept changing
    /// the entry (the caller asks the proxy).
    pub fn lookup(&self, key: u128) -> Option<Published> {
        let read = |entry: &[AtomicU64]| {
            let word = |i: usize| entry[i].load(Ordering::Relaxed);
            (word(SIZE), word(VERIFIED), word(LAST_MODIFIED) as i64, [word(ETAG), word(ETAG + 1)])
        };
        // A consistent copy; what it holds is checked as any input is.
        let decode = |(size, verified, last_modified_ms, etag): (u64, u64, i64, [u64; 2])| {
            let mut bytes = [0; 16];
            bytes[..8].copy_from_slice(&etag[0].to_le_bytes());
            bytes[8..].copy_from_slice(&etag[1].to_le_bytes());
            let form = etag::Form::from_u8((verified >> 16) as u8 & 0xf)?;
            let etag = etag::unpack(&etag::PackedEtag { form, arg: verified as u16, bytes }, size)?;
            Some(Published { size, etag, last_modified_ms, verified_ms: verified >> VERIFIED_SHIFT })
        };
        self.table.find(key, read, decode).map(|found| found.fields)
    }

    /// Publishes `published` for the URL hashed to `key`, and says how; nothing is written for an
    /// ETag of none of the forms an entry holds (`etag.rs`), or a verification time past 2527 (and
    /// an older entry of the URL is withdrawn). Single writer.
    pub fn publish(&self, key: u128, published: &Published) -> Publish {
        self.put(key, Entry::of(published).as_ref(), false)
    }

    /// [`MetaTable::publish`] of a key the table does not hold, its ETag packed already: a new table
    /// filled from distinct keys (`SeqTable::claim_vacant`). Single writer.
    pub fn publish_new(&self, key: u128, entry: &Entry) -> Publish {
        self.put(key, Some(entry), true)
    }

    fn put(&self, key: u128, entry: Option<&Entry>, vacant: bool) -> Publish {
        let (Some(entry), true, true) =
            (entry, entry.is_some_and(|e| e.verified_ms >> (64 - VERIFIED_SHIFT) == 0), key != 0)
        else {
            if key != 0 {
                self.withdraw(key); // an older version's entry must not outlive this one
            }
            return Publish::Skipped;
        };
        let claimed = if vacant {
            self.table.claim_vacant(key, Some(VERIFIED))
        } else {
            self.table.claim(key, Some(VERIFIED))
        };
        let Some((place, how)) = claimed else {
            return Publish::Skipped;
        };
        let packed = &entry.etag;
        let verified =
            entry.verified_ms << VERIFIED_SHIFT | u64::from(packed.form as u8) << 16 | u64::from(packed.arg);
        let etag_word =
            |i: usize| u64::from_le_bytes(packed.bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        self.table.write(place, key, |e| {
            e[SIZE].store(entry.size, Ordering::Relaxed);
            e[VERIFIED].store(verified, Ordering::Relaxed);
            e[LAST_MODIFIED].store(entry.last_modified_ms as u64, Ordering::Relaxed);
            e[ETAG].store(etag_word(0), Ordering::Relaxed);
            e[ETAG + 1].store(etag_word(1), Ordering::Relaxed);
        });
        match how {
            Claim::Own => Publish::Updated,
            Claim::Free => Publish::Added,
            Claim::Displaced => Publish::Displaced,
        }
    }

    /// Removes what the table says of the URL hashed to `key` (the object changed or is gone);
    /// whether it said anything. Single writer.
    pub fn withdraw(&self, key: u128) -> bool {
        self.table.withdraw(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(capacity: usize) -> Vec<AtomicU64> {
        (0..table_len(capacity) / 8).map(|_| AtomicU64::new(0)).collect()
    }

    fn published(etag: &str, size: u64) -> Published {
        Published { size, etag: etag.into(), last_modified_ms: -5, verified_ms: 1_700_000_000_000 + size }
    }

    #[test]
    fn what_is_published_is_found_and_what_is_withdrawn_is_not() {
        let w = words(64);
        let table = MetaTable::init(&w, 60_000).unwrap();
        let (a, b) = (url_key("s3://b/a"), url_key("s3://b/b"));
        assert_eq!(table.lookup(a), None);
        assert_eq!(table.publish(a, &published("\"etag-a\"", 10)), Publish::Added);
        assert_eq!(table.publish(b, &published("\"etag-b\"", 20)), Publish::Added);
        assert_eq!(table.lookup(a), Some(published("\"etag-a\"", 10)));
        assert_eq!(table.publish(a, &published("\"etag-a2\"", 11)), Publish::Updated);
        assert_eq!(table.lookup(a), Some(published("\"etag-a2\"", 11)));
        assert!(table.withdraw(a));
        assert!(!table.withdraw(a));
        assert_eq!(table.lookup(a), None);
        assert_eq!(table.lookup(b), Some(published("\"etag-b\"", 20)));
        // A reader's view of the same words.
        let other = MetaTable::open(&w).unwrap();
        assert_eq!((other.capacity(), other.ttl_ms()), (64, 60_000));
        assert_eq!(other.lookup(b), Some(published("\"etag-b\"", 20)));
    }

    #[test]
    fn an_etag_of_no_form_is_not_published_and_withdraws_the_old_one() {
        let w = words(16);
        let table = MetaTable::init(&w, 1000).unwrap();
        let k = url_key("s3://b/k");
        assert_eq!(table.publish(k, &published("short", 1)), Publish::Added);
        assert_eq!(table.publish(k, &published(&"x".repeat(17), 2)), Publish::Skipped);
        assert_eq!(table.lookup(k), None, "the old version's entry went");
        let multipart = "\"9e107d9d372bb6826bd81d3542a419d6-300\"";
        assert_eq!(table.publish(k, &published(multipart, 3)), Publish::Added);
        assert_eq!(table.lookup(k).unwrap().etag, multipart);
        assert_eq!(table.publish(k, &published("", 4)), Publish::Skipped);
        assert_eq!(table.lookup(k), None);
    }

    #[test]
    fn a_full_neighbourhood_gives_up_its_least_recently_verified_entry() {
        let w = words(8);
        let table = MetaTable::init(&w, 1000).unwrap();
        // Nine keys for eight places: each probes all of them.
        let keys: Vec<u128> = (0..9).map(|i| url_key(&format!("s3://b/{i}"))).collect();
        for (i, k) in keys.iter().enumerate() {
            let want = if i < 8 { Publish::Added } else { Publish::Displaced };
            assert_eq!(table.publish(*k, &published("e", i as u64)), want);
        }
        assert_eq!(table.lookup(keys[0]), None, "the oldest made room");
        for k in &keys[1..] {
            assert!(table.lookup(*k).is_some());
        }
    }

    #[test]
    fn headers_that_are_not_a_table_are_refused() {
        let w = words(8);
        assert_eq!(MetaTable::open(&w).err(), Some(TableError::NotATable));
        MetaTable::init(&w, 1).unwrap();
        w[2].store(0, Ordering::Relaxed);
        assert_eq!(MetaTable::open(&w).err(), Some(TableError::BadCapacity(0)));
        w[2].store(1 << 40, Ordering::Relaxed);
        assert_eq!(MetaTable::open(&w).err(), Some(TableError::BadCapacity(1 << 40)));
        assert!(MetaTable::init(&w[..4], 1).is_err());
        // Garbage in an entry's fields is refused, not trusted.
        let table = MetaTable::init(&w, 1).unwrap();
        let k = url_key("s3://b/x");
        table.publish(k, &published("e", 1));
        for i in 0..8 {
            if table.table.key_at(i) == k {
                table.table.entry(i)[VERIFIED].store(7 << 16 | 1, Ordering::Relaxed);
                // no such form
            }
        }
        assert_eq!(table.lookup(k), None);
    }

    /// Readers racing one writer never see a mix of two entries: every entry they find is one that
    /// was published whole.
    #[test]
    fn readers_racing_a_writer_see_whole_entries_only() {
        let w = words(64);
        let table = MetaTable::init(&w, 1000).unwrap();
        let keys: Vec<u128> = (0..32).map(|i| url_key(&format!("s3://b/{i}"))).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let reader = MetaTable::open(&w).unwrap();
                    let mut seen = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for k in &keys {
                            if let Some(p) = reader.lookup(*k) {
                                // Version v of a key has size v and ETag "v<v>" padded by v % 8.
                                let want = format!("v{}", p.size);
                                let want =
                                    format!("{want:x<width$}", width = (p.size % 8) as usize + want.len());
                                assert_eq!(p.etag, want, "a torn entry");
                                seen += 1;
                            }
                        }
                    }
                    assert!(seen > 0);
                });
            }
            for v in 0..20_000u64 {
                let k = keys[(v % 32) as usize];
                let etag = format!("v{v}");
                let etag = format!("{etag:x<width$}", width = (v % 8) as usize + etag.len());
                if v % 7 == 0 {
                    table.withdraw(k);
                } else {
                    table.publish(k, &Published { size: v, etag, last_modified_ms: 0, verified_ms: v });
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
