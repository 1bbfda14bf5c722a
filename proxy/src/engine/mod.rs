//! The engine of a proxy slot: what one slot knows and does, behind the socket and above the disk.
//! `Engine` routes: each read to its tiers, each request to the side that answers it.
//!
//! A chunk read is either a hit (the chunk file is on disk and its header binds it to the requested
//! identity: the caller gets the open file to pass on) or a miss (one origin fetch per chunk however
//! many readers wait for it; the bytes go to every waiter and then to disk). A chunk that fails a
//! check is dropped, counted, and fetched again: bad bytes are never served.
//!
//! Layout:
//! - this file: the slot's state, its counters and what a read hands to the server;
//! - `metadata/`: the metadata side ([`Metadata`]: `stat` with single-flight HEADs, revalidation
//!   by listing directories, the stale fallback when the origin is down, snapshots kept across
//!   graceful restarts); the engine asks it for versions, it asks the disk what it holds;
//! - `disk_chunks.rs`: the chunks on the slot's disk ([`DiskChunks`]: hits verified, fetched
//!   chunks persisted within the capacity, corrupt ones dropped), with `index.rs` (chunk index:
//!   LRU order, byte accounting, promised room), `chunk_map.rs` (its chunks in recency order,
//!   packed, with their placements), `eviction/` (what to keep: the policy behind a
//!   trait, `lru.rs` and `tinylfu.rs`), `admission.rs` (the frequency sketch admission consults),
//!   `recency.rs` (last reads and the slot's reuse distance, to tell a chunk no longer read),
//!   `open_chunks.rs` (open files of recent hits), `resident.rs` (chunks locked in memory for
//!   local reads) and `local_reads.rs` (the reads shims report of the files they read themselves);
//! - the rest adds its part of `impl Engine`: `chunks.rs` (chunk reads: a hit from the disk, else
//!   a miss filled in one flight), `miss.rs` (the tiers a fill walks in its single flight: a cold
//!   first read's chunk 0, the disk, staging, peers, the origin; and where it lands, disk or
//!   staging), `first_read.rs` (an object's metadata and chunk 0 in one round trip, in one GET
//!   when cold), `rebuild.rs` (the background index rebuild after a start, and the default
//!   capacity), `uploads.rs` (writes through the slot, to the origin or memarts-only objects),
//!   `peers.rs` (the cluster pool: chunks another node owns read from it, and reads served to
//!   peers), `prefetch.rs` (objects clients hint they will read next, fetched ahead by adaptive
//!   fetchers), `status.rs` and `metrics.rs` (the counters as `memarts status` and the metrics
//!   show them); `flight.rs` is single-flight.

mod admission;
#[cfg(test)]
mod admission_tests;
mod awaited;
#[cfg(test)]
mod budget_tests;
mod chunk_map;
mod chunks;
mod disk_chunks;
#[cfg(test)]
mod disk_fault_tests;
#[cfg(test)]
mod epoch_tests;
mod eviction;
mod first_read;
mod flight;
#[cfg(test)]
mod herd_tests;
mod index;
mod local_reads;
pub mod metadata;
mod metrics;
mod miss;
mod open_chunks;
mod peers;
mod prefetch;
mod rebuild;
mod recency;
pub(crate) mod resident;
#[cfg(test)]
mod revalidate_tests;
mod staging;
mod status;
mod uploads;

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use memarts_protocol::{ErrorCode, ObjectMeta, ObjectUrl, WireError};

use crate::budget::MemoryBudget;
use crate::chunk_store::{CachedChunk, ChunkStore};
use crate::memarts_only::{OnlyError, OnlyRead, OnlyStore};
use crate::metrics::LatencyHistogram;
use crate::origin::Origin;
pub use disk_chunks::DiskChunks;
pub use flight::Flights;
pub use index::ChunkIndex;
use metadata::ChunkPresence;
pub use metadata::{MetaCache, Metadata};
pub use open_chunks::OpenChunks;
pub use prefetch::Prefetcher;
pub use uploads::Upload;

/// Chunks up to this size are read by the proxy and sent inline; larger hits pass the descriptor.
pub const INLINE_MAX: u64 = 64 << 10;

/// Chunk files a slot keeps open for fast hits (see [`OpenChunks`]).
pub const MAX_OPEN_CHUNKS: usize = 1024;

