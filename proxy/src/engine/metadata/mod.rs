//! Object metadata in a slot: `stat` from the metadata cache while fresh, else one HEAD however
//! many readers ask at once; the last verified version when the origin cannot be reached; and the
//! snapshot a slot saves when it stops cleanly, so the next process of the same slot starts warm
//! (and, after a restart with another number of slots, each slot takes what it now serves from
//! the previous fleet's snapshots).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_protocol::{
    chunk_owner, meta_owner_slot, ErrorCode, ObjectMeta, ObjectUrl, WireError, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};

use super::{parse_url, Engine};

impl Engine {
    /// Metadata of `url`, from the metadata cache while fresh, else from the origin.
    /// Concurrent misses of one URL share one HEAD request (single-flight, as chunk fills do).
    pub async fn stat(self: &Arc<Self>, url: &str, refresh: bool) -> Result<ObjectMeta, WireError> {
        self.stat_for(url, refresh, None).await
    }

    /// [`Engine::stat`] for a read with chunks of `chunk_size` (which slot reads what next, for a
    /// revalidation's answer: `revalidate.rs`).
    pub(super) async fn stat_for(
        self: &Arc<Self>,
        url: &str,
        refresh: bool,
        chunk_size: Option<u64>,
    ) -> Result<ObjectMeta, WireError> {
        let parsed = parse_url(url)?;
        let key = parsed.to_string();
        if !refresh {
            if let Some(meta) = self.meta.get(&key) {
                return Ok(meta);
            }
        }
        let flight = xxhash_rust::xxh3::xxh3_128(key.as_bytes());
        let stale_key = key.clone();
        let this = self.clone();
        let meta = self
            .heads
            .join_fallible(flight, "the metadata request", move |leader| async move {
                // The listing of its directory, which one request keeps fresh for up to 1,000
                // objects, unless a refresh asks the origin about this one.
                if !refresh {
                    if let Some((meta, ago)) = this.revalidate_by_listing(&parsed, chunk_size).await {
                        this.stats.listed_revalidations.fetch_add(1, Ordering::Relaxed);
                        this.meta.put_confirmed(key, meta.clone(), ago);
                        leader.publish(Ok(meta));
                        return;
                    }
                }
                let meta = this.origin.head(&parsed).await.map_err(WireError::from);
                match &meta {
                    Ok(m) => this.meta.put(key, m.clone()),
                    // Gone at the origin: stop vouching for a version that no longer exists.
                    Err(e) if e.code == ErrorCode::NotFound => this.meta.invalidate(&key),
                    Err(_) => {}
                }
                leader.publish(meta);
            })
            .await;
        match meta {
            // The origin cannot be reached to verify the version: keep serving the last verified
            // one (its cached chunks are whole and checked; its misses will fail on their own).
            // Not for refusals (403) or absence (404), which the origin did answer.
            Err(e) if e.code == ErrorCode::OriginError => match self.meta.get_stale(&stale_key) {
                Some(stale) => {
                    self.stats.stale_meta_served.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(url, error = %e.message, "origin unreachable: serving the last verified version");
                    Ok(stale)
                }
                None => Err(e),
            },
            other => other,
        }
    }

    /// Records the metadata of a version this slot just wrote, so reads through it see the new
    /// version at once (other slots revalidate when their metadata TTL ends, or on `refresh`).
    pub async fn note_written(self: &Arc<Self>, url: &ObjectUrl, meta: &ObjectMeta) {
        self.forget_listed(url).await;
        if meta.etag.is_some() {
            self.meta.put(url.to_string(), meta.clone());
        } else {
            self.meta.invalidate(&url.to_string());
        }
    }

    /// Where slot `slot` of a fleet of `slots` keeps its metadata across graceful restarts.
    fn meta_snapshot_path_of(&self, slot: u32, slots: u32) -> PathBuf {
        self.info.cache_dir.join("v1/meta").join(format!("slot-{slot}-of-{slots}.snap"))
    }

    fn meta_snapshot_path(&self) -> PathBuf {
        self.meta_snapshot_path_of(self.info.slot, self.info.slots)
    }

