//! Local hits of packed chunks: a small chunk its slot packed into a segment file
//! (`memarts_disk::segment`) read straight from that file, with no round trip to the slot.
//!
//! The slot publishes where each of its records lies (`memarts_disk::packed_table`, mapped here
//! as the other tables are: `slot_tables.rs`); a read looks the chunk up there, reads the record's
//! head, identity and data in one `preadv` (the data straight into the caller's buffer) and then
//! - takes the read as a miss unless the entry is as it was before the read and its table was not
//!   superseded: the slot may move a record (a compaction) or drop it at any moment, and withdraws
//!   the entry before it unlinks a segment; segment numbers are not reused while a slot runs, and a
//!   slot that starts again makes a new table (marking the old one superseded), after which the
//!   descriptors opened under the old table are not used again;
//! - checks the record as the slot does (`memarts_disk::segment::check_parts`: head CRC, identity
//!   bytes equal to this chunk's, length, data CRC32C): a record that fails is never served, the
//!   read asks the slot to drop and refetch it (`recheck`), counted as a corrupt chunk file is.
//!
//! A missing segment, a short read or a record of another length than the chunk's is a miss: the
//! slot serves it. Segment files are opened without following a symlink and read only if they
//! belong to the fleet's uid (S9); a few stay open per client (the most recent ones, a bounded
//! number), so a warm epoch opens each segment once.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use memarts_disk::layout::packed_table_path;
use memarts_disk::packed_table::{PackedFile, PACKED_MAX};
use memarts_disk::segment::{self, HEAD};

use crate::chunk_check::Found;
use crate::room::{assume_filled, preadv_exact, Room};
use crate::slot_tables::{mapped, Mapped};

/// Segment files kept open per client.
const OPEN_SEGMENTS: usize = 16;

/// An open segment file: of which slot and number, opened while which table was mapped.
struct OpenSegment {
    slot: u32,
    seq: u64,
    table: Arc<PackedFile>,
    file: Arc<File>,
}

/// A client's reads of packed records (see the module docs).
pub(crate) struct PackedReads {
    run_dir: PathBuf,
    /// `<cache dir>/v1/segments`.
    segments: PathBuf,
    /// The fleet's uid, which every segment file read belongs to.
    owner: u32,
    tables: Mutex<Vec<Option<Mapped<PackedFile>>>>,
    open: Mutex<VecDeque<OpenSegment>>,
}

impl PackedReads {
    pub fn new(run_dir: PathBuf, segments: PathBuf, owner: u32) -> PackedReads {
        PackedReads { run_dir, segments, owner, tables: Mutex::default(), open: Mutex::default() }
    }

    /// Whether a chunk of `len` bytes may be packed (larger ones are looked for as files only).
    pub fn may_hold(len: usize) -> bool {
        len as u64 <= PACKED_MAX
    }

    /// Chunk `id` (its identity encoding `identity`), owned by `slot`, read from its record into
    /// `dst` (exactly the chunk's length) and checked: `Served`, `Corrupt` (never served), or
    /// `Absent` (not packed, moved or dropped meanwhile, not readable: ask elsewhere).
    pub fn read(&self, slot: u32, id: u128, identity: &[u8], dst: &mut Room) -> Found {
        let Some(table) = mapped(&self.tables, slot, || packed_table_path(&self.run_dir, slot)) else {
            return Found::Absent;
        };
        let Some(entry) = table.table().lookup(id) else { return Found::Absent };
        let record = entry.record;
        if record.len != segment::record_len(identity.len(), dst.len()) {
            return Found::Absent; // another length than this chunk's: the slot judges it
        }
        let Some(file) = self.segment(slot, record.segment, &table) else { return Found::Absent };
        let mut head = vec![std::mem::MaybeUninit::<u8>::uninit(); HEAD + identity.len()];
        let read = preadv_exact(file.as_raw_fd(), &mut head, dst, record.offset);
        // Moved, dropped or superseded while it was read: what was read may be anything.
        if !table.table().unchanged(&entry) {
            return Found::Absent;
        }
        match read {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Found::Corrupt,
            Err(_) => return Found::Absent,
        }
        // SAFETY: preadv_exact returned Ok, so every byte of `head` and of `dst` was written.
        let (head, data) = unsafe { (assume_filled(&head), assume_filled(dst)) };
        match segment::check_parts(head, data, identity) {
            Ok(_) => Found::Served,
            Err(_) => Found::Corrupt,
        }
    }

    /// Segment `seq` of `slot`, opened under `table` (kept open, a few at a time); `None` when it
    /// is gone or not the fleet's.
    fn segment(&self, slot: u32, seq: u64, table: &Arc<PackedFile>) -> Option<Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        // Descriptors opened under a table the slot has since replaced are not used again.
        open.retain(|s| s.slot != slot || Arc::ptr_eq(&s.table, table));
        if let Some(s) = open.iter().find(|s| s.slot == slot && s.seq == seq) {
            return Some(Arc::clone(&s.file));
        }
        let path = segment::segment_path(&self.segments, slot, seq);
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.uid() != self.owner {
            return None;
        }
        let file = Arc::new(file);
        if open.len() >= OPEN_SEGMENTS {
            open.pop_front();
        }
        open.push_back(OpenSegment { slot, seq, table: Arc::clone(table), file: Arc::clone(&file) });
        Some(file)
    }
}
