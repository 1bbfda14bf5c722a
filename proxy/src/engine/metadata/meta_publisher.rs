//! The slot's metadata table for local hits (`memarts_disk::meta_table`), kept in step with the
//! metadata cache (`meta_cache.rs`, whose lock serializes every write here: the table has one writer).
//!
//! The table grows with what it holds: it starts small, and once 7/8 full (or once an entry had to
//! displace another) it is made again half as large again from the cache's fresh entries
//! (`memarts_disk::table_size`), and renamed over the old one, which is then marked superseded
//! (shims map the new file at their next read, and the old mapping stays valid meanwhile): 73 to
//! 110 bytes per object (64-byte entries, 58% to 7/8 of them used).

use std::io;
use std::path::PathBuf;

use memarts_disk::meta_table::{url_key, Entry, Publish, Published, TableFile};
use memarts_disk::table_size;
use memarts_protocol::ObjectMeta;

/// Entries of a new table: 512 KiB.
pub const FIRST_ENTRIES: usize = 1 << 12;
/// Entries of the largest table: 64 MiB (about 900,000 objects per slot).
pub const MAX_ENTRIES: usize = 1 << 20;

pub struct Publisher {
    path: PathBuf,
    file: TableFile,
    ttl_ms: u64,
    /// Entries the table holds (added minus withdrawn).
    held: usize,
}

impl Publisher {
    /// A new, empty table at `path`, replacing any older one.
    pub fn create(path: PathBuf, ttl_ms: u64) -> io::Result<Publisher> {
        // The table of the slot's last run, if still there (`memarts` removes a gone slot's table,
        // a slot started by other means may find it): once this one is in its place, the shims
        // still mapping it are told so and map this one at their next read.
        let older = TableFile::open_writable(&path).ok();
        let file = TableFile::create(&path, FIRST_ENTRIES, ttl_ms)?;
        if let Some(older) = older {
            older.table().mark_superseded();
        }
        Ok(Publisher { path, file, ttl_ms, held: 0 })
    }

    pub fn capacity(&self) -> usize {
        self.file.table().capacity()
    }

    /// Publishes what shims may know of `url`: its size and ETag (an object without one is not
    /// published, and an older entry of it goes). True when the table should grow.
    pub fn publish(&mut self, url: &str, meta: &ObjectMeta, verified_ms: u64) -> bool {
        let how = self.file.table().publish(url_key(url), &published(meta, verified_ms));
        if how == Publish::Added {
            self.held += 1;
        }
        let crowded = how == Publish::Displaced || table_size::crowded(self.held, self.capacity());
        crowded && self.capacity() < MAX_ENTRIES
    }

    pub fn withdraw(&mut self, url: &str) {
        if self.file.table().withdraw(url_key(url)) {
            self.held = self.held.saturating_sub(1);
        }
    }

    /// Makes the table again, larger (`table_size::grown`), with `entries` (each under its URL's key, distinct),
    /// and puts it in place of the old one. On failure the old table stays as it is.
    pub fn grow(&mut self, entries: impl Iterator<Item = (u128, Entry)>) -> io::Result<()> {
        self.remake(table_size::grown(self.capacity()), entries)
    }

    /// Makes the table again with `entries`, `count` of them, at the size that holds them without
    /// growing (or its own, if larger): what a slot loads at its start goes in at once, not through
    /// the growths that one at a time would take (each a new file, filled again): with 50,000
    /// fresh entries a slot, those took a third of a 2-slot fleet's restart (its CPU time).
    pub fn refill(&mut self, count: usize, entries: impl Iterator<Item = (u128, Entry)>) -> io::Result<()> {
        self.remake(table_size::holding(count).max(self.capacity()), entries)
    }

    /// A new table of `capacity` entries (at most [`MAX_ENTRIES`]) holding `entries`, in place of
    /// the old one.
    fn remake(&mut self, capacity: usize, entries: impl Iterator<Item = (u128, Entry)>) -> io::Result<()> {
        let file = TableFile::create(&self.path, capacity.min(MAX_ENTRIES), self.ttl_ms)?;
        let (old_file, old_held) = (std::mem::replace(&mut self.file, file), self.held);
        let table = self.file.table();
        let added = entries.filter(|(key, entry)| table.publish_new(*key, entry) == Publish::Added).count();
        self.held = added;
        // Filled: the shims that still map the old table move to this one at their next read.
        old_file.table().mark_superseded();
        tracing::debug!(
            from = old_file.table().capacity(),
            to = self.capacity(),
            old_held,
            held = self.held,
            "metadata table made again"
        );
        Ok(())
    }
}

