//! The chunks a slot holds on its disk: the chunk store, the index that accounts for them within
//! the slot's capacity (`index.rs`, its policy in `eviction/`), the files of recent hits kept open
//! (`open_chunks.rs`) and the chunks kept resident for local reads (`resident.rs`, with the reads
//! shims report in `local_reads.rs`). A hit is a chunk file whose header binds it to the requested
//! identity; a fetched chunk is written within the capacity (victims evicted first) if the index
//! admits it; a chunk that fails a check is dropped, counted, and fetched again by its reader.
//! Where a missing chunk comes from is the slot's business (`miss.rs`), not this one's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;

use super::index::ChunkIndex;
use super::metadata::ChunkPresence;
use super::open_chunks::OpenChunks;
use super::resident::ResidentChunks;
use super::{ChunkOutcome, Fetched, ReadBy, Stats, INLINE_MAX, MAX_OPEN_CHUNKS};
use crate::chunk_store::format::round_up;
use crate::chunk_store::{ChunkId, ChunkKey, ChunkStore, StoreError};

/// The chunks of one slot on its disk (see the module docs).
pub struct DiskChunks {
    /// Never read or write chunk files (origin mode): every chunk comes from the origin.
    passthrough: bool,
    pub(super) store: Arc<ChunkStore>,
    index: Mutex<ChunkIndex>,
    open: OpenChunks,
    /// Whether the index was rebuilt from the store since the slot started (`rebuild.rs`).
    index_ready: AtomicBool,
    /// Chunks read locally, locked in memory and checked once (`resident.rs`), once set up.
    pub(super) resident: OnceLock<Arc<ResidentChunks>>,
    /// The slot's counters (hits, evictions, corrupt chunks, store errors).
    pub(super) stats: Arc<Stats>,
}

impl ChunkPresence for DiskChunks {
    fn index_ready(&self) -> bool {
        DiskChunks::index_ready(self)
    }

    fn has_placement(&self, placement: u64) -> bool {
        self.index().has_placement(placement)
    }
}

impl DiskChunks {
    pub fn new(store: ChunkStore, index: ChunkIndex, passthrough: bool, stats: Arc<Stats>) -> DiskChunks {
        DiskChunks {
            passthrough,
            store: Arc::new(store),
            index: Mutex::new(index),
            open: OpenChunks::new(MAX_OPEN_CHUNKS),
            index_ready: AtomicBool::new(false),
            resident: OnceLock::new(),
            stats,
        }
    }

    pub(super) fn index(&self) -> MutexGuard<'_, ChunkIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the index was rebuilt since the slot started.
    pub(super) fn index_ready(&self) -> bool {
        self.index_ready.load(Ordering::Acquire)
    }

    /// The index is rebuilt: eviction and the look-ups that need the whole index may start.
    pub(super) fn set_index_ready(&self) {
        self.index_ready.store(true, Ordering::Release);
    }

    /// Counts a read of chunk `id` for admission (`ChunkIndex::record_read`), as `by` makes it.
    pub(super) fn count_read(&self, id: u128, by: ReadBy) -> bool {
        match by {
            ReadBy::Client => self.index().record_read(id),
            ReadBy::Prefetch => self.index().record_prefetch(id),
        }
    }

    /// Tier `Disk` (`miss.rs`): a flight that ended between the caller's cache lookup and this
    /// one may have just written the chunk: the chunk `key` read whole from disk and verified, if
    /// it is there (never in pass-through). A prefetch's staging starts here, with no lookup
    /// before: a chunk found corrupt is dropped and counted as a lookup's is, never passed over.
    pub(super) async fn read_whole(&self, key: &ChunkKey) -> Option<Fetched> {
        if self.passthrough {
            return None;
        }
        let id = key.id().0;
        match self.store.read_packed(key).await {
            Ok(Some(packed)) => {
                return Some(Fetched { crc32c: packed.crc32c, data: Bytes::from(packed.data) })
            }
            Ok(None) => {}
            Err(e) => {
                self.lookup_failed(id, e).await;
                return None;
            }
        }
        let chunk = match self.store.get(key).await {
            Ok(chunk) => chunk?,
            Err(e) => {
                self.lookup_failed(id, e).await;
                return None;
            }
        };
        match self.store.read_verified(&chunk).await {
            Ok(data) => Some(Fetched { crc32c: chunk.crc32c, data: Bytes::from(data) }),
            Err(e) => {
                self.drop_corrupt(id, &e.to_string()).await;
                None
            }
        }
    }

