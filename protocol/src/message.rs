//! Requests, responses and the handshake.
//!
//! Every enum here is append-only: postcard encodes a variant by its index, so a new variant goes at
//! the end, and a changed field set means a new variant (or a new protocol version), never an edit.

use serde::{Deserialize, Serialize};

use crate::error::WireError;
pub use crate::listed::*;

/// The first frame of every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    /// Free-form client description for logs, e.g. `memarts-shim/0.1.0 pid=123`.
    pub client: String,
}

/// The proxy's answer to a compatible `Hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    /// This proxy's slot number, `0..slots`.
    pub slot: u32,
    /// How many slots the fleet has; chunk ownership is computed over `0..slots`.
    pub slots: u32,
    /// Server build, e.g. `memarts-proxy/0.1.0`.
    pub server: String,
}

/// Metadata of one object version at the origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub size: u64,
    /// The origin's ETag (or the local file system's equivalent); reads pin it with `If-Match`.
    pub etag: Option<String>,
    pub version: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub last_modified_ms: i64,
}

/// One chunk of one object version. The identity of the cached chunk is (origin, url, etag,
/// chunk_size, index); `object_size` lets the proxy check that the origin returned exactly the bytes
/// the chunk must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRequest {
    pub url: String,
    pub etag: String,
    pub object_size: u64,
    pub chunk_size: u64,
    pub index: u64,
    /// Set when the client's checksum of a descriptor-served chunk failed: the proxy drops its copy
    /// (counting it as corrupt) and fetches the chunk again.
    pub recheck: bool,
}

impl ChunkRequest {
    /// Byte range of this chunk within the object, or `None` if `index` lies past the end.
    pub fn range(&self) -> Option<std::ops::Range<u64>> {
        let start = self.index.checked_mul(self.chunk_size)?;
        if start >= self.object_size {
            return None;
        }
        // Saturating: `chunk_size` comes off the wire unchecked, and the proxy computes ranges
        // (to size a batch) before it validates chunk sizes.
        Some(start..start.saturating_add(self.chunk_size).min(self.object_size))
    }
}

/// A listing request; pages continue after `start_after` (exclusive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {
    pub url: String,
    /// `false`: one level, with common prefixes reported as directories; `true`: every object below.
    pub recursive: bool,
    pub start_after: Option<String>,
    pub max_entries: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEntry {
    /// Full URL of the entry, in the scheme of the request (`s3://b/k`, `/local/path`, ...).
    pub url: String,
    pub is_dir: bool,
    pub size: u64,
    pub etag: Option<String>,
    pub last_modified_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListPage {
    pub entries: Vec<ListEntry>,
    /// Pass as `start_after` to get the next page; `None` on the last page.
    pub next: Option<String>,
}

/// Counters and state of one proxy slot, as `memarts status` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotStatus {
    pub slot: u32,
    pub slots: u32,
    pub pid: u32,
    pub uptime_ms: u64,
    pub connections: u64,
    pub requests: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes_from_cache: u64,
    pub bytes_from_origin: u64,
    pub origin_requests: u64,
    pub origin_retries: u64,
    pub corrupt_chunks: u64,
    pub evicted_chunks: u64,
    pub cached_chunks: u64,
    pub cache_bytes_used: u64,
    pub cache_capacity: u64,
    pub index_ready: bool,
    pub io_engine: String,
    pub cache_dir: String,
}

/// What the slot's eviction policy did: the answer to `Request::AdmissionStatus`.
///
/// Not fields of [`SlotStatus`]: postcard has no optional fields (a message is its fields in
/// order, and a frame with bytes left after it, or too few, does not decode), so a field added to
/// `SlotStatus` would break `memarts status` both ways across builds during a rolling upgrade.
/// Here, a client of this build asks for it on a connection of its own; a proxy of an older build
/// answers `BadRequest` (an unknown variant) and closes it, and the client shows the counters as
/// unknown; a client of an older build never asks. Counters the policy gains later go
/// in a new variant the same way, never into this struct.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionStatus {
    /// The policy's name, as `--eviction` takes it (`tinylfu`, `lru`).
    pub eviction: String,
    /// Fetched chunks served but not kept: colder than every cached chunk they would have pushed
    /// out.
    pub rejected_chunks: u64,
}

