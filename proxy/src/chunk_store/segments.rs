//! [`Segments`]: a slot's small chunks (up to its `pack_max`, at most [`PACK_MAX`] bytes) packed into segment files
//! (`memarts_disk::segment`: the bytes; `segment_files.rs`: the files), where a file per chunk
//! would cost more than the chunk: space (an inode, a header page, block rounding: 2× and more for
//! 4 KiB objects) and time (a file created, renamed and later unlinked per chunk).
//!
//! - A fill appends the chunk's record to the slot's active segment (one `pwrite`); once the
//!   segment is full, its index is written beside it (it is sealed) and a new one begins. Where
//!   each record lies is kept in the table shims read (`record_places.rs`).
//! - A read is one `pread` of the whole record, checked (head CRC, identity, data CRC): anything
//!   else than the chunk asked for is a miss, and the record is dropped.
//! - An evicted or dropped record is dead: its bytes stay in their segment until the segment is
//!   compacted (its live records copied to the active segment, then the segment removed). The index
//!   keeps [`Segments::reserved`] of the slot's share free of chunks, in proportion to what is
//!   packed: room for dead records (a sixteenth of the live ones, at most two segments, and each
//!   file's last blocks) and for one compaction's copies (a segment, or every live record if they
//!   take less); whenever the dead records take more than their room, the segments with the most
//!   of them are compacted ([`Segments::reclaim`]). So the disk never holds more than the
//!   capacity, an eviction costs a compaction only once dead records add up, and a slot that packs
//!   nothing (its chunks are all large) keeps nothing back. Readers that are reading from a segment meanwhile
//!   keep their open file, whose bytes do not change.
//! - At start, the slot's records are those its segments' indexes list (the unsealed segment's read
//!   from its records' heads, cut at the first whose head fails its check or that the file does not
//!   hold whole: a torn append; a record damaged in the middle is caught when read) that the slot
//!   owns.
//!   After a restart with another number of slots, each slot copies the records it now owns from
//!   the segments the other slots wrote before ([`Segments::adopt`]); none compacts until all have.
//!
//! - Where each record is, is published for the shims of the fleet's uid (`record_places.rs`,
//!   once [`Segments::publish_at`] set it up): an entry once the record is written, moved with it
//!   by a compaction (`segment_compaction.rs`) before its old segment goes, withdrawn when it is
//!   dropped and before its segment file is unlinked.
//!
//! One writer per directory: the slot holds the directory's lock (`segment_files::lock`); a process
//! that cannot take it (an embedded engine beside a fleet) keeps its chunks as files.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use memarts_disk::segment::{self, IndexEntry, INDEX_ENTRY, SEGMENT_HEADER};

use super::record_places::{Loc, RecordPlaces};
use super::segment_files as files;

/// The most a slot may be told to pack (`pack_max`): packed chunks are sent inline, never passed
/// as a file. (Below 32 KiB a file's header page and block rounding cost 12% and more.)
pub const PACK_MAX: u64 = crate::engine::INLINE_MAX;
/// What a slot packs unless told otherwise: chunks of up to 32 KiB, which as files would take
/// 12% more room and more (a 4 KiB one, twice its size).
pub const DEFAULT_PACK_MAX: u64 = 32 << 10;
// Shims look for chunks up to this size in the packed table.
const _: () = assert!(PACK_MAX <= memarts_disk::packed_table::PACKED_MAX);
/// The largest and smallest segment: 1/32 of the slot's share of the capacity within these.
const MAX_SEGMENT: u64 = 64 << 20;
const MIN_SEGMENT: u64 = 128 << 10;
/// Dead records a slot keeps before compacting: this fraction of its live records ...
const DEAD_FRACTION: u64 = 16;
/// ... and at most this many segments' worth (a sixteenth of its share).
const DEAD_SEGMENTS: u64 = 2;

/// The file system's allocation unit, in which files take room.
const BLOCK: u64 = 4096;

/// Bytes a record of `len` takes on disk, its index entry included.
fn taken(len: u32) -> u64 {
    u64::from(len) + INDEX_ENTRY as u64
}

