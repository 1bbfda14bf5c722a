//! Local hits: a warm chunk read straight from its file, with no round trip to a proxy.
//!
//! A chunk file's name is a pure function of (object, ETag, chunk size, index), so a client that
//! knows an object's ETag can open its chunks itself. The ETag (with the size) comes from the
//! metadata table the chunk-0 slot publishes (`memarts_disk::meta_table`), trusted as the slot
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
//! The reads are reported to the owning slots in batches (`Request::Touched`, `touch.rs`: sent by
//! this source itself, the rest when it goes or the process ends), so that what is read stays
//! cached and what is not goes, as if the slots had served them; reads of resident chunks are noted
//! in the resident table instead, where the slot counts them (no request at all). This is the first of
//! a client's chunk sources (`sources.rs`).
//!
//! A small chunk its slot packed into a segment file (`memarts_disk::segment`) is read from its
//! record there, found in the slot's packed table and checked as the slot checks it
//! (`packed_reads.rs`), with the same fallbacks and reports.
//!
//! A chunk that goes straight to an output (`memarts cat`: `LocalReads::write_mapped_chunk`) is not
//! copied into a buffer at all: its file is mapped and locked in memory (`mlock`: the pages checked
//! are the pages written out, none can be dropped and read again from the disk in between),
//! checked (not again if its slot held it resident from before the file was opened until it was
//! locked here), and handed to the writer from the page cache. memarts never changes a chunk file
//! in place (an eviction unlinks one, which a mapping outlives), and a file shorter than its header
//! says is never mapped past its end. What this does not guard against, unlike a read into a
//! buffer: another process of the cache's own uid writing into a chunk file in place while it is
//! written out (its bytes could get through) or truncating it (the reader dies of SIGBUS); that uid
//! is trusted with the cache as it is with the slots' sockets and credentials. Where memory cannot
//! be locked (`RLIMIT_MEMLOCK`, no `CAP_IPC_LOCK`), the chunk is read into a buffer instead.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use memarts_disk::chunk_file::{chunks_dir, format, ChunkId};
use memarts_disk::layout::{meta_table_path, resident_table_path};
use memarts_disk::meta_table::{url_key, TableFile};
use memarts_disk::resident_table::{ResidentEntry, ResidentFile, ResidentTable};
use memarts_disk::segment::segments_dir;
use memarts_protocol::{ObjectMeta, ObjectUrl, Touch};

pub(crate) use crate::chunk_check::Found;
use crate::chunk_check::{check, identity_of, map_checked, resident_of, resident_throughout};
use crate::chunk_files::{ChunkFiles, Opened};
use crate::conn::Dialer;
use crate::packed_reads::PackedReads;
use crate::room::{pread_exact, Room};
use crate::slot_tables::{mapped, Mapped};
use crate::touch::ReadReports;

/// Which chunk: index `index` of the version `etag` of `url`, cut at `chunk_size`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkName<'a> {
    pub url: &'a ObjectUrl,
    pub etag: &'a str,
    pub chunk_size: u64,
    pub index: u64,
}

/// What local reads did in this process.
#[derive(Debug, Default)]
pub struct LocalCounters {
    /// Chunks served from their files with no request to a proxy.
    pub hits: AtomicU64,
    pub bytes: AtomicU64,
    /// Chunks looked for directly and read through a proxy instead (no file: not cached yet, evicted).
    pub fallbacks: AtomicU64,
    /// Chunk files that failed their checks: never served, refetched by their slot.
    pub corrupt: AtomicU64,
    /// Of the hits, small chunks read from the segment file their slot packed them into.
    pub packed: AtomicU64,
    /// Of the hits, chunks their slot held resident (locked in memory, checked when resident) all
    /// through the read, whose CRC32C was therefore not computed again.
    pub resident: AtomicU64,
}

/// The local-read state of a client.
pub(crate) struct LocalReads {
    run_dir: PathBuf,
    /// The chunk files, opened only if they are the fleet's (`chunk_files.rs`).
    chunks: ChunkFiles,
    /// The small chunks packed into segment files (`packed_reads.rs`).
    packed: PackedReads,
    tables: Mutex<Vec<Option<Mapped<TableFile>>>>,
    resident: Mutex<Vec<Option<Mapped<ResidentFile>>>>,
    /// The reads to report, sent in batches, the rest when this goes.
    pub(crate) reports: ReadReports,
    pub counters: LocalCounters,
}

impl LocalReads {
    /// Local reads of the fleet `dial` reaches, when it caches and this process may read its
    /// files: `None` for a fleet of another uid, one that caches nothing, one that trusts no
    /// metadata (a TTL of 0), or one whose `fleet.json` says too little (an older build).
    pub fn new(dial: &Arc<Dialer>) -> Option<LocalReads> {
        let (run_dir, owner): (&Path, u32) = (&dial.run_dir, dial.owner);
        if owner != nix::unistd::geteuid().as_raw() {
            return None;
        }
        let facts = crate::FleetFile::read(run_dir).ok()?;
        if facts.passthrough || facts.meta_ttl_secs <= 0.0 {
            return None;
        }
        Some(LocalReads {
            run_dir: run_dir.to_path_buf(),
            chunks: ChunkFiles::new(chunks_dir(facts.cache_dir.as_ref()?), owner),
            packed: PackedReads::new(run_dir.to_path_buf(), segments_dir(facts.cache_dir.as_ref()?), owner),
            tables: Mutex::default(),
            resident: Mutex::default(),
            reports: ReadReports::new(dial.clone()),
            counters: LocalCounters::default(),
        })
    }