/// Where a chunk reply's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkBody {
    /// The bytes follow as the frame's payload (misses, small chunks).
    Inline,
    /// The bytes are `len` bytes at `offset` in the file whose descriptor arrived with this frame.
    Fd { offset: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkReply {
    pub len: u64,
    /// CRC32C of the chunk's bytes: the client checks descriptor-served bytes against it.
    pub crc32c: u32,
    pub body: ChunkBody,
    /// Whether the chunk came from the cache (a hit) or the origin (a miss).
    pub from_cache: bool,
}

/// Metadata and the first chunk of an object in one round trip. Sent to the owner of chunk 0 (see
/// [`crate::chunk_owner`]), which resolves the current version from its metadata cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstRequest {
    pub url: String,
    pub chunk_size: u64,
    /// Bypass the metadata cache and revalidate with the origin.
    pub refresh: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Must be the first frame. Variant 0 forever, so any version can decode it.
    Hello(Hello),
    Stat {
        url: String,
        refresh: bool,
    },
    ReadChunk(ChunkRequest),
    List(ListRequest),
    Status,
    ReadFirst(FirstRequest),
    /// Several chunks owned by the same slot in one round trip (at most [`MAX_BATCH`], and at most
    /// `Limits::RESPONSE.max_payload` bytes of chunk data in all).
    ReadChunks(Vec<ChunkRequest>),
    /// Starts writing a new version of an object at the origin; followed by `PutData` frames and one
    /// `PutFinish` (or another `PutStart`, which abandons this one) on the same connection.
    PutStart {
        url: String,
    },
    /// The next bytes of the upload, as this frame's payload.
    PutData,
    /// Completes the upload; `size` and `crc32c` cover every byte sent, and must match.
    PutFinish {
        size: u64,
        crc32c: u32,
    },
    /// Deletes an object at the origin (its cached chunks become unreachable: their ETag is gone).
    Delete {
        url: String,
    },
    /// Like `PutStart`, for a memarts-only object (`write_memarts`): the cache holds the only copy,
    /// and `Put` is answered only once it is durable.
    PutMemartsStart {
        url: String,
    },
    /// A memarts-only object: answered with `Chunk` (its whole data as one body) or `NotFound`.
    ReadMemarts {
        url: String,
    },
    /// The slot's part of the cluster pool: answered with `ClusterStatus` (empty outside a cluster).
    ClusterStatus,
    /// Hints: objects the client will read soon (a sampler's next items), sent to the slot that owns
    /// each one's chunk 0. Answered at once with `Prefetched`; the slot fetches them in the
    /// background, as a read of them would. An older proxy answers `BadRequest` (it cannot decode
    /// the variant) and closes the connection: clients then stop sending hints to it.
    Prefetch(PrefetchRequest),
    /// The slot's prefetch counters: answered with `PrefetchStatus`. A request of its own rather
    /// than fields of `SlotStatus`, which an older shim could not decode with more fields.
    PrefetchStatus,
    /// What the slot's eviction policy did: answered with `AdmissionStatus`. (Proxies before it
    /// answer `BadRequest` and close the connection: ask it on its own, or last.)
    AdmissionStatus,
    /// Every metric of the slot: answered with `Metrics` (for the node's Prometheus endpoint, which
    /// one slot serves for all). Proxies before it answer `BadRequest` and close the connection.
    Metrics,
    /// Chunks of this slot that a client read straight from their files (local hits, found through
    /// the slot's metadata table), at most [`MAX_TOUCHES`], batched: the slot counts them as the
    /// hits they were, for its counters and for its eviction (recency and frequency), as if it had
    /// served them. Answered with `Touched`.
    Touched(Vec<Touch>),
    /// Objects to bring into the cache as a first read of each would (metadata and chunk 0: one
    /// GET when cold; counted as reads), without sending their bytes back: `memarts warmup`. Sent
    /// to the slot that owns each one's chunk 0; answered with `Filled` once all are done. An
    /// older proxy answers `BadRequest` (it cannot decode the variant) and closes the connection:
    /// the client then reads them instead.
    Fill(FillRequest),
    /// From another slot of the fleet (the fleet's own uid only): the version of an object as the
    /// listing of its directory shows it, asked of the slot that owns the directory
    /// (`meta_owner_slot` of the directory's URL), which lists it once for every slot. Answered
    /// with `Revalidated`. An older proxy answers `BadRequest` and closes the connection: the
    /// asking slot then asks the origin itself.
    Revalidate(RevalidateRequest),
    /// From another slot of the fleet (the fleet's own uid only), which just wrote or deleted `url`
    /// at the origin: the slot that owns its directory forgets what listings showed of it, so that
    /// no slot takes an older version from them. Answered with `Forgotten` once done.
    Forget {
        url: String,
    },
    /// From another slot of the fleet (the fleet's own uid only), which a client's listing just
    /// answered: what its page showed of directories this slot owns, so that their objects'
    /// versions are known without a listing of their own (at most [`MAX_LISTED`] entries in all).
    /// Answered with `Recorded`.
    Listed(Vec<ListedRange>),
    /// From the slot that owns a directory (the fleet's own uid only), which listed it again before
    /// the versions it gave expired: those versions, confirmed again, for the objects whose
    /// metadata this slot holds (at most [`MAX_REVALIDATED`]). Answered with `Recorded`.
    Confirm(Vec<(String, ConfirmedMeta)>),
}

/// Most URLs one `Fill` may carry.
pub const MAX_FILL_URLS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FillRequest {
    /// At most [`MAX_FILL_URLS`], each a URL a read would name.
    pub urls: Vec<String>,
    /// The chunk size the client reads with (part of every chunk's identity).
    pub chunk_size: u64,
}

/// Most chunks one `Touched` may carry.
pub const MAX_TOUCHES: usize = 4096;

