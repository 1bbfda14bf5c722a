//! Versions of a directory's objects as listings of it showed them: what a slot that owns the
//! directory (`meta_owner_slot` of its URL) answers, for every slot, when their metadata of one of
//! its objects has expired, instead of one HEAD per object (`revalidate.rs`).
//!
//! A listing page covers a range of keys: every key of the bucket in `(after, last]` (`after`: the
//! key the page started after, none from the directory's start; `last`: its last key, none when
//! the listing ended). Every object of the directory in that range was in the page, so for a key
//! in a fresh range the page's entry is the version the origin had then, and a key the page did
//! not show did not exist then. Ranges and entries are trusted for the metadata TTL from when the
//! page was asked for; at most [`MAX_ENTRIES`] entries are kept, the least recently used
//! directories dropped first. An entry without an ETag (some S3-compatible servers list none)
//! tells that the object exists, not its version: only a HEAD does.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;
use memarts_protocol::ObjectMeta;

/// Entries kept over every directory (a hundred bytes or so each).
pub const MAX_ENTRIES: usize = 512 << 10;

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// In a fresh range, with this version, listed that long ago.
    Listed(ObjectMeta, Duration),
    /// In a fresh range, and not listed: it did not exist when the page was asked for.
    Absent,
    /// In a fresh range, listed without an ETag: it existed, in a version only a HEAD tells.
    Unversioned,
    /// In no fresh range: a listing would have to be asked for.
    Unknown,
}

/// One page's range of keys, `(after, last]`, and when it was asked for.
#[derive(Debug, Clone)]
struct Range {
    after: Option<String>,
    last: Option<String>,
    at: Instant,
}

impl Range {
    fn covers(&self, key: &str) -> bool {
        self.after.as_deref().is_none_or(|a| a < key) && self.last.as_deref().is_none_or(|l| key <= l)
    }
}

#[derive(Default)]
struct Dir {
    ranges: Vec<Range>,
    entries: BTreeMap<String, (ObjectMeta, Instant)>,
    /// Keys written or deleted through the fleet, and when: a page asked for before that shows
    /// what the origin had before, and is not taken for them.
    forgotten: BTreeMap<String, Instant>,
    /// A listing of it was cut into pages: it has more keys than one page holds.
    large: bool,
    /// The slots of this fleet that asked for versions of it, and when one last did: what
    /// `refresh.rs` keeps fresh, for whom.
    askers: Vec<Asker>,
    asked: Option<Instant>,
}

/// A slot that asked for versions of a directory: slot `slot` of a fleet of `slots`, reading
/// with chunks of `chunk_size` (0: not known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker {
    pub slot: u32,
    pub slots: u32,
    pub chunk_size: u64,
}

/// Askers remembered per directory (slots times the chunk sizes they read with, in practice one
/// or two per slot).
const MAX_ASKERS: usize = 64;

pub struct DirVersions {
    ttl: Duration,
    dirs: Mutex<(LruCache<String, Dir>, usize)>,
}

impl DirVersions {
    pub fn new(ttl: Duration) -> DirVersions {
        DirVersions { ttl, dirs: Mutex::new((LruCache::unbounded(), 0)) }
    }

    /// What the fresh pages of directory `dir` say of `key` (a key of that directory).
    pub fn lookup(&self, dir: &str, key: &str) -> Seen {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(d) = dirs.0.get_mut(dir) else { return Seen::Unknown };
        let ttl = self.ttl;
        // The newest page that covers it says what the origin had last.
        let fresh = d.ranges.iter().filter(|r| r.at.elapsed() < ttl && r.covers(key));
        let Some(range) = fresh.max_by_key(|r| r.at) else {
            return Seen::Unknown;
        };
        match d.entries.get(key) {
            // An entry older than the range that covers it was not in that page: gone since.
            Some((meta, at)) if *at >= range.at => match versioned(meta) {
                true => Seen::Listed(meta.clone(), at.elapsed()),
                false => Seen::Unversioned,
            },
            _ => Seen::Absent,
        }
    }

    /// Every object of `dir` its fresh pages show with a version, and how long ago it was listed
    /// (what [`DirVersions::lookup`] would say of each).
    pub fn fresh_entries(&self, dir: &str) -> Vec<(String, ObjectMeta, Duration)> {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(d) = dirs.0.get_mut(dir) else { return Vec::new() };
        let ttl = self.ttl;
        let fresh: Vec<&Range> = d.ranges.iter().filter(|r| r.at.elapsed() < ttl).collect();
        d.entries
            .iter()
            .filter(|(key, (meta, at))| {
                let newest = fresh.iter().filter(|r| r.covers(key)).map(|r| r.at).max();
                newest.is_some_and(|n| *at >= n) && versioned(meta)
            })
            .map(|(key, (meta, at))| (key.clone(), meta.clone(), at.elapsed()))
            .collect()
    }

