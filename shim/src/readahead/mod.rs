//! One read-ahead for every reader of an object version that reads in order: a
//! [`Stream`](crate::Stream) (so `File(url, "rb")`, fsspec's files and `memarts cat`) and each file
//! open in `memarts mount`.
//!
//! A [`Readahead`] holds the chunks of one pinned version that its reader is in or will soon be in.
//! A read that starts near where the last one ended (within the window: a mount's kernel sends its
//! requests a little out of order) is in order; each later chunk a read in order enters doubles
//! the window, from one chunk up to [`ShimConfig::readahead`](crate::ShimConfig::readahead) bytes,
//! and the chunks ahead are queued for the process's fetch threads (`pool.rs`), lowest first. Chunks
//! that come fast (read locally) need no depth: the window then stays at two chunks per core. A
//! read elsewhere (a seek) drops the window. Chunks more than [`BEHIND`] behind the reader are
//! dropped and their buffers kept for the next fetches (a reader of any length touches a window's
//! worth of fresh memory once: a new buffer costs a page fault per page, as much as copying it).
//!
//! Every buffer a window keeps holds a lease on the process's budget
//! ([`ShimConfig::readahead_memory`](crate::ShimConfig::readahead_memory), `budget.rs`): with no
//! room, a chunk is fetched for its read alone and nothing is read ahead. A chunk fetched ahead
//! that failed surfaces its error at the read that needs it. Dropping the `Readahead` ends its
//! fetches after those under way; queued ones do nothing.

mod budget;
mod fetch;
mod pool;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use memarts_protocol::ObjectMeta;

pub(crate) use budget::Lease;
pub(crate) use pool::{Process, Readaheads};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::room::Room;

/// Anything that holds a [`Client`] and can be shared with the fetch threads: a `Client`, a
/// `memarts_session::Session` (whose in-process engine then lives as long as the reader), a mount.
pub type Source = Arc<dyn AsRef<Client> + Send + Sync>;

impl AsRef<Client> for Client {
    fn as_ref(&self) -> &Client {
        self
    }
}

/// Chunks kept behind the one the reader is in: a request that arrived out of order may still
/// want the chunk or two before it.
pub const BEHIND: u64 = 2;

/// Fetches faster than this are local (local reads, the page cache): a window of a few chunks per
/// core keeps the cores busy, and a larger one only costs fresh buffers.
const LOCAL_FETCH: Duration = Duration::from_millis(2);

/// A chunk's buffer and its lease on the budget (`None`: fetched for one read, not kept).
pub struct Buffer {
    data: Vec<u8>,
    lease: Option<Lease>,
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

enum State {
    /// Waiting for a fetch thread, with the buffer it will fill.
    Queued(Buffer),
    /// Being fetched (by a fetch thread or a reader).
    Fetching,
    Ready(Arc<Buffer>),
    Failed(Error),
}

#[derive(Default)]
struct Window {
    chunks: BTreeMap<u64, State>,
    /// Where the last read ended (the furthest, for reads in order).
    last_end: u64,
    /// Whether the last read was in order.
    in_order: bool,
    /// The furthest chunk a read in order entered.
    last_chunk: Option<u64>,
    /// Chunks to keep in flight ahead of the reader (0 after a seek).
    ahead: u64,
    /// Leased buffers of chunks left behind, for the next fetches.
    free: Vec<Buffer>,
}

/// What the reader shares with the fetch threads.
struct Inner {
    source: Source,
    url: String,
    meta: ObjectMeta,
    chunk_size: u64,
    max_ahead: AtomicU64,
    window: Mutex<Window>,
    changed: Condvar,
    closed: AtomicBool,
    /// How long a chunk takes to fetch, µs (a moving average; 0 until one was fetched).
    fetch_us: AtomicU64,
    process: Arc<Process>,
}

/// The read-ahead of one reader of one object version (see the module docs).
pub struct Readahead {
    inner: Arc<Inner>,
    /// The process the window belongs to (a forked child starts its own).
    pid: u32,
}

impl Readahead {
    /// A window over the version `meta` of `url`, read through `source`'s client.
    pub fn new(source: Source, url: &str, meta: ObjectMeta) -> Readahead {
        let client: &Client = (*source).as_ref();
        let chunk_size = client.config().chunk_size.max(1);
        let max_ahead = (client.config().readahead / chunk_size).max(1);
        let process = client.readaheads.process();
        let inner = Inner {
            source,
            url: url.to_string(),
            meta,
            chunk_size,
            max_ahead: AtomicU64::new(max_ahead),
            window: Mutex::default(),
            changed: Condvar::new(),
            closed: AtomicBool::new(false),
            fetch_us: AtomicU64::new(0),
            process,
        };
        Readahead { inner: Arc::new(inner), pid: std::process::id() }
    }

