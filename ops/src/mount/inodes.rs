//! The inode table: which inode number stands for which path below the mount's root, what kind of
//! entry it is, and what the mount last learnt of the object (its metadata and when).
//!
//! An inode lives while the kernel holds references to it (one per `lookup`, dropped by `forget`),
//! so the table holds what the kernel has in its dentry cache, not every name ever listed: its
//! size is bounded by the kernel's cache, whatever the size of the bucket.

use std::collections::HashMap;
use std::time::Instant;

use memarts_shim::ObjectMeta;

pub const ROOT: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

#[derive(Debug, Clone)]
pub struct Node {
    /// Relative to the mount's root, `/`-separated; `""` for the root.
    pub path: String,
    pub kind: Kind,
    /// A file's metadata as last checked (none yet for a file being written).
    pub meta: Option<ObjectMeta>,
    /// When `meta` was last checked with the fleet (or came from a listing).
    pub checked: Instant,
    /// The kernel's references (lookups not yet forgotten).
    lookups: u64,
    /// The ETag of the last open, to keep the page cache only while the object is unchanged.
    pub last_open_etag: Option<String>,
}

pub struct Inodes {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
}

/// The path of `name` in the directory `parent` (a relative path).
pub fn child_path(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// The directory part of a relative path (`""` for an entry of the root).
pub fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl Inodes {
    pub fn new() -> Inodes {
        let root = Node {
            path: String::new(),
            kind: Kind::Dir,
            meta: None,
            checked: Instant::now(),
            lookups: 1,
            last_open_etag: None,
        };
        Inodes {
            nodes: HashMap::from([(ROOT, root)]),
            by_path: HashMap::from([(String::new(), ROOT)]),
            next: ROOT + 1,
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    pub fn ino_of(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The inode of `path` with what was just learnt of it, counting one kernel reference: the
    /// existing one (updated) or a new one. A kind that changed (an object replaced by a prefix)
    /// gets a new inode, so the kernel never sees a file turn into a directory.
    pub fn learn(&mut self, path: &str, kind: Kind, meta: Option<ObjectMeta>, checked: Instant) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            let node = self.nodes.get_mut(&ino).expect("by_path and nodes agree");
            if node.kind == kind {
                if meta.is_some() || kind == Kind::Dir {
                    node.meta = meta;
                    node.checked = checked;
                }
                node.lookups += 1;
                return ino;
            }
            self.by_path.remove(path);
        }
        let ino = self.next;
        self.next += 1;
        let node = Node { path: path.to_string(), kind, meta, checked, lookups: 1, last_open_etag: None };
        self.nodes.insert(ino, node);
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// Drops `n` kernel references; the inode goes with the last one (the root never does).
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let node = self.nodes.remove(&ino).expect("present");
            if self.by_path.get(&node.path) == Some(&ino) {
                self.by_path.remove(&node.path);
            }
        }
    }

    /// The path no longer names this inode (unlinked, removed): a later lookup makes a new one.
    pub fn detach(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64) -> Option<ObjectMeta> {
        Some(ObjectMeta { size, etag: Some("e".into()), version: None, last_modified_ms: 0 })
    }

    #[test]
    fn lookups_and_forgets_bound_the_table() {
        let mut t = Inodes::new();
        let now = Instant::now();
        let a = t.learn("a", Kind::File, meta(1), now);
        assert_eq!(t.learn("a", Kind::File, meta(2), now), a, "the same path keeps its inode");
        assert_eq!(t.get(a).unwrap().meta.as_ref().unwrap().size, 2);
        t.forget(a, 1);
        assert!(t.get(a).is_some(), "one reference is left");
        t.forget(a, 1);
        assert!(t.get(a).is_none() && t.ino_of("a").is_none());
        assert_eq!(t.len(), 1, "only the root is left");
        t.forget(ROOT, 10);
        assert!(t.get(ROOT).is_some(), "the root is never forgotten");
    }

    #[test]
    fn a_file_that_became_a_directory_gets_a_new_inode() {
        let mut t = Inodes::new();
        let now = Instant::now();
        let f = t.learn("x", Kind::File, meta(1), now);
        let d = t.learn("x", Kind::Dir, None, now);
        assert_ne!(f, d);
        assert_eq!(t.ino_of("x"), Some(d));
        t.forget(f, 1);
        assert_eq!(t.ino_of("x"), Some(d), "forgetting the old inode leaves the new one's path");
    }

    #[test]
    fn paths() {
        assert_eq!(child_path("", "a"), "a");
        assert_eq!(child_path("a/b", "c"), "a/b/c");
        assert_eq!(parent_of("a/b/c"), "a/b");
        assert_eq!(parent_of("a"), "");
    }
}
