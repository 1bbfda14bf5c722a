//! One file opened for reading: the object version pinned at open (its ETag, so a changed object
//! is never served mixed: a chunk of another version is a `Stale` error, `ESTALE`), the chunks it
//! holds, and read-ahead.
//!
//! Reads are served from whole chunks (the fleet's unit), so the kernel's 128 KiB requests cost
//! one fleet read per chunk, not per request. A handle read sequentially reads ahead: a window that
//! starts at one chunk and doubles with each sequential read up to `max_ahead` chunks, fetched in
//! the background by the prefetch workers. A read elsewhere (a seek) drops the window. Chunks
//! behind the reader are dropped; every chunk kept holds a lease on the mount's budget (`budget.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use fuser::Errno;
use memarts_shim::ObjectMeta;

use super::budget::Lease;
use super::errno::failed;
use super::prefetch::Prefetcher;
use super::Fleet;

/// Chunks kept behind the one a sequential reader is in.
const BEHIND: u64 = 2;

enum WindowChunk {
    /// Being fetched (by a prefetch worker or another reader thread).
    Pending,
    Ready(Arc<Held>),
    Failed(Errno),
}

struct Held {
    data: Vec<u8>,
    _lease: Option<Lease>,
}

struct Window {
    chunks: BTreeMap<u64, WindowChunk>,
    /// Where the last read ended: a read that starts there is sequential.
    last_end: u64,
    /// Chunks to read ahead (0 after a seek).
    ahead: u64,
}

pub struct Reader {
    fleet: Arc<Fleet>,
    pub url: String,
    pub meta: ObjectMeta,
    chunk_size: u64,
    max_ahead: u64,
    window: Mutex<Window>,
    changed: Condvar,
    closed: AtomicBool,
}

