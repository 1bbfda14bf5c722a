//! Chunks a prefetch fetched that the cache would not keep (a full cache of chunks read as often,
//! `index.rs`), held in memory until the read they were fetched for takes them. Without it, a
//! prefetch over a dataset larger than the cache could only skip those chunks (their reads then
//! wait for the origin) or fetch them twice (once for nothing, once for the read).
//!
//! Bounded in bytes (`[prefetch] staging_bytes`): room is reserved before the fetch, so a fetched
//! chunk always has its place. An entry leaves when a read takes it; one older than
//! [`STALE_AFTER`] (a hint whose read never came) gives its room to a new one. Nothing else is
//! pushed out, so a staged chunk is never fetched a second time for its read.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memarts_protocol::{ObjectMeta, ObjectUrl, WireError};

use super::first_read::first_flight;
use super::miss::Miss;
use super::{parse_url, Engine, Fetched, ReadBy};
use crate::chunk_store::ChunkKey;

/// A staged chunk not taken by then is taken to be a hint whose read will not come.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Staging {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    capacity: u64,
    /// Bytes of the entries and of the reservations of fetches in flight.
    bytes: u64,
    entries: HashMap<u128, (Fetched, Instant)>,
}

impl Staging {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_capacity(&self, capacity: u64) {
        self.inner().capacity = capacity;
    }

    /// Reserves room for a chunk of `len` bytes about to be fetched (stale entries make way);
    /// false if there is none.
    pub fn reserve(&self, len: u64) -> bool {
        let mut s = self.inner();
        if s.bytes + len > s.capacity {
            let now = Instant::now();
            let stale: Vec<u128> = s
                .entries
                .iter()
                .filter(|(_, (_, at))| now.duration_since(*at) >= STALE_AFTER)
                .map(|(id, _)| *id)
                .collect();
            for id in stale {
                if let Some((f, _)) = s.entries.remove(&id) {
                    s.bytes -= f.data.len() as u64;
                }
            }
        }
        if s.bytes + len > s.capacity {
            return false;
        }
        s.bytes += len;
        true
    }

    /// The fetch that reserved `reserved` bytes got `f`, chunk `id`.
    pub fn fill(&self, id: u128, f: Fetched, reserved: u64) {
        let mut s = self.inner();
        s.bytes = s.bytes + f.data.len() as u64 - reserved;
        if let Some((old, _)) = s.entries.insert(id, (f, Instant::now())) {
            s.bytes -= old.data.len() as u64;
        }
    }

    /// The fetch that reserved `reserved` bytes got nothing (it failed, or another fetch of the
    /// chunk was already running).
    pub fn cancel(&self, reserved: u64) {
        let mut s = self.inner();
        s.bytes = s.bytes.saturating_sub(reserved);
    }

    /// The staged chunk `id`, which leaves.
    pub fn take(&self, id: u128) -> Option<Fetched> {
        let mut s = self.inner();
        let (f, _) = s.entries.remove(&id)?;
        s.bytes -= f.data.len() as u64;
        Some(f)
    }

    /// Chunks staged and bytes held (reservations included).
    #[cfg(test)]
    pub fn usage(&self) -> (usize, u64) {
        let s = self.inner();
        (s.entries.len(), s.bytes)
    }
}

impl Engine {
    /// Fetches bytes `range` of the chunk `key` of `url` into staging, through the chunk's single
    /// flight (a read of it running or arriving shares the one GET). False: no room, or a fetch of
    /// it was already running (its reader has it).
    pub(super) async fn stage_chunk(
        self: &Arc<Self>,
        url: &ObjectUrl,
        key: ChunkKey,
        range: Range<u64>,
    ) -> Result<bool, WireError> {
        let len = range.end - range.start;
        if !self.staged.reserve(len) {
            return Ok(false);
        }
        let miss = Miss::chunk(url.clone(), key, range, ReadBy::Prefetch).staged(len);
        let (fetched, led) = self.fill_chunk(miss).await;
        if !led {
            self.staged.cancel(len);
        }
        fetched.map(|_| led)
    }

    /// Chunk 0 of `url` into staging, with its metadata: of the version whose metadata is known,
    /// else (cold) with the metadata in one GET, through the object's first-read flight, and the
    /// metadata kept, so that its read finds it. `None`: no room, or nothing was staged.
    pub(super) async fn stage_first(
        self: &Arc<Self>,
        url: &str,
        chunk_size: u64,
    ) -> Result<Option<ObjectMeta>, WireError> {
        let parsed = parse_url(url)?;
        if let Some(meta) = self.metadata.cache().get(url) {
            let Some(etag) = meta.etag.clone().filter(|e| !e.is_empty() && meta.size > 0) else {
                return Ok(None);
            };
            let key = ChunkKey::new(&parsed, &etag, chunk_size, 0);
            let staged = self.stage_chunk(&parsed, key, 0..meta.size.min(chunk_size)).await?;
            return Ok(staged.then_some(meta));
        }
        if !self.staged.reserve(chunk_size) {
            return Ok(None);
        }
        let flight = first_flight(&parsed, chunk_size);
        let miss = Miss::first(parsed, chunk_size, flight, ReadBy::Prefetch).staged(chunk_size);
        let (got, led) = self.fill_first(miss).await;
        if !led {
            self.staged.cancel(chunk_size);
        }
        Ok(got.ok().filter(|_| led).map(|(meta, _)| meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn chunk(len: usize) -> Fetched {
        Fetched { data: Bytes::from(vec![7u8; len]), crc32c: 0 }
    }

    #[test]
    fn room_is_reserved_before_the_fetch_and_freed_when_the_read_takes_the_chunk() {
        let s = Staging::default();
        s.set_capacity(100);
        assert!(s.reserve(60));
        assert!(!s.reserve(60), "a reservation counts before its chunk is fetched");
        s.fill(1, chunk(50), 60); // shorter than reserved: the difference is given back
        assert_eq!(s.usage(), (1, 50));
        assert!(s.reserve(50));
        s.cancel(50);
        assert_eq!(s.take(1).map(|f| f.data.len()), Some(50));
        assert_eq!(s.usage(), (0, 0));
        assert!(s.take(1).is_none(), "taken once");
    }
}