    /// `slot`'s table, mapped once and mapped again when the slot replaced it: at once when the slot
    /// marked the old one superseded (it grew, or a slot started over a table it left), else at the
    /// next look (at most every [`RECHECK_TABLE`]: a slot that started again after `memarts` removed
    /// the table of its last run, or one of an older build).
    fn table(&self, slot: u32) -> Option<Arc<TableFile>> {
        mapped(&self.tables, slot, || meta_table_path(&self.run_dir, slot))
    }

    /// `slot`'s resident table, mapped as its metadata table is.
    fn resident(&self, slot: u32) -> Option<Arc<ResidentFile>> {
        mapped(&self.resident, slot, || resident_table_path(&self.run_dir, slot))
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
    /// the chunk's owner, to be reported.
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
        // A small chunk may be packed: looked for in its slot's packed table first (no system
        // call unless it is there); a larger one never is.
        if PackedReads::may_hold(dst.len()) {
            match self.packed.read(slot, id, &identity, dst) {
                Found::Absent => {}
                found => {
                    if found == Found::Served {
                        self.counters.packed.fetch_add(1, Ordering::Relaxed);
                    }
                    self.count(found, slot, id, dst.len(), None);
                    return found;
                }
            }
        }
        let resident = self.resident(slot);
        let entry = resident_of(resident.as_deref(), id);
        let found = match self.chunks.open(ChunkId(id)) {
            Opened::File(file) => check(&file, &identity, dst, entry.as_ref()),
            Opened::Absent => Found::Absent,
            // Not the fleet's: never read, dropped and served by the slot, as a file that failed
            // its checks is.
            Opened::Foreign => Found::Corrupt,
        };
        self.count(found, slot, id, dst.len(), entry.as_ref());
        match found {
            Found::Resident => Found::Served,
            found => found,
        }
    }

    fn count_hit(&self, len: usize) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Counts what a local read of chunk `id` found; a read served is noted for its slot: in the
    /// entry of its `entry` when the resident entry served it (for the slot to count), else in the next report.
    fn count(
        &self,
        found: Found,
        slot: u32,
        id: u128,
        len: usize,
        entry: Option<&(ResidentTable<'_>, ResidentEntry)>,
    ) {
        match (found, entry) {
            (Found::Resident, Some((table, entry))) => {
                table.note_read(entry);
                self.counters.resident.fetch_add(1, Ordering::Relaxed);
                self.count_hit(len);
            }
            (Found::Served | Found::Resident, _) => {
                self.count_hit(len);
                self.reports.note(slot, Touch { id, len: len as u64 });
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
        let resident = self.resident(slot);
        let entry = resident_of(resident.as_deref(), id);
        let file = self.chunks.open(ChunkId(id)).file()?;
        let (map, found) = map_checked(&file, &identity, len, entry.as_ref())?;
        let data_offset = format::data_offset_for(identity.len()) as usize;
        self.count(found, slot, id, len, entry.as_ref());
        Some(write(&map[data_offset..data_offset + len]))
    }

    /// Chunk `index` (of `len` bytes) of the version `etag` of `url`, opened for reads of any part
    /// of it, if its slot holds it resident: then a part can be read without the rest (whose CRC32C
    /// it would need otherwise). `None` otherwise (the caller reads the chunk whole, checked).
    ///
    /// Its header is not read: the slot checked the header and the data of the file it resident, and
    /// each read is served only if the file read is that file, unchanged ([`ResidentChunk::read`]).
    pub fn open_resident(&self, chunk: ChunkName<'_>, slot: u32, len: usize) -> Option<ResidentChunk> {
        let (identity, id) = identity_of(chunk.url, chunk.etag, chunk.chunk_size, chunk.index);
        let resident = self.resident(slot)?;
        let entry = resident.table().lookup(id)?;
        let data_offset = format::data_offset_for(identity.len());
        // The resident file holds this chunk's header and its `len` bytes of data, nothing more.
        if data_offset.checked_add(len as u64) != Some(entry.stamp.size) {
            return None;
        }
        let file = self.chunks.open(ChunkId(id)).file()?;
        Some(ResidentChunk { file, resident, entry, data_offset, len, slot, id, counted: false })
    }
}

/// A chunk file open for reads of parts of its data, vouched for by its slot's resident entry
/// ([`LocalReads::open_resident`]): each read is served only if the resident entry held from before the file was
/// opened until the read was done, and the file is still the one resident, unchanged
/// ([`resident_throughout`]), so its bytes came from pages the slot checked and held locked all along.
pub(crate) struct ResidentChunk {
    file: File,
    resident: Arc<ResidentFile>,
    entry: ResidentEntry,
    data_offset: u64,
    len: usize,
    slot: u32,
    id: u128,
    /// Whether a read of it was counted yet (a chunk counts as one local hit, however many reads).
    counted: bool,
}

impl ResidentChunk {
    /// The chunk's data from `skip`, `dst.len()` bytes of it, read into `dst`; `false` when the resident entry
    /// no longer vouches for what was read, or the read failed (the caller reads the chunk whole,
    /// checked: what was read into `dst` is to be overwritten).
    pub fn read(&mut self, direct: &LocalReads, skip: usize, dst: &mut Room) -> bool {
        let fits = skip.checked_add(dst.len()).is_some_and(|end| end <= self.len);
        if !fits || pread_exact(&self.file, dst, self.data_offset + skip as u64).is_err() {
            return false;
        }
        let table = self.resident.table();
        if !resident_throughout(&self.file, &table, &self.entry) {
            return false;
        }
        if !self.counted {
            self.counted = true;
            direct.count(Found::Resident, self.slot, self.id, self.len, Some(&(table, self.entry)));
        }
        true
    }
}

#[cfg(test)]
#[path = "local_reads_tests.rs"]
mod tests;
