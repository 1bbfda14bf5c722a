//! The slot's packed table (`memarts_disk::packed_table`): where each of its packed records lies,
//! published for the shims of its fleet's uid, which then read warm packed chunks with no round
//! trip. `segments.rs` keeps it in step with its records, under its state's lock (the table has one
//! writer): an entry is published once its record is written, moved with it by a compaction before
//! the old segment goes, withdrawn when the record is dropped and before its segment file is
//! unlinked.
//!
//! The table grows with what it holds, as the metadata table does (`meta_publisher.rs`): made again
//! at twice the size from every record's place once half full (or once a chunk found no place),
//! renamed over the old one, which is then marked superseded (a reader of it takes what it read
//! from it as a miss, and maps the new one).

use std::io;
use std::path::PathBuf;

use memarts_disk::packed_table::{PackedFile, Publish, RecordPlace};

/// Entries of a new table: 256 KiB, sparse.
pub const FIRST_ENTRIES: usize = 1 << 12;
/// Entries of the largest table: 256 MiB (two million packed chunks per slot).
pub const MAX_ENTRIES: usize = 1 << 22;

pub(super) struct PackedPublisher {
    path: PathBuf,
    file: PackedFile,
    /// Entries the table holds (added minus withdrawn).
    held: usize,
}

impl PackedPublisher {
    /// A new table at `path` holding `records`, replacing any older one (the slot's last run's),
    /// which is then marked superseded.
    pub fn create(path: PathBuf, records: Vec<(u128, RecordPlace)>) -> io::Result<PackedPublisher> {
        let older = PackedFile::open_writable(&path).ok();
        let capacity = (records.len() * 2).next_power_of_two().clamp(FIRST_ENTRIES, MAX_ENTRIES);
        let mut publisher = PackedPublisher { file: PackedFile::create(&path, capacity)?, path, held: 0 };
        for (id, record) in records {
            publisher.publish_once(id, record, true);
        }
        if let Some(older) = older {
            older.table().mark_superseded();
        }
        Ok(publisher)
    }

    fn capacity(&self) -> usize {
        self.file.table().capacity()
    }

    /// Publishes one entry (`new`: into a table being filled from distinct records, which does not
    /// hold it); whether the table should grow.
    fn publish_once(&mut self, id: u128, record: RecordPlace, new: bool) -> bool {
        let table = self.file.table();
        let how = if new { table.publish_new(id, record) } else { table.publish(id, record) };
        if how == Publish::Added {
            self.held += 1;
        }
        (how == Publish::Full || self.held * 2 > self.capacity()) && self.capacity() < MAX_ENTRIES
    }

    /// Publishes where chunk `id`'s record is now (its bytes written); the table is made again at
    /// twice its size from `all` (every record's place, this one's included) when it should grow.
    pub fn publish(&mut self, id: u128, record: RecordPlace, all: impl FnOnce() -> Vec<(u128, RecordPlace)>) {
        if self.publish_once(id, record, false) {
            if let Err(e) = self.grow(all()) {
                tracing::warn!("packed table not grown (some packed chunks are read through the slot): {e}");
            }
        }
    }

    fn grow(&mut self, records: Vec<(u128, RecordPlace)>) -> io::Result<()> {
        let file = PackedFile::create(&self.path, (self.capacity() * 2).min(MAX_ENTRIES))?;
        let old = std::mem::replace(&mut self.file, file);
        self.held = 0;
        for (id, record) in records {
            self.publish_once(id, record, true);
        }
        old.table().mark_superseded();
        tracing::debug!(to = self.capacity(), held = self.held, "packed table grown");
        Ok(())
    }

    /// Withdraws chunk `id`'s entry (its record dropped, or its segment about to go).
    pub fn withdraw(&mut self, id: u128) {
        if self.file.table().withdraw(id) {
            self.held = self.held.saturating_sub(1);
        }
    }
}
