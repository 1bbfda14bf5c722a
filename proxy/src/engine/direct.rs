//! Direct hits: a shim of the fleet's uid reads a warm object straight from its chunk files, with no
//! round trip to a proxy. The slot's part is to publish what the shim needs to name those files (its
//! metadata, in the table `meta.rs` writes: see `memarts_protocol::meta_table`) and to hear, in
//! batches, which chunks were read that way (`Request::Touched`), so that its counters and its
//! eviction see those reads as the hits they were: what is read stays, what is not goes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_protocol::chunk_file::ChunkId;

use memarts_protocol::Touch;

use super::{Engine, ReadBy};

impl Engine {
    /// Publishes the slot's metadata in a table at `path` from now on, for direct hits.
    pub fn publish_metadata(&self, path: std::path::PathBuf) -> std::io::Result<()> {
        self.meta.publish_at(path)
    }

    /// Pins chunks read directly from now on, at most `budget` bytes of them, publishing them in a
    /// table at `path` (`pins.rs`). Once per engine.
    pub fn publish_pins(&self, path: &std::path::Path, budget: u64) -> std::io::Result<()> {
        let pins = super::pins::Pins::create(path, budget)?;
        self.pins.set(Arc::new(pins)).map_err(|_| std::io::Error::other("pins are set up already"))
    }

    /// Bytes pinned now and the slot's pin budget (0 and 0 without pins).
    pub fn pin_usage(&self) -> (u64, u64) {
        self.pins.get().map_or((0, 0), |p| p.usage())
    }

    /// Lets go of chunk `id`'s pin, if it has one (it is being evicted or dropped).
    pub(super) fn release_pin(&self, id: u128) {
        if let Some(pins) = self.pins.get() {
            pins.release(id);
        }
    }

    /// Counts chunks a client read directly as hits, for the counters and the eviction policy, as
    /// [`Engine::read_chunk`] counts a hit it serves. A chunk the slot no longer holds (evicted
    /// while the reader had its file open, or not indexed yet after a start) is not counted: its
    /// file is gone or will be found by the rebuild. Returns how many were counted.
    pub fn touched(&self, touches: &[Touch]) -> u32 {
        let mut counted = 0;
        let mut read = Vec::new();
        for t in touches {
            if !self.index().touch(t.id) {
                continue;
            }
            read.push(t.id);
            self.count_read(t.id, ReadBy::Client);
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            self.stats.direct_hits.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_from_cache.fetch_add(t.len, Ordering::Relaxed);
            counted += 1;
        }
        if let Some(pins) = self.pins.get().filter(|p| p.read(&read)) {
            let store = Arc::clone(&self.store);
            super::pins::spawn_pinning(pins, move |id| store.path_of(ChunkId(id)));
        }
        counted
    }
}
