//! Direct hits: a warm chunk read straight from its file, with no round trip to a proxy.
//!
//! A chunk file's name is a pure function of (object, ETag, chunk size, index), so a client that
//! knows an object's ETag can open its chunks itself. The ETag (with the size) comes from the
//! metadata table the chunk-0 slot publishes (`memarts_protocol::meta_table`), trusted as the slot
//! trusts it: for the fleet's metadata TTL after it was verified with the origin. Every promise of
//! the proxy path holds:
//! - every byte is checked: the header must be the chunk's own (identity bytes and header CRC, as
//!   the proxy checks them) and the data must match the header's CRC32C; a file that fails either
//!   check is never served: the read asks the slot to drop and refetch it (`recheck`), counted;
//! - one read never mixes versions: all its chunks are named with the one ETag it started with;
//! - eviction or a refill racing the read cannot hand it a torn or foreign file: chunk files are
//!   written to a temp file and renamed into place, never changed in place, so an open file is the
//!   whole chunk it was when opened (an eviction only unlinks the name); a missing file is a
//!   fallback to the slot;
//! - other uids never get here: only a client of the fleet's own uid reads chunk files (the cache
//!   dir stays 0700), others go through the proxy as before; and a chunk file of another owner is
//!   never read (`chunk_files.rs`): it is dropped and served by the slot, as a corrupt one is.
//!
//! The reads are reported to the owning slots in batches (`Request::Touched`), so that what is
//! read stays cached and what is not goes, as if the slots had served them; reads of pinned chunks
//! are noted in the pin table instead, where the slot counts them (no request at all).
//!
//! A chunk that goes straight to an output (`memarts cat`: `Direct::write_mapped_chunk`) is not
//! copied into a buffer at all: its file is mapped and locked in memory (`mlock`: the pages checked
//! are the pages written out, none can be dropped and read again from the disk in between),
//! checked (not again if its slot held it pinned from before the file was opened until it was
//! locked here), and handed to the writer from the page cache. memarts never changes a chunk file
//! in place (an eviction unlinks one, which a mapping outlives), and a file shorter than its header
//! says is never mapped past its end. What this does not guard against, unlike a read into a
//! buffer: another process of the cache's own uid writing into a chunk file in place while it is
//! written out (its bytes could get through) or truncating it (the reader dies of SIGBUS); that uid
//! is trusted with the cache as it is with the slots' sockets and credentials. Where memory cannot
//! be locked (`RLIMIT_MEMLOCK`, no `CAP_IPC_LOCK`), the chunk is read into a buffer instead.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use memarts_protocol::chunk_file::{chunks_dir, format, ChunkId};
use memarts_protocol::layout::{meta_table_path, pin_table_path};
use memarts_protocol::meta_table::{url_key, TableFile};
use memarts_protocol::pin_table::{Pin, PinFile, PinTable, Stamp};
use memarts_protocol::{ObjectMeta, ObjectUrl, Touch};

use crate::chunk_files::{ChunkFiles, Opened};
use crate::fill::{assume_filled, pread_exact, preadv_exact, Room};
use crate::per_process::{PerProcess, PerProcessGuard};

/// A table file is checked for replacement (a slot that started again) at most this often.
const RECHECK_TABLE: Duration = Duration::from_secs(1);

/// Reads are reported to the slots once this many are pending...
const TOUCH_BATCH: usize = 256;
/// ... or once the oldest has waited this long (checked at the next read).
const TOUCH_DELAY: Duration = Duration::from_millis(100);

/// Data read and checksummed per step: small enough that the checksum reads it from the CPU cache
/// right after the kernel copied it there, large enough that a small file's data comes with its
/// header in one `preadv`.
const PIECE: usize = 512 << 10;

/// Which chunk: index `index` of the version `etag` of `url`, cut at `chunk_size`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkName<'a> {
    pub url: &'a ObjectUrl,
    pub etag: &'a str,
    pub chunk_size: u64,
    pub index: u64,
}

