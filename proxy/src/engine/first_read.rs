//! The first round trip of a whole-object read: the object's metadata and its chunk 0 together,
//! from the owner of chunk 0. For a cold object (no metadata, no cached chunk 0) both come from one
//! ranged GET instead of a HEAD and then a GET, which halves the round trips of a cold small file.

use std::ops::Range;
use std::sync::Arc;

use memarts_protocol::{
    owner_slot, ChunkRequest, ErrorCode, FillRequest, FirstRequest, ObjectMeta, ObjectUrl, WireError,
    MAX_CHUNK_SIZE, MAX_FILL_URLS, MIN_CHUNK_SIZE,
};

use super::miss::Miss;
use super::{bad_request, parse_url, ChunkOutcome, Engine, Fetched, ReadBy};
use crate::chunk_store::ChunkKey;

/// The flight of the cold first read of `url` at `chunk_size` (metadata and chunk 0 in one GET).
pub(super) fn first_flight(url: &ObjectUrl, chunk_size: u64) -> u128 {
    xxhash_rust::xxh3::xxh3_128(format!("{url}\0{chunk_size}").as_bytes())
}

/// Chunk 0 fills of a known version in flight, by [`first_flight`] of their object: a reader that
/// knows an object's version without this slot knowing it (a peer, told by a listing) fills chunk
/// 0 as a chunk, not as a first read, and a cold first read of the same object must not fetch it
/// again (R3). A chunk 0 fill marks itself before it looks for a first read in flight, and a first
/// read starts its flight before it looks for a mark: one of the two sees the other.
#[derive(Default)]
pub(super) struct ZeroFills(Arc<std::sync::Mutex<std::collections::HashMap<u128, usize>>>);

/// A chunk 0 fill's mark, removed when dropped.
pub(super) struct ZeroFill(Arc<std::sync::Mutex<std::collections::HashMap<u128, usize>>>, u128);

impl ZeroFills {
    pub fn mark(&self, first: u128) -> ZeroFill {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(first).or_default() += 1;
        ZeroFill(self.0.clone(), first)
    }

    pub fn marked(&self, first: u128) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&first)
    }
}

impl Drop for ZeroFill {
    fn drop(&mut self) {
        let mut fills = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = fills.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                fills.remove(&self.1);
            }
        }
    }
}

impl Engine {
    /// Metadata of `req.url` and its chunk 0 (none for an empty object), in one request: the shim
    /// sends it to the owner of chunk 0, so the chunk is filled by the same single flight as a
    /// `ReadChunk` of it would be.
    pub async fn read_first(
        self: &Arc<Self>,
        req: &FirstRequest,
    ) -> Result<(ObjectMeta, Option<ChunkOutcome>), WireError> {
        self.read_first_routed(req, true, ReadBy::Client).await
    }

    /// `Fill`: a first read of each of `req.urls` (all at once), as [`Engine::read_first`] makes
    /// it, keeping only the metadata: the bytes stay in the cache (`memarts warmup`, which has no
    /// use for them, no longer has them copied through the socket). Per object, its metadata or
    /// why it could not be read.
    pub async fn fill(
        self: &Arc<Self>,
        req: &FillRequest,
    ) -> Result<Vec<Result<ObjectMeta, WireError>>, WireError> {
        if req.urls.len() > MAX_FILL_URLS {
            return Err(bad_request(format!("a fill of {} URLs exceeds {MAX_FILL_URLS}", req.urls.len())));
        }
        let firsts = req.urls.iter().map(|url| async move {
            let first = FirstRequest { url: url.clone(), chunk_size: req.chunk_size, refresh: false };
            self.read_first(&first).await.map(|(meta, _chunk)| meta)
        });
        Ok(futures::future::join_all(firsts).await)
    }

    /// [`Engine::read_first`]; without `route`, never from a peer (a read a peer asked for); `by`:
    /// a client's read or a prefetch's.
    pub(super) async fn read_first_routed(
        self: &Arc<Self>,
        req: &FirstRequest,
        route: bool,
        by: ReadBy,
    ) -> Result<(ObjectMeta, Option<ChunkOutcome>), WireError> {
        let mut known = None;
        if !req.refresh {
            let url = parse_url(&req.url)?;
            known = self.metadata.cache().get(&url.to_string());
            // In a cluster, a cold object's first read goes to the node that owns its chunk 0, which
            // answers with the metadata and the chunk in one round trip (one GET in the cluster).
            if known.is_none() && route {
                if let Some(first) = self.read_first_from_peers(req, &url).await {
                    return first;
                }
            }
            let cold = known.is_none()
                && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&req.chunk_size)
                && self.is_cold(&url, req.chunk_size);
            if cold {
                if let Some(first) = self.read_first_cold(url, req.chunk_size, by).await {
                    return first;
                }
            }
        }
        let meta = match known {
            Some(meta) => meta,
            None => self.metadata.stat_for(&req.url, req.refresh, Some(req.chunk_size)).await?,
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
        let outcome = self.read_chunk_routed(&chunk, route, by).await?;
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
        // A HEAD of it in flight means a reader that came before the index was rebuilt is on the slow
        // way and will fetch chunk 0: join it rather than fetch chunk 0 a second time (R3).
        let asking = self.metadata.asking_about(url);
        owner_slot(u128::from(placement) << 64, self.info.slots) == self.info.slot
            && self.disk.index_ready()
            && !asking
            && !self.disk.index().has_placement(placement)
    }

