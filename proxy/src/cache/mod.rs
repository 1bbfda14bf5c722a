//! The engine of a proxy slot: metadata cache, chunk index, single-flight fills and eviction.
//!
//! A chunk read is either a hit (the chunk file is on disk and its header binds it to the requested
//! identity: the caller gets the open file to pass on) or a miss (one origin fetch per chunk however
//! many readers wait for it; the bytes go to every waiter and then to disk). A chunk that fails a
//! check is dropped, counted, and fetched again: bad bytes are never served.

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod disk_fault_tests;
mod flight;
#[cfg(test)]
mod herd_tests;
mod index;
mod meta;
mod open_chunks;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use memarts_protocol::{
    owner_slot, ChunkRequest, ErrorCode, FirstRequest, ListPage, ListRequest, ObjectMeta, ObjectUrl,
    SlotStatus, WireError, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};

use crate::budget::MemoryBudget;
use crate::chunk_store::{CachedChunk, ChunkKey, ChunkStore, StoreError};
use crate::memarts_only::{OnlyError, OnlyStore};
use crate::origin::Origin;
pub use flight::Flights;
pub use index::ChunkIndex;
pub use meta::MetaCache;
pub use open_chunks::OpenChunks;

/// Chunks up to this size are read by the proxy and sent inline; larger hits pass the descriptor.
pub const INLINE_MAX: u64 = 64 << 10;

/// Chunk files a slot keeps open for fast hits (see [`OpenChunks`]).
pub const MAX_OPEN_CHUNKS: usize = 1024;

/// Bytes fetched from the origin, with their checksum.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub data: Bytes,
    pub crc32c: u32,
}

/// What a chunk read produced.
pub enum ChunkOutcome {
    /// A verified-header hit whose data the client reads from the passed descriptor.
    Fd(CachedChunk),
    /// Bytes to send inline: a small hit (`from_cache`) or a miss.
    Bytes { data: Bytes, crc32c: u32, from_cache: bool },
}

/// Counters for `memarts status`.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_from_cache: AtomicU64,
    pub bytes_from_origin: AtomicU64,
    pub corrupt_chunks: AtomicU64,
    pub evicted_chunks: AtomicU64,
    pub store_errors: AtomicU64,
    /// Reads that went on with an expired version because the origin could not be reached.
    pub stale_meta_served: AtomicU64,
}

/// Static facts about the slot.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    pub slot: u32,
    pub slots: u32,
    pub cache_dir: PathBuf,
    /// Fleet capacity from the config; `None`: derived from free space once the index is rebuilt.
    pub capacity: Option<u64>,
    pub io_engine: &'static str,
    /// Never read or write chunk files: every chunk comes from the origin.
    pub passthrough: bool,
    /// Bytes of fills and upload payloads the slot may hold in memory at once.
    pub memory_budget: u64,
}

pub struct Cache {
    info: SlotInfo,
    origin: Arc<Origin>,
    store: Arc<ChunkStore>,
    index: Mutex<ChunkIndex>,
    meta: MetaCache,
    /// memarts-only objects; `None` in a pass-through engine, which stores nothing.
    only: Option<Arc<OnlyStore>>,
    open: OpenChunks,
    flights: Arc<Flights<Result<Fetched, WireError>>>,
    heads: Arc<Flights<Result<ObjectMeta, WireError>>>,
    /// Cold first reads (metadata and chunk 0 in one GET), one flight per URL and chunk size.
    firsts: Arc<Flights<Result<(ObjectMeta, Fetched), WireError>>>,
    index_ready: AtomicBool,
    started: Instant,
    /// Bounds the fills held in memory at once, shared with the slot's connections (R2).
    budget: MemoryBudget,
    pub stats: Stats,
}

fn bad_request(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::BadRequest, msg)
}

fn parse_url(url: &str) -> Result<ObjectUrl, WireError> {
    ObjectUrl::parse(url).map_err(|e| bad_request(e.to_string()))
}

