//! What the kernel's requests (`fs.rs`) have in common: names checked, entries replied, a file
//! opened for reading (its version pinned, a read-ahead reader) or for writing (a spool, published
//! to the origin at the last close by a live process), and a directory's snapshot for `readdir`.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex};

use fuser::{Errno, FileAttr, FileType, FopenFlags, Generation, ReplyEntry};

use super::dirs::valid_name;
use super::fs::MemartsFs;
use super::handles::{DirItem, Handle};
use super::inodes::{child_path, parent_of, Kind};
use super::reader::Reader;
use super::spool::{Spool, State};
use super::writer_exit::{closer, tgid_of, Closer};

impl MemartsFs {
    pub(super) fn name<'a>(&self, name: &'a OsStr) -> Result<&'a str, Errno> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        // Object keys are UTF-8.
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        if valid_name(name) {
            Ok(name)
        } else {
            Err(Errno::EINVAL)
        }
    }

    pub(super) fn writable(&self) -> Result<(), Errno> {
        if self.view.opts.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    pub(super) fn reply_entry(&self, reply: ReplyEntry, attr: &FileAttr) {
        reply.entry_with_ttls(&self.view.opts.attr_timeout, &self.view.entry_ttl(), attr, Generation(0));
    }

    pub(super) fn lookup_inner(&self, parent: u64, name: &OsStr) -> Result<Option<FileAttr>, Errno> {
        let Ok(name) = self.name(name) else { return Ok(None) };
        let dir = self.view.dir_node(parent)?;
        let (path, found) = self.view.find(&dir.path, name)?;
        Ok(self.view.learn(&path, found))
    }

    pub(super) fn open_read(&self, ino: u64) -> Result<(u64, FopenFlags), Errno> {
        let node = self.view.node(ino)?;
        let meta = self.view.current_meta(ino, &node)?;
        let keep = {
            let mut inodes = self.view.inodes();
            let n = inodes.get_mut(ino).ok_or(Errno::ENOENT)?;
            let same = n.last_open_etag.is_some() && n.last_open_etag == meta.etag;
            n.last_open_etag = meta.etag.clone();
            self.view.opts.kernel_cache || same
        };
        let url = self.view.opts.url_of(&node.path);
        let reader = Reader::new(self.view.fleet.clone(), url, meta);
        let fh = self.handles.insert(Handle::Read(Arc::new(reader)));
        // A file open for reading has nothing to do at close: no FLUSH round trip per close.
        let flags = FopenFlags::FOPEN_NOFLUSH;
        Ok((fh, if keep { flags | FopenFlags::FOPEN_KEEP_CACHE } else { flags }))
    }

    /// A new spool for `path`, the one writer it may have.
    pub(super) fn open_write(&self, path: &str, opener: u32) -> Result<u64, Errno> {
        self.writable()?;
        let mut writers = self.view.writers();
        if writers.contains_key(path) {
            eprintln!("memarts mount: {path} is already open for writing: one writer per file");
            return Err(Errno::EPERM);
        }
        let url = self.view.opts.url_of(path);
        let spool =
            Spool::new(&self.view.opts.spool_dir, path.to_string(), url, tgid_of(opener)).map_err(|e| {
                eprintln!("memarts mount: spool file in {}: {e}", self.view.opts.spool_dir.display());
                e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
            })?;
        let spool = Arc::new(Mutex::new(spool));
        writers.insert(path.to_string(), spool.clone());
        drop(writers);
        Ok(self.handles.insert(Handle::Write(spool)))
    }

    /// The close of a file being written by the process that opened it: publish (upload) it,
    /// unless that process is being killed.
    pub(super) fn close_write(&self, spool: &Mutex<Spool>, pid: u32) -> Result<(), Errno> {
        let mut s = spool.lock().unwrap_or_else(|p| p.into_inner());
        if tgid_of(pid) != s.opener {
            // Another process's copy of the descriptor (a forked child) closes: not the end.
            return Ok(());
        }
        match s.state {
            State::Open => {}
            State::Published | State::Discarded => return Ok(()),
            State::Failed(e) => {
                let path = s.path.clone();
                drop(s);
                self.end_write(&path);
                return Err(e);
            }
        }
        match closer(pid) {
            Closer::Alive => {}
            how => {
                eprintln!(
                    "memarts mount: the writer of {} ended ({how:?}) before closing it: nothing published",
                    s.url
                );
                s.state = State::Discarded;
                let path = s.path.clone();
                // Never wait for the writers' map while holding a spool: `learn` locks them the
                // other way round.
                drop(s);
                self.end_write(&path);
                return Ok(());
            }
        }
        if s.len() == 0 {
            s.closed_empty = true;
            return Ok(());
        }
        self.publish(s)
    }

    /// Uploads the spool and makes the mount's view show the new object.
    pub(super) fn publish(&self, mut s: std::sync::MutexGuard<'_, Spool>) -> Result<(), Errno> {
        let result = s.publish(&self.view.fleet);
        let path = s.path.clone();
        drop(s);
        self.end_write(&path);
        let meta = result?;
        let mut inodes = self.view.inodes();
        if let Some(ino) = inodes.ino_of(&path) {
            if let Some(n) = inodes.get_mut(ino) {
                n.meta = Some(meta);
                n.checked = std::time::Instant::now();
                n.last_open_etag = None;
            }
        }
        Ok(())
    }

    /// `path` has no writer any more; its directory's listing is out of date.
    pub(super) fn end_write(&self, path: &str) {
        self.view.writers().remove(path);
        self.view.dirs().invalidate_up(parent_of(path));
    }

    pub(super) fn snapshot(&self, ino: u64) -> Result<Vec<DirItem>, Errno> {
        let dir = self.view.dir_node(ino)?;
        let listed = self.view.listing(&dir.path)?;
        let mut items: std::collections::BTreeMap<String, FileType> = std::collections::BTreeMap::new();
        for e in listed.iter() {
            let kind = if e.kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
            items.insert(e.name.clone(), kind);
        }
        for name in self.view.dirs().local_children(&dir.path) {
            items.entry(name).or_insert(FileType::Directory);
        }
        let prefix = if dir.path.is_empty() { String::new() } else { format!("{}/", dir.path) };
        for path in self.view.writers().keys() {
            if let Some(name) = path.strip_prefix(&prefix).filter(|n| !n.contains('/')) {
                items.insert(name.to_string(), FileType::RegularFile);
            }
        }
        let inodes = self.view.inodes();
        Ok(items
            .into_iter()
            .map(|(name, kind)| {
                let path = child_path(&dir.path, &name);
                // Inode numbers are handed out by lookup; an entry not looked up yet gets a stable
                // stand-in (readdir's numbers are informative, the kernel looks names up).
                let ino = inodes.ino_of(&path).unwrap_or_else(|| stand_in_ino(&path));
                DirItem { ino, kind, name }
            })
            .collect())
    }
}

fn stand_in_ino(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | (1 << 63)
}