    /// Whether listings of `dir` came in more than one page (from the last one that did).
    pub fn is_large(&self, dir: &str) -> bool {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner()).0.peek(dir).is_some_and(|d| d.large)
    }

    /// Slot `asker` of this fleet asked for a version of `dir`, now.
    pub fn note_asker(&self, dir: &str, asker: Asker) {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = dirs.0.get_mut(dir) {
            d.asked = Some(Instant::now());
            if !d.askers.contains(&asker) && d.askers.len() < MAX_ASKERS {
                d.askers.push(asker);
            }
        }
    }

    /// The directories known whole (one page), asked about within `asked_within`, whose newest
    /// page is `older_than` or more (or expired): to list again, with who asked.
    pub fn due(&self, older_than: Duration, asked_within: Duration) -> Vec<(String, Vec<Asker>)> {
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        dirs.0
            .iter()
            .filter(|(_, d)| !d.large && d.asked.is_some_and(|a| a.elapsed() < asked_within))
            .filter(|(_, d)| {
                d.ranges.iter().map(|r| r.at.elapsed()).min().is_none_or(|age| age >= older_than)
            })
            .map(|(dir, d)| (dir.clone(), d.askers.clone()))
            .collect()
    }

    /// Forgets what pages showed of `key` of `dir` (written or deleted through the fleet): until a
    /// page asked for after now shows it, it is `Absent` (its version is asked of the origin).
    pub fn forget(&self, dir: &str, key: &str) {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let (cache, total) = &mut *dirs;
        if let Some(d) = cache.get_mut(dir) {
            if d.entries.remove(key).is_some() {
                *total -= 1;
            }
            d.forgotten.insert(key.to_string(), Instant::now());
        }
    }

    /// Records a page of `dir` asked for at `at`, covering `(after, last]`, with `entries` (keys of
    /// that directory, in it); `more`: the listing went on after it.
    pub fn record(
        &self,
        dir: &str,
        after: Option<String>,
        last: Option<String>,
        more: bool,
        at: Instant,
        entries: Vec<(String, ObjectMeta)>,
    ) {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let (cache, total) = &mut *dirs;
        if cache.peek(dir).is_none() {
            cache.put(dir.to_string(), Dir::default());
        }
        let d = cache.get_mut(dir).expect("just put");
        let ttl = self.ttl;
        let before = d.entries.len();
        d.ranges.retain(|r| r.at.elapsed() < ttl);
        d.entries.retain(|_, (_, seen)| seen.elapsed() < ttl);
        d.large |= more || after.is_some();
        d.ranges.push(Range { after, last: if more { last } else { None }, at });
        d.forgotten.retain(|_, when| when.elapsed() < ttl);
        for (key, meta) in entries {
            if d.forgotten.get(&key).is_none_or(|when| *when < at) {
                d.entries.insert(key, (meta, at));
            }
        }
        *total = *total + d.entries.len() - before;
        while *total > MAX_ENTRIES {
            match cache.pop_lru() {
                Some((_, old)) => *total -= old.entries.len(),
                None => break,
            }
        }
    }
}

