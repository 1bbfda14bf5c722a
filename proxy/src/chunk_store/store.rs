//! [`ChunkStore`]: chunk files under a cache root, written and read through an [`IoEngine`].
//!
//! Layout: `<root>/v1/chunks/<hex[0..2]>/<hex>` (32-hex [`ChunkId`]) and `<root>/v1/tmp/` for
//! files being written. Directories are created 0700, files 0600. Caches written before one level
//! of fan-out replaced two kept chunks at `<hex[0..2]>/<hex[2..4]>/<hex>`: a lookup that misses
//! tries that path too, and moves what it finds to its place, until the slot's index rebuild has
//! moved all its chunks ([`ChunkStore::adopt_legacy`]).
//! Several processes may share a root (the slots of a fleet, embedded engines): temp files are
//! named `<id>.<pid>.<serial>.tmp`, and opening a store removes only those whose writer process is
//! gone.
//!
//! Crash safety: a chunk is written to a unique temp file and renamed into place, so a
//! process crash at any instant leaves either a complete chunk or nothing visible. With
//! `durable`, the file is fdatasync'ed before the rename and its directory fsync'ed after,
//! which extends that to power loss; without it, a power loss may leave a file whose header
//! or data CRC no longer checks out, which `get` / `read_verified` report as `Corrupt` and
//! remove. Directory operations (open, rename, mkdir, unlink) run on tokio's blocking pool.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::files::{describe, publish, remove_entry, rename_into, writer_alive};
use super::format::{self, FormatError};
use super::io_engine::IoEngine;
use super::pread::run_blocking;
use super::scan::{Scan, ScannedChunk};
use super::segments::{Packed, Segments, PACK_MAX};
use super::verify;
use super::{ChunkId, ChunkKey};
use crate::cache_root::{remove_files_where, CacheRoot};

const FILE_MODE: u32 = 0o600;

/// Errors of [`ChunkStore`] operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("chunk store I/O error: {0}")]
    Io(io::Error),
    /// The chunk file was invalid; `get` and `read_verified` have removed it.
    #[error("chunk {id} is corrupt: {reason}")]
    Corrupt { id: ChunkId, reason: String },
    /// ENOSPC or EDQUOT while writing.
    #[error("no space left for the chunk cache")]
    NoSpace,
    /// The key's identity encoding exceeds the header's limit.
    #[error("chunk key identity of {len} bytes exceeds the {}-byte limit", format::MAX_IDENTITY_LEN)]
    KeyTooLarge { len: usize },
}

impl From<io::Error> for StoreError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => StoreError::NoSpace,
            _ => StoreError::Io(e),
        }
    }
}

/// A chunk found by [`ChunkStore::get`]: its open file and where its data lies. The data is
/// not read or verified yet; whoever reads it checks `crc32c`.
#[derive(Clone, Debug)]
pub struct CachedChunk {
    pub id: ChunkId,
    pub file: Arc<File>,
    pub data_offset: u64,
    pub len: u64,
    pub crc32c: u32,
    pub flags: u16,
}

/// The on-disk chunk store; see the module docs.
pub struct ChunkStore {
    root: PathBuf,
    chunks: PathBuf,
    tmp: PathBuf,
    io: Arc<dyn IoEngine>,
    next_tmp: AtomicU64,
    /// Whether chunks may still be at their two-level layout paths (until the rebuild moved them).
    legacy: AtomicBool,
    /// The slot's small chunks, packed (`segments.rs`), once opened, and up to what size.
    packed: OnceLock<Arc<Segments>>,
    pack_max: AtomicU64,
}

impl ChunkStore {
    /// Opens the store on the cache root `root`, checked first ([`CacheRoot::open`]: refused, with
    /// nothing in it touched, unless the cache dir may be trusted). Blocking.
    pub fn open(root: impl AsRef<Path>, io: Arc<dyn IoEngine>) -> io::Result<Self> {
        ChunkStore::open_in(&CacheRoot::open(root.as_ref())?, io)
    }

