//! Chunk reads in a slot, routed: a hit is a chunk file the disk (`disk_chunks.rs`) finds, whose
//! header binds it to the requested identity; a miss is filled once however many readers wait for
//! it (the tiers of `miss.rs`: a first read's chunk 0, the disk again, staging, a peer, the
//! origin), handed to all of them, then written to disk within the capacity (victims evicted
//! first) if the index admits it (`index.rs`, `eviction/`: with a full cache, only a chunk read
//! more often lately than what it would push out). Every read, hit or miss, is counted for that.
//! A chunk that fails a check is dropped, counted and fetched again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_protocol::{ChunkRequest, WireError, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};

use super::miss::Miss;
use super::{bad_request, parse_url, ChunkOutcome, Engine, ReadBy};
use crate::chunk_store::ChunkKey;

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
                self.disk.drop_corrupt(id, "client checksum mismatch").await;
            } else if let Some(outcome) = self.disk.hit(&key, id, by).await {
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
            miss.returning = self.disk.count_read(id, by);
        }
        // One fill however many read it (R3), walking the tiers of a miss (`miss.rs`).
        let f = self.fill_chunk(miss).await.0?;
        if by == ReadBy::Client {
            // A read that joined a prefetch's staging of this chunk has what was staged.
            self.staged.take(id);
        }
        Ok(ChunkOutcome::Bytes { data: f.data, crc32c: f.crc32c, from_cache: false })
    }
}