impl Cache {
    pub fn new(
        info: SlotInfo,
        origin: Origin,
        store: ChunkStore,
        meta: MetaCache,
        only: Option<OnlyStore>,
    ) -> Arc<Cache> {
        let budget = info.memory_budget;
        Arc::new(Cache {
            info,
            only: only.map(Arc::new),
            origin: Arc::new(origin),
            store: Arc::new(store),
            index: Mutex::new(ChunkIndex::default()),
            meta,
            open: OpenChunks::new(MAX_OPEN_CHUNKS),
            flights: Arc::default(),
            heads: Arc::default(),
            firsts: Arc::default(),
            index_ready: AtomicBool::new(false),
            started: Instant::now(),
            budget: MemoryBudget::new(budget),
            stats: Stats::default(),
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, ChunkIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot's memory budget: fills hold their bytes in it, connections their upload payloads.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Metadata of `url`, from the metadata cache while fresh, else from the origin.
    /// Concurrent misses of one URL share one HEAD request (single-flight, as chunk fills do).
    pub async fn stat(self: &Arc<Self>, url: &str, refresh: bool) -> Result<ObjectMeta, WireError> {
        let parsed = parse_url(url)?;
        let key = parsed.to_string();
        if !refresh {
            if let Some(meta) = self.meta.get(&key) {
                return Ok(meta);
            }
        }
        let flight = xxhash_rust::xxh3::xxh3_128(key.as_bytes());
        let stale_key = key.clone();
        let this = self.clone();
        let (meta, _) = self
            .heads
            .join(
                flight,
                move |leader| async move {
                    let meta = this.origin.head(&parsed).await.map_err(WireError::from);
                    match &meta {
                        Ok(m) => this.meta.put(key, m.clone()),
                        // Gone at the origin: stop vouching for a version that no longer exists.
                        Err(e) if e.code == ErrorCode::NotFound => this.meta.invalidate(&key),
                        Err(_) => {}
                    }
                    leader.publish(meta);
                },
                || Err(WireError::new(ErrorCode::Internal, "the metadata request was abandoned")),
            )
            .await;
        match meta {
            // The origin cannot be reached to verify the version: keep serving the last verified
            // one (its cached chunks are whole and checked; its misses will fail on their own).
            // Not for refusals (403) or absence (404), which the origin did answer.
            Err(e) if e.code == ErrorCode::OriginError => match self.meta.get_stale(&stale_key) {
                Some(stale) => {
                    self.stats.stale_meta_served.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(url, error = %e.message, "origin unreachable: serving the last verified version");
                    Ok(stale)
                }
                None => Err(e),
            },
            other => other,
        }
    }

    /// Where this slot number of a fleet of this size keeps its metadata across graceful restarts.
    fn meta_snapshot_path(&self) -> PathBuf {
        let name = format!("slot-{}-of-{}.snap", self.info.slot, self.info.slots);
        self.info.cache_dir.join("v1/meta").join(name)
    }

    /// Loads what the previous process of this slot saved when it stopped (see [`MetaCache::save`]).
    pub fn load_meta_snapshot(&self) {
        if self.info.passthrough {
            return;
        }
        let path = self.meta_snapshot_path();
        match self.meta.load(&path) {
            Ok(n) => tracing::info!(entries = n, "metadata restored from {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("metadata snapshot ignored: {e}"),
        }
    }

    /// Saves the fresh metadata for the next process of this slot; called after draining.
    pub fn save_meta_snapshot(&self) {
        if self.info.passthrough {
            return;
        }
        let path = self.meta_snapshot_path();
        let saved = path.parent().map_or(Ok(()), |dir| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
        });
        match saved.and_then(|()| self.meta.save(&path)) {
            Ok(n) => tracing::info!(entries = n, "metadata saved to {}", path.display()),
            Err(e) => tracing::warn!("could not save the metadata snapshot {}: {e}", path.display()),
        }
    }

    /// Records the metadata of a version this slot just wrote, so reads through it see the new
    /// version at once (other slots revalidate when their metadata TTL ends, or on `refresh`).
    pub fn note_written(&self, url: &ObjectUrl, meta: &ObjectMeta) {
        if meta.etag.is_some() {
            self.meta.put(url.to_string(), meta.clone());
        } else {
            self.meta.invalidate(&url.to_string());
        }
    }

    /// The store of memarts-only objects, or why there is none.
    pub fn only_store(&self) -> Result<Arc<OnlyStore>, WireError> {
        self.only.clone().ok_or_else(|| {
            WireError::new(
                ErrorCode::NoSpace,
                "memarts is disabled here (direct mode): memarts-only objects cannot be stored",
            )
        })
    }

    /// A memarts-only object as one chunk reply: its header verified; its data inline (checked
    /// here) when small, else by descriptor (checked by the client). Damage is `Corrupt`: there is
    /// no other copy to fall back on.
    pub async fn read_memarts(&self, url: &str) -> Result<ChunkOutcome, WireError> {
        let parsed = parse_url(url)?;
        let store = self.only_store().map_err(|_| {
            WireError::new(ErrorCode::NotFound, format!("{url}: no memarts-only objects in direct mode"))
        })?;
        let found = tokio::task::spawn_blocking(move || {
            let stored = store.get(&parsed)?;
            let Some(s) = stored else { return Ok(None) };
            if s.len > INLINE_MAX {
                return Ok(Some((s, None)));
            }
            let mut data = vec![0u8; s.len as usize];
            std::os::unix::fs::FileExt::read_exact_at(&s.file, &mut data, s.data_offset)?;
            if memarts_protocol::crc32c(&data) != s.crc32c {
                return Err(OnlyError::Corrupt {
                    url: parsed.to_string(),
                    why: "data checksum mismatch".into(),
                });
            }
            Ok(Some((s, Some(data))))
        })
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
        match found {
            Ok(None) => {
                Err(WireError::new(ErrorCode::NotFound, format!("{url}: no such memarts-only object")))
            }
            Ok(Some((s, Some(data)))) => {
                Ok(ChunkOutcome::Bytes { crc32c: s.crc32c, data: data.into(), from_cache: true })
            }
            Ok(Some((s, None))) => Ok(ChunkOutcome::Fd(CachedChunk {
                id: crate::chunk_store::ChunkId(0),
                file: Arc::new(s.file),
                data_offset: s.data_offset,
                len: s.len,
                crc32c: s.crc32c,
                flags: crate::chunk_store::format::FLAG_MEMARTS_ONLY,
            })),
            Err(OnlyError::Corrupt { url, why }) => {
                self.stats.corrupt_chunks.fetch_add(1, Ordering::Relaxed);
                Err(WireError::new(ErrorCode::Corrupt, format!("{url}: {why}")))
            }
            Err(e) => Err(WireError::new(ErrorCode::Internal, e.to_string())),
        }
    }

    /// Deletes an object at the origin and forgets its metadata here.
    pub async fn delete(&self, url: &str) -> Result<(), WireError> {
        let parsed = parse_url(url)?;
        self.origin.delete(&parsed).await?;
        self.meta.invalidate(&parsed.to_string());
        Ok(())
    }

    pub async fn list(&self, req: &ListRequest) -> Result<ListPage, WireError> {
        Ok(self.origin.list(req).await?)
    }

    /// Metadata of `req.url` and its chunk 0 (none for an empty object), in one request: the shim
    /// sends it to the owner of chunk 0, so the chunk is filled by the same single flight as a
    /// `ReadChunk` of it would be.
    pub async fn read_first(
        self: &Arc<Self>,
        req: &FirstRequest,
    ) -> Result<(ObjectMeta, Option<ChunkOutcome>), WireError> {
        let mut known = None;
        if !req.refresh {
            let url = parse_url(&req.url)?;
            known = self.meta.get(&url.to_string());
            let cold = known.is_none()
                && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&req.chunk_size)
                && self.is_cold(&url, req.chunk_size);
            if cold {
                if let Some(first) = self.read_first_cold(url, req.chunk_size).await {
                    return first;
                }
            }
        }
        let meta = match known {
            Some(meta) => meta,
            None => self.stat(&req.url, req.refresh).await?,
        };
        if meta.size == 0 {
            return Ok((meta, None));
        }
        let etag = meta.etag.clone().filter(|e| !e.is_empty()).ok_or_else(|| {
            WireError::new(
                ErrorCode::OriginError,
                format!("{}: the origin reports no ETag, so its chunks cannot be cached safely", req.url),
            )
        })?;
        let chunk = ChunkRequest {
            url: req.url.clone(),
            etag,
            object_size: meta.size,
            chunk_size: req.chunk_size,
            index: 0,
            recheck: false,
        };
        let outcome = self.read_chunk(&chunk).await?;
        Ok((meta, Some(outcome)))
    }

    /// With no metadata for `url`: no version of its chunk 0 is cached either (the index must be
    /// complete, and this slot chunk 0's owner, to say so). A warm object that merely lost its
    /// metadata (a restart) is not cold: it is revalidated with a HEAD, so its cached chunks are used
    /// and nothing is fetched.
    fn is_cold(&self, url: &ObjectUrl, chunk_size: u64) -> bool {
        if self.info.passthrough {
            return true;
        }
        // Only the owner of chunk 0 indexes it; another slot (a client routing by an old fleet size)
        // cannot tell.
        let placement = memarts_protocol::placement(url.kind.as_str(), &url.bucket, &url.key, chunk_size, 0);
        owner_slot(u128::from(placement) << 64, self.info.slots) == self.info.slot
            && self.index_ready.load(Ordering::Acquire)
            && !self.index().has_placement(placement)
    }

    /// A first read of a cold object: its metadata and chunk 0 come from one ranged GET instead of a
    /// HEAD and then a GET, halving the round trips of a cold small file. Concurrent cold first reads
    /// of one object share that GET. `None`: the GET did not work out (an empty object, an origin
    /// without ETags, a transient failure): the caller takes the usual way, with its retries.
    async fn read_first_cold(
        self: &Arc<Self>,
        url: ObjectUrl,
        chunk_size: u64,
    ) -> Option<Result<(ObjectMeta, Option<ChunkOutcome>), WireError>> {
        let flight = first_flight(&url, chunk_size);
        let this = self.clone();
        let (result, _) = self
            .firsts
            .join(
                flight,
                move |leader| async move {
                    let _held = this.budget.hold(chunk_size).await;
                    let got = this.origin.get_first(&url, chunk_size).await.map_err(WireError::from);
                    let got = got.and_then(|(meta, data)| match meta.etag.as_deref() {
                        Some(etag) if !etag.is_empty() && meta.size > 0 => {
                            Ok((meta, Fetched { crc32c: memarts_protocol::crc32c(&data), data }))
                        }
                        _ => Err(WireError::new(ErrorCode::OriginError, "empty, or no ETag: ask with HEAD")),
                    });
                    // Chunk 0 is on disk before anyone is answered: this fill is not in the chunk
                    // flights, so a read of chunk 0 right after must find it there, not fetch it again.
                    if let Ok((meta, f)) = &got {
                        this.meta.put(url.to_string(), meta.clone());
                        this.stats.misses.fetch_add(1, Ordering::Relaxed);
                        this.stats.bytes_from_origin.fetch_add(f.data.len() as u64, Ordering::Relaxed);
                        if !this.info.passthrough {
                            let etag = meta.etag.as_deref().unwrap_or_default();
                            let key = ChunkKey::new(&url, etag, chunk_size, 0);
                            this.persist(&key, key.id().0, f.data.clone()).await;
                        }
                    }
                    leader.publish(got);
                    drop(leader);
                },
                || Err(WireError::new(ErrorCode::Internal, "the first read of this object was abandoned")),
            )
            .await;
        match result {
            Ok((meta, f)) => Some(Ok((
                meta,
                Some(ChunkOutcome::Bytes { data: f.data, crc32c: f.crc32c, from_cache: false }),
            ))),
            // Gone is gone, refused is refused (O3: never retried): no need to ask again with a HEAD.
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::PermissionDenied) => Some(Err(e)),
            Err(_) => None,
        }
    }

    /// Reads one chunk: a hit from disk or a single-flight fill from the origin.
    pub async fn read_chunk(self: &Arc<Self>, req: &ChunkRequest) -> Result<ChunkOutcome, WireError> {
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&req.chunk_size) {
            return Err(bad_request(format!(
                "chunk size {} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}",
                req.chunk_size
            )));
        }
        let range = req.range().ok_or_else(|| {
            bad_request(format!("chunk {} lies past the end of a {}-byte object", req.index, req.object_size))
        })?;
        if req.etag.is_empty() {
            return Err(bad_request("a chunk read needs the ETag the read started with"));
        }
        let url = parse_url(&req.url)?;
        let key = ChunkKey::new(&url, &req.etag, req.chunk_size, req.index);
        let id = key.id().0;

        if !self.info.passthrough {
            if req.recheck {
                self.drop_corrupt(id, "client checksum mismatch").await;
            } else if let Some(outcome) = self.try_hit(&key, id).await {
                return Ok(outcome);
            }
        }

        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let this = self.clone();
        let (result, _led) = self
            .flights
            .join(
                id,
                move |leader| async move {
                    // A flight that ended between our cache lookup and this one may have just
                    // written the chunk: look again before going to the origin.
                    if let Some(f) = this.read_from_disk(&key).await {
                        leader.publish(Ok(f));
                        return;
                    }
                    // A cold first read may be fetching chunk 0 with the metadata (a reader that found
                    // no metadata before the index was rebuilt asked with a HEAD instead, and comes
                    // here): wait for it and look again, so the chunk is fetched once (R3).
                    if key.index == 0 && this.firsts.wait(first_flight(&url, key.chunk_size)).await {
                        if let Some(f) = this.read_from_disk(&key).await {
                            leader.publish(Ok(f));
                            return;
                        }
                    }
                    // Held until the chunk is on disk (end of this block); never while waiting for
                    // anything else that needs the budget, so holders cannot wait on each other.
                    let _held = this.budget.hold(range.end - range.start).await;
                    let fetched = this.origin.get_range(&url, range, &key.etag).await;
                    let fetched = fetched
                        .map(|data| Fetched { crc32c: memarts_protocol::crc32c(&data), data })
                        .map_err(WireError::from);
                    leader.publish(fetched.clone());
                    if let Ok(f) = fetched {
                        this.stats.bytes_from_origin.fetch_add(f.data.len() as u64, Ordering::Relaxed);
                        if !this.info.passthrough {
                            this.persist(&key, id, f.data).await;
                        }
                    }
                    drop(leader);
                },
                || Err(WireError::new(ErrorCode::Internal, "the fetch of this chunk was abandoned")),
            )
            .await;
        let f = result?;
        Ok(ChunkOutcome::Bytes { data: f.data, crc32c: f.crc32c, from_cache: false })
    }

