//! The snapshot a slot saves when it stops cleanly, so the next process of the same slot starts
//! with the metadata it had (and, after a restart with another number of slots, each slot takes
//! what it now serves from the previous fleet's snapshots).

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use memarts_protocol::{chunk_owner, meta_owner_slot, ObjectUrl, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};

use super::Metadata;

impl Metadata {
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

    /// Takes the metadata the fleet that stopped last saved: this slot's own snapshot if that fleet
    /// had this size, else what this slot now serves of its slots' snapshots. Blocking: the index
    /// rebuild runs it, before `index_ready`. Until it is done, a stop saves no snapshot (the last
    /// fleet's stay as they are: saving a cache that has not taken them in would lose them).
    pub(crate) fn restore_snapshots(&self) {
        match self.previous_fleet_size() {
            _ if self.info.passthrough => {}
            Some(n) if n == self.info.slots => self.load_meta_snapshot(),
            Some(old) => self.restore_meta_of_another_size(old),
            None => {}
        }
        self.restored.store(true, Ordering::Release);
    }

    /// Loads what the previous process of this slot saved when it stopped (see
    /// [`super::MetaCache::save`]).
    fn load_meta_snapshot(&self) {
        let path = self.meta_snapshot_path();
        match self.cache.load(&path) {
            Ok(n) => tracing::info!(entries = n, "metadata restored from {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("metadata snapshot ignored: {e}"),
        }
    }

    /// After a fleet of `old` slots stopped cleanly: loads, from its slots' snapshots, the
    /// metadata of the objects this slot serves now, so that a fleet restarted with another N does
    /// not ask the origin again for every object's metadata (a few hashes per entry).
    fn restore_meta_of_another_size(&self, old: u32) {
        let mut restored = 0;
        for k in 0..old {
            let path = self.meta_snapshot_path_of(k, old);
            match self.cache.load_where(&path, |url| self.took_over(url, k, old)) {
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
        if self.info.passthrough || !self.restored.load(Ordering::Acquire) {
            return;
        }
        let path = self.meta_snapshot_path();
        let saved = path.parent().map_or(Ok(()), |dir| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
        });
        match saved.and_then(|()| self.cache.save(&path)) {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use memarts_protocol::ObjectMeta;

    use crate::config::FleetConfig;
    use crate::engine::Engine;
    use crate::origin::Origin;

    fn engine(dir: &std::path::Path) -> Arc<Engine> {
        let cfg = FleetConfig {
            run_dir: dir.join("run"),
            cache_dir: dir.join("cache"),
            io_engine: "pread".into(),
            origin_log: false,
            ..FleetConfig::default()
        };
        crate::build_engine_with(&cfg, 0, Origin::new(cfg.origin.clone(), None)).unwrap().0
    }

    async fn ready(engine: &Arc<Engine>) {
        engine.start_rebuild();
        while !engine.status().index_ready {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn meta(size: u64) -> ObjectMeta {
        ObjectMeta { size, etag: Some(format!("\"e{size}\"")), version: None, last_modified_ms: 1 }
    }

    /// A slot stopped before it took in the last fleet's snapshot saves none over it; once it did,
    /// its stop saves what it holds.
    #[tokio::test]
    async fn a_slot_stopped_before_its_restore_leaves_the_last_snapshot_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let first = engine(dir.path());
        ready(&first).await;
        first.metadata().cache().put("s3://b/kept".into(), meta(7));
        first.metadata().save_meta_snapshot();
        drop(first);

        // Started, then stopped before its rebuild (so before the restore): nothing saved.
        let early = engine(dir.path());
        early.metadata().cache().put("s3://b/early".into(), meta(9));
        early.metadata().save_meta_snapshot();
        drop(early);

        let next = engine(dir.path());
        ready(&next).await;
        let cache = next.metadata().cache();
        assert_eq!(cache.get_stale("s3://b/kept").map(|m| m.size), Some(7), "the last snapshot was lost");
        assert!(cache.get_stale("s3://b/early").is_none(), "a stop before the restore saved its cache");
        cache.put("s3://b/later".into(), meta(11));
        next.metadata().save_meta_snapshot();
        drop(next);

        let last = engine(dir.path());
        ready(&last).await;
        let cache = last.metadata().cache();
        assert_eq!(cache.get_stale("s3://b/later").map(|m| m.size), Some(11));
        assert_eq!(cache.get_stale("s3://b/kept").map(|m| m.size), Some(7));
    }
}
