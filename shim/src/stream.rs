//! A sequential stream over one object version, with read-ahead.
//!
//! [`Stream::open`] pins the current version (the one published for local reads, else a stat):
//! every chunk it reads carries the ETag, so an object replaced at the origin mid-stream is a
//! `Stale` error at the read that needs a chunk of the new version, never bytes of two versions.
//! Reads are served from whole chunks.
//!
//! A reader that goes on where its last read ended keeps a window of chunks in flight ahead of it:
//! the process's one read-ahead (`readahead/`, shared with `memarts mount`), which starts at one
//! chunk and doubles with each chunk entered in order, up to
//! [`ShimConfig::readahead`](crate::ShimConfig::readahead) bytes, within the memory budget of all
//! the process's windows. A seek further than the window reaches drops it. A chunk that failed surfaces its error at the
//! read that needs it. Dropping the stream ends its fetches after those under way.
//!
//! A chunk its slot holds resident (locked in memory and checked once, `local_reads.rs`) needs no window:
//! a read is copied from its file straight into the caller's buffer, a part at a time, as a read of
//! a local file is (a chunk read into the window is read whole, to be checked, then copied again).
//!
//! After a `fork` the child has none of the parent's fetch threads: its first read starts a fresh
//! window.

use memarts_protocol::ObjectMeta;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::local_reads::ResidentChunk;
use crate::readahead::Readahead;
pub use crate::readahead::Source;
use crate::room::{ReadBuf, Room};

/// A sequential reader of one object version (see the module docs). Implements [`std::io::Read`]
/// and [`std::io::Seek`].
pub struct Stream {
    window: Readahead,
    pos: u64,
    /// The chunk the reader is in, when its slot holds it resident: read straight from its file into
    /// the caller's buffer, a part at a time, with no window (see [`Stream::read_resident`]).
    resident: Option<(u64, ResidentChunk)>,
}

impl Client {
    /// A [`Stream`] over the current version of `url`, sharing this client with its fetches.
    pub fn open_stream(self: &std::sync::Arc<Self>, url: &str) -> Result<Stream> {
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
        Ok(Stream { window: Readahead::new(source, url, meta), pos: 0, resident: None })
    }

    /// The pinned version.
    pub fn meta(&self) -> &ObjectMeta {
        self.window.meta()
    }

    pub fn size(&self) -> u64 {
        self.meta().size
    }

    /// Where the next read starts.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Chunks the window currently keeps ahead of the reader (for tests and diagnostics).
    pub fn window_chunks(&self) -> u64 {
        self.window.ahead()
    }

    /// A probe that outlives the stream: how many holders its window still has (the stream, and
    /// fetches under way). For tests of its shutdown.
    #[doc(hidden)]
    pub fn workers_probe(&self) -> impl Fn() -> usize + Send + 'static {
        self.window.holders_probe()
    }

    /// Moves the reader to `pos` (past the end is allowed: reads there return 0). A move further
    /// from where the last read ended than the window reaches drops the window.
    pub fn seek_to(&mut self, pos: u64) {
        self.pos = pos;
    }

    fn client(&self) -> &Client {
        (**self.window.source()).as_ref()
    }

    /// Fills `buf` from the current position; returns the bytes read, 0 only at (or past) the end.
    /// `buf` is a reused `&mut [u8]`, or [`Room`] that need not be initialised (a buffer allocated
    /// for the read, such as Python's `bytes`); on `Ok(n)` its first `n` bytes are written.
    pub fn read<'d>(&mut self, buf: impl Into<ReadBuf<'d>>) -> Result<usize> {
        let buf = buf.into().0;
        let size = self.size();
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        self.window.renew_after_fork();
        let cs = self.window.chunk_size();
        let end = (self.pos + buf.len() as u64).min(size);
        self.window.note_read(self.pos, end);
        let mut done = 0usize;
        while self.pos < end {
            let index = self.pos / cs;
            let skip = (self.pos - index * cs) as usize;
            let take = (self.window.chunk_len(index) - skip).min((end - self.pos) as usize);
            let dst = &mut buf[done..done + take];
            if !self.read_resident(index, skip, dst) {
                let chunk = self.window.enter(index)?;
                dst.write_copy_of_slice(&chunk[skip..skip + take]);
            }
            done += take;
            self.pos += take as u64;
        }
        Ok(done)
    }

    /// Bytes `skip..skip + dst.len()` of chunk `index` straight from its file into `dst`, when its
    /// slot holds it resident and it is not in the window already: one copy, from the page cache to
    /// the caller, as a read of a local file makes (a chunk read whole into the window first, to be
    /// checked, would be copied twice). Whether it was served so; if not, `dst` is to be filled
    /// the usual way.
    fn read_resident(&mut self, index: u64, skip: usize, dst: &mut Room) -> bool {
        let client: &Client = (**self.window.source()).as_ref();
        let Some(local) = client.sources.local() else { return false };
        if self.resident.as_ref().is_none_or(|(i, _)| *i != index) {
            self.resident = None;
            if self.window.contains(index) {
                return false;
            }
            let (url, meta) = (self.window.url(), self.window.meta());
            let opened = client.with_local_chunk(url, meta, index, |local, chunk, slot, len| {
                local.open_resident(chunk, slot, len)
            });
            let Some(chunk) = opened else { return false };
            self.resident = Some((index, chunk));
            // Entered in order: a chunk after it that is not resident gets a window ahead of it.
            self.window.passed(index);
        }
        let (_, chunk) = self.resident.as_mut().expect("set above");
        if chunk.read(local, skip, dst) {
            return true;
        }
        self.resident = None;
        false
    }

    /// Hands the rest of the stream to `write`, piece by piece, straight from the fetched chunks
    /// (no copy into a buffer of the caller's): how `memarts cat` streams an object to its output.
    /// A whole chunk that is a local hit and not in the window already is not even read into a
    /// buffer: `write` gets it from its file's mapping, checked (`local_reads.rs`), on this thread.
    /// An error of `write` ends the copy as [`Error::Io`]. Returns the bytes written.
    pub fn copy_to(&mut self, mut write: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<u64> {
        self.window.renew_after_fork();
        let (size, cs, start) = (self.size(), self.window.chunk_size(), self.pos);
        while self.pos < size {
            let index = self.pos / cs;
            let chunk_end = (index * cs + self.window.chunk_len(index) as u64).min(size);
            self.window.note_read(self.pos, chunk_end);
            if self.pos == index * cs && !self.window.contains(index) {
                let (url, meta) = (self.window.url(), self.window.meta());
                let mapped = self.client().with_local_chunk(url, meta, index, |local, chunk, slot, len| {
                    local.write_mapped_chunk(chunk, slot, len, &mut write)
                });
                if let Some(written) = mapped {
                    written?;
                    self.pos = chunk_end;
                    self.window.passed(index);
                    continue;
                }
            }
            let chunk = self.window.enter(index)?;
            let skip = (self.pos - index * cs) as usize;
            write(&chunk[skip..])?;
            self.pos += (chunk.len() - skip) as u64;
        }
        Ok(self.pos - start)
    }

    /// Caps this stream's read-ahead at `max_bytes` (rounded up to whole chunks; 0 switches it off,
    /// so every chunk costs the reader a round trip: the path before streams, for comparisons).
    pub fn set_readahead(&mut self, max_bytes: u64) {
        self.window.set_max_ahead(max_bytes.div_ceil(self.window.chunk_size()));
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
