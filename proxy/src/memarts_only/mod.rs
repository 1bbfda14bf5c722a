//! memarts-only objects (`write_memarts`): data whose only copy is the cache. They are never evicted,
//! survive `kill -9` and restarts, and are acknowledged only once durable.
//!
//! Layout: `<cache dir>/v1/memarts/<xxh3-128 of the URL, 32 hex>`, one file per object: a header
//! (`codec.rs`: the chunk format's, flagged memarts-only and bound to the URL), zero padding to a
//! 4096-byte boundary, then the data. It is written to `v1/tmp/` first, then fsynced, renamed into
//! place, and the directory fsynced: a crash at any instant leaves the previous version or the new
//! one, never a mix. Files of the earlier format (`legacy.rs`) are read as they are.
//!
//! - [`OnlyStore`]: begin / commit (durable, within the fleet-wide quota), get, remove, and
//!   [`OnlyStore::read`], what a read request gets: the data inline (checked) or the open file.
//! - [`wire_error`]: what a client is told of a failure (no room is `NoSpace`, with the way out).

mod codec;
mod legacy;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use memarts_protocol::{crc32c, Crc32c, ErrorCode, ObjectUrl, WireError};
use nix::fcntl::{Flock, FlockArg};

pub use codec::MEMARTS_ONLY_ETAG;

use crate::cache_root::CacheRoot;

/// A memarts-only object whose header was verified, open for reading (its data is checked by
/// whoever reads it).
#[derive(Debug)]
pub struct Stored {
    pub file: File,
    pub data_offset: u64,
    pub len: u64,
    pub crc32c: u32,
}

/// What a read request gets of an object: small ones inline (their data checked here), larger ones
/// as the open file, whose descriptor is passed (the client checks the data).
pub enum OnlyRead {
    Inline { data: Vec<u8>, crc32c: u32 },
    File(Stored),
}

#[derive(Debug, thiserror::Error)]
pub enum OnlyError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("memarts-only object {url} is corrupt: {why}")]
    Corrupt { url: String, why: String },
    #[error("no room for {need} more bytes of memarts-only objects ({used} of {quota} used)")]
    Quota { need: u64, used: u64, quota: u64 },
}

pub struct OnlyStore {
    dir: PathBuf,
    tmp: PathBuf,
    quota: Option<u64>,
}

/// A memarts-only object being written (in the temp directory until [`OnlyStore::commit`]).
pub struct Writer {
    url: ObjectUrl,
    data_offset: u64,
    file: File,
    path: PathBuf,
    written: u64,
    crc: Crc32c,
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

impl Writer {
    /// Appends bytes (blocking).
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, self.data_offset + self.written)?;
        self.written += bytes.len() as u64;
        self.crc.update(bytes);
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn crc(&self) -> u32 {
        self.crc.finish()
    }
}

impl OnlyStore {
    /// Opens (creating) `<cache dir>/v1/memarts`, the cache dir checked first
    /// ([`CacheRoot::open`]). Blocking.
    pub fn open(cache_dir: &Path, quota: Option<u64>) -> io::Result<OnlyStore> {
        OnlyStore::open_in(&CacheRoot::open(cache_dir)?, quota)
    }

    /// Opens (creating) `v1/memarts` and `v1/tmp` of the checked cache root `tree`. Blocking.
    pub fn open_in(tree: &CacheRoot, quota: Option<u64>) -> io::Result<OnlyStore> {
        for name in ["memarts", "tmp"] {
            tree.subdir(name)?;
        }
        Ok(OnlyStore { dir: tree.path_of("memarts"), tmp: tree.path_of("tmp"), quota })
    }

