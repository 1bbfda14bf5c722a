//! Direct hits: a shim of the fleet's uid reads a warm object straight from its chunk files, with no
//! round trip to a proxy. The slot's part is to publish what the shim needs to name those files (its
//! metadata, in the table `meta.rs` writes: see `memarts_protocol::meta_table`) and to hear, in
//! batches, which chunks were read that way (`Request::Touched`), so that its counters and its
//! eviction see those reads as the hits they were: what is read stays, what is not goes.

use std::sync::atomic::Ordering;

use memarts_protocol::Touch;

use super::{Engine, ReadBy};

impl Engine {
    /// Publishes the slot's metadata in a table at `path` from now on, for direct hits.
    pub fn publish_metadata(&self, path: std::path::PathBuf) -> std::io::Result<()> {
        self.meta.publish_at(path)
    }

    /// Counts chunks a client read directly as hits, for the counters and the eviction policy, as
    /// [`Engine::read_chunk`] counts a hit it serves. A chunk the slot no longer holds (evicted
    /// while the reader had its file open, or not indexed yet after a start) is not counted: its
    /// file is gone or will be found by the rebuild. Returns how many were counted.
    pub fn touched(&self, touches: &[Touch]) -> u32 {
        let mut counted = 0;
        for t in touches {
            if !self.index().touch(t.id) {
                continue;
            }
            self.count_read(t.id, ReadBy::Client);
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            self.stats.direct_hits.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_from_cache.fetch_add(t.len, Ordering::Relaxed);
            counted += 1;
        }
        counted
    }
}
