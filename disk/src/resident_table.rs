//! The chunks a proxy slot holds locked in memory, checked, for the shims of its fleet's uid (resident
//! chunks).
//!
//! A local read checks every byte it reads against the chunk's CRC32C, because a page of a chunk
//! file may have been dropped from the page cache and read again from the disk since it was last
//! checked, and a disk can return other bytes than it was given. A resident chunk cannot: its slot
//! mapped its file, locked the mapping in memory (`mlock`: those pages are never dropped, so never
//! read again from the disk), checked the data there against its CRC32C, and noted here the file's
//! inode, size and times as they were when it checked. A shim that finds a chunk here reads it as
//! usual and then skips the CRC32C if, after its read,
//! - the file it read has the noted inode, size, mtime and ctime: it is the file checked, and
//!   nothing wrote to it since (any write changes its mtime and ctime);
//! - the entry is as it was before the read: the slot did not let go of the resident entry meanwhile (it
//!   withdraws the entry before it unlocks anything);
//! - the slot is alive: its resident chunks die with it (the kernel unlocks a dead process's memory), and
//!   the table says so at once, with no help from the slot ([`OwnerLock`]).
//!
//! Otherwise the shim checks the CRC32C as for any other chunk.
//!
//! A read of a resident chunk is noted in its entry ([`ResidentTable::note_read`]: one atomic add to a
//! word of its own), not reported to the slot in a request: the slot takes the counts now and then
//! ([`ResidentTable::take_reads`]) and counts them for its eviction as the reads they were. A warm
//! epoch read from resident chunks thus costs the slots no request, no wake-up and no CPU at all.
//!
//! One file per slot (`<run dir>/resident chunks-<slot>.table`, 0600), mapped shared; the slot is its only
//! writer but for the read counts, which readers add to. Entries are seqlocked as in `meta_table`
//! (`crate::seq_table`); the read count is outside what the sequence number guards.
//!
//! Layout (words of 8 bytes in the machine's byte order: the table never leaves its machine):
//!
//! ```text
//! word      field
//! 0         magic b"MAPINTB1"
//! 1         layout version = 2
//! 2         capacity: entries
//! 3         superseded: 1 once the slot put a newer table in this one's place, else 0
//! 4..8      reserved, 0
//! 8..16     the owner lock: a process-shared robust mutex (glibc's pthread_mutex_t) the slot holds
//!           for as long as it lives; its first 4 bytes are the futex word: the holder's thread id,
//!           with FUTEX_OWNER_DIED (0x4000_0000) set by the kernel when the holder exits
//! 16 + 8i   entry i, 8 words:
//!   +0        seq: 0 never written; odd while being written; even once written
//!   +1, +2    chunk id (low, high); both 0 for an entry withdrawn
//!   +3        the file's inode
//!   +4        the file's size in bytes
//!   +5        its mtime, ns since the Unix epoch
//!   +6        its ctime, ns since the Unix epoch
//!   +7        reads: how many reads of the resident entry readers noted since the slot last took them
//! ```

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::seq_table::{BadHeader, SeqTable, Shape};
use crate::shared_file::SharedWords;

/// Word 0 of every resident table.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MAPINTB1");
/// The layout this code reads and writes (2: two windows of places, any capacity).
pub const VERSION: u64 = 2;
/// Words before the first entry.
pub const HEADER_WORDS: usize = 16;
/// Words per entry.
pub const ENTRY_WORDS: usize = 8;
/// Places of each of an entry's two windows (`crate::seq_table`). Entries never move between
/// them: readers add to an entry's read count, which a move could carry to another chunk.
pub const PROBES: usize = 8;

const OWNER: usize = 8;
const OWNER_WORDS: usize = 8;
// Entry words after the chunk id (words 1 and 2, `crate::seq_table`).
const INO: usize = 3;
const SIZE: usize = 4;
const MTIME: usize = 5;
const CTIME: usize = 6;
const READS: usize = 7;