    fn path_of(&self, url: &str) -> PathBuf {
        self.dir.join(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(url.as_bytes())))
    }

    /// Bytes the memarts-only objects of the whole cache dir take (file lengths), counted now.
    pub fn used(&self) -> io::Result<u64> {
        let mut used = 0;
        for entry in fs::read_dir(&self.dir)? {
            match entry?.metadata() {
                Ok(m) => used += m.len(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(used)
    }

    /// Starts writing `url` (blocking).
    pub fn begin(&self, url: &ObjectUrl) -> io::Result<Writer> {
        let path = self.tmp.join(format!(
            "{:032x}.{}.{}.only.tmp",
            xxhash_rust::xxh3::xxh3_128(url.to_string().as_bytes()),
            std::process::id(),
            rand::random::<u32>()
        ));
        let file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        let data_offset = codec::data_offset(url);
        Ok(Writer { url: url.clone(), data_offset, file, path, written: 0, crc: Crc32c::default() })
    }

    /// Makes the object durable and visible (blocking): header, fdatasync, rename, directory fsync.
    /// The previous version, if any, is replaced atomically. With a quota, the room is checked and
    /// the object published under an exclusive `flock` of the directory, against what the directory
    /// holds: every slot of the fleet writes there, so a count kept by one process would let the
    /// fleet as a whole exceed the quota.
    pub fn commit(&self, w: Writer) -> Result<u64, OnlyError> {
        let size = w.data_offset + w.written;
        let dest = self.path_of(&w.url.to_string());
        let header = codec::encode(&w.url, w.written, w.crc())
            .map_err(|e| OnlyError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        w.file.write_all_at(&header, 0)?;
        // The data starts at the page after the header: an empty object must still reach it.
        w.file.set_len(size)?;
        w.file.sync_all()?;
        let dir = File::open(&self.dir)?;
        let _lock = match self.quota {
            Some(quota) => {
                let lock = Flock::lock(dir.try_clone()?, FlockArg::LockExclusive)
                    .map_err(|(_, errno)| io::Error::from(errno))?;
                let replaced = fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
                let used = self.used()?;
                if used.saturating_sub(replaced) + size > quota {
                    return Err(OnlyError::Quota { need: size, used, quota });
                }
                Some(lock)
            }
            None => None,
        };
        fs::rename(&w.path, &dest)?;
        dir.sync_all()?;
        Ok(w.written)
    }

    /// The object at `url`, its header verified (the data is checked by whoever reads it). Blocking.
    pub fn get(&self, url: &ObjectUrl) -> Result<Option<Stored>, OnlyError> {
        let text = url.to_string();
        // Non-blocking, so that a named pipe at the path cannot hang the open waiting for a writer;
        // whatever is there must then prove to be a regular file.
        let file =
            match OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(self.path_of(&text)) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e.into()),
            };
        let corrupt = |why: String| OnlyError::Corrupt { url: text.clone(), why };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(corrupt(format!("not a regular file at its path ({:?})", meta.file_type())));
        }
        // No slot wrote it (S9): another owner's file is never read, however well-formed.
        if meta.uid() != memarts_settings::dir_trust::own_uid() {
            return Err(corrupt(format!("a file of uid {}, which no slot of this fleet wrote", meta.uid())));
        }
        // Back to blocking for whoever reads it (io_uring answers EAGAIN on non-blocking files).
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()))
            .map_err(io::Error::from)?;
        let file_len = meta.len();
        let layout = read_header(&file, file_len, url).map_err(|why| corrupt(why.to_string()))?;
        if layout.data_offset.checked_add(layout.len).is_none_or(|end| end > file_len) {
            let len = layout.len;
            return Err(corrupt(format!("file of {file_len} bytes is shorter than its {len} bytes of data")));
        }
        Ok(Some(Stored { file, data_offset: layout.data_offset, len: layout.len, crc32c: layout.crc32c }))
    }

    /// The object at `url` as a read request gets it ([`OnlyRead`]), `None` if absent; objects of at
    /// most `inline_max` bytes are read and checked here.
    pub async fn read(
        self: Arc<Self>,
        url: ObjectUrl,
        inline_max: u64,
    ) -> Result<Option<OnlyRead>, OnlyError> {
        let read = tokio::task::spawn_blocking(move || {
            let Some(s) = self.get(&url)? else { return Ok(None) };
            if s.len > inline_max {
                return Ok(Some(OnlyRead::File(s)));
            }
            let mut data = vec![0u8; s.len as usize];
            s.file.read_exact_at(&mut data, s.data_offset)?;
            if crc32c(&data) != s.crc32c {
                return Err(OnlyError::Corrupt {
                    url: url.to_string(),
                    why: "data checksum mismatch".into(),
                });
            }
            Ok(Some(OnlyRead::Inline { data, crc32c: s.crc32c }))
        });
        read.await.map_err(|e| OnlyError::Io(io::Error::other(e)))?
    }

    /// Removes `url`; true if it existed. Blocking.
    pub fn remove(&self, url: &ObjectUrl) -> io::Result<bool> {
        let path = self.path_of(&url.to_string());
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Why a memarts-only file's header cannot be used.
#[derive(Debug, thiserror::Error)]
enum BadHeader {
    #[error("{0}")]
    Unreadable(#[from] io::Error),
    #[error("header truncated: {needed} bytes needed, the file has {file_len}")]
    Truncated { needed: usize, file_len: u64 },
    #[error("{0}")]
    Refused(String),
}

/// Decodes the header at the start of `file` (either format), reading more only for long URLs.
fn read_header(file: &File, file_len: u64, url: &ObjectUrl) -> Result<codec::Layout, BadHeader> {
    let mut want = codec::FIRST_READ;
    loop {
        let mut head = vec![0u8; want.min(file_len as usize)];
        file.read_exact_at(&mut head, 0)?;
        match codec::decode(&head, url) {
            Ok(layout) => return Ok(layout),
            Err(codec::Refused::Truncated { needed }) if needed > head.len() && head.len() == want => {
                want = needed;
            }
            Err(codec::Refused::Truncated { needed }) => {
                return Err(BadHeader::Truncated { needed, file_len })
            }
            Err(codec::Refused::Bad(why)) => return Err(BadHeader::Refused(why)),
        }
    }
}

/// What the client of a failed memarts-only operation on `url` is told. A full cache disk and the
/// quota are `NoSpace`, logged with what the operator can do: memarts-only objects are never evicted.
pub fn wire_error(e: OnlyError, url: &ObjectUrl) -> WireError {
    match e {
        OnlyError::Quota { need, used, quota } => WireError::new(
            ErrorCode::NoSpace,
            format!("memarts-only quota: {need} more bytes do not fit ({used} of {quota} used)"),
        ),
        OnlyError::Corrupt { url, why } => WireError::new(ErrorCode::Corrupt, format!("{url}: {why}")),
        OnlyError::Io(e) => match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => {
                let msg = format!(
                    "write_memarts {url}: the cache disk is full ({e}); memarts-only objects are never \
                     evicted to make room, so delete some or give the cache more disk"
                );
                tracing::warn!("{msg}");
                WireError::new(ErrorCode::NoSpace, msg)
            }
            _ => WireError::new(ErrorCode::Internal, format!("write_memarts {url}: {e}")),
        },
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
