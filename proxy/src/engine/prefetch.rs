//! Prefetch: objects clients hint they will read next (a sampler's next items, a worker's shard
//! list), fetched in the background by the slot that owns each one's chunk 0, so that the read that
//! follows is a hit.
//!
//! - A prefetch does exactly what a read of the object would: its metadata and chunk 0 (one GET
//!   when cold, `first_read.rs`), then the further chunks this slot owns (up to
//!   `max_object_bytes`), through the same single-flight maps. A read that arrives while the
//!   prefetch runs joins its fetch; a hint for an object already cached costs no origin request
//!   (it only marks the chunks recently used, as the read soon to come would).
//! - Fetched chunks are stored the way a read stores them (same index, same eviction): clients hint
//!   a bounded window ahead of what they consume, so prefetching evicts only what the reads of
//!   that window would have evicted anyway. A prefetch is counted for admission as the read it
//!   makes early, and that read is then not counted again; a chunk the index would not keep (a
//!   full cache of chunks read more often) is fetched into memory instead (`staging.rs`), where
//!   its read takes it, or, with no room there, not prefetched: its read fetches it, once, as it
//!   would have without the hint (counted in `dropped`).
//! - The hint queue is bounded (`queue`: the oldest hints go first, counted); a URL waiting or
//!   being fetched is not queued twice.
//! - How many objects are fetched at once adapts (AIMD, as TCP's window): it starts at `start`
//!   and grows by one per completed fetch while hints wait (up to `max`); an origin that answers
//!   503 SlowDown (or 429) halves it (at most once per [`CUT_INTERVAL`], down to `min`), pauses new
//!   fetches briefly, and from then on it grows by one per `limit` completed fetches only, until the
//!   next cut. With small objects on a link with a long round trip, tens of GETs must be in flight
//!   to fill it; an origin that throttles gets fewer.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use memarts_protocol::{
    chunk_owner, ChunkRequest, FirstRequest, PrefetchRequest, PrefetchStatus, WireError, MAX_CHUNK_SIZE,
    MAX_PREFETCH_URLS, MIN_CHUNK_SIZE,
};
use tokio::sync::Notify;

use super::first_read::first_flight;
use super::{bad_request, parse_url, Engine, ReadBy};
use crate::chunk_store::format::on_disk_len;
use crate::chunk_store::ChunkKey;
use crate::config::PrefetchConfig;

/// The limit is cut at most once per this interval: one burst of 503s seen by many fetches at once
/// is one signal, not one per fetch.
pub const CUT_INTERVAL: Duration = Duration::from_millis(100);

/// After a cut, no new fetch starts for this long.
const PAUSE: Duration = Duration::from_millis(50);

/// A hint: the URL (as the slot spells it) and the chunk size its reads use.
type Hint = (String, u64);

struct Queue {
    cfg: PrefetchConfig,
    waiting: VecDeque<Hint>,
    /// Waiting or being fetched.
    known: HashSet<Hint>,
    inflight: u32,
    peak: u32,
    limit: u32,
    limit_low: u32,
    /// Below it the limit grows by one per completed fetch, above it by one per `limit` of them:
    /// `max` until the origin first throttles, then half the limit of the last cut.
    threshold: u32,
    /// Completed fetches since the limit last grew above `threshold`.
    credit: u32,
    last_cut: Option<Instant>,
    paused_until: Option<Instant>,
}

#[derive(Default)]
struct Counters {
    hinted: AtomicU64,
    objects: AtomicU64,
    chunks: AtomicU64,
    skipped_cached: AtomicU64,
    dropped: AtomicU64,
    throttled: AtomicU64,
    failed: AtomicU64,
}

/// A slot's prefetch queue and its adaptive fetchers.
pub struct Prefetcher {
    queue: Mutex<Queue>,
    wake: Notify,
    driving: AtomicBool,
    counters: Counters,
}

impl Default for Prefetcher {
    fn default() -> Self {
        Prefetcher::new(PrefetchConfig::default())
    }
}

