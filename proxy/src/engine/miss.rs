//! The miss path: what a read that missed the cache (or a prefetch) is filled from, as an ordered
//! list of tiers walked by one function inside the fill's single flight, and where the fill then
//! lands. A chunk read and a cold first read (metadata and chunk 0 in one GET, in its own flight
//! because its version is not known until the GET) take the same walk and land the same way.
//!
//! ```text
//! chunk read:        FirstRead → Disk → Staged → [budget] Peers → Origin   → answer, then persist
//! cold first read:   StillCold ───────────────→ [budget] Origin (metadata and chunk 0)
//!                                                                          → persist, then answer
//! prefetch, not kept:                             [budget] Origin   → stage, then answer
//! ```
//!
//! The first tier that answers ends the walk. Only a fill from staging or the origin lands here
//! (a first read landed its chunk 0 already, a peer keeps what it owns); in pass-through, nothing
//! is read from or written to disk. The memory budget is held from the first of `Peers`
//! and `Origin` the walk reaches until the fill has landed, never while waiting for anything else
//! that needs it, so holders cannot wait on each other. Each tier's code is with its state:
//! `FirstRead` and `StillCold` in `first_read.rs` (the zero-fill marks, R3), `Disk` in
//! `chunks.rs`, `Staged` in `staging.rs`, `Peers` in `peers.rs`, `Origin` here.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_protocol::{ChunkRequest, ErrorCode, ObjectMeta, ObjectUrl, WireError};

use super::first_read::ZeroFill;
use super::{Engine, Fetched, ReadBy};
use crate::budget::Held;
use crate::chunk_store::ChunkKey;

/// One place a miss can be filled from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tier {
    /// Chunk 0 from a cold first read of its object in flight (`first_read.rs`).
    FirstRead,
    /// The chunk on disk, written by a flight that ended since the caller's look (`chunks.rs`).
    Disk,
    /// The chunk a prefetch fetched for this read and the cache would not keep (`staging.rs`).
    Staged,
    /// A cold first read whose object is no longer cold: the caller takes the usual way.
    StillCold,
    /// In a cluster, the node that owns the chunk (`peers.rs`).
    Peers,
    /// The origin: a ranged GET of the chunk, or of the metadata with chunk 0.
    Origin,
}

/// A chunk read's tiers.
const CHUNK_READ: &[Tier] = &[Tier::FirstRead, Tier::Disk, Tier::Staged, Tier::Peers, Tier::Origin];
/// A cold first read's tiers.
const COLD_FIRST_READ: &[Tier] = &[Tier::StillCold, Tier::Origin];
/// A prefetch's fetch of a chunk the cache would not keep: it was not cached when it looked.
const TO_STAGING: &[Tier] = &[Tier::Origin];

impl Tier {
    /// Whether the memory budget is held from this tier on: only to hold bytes coming from afar.
    fn holds_budget(self) -> bool {
        matches!(self, Tier::Peers | Tier::Origin)
    }
}

/// What a miss fills.
pub(super) enum Wanted {
    /// A chunk of a known version: its identity and byte range in the object.
    Chunk { key: ChunkKey, range: Range<u64> },
    /// An object's metadata with its chunk 0, version unknown: the first read's flight.
    First { flight: u128 },
}

/// Where a fill goes besides its readers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Landing {
    /// To disk, within the capacity, if the index admits it (`Engine::persist`).
    Persist,
    /// To staging, into the `reserved` bytes (`staging.rs`).
    Stage { reserved: u64 },
}

/// A miss to fill: what, from which tiers, to land where, and for whom.
pub(super) struct Miss {
    pub url: ObjectUrl,
    pub chunk_size: u64,
    pub wanted: Wanted,
    tiers: &'static [Tier],
    landing: Landing,
    pub by: ReadBy,
    /// In a cluster, the request for the node that owns the chunk (`Tier::Peers`); `None`: not
    /// routed (no cluster, a local path, or a read a peer asked for).
    pub peer_req: Option<ChunkRequest>,
    /// Whether this read is a re-read, as the index's read clock knew it before it.
    pub returning: bool,
}

