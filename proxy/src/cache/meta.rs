//! Metadata cache: stat results trusted for a TTL, then revalidated with the origin. Bounded in entries.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;
use memarts_protocol::ObjectMeta;

pub struct MetaCache {
    ttl: Duration,
    entries: Mutex<LruCache<String, (ObjectMeta, Instant)>>,
}

impl MetaCache {
    pub fn new(ttl: Duration, max_entries: usize) -> MetaCache {
        let cap = std::num::NonZeroUsize::new(max_entries.max(1)).expect("max(1) is non-zero");
        MetaCache { ttl, entries: Mutex::new(LruCache::new(cap)) }
    }

    /// A fresh entry for `url`, if any.
    pub fn get(&self, url: &str) -> Option<ObjectMeta> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(url) {
            Some((meta, at)) if at.elapsed() < self.ttl => Some(meta.clone()),
            Some(_) => {
                entries.pop(url);
                None
            }
            None => None,
        }
    }

    pub fn put(&self, url: String, meta: ObjectMeta) {
        if self.ttl.is_zero() {
            return;
        }
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).put(url, (meta, Instant::now()));
    }

    pub fn invalidate(&self, url: &str) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).pop(url);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: &str) -> ObjectMeta {
        ObjectMeta { size: 1, etag: Some(etag.into()), version: None, last_modified_ms: 0 }
    }

    #[test]
    fn expires_after_ttl_and_is_bounded() {
        let cache = MetaCache::new(Duration::from_millis(30), 2);
        cache.put("a".into(), meta("1"));
        assert_eq!(cache.get("a"), Some(meta("1")));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get("a"), None);
        cache.put("a".into(), meta("1"));
        cache.put("b".into(), meta("2"));
        cache.put("c".into(), meta("3"));
        assert_eq!(cache.get("a"), None, "oldest entry evicted at the bound");
        let off = MetaCache::new(Duration::ZERO, 2);
        off.put("a".into(), meta("1"));
        assert_eq!(off.get("a"), None);
    }
}
