//! The index rebuild: after a start, a slot scans the shared chunk tree in the background for the
//! chunks it owns (by rendezvous hash over the fleet's slots) and their sizes and access times, then
//! applies its share of the capacity and evicts what does not fit. The slot serves meanwhile: a chunk
//! file is found by its name, the index only orders eviction. Its chunks still in the two-level
//! layout of older caches are moved to their place first (`ChunkStore::adopt_legacy`). The metadata
//! the last fleet saved is taken in meanwhile (`metadata/snapshots.rs`).

use std::sync::Arc;
use std::time::Instant;

use memarts_protocol::owner_slot;

use super::Engine;

impl Engine {
    /// Starts the rebuild on the runtime; `memarts status` shows `index_ready` once it is done.
    pub fn start_rebuild(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let store = this.disk.store.clone();
            let (slot, slots) = (this.info.slot, this.info.slots);
            let metadata = this.metadata.clone();
            // The last fleet's metadata is loaded while the chunks are scanned (both read the disk
            // and decode; neither needs the other), on threads of their own: the slot serves
            // meanwhile.
            let snapshot = tokio::task::spawn_blocking(move || metadata.restore_snapshots());
            let scanned = tokio::task::spawn_blocking(move || {
                let mut owned = Vec::new();
                let mut total = 0u64;
                for c in store.scan() {
                    total += c.bytes_on_disk;
                    if owner_slot(c.id.0, slots) == slot {
                        owned.push(c);
                    }
                }
                match store.adopt_packed(|id| owner_slot(id, slots) == slot) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("took {n} packed chunks from the segments of other slots"),
                    Err(e) => tracing::warn!("could not take packed chunks from other slots' segments: {e}"),
                }
                owned.extend(store.packed_chunks());
                let legacy: Vec<_> = owned.iter().filter(|c| c.legacy).map(|c| c.id).collect();
                match store.adopt_legacy(&legacy) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("moved {n} chunk files of the two-level layout to their place"),
                    Err(e) => tracing::warn!("could not move the chunk files of the two-level layout: {e}"),
                }
                owned.sort_by_key(|c| c.accessed);
                (owned, total)
            })
            .await;
            let _ = snapshot.await;
            let Ok((mut owned, total)) = scanned else {
                tracing::error!("index rebuild failed; eviction stays off");
                return;
            };
            let capacity =
                this.info.capacity.unwrap_or_else(|| default_capacity(&this.info.cache_dir, total));
            let share = capacity / u64::from(slots.max(1));
            let store = this.disk.store.clone();
            let corrupt = tokio::task::spawn_blocking(move || store.set_share(share)).await;
            let corrupt: std::collections::HashMap<u128, String> =
                corrupt.unwrap_or_default().into_iter().collect();
            if !corrupt.is_empty() {
                // What a compaction just dropped as corrupt is not indexed from the scan.
                owned.retain(|c| !corrupt.contains_key(&c.id.0));
                for (id, why) in &corrupt {
                    this.disk.forget_corrupt(*id, why);
                }
            }
            let victims = {
                let mut index = this.disk.index();
                let live = index.ids_most_recent_first();
                let (n, bytes) = (owned.len(), owned.iter().map(|c| c.bytes_on_disk).sum::<u64>());
                let before = index.len();
                index.reserve(n);
                for c in &owned {
                    index.insert_if_absent(c.id.0, c.bytes_on_disk);
                }
                // Chunks served while the scan ran are more recent than anything it found.
                for id in live.into_iter().rev() {
                    index.touch(id);
                }
                index.set_reserve(this.disk.store.reserve_gauge());
                index.set_capacity(Some(share));
                tracing::info!(
                    "index rebuilt in {:?}: {n} chunks ({bytes} bytes) owned, {before} seen live; \
                     fleet capacity {capacity} bytes, slot share {share}, {} bytes kept for packed \
                     segments",
                    started.elapsed(),
                    this.disk.store.reserved()
                );
                index.evict_over_capacity(None)
            };
            this.disk.remove_files(victims).await;
            this.disk.set_index_ready();
        });
    }
}

/// 80% of the space that is free or already holds our chunks.
fn default_capacity(cache_dir: &std::path::Path, ours: u64) -> u64 {
    match nix::sys::statvfs::statvfs(cache_dir) {
        Ok(st) => {
            let free = st.blocks_available() * st.fragment_size();
            (free.saturating_add(ours) as f64 * 0.8) as u64
        }
        Err(e) => {
            tracing::warn!(
                "statvfs({}) failed ({e}); capacity defaults to what is cached now",
                cache_dir.display()
            );
            ours.max(1 << 30)
        }
    }
}
