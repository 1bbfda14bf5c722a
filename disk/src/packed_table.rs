//! Where a slot's packed chunks lie in its segment files (`crate::segment`), published for the shims
//! of its fleet's uid: with it, a shim reads a warm packed chunk's record itself (one `pread`) and
//! checks it exactly as the slot does ([`crate::segment::check_record`]), with no round trip.
//!
//! An entry says "chunk `id` is the record of `len` bytes at `offset` of segment `segment`". The
//! slot keeps it true:
//! - an entry is written only once the record's bytes are in the segment file (after the write
//!   returned), so a reader never reads bytes not yet written;
//! - a record moved by a compaction is published at its new place before its old segment file
//!   goes, and every entry of a segment is withdrawn before its file is unlinked;
//! - an entry is withdrawn when its record is dropped (evicted, replaced, found corrupt).
//!
//! An entry may change at any moment, so a reader reads the record, then checks the entry is as it
//! was before the read ([`PackedTable::unchanged`]) and that the table was not superseded; a changed
//! entry is a miss. Segment numbers are not reused while a slot runs, and the record's own checks
//! (identity bytes, both CRCs) are the last guard: a reader never serves a record that is not the
//! chunk it asked for.
//!
//! One file per slot (`<run dir>/packed-<slot>.table`, 0600, `crate::layout`), mapped shared, the
//! slot its only writer; entries seqlocked on `crate::seq_table`; it grows as the others do (made
//! again at twice the size, the old one marked superseded).
//!
//! Layout (words of 8 bytes in the machine's byte order: the table never leaves its machine):
//!
//! ```text
//! word      field
//! 0         magic b"MAPACKT1"
//! 1         layout version = 3
//! 2         capacity: entries
//! 3         superseded: 1 once the slot put a newer table in this one's place, else 0
//! 4..8      reserved, 0
//! 8 + 5i    entry i, 5 words (40 bytes):
//!   +0        seq: 0 never written; odd while being written; even once written
//!   +1, +2    chunk id (low, high); both 0 for an entry withdrawn
//!   +3        segment | len << 32: the number of the segment file (`<seq:016x>.seg` in the slot's
//!             directory) and the length of the whole record, padding included (what
//!             `Segments::read` reads)
//!   +4        offset of the record in that file
//! ```

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::seq_table::{BadHeader, Claim, SeqTable, Shape};
use crate::shared_file::SharedWords;

/// Word 0 of every packed table.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MAPACKT1");
/// The layout this code reads and writes (2: entries of 5 words, not 8; 3: two windows of 8
/// places, any capacity).
pub const VERSION: u64 = 3;
/// Words before the first entry.
pub const HEADER_WORDS: usize = 8;
/// Words per entry.
pub const ENTRY_WORDS: usize = 5;
/// Places of each of an entry's two windows, as in the metadata table (`crate::seq_table`): a
/// table fills to about 90% before a chunk first finds all its places taken.
pub const PROBES: usize = 8;
/// The largest chunk a slot packs (its `pack_max` is at most this): a shim looks for larger chunks
/// as files only.
pub const PACKED_MAX: u64 = 64 << 10;

// Entry words after the chunk id (words 1 and 2, `crate::seq_table`).
const SEGMENT_LEN: usize = 3;
const OFFSET: usize = 4;

/// Bytes of a table of `capacity` entries.
pub fn table_len(capacity: usize) -> usize {
    (HEADER_WORDS + capacity * ENTRY_WORDS) * 8
}

static SHAPE: Shape = Shape {
    magic: MAGIC,
    version: VERSION,
    header_words: HEADER_WORDS,
    entry_words: ENTRY_WORDS,
    superseded: 3,
    probes: PROBES,
    moves: true,
};

/// Where a packed chunk's record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPlace {
    pub segment: u64,
    pub offset: u64,
    pub len: u64,
}