/// Who a read is for: a client, or a prefetch making a client's read early (counted for admission
/// as that read, once: `index.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadBy {
    Client,
    Prefetch,
}

/// Bytes fetched from the origin, with their checksum.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub data: Bytes,
    pub crc32c: u32,
}

impl Fetched {
    /// Bytes from the origin, with the checksum every later read of them is checked against.
    pub fn of(data: Bytes) -> Fetched {
        Fetched { crc32c: memarts_protocol::crc32c(&data), data }
    }
}

/// An open file whose `len` bytes at `data_offset` the client reads itself (its descriptor is
/// passed): a large hit, or a large memarts-only object. The header was verified; the client checks
/// the data against `crc32c`.
#[derive(Debug, Clone)]
pub struct PassedFile {
    pub file: Arc<File>,
    pub data_offset: u64,
    pub len: u64,
    pub crc32c: u32,
}

impl From<CachedChunk> for PassedFile {
    fn from(c: CachedChunk) -> PassedFile {
        PassedFile { file: c.file, data_offset: c.data_offset, len: c.len, crc32c: c.crc32c }
    }
}

/// What a chunk read produced.
pub enum ChunkOutcome {
    /// A verified-header file whose data the client reads from the passed descriptor.
    Fd(PassedFile),
    /// Bytes to send inline: a small hit (`from_cache`) or a miss.
    Bytes { data: Bytes, crc32c: u32, from_cache: bool },
}

impl ChunkOutcome {
    /// Whether the chunk came from the cache.
    pub fn is_hit(&self) -> bool {
        match self {
            ChunkOutcome::Fd(_) => true,
            ChunkOutcome::Bytes { from_cache, .. } => *from_cache,
        }
    }
}

/// Counters for `memarts status`.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    pub hits: AtomicU64,
    /// Hits a client read straight from the chunk files and reported (`local_reads.rs`); part of `hits`.
    pub local_hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_from_cache: AtomicU64,
    pub bytes_from_origin: AtomicU64,
    pub corrupt_chunks: AtomicU64,
    pub evicted_chunks: AtomicU64,
    /// Fetched chunks served but not kept: colder than every chunk they would have pushed out.
    pub rejected_chunks: AtomicU64,
    pub store_errors: AtomicU64,
    /// Time to answer a client's chunk read that hit, and one that missed (`server/dispatch.rs`).
    pub read_hit: LatencyHistogram,
    pub read_miss: LatencyHistogram,
}

impl Stats {
    /// Records a client's chunk read answered in `took`.
    pub fn observe_read(&self, hit: bool, took: std::time::Duration) {
        if hit { &self.read_hit } else { &self.read_miss }.observe(took);
    }
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
    /// What the slot keeps when its cache is full (`index.rs`).
    pub eviction: index::Eviction,
}

pub struct Engine {
    info: SlotInfo,
    origin: Arc<Origin>,
    /// The chunks it holds on its disk (`disk_chunks.rs`).
    disk: Arc<DiskChunks>,
    /// What the slot knows of objects' versions (`metadata/`).
    metadata: Arc<Metadata>,
    /// memarts-only objects; `None` in a pass-through engine, which stores nothing.
    only: Option<Arc<OnlyStore>>,
    flights: Arc<Flights<Result<Fetched, WireError>>>,
    /// Cold first reads (metadata and chunk 0 in one GET), one flight per URL and chunk size.
    firsts: Arc<Flights<Result<(ObjectMeta, Fetched), WireError>>>,
    zero_fills: first_read::ZeroFills,
    started: Instant,
    /// Bounds the fills held in memory at once, shared with the slot's connections (R2).
    budget: MemoryBudget,
    /// In a cluster, the part of the budget for replies to peers (`peers.rs`), split off at join.
    peer_replies: std::sync::OnceLock<MemoryBudget>,
    pub stats: Arc<Stats>,
    /// The cluster this slot is part of, set once before it serves (`peers.rs`).
    cluster: Arc<std::sync::OnceLock<Arc<crate::cluster::Cluster>>>,
    /// Objects clients hinted they will read next, fetched in the background (`prefetch.rs`).
    prefetcher: Arc<Prefetcher>,
    /// Prefetched chunks the cache would not keep, waiting for their reads (`staging.rs`).
    staged: staging::Staging,
}

