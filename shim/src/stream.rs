//! A sequential stream over one object version, with read-ahead.
//!
//! [`Stream::open`] pins the current version (the one published for direct reads, else a stat):
//! every chunk it reads carries the ETag, so an object replaced at the origin mid-stream is a
//! `Stale` error at the read that needs a chunk of the new version, never bytes of two versions. Reads are served from whole chunks.
//!
//! A reader that goes on where its last read ended keeps a window of chunks in flight ahead of it,
//! fetched by a few background threads: the window starts at one chunk and doubles with each chunk
//! entered in order, up to [`ShimConfig::readahead`](crate::ShimConfig::readahead) bytes, so a cold
//! stream overlaps its round trips instead of paying one per chunk (as Mountpoint's prefetcher and
//! `memarts mount`'s reader do). Chunks that come fast (read locally: direct hits) need no such
//! depth: the window then stays at two chunks per core. A seek drops the window; chunks behind the
//! reader are dropped and their buffers reused, so memory stays within the window plus the chunks
//! in flight. A chunk that failed surfaces its error
//! at the read that needs it. Dropping the stream stops its workers after the fetch each has under
//! way (at most one chunk each); they never start another.
//!
//! A chunk its slot holds pinned (locked in memory and checked once, `direct.rs`) needs no window:
//! a read is copied from its file straight into the caller's buffer, a part at a time, as a read of
//! a local file is (a chunk read into the window is read whole, to be checked, then copied again).
//!
//! After a `fork` the child has none of the parent's workers: its first read starts a fresh window
//! with workers of its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_protocol::ObjectMeta;

use crate::client::Client;
use crate::direct::PinnedChunk;
use crate::error::{Error, Result};
use crate::fill::{ReadBuf, Room};
use crate::readahead::{new_shared, work, Shared, Target, WindowChunk};

/// Anything that holds a [`Client`] and can be shared with the stream's workers: a `Client`, or a
/// `memarts_session::Session` (whose in-process engine then lives as long as the stream).
pub type Source = Arc<dyn AsRef<Client> + Send + Sync>;

impl AsRef<Client> for Client {
    fn as_ref(&self) -> &Client {
        self
    }
}

/// A sequential reader of one object version (see the module docs). Implements [`std::io::Read`]
/// and [`std::io::Seek`].
pub struct Stream {
    target: Arc<Target>,
    shared: Arc<Shared>,
    /// The process the workers belong to (a forked child starts its own).
    pid: u32,
    /// Background fetchers a window may have; they start as chunks are queued (no more than are
    /// queued: a two-chunk object gets one) and end with the stream.
    workers: usize,
    started: usize,
    pos: u64,
    /// Where the last read ended: a read that starts there is sequential.
    last_end: u64,
    /// The last chunk a sequential read entered (the window grows when the reader enters a new one).
    last_chunk: Option<u64>,
    /// Chunks to keep in flight ahead of the reader (0 after a seek).
    ahead: u64,
    max_ahead: u64,
    /// The chunk the reader is in, when its slot holds it pinned: read straight from its file into
    /// the caller's buffer, a part at a time, with no window (see [`Stream::read_pinned`]).
    pinned: Option<(u64, PinnedChunk)>,
}

impl Client {
    /// A [`Stream`] over the current version of `url`, sharing this client with its workers.
    pub fn open_stream(self: &Arc<Self>, url: &str) -> Result<Stream> {
        Stream::open(self.clone(), url)
    }
}

impl Stream {
    /// Pins the current version of `url` (see the module docs): the one its slot published for direct
    /// reads, else a `Stat`.
    pub fn open(source: Source, url: &str) -> Result<Stream> {
        let meta = (*source).as_ref().version_to_read(url)?;
        Stream::at_version(source, url, meta)
    }

    /// A stream over the version `meta` names (e.g. from a metadata cache): nothing is asked.
    pub fn at_version(source: Source, url: &str, meta: ObjectMeta) -> Result<Stream> {
        // A version without an ETag cannot be pinned: its first chunk read says so (`read_at`).
        let cfg = (*source).as_ref().config();
        let chunk_size = cfg.chunk_size.max(1);
        let max_ahead = (cfg.readahead / chunk_size).max(1);
        let workers = cfg.parallel.clamp(1, max_ahead as usize);
        let target = Arc::new(Target { source, url: url.to_string(), meta, chunk_size });
        Ok(Stream {
            target,
            shared: new_shared(),
            pid: std::process::id(),
            workers,
            started: 0,
            pos: 0,
            last_end: 0,
            last_chunk: None,
            ahead: 0,
            max_ahead,
            pinned: None,
        })
    }

    /// The pinned version.
    pub fn meta(&self) -> &ObjectMeta {
        &self.target.meta
    }

    pub fn size(&self) -> u64 {
        self.target.meta.size
    }

    /// Where the next read starts.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Chunks the window currently keeps ahead of the reader (for tests and diagnostics).
    pub fn window_chunks(&self) -> u64 {
        self.ahead
    }

