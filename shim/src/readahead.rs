//! The read-ahead of a [`Stream`](crate::stream::Stream): a window of chunk fetches in flight
//! ahead of a sequential reader, the few background workers that fill it, lowest chunk first, and
//! the buffers of chunks left behind, reused for the next fetches.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use memarts_protocol::ObjectMeta;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::stream::Source;

pub(crate) enum WindowChunk {
    /// Queued for a worker, or being fetched.
    Pending,
    Ready(Arc<Vec<u8>>),
    Failed(Error),
}

#[derive(Default)]
pub(crate) struct Window {
    pub(crate) chunks: BTreeMap<u64, WindowChunk>,
    /// Chunks waiting for a worker, lowest first.
    pub(crate) queue: VecDeque<u64>,
    /// Buffers of chunks the reader has left behind, for the next fetches: a stream of any length
    /// touches a window's worth of fresh memory once (each new buffer costs a page fault per page,
    /// as much as copying it), not the whole object.
    pub(crate) free: Vec<Vec<u8>>,
}

impl Window {
    /// Drops the chunks behind `index`, keeping their buffers for later fetches (at most `keep`).
    pub(crate) fn leave_behind(&mut self, index: u64, keep: usize) {
        let behind: Vec<u64> = self.chunks.range(..index).map(|(i, _)| *i).collect();
        for i in behind {
            if let Some(WindowChunk::Ready(data)) = self.chunks.remove(&i) {
                if self.free.len() < keep {
                    if let Ok(buf) = Arc::try_unwrap(data) {
                        self.free.push(buf);
                    }
                }
            }
        }
    }

    pub(crate) fn take_buffer(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_default()
    }
}

/// The state the reader shares with its workers.
pub(crate) struct Shared {
    pub(crate) window: Mutex<Window>,
    pub(crate) changed: Condvar,
    pub(crate) closed: AtomicBool,
    /// How long a chunk takes to fetch, µs (a moving average; 0 until one was fetched).
    pub(crate) fetch_us: AtomicU64,
}

/// Fetches faster than this are local (direct hits, the page cache): a window of a few chunks per
/// core keeps the cores busy, and a larger one only costs fresh buffers (a page fault per page).
pub(crate) const LOCAL_FETCH: Duration = Duration::from_millis(2);

impl Shared {
    /// Runs a fetch and folds its time into the average.
    pub(crate) fn timed<T>(&self, fetch: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = fetch();
        let took = started.elapsed().as_micros().max(1) as u64;
        let old = self.fetch_us.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { (old * 7 + took) / 8 };
        self.fetch_us.store(new, Ordering::Relaxed);
        out
    }

    pub(crate) fn fetches_are_local(&self) -> bool {
        let us = self.fetch_us.load(Ordering::Relaxed);
        us != 0 && us < LOCAL_FETCH.as_micros() as u64
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What every fetch needs: the client and the pinned version.
pub(crate) struct Target {
    pub(crate) source: Source,
    pub(crate) url: String,
    pub(crate) meta: ObjectMeta,
    pub(crate) chunk_size: u64,
}

impl Target {
    pub(crate) fn chunk_len(&self, index: u64) -> usize {
        (self.meta.size - index * self.chunk_size).min(self.chunk_size) as usize
    }

    /// Chunk `index` of the pinned version, whole, in `data` (a recycled buffer, or a new one):
    /// written into its spare capacity, never zeroed first.
    pub(crate) fn fetch(&self, index: u64, mut data: Vec<u8>) -> Result<Vec<u8>> {
        let len = self.chunk_len(index);
        data.clear();
        data.reserve_exact(len);
        let client: &Client = (*self.source).as_ref();
        let room = &mut data.spare_capacity_mut()[..len];
        let n = client.read_at(&self.url, &self.meta, index * self.chunk_size, &mut *room)?;
        if n != len {
            return Err(Error::Stale(format!(
                "{}: changed during the read (chunk {index} ended after {n} of {len} bytes)",
                self.url
            )));
        }
        // SAFETY: read_at returned Ok(len): it wrote the first `len` bytes of the spare capacity.
        unsafe { data.set_len(len) };
        Ok(data)
    }
}

pub(crate) fn new_shared() -> Arc<Shared> {
    Arc::new(Shared {
        window: Mutex::default(),
        changed: Condvar::new(),
        closed: AtomicBool::new(false),
        fetch_us: AtomicU64::new(0),
    })
}

/// A worker: fetches queued chunks, lowest first, until the stream is dropped.
pub(crate) fn work(target: &Target, shared: &Shared) {
    loop {
        let mut w = shared.lock();
        let index = loop {
            if shared.closed.load(Ordering::Relaxed) {
                return;
            }
            match w.queue.pop_front() {
                Some(i) if matches!(w.chunks.get(&i), Some(WindowChunk::Pending)) => break i,
                Some(_) => continue,
                None => w = shared.changed.wait(w).unwrap_or_else(|p| p.into_inner()),
            }
        };
        let buf = w.take_buffer();
        drop(w);
        let result = shared.timed(|| target.fetch(index, buf));
        let mut w = shared.lock();
        // Only a chunk still wanted is kept (a seek may have dropped it meanwhile).
        if let Some(slot @ WindowChunk::Pending) = w.chunks.get_mut(&index) {
            *slot = match result {
                Ok(data) => WindowChunk::Ready(Arc::new(data)),
                Err(e) => WindowChunk::Failed(e),
            };
        }
        drop(w);
        shared.changed.notify_all();
    }
}