    /// The size of the fleet that stopped last (whose slots wrote the newest snapshots), if any did.
    fn previous_fleet_size(&self) -> Option<u32> {
        let dir = std::fs::read_dir(self.info.cache_dir.join("v1/meta")).ok()?;
        dir.flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let (_, slots) = parse_snapshot_name(name.to_str()?)?;
                Some((e.metadata().ok()?.modified().ok()?, slots))
            })
            .max()
            .map(|(_, slots)| slots)
    }

    /// Loads what the previous process of this slot saved when it stopped (see
    /// [`super::MetaCache::save`]), if the fleet that stopped last had this size. After a fleet of
    /// another size, the index rebuild sorts out its slots' snapshots instead
    /// (`restore_meta_of_another_size`).
    pub fn load_meta_snapshot(&self) {
        if self.info.passthrough || self.previous_fleet_size() != Some(self.info.slots) {
            return;
        }
        let path = self.meta_snapshot_path();
        match self.meta.load(&path) {
            Ok(n) => tracing::info!(entries = n, "metadata restored from {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("metadata snapshot ignored: {e}"),
        }
    }

    /// After a fleet of another size stopped cleanly: loads, from its slots' snapshots, the
    /// metadata of the objects this slot serves now, so that a fleet restarted with another N does
    /// not ask the origin again for every object's metadata. Blocking (a few hashes per entry):
    /// the index rebuild runs it, before `index_ready`.
    pub(super) fn restore_meta_of_another_size(&self) {
        let Some(old) = self.previous_fleet_size().filter(|&n| n != self.info.slots) else { return };
        if self.info.passthrough {
            return;
        }
        let mut restored = 0;
        for k in 0..old {
            let path = self.meta_snapshot_path_of(k, old);
            match self.meta.load_where(&path, |url| self.took_over(url, k, old)) {
                Ok(n) => restored += n,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("metadata snapshot ignored: {e}"),
            }
        }
        tracing::info!(
            entries = restored,
            "metadata restored from the snapshots of the previous fleet of {old}"
        );
    }

    /// Whether this slot now serves the metadata that slot `k` of a fleet of `n` held for `url`: as
    /// its metadata owner, or as the owner of its chunk 0 at a chunk size that made `k` the owner
    /// then. Chunk sizes are not recorded, so every power of two a read may use is tried (a size
    /// that is none only costs a HEAD, as before).
    fn took_over(&self, url: &str, k: u32, n: u32) -> bool {
        let (slot, slots) = (self.info.slot, self.info.slots);
        if meta_owner_slot(url, n) == k && meta_owner_slot(url, slots) == slot {
            return true;
        }
        let Ok(parsed) = ObjectUrl::parse(url) else { return false };
        (MIN_CHUNK_SIZE.trailing_zeros()..=MAX_CHUNK_SIZE.trailing_zeros())
            .map(|bits| 1u64 << bits)
            .any(|cs| chunk_owner(&parsed, cs, 0, n) == k && chunk_owner(&parsed, cs, 0, slots) == slot)
    }

    /// Saves the fresh metadata for the next process of this slot; called after draining.
    pub fn save_meta_snapshot(&self) {
        if self.info.passthrough {
            return;
        }
        let path = self.meta_snapshot_path();
        let saved = path.parent().map_or(Ok(()), |dir| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
        });
        match saved.and_then(|()| self.meta.save(&path)) {
            Ok(n) => tracing::info!(entries = n, "metadata saved to {}", path.display()),
            Err(e) => tracing::warn!("could not save the metadata snapshot {}: {e}", path.display()),
        }
    }
}

/// `(slot, slots)` of a snapshot file named `slot-<slot>-of-<slots>.snap`.
fn parse_snapshot_name(name: &str) -> Option<(u32, u32)> {
    let (slot, slots) = name.strip_prefix("slot-")?.strip_suffix(".snap")?.split_once("-of-")?;
    let (slot, slots) = (slot.parse().ok()?, slots.parse().ok()?);
    (slot < slots).then_some((slot, slots))
}