    /// A probe that outlives the stream: how many of its workers still run (plus one while the
    /// stream itself is alive). For tests of its shutdown.
    #[doc(hidden)]
    pub fn workers_probe(&self) -> impl Fn() -> usize + Send + 'static {
        let weak = Arc::downgrade(&self.shared);
        move || weak.strong_count()
    }

    /// Moves the reader to `pos` (past the end is allowed: reads there return 0). A move anywhere
    /// but where the last read ended drops the window.
    pub fn seek_to(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// Fills `buf` from the current position; returns the bytes read, 0 only at (or past) the end.
    /// `buf` is a reused `&mut [u8]`, or [`Room`] that need not be initialised (a buffer allocated
    /// for the read, such as Python's `bytes`); on `Ok(n)` its first `n` bytes are written.
    pub fn read<'d>(&mut self, buf: impl Into<ReadBuf<'d>>) -> Result<usize> {
        let buf = buf.into().0;
        let size = self.target.meta.size;
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        if self.pid != std::process::id() {
            // A forked child: the parent's workers are not here, and the window's lock may have
            // been held by one of them at the fork. Start afresh.
            self.shared = new_shared();
            self.pid = std::process::id();
            self.started = 0;
            self.ahead = 0;
        }
        let cs = self.target.chunk_size;
        if self.pos != self.last_end {
            // A seek: forget the window (in-flight fetches finish and are thrown away).
            self.ahead = 0;
            self.last_chunk = None;
            let mut w = self.shared.lock();
            w.queue.clear();
            w.chunks.clear();
        }
        let end = (self.pos + buf.len() as u64).min(size);
        let mut done = 0usize;
        while self.pos < end {
            let index = self.pos / cs;
            let skip = (self.pos - index * cs) as usize;
            let take = (self.target.chunk_len(index) - skip).min((end - self.pos) as usize);
            let dst = &mut buf[done..done + take];
            if !self.read_pinned(index, skip, dst) {
                let chunk = self.enter(index)?;
                dst.write_copy_of_slice(&chunk[skip..skip + take]);
            }
            done += take;
            self.pos += take as u64;
        }
        self.last_end = self.pos;
        Ok(done)
    }

    /// Bytes `skip..skip + dst.len()` of chunk `index` straight from its file into `dst`, when its
    /// slot holds it pinned and it is not in the window already: one copy, from the page cache to
    /// the caller, as a read of a local file makes (a chunk read whole into the window first, to be
    /// checked, would be copied twice). Whether it was served so; if not, `dst` is to be filled
    /// the usual way.
    fn read_pinned(&mut self, index: u64, skip: usize, dst: &mut Room) -> bool {
        let client: &Client = (*self.target.source).as_ref();
        let Some(local) = client.sources.local() else { return false };
        if self.pinned.as_ref().is_none_or(|(i, _)| *i != index) {
            self.pinned = None;
            if self.in_window(index) {
                return false;
            }
            let (url, meta) = (&self.target.url, &self.target.meta);
            let opened = client.with_local_chunk(url, meta, index, |local, chunk, slot, len| {
                local.open_pinned(chunk, slot, len)
            });
            let Some(chunk) = opened else { return false };
            self.pinned = Some((index, chunk));
            // Entered in order: a chunk after it that is not pinned gets a window ahead of it.
            self.last_chunk = Some(index);
        }
        let (_, chunk) = self.pinned.as_mut().expect("set above");
        if chunk.read(local, skip, dst) {
            return true;
        }
        self.pinned = None;
        false
    }

    /// Hands the rest of the stream to `write`, piece by piece, straight from the fetched chunks
    /// (no copy into a buffer of the caller's): how `memarts cat` streams an object to its output.
    /// A whole chunk that is a direct hit and not in the window already is not even read into a
    /// buffer: `write` gets it from its file's mapping, checked (`direct.rs`), on this thread.
    /// An error of `write` ends the copy as [`Error::Io`]. Returns the bytes written.
    pub fn copy_to(&mut self, mut write: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<u64> {
        let (size, cs, start) = (self.target.meta.size, self.target.chunk_size, self.pos);
        while self.pos < size {
            self.last_end = self.pos;
            let index = self.pos / cs;
            if self.pos == index * cs && !self.in_window(index) {
                let client: &Client = (*self.target.source).as_ref();
                let (url, meta) = (&self.target.url, &self.target.meta);
                let mapped = client.with_local_chunk(url, meta, index, |local, chunk, slot, len| {
                    local.write_mapped_chunk(chunk, slot, len, &mut write)
                });
                if let Some(written) = mapped {
                    written?;
                    self.pos += self.target.chunk_len(index) as u64;
                    self.last_chunk = Some(index);
                    continue;
                }
            }
            let chunk = self.enter(index)?;
            let skip = (self.pos - index * cs) as usize;
            write(&chunk[skip..])?;
            self.pos += (chunk.len() - skip) as u64;
        }
        self.last_end = self.pos;
        Ok(self.pos - start)
    }

    /// Whether chunk `index` is in the window (on its way or fetched).
    fn in_window(&self, index: u64) -> bool {
        self.shared.lock().chunks.contains_key(&index)
    }

    /// Chunk `index`, which the reader has just reached: the window grows when the reader went on
    /// in order, and is scheduled ahead of it.
    fn enter(&mut self, index: u64) -> Result<Arc<Vec<u8>>> {
        if self.last_chunk != Some(index) {
            // Local chunks need no deep window: two per core.
            let cap = if self.shared.fetches_are_local() {
                self.max_ahead.min(2 * crate::read::cores() as u64)
            } else {
                self.max_ahead
            };
            if self.last_chunk.is_some_and(|c| c + 1 == index) || self.pos == 0 {
                self.ahead = (self.ahead * 2).max(1);
            }
            self.ahead = self.ahead.min(cap);
            self.last_chunk = Some(index);
            self.schedule(index);
        }
        self.chunk(index)
    }

    /// Drops the chunks behind `index` and queues the window ahead of it; starts the workers the
    /// first time there is something ahead.
    fn schedule(&mut self, index: u64) {
        let chunks = self.target.meta.size.div_ceil(self.target.chunk_size);
        let mut w = self.shared.lock();
        w.leave_behind(index, self.max_ahead as usize + self.workers + 1);
        let mut added = false;
        for i in (index + 1..chunks).take(self.ahead as usize) {
            if let std::collections::btree_map::Entry::Vacant(e) = w.chunks.entry(i) {
                e.insert(WindowChunk::Pending);
                w.queue.push_back(i);
                added = true;
            }
        }
        let queued = w.queue.len();
        drop(w);
        if added {
            self.shared.changed.notify_all();
            self.start_workers(queued.min(self.workers));
        }
    }

    /// Brings the workers up to `want`.
    fn start_workers(&mut self, want: usize) {
        while self.started < want {
            let i = self.started;
            self.started += 1;
            let (target, shared) = (self.target.clone(), self.shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("memarts-ahead{i}"))
                .spawn(move || work(&target, &shared));
            if spawned.is_err() {
                // No thread to spare: the reader fetches the queued chunks itself when it gets there.
                self.started -= 1;
                self.workers = self.started;
                break;
            }
        }
    }

    /// Chunk `index`: ready, or on its way (wait for it), or fetched now by the reader itself.
    fn chunk(&mut self, index: u64) -> Result<Arc<Vec<u8>>> {
        let mut w = self.shared.lock();
        loop {
            match w.chunks.remove(&index) {
                Some(WindowChunk::Ready(data)) => {
                    w.chunks.insert(index, WindowChunk::Ready(data.clone()));
                    return Ok(data);
                }
                Some(WindowChunk::Failed(e)) => return Err(e),
                Some(WindowChunk::Pending) if w.queue.contains(&index) => {
                    // Not started yet: fetch it here rather than wait behind the chunks ahead.
                    w.queue.retain(|&i| i != index);
                    w.chunks.insert(index, WindowChunk::Pending);
                    break;
                }
                Some(WindowChunk::Pending) => {
                    w.chunks.insert(index, WindowChunk::Pending);
                    w = self.shared.changed.wait(w).unwrap_or_else(|p| p.into_inner());
                }
                None => {
                    w.chunks.insert(index, WindowChunk::Pending);
                    break;
                }
            }
        }
        let buf = w.take_buffer();
        drop(w);
        let result = self.shared.timed(|| self.target.fetch(index, buf)).map(Arc::new);
        let mut w = self.shared.lock();
        match &result {
            Ok(data) => w.chunks.insert(index, WindowChunk::Ready(data.clone())),
            Err(_) => w.chunks.remove(&index),
        };
        result
    }

    /// Caps this stream's read-ahead at `max_bytes` (rounded up to whole chunks; 0 switches it off,
    /// so every chunk costs the reader a round trip: the path before streams, for comparisons).
    pub fn set_readahead(&mut self, max_bytes: u64) {
        self.max_ahead = max_bytes.div_ceil(self.target.chunk_size);
        self.ahead = self.ahead.min(self.max_ahead);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        // Under the lock, so a worker between its check of `closed` and its wait cannot miss this.
        drop(self.shared.lock());
        self.shared.changed.notify_all();
    }
}

impl std::io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Stream::read(self, buf).map_err(into_io)
    }
}

impl std::io::Seek for Stream {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let base = match to {
            std::io::SeekFrom::Start(p) => Some(p),
            std::io::SeekFrom::End(d) => self.size().checked_add_signed(d),
            std::io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let pos =
            base.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before 0"))?;
        self.seek_to(pos);
        Ok(pos)
    }
}

fn into_io(e: Error) -> std::io::Error {
    match e {
        Error::Io(io) => io,
        other => std::io::Error::other(other),
    }
}