/// Whether a listed entry names its version: an ETag, which every read of the object's chunks
/// is pinned to.
pub fn versioned(meta: &ObjectMeta) -> bool {
    meta.etag.as_deref().is_some_and(|e| !e.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: &str) -> ObjectMeta {
        ObjectMeta { size: 3, etag: Some(etag.into()), version: None, last_modified_ms: 0 }
    }

    #[test]
    fn a_page_tells_the_versions_of_its_range_for_the_ttl() {
        let v = DirVersions::new(Duration::from_millis(200));
        assert_eq!(v.lookup("d", "d/a"), Seen::Unknown);
        let t0 = Instant::now();
        let page = vec![("d/a".to_string(), meta("1")), ("d/c".to_string(), meta("2"))];
        v.record("d", None, Some("d/c".into()), true, t0, page);
        assert!(matches!(v.lookup("d", "d/a"), Seen::Listed(m, _) if m == meta("1")));
        assert_eq!(v.lookup("d", "d/b"), Seen::Absent, "in the range, not listed");
        assert_eq!(v.lookup("d", "d/d"), Seen::Unknown, "past the page's last key");
        assert!(v.is_large("d"));
        // The next page covers the rest, to the end.
        v.record(
            "d",
            Some("d/c".into()),
            Some("d/e".into()),
            false,
            Instant::now(),
            vec![("d/e".into(), meta("3"))],
        );
        assert!(matches!(v.lookup("d", "d/e"), Seen::Listed(..)));
        let keys: Vec<String> = v.fresh_entries("d").into_iter().map(|(k, _, _)| k).collect();
        assert_eq!(keys, ["d/a", "d/c", "d/e"]);
        assert_eq!(v.lookup("d", "d/z"), Seen::Absent, "the listing ended: nothing after it");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(v.lookup("d", "d/a"), Seen::Unknown, "past the TTL");
    }

    #[test]
    fn an_entry_listed_without_an_etag_is_no_version() {
        let v = DirVersions::new(Duration::from_secs(60));
        let bare = ObjectMeta { size: 3, etag: None, version: None, last_modified_ms: 0 };
        let empty = ObjectMeta { etag: Some(String::new()), ..bare.clone() };
        let page = vec![("d/a".into(), bare), ("d/b".into(), empty), ("d/c".into(), meta("1"))];
        v.record("d", None, None, false, Instant::now(), page);
        assert_eq!(v.lookup("d", "d/a"), Seen::Unversioned);
        assert_eq!(v.lookup("d", "d/b"), Seen::Unversioned);
        assert_eq!(v.lookup("d", "d/z"), Seen::Absent, "the others still tell what is not there");
        let keys: Vec<String> = v.fresh_entries("d").into_iter().map(|(k, _, _)| k).collect();
        assert_eq!(keys, ["d/c"], "only versions are sent to other slots");
    }

    #[test]
    fn a_key_written_through_the_fleet_is_not_taken_from_a_page_asked_for_before() {
        let v = DirVersions::new(Duration::from_secs(60));
        let before = Instant::now();
        v.record("d", None, None, false, before, vec![("d/a".into(), meta("old"))]);
        v.forget("d", "d/a");
        assert_eq!(v.lookup("d", "d/a"), Seen::Absent);
        // A page that was in flight during the write comes back with the old version: not taken.
        v.record("d", None, None, false, before, vec![("d/a".into(), meta("old"))]);
        assert_eq!(v.lookup("d", "d/a"), Seen::Absent);
        std::thread::sleep(Duration::from_millis(2));
        v.record("d", None, None, false, Instant::now(), vec![("d/a".into(), meta("new"))]);
        assert!(matches!(v.lookup("d", "d/a"), Seen::Listed(m, _) if m == meta("new")));
    }

    #[test]
    fn a_directory_asked_about_is_due_again_once_its_page_ages_and_until_no_one_asks() {
        let v = DirVersions::new(Duration::from_secs(60));
        let asker = Asker { slot: 1, slots: 4, chunk_size: 1 << 20 };
        v.record("d", None, None, false, Instant::now(), vec![("d/a".into(), meta("1"))]);
        v.record("big", None, Some("big/x".into()), true, Instant::now(), vec![("big/a".into(), meta("1"))]);
        let long = Duration::from_secs(600);
        assert!(v.due(Duration::ZERO, long).is_empty(), "no one asked yet");
        v.note_asker("d", asker);
        v.note_asker("d", asker);
        v.note_asker("big", asker);
        assert_eq!(v.due(Duration::ZERO, long), vec![("d".to_string(), vec![asker])], "one page, one asker");
        assert!(v.due(Duration::from_millis(50), long).is_empty(), "its page is not old enough");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(v.due(Duration::from_millis(50), long).len(), 1);
        assert!(v.due(Duration::from_millis(50), Duration::from_millis(30)).is_empty(), "asked too long ago");
    }

    #[test]
    fn an_object_gone_from_a_newer_page_is_absent_not_its_old_version() {
        let v = DirVersions::new(Duration::from_secs(60));
        v.record("d", None, None, false, Instant::now(), vec![("d/a".into(), meta("1"))]);
        std::thread::sleep(Duration::from_millis(5));
        v.record("d", None, None, false, Instant::now(), vec![("d/b".into(), meta("2"))]);
        assert_eq!(v.lookup("d", "d/a"), Seen::Absent);
        assert!(matches!(v.lookup("d", "d/b"), Seen::Listed(..)));
        assert!(!v.is_large("d"));
    }
}
