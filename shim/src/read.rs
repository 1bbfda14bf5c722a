//! Reading objects: split a byte range into chunks, fetch them from their owning slots in parallel
//! (at most `MOX_COPY_PARALLEL_THREADS` at once), each straight into its place in the caller's buffer.
//!
//! Each chunk comes from the client's chunk sources (`sources.rs`): the cache's files read locally
//! when warm, else its slot. A chunk a slot serves from the cache arrives as a file descriptor: the
//! shim reads the bytes from the page cache itself and checks their CRC32C; on a mismatch it asks
//! the slot to drop and refetch the chunk.

use std::sync::Mutex;
use std::time::Instant;

use memarts_protocol::{chunk_owner, ChunkRequest, ObjectMeta, ObjectUrl, MAX_BATCH};

use crate::chunk_io::{read_batch, read_first, read_memarts};
use crate::client::{parse, Client};
use crate::error::{Error, Result};
use crate::room::{ReadBuf, Room, Sink, VecSink};
use crate::sources::{Target, Wanted};

/// One chunk's share of a read: the chunk, and where its wanted bytes go.
struct Piece<'a> {
    index: u64,
    /// Offset of the wanted bytes within the chunk.
    skip: usize,
    dst: &'a mut Room,
}

impl Client {
    /// The whole object. Metadata and the first chunk come in one round trip from the owner of
    /// chunk 0; the other chunks follow in parallel, pinned to the ETag that round trip returned.
    pub fn read(&self, url: &str) -> Result<Vec<u8>> {
        let mut sink = VecSink::default();
        self.read_to(url, &mut sink)?;
        // SAFETY: read_to returned Ok, so it wrote every byte of the room it reserved.
        Ok(unsafe { sink.finish() })
    }

    /// The whole object into `sink`, which is asked for room once the size is known. On `Ok` every
    /// byte of that room has been written.
    ///
    /// If the object changes during the read (`Stale`), the read starts over once from fresh
    /// metadata: the caller asked for the object, not for a version, and still never gets a mix.
    pub fn read_to(&self, url: &str, sink: &mut dyn Sink) -> Result<ObjectMeta> {
        match self.read_to_once(url, sink, false) {
            Err(Error::Stale(_)) => self.read_to_once(url, sink, true),
            other => other,
        }
    }

    fn read_to_once(&self, url: &str, sink: &mut dyn Sink, refresh: bool) -> Result<ObjectMeta> {
        let parsed = parse(url)?;
        let url_text = parsed.to_string();
        let cs = self.cfg.chunk_size;
        let slot = chunk_owner(&parsed, cs, 0, self.slots());
        // A warm object whose version the slot published: its chunks straight from their files.
        if let Some(meta) = self.sources.local().filter(|_| !refresh).and_then(|d| d.meta(&url_text, slot)) {
            let size =
                usize::try_from(meta.size).map_err(|_| Error::BadRequest("object too large".into()))?;
            sink.reserve(size)?;
            if size > 0 {
                self.read_at_parsed(&parsed, &meta, 0, sink.room())?;
            }
            return Ok(meta);
        }
        let deadline = Instant::now() + self.cfg.deadline;
        let (meta, warm) =
            self.conns.with_slot(slot, deadline, |conn| read_first(conn, &url_text, cs, refresh, sink))?;
        if meta.size > cs {
            let rest = &mut sink.room()[cs as usize..];
            if warm {
                self.read_batched(&url_text, &meta, cs, rest)?;
            } else {
                self.read_at(&url_text, &meta, cs, rest)?;
            }
        }
        Ok(meta)
    }

    /// The version of `url` a read of it reads: the one its slot published for local reads if that
    /// is fresh (no round trip: the slot would answer a `Stat` with it), else a `Stat`.
    pub fn version_to_read(&self, url: &str) -> Result<ObjectMeta> {
        match self.published_version(url)? {
            Some(meta) => Ok(meta),
            None => self.stat(url),
        }
    }

    /// The version of `url` its slot published for local reads, if it is fresh.
    pub(crate) fn published_version(&self, url: &str) -> Result<Option<ObjectMeta>> {
        let Some(local) = self.sources.local() else { return Ok(None) };
        let parsed = parse(url)?;
        let slot = chunk_owner(&parsed, self.cfg.chunk_size, 0, self.slots());
        Ok(local.meta(&parsed.to_string(), slot))
    }

