//! Where a chunk's bytes come from: a client's ordered list of [`ChunkSource`]s, asked in turn for
//! a chunk until one serves it.
//!
//! - the cache's files read locally, without a proxy (`local_reads.rs`), when this client may read them
//!   (a fleet of its own uid that caches, `MEMARTS_LOCAL_READS` not 0): a warm chunk with no round
//!   trip; its reads are reported to their slots by the source itself (`touch.rs`);
//! - the owning slot, over its socket (`chunk_io.rs`), which always serves or fails.
//!
//! A source that does not have the chunk passes it on ([`Outcome::Absent`]); one whose copy failed
//! its checks passes it on as [`Outcome::Corrupt`], and the sources after it are asked with
//! `recheck` (a slot then drops its copy and refetches it from the origin).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use memarts_protocol::{chunk_owner, ChunkRequest, ObjectMeta, ObjectUrl};

use crate::chunk_io::read_chunk;
use crate::client::{parse, Client};
use crate::config::ShimConfig;
use crate::connections::Connections;
use crate::error::{Error, Result};
use crate::local_reads::{ChunkName, Found, LocalReads};
use crate::room::Room;

/// What one read is about: the object version pinned by its ETag.
pub(crate) struct Target<'a> {
    pub url: &'a ObjectUrl,
    /// The URL as requests spell it, made when the first request is.
    url_text: OnceLock<String>,
    pub etag: &'a str,
    pub size: u64,
    pub chunk_size: u64,
}

impl<'a> Target<'a> {
    pub fn new(url: &'a ObjectUrl, etag: &'a str, size: u64, chunk_size: u64) -> Target<'a> {
        Target { url, url_text: OnceLock::new(), etag, size, chunk_size }
    }

    /// The request for chunk `index` (only when a slot is asked: a local read needs none).
    pub fn request(&self, index: u64) -> ChunkRequest {
        ChunkRequest {
            url: self.url_text.get_or_init(|| self.url.to_string()).clone(),
            etag: self.etag.to_string(),
            object_size: self.size,
            chunk_size: self.chunk_size,
            index,
            recheck: false,
        }
    }
}

/// One chunk asked of a source: chunk `index` of `target`, owned by `slot`, wanted by `deadline`.
#[derive(Clone, Copy)]
pub(crate) struct Wanted<'a> {
    pub target: &'a Target<'a>,
    pub index: u64,
    pub slot: u32,
    pub deadline: Instant,
    /// An earlier source found a copy that failed its checks: a slot is to drop and refetch it.
    pub recheck: bool,
}

/// What a source did with a chunk it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every byte of the room written, checked.
    Served,
    /// Not here: the next source is asked.
    Absent,
    /// A copy that failed its checks (never served): the next source is asked with `recheck`.
    Corrupt,
}

/// A place chunks are read from.
pub(crate) trait ChunkSource: Send + Sync {
    /// The chunk `want` names, whole, into `dst` (exactly its length).
    fn read_chunk(&self, want: &Wanted<'_>, dst: &mut Room) -> Result<Outcome>;
}

impl ChunkSource for LocalReads {
    fn read_chunk(&self, want: &Wanted<'_>, dst: &mut Room) -> Result<Outcome> {
        let t = want.target;
        Ok(match LocalReads::read_chunk(self, t.url, t.etag, t.chunk_size, want.index, want.slot, dst) {
            Found::Served | Found::Resident => Outcome::Served,
            Found::Absent => Outcome::Absent,
            Found::Corrupt => Outcome::Corrupt,
        })
    }
}

/// The owning slot, asked over a kept connection, retried until the deadline.
struct OwningSlot {
    conns: Arc<Connections>,
}

impl ChunkSource for OwningSlot {
    fn read_chunk(&self, want: &Wanted<'_>, dst: &mut Room) -> Result<Outcome> {
        let req = ChunkRequest { recheck: want.recheck, ..want.target.request(want.index) };
        self.conns.with_slot(want.slot, want.deadline, |conn| read_chunk(conn, &req, dst))?;
        Ok(Outcome::Served)
    }
}

/// A client's chunk sources, in the order they are asked.
pub(crate) struct Sources {
    /// The cache's files read locally, when this client may (also first in `order`).
    local: Option<Arc<LocalReads>>,
    order: Vec<Arc<dyn ChunkSource>>,
}

impl Sources {
    pub fn new(cfg: &ShimConfig, conns: &Arc<Connections>) -> Sources {
        let local = if cfg.local_reads { LocalReads::new(conns.dial()).map(Arc::new) } else { None };
        let mut order: Vec<Arc<dyn ChunkSource>> = Vec::new();
        if let Some(local) = &local {
            order.push(local.clone());
        }
        order.push(Arc::new(OwningSlot { conns: conns.clone() }));
        Sources { local, order }
    }

    /// The local source: its published versions, counters, and whole chunks written out or parts
    /// of chunks read straight from their files (streams).
    pub fn local(&self) -> Option<&LocalReads> {
        self.local.as_deref()
    }

    /// The chunk `want` names, whole, into `dst` (exactly its length), from the first source that
    /// serves it.
    pub fn read_chunk(&self, want: Wanted<'_>, dst: &mut Room) -> Result<()> {
        let mut want = want;
        for source in &self.order {
            match source.read_chunk(&want, dst)? {
                Outcome::Served => return Ok(()),
                Outcome::Absent => {}
                Outcome::Corrupt => want.recheck = true,
            }
        }
        Err(Error::Unavailable(format!("no source served chunk {} of {}", want.index, want.target.url)))
    }
}

impl Client {
    /// `f` of the local source, chunk `index` of the version `meta` of `url`, its owning slot and
    /// its length; `None` when there is no local source, the version has no ETag or the chunk is
    /// past the end. For a stream's reads straight from the files (`LocalReads::write_mapped_chunk`,
    /// `LocalReads::open_resident`).
    pub(crate) fn with_local_chunk<T>(
        &self,
        url: &str,
        meta: &ObjectMeta,
        index: u64,
        f: impl FnOnce(&LocalReads, ChunkName<'_>, u32, usize) -> Option<T>,
    ) -> Option<T> {
        let local = self.sources.local()?;
        let etag = meta.etag.as_deref().filter(|e| !e.is_empty())?;
        let cs = self.cfg.chunk_size;
        let start = index.checked_mul(cs).filter(|&s| s < meta.size)?;
        let len = usize::try_from((meta.size - start).min(cs)).ok()?;
        let parsed = parse(url).ok()?;
        let slot = chunk_owner(&parsed, cs, index, self.slots());
        f(local, ChunkName { url: &parsed, etag, chunk_size: cs, index }, slot, len)
    }
}
