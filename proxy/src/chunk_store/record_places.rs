//! Where each of a slot's packed records lies (`segments.rs`): the slot's one index of them, kept
//! in a packed table (`memarts_disk::packed_table`), the table the shims of its fleet's uid read
//! warm packed chunks from with no round trip. A node caching tens of millions of small chunks
//! keeps their places once, in the table it publishes anyway, not a second time in its heap.
//!
//! Until the slot publishes it ([`RecordPlaces::publish_at`]) the table is in anonymous memory (an
//! embedded engine's never leaves it). `segments.rs` keeps it in step with its records, under its
//! state's lock (the table has one writer): an entry is set once its record is written, moved with
//! it by a compaction before the old segment goes, withdrawn when the record is dropped and before
//! its segment file is unlinked.
//!
//! The table grows with what it holds, as the metadata table does (`meta_publisher.rs`): made
//! again half as large again from every record's place once 7/8 full (or once a chunk found no
//! place: `memarts_disk::table_size`), renamed over the old one, which is then marked superseded
//! (a reader of it takes what it read from it as a miss, and maps the new one). A record the largest table has no place for, or
//! that a table that could not be made again has none for, is kept in a map beside it: shims read
//! it through the slot.
//!
//! A published table lies in the run directory, writable by the fleet's uid only; still, what the
//! slot reads back from it is checked before it is used (a place past any record's bounds is no
//! place), and a record's own checks (identity, CRCs) stand behind every read.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;

use memarts_disk::chunk_file::format::MAX_IDENTITY_LEN;
use memarts_disk::packed_table::{PackedFile, Publish, RecordPlace, PACKED_MAX};
use memarts_disk::table_size;

/// Entries of a new table: 160 KiB.
pub const FIRST_ENTRIES: usize = 1 << 12;
/// Entries of the largest table: 640 MiB (up to 14 million packed chunks per slot).
pub const MAX_ENTRIES: usize = 1 << 24;

/// No record is longer: its head, identity and data, padded.
const MAX_RECORD: u64 = PACKED_MAX + MAX_IDENTITY_LEN as u64 + 4096;

/// Where a record is. `len`: its record's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Loc {
    pub seq: u32,
    pub offset: u32,
    pub len: u32,
}

impl Loc {
    pub fn record(self) -> RecordPlace {
        RecordPlace { segment: u64::from(self.seq), offset: u64::from(self.offset), len: u64::from(self.len) }
    }

    /// The place `record` names, if it could be a record's.
    fn of(record: RecordPlace) -> Option<Loc> {
        Some(Loc {
            seq: u32::try_from(record.segment).ok()?,
            offset: u32::try_from(record.offset).ok()?,
            len: u32::try_from(record.len).ok().filter(|&l| l > 0 && u64::from(l) <= MAX_RECORD)?,
        })
    }
}

pub(super) struct RecordPlaces {
    /// Where the table is published; `None` while it is the slot's own.
    path: Option<PathBuf>,
    file: PackedFile,
    /// Entries the table holds (added minus withdrawn).
    held: usize,
    /// Records the table had no place for.
    overflow: HashMap<u128, Loc>,
    /// After a table could not be made (a full run directory), none is tried again until the
    /// records are this many: not once per record.
    retry_at: usize,
}

impl RecordPlaces {
    /// An empty index in anonymous memory, with room for about `records`.
    pub fn new(records: usize) -> io::Result<RecordPlaces> {
        let file = PackedFile::private(capacity_for(records))?;
        Ok(RecordPlaces { path: None, file, held: 0, overflow: HashMap::new(), retry_at: 0 })
    }

    /// An index in anonymous memory of `records` (distinct ids), at the size that holds them.
    pub fn filled(records: Vec<(u128, Loc)>) -> io::Result<RecordPlaces> {
        let mut places = RecordPlaces::new(records.len())?;
        places.fill(records);
        Ok(places)
    }

    /// Puts `records` (distinct ids) in a table that holds none of them.
    fn fill(&mut self, records: Vec<(u128, Loc)>) {
        let table = self.file.table();
        for (id, loc) in records {
            match table.publish_new(id, loc.record()) {
                Publish::Full => {
                    self.overflow.insert(id, loc);
                }
                _ => self.held += 1,
            }
        }
    }

