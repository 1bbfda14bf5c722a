//! Chunk reads in a slot: a hit is a chunk file found (in the open-file cache or the store) whose
//! header binds it to the requested identity; a miss is filled once however many readers wait for
//! it (the tiers of `miss.rs`: a first read's chunk 0, the disk again, staging, a peer, the
//! origin), handed to all of them, then written to disk within the capacity (victims evicted
//! first) if the index admits it (`index.rs`, `eviction/`: with a full cache, only a chunk read
//! more often lately than what it would push out). Every read, hit or miss, is counted for that.
//! A chunk that fails a check is dropped, counted and fetched again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use memarts_protocol::{ChunkRequest, WireError, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};

use super::miss::Miss;
use super::{bad_request, parse_url, ChunkOutcome, Engine, Fetched, ReadBy, INLINE_MAX};
use crate::chunk_store::format::{on_disk_len, round_up};
use crate::chunk_store::{ChunkId, ChunkKey, StoreError};

impl Engine {
    /// Reads one chunk: a hit from disk, or a single-flight fill, from the node that owns it in a
    /// cluster (`peers.rs`) or from the origin.
    pub async fn read_chunk(self: &Arc<Self>, req: &ChunkRequest) -> Result<ChunkOutcome, WireError> {
        self.read_chunk_routed(req, true, ReadBy::Client).await
    }

    /// [`Engine::read_chunk`]; without `route`, never from a peer (a read a peer asked for); `by`:
    /// a client's read or a prefetch's.
    pub(super) async fn read_chunk_routed(
        self: &Arc<Self>,
        req: &ChunkRequest,
        route: bool,
        by: ReadBy,
    ) -> Result<ChunkOutcome, WireError> {
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
            } else if let Some(outcome) = self.try_hit(&key, id, by).await {
                return Ok(outcome);
            }
        }

        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let mut miss = Miss::chunk(url, key, range, by);
        // In a cluster, from the node that owns it: object-store objects only (`peers.rs`).
        miss.peer_req =
            (route && self.cluster().is_some() && super::peers::pooled(&miss.url)).then(|| req.clone());
        // Counted for admission here, unless another node may own it: then only once the turn to
        // fill it comes to this node (`Tier::Peers`), so that chunks kept elsewhere do not age this
        // slot's counts.
        if !self.info.passthrough && miss.peer_req.is_none() {
            miss.returning = self.count_read(id, by);
        }
        // One fill however many read it (R3), walking the tiers of a miss (`miss.rs`).
        let f = self.fill_chunk(miss).await.0?;
        if by == ReadBy::Client {
            // A read that joined a prefetch's staging of this chunk has what was staged.
            self.staged.take(id);
        }
        Ok(ChunkOutcome::Bytes { data: f.data, crc32c: f.crc32c, from_cache: false })
    }

    /// Tier `Disk` (`miss.rs`): a flight that ended between the caller's cache lookup and this
    /// one may have just written the chunk: the chunk `key` read whole from disk and verified, if
    /// it is there (never in pass-through).
    pub(super) async fn read_from_disk(&self, key: &ChunkKey) -> Option<Fetched> {
        if self.info.passthrough {
            return None;
        }
        let chunk = self.store.get(key).await.ok()??;
        let data = self.store.read_verified(&chunk).await.ok()?;
        Some(Fetched { crc32c: chunk.crc32c, data: Bytes::from(data) })
    }

    async fn try_hit(&self, key: &ChunkKey, id: u128, by: ReadBy) -> Option<ChunkOutcome> {
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
        self.count_read(id, by);
        {
            let mut index = self.index();
            if !index.touch(id) {
                index.insert(id, on_disk);
            }
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_from_cache.fetch_add(len, Ordering::Relaxed);
        Some(outcome)
    }

    async fn drop_corrupt(&self, id: u128, reason: &str) {
        self.stats.corrupt_chunks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("dropping corrupt chunk {id:032x}: {reason}");
        self.open.remove(id);
        self.release_resident(id);
        self.index().remove(id);
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.remove(ChunkId(id))).await;
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
        let need = on_disk_len(key, data.len() as u64);
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
        let _ = tokio::task::spawn_blocking(move || {
            for (id, _) in victims {
                if let Err(e) = store.remove(ChunkId(id)) {
                    tracing::warn!("could not evict chunk {id:032x}: {e}");
                }
            }
        })
        .await;
    }
}
