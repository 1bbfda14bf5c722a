//! The mount's view of names: what a path is (a file with its metadata, a directory, nothing),
//! answered from the fresh listing of its directory, from this mount's own changes (files being
//! written, directories made here), or by asking the fleet; and the attributes the kernel gets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fuser::{Errno, FileAttr};
use memarts_shim::{Error, ObjectMeta};

use super::dirs::{entries_of, Dirs, Entry};
use super::errno::{errno_of, failed};
use super::inodes::{child_path, Inodes, Kind, Node};
use super::options::MountOptions;
use super::spool::Spool;
use super::Fleet;

/// What a path turned out to be.
pub enum Found {
    File(ObjectMeta, Instant),
    /// A file this mount is writing, not at the origin yet.
    Writing,
    Dir,
    Missing,
}

pub struct View {
    pub fleet: Arc<Fleet>,
    pub opts: MountOptions,
    pub inodes: Mutex<Inodes>,
    pub dirs: Mutex<Dirs>,
    /// Files being written, by path: at most one writer each.
    pub writers: Mutex<HashMap<String, Arc<Mutex<Spool>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn meta_of(e: &Entry) -> ObjectMeta {
    ObjectMeta { size: e.size, etag: e.etag.clone(), version: None, last_modified_ms: e.mtime_ms }
}

impl View {
    pub fn new(fleet: Arc<Fleet>, opts: MountOptions) -> View {
        View {
            fleet,
            opts,
            inodes: Mutex::new(Inodes::new()),
            dirs: Mutex::new(Dirs::default()),
            writers: Mutex::new(HashMap::new()),
        }
    }

    pub fn inodes(&self) -> MutexGuard<'_, Inodes> {
        lock(&self.inodes)
    }