impl Reader {
    pub fn new(fleet: Arc<Fleet>, url: String, meta: ObjectMeta, max_readahead: u64) -> Reader {
        let chunk_size = fleet.chunk_size();
        Reader {
            fleet,
            url,
            meta,
            chunk_size,
            max_ahead: (max_readahead / chunk_size).max(1),
            window: Mutex::new(Window { chunks: BTreeMap::new(), last_end: 0, ahead: 0 }),
            changed: Condvar::new(),
            closed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn chunks(&self) -> u64 {
        self.meta.size.div_ceil(self.chunk_size)
    }

    fn chunk_len(&self, index: u64) -> usize {
        (self.meta.size - index * self.chunk_size).min(self.chunk_size) as usize
    }

    /// Up to `size` bytes from `offset` (fewer at the end of the object, none past it).
    pub fn read(self: &Arc<Self>, offset: u64, size: u32, prefetch: &Prefetcher) -> Result<Vec<u8>, Errno> {
        if offset >= self.meta.size || size == 0 {
            return Ok(Vec::new());
        }
        let end = (offset + u64::from(size)).min(self.meta.size);
        let (first, last) = (offset / self.chunk_size, (end - 1) / self.chunk_size);
        {
            let mut w = self.lock();
            // The kernel sends read-ahead requests in parallel, so sequential reads arrive a little
            // out of order: anything within the window around the last read counts as sequential.
            let reach = (w.ahead + 1) * self.chunk_size;
            if offset <= w.last_end.saturating_add(reach) && offset.saturating_add(reach) >= w.last_end {
                w.ahead = (w.ahead * 2).clamp(1, self.max_ahead);
                w.last_end = w.last_end.max(end);
            } else {
                w.ahead = 0;
                w.chunks.retain(|&i, s| (first..=last).contains(&i) || matches!(s, WindowChunk::Pending));
                w.last_end = end;
            }
        }
        let mut out = Vec::with_capacity((end - offset) as usize);
        for index in first..=last {
            let chunk = self.chunk(index)?;
            let start = index * self.chunk_size;
            let from = offset.max(start) - start;
            let to = end.min(start + chunk.data.len() as u64) - start;
            out.extend_from_slice(&chunk.data[from as usize..to as usize]);
        }
        let ahead = {
            let mut w = self.lock();
            // The next sequential read starts in chunk `last` at the earliest; a request that
            // arrived out of order may still want the chunk or two before it.
            w.chunks.retain(|&i, s| i + BEHIND >= last || matches!(s, WindowChunk::Pending));
            w.ahead
        };
        for index in (last + 1..self.chunks()).take(ahead as usize) {
            if !self.schedule(index, prefetch) {
                break;
            }
        }
        Ok(out)
    }

    /// Puts chunk `index` on the prefetch queue unless it is held or on its way; false when the
    /// budget has no room for it.
    fn schedule(self: &Arc<Self>, index: u64, prefetch: &Prefetcher) -> bool {
        let mut w = self.lock();
        if w.chunks.contains_key(&index) {
            return true;
        }
        let Some(lease) = self.fleet.budget.take(self.chunk_len(index) as u64) else { return false };
        w.chunks.insert(index, WindowChunk::Pending);
        drop(w);
        prefetch.submit(self.clone(), index, lease);
        true
    }

    /// Chunk `index`: held, or on its way (wait for it), or fetched now.
    fn chunk(&self, index: u64) -> Result<Arc<Held>, Errno> {
        let mut w = self.lock();
        loop {
            match w.chunks.get(&index) {
                Some(WindowChunk::Ready(h)) => return Ok(h.clone()),
                Some(WindowChunk::Pending) => {
                    w = self.changed.wait(w).unwrap_or_else(|p| p.into_inner());
                }
                Some(WindowChunk::Failed(e)) => {
                    let e = *e;
                    w.chunks.remove(&index);
                    return Err(e);
                }
                None => break,
            }
        }
        let lease = self.fleet.budget.take(self.chunk_len(index) as u64);
        if lease.is_some() {
            w.chunks.insert(index, WindowChunk::Pending);
        }
        drop(w);
        let kept = lease.is_some();
        let result = self.fetch(index).map(|data| Arc::new(Held { data, _lease: lease }));
        if kept {
            self.finish(index, result.clone().map(|_| ()).err(), result.as_ref().ok().cloned());
        }
        result
    }

    /// Reads chunk `index` of the pinned version from the fleet.
    fn fetch(&self, index: u64) -> Result<Vec<u8>, Errno> {
        let mut data = vec![0u8; self.chunk_len(index)];
        match self.fleet.client().read_at(&self.url, &self.meta, index * self.chunk_size, &mut data[..]) {
            Ok(n) if n == data.len() => Ok(data),
            Ok(n) => {
                eprintln!(
                    "memarts mount: {}: chunk {index} ended after {n} of {} bytes",
                    self.url,
                    data.len()
                );
                Err(Errno::EIO)
            }
            Err(e) => Err(failed(&format!("read {} chunk {index}", self.url), &e)),
        }
    }

    fn finish(&self, index: u64, err: Option<Errno>, held: Option<Arc<Held>>) {
        let mut w = self.lock();
        match (err, held) {
            (None, Some(h)) => w.chunks.insert(index, WindowChunk::Ready(h)),
            (Some(e), _) => w.chunks.insert(index, WindowChunk::Failed(e)),
            (None, None) => w.chunks.remove(&index),
        };
        drop(w);
        self.changed.notify_all();
    }

    /// A prefetch worker's part: fetch `index` under `lease` (unless the file was closed).
    pub fn prefetched(&self, index: u64, lease: Lease) {
        if self.closed.load(Ordering::Relaxed) {
            self.finish(index, None, None);
            return;
        }
        match self.fetch(index) {
            Ok(data) => self.finish(index, None, Some(Arc::new(Held { data, _lease: Some(lease) }))),
            Err(e) => self.finish(index, Some(e), None),
        }
    }

    /// The file was released: its chunks go now; queued prefetches are dropped when reached.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.lock().chunks.retain(|_, s| matches!(s, WindowChunk::Pending));
    }
}