/// The kernel's mark on a robust futex whose holder exited (`linux/futex.h`).
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The holder's thread id in a robust futex word.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// Bytes of a table of `capacity` entries.
pub fn table_len(capacity: usize) -> usize {
    (HEADER_WORDS + capacity * ENTRY_WORDS) * 8
}

static SHAPE: Shape = Shape {
    magic: MAGIC,
    version: VERSION,
    header_words: HEADER_WORDS,
    entry_words: ENTRY_WORDS,
    superseded: 3,
    probes: PROBES,
    moves: false,
};

impl From<BadHeader> for ResidentTableError {
    fn from(bad: BadHeader) -> Self {
        match bad {
            BadHeader::NotATable => ResidentTableError::NotATable,
            BadHeader::BadCapacity(c) => ResidentTableError::BadCapacity(c),
        }
    }
}

/// What identifies a chunk file as it was when its slot checked it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec()),
            ctime_ns: meta.ctime().saturating_mul(1_000_000_000).saturating_add(meta.ctime_nsec()),
        }
    }
}

/// A resident entry as a reader found it: the file it vouches for, and where and at what sequence number the
/// entry was, to tell afterwards whether it held throughout ([`ResidentTable::held`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResidentEntry {
    pub stamp: Stamp,
    place: usize,
    seq: u64,
}

/// Why words cannot be used as a resident table.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResidentTableError {
    #[error("not a resident table (bad magic or layout version)")]
    NotATable,
    #[error("the resident table's capacity {0} does not fit its file")]
    BadCapacity(u64),
}

/// A resident table over mapped words (see the module docs). Reading is safe from any number of threads
/// and processes; [`ResidentTable::insert`] and [`ResidentTable::withdraw`] need a single writer at a time.
pub struct ResidentTable<'a> {
    table: SeqTable<'a>,
}