/// What a direct read of one chunk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Read and checked: the bytes are in the caller's room.
    Served,
    /// No file (not cached, evicted, another node's chunk) or one that cannot be read: ask the slot.
    Absent,
    /// A file that failed its checks: ask the slot to drop and refetch it.
    Corrupt,
    /// Served from a chunk its slot held pinned all through the read: checked when it was pinned,
    /// not again (reported to callers as `Served`).
    Pinned,
}

/// What direct reads did in this process.
#[derive(Debug, Default)]
pub struct DirectCounters {
    /// Chunks served from their files with no request to a proxy.
    pub hits: AtomicU64,
    pub bytes: AtomicU64,
    /// Chunks looked for directly and read through a proxy instead (no file: not cached yet, evicted).
    pub fallbacks: AtomicU64,
    /// Chunk files that failed their checks: never served, refetched by their slot.
    pub corrupt: AtomicU64,
    /// Of the hits, chunks their slot held pinned (locked in memory, checked when pinned) all
    /// through the read, whose CRC32C was therefore not computed again.
    pub pinned: AtomicU64,
}

/// A slot's table as last looked for: mapped, or not there (a fleet without tables: an older build,
/// or a slot that could not make one), and when.
struct Mapped<T> {
    table: Option<Arc<T>>,
    checked: Instant,
}

/// A table file a slot publishes: its metadata, its pins.
trait SlotTable: Sized {
    fn open(path: &Path) -> io::Result<Self>;
    fn superseded(&self) -> bool;
    fn is_current(&self, path: &Path) -> bool;
}

impl SlotTable for TableFile {
    fn open(path: &Path) -> io::Result<Self> {
        TableFile::open(path)
    }
    fn superseded(&self) -> bool {
        self.table().superseded()
    }
    fn is_current(&self, path: &Path) -> bool {
        TableFile::is_current(self, path)
    }
}

impl SlotTable for PinFile {
    fn open(path: &Path) -> io::Result<Self> {
        PinFile::open(path)
    }
    fn superseded(&self) -> bool {
        self.table().superseded()
    }
    fn is_current(&self, path: &Path) -> bool {
        PinFile::is_current(self, path)
    }
}

/// `slot`'s table of kind `T` at `path`, from `tables` (mapped once and mapped again when the slot
/// replaced it: see [`Direct::table`]).
fn mapped<T: SlotTable>(
    tables: &Mutex<Vec<Option<Mapped<T>>>>,
    slot: u32,
    path: impl FnOnce() -> PathBuf,
) -> Option<Arc<T>> {
    let mut tables = tables.lock().unwrap_or_else(|p| p.into_inner());
    let index = slot as usize;
    if tables.len() <= index {
        tables.resize_with(index + 1, || None);
    }
    let entry = &mut tables[index];
    let fresh = |m: &&Mapped<T>| {
        m.checked.elapsed() < RECHECK_TABLE && !m.table.as_ref().is_some_and(|t| t.superseded())
    };
    if let Some(m) = entry.as_ref().filter(fresh) {
        return m.table.clone();
    }
    let path = path();
    let current = entry.as_ref().and_then(|m| m.table.clone()).filter(|t| t.is_current(&path));
    let table = current.or_else(|| T::open(&path).ok().map(Arc::new));
    *entry = Some(Mapped { table: table.clone(), checked: Instant::now() });
    table
}

#[derive(Default)]
struct Pending {
    touches: Vec<(u32, Touch)>,
    since: Option<Instant>,
}

/// The direct-read state of a client.
pub(crate) struct Direct {
    run_dir: PathBuf,
    /// The chunk files, opened only if they are the fleet's (`chunk_files.rs`).
    chunks: ChunkFiles,
    tables: Mutex<Vec<Option<Mapped<TableFile>>>>,
    pins: Mutex<Vec<Option<Mapped<PinFile>>>>,
    /// This process's reads to report (a forked child's parent reports what it read before).
    pending: PerProcess<Pending>,
    /// Set when the pending reads are due to be reported.
    due: AtomicBool,
    pub counters: DirectCounters,
}

