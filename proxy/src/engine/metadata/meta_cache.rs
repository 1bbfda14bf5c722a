//! Metadata cache: stat results trusted for a TTL, then revalidated with the origin. Bounded in entries.
//!
//! In a fleet's slot, every entry put, loaded or invalidated is also published in the slot's
//! metadata table (`memarts_disk::meta_table`), from which shims of the fleet's uid read a warm
//! object with no round trip; the cache's lock makes it the table's single writer.
//!
//! A slot that stops gracefully saves its fresh entries ([`MetaCache::save`]) and the next slot of
//! that number loads them ([`MetaCache::load`]) with the time each was verified, so a planned
//! restart does not cost one HEAD per object: each entry is trusted for what is left of its TTL,
//! exactly as if the slot had kept running. The snapshot is a cache: a missing, foreign or damaged
//! file only means HEADs again.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::compact_meta::MetaRef;
use super::meta_publisher::Publisher;
use super::url_lru::UrlLru;
use memarts_disk::meta_table::{url_key, Entry};
use memarts_protocol::{crc32c, ObjectMeta};
use serde::{Deserialize, Serialize};

/// Snapshot file: this magic, a CRC32C of the rest, then the postcard-encoded entries.
const SNAPSHOT_MAGIC: &[u8; 8] = b"MAMETA01";

/// One entry of a snapshot, borrowed from the snapshot's bytes when loaded (no string made for the
/// entries a load passes over, nor for those it packs).
#[derive(Serialize, Deserialize)]
struct SnapshotEntry<'a> {
    url: &'a str,
    #[serde(borrow)]
    meta: MetaRef<'a>,
    /// Wall-clock time of the verification, ms since the Unix epoch.
    verified_ms: u64,
}

/// The entries, compact (`url_lru.rs`: ~48 B an entry besides its URL's last component).
type Entries = UrlLru;

pub struct MetaCache {
    ttl: Duration,
    entries: Mutex<Entries>,
    /// The table shims read (`meta_publisher.rs`); locked only while `entries` is, so that the
    /// two change together.
    table: Mutex<Option<Publisher>>,
}

