//! Open, header-verified chunk files of recent hits, so that a hit on a hot chunk costs one `fstat`
//! instead of an `open` and a header read.
//!
//! An entry is trusted only while the file is unchanged: each lookup compares the file's inode,
//! size, mtime and ctime with what they were when the header was verified; any difference drops the
//! entry and the caller takes the full path again (reopen, decode and check the header). The data
//! itself is checked by whoever reads it (the shim's CRC32C), as on the full path. Entries are
//! dropped when their chunk is evicted or found corrupt, so no deleted file is kept open.

use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use lru::LruCache;

use crate::chunk_store::CachedChunk;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

fn stamp(chunk: &CachedChunk) -> Option<Stamp> {
    let m = chunk.file.metadata().ok()?;
    Some(Stamp {
        ino: m.ino(),
        size: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    })
}

pub struct OpenChunks {
    entries: Mutex<LruCache<u128, (CachedChunk, Stamp)>>,
}

impl OpenChunks {
    pub fn new(max_open: usize) -> OpenChunks {
        let cap = std::num::NonZeroUsize::new(max_open.max(1)).expect("max(1) is non-zero");
        OpenChunks { entries: Mutex::new(LruCache::new(cap)) }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, LruCache<u128, (CachedChunk, Stamp)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open chunk for `id`, if cached and its file is unchanged since it was verified.
    pub fn get(&self, id: u128) -> Option<CachedChunk> {
        let (chunk, was) = self.entries().get(&id).cloned()?;
        if stamp(&chunk) == Some(was) {
            return Some(chunk);
        }
        self.remove(id);
        None
    }

    /// Remembers a chunk whose header was just verified.
    pub fn insert(&self, id: u128, chunk: &CachedChunk) {
        if let Some(s) = stamp(chunk) {
            self.entries().put(id, (chunk.clone(), s));
        }
    }

    pub fn remove(&self, id: u128) {
        self.entries().pop(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;

    fn chunk(file: std::fs::File) -> CachedChunk {
        CachedChunk {
            id: crate::chunk_store::ChunkId(1),
            file: Arc::new(file),
            data_offset: 4096,
            len: 1,
            crc32c: 0,
            flags: 0,
        }
    }

    #[test]
    fn a_changed_file_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        std::fs::write(&path, [0u8; 4097]).unwrap();
        let open = OpenChunks::new(4);
        open.insert(1, &chunk(std::fs::File::open(&path).unwrap()));
        assert!(open.get(1).is_some());
        // Any write moves ctime; make sure the clock visibly moves first.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"x").unwrap();
        assert!(open.get(1).is_none(), "a modified file stayed trusted");
        assert!(open.get(1).is_none(), "the stale entry was dropped");
    }

    #[test]
    fn bounded_and_removable() {
        let dir = tempfile::tempdir().unwrap();
        let open = OpenChunks::new(2);
        for id in 0..3u128 {
            let path = dir.path().join(id.to_string());
            std::fs::write(&path, b"x").unwrap();
            open.insert(id, &chunk(std::fs::File::open(&path).unwrap()));
        }
        assert!(open.get(0).is_none(), "least recent entry closed at the bound");
        assert!(open.get(2).is_some());
        open.remove(2);
        assert!(open.get(2).is_none());
    }
}