    pub(super) async fn hit(&self, key: &ChunkKey, id: u128, by: ReadBy) -> Option<ChunkOutcome> {
        match self.store.read_packed(key).await {
            Ok(None) => {}
            Ok(Some(packed)) => {
                let (len, crc32c) = (packed.data.len() as u64, packed.crc32c);
                self.served(id, by, len, self.store.on_disk_len(key, len));
                return Some(ChunkOutcome::Bytes { data: packed.data.into(), crc32c, from_cache: true });
            }
            Err(e) => {
                self.lookup_failed(id, e).await;
                return None;
            }
        }
        let chunk = match self.open.get(id) {
            Some(chunk) => chunk,
            None => match self.store.get(key).await {
                Ok(Some(chunk)) => {
                    self.open.insert(id, &chunk);
                    chunk
                }
                Ok(None) => {
                    self.index().remove(id);
                    return None;
                }
                Err(e) => {
                    self.lookup_failed(id, e).await;
                    return None;
                }
            },
        };
        let len = chunk.len;
        let on_disk = round_up(chunk.data_offset + chunk.len);
        let outcome = if chunk.len <= INLINE_MAX {
            match self.store.read_verified(&chunk).await {
                Ok(data) => ChunkOutcome::Bytes { data: data.into(), crc32c: chunk.crc32c, from_cache: true },
                Err(e) => {
                    self.drop_corrupt(id, &e.to_string()).await;
                    return None;
                }
            }
        } else {
            ChunkOutcome::Fd(chunk.into())
        };
        self.served(id, by, len, on_disk);
        Some(outcome)
    }

    /// A lookup of chunk `id` that failed: a corrupt chunk dropped, any other error counted.
    async fn lookup_failed(&self, id: u128, e: StoreError) {
        match e {
            StoreError::Corrupt { reason, .. } => self.drop_corrupt(id, &reason).await,
            e => {
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cache read failed, going to the origin: {e}");
            }
        }
    }

    /// A hit of `len` bytes (`on_disk` on disk) served: counted, and the chunk's recency.
    fn served(&self, id: u128, by: ReadBy, len: u64, on_disk: u64) {
        self.count_read(id, by);
        {
            let mut index = self.index();
            if !index.touch(id) {
                index.insert(id, on_disk);
            }
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_from_cache.fetch_add(len, Ordering::Relaxed);
    }

    pub(super) async fn drop_corrupt(&self, id: u128, reason: &str) {
        self.forget_corrupt(id, reason);
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.remove(ChunkId(id))).await;
    }

    /// A chunk found corrupt whose bytes the store dropped (a compaction's finds): counted and
    /// logged as a read's find is, and no longer indexed.
    pub(super) fn forget_corrupt(&self, id: u128, reason: &str) {
        self.stats.corrupt_chunks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("dropping corrupt chunk {id:032x}: {reason}");
        self.open.remove(id);
        self.release_resident(id);
        self.index().remove(id);
    }

    /// Writes a fetched chunk to disk and accounts for it; a full or failing disk only costs the cache.
    /// Room is reserved (and victims deleted) before the write, so bytes on disk never exceed the
    /// capacity, even with many writes in flight. A chunk the index does not admit (colder than
    /// what it would push out) is not written and pushes nothing out: its readers were served.
    /// `returning`: whether the read that fetched it was a re-read (`ChunkIndex::record_read`).
    pub(super) async fn persist(
        &self,
        key: &ChunkKey,
        id: u128,
        fetched: Fetched,
        returning: bool,
        promised_as: Option<u128>,
    ) {
        let Fetched { data, crc32c } = fetched;
        let need = self.store.on_disk_len(key, data.len() as u64);
        let Some(victims) = self.index().admit(id, need, returning, promised_as) else {
            self.stats.rejected_chunks.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.remove_files(victims).await;
        match self.store.put_checked(key, data, crc32c, 0, false).await {
            Ok(bytes) => self.index().insert(id, bytes),
            Err(e) => {
                self.index().remove(id);
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("could not cache chunk {id:032x}, serving it from the origin only: {e}");
            }
        }
    }

    /// Deletes evicted chunks' files (and closes them: an open descriptor would keep their blocks).
    pub(super) async fn remove_files(&self, victims: Vec<(u128, u64)>) {
        if victims.is_empty() {
            return;
        }
        self.stats.evicted_chunks.fetch_add(victims.len() as u64, Ordering::Relaxed);
        for (id, _) in &victims {
            self.open.remove(*id);
            self.release_resident(*id);
        }
        let store = self.store.clone();
        let corrupt = tokio::task::spawn_blocking(move || {
            for (id, _) in victims {
                if let Err(e) = store.remove(ChunkId(id)) {
                    tracing::warn!("could not evict chunk {id:032x}: {e}");
                }
            }
            // Evicted packed chunks free their room once their segments are compacted.
            store.reclaim()
        })
        .await;
        for (id, why) in corrupt.unwrap_or_default() {
            self.forget_corrupt(id, &why);
        }
    }
}