fn bad_request(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::BadRequest, msg)
}

fn parse_url(url: &str) -> Result<ObjectUrl, WireError> {
    ObjectUrl::parse(url).map_err(|e| bad_request(e.to_string()))
}

impl Engine {
    pub fn new(
        info: SlotInfo,
        origin: Origin,
        store: ChunkStore,
        meta: MetaCache,
        only: Option<OnlyStore>,
    ) -> Arc<Engine> {
        let budget = info.memory_budget;
        let stats = Arc::new(Stats::default());
        let index = ChunkIndex::new(info.eviction);
        let disk = Arc::new(DiskChunks::new(store, index, info.passthrough, stats.clone()));
        let origin = Arc::new(origin);
        let cluster = Arc::new(std::sync::OnceLock::new());
        let chunks: Arc<dyn ChunkPresence> = disk.clone();
        let metadata = Metadata::new(info.clone(), origin.clone(), meta, cluster.clone(), chunks);
        Arc::new(Engine {
            info,
            only: only.map(Arc::new),
            origin,
            disk,
            metadata: Arc::new(metadata),
            flights: Arc::default(),
            firsts: Arc::default(),
            zero_fills: Default::default(),
            started: Instant::now(),
            budget: MemoryBudget::new(budget),
            peer_replies: std::sync::OnceLock::new(),
            stats,
            cluster,
            prefetcher: Arc::default(),
            staged: staging::Staging::default(),
        })
    }

    /// The slot's metadata side: versions of objects, listings, snapshots.
    pub fn metadata(&self) -> &Arc<Metadata> {
        &self.metadata
    }

    /// The chunks the slot holds on its disk: the store, the index, resident chunks.
    pub fn disk(&self) -> &Arc<DiskChunks> {
        &self.disk
    }

    /// The slot's memory budget: fills hold their bytes in it, connections their upload payloads.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The store of memarts-only objects, or why there is none.
    pub fn only_store(&self) -> Result<Arc<OnlyStore>, WireError> {
        self.only.clone().ok_or_else(|| {
            WireError::new(
                ErrorCode::NoSpace,
                "memarts is disabled here (origin mode): memarts-only objects cannot be stored",
            )
        })
    }

    /// A memarts-only object as one chunk reply (see [`OnlyStore::read`]). Damage is `Corrupt`,
    /// counted: there is no other copy to fall back on.
    pub async fn read_memarts(&self, url: &str) -> Result<ChunkOutcome, WireError> {
        let parsed = parse_url(url)?;
        let store = self.only_store().map_err(|_| {
            WireError::new(ErrorCode::NotFound, format!("{url}: no memarts-only objects in origin mode"))
        })?;
        match store.read(parsed, INLINE_MAX).await {
            Ok(None) => {
                Err(WireError::new(ErrorCode::NotFound, format!("{url}: no such memarts-only object")))
            }
            Ok(Some(OnlyRead::Inline { data, crc32c })) => {
                Ok(ChunkOutcome::Bytes { data: data.into(), crc32c, from_cache: true })
            }
            Ok(Some(OnlyRead::File(s))) => Ok(ChunkOutcome::Fd(PassedFile {
                file: Arc::new(s.file),
                data_offset: s.data_offset,
                len: s.len,
                crc32c: s.crc32c,
            })),
            Err(OnlyError::Corrupt { url, why }) => {
                self.stats.corrupt_chunks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(WireError::new(ErrorCode::Corrupt, format!("{url}: {why}")))
            }
            Err(e) => Err(WireError::new(ErrorCode::Internal, e.to_string())),
        }
    }

    /// Deletes an object at the origin and forgets its metadata here.
    pub async fn delete(self: &Arc<Self>, url: &str) -> Result<(), WireError> {
        let parsed = parse_url(url)?;
        self.origin.delete(&parsed).await?;
        self.metadata.deleted(&parsed).await;
        Ok(())
    }

    /// Waits (up to `timeout`) until no fill is in flight, so a draining slot finishes writing the
    /// chunks it fetched.
    pub async fn wait_idle(&self, timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while !(self.flights.is_empty() && self.firsts.is_empty()) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