impl<'a> ResidentTable<'a> {
    /// Writes a header into `words`, all zero (a new file), for as many entries as fit. The owner lock is left for [`ResidentFile::create`] to set up.
    pub fn init(words: &'a [AtomicU64]) -> Result<ResidentTable<'a>, ResidentTableError> {
        Ok(ResidentTable { table: SeqTable::init(words, &SHAPE, |_| {})? })
    }

    /// Opens the table in `words`, checking its header.
    pub fn open(words: &'a [AtomicU64]) -> Result<ResidentTable<'a>, ResidentTableError> {
        Ok(ResidentTable { table: SeqTable::open(words, &SHAPE)? })
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Whether the slot that writes this table is alive: its owner lock is held, by a thread that
    /// has not exited. A table whose lock was never taken (a slot that could not, or not yet) has no
    /// living owner either.
    pub fn owner_alive(&self) -> bool {
        let word = self.table.header()[OWNER].load(Ordering::Acquire);
        // The futex word is the first 4 bytes of the lock.
        let futex = if cfg!(target_endian = "little") { word as u32 } else { (word >> 32) as u32 };
        futex & FUTEX_TID_MASK != 0 && futex & FUTEX_OWNER_DIED == 0
    }

    /// Tells the readers that a newer table is in this one's place.
    pub fn mark_superseded(&self) {
        self.table.mark_superseded();
    }

    pub fn superseded(&self) -> bool {
        self.table.superseded()
    }

    /// The resident entry of chunk `id`, if its slot holds one (alive or not: see [`ResidentTable::held`]).
    pub fn lookup(&self, id: u128) -> Option<ResidentEntry> {
        let found = self.table.find(id, read_stamp, Some)?;
        Some(ResidentEntry { stamp: found.fields, place: found.place, seq: found.seq })
    }

    /// Whether `entry` still holds: its entry unchanged since it was found, and its slot alive. A
    /// read made between finding a resident entry and this answer being true read pages that were locked in
    /// memory all along.
    pub fn held(&self, entry: &ResidentEntry) -> bool {
        self.table.unchanged(entry.place, entry.seq) && self.owner_alive()
    }

    /// Every chunk resident now and its file's stamp (a scan of the whole table: for tests and tools).
    pub fn entries(&self) -> Vec<(u128, Stamp)> {
        self.table.entries(read_stamp, Some)
    }

    /// Notes chunk `id` as resident, its file as `stamp` says, with no reads noted yet; returns the
    /// place it took (for [`ResidentTable::take_reads`]), `None` when every place it may take is
    /// another's (it is not resident). Single writer.
    pub fn insert(&self, id: u128, stamp: Stamp) -> Option<usize> {
        let (place, _) = self.table.claim(id, None)?;
        self.table.write(place, id, |e| {
            e[INO].store(stamp.ino, Ordering::Relaxed);
            e[SIZE].store(stamp.size, Ordering::Relaxed);
            e[MTIME].store(stamp.mtime_ns as u64, Ordering::Relaxed);
            e[CTIME].store(stamp.ctime_ns as u64, Ordering::Relaxed);
            e[READS].store(0, Ordering::Relaxed);
        });
        Some(place)
    }

    /// Notes a read of `entry` (one that held all through: [`ResidentTable::held`]) for its slot to count.
    /// Needs the table mapped writable, as [`ResidentFile::open`] maps it. A read noted just as the slot
    /// replaced the entry counts for the chunk resident there next: one read more or less for the
    /// eviction policy, nothing that decides what a reader gets.
    pub fn note_read(&self, entry: &ResidentEntry) {
        self.table.entry(entry.place)[READS].fetch_add(1, Ordering::Relaxed);
    }

    /// The reads noted of the resident entry of chunk `id` at `place` (where [`ResidentTable::insert`] put it) since
    /// they were last taken, now taken (0 if that place holds another chunk). The slot's only.
    pub fn take_reads(&self, place: usize, id: u128) -> u64 {
        let entry = self.table.entry(place);
        if entry[READS].load(Ordering::Relaxed) == 0 || self.table.key_at(place) != id {
            return 0;
        }
        entry[READS].swap(0, Ordering::Relaxed)
    }

    /// Withdraws the resident entry of chunk `id`: from now on no reader skips its check. Call it before the
    /// pages are unlocked. Single writer.
    pub fn withdraw(&self, id: u128) -> bool {
        self.table.withdraw(id)
    }
}

/// A resident table in its file (`crate::shared_file`).
pub struct ResidentFile {
    words: Arc<SharedWords>,
}

impl ResidentFile {
    /// A new, empty table of `capacity` entries at `path`, 0600,
    /// replacing any older one, with its owner lock set up (not held: [`ResidentFile::hold_owner_lock`]).
    pub fn create(path: &Path, capacity: usize) -> io::Result<ResidentFile> {
        let words = SharedWords::create(path, table_len(capacity.max(1)), |w| {
            ResidentTable::init(w).map_err(io::Error::other)?;
            owner_lock::init(&w[OWNER..OWNER + OWNER_WORDS])
        })?;
        Ok(ResidentFile { words: Arc::new(words) })
    }

    /// The table at `path`, mapped writable: for a reader to find resident chunks and note its reads of them
    /// (the one word of an entry a reader writes: [`ResidentTable::note_read`]), for a slot to mark an
    /// older table superseded; an error if it is not one.
    pub fn open(path: &Path) -> io::Result<ResidentFile> {
        let words = SharedWords::open(path, true, |w| ResidentTable::open(w).is_ok())?;
        Ok(ResidentFile { words: Arc::new(words) })
    }

    pub fn table(&self) -> ResidentTable<'_> {
        ResidentTable::open(self.words.words()).expect("checked when mapped")
    }

    pub fn is_current(&self, path: &Path) -> bool {
        self.words.is_current(path)
    }

    /// Takes the owner lock of a table this process created, on a thread of its own that holds it
    /// until the lock is dropped (the table's resident chunks then die, as they do when the process exits).
    pub fn hold_owner_lock(&self) -> io::Result<OwnerLock> {
        owner_lock::hold(Arc::clone(&self.words), OWNER)
    }
}

pub use owner_lock::OwnerLock;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod owner_lock {
    use std::io;
    use std::sync::atomic::AtomicU64;
    use std::sync::{mpsc, Arc};

    use crate::shared_file::SharedWords;

    const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= super::OWNER_WORDS * 8);

    /// The owner lock held by its own thread; dropping it ends the thread without unlocking, so
    /// the kernel marks the lock's owner dead, as when the process exits.
    pub struct OwnerLock {
        _stop: mpsc::Sender<()>,
    }

    fn errno(rc: libc::c_int) -> io::Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
    }