/// What the table says of an object of `meta` verified at `verified_ms`.
fn published(meta: &ObjectMeta, verified_ms: u64) -> Published {
    Published {
        size: meta.size,
        etag: meta.etag.clone().unwrap_or_default(),
        last_modified_ms: meta.last_modified_ms,
        verified_ms,
    }
}

/// [`published`] as an entry holds it, if it can (`Entry::of`).
pub fn entry(meta: &ObjectMeta, verified_ms: u64) -> Option<Entry> {
    Entry::of(&published(meta, verified_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64) -> ObjectMeta {
        ObjectMeta { size, etag: Some(format!("\"e{size}\"")), version: None, last_modified_ms: 0 }
    }

    #[test]
    fn a_refill_takes_every_entry_at_once_at_a_size_that_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta-0.table");
        let mut p = Publisher::create(path.clone(), 60_000).unwrap();
        let n = 3 * FIRST_ENTRIES;
        let urls: Vec<String> = (0..n as u64).map(|i| format!("s3://b/{i}")).collect();
        let metas: Vec<ObjectMeta> = (0..n as u64).map(meta).collect();
        p.refill(n, urls.iter().zip(&metas).map(|(u, m)| (url_key(u), entry(m, 7).unwrap()))).unwrap();
        assert_eq!(p.capacity(), table_size::holding(n), "no growth left for these entries");
        // Published as any entry is from now on: the same URL updated in place, not twice.
        assert!(!p.publish(&urls[0], &meta(99), 8));
        let reader = TableFile::open(&path).unwrap();
        for (url, m) in urls.iter().zip(&metas).skip(1) {
            assert_eq!(reader.table().lookup(url_key(url)).map(|f| f.size), Some(m.size), "{url}");
        }
        assert_eq!(reader.table().lookup(url_key(&urls[0])).map(|f| f.size), Some(99));
        p.withdraw(&urls[0]);
        assert_eq!(reader.table().lookup(url_key(&urls[0])), None, "no second entry of it left");
    }

    #[test]
    fn a_table_grows_with_what_it_holds_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta-0.table");
        let mut p = Publisher::create(path.clone(), 60_000).unwrap();
        assert_eq!(p.capacity(), FIRST_ENTRIES);
        let first = TableFile::open(&path).unwrap();
        let urls: Vec<String> = (0..FIRST_ENTRIES as u64).map(|i| format!("s3://b/{i}")).collect();
        let metas: Vec<ObjectMeta> = (0..FIRST_ENTRIES as u64).map(meta).collect();
        let mut grew = 0;
        for i in 0..urls.len() {
            if p.publish(&urls[i], &metas[i], 7) {
                p.grow((0..=i).map(|j| (url_key(&urls[j]), entry(&metas[j], 7).unwrap()))).unwrap();
                grew += 1;
            }
        }
        let capacity = p.capacity();
        assert!(
            grew >= 1 && !table_size::crowded(FIRST_ENTRIES, capacity),
            "grew {grew} times to {capacity}"
        );
        let reader = TableFile::open(&path).unwrap();
        assert!(first.table().superseded(), "a reader of the first table is told a newer one is in place");
        assert!(!reader.table().superseded());
        for (url, m) in urls.iter().zip(&metas) {
            let found = reader.table().lookup(url_key(url)).unwrap_or_else(|| panic!("{url} lost"));
            assert_eq!((found.size, found.etag.as_str()), (m.size, m.etag.as_deref().unwrap()));
        }
        p.withdraw(&urls[0]);
        assert_eq!(reader.table().lookup(url_key(&urls[0])), None);
        // The slot starts again: its new table takes the place of this one, which says so.
        drop(p);
        let _again = Publisher::create(path.clone(), 60_000).unwrap();
        assert!(reader.table().superseded(), "the last run's table is marked when a new run replaces it");
        assert!(!TableFile::open(&path).unwrap().table().superseded());
    }
}