#[derive(serde::Deserialize)]
struct FleetFacts {
    cache_dir: PathBuf,
    #[serde(default)]
    passthrough: bool,
    #[serde(default)]
    meta_ttl_secs: f64,
}

impl Direct {
    /// Direct reads of the fleet in `run_dir`, when it caches and this process may read its files:
    /// `None` for a fleet of another uid (`owner`), one that caches nothing, one that trusts no
    /// metadata (a TTL of 0), or one whose `fleet.json` says too little (an older build).
    pub fn new(run_dir: &Path, owner: u32) -> Option<Direct> {
        if owner != nix::unistd::geteuid().as_raw() {
            return None;
        }
        let text = std::fs::read(memarts_protocol::layout::fleet_file(run_dir)).ok()?;
        let facts: FleetFacts = serde_json::from_slice(&text).ok()?;
        if facts.passthrough || facts.meta_ttl_secs <= 0.0 {
            return None;
        }
        Some(Direct {
            run_dir: run_dir.to_path_buf(),
            chunks: ChunkFiles::new(chunks_dir(&facts.cache_dir), owner),
            tables: Mutex::default(),
            pins: Mutex::default(),
            pending: PerProcess::new(),
            due: AtomicBool::new(false),
            counters: DirectCounters::default(),
        })
    }

    /// `slot`'s table, mapped once and mapped again when the slot replaced it: at once when the slot
    /// marked the old one superseded (it grew, or a slot started over a table it left), else at the
    /// next look (at most every [`RECHECK_TABLE`]: a slot that started again after `memarts` removed
    /// the table of its last run, or one of an older build).
    fn table(&self, slot: u32) -> Option<Arc<TableFile>> {
        mapped(&self.tables, slot, || meta_table_path(&self.run_dir, slot))
    }

    /// `slot`'s pin table, mapped as its metadata table is.
    fn pins(&self, slot: u32) -> Option<Arc<PinFile>> {
        mapped(&self.pins, slot, || pin_table_path(&self.run_dir, slot))
    }

    /// The version of `url` (as the slots spell it) that `slot` (the owner of its chunk 0) published,
    /// if it is still within the fleet's metadata TTL.
    pub fn meta(&self, url: &str, slot: u32) -> Option<ObjectMeta> {
        let table = self.table(slot)?;
        let table = table.table();
        let published = table.lookup(url_key(url))?;
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis() as u64;
        // Verified in the future (a clock that stepped back) is not trusted either.
        let age = now.checked_sub(published.verified_ms)?;
        if age >= table.ttl_ms() {
            return None;
        }
        Some(ObjectMeta {
            size: published.size,
            etag: Some(published.etag),
            version: None,
            last_modified_ms: published.last_modified_ms,
        })
    }

    /// Chunk `index` of the version `etag` of `url`, cut at `chunk_size`, read whole into `dst`
    /// (exactly the chunk's length) from its file, and checked; a read served is noted for `slot`,
    /// the chunk's owner (see [`Direct::due`]).
    pub fn read_chunk(
        &self,
        url: &ObjectUrl,
        etag: &str,
        chunk_size: u64,
        index: u64,
        slot: u32,
        dst: &mut Room,
    ) -> Found {
        let (identity, id) = identity_of(url, etag, chunk_size, index);
        let pins = self.pins(slot);
        let pin = pin_of(pins.as_deref(), id);
        let found = match self.chunks.open(ChunkId(id)) {
            Opened::File(file) => check(&file, &identity, dst, pin.as_ref()),
            Opened::Absent => Found::Absent,
            // Not the fleet's: never read, dropped and served by the slot, as a file that failed
            // its checks is.
            Opened::Foreign => Found::Corrupt,
        };
        self.count(found, slot, id, dst.len(), pin.as_ref());
        match found {
            Found::Pinned => Found::Served,
            found => found,
        }
    }