impl Miss {
    /// A read of the chunk `key`, bytes `range` of its object.
    pub fn chunk(url: ObjectUrl, key: ChunkKey, range: Range<u64>, by: ReadBy) -> Miss {
        let chunk_size = key.chunk_size;
        Miss::new(url, chunk_size, Wanted::Chunk { key, range }, CHUNK_READ, by)
    }

    /// A cold first read of `url`: its metadata and chunk 0 in one GET.
    pub fn first(url: ObjectUrl, chunk_size: u64, flight: u128, by: ReadBy) -> Miss {
        Miss::new(url, chunk_size, Wanted::First { flight }, COLD_FIRST_READ, by)
    }

    fn new(url: ObjectUrl, chunk_size: u64, wanted: Wanted, tiers: &'static [Tier], by: ReadBy) -> Miss {
        let (landing, peer_req, returning) = (Landing::Persist, None, false);
        Miss { url, chunk_size, wanted, tiers, landing, by, peer_req, returning }
    }

    /// The same miss for a prefetch, from the origin into staging, in `reserved` bytes.
    pub fn staged(self, reserved: u64) -> Miss {
        Miss { tiers: TO_STAGING, landing: Landing::Stage { reserved }, ..self }
    }

    /// Bytes the fill holds in memory.
    fn len(&self) -> u64 {
        match &self.wanted {
            Wanted::Chunk { range, .. } => range.end - range.start,
            Wanted::First { .. } => self.chunk_size,
        }
    }

    /// The chunk filled with `got` (for a first read, of the version its metadata names).
    fn key_of(&self, got: &Got) -> ChunkKey {
        match &self.wanted {
            Wanted::Chunk { key, .. } => key.clone(),
            Wanted::First { .. } => {
                let etag = got.meta.as_ref().and_then(|m| m.etag.as_deref()).unwrap_or_default();
                ChunkKey::new(&self.url, etag, self.chunk_size, 0)
            }
        }
    }

    /// What its flight's waiters are told was abandoned if its leader dies.
    fn what(&self) -> &'static str {
        match (&self.wanted, &self.landing) {
            (Wanted::Chunk { .. }, Landing::Persist) => "the fetch of this chunk",
            (Wanted::First { .. }, Landing::Persist) => "the first read of this object",
            (Wanted::Chunk { .. }, Landing::Stage { .. }) => "the prefetch of this chunk",
            (Wanted::First { .. }, Landing::Stage { .. }) => "the prefetch of this object",
        }
    }
}

/// The bytes a tier filled a miss with, and the metadata that came with them (a first read's GET).
#[derive(Clone)]
struct Got {
    meta: Option<ObjectMeta>,
    data: Fetched,
}

impl Got {
    fn chunk(data: Fetched) -> Got {
        Got { meta: None, data }
    }
}

/// A tier's answer, and whether this slot lands it (it came from the origin or staging; not from
/// disk, a first read that landed it already, or a peer that keeps it).
struct Found {
    got: Result<Got, WireError>,
    keep: bool,
}

impl Found {
    fn served(got: Result<Fetched, WireError>) -> Found {
        Found { got: got.map(Got::chunk), keep: false }
    }

    fn kept(got: Result<Got, WireError>) -> Found {
        Found { got, keep: true }
    }
}

/// What a fill holds until its flight has ended: the memory budget, a chunk 0 fill's mark.
#[derive(Default)]
struct Holds {
    zero: Option<ZeroFill>,
    budget: Option<Held>,
}

