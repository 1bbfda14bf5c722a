//! Local hits: a shim of the fleet's uid reads a warm object straight from its chunk files, with no
//! round trip to a proxy. The slot's part is to publish what the shim needs to name those files (its
//! metadata, in the table `meta_cache.rs` writes: see `memarts_disk::meta_table`) and to hear, in
//! batches, which chunks were read that way (`Request::Touched`), so that its counters and its
//! eviction see those reads as the hits they were: what is read stays, what is not goes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_disk::chunk_file::ChunkId;

use memarts_protocol::Touch;

use super::disk_chunks::DiskChunks;
use super::ReadBy;

impl DiskChunks {
    /// Makes resident the chunks read locally from now on, at most `budget` bytes of them, publishing them in a
    /// table at `path` (`resident.rs`), and counts the reads noted there every `PINNED_READS_EVERY`
    /// on the caller's runtime. Once per slot.
    pub fn publish_residents(self: &Arc<Self>, path: &std::path::Path, budget: u64) -> std::io::Result<()> {
        let resident = super::resident::ResidentChunks::create(path, budget)?;
        self.resident
            .set(Arc::new(resident))
            .map_err(|_| std::io::Error::other("resident chunks are set up already"))?;
        spawn_counting_resident_reads(self);
        Ok(())
    }

    /// Publishes where the slot's packed chunks are, in a table at `path` kept in step with them
    /// (`chunk_store/record_places.rs`), so that shims read them too with no round trip; false
    /// when the slot packs nothing (it could not open its segments).
    pub fn publish_packed(&self, path: std::path::PathBuf) -> std::io::Result<bool> {
        self.store.publish_packed(path)
    }

    /// Lets go of chunk `id`'s resident entry, if it has one (it is being evicted or dropped).
    pub(super) fn release_resident(&self, id: u128) {
        if let Some(resident) = self.resident.get() {
            resident.release(id);
        }
    }

    /// Counts chunks a client read directly as hits, for the counters and the eviction policy, as
    /// [`super::Engine::read_chunk`] counts a hit it serves. A chunk the slot no longer holds (evicted
    /// while the reader had its file open, or not indexed yet after a start) is not counted: its
    /// file is gone or will be found by the rebuild. Returns how many were counted.
    ///
    /// Resident chunks (`resident.rs`) are for chunks read again: a chunk is queued for one when this read is not
    /// the first the slot's read clock has on record (`recency.rs`; served by the slot or read
    /// directly). The first epoch after a restart, which reads the dataset from the disk, then
    /// does not also pay for making resident it (mapping, locking and checking each chunk again while the
    /// readers wait on the disk: 10-15% of that epoch on 2 cores, issue 29); the next epoch resident chunks
    /// what it reads, and the one after reads from resident chunks. Without a read clock (`lru`), every read
    /// chunk is queued, as before.
    pub fn touched(&self, touches: &[Touch]) -> u32 {
        let mut counted = 0;
        let mut read = Vec::new();
        let clocked = self.index().clocks_reads();
        for t in touches {
            if let Some(returning) = self.count_direct(t.id, 1, t.len) {
                if returning || !clocked {
                    read.push(t.id);
                }
                counted += 1;
            }
        }
        if let Some(resident) = self.resident.get().filter(|p| p.read(&read)) {
            let store = Arc::clone(&self.store);
            super::resident::spawn_making_resident(resident, move |id| store.path_of(ChunkId(id)));
        }
        counted
    }

    /// Counts the reads shims noted in the resident table since the last call (reads of resident chunks
    /// are noted there, not reported: `memarts_disk::resident_table`), as [`DiskChunks::touched`] counts
    /// reported ones: every `PINNED_READS_EVERY`, and before the counters are shown
    /// ([`super::Engine::status`]). Returns how many reads were counted.
    pub fn count_resident_reads(&self) -> u64 {
        let Some(resident) = self.resident.get() else { return 0 };
        let mut counted = 0;
        for (id, reads, len) in resident.take_reads() {
            if self.count_direct(id, reads, len).is_some() {
                counted += reads;
            }
        }
        counted
    }

    /// `reads` local reads of chunk `id` (`len` bytes of data), if the slot still holds it: marked
    /// recently used, counted for the admission policy (at most a few times: its counters saturate
    /// soon) and in the hit counters. `Some(returning)`: held, and whether a read of it before
    /// these was on record; `None`: not held.
    fn count_direct(&self, id: u128, reads: u64, len: u64) -> Option<bool> {
        if !self.index().touch(id) {
            return None;
        }
        let counted = reads.min(COUNTED_READS);
        // Whether the first of these reads found an earlier one on record; the rest only count.
        let returning = counted > 0 && self.count_read(id, ReadBy::Client);
        for _ in 1..counted {
            self.count_read(id, ReadBy::Client);
        }
        self.stats.hits.fetch_add(reads, Ordering::Relaxed);
        self.stats.local_hits.fetch_add(reads, Ordering::Relaxed);
        self.stats.bytes_from_cache.fetch_add(reads.saturating_mul(len), Ordering::Relaxed);
        Some(returning)
    }
}

/// Reads of one chunk noted in a resident table that count for the admission policy, at most (its
/// frequency sketch saturates there).
const COUNTED_READS: u64 = 15;

/// How often a slot counts the reads noted in its resident table.
pub const PINNED_READS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts the reads noted in `disk`'s resident table every [`PINNED_READS_EVERY`], for as long as the
/// slot's chunks live, on the runtime of the caller (none: not at all).
fn spawn_counting_resident_reads(disk: &Arc<DiskChunks>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let disk = Arc::downgrade(disk);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(PINNED_READS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(disk) = disk.upgrade() else { return };
            disk.count_resident_reads();
        }
    });
}
