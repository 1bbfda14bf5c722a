//! Resident chunks: chunks that shims read directly, held locked in memory and checked once, so that
//! their readers need not check them again (`memarts_disk::resident_table` says why that is sound).
//!
//! The slot resident chunks what it hears was read again (`Request::Touched`; `Engine::touched` queues only
//! chunks read before), within its share of the resident entry budget (`resident_memory`), on one blocking thread
//! at a time, from a bounded queue: it maps the chunk file, locks the mapping (`mlock`; see
//! `map_checked`), checks the header (the chunk's own) and the data (its CRC32C) in the locked
//! pages, and publishes the file's stamp only if the file did not change meanwhile and its name
//! still names it. When the budget is full, a CLOCK sweep finds a resident entry not read since the hand last
//! passed it; a resident entry still read stays, and a chunk that finds none within a few steps is not resident
//! (so a dataset larger than the budget does not churn resident chunks at every read). A resident entry goes when its
//! chunk is evicted or dropped as corrupt: the table entry first, then the pages.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use memarts_disk::chunk_file::{format, verify, ChunkKey};
use memarts_disk::resident_table::{OwnerLock, ResidentFile, Stamp};

/// A file changed this recently is not resident yet: a write in the same tick of the kernel's coarse
/// clock could leave its times as they were.
const SETTLED: Duration = Duration::from_millis(100);

/// CLOCK steps one resident entry may take looking for room before it gives up.
const SWEEP: usize = 8;

/// Chunks waiting to be resident at most (more are dropped: their next reads ask again).
const QUEUED: usize = 1 << 16;

/// Resident entry table entries per byte of budget: one per 32 KiB resident (chunks are at least 4 KiB, most
/// far larger), at least 1024.
const BYTES_PER_ENTRY: u64 = 32 << 10;

struct Held {
    /// The locked mapping: the pages stay in memory while it lives.
    _map: memmap2::Mmap,
    bytes: u64,
    /// The chunk's data length, and where its entry is in the table (for the reads noted there).
    data_len: u64,
    place: usize,
    /// Read since the CLOCK hand last passed.
    referenced: bool,
}

#[derive(Default)]
struct State {
    held: HashMap<u128, Held>,
    /// CLOCK order; may name chunks no longer held (skipped).
    ring: VecDeque<u128>,
    used: u64,
    /// Chunks read and not resident yet, for the making resident thread to take (at most [`QUEUED`]).
    queue: Vec<u128>,
}

/// Counters of resident chunks, for `memarts status` and the metrics.
#[derive(Default)]
pub struct ResidentStats {
    pub resident: AtomicU64,
    pub released: AtomicU64,
    pub refused: AtomicU64,
}

pub(crate) struct ResidentChunks {
    file: ResidentFile,
    _owner: OwnerLock,
    budget: u64,
    state: Mutex<State>,
    /// A batch is being resident.
    busy: AtomicBool,
    /// Memory cannot be locked (`RLIMIT_MEMLOCK`): no more resident chunks are tried.
    refused: AtomicBool,
    pub stats: ResidentStats,
}

