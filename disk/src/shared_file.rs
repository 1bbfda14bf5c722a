//! A file of words mapped shared, as the tables a slot publishes for the shims (`meta_table`,
//! `resident_table`) are: created by the slot (a temp file renamed into place, so no reader maps a
//! half-made one), opened read-only by shims.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::AtomicU64;

use memmap2::{MmapOptions, MmapRaw};

/// A mapped file of words; see the module docs.
pub(crate) struct SharedWords {
    map: MmapRaw,
    /// Device and inode of the file mapped: a slot that starts again replaces the file, and a
    /// reader compares this with the path's to know.
    identity: (u64, u64),
}

impl SharedWords {
    /// A new file of `len` bytes at `path`, 0600, its words set up by `init` before it takes the
    /// place of any older one; the file is sparse, so only the pages written to take room.
    pub fn create(
        path: &Path,
        len: usize,
        init: impl FnOnce(&[AtomicU64]) -> io::Result<()>,
    ) -> io::Result<Self> {
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&tmp)?;
        let made = (|| {
            file.set_len(len as u64)?;
            let words = SharedWords { map: MmapOptions::new().map_raw(&file)?, identity: identity(&file)? };
            init(words.words())?;
            std::fs::rename(&tmp, path)?;
            Ok(words)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        made
    }

    /// Words of `len` bytes in anonymous memory, set up by `init`: a table no other process maps
    /// (one the slot keeps for itself until it publishes one).
    pub fn anonymous(len: usize, init: impl FnOnce(&[AtomicU64]) -> io::Result<()>) -> io::Result<Self> {
        let map = MmapRaw::from(MmapOptions::new().len(len.max(8)).map_anon()?);
        let words = SharedWords { map, identity: (0, 0) };
        init(words.words())?;
        Ok(words)
    }

    /// The file at `path`, mapped read-only (or for writing, for its slot only), once `check`
    /// accepted its words.
    pub fn open(path: &Path, writable: bool, check: impl FnOnce(&[AtomicU64]) -> bool) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let options = MmapOptions::new();
        let map = if writable { options.map_raw(&file)? } else { options.map_raw_read_only(&file)? };
        let words = SharedWords { map, identity: identity(&file)? };
        if !check(words.words()) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a table of this kind"));
        }
        Ok(words)
    }

    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned (so aligned for u64) and lives as long as `self`; its
        // length is rounded down to whole words. AtomicU64 has the layout of u64. Every access to
        // these words, in this process and in the others that map the file, is an atomic one (the
        // tables' code does nothing else), so sharing them is no data race. A read-only mapping is
        // only ever loaded from: the tables store only through a file made by `create` or opened
        // writable, and a u64 atomic load is a plain load on the 64-bit targets memarts builds for.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8) }
    }

    /// Whether `path` still names the file this maps (false once a restarted slot replaced it, or
    /// removed it; always false for anonymous words).
    pub fn is_current(&self, path: &Path) -> bool {
        self.identity != (0, 0) && std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }
}

fn identity(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}
