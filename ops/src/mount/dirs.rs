//! Directory listings: each directory's entries as the origin listed them, kept for the entry
//! timeout, and the directories made with `mkdir` that exist only in this mount's view until a file
//! is written below them (object stores have no directories: a prefix exists while an object is
//! under it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_shim::ListEntry;

use super::inodes::Kind;

/// Longest name the kernel accepts in a directory entry.
const NAME_MAX: usize = 255;

#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub size: u64,
    pub etag: Option<String>,
    pub mtime_ms: i64,
}

struct Listing {
    entries: Arc<Vec<Entry>>,
    at: Instant,
}

#[derive(Default)]
pub struct Dirs {
    listings: HashMap<String, Listing>,
    /// Directories made in this mount (relative paths).
    local: BTreeSet<String>,
}

/// Whether `name` can be a directory entry: object keys can hold names no file system can
/// (`a//b` gives an empty one, `.` and `..` are taken, NUL ends a C string, 255 bytes at most).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('\0') && name.len() <= NAME_MAX
}

/// The entries of one listing page set, by name: names that cannot be entries are left out, and
/// where an object and a prefix share a name the object is kept (a lookup finds the object too).
pub fn entries_of(listed: Vec<ListEntry>) -> Vec<Entry> {
    let mut by_name: BTreeMap<String, Entry> = BTreeMap::new();
    for e in listed {
        let Some(name) = e.url.trim_end_matches('/').rsplit('/').next() else { continue };
        if !valid_name(name) {
            continue;
        }
        let kind = if e.is_dir { Kind::Dir } else { Kind::File };
        let entry =
            Entry { name: name.to_string(), kind, size: e.size, etag: e.etag, mtime_ms: e.last_modified_ms };
        match by_name.get(name) {
            Some(old) if old.kind == Kind::File => {}
            _ => {
                by_name.insert(name.to_string(), entry);
            }
        }
    }
    by_name.into_values().collect()
}

impl Dirs {
    /// The cached listing of `path` if it is younger than `ttl`, with its age.
    pub fn fresh(&self, path: &str, ttl: Duration) -> Option<(Arc<Vec<Entry>>, Duration)> {
        let l = self.listings.get(path)?;
        let age = l.at.elapsed();
        (age < ttl).then(|| (l.entries.clone(), age))
    }

    /// Keeps a new listing of `path`; listings older than `ttl` go, so the cache holds only what
    /// may still be used.
    pub fn store(&mut self, path: &str, entries: Vec<Entry>, at: Instant, ttl: Duration) -> Arc<Vec<Entry>> {
        self.listings.retain(|_, l| l.at.elapsed() < ttl);
        let entries = Arc::new(entries);
        if !ttl.is_zero() {
            self.listings.insert(path.to_string(), Listing { entries: entries.clone(), at });
        }
        entries
    }

    /// Forgets the listing of `path` and of every directory above it (a write or delete below them
    /// changed what they hold).
    pub fn invalidate_up(&mut self, path: &str) {
        let mut p = path;
        loop {
            self.listings.remove(p);
            if p.is_empty() {
                return;
            }
            p = super::inodes::parent_of(p);
        }
    }

    pub fn is_local(&self, path: &str) -> bool {
        self.local.contains(path)
    }

    pub fn add_local(&mut self, path: &str) {
        self.local.insert(path.to_string());
    }

    pub fn remove_local(&mut self, path: &str) {
        self.local.remove(path);
    }

    /// Names of the local directories directly in `path`.
    pub fn local_children(&self, path: &str) -> Vec<String> {
        let prefix = if path.is_empty() { String::new() } else { format!("{path}/") };
        self.local
            .range(prefix.clone()..)
            .take_while(|p| p.starts_with(&prefix))
            .filter_map(|p| {
                let rest = &p[prefix.len()..];
                (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
            })
            .collect()
    }

    /// Whether any local directory lies below `path`.
    pub fn has_local_below(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.local.range(prefix.clone()..).next().is_some_and(|p| p.starts_with(&prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(url: &str, is_dir: bool) -> ListEntry {
        ListEntry { url: url.into(), is_dir, size: 3, etag: None, last_modified_ms: 0 }
    }

    #[test]
    fn odd_names_are_left_out_and_objects_win_over_prefixes() {
        let got = entries_of(vec![
            listed("s3://b/d/x", true),
            listed("s3://b/d/x", false),
            listed("s3://b/d/", false),
            listed("s3://b/d/..", false),
            listed("s3://b/d/nul\0", false),
            listed(&format!("s3://b/d/{}", "n".repeat(256)), false),
            listed("s3://b/d/sub/", true),
        ]);
        let names: Vec<(&str, Kind)> = got.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(names, vec![("d", Kind::File), ("sub", Kind::Dir), ("x", Kind::File)]);
    }

    #[test]
    fn local_directories_and_listing_freshness() {
        let mut d = Dirs::default();
        d.add_local("a");
        d.add_local("a/b");
        d.add_local("a/b/c");
        d.add_local("ab");
        assert_eq!(d.local_children(""), vec!["a", "ab"]);
        assert_eq!(d.local_children("a"), vec!["b"]);
        assert!(d.has_local_below("a") && !d.has_local_below("ab"));
        let ttl = Duration::from_secs(60);
        d.store("a/b", vec![], Instant::now(), ttl);
        d.store("a", vec![], Instant::now(), ttl);
        assert!(d.fresh("a/b", ttl).is_some());
        d.invalidate_up("a/b");
        assert!(d.fresh("a/b", ttl).is_none() && d.fresh("a", ttl).is_none());
        d.store("z", vec![], Instant::now(), Duration::ZERO);
        assert!(d.fresh("z", Duration::ZERO).is_none(), "a zero timeout caches nothing");
    }
}