impl ResidentChunks {
    /// A new resident table at `path` holding at most `budget` bytes, its owner lock taken; an older
    /// table there is marked superseded once the new one is in place.
    pub fn create(path: &Path, budget: u64) -> std::io::Result<ResidentChunks> {
        let older = ResidentFile::open(path).ok();
        let entries = (budget / BYTES_PER_ENTRY).clamp(1024, 1 << 22) as usize;
        let file = ResidentFile::create(path, entries.next_power_of_two())?;
        let owner = file.hold_owner_lock()?;
        if let Some(older) = older {
            older.table().mark_superseded();
        }
        Ok(ResidentChunks {
            file,
            _owner: owner,
            budget,
            state: Mutex::default(),
            busy: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            stats: ResidentStats::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes resident now, and the budget (for the tests).
    #[cfg(test)]
    pub fn usage(&self) -> (u64, u64) {
        (self.state().used, self.budget)
    }

    /// Notes reads of `ids` and queues those not resident yet; true when the caller is to start the
    /// making resident thread ([`ResidentChunks::resident_queued`]: none runs). Nothing once memory cannot be locked.
    pub fn read(&self, ids: &[u128]) -> bool {
        if self.refused.load(Ordering::Relaxed) {
            return false;
        }
        let mut state = self.state();
        let mut queued = false;
        for id in ids {
            if let Some(h) = state.held.get_mut(id) {
                h.referenced = true;
            } else if state.queue.len() < QUEUED {
                state.queue.push(*id);
                queued = true;
            }
        }
        drop(state);
        queued && !self.busy.swap(true, Ordering::Acquire)
    }

    /// Makes resident what is queued, until nothing is (`path_of` names a chunk's file). Blocking: on a
    /// blocking thread.
    pub fn resident_queued(&self, path_of: impl Fn(u128) -> PathBuf) {
        loop {
            let ids = std::mem::take(&mut self.state().queue);
            if ids.is_empty() || self.refused.load(Ordering::Relaxed) {
                self.busy.store(false, Ordering::Release);
                // A read queued after the look and before the flag went down found it up: take it.
                if self.state().queue.is_empty() || self.busy.swap(true, Ordering::Acquire) {
                    return;
                }
                continue;
            }
            for id in ids {
                if !self.state().held.contains_key(&id) {
                    self.make_resident(id, &path_of(id));
                }
            }
        }
    }

    fn make_resident(&self, id: u128, path: &Path) {
        let Ok(file) = File::options().read(true).custom_flags(libc::O_NOATIME | libc::O_NONBLOCK).open(path)
        else {
            return; // evicted meanwhile, or not ours to open with O_NOATIME: not resident
        };
        let Ok(meta) = file.metadata() else { return };
        let stamp = Stamp::of(&meta);
        let settled = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).is_ok_and(|now| {
            now.as_nanos() as i128 - i128::from(stamp.ctime_ns) >= SETTLED.as_nanos() as i128
        });
        if !meta.is_file() || !settled {
            return;
        }
        let bytes = format::round_up(meta.len());
        if !self.make_room(bytes) {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some((map, data_len)) = self.map_checked(&file, id) else { return };
        if file.metadata().map(|m| Stamp::of(&m)).ok() != Some(stamp) {
            return; // changed while it was checked
        }
        let mut state = self.state();
        // Under the lock that `release` takes: an eviction either came before (the name no longer
        // names this file, so it is not resident) or comes after (and finds the resident entry).
        let current =
            std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == stamp.ino && m.dev() == meta.dev());
        if !current || state.held.contains_key(&id) {
            return;
        }
        let Some(place) = self.file.table().insert(id, stamp) else { return };
        state.held.insert(id, Held { _map: map, bytes, data_len, place, referenced: false });
        state.ring.push_back(id);
        state.used += bytes;
        self.stats.resident.fetch_add(1, Ordering::Relaxed);
    }

    /// The chunk file mapped whole, locked, and checked in the locked pages: a header naming chunk
    /// `id`, data of the length it says matching its CRC32C; with that length.
    ///
    /// Pages not all in memory are read again from the disk first, into large folios: a file's
    /// pages that were read from the disk (after a restart, or once memory pressure dropped them)
    /// are 4 KiB pages, and copying a file out of those costs 15-20% more than out of the folios of
    /// up to 128 KiB that a write or a fault in a huge-page mapping (`MADV_HUGEPAGE`) makes. Pages
    /// all in memory are locked as they are: a reader that just read the chunk from the disk
    /// brought them in, and reading it again would double the disk reads of the epoch that is
    /// reading the dataset from the disk (issue 29: 789 MB read for a 375 MiB epoch). Once per
    /// resident entry; pages another process maps or locks stay as they are.
    ///
    /// The check reads the file (`pread`), not the mapping: once locked, its pages are the pages
    /// the page cache copies from, and a file cut short meanwhile (by anyone of the cache's uid)
    /// is a short read here, where touching the mapping past its new end would kill the slot
    /// (SIGBUS). The slot never touches the mapping itself.
    fn map_checked(&self, file: &File, id: u128) -> Option<(memmap2::Mmap, u64)> {
        use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
        // SAFETY: the mapping is never read or written through (see above): it only holds the
        // file's pages locked, and a locked page beyond a new end of file is simply dropped.
        let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
        if !all_resident(&map) {
            let _ = posix_fadvise(file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
        }
        let _ = map.advise(memmap2::Advice::HugePage);
        if let Err(e) = map.lock() {
            if !self.refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "resident chunks off: cannot lock memory ({e}); raise RLIMIT_MEMLOCK (ulimit -l) or grant \
                     CAP_IPC_LOCK for local reads that skip their CRC32C"
                );
            }
            return None;
        }
        let len = check_file(file, id, map.len())?;
        Some((map, len))
    }

    /// The reads shims noted of the chunks resident ([`memarts_disk::resident_table::ResidentTable::note_read`])
    /// since the last call: (chunk, reads, data length) of each chunk read. They count for CLOCK
    /// here as reads heard in a report do.
    pub fn take_reads(&self) -> Vec<(u128, u64, u64)> {
        let mut state = self.state();
        let table = self.file.table();
        let mut read = Vec::new();
        for (&id, held) in state.held.iter_mut() {
            let n = table.take_reads(held.place, id);
            if n > 0 {
                held.referenced = true;
                read.push((id, n, held.data_len));
            }
        }
        read
    }

    /// Frees resident chunks until `bytes` more fit, by CLOCK; false when it found no resident entry to give way within
    /// [`SWEEP`] steps.
    fn make_room(&self, bytes: u64) -> bool {
        if bytes > self.budget {
            return false;
        }
        let mut state = self.state();
        let mut steps = 0;
        while state.used + bytes > self.budget {
            let Some(id) = state.ring.pop_front() else { return false };
            let Some(held) = state.held.get_mut(&id) else { continue };
            if held.referenced && steps < SWEEP {
                held.referenced = false;
                state.ring.push_back(id);
                steps += 1;
                continue;
            }
            if held.referenced {
                state.ring.push_front(id);
                return false;
            }
            self.release_entry(&mut state, id);
        }
        true
    }

    fn release_entry(&self, state: &mut State, id: u128) {
        // The entry first: no reader skips its check from now on; then the pages.
        self.file.table().withdraw(id);
        if let Some(held) = state.held.remove(&id) {
            state.used -= held.bytes;
            self.stats.released.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lets go of chunk `id`'s resident entry, if any (it is being evicted or dropped).
    pub fn release(&self, id: u128) {
        let mut state = self.state();
        if state.held.contains_key(&id) {
            self.release_entry(&mut state, id);
        }
    }
}

/// Bytes of a chunk file read and checked per step while making resident.
const PIECE: usize = 256 << 10;

/// The data length of the chunk file `file` (`len` bytes) if it holds a header naming chunk `id`
/// and data of the length it says matching its CRC32C, read with `pread`.
fn check_file(file: &File, id: u128, len: usize) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len.min(PIECE)];
    file.read_exact_at(&mut buf, 0).ok()?;
    let raw = format::decode_raw(&buf).ok()?;
    if ChunkKey::decode_identity(raw.identity)?.id().0 != id {
        return None;
    }
    let data = verify::Data::from(&raw);
    verify::fits_file(&data, len as u64).ok()?;
    let (start, data_len) = (usize::try_from(data.offset).ok()?, data.len);
    let end = start.checked_add(usize::try_from(data_len).ok()?)?;
    if start > buf.len() {
        return None;
    }
    let mut crc = memarts_protocol::Crc32c::default();
    crc.update(&buf[start..end.min(buf.len())]);
    let mut at = buf.len();
    while at < end {
        let piece = &mut buf[..(end - at).min(PIECE)];
        file.read_exact_at(piece, at as u64).ok()?;
        crc.update(piece);
        at += piece.len();
    }
    verify::data_crc(&data, crc.finish()).ok().map(|()| data_len)
}

/// The default resident entry budget of a fleet: a sixteenth of the machine's memory.
pub(crate) fn default_fleet_budget() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || page <= 0 {
        return 0;
    }
    (pages as u64).saturating_mul(page as u64) / 16
}