struct Seg {
    file: Arc<File>,
    /// Where the next record goes (the active segment), or the file's length.
    end: u64,
    /// Bytes of the segment's live records ([`taken`]).
    live: u64,
    /// The records appended, while it is the active segment (its index when it is sealed).
    appended: Option<Vec<IndexEntry>>,
}

impl Seg {
    /// Bytes the segment takes on disk, in whole blocks: its file (header and records, dead or
    /// alive) and its index.
    fn size(&self, records: u64) -> u64 {
        self.end.next_multiple_of(BLOCK) + (20 + records * INDEX_ENTRY as u64).next_multiple_of(BLOCK)
    }
}

struct State {
    /// Where each record is (`record_places.rs`).
    locs: RecordPlaces,
    segs: BTreeMap<u32, Seg>,
    /// Records per segment, dead or alive (for its size).
    counts: HashMap<u32, u64>,
    active: Option<u32>,
    next_seq: u32,
    segment_bytes: u64,
    /// Bytes of every segment's live records.
    live: u64,
    /// [`State::reserve`], kept current for the chunk index ([`Segments::reserve_gauge`]).
    reserve: Arc<AtomicU64>,
}

impl State {
    /// Room for dead records before a compaction: a sixteenth of the live records (at most two
    /// segments), and the last blocks of every file, which no compaction frees.
    fn dead_room(&self) -> u64 {
        (self.live / DEAD_FRACTION).min(DEAD_SEGMENTS * self.segment_bytes)
            + 2 * BLOCK * self.segs.len() as u64
    }

    /// What the index leaves free for the segments beyond their live records: room for dead
    /// records, and for one compaction's copies (a segment's live records at most); 0 without a
    /// segment.
    fn reserve(&self) -> u64 {
        match self.segs.is_empty() {
            true => 0,
            false => self.dead_room() + self.live.min(self.segment_bytes),
        }
    }

    /// Live records or segments changed: the index is told what to leave free now.
    fn changed(&self) {
        self.reserve.store(self.reserve(), Ordering::Relaxed);
    }

    /// `bytes` of live records were added to segment `seq`.
    fn add_live(&mut self, seq: u32, bytes: u64) {
        if let Some(seg) = self.segs.get_mut(&seq) {
            seg.live += bytes;
            self.live += bytes;
        }
        self.changed();
    }

    fn dead_of(&self, seq: u32) -> u64 {
        let seg = &self.segs[&seq];
        seg.size(self.counts.get(&seq).copied().unwrap_or(0)).saturating_sub(seg.live)
    }

    fn kill(&mut self, loc: Loc) {
        if let Some(seg) = self.segs.get_mut(&loc.seq) {
            let bytes = taken(loc.len).min(seg.live);
            seg.live -= bytes;
            self.live -= bytes;
        }
        self.changed();
    }

    /// Chunk `id`'s record is at `loc` (its bytes written): the one it replaces is dead, and the
    /// shims are told the new place.
    fn place(&mut self, id: u128, loc: Loc) {
        if let Some(old) = self.locs.insert(id, loc) {
            self.kill(old);
        }
    }

    /// Drops chunk `id`'s record (dead from now on), its entry withdrawn first; where it was.
    fn unplace(&mut self, id: u128) -> Option<Loc> {
        let loc = self.locs.remove(id)?;
        self.kill(loc);
        Some(loc)
    }
}

/// A slot's packed chunks; see the module docs.
pub struct Segments {
    /// `v1/segments`, and the slot's own directory in it.
    root: PathBuf,
    dir: PathBuf,
    slot: u32,
    slots: u32,
    _lock: nix::fcntl::Flock<File>,
    state: Mutex<State>,
    /// Every slot of the fleet took its chunks from the others' segments ([`Segments::adopt`]):
    /// what a segment holds of other slots' chunks is dead from then on.
    settled: AtomicBool,
}

/// A packed chunk read and checked.
pub struct Packed {
    pub data: Vec<u8>,
    pub crc32c: u32,
    pub flags: u16,
}