    pub fn dirs(&self) -> MutexGuard<'_, Dirs> {
        lock(&self.dirs)
    }

    pub fn writers(&self) -> MutexGuard<'_, HashMap<String, Arc<Mutex<Spool>>>> {
        lock(&self.writers)
    }

    pub fn node(&self, ino: u64) -> Result<Node, Errno> {
        self.inodes().get(ino).cloned().ok_or(Errno::ENOENT)
    }

    pub fn dir_node(&self, ino: u64) -> Result<Node, Errno> {
        let node = self.node(ino)?;
        if node.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        Ok(node)
    }

    /// The entries of directory `path`: its listing if younger than the entry timeout, else a
    /// new one from the fleet.
    pub fn listing(&self, path: &str) -> Result<Arc<Vec<Entry>>, Errno> {
        if let Some((entries, _)) = self.dirs().fresh(path, self.opts.entry_timeout) {
            return Ok(entries);
        }
        let url = self.opts.url_of(path);
        let at = Instant::now();
        match self.fleet.client().list(&url, false) {
            Ok(listed) => Ok(self.dirs().store(path, entries_of(listed), at, self.opts.entry_timeout)),
            Err(Error::NotFound(_)) => Ok(Arc::new(Vec::new())),
            Err(e) => Err(failed(&format!("list {url}"), &e)),
        }
    }

    /// What `name` in directory `dir` is.
    pub fn find(&self, dir: &str, name: &str) -> Result<(String, Found), Errno> {
        let path = child_path(dir, name);
        if self.writers().contains_key(&path) {
            return Ok((path, Found::Writing));
        }
        if self.dirs().is_local(&path) {
            return Ok((path, Found::Dir));
        }
        let fresh = self.dirs().fresh(dir, self.opts.entry_timeout);
        if let Some((entries, age)) = fresh {
            let checked = Instant::now() - age;
            match entries.iter().find(|e| e.name == name) {
                Some(e) if e.kind == Kind::Dir => return Ok((path, Found::Dir)),
                // A listing's entry carries size, ETag and mtime: no HEAD needed while it is fresh.
                Some(e) if e.etag.is_some() && age < self.opts.attr_timeout => {
                    return Ok((path, Found::File(meta_of(e), checked)))
                }
                Some(_) => {}
                // Trusted for a missing name only as long as the negative timeout allows.
                None if age < self.opts.negative_timeout => return Ok((path, Found::Missing)),
                None => {}
            }
        }
        let found = self.resolve(&path)?;
        Ok((path, found))
    }

    /// Asks the fleet what `path` is: an object (one stat, revalidated with the origin when the
    /// mount knew it before, so a replaced object is seen), else a prefix with something below it.
    pub fn resolve(&self, path: &str) -> Result<Found, Errno> {
        let url = self.opts.url_of(path);
        let known = {
            let inodes = self.inodes();
            inodes.ino_of(path).and_then(|ino| inodes.get(ino)).is_some_and(|n| n.meta.is_some())
        };
        let at = Instant::now();
        let stat_err = match self.fleet.client().stat_opts(&url, known) {
            Ok(meta) => return Ok(Found::File(meta, at)),
            Err(e @ (Error::Unavailable(_) | Error::Untrusted(_))) => {
                return Err(failed(&format!("stat {url}"), &e))
            }
            Err(e) => e,
        };
        match self.fleet.client().list_page(&url, false, None, 1) {
            Ok(page) if !page.entries.is_empty() => Ok(Found::Dir),
            Ok(_) | Err(Error::NotFound(_)) if matches!(stat_err, Error::NotFound(_)) => Ok(Found::Missing),
            Ok(_) => Err(failed(&format!("stat {url}"), &stat_err)),
            Err(e) => Err(failed(&format!("list {url}"), &e)),
        }
    }

    /// Up-to-date metadata of the file `node`: its own if checked within the attribute timeout,
    /// else the origin's current version (one HEAD through the fleet), remembered.
    pub fn current_meta(&self, ino: u64, node: &Node) -> Result<ObjectMeta, Errno> {
        if let Some(meta) = &node.meta {
            if node.checked.elapsed() < self.opts.attr_timeout {
                return Ok(meta.clone());
            }
        }
        let url = self.opts.url_of(&node.path);
        let at = Instant::now();
        match self.fleet.client().stat_opts(&url, true) {
            Ok(meta) => {
                if let Some(n) = self.inodes().get_mut(ino) {
                    n.meta = Some(meta.clone());
                    n.checked = at;
                }
                Ok(meta)
            }
            Err(e) => Err(if matches!(e, Error::NotFound(_)) { errno_of(&e) } else { failed(&url, &e) }),
        }
    }

    /// The attributes of inode `ino` as the kernel should see them now.
    pub fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.node(ino)?;
        if node.kind == Kind::Dir {
            return Ok(self.opts.dir_attr(ino));
        }
        // Not `if let` on the guard: it would hold the writers' map while the spool is locked.
        let spool = self.writers().get(&node.path).cloned();
        if let Some(spool) = spool {
            let len = lock(&spool).len();
            return Ok(self.opts.file_attr(ino, len, now_ms()));
        }
        let meta = self.current_meta(ino, &node)?;
        Ok(self.opts.file_attr(ino, meta.size, meta.last_modified_ms))
    }

    /// Counts a kernel reference to `path`, found as `found`; its inode and attributes.
    pub fn learn(&self, path: &str, found: Found) -> Option<FileAttr> {
        let (kind, meta, checked) = match found {
            Found::File(meta, at) => (Kind::File, Some(meta).filter(|m| m.etag.is_some()), at),
            Found::Writing => (Kind::File, None, Instant::now()),
            Found::Dir => (Kind::Dir, None, Instant::now()),
            Found::Missing => return None,
        };
        let ino = self.inodes().learn(path, kind, meta.clone(), checked);
        Some(match (kind, meta) {
            (Kind::Dir, _) => self.opts.dir_attr(ino),
            (Kind::File, Some(m)) => self.opts.file_attr(ino, m.size, m.last_modified_ms),
            (Kind::File, None) => {
                let spool = self.writers().get(path).cloned();
                let len = spool.map_or(0, |s| lock(&s).len());
                self.opts.file_attr(ino, len, now_ms())
            }
        })
    }

    pub fn entry_ttl(&self) -> Duration {
        self.opts.entry_timeout
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
