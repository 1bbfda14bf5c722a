//! [`Scan`]: a lazy, blocking walk of `chunks/<2 hex>/<32 hex>` that yields one
//! [`ScannedChunk`] per chunk file and counts, without touching, everything else. Chunk files of
//! the earlier two-level layout (`chunks/<2 hex>/<2 hex>/<32 hex>`) are yielded too, marked
//! `legacy`: the index rebuild moves them to their place (`ChunkStore::adopt_legacy`).
//!
//! Anything that is not where a chunk file would be — names that are not canonical
//! lowercase hex, a chunk whose name does not match its fan-out directories, symlinks,
//! directories at the file level — is "foreign": skipped, logged at debug level and counted
//! in [`ScanReport::foreign`]. Unreadable directories and entries are counted in
//! [`ScanReport::errors`]. Files removed while the walk runs are silently skipped.

use std::fs::{self, DirEntry, ReadDir};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::SystemTime;

use super::ChunkId;

/// One chunk file found by a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScannedChunk {
    pub id: ChunkId,
    /// Allocated size (`st_blocks * 512`).
    pub bytes_on_disk: u64,
    /// Last access as recorded in the file's mtime.
    pub accessed: SystemTime,
    /// Found where the two-level layout kept it, not at its path.
    pub legacy: bool,
}

/// Counters of a scan so far (final once the iterator is exhausted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Chunk files yielded.
    pub chunks: u64,
    /// Sum of their `bytes_on_disk`.
    pub bytes_on_disk: u64,
    /// Entries skipped because they are not chunk files.
    pub foreign: u64,
    /// Directories or entries that could not be read.
    pub errors: u64,
}

/// Iterator over the chunk files under `chunks/`. Blocking: run it on a blocking thread.
pub struct Scan {
    /// Open directories, outermost first; each with the hex digits its path implies.
    stack: Vec<(ReadDir, String)>,
    report: ScanReport,
}

impl Scan {
    pub(super) fn new(chunks_dir: &Path) -> Scan {
        let mut scan = Scan { stack: Vec::with_capacity(3), report: ScanReport::default() };
        match fs::read_dir(chunks_dir) {
            Ok(dir) => scan.stack.push((dir, String::new())),
            Err(e) => scan.error(chunks_dir, e),
        }
        scan
    }

    /// The counters so far.
    pub fn report(&self) -> ScanReport {
        self.report
    }

    fn error(&mut self, path: &Path, error: io::Error) {
        tracing::warn!(path = %path.display(), %error, "chunk scan could not read an entry");
        self.report.errors += 1;
    }

    fn foreign(&mut self, entry: &DirEntry) {
        tracing::debug!(path = %entry.path().display(), "chunk scan skipped a foreign entry");
        self.report.foreign += 1;
    }

    /// Enters a fan-out directory (`chunks/aa`, or a two-level layout's `chunks/aa/bb`).
    fn enter(&mut self, entry: &DirEntry, name: &str, prefix: &str) {
        match fs::read_dir(entry.path()) {
            Ok(dir) => self.stack.push((dir, format!("{prefix}{name}"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => self.error(&entry.path(), e),
        }
    }

    /// Handles an entry at `depth` 1 (`chunks/`: fan-out directories), 2 (`chunks/aa/`: chunk
    /// files, or the fan-out directories of the two-level layout) or 3 (`chunks/aa/bb/`: that
    /// layout's chunk files).
    fn entry(&mut self, entry: &DirEntry, name: &str, prefix: &str, depth: usize) -> Option<ScannedChunk> {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if depth < 3 && is_dir && is_fanout_name(name) {
            self.enter(entry, name, prefix);
            return None;
        }
        if depth == 1 {
            self.foreign(entry);
            return None;
        }
        self.chunk(entry, name, prefix, depth == 3)
    }

    /// Handles an entry where a chunk file would be.
    fn chunk(&mut self, entry: &DirEntry, name: &str, prefix: &str, legacy: bool) -> Option<ScannedChunk> {
        let id = ChunkId::from_hex(name).filter(|id| id.to_hex() == name && name.starts_with(prefix));
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let Some(id) = id.filter(|_| is_file) else {
            self.foreign(entry);
            return None;
        };
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.error(&entry.path(), e);
                return None;
            }
        };
        let accessed = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let bytes_on_disk = meta.blocks() * 512;
        self.report.chunks += 1;
        self.report.bytes_on_disk += bytes_on_disk;
        Some(ScannedChunk { id, bytes_on_disk, accessed, legacy })
    }
}

fn is_fanout_name(name: &str) -> bool {
    name.len() == 2 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Iterator for Scan {
    type Item = ScannedChunk;

    fn next(&mut self) -> Option<ScannedChunk> {
        loop {
            let depth = self.stack.len();
            let (dir, prefix) = self.stack.last_mut()?;
            let entry = match dir.next() {
                None => {
                    self.stack.pop();
                    continue;
                }
                Some(Ok(entry)) => entry,
                Some(Err(e)) => {
                    self.report.errors += 1;
                    tracing::warn!(error = %e, "chunk scan could not read a directory entry");
                    continue;
                }
            };
            // Borrowed out (not cloned) so the handlers can take `&mut self`; put back below.
            let prefix = std::mem::take(prefix);
            let name = entry.file_name();
            let name = name.to_str().unwrap_or("");
            let found = self.entry(&entry, name, &prefix, depth);
            self.stack[depth - 1].1 = prefix;
            if found.is_some() {
                return found;
            }
        }
    }
}