impl Segments {
    /// The segments of `slot` under `segments` (`v1/segments`), loaded: the records the slot
    /// `owns` (by id) are indexed, the others are dead. `None` if another process writes them.
    /// Blocking.
    pub fn open(
        segments: &Path,
        slot: u32,
        slots: u32,
        owns: impl Fn(u128) -> bool,
    ) -> io::Result<Option<Segments>> {
        let dir = files::slot_dir(segments, slot)?;
        let Some(lock) = files::lock(&dir)? else { return Ok(None) };
        let loaded = files::load(&dir, true, u32::MAX)?;
        let records = loaded.iter().map(|(_, _, entries)| entries.len()).sum();
        let (mut owned, mut segs, mut counts, mut next_seq) =
            (Vec::with_capacity(records), BTreeMap::new(), HashMap::new(), 0);
        for (seq, file, entries) in loaded {
            let end = file.metadata()?.len();
            segs.insert(seq, Seg { file: Arc::new(file), end, live: 0, appended: None });
            counts.insert(seq, entries.len() as u64);
            next_seq = seq.saturating_add(1);
            let records = entries.into_iter().filter(|e| owns(e.id));
            owned.extend(records.map(|e| (e.id, Loc { seq, offset: e.offset, len: e.record_len })));
        }
        // A chunk written more than once is where its last record is (the others are dead): the
        // records, last first, sorted stably by id keep that one first of its id. In the table's
        // order of places too, so that it is filled from start to end.
        owned.reverse();
        owned.sort_by_key(|&(id, _)| (id as u64, (id >> 64) as u64));
        owned.dedup_by_key(|(id, _)| *id);
        let mut live = 0;
        for &(_, loc) in &owned {
            if let Some(seg) = segs.get_mut(&loc.seq) {
                seg.live += taken(loc.len);
                live += taken(loc.len);
            }
        }
        let state = State {
            locs: RecordPlaces::filled(owned)?,
            segs,
            counts,
            active: None,
            next_seq,
            segment_bytes: MAX_SEGMENT,
            live,
            reserve: Arc::new(AtomicU64::new(0)),
        };
        state.changed();
        // The segments from here on hold this fleet's chunks only; those before, if the fleet had
        // another size, are read by the other slots for the chunks they now own.
        if files::since(&dir).is_none_or(|(n, _)| n != slots) {
            files::set_since(&dir, slots, state.next_seq)?;
        }
        Ok(Some(Segments {
            root: segments.to_path_buf(),
            dir,
            slot,
            slots,
            _lock: lock,
            state: Mutex::new(state),
            settled: AtomicBool::new(false),
        }))
    }

    /// Takes the chunks this slot `owns` from the other slots' segments written by a fleet of
    /// another size (those a slot wrote as one of this fleet hold only its own chunks: not read):
    /// each record read, checked and appended here. Then says so (`segment_files::set_adopted`).
    /// Returns how many it took. Blocking.
    pub fn adopt(&self, owns: impl Fn(u128) -> bool) -> io::Result<u64> {
        let mut taken = 0;
        for (n, dir) in files::slot_dirs(&self.root) {
            let old_below = match files::since(&dir) {
                Some((slots, seq)) if slots == self.slots => seq,
                _ => u32::MAX,
            };
            if n == self.slot || old_below == 0 {
                continue;
            }
            for (_, file, entries) in files::load(&dir, false, old_below)? {
                for e in entries.into_iter().filter(|e| owns(e.id) && !self.contains(e.id)) {
                    let mut bytes = vec![0u8; e.record_len as usize];
                    if file.read_exact_at(&mut bytes, u64::from(e.offset)).is_err() {
                        continue;
                    }
                    let Ok((head, _)) = segment::check_record(&bytes, None) else { continue };
                    let key = memarts_disk::chunk_file::ChunkKey::decode_identity(head.identity);
                    if key.is_none_or(|k| k.id().0 != e.id) {
                        continue;
                    }
                    let mut st = self.state();
                    if !st.locs.contains(e.id) {
                        self.append(&mut st, e.id, &bytes, false)?;
                        taken += 1;
                    }
                }
            }
        }
        files::set_adopted(&self.dir, self.slots)?;
        Ok(taken)
    }

