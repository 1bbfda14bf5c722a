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
        let layout = read_header(&file, file_len, url).map_err(corrupt)?;
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

/// Decodes the header at the start of `file` (either format), reading more only for long URLs.
fn read_header(file: &File, file_len: u64, url: &ObjectUrl) -> Result<codec::Layout, String> {
    let mut want = codec::FIRST_READ;
    loop {
        let mut head = vec![0u8; want.min(file_len as usize)];
        file.read_exact_at(&mut head, 0).map_err(|e| e.to_string())?;
        match codec::decode(&head, url) {
            Ok(layout) => return Ok(layout),
            Err(codec::Refused::Truncated { needed }) if needed > head.len() && head.len() == want => {
                want = needed;
            }
            Err(codec::Refused::Truncated { needed }) => {
                return Err(format!("header truncated: {needed} bytes needed, the file has {file_len}"))
            }
            Err(codec::Refused::Bad(why)) => return Err(why),
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
mod tests {
    use super::*;

    #[test]
    fn round_trip_replace_remove_and_detect_damage() {
        let dir = tempfile::tempdir().unwrap();
        let store = OnlyStore::open(dir.path(), None).unwrap();
        let url = ObjectUrl::parse("obs://b/k").unwrap();
        assert!(store.get(&url).unwrap().is_none());
        for data in [b"first version".to_vec(), vec![7u8; 100_000]] {
            let mut w = store.begin(&url).unwrap();
            w.write(&data[..10]).unwrap();
            w.write(&data[10..]).unwrap();
            assert_eq!(store.commit(w).unwrap(), data.len() as u64);
            let s = store.get(&url).unwrap().unwrap();
            let mut back = vec![0u8; s.len as usize];
            s.file.read_exact_at(&mut back, s.data_offset).unwrap();
            assert_eq!(back, data);
            assert_eq!(s.crc32c, crc32c(&data));
        }
        // An unacknowledged writer leaves nothing behind.
        let mut w = store.begin(&url).unwrap();
        w.write(b"never committed").unwrap();
        drop(w);
        assert_eq!(fs::read_dir(dir.path().join("v1/tmp")).unwrap().count(), 0);
        assert_eq!(store.get(&url).unwrap().unwrap().len, 100_000);
        // A flipped header byte is detected.
        let path = store.path_of(&url.to_string());
        let mut bytes = fs::read(&path).unwrap();
        bytes[20] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(store.get(&url), Err(OnlyError::Corrupt { .. })));
        assert!(store.remove(&url).unwrap());
        assert!(store.get(&url).unwrap().is_none());
    }

    /// Found by the e2e test of D1: an empty object was written as its header alone, shorter than the
    /// data offset the header names, so once acknowledged it read back as corrupt.
    #[test]
    fn an_empty_object_reads_back_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = OnlyStore::open(dir.path(), None).unwrap();
        let url = ObjectUrl::parse("obs://b/empty").unwrap();
        assert_eq!(store.commit(store.begin(&url).unwrap()).unwrap(), 0);
        let s = store.get(&url).unwrap().expect("the empty object is there");
        assert_eq!((s.len, s.crc32c), (0, crc32c(b"")));
    }

    /// A named pipe at an object's path used to hang `get` in its open, waiting for a writer; it and
    /// a directory are now a typed `Corrupt`, at once.
    #[test]
    fn a_pipe_or_a_directory_at_an_objects_path_is_corrupt_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let store = OnlyStore::open(dir.path(), None).unwrap();
        let (pipe, folder) =
            (ObjectUrl::parse("obs://b/pipe").unwrap(), ObjectUrl::parse("obs://b/dir").unwrap());
        let pipe_path = store.path_of(&pipe.to_string());
        fs::create_dir_all(pipe_path.parent().unwrap()).unwrap();
        nix::unistd::mkfifo(&pipe_path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let folder_path = store.path_of(&folder.to_string());
        fs::create_dir_all(&folder_path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let outcomes = [&pipe, &folder].map(|u| matches!(store.get(u), Err(OnlyError::Corrupt { .. })));
            let _ = tx.send(outcomes);
        });
        let outcomes = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("get hung on a named pipe");
        assert_eq!(outcomes, [true, true]);
    }

    /// S9: a well-formed object file of another owner (no slot wrote it) is never read.
    #[test]
    fn an_object_file_of_another_owner_is_corrupt() {
        assert!(nix::unistd::geteuid().is_root(), "this test chowns a file: run it as root (CI does)");
        let dir = tempfile::tempdir().unwrap();
        let (store, url) =
            (OnlyStore::open(dir.path(), None).unwrap(), ObjectUrl::parse("obs://b/o").unwrap());
        store.commit(store.begin(&url).unwrap()).unwrap();
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(&store.path_of(&url.to_string()), nobody, None).unwrap();
        let err = store.get(&url).unwrap_err().to_string();
        assert!(err.contains("uid 65534"), "{err}");
    }

    #[test]
    fn quota_is_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let store = OnlyStore::open(dir.path(), Some(10_000)).unwrap();
        let url = ObjectUrl::parse("obs://b/big").unwrap();
        let mut w = store.begin(&url).unwrap();
        w.write(&[1u8; 20_000]).unwrap();
        assert!(matches!(store.commit(w), Err(OnlyError::Quota { .. })));
        assert!(store.get(&url).unwrap().is_none());
    }

    /// Found by the e2e test of D4: each slot counted only what it had written itself, so a fleet
    /// of two slots stored twice its quota.
    #[test]
    fn the_quota_is_shared_by_every_store_of_the_cache_dir() {
        let dir = tempfile::tempdir().unwrap();
        let slots = [
            OnlyStore::open(dir.path(), Some(100_000)).unwrap(),
            OnlyStore::open(dir.path(), Some(100_000)).unwrap(),
        ];
        let mut acked = 0;
        for i in 0..10 {
            let store = &slots[i % 2];
            let mut w = store.begin(&ObjectUrl::parse(&format!("obs://b/{i}")).unwrap()).unwrap();
            w.write(&[i as u8; 20_000]).unwrap();
            match store.commit(w) {
                Ok(_) => acked += 1,
                Err(OnlyError::Quota { used, quota, .. }) => assert!(used <= quota),
                Err(e) => panic!("{e}"),
            }
        }
        // 24,096 bytes per object (a 4 KiB header): four fit in 100,000.
        assert_eq!(acked, 4);
        assert!(slots[0].used().unwrap() <= 100_000);
        // Replacing an object in place needs no more room than it frees.
        let url = ObjectUrl::parse("obs://b/0").unwrap();
        let mut w = slots[1].begin(&url).unwrap();
        w.write(&[9u8; 20_000]).unwrap();
        slots[1].commit(w).unwrap();
        assert!(slots[1].remove(&url).unwrap());
        assert_eq!(slots[0].used().unwrap(), 3 * 24_096);
    }

    /// Objects written by the release before the chunk-format codec read back byte for byte
    /// through the store, and replacing one writes the new format.
    #[test]
    fn objects_of_the_earlier_format_read_back_and_are_replaced_in_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = OnlyStore::open(dir.path(), None).unwrap();
        for (url, golden, len) in [
            ("s3://bucket/features/part-0.bin", &include_bytes!("testdata/v1-object.bin")[..], 10_000),
            ("s3://bucket/empty", &include_bytes!("testdata/v1-empty.bin")[..], 0),
        ] {
            fs::write(store.path_of(url), golden).unwrap();
            let url = ObjectUrl::parse(url).unwrap();
            let s = store.get(&url).unwrap().expect("the golden object is there");
            let mut back = vec![0u8; s.len as usize];
            s.file.read_exact_at(&mut back, s.data_offset).unwrap();
            assert_eq!(back, legacy::tests::golden_data(len));
            assert_eq!(s.crc32c, crc32c(&back));
        }
        let url = ObjectUrl::parse("s3://bucket/features/part-0.bin").unwrap();
        let mut w = store.begin(&url).unwrap();
        w.write(b"new").unwrap();
        store.commit(w).unwrap();
        assert_eq!(&fs::read(store.path_of(&url.to_string())).unwrap()[..8], b"MACHUNK1");
        assert_eq!(store.get(&url).unwrap().unwrap().len, 3);
    }

    /// The new format is fixed too: a file this code writes, checked in (`testdata/v2-object.bin`;
    /// `MEMARTS_BLESS=1` rewrites it, for a deliberate format change only).
    #[test]
    fn the_new_format_is_what_the_golden_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = OnlyStore::open(dir.path(), None).unwrap();
        let url = ObjectUrl::parse("s3://bucket/features/part-0.bin").unwrap();
        let mut w = store.begin(&url).unwrap();
        w.write(&legacy::tests::golden_data(10_000)).unwrap();
        store.commit(w).unwrap();
        let written = fs::read(store.path_of(&url.to_string())).unwrap();
        let golden =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/memarts_only/testdata/v2-object.bin");
        if std::env::var_os("MEMARTS_BLESS").is_some() {
            fs::write(&golden, &written).unwrap();
        }
        assert!(written == fs::read(&golden).unwrap(), "the memarts-only file format changed");
    }
}