    fn capacity(&self) -> usize {
        self.file.table().capacity()
    }

    pub fn len(&self) -> usize {
        self.held + self.overflow.len()
    }

    /// Where chunk `id`'s record is.
    pub fn get(&self, id: u128) -> Option<Loc> {
        match self.file.table().lookup(id) {
            Some(entry) => Loc::of(entry.record),
            None => self.overflow.get(&id).copied(),
        }
    }

    pub fn contains(&self, id: u128) -> bool {
        self.get(id).is_some()
    }

    /// Every record and where it is (a scan of the whole table).
    pub fn all(&self) -> Vec<(u128, Loc)> {
        let table = self.file.table();
        let held = table.entries().into_iter().filter_map(|(id, r)| Some((id, Loc::of(r)?)));
        held.chain(self.overflow.iter().map(|(&id, &l)| (id, l))).collect()
    }

    /// Chunk `id`'s record is at `loc` now (its bytes written: shims may read it there); where it
    /// was before, if anywhere.
    pub fn insert(&mut self, id: u128, loc: Loc) -> Option<Loc> {
        let old = self.get(id);
        if self.overflow.remove(&id).is_some() || !self.put(id, loc) {
            self.overflow.insert(id, loc);
        }
        if table_size::crowded(self.held, self.capacity()) && self.can_grow() {
            self.remake(table_size::grown(self.capacity()), self.path.clone());
        }
        old
    }

    /// Sets `id`'s entry in the table, growing it if it has no place: false if it still has none.
    fn put(&mut self, id: u128, loc: Loc) -> bool {
        match self.file.table().publish(id, loc.record()) {
            Publish::Added => self.held += 1,
            Publish::Updated => {}
            Publish::Full if self.can_grow() => {
                return self.remake(table_size::grown(self.capacity()), self.path.clone())
                    && self.put(id, loc);
            }
            Publish::Full => return false,
        }
        true
    }

    fn can_grow(&self) -> bool {
        self.capacity() < MAX_ENTRIES && self.len() >= self.retry_at
    }

    /// Drops chunk `id`'s entry (its record dropped, or its segment about to go); where it was.
    pub fn remove(&mut self, id: u128) -> Option<Loc> {
        if let Some(loc) = self.overflow.remove(&id) {
            return Some(loc);
        }
        let loc = self.get(id)?;
        if self.file.table().withdraw(id) {
            self.held = self.held.saturating_sub(1);
        }
        Some(loc)
    }

    /// Publishes the table at `path` from now on (made again there from every record's place),
    /// replacing any older one (the slot's last run's), which is then marked superseded.
    pub fn publish_at(&mut self, path: PathBuf) -> io::Result<()> {
        let older = PackedFile::open_writable(&path).ok();
        let capacity = capacity_for(self.len());
        if self.path.is_none() && capacity == self.capacity() && self.overflow.is_empty() {
            // The slot's own table, made at its size at start: published as it is.
            self.file = PackedFile::create_copy(&path, &self.file)?;
            self.path = Some(path);
        } else if !self.remake(capacity, Some(path)) {
            return Err(io::Error::other("the packed table could not be made"));
        }
        if let Some(older) = older {
            older.table().mark_superseded();
        }
        Ok(())
    }

    /// Makes the table again with `capacity` entries (at most [`MAX_ENTRIES`]) at `path` (in
    /// anonymous memory for `None`), holding every record's place; false, and nothing changed, if
    /// it could not be made.
    fn remake(&mut self, capacity: usize, path: Option<PathBuf>) -> bool {
        let capacity = capacity.min(MAX_ENTRIES);
        let made = match &path {
            Some(path) => PackedFile::create(path, capacity),
            None => PackedFile::private(capacity),
        };
        let file = match made {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(
                    "packed table not made again (some packed chunks are read through the slot): {e}"
                );
                self.retry_at = self.len() + self.capacity() / 4;
                return false;
            }
        };
        let records = self.all();
        let old = std::mem::replace(&mut self.file, file);
        let republished = self.path.is_some() && self.path == path;
        self.path = path;
        self.held = 0;
        self.overflow.clear();
        self.fill(records);
        if republished {
            old.table().mark_superseded();
        }
        tracing::debug!(to = self.capacity(), held = self.held, "packed table made again");
        true
    }
}

