//! memarts-only objects (`write_memarts`): data whose only copy is the cache. They are never evicted,
//! survive `kill -9` and restarts, and are acknowledged only once durable.
//!
//! Layout: `<cache dir>/v1/memarts/<xxh3-128 of the URL, 32 hex>`, one file per object, written to
//! `v1/tmp/` first, then fsynced, renamed into place, and the directory fsynced. A crash at any
//! instant leaves the previous version or the new one, never a mix.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "MAMONLY1"
//! 8       2     format version (1), u16 LE
//! 10      2     reserved, 0
//! 12      4     data offset D (the header rounded up to 4096), u32 LE
//! 16      8     data length, u64 LE
//! 24      4     CRC32C of the data, u32 LE
//! 28      4     URL length U, u32 LE (at most MAX_URL_LEN)
//! 32      U     the URL (normalised, e.g. s3://bucket/key)
//! 32+U    4     CRC32C of bytes 0..32+U
//! D       ...   the data
//! ```

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use memarts_protocol::{crc32c, Crc32c, ObjectUrl, MAX_URL_LEN};
use nix::fcntl::{Flock, FlockArg};

const MAGIC: &[u8; 8] = b"MAMONLY1";
const VERSION: u16 = 1;
const FIXED: usize = 32;

/// A verified memarts-only object, open for reading.
#[derive(Debug)]
pub struct Stored {
    pub file: File,
    pub data_offset: u64,
    pub len: u64,
    pub crc32c: u32,
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

fn header(url: &str, len: u64, crc: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(FIXED + url.len() + 4);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&(data_offset(url) as u32).to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(&(url.len() as u32).to_le_bytes());
    h.extend_from_slice(url.as_bytes());
    let hcrc = crc32c(&h);
    h.extend_from_slice(&hcrc.to_le_bytes());
    h
}

fn data_offset(url: &str) -> u64 {
    ((FIXED + url.len() + 4) as u64).div_ceil(4096) * 4096
}

/// Decodes a header; bounded, never panics.
fn decode(bytes: &[u8]) -> Result<(u64, u64, u32, String), String> {
    if bytes.len() < FIXED + 4 || &bytes[..8] != MAGIC {
        return Err("bad magic".into());
    }
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    if u16_at(8) != VERSION {
        return Err(format!("unknown format version {}", u16_at(8)));
    }
    let url_len = u32_at(28) as usize;
    if url_len > MAX_URL_LEN || bytes.len() < FIXED + url_len + 4 {
        return Err("truncated header".into());
    }
    if u32_at(FIXED + url_len) != crc32c(&bytes[..FIXED + url_len]) {
        return Err("header checksum mismatch".into());
    }
    let len = u64::from_le_bytes(bytes[16..24].try_into().map_err(|_| "short")?);
    let url = String::from_utf8(bytes[FIXED..FIXED + url_len].to_vec()).map_err(|_| "URL not UTF-8")?;
    Ok((u64::from(u32_at(12)), len, u32_at(24), url))
}

/// A memarts-only object being written (in the temp directory until [`OnlyStore::commit`]).
pub struct Writer {
    url: String,
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
        self.file.write_all_at(bytes, data_offset(&self.url) + self.written)?;
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
    /// Opens (creating) `<cache dir>/v1/memarts`. Blocking.
    pub fn open(cache_dir: &Path, quota: Option<u64>) -> io::Result<OnlyStore> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = cache_dir.join("v1").join("memarts");
        let tmp = cache_dir.join("v1").join("tmp");
        for d in [&dir, &tmp] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(d)?;
        }
        Ok(OnlyStore { dir, tmp, quota })
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
        let url = url.to_string();
        let path = self.tmp.join(format!(
            "{:032x}.{}.{}.only.tmp",
            xxhash_rust::xxh3::xxh3_128(url.as_bytes()),
            std::process::id(),
            rand::random::<u32>()
        ));
        let file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        Ok(Writer { url, file, path, written: 0, crc: Crc32c::default() })
    }

    /// Makes the object durable and visible (blocking): header, fdatasync, rename, directory fsync.
    /// The previous version, if any, is replaced atomically. With a quota, the room is checked and
    /// the object published under an exclusive `flock` of the directory, against what the directory
    /// holds: every slot of the fleet writes there, so a count kept by one process would let the
    /// fleet as a whole exceed the quota.
    pub fn commit(&self, w: Writer) -> Result<u64, OnlyError> {
        let size = data_offset(&w.url) + w.written;
        let dest = self.path_of(&w.url);
        w.file.write_all_at(&header(&w.url, w.written, w.crc()), 0)?;
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
        // Back to blocking for whoever reads it (io_uring answers EAGAIN on non-blocking files).
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()))
            .map_err(io::Error::from)?;
        let file_len = meta.len();
        let mut head = vec![0u8; (FIXED + MAX_URL_LEN + 4).min(file_len as usize)];
        file.read_exact_at(&mut head, 0)?;
        let (offset, len, crc, stored_url) = decode(&head).map_err(corrupt)?;
        if stored_url != text {
            return Err(corrupt(format!("file holds {stored_url}")));
        }
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(corrupt(format!("file of {file_len} bytes is shorter than its {len} bytes of data")));
        }
        Ok(Some(Stored { file, data_offset: offset, len, crc32c: crc }))
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

    #[test]
    fn decoding_garbage_never_panics() {
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = decode(&bytes);
            let mut h = header("s3://b/k", 5, 1);
            h.truncate(len.min(h.len()));
            let _ = decode(&h);
        }
    }
}