    fn count_hit(&self, len: usize) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Counts what a direct read of chunk `id` found; a read served is noted for its slot: in the
    /// entry of its `pin` when the pin served it (for the slot to count), else in the next report.
    fn count(&self, found: Found, slot: u32, id: u128, len: usize, pin: Option<&(PinTable<'_>, Pin)>) {
        match (found, pin) {
            (Found::Pinned, Some((table, pin))) => {
                table.note_read(pin);
                self.counters.pinned.fetch_add(1, Ordering::Relaxed);
                self.count_hit(len);
            }
            (Found::Served | Found::Pinned, _) => {
                self.count_hit(len);
                self.note(slot, Touch { id, len: len as u64 });
            }
            (Found::Absent, _) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
            }
            (Found::Corrupt, _) => {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Chunk `index` (of `len` bytes) of the version `etag` of `url`, checked and handed to `write`
    /// straight from its file's mapping (see the module docs). `None` when it is not served so:
    /// no such file, memory that cannot be locked, a file of another owner or one that fails its
    /// checks, all of which the caller reads the usual way (which counts them, and has the slot
    /// refetch a corrupt or foreign one).
    pub fn write_mapped_chunk(
        &self,
        chunk: ChunkName<'_>,
        slot: u32,
        len: usize,
        write: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Option<io::Result<()>> {
        let (identity, id) = identity_of(chunk.url, chunk.etag, chunk.chunk_size, chunk.index);
        let pins = self.pins(slot);
        let pin = pin_of(pins.as_deref(), id);
        let file = self.chunks.open(ChunkId(id)).file()?;
        let (map, found) = map_checked(&file, &identity, len, pin.as_ref())?;
        let data_offset = format::data_offset_for(identity.len()) as usize;
        self.count(found, slot, id, len, pin.as_ref());
        Some(write(&map[data_offset..data_offset + len]))
    }

    /// Chunk `index` (of `len` bytes) of the version `etag` of `url`, opened for reads of any part
    /// of it, if its slot holds it pinned: then a part can be read without the rest (whose CRC32C
    /// it would need otherwise). `None` otherwise (the caller reads the chunk whole, checked).
    ///
    /// Its header is not read: the slot checked the header and the data of the file it pinned, and
    /// each read is served only if the file read is that file, unchanged ([`PinnedChunk::read`]).
    pub fn open_pinned(&self, chunk: ChunkName<'_>, slot: u32, len: usize) -> Option<PinnedChunk> {
        let (identity, id) = identity_of(chunk.url, chunk.etag, chunk.chunk_size, chunk.index);
        let pins = self.pins(slot)?;
        let pin = pins.table().lookup(id)?;
        let data_offset = format::data_offset_for(identity.len());
        // The pinned file holds this chunk's header and its `len` bytes of data, nothing more.
        if data_offset.checked_add(len as u64) != Some(pin.stamp.size) {
            return None;
        }
        let file = self.chunks.open(ChunkId(id)).file()?;
        Some(PinnedChunk { file, pins, pin, data_offset, len, slot, id, counted: false })
    }

    fn pending(&self) -> PerProcessGuard<'_, Pending> {
        self.pending.lock()
    }

    fn note(&self, slot: u32, touch: Touch) {
        let mut pending = self.pending();
        pending.touches.push((slot, touch));
        let since = *pending.since.get_or_insert_with(Instant::now);
        if pending.touches.len() >= TOUCH_BATCH || since.elapsed() >= TOUCH_DELAY {
            self.due.store(true, Ordering::Relaxed);
        }
    }

    /// The reads due to be reported, by slot: all of them once a batch is full or its oldest read
    /// has waited long enough (as of the last read), else none.
    pub fn due(&self) -> Vec<(u32, Vec<Touch>)> {
        if !self.due.swap(false, Ordering::Relaxed) {
            return Vec::new();
        }
        self.take_touches()
    }

    /// Every read not yet reported, by slot (for a client going away).
    pub fn take_touches(&self) -> Vec<(u32, Vec<Touch>)> {
        let mut pending = self.pending();
        pending.since = None;
        by_slot(std::mem::take(&mut pending.touches))
    }
}

/// A chunk file open for reads of parts of its data, vouched for by its slot's pin
/// ([`Direct::open_pinned`]): each read is served only if the pin held from before the file was
/// opened until the read was done, and the file is still the one pinned, unchanged
/// ([`pinned_throughout`]), so its bytes came from pages the slot checked and held locked all along.
pub(crate) struct PinnedChunk {
    file: File,
    pins: Arc<PinFile>,
    pin: Pin,
    data_offset: u64,
    len: usize,
    slot: u32,
    id: u128,
    /// Whether a read of it was counted yet (a chunk counts as one direct hit, however many reads).
    counted: bool,
}

impl PinnedChunk {
    /// The chunk's data from `skip`, `dst.len()` bytes of it, read into `dst`; `false` when the pin
    /// no longer vouches for what was read, or the read failed (the caller reads the chunk whole,
    /// checked: what was read into `dst` is to be overwritten).
    pub fn read(&mut self, direct: &Direct, skip: usize, dst: &mut Room) -> bool {
        let fits = skip.checked_add(dst.len()).is_some_and(|end| end <= self.len);
        if !fits || pread_exact(&self.file, dst, self.data_offset + skip as u64).is_err() {
            return false;
        }
        let table = self.pins.table();
        if !pinned_throughout(&self.file, &table, &self.pin) {
            return false;
        }
        if !self.counted {
            self.counted = true;
            direct.count(Found::Pinned, self.slot, self.id, self.len, Some(&(table, self.pin)));
        }
        true
    }
}

/// The identity bytes of a chunk and its id (what names its file).
fn identity_of(url: &ObjectUrl, etag: &str, chunk_size: u64, index: u64) -> (Vec<u8>, u128) {
    let mut identity = Vec::with_capacity(64 + url.bucket.len() + url.key.len() + etag.len());
    memarts_protocol::encode_identity(&mut identity, url, etag, chunk_size, index);
    let id = memarts_protocol::chunk_id_from_identity(url, chunk_size, index, &identity);
    (identity, id)
}

/// Chunk `id`'s entry in a slot's pin table `pins`, if it is pinned (with the table: its header is
/// checked once per read).
fn pin_of(pins: Option<&PinFile>, id: u128) -> Option<(PinTable<'_>, Pin)> {
    let table = pins?.table();
    table.lookup(id).map(|pin| (table, pin))
}

/// The chunk file mapped whole and locked in memory, if it is exactly this chunk's with `len`
/// bytes of data that match its CRC32C (the checks of [`check`], on the mapping), and whether it
/// was served as pinned (`Found::Pinned`) or checked (`Found::Served`).
///
/// With the chunk's `pin` (found before the file was opened), the CRC32C is not computed if, once
/// the mapping is locked, the file is still the one pinned, unchanged, and the pin still holds
/// ([`pinned_throughout`]): then the slot held these very pages locked, as it checked them, from
/// before the file was opened until this process locked them too, so no page could be dropped and
/// read again from the disk in between, and this process's lock keeps them while they are written
/// out.
fn map_checked(
    file: &File,
    identity: &[u8],
    len: usize,
    pin: Option<&(PinTable<'_>, Pin)>,
) -> Option<(memmap2::Mmap, Found)> {
    let data_offset = format::data_offset_for(identity.len());
    let whole = data_offset.checked_add(len as u64)?;
    // Never mapped past the end of the file: a page there would fault (SIGBUS) when read.
    if file.metadata().ok()?.len() < whole {
        return None;
    }
    // SAFETY: chunk files are written whole to a temp file and renamed into place; nothing writes
    // to or truncates a published one (an eviction unlinks it, which the mapping outlives), so the
    // mapped bytes do not change while the map lives. It is read only through `&[u8]`.
    let map = unsafe { memmap2::MmapOptions::new().len(whole as usize).map(file) }.ok()?;
    // Locked: the pages checked below stay the pages the caller writes out.
    map.lock().ok()?;
    let raw = format::decode_raw(&map[..data_offset as usize]).ok()?;
    let data = &map[data_offset as usize..];
    if raw.identity != identity || raw.data_offset != data_offset || raw.data_len != len as u64 {
        return None;
    }
    if let Some((table, pin)) = pin {
        if pinned_throughout(file, table, pin) {
            return Some((map, Found::Pinned));
        }
    }
    (memarts_protocol::crc32c(data) == raw.data_crc32c).then_some((map, Found::Served))
}

fn by_slot(touches: Vec<(u32, Touch)>) -> Vec<(u32, Vec<Touch>)> {
    let mut out: std::collections::BTreeMap<u32, Vec<Touch>> = Default::default();
    for (slot, t) in touches {
        out.entry(slot).or_default().push(t);
    }
    out.into_iter().collect()
}

/// Reads the chunk's header and data from `file` into `dst` and checks both: the header must be this
/// chunk's (identity and header CRC) and claim exactly `dst.len()` bytes, the data must match its
/// CRC32C. The header and the first piece of data come in one `preadv`. With the chunk's `pin` (as
/// found before the file was opened), the data's CRC32C is not computed if the pin held all
/// through the read and the file read is the one pinned, unchanged ([`pinned_throughout`]).
fn check(file: &File, identity: &[u8], dst: &mut Room, pin: Option<&(PinTable<'_>, Pin)>) -> Found {
    let data_offset = format::data_offset_for(identity.len());
    // The usual header fits one page: on the stack, not zeroed.
    let mut page = [std::mem::MaybeUninit::<u8>::uninit(); format::ALIGN as usize];
    let mut long: Vec<u8> = Vec::new();
    let header: &mut Room = if data_offset <= format::ALIGN {
        &mut page[..data_offset as usize]
    } else {
        long.reserve_exact(data_offset as usize);
        &mut long.spare_capacity_mut()[..data_offset as usize]
    };
    let first = dst.len().min(PIECE);
    let (head, rest) = dst.split_at_mut(first);
    match preadv_exact(file.as_raw_fd(), header, head, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Found::Corrupt,
        Err(_) => return Found::Absent,
    }
    // SAFETY: preadv_exact returned Ok, so every byte of `header` was written.
    let header = unsafe { assume_filled(header) };
    let raw = match format::decode_raw(header) {
        Ok(raw) => raw,
        Err(_) => return Found::Corrupt,
    };
    if raw.identity != identity
        || raw.data_offset != data_offset
        || raw.data_len != (first + rest.len()) as u64
    {
        return Found::Corrupt;
    }
    let mut crc = pin.is_none().then(memarts_protocol::Crc32c::default);
    if let Some(crc) = crc.as_mut() {
        // SAFETY: preadv_exact returned Ok, so every byte of `head` was written.
        crc.update(unsafe { assume_filled(head) });
    }
    let mut at = data_offset + first as u64;
    for piece in rest.chunks_mut(PIECE) {
        match pread_exact(file, piece, at) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Found::Corrupt,
            Err(_) => return Found::Absent,
        }
        if let Some(crc) = crc.as_mut() {
            // SAFETY: pread_exact returned Ok, so every byte of `piece` was written.
            crc.update(unsafe { assume_filled(piece) });
        }
        at += piece.len() as u64;
    }
    let sum = match (crc, pin) {
        (Some(crc), _) => crc.finish(),
        (None, Some((table, pin))) if pinned_throughout(file, table, pin) => return Found::Pinned,
        // SAFETY: every piece of `dst` was read into above (each read returned Ok).
        (None, _) => memarts_protocol::crc32c(unsafe { assume_filled(dst) }),
    };
    if sum != raw.data_crc32c {
        return Found::Corrupt;
    }
    Found::Served
}

/// Whether the bytes just read from `file` came from pages its slot held locked and checked all
/// through the read: the file is the one pinned, unchanged since (inode, size, mtime and ctime as
/// noted: any write changes the last two), and the pin, found before the read, still holds (the
/// slot withdraws an entry before it unlocks, and a dead slot's pins show as dead at once).
fn pinned_throughout(file: &File, table: &PinTable<'_>, pin: &Pin) -> bool {
    file.metadata().is_ok_and(|m| Stamp::of(&m) == pin.stamp) && table.held(pin)
}

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