    /// Whether every slot of the fleet took its chunks from the others' segments (then the
    /// directories of slots the fleet no longer has go, by slot 0).
    fn settled(&self) -> bool {
        if self.settled.load(Ordering::Relaxed) {
            return true;
        }
        let all = (0..self.slots).all(|n| files::adopted(&self.root.join(n.to_string())) == Some(self.slots));
        if all {
            self.settled.store(true, Ordering::Relaxed);
            if self.slot == 0 {
                files::remove_orphans(&self.root, self.slots);
            }
        }
        all
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Segments of 1/32 of the slot's `share` of the capacity (within 128 KiB and 64 MiB), so that
    /// one compaction moves a small part of it, and the room kept for one takes little.
    pub fn set_share(&self, share: u64) {
        let mut st = self.state();
        st.segment_bytes = (share / 32).clamp(MIN_SEGMENT, MAX_SEGMENT);
        st.changed();
    }

    pub fn contains(&self, id: u128) -> bool {
        self.state().locs.contains(id)
    }

    /// Bytes of the slot's share the index leaves to the segments beyond their live records, now
    /// (see the module docs).
    pub fn reserved(&self) -> u64 {
        self.state().reserve()
    }

    /// [`Segments::reserved`], kept current as records come and go, for the chunk index to read
    /// without taking the segments' lock.
    pub fn reserve_gauge(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.state().reserve)
    }

    /// Bytes a record of this identity and data takes on disk ([`Segments::put`]'s answer).
    pub fn on_disk_len(identity_len: usize, data_len: u64) -> u64 {
        taken(segment::record_len(identity_len, data_len as usize) as u32)
    }

    /// Appends the chunk `id` (its identity encoding, data and the data's CRC32C); returns the
    /// bytes it takes. A record it replaces is dead. Blocking.
    pub fn put(
        &self,
        id: u128,
        identity: &[u8],
        data: &[u8],
        crc32c: u32,
        flags: u16,
        durable: bool,
    ) -> io::Result<u64> {
        let head = segment::encode_head(identity, data.len() as u32, crc32c, flags)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut record = head;
        record.extend_from_slice(data);
        record.resize(record.len() + segment::padding(identity.len(), data.len()), 0);
        let mut st = self.state();
        let loc = self.append(&mut st, id, &record, durable)?;
        Ok(taken(loc.len))
    }

    /// Appends `record` (of chunk `id`) to the active segment, sealing it first if it is full.
    fn append(&self, st: &mut State, id: u128, record: &[u8], durable: bool) -> io::Result<Loc> {
        let len = record.len() as u64;
        let seq = match st.active {
            Some(seq) if st.segs[&seq].end + len <= st.segment_bytes.max(SEGMENT_HEADER + len) => seq,
            active => {
                if let Some(full) = active {
                    self.seal(st, full);
                }
                self.start_segment(st)?
            }
        };
        let seg = st.segs.get_mut(&seq).expect("the active segment is listed");
        let offset = seg.end;
        if let Err(e) = seg.file.write_all_at(record, offset).and_then(|()| {
            if durable {
                seg.file.sync_data()
            } else {
                Ok(())
            }
        }) {
            // Whatever part was written is cut off: the next record starts where this one did.
            let _ = seg.file.set_len(offset);
            return Err(e);
        }
        let loc = Loc { seq, offset: offset as u32, len: len as u32 };
        seg.end += len;
        if let Some(appended) = seg.appended.as_mut() {
            appended.push(IndexEntry { id, offset: loc.offset, record_len: loc.len });
        }
        st.add_live(seq, taken(loc.len));
        *st.counts.entry(seq).or_insert(0) += 1;
        // Its bytes are in the file: shims may read it there from now on.
        st.place(id, loc);
        Ok(loc)
    }

    fn start_segment(&self, st: &mut State) -> io::Result<u32> {
        let seq = st.next_seq;
        let file = files::open_segment(&files::segment_path(&self.dir, seq), true, true)?;
        file.write_all_at(&segment::segment_header(u64::from(seq)), 0)?;
        st.next_seq = seq.checked_add(1).ok_or_else(|| io::Error::other("segment numbers exhausted"))?;
        st.segs.insert(
            seq,
            Seg { file: Arc::new(file), end: SEGMENT_HEADER, live: 0, appended: Some(Vec::new()) },
        );
        st.active = Some(seq);
        st.changed();
        Ok(seq)
    }