    pub fn meta(&self) -> &ObjectMeta {
        &self.inner.meta
    }

    pub fn url(&self) -> &str {
        &self.inner.url
    }

    pub fn chunk_size(&self) -> u64 {
        self.inner.chunk_size
    }

    pub(crate) fn source(&self) -> &Source {
        &self.inner.source
    }

    /// The length of chunk `index`.
    pub fn chunk_len(&self, index: u64) -> usize {
        self.inner.chunk_len(index)
    }

    /// In a forked child, a fresh window (the parent's fetch threads are not here, and its lock
    /// may have been held by one of them at the fork).
    pub fn renew_after_fork(&mut self) {
        if self.pid != std::process::id() {
            let i = &self.inner;
            let fresh = Readahead::new(i.source.clone(), &i.url, i.meta.clone());
            fresh.set_max_ahead(i.max_ahead.load(Ordering::Relaxed));
            *self = fresh;
        }
    }

    /// Up to `dst.len()` bytes from `offset` (fewer at the end of the version, none past it): a
    /// read, which moves the window. On `Ok(n)` the first `n` bytes of `dst` are written.
    pub fn read(&self, offset: u64, dst: &mut Room) -> Result<usize> {
        let size = self.inner.meta.size;
        if offset >= size || dst.is_empty() {
            return Ok(0);
        }
        let end = (offset + dst.len() as u64).min(size);
        self.note_read(offset, end);
        let (cs, mut pos, mut done) = (self.inner.chunk_size, offset, 0usize);
        while pos < end {
            let index = pos / cs;
            let skip = (pos - index * cs) as usize;
            let chunk = self.enter(index)?;
            let take = (chunk.len() - skip).min((end - pos) as usize);
            dst[done..done + take].write_copy_of_slice(&chunk[skip..skip + take]);
            done += take;
            pos += take as u64;
        }
        Ok(done)
    }

    /// Notes a read of `offset..end` (the caller then enters its chunks, or serves them some other
    /// way): a read not in order drops the window.
    pub fn note_read(&self, offset: u64, end: u64) {
        let cs = self.inner.chunk_size;
        let mut w = self.inner.lock();
        let reach = (w.ahead + 1) * cs;
        w.in_order = offset <= w.last_end.saturating_add(reach) && offset.saturating_add(reach) >= w.last_end;
        if w.in_order {
            w.last_end = w.last_end.max(end);
            return;
        }
        w.ahead = 0;
        w.last_chunk = None;
        w.last_end = end;
        let wanted = offset / cs..=end.saturating_sub(1) / cs;
        let chunks = std::mem::take(&mut w.chunks);
        for (i, state) in chunks {
            match state {
                State::Fetching => drop(w.chunks.insert(i, state)),
                state if wanted.contains(&i) => drop(w.chunks.insert(i, state)),
                State::Queued(buf) => w.recycle(buf),
                _ => {}
            }
        }
    }

    /// Notes that the reader, reading in order, is in chunk `index`, which it served without the
    /// window (a chunk held resident by its slot): a later chunk gets a window ahead of it.
    pub fn passed(&self, index: u64) {
        let mut w = self.inner.lock();
        w.last_chunk = Some(w.last_chunk.map_or(index, |c| c.max(index)));
    }