impl Engine {
    /// Fills the chunk `miss` in its single flight (one per chunk id), or joins the one running.
    /// The chunk, and whether this call led the flight.
    pub(super) async fn fill_chunk(self: &Arc<Self>, mut miss: Miss) -> (Result<Fetched, WireError>, bool) {
        let Wanted::Chunk { key, .. } = &miss.wanted else {
            return (Err(WireError::new(ErrorCode::Internal, "a first read is not a chunk's fill")), false);
        };
        let (id, what, this) = (key.id().0, miss.what(), self.clone());
        let start = move |leader: super::flight::Leader<_>| async move {
            let _holds = this.lead(&mut miss, |got| leader.publish(got.map(|g| g.data))).await;
            drop(leader);
        };
        self.flights.join(id, start, || Err(abandoned(what))).await
    }

    /// Fills the cold first read `miss` in its object's first-read flight, or joins the one
    /// running. The metadata and chunk 0, and whether this call led the flight.
    pub(super) async fn fill_first(
        self: &Arc<Self>,
        mut miss: Miss,
    ) -> (Result<(ObjectMeta, Fetched), WireError>, bool) {
        let Wanted::First { flight } = miss.wanted else {
            return (Err(WireError::new(ErrorCode::Internal, "a chunk's fill is not a first read")), false);
        };
        let (what, this) = (miss.what(), self.clone());
        let start = move |leader: super::flight::Leader<_>| async move {
            let answer = |got: Result<Got, WireError>| {
                leader.publish(got.and_then(|g| match g.meta {
                    Some(meta) => Ok((meta, g.data)),
                    None => Err(WireError::new(ErrorCode::Internal, "a first read without metadata")),
                }))
            };
            let _holds = this.lead(&mut miss, answer).await;
            drop(leader);
        };
        self.firsts.join(flight, start, || Err(abandoned(what))).await
    }

    /// The leader's work: walks the tiers, lands what the first that answered found, and answers
    /// the flight's waiters with `answer`. What it holds is dropped once the flight has ended.
    async fn lead(&self, miss: &mut Miss, answer: impl FnOnce(Result<Got, WireError>)) -> Holds {
        let mut holds = Holds::default();
        let found = self.walk(miss, &mut holds).await;
        self.land(miss, found, answer).await;
        holds
    }

    /// The tiers of `miss` in order, up to the first that answers.
    async fn walk(&self, miss: &mut Miss, holds: &mut Holds) -> Found {
        for &tier in miss.tiers {
            if tier.holds_budget() && holds.budget.is_none() {
                holds.budget = Some(self.budget.hold(miss.len()).await);
            }
            if let Some(found) = self.try_tier(tier, miss, holds).await {
                return found;
            }
        }
        // Not reached: every list ends with the origin, which always answers.
        Found::served(Err(WireError::new(ErrorCode::Internal, "no tier filled this miss")))
    }

    /// `tier`'s answer to `miss`, or `None` to go on to the next (including a tier that does not
    /// apply to what is wanted).
    async fn try_tier(&self, tier: Tier, miss: &mut Miss, holds: &mut Holds) -> Option<Found> {
        match (tier, &miss.wanted) {
            (Tier::FirstRead, Wanted::Chunk { key, range }) => {
                let f = self.zero_of_first_read(&miss.url, key, range, &mut holds.zero).await?;
                Some(Found::served(Ok(f)))
            }
            (Tier::Disk, Wanted::Chunk { key, .. }) => {
                Some(Found::served(Ok(self.disk.read_whole(key).await?)))
            }
            (Tier::Staged, Wanted::Chunk { key, .. }) => {
                Some(Found::kept(Ok(Got::chunk(self.staged.take(key.id().0)?))))
            }
            (Tier::Peers, Wanted::Chunk { key, .. }) => {
                let id = key.id().0;
                let req = miss.peer_req.as_ref()?;
                if let Some(read) = self.read_from_peers(req, (id >> 64) as u64).await {
                    return Some(Found::served(read));
                }
                // The turn to fill it came to this node: counted for admission now (`chunks.rs`).
                miss.returning = self.disk.count_read(id, miss.by);
                None
            }
            (Tier::StillCold, Wanted::First { flight }) => {
                let no_longer = self.no_longer_cold(&miss.url, miss.chunk_size, *flight);
                no_longer
                    .then(|| Found::served(Err(WireError::new(ErrorCode::OriginError, "no longer cold"))))
            }
            (Tier::Origin, _) => Some(Found::kept(self.fetch_from_origin(miss).await)),
            _ => None,
        }
    }