    /// Writes the index of the active segment `seq` (its live records) and ends its appends: the
    /// file is reopened read-only, so that no writable descriptor keeps the blocks the file system
    /// allocated ahead of its end (ext4 frees them when the last one closes).
    fn seal(&self, st: &mut State, seq: u32) {
        st.active = None;
        let path = files::segment_path(&self.dir, seq);
        if let (Some(seg), Ok(file)) = (st.segs.get_mut(&seq), files::open_segment(&path, false, false)) {
            seg.file = Arc::new(file);
        }
        let appended = st.segs.get_mut(&seq).and_then(|s| s.appended.take()).unwrap_or_default();
        let live: Vec<IndexEntry> = appended
            .into_iter()
            .filter(|e| st.locs.get(e.id) == Some(Loc { seq, offset: e.offset, len: e.record_len }))
            .collect();
        if let Err(e) = files::write_index(&self.dir, seq, &live) {
            // A restart reads the segment's records instead.
            tracing::warn!(seq, "could not write a segment's index: {e}");
        }
    }

    /// The chunk `id` read and checked against `identity`: `Ok(None)` if it is not packed here,
    /// `Err` (and the record dropped) if what is there fails a check. Blocking.
    pub fn read(&self, id: u128, identity: &[u8]) -> io::Result<Option<Result<Packed, segment::Invalid>>> {
        let Some((file, loc)) = self.find(id) else { return Ok(None) };
        let mut bytes = vec![0u8; loc.len as usize];
        let checked = match file.read_exact_at(&mut bytes, u64::from(loc.offset)) {
            Ok(()) => segment::check_record(&bytes, Some(identity))
                .map(|(head, _)| (head.data_offset(), head.data_len, head.data_crc32c, head.flags)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(segment::Invalid::Truncated { needed: loc.len as usize, have: 0 })
            }
            Err(e) => return Err(e),
        };
        match checked {
            Ok((start, len, crc32c, flags)) => {
                bytes.truncate(start + len as usize);
                bytes.drain(..start);
                Ok(Some(Ok(Packed { data: bytes, crc32c, flags })))
            }
            Err(invalid) => {
                self.remove_at(id, loc);
                Ok(Some(Err(invalid)))
            }
        }
    }

    fn find(&self, id: u128) -> Option<(Arc<File>, Loc)> {
        let st = self.state();
        let loc = st.locs.get(id)?;
        Some((Arc::clone(&st.segs.get(&loc.seq)?.file), loc))
    }

    fn remove_at(&self, id: u128, loc: Loc) {
        let mut st = self.state();
        if st.locs.get(id) == Some(loc) {
            st.unplace(id);
        }
    }

    /// Drops the chunk `id` (its record is dead; [`Segments::reclaim`] frees its room); false if
    /// it is not packed here.
    pub fn remove(&self, id: u128) -> bool {
        self.state().unplace(id).is_some()
    }

    /// Publishes where every record is in a new table at `path` (`record_places.rs`), kept in
    /// step from now on, for shims to read packed chunks with no round trip. Blocking.
    pub fn publish_at(&self, path: PathBuf) -> io::Result<()> {
        self.state().locs.publish_at(path)
    }

    /// Every packed chunk: its id, the bytes it takes and when its segment was last written.
    pub fn chunks(&self) -> Vec<(u128, u64, SystemTime)> {
        let st = self.state();
        let written: HashMap<u32, SystemTime> = st
            .segs
            .iter()
            .map(|(&seq, s)| {
                (seq, s.file.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH))
            })
            .collect();
        let all = st.locs.all().into_iter();
        all.filter_map(|(id, l)| Some((id, taken(l.len), *written.get(&l.seq)?))).collect()
    }
}

#[path = "segment_compaction.rs"]
mod compaction;

#[cfg(test)]
#[path = "segments_tests.rs"]
mod tests;