    /// The metadata of `url` and its chunk 0, in one round trip to the owner of chunk 0 (one GET
    /// when the object is cold, which leaves both in the fleet), or none when its slot published the
    /// version for local reads. Chunk 0's bytes (the first
    /// `min(size, chunk size)` bytes of the object) go to the start of `first`, which must hold a
    /// chunk. For readers that go on in windows of their own (`memarts warmup`).
    pub fn read_head(&self, url: &str, first: &mut [u8]) -> Result<ObjectMeta> {
        let cs = self.cfg.chunk_size;
        if (first.len() as u64) < cs {
            return Err(Error::BadRequest(format!(
                "read_head: a buffer of {} bytes cannot hold a chunk",
                first.len()
            )));
        }
        // A version published for local reads: chunk 0 straight from its file, no round trip.
        if let Some(meta) = self.published_version(url)? {
            let head = meta.size.min(cs) as usize;
            match self.read_at(url, &meta, 0, &mut first[..head]) {
                Ok(n) if n == head => return Ok(meta),
                Ok(_) | Err(Error::Stale(_)) => {} // changed since: the usual first read sorts it out
                Err(e) => return Err(e),
            }
        }
        let parsed = parse(url)?;
        let url_text = parsed.to_string();
        let slot = chunk_owner(&parsed, cs, 0, self.slots());
        let deadline = Instant::now() + self.cfg.deadline;
        let mut sink = Head { buf: crate::room::as_room(first), len: 0, chunk: cs as usize };
        self.conns
            .with_slot(slot, deadline, |conn| read_first(conn, &url_text, cs, false, &mut sink))
            .map(|(meta, _)| meta)
    }

    /// A memarts-only object (`write_memarts`) into `sink`; returns its size.
    pub fn read_memarts_to(&self, url: &str, sink: &mut dyn Sink) -> Result<u64> {
        let url = parse(url)?.to_string();
        let slot = memarts_protocol::meta_owner_slot(&url, self.slots());
        let deadline = Instant::now() + self.cfg.deadline;
        self.conns.with_slot(slot, deadline, |conn| read_memarts(conn, &url, sink))
    }

    /// `len` bytes from `offset` (fewer at the end of the object).
    pub fn read_range(&self, url: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let meta = self.version_to_read(url)?;
        let len = len.min(meta.size.saturating_sub(offset) as usize);
        let mut buf = vec![0u8; len];
        let n = self.read_at(url, &meta, offset, &mut buf[..])?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Fills `dst` from `offset`; returns the bytes read (short only at the end of the object).
    pub fn read_into(&self, url: &str, offset: u64, dst: &mut [u8]) -> Result<usize> {
        self.read_at(url, &self.version_to_read(url)?, offset, dst)
    }

    /// Bytes of the version `meta` names (its ETag pins it), from `offset` into `dst`: a reused
    /// `&mut [u8]`, or [`Room`] that need not be initialised (a buffer allocated for the read).
    /// Returns the bytes read, short only at the end of the object; on `Ok(n)` the first `n` bytes
    /// of `dst` are written. The chunks covering `dst` are fetched on up to
    /// [`ShimConfig::parallel`](crate::ShimConfig::parallel) threads, the calling one included.
    pub fn read_at<'d>(
        &self,
        url: &str,
        meta: &ObjectMeta,
        offset: u64,
        dst: impl Into<ReadBuf<'d>>,
    ) -> Result<usize> {
        self.read_at_parsed(&parse(url)?, meta, offset, dst.into().0)
    }

    /// [`Client::read_at`] of an object URL parsed already.
    fn read_at_parsed(
        &self,
        parsed: &ObjectUrl,
        meta: &ObjectMeta,
        offset: u64,
        dst: &mut Room,
    ) -> Result<usize> {
        let url = parsed;
        let etag = meta.etag.as_deref().filter(|e| !e.is_empty()).ok_or_else(|| {
            Error::Origin(format!("{url}: the origin reports no ETag, so its chunks cannot be cached safely"))
        })?;
        if offset >= meta.size || dst.is_empty() {
            return Ok(0);
        }
        let len = (meta.size - offset).min(dst.len() as u64) as usize;
        let target = Target::new(parsed, etag, meta.size, self.cfg.chunk_size);
        let pieces = plan(&target, offset, &mut dst[..len]);
        let deadline = Instant::now() + self.cfg.deadline;
        run_parallel(self.cfg.parallel, pieces, |piece| self.fetch_piece(&target, piece, deadline))?;
        Ok(len)
    }

