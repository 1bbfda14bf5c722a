//! Object metadata in a slot: `stat` from the metadata cache while fresh, else one HEAD however
//! many readers ask at once; the last verified version when the origin cannot be reached; and the
//! snapshot a slot saves when it stops cleanly, so the next process of the same slot starts warm.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use memarts_protocol::{ErrorCode, ObjectMeta, ObjectUrl, WireError};

use super::{parse_url, Engine};

impl Engine {
    /// Metadata of `url`, from the metadata cache while fresh, else from the origin.
    /// Concurrent misses of one URL share one HEAD request (single-flight, as chunk fills do).
    pub async fn stat(self: &Arc<Self>, url: &str, refresh: bool) -> Result<ObjectMeta, WireError> {
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
    pub fn note_written(&self, url: &ObjectUrl, meta: &ObjectMeta) {
        if meta.etag.is_some() {
            self.meta.put(url.to_string(), meta.clone());
        } else {
            self.meta.invalidate(&url.to_string());
        }
    }

    /// Where this slot number of a fleet of this size keeps its metadata across graceful restarts.
    fn meta_snapshot_path(&self) -> PathBuf {
        let name = format!("slot-{}-of-{}.snap", self.info.slot, self.info.slots);
        self.info.cache_dir.join("v1/meta").join(name)
    }

    /// Loads what the previous process of this slot saved when it stopped (see
    /// [`super::MetaCache::save`]).
    pub fn load_meta_snapshot(&self) {
        if self.info.passthrough {
            return;
        }
        let path = self.meta_snapshot_path();
        match self.meta.load(&path) {
            Ok(n) => tracing::info!(entries = n, "metadata restored from {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("metadata snapshot ignored: {e}"),
        }
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
