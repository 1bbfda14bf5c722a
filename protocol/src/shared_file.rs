//! A file of words mapped shared, as the tables a slot publishes for the shims (`meta_table`,
//! `pin_table`) are: created by the slot (a temp file renamed into place, so no reader maps a
//! half-made one), opened read-only by shims.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// removed it).
    pub fn is_current(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }
}

fn identity(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// The header every shared table starts with: word 0 its magic, word 1 its layout version, word 2
/// its capacity in entries (a power of two), then the table's own words up to `header_words`.
pub(crate) struct Shape {
    pub magic: u64,
    pub version: u64,
    pub header_words: usize,
    pub entry_words: usize,
}

/// Why words do not hold a table of a [`Shape`].
pub(crate) enum BadHeader {
    NotATable,
    BadCapacity(u64),
}

impl Shape {
    /// Writes the header into `words` (all zero: a new file) for as many entries as fit, rounded
    /// down to a power of two, with `own` writing the table's own header words before the magic
    /// goes in last (a reader that sees it sees the rest); returns the capacity.
    pub fn init(&self, words: &[AtomicU64], own: impl FnOnce(&[AtomicU64])) -> Result<usize, BadHeader> {
        let fit = words.len().saturating_sub(self.header_words) / self.entry_words;
        if fit == 0 {
            return Err(BadHeader::BadCapacity(0));
        }
        let capacity = 1usize << fit.ilog2();
        words[1].store(self.version, Ordering::Relaxed);
        words[2].store(capacity as u64, Ordering::Relaxed);
        own(words);
        words[0].store(self.magic, Ordering::Release);
        Ok(capacity)
    }

    /// Checks the header in `words`; returns the capacity.
    pub fn open(&self, words: &[AtomicU64]) -> Result<usize, BadHeader> {
        if words.len() < self.header_words
            || words[0].load(Ordering::Acquire) != self.magic
            || words[1].load(Ordering::Relaxed) != self.version
        {
            return Err(BadHeader::NotATable);
        }
        let capacity = words[2].load(Ordering::Relaxed);
        let fits = usize::try_from(capacity)
            .ok()
            .and_then(|c| c.checked_mul(self.entry_words))
            .and_then(|w| w.checked_add(self.header_words))
            .is_some_and(|w| w <= words.len());
        if !capacity.is_power_of_two() || !fits {
            return Err(BadHeader::BadCapacity(capacity));
        }
        Ok(capacity as usize)
    }
}