    /// Reads the chunks covering `dst` (from the chunk-aligned `offset` to the end of the object) in
    /// batches, one round trip per batch of chunks of one slot, spread over the cores: the path for
    /// data that is expected to be cached, where round trips, not the origin, are the cost.
    fn read_batched(&self, url: &str, meta: &ObjectMeta, offset: u64, dst: &mut Room) -> Result<()> {
        let parsed = parse(url)?;
        let etag = meta.etag.as_deref().unwrap_or_default();
        let target = Target::new(&parsed, etag, meta.size, self.cfg.chunk_size);
        let pieces = plan(&target, offset, dst);
        let workers = self.cfg.parallel.min(cores()).clamp(1, pieces.len().max(1));
        let by_bytes =
            (memarts_protocol::Limits::RESPONSE.max_payload as u64 / target.chunk_size).max(1) as usize;
        let per_batch = pieces.len().div_ceil(workers).clamp(1, MAX_BATCH.min(by_bytes));
        let mut by_slot: std::collections::BTreeMap<u32, Vec<Piece<'_>>> = Default::default();
        for piece in pieces {
            by_slot
                .entry(chunk_owner(target.url, target.chunk_size, piece.index, self.slots()))
                .or_default()
                .push(piece);
        }
        let mut batches = Vec::new();
        for (slot, mut group) in by_slot {
            while !group.is_empty() {
                let rest = group.split_off(group.len().saturating_sub(per_batch));
                batches.push((slot, rest));
            }
        }
        let deadline = Instant::now() + self.cfg.deadline;
        run_parallel(workers, batches, |(slot, mut batch)| {
            let reqs: Vec<ChunkRequest> = batch.iter().map(|p| target.request(p.index)).collect();
            let mut dsts: Vec<&mut Room> = batch.iter_mut().map(|p| &mut *p.dst).collect();
            self.conns.with_slot(slot, deadline, |conn| read_batch(conn, &reqs, &mut dsts))
        })
    }

    fn fetch_piece(&self, t: &Target<'_>, piece: Piece<'_>, deadline: Instant) -> Result<()> {
        let start = piece.index * t.chunk_size;
        let chunk_len = (t.size - start).min(t.chunk_size) as usize;
        let slot = chunk_owner(t.url, t.chunk_size, piece.index, self.slots());
        let want = Wanted { target: t, index: piece.index, slot, deadline, recheck: false };
        if piece.skip == 0 && piece.dst.len() == chunk_len {
            return self.sources.read_chunk(want, piece.dst);
        }
        let mut whole: Vec<u8> = Vec::with_capacity(chunk_len);
        let room = &mut whole.spare_capacity_mut()[..chunk_len];
        self.sources.read_chunk(want, room)?;
        // SAFETY: Sources::read_chunk returned Ok: a source served the chunk, which wrote all
        // `chunk_len` bytes of the spare capacity.
        unsafe { whole.set_len(chunk_len) };
        let wanted = &whole[piece.skip..piece.skip + piece.dst.len()];
        for (d, s) in piece.dst.iter_mut().zip(wanted) {
            d.write(*s);
        }
        Ok(())
    }
}

/// Cuts `dst` (the bytes from `offset`) into per-chunk pieces, last chunk first (workers pop them).
fn plan<'a>(t: &Target<'_>, offset: u64, mut dst: &'a mut Room) -> Vec<Piece<'a>> {
    let mut pieces = Vec::new();
    let mut pos = offset;
    while !dst.is_empty() {
        let index = pos / t.chunk_size;
        let skip = (pos - index * t.chunk_size) as usize;
        let take = ((t.chunk_size as usize) - skip).min(dst.len());
        let (head, rest) = std::mem::take(&mut dst).split_at_mut(take);
        pieces.push(Piece { index, skip, dst: head });
        dst = rest;
        pos += take as u64;
    }
    pieces.reverse();
    pieces
}

/// Runs `job` over `jobs` (taken from the back) on at most `workers` threads, the calling one
/// included; stops handing out jobs after the first failure and returns it.
fn run_parallel<T: Send>(workers: usize, jobs: Vec<T>, job: impl Fn(T) -> Result<()> + Sync) -> Result<()> {
    let workers = workers.clamp(1, jobs.len().max(1));
    let queue = Mutex::new(jobs);
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    let work = || loop {
        if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return;
        }
        let Some(next) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop() else { return };
        if let Err(e) = job(next) {
            failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            return;
        }
    };
    std::thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(work);
        }
        work();
    });
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The CPUs this process may use, looked up once: `available_parallelism` reads the cgroup's CPU
/// quota files on every call (an open, a read and a statx or more, ~25 µs here), and a stream asked
/// for it at every chunk it entered: 8% of `memarts cat`'s CPU for a warm object.
pub(crate) fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// The room of [`Client::read_head`]: the first chunk of the object only.
struct Head<'a> {
    buf: &'a mut Room,
    len: usize,
    chunk: usize,
}

impl Sink for Head<'_> {
    fn reserve(&mut self, size: usize) -> Result<()> {
        // `read_head` checked that a chunk fits.
        self.len = size.min(self.chunk).min(self.buf.len());
        Ok(())
    }

    fn room(&mut self) -> &mut Room {
        &mut self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::room::as_room;

    #[test]
    fn plan_covers_the_range_exactly() {
        let url = ObjectUrl::parse("s3://b/k").unwrap();
        let t = Target::new(&url, "e", 100, 10);
        let mut buf = vec![0u8; 35];
        let pieces = plan(&t, 7, as_room(&mut buf));
        let shape: Vec<(u64, usize, usize)> =
            pieces.iter().rev().map(|p| (p.index, p.skip, p.dst.len())).collect();
        assert_eq!(shape, vec![(0, 7, 3), (1, 0, 10), (2, 0, 10), (3, 0, 10), (4, 0, 2)]);
    }
}