    /// Tier `Origin`: the chunk's bytes, or for a first read the metadata and chunk 0 if they can
    /// be cached (`Engine::get_first_cacheable`); counted as bytes from the origin.
    async fn fetch_from_origin(&self, miss: &Miss) -> Result<Got, WireError> {
        let got = match &miss.wanted {
            Wanted::Chunk { key, range } => {
                let fetched = self.origin.get_range(&miss.url, range.clone(), &key.etag).await;
                fetched.map(|data| Got::chunk(Fetched::of(data))).map_err(WireError::from)
            }
            Wanted::First { .. } => {
                let (meta, data) = self.get_first_cacheable(&miss.url, miss.chunk_size).await?;
                Ok(Got { meta: Some(meta), data })
            }
        };
        if let Ok(g) = &got {
            self.stats.bytes_from_origin.fetch_add(g.data.data.len() as u64, Ordering::Relaxed);
        }
        got
    }

    /// Lands what the walk found (a fill kept here: to disk or staging), and answers the waiters
    /// before or after, as the flight needs.
    async fn land(&self, miss: &Miss, found: Found, answer: impl FnOnce(Result<Got, WireError>)) {
        let kept = found.got.as_ref().ok().filter(|_| found.keep).cloned();
        match (&miss.wanted, miss.landing) {
            // Answered at once, then written: a read of the chunk meanwhile joins this flight,
            // which lasts until the write has ended.
            (Wanted::Chunk { key, .. }, Landing::Persist) => {
                answer(found.got);
                if let Some(g) = kept.filter(|_| !self.info.passthrough) {
                    self.disk.persist(key, key.id().0, g.data, miss.returning, None).await;
                }
            }
            // Chunk 0 is on disk before anyone is answered: this fill is not in the chunk
            // flights, so a read of chunk 0 right after must find it there, not fetch it again.
            // Kept or not as any fill is (`persist`: the same admission, the room a prefetch was
            // promised under this first read used up), and counted as a read.
            (Wanted::First { flight }, Landing::Persist) => {
                if let Some(g) = kept {
                    self.put_meta(miss, &g);
                    self.stats.misses.fetch_add(1, Ordering::Relaxed);
                    if !self.info.passthrough {
                        let key = miss.key_of(&g);
                        let returning = self.disk.count_read(key.id().0, miss.by);
                        self.disk.persist(&key, key.id().0, g.data, returning, Some(*flight)).await;
                    }
                }
                answer(found.got);
            }
            // Staged before anyone is answered: a client's read that joined takes it after.
            (_, Landing::Stage { reserved }) => {
                match kept {
                    Some(g) => {
                        self.put_meta(miss, &g);
                        self.staged.fill(miss.key_of(&g).id().0, g.data, reserved);
                    }
                    None => self.staged.cancel(reserved),
                }
                answer(found.got);
            }
        }
    }

    /// The metadata that came with chunk 0, kept (put before the flight ends: a first read that
    /// comes after it finds the object known, and its chunk 0 where this fill landed it).
    fn put_meta(&self, miss: &Miss, got: &Got) {
        if let Some(meta) = &got.meta {
            self.metadata.cache().put(miss.url.to_string(), meta.clone());
        }
    }
}

fn abandoned(what: &str) -> WireError {
    WireError::new(ErrorCode::Internal, format!("{what} was abandoned"))
}