/// An entry as a reader found it, and where and at what sequence number, to tell after the read
/// whether it held throughout ([`PackedTable::unchanged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedEntry {
    pub record: RecordPlace,
    place: usize,
    seq: u64,
}

/// What [`PackedTable::publish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// The chunk's entry was rewritten (its record moved).
    Updated,
    /// A free place was taken.
    Added,
    /// Every place the chunk may take is another's: not published (a table that should grow).
    Full,
}

/// Why words cannot be used as a packed table.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PackedTableError {
    #[error("not a packed table (bad magic or layout version)")]
    NotATable,
    #[error("the packed table's capacity {0} does not fit its file")]
    BadCapacity(u64),
}

impl From<BadHeader> for PackedTableError {
    fn from(bad: BadHeader) -> Self {
        match bad {
            BadHeader::NotATable => PackedTableError::NotATable,
            BadHeader::BadCapacity(c) => PackedTableError::BadCapacity(c),
        }
    }
}

/// A packed table over mapped words (see the module docs). Reading is safe from any number of
/// threads and processes; [`PackedTable::publish`] and [`PackedTable::withdraw`] need a single
/// writer at a time.
pub struct PackedTable<'a> {
    table: SeqTable<'a>,
}

impl<'a> PackedTable<'a> {
    /// Writes a header into `words`, all zero (a new file), for as many entries as fit.
    pub fn init(words: &'a [AtomicU64]) -> Result<PackedTable<'a>, PackedTableError> {
        Ok(PackedTable { table: SeqTable::init(words, &SHAPE, |_| {})? })
    }

    /// Opens the table in `words`, checking its header.
    pub fn open(words: &'a [AtomicU64]) -> Result<PackedTable<'a>, PackedTableError> {
        Ok(PackedTable { table: SeqTable::open(words, &SHAPE)? })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Tells the readers that a newer table is in this one's place.
    pub fn mark_superseded(&self) {
        self.table.mark_superseded();
    }

    pub fn superseded(&self) -> bool {
        self.table.superseded()
    }

    /// The entry of chunk `id`, if its slot published one (read consistently: never a torn one).
    pub fn lookup(&self, id: u128) -> Option<PackedEntry> {
        let found = self.table.find(id, read_place, held)?;
        Some(PackedEntry { record: found.fields, place: found.place, seq: found.seq })
    }

    /// Whether `entry` is as it was found: no write to it since, and the table not superseded. A
    /// read made between finding it and this answer being true read the record it names, in the
    /// segment file the slot had not removed.
    pub fn unchanged(&self, entry: &PackedEntry) -> bool {
        self.table.unchanged(entry.place, entry.seq) && !self.superseded()
    }

    /// Publishes where chunk `id`'s record is (its bytes written); a segment number or length
    /// past 32 bits is not (a slot's are not: `Segments` numbers them in 32 bits, records are at
    /// most [`PACKED_MAX`] and a head). Single writer.
    pub fn publish(&self, id: u128, record: RecordPlace) -> Publish {
        self.put(id, record, false)
    }

    /// [`PackedTable::publish`] of a chunk the table does not hold: a new table filled from
    /// distinct chunks (`SeqTable::claim_vacant`). Single writer.
    pub fn publish_new(&self, id: u128, record: RecordPlace) -> Publish {
        self.put(id, record, true)
    }

    fn put(&self, id: u128, record: RecordPlace, vacant: bool) -> Publish {
        if (record.segment | record.len) >> 32 != 0 {
            self.withdraw(id);
            return Publish::Full;
        }
        let claimed = if vacant { self.table.claim_vacant(id, None) } else { self.table.claim(id, None) };
        let Some((place, how)) = claimed else { return Publish::Full };
        self.table.write(place, id, |e| {
            e[SEGMENT_LEN].store(record.segment | record.len << 32, Ordering::Relaxed);
            e[OFFSET].store(record.offset, Ordering::Relaxed);
        });
        match how {
            Claim::Own => Publish::Updated,
            Claim::Free | Claim::Displaced => Publish::Added,
        }
    }

    /// Withdraws chunk `id`'s entry: from now on no reader finds it, and a reader that found it
    /// before sees it changed. Single writer.
    pub fn withdraw(&self, id: u128) -> bool {
        self.table.withdraw(id)
    }

    /// Every chunk published now and where (a scan of the whole table: for tests and tools).
    pub fn entries(&self) -> Vec<(u128, RecordPlace)> {
        self.table.entries(read_place, held)
    }
}

fn read_place(e: &[AtomicU64]) -> RecordPlace {
    let segment_len = e[SEGMENT_LEN].load(Ordering::Relaxed);
    RecordPlace {
        segment: segment_len & 0xffff_ffff,
        offset: e[OFFSET].load(Ordering::Relaxed),
        len: segment_len >> 32,
    }
}

/// A place that names a record (an entry of length 0 names none).
fn held(record: RecordPlace) -> Option<RecordPlace> {
    (record.len > 0).then_some(record)
}

/// A packed table in its file (`crate::shared_file`).
pub struct PackedFile {
    words: SharedWords,
}

impl PackedFile {
    /// A new, empty table of `capacity` entries at `path`, 0600,
    /// replacing any older one.
    pub fn create(path: &Path, capacity: usize) -> io::Result<PackedFile> {
        let words = SharedWords::create(path, table_len(capacity.max(1)), |w| {
            PackedTable::init(w).map(drop).map_err(io::Error::other)
        })?;
        Ok(PackedFile { words })
    }

    /// A new table at `path` (0600, replacing any older one) holding what `table` holds now, word
    /// for word: publishing a slot's own table at its size without placing each entry again. Pages
    /// of `table` never written are not written (the file stays sparse). Single writer of `table`.
    pub fn create_copy(path: &Path, table: &PackedFile) -> io::Result<PackedFile> {
        let from = table.words.words();
        let words = SharedWords::create(path, from.len() * 8, |to| {
            for (to, from) in to.iter().zip(from) {
                let word = from.load(Ordering::Relaxed);
                if word != 0 {
                    to.store(word, Ordering::Relaxed);
                }
            }
            PackedTable::open(to).map(drop).map_err(io::Error::other)
        })?;
        Ok(PackedFile { words })
    }

    /// A new, empty table of `capacity` entries in anonymous memory: the slot's own, which no shim
    /// reads (a slot that publishes none, as an embedded engine's).
    pub fn private(capacity: usize) -> io::Result<PackedFile> {
        let words = SharedWords::anonymous(table_len(capacity.max(1)), |w| {
            PackedTable::init(w).map(drop).map_err(io::Error::other)
        })?;
        Ok(PackedFile { words })
    }

    /// The table at `path` mapped for writing, for its slot only: the one a slot that starts again
    /// is about to replace, to mark it superseded once the new one is in place.
    pub fn open_writable(path: &Path) -> io::Result<PackedFile> {
        Ok(PackedFile { words: SharedWords::open(path, true, |w| PackedTable::open(w).is_ok())? })
    }

    /// The table at `path`, mapped read-only; an error if it is not one.
    pub fn open(path: &Path) -> io::Result<PackedFile> {
        Ok(PackedFile { words: SharedWords::open(path, false, |w| PackedTable::open(w).is_ok())? })
    }

    /// The table (its header was checked when the file was created or opened).
    pub fn table(&self) -> PackedTable<'_> {
        PackedTable::open(self.words.words()).expect("checked when mapped")
    }

    /// Whether `path` still names the file this maps (false once a restarted slot replaced it, or
    /// removed it).
    pub fn is_current(&self, path: &Path) -> bool {
        self.words.is_current(path)
    }
}

#[cfg(test)]
#[path = "packed_table_tests.rs"]
mod tests;
