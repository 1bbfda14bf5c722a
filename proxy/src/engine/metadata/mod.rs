//! The metadata side of a slot: what it knows of objects' versions, and how it keeps that fresh.
//! `stat` answers from the metadata cache while fresh, else with one HEAD however many readers
//! ask at once, or, past the TTL, from the listing of the object's directory (one request per
//! 1,000 objects); the last verified version when the origin cannot be reached.
//!
//! Layout (each file adds its part of `impl Metadata`):
//! - this file: the state, `stat`, and what a write or a delete through the slot changes;
//! - `meta_cache.rs`: the metadata cache (TTL, the stale fallback, what local reads are published);
//!   its entries in `url_lru.rs` (a compact LRU map of URLs), their metadata as `compact_meta.rs`
//!   packs it, their verification times as `verified_clock.rs` counts them, their URLs' names in
//!   a `byte_arena.rs`;
//! - `revalidate.rs`: expired metadata revalidated by listing the object's directory, by the slot
//!   (or in a cluster the node) that owns it, for every slot that asks;
//! - `dir_versions.rs`: the versions the listings of the directories a slot owns showed (packed
//!   too, keys in a `byte_arena.rs` per directory);
//! - `list_policy.rs`: whether a directory is worth listing (a bucket that refuses, a directory
//!   of which this slot holds little);
//! - `refresh.rs`: listings kept fresh ahead of their TTL for the slots reading them;
//! - `listings.rs`: what a client's listing shows, kept by the directories' owners;
//! - `snapshots.rs`: the metadata saved when a slot stops cleanly, loaded by the next process.
//!
//! It asks the disk of its slot one thing ([`ChunkPresence`]: whether the index is rebuilt
//! and which chunks it holds, to tell a listing worth its cost); it reaches the slot's siblings
//! and, in a cluster, the node that owns a directory, itself.

mod byte_arena;
mod compact_meta;
mod dir_versions;
mod list_policy;
mod listings;
mod meta_cache;
mod meta_publisher;
mod refresh;
mod revalidate;
mod snapshots;
mod url_lru;
mod verified_clock;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use memarts_protocol::{ErrorCode, ObjectMeta, ObjectUrl, WireError};

/// Public for `tests/metadata_memory.rs`, which measures its memory per entry.
pub use dir_versions::DirVersions;
pub use meta_cache::MetaCache;

use super::flight::Flights;
use super::{parse_url, SlotInfo};
use crate::cluster::Cluster;
use crate::origin::Origin;
use crate::siblings::Siblings;

/// What the metadata side asks of the chunks on its slot's disk ([`super::DiskChunks`]).
pub trait ChunkPresence: Send + Sync {
    /// Whether the chunk index was rebuilt since the slot started (before, it cannot tell).
    fn index_ready(&self) -> bool;
    /// Whether some version of the chunk with this placement is held.
    fn has_placement(&self, placement: u64) -> bool;
}

/// The metadata side's counters, for `memarts status` and the metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Reads that went on with an expired version because the origin could not be reached.
    pub stale_meta_served: AtomicU64,
    /// Pages of directory listings asked for to revalidate expired metadata (`revalidate.rs`), and
    /// expired metadata revalidated by a listing (this slot's or its directory owner's) rather than
    /// a HEAD.
    pub listed_pages: AtomicU64,
    pub refreshed_listings: AtomicU64,
    pub listed_revalidations: AtomicU64,
}

/// Object metadata in one slot (see the module docs).
pub struct Metadata {
    info: SlotInfo,
    origin: Arc<Origin>,
    cache: MetaCache,
    /// HEADs in flight, one per URL.
    heads: Arc<Flights<Result<ObjectMeta, WireError>>>,
    /// Versions of the objects of the directories this slot owns, as listings showed them, and
    /// the listings in flight, one per directory (`revalidate.rs`).
    dir_versions: dir_versions::DirVersions,
    list_policy: list_policy::ListPolicy,
    dir_flights: Arc<Flights<Result<(), WireError>>>,
    /// The other slots of the fleet, asked for what they own (set once the slot knows its run dir).
    siblings: OnceLock<Arc<Siblings>>,
    /// The cluster the slot is part of: the slot's own cell, set once by `Engine::join_cluster`.
    cluster: Arc<OnceLock<Arc<Cluster>>>,
    /// The chunks on the slot's disk, asked what they hold.
    chunks: Arc<dyn ChunkPresence>,
    pub counters: Counters,
    /// Whether the last fleet's snapshots were taken in (`snapshots.rs`).
    restored: AtomicBool,
}