/// A slot's share of `fleet` bytes, within what this process may lock (`RLIMIT_MEMLOCK`, unless it
/// runs as root, which may lock any amount).
pub(crate) fn slot_budget(fleet: u64, slots: u32) -> u64 {
    let share = fleet / u64::from(slots.max(1));
    if nix::unistd::geteuid().is_root() {
        return share;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into `limit`, a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return share;
    }
    share.min(limit.rlim_cur)
}

/// Makes resident what is queued on the runtime's blocking pool (after [`ResidentChunks::read`] said to).
pub(crate) fn spawn_making_resident(
    resident: &Arc<ResidentChunks>,
    path_of: impl Fn(u128) -> PathBuf + Send + 'static,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        resident.busy.store(false, Ordering::Release);
        return;
    };
    let resident = Arc::clone(resident);
    runtime.spawn_blocking(move || resident.resident_queued(path_of));
}

/// Whether every page of `map` is in the page cache.
fn all_resident(map: &memmap2::Mmap) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let mut resident = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: `map` is a live mapping of `map.len()` bytes that starts at a page boundary, and
    // `resident` has one byte for each of its pages, as mincore(2) fills.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), resident.as_mut_ptr()) };
    rc == 0 && !resident.is_empty() && resident.iter().all(|b| b & 1 == 1)
}

#[cfg(test)]
#[path = "resident_tests.rs"]
mod tests;