    /// Chunk `index`, which a read just reached: the window grows if the read is in order and
    /// entered a later chunk, and is queued ahead of it; then the chunk, ready, waited for, or
    /// fetched now by the caller.
    pub fn enter(&self, index: u64) -> Result<Arc<Buffer>> {
        let mut w = self.inner.lock();
        if w.last_chunk != Some(index) {
            let max = self.inner.max_ahead.load(Ordering::Relaxed);
            let cap =
                if self.inner.fetches_are_local() { max.min(2 * crate::read::cores() as u64) } else { max };
            if w.in_order && w.last_chunk.map_or(index == 0, |c| index > c) {
                w.ahead = (w.ahead * 2).max(1);
            }
            w.ahead = w.ahead.min(cap);
            if w.in_order {
                w.last_chunk = Some(w.last_chunk.map_or(index, |c| c.max(index)));
            }
            let jobs = self.queue_ahead(&mut w, index);
            drop(w);
            if !jobs.is_empty() {
                let inner = Arc::downgrade(&self.inner);
                let jobs = jobs
                    .into_iter()
                    .map(|i| {
                        let inner = inner.clone();
                        Box::new(move || {
                            if let Some(inner) = inner.upgrade() {
                                inner.fetch_ahead(i);
                            }
                        }) as pool::Job
                    })
                    .collect();
                self.inner.process.submit(jobs);
            }
            return self.inner.chunk(index);
        }
        drop(w);
        self.inner.chunk(index)
    }

    /// Drops the chunks well behind `index` and queues the window ahead of it, each with a leased
    /// buffer, as far as the budget goes; the chunks queued.
    fn queue_ahead(&self, w: &mut Window, index: u64) -> Vec<u64> {
        let keep = (self.inner.max_ahead.load(Ordering::Relaxed) as usize).min(64) + 2;
        w.leave_behind(index.saturating_sub(BEHIND), keep);
        let chunks = self.inner.meta.size.div_ceil(self.inner.chunk_size);
        let mut queued = Vec::new();
        for i in (index + 1..chunks).take(w.ahead as usize) {
            if w.chunks.contains_key(&i) {
                continue;
            }
            let Some(buf) = self.inner.leased_buffer(w) else { break };
            w.chunks.insert(i, State::Queued(buf));
            queued.push(i);
        }
        queued
    }

    /// Whether chunk `index` is in the window (on its way or fetched).
    pub fn contains(&self, index: u64) -> bool {
        self.inner.lock().chunks.contains_key(&index)
    }

    /// Chunks the window keeps ahead of the reader now.
    pub fn ahead(&self) -> u64 {
        self.inner.lock().ahead
    }

    /// Caps the window at `chunks` chunks (0 switches read-ahead off).
    pub fn set_max_ahead(&self, chunks: u64) {
        self.inner.max_ahead.store(chunks, Ordering::Relaxed);
        let mut w = self.inner.lock();
        w.ahead = w.ahead.min(chunks);
    }

    /// A probe that outlives the reader: how many holders its window still has (the reader and any
    /// fetch under way). For tests of its shutdown.
    pub fn holders_probe(&self) -> impl Fn() -> usize + Send + 'static {
        let weak = Arc::downgrade(&self.inner);
        move || weak.strong_count()
    }

    /// The reader is done (a file closed): its chunks go now; fetches under way finish unused.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        let mut w = self.inner.lock();
        w.chunks.retain(|_, s| matches!(s, State::Fetching));
        w.free.clear();
        drop(w);
        self.inner.changed.notify_all();
    }
}

impl Client {
    /// Bytes the read-ahead windows of this process hold now (within
    /// [`ShimConfig::readahead_memory`](crate::ShimConfig::readahead_memory)).
    pub fn readahead_memory_used(&self) -> u64 {
        self.readaheads.process().budget.used()
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.close();
    }
}

impl Window {
    /// Drops the chunks before `index`, keeping up to `keep` of their buffers for later fetches.
    fn leave_behind(&mut self, index: u64, keep: usize) {
        let behind: Vec<u64> = self.chunks.range(..index).map(|(i, _)| *i).collect();
        for i in behind {
            match self.chunks.remove(&i) {
                Some(State::Fetching) => drop(self.chunks.insert(i, State::Fetching)),
                Some(State::Ready(data)) if self.free.len() < keep => {
                    if let Ok(buf) = Arc::try_unwrap(data) {
                        self.recycle(buf);
                    }
                }
                Some(State::Queued(buf)) if self.free.len() < keep => self.recycle(buf),
                _ => {}
            }
        }
    }

    fn recycle(&mut self, buf: Buffer) {
        if buf.lease.is_some() {
            self.free.push(buf);
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn chunk_len(&self, index: u64) -> usize {
        (self.meta.size - index * self.chunk_size).min(self.chunk_size) as usize
    }

    fn fetches_are_local(&self) -> bool {
        let us = self.fetch_us.load(Ordering::Relaxed);
        us != 0 && us < LOCAL_FETCH.as_micros() as u64
    }
}