/// Entries of a table for `records` (`table_size::holding`).
fn capacity_for(records: usize) -> usize {
    table_size::holding(records).clamp(FIRST_ENTRIES, MAX_ENTRIES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(n: u32) -> Loc {
        Loc { seq: n % 7, offset: n * 100, len: 100 + n % 50 }
    }

    #[test]
    fn places_survive_growth_overwrites_and_removals() {
        let mut places = RecordPlaces::new(0).unwrap();
        let n = 20_000u32;
        for i in 1..=n {
            assert_eq!(places.insert(u128::from(i) << 64 | 1, loc(i)), None);
        }
        let capacity = places.capacity();
        assert!(
            !table_size::crowded(n as usize, capacity) && capacity < 2 * n as usize,
            "grew to {capacity}"
        );
        for i in (1..=n).step_by(3) {
            assert_eq!(places.insert(u128::from(i) << 64 | 1, loc(i + 1)), Some(loc(i)));
        }
        for i in (2..=n).step_by(3) {
            assert_eq!(places.remove(u128::from(i) << 64 | 1), Some(loc(i)));
        }
        for i in 1..=n {
            let want = match i % 3 {
                1 => Some(loc(i + 1)),
                2 => None,
                _ => Some(loc(i)),
            };
            assert_eq!(places.get(u128::from(i) << 64 | 1), want, "chunk {i}");
        }
        assert_eq!(places.len(), places.all().len());
        assert_eq!(places.len(), n as usize - (n as usize + 1) / 3);
    }

    #[test]
    fn a_published_table_is_what_shims_read_and_the_last_one_is_superseded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("packed-0.table");
        let mut places = RecordPlaces::new(0).unwrap();
        places.insert(7 << 64 | 7, loc(7));
        places.publish_at(path.clone()).unwrap();
        let shim = PackedFile::open(&path).unwrap();
        assert_eq!(shim.table().lookup(7 << 64 | 7).map(|e| e.record), Some(loc(7).record()));
        for i in 1..=10_000u32 {
            places.insert(u128::from(i) << 64 | 2, loc(i));
        }
        assert!(shim.table().superseded(), "the grown table replaced the first");
        let now = PackedFile::open(&path).unwrap();
        assert_eq!(now.table().lookup(5 << 64 | 2).map(|e| e.record), Some(loc(5).record()));
        assert_eq!(places.get(7 << 64 | 7), Some(loc(7)));
    }

    #[test]
    fn a_table_that_cannot_grow_loses_no_place_and_is_not_retried_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        let mut places = RecordPlaces::new(0).unwrap();
        places.publish_at(run.join("packed-0.table")).unwrap();
        std::fs::remove_dir_all(&run).unwrap(); // no table can be made there any more
        let n = 10_000u32;
        for i in 1..=n {
            places.insert(u128::from(i) << 64 | 3, loc(i));
        }
        assert_eq!(places.capacity(), FIRST_ENTRIES, "no table was made");
        assert!(!places.overflow.is_empty());
        assert!(places.retry_at > places.len() - FIRST_ENTRIES, "retried until {}", places.retry_at);
        for i in 1..=n {
            assert_eq!(places.get(u128::from(i) << 64 | 3), Some(loc(i)), "chunk {i}");
        }
        assert_eq!(places.len(), n as usize);
        assert_eq!(places.all().len(), n as usize);
    }

    #[test]
    fn a_place_no_record_could_have_is_no_place() {
        let places = RecordPlaces::new(0).unwrap();
        let id = 9 << 64 | 9;
        places.file.table().publish(id, RecordPlace { segment: 1, offset: 0, len: 1 << 31 });
        assert_eq!(places.get(id), None);
        places.file.table().publish(id, RecordPlace { segment: 1, offset: 0, len: 0x1000 });
        assert_eq!(places.get(id), Some(Loc { seq: 1, offset: 0, len: 0x1000 }));
    }
}
