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
//!
//! A directory's entries are compact, as a slot may hold half a million: a sorted `Vec` of 36-byte
//! [`Listed`] (the key in the directory's [`ByteArena`], the metadata a [`PackedMeta`], and the
//! page that listed it, whose time its [`Range`] holds) where a `BTreeMap<String, (ObjectMeta,
//! Instant)>` took ~250 bytes an entry.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;
use memarts_protocol::ObjectMeta;

use super::byte_arena::ByteArena;
use super::compact_meta::{PackedMeta, Spills};

/// Entries kept over every directory (~40 bytes and the key each).
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
    /// Its number in its directory: what its entries name it by ([`Listed::page`]).
    page: u32,
}

impl Range {
    fn covers(&self, key: &str) -> bool {
        self.after.as_deref().is_none_or(|a| a < key) && self.last.as_deref().is_none_or(|l| key <= l)
    }
}

/// One key a page of the directory listed, with its version.
#[derive(Clone, Copy)]
struct Listed {
    /// The key, in [`Dir::keys`].
    key: u32,
    /// The [`Range::page`] of the page that listed it last: it was listed when that page was
    /// asked for (entries of pages no longer held are dropped with them).
    page: u32,
    meta: PackedMeta,
}

#[derive(Default)]
struct Dir {
    /// In the order they were recorded: by `page`.
    ranges: Vec<Range>,
    /// Sorted by key.
    entries: Vec<Listed>,
    keys: ByteArena,
    spills: Spills,
    /// Pages recorded so far: the next one's number.
    pages: u32,
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

impl Dir {
    /// Where `key` is in `entries` (or would go).
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|e| self.keys.get(e.key).cmp(key.as_bytes()))
    }

    /// When the page numbered `page` was asked for, if it is held.
    fn page_at(&self, page: u32) -> Option<Instant> {
        self.ranges.binary_search_by_key(&page, |r| r.page).ok().map(|i| self.ranges[i].at)
    }

    /// Drops what `e` holds besides itself.
    fn release(&mut self, e: Listed) {
        self.keys.free(e.key);
        e.meta.release(&mut self.spills);
    }

    fn compact_keys(&mut self) {
        if self.keys.wants_compaction() {
            self.keys.compact(self.entries.iter_mut().map(|e| &mut e.key));
        }
    }

    /// Drops the entries of the pages no longer held.
    fn drop_unheld(&mut self) {
        let (ranges, keys, spills) = (&self.ranges, &mut self.keys, &mut self.spills);
        self.entries.retain(|e| {
            let held = ranges.binary_search_by_key(&e.page, |r| r.page).is_ok();
            if !held {
                keys.free(e.key);
                e.meta.release(spills);
            }
            held
        });
        self.compact_keys();
    }

    /// Holds `found` (key, metadata) as listed by `page`, in place of what an older page said of
    /// the same keys.
    fn insert(&mut self, page: u32, found: Vec<(String, ObjectMeta)>) {
        let held = self.entries.len();
        let mut new: Vec<Listed> = Vec::new();
        for (key, meta) in found {
            let meta = PackedMeta::new(&meta, &mut self.spills);
            match self.entries[..held].binary_search_by(|e| self.keys.get(e.key).cmp(key.as_bytes())) {
                Ok(i) => {
                    self.entries[i].meta.release(&mut self.spills);
                    self.entries[i].meta = meta;
                    self.entries[i].page = page;
                }
                Err(_) => match self.keys.push(key.as_bytes()) {
                    Some(key) => new.push(Listed { key, page, meta }),
                    None => meta.release(&mut self.spills),
                },
            }
        }
        if new.is_empty() {
            return;
        }
        let keys = &self.keys;
        new.sort_by(|a, b| keys.get(a.key).cmp(keys.get(b.key)));
        // A key a page showed twice: the last one holds, as it would in a map.
        let mut unique: Vec<Listed> = Vec::with_capacity(new.len());
        for e in new {
            match unique.last_mut() {
                Some(last) if self.keys.get(last.key) == self.keys.get(e.key) => {
                    let replaced = std::mem::replace(last, e);
                    self.release(replaced);
                }
                _ => unique.push(e),
            }
        }
        let spare = self.entries.capacity() - self.entries.len();
        if spare < unique.len() {
            // By a sixteenth at a time: spare entries cost 36 bytes each.
            self.entries.reserve_exact(unique.len().max(self.entries.len() / 16));
        }
        let in_order = match (self.entries.last(), unique.first()) {
            (Some(last), Some(first)) => self.keys.get(last.key) < self.keys.get(first.key),
            _ => true,
        };
        self.entries.extend(unique);
        if !in_order {
            // Two sorted runs: a stable sort merges them in one pass.
            let keys = &self.keys;
            self.entries.sort_by(|a, b| keys.get(a.key).cmp(keys.get(b.key)));
        }
    }
}

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
        let listed = d.find(key).ok().map(|i| d.entries[i]);
        match listed.and_then(|e| Some((e.meta, d.page_at(e.page)?))) {
            // An entry older than the range that covers it was not in that page: gone since.
            Some((meta, at)) if at >= range.at => match meta.versioned(&d.spills) {
                true => Seen::Listed(meta.meta(&d.spills), at.elapsed()),
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
        let mut found = Vec::new();
        for e in &d.entries {
            let (key, Some(at)) = (d.keys.get_str(e.key), d.page_at(e.page)) else { continue };
            let newest = fresh.iter().filter(|r| r.covers(key)).map(|r| r.at).max();
            if newest.is_some_and(|n| at >= n) && e.meta.versioned(&d.spills) {
                found.push((key.to_string(), e.meta.meta(&d.spills), at.elapsed()));
            }
        }
        found
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
            if let Ok(i) = d.find(key) {
                let e = d.entries.remove(i);
                d.release(e);
                d.compact_keys();
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
        d.drop_unheld();
        d.large |= more || after.is_some();
        let page = d.pages;
        d.pages += 1;
        d.ranges.push(Range { after, last: if more { last } else { None }, at, page });
        d.forgotten.retain(|_, when| when.elapsed() < ttl);
        let forgotten = &d.forgotten;
        let taken = entries.into_iter().filter(|(key, _)| forgotten.get(key).is_none_or(|when| *when < at));
        let taken: Vec<(String, ObjectMeta)> = taken.collect();
        d.insert(page, taken);
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