    /// Creates `v1/chunks` and `v1/tmp` in the checked cache root `tree` if needed and removes
    /// leftover temp files of processes that no longer run (regular files directly in `tmp/`,
    /// nothing else), through the checked descriptor of `tmp`. Blocking.
    pub fn open_in(tree: &CacheRoot, io: Arc<dyn IoEngine>) -> io::Result<Self> {
        let root = tree.path().to_path_buf();
        let chunks = memarts_disk::chunk_file::chunks_dir(&root);
        let tmp = tree.path_of("tmp");
        tree.subdir("chunks")?;
        let removed = remove_files_where(&tree.subdir("tmp")?, |name| !writer_alive(name))?;
        if removed > 0 {
            tracing::info!(removed, dir = %tmp.display(), "removed leftover chunk temp files");
        }
        Ok(ChunkStore {
            root,
            chunks,
            tmp,
            io,
            next_tmp: AtomicU64::new(0),
            legacy: AtomicBool::new(true),
            packed: OnceLock::new(),
            pack_max: AtomicU64::new(0),
        })
    }

    /// Packs chunks of up to `pack_max` bytes (at most [`PACK_MAX`]) into the segments of `slot`
    /// from now on (those of its chunks the segments hold are found by id, the others are dead:
    /// `owns`). False if another process writes that slot's segments: chunks stay files. Blocking.
    pub fn open_segments(
        &self,
        tree: &CacheRoot,
        (slot, slots): (u32, u32),
        pack_max: u64,
        owns: impl Fn(u128) -> bool,
    ) -> io::Result<bool> {
        tree.subdir("segments").map_err(io::Error::other)?;
        let Some(segments) = Segments::open(&tree.path_of("segments"), slot, slots, owns)? else {
            return Ok(false);
        };
        self.pack_max.store(pack_max.min(PACK_MAX), Ordering::Relaxed);
        Ok(self.packed.set(Arc::new(segments)).is_ok())
    }

    fn packed_for(&self, len: u64) -> Option<&Arc<Segments>> {
        self.packed.get().filter(|_| len <= self.pack_max.load(Ordering::Relaxed))
    }

    /// The packed chunk `key`, read and checked: `Ok(None)` if it is not packed; a record that fails
    /// a check is dropped and reported as `Corrupt`.
    pub async fn read_packed(&self, key: &ChunkKey) -> Result<Option<Packed>, StoreError> {
        let Some(segments) = self.packed.get().filter(|s| s.contains(key.id().0)).cloned() else {
            return Ok(None);
        };
        let (id, identity) = (key.id(), key.identity_bytes());
        match run_blocking(move || segments.read(id.0, &identity)).await? {
            None => Ok(None),
            Some(Ok(packed)) => Ok(Some(packed)),
            Some(Err(invalid)) => {
                Err(StoreError::Corrupt { id, reason: format!("packed record: {invalid}") })
            }
        }
    }

    /// Bytes the chunk `key` of `len` bytes takes on disk once stored.
    pub fn on_disk_len(&self, key: &ChunkKey, len: u64) -> u64 {
        match self.packed_for(len) {
            Some(_) => Segments::on_disk_len(key.identity_len(), len),
            None => format::on_disk_len(key, len),
        }
    }

    /// Bytes of the slot's share the index leaves free of chunks: room the packed segments keep for
    /// dead records and compactions (`Segments::reserved`); 0 without segments.
    pub fn reserved(&self) -> u64 {
        self.packed.get().map_or(0, |s| s.reserved())
    }

    /// [`ChunkStore::reserved`] as it changes, for the chunk index; `None` without segments.
    pub fn reserve_gauge(&self) -> Option<Arc<AtomicU64>> {
        self.packed.get().map(|s| s.reserve_gauge())
    }

    /// Frees the room of evicted packed chunks once it adds up (`Segments::reclaim`); the chunks
    /// found corrupt (and dropped) on the way, and why. Blocking.
    #[must_use = "the chunks found corrupt are to be counted"]
    pub fn reclaim(&self) -> Vec<(u128, String)> {
        self.packed.get().map(|segments| segments.reclaim()).unwrap_or_default()
    }