    /// Tier `StillCold` (`miss.rs`): the object was cold when the caller looked, but another first
    /// read (or a HEAD) may have ended between that look and this flight: its metadata is then
    /// known (put before its flight ended) and its chunk 0 on disk; or a chunk 0 fill is running
    /// (R3). The usual way reads them.
    pub(super) fn no_longer_cold(&self, url: &ObjectUrl, chunk_size: u64, flight: u128) -> bool {
        self.zero_fills.marked(flight)
            || self.metadata.cache().get(&url.to_string()).is_some()
            || !self.is_cold(url, chunk_size)
    }

    /// Tier `FirstRead` (`miss.rs`) of a fill of chunk `key`: a cold first read may be fetching
    /// chunk 0 with the metadata (this reader found the metadata it put, or asked with a HEAD
    /// before the index was rebuilt): wait for it and take its chunk 0. Before the look at the
    /// disk, not after: a first read that ended between the two would have been missed by both
    /// (R3). From its result, not from the disk: the index may not have kept the chunk
    /// (admission). `mark`: this fill's [`ZeroFill`], kept until its flight ends.
    pub(super) async fn zero_of_first_read(
        &self,
        url: &ObjectUrl,
        key: &ChunkKey,
        range: &Range<u64>,
        mark: &mut Option<ZeroFill>,
    ) -> Option<Fetched> {
        if key.index != 0 {
            return None;
        }
        let first = first_flight(url, key.chunk_size);
        *mark = Some(self.zero_fills.mark(first));
        let Some(Ok((meta, f))) = self.firsts.wait(first).await else { return None };
        let whole = f.data.len() as u64 == range.end - range.start;
        (whole && meta.etag.as_deref() == Some(key.etag.as_str())).then_some(f)
    }

    /// Metadata and chunk 0 of `url` in one ranged GET, if they can be cached: an empty object or
    /// one without an ETag is an error, for the caller to take the usual way (a HEAD first).
    pub(super) async fn get_first_cacheable(
        &self,
        url: &ObjectUrl,
        chunk_size: u64,
    ) -> Result<(ObjectMeta, Fetched), WireError> {
        let (meta, data) = self.origin.get_first(url, chunk_size).await?;
        match meta.etag.as_deref() {
            Some(etag) if !etag.is_empty() && meta.size > 0 => Ok((meta, Fetched::of(data))),
            _ => Err(WireError::new(ErrorCode::OriginError, "empty, or no ETag: ask with HEAD")),
        }
    }

    /// A first read of a cold object in one ranged GET. Concurrent cold first reads of one object
    /// share that GET. `None`: the GET did not work out (an empty object, an origin without ETags, a
    /// transient failure): the caller takes the usual way, with its retries.
    pub(super) async fn read_first_cold(
        self: &Arc<Self>,
        url: ObjectUrl,
        chunk_size: u64,
        by: ReadBy,
    ) -> Option<Result<(ObjectMeta, Option<ChunkOutcome>), WireError>> {
        let flight = first_flight(&url, chunk_size);
        let joined_url = (by == ReadBy::Client).then(|| url.clone());
        // One GET however many read it, walking the tiers of a cold first read (`miss.rs`).
        let (result, _) = self.fill_first(Miss::first(url, chunk_size, flight, by)).await;
        match result {
            Ok((meta, f)) => {
                // A client that joined a prefetch's first read was counted by it (`index.rs`).
                // One that joined a prefetch's staging of it has what was staged (`staging.rs`).
                if let (Some(url), Some(etag)) = (joined_url, meta.etag.as_deref()) {
                    let id = ChunkKey::new(&url, etag, chunk_size, 0).id().0;
                    self.disk.index().forget_prefetch(id);
                    self.staged.take(id);
                }
                Some(Ok((
                    meta,
                    Some(ChunkOutcome::Bytes { data: f.data, crc32c: f.crc32c, from_cache: false }),
                )))
            }
            // Gone is gone, refused is refused (O3: never retried): no need to ask again with a HEAD.
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::PermissionDenied) => Some(Err(e)),
            Err(_) => None,
        }
    }
}
