//! A metadata table in a file, mapped shared (`crate::shared_file`): created by its slot, opened
//! read-only by shims.

use std::io;
use std::path::Path;

use super::{table_len, MetaTable};
use crate::shared_file::SharedWords;

/// A mapped table file; see the module docs.
pub struct TableFile {
    words: SharedWords,
}

impl TableFile {
    /// A new, empty table of `capacity` entries at `path`, 0600,
    /// replacing any older one; the file is sparse, so only the pages entries land on take room.
    pub fn create(path: &Path, capacity: usize, ttl_ms: u64) -> io::Result<TableFile> {
        let words = SharedWords::create(path, table_len(capacity.max(1)), |w| {
            MetaTable::init(w, ttl_ms).map(drop).map_err(io::Error::other)
        })?;
        Ok(TableFile { words })
    }

    /// The table at `path` mapped for writing, for its slot only: the one a slot that starts again
    /// is about to replace, to mark it superseded ([`MetaTable::mark_superseded`]) once the new
    /// one is in place.
    pub fn open_writable(path: &Path) -> io::Result<TableFile> {
        Ok(TableFile { words: SharedWords::open(path, true, |w| MetaTable::open(w).is_ok())? })
    }

    /// The table at `path`, mapped read-only; an error if it is not one.
    pub fn open(path: &Path) -> io::Result<TableFile> {
        Ok(TableFile { words: SharedWords::open(path, false, |w| MetaTable::open(w).is_ok())? })
    }

    /// The table (its header was checked when the file was created or opened).
    pub fn table(&self) -> MetaTable<'_> {
        MetaTable::open(self.words.words()).expect("checked when mapped")
    }

    /// Whether `path` still names the file this maps (false once a restarted slot replaced it, or
    /// removed it).
    pub fn is_current(&self, path: &Path) -> bool {
        self.words.is_current(path)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{url_key, Published};
    use super::*;

    #[test]
    fn a_slot_publishes_and_a_reader_of_the_file_sees_it_until_the_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta-0.table");
        let writer = TableFile::create(&path, 1000, 5000).unwrap();
        assert_eq!(writer.table().capacity(), 1000);
        let reader = TableFile::open(&path).unwrap();
        let k = url_key("s3://b/k");
        let p = Published { size: 7, etag: "\"e\"".into(), last_modified_ms: 3, verified_ms: 1 };
        assert_eq!(writer.table().publish(k, &p), super::super::Publish::Added);
        assert_eq!(reader.table().lookup(k), Some(p));
        assert_eq!(reader.table().ttl_ms(), 5000);
        assert!(reader.is_current(&path));
        let again = TableFile::create(&path, 16, 5000).unwrap();
        assert!(!reader.is_current(&path) && again.is_current(&path));
        assert_eq!(TableFile::open(&path).unwrap().table().lookup(k), None);
        std::fs::write(dir.path().join("junk"), [7u8; 4096]).unwrap();
        assert!(TableFile::open(&dir.path().join("junk")).is_err());
        assert!(TableFile::open(&dir.path().join("missing")).is_err());
    }
}