/// What one prefetch did.
enum Done {
    /// Everything was cached already.
    Cached,
    /// `n` chunks were fetched (or joined) for it.
    Fetched(u64),
    /// Nothing was fetched: the index would not keep its chunk 0.
    NotKept,
}

impl Prefetcher {
    pub fn new(cfg: PrefetchConfig) -> Prefetcher {
        let start = cfg.start;
        Prefetcher {
            queue: Mutex::new(Queue {
                cfg,
                waiting: VecDeque::new(),
                known: HashSet::new(),
                inflight: 0,
                peak: 0,
                limit: start,
                limit_low: start,
                threshold: u32::MAX,
                credit: 0,
                last_cut: None,
                paused_until: None,
            }),
            wake: Notify::new(),
            driving: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn status(&self) -> PrefetchStatus {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let q = self.queue();
        PrefetchStatus {
            hinted: load(&c.hinted),
            queued: q.waiting.len() as u64,
            inflight: q.inflight.into(),
            peak_inflight: q.peak.into(),
            limit: q.limit.into(),
            limit_low: q.limit_low.into(),
            limit_max: q.cfg.max.into(),
            objects: load(&c.objects),
            chunks: load(&c.chunks),
            skipped_cached: load(&c.skipped_cached),
            dropped: load(&c.dropped),
            throttled: load(&c.throttled),
            failed: load(&c.failed),
        }
    }

    /// Queues `hints` (newest last; past the bound the oldest go). Returns how many were queued.
    fn push(&self, hints: Vec<Hint>) -> u32 {
        let mut queued = 0;
        let mut dropped = 0;
        {
            let mut q = self.queue();
            for hint in hints {
                if q.known.contains(&hint) {
                    dropped += 1;
                    continue;
                }
                q.known.insert(hint.clone());
                q.waiting.push_back(hint);
                queued += 1;
                if q.waiting.len() > q.cfg.queue {
                    if let Some(old) = q.waiting.pop_front() {
                        q.known.remove(&old);
                        dropped += 1;
                    }
                }
            }
        }
        self.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
        self.wake.notify_one();
        queued
    }

    /// The next hint to fetch, if the limit allows one more now; else how long to wait (`None`:
    /// until a fetch ends or a hint arrives).
    fn next(&self) -> Result<Hint, Option<Duration>> {
        let mut q = self.queue();
        if let Some(until) = q.paused_until {
            let now = Instant::now();
            if until > now {
                return Err(Some(until - now));
            }
            q.paused_until = None;
        }
        if q.inflight >= q.limit {
            return Err(None);
        }
        let hint = q.waiting.pop_front().ok_or(None)?;
        q.inflight += 1;
        q.peak = q.peak.max(q.inflight);
        Ok(hint)
    }

    /// A fetch ended; `throttled`: the origin asked us to slow down while it ran.
    fn finished(&self, hint: &Hint, throttled: bool) {
        let mut q = self.queue();
        q.inflight -= 1;
        q.known.remove(hint);
        let now = Instant::now();
        if throttled {
            if q.last_cut.is_none_or(|t| now.duration_since(t) >= CUT_INTERVAL) {
                q.limit = (q.limit / 2).max(q.cfg.min);
                q.threshold = q.limit;
                q.credit = 0;
                q.limit_low = q.limit_low.min(q.limit);
                q.last_cut = Some(now);
                q.paused_until = Some(now + PAUSE);
                self.counters.throttled.fetch_add(1, Ordering::Relaxed);
            }
        } else if !q.waiting.is_empty() && q.limit < q.cfg.max {
            if q.limit < q.threshold {
                q.limit += 1;
            } else {
                q.credit += 1;
                if q.credit >= q.limit {
                    q.limit += 1;
                    q.credit = 0;
                }
            }
        }
        drop(q);
        self.wake.notify_one();
    }
}

/// Starts fetches while the limit allows, until the engine is gone.
async fn drive(prefetcher: Arc<Prefetcher>, engine: Weak<Engine>) {
    loop {
        let woken = prefetcher.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let wait = loop {
            match prefetcher.next() {
                Ok(hint) => {
                    let Some(engine) = engine.upgrade() else { return };
                    let p = prefetcher.clone();
                    tokio::spawn(async move {
                        let throttled = || engine.origin.stats.throttled.load(Ordering::Relaxed);
                        let before = throttled();
                        let done = engine.prefetch_one(&hint.0, hint.1).await;
                        let c = &p.counters;
                        match done {
                            Ok(Done::Cached) => c.skipped_cached.fetch_add(1, Ordering::Relaxed),
                            Ok(Done::NotKept) => c.dropped.fetch_add(1, Ordering::Relaxed),
                            Ok(Done::Fetched(n)) => {
                                c.chunks.fetch_add(n, Ordering::Relaxed);
                                c.objects.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(e) => {
                                tracing::debug!("prefetch of {} failed: {e}", hint.0);
                                c.failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                        p.finished(&hint, throttled() > before);
                    });
                }
                Err(wait) => break wait,
            }
        };
        if engine.strong_count() == 0 {
            return;
        }
        match wait {
            Some(pause) => tokio::time::sleep(pause).await,
            None => woken.await,
        }
    }
}

/// Room the index promised to a prefetch's chunk, released when the fetch is over.
struct PromisedRoom<'a> {
    engine: &'a Engine,
    /// What the room is promised to (`ChunkIndex::promise`).
    key: u128,
}

impl Drop for PromisedRoom<'_> {
    fn drop(&mut self) {
        self.engine.disk.index().release(self.key);
    }
}

impl Engine {
    /// Sets the prefetcher's bounds (before the slot serves).
    pub fn configure_prefetch(&self, cfg: PrefetchConfig) {
        self.staged.set_capacity(cfg.staging_bytes);
        let mut q = self.prefetcher.queue();
        q.limit = cfg.start;
        q.limit_low = cfg.start;
        q.cfg = cfg;
    }

    pub fn prefetch_status(&self) -> PrefetchStatus {
        self.prefetcher.status()
    }

    /// Queues the hinted objects that are not cached yet; returns how many were queued. A slot that
    /// caches nothing (pass-through) drops every hint.
    pub fn prefetch(self: &Arc<Self>, req: &PrefetchRequest) -> Result<u32, WireError> {
        if req.urls.len() > MAX_PREFETCH_URLS {
            return Err(bad_request(format!(
                "a prefetch of {} URLs exceeds {MAX_PREFETCH_URLS}",
                req.urls.len()
            )));
        }
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&req.chunk_size) {
            return Err(bad_request(format!(
                "chunk size {} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}",
                req.chunk_size
            )));
        }
        let urls = req.urls.iter().map(|u| parse_url(u)).collect::<Result<Vec<_>, _>>()?;
        let c = &self.prefetcher.counters;
        c.hinted.fetch_add(urls.len() as u64, Ordering::Relaxed);
        if self.info.passthrough {
            c.dropped.fetch_add(urls.len() as u64, Ordering::Relaxed);
            return Ok(0);
        }
        let mut hints = Vec::with_capacity(urls.len());
        for url in urls {
            let url = url.to_string();
            if self.first_chunk_cached(&url, req.chunk_size) {
                c.skipped_cached.fetch_add(1, Ordering::Relaxed);
            } else {
                hints.push((url, req.chunk_size));
            }
        }
        let queued = self.prefetcher.push(hints);
        if !self.prefetcher.driving.swap(true, Ordering::AcqRel) {
            tokio::spawn(drive(self.prefetcher.clone(), Arc::downgrade(self)));
        }
        Ok(queued)
    }

    /// Whether the current version of `url` is known and its chunk 0 indexed (then awaited, as
    /// `ChunkIndex::hint` says: its read is near). No origin request.
    fn first_chunk_cached(&self, url: &str, chunk_size: u64) -> bool {
        let Some(meta) = self.metadata.cache().get(url) else { return false };
        if meta.size == 0 {
            return true;
        }
        let (Some(etag), Ok(parsed)) = (meta.etag.as_deref(), parse_url(url)) else { return false };
        let id = ChunkKey::new(&parsed, etag, chunk_size, 0).id().0;
        self.disk.index().hint(id)
    }

    /// Room promised for chunk 0 of `url` if the index would keep it were it fetched now: of the
    /// version whose metadata is known, else of a version never read (kept only if it fits).
    fn promise_first_chunk(&self, url: &str, chunk_size: u64) -> Option<PromisedRoom<'_>> {
        let Ok(parsed) = parse_url(url) else { return self.promise_room(0, None, 0) }; // the read says why
        let known = self.metadata.cache().get(url);
        let etag = known.as_ref().and_then(|m| m.etag.as_deref());
        let key = ChunkKey::new(&parsed, etag.unwrap_or_default(), chunk_size, 0);
        let len = known.as_ref().map_or(chunk_size, |m| m.size.min(chunk_size));
        let id = etag.map(|_| key.id().0);
        // A cold chunk 0 comes with the metadata in the object's first read: promised to that.
        let promised_to = id.unwrap_or_else(|| first_flight(&parsed, chunk_size));
        self.promise_room(promised_to, id, on_disk_len(&key, len))
    }

    /// Room for a chunk a prefetch is about to fetch (`ChunkIndex::promise`), promised to `key`
    /// until its admission or until dropped.
    fn promise_room(&self, key: u128, id: Option<u128>, bytes: u64) -> Option<PromisedRoom<'_>> {
        // Not `then_some`: a room made and dropped under the index's lock would take it again.
        let promised = self.disk.index().promise(key, id, bytes);
        promised.then(|| PromisedRoom { engine: self, key })
    }