    /// The chunk `key` read whole from disk and verified, if it is there (never in pass-through).
    async fn read_from_disk(&self, key: &ChunkKey) -> Option<Fetched> {
        if self.info.passthrough {
            return None;
        }
        let chunk = self.store.get(key).await.ok()??;
        let data = self.store.read_verified(&chunk).await.ok()?;
        Some(Fetched { crc32c: chunk.crc32c, data: Bytes::from(data) })
    }

    async fn try_hit(&self, key: &ChunkKey, id: u128) -> Option<ChunkOutcome> {
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
                Err(StoreError::Corrupt { reason, .. }) => {
                    self.drop_corrupt(id, &reason).await;
                    return None;
                }
                Err(e) => {
                    self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("cache read failed, going to the origin: {e}");
                    return None;
                }
            },
        };
        let outcome = if chunk.len <= INLINE_MAX {
            match self.store.read_verified(&chunk).await {
                Ok(data) => ChunkOutcome::Bytes { data: data.into(), crc32c: chunk.crc32c, from_cache: true },
                Err(e) => {
                    self.drop_corrupt(id, &e.to_string()).await;
                    return None;
                }
            }
        } else {
            ChunkOutcome::Fd(chunk.clone())
        };
        {
            let mut index = self.index();
            if !index.touch(id) {
                index.insert(id, crate::chunk_store::format::round_up(chunk.data_offset + chunk.len));
            }
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_from_cache.fetch_add(chunk.len, Ordering::Relaxed);
        Some(outcome)
    }

    async fn drop_corrupt(&self, id: u128, reason: &str) {
        self.stats.corrupt_chunks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("dropping corrupt chunk {id:032x}: {reason}");
        self.open.remove(id);
        self.index().remove(id);
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.remove(crate::chunk_store::ChunkId(id))).await;
    }

    /// Writes a fetched chunk to disk and accounts for it; a full or failing disk only costs the cache.
    /// Room is reserved (and victims deleted) before the write, so bytes on disk never exceed the
    /// capacity, even with many writes in flight.
    async fn persist(&self, key: &ChunkKey, id: u128, data: Bytes) {
        let need = crate::chunk_store::format::round_up(
            crate::chunk_store::format::data_offset_for(key.identity_len()) + data.len() as u64,
        );
        let victims = {
            let mut index = self.index();
            index.insert(id, need);
            index.evict_over_capacity(Some(id))
        };
        self.remove_files(victims).await;
        match self.store.put(key, data, 0, false).await {
            Ok(bytes) => self.index().insert(id, bytes),
            Err(e) => {
                self.index().remove(id);
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("could not cache chunk {id:032x}, serving it from the origin only: {e}");
            }
        }
    }

    /// Waits (up to `timeout`) until no fill is in flight, so a draining slot finishes writing the
    /// chunks it fetched.
    pub async fn wait_idle(&self, timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while !(self.flights.is_empty() && self.firsts.is_empty()) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn remove_files(&self, victims: Vec<(u128, u64)>) {
        if victims.is_empty() {
            return;
        }
        self.stats.evicted_chunks.fetch_add(victims.len() as u64, Ordering::Relaxed);
        for (id, _) in &victims {
            // An open descriptor would keep an evicted file's blocks allocated.
            self.open.remove(*id);
        }
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for (id, _) in victims {
                if let Err(e) = store.remove(crate::chunk_store::ChunkId(id)) {
                    tracing::warn!("could not evict chunk {id:032x}: {e}");
                }
            }
        })
        .await;
    }

    /// Rebuilds the index from the chunk files in the background: the slot serves meanwhile (a chunk
    /// file is found by its name, the index only orders eviction).
    pub fn start_rebuild(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let store = this.store.clone();
            let (slot, slots) = (this.info.slot, this.info.slots);
            let scanned = tokio::task::spawn_blocking(move || {
                let mut owned = Vec::new();
                let mut total = 0u64;
                for c in store.scan() {
                    total += c.bytes_on_disk;
                    if owner_slot(c.id.0, slots) == slot {
                        owned.push(c);
                    }
                }
                owned.sort_by_key(|c| c.accessed);
                (owned, total)
            })
            .await;
            let Ok((owned, total)) = scanned else {
                tracing::error!("index rebuild failed; eviction stays off");
                return;
            };
            let capacity =
                this.info.capacity.unwrap_or_else(|| default_capacity(&this.info.cache_dir, total));
            let share = capacity / u64::from(slots.max(1));
            let victims = {
                let mut index = this.index();
                let live = index.ids_most_recent_first();
                let (n, bytes) = (owned.len(), owned.iter().map(|c| c.bytes_on_disk).sum::<u64>());
                let before = index.len();
                for c in &owned {
                    index.insert_if_absent(c.id.0, c.bytes_on_disk);
                }
                // Chunks served while the scan ran are more recent than anything it found.
                for id in live.into_iter().rev() {
                    index.touch(id);
                }
                index.set_capacity(Some(share));
                tracing::info!(
                    "index rebuilt in {:?}: {n} chunks ({bytes} bytes) owned, {before} seen live; \
                     fleet capacity {capacity} bytes, slot share {share}",
                    started.elapsed()
                );
                index.evict_over_capacity(None)
            };
            this.remove_files(victims).await;
            this.index_ready.store(true, Ordering::Release);
        });
    }

    pub fn status(&self) -> SlotStatus {
        let index = self.index();
        let s = &self.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SlotStatus {
            slot: self.info.slot,
            slots: self.info.slots,
            pid: std::process::id(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            connections: load(&s.connections),
            requests: load(&s.requests),
            hits: load(&s.hits),
            misses: load(&s.misses),
            bytes_from_cache: load(&s.bytes_from_cache),
            bytes_from_origin: load(&s.bytes_from_origin),
            origin_requests: load(&self.origin.stats.requests),
            origin_retries: load(&self.origin.stats.retries),
            corrupt_chunks: load(&s.corrupt_chunks),
            evicted_chunks: load(&s.evicted_chunks),
            cached_chunks: index.len() as u64,
            cache_bytes_used: index.used(),
            cache_capacity: index.capacity().unwrap_or(0),
            index_ready: self.index_ready.load(Ordering::Acquire),
            io_engine: self.info.io_engine.to_string(),
            cache_dir: self.info.cache_dir.display().to_string(),
        }
    }
}

/// The flight of the cold first read of `url` at `chunk_size` (metadata and chunk 0 in one GET).
fn first_flight(url: &ObjectUrl, chunk_size: u64) -> u128 {
    xxhash_rust::xxh3::xxh3_128(format!("{url}\0{chunk_size}").as_bytes())
}

/// 80% of the space that is free or already holds our chunks.
fn default_capacity(cache_dir: &std::path::Path, ours: u64) -> u64 {
    match nix::sys::statvfs::statvfs(cache_dir) {
        Ok(st) => {
            let free = st.blocks_available() * st.fragment_size();
            (free.saturating_add(ours) as f64 * 0.8) as u64
        }
        Err(e) => {
            tracing::warn!(
                "statvfs({}) failed ({e}); capacity defaults to what is cached now",
                cache_dir.display()
            );
            ours.max(1 << 30)
        }
    }
}