impl MetaCache {
    pub fn new(ttl: Duration, max_entries: usize) -> MetaCache {
        let cap = std::num::NonZeroUsize::new(max_entries.max(1)).expect("max(1) is non-zero");
        // Bounded, but not allocated for the bound up front: it grows as entries come.
        let entries = UrlLru::new(cap, ttl);
        MetaCache { ttl, entries: Mutex::new(entries), table: Mutex::new(None) }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Option<Publisher>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes every entry from now on in a new table at `path` (the fresh ones already held
    /// first), for local hits.
    pub fn publish_at(&self, path: std::path::PathBuf) -> io::Result<()> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut publisher = Publisher::create(path, self.ttl.as_millis() as u64)?;
        let count = self.fresh_count(&entries);
        if count > 0 {
            publisher.refill(count, self.fresh(&entries))?;
        }
        *self.table() = Some(publisher);
        Ok(())
    }

    /// The fresh entries the table holds, as it holds them: each under its URL's key, with when it
    /// was verified (ms since the Unix epoch).
    fn fresh<'a>(&self, entries: &'a Entries) -> impl Iterator<Item = (u128, Entry)> + 'a {
        let (now_wall, now, ttl) = (SystemTime::now(), Instant::now(), self.ttl);
        let mut url = String::new();
        entries.iter().filter(move |e| e.age(now) < ttl).filter_map(move |e| {
            let verified = now_wall.checked_sub(e.age(now)).unwrap_or(SystemTime::UNIX_EPOCH);
            let entry = e.entry(unix_ms(verified))?;
            e.url_into(&mut url);
            Some((url_key(&url), entry))
        })
    }

    /// How many entries are fresh: what a table made for them must hold (counted without making
    /// their keys, which [`MetaCache::fresh`] does).
    fn fresh_count(&self, entries: &Entries) -> usize {
        let now = Instant::now();
        entries.iter().filter(|e| e.age(now) < self.ttl).count()
    }

    /// Publishes `url` (under the entries' lock), growing the table when it is crowded.
    fn publish(&self, entries: &Entries, url: &str, meta: &ObjectMeta, verified_ms: u64) {
        let mut table = self.table();
        let Some(publisher) = table.as_mut() else { return };
        if publisher.publish(url, meta, verified_ms) {
            if let Err(e) = publisher.grow(self.fresh(entries)) {
                tracing::warn!("the metadata table for local hits could not grow: {e}");
            }
        }
    }

    /// Makes the table again from every fresh entry, at the size that holds them all (after a
    /// load: one table filled once, not one entry at a time through every growth).
    fn republish(&self, entries: &Entries) {
        let mut table = self.table();
        let Some(publisher) = table.as_mut() else { return };
        let count = self.fresh_count(entries);
        if let Err(e) = publisher.refill(count, self.fresh(entries)) {
            tracing::warn!("the metadata table for local hits could not be made again: {e}");
        }
    }

    /// The TTL, as the published table states it.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The URL of every entry, fresh or not.
    pub fn urls(&self) -> Vec<String> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|e| e.url()).collect()
    }

    /// A fresh entry for `url`, if any.
    pub fn get(&self, url: &str) -> Option<ObjectMeta> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(url).filter(|(_, age)| *age < self.ttl).map(|(meta, _)| meta)
    }

    /// The last verified entry for `url`, however old: what a read may fall back on when the origin
    /// cannot be reached to verify it again. Expired entries stay until the LRU bound evicts them.
    pub fn get_stale(&self, url: &str) -> Option<ObjectMeta> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).peek(url).map(|(meta, _)| meta)
    }

    pub fn put(&self, url: String, meta: ObjectMeta) {
        self.put_confirmed(url, meta, Duration::ZERO);
    }

    /// Puts `meta` as the origin confirmed it `ago` (a peer's answer: `engine/peers.rs`), trusted
    /// for what is left of the TTL: not at all once that is nothing. An entry confirmed more
    /// recently stays.
    pub fn put_confirmed(&self, url: String, meta: ObjectMeta, ago: Duration) {
        if ago >= self.ttl {
            return;
        }
        let Some(at) = Instant::now().checked_sub(ago) else { return };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if !ago.is_zero() && entries.verified(&url).is_some_and(|held| held > entries.stamp(at)) {
            return;
        }
        entries.put(&url, &meta, at);
        let verified = SystemTime::now().checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH);
        self.publish(&entries, &url, &meta, unix_ms(verified));
    }

    /// How long ago the origin confirmed the entry of `url` if it is `meta` (fresh or not): what a
    /// peer is told with it.
    pub fn confirmed_ago(&self, url: &str, meta: &ObjectMeta) -> Option<Duration> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.peek(url).filter(|(held, _)| held == meta).map(|(_, age)| age)
    }

    pub fn invalidate(&self, url: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(publisher) = self.table().as_mut() {
            publisher.withdraw(url);
        }
        entries.pop(url);
    }

    /// Writes the entries to `path` (temp file, then rename); returns how many. Expired ones too:
    /// the next process cannot trust them, but they tell it which directories to list again
    /// (`refresh.rs`) and which versions a listing confirms, so that the first epoch after a
    /// restart long after the last one waits for no listing.
    pub fn save(&self, path: &Path) -> io::Result<usize> {
        let (now_wall, now) = (SystemTime::now(), Instant::now());
        let held: Vec<(String, ObjectMeta, u64)> = {
            let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            // Least recently used first, so that a load into a smaller cache keeps the hottest.
            entries
                .iter_lru_first()
                .map(|e| {
                    let verified = now_wall.checked_sub(e.age(now)).unwrap_or(SystemTime::UNIX_EPOCH);
                    (e.url(), e.meta(), unix_ms(verified))
                })
                .collect()
        };
        let entries: Vec<SnapshotEntry> = held
            .iter()
            .map(|(url, meta, verified_ms)| SnapshotEntry {
                url,
                meta: meta.into(),
                verified_ms: *verified_ms,
            })
            .collect();
        let body = postcard::to_allocvec(&entries).map_err(io::Error::other)?;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(SNAPSHOT_MAGIC)?;
        file.write_all(&crc32c(&body).to_le_bytes())?;
        file.write_all(&body)?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        Ok(entries.len())
    }

    /// Loads a snapshot written by [`MetaCache::save`]: each entry is trusted for what is left of
    /// its TTL; an expired one is held as expired (what a listing may confirm, see [`save`]);
    /// entries verified in the future (a clock that jumped back) are skipped. Returns how many
    /// were loaded, expired ones included.
    ///
    /// [`save`]: MetaCache::save
    pub fn load(&self, path: &Path) -> io::Result<usize> {
        self.load_entries(path, None::<fn(&str) -> bool>)
    }

    /// [`MetaCache::load`] of the entries whose URL `keep` accepts; none replaces an entry of its
    /// URL verified more recently (another snapshot's, or one this slot just verified).
    pub fn load_where(&self, path: &Path, keep: impl Fn(&str) -> bool) -> io::Result<usize> {
        self.load_entries(path, Some(keep))
    }

    /// [`MetaCache::load_where`]; every entry for `None` (room made for them all at once).
    fn load_entries(&self, path: &Path, keep: Option<impl Fn(&str) -> bool>) -> io::Result<usize> {
        let bytes = std::fs::read(path)?;
        let invalid =
            |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
        if bytes.len() < 12 || &bytes[..8] != SNAPSHOT_MAGIC {
            return Err(invalid("not a metadata snapshot"));
        }
        let body = &bytes[12..];
        if crc32c(body).to_le_bytes() != bytes[8..12] {
            return Err(invalid("checksum mismatch"));
        }
        let entries: Vec<SnapshotEntry> = postcard::from_bytes(body).map_err(|e| invalid(&e.to_string()))?;
        // (Borrowed from `bytes`: a load makes no string for an entry.)
        let now_ms = unix_ms(SystemTime::now());
        let (now, mut loaded, mut fresh_loaded) = (Instant::now(), 0, 0);
        let mut cache = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if keep.is_none() {
            cache.reserve(entries.len());
        }
        let keep = |url: &str| keep.as_ref().is_none_or(|keep| keep(url));
        for e in entries {
            let Some(age) = now_ms.checked_sub(e.verified_ms).map(Duration::from_millis) else { continue };
            // An expired entry's age past the TTL tells nothing more (and may reach back before
            // this machine's boot, which an `Instant` cannot).
            let fresh = age < self.ttl;
            let Some(at) = now.checked_sub(if fresh { age } else { self.ttl }) else { continue };
            if !keep(e.url) || !cache.put_unless_newer(e.url, e.meta, at) {
                continue;
            }
            fresh_loaded += usize::from(fresh);
            loaded += 1;
        }
        if fresh_loaded > 0 {
            self.republish(&cache);
        }
        Ok(loaded)
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: &str) -> ObjectMeta {
        ObjectMeta { size: 1, etag: Some(etag.into()), version: None, last_modified_ms: 0 }
    }

    #[test]
    fn holds_at_most_its_bound() {
        let cache = MetaCache::new(Duration::from_secs(60), 1 << 20);
        assert!(cache.entries.lock().unwrap().cap().get() == 1 << 20);
        let small = MetaCache::new(Duration::from_secs(60), 3);
        for i in 0..10 {
            small.put(format!("s3://b/{i}"), meta("\"e\""));
        }
        assert_eq!(small.urls().len(), 3);
        assert!(small.get("s3://b/9").is_some() && small.get("s3://b/0").is_none());
    }

    #[test]
    fn expires_after_ttl_and_is_bounded() {
        let cache = MetaCache::new(Duration::from_millis(30), 2);
        cache.put("a".into(), meta("1"));
        assert_eq!(cache.get("a"), Some(meta("1")));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get_stale("a"), Some(meta("1")), "kept for when the origin is down");
        cache.put("a".into(), meta("1"));
        cache.put("b".into(), meta("2"));
        cache.put("c".into(), meta("3"));
        assert_eq!(cache.get("a"), None, "oldest entry evicted at the bound");
        let off = MetaCache::new(Duration::ZERO, 2);
        off.put("a".into(), meta("1"));
        assert_eq!(off.get("a"), None);
    }

    #[test]
    fn an_entry_a_peer_confirmed_earlier_is_trusted_for_what_is_left_of_its_ttl() {
        let cache = MetaCache::new(Duration::from_millis(300), 8);
        cache.put_confirmed("a".into(), meta("1"), Duration::from_millis(250));
        assert_eq!(cache.get("a"), Some(meta("1")));
        let ago = cache.confirmed_ago("a", &meta("1")).unwrap();
        assert!(ago >= Duration::from_millis(250), "{ago:?}");
        assert_eq!(cache.confirmed_ago("a", &meta("2")), None, "another version");
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(cache.get("a"), None, "expired 300 ms after the origin confirmed it, not after the put");
        cache.put_confirmed("b".into(), meta("1"), Duration::from_millis(300));
        assert_eq!(cache.get_stale("b"), None, "confirmed a TTL ago or more: not kept at all");
        // One the slot confirmed itself just now is not replaced by an older confirmation.
        cache.put("c".into(), meta("new"));
        cache.put_confirmed("c".into(), meta("old"), Duration::from_millis(100));
        assert_eq!(cache.get("c"), Some(meta("new")));
    }

    /// What shims read: every entry held, put, loaded or invalidated shows in the published table,
    /// with when it was verified.
    #[test]
    fn entries_are_published_in_the_table_shims_read() {
        use memarts_disk::meta_table::{url_key, TableFile};
        let dir = tempfile::tempdir().unwrap();
        let cache = MetaCache::new(Duration::from_secs(60), 10);
        cache.put("s3://b/held".into(), meta("\"h\""));
        let path = dir.path().join("meta-0.table");
        cache.publish_at(path.clone()).unwrap();
        let reader = TableFile::open(&path).unwrap();
        let found = |url: &str| reader.table().lookup(url_key(url));
        assert_eq!(found("s3://b/held").map(|p| p.etag), Some("\"h\"".into()), "held before publishing");
        let before = unix_ms(SystemTime::now());
        cache.put("s3://b/k".into(), ObjectMeta { size: 5, last_modified_ms: 77, ..meta("\"e1\"") });
        let p = found("s3://b/k").expect("published");
        assert_eq!((p.size, p.etag.as_str(), p.last_modified_ms), (5, "\"e1\"", 77));
        assert!(p.verified_ms >= before && p.verified_ms <= unix_ms(SystemTime::now()));
        cache.put("s3://b/k".into(), meta("\"e2\""));
        assert_eq!(
            found("s3://b/k").map(|p| p.etag),
            Some("\"e2\"".into()),
            "the new version replaces the old"
        );
        cache.invalidate("s3://b/k");
        assert_eq!(found("s3://b/k"), None, "an invalidated entry is withdrawn");
        let snap = dir.path().join("meta.snap");
        cache.put("s3://b/saved".into(), meta("\"s\""));
        cache.save(&snap).unwrap();
        let next = MetaCache::new(Duration::from_secs(60), 10);
        let path = dir.path().join("meta-1.table");
        next.publish_at(path.clone()).unwrap();
        next.load(&snap).unwrap();
        let reader = TableFile::open(&path).unwrap();
        assert!(reader.table().lookup(url_key("s3://b/saved")).is_some(), "a loaded snapshot is published");
    }

    #[test]
    fn a_snapshot_keeps_what_is_left_of_each_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.snap");
        let cache = MetaCache::new(Duration::from_millis(300), 10);
        cache.put("old".into(), meta("1"));
        std::thread::sleep(Duration::from_millis(200));
        cache.put("new".into(), meta("2"));
        assert_eq!(cache.save(&path).unwrap(), 2);

        let restarted = MetaCache::new(Duration::from_millis(300), 10);
        assert_eq!(restarted.load(&path).unwrap(), 2);
        assert_eq!((restarted.get("old"), restarted.get("new")), (Some(meta("1")), Some(meta("2"))));
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(restarted.get("old"), None, "the old entry's TTL ran out as it would have");
        assert_eq!(restarted.get("new"), Some(meta("2")));

        // Loaded after every entry expired: held as expired, for a listing to confirm; nothing
        // trusted, nothing published for local reads.
        std::thread::sleep(Duration::from_millis(200));
        let late = MetaCache::new(Duration::from_millis(300), 10);
        let table = dir.path().join("meta.table");
        late.publish_at(table.clone()).unwrap();
        assert_eq!(late.load(&path).unwrap(), 2);
        assert_eq!((late.get("old"), late.get("new")), (None, None), "expired entries trusted");
        assert_eq!(late.get_stale("new"), Some(meta("2")));
        let published = memarts_disk::meta_table::TableFile::open(&table).unwrap();
        assert!(published.table().lookup(memarts_disk::meta_table::url_key("new")).is_none());
        late.put_confirmed("new".into(), meta("3"), Duration::from_millis(100));
        assert_eq!(late.get("new"), Some(meta("3")), "a listing's confirmation replaces an expired entry");

        // Saved again while expired: still there for the next process.
        assert_eq!(late.save(&path).unwrap(), 2);
        assert_eq!(MetaCache::new(Duration::from_millis(300), 10).load(&path).unwrap(), 2);
    }

    /// Snapshots of several slots (a fleet of another size) loaded into one: only the entries the
    /// filter takes, and of two entries of one URL the one verified last, whatever the load order.
    #[test]
    fn snapshots_load_filtered_and_the_latest_verification_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (older, newer) = (dir.path().join("older.snap"), dir.path().join("newer.snap"));
        let first = MetaCache::new(Duration::from_secs(60), 10);
        first.put("s3://b/o".into(), meta("\"v1\""));
        first.put("s3://b/other".into(), meta("\"x\""));
        first.save(&older).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let second = MetaCache::new(Duration::from_secs(60), 10);
        second.put("s3://b/o".into(), meta("\"v2\""));
        second.save(&newer).unwrap();
        for order in [[&older, &newer], [&newer, &older]] {
            let cache = MetaCache::new(Duration::from_secs(60), 10);
            for path in order {
                cache.load_where(path, |url| url != "s3://b/other").unwrap();
            }
            assert_eq!(cache.get("s3://b/o"), Some(meta("\"v2\"")), "the later verification wins");
            assert_eq!(cache.get("s3://b/other"), None, "filtered out");
        }
    }

    #[test]
    fn a_damaged_snapshot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.snap");
        let cache = MetaCache::new(Duration::from_secs(60), 10);
        cache.put("a".into(), meta("1"));
        cache.save(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let fresh = MetaCache::new(Duration::from_secs(60), 10);
        assert_eq!(fresh.load(&path).unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::write(&path, b"junk").unwrap();
        assert!(fresh.load(&path).is_err());
        assert_eq!(fresh.get("a"), None);
    }
}
