//! A metadata table in a file, mapped shared: created by its slot (a temp file renamed into place, so
//! no reader maps a half-made one), opened read-only by shims.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::AtomicU64;

use memmap2::{MmapOptions, MmapRaw};

use super::{table_len, MetaTable};

/// A mapped table file; see the module docs.
pub struct TableFile {
    map: MmapRaw,
    /// Device and inode of the file mapped: a slot that starts again replaces the file, and a
    /// reader compares this with the path's to know.
    identity: (u64, u64),
}

impl TableFile {
    /// A new, empty table of `capacity` entries (rounded down to a power of two) at `path`, 0600,
    /// replacing any older one; the file is sparse, so only the pages entries land on take room.
    pub fn create(path: &Path, capacity: usize, ttl_ms: u64) -> io::Result<TableFile> {
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&tmp)?;
        let made = (|| {
            file.set_len(table_len(capacity.max(1)) as u64)?;
            let map = MmapOptions::new().map_raw(&file)?;
            let table = TableFile { map, identity: identity(&file)? };
            MetaTable::init(table.words(), ttl_ms).map_err(io::Error::other)?;
            std::fs::rename(&tmp, path)?;
            Ok(table)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        made
    }

    /// The table at `path` mapped for writing, for its slot only: the one a slot that starts again
    /// is about to replace, to mark it superseded ([`MetaTable::mark_superseded`]) once the new
    /// one is in place.
    pub fn open_writable(path: &Path) -> io::Result<TableFile> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let map = MmapOptions::new().map_raw(&file)?;
        let table = TableFile { map, identity: identity(&file)? };
        MetaTable::open(table.words()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(table)
    }

    /// The table at `path`, mapped read-only; an error if it is not one.
    pub fn open(path: &Path) -> io::Result<TableFile> {
        let file = File::open(path)?;
        let map = MmapOptions::new().map_raw_read_only(&file)?;
        let table = TableFile { map, identity: identity(&file)? };
        MetaTable::open(table.words()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(table)
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned (so aligned for u64) and lives as long as `self`; its
        // length is rounded down to whole words. AtomicU64 has the layout of u64. Every access to
        // these words, in this process and in the others that map the file, is an atomic one (the
        // table's code does nothing else), so sharing them is no data race. A read-only mapping is
        // only ever loaded from: `MetaTable` stores only through a table made by `create` or
        // `open_writable`, and a u64 atomic load is a plain load on the 64-bit targets memarts
        // builds for.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8) }
    }

    /// The table (its header was checked when the file was created or opened).
    pub fn table(&self) -> MetaTable<'_> {
        MetaTable::open(self.words()).expect("checked when mapped")
    }

    /// Whether `path` still names the file this maps (false once a restarted slot replaced it, or
    /// removed it).
    pub fn is_current(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }
}

fn identity(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
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
        assert_eq!(writer.table().capacity(), 512);
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