    /// Sets up a process-shared robust mutex in `words` (all zero, in a new file).
    pub fn init(words: &[AtomicU64]) -> io::Result<()> {
        let mutex = words.as_ptr() as *mut libc::pthread_mutex_t;
        // SAFETY: `words` is at least as large as a pthread_mutex_t and 8-aligned (asserted above
        // and by the table layout); it is in a shared file mapping made writable by `create`, not
        // yet visible to any reader (the file is renamed into place afterwards). The attribute
        // lives on the stack for the calls and is destroyed after.
        unsafe {
            let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
            errno(libc::pthread_mutexattr_init(attr.as_mut_ptr()))?;
            let set =
                errno(libc::pthread_mutexattr_setpshared(attr.as_mut_ptr(), libc::PTHREAD_PROCESS_SHARED))
                    .and_then(|()| {
                        errno(libc::pthread_mutexattr_setrobust(
                            attr.as_mut_ptr(),
                            libc::PTHREAD_MUTEX_ROBUST,
                        ))
                    })
                    .and_then(|()| errno(libc::pthread_mutex_init(mutex, attr.as_ptr())));
            libc::pthread_mutexattr_destroy(attr.as_mut_ptr());
            set
        }
    }

    pub fn hold(words: Arc<SharedWords>, at: usize) -> io::Result<OwnerLock> {
        let (locked_tx, locked_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        std::thread::Builder::new().name("memarts-entry-owner".into()).spawn(move || {
            let mutex = words.words()[at..].as_ptr() as *mut libc::pthread_mutex_t;
            // SAFETY: the mutex was set up by `init` in this mapping, which `words` keeps alive for
            // as long as this thread runs; glibc's robust-mutex code is its only user.
            let rc = unsafe { libc::pthread_mutex_lock(mutex) };
            let rc = if rc == libc::EOWNERDEAD {
                // SAFETY: as above; this thread now holds the mutex.
                unsafe { libc::pthread_mutex_consistent(mutex) }
            } else {
                rc
            };
            let _ = locked_tx.send(rc);
            if rc == 0 {
                // Held until the lock is dropped (or the process exits); never unlocked.
                let _ = stop_rx.recv();
            }
        })?;
        let rc = locked_rx.recv().map_err(|_| io::Error::other("the entry owner thread died"))?;
        errno(rc)?;
        Ok(OwnerLock { _stop: stop_tx })
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod owner_lock {
    use std::io;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use crate::shared_file::SharedWords;

    pub struct OwnerLock;

    pub fn init(_: &[AtomicU64]) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "resident chunks need glibc's robust mutexes"))
    }

    pub fn hold(_: Arc<SharedWords>, _: usize) -> io::Result<OwnerLock> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "resident chunks need glibc's robust mutexes"))
    }
}

fn read_stamp(e: &[AtomicU64]) -> Stamp {
    Stamp {
        ino: e[INO].load(Ordering::Relaxed),
        size: e[SIZE].load(Ordering::Relaxed),
        mtime_ns: e[MTIME].load(Ordering::Relaxed) as i64,
        ctime_ns: e[CTIME].load(Ordering::Relaxed) as i64,
    }
}

#[cfg(test)]
#[path = "resident_table_tests.rs"]
mod tests;