/// One chunk read directly from its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Touch {
    /// The chunk's id ([`crate::chunk_id`]).
    pub id: u128,
    /// Bytes of data read.
    pub len: u64,
}

/// Most URLs one `Prefetch` may carry.
pub const MAX_PREFETCH_URLS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchRequest {
    /// At most [`MAX_PREFETCH_URLS`], each a URL a read would name.
    pub urls: Vec<String>,
    /// The chunk size the client reads with (part of every chunk's identity).
    pub chunk_size: u64,
}

/// What a slot's prefetcher has done since it started, and its state now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchStatus {
    /// URLs received in hints.
    pub hinted: u64,
    /// Hints waiting for a fetcher now.
    pub queued: u64,
    /// Objects being fetched now.
    pub inflight: u64,
    /// Most objects fetched at once so far.
    pub peak_inflight: u64,
    /// How many may be fetched at once now (adaptive: halved when the origin throttles, grown
    /// while hints wait), its lowest value so far, and its configured bounds.
    pub limit: u64,
    pub limit_low: u64,
    pub limit_max: u64,
    /// Objects whose chunks a prefetch fetched (or joined a fetch of), and those chunks.
    pub objects: u64,
    pub chunks: u64,
    /// Hints for objects already cached: no origin request.
    pub skipped_cached: u64,
    /// Hints dropped: the queue was full (the oldest go), a duplicate of one waiting or running,
    /// a slot that caches nothing, or an object whose chunk 0 a full cache would not keep (its
    /// read fetches it once, rather than the prefetch and then the read).
    pub dropped: u64,
    /// Times the limit was cut because the origin answered 503 SlowDown (or 429).
    pub throttled: u64,
    /// Prefetches that failed (the object is missing, the origin is down...): a later read of it
    /// fails or succeeds on its own.
    pub failed: u64,
}

/// Most chunks one `ReadChunks` may ask for (each may bring a descriptor; Linux passes at most 253
/// in one message).
pub const MAX_BATCH: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Welcome(Welcome),
    /// The client's protocol version is not spoken here; the connection is closed after this frame.
    Incompatible {
        supported: u32,
        message: String,
    },
    Stat(ObjectMeta),
    Chunk(ChunkReply),
    List(ListPage),
    Status(SlotStatus),
    Error(WireError),
    /// Answer to `ReadFirst`: the object's metadata and, unless it is empty, its chunk 0 (body as in
    /// `Chunk`: inline payload or a passed descriptor).
    First {
        meta: ObjectMeta,
        chunk: Option<ChunkReply>,
    },
    /// Answer to `ReadChunks`, one result per requested chunk, in order. Descriptors of `Fd` bodies
    /// arrive together with the frame, in the same order; `Inline` bodies follow as the payload,
    /// concatenated in the same order.
    Chunks(Vec<Result<ChunkReply, WireError>>),
    /// `PutStart` / `PutData` accepted; `received` bytes so far.
    PutAck {
        received: u64,
    },
    /// The upload completed: the new version's metadata.
    Put(ObjectMeta),
    /// The object was deleted (or did not exist).
    Deleted,
    ClusterStatus(crate::peer::ClusterStatus),
    /// Answer to `Prefetch`: how many of its URLs were queued (the others were cached, duplicates or
    /// dropped).
    Prefetched {
        queued: u32,
    },
    PrefetchStatus(PrefetchStatus),
    AdmissionStatus(AdmissionStatus),
    Metrics(crate::metrics::MetricsSnapshot),
    /// How many of a `Touched`'s chunks the slot still held (the others were evicted meanwhile).
    Touched {
        counted: u32,
    },
    /// Answer to `Fill`: each object's metadata (its chunk 0 is cached, unless the cache would not
    /// keep it), or why it could not be read, in request order.
    Filled(Vec<Result<ObjectMeta, WireError>>),
    /// Answer to `Revalidate`.
    Revalidated(Revalidated),
    /// Answer to `Forget`.
    Forgotten,
    /// Answer to `Listed`.
    Recorded,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_range_covers_the_tail_and_rejects_past_end() {
        let mut req = ChunkRequest {
            url: "s3://b/k".into(),
            etag: "e".into(),
            object_size: 10,
            chunk_size: 4,
            index: 2,
            recheck: false,
        };
        assert_eq!(req.range(), Some(8..10));
        req.index = 3;
        assert_eq!(req.range(), None);
        req.index = u64::MAX;
        assert_eq!(req.range(), None);
    }

    /// A chunk that starts inside the object but whose nominal end is past `u64::MAX` overflowed
    /// (a panic with overflow checks; a range ending before it starts without them).
    #[test]
    fn chunk_range_near_u64_max_does_not_overflow() {
        let req = ChunkRequest {
            url: "s3://b/k".into(),
            etag: "e".into(),
            object_size: u64::MAX,
            chunk_size: u64::MAX - 1,
            index: 1,
            recheck: false,
        };
        assert_eq!(req.range(), Some(u64::MAX - 1..u64::MAX));
    }
}