    /// Reads `url` the way a client's read would (chunk 0 with the metadata, then the chunks this
    /// slot owns, up to `max_object_bytes`), keeping nothing but the cache's copy.
    async fn prefetch_one(self: &Arc<Self>, url: &str, chunk_size: u64) -> Result<Done, WireError> {
        if self.first_chunk_cached(url, chunk_size) {
            return Ok(Done::Cached);
        }
        let (meta, mut fetched) = match self.promise_first_chunk(url, chunk_size) {
            Some(_room) => {
                let first = FirstRequest { url: url.to_string(), chunk_size, refresh: false };
                let (meta, outcome) = self.read_first_routed(&first, true, ReadBy::Prefetch).await?;
                (meta, u64::from(outcome.as_ref().is_some_and(|o| !o.is_hit())))
            }
            // Not to be kept: held in memory for its read instead, if there is room.
            None => match self.stage_first(url, chunk_size).await? {
                Some(meta) => (meta, 1),
                None => return Ok(Done::NotKept),
            },
        };
        let (Some(etag), Ok(parsed)) = (meta.etag.clone(), parse_url(url)) else {
            return Ok(if fetched > 0 { Done::Fetched(fetched) } else { Done::Cached });
        };
        let max_bytes = self.prefetcher.queue().cfg.max_object_bytes;
        let chunks = meta.size.min(max_bytes.max(chunk_size)).div_ceil(chunk_size);
        for index in 1..chunks {
            if chunk_owner(&parsed, chunk_size, index, self.info.slots) != self.info.slot {
                continue;
            }
            let key = ChunkKey::new(&parsed, &etag, chunk_size, index);
            let id = key.id().0;
            if self.disk.index().hint(id) {
                continue;
            }
            let len = (meta.size - index * chunk_size).min(chunk_size);
            let Some(_room) = self.promise_room(id, Some(id), on_disk_len(&key, len)) else {
                let range = index * chunk_size..index * chunk_size + len;
                fetched += u64::from(self.stage_chunk(&parsed, key.clone(), range).await?);
                continue;
            };
            let req = ChunkRequest {
                url: url.to_string(),
                etag: etag.clone(),
                object_size: meta.size,
                chunk_size,
                index,
                recheck: false,
            };
            let outcome = self.read_chunk_routed(&req, true, ReadBy::Prefetch).await?;
            fetched += u64::from(!outcome.is_hit());
        }
        Ok(if fetched > 0 { Done::Fetched(fetched) } else { Done::Cached })
    }
}

#[cfg(test)]
#[path = "prefetch_tests.rs"]
mod tests;