impl Metadata {
    pub fn new(
        info: SlotInfo,
        origin: Arc<Origin>,
        cache: MetaCache,
        cluster: Arc<OnceLock<Arc<Cluster>>>,
        chunks: Arc<dyn ChunkPresence>,
    ) -> Metadata {
        let ttl = cache.ttl();
        Metadata {
            info,
            origin,
            cache,
            heads: Arc::default(),
            dir_versions: dir_versions::DirVersions::new(ttl),
            list_policy: list_policy::ListPolicy::new(ttl),
            dir_flights: Arc::default(),
            siblings: OnceLock::new(),
            cluster,
            chunks,
            counters: Counters::default(),
            restored: AtomicBool::new(false),
        }
    }

    /// The metadata cache.
    pub fn cache(&self) -> &MetaCache {
        &self.cache
    }

    /// Lets this slot ask the other slots of its fleet for what they own; once, before it serves.
    pub fn know_siblings(&self, siblings: Arc<Siblings>) {
        let _ = self.siblings.set(siblings);
    }

    fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// Whether the chunk index is rebuilt (false while the chunk side is not known).
    fn index_ready(&self) -> bool {
        self.chunks.index_ready()
    }

    /// Whether a HEAD of `url` is in flight.
    pub(crate) fn asking_about(&self, url: &ObjectUrl) -> bool {
        self.heads.running(xxhash_rust::xxh3::xxh3_128(url.to_string().as_bytes()))
    }

    /// Metadata of `url`, from the metadata cache while fresh, else from the origin.
    /// Concurrent misses of one URL share one HEAD request (single-flight, as chunk fills do).
    pub async fn stat(self: &Arc<Self>, url: &str, refresh: bool) -> Result<ObjectMeta, WireError> {
        self.stat_for(url, refresh, None).await
    }

    /// [`Metadata::stat`] for a read with chunks of `chunk_size` (which slot reads what next, for a
    /// revalidation's answer: `revalidate.rs`).
    pub(crate) async fn stat_for(
        self: &Arc<Self>,
        url: &str,
        refresh: bool,
        chunk_size: Option<u64>,
    ) -> Result<ObjectMeta, WireError> {
        let parsed = parse_url(url)?;
        let key = parsed.to_string();
        if !refresh {
            if let Some(meta) = self.cache.get(&key) {
                return Ok(meta);
            }
        }
        let flight = xxhash_rust::xxh3::xxh3_128(key.as_bytes());
        let stale_key = key.clone();
        let this = self.clone();
        let meta = self
            .heads
            .join_fallible(flight, "the metadata request", move |leader| async move {
                // The listing of its directory, which one request keeps fresh for up to 1,000
                // objects, unless a refresh asks the origin about this one.
                if !refresh {
                    if let Some((meta, ago)) = this.revalidate_by_listing(&parsed, chunk_size).await {
                        this.counters.listed_revalidations.fetch_add(1, Ordering::Relaxed);
                        this.cache.put_confirmed(key, meta.clone(), ago);
                        leader.publish(Ok(meta));
                        return;
                    }
                }
                let meta = this.origin.head(&parsed).await.map_err(WireError::from);
                match &meta {
                    Ok(m) => this.cache.put(key, m.clone()),
                    // Gone at the origin: stop vouching for a version that no longer exists.
                    Err(e) if e.code == ErrorCode::NotFound => this.cache.invalidate(&key),
                    Err(_) => {}
                }
                leader.publish(meta);
            })
            .await;
        match meta {
            // The origin cannot be reached to verify the version: keep serving the last verified
            // one (its cached chunks are whole and checked; its misses will fail on their own).
            // Not for refusals (403) or absence (404), which the origin did answer.
            Err(e) if e.code == ErrorCode::OriginError => match self.cache.get_stale(&stale_key) {
                Some(stale) => {
                    self.counters.stale_meta_served.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(url, error = %e.message, "origin unreachable: serving the last verified version");
                    Ok(stale)
                }
                None => Err(e),
            },
            other => other,
        }
    }

    /// Records the metadata of a version this slot just wrote, so reads through it see the new
    /// version at once (other slots revalidate when their metadata TTL ends, or on `refresh`).
    pub async fn note_written(self: &Arc<Self>, url: &ObjectUrl, meta: &ObjectMeta) {
        self.forget_listed(url).await;
        if meta.etag.is_some() {
            self.cache.put(url.to_string(), meta.clone());
        } else {
            self.cache.invalidate(&url.to_string());
        }
    }

    /// An object deleted at the origin through this slot: what listings showed of it, and its
    /// metadata here, are forgotten.
    pub(crate) async fn deleted(self: &Arc<Self>, url: &ObjectUrl) {
        self.forget_listed(url).await;
        self.cache.invalidate(&url.to_string());
    }
}