    /// Packed segments sized for the slot's share of the capacity; what [`ChunkStore::reclaim`]
    /// found corrupt then. Blocking.
    #[must_use = "the chunks found corrupt are to be counted"]
    pub fn set_share(&self, share: u64) -> Vec<(u128, String)> {
        let Some(segments) = self.packed.get() else { return Vec::new() };
        segments.set_share(share);
        segments.reclaim()
    }

    /// Takes the packed chunks this slot `owns` from other slots' segments (`Segments::adopt`).
    /// Blocking.
    pub fn adopt_packed(&self, owns: impl Fn(u128) -> bool) -> io::Result<u64> {
        self.packed.get().map_or(Ok(0), |s| s.adopt(owns))
    }

    /// Publishes where the packed records are, for shims (`Segments::publish_at`); false without
    /// segments. Blocking.
    pub fn publish_packed(&self, path: PathBuf) -> io::Result<bool> {
        self.packed.get().map_or(Ok(false), |s| s.publish_at(path).map(|()| true))
    }

    /// Every packed chunk, as a scan would find a chunk file.
    pub fn packed_chunks(&self) -> Vec<ScannedChunk> {
        let Some(segments) = self.packed.get() else { return Vec::new() };
        segments
            .chunks()
            .into_iter()
            .map(|(id, bytes_on_disk, accessed)| ScannedChunk {
                id: ChunkId(id),
                bytes_on_disk,
                accessed,
                legacy: false,
            })
            .collect()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn io(&self) -> &Arc<dyn IoEngine> {
        &self.io
    }

    /// Where the chunk `id` lives (whether or not it exists).
    pub fn path_of(&self, id: ChunkId) -> PathBuf {
        memarts_disk::chunk_file::chunk_path(&self.chunks, id)
    }

    /// Where the two-level layout kept the chunk `id`: `<hex[0..2]>/<hex[2..4]>/<hex>`.
    fn legacy_path_of(&self, id: ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.chunks.join(&hex[0..2]).join(&hex[2..4]).join(&hex)
    }

    /// Moves the chunk files `ids` (found by a [`Scan`] as `legacy`) from the two-level layout to
    /// their place, then removes the old fan-out directories they leave empty (one that still holds
    /// another slot's chunks goes when that slot moves them). Once done, lookups stop trying the
    /// old paths: call it with all the chunks this store's slot owns. Returns how many it moved (a
    /// chunk gone meanwhile is not an error). Blocking.
    pub fn adopt_legacy(&self, ids: &[ChunkId]) -> io::Result<u64> {
        let mut moved = 0;
        let mut dirs = BTreeSet::new();
        for &id in ids {
            let from = self.legacy_path_of(id);
            match rename_into(&from, &self.path_of(id), &self.chunks) {
                Ok(_) => moved += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            dirs.extend(from.parent().map(Path::to_path_buf));
        }
        for dir in dirs {
            // Not empty (another slot's chunks, foreign files) or gone: left as it is.
            let _ = fs::remove_dir(dir);
        }
        self.legacy.store(false, Ordering::Relaxed);
        Ok(moved)
    }

    /// Stores `data` as the chunk `key`, replacing any previous file atomically. Returns the
    /// bytes it occupies on disk (file length rounded up to 4096).
    pub async fn put(
        &self,
        key: &ChunkKey,
        data: Bytes,
        flags: u16,
        durable: bool,
    ) -> Result<u64, StoreError> {
        let crc = memarts_protocol::crc32c(&data);
        self.put_checked(key, data, crc, flags, durable).await
    }

    /// [`ChunkStore::put`] of bytes whose CRC32C the caller has computed already (a fill's).
    ///
    /// The whole file (create the temp file, write header and data with one `pwritev`, fdatasync
    /// when `durable`, rename into place) is one task on the blocking pool: a fill of a small
    /// chunk used to take four thread hops (create, two I/O engine writes, rename), and on a 2-core
    /// machine under a cold epoch those wake-ups were a large part of the proxies' CPU.
    pub async fn put_checked(
        &self,
        key: &ChunkKey,
        data: Bytes,
        crc: u32,
        flags: u16,
        durable: bool,
    ) -> Result<u64, StoreError> {
        let id = key.id();
        if let Some(segments) = self.packed_for(data.len() as u64).cloned() {
            let identity = key.identity_bytes();
            // Appended from this task (a `pwrite` to the page cache): a hop to the blocking pool
            // and back cost a small chunk's fill more than the write. A durable one syncs there.
            if !durable {
                return Ok(segments.put(id.0, &identity, &data, crc, flags, false)?);
            }
            return Ok(run_blocking(move || segments.put(id.0, &identity, &data, crc, flags, true)).await?);
        }
        let header = format::encode_header(key, data.len() as u64, crc, flags)
            .map_err(|_| StoreError::KeyTooLarge { len: key.identity_len() })?;
        let on_disk = format::round_up((header.len() + data.len()) as u64);
        let serial = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self.tmp.join(format!("{}.{}.{serial}.tmp", id.to_hex(), std::process::id()));
        let (dest, chunks, io) = (self.path_of(id), self.chunks.clone(), Arc::clone(&self.io));
        run_blocking(move || {
            let file =
                OpenOptions::new().read(true).write(true).create_new(true).mode(FILE_MODE).open(&tmp)?;
            let written = io
                .write_parts_blocking(&file, 0, &[&header, &data])
                .and_then(|()| if durable { file.sync_data() } else { Ok(()) })
                .and_then(|()| publish(&tmp, &dest, &chunks, durable));
            if written.is_err() {
                // Best effort: after a failed write or rename the temp file is still there.
                let _ = fs::remove_file(&tmp);
            }
            written
        })
        .await?;
        Ok(on_disk)
    }

    /// Opens the chunk `key` and checks its header (identity and length) without reading
    /// the data. `None` when absent. An invalid file, anything but a regular file at its path, or
    /// a file of another owner is removed and reported as `Corrupt`.
    pub async fn get(&self, key: &ChunkKey) -> Result<Option<CachedChunk>, StoreError> {
        let id = key.id();
        let path = self.path_of(id);
        let legacy =
            self.legacy.load(Ordering::Relaxed).then(|| (self.legacy_path_of(id), self.chunks.clone()));
        let opened = run_blocking(move || {
            // Only a regular file can be a chunk. Anything else at its path (a directory, a named
            // pipe) would keep the chunk out of the cache for good: it is removed, so the chunk can
            // be stored again. Opened non-blocking, so a pipe cannot hold the open waiting for a
            // writer; one open and one fstat, as for any hit.
            let open = || OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path);
            let file = match open() {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Still where the two-level layout kept it? Then moved to its place first.
                    // (Moved meanwhile by the rebuild, or by another lookup: opened all the same.)
                    let Some((old, chunks)) = &legacy else { return Ok(Ok(None)) };
                    match rename_into(old, &path, chunks) {
                        // The old directory goes once its last chunk has moved: this lookup may
                        // have moved it before the rebuild's scan saw it, and then the rebuild
                        // would not know the directory.
                        Ok(_) => _ = old.parent().map(fs::remove_dir),
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        Err(_) => {}
                    }
                    match open() {
                        Ok(file) => file,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(None)),
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            let meta = file.metadata()?;
            if !meta.is_file() {
                drop(file);
                remove_entry(&path)?;
                return Ok(Err(describe(meta.file_type())));
            }
            // A file no slot wrote (S9: another owner's, planted by whoever could): never read.
            if meta.uid() != memarts_settings::dir_trust::own_uid() {
                drop(file);
                remove_entry(&path)?;
                return Ok(Err("a file of another owner"));
            }
            // Back to blocking: io_uring answers EAGAIN, instead of waiting for the disk, on a
            // non-blocking file whose data is not in the page cache.
            nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()))
                .map_err(io::Error::from)?;
            Ok(Ok(Some((file, meta.len()))))
        })
        .await?;
        let (file, file_len) = match opened {
            Ok(Some(opened)) => opened,
            Ok(None) => return Ok(None),
            Err(what) => {
                let reason = format!("{what} where the chunk file should be (removed)");
                tracing::warn!(%id, %reason, "removing a foreign entry at a chunk's path");
                return Err(StoreError::Corrupt { id, reason });
            }
        };
        let file = Arc::new(file);
        match self.read_header(&file, file_len, &key.identity_bytes()).await {
            Ok(Ok(data)) => Ok(Some(CachedChunk {
                id,
                file,
                data_offset: data.offset,
                len: data.len,
                crc32c: data.crc32c,
                flags: data.flags,
            })),
            Ok(Err(invalid)) => Err(self.discard(id, &file, invalid.to_string()).await),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.discard(id, &file, "file shrank while reading its header".into()).await)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the header, checked ([`verify`]: the chunk's own, `identity`, with its data within
    /// the file): one 4096-byte read, a second one only for very long identities.
    async fn read_header(
        &self,
        file: &Arc<File>,
        file_len: u64,
        identity: &[u8],
    ) -> io::Result<Result<verify::Data, verify::Invalid>> {
        let first = file_len.min(format::ALIGN) as usize;
        let bytes = self.io.read_at(Arc::clone(file), 0, first).await?;
        let checked = match verify::header(&bytes, identity) {
            Err(verify::Invalid::Header(FormatError::Truncated { needed, .. }))
                if needed > first && needed as u64 <= file_len =>
            {
                let bytes = self.io.read_at(Arc::clone(file), 0, needed).await?;
                verify::header(&bytes, identity)
            }
            checked => checked,
        };
        Ok(checked.and_then(|data| verify::fits_file(&data, file_len).map(|()| data)))
    }

    /// Reads the chunk's data and checks its CRC32C. On a mismatch (or a file that shrank)
    /// the file is removed and `Corrupt` returned.
    pub async fn read_verified(&self, chunk: &CachedChunk) -> Result<Vec<u8>, StoreError> {
        let len = usize::try_from(chunk.len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let data = match self.io.read_at(Arc::clone(&chunk.file), chunk.data_offset, len).await {
            Ok(data) => data,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(self.discard(chunk.id, &chunk.file, "data truncated".into()).await);
            }
            Err(e) => return Err(e.into()),
        };
        let header = verify::Data {
            offset: chunk.data_offset,
            len: chunk.len,
            crc32c: chunk.crc32c,
            flags: chunk.flags,
        };
        if let Err(invalid) = verify::data(&header, &data) {
            return Err(self.discard(chunk.id, &chunk.file, invalid.to_string()).await);
        }
        Ok(data)
    }

    /// Removes the corrupt chunk file — only if the path still names the file we opened, so
    /// a concurrent `put` that just replaced it is not undone — and builds the error.
    async fn discard(&self, id: ChunkId, file: &Arc<File>, reason: String) -> StoreError {
        tracing::warn!(%id, %reason, "removing corrupt chunk file");
        let (path, file) = (self.path_of(id), Arc::clone(file));
        let removed = run_blocking(move || {
            let (ours, named) = (file.metadata()?, fs::symlink_metadata(&path)?);
            if (ours.dev(), ours.ino()) == (named.dev(), named.ino()) {
                fs::remove_file(&path)?;
            }
            Ok(())
        })
        .await;
        match removed {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(%id, error = %e, "could not remove corrupt chunk file");
            }
            _ => {}
        }
        StoreError::Corrupt { id, reason }
    }

    /// Removes the chunk `id`; returns the bytes freed (`st_blocks * 512`, 0 if absent).
    /// Blocking: call it from a blocking thread.
    pub fn remove(&self, id: ChunkId) -> io::Result<u64> {
        // A packed chunk has no file, unless it was kept as one before its slot packed chunks.
        if let Some(segments) = self.packed.get() {
            segments.remove(id.0);
        }
        let path = self.path_of(id);
        let freed = match fs::symlink_metadata(&path) {
            Ok(meta) => meta.blocks() * 512,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        match fs::remove_file(&path) {
            Ok(()) => Ok(freed),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Walks `chunks/` lazily, yielding every chunk file; foreign entries are skipped and
    /// counted in [`Scan::report`]. Blocking: iterate it on a blocking thread.
    pub fn scan(&self) -> Scan {
        Scan::new(&self.chunks)
    }
}

impl std::fmt::Debug for ChunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStore").field("root", &self.root).field("io_engine", &self.io.name()).finish()
    }
}
