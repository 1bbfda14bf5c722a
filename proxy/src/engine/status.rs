//! A slot's counters and state, as `memarts status` shows them.

use std::sync::atomic::{AtomicU64, Ordering};

use memarts_protocol::{AdmissionStatus, SlotStatus};

use super::Engine;

impl Engine {
    /// The counters as of now: reads of resident chunks noted so far counted first (they are
    /// otherwise counted every second), so that what a client read before asking is in them.
    pub fn status(&self) -> SlotStatus {
        self.disk.count_resident_reads();
        let index = self.disk.index();
        let s = &self.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SlotStatus {
            slot: self.info.slot,
            slots: self.info.slots,
            pid: std::process::id(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            connections: load(&s.connections),
            requests: load(&s.requests),
            hits: load(&s.hits),
            misses: load(&s.misses),
            bytes_from_cache: load(&s.bytes_from_cache),
            bytes_from_origin: load(&s.bytes_from_origin),
            origin_requests: load(&self.origin.stats.requests),
            origin_retries: load(&self.origin.stats.retries),
            corrupt_chunks: load(&s.corrupt_chunks),
            evicted_chunks: load(&s.evicted_chunks),
            cached_chunks: index.len() as u64,
            cache_bytes_used: index.used(),
            cache_capacity: index.capacity().unwrap_or(0),
            index_ready: self.disk.index_ready(),
            io_engine: self.info.io_engine.to_string(),
            cache_dir: self.info.cache_dir.display().to_string(),
        }
    }

    /// What the eviction policy did (apart from `status`: see [`AdmissionStatus`]).
    pub fn admission_status(&self) -> AdmissionStatus {
        AdmissionStatus {
            eviction: self.info.eviction.to_string(),
            rejected_chunks: self.stats.rejected_chunks.load(Ordering::Relaxed),
        }
    }
}
